//! nfsrdmad refuses bad settings before it starts serving: a clear message
//! naming the flag, a non-zero exit, no listener left behind.

mod common;

use common::{nfsrdmad, serving};

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs nfsrdmad with `args`; returns (exited with success, stderr). Kills
/// it after 20 s (a daemon that accepted the flags would run on).
fn run(args: &[&str]) -> (bool, String) {
    run_with_env(args, &[])
}

/// [`run`] with more environment variables.
fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut child = nfsrdmad(args)
        .envs(env.iter().copied())
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
            &["--rdma-threads", "0"][..],
            "--rdma-threads must be between 1 and 1024",
        ),
        (
            &["--rdma-threads", "1025"][..],
            "--rdma-threads must be between 1 and 1024",
        ),
        (
            &["--rdma-srq", "65537"][..],
            "--rdma-srq must be between 0 and 65536",
        ),
        (
            &["--delegations", "maybe"][..],
            "--delegations must be on or off",
        ),
        (
            &["--inline", "3000"][..],
            "--inline must be a multiple of 1K",
        ),
        (&["--poll", "sometimes"][..], "--poll"),
        (
            &["--max-io", "6000"][..],
            "--max-io must be a multiple of 4K between 4K and 1M",
        ),
        (
            &["--max-io", "2M"][..],
            "--max-io must be a multiple of 4K between 4K and 1M",
        ),
        (&["--max-io", "lots"][..], "--max-io"),
    ] {
        let (ok, err) = run(args);
        assert!(!ok, "{args:?} accepted");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // One line naming the problem, also where backtraces are asked for.
    let (ok, err) = run_with_env(&["--credits", "0"], &[("RUST_BACKTRACE", "1")]);
    assert!(!ok);
    assert_eq!(
        err.trim_end(),
        "nfsrdmad: error: --credits must be at least 1",
        "{err}"
    );
}

/// `--max-io` is what FSINFO offers clients as the largest READ and WRITE.
#[test]
fn max_io_is_offered_in_fsinfo() {
    use nfsrdma_xdr::nfs3::{FsRootArgs, Nfs3Args, Nfs3Res, NfsResult};
    let (mut child, addr) = serving(&["--no-rdma", "--max-io", "64K"], Stdio::null());
    let mut c = common::RawClient::connect(addr);
    let root = c.mount("/export");
    let r = c.nfs(Nfs3Args::Fsinfo(FsRootArgs { fsroot: root }));
    let _ = child.kill();
    let _ = child.wait();
    match r {
        Nfs3Res::Fsinfo(NfsResult::Ok(i)) => {
            assert_eq!((i.rtmax, i.wtmax), (64 << 10, 64 << 10));
            assert!(i.rtpref <= i.rtmax && i.wtpref <= i.wtmax, "{i:?}");
        }
        other => panic!("FSINFO: {other:?}"),
    }
}

/// `--null` turns `--export` into a null export: a WRITE is acknowledged
/// and changes the size, a READ returns zeros, and the report the daemon
/// prints when it stops counts both. A state file, which would promise the
/// data back after a restart, is refused beside it.
#[test]
fn null_flag_makes_a_null_export_and_refuses_a_state_file() {
    use nfsrdma_xdr::nfs3::{Data, Nfs3Args, Nfs3Res, NfsResult, Read3Args, StableHow, Write3Args};
    use std::io::Read;
    let (mut child, addr) = serving(&["--no-rdma", "--null"], Stdio::piped());
    let mut c = common::RawClient::connect(addr);
    let root = c.mount("/export");
    let f = c.create(&root, "f");
    match c.nfs(Nfs3Args::Write(Write3Args {
        file: f.clone(),
        offset: 0,
        count: 8192,
        stable: StableHow::FileSync,
        data: Data::new(bytes::Bytes::from(vec![0xab; 8192])),
    })) {
        Nfs3Res::Write(NfsResult::Ok(w)) => {
            assert_eq!(w.count, 8192);
            assert_eq!(w.file_wcc.after.expect("attributes").size, 8192);
        }
        r => panic!("WRITE: {r:?}"),
    }
    match c.nfs(Nfs3Args::Read(Read3Args {
        file: f,
        offset: 4096,
        count: 8192,
    })) {
        Nfs3Res::Read(NfsResult::Ok(r)) => {
            assert!(r.eof);
            assert_eq!(r.data.len(), 4096);
            assert!(r.data.bytes().all(|b| b == 0), "a null export kept data");
        }
        r => panic!("READ: {r:?}"),
    }
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(term.success());
    let status = child.wait().expect("wait");
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert!(status.success(), "{err}");
    assert!(
        err.contains(
            "null export /export: READ bytes answered with zeros 4096, WRITE bytes discarded 8192"
        ),
        "{err}"
    );

    let state = std::env::temp_dir().join(format!("nfsrdmad-null-{}.state", std::process::id()));
    let (ok, err) = run(&["--no-rdma", "--null", "--state", state.to_str().unwrap()]);
    assert!(!ok, "--null with --state accepted");
    assert!(err.contains("is a null export, which keeps none"), "{err}");
    assert!(!state.exists());
}

/// `--versions` picks the NFS versions served and `--lease` the NFSv4
/// lease; bad values are refused by name.
#[test]
fn versions_lease_and_grace_flags() {
    for (args, says) in [
        (&["--versions", "4.0"][..], "NFSv4.0 is not served"),
        (&["--versions", "3,5"][..], "unknown NFS version \"5\""),
        (&["--lease", "5"][..], "--lease must be between 10 and 3600"),
        (
            &["--grace", "3601"][..],
            "--grace must be between 0 and 3600",
        ),
    ] {
        let (ok, err) = run(args);
        assert!(!ok, "{args:?} accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    use nfsrdma_xdr::rpc::AcceptStat;
    // v3 only: a COMPOUND is a program mismatch naming 3..3.
    let (mut child, addr) = serving(&["--no-rdma", "--versions", "3"], Stdio::null());
    let mut c = common::RawClient::connect(addr);
    let (h, _) = c.call(100003, 4, 0, &[]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        common::accept_stat(&h),
        Some(AcceptStat::ProgMismatch { low: 3, high: 3 })
    );
    // 4.2 only: NFSv3 is refused, 4.1 COMPOUNDs are a minor version
    // mismatch, 4.2 NULL answers.
    let (mut child, addr) = serving(&["--no-rdma", "--versions", "4.2"], Stdio::null());
    let mut c = common::RawClient::connect(addr);
    let (h3, _) = c.call(100003, 3, 0, &[]);
    let (h4, _) = c.call(100003, 4, 0, &[]);
    // COMPOUND: empty tag, minor version 1, no operations.
    let (h41, mut d) = c.call(100003, 4, 1, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        common::accept_stat(&h3),
        Some(AcceptStat::ProgMismatch { low: 4, high: 4 })
    );
    common::assert_success(&h4);
    common::assert_success(&h41);
    assert_eq!(
        d.u32("status").unwrap(),
        10021,
        "NFS4ERR_MINOR_VERS_MISMATCH"
    );
}
