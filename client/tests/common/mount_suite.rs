//! The `nfsrdma mount` (FUSE) behaviour suite, written once and run against
//! several targets: our server in-process over TCP on the host
//! (`tests/mount.rs`), and nfsrdmad and the kernel's nfsd over RPC-over-RDMA
//! in the Soft-RoCE VM (`tests/vm_mount.rs`). A target says how to mount it,
//! how to reach it with a second client, how many calls its server
//! executed, and how to restart or kill that server.
//!
//! Included with `#[path = "common/mount_suite.rs"] mod mount_suite;` next
//! to `mod common;` (it uses `crate::common`). Every test here runs as
//! root (mounting FUSE needs it) and needs /dev/fuse.
#![allow(dead_code)]

use crate::common::pattern;
use nfsrdma_client::xdr::nfs3::NfsProc3;
use nfsrdma_client::{Client, ConnectOptions};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_nfsrdma");
/// Upper bound on waiting for a mount to appear or go away.
pub const MOUNT_WAIT: Duration = Duration::from_secs(60);
/// The export every target serves.
pub const EXPORT: &str = "/export";

/// The server behind a target. A few checks differ between servers; each
/// place that branches on this says why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Server {
    /// nfsrdmad (in-process or the daemon).
    Ours,
    /// The Linux kernel's nfsd with rpc.mountd.
    KernelNfsd,
}

/// What the suite mounts, and the hooks it needs into the server.
pub trait Target {
    /// Which server answers.
    fn server(&self) -> Server;
    /// The server's address as `nfsrdma mount` is given it (`HOST` of
    /// `HOST:/export`).
    fn host(&self) -> String;
    /// `-o` options that reach the server: transport, ports, credential.
    fn conn_opts(&self) -> String;
    /// `-o` options under which no NFS server answers (MOUNT may), and the
    /// `ADDR:PORT` the client will fail to connect to.
    fn dead_conn_opts(&self) -> (String, String);
    /// Options for a second client (the library) to the same export.
    fn other_client(&self) -> ConnectOptions;
    /// Calls of `proc` the server executed since the target started,
    /// restarts included.
    fn calls(&mut self, proc: NfsProc3) -> u64;
    /// Stops the server and starts it again with the same files; the new
    /// instance has another write verifier.
    fn restart_keeping_data(&mut self);
    /// The server dies: its connections are cut and nothing answers any
    /// more.
    fn kill(&mut self);
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "mount-{}-{}-{}",
        name,
        std::process::id(),
        SEQ.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

pub fn require_fuse() {
    if !Path::new("/dev/fuse").exists() {
        let _ = Command::new("modprobe").arg("fuse").status();
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: load the `fuse` kernel module (modprobe fuse) or pass the device \
         into the container; these tests need it"
    );
}

pub fn mounted(dir: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = dir.to_str().unwrap();
    info.lines().any(|l| {
        l.split(' ').nth(4) == Some(want)
            && l.split_once(" - ")
                .is_some_and(|(_, rest)| rest.starts_with("fuse"))
    })
}

/// A mount made by the `nfsrdma` binary in the foreground; unmounted on
/// drop whatever happened.
pub struct Mount {
    pub dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Mount {
    /// Mounts the target's export with its connection options and `extra`.
    pub fn new(t: &dyn Target, extra: &str) -> Mount {
        let mut opts = t.conn_opts();
        if !extra.is_empty() {
            opts.push(',');
            opts.push_str(extra);
        }
        Self::with_opts(&format!("{}:{EXPORT}", t.host()), &opts)
    }

    fn with_opts(source: &str, opts: &str) -> Mount {
        require_fuse();
        let base = scratch("mnt");
        let dir = base.join("m");
        fs::create_dir(&dir).unwrap();
        let log = base.join("log");
        let child = Command::new(BIN)
            .args(["mount", "-f", "-o", opts])
            .arg(source)
            .arg(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("start nfsrdma mount");
        let mut m = Mount {
            dir,
            child: Some(child),
            log,
        };
        let start = Instant::now();
        while !mounted(&m.dir) {
            if let Some(st) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "nfsrdma mount exited ({st}): {}",
                    fs::read_to_string(&m.log).unwrap_or_default()
                );
            }
            assert!(start.elapsed() < MOUNT_WAIT, "mount did not appear");
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// `nfsrdma umount`, then waits for the mount process to exit.
    pub fn unmount(self) -> std::process::ExitStatus {
        self.unmount_within(MOUNT_WAIT)
    }

    /// `nfsrdma umount`, then waits up to `limit` for the mount process to
    /// exit.
    pub fn unmount_within(mut self, limit: Duration) -> std::process::ExitStatus {
        let st = Command::new(BIN)
            .arg("umount")
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(st.success(), "nfsrdma umount failed");
        let mut child = self.child.take().unwrap();
        let start = Instant::now();
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < limit,
                "mount process did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if mounted(&self.dir) {
            let ok = Command::new(BIN)
                .arg("umount")
                .arg(&self.dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
            }
        }
        if let Some(mut c) = self.child.take() {
            let start = Instant::now();
            while c.try_wait().ok().flatten().is_none() && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Remove the scratch directory, never through a live mount.
        if !mounted(&self.dir) {
            if let Some(base) = self.dir.parent() {
                let _ = fs::remove_dir_all(base);
            }
        }
    }
}

pub use crate::posix::{errno_of, run};

/// Runs `f` with a second client (the library) on the target's export.
fn with_other_client(t: &dyn Target, f: impl AsyncFnOnce(Client)) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = Client::connect(&t.other_client(), &t.host(), EXPORT)
            .await
            .expect("second client");
        f(c).await
    });
}

