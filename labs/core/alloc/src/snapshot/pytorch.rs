//! Import of `torch.cuda.memory._dump_snapshot` pickles. The pickle is decoded into
//! generic Python values first, then mapped onto our model key by key, so that each
//! complaint can name where in the file it is (`segments[3].blocks[0].state`).
//!
//! Optional keys (frames, times, settings, newer fields) may be missing: PyTorch
//! versions differ in what they record. The keys without which a snapshot means
//! nothing (sizes, addresses, states, actions) are required.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};

use super::model::{
    AllocatorSettings, Block, BlockState, Frame, Frames, Segment, SegmentType, Snapshot,
    TraceAction, TraceEvent,
};
use super::pickle::{self, Heap, Id, Py};
use super::SnapshotError;

/// Segments up to this size come from PyTorch's small pool; used only when a snapshot
/// does not say which pool a segment is in.
const SMALL_SEGMENT: u64 = 2 << 20;

/// Settings are free-form; a pickle can nest (or even contain itself), so their
/// conversion stops at this depth.
const MAX_DEPTH: usize = 32;

/// The work a conversion may do, in values visited and 16-byte pieces of text copied,
/// per byte of pickle (plus a floor for small files). A pickle can refer to one object
/// any number of times, so a small file can describe an enormous tree; the snapshot in
/// the shared test data needs less than one unit per byte. A unit costs at most some
/// tens of bytes of memory, so memory stays proportional to the file's size.
const WORK_PER_BYTE: u64 = 8;
const WORK_FLOOR: u64 = 1 << 20;

/// What a conversion shares across the values of one pickle: its work budget, and the
/// frame lists already converted (by heap id), which are handed out again rather than
/// copied.
struct Conversion {
    work_left: Cell<u64>,
    budget: u64,
    frames: RefCell<HashMap<Id, Frames>>,
}

impl Conversion {
    fn charge(&self, units: u64) -> Result<(), SnapshotError> {
        let left = self.work_left.get();
        if units > left {
            return Err(SnapshotError::Pickle(format!(
                "the pickle expands to more than {} values (objects referred to too many \
                 times, or nested in themselves); a memory snapshot of its size holds far fewer",
                self.budget
            )));
        }
        self.work_left.set(left - units);
        Ok(())
    }
}

/// A value inside the pickle's heap.
#[derive(Clone, Copy)]
struct Value<'h> {
    heap: &'h Heap,
    conv: &'h Conversion,
    id: Id,
}

impl<'h> Value<'h> {
    fn py(self) -> &'h Py {
        self.heap.get(self.id)
    }
    fn at(self, id: Id) -> Value<'h> {
        Value { id, ..self }
    }
    fn charge(self, units: usize) -> Result<(), SnapshotError> {
        self.conv.charge(units as u64)
    }
    /// A copy of a string of the pickle, paid for.
    fn text(self, s: &str) -> Result<String, SnapshotError> {
        self.charge(1 + s.len() / 16)?;
        Ok(s.to_string())
    }
}

/// A dict of the pickle.
#[derive(Clone, Copy)]
struct Dict<'h>(Value<'h>);

impl<'h> Dict<'h> {
    fn entries(self) -> &'h [(Id, Id)] {
        match self.0.py() {
            Py::Dict(d) => d,
            _ => &[],
        }
    }
    /// The value of a string key; the last one wins, as in Python. The scan is paid for:
    /// a dict of many keys referred to from many places is work.
    fn get(self, key: &str) -> Result<Option<Value<'h>>, SnapshotError> {
        let entries = self.entries();
        self.0.charge(1 + entries.len() / 4)?;
        Ok(entries
            .iter()
            .rev()
            .find(|(k, _)| matches!(self.0.at(*k).py(), Py::Str(s) if s == key))
            .map(|(_, v)| self.0.at(*v)))
    }
}

/// Reads a snapshot pickle. Memory and time are bounded by the file's size: objects
/// the pickle shares stay shared, and the conversion has a work budget.
pub fn load_pickle(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    let heap = pickle::parse(bytes).map_err(SnapshotError::Pickle)?;
    let budget = (bytes.len() as u64)
        .saturating_mul(WORK_PER_BYTE)
        .max(WORK_FLOOR);
    let conv = Conversion {
        work_left: Cell::new(budget),
        budget,
        frames: RefCell::new(HashMap::new()),
    };
    let snapshot = from_value(Value {
        heap: &heap,
        conv: &conv,
        id: heap.root,
    })?;
    super::validate::sizes(&snapshot)?;
    Ok(snapshot)
}

