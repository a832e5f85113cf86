//! A pickle reader for plain data: the subset of the pickle machine that
//! `torch.cuda.memory._dump_snapshot` uses (dicts, lists, tuples, strings, ints,
//! floats, bools, None, and the memo). Objects live in an arena and the stack holds
//! their indices, so shared objects (PyTorch shares frame dicts and strings across
//! thousands of events) cost nothing to reference and a container can be filled after
//! it was memoized, as pickle does. Class instances and other code-running opcodes are
//! refused: a snapshot holds none, and loading them would mean running arbitrary code.

use std::collections::HashMap;

use super::error::quote;

pub(crate) type Id = usize;

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Py {
    None,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<Id>),
    Tuple(Vec<Id>),
    Dict(Vec<(Id, Id)>),
}

/// Every object of a pickle; `root` is the one it returns.
#[derive(Debug, Default)]
pub(crate) struct Heap {
    objects: Vec<Py>,
    pub root: Id,
}

impl Heap {
    pub fn get(&self, id: Id) -> &Py {
        &self.objects[id]
    }

    fn add(&mut self, obj: Py) -> Id {
        self.objects.push(obj);
        self.objects.len() - 1
    }
}

struct Machine<'a> {
    bytes: &'a [u8],
    pos: usize,
    heap: Heap,
    stack: Vec<Id>,
    marks: Vec<usize>,
    memo: HashMap<u64, Id>,
}