pub fn posix_suite(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    crate::posix::posix_checks(&m.dir);
    assert!(m.unmount().success());
}

pub fn readdir_of_10000_entries(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    fs::create_dir(m.p("big")).unwrap();
    let t = Instant::now();
    for i in 0..10_000 {
        File::create(m.p(&format!("big/file-{i:05}"))).unwrap();
    }
    let created = t.elapsed();
    let t = Instant::now();
    let mut names: Vec<String> = fs::read_dir(m.p("big"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let listed = t.elapsed();
    names.sort();
    assert_eq!(names.len(), 10_000);
    for (i, n) in names.iter().enumerate() {
        assert_eq!(*n, format!("file-{i:05}"));
    }
    // ls -l: every entry's attributes (primed by READDIRPLUS).
    let t = Instant::now();
    let out = run(Command::new("ls").arg("-l").arg(m.p("big")));
    let ls_l = t.elapsed();
    assert_eq!(out.lines().count(), 10_001);
    println!("10,000 entries: create {created:?}, readdir {listed:?}, ls -l {ls_l:?}");
    drop(m);
}

/// Copies a `mib` MiB file into the mount and out again with `cp`, and
/// compares checksums of all three copies.
pub fn large_file_copy(t: &mut dyn Target, mib: usize) {
    let m = Mount::new(t, "");
    let local = scratch("big").join("src");
    let size = mib << 20;
    {
        let mut f = File::create(&local).unwrap();
        for i in 0..mib {
            f.write_all(&pattern(i as u64, 1 << 20)).unwrap();
        }
    }
    let t = Instant::now();
    run(Command::new("cp").arg(&local).arg(m.p("big")));
    let copy_in = t.elapsed();
    assert_eq!(fs::metadata(m.p("big")).unwrap().len(), size as u64);
    let back = local.with_file_name("back");
    let t = Instant::now();
    run(Command::new("cp").arg(m.p("big")).arg(&back));
    let copy_out = t.elapsed();
    let sum = |p: &Path| {
        run(Command::new("sha256sum").arg(p))
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(sum(&local), sum(&back));
    assert_eq!(sum(&local), sum(&m.p("big")));
    println!(
        "{mib} MiB: copy in {copy_in:?} ({:.1} MiB/s), copy out {copy_out:?} ({:.1} MiB/s)",
        mib as f64 / copy_in.as_secs_f64(),
        mib as f64 / copy_out.as_secs_f64()
    );
    let _ = fs::remove_dir_all(local.parent().unwrap());
    drop(m);
}

pub fn concurrent_writers_to_different_files(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    let dir = m.dir.clone();
    let threads: Vec<_> = (0..8u64)
        .map(|i| {
            let p = dir.join(format!("w{i}"));
            std::thread::spawn(move || {
                let data = pattern(100 + i, 4 << 20);
                let mut f = File::create(&p).unwrap();
                for c in data.chunks(100_000) {
                    f.write_all(c).unwrap();
                }
                f.sync_all().unwrap();
                drop(f);
                assert_eq!(fs::read(&p).unwrap(), data);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for i in 0..8u64 {
        assert_eq!(
            fs::read(m.p(&format!("w{i}"))).unwrap(),
            pattern(100 + i, 4 << 20)
        );
    }
    drop(m);
}

pub fn close_to_open_sees_other_clients_changes(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    fs::write(m.p("shared"), b"version 1").unwrap();
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"version 1");
    // Another client changes the file (same size).
    std::thread::sleep(Duration::from_millis(1100));
    with_other_client(t, async |c| {
        let (fh, _) = c.lookup_path("shared").await.unwrap();
        c.write_all(&fh, 0, bytes::Bytes::from_static(b"version 2"))
            .await
            .unwrap();
    });
    // A new open revalidates and drops stale pages.
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"version 2");
    drop(m);
}

pub fn standard_tools_through_the_mount(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    let base = scratch("tools");
    let tree = base.join("tree");
    fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    for i in 0..50u64 {
        fs::write(tree.join(format!("f{i}")), pattern(i, (i as usize) * 1000)).unwrap();
    }
    fs::write(tree.join("sub/deeper/big"), pattern(7, 3 << 20)).unwrap();
    std::os::unix::fs::symlink("../f1", tree.join("sub/link")).unwrap();
    fs::set_permissions(tree.join("f3"), fs::Permissions::from_mode(0o751)).unwrap();

    // cp -a in, diff -r.
    run(Command::new("cp").arg("-a").arg(&tree).arg(m.p("tree")));
    run(Command::new("diff").arg("-r").arg(&tree).arg(m.p("tree")));
    assert_eq!(fs::metadata(m.p("tree/f3")).unwrap().mode() & 0o777, 0o751);

    // tar out of the mount, extract locally, compare.
    let tarball = base.join("t.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&m.dir)
        .arg("-cf")
        .arg(&tarball)
        .arg("tree"));
    let out = base.join("out");
    fs::create_dir(&out).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(&out)
        .arg("-xf")
        .arg(&tarball));
    run(Command::new("diff")
        .arg("-r")
        .arg(&tree)
        .arg(out.join("tree")));
    // tar into the mount.
    fs::create_dir(m.p("untar")).unwrap();
    run(Command::new("tar")
        .arg("-C")
        .arg(m.p("untar"))
        .arg("-xf")
        .arg(&tarball));
    run(Command::new("diff")
        .arg("-r")
        .arg(&tree)
        .arg(m.p("untar/tree")));

    // git inside the mount.
    let repo = m.p("repo");
    fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        run(Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=Test", "-c", "user.email=test@example.com"])
            .args(["-c", "init.defaultBranch=main", "-c", "safe.directory=*"])
            .args(args))
    };
    git(&["init", "-q"]);
    fs::write(repo.join("README"), b"hello\n").unwrap();
    fs::create_dir(repo.join("src")).unwrap();
    fs::write(repo.join("src/main.c"), b"int main(void) { return 0; }\n").unwrap();
    git(&["add", "."]);
    git(&["commit", "-q", "-m", "first"]);
    fs::write(repo.join("README"), b"hello again\n").unwrap();
    git(&["commit", "-q", "-am", "second"]);
    let log = git(&["log", "--oneline"]);
    assert_eq!(log.lines().count(), 2, "{log}");
    git(&["fsck"]);
    let st = git(&["status", "--porcelain"]);
    assert!(st.is_empty(), "{st}");
    let _ = fs::remove_dir_all(&base);
    drop(m);
}

pub fn daemon_mode_and_sigterm(t: &mut dyn Target) {
    require_fuse();
    // Without -f: returns once mounted.
    let dir = scratch("daemon").join("m");
    fs::create_dir(&dir).unwrap();
    let st = Command::new(BIN)
        .args(["mount", "-o", &t.conn_opts()])
        .arg(format!("{}:{EXPORT}", t.host()))
        .arg(&dir)
        .status()
        .unwrap();
    let guard = Mount {
        dir: dir.clone(),
        child: None,
        log: PathBuf::new(),
    };
    assert!(st.success());
    assert!(mounted(&dir));
    fs::write(dir.join("f"), b"daemon").unwrap();
    // Plain umount works too.
    run(Command::new("umount").arg(&dir));
    assert!(!mounted(&dir));
    drop(guard);

    // SIGTERM: writes back, unmounts, exits 0.
    let m = Mount::new(t, "");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"daemon");
    let pid = m.child.as_ref().unwrap().id();
    run(Command::new("kill").arg("-TERM").arg(pid.to_string()));
    let mut m = m;
    let mut child = m.child.take().unwrap();
    let start = Instant::now();
    let st = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed() < MOUNT_WAIT, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(st.success(), "{st}");
    assert!(!mounted(&m.dir));
}

fn mount_fails(args: &[&str]) -> (i32, String) {
    require_fuse();
    let dir = scratch("bad").join("m");
    fs::create_dir(&dir).unwrap();
    let out = Command::new(BIN)
        .arg("mount")
        .args(args)
        .arg(&dir)
        .output()
        .unwrap();
    if mounted(&dir) {
        let _ = Command::new("umount").arg("-l").arg(&dir).status();
        panic!("mounted unexpectedly");
    }
    let _ = fs::remove_dir_all(dir.parent().unwrap());
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn bad_input(t: &mut dyn Target) {
    let opts = t.conn_opts();
    let host = t.host();
    // Export that does not exist (foreground and daemon mode). nfsrdmad
    // answers MNT3ERR_NOENT; rpc.mountd looks the path up in its export
    // table first and refuses a path it does not export with
    // MNT3ERR_ACCES.
    let expect = match t.server() {
        Server::Ours => "MNT3ERR_NOENT",
        Server::KernelNfsd => "MNT3ERR_ACCES",
    };
    let nope = format!("{host}:/nope");
    for fg in [true, false] {
        let mut args = vec!["-o", &opts, &nope];
        if fg {
            args.insert(0, "-f");
        }
        let (code, err) = mount_fails(&args);
        assert_ne!(code, 0);
        assert!(err.contains("/nope") && err.contains(expect), "{err}");
    }
    // Server down: nothing answers NFS there.
    let (dead, dead_addr) = t.dead_conn_opts();
    let dead_opts = format!("{dead},soft,timeo=20,retrans=1");
    let source = format!("{host}:{EXPORT}");
    let (code, err) = mount_fails(&["-f", "-o", &dead_opts, &source]);
    assert_ne!(code, 0);
    assert!(err.contains("connect") && err.contains(&dead_addr), "{err}");
    // Invalid options: exit 2 with a message naming the option.
    for (bad, says) in [
        ("proto=udp", "proto=udp"),
        ("rsize=abc", "rsize=abc"),
        ("frobnicate", "frobnicate"),
    ] {
        let (code, err) = mount_fails(&["-o", bad, &source]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says), "{err}");
    }
    let (code, err) = mount_fails(&["no-colon"]);
    assert_eq!(code, 2, "{err}");
}

/// The server dies while a large copy is running on a `soft` mount: the
/// copy fails with EIO and the mount can still be taken down. A try's
/// timeout (3 s) is above a healthy reply's delay also in the Soft-RoCE
/// guest, where 1 MiB WRITEs queued behind each other took longer than 1 s.
/// Taking the mount down waits for the kernel's writeback of the dirty
/// pages, each batch failing only after its calls' timeouts (6 s).
pub fn server_dies_mid_copy_soft(t: &mut dyn Target) {
    let m = Mount::new(t, "soft,timeo=30,retrans=1");
    let p = m.p("victim");
    let writer = std::thread::spawn(move || -> std::io::Result<u64> {
        let mut f = File::create(&p)?;
        let chunk = pattern(9, 1 << 20);
        let mut written = 0u64;
        for _ in 0..4096 {
            f.write_all(&chunk)?;
            written += chunk.len() as u64;
        }
        f.sync_all()?;
        Ok(written)
    });
    // Let some data through, then the server "dies".
    let start = Instant::now();
    while fs::metadata(m.p("victim")).map(|md| md.len()).unwrap_or(0) < (8 << 20) {
        if writer.is_finished() {
            panic!(
                "the copy ended before the server died: {:?}; the mount's log: {}",
                writer.join().unwrap(),
                fs::read_to_string(&m.log).unwrap_or_default()
            );
        }
        assert!(
            start.elapsed() < MOUNT_WAIT,
            "copy made no progress: the file has {:?} bytes after {MOUNT_WAIT:?}",
            fs::metadata(m.p("victim")).map(|md| md.len())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    t.kill();
    let r = writer.join().unwrap();
    let e = r.expect_err("the copy must fail once the server is gone");
    assert_eq!(errno_of(&e), libc::EIO, "{e}");
    // The mount can still be taken down.
    let killed = Instant::now();
    let st = m.unmount_within(3 * MOUNT_WAIT);
    println!(
        "mount process after server death: {st}, {:?} after the kill",
        killed.elapsed()
    );
}

/// A server restart between the unstable WRITEs and the COMMIT: the new
/// instance has another write verifier, so fsync writes the data again.
/// The target's hooks must not start processes from this process while
/// the file is open: the child's close of its inherited descriptor at exec
/// reaches the mount as FUSE_FLUSH, which commits (as close does).
pub fn write_verifier_change_resends_uncommitted_data(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    let data = pattern(42, 3 << 20);
    // When another thread of this process forks and execs (a test running
    // alongside starts a mount, say), the child's copies of our open
    // descriptors are closed at its exec, and the kernel sends FUSE a
    // FLUSH for each; the mount then commits, as the kernel NFS client
    // does on every close. The data is then no longer unstable when the
    // server restarts, which is what this test is about: such an attempt
    // is made again with a new file.
    for attempt in 1..=5 {
        let name = format!("v{attempt}");
        let (w0, c0) = (t.calls(NfsProc3::Write), t.calls(NfsProc3::Commit));
        let mut f = File::create(m.p(&name)).unwrap();
        f.write_all(&data).unwrap();
        let unstable = t.calls(NfsProc3::Write) - w0;
        assert!(unstable > 0);
        if t.calls(NfsProc3::Commit) != c0 {
            eprintln!("attempt {attempt}: committed before the restart (a FLUSH from elsewhere)");
            drop(f);
            fs::remove_file(m.p(&name)).unwrap();
            continue;
        }
        t.restart_keeping_data();
        let (w1, c1) = (t.calls(NfsProc3::Write), t.calls(NfsProc3::Commit));
        f.sync_all().unwrap();
        drop(f);
        assert_eq!(t.calls(NfsProc3::Commit) - c1, 1);
        assert_eq!(
            t.calls(NfsProc3::Write) - w1,
            unstable,
            "every unstable WRITE is sent again after the verifier changed"
        );
        assert_eq!(fs::read(m.p(&name)).unwrap(), data);
        drop(m);
        return;
    }
    panic!("every attempt's data was committed before the server restarted");
}

/// POSIX: an unlinked (or replaced) file stays usable while it is open;
/// its hidden name goes at the last close.
pub fn open_file_survives_unlink_and_replace(t: &mut dyn Target) {
    let m = Mount::new(t, "");
    fs::write(m.p("u"), b"still here").unwrap();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("u"))
        .unwrap();
    fs::remove_file(m.p("u")).unwrap();
    assert_eq!(errno_of(&fs::metadata(m.p("u")).unwrap_err()), libc::ENOENT);
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here");
    f.write_all(b", and more").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    s.clear();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "still here, and more");
    drop(f);

    // Replaced by a rename while open.
    fs::write(m.p("r"), b"old").unwrap();
    fs::write(m.p("r.new"), b"new").unwrap();
    let mut f = File::open(m.p("r")).unwrap();
    fs::rename(m.p("r.new"), m.p("r")).unwrap();
    let mut s = String::new();
    f.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old");
    drop(f);
    assert_eq!(fs::read(m.p("r")).unwrap(), b"new");

    // A directory whose only file was removed while open: RMDIR fails with
    // ENOTEMPTY while the file stays open, and waits for its release (FUSE
    // sends it after close() returns) when it is closed meanwhile.
    fs::create_dir(m.p("dd")).unwrap();
    fs::write(m.p("dd/f"), b"x").unwrap();
    let f = File::open(m.p("dd/f")).unwrap();
    fs::remove_file(m.p("dd/f")).unwrap();
    assert_eq!(
        errno_of(&fs::remove_dir(m.p("dd")).unwrap_err()),
        libc::ENOTEMPTY
    );
    let closer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        drop(f);
    });
    fs::remove_dir(m.p("dd")).unwrap();
    closer.join().unwrap();

    // No hidden names are left once everything is closed (FUSE sends
    // RELEASE after close() returns: wait for it, bounded).
    let start = Instant::now();
    loop {
        let names: Vec<String> = fs::read_dir(&m.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        if names == ["r"] {
            break;
        }
        assert!(start.elapsed() < MOUNT_WAIT, "left behind: {names:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(m);
}

pub fn read_only_mount(t: &mut dyn Target) {
    {
        let m = Mount::new(t, "");
        fs::write(m.p("f"), b"data").unwrap();
    }
    let m = Mount::new(t, "ro");
    assert_eq!(fs::read(m.p("f")).unwrap(), b"data");
    assert_eq!(
        errno_of(&fs::write(m.p("g"), b"x").unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno_of(&OpenOptions::new().write(true).open(m.p("f")).unwrap_err()),
        libc::EROFS
    );
    assert_eq!(
        errno_of(&fs::remove_file(m.p("f")).unwrap_err()),
        libc::EROFS
    );
    drop(m);
}

/// `noac`: no attribute caching (another client's change shows at once)
/// and FILE_SYNC writes (no COMMIT needed).
pub fn noac_mount(t: &mut dyn Target) {
    let commits = t.calls(NfsProc3::Commit);
    let m = Mount::new(t, "noac");
    fs::write(m.p("f"), pattern(1, 1 << 20)).unwrap();
    assert_eq!(t.calls(NfsProc3::Commit), commits);
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 1 << 20);
    with_other_client(t, async |c| {
        let (fh, _) = c.lookup_path("f").await.unwrap();
        c.write_all(&fh, 1 << 20, bytes::Bytes::from_static(b"tail"))
            .await
            .unwrap();
    });
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), (1 << 20) + 4);
    drop(m);
}
