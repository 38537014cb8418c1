//! `nfsrdma mount` (FUSE) against our server over TCP, in-process: a POSIX
//! behaviour suite, standard tools through the mount, and bad input.
//! Runs as root (mounting FUSE needs it here); /dev/fuse must exist.

mod common;

use common::{pattern, TestServer, EXPORTS};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_nfsrdma");
/// Upper bound on waiting for a mount to appear or go away.
const MOUNT_WAIT: Duration = Duration::from_secs(60);

static SEQ: AtomicUsize = AtomicUsize::new(0);

fn scratch(name: &str) -> PathBuf {
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

fn require_fuse() {
    if !Path::new("/dev/fuse").exists() {
        let _ = Command::new("modprobe").arg("fuse").status();
    }
    assert!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: load the `fuse` kernel module (modprobe fuse) or pass the device \
         into the container; these tests need it"
    );
}

fn mounted(dir: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = dir.to_str().unwrap();
    info.lines().any(|l| {
        l.split(' ').nth(4) == Some(want)
            && l.split_once(" - ")
                .is_some_and(|(_, rest)| rest.starts_with("fuse"))
    })
}

fn conn_opts(addr: std::net::SocketAddr) -> String {
    format!("port={0},mountport={0},uid=0,gid=0", addr.port())
}

/// A mount made by the `nfsrdma` binary in the foreground; unmounted on
/// drop whatever happened.
struct Mount {
    dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

impl Mount {
    fn new(server: &TestServer, extra: &str) -> Mount {
        Self::at(server.addr, "/export", extra)
    }

