//! The files users give the readers (snapshots, traces, safetensors weights): what is
//! not a regular file (a FIFO, a device, a directory) is refused at once instead of
//! blocking or being read without end, a file over its size limit is refused before it
//! is read, and weights are streamed onto the device rather than held on the host in
//! several copies.

#[path = "../../alloc/tests/bounded/mod.rs"]
mod bounded;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use bounded::{assert_one_line, measure};
use labs_alloc::alloc::replay;
use labs_alloc::snapshot;
use labs_device::testing::test_device;
use labs_nn::nn;
use labs_tensor::{DType, Tensor};

const MIB: usize = 1 << 20;
/// How long a refusal may take: it reads nothing, so a hang shows up as a timeout.
const PROMPT: Duration = Duration::from_secs(5);

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("labs-input-files-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn fifo(name: &str) -> PathBuf {
    let path = scratch(name);
    let status = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .expect("mkfifo runs");
    assert!(status.success(), "mkfifo {}", path.display());
    path
}

/// A sparse file of `len` bytes starting with `head`: large, but costs no disk.
fn sparse(name: &str, head: &[u8], len: u64) -> PathBuf {
    let path = scratch(name);
    std::fs::write(&path, head).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len)
        .unwrap();
    path
}

/// Each reader of the crate, as "what it returned, as an error message if it failed".
type Reader = fn(&Path) -> Result<(), String>;

fn readers() -> [(&'static str, Reader); 3] {
    [
        ("snapshot::load_file", |p| {
            snapshot::load_file(p).map(drop).map_err(|e| e.to_string())
        }),
        ("replay::read_trace", |p| {
            replay::read_trace(p).map(drop).map_err(|e| e.to_string())
        }),
        ("nn::load", |p| {
            nn::load(p, &test_device())
                .map(drop)
                .map_err(|e| e.to_string())
        }),
    ]
}

/// `reader(path)` on a thread, with the heap it used at its peak; `None` if it had not
/// returned after [`PROMPT`] (it is left blocked: a FIFO reader is released below).
fn promptly(reader: Reader, path: &Path) -> Option<(Result<(), String>, usize)> {
    let (tx, rx) = mpsc::channel();
    let owned = path.to_path_buf();
    std::thread::spawn(move || {
        let (r, cost) = measure(|| reader(&owned));
        let _ = tx.send((r, cost.peak_bytes));
    });
    let got = rx.recv_timeout(PROMPT).ok();
    if got.is_none() {
        release_fifo_reader(path);
    }
    got
}

/// Opens the FIFO for writing without blocking (if a reader is waiting on it) and
/// closes it, so that the reader sees the end of the file and its thread ends.
fn release_fifo_reader(path: &Path) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(0o4000)
            .open(path);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = path;
}

fn assert_refused(name: &str, path: &Path, needle: &str) {
    for (reader_name, reader) in readers() {
        let what = format!("{reader_name}({name})");
        let Some((result, heap)) = promptly(reader, path) else {
            panic!("{what} did not return within {PROMPT:?}");
        };
        let e = result.expect_err(&what);
        assert_one_line(&e);
        assert!(
            e.contains(&path.display().to_string()) && e.contains(needle),
            "{what}: {e}"
        );
        assert!(heap < MIB, "{what}: used {heap} bytes of heap to refuse it");
    }
}

#[test]
fn a_fifo_is_refused_at_once_by_every_reader() {
    let path = fifo("snapshot.fifo");
    assert_refused("a FIFO", &path, "FIFO");
}

#[test]
fn a_directory_is_refused_by_every_reader() {
    let dir = scratch("a-directory");
    std::fs::create_dir_all(&dir).unwrap();
    assert_refused("a directory", &dir, "is a directory");
}

#[cfg(unix)]
#[test]
fn a_device_such_as_dev_zero_is_refused_by_every_reader() {
    assert_refused("/dev/zero", Path::new("/dev/zero"), "character device");
}

#[test]
fn a_snapshot_over_the_size_limit_is_refused_without_reading_it() {
    let path = sparse("huge.pickle", &[0x80, 0x04], 2 << 30);
    let (r, cost) = measure(|| snapshot::load_file(&path));
    let e = r.unwrap_err().to_string();
    assert_one_line(&e);
    assert!(
        e.contains("huge.pickle") && e.contains("LABS_MAX_SNAPSHOT_SIZE"),
        "{e}"
    );
    assert!(cost.peak_bytes < MIB, "{} bytes of heap", cost.peak_bytes);
    assert!(cost.elapsed < PROMPT, "{:?}", cost.elapsed);
}

#[test]
fn a_trace_over_the_size_limit_is_refused_without_reading_it() {
    let path = sparse(
        "huge.trace.csv",
        b"action,addr,size,stream\nalloc,0,512,0\n",
        2 << 30,
    );
    let (r, cost) = measure(|| replay::read_trace(&path));
    let e = r.unwrap_err().to_string();
    assert_one_line(&e);
    assert!(
        e.contains("huge.trace.csv") && e.contains("--max-trace-size"),
        "{e}"
    );
    assert!(cost.peak_bytes < MIB, "{} bytes of heap", cost.peak_bytes);
}

