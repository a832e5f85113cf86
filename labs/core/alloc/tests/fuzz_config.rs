//! Fuzzing the configuration and size parsers: mutations of valid `LABS_ALLOC_CONF`
//! strings and sizes. Every case must end, without a panic, in a value or a one-line
//! error, quickly and in little memory; a configuration that parses must survive its
//! own round trip through `to_conf_string`.
//! `LABS_FUZZ_CASES=10000 cargo test -p labs-core --test fuzz_config` for a longer run.

mod bounded;

use std::time::Duration;

use bounded::mutate::{apply, mutations};
use bounded::{assert_one_line, bounded};
use labs_alloc::alloc::Config;
use labs_base::format::parse_bytes;
use proptest::prelude::*;

const CONFS: &[&str] = &[
    "",
    "expandable_segments:True",
    "max_split_size_mb:128,garbage_collection_threshold:0.6",
    "roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:False",
    "roundup_power2_divisions:4,per_process_memory_fraction:0.5,park_freed_blocks:False",
    "backend:native,max_split_size_mb:21",
];

const SIZES: &[&str] = &[
    "512", "20MiB", "16GiB", "1.5GB", "80G", "1e9", "0.5KiB", "3EiB",
];

const MIB: usize = 1 << 20;
const LIMIT: Duration = Duration::from_secs(2);

#[test]
fn mutated_configurations_parse_or_fail_cleanly() {
    let strategy = (any::<prop::sample::Index>(), mutations(6));
    let tally = bounded::fuzz("fuzz_config: conf", 500, strategy, |(seed, m)| {
        let bytes = apply(CONFS[seed.index(CONFS.len())].as_bytes(), &m);
        let text = String::from_utf8_lossy(&bytes);
        match bounded("parsing", 4 * MIB + 4 * text.len(), LIMIT, || {
            Config::parse(&text)
        }) {
            Ok(c) => {
                let again = Config::parse(&c.to_conf_string());
                assert_eq!(again.as_ref(), Ok(&c), "round trip of {text:?}");
                "parsed"
            }
            Err(e) => {
                assert_one_line(&e.to_string());
                "refused"
            }
        }
    });
    assert!(tally.contains_key("parsed"), "{tally:?}");
}

#[test]
fn mutated_sizes_parse_exactly_or_fail_cleanly() {
    let strategy = (any::<prop::sample::Index>(), mutations(4));
    let tally = bounded::fuzz("fuzz_config: sizes", 500, strategy, |(seed, m)| {
        let bytes = apply(SIZES[seed.index(SIZES.len())].as_bytes(), &m);
        let text = String::from_utf8_lossy(&bytes);
        match bounded("parsing", MIB + 4 * text.len(), LIMIT, || {
            parse_bytes(&text)
        }) {
            Ok(n) => {
                // Exact: plain digits read back as themselves.
                let t = text.trim();
                if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
                    assert_eq!(t.parse::<u64>().ok(), Some(n), "{text:?}");
                }
                "parsed"
            }
            Err(e) => {
                assert_one_line(&e);
                "refused"
            }
        }
    });
    assert!(tally.contains_key("parsed"), "{tally:?}");
}

/// `LABS_FUZZ_SEED=random` prints the seed it drew, in a form that can be pasted back,
/// and that seed repeats the run: this test runs one of its neighbours twice, in child
/// processes of this test binary.
#[test]
fn a_random_seed_is_printed_and_repeats_the_run() {
    let run = |seed: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["mutated_sizes_parse_exactly_or_fail_cleanly", "--exact"])
            .args(["--nocapture", "--test-threads=1"])
            .env("LABS_FUZZ_SEED", seed)
            // Enough cases that some mutated size still parses (the test asserts one does).
            .env("LABS_FUZZ_CASES", "400")
            .env_remove("PROPTEST_CASES")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let first = run("random");
    let seed = (first.lines())
        .find_map(|l| {
            l.split_once("LABS_FUZZ_SEED=")
                .map(|(_, s)| s.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no LABS_FUZZ_SEED=<n> line in:\n{first}"));
    assert!(seed.parse::<u64>().is_ok(), "{seed:?}");
    let tally = |text: &str| {
        (text.lines())
            .find(|l| l.starts_with("fuzz_config: sizes: ") && l.contains(" cases: "))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no tally in:\n{text}"))
    };
    assert!(tally(&first).contains(" 400 cases"), "{first}");
    assert_eq!(tally(&run(&seed)), tally(&first), "seed {seed}");
}
