//! The calculator answers what lab-10's dry run and lab-05's fit answer, to the byte,
//! and turns every bad request into one line. (The page's WebAssembly build is held to
//! `lab-10 --dry-run` itself by the book's browser test.)

use labs_browser::calculator::{answer, answer_json, Request};
use labs_core::Device;
use labs_train::{parse_flags, TrainConfig};

fn request(flags: &str) -> Request {
    Request {
        flags: flags.into(),
        capacity: "80GiB".into(),
        gemm_workspace: "32MiB".into(),
        ..Request::default()
    }
}

/// `lab-10 --dry-run --capacity 80GiB --gemm-workspace 32MiB train FLAGS` as lab-10
/// runs it.
fn lab10(config: &TrainConfig) -> labs_train::TrainReport {
    let device = Device::new_dry(80 << 30);
    device.set_gemm_workspace_bytes(32 << 20).unwrap();
    labs_train::run(config, &device).unwrap()
}

#[test]
fn every_configuration_of_chapter_10_gets_lab_10s_peaks() {
    use lab_10::experiments::configs::{configurations, Scale};
    // The chapter's full-size runs (GPT-2 small at batch 8 x 1024 among them).
    let configs = configurations(Scale::Full);
    assert!(configs.len() >= 17, "{} configurations", configs.len());
    for c in configs {
        let a = answer(&request(&c.flags)).unwrap();
        let mut config = parse_flags(&c.flags).unwrap();
        config.timeline = true;
        let want = lab10(&config);
        assert_eq!(a.report.peak_allocated, want.peak_allocated, "{}", c.name);
        assert_eq!(a.report.peak_reserved, want.peak_reserved, "{}", c.name);
        assert_eq!(a.report.by_category, want.by_category, "{}", c.name);
        assert!(a.report.oom.is_none(), "{}", c.name);
        let svg = a.timeline_svg.expect("a timeline");
        assert!(
            svg.starts_with("<svg") && svg.contains("activation"),
            "{}",
            c.name
        );
        assert!(a.command.contains(&c.flags), "{}: {}", c.name, a.command);
    }
}

#[test]
fn a_step_that_does_not_fit_reports_the_out_of_memory_error() {
    let a = answer(&Request {
        capacity: "4GiB".into(),
        ..request("--model gpt2 --batch 16")
    })
    .unwrap();
    let oom = a
        .report
        .oom
        .expect("GPT-2 small at batch 16 x 1024 needs more than 4 GiB");
    assert!(oom.contains("out of memory on dry:"), "{oom}");
    assert!(oom.contains("total capacity of 4.00 GiB"), "{oom}");
}

#[test]
fn the_fit_search_finds_lab_05s_batch() {
    let base = "--model transformer --d-model 256 --seq 100 --steps 2";
    let capacity = 3u64 << 30;
    let a = answer(&Request {
        capacity: capacity.to_string(),
        fit: true,
        ..request(base)
    })
    .unwrap();
    let fit = a.fit.unwrap();
    let target = Device::new_dry(capacity);
    target.set_gemm_workspace_bytes(32 << 20).unwrap();
    let mut config = parse_flags(base).unwrap();
    config.timeline = true;
    let want = lab_05::fit_train::predict(
        &target,
        capacity,
        &config,
        labs_browser::calculator::MAX_FIT_BATCH,
    )
    .unwrap();
    assert_eq!(fit.batch, want.search.batch);
    assert_eq!(fit.trials, want.search.trials);
    assert_eq!(fit.peak_reserved, Some(want.report.peak_reserved));
    assert!(fit.batch > 1);
    assert!(
        fit.trials.contains(&(fit.batch, true)) && fit.trials.contains(&(fit.batch + 1, false))
    );
}

