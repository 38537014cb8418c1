//! NFSv3 locking with the Linux kernel client: two kernel clients (each in
//! a network, mount and UTS namespace of its own, with its own lockd,
//! rpc.statd and rpcbind: `tests/vm/guest/lock-client`) mount nfsrdmad
//! over NFSv3 without `nolock` and lock through its lock manager (NLM 4,
//! NSM 1, found through the guest's rpcbind): exclusive and shared `fcntl`
//! locks on byte ranges across the two clients, a blocked waiter woken by
//! the server's GRANTED callback, `flock`, locks released on close and on
//! process exit, and a restart with `--state` during a held lock (the
//! client reclaims it after the server's SM_NOTIFY, the other client cannot
//! take it meanwhile). The same cases against the kernel nfsd are the
//! control.
//!
//! The clients mount over TCP: from a network namespace of its own a
//! client cannot reach the guest's Soft-RoCE device (rdma_cm answers
//! ADDR_ERROR), and its lock calls go over TCP with any NFS transport.
//!
//! Ignored on the host (it needs root, the kernel NFS modules, rpcbind and
//! rpc.statd); `scripts/test-vm` runs it inside the VM.

mod common;

use common::kernel::{addr, reset_nfs_services, sh, Daemon};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LOCK_CLIENT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vm/guest/lock-client");
const KNFSD_UP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vm/guest/knfsd-up");

/// A lock taker: `locker.py KIND PATH START LEN WAIT FLAGS`: KIND `ex`,
/// `sh` (fcntl locks) or `flock`; WAIT `nb` (fail with exit 11 if busy) or
/// `wait`; it creates FLAGS.trying just before it asks for the lock (a
/// Python start takes seconds under emulation); once it holds the lock it
/// creates FLAGS.held and keeps it until
/// FLAGS.release exists (then closes the file; exit 0), or forever with
/// FLAGS `-` (it is killed).
const LOCKER: &str = r#"
import fcntl, os, sys, time
kind, path, start, length, wait, flags = sys.argv[1:7]
start, length = int(start), int(length)
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
if flags != "-":
    open(flags + ".trying", "w").close()
try:
    if kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if wait == "nb" else 0))
    else:
        op = fcntl.LOCK_EX if kind == "ex" else fcntl.LOCK_SH
        # lockf's shared locks need a descriptor open for reading: it is.
        fcntl.lockf(fd, op | (fcntl.LOCK_NB if wait == "nb" else 0), length, start)
except OSError as e:
    print(f"busy: {e}", flush=True)
    sys.exit(11)
if flags != "-":
    open(flags + ".held", "w").close()
    while not os.path.exists(flags + ".release"):
        time.sleep(0.05)
else:
    while True:
        time.sleep(1)
os.close(fd)
"#;

/// One kernel client of the test (`lock-client --index N`).
struct Client {
    index: u32,
    mnt: String,
}

impl Client {
    fn up(index: u32, server: &str) -> Client {
        let mnt = format!("/mnt/nlm{index}");
        sh(&format!(
            "{LOCK_CLIENT} --index {index} up {server} {mnt} vers=3,proto=tcp"
        ));
        let line = std::fs::read_to_string("/proc/mounts").unwrap();
        let m = line
            .lines()
            .find(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                f.get(1) == Some(&mnt.as_str()) && f.get(2) == Some(&"nfs")
            })
            .unwrap_or_else(|| panic!("{mnt} is not mounted"));
        assert!(
            !m.contains("nolock") && m.contains("vers=3"),
            "an NFSv3 mount with locking: {m}"
        );
        Client { index, mnt }
    }

    fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.mnt)
    }

    /// Tries a lock without waiting: whether it was granted (and then let
    /// go at once).
    fn try_lock(&self, kind: &str, name: &str, start: u64, len: u64) -> bool {
        let st = run_locker(locker(
            kind,
            &self.path(name),
            start,
            len,
            "nb",
            "/tmp/nlm-none",
        ));
        match st {
            0 => true,
            11 => false,
            other => panic!("locker exited with {other}"),
        }
    }

    /// A process that takes the lock and holds it until released.
    fn hold(&self, kind: &str, name: &str, start: u64, len: u64, wait: &str) -> Holder {
        let flags = format!("/tmp/nlm-{}-{name}-{start}-{kind}", self.index);
        for f in [".trying", ".held", ".release"] {
            let _ = std::fs::remove_file(format!("{flags}{f}"));
        }
        let child = locker(kind, &self.path(name), start, len, wait, &flags)
            .spawn()
            .unwrap();
        Holder { child, flags }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = Command::new(LOCK_CLIENT)
            .args(["--index", &self.index.to_string(), "down"])
            .stdout(Stdio::null())
            .status();
    }
}