/// Runs the pickle. Errors name the problem and the byte offset where it was found.
pub(crate) fn parse(bytes: &[u8]) -> Result<Heap, String> {
    let mut m = Machine {
        bytes,
        pos: 0,
        heap: Heap::default(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
    };
    m.run()?;
    Ok(m.heap)
}

impl<'a> Machine<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.bytes.len())
            .ok_or_else(|| {
                format!(
                    "the file ends at byte {} in the middle of a value (truncated?)",
                    self.bytes.len()
                )
            })?;
        let out = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn uint(&mut self, n: usize) -> Result<u64, String> {
        let b = self.take(n)?;
        let mut buf = [0u8; 8];
        buf[..n].copy_from_slice(b);
        Ok(u64::from_le_bytes(buf))
    }

    fn len(&mut self, n: usize) -> Result<usize, String> {
        let len = self.uint(n)?;
        usize::try_from(len).map_err(|_| format!("length {len} is too large"))
    }

    fn line(&mut self) -> Result<&'a str, String> {
        let rest = &self.bytes[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\n')
            .ok_or("the file ends inside a text argument (truncated?)")?;
        self.pos += end + 1;
        std::str::from_utf8(&rest[..end]).map_err(|_| "a text argument is not UTF-8".to_string())
    }

    fn push(&mut self, obj: Py) {
        let id = self.heap.add(obj);
        self.stack.push(id);
    }

    fn pop(&mut self) -> Result<Id, String> {
        let floor = self.marks.last().copied().unwrap_or(0);
        if self.stack.len() <= floor {
            return Err("stack underflow".into());
        }
        Ok(self.stack.pop().expect("checked above"))
    }

    fn top(&self) -> Result<Id, String> {
        self.stack
            .last()
            .copied()
            .ok_or_else(|| "empty stack".into())
    }

    fn pop_mark(&mut self) -> Result<Vec<Id>, String> {
        let mark = self
            .marks
            .pop()
            .ok_or("no MARK before a MARK-consuming opcode")?;
        Ok(self.stack.split_off(mark))
    }

    fn string(&mut self, n: usize) -> Result<(), String> {
        let b = self.take(n)?;
        let s = std::str::from_utf8(b).map_err(|_| "a string is not valid UTF-8".to_string())?;
        self.push(Py::Str(s.to_string()));
        Ok(())
    }

    fn bytes_obj(&mut self, n: usize) -> Result<(), String> {
        let b = self.take(n)?.to_vec();
        self.push(Py::Bytes(b));
        Ok(())
    }

    fn memo_put(&mut self, key: u64) -> Result<(), String> {
        let id = self.top()?;
        self.memo.insert(key, id);
        Ok(())
    }

    fn memo_get(&mut self, key: u64) -> Result<(), String> {
        let id = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo entry {key} is used before it is set"))?;
        self.stack.push(id);
        Ok(())
    }

    fn extend(&mut self, target: Id, items: Vec<Id>) -> Result<(), String> {
        match &mut self.heap.objects[target] {
            Py::List(l) => {
                l.extend(items);
                Ok(())
            }
            other => Err(format!("APPEND to {}, not a list", kind(other))),
        }
    }

    fn set_items(&mut self, target: Id, items: Vec<Id>) -> Result<(), String> {
        if !items.chunks_exact(2).remainder().is_empty() {
            return Err("SETITEMS with an odd number of items".into());
        }
        match &mut self.heap.objects[target] {
            Py::Dict(d) => {
                d.extend(items.chunks(2).map(|kv| (kv[0], kv[1])));
                Ok(())
            }
            other => Err(format!("SETITEM on {}, not a dict", kind(other))),
        }
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            let at = self.pos;
            let op = *self
                .bytes
                .get(self.pos)
                .ok_or_else(|| format!("the file ends at byte {at} before STOP (truncated?)"))?;
            self.pos += 1;
            self.step(op)
                .map_err(|e| format!("{e} (opcode {op:#04x} at byte {at})"))?;
            if op == b'.' {
                if self.pos != self.bytes.len() {
                    return Err(format!(
                        "{} bytes after the end of the pickle",
                        self.bytes.len() - self.pos
                    ));
                }
                return Ok(());
            }
        }
    }

    fn step(&mut self, op: u8) -> Result<(), String> {
        match op {
            0x80 => {
                let proto = self.uint(1)?;
                if proto > 5 {
                    return Err(format!("pickle protocol {proto} is newer than 5"));
                }
            }
            0x95 => {
                self.take(8)?;
            }
            b'.' => {
                self.heap.root = self.pop()?;
                if !self.stack.is_empty() || !self.marks.is_empty() {
                    return Err("STOP with values left on the stack".into());
                }
            }
            b'(' => self.marks.push(self.stack.len()),
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let id = self.top()?;
                self.stack.push(id);
            }
            b'}' => self.push(Py::Dict(Vec::new())),
            b']' => self.push(Py::List(Vec::new())),
            b')' => self.push(Py::Tuple(Vec::new())),
            0x8f => self.push(Py::List(Vec::new())), // EMPTY_SET, read as a list
            b'd' => {
                let items = self.pop_mark()?;
                self.push(Py::Dict(Vec::new()));
                let id = self.top()?;
                self.set_items(id, items)?;
            }
            b'l' => {
                let items = self.pop_mark()?;
                self.push(Py::List(items));
            }
            b't' | 0x91 => {
                let items = self.pop_mark()?;
                self.push(Py::Tuple(items));
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let floor = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < floor + n {
                    return Err("stack underflow".into());
                }
                let items = self.stack.split_off(self.stack.len() - n);
                self.push(Py::Tuple(items));
            }
            b'a' => {
                let item = self.pop()?;
                let list = self.top()?;
                self.extend(list, vec![item])?;
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                let list = self.top()?;
                self.extend(list, items)?;
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                let dict = self.top()?;
                self.set_items(dict, vec![key, value])?;
            }
            b'u' => {
                let items = self.pop_mark()?;
                let dict = self.top()?;
                self.set_items(dict, items)?;
            }
            0x94 => {
                let key = self.memo.len() as u64;
                self.memo_put(key)?;
            }
            b'q' => {
                let key = self.uint(1)?;
                self.memo_put(key)?;
            }
            b'r' => {
                let key = self.uint(4)?;
                self.memo_put(key)?;
            }
            b'p' => {
                let key = self.line()?.trim().parse().map_err(|_| "bad PUT index")?;
                self.memo_put(key)?;
            }
            b'h' => {
                let key = self.uint(1)?;
                self.memo_get(key)?;
            }
            b'j' => {
                let key = self.uint(4)?;
                self.memo_get(key)?;
            }
            b'g' => {
                let key = self.line()?.trim().parse().map_err(|_| "bad GET index")?;
                self.memo_get(key)?;
            }
            b'N' => self.push(Py::None),
            0x88 => self.push(Py::Bool(true)),
            0x89 => self.push(Py::Bool(false)),
            b'J' => {
                let v = self.uint(4)? as u32 as i32;
                self.push(Py::Int(v as i128));
            }
            b'K' => {
                let v = self.uint(1)?;
                self.push(Py::Int(v as i128));
            }
            b'M' => {
                let v = self.uint(2)?;
                self.push(Py::Int(v as i128));
            }
            0x8a | 0x8b => {
                let n = if op == 0x8a {
                    self.len(1)?
                } else {
                    self.len(4)?
                };
                let b = self.take(n)?;
                self.push(Py::Int(le_signed(b)?));
            }
            b'I' | b'L' => {
                let text = self.line()?.trim().trim_end_matches('L');
                let obj = match text {
                    "00" => Py::Bool(false),
                    "01" => Py::Bool(true),
                    t => Py::Int(t.parse().map_err(|_| format!("bad integer {}", quote(t)))?),
                };
                self.push(obj);
            }
            b'G' => {
                let b = self.take(8)?;
                let v = f64::from_be_bytes(b.try_into().expect("8 bytes"));
                self.push(Py::Float(v));
            }
            b'F' => {
                let t = self.line()?.trim();
                let v = t.parse().map_err(|_| format!("bad float {}", quote(t)))?;
                self.push(Py::Float(v));
            }
            0x8c => {
                let n = self.len(1)?;
                self.string(n)?;
            }
            b'X' => {
                let n = self.len(4)?;
                self.string(n)?;
            }
            0x8d => {
                let n = self.len(8)?;
                self.string(n)?;
            }
            b'C' | b'U' => {
                let n = self.len(1)?;
                self.bytes_obj(n)?;
            }
            b'B' | b'T' => {
                let n = self.len(4)?;
                self.bytes_obj(n)?;
            }
            0x8e => {
                let n = self.len(8)?;
                self.bytes_obj(n)?;
            }
            b'c' | 0x93 | b'R' | b'b' | 0x81 | 0x92 | b'i' | b'o' | b'P' | b'Q' | 0x82..=0x84 => {
                return Err(
                    "the pickle holds Python objects, not only plain data (dicts, lists, \
                     strings, numbers); a memory snapshot has none"
                        .into(),
                )
            }
            _ => return Err("not a pickle opcode this reader knows".into()),
        }
        Ok(())
    }
}

