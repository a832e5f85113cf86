//! Pickles built by hand, opcode by opcode (protocol 4, as `torch.cuda.memory._dump_snapshot`
//! writes), for the pickle reader's tests.

/// Opcodes used here.
pub const PROTO4: &[u8] = b"\x80\x04";
pub const EMPTY_DICT: u8 = b'}';
pub const EMPTY_LIST: u8 = b']';
pub const MARK: u8 = b'(';
pub const APPENDS: u8 = b'e';
pub const SETITEMS: u8 = b'u';
pub const STOP: u8 = b'.';

/// SHORT_BINUNICODE (or BINUNICODE when longer than 255 bytes).
pub fn string(out: &mut Vec<u8>, s: &str) {
    if s.len() < 256 {
        out.push(0x8c);
        out.push(s.len() as u8);
    } else {
        out.push(b'X');
        out.extend((s.len() as u32).to_le_bytes());
    }
    out.extend(s.as_bytes());
}

/// BININT (signed 32 bits).
pub fn int(out: &mut Vec<u8>, v: i32) {
    out.push(b'J');
    out.extend(v.to_le_bytes());
}

/// LONG1 of any i64.
pub fn long(out: &mut Vec<u8>, v: i64) {
    out.push(0x8a);
    out.push(8);
    out.extend(v.to_le_bytes());
}

/// BINPUT `key`: memoises the top of the stack.
pub fn put(out: &mut Vec<u8>, key: u8) {
    out.extend([b'q', key]);
}

/// BINGET `key`: pushes the memoised object again (the same object, not a copy).
pub fn get(out: &mut Vec<u8>, key: u8) {
    out.extend([b'h', key]);
}

/// `{"segments": [], <rest>}` where `rest` writes further key/value pairs.
pub fn snapshot(rest: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut p = PROTO4.to_vec();
    p.extend([EMPTY_DICT, MARK]);
    string(&mut p, "segments");
    p.push(EMPTY_LIST);
    rest(&mut p);
    p.extend([SETITEMS, STOP]);
    p
}

/// A snapshot whose allocator settings hold a list containing itself twice: 65 bytes
/// that expand to 2^depth values when followed naively.
pub fn self_referencing_settings() -> Vec<u8> {
    snapshot(|p| {
        string(p, "allocator_settings");
        p.extend([EMPTY_DICT, MARK]);
        string(p, "x");
        p.push(EMPTY_LIST);
        put(p, 0);
        p.push(MARK);
        get(p, 0);
        get(p, 0);
        p.push(APPENDS);
        p.push(SETITEMS);
    })
}

/// A snapshot of `events` trace events on device 0, each with the same list of
/// `frames` references to one frame dict whose name is `name_len` bytes: what PyTorch's
/// sharing of frames looks like, at a scale where copying per reference is ruinous.
pub fn shared_frames(events: u32, frames: u32, name_len: usize) -> Vec<u8> {
    snapshot(|p| {
        string(p, "device_traces");
        p.extend([EMPTY_LIST, MARK, EMPTY_LIST, MARK]);
        for i in 0..events {
            p.extend([EMPTY_DICT, MARK]);
            string(p, "action");
            string(p, "alloc");
            string(p, "addr");
            int(p, (i as i32) * 512);
            string(p, "size");
            int(p, 512);
            string(p, "frames");
            if i == 0 {
                p.extend([EMPTY_LIST]);
                put(p, 0);
                p.push(MARK);
                p.extend([EMPTY_DICT, MARK]);
                string(p, "name");
                string(p, &"f".repeat(name_len));
                string(p, "filename");
                string(p, "train.py");
                string(p, "line");
                int(p, 7);
                p.push(SETITEMS);
                put(p, 1);
                for _ in 1..frames {
                    get(p, 1);
                }
                p.push(APPENDS);
            } else {
                get(p, 0);
            }
            p.push(SETITEMS);
        }
        p.push(APPENDS);
        p.push(APPENDS);
    })
}