fn from_value(value: Value) -> Result<Snapshot, SnapshotError> {
    // Before `_dump_snapshot` existed, `memory_snapshot()` was a bare list of segments.
    let (segments, top) = match value.py() {
        Py::List(_) => (as_list(value, "<top>")?, None),
        Py::Dict(_) => {
            let top = Dict(value);
            let segments = get(top, "segments")?
                .ok_or_else(|| SnapshotError::shape("<top>", "no `segments` key"))?;
            (as_list(segments, "segments")?, Some(top))
        }
        other => {
            return Err(SnapshotError::shape(
                "<top>",
                format!("expected a dict with `segments`, found {}", kind(other)),
            ))
        }
    };
    let segments = segments
        .iter()
        .enumerate()
        .map(|(i, s)| segment(*s, &format!("segments[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;

    let mut trace = Vec::new();
    let mut settings = AllocatorSettings::default();
    if let Some(top) = top {
        if let Some(traces) = get(top, "device_traces")? {
            for (device, events) in as_list(traces, "device_traces")?.iter().enumerate() {
                let at = format!("device_traces[{device}]");
                for (j, e) in as_list(*events, &at)?.iter().enumerate() {
                    trace.push(event(*e, device as i64, &format!("{at}[{j}]"))?);
                }
            }
        }
        if let Some(s) = get(top, "allocator_settings")? {
            settings = allocator_settings(s)?;
        }
    }
    Ok(Snapshot {
        segments,
        trace,
        settings,
    })
}

fn segment(v: Value, at: &str) -> Result<Segment, SnapshotError> {
    let d = as_dict(v, at)?;
    let total_size = req_u64(d, "total_size", at)?;
    let segment_type = match opt_str(d, "segment_type", at)? {
        Some("small") => SegmentType::Small,
        Some("large") => SegmentType::Large,
        Some(other) => {
            return Err(SnapshotError::shape(
                format!("{at}.segment_type"),
                format!("expected 'small' or 'large', found {other:?}"),
            ))
        }
        None if total_size <= SMALL_SEGMENT => SegmentType::Small,
        None => SegmentType::Large,
    };
    let blocks = match get(d, "blocks")? {
        Some(b) => {
            let at = format!("{at}.blocks");
            as_list(b, &at)?
                .iter()
                .enumerate()
                .map(|(i, b)| block(*b, &format!("{at}[{i}]")))
                .collect::<Result<Vec<_>, _>>()?
        }
        None => Vec::new(),
    };
    Ok(Segment {
        device: opt_i64(d, "device", at)?.unwrap_or(0),
        address: req_u64(d, "address", at)?,
        total_size,
        stream: opt_u64(d, "stream", at)?.unwrap_or(0),
        segment_type,
        is_expandable: opt_bool(d, "is_expandable", at)?.unwrap_or(false),
        segment_pool_id: pool_id(d, at)?,
        blocks,
    })
}

/// `segment_pool_id`, a pair of ints; `(0, 0)` where the snapshot has none.
fn pool_id(d: Dict, at: &str) -> Result<(u64, u64), SnapshotError> {
    let Some(v) = get(d, "segment_pool_id")? else {
        return Ok((0, 0));
    };
    let at = format!("{at}.segment_pool_id");
    let bad = |what: String| SnapshotError::shape(&at, what);
    let items = as_list(v, &at)?;
    let ints = items
        .iter()
        .map(|i| match i.py() {
            Py::Int(n) => u64::try_from(*n).map_err(|_| bad(format!("{n} is out of range"))),
            other => Err(bad(format!("expected an int, found {}", kind(other)))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    match ints[..] {
        [a, b] => Ok((a, b)),
        _ => Err(bad(format!("expected two ints, found {}", ints.len()))),
    }
}

fn block(v: Value, at: &str) -> Result<Block, SnapshotError> {
    let d = as_dict(v, at)?;
    let size = req_u64(d, "size", at)?;
    let state = match req_str(d, "state", at)? {
        "active_allocated" => BlockState::ActiveAllocated,
        "active_pending_free" => BlockState::ActivePendingFree,
        "inactive" => BlockState::Inactive,
        other => {
            return Err(SnapshotError::shape(
                format!("{at}.state"),
                format!(
                "expected 'active_allocated', 'active_pending_free' or 'inactive', found {other:?}"
            ),
            ))
        }
    };
    Ok(Block {
        address: req_u64(d, "address", at)?,
        size,
        requested_size: opt_u64(d, "requested_size", at)?.unwrap_or(size),
        state,
        frames: frames(d, at)?,
        category: None,
    })
}

fn event(v: Value, device: i64, at: &str) -> Result<TraceEvent, SnapshotError> {
    let d = as_dict(v, at)?;
    Ok(TraceEvent {
        device,
        action: TraceAction::from(v.text(req_str(d, "action", at)?)?),
        addr: opt_u64(d, "addr", at)?.unwrap_or(0),
        size: opt_u64(d, "size", at)?.unwrap_or(0),
        stream: opt_u64(d, "stream", at)?.unwrap_or(0),
        time_us: opt_i64(d, "time_us", at)?.unwrap_or(0),
        frames: frames(d, at)?,
        category: None,
        saved_by: None,
    })
}

/// The frames under `frames`; a list converted once is shared by every later reference.
fn frames(d: Dict, at: &str) -> Result<Frames, SnapshotError> {
    let Some(v) = get(d, "frames")? else {
        return Ok(Frames::default());
    };
    if let Some(done) = v.conv.frames.borrow().get(&v.id) {
        v.charge(1)?;
        return Ok(done.clone());
    }
    let at = format!("{at}.frames");
    let list = as_list(v, &at)?
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let at = format!("{at}[{i}]");
            let f = as_dict(*f, &at)?;
            Ok(Frame {
                name: f.0.text(opt_str(f, "name", &at)?.unwrap_or("??"))?,
                filename: f.0.text(opt_str(f, "filename", &at)?.unwrap_or(""))?,
                line: opt_u64(f, "line", &at)?.unwrap_or(0),
            })
        })
        .collect::<Result<Frames, SnapshotError>>()?;
    v.conv.frames.borrow_mut().insert(v.id, list.clone());
    Ok(list)
}

fn allocator_settings(v: Value) -> Result<AllocatorSettings, SnapshotError> {
    let at = "allocator_settings";
    let d = as_dict(v, at)?;
    let mut s = AllocatorSettings {
        alloc_conf: v.text(opt_str(d, "PYTORCH_CUDA_ALLOC_CONF", at)?.unwrap_or(""))?,
        expandable_segments: opt_bool(d, "expandable_segments", at)?.unwrap_or(false),
        // PyTorch writes -1 (or SIZE_MAX) for "no limit".
        max_split_size: opt_i64(d, "max_split_size", at)
            .ok()
            .flatten()
            .filter(|&m| m > 0 && m < i64::MAX)
            .map(|m| m as u64),
        garbage_collection_threshold: match get(d, "garbage_collection_threshold")?.map(Value::py) {
            Some(Py::Float(x)) => *x,
            Some(Py::Int(x)) => *x as f64,
            _ => 0.0,
        },
        other: BTreeMap::new(),
    };
    const KNOWN: [&str; 4] = [
        "PYTORCH_CUDA_ALLOC_CONF",
        "expandable_segments",
        "max_split_size",
        "garbage_collection_threshold",
    ];
    for &(k, x) in d.entries() {
        let key = key_to_string(v.at(k))?;
        if !KNOWN.contains(&key.as_str()) {
            let value = to_json(v.at(x), &mut Vec::new())?;
            s.other.insert(key, value);
        }
    }
    Ok(s)
}

fn key_to_string(k: Value) -> Result<String, SnapshotError> {
    match k.py() {
        Py::Str(s) => k.text(s),
        Py::Bytes(b) => k.text(&String::from_utf8_lossy(b)),
        Py::Int(i) => k.text(&i.to_string()),
        other => k.text(kind(other)),
    }
}

/// A settings value as JSON. `path` holds the containers being converted: one that
/// contains itself is written `[...]`, as Python prints it; the depth is capped; the
/// width (one object referred to many times) is paid for from the work budget.
fn to_json(v: Value, path: &mut Vec<Id>) -> Result<serde_json::Value, SnapshotError> {
    use serde_json::Value as J;
    v.charge(1)?;
    if path.len() > MAX_DEPTH {
        return Ok(J::String("<nested too deep>".into()));
    }
    if path.contains(&v.id) {
        return Ok(J::String("[...]".into()));
    }
    path.push(v.id);
    let out = match v.py() {
        Py::None => J::Null,
        Py::Bool(b) => J::Bool(*b),
        Py::Int(i) => i64::try_from(*i)
            .map(J::from)
            .or_else(|_| u64::try_from(*i).map(J::from))
            .unwrap_or_else(|_| J::String(i.to_string())),
        Py::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Py::Bytes(b) => J::String(v.text(&String::from_utf8_lossy(b))?),
        Py::Str(s) => J::String(v.text(s)?),
        Py::List(l) | Py::Tuple(l) => J::Array(
            l.iter()
                .map(|&i| to_json(v.at(i), path))
                .collect::<Result<_, _>>()?,
        ),
        Py::Dict(d) => J::Object(
            d.iter()
                .map(|&(k, x)| Ok((key_to_string(v.at(k))?, to_json(v.at(x), path)?)))
                .collect::<Result<_, SnapshotError>>()?,
        ),
    };
    path.pop();
    Ok(out)
}

fn kind(v: &Py) -> &'static str {
    pickle::kind(v)
}

fn as_dict<'h>(v: Value<'h>, at: &str) -> Result<Dict<'h>, SnapshotError> {
    match v.py() {
        Py::Dict(_) => Ok(Dict(v)),
        other => Err(SnapshotError::shape(
            at,
            format!("expected a dict, found {}", kind(other)),
        )),
    }
}

fn as_list<'h>(v: Value<'h>, at: &str) -> Result<Vec<Value<'h>>, SnapshotError> {
    match v.py() {
        Py::List(l) | Py::Tuple(l) => {
            v.charge(1 + l.len())?;
            Ok(l.iter().map(|&i| v.at(i)).collect())
        }
        other => Err(SnapshotError::shape(
            at,
            format!("expected a list, found {}", kind(other)),
        )),
    }
}