#[test]
fn a_huge_weights_file_is_refused_without_reading_it() {
    // A header length of zero: the JSON header is missing.
    let path = sparse("huge.safetensors", &[0; 8], 2 << 30);
    let device = test_device();
    let (r, cost) = measure(|| nn::load(&path, &device));
    let e = r.unwrap_err().to_string();
    assert_one_line(&e);
    assert!(
        e.contains("huge.safetensors") && e.contains("not a valid safetensors file"),
        "{e}"
    );
    assert!(cost.peak_bytes < MIB, "{} bytes of heap", cost.peak_bytes);
    assert!(cost.elapsed < PROMPT, "{:?}", cost.elapsed);
}

#[test]
fn loading_a_tensor_holds_about_one_copy_of_it_on_the_host() {
    let device = test_device();
    const ELEMENTS: usize = 16 << 20; // 64 MiB of f32
    let bytes = ELEMENTS * 4;
    let values: Vec<f32> = (0..ELEMENTS).map(|i| (i % 1000) as f32 - 500.0).collect();
    let t = Tensor::from_slice(&values, &[ELEMENTS / 1024, 1024], &device).unwrap();
    let path = scratch("big.safetensors");
    nn::save(&path, &[("w".into(), t)]).unwrap();
    let (loaded, cost) = measure(|| nn::load(&path, &device).unwrap());
    // The simulated device's memory is host memory too: one copy is the device's, so
    // everything else (the file's bytes on their way) must stay well under another copy.
    assert!(
        cost.peak_bytes < bytes + bytes / 4,
        "loading a {bytes}-byte tensor used {} bytes of heap at the peak",
        cost.peak_bytes
    );
    let [(name, w)] = &loaded[..] else {
        panic!("one tensor expected, got {}", loaded.len())
    };
    assert_eq!((name.as_str(), w.dtype()), ("w", DType::F32));
    assert_eq!(w.shape(), &[ELEMENTS / 1024, 1024]);
    assert_eq!(w.to_vec::<f32>().unwrap(), values);
}

#[test]
fn a_truncated_or_malformed_weights_file_is_a_one_line_error() {
    let device = test_device();
    let good = scratch("good.safetensors");
    let a = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &device).unwrap();
    let b = Tensor::from_slice(&[7i64, 8], &[2], &device).unwrap();
    nn::save(&good, &[("a".into(), a), ("b".into(), b)]).unwrap();
    let whole = std::fs::read(&good).unwrap();
    let loaded = nn::load(&good, &device).unwrap();
    assert_eq!(loaded[0].1.to_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
    assert_eq!(loaded[1].1.to_vec::<i64>().unwrap(), [7, 8]);

    let header = |json: &str, data: &[u8]| {
        [
            &(json.len() as u64).to_le_bytes()[..],
            json.as_bytes(),
            data,
        ]
        .concat()
    };
    let bad = scratch("bad.safetensors");
    for (what, bytes, needle) in [
        ("cut in the data", whole[..whole.len() - 3].to_vec(), "data"),
        ("cut in the header", whole[..20].to_vec(), "header"),
        (
            "bytes after the data",
            [&whole[..], &[0; 5]].concat(),
            "data",
        ),
        ("shorter than a length", vec![1, 2, 3], "8"),
        (
            "a header length past the end",
            [&u64::MAX.to_le_bytes()[..], b"{}"].concat(),
            "header",
        ),
        (
            "offsets that overlap",
            header(
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#,
                &[0; 8],
            ),
            "safetensors",
        ),
        (
            "a size that does not match the shape",
            header(
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,4]}}"#,
                &[0; 4],
            ),
            "safetensors",
        ),
    ] {
        std::fs::write(&bad, &bytes).unwrap();
        let e = nn::load(&bad, &device).unwrap_err().to_string();
        assert_one_line(&e);
        assert!(
            e.contains("bad.safetensors")
                && e.contains("not a valid safetensors file")
                && e.contains(needle),
            "{what}: {e}"
        );
    }
}

#[test]
fn a_lower_limit_refuses_a_file_that_the_default_reads() {
    let device = test_device();
    let weights = scratch("small.safetensors");
    let t = Tensor::from_slice(&[1.0f32; 64], &[64], &device).unwrap();
    nn::save(&weights, &[("t".into(), t)]).unwrap();
    let size = std::fs::metadata(&weights).unwrap().len();
    assert_eq!(nn::load_limited(&weights, &device, size).unwrap().len(), 1);
    let e = nn::load_limited(&weights, &device, size - 1)
        .unwrap_err()
        .to_string();
    assert_one_line(&e);
    assert!(
        e.contains("small.safetensors")
            && e.contains(&format!("({} bytes) a weights file may be", size - 1))
            && e.contains("LABS_MAX_WEIGHTS_SIZE"),
        "{e}"
    );

    let snap = scratch("small.json");
    std::fs::write(&snap, snapshot::dump(&snapshot::Snapshot::default())).unwrap();
    let size = std::fs::metadata(&snap).unwrap().len();
    assert!(snapshot::load_file_limited(&snap, size).is_ok());
    let e = snapshot::load_file_limited(&snap, size - 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("small.json") && e.contains("--max-snapshot-size"),
        "{e}"
    );
}