#[test]
fn data_parallel_runs_are_rank_0s() {
    let a = answer(&request(
        "--model gpt2 --layers 2 --batch 2 --nproc 4 --zero1",
    ))
    .unwrap();
    assert_eq!(a.report.world_size, 4);
    assert_eq!(a.report.data_parallel.as_deref(), Some("zero1"));
    let one = answer(&request("--model gpt2 --layers 2 --batch 2")).unwrap();
    // ZeRO-1 shards Adam's state over the ranks: rank 0 holds a quarter of it.
    let state =
        |r: &labs_train::TrainReport| r.by_category.get("optimizer_state").copied().unwrap_or(0);
    assert!(
        state(&a.report) < state(&one.report),
        "{:?} vs {:?}",
        a.report.by_category,
        one.report.by_category
    );
    // ZeRO-2 shards the gradients too.
    let z2 = answer(&request(
        "--model gpt2 --layers 2 --batch 2 --nproc 4 --zero2",
    ))
    .unwrap();
    assert_eq!(z2.report.data_parallel.as_deref(), Some("zero2"));
    let grads = |r: &labs_train::TrainReport| r.by_category.get("gradient").copied().unwrap_or(0);
    assert!(
        grads(&z2.report) < grads(&a.report),
        "{:?}",
        z2.report.by_category
    );
}

#[test]
fn the_allocator_setting_is_the_one_asked_for() {
    let flags = "--model transformer --d-model 256 --seq 100 --batch 16";
    let pytorch = answer(&request(flags)).unwrap();
    assert_eq!(pytorch.report.allocator, "expandable_segments:False");
    let labs = answer(&Request {
        alloc_conf: "preset:labs".into(),
        ..request(flags)
    })
    .unwrap();
    assert!(
        labs.report.allocator.contains("recycle_idle_pages:True"),
        "{}",
        labs.report.allocator
    );
    assert!(
        labs.command
            .starts_with("LABS_ALLOC_CONF=preset:labs lab-10"),
        "{}",
        labs.command
    );
    // The same run under the preset's policy: the peaks are its own.
    let mut config = parse_flags(flags).unwrap();
    config.timeline = true;
    let device = Device::new_dry(80 << 30);
    device
        .configure_allocator(labs_core::alloc::Config::labs())
        .unwrap();
    device.set_gemm_workspace_bytes(32 << 20).unwrap();
    let want = labs_train::run(&config, &device).unwrap();
    assert_eq!(labs.report.peak_reserved, want.peak_reserved);
    assert_ne!(labs.report.peak_reserved, pytorch.report.peak_reserved);
}

#[test]
fn bad_requests_are_one_line_errors() {
    for (json, says) in [
        (r#"{"flags": "--model gpt3", "capacity": "80GiB"}"#, "gpt3"),
        (r#"{"flags": "--batch 0", "capacity": "80GiB"}"#, "batch"),
        (r#"{"flags": "--nhead 5", "capacity": "80GiB"}"#, "nhead"),
        (
            r#"{"flags": "--model gpt2", "capacity": "lots"}"#,
            "the GPU's memory",
        ),
        (
            r#"{"flags": "--model gpt2", "capacity": "0"}"#,
            "more than 0",
        ),
        (
            r#"{"flags": "--model gpt2", "capacity": "80GiB", "alloc_conf": "nonsense:1"}"#,
            "allocator",
        ),
        (
            r#"{"flags": "--model gpt2", "capacity": "80GiB", "gemm_workspace": "x"}"#,
            "workspace",
        ),
        (
            r#"{"flags": "--timeline t.svg", "capacity": "80GiB"}"#,
            "--timeline",
        ),
        (
            r#"{"flags": "--nproc 0 --ddp", "capacity": "80GiB"}"#,
            "--nproc",
        ),
        (r#"{"flags": "--model gpt2""#, "the request"),
        (r#"{"flags": "", "capacity": "1GiB", "extra": 1}"#, "extra"),
    ] {
        let out: serde_json::Value = serde_json::from_str(&answer_json(json)).unwrap();
        let e = out["error"]
            .as_str()
            .unwrap_or_else(|| panic!("{json}: no error in {out}"));
        assert!(!e.contains('\n'), "{json}: {e}");
        assert!(e.contains(says), "{json}: {e:?} does not mention {says:?}");
    }
}