fn get<'h>(d: Dict<'h>, key: &str) -> Result<Option<Value<'h>>, SnapshotError> {
    d.get(key)
}

fn missing(d_at: &str, key: &str) -> SnapshotError {
    SnapshotError::shape(d_at, format!("missing key `{key}`"))
}

fn opt_int(d: Dict, key: &str, at: &str) -> Result<Option<i128>, SnapshotError> {
    match get(d, key)?.map(Value::py) {
        None | Some(Py::None) => Ok(None),
        Some(Py::Int(i)) => Ok(Some(*i)),
        Some(Py::Bool(b)) => Ok(Some(*b as i128)),
        Some(other) => Err(SnapshotError::shape(
            format!("{at}.{key}"),
            format!("expected an int, found {}", kind(other)),
        )),
    }
}

fn opt_i64(d: Dict, key: &str, at: &str) -> Result<Option<i64>, SnapshotError> {
    opt_int(d, key, at)?
        .map(|i| {
            i64::try_from(i).map_err(|_| {
                SnapshotError::shape(format!("{at}.{key}"), format!("{i} is out of range"))
            })
        })
        .transpose()
}

fn opt_u64(d: Dict, key: &str, at: &str) -> Result<Option<u64>, SnapshotError> {
    opt_int(d, key, at)?
        .map(|i| {
            u64::try_from(i).map_err(|_| {
                SnapshotError::shape(
                    format!("{at}.{key}"),
                    format!("expected a non-negative int, found {i}"),
                )
            })
        })
        .transpose()
}