/// A little-endian two's complement integer, as LONG1/LONG4 store them.
fn le_signed(b: &[u8]) -> Result<i128, String> {
    if b.len() > 16 {
        return Err(format!("a {}-byte integer is too large", b.len()));
    }
    if b.is_empty() {
        return Ok(0);
    }
    let fill = if b[b.len() - 1] & 0x80 != 0 { 0xff } else { 0 };
    let mut buf = [fill; 16];
    buf[..b.len()].copy_from_slice(b);
    Ok(i128::from_le_bytes(buf))
}

pub(crate) fn kind(v: &Py) -> &'static str {
    match v {
        Py::None => "None",
        Py::Bool(_) => "a bool",
        Py::Int(_) => "an int",
        Py::Float(_) => "a float",
        Py::Str(_) => "a string",
        Py::Bytes(_) => "bytes",
        Py::List(_) => "a list",
        Py::Tuple(_) => "a tuple",
        Py::Dict(_) => "a dict",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_protocol_4_data_with_memo_and_late_filled_containers() {
        // pickle.dumps({'a': [1, -2, 2**40, 'x', 'x'], 'b': (None, True, 1.5)}, protocol=4)
        let bytes: &[u8] = b"\x80\x04\x953\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01a\x94]\x94(K\x01J\xfe\xff\xff\xff\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x01x\x94h\x03e\x8c\x01b\x94N\x88G?\xf8\x00\x00\x00\x00\x00\x00\x87\x94u.";
        let heap = parse(bytes).unwrap();
        let Py::Dict(top) = heap.get(heap.root) else {
            panic!("not a dict")
        };
        assert_eq!(top.len(), 2);
        let Py::List(items) = heap.get(top[0].1) else {
            panic!("not a list")
        };
        let ints: Vec<&Py> = items.iter().map(|&i| heap.get(i)).collect();
        assert_eq!(ints[0], &Py::Int(1));
        assert_eq!(ints[1], &Py::Int(-2));
        assert_eq!(ints[2], &Py::Int(1 << 40));
        assert_eq!(items[3], items[4], "memoized strings are shared");
        assert!(matches!(heap.get(top[1].1), Py::Tuple(t) if t.len() == 3));
    }

    #[test]
    fn refuses_code_and_truncation() {
        // pickle.dumps(print) refers to a global.
        let err = parse(b"\x80\x04\x95\x16\x00\x00\x00\x00\x00\x00\x00\x8c\x08builtins\x94\x8c\x05print\x94\x93\x94.")
            .unwrap_err();
        assert!(err.contains("Python objects"), "{err}");
        assert!(parse(b"\x80\x04}\x94").unwrap_err().contains("truncated"));
        assert!(parse(b"\x80\x04K\x01.junk")
            .unwrap_err()
            .contains("after the end"));
    }
}
