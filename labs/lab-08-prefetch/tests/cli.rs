//! The lab's command line: the JSON contract of `bench`, and the default tables.

use std::process::Command;

/// The lab's binary: where cargo built it, or in the GPU bundle, `LABS_BIN_DIR`.
fn binary() -> std::path::PathBuf {
    labs_core::testing::lab_binary("lab-08", env!("CARGO_BIN_EXE_lab-08"))
}

fn lab() -> Command {
    let mut c = Command::new(binary());
    c.args(["--device", "sim", "--quick"]);
    c
}

#[test]
fn bench_json_is_one_object_with_the_documented_keys() {
    let out = lab().args(["bench", "--json"]).output().unwrap();
    let v = labs_core::testing::one_json_object(out);
    for key in [
        "naive_step_ms",
        "prefetch_step_ms",
        "copy_ms",
        "compute_ms",
        "prefetch_ratio",
        "pinned_htod_gbps",
        "pinned_dtoh_gbps",
        "pageable_htod_gbps",
        "pageable_dtoh_gbps",
        "prefetch_step_worst_ms",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    for key in [
        "pinned_allocs",
        "pinned_frees",
        "device_allocs",
        "device_frees",
        "device_syncs",
    ] {
        assert!(v["timed_driver_work"][key].is_u64(), "{key}: {v}");
    }
    assert!(!v["bandwidth"].as_array().unwrap().is_empty());
    assert!(
        v["pytorch"].is_null(),
        "no --pytorch, no PyTorch figures: {v}"
    );
}

#[test]
fn the_default_command_prints_every_experiment() {
    let out = lab().output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for title in [
        "non_blocking=True",
        "Training-like loop",
        // The same ratio as bench's, so that the two runs compare directly.
        "prefetched / max(copy, compute) = ",
        "driver calls in the timed steps: ",
        "pinned-memory pool",
    ] {
        assert!(text.contains(title), "missing {title}:\n{text}");
    }
    // Chapter 11's experiments are lab-11's.
    for title in ["Getting host memory", "where its input lives"] {
        assert!(!text.contains(title), "{title} is lab-11's:\n{text}");
    }
}

/// A file under the system's temporary folder, unique to this process and `name`.
fn temp_file(name: &str, contents: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("lab-08-{}-{name}", std::process::id()));
    std::fs::write(&path, contents).unwrap();
    path
}

/// What `python3 ci/pytorch-reference.py` prints, cut to a few of its keys plus the ones
/// `bench` reads.
const REFERENCE: &str = r#"{"torch": "2.11.0+cu130", "device_name": "NVIDIA Test GPU", "pinned_htod_gbps": 55.46, "pinned_dtoh_gbps": 55.32, "pageable_htod_gbps": 9.53, "pageable_dtoh_gbps": 16.65, "python_alloc_free_pair_ns": {"512": 2202.0}}
"#;

#[test]
fn pytorch_figures_are_read_from_the_reference_json() {
    let good = temp_file("good.json", REFERENCE);
    let p = lab_08::bench::read_pytorch(&good).unwrap();
    assert_eq!(p.device_name, "NVIDIA Test GPU");
    assert_eq!(p.torch.as_deref(), Some("2.11.0+cu130"));
    assert_eq!(
        (
            p.pinned_htod_gbps,
            p.pinned_dtoh_gbps,
            p.pageable_htod_gbps,
            p.pageable_dtoh_gbps
        ),
        (55.46, 55.32, 9.53, 16.65)
    );
    std::fs::remove_file(good).unwrap();
}

#[test]
fn bad_pytorch_files_give_errors_that_name_the_file_and_the_problem() {
    let message =
        |path: &std::path::Path| format!("{:#}", lab_08::bench::read_pytorch(path).unwrap_err());
    let missing = std::env::temp_dir().join("lab-08-no-such-reference.json");
    let m = message(&missing);
    assert!(
        m.contains("reading PyTorch's figures from") && m.contains("no-such-reference"),
        "{m}"
    );

    let malformed = temp_file("malformed.json", "{\"device_name\": \"NVIDIA H100\", ");
    let m = message(&malformed);
    assert!(
        m.contains("is not the JSON object ci/pytorch-reference.py prints"),
        "{m}"
    );

    let short = temp_file(
        "short.json",
        r#"{"device_name": "NVIDIA H100", "pinned_htod_gbps": 55.0}"#,
    );
    let m = message(&short);
    assert!(
        m.contains("pinned_dtoh_gbps"),
        "a missing key is named: {m}"
    );

    let zero = temp_file("zero.json", &REFERENCE.replace("9.53", "0.0"));
    let m = message(&zero);
    assert!(m.contains("pageable_htod_gbps is 0"), "{m}");
    for f in [malformed, short, zero] {
        std::fs::remove_file(f).unwrap();
    }
}

#[test]
fn bench_prints_pytorch_figures_only_when_given_a_file() {
    let good = temp_file("bench.json", REFERENCE);
    let out = lab()
        .args(["bench", "--pytorch"])
        .arg(&good)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("beside PyTorch's 1 GiB copies on NVIDIA Test GPU (torch 2.11.0+cu130)"),
        "{text}"
    );
    assert!(
        text.contains(" 9.5 |") && text.contains(" 55.5 |"),
        "PyTorch's figures: {text}"
    );
    assert!(
        text.contains("not the same GPU"),
        "another GPU's figures are said to be: {text}"
    );
    assert!(
        !text.contains(lab_08::bench::PYTORCH_NOT_MEASURED),
        "{text}"
    );
    std::fs::remove_file(good).unwrap();

    let out = lab().arg("bench").output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains(lab_08::bench::PYTORCH_NOT_MEASURED), "{text}");
    assert!(!text.contains("PyTorch pinned"), "{text}");
}

#[test]
fn bench_stops_before_measuring_on_a_bad_pytorch_file() {
    let out = lab()
        .args(["bench", "--json", "--pytorch", "no-such-reference.json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing measured or printed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-reference.json"), "{err}");
}

/// A FIFO given as PyTorch's figures is refused at once, naming it, instead of blocking
/// the lab until some program writes to it.
#[cfg(unix)]
#[test]
fn a_fifo_as_pytorchs_figures_is_refused_at_once() {
    let fifo = labs_core::testing::make_fifo("lab08-pytorch.json");
    labs_core::testing::assert_refused(
        lab().args(["bench", "--pytorch"]).arg(&fifo),
        std::time::Duration::from_secs(60),
        &[fifo.to_str().unwrap(), "FIFO"],
    );
}