    fn at(addr: std::net::SocketAddr, export: &str, extra: &str) -> Mount {
        require_fuse();
        let base = scratch("mnt");
        let dir = base.join("m");
        fs::create_dir(&dir).unwrap();
        let log = base.join("log");
        let mut opts = conn_opts(addr);
        if !extra.is_empty() {
            opts.push(',');
            opts.push_str(extra);
        }
        let child = Command::new(BIN)
            .args(["mount", "-f", "-o", &opts])
            .arg(format!("127.0.0.1:{export}"))
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

    fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// `nfsrdma umount`, then waits for the mount process to exit.
    fn unmount(mut self) -> std::process::ExitStatus {
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
            assert!(start.elapsed() < MOUNT_WAIT, "mount process did not exit");
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

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn posix_suite() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");

    // Create, write, read back.
    fs::write(m.p("a.txt"), b"hello, world\n").unwrap();
    assert_eq!(fs::read(m.p("a.txt")).unwrap(), b"hello, world\n");
    assert_eq!(fs::metadata(m.p("a.txt")).unwrap().len(), 13);

    // Writes at offsets, overwrite in the middle, append.
    {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(m.p("a.txt"))
            .unwrap();
        f.seek(SeekFrom::Start(7)).unwrap();
        f.write_all(b"WORLD").unwrap();
        f.sync_all().unwrap();
    }
    {
        let mut f = OpenOptions::new().append(true).open(m.p("a.txt")).unwrap();
        f.write_all(b"more\n").unwrap();
    }
    assert_eq!(fs::read(m.p("a.txt")).unwrap(), b"hello, WORLD\nmore\n");

    // Rename (also over an existing file), then the old name is gone.
    fs::write(m.p("b.txt"), b"b").unwrap();
    fs::rename(m.p("a.txt"), m.p("b.txt")).unwrap();
    assert_eq!(
        errno_of(&fs::metadata(m.p("a.txt")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(fs::read(m.p("b.txt")).unwrap(), b"hello, WORLD\nmore\n");

    // Hard link: same inode, two links.
    fs::hard_link(m.p("b.txt"), m.p("c.txt")).unwrap();
    let (b, c) = (
        fs::metadata(m.p("b.txt")).unwrap(),
        fs::metadata(m.p("c.txt")).unwrap(),
    );
    assert_eq!(b.ino(), c.ino());
    assert_eq!(c.nlink(), 2);
    fs::remove_file(m.p("c.txt")).unwrap();
    assert_eq!(fs::metadata(m.p("b.txt")).unwrap().nlink(), 1);

    // Symlink and readlink.
    std::os::unix::fs::symlink("b.txt", m.p("ln")).unwrap();
    assert_eq!(fs::read_link(m.p("ln")).unwrap(), Path::new("b.txt"));
    assert!(fs::symlink_metadata(m.p("ln"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(m.p("ln")).unwrap(), b"hello, WORLD\nmore\n");

    // chmod, chown, utimens.
    fs::set_permissions(m.p("b.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(fs::metadata(m.p("b.txt")).unwrap().mode() & 0o7777, 0o640);
    std::os::unix::fs::chown(m.p("b.txt"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(m.p("b.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options()
        .write(true)
        .open(m.p("b.txt"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    assert_eq!(fs::metadata(m.p("b.txt")).unwrap().mtime(), 1_000_000_000);

    // Truncate down and up.
    let f = OpenOptions::new().write(true).open(m.p("b.txt")).unwrap();
    f.set_len(5).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("b.txt")).unwrap(), b"hello");
    let f = OpenOptions::new().write(true).open(m.p("b.txt")).unwrap();
    f.set_len(8).unwrap();
    drop(f);
    assert_eq!(fs::read(m.p("b.txt")).unwrap(), b"hello\0\0\0");
    // O_TRUNC.
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.p("b.txt"))
        .unwrap();
    assert_eq!(fs::metadata(m.p("b.txt")).unwrap().len(), 0);

    // Sparse file: a write far out, zeros before it.
    {
        let mut f = File::create(m.p("sparse")).unwrap();
        f.seek(SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(b"end").unwrap();
    }
    let mut f = File::open(m.p("sparse")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), (10 << 20) + 3);
    let mut buf = vec![1u8; 4096];
    f.seek(SeekFrom::Start(5 << 20)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    let mut tail = Vec::new();
    f.seek(SeekFrom::Start(10 << 20)).unwrap();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, b"end");
    drop(f);

    // O_EXCL: the second exclusive create fails with EEXIST.
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(m.p("excl"))
        .unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("excl")).unwrap().mode() & 0o777, 0o600);
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("excl"))
        .unwrap_err();
    assert_eq!(errno_of(&e), libc::EEXIST);

    // Directories.
    fs::create_dir(m.p("d")).unwrap();
    fs::write(m.p("d/x"), b"x").unwrap();
    assert_eq!(
        errno_of(&fs::remove_dir(m.p("d")).unwrap_err()),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno_of(&fs::create_dir(m.p("d")).unwrap_err()),
        libc::EEXIST
    );
    fs::rename(m.p("d"), m.p("e")).unwrap();
    assert_eq!(fs::read(m.p("e/x")).unwrap(), b"x");
    fs::remove_file(m.p("e/x")).unwrap();
    fs::remove_dir(m.p("e")).unwrap();
    assert_eq!(
        errno_of(&fs::remove_file(m.p("nope")).unwrap_err()),
        libc::ENOENT
    );
    assert_eq!(
        errno_of(&fs::read_dir(m.p("b.txt")).unwrap_err()),
        libc::ENOTDIR
    );

    // mknod: a FIFO.
    run(Command::new("mkfifo").arg(m.p("fifo")));
    assert!(fs::metadata(m.p("fifo")).unwrap().file_type().is_fifo());
    // mknod: a character device (1:3, like /dev/null); removed again.
    run(Command::new("mknod").arg(m.p("chr")).args(["c", "1", "3"]));
    let md = fs::metadata(m.p("chr")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), 0x103);
    fs::remove_file(m.p("chr")).unwrap();

    // Listing.
    let mut names: Vec<String> = fs::read_dir(&m.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b.txt", "excl", "fifo", "ln", "sparse"]);

    // statfs.
    let out = run(Command::new("stat").args(["-f", "-c", "%b %S"]).arg(&m.dir));
    let blocks: u64 = out.split_whitespace().next().unwrap().parse().unwrap();
    assert!(blocks > 0, "statfs: {out}");

    assert!(m.unmount().success());
}

#[test]
fn readdir_of_10000_entries() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");
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

#[test]
fn large_file_copy_256mib() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");
    let local = scratch("big").join("src");
    let size = 256usize << 20;
    {
        let mut f = File::create(&local).unwrap();
        for i in 0..(size >> 20) {
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
        "256 MiB: copy in {copy_in:?} ({:.1} MiB/s), copy out {copy_out:?} ({:.1} MiB/s)",
        256.0 / copy_in.as_secs_f64(),
        256.0 / copy_out.as_secs_f64()
    );
    let _ = fs::remove_dir_all(local.parent().unwrap());
    drop(m);
}

#[test]
fn concurrent_writers_to_different_files() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");
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

#[test]
fn close_to_open_sees_other_clients_changes() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");
    fs::write(m.p("shared"), b"version 1").unwrap();
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"version 1");
    // Another client changes the file (same size).
    std::thread::sleep(Duration::from_millis(1100));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = common::connect(&server, "/export").await;
        let (fh, _) = c.lookup_path("shared").await.unwrap();
        c.write_all(&fh, 0, bytes::Bytes::from_static(b"version 2"))
            .await
            .unwrap();
    });
    // A new open revalidates and drops stale pages.
    assert_eq!(fs::read(m.p("shared")).unwrap(), b"version 2");
    drop(m);
}

#[test]
fn standard_tools_through_the_mount() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");
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

#[test]
fn daemon_mode_and_sigterm() {
    require_fuse();
    let server = TestServer::start(EXPORTS);
    // Without -f: returns once mounted.
    let dir = scratch("daemon").join("m");
    fs::create_dir(&dir).unwrap();
    let st = Command::new(BIN)
        .args(["mount", "-o", &conn_opts(server.addr)])
        .arg("127.0.0.1:/export")
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
    let m = Mount::new(&server, "");
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

#[test]
fn bad_input() {
    let server = TestServer::start(EXPORTS);
    let opts = conn_opts(server.addr);
    // Export that does not exist (foreground and daemon mode).
    for fg in [true, false] {
        let mut args = vec!["-o", &opts, "127.0.0.1:/nope"];
        if fg {
            args.insert(0, "-f");
        }
        let (code, err) = mount_fails(&args);
        assert_ne!(code, 0);
        assert!(
            err.contains("/nope") && err.contains("MNT3ERR_NOENT"),
            "{err}"
        );
    }
    // Server down: nothing listens there.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    let dead_opts = format!("{},soft,timeo=20,retrans=1", conn_opts(dead));
    let (code, err) = mount_fails(&["-f", "-o", &dead_opts, "127.0.0.1:/export"]);
    assert_ne!(code, 0);
    assert!(err.contains("cannot connect"), "{err}");
    // Invalid options: exit 2 with a message naming the option.
    for (bad, says) in [
        ("proto=udp", "proto=udp"),
        ("rsize=abc", "rsize=abc"),
        ("frobnicate", "frobnicate"),
    ] {
        let (code, err) = mount_fails(&["-o", bad, "127.0.0.1:/export"]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains(says), "{err}");
    }
    let (code, err) = mount_fails(&["no-colon"]);
    assert_eq!(code, 2, "{err}");
}

/// A TCP forwarder that can be cut: connections are closed and new ones
/// refused, as when the server dies.
struct Killable {
    addr: std::net::SocketAddr,
    rt: Option<tokio::runtime::Runtime>,
}

impl Killable {
    fn start(upstream: std::net::SocketAddr) -> Killable {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = l.local_addr().unwrap();
        rt.spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
            }
        });
        Killable { addr, rt: Some(rt) }
    }

    fn kill(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

#[test]
fn server_dies_mid_copy_soft() {
    let server = TestServer::start(EXPORTS);
    let mut proxy = Killable::start(server.addr);
    let m = Mount::at(proxy.addr, "/export", "soft,timeo=10,retrans=1");
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
        assert!(start.elapsed() < MOUNT_WAIT, "copy made no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    proxy.kill();
    let r = writer.join().unwrap();
    let e = r.expect_err("the copy must fail once the server is gone");
    assert_eq!(errno_of(&e), libc::EIO, "{e}");
    // The mount can still be taken down.
    let st = m.unmount();
    println!("mount process after server death: {st}");
}

/// Serves `service` on a new port from its own runtime thread.
fn serve(
    service: std::sync::Arc<nfsrdma_server::service::Service>,
) -> (std::net::SocketAddr, tokio::sync::watch::Sender<bool>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            nfsrdma_server::tcp::TcpServer::new(service, Default::default())
                .serve(l, rx)
                .await;
        });
    });
    (addr, tx)
}

/// A TCP forwarder whose upstream can be switched; switching cuts the
/// connections made so far.
struct Switch {
    addr: std::net::SocketAddr,
    upstream: std::sync::Arc<std::sync::Mutex<std::net::SocketAddr>>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    rt: tokio::runtime::Runtime,
}

impl Switch {
    fn start(upstream: std::net::SocketAddr) -> Switch {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = l.local_addr().unwrap();
        let up = std::sync::Arc::new(std::sync::Mutex::new(upstream));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (up2, conns2) = (up.clone(), conns.clone());
        rt.spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                let target = *up2.lock().unwrap();
                let h = tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                conns2.lock().unwrap().push(h);
            }
        });
        Switch {
            addr,
            upstream: up,
            conns,
            rt,
        }
    }

