//! The rendezvous against processes that are not ranks of the job: whatever connects to
//! rank 0's port (a web request, a frame claiming a huge length, a connection that says
//! nothing, a greeting without the job's token) is refused and takes no rank's slot;
//! rank 0 still meets the real ranks, and says what it refused in one short line.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use labs_base::Error;
use labs_dist::dist::{self, DistEnv, Rendezvous};

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

fn env(rank: usize, world_size: usize, port: u16) -> DistEnv {
    DistEnv {
        rank,
        local_rank: rank,
        world_size,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        job_token: Some(TOKEN.into()),
    }
}

fn connect(port: u16) -> TcpStream {
    let started = Instant::now();
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(e) if started.elapsed() > Duration::from_secs(20) => panic!("connecting: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn framed(bytes: &[u8]) -> Vec<u8> {
    let mut frame = (bytes.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(bytes);
    frame
}

/// Connects to `port` and sends `bytes`, keeping the connection open.
fn stranger(port: u16, bytes: &[u8]) -> TcpStream {
    let mut s = connect(port);
    // A refused stranger may find the connection closed before it has sent everything.
    let _ = s.write_all(bytes);
    s
}

const ID: [u8; 128] = [7; 128];

/// Ranks 0 and 1 of a job of two, on threads; `strangers` connect once rank 0 listens
/// and before rank 1 comes, and stay connected until both ranks are done. Each rank's
/// id, or its error.
fn rendezvous_with(
    timeout: Duration,
    strangers: impl FnOnce(u16) -> Vec<TcpStream>,
) -> [Result<[u8; 128], Error>; 2] {
    let port = dist::free_loopback_port().unwrap();
    std::thread::scope(|s| {
        let root =
            s.spawn(move || Rendezvous::join(&env(0, 2, port), timeout, || Ok(ID)).map(|r| r.1));
        let kept = strangers(port);
        // Time for rank 0 to read what the strangers sent before rank 1 comes.
        std::thread::sleep(Duration::from_millis(200));
        let one = s.spawn(move || {
            Rendezvous::join(&env(1, 2, port), timeout, || panic!("rank 1 makes no id"))
                .map(|r| r.1)
        });
        let outcome = [root.join().unwrap(), one.join().unwrap()];
        drop(kept);
        outcome
    })
}

fn assert_both_met(outcome: [Result<[u8; 128], Error>; 2]) {
    for (rank, r) in outcome.into_iter().enumerate() {
        match r {
            Ok(id) => assert_eq!(id, ID, "rank {rank}"),
            Err(e) => panic!("rank {rank}: {e}"),
        }
    }
}

#[test]
fn a_web_request_to_rank_zero_is_refused() {
    let request = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";
    assert_both_met(rendezvous_with(Duration::from_secs(15), |port| {
        vec![stranger(port, request)]
    }));
}

#[test]
fn a_frame_claiming_a_huge_length_is_refused() {
    assert_both_met(rendezvous_with(Duration::from_secs(15), |port| {
        vec![stranger(port, &(u64::MAX / 3).to_le_bytes())]
    }));
}

#[test]
fn a_silent_connection_blocks_no_rank() {
    let started = Instant::now();
    assert_both_met(rendezvous_with(Duration::from_secs(8), |port| {
        vec![connect(port), stranger(port, &[1, 0])]
    }));
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn greetings_without_the_jobs_token_take_no_slot() {
    assert_both_met(rendezvous_with(Duration::from_secs(15), |port| {
        [
            "labs-rendezvous rank=1 world=2".to_string(),
            "labs-rendezvous/2 rank=1 world=2 token=-".to_string(),
            format!("labs-rendezvous/2 rank=1 world=2 token={}", &TOKEN[1..]),
            format!("labs-rendezvous/2 rank=1 world=2 token={}0", &TOKEN[1..]),
        ]
        .iter()
        .map(|g| stranger(port, &framed(g.as_bytes())))
        .collect()
    }));
}

#[test]
fn a_huge_greeting_is_refused() {
    assert_both_met(rendezvous_with(Duration::from_secs(15), |port| {
        vec![stranger(port, &framed(&vec![b'x'; 1 << 20]))]
    }));
}

/// The variable that makes this test binary rank 0 of a job of two at that port.
const ROOT_PORT: &str = "LABS_TEST_RENDEZVOUS_ROOT_PORT";

#[test]
fn refusals_are_logged_in_one_short_line_each() {
    if let Ok(port) = std::env::var(ROOT_PORT) {
        let port = port.parse().unwrap();
        let (_, id) = Rendezvous::join(&env(0, 2, port), Duration::from_secs(20), || Ok(ID))
            .unwrap_or_else(|e| panic!("rank 0: {e}"));
        assert_eq!(id, ID);
        println!("rank 0 met rank 1");
        return;
    }
    let port = dist::free_loopback_port().unwrap();
    let exe = std::env::current_exe().unwrap();
    let root = std::process::Command::new(exe)
        .args([
            "refusals_are_logged_in_one_short_line_each",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROOT_PORT, port.to_string())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let kept = vec![
        stranger(port, &framed(&vec![b'x'; 1 << 20])),
        stranger(port, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n"),
        stranger(port, &framed(b"labs-rendezvous/2 rank=1 world=2 token=-")),
    ];
    std::thread::sleep(Duration::from_millis(300));
    let one = Rendezvous::join(&env(1, 2, port), Duration::from_secs(20), || Ok(ID));
    let out = root.wait_with_output().unwrap();
    drop(kept);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(one.is_ok() && out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("rank 0 met rank 1"), "{stdout}");
    let refusals: Vec<&str> = stderr.lines().filter(|l| l.contains("refused")).collect();
    assert_eq!(refusals.len(), 3, "{stderr}");
    for line in stderr.lines() {
        assert!(line.len() <= 300, "a log line of {} bytes", line.len());
    }
    assert!(
        stderr.contains("1048584 bytes") || stderr.contains("1048576"),
        "{stderr}"
    );
}

#[test]
fn missing_ranks_are_counted_not_listed() {
    let port = dist::free_loopback_port().unwrap();
    let e = Rendezvous::join(&env(0, 60_000, port), Duration::from_millis(300), || Ok(ID))
        .err()
        .unwrap()
        .to_string();
    assert!(e.len() < 300, "an error of {} bytes", e.len());
    assert!(e.contains("59999 of 60000"), "{e}");
}

#[test]
fn a_huge_world_is_refused_before_anything_is_sized_by_it() {
    let port = dist::free_loopback_port().unwrap();
    let e = Rendezvous::join(&env(0, 1 << 40, port), Duration::from_millis(300), || {
        Ok(ID)
    })
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("WORLD_SIZE=1099511627776") && e.contains("65536"),
        "{e}"
    );
}

#[test]
fn a_member_that_claims_a_huge_barrier_message_is_an_error_not_an_abort() {
    use std::io::Read;
    let port = dist::free_loopback_port().unwrap();
    let root = std::thread::spawn(move || {
        Rendezvous::join(&env(0, 2, port), Duration::from_secs(15), || Ok(ID))
            .map(|_| ())
            .expect_err("rank 0 fails")
            .to_string()
    });
    // Rank 1 by hand: the right greeting, then a barrier message claiming ~6 EB.
    let hello = format!("labs-rendezvous/2 rank=1 world=2 token={TOKEN}");
    let mut one = stranger(port, &framed(hello.as_bytes()));
    let mut reply = [0u8; 8 + 1 + 128];
    one.read_exact(&mut reply).unwrap();
    assert_eq!(reply[8], 0, "rank 0 admitted rank 1");
    assert_eq!(&reply[9..], &ID);
    one.write_all(&(u64::MAX / 3).to_le_bytes()).unwrap();
    let e = root.join().unwrap();
    assert!(
        e.contains("rank 1") && e.contains("more than the limit"),
        "{e}"
    );
    assert!(e.len() < 300, "{e}");
}

/// A job's variables with `name` set to `value` (`None`: the usual ones).
fn vars(change: Option<(&'static str, String)>) -> impl Fn(&str) -> Option<String> {
    let mut pairs: Vec<(&str, String)> = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]
    .iter()
    .map(|(n, v)| (*n, v.to_string()))
    .collect();
    if let Some((name, value)) = change {
        pairs.retain(|(n, _)| *n != name);
        pairs.push((name, value));
    }
    move |name| {
        pairs
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.clone())
    }
}

#[test]
fn the_environment_is_checked_before_it_is_used() {
    let ok = DistEnv::from_vars(vars(None)).unwrap();
    assert_eq!((ok.rank, ok.world_size, ok.job_token), (0, 2, None));
    let token = DistEnv::from_vars(vars(Some((dist::ENV_JOB_TOKEN, TOKEN.into())))).unwrap();
    assert_eq!(token.job_token.as_deref(), Some(TOKEN));
    for (name, value, says) in [
        ("WORLD_SIZE", "1099511627776".to_string(), "1 to 65536"),
        ("WORLD_SIZE", "0".into(), "1 to 65536"),
        ("RANK", "2".into(), "not a rank of WORLD_SIZE=2"),
        ("LOCAL_RANK", "100000".into(), "LOCAL_RANK=100000"),
        ("MASTER_PORT", "65536".into(), "MASTER_PORT"),
        (dist::ENV_JOB_TOKEN, "has spaces".into(), "LABS_JOB_TOKEN"),
        ("RANK", "9".repeat(1 << 20), "RANK"),
    ] {
        let e = DistEnv::from_vars(vars(Some((name, value))))
            .expect_err(name)
            .to_string();
        assert!(e.contains(says) && e.len() < 200, "{name}: {e}");
    }
}

#[test]
fn launched_ranks_get_a_fresh_random_token() {
    let mut lines = Vec::new();
    dist::launch_with(
        2,
        "sh",
        &["-c".into(), "echo $LABS_JOB_TOKEN".into()],
        |l| lines.push(l.text),
    )
    .unwrap();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0], lines[1], "every rank of a job has its token");
    assert_eq!(lines[0].len(), 32);
    assert!(lines[0].bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(dist::new_job_token(), dist::new_job_token());
}

#[test]
fn a_rank_with_another_token_is_told_why() {
    let port = dist::free_loopback_port().unwrap();
    let root = std::thread::spawn(move || {
        Rendezvous::join(&env(0, 2, port), Duration::from_secs(2), || Ok(ID))
            .map(|_| ())
            .expect_err("rank 1 never joins")
            .to_string()
    });
    let mut one = env(1, 2, port);
    one.job_token = Some("another-job".into());
    let e = Rendezvous::join(&one, Duration::from_secs(10), || Ok(ID))
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(
        e.contains("refused this rank") && e.contains("LABS_JOB_TOKEN"),
        "{e}"
    );
    let e = root.join().unwrap();
    assert!(e.contains("1 of 2 ranks never connected"), "{e}");
}