fn locker(kind: &str, path: &str, start: u64, len: u64, wait: &str, flags: &str) -> Command {
    let mut c = Command::new("python3");
    c.args([
        "-c",
        LOCKER,
        kind,
        path,
        &start.to_string(),
        &len.to_string(),
        wait,
        flags,
    ]);
    c
}

/// Runs a `nb` locker (whose FLAGS.release exists already, so it lets go
/// at once): its exit code. A locker still running after two minutes
/// fails the test.
fn run_locker(mut c: Command) -> i32 {
    std::fs::write("/tmp/nlm-none.release", b"").unwrap();
    let mut child = c.stdout(Stdio::null()).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("a non-blocking lock attempt did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Holder {
    child: Child,
    flags: String,
}

impl Holder {
    /// Waits until it holds its lock; false if it did not within `secs`
    /// (or exited).
    fn holds_within(&mut self, secs: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if Path::new(&format!("{}.held", self.flags)).exists() {
                return true;
            }
            if let Some(st) = self.child.try_wait().unwrap() {
                panic!("the lock holder exited with {st} before holding");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Waits until it is about to ask for its lock.
    fn trying_within(&mut self, secs: u64) -> bool {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while Instant::now() < deadline {
            if Path::new(&format!("{}.trying", self.flags)).exists() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Lets it close its file and waits for it.
    fn release(mut self) {
        std::fs::write(format!("{}.release", self.flags), b"").unwrap();
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the lock holder exited with {st}");
    }

    fn kill(self) {
        drop(self);
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // A process killed while its server is gone can hang in its unlock
        // (a hard mount retries): give up on it after a while.
        let _ = self.child.kill();
        for _ in 0..100 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Waits until `f` is true, up to `secs`.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The cases both servers must pass, through clients `a` and `b`.
fn lock_cases(a: &Client, b: &Client, server: &str) {
    eprintln!("--- {server}");
    // Exclusive byte ranges: a holds [0, 100); b is refused inside it and
    // served beside it; a shared lock inside it is refused too.
    let mut h = a.hold("ex", "ranges", 0, 100, "nb");
    assert!(h.holds_within(60), "{server}: a's first lock");
    assert!(
        !b.try_lock("ex", "ranges", 50, 1),
        "{server}: overlap granted"
    );
    assert!(
        !b.try_lock("sh", "ranges", 0, 1),
        "{server}: read lock in a write lock"
    );
    assert!(
        b.try_lock("ex", "ranges", 100, 10),
        "{server}: the next bytes refused"
    );
    h.release();
    assert!(
        b.try_lock("ex", "ranges", 50, 1),
        "{server}: not released on close"
    );

    // Shared locks: both clients read-lock one range; a writer waits.
    let mut h = a.hold("sh", "shared", 1000, 10, "nb");
    assert!(h.holds_within(60));
    assert!(
        b.try_lock("sh", "shared", 1000, 10),
        "{server}: two read locks"
    );
    assert!(
        !b.try_lock("ex", "shared", 1005, 1),
        "{server}: write in a read lock"
    );
    h.release();

    // A blocked waiter on b gets the lock when a lets go: the server calls
    // b back (GRANTED); the client's own retry would come only after 30 s.
    let mut h = a.hold("ex", "wait", 0, 0, "nb");
    assert!(h.holds_within(60));
    let mut w = b.hold("ex", "wait", 0, 0, "wait");
    assert!(w.trying_within(60), "{server}: the waiter did not start");
    assert!(!w.holds_within(4), "{server}: the waiter got a held lock");
    let released = Instant::now();
    h.release();
    assert!(w.holds_within(25), "{server}: the waiter was not woken");
    let woke = released.elapsed();
    eprintln!("{server}: blocked waiter woken {woke:?} after the release");
    w.release();

    // flock: whole-file locks between the clients.
    let mut h = a.hold("flock", "flocked", 0, 0, "nb");
    assert!(h.holds_within(60));
    assert!(
        !b.try_lock("flock", "flocked", 0, 0),
        "{server}: flock granted twice"
    );
    h.release();
    assert!(
        b.try_lock("flock", "flocked", 0, 0),
        "{server}: flock not released"
    );

    // A process that dies holding a lock loses it.
    let mut h = a.hold("ex", "exit", 0, 0, "nb");
    assert!(h.holds_within(60));
    assert!(!b.try_lock("ex", "exit", 0, 1));
    h.kill();
    assert!(
        eventually(20, || b.try_lock("ex", "exit", 0, 1)),
        "{server}: a dead process's lock stayed"
    );
}

fn clean() {
    sh(&format!(
        "for i in 1 2; do {LOCK_CLIENT} --index $i down >/dev/null 2>&1; done; \
         pkill -x rpc.statd; true"
    ));
    reset_nfs_services();
}

#[test]
#[ignore = "needs the kernel NFS client and rpcbind: run with scripts/test-vm"]
fn kernel_clients_lock_over_nfsv3_through_nfsrdmads_lock_manager() {
    common::kernel::in_vm(&["nfsv3"]);
    clean();
    let a_addr = addr();
    sh("rpcbind -w");
    let state = "/tmp/nlm.state";
    let _ = std::fs::remove_file(state);
    let flags = ["--state", state, "--grace", "15"];
    let d = Daemon::start_registered(&flags, "info");
    let reg = sh(&format!("rpcinfo -p {a_addr}"));
    for want in ["100021    4   tcp   2049", "100024    1   tcp   2049"] {
        assert!(reg.contains(want), "not registered: {want}\n{reg}");
    }
    let a = Client::up(1, &a_addr);
    let b = Client::up(2, &a_addr);
    lock_cases(&a, &b, "nfsrdmad");

    // A restart with --state while a holds a lock: the next instance tells
    // a (SM_NOTIFY); a reclaims in the grace period; b cannot take it, not
    // in the grace period (its calls wait it out) nor after it.
    let mut h = a.hold("ex", "restart", 0, 0, "nb");
    assert!(h.holds_within(60));
    let (ok, report1) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report1}");
    assert!(
        report1.contains("GRANTED callbacks taken ")
            && !report1.contains("GRANTED callbacks taken 0"),
        "the blocked waiter was not woken by a GRANTED callback:\n{report1}"
    );
    for l in report1.lines().filter(|l| l.starts_with("nlm:")) {
        eprintln!("before the restart: {l}");
    }
    let d = Daemon::start_registered(&flags, "info");
    let t = Instant::now();
    assert!(
        !b.try_lock("ex", "restart", 0, 1),
        "the lock was lost in the restart"
    );
    eprintln!("b was refused {:?} after the restart", t.elapsed());
    h.release();
    assert!(
        b.try_lock("ex", "restart", 0, 1),
        "the reclaimed lock was not released"
    );
    let (ok, report2) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report2}");
    eprintln!("{report2}");
    assert!(
        report2.contains("SM_NOTIFY") && report2.contains("10.97.1.2"),
        "a was not told of the restart:\n{report2}"
    );
    assert!(
        report2.contains("refused in grace ") && !report2.contains("refused in grace 0"),
        "b was not held back in the grace period:\n{report2}"
    );
    drop((a, b));
    clean();
    let _ = std::fs::remove_file(state);
}

#[test]
#[ignore = "needs the kernel NFS client and server: run with scripts/test-vm"]
fn kernel_clients_lock_over_nfsv3_through_the_kernel_nfsd_as_the_control() {
    common::kernel::in_vm(&["nfsv3"]);
    clean();
    sh("modprobe lockd && echo 10 > /proc/sys/fs/nfs/nlm_grace_period");
    sh(&format!("{KNFSD_UP} >/dev/null"));
    sh("rpc.statd --no-notify");
    // The kernel lockd's grace period (10 s) runs from nfsd's start.
    std::thread::sleep(Duration::from_secs(11));
    let a = Client::up(1, &addr());
    let b = Client::up(2, &addr());
    lock_cases(&a, &b, "kernel nfsd");
    drop((a, b));
    clean();
}
