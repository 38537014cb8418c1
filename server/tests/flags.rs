//! nfsrdmad refuses bad settings before it starts serving: a clear message
//! naming the flag, a non-zero exit, no listener left behind.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs nfsrdmad with `args`; returns (exited with success, stderr). Kills
/// it after 20 s (a daemon that accepted the flags would run on).
fn run(args: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
        .args([
            "--export",
            "/export",
            "--tcp",
            "127.0.0.1:0",
            "--no-rpcbind",
        ])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nfsrdmad");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("nfsrdmad {args:?} kept running: the flags were accepted");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    (status.success(), err)
}

#[test]
fn bad_rdma_settings_are_refused_by_name() {
    for (args, says) in [
        (
            &["--signal-every", "0"][..],
            "--signal-every must be between 1 and 64",
        ),
        (
            &["--signal-every", "65"][..],
            "--signal-every must be between 1 and 64",
        ),
        (&["--credits", "0"][..], "--credits must be at least 1"),
        (
            &["--inline", "3000"][..],
            "--inline must be a multiple of 1K",
        ),
        (&["--poll", "sometimes"][..], "--poll"),
    ] {
        let (ok, err) = run(args);
        assert!(!ok, "{args:?} accepted");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