fn req_u64(d: Dict, key: &str, at: &str) -> Result<u64, SnapshotError> {
    opt_u64(d, key, at)?.ok_or_else(|| missing(at, key))
}

fn opt_str<'h>(d: Dict<'h>, key: &str, at: &str) -> Result<Option<&'h str>, SnapshotError> {
    match get(d, key)?.map(Value::py) {
        None | Some(Py::None) => Ok(None),
        Some(Py::Str(s)) => Ok(Some(s)),
        Some(other) => Err(SnapshotError::shape(
            format!("{at}.{key}"),
            format!("expected a string, found {}", kind(other)),
        )),
    }
}

fn req_str<'h>(d: Dict<'h>, key: &str, at: &str) -> Result<&'h str, SnapshotError> {
    opt_str(d, key, at)?.ok_or_else(|| missing(at, key))
}

fn opt_bool(d: Dict, key: &str, at: &str) -> Result<Option<bool>, SnapshotError> {
    match get(d, key)?.map(Value::py) {
        None | Some(Py::None) => Ok(None),
        Some(Py::Bool(b)) => Ok(Some(*b)),
        Some(Py::Int(i)) => Ok(Some(*i != 0)),
        Some(other) => Err(SnapshotError::shape(
            format!("{at}.{key}"),
            format!("expected a bool, found {}", kind(other)),
        )),
    }
}