    fn switch_to(&self, upstream: std::net::SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for Switch {
    fn drop(&mut self) {
        self.switch_to(self.addr);
        let _ = &self.rt;
    }
}

/// A server "restart" between the unstable WRITEs and the COMMIT: the new
/// instance has another write verifier, so fsync writes the data again.
#[test]
fn write_verifier_change_resends_uncommitted_data() {
    use nfsrdma_server::exports::Exports;
    use nfsrdma_server::service::{Export, Service, ServiceConfig};
    use nfsrdma_server::store::StoreConfig;
    use nfsrdma_xdr::nfs3::NfsProc3;
    use std::sync::Arc;

    let rules = Exports::parse(EXPORTS).unwrap();
    let first = Service::exports_from_rules(&rules, &StoreConfig::default());
    // The second instance serves the same stores (the data survived).
    let second: Vec<Export> = first
        .iter()
        .map(|e| Export {
            path: e.path.clone(),
            rules: e.rules.clone(),
            store: e.store.clone(),
        })
        .collect();
    let a = Arc::new(Service::new(first, ServiceConfig::default()));
    std::thread::sleep(Duration::from_millis(2));
    let b = Arc::new(Service::new(second, ServiceConfig::default()));
    assert_ne!(a.write_verf(), b.write_verf());
    let (addr_a, _stop_a) = serve(a.clone());
    let (addr_b, _stop_b) = serve(b.clone());
    let switch = Switch::start(addr_a);
    let m = Mount::at(switch.addr, "/export", "");

    let data = pattern(42, 3 << 20);
    let mut f = File::create(m.p("v")).unwrap();
    f.write_all(&data).unwrap();
    let unstable = a.metrics().calls(NfsProc3::Write);
    assert!(unstable > 0);
    assert_eq!(a.metrics().calls(NfsProc3::Commit), 0);
    switch.switch_to(addr_b);
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(b.metrics().calls(NfsProc3::Commit), 1);
    assert_eq!(
        b.metrics().calls(NfsProc3::Write),
        unstable,
        "every unstable WRITE is sent again after the verifier changed"
    );
    assert_eq!(fs::read(m.p("v")).unwrap(), data);
    drop(m);
}

/// POSIX: an unlinked (or replaced) file stays usable while it is open;
/// its hidden name goes at the last close.
#[test]
fn open_file_survives_unlink_and_replace() {
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "");
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

#[test]
fn read_only_mount() {
    let server = TestServer::start(EXPORTS);
    {
        let m = Mount::new(&server, "");
        fs::write(m.p("f"), b"data").unwrap();
    }
    let m = Mount::new(&server, "ro");
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
#[test]
fn noac_mount() {
    use nfsrdma_xdr::nfs3::NfsProc3;
    let server = TestServer::start(EXPORTS);
    let m = Mount::new(&server, "noac");
    fs::write(m.p("f"), pattern(1, 1 << 20)).unwrap();
    assert_eq!(server.service.metrics().calls(NfsProc3::Commit), 0);
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), 1 << 20);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let c = common::connect(&server, "/export").await;
        let (fh, _) = c.lookup_path("f").await.unwrap();
        c.write_all(&fh, 1 << 20, bytes::Bytes::from_static(b"tail"))
            .await
            .unwrap();
    });
    assert_eq!(fs::metadata(m.p("f")).unwrap().len(), (1 << 20) + 4);
    drop(m);
}
