//! The Linux kernel NFS client mounting nfsrdmad with NFSv4.1 and NFSv4.2,
//! over TCP and RPC-over-RDMA, and with no version given (it negotiates
//! 4.2); the same file-system workload through each mount and through the
//! kernel nfsd's NFSv4.2 mount as the control; data written over NFSv3
//! read over NFSv4.2 and back; the POSIX checks of `nfsrdma mount`
//! through each mount; whole-file locks contended by two
//! processes; a restart with `--state` during an open, locked file,
//! which the client reclaims in the grace period; a client cut off for
//! longer than its lease loses its lock to another client.
//!
//! Ignored on the host (it needs root, rdma_rxe and the kernel NFS
//! modules); `scripts/test-vm` runs it inside the VM.

mod common;
// The POSIX checks `nfsrdma mount` passes, run here through the kernel
// client's NFSv4 mounts.
#[path = "../../client/tests/common/posix.rs"]
mod posix;

use common::kernel::{addr, reset_nfs_services, sh, Daemon};
use common::nfs4::V4;
use nfsrdma_xdr::nfs4::ops::LocktArgs;
use nfsrdma_xdr::nfs4::{ArgOp, LockType4, Opaque4, StateOwner4, Status};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

fn digest(d: &[u8]) -> String {
    // FNV-1a: enough to tell contents apart.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in d {
        h = (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

fn data(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Mounts `src` on `mnt` with `opts`; returns the mount's line in
/// /proc/mounts and its transport from mountstats.
fn mount(src: &str, mnt: &str, opts: &str) -> (String, String) {
    std::fs::create_dir_all(mnt).unwrap();
    sh(&format!("timeout 120 mount -t nfs -o {opts} {src} {mnt}"));
    let line = std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(mnt))
        .unwrap_or_else(|| panic!("{mnt} not in /proc/mounts"))
        .to_string();
    let stats = std::fs::read_to_string("/proc/self/mountstats").unwrap();
    let xprt = stats
        .split("device ")
        .find(|s| s.contains(&format!("mounted on {mnt} ")))
        .and_then(|s| s.lines().find(|l| l.trim_start().starts_with("xprt:")))
        .map(|l| l.split_whitespace().nth(1).unwrap_or("").to_string())
        .unwrap_or_default();
    (line, xprt)
}

/// A file-system workload; returns a manifest to compare between servers.
/// `v42`: the mount is NFSv4.2, so fallocate and hole punching work (over
/// NFSv4.1 the client refuses them).
fn workload(mnt: &Path, v42: bool) -> Vec<String> {
    let mut m = Vec::new();
    let p = mnt.join("posix");
    std::fs::create_dir(&p).unwrap();
    posix::posix_checks(&p);
    sh(&format!("rm -r {}", p.display()));
    let src = data(3 << 20, 7);
    std::fs::write("/tmp/v4-src", &src).unwrap();
    for bs in ["4k", "64k", "1M"] {
        let f = mnt.join(format!("direct-{bs}"));
        sh(&format!(
            "timeout 600 dd if=/tmp/v4-src of={} bs={bs} oflag=direct status=none",
            f.display()
        ));
        sh(&format!(
            "echo 3 > /proc/sys/vm/drop_caches; timeout 600 dd if={} of=/tmp/v4-back bs={bs} iflag=direct status=none",
            f.display()
        ));
        let got = std::fs::read("/tmp/v4-back").unwrap();
        assert!(got == src, "O_DIRECT {bs} read back differs");
        m.push(format!("direct-{bs} {} {}", got.len(), digest(&got)));
    }
    let odd = &src[..src.len() - 12_345];
    std::fs::write(mnt.join("buffered"), odd).unwrap();
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    assert!(
        std::fs::read(mnt.join("buffered")).unwrap() == odd,
        "buffered read back differs"
    );
    // Truncate (SETATTR of the size with the open's stateid), append.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(mnt.join("buffered"))
        .unwrap();
    f.set_len(100_000).unwrap();
    drop(f);
    sh(&format!("echo tail >> {}", mnt.join("buffered").display()));
    let got = std::fs::read(mnt.join("buffered")).unwrap();
    assert_eq!(&got[..100_000], &src[..100_000]);
    m.push(format!("truncated {} {}", got.len(), digest(&got)));
    // NFSv4.2: copy_file_range (COPY), fallocate (ALLOCATE), hole punch
    // (DEALLOCATE).
    sh(&format!(
        "cp {} {}",
        mnt.join("direct-1M").display(),
        mnt.join("copied").display()
    ));
    let got = std::fs::read(mnt.join("copied")).unwrap();
    assert!(got == src, "copy differs");
    m.push(format!("copied {} {}", got.len(), digest(&got)));
    if v42 {
        sh(&format!("fallocate -l 5M {}", mnt.join("copied").display()));
        sh(&format!(
            "fallocate -p -o 4096 -l 8192 {}",
            mnt.join("copied").display()
        ));
        sh("echo 3 > /proc/sys/vm/drop_caches");
        let got = std::fs::read(mnt.join("copied")).unwrap();
        assert_eq!(got.len(), 5 << 20);
        assert!(
            got[4096..12288].iter().all(|b| *b == 0),
            "punched range reads zeros"
        );
        assert_eq!(&got[..4096], &src[..4096]);
        m.push(format!("fallocated {} {}", got.len(), digest(&got)));
    }
    // Names: files, renames, hard links, symbolic links, a fifo, modes.
    let t = mnt.join("tree");
    std::fs::create_dir(&t).unwrap();
    for i in 0..300 {
        std::fs::write(t.join(format!("f{i:03}")), format!("file {i}\n")).unwrap();
    }
    for i in (0..300).step_by(2) {
        std::fs::rename(t.join(format!("f{i:03}")), t.join(format!("r{i:03}"))).unwrap();
    }
    std::fs::create_dir(t.join("sub")).unwrap();
    for i in (1..40).step_by(2) {
        std::fs::hard_link(
            t.join(format!("f{i:03}")),
            t.join("sub").join(format!("h{i:03}")),
        )
        .unwrap();
    }
    std::os::unix::fs::symlink("../f001", t.join("sub/link")).unwrap();
    assert_eq!(
        std::fs::read_to_string(t.join("sub/link")).unwrap(),
        "file 1\n"
    );
    sh(&format!("mkfifo {}", t.join("sub/fifo").display()));
    assert!(std::fs::symlink_metadata(t.join("sub/fifo"))
        .unwrap()
        .file_type()
        .is_fifo());
    std::fs::set_permissions(t.join("f003"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(&t)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 301);
    for n in &names {
        let p = t.join(n);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let content = if md.is_file() {
            digest(&std::fs::read(&p).unwrap())
        } else {
            "-".into()
        };
        let size = if md.is_dir() {
            "-".into()
        } else {
            md.len().to_string()
        };
        m.push(format!(
            "tree/{n} {size} {:o} {} {content}",
            md.mode() & 0o7777,
            md.nlink()
        ));
    }
    let e = std::fs::remove_dir(&t).unwrap_err();
    m.push(format!("rmdir-nonempty {:?}", e.raw_os_error()));
    std::fs::remove_dir_all(&t).unwrap();
    assert!(!t.exists());
    // Whole-file locks: a second process cannot take one the first holds,
    // and can once it is released.
    let lf = mnt.join("lockfile");
    std::fs::write(&lf, b"l").unwrap();
    // Each opens the file for writing (flock(1) with a path would open it
    // read-only, and an exclusive lock wants a write open).
    let lfs = lf.display().to_string();
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec 9>>{lfs}; flock -x 9 || exit 3; echo held > /tmp/v4-held; sleep 8"
        ))
        .spawn()
        .unwrap();
    // A server in its grace period (the kernel nfsd just started) holds
    // the first lock back for a while.
    for _ in 0..3000 {
        if Path::new("/tmp/v4-held").exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(
        Path::new("/tmp/v4-held").exists(),
        "the first flock never got its lock"
    );
    let try_lock = || {
        Command::new("sh")
            .arg("-c")
            .arg(format!("exec 9>>{lfs}; flock -n -x 9"))
            .status()
            .unwrap()
    };
    let busy = try_lock();
    m.push(format!("flock-while-held {:?}", busy.code()));
    assert_eq!(
        busy.code(),
        Some(1),
        "a second flock got a lock already held"
    );
    assert!(holder.wait().unwrap().success(), "the lock holder failed");
    std::fs::remove_file("/tmp/v4-held").unwrap();
    let free = try_lock();
    assert!(free.success(), "the lock was not released");
    m
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn kernel_client_mounts_nfsv41_and_nfsv42_over_tcp_and_rdma() {
    common::kernel::in_vm(&["nfsv3", "nfsv4"]);
    let a = addr();
    let d = Daemon::start(&["--lease", "15"]);
    let mut manifests = Vec::new();
    for (opts, vers, xprt) in [
        ("vers=4.1,proto=tcp", "4.1", "tcp"),
        ("vers=4.1,proto=rdma,port=20049", "4.1", "rdma"),
        ("vers=4.2,proto=tcp", "4.2", "tcp"),
        ("vers=4.2,proto=rdma,port=20049", "4.2", "rdma"),
        // What a user types: no version.
        ("proto=rdma,port=20049", "4.2", "rdma"),
    ] {
        let (line, got_xprt) = mount(&format!("{a}:/export"), "/mnt/v4", opts);
        assert!(line.contains(&format!("vers={vers}")), "{opts}: {line}");
        assert_eq!(got_xprt, xprt, "{opts}: {line}");
        eprintln!("mounted with {opts}: {line}");
        manifests.push(workload(Path::new("/mnt/v4"), vers == "4.2"));
        sh("timeout 60 umount /mnt/v4");
    }
    // One namespace: written over NFSv3, read over NFSv4.2, and back.
    let (_, x3) = mount(
        &format!("{a}:/export"),
        "/mnt/v3",
        "vers=3,proto=tcp,port=2049,mountport=2049,mountproto=tcp,nolock",
    );
    let (_, x4) = mount(
        &format!("{a}:/export"),
        "/mnt/v4",
        "vers=4.2,proto=rdma,port=20049",
    );
    assert_eq!((x3.as_str(), x4.as_str()), ("tcp", "rdma"));
    let one = data(1 << 20, 11);
    std::fs::write("/mnt/v3/from-v3", &one).unwrap();
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    assert!(
        std::fs::read("/mnt/v4/from-v3").unwrap() == one,
        "v3 data over v4.2"
    );
    let two = data(700_001, 12);
    std::fs::write("/mnt/v4/from-v4", &two).unwrap();
    sh("sync; echo 3 > /proc/sys/vm/drop_caches");
    assert!(
        std::fs::read("/mnt/v3/from-v4").unwrap() == two,
        "v4.2 data over v3"
    );
    let i3 = std::fs::metadata("/mnt/v3/from-v4").unwrap().ino();
    let i4 = std::fs::metadata("/mnt/v4/from-v4").unwrap().ino();
    assert_eq!(i3, i4, "the same file id over both versions");
    sh("timeout 60 umount /mnt/v3; timeout 60 umount /mnt/v4");
    let (ok, report) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report}");
    eprintln!("{report}");
    // The client binds a connection to its session when it makes one, not
    // after its calls (as it does when told its callback path is down).
    let binds: u64 = report
        .lines()
        .find_map(|l| l.strip_prefix("BIND_CONN_TO_SESSION"))
        .and_then(|l| l.split_whitespace().next())
        .map_or(0, |n| n.parse().unwrap());
    assert!(binds <= 10, "{binds} BIND_CONN_TO_SESSION calls");
    // The client's session gets a backchannel on its connection, over TCP
    // and over RDMA (RFC 8167), and the client answers the server's probe
    // (CB_NULL) there: one per mount at least (two over TCP, four over
    // RDMA), none failed; over RDMA they are backward calls.
    let cb = report_numbers(&report, "nfs4 backchannel: ");
    let (sent, answered, failed) = (cb[0], cb[1], cb[2]);
    assert!(
        answered >= 6 && answered == sent && failed == 0,
        "backchannel calls sent {sent}, answered {answered}, failed {failed}"
    );
    let (calls, replies, dropped) = backward_calls(&report);
    assert!(
        replies >= 4 && replies == calls && dropped == 0,
        "backward calls {calls}, answered {replies}, dropped {dropped}"
    );
    // `cp` asks for a clone first (FICLONE): over each NFSv4.2 mount that
    // is a CLONE, which nfsrdmad does (the kernel nfsd's tmpfs cannot; its
    // client then copies).
    let clones: Vec<u64> = report
        .lines()
        .find_map(|l| l.strip_prefix("CLONE "))
        .map(|l| l.split_whitespace().map(|n| n.parse().unwrap()).collect())
        .unwrap_or_default();
    assert!(
        clones.len() == 2 && clones[0] >= 3 && clones[1] == 0,
        "CLONE calls and errors: {clones:?}"
    );

    // The control: the kernel nfsd over NFSv4.2 and RDMA.
    let up = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vm/guest/knfsd-up");
    sh(&format!(
        "{} --vers 4.2 --mount /mnt/knfsd /export",
        up.display()
    ));
    let theirs = workload(&PathBuf::from("/mnt/knfsd"), true);
    sh("timeout 60 umount /mnt/knfsd");
    reset_nfs_services();
    for ours in &manifests {
        // NFSv4.1 has no fallocate: its manifest lacks that line.
        let theirs: Vec<&String> = theirs
            .iter()
            .filter(|l| ours.len() == theirs.len() || !l.starts_with("fallocated"))
            .collect();
        assert_eq!(ours.len(), theirs.len());
        for (x, y) in ours.iter().zip(theirs) {
            assert_eq!(x, y, "nfsrdmad and kernel nfsd disagree");
        }
    }
}

/// LOCKT of all of /export/held for a write lock, from `v`: its status,
/// after waiting out NFS4ERR_GRACE and NFS4ERR_DELAY (up to 120 s), and
/// the seconds waited.
fn lockt(v: &mut V4) -> (Status, u64) {
    let start = std::time::Instant::now();
    loop {
        let clientid = v.clientid;
        let r = v.run(vec![
            ArgOp::Putrootfh,
            ArgOp::Lookup("export".into()),
            ArgOp::Lookup("held".into()),
            ArgOp::Lockt(LocktArgs {
                locktype: LockType4::Write,
                offset: 0,
                length: u64::MAX,
                owner: StateOwner4 {
                    clientid,
                    owner: Opaque4(bytes::Bytes::from_static(b"tester")),
                },
            }),
        ]);
        // GRACE after a restart; DELAY while a delegation of the file is
        // recalled from its holder.
        if !matches!(r.status, Status::GRACE | Status::DELAY) || start.elapsed().as_secs() > 120 {
            return (r.status, start.elapsed().as_secs());
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// Waits up to `secs` for `path` to exist.
fn wait_for(path: &str, secs: u64) -> bool {
    for _ in 0..secs * 10 {
        if Path::new(path).exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn kernel_client_reclaims_its_open_and_lock_after_a_restart_with_state() {
    common::kernel::in_vm(&["nfsv4"]);
    let a = addr();
    let state = "/tmp/v4-restart.state";
    let _ = std::fs::remove_file(state);
    let flags = ["--state", state, "--lease", "15", "--grace", "60"];
    let d = Daemon::start(&flags);
    mount(
        &format!("{a}:/export"),
        "/mnt/v4r",
        "vers=4.2,proto=rdma,port=20049",
    );
    for f in ["/tmp/r-held", "/tmp/r-go", "/tmp/r-wrote", "/tmp/r-done"] {
        let _ = std::fs::remove_file(f);
    }
    // A process opens a file, locks it whole, writes, and waits; after the
    // restart it writes again through the same descriptor and keeps the
    // lock until told to finish.
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(
            "exec 9>>/mnt/v4r/held; flock -x 9 || exit 3; echo before >&9 || exit 4; \
             touch /tmp/r-held; while [ ! -e /tmp/r-go ]; do sleep 0.2; done; \
             echo after >&9 || exit 5; touch /tmp/r-wrote; \
             while [ ! -e /tmp/r-done ]; do sleep 0.2; done",
        )
        .spawn()
        .unwrap();
    assert!(
        wait_for("/tmp/r-held", 300),
        "the holder never got its lock"
    );
    let (ok, report) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report}");
    let d = Daemon::start(&flags);
    std::fs::write("/tmp/r-go", b"").unwrap();
    assert!(
        wait_for("/tmp/r-wrote", 600),
        "the holder's write after the restart did not finish"
    );
    // The lock was reclaimed on the server: another NFSv4 client (a raw
    // one over TCP; a second process on this client would be stopped by
    // the client's own lock table) is denied it, and gets it once the
    // holder is gone.
    let tester: std::net::SocketAddr = format!("{a}:2049").parse().unwrap();
    let mut other = V4::new(tester, "another client");
    let (held, _) = lockt(&mut other);
    assert_eq!(held, Status::DENIED, "the lock was lost in the restart");
    std::fs::write("/tmp/r-done", b"").unwrap();
    assert!(holder.wait().unwrap().success(), "the holder failed");
    let (free, waited) = lockt(&mut other);
    assert_eq!(free, Status::OK, "the lock was not released");
    eprintln!("LOCKT waited out the grace period for {waited} s");
    sh("echo 3 > /proc/sys/vm/drop_caches");
    assert_eq!(
        std::fs::read_to_string("/mnt/v4r/held").unwrap(),
        "before\nafter\n"
    );
    sh("timeout 60 umount /mnt/v4r");
    let (ok, report) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report}");
    let _ = std::fs::remove_file(state);
}

/// Runs `cmd` in the shell, ignoring how it ends (clean-up).
fn sh_quiet(cmd: &str) {
    let _ = Command::new("sh").arg("-c").arg(cmd).status();
}

/// Removes the network namespace and link the lease test makes.
struct LeaseNet;

impl Drop for LeaseNet {
    fn drop(&mut self) {
        sh_quiet("umount -f -l /mnt/v4l 2>/dev/null; ip link del vlease0 2>/dev/null; ip netns del nfslease 2>/dev/null");
    }
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_client_whose_lease_expires_loses_its_lock_to_another_client() {
    common::kernel::in_vm(&["nfsv4"]);
    let a = addr();
    let lease = 10;
    let d = Daemon::start(&["--lease", &lease.to_string()]);
    // The kernel client in a network namespace of its own, behind a veth
    // pair whose link the test can cut: it then cannot renew its lease.
    sh_quiet("ip link del vlease0 2>/dev/null; ip netns del nfslease 2>/dev/null");
    let _net = LeaseNet;
    sh(
        "ip netns add nfslease && ip link add vlease0 type veth peer name vlease1 && \
        ip link set vlease1 netns nfslease && ip addr add 10.98.0.1/24 dev vlease0 && \
        ip link set vlease0 up && \
        ip netns exec nfslease sh -c 'ip addr add 10.98.0.2/24 dev vlease1 && \
        ip link set vlease1 up && ip link set lo up && ip route add default via 10.98.0.1'",
    );
    // Mounted from inside the namespace (the client's transport lives
    // there), used from this one.
    sh(&format!(
        "mkdir -p /mnt/v4l && nsenter --net=/run/netns/nfslease \
         timeout 120 mount -t nfs -o vers=4.2,proto=tcp,port=2049 {a}:/export /mnt/v4l"
    ));
    for f in ["/tmp/l-held", "/tmp/l-go", "/tmp/l-wrote"] {
        let _ = std::fs::remove_file(f);
    }
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg(
            "exec 9>>/mnt/v4l/held; flock -x 9 || exit 3; echo before >&9 || exit 4; \
             touch /tmp/l-held; while [ ! -e /tmp/l-go ]; do sleep 0.2; done; \
             echo after >&9 && touch /tmp/l-wrote; exit 0",
        )
        .spawn()
        .unwrap();
    assert!(
        wait_for("/tmp/l-held", 300),
        "the holder never got its lock"
    );
    let tester: std::net::SocketAddr = format!("{a}:2049").parse().unwrap();
    let mut other = V4::new(tester, "lease tester");
    assert_eq!(lockt(&mut other).0, Status::DENIED, "the lock is not held");

    // Cut the link: the holder's client goes silent. Its lock stays until
    // its lease runs out, then goes with the rest of its state.
    sh("ip link set vlease0 down");
    let cut = std::time::Instant::now();
    let mut freed = None;
    while cut.elapsed().as_secs() < 6 * lease {
        if lockt(&mut other).0 == Status::OK {
            freed = Some(cut.elapsed());
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    let freed = freed.expect("the silent client's lock was never released");
    eprintln!(
        "the lock went {:.1} s after the link was cut",
        freed.as_secs_f64()
    );
    // The other client takes it.
    let (open, fh) = other.open("held", false);
    let lock = other.lock(&fh, open, 0, u64::MAX);
    let nfsrdma_xdr::nfs4::ops::LockRes::Ok(lock_sid) = lock else {
        panic!("the expired client's lock could not be taken: {lock:?}")
    };

    // The link comes back: the client finds its lease gone and starts
    // over; its lock is now the other client's.
    sh("ip link set vlease0 up");
    std::fs::write("/tmp/l-go", b"").unwrap();
    let st = holder.wait().unwrap();
    eprintln!(
        "the holder's write after the expiry {} ({st})",
        if Path::new("/tmp/l-wrote").exists() {
            "succeeded"
        } else {
            "failed"
        }
    );
    let try_lock = || {
        Command::new("sh")
            .arg("-c")
            .arg("exec 9>>/mnt/v4l/held; timeout 180 flock -n -x 9")
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(
        try_lock(),
        Some(1),
        "the recovered client got a lock another client holds"
    );
    let r = other.run(vec![
        ArgOp::Putfh(fh),
        ArgOp::Locku(nfsrdma_xdr::nfs4::ops::LockuArgs {
            locktype: LockType4::Write,
            seqid: 0,
            lock_stateid: lock_sid,
            offset: 0,
            length: u64::MAX,
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    assert_eq!(try_lock(), Some(0), "the released lock could not be taken");
    sh("timeout 60 umount /mnt/v4l");
    drop(_net);
    let (ok, report) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report}");
}

/// The count of operation `op` in the per-op statistics of the mount on
/// `mnt` (/proc/self/mountstats).
fn op_count(mnt: &str, op: &str) -> u64 {
    let stats = std::fs::read_to_string("/proc/self/mountstats").unwrap();
    stats
        .split("device ")
        .find(|s| s.contains(&format!("mounted on {mnt} ")))
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.trim_start().strip_prefix(&format!("{op}:")))
        })
        .and_then(|l| l.split_whitespace().next())
        .map_or(0, |n| n.parse().unwrap())
}

/// The RDMA transport's backward calls: sent, answered, dropped.
fn backward_calls(report: &str) -> (u64, u64, u64) {
    let l = report
        .lines()
        .find(|l| l.starts_with("rdma: "))
        .unwrap_or_else(|| panic!("no rdma line in the report:\n{report}"));
    let rest = &l[l.find("backward calls ").expect("backward calls") + 15..];
    let n: Vec<u64> = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .take(3)
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0], n[1], n[2])
}

/// The report's counters by transport, after a recall of a delegation
/// held over RDMA (`rdma`) or over TCP: `cb` the backchannel line's
/// numbers, `n` the delegation line's. Over RDMA the probe and the recall
/// (at least) were backward calls, all answered, as the backchannel line
/// counts them too, and a delegation was granted, recalled and returned
/// over RDMA, none revoked; over TCP nothing went over RDMA.
fn check_transport_counters(report: &str, cb: &[u64], n: &[u64], rdma: bool) {
    let (calls, replies, dropped) = backward_calls(report);
    if rdma {
        assert!(
            replies >= 2 && replies == calls && dropped == 0,
            "backward calls {calls}, answered {replies}, dropped {dropped}"
        );
        assert_eq!((cb[3], cb[4]), (calls, replies), "{cb:?}");
        assert!(
            n[6] >= 1 && n[7] >= 1 && n[8] >= 1 && n[9] == 0,
            "delegations: {n:?}"
        );
    } else {
        assert_eq!(calls, 0, "no backward call without an RDMA mount");
        assert_eq!((cb[3], &n[6..10]), (0, &[0; 4][..]), "{cb:?} {n:?}");
    }
}

/// The numbers of the report's line that starts with `prefix`.
fn report_numbers(report: &str, prefix: &str) -> Vec<u64> {
    report
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in the report:\n{report}"))
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect()
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn kernel_client_holds_a_write_delegation_over_tcp_until_nfsv3_writes_the_file() {
    write_delegation_until_nfsv3_writes("vers=4.2,proto=tcp", false, &[]);
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn kernel_client_holds_a_write_delegation_over_rdma_until_nfsv3_writes_the_file() {
    write_delegation_until_nfsv3_writes("vers=4.2,proto=rdma,port=20049", true, &[]);
}

/// The same over RDMA with the daemon's receives on a shared receive
/// queue (`--rdma-srq`, one pool thread): the replies to the backward
/// calls (the probe, the recall) come in the shared queue's buffers, and
/// every buffer is posted again by the end, none refused for want of one.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn kernel_client_holds_a_write_delegation_over_a_shared_receive_queue() {
    let report = write_delegation_until_nfsv3_writes(
        "vers=4.2,proto=rdma,port=20049",
        true,
        &["--rdma-threads", "1", "--rdma-srq", "64"],
    );
    let rdma = report
        .lines()
        .find(|l| l.starts_with("rdma: "))
        .expect("the rdma line");
    let after = |name: &str| common::kernel::counter(rdma, name);
    assert_eq!(after("shared receive buffers "), 64, "{rdma}");
    assert_eq!(
        after("posted now "),
        64,
        "every buffer posted again: {rdma}"
    );
    assert!(after("taken at once at most ") >= 1, "{rdma}");
    assert_eq!(after("connection errors "), 0, "{rdma}");
    assert_eq!(after("(RNR) "), 0, "{rdma}");
}

/// The kernel client mounted with `opts` writes a file and holds a write
/// delegation of it; NFSv3 over TCP writes the file, which recalls the
/// delegation (over RPC-over-RDMA's backward direction when `rdma`). The
/// daemon runs with `flags` more; its report is returned.
fn write_delegation_until_nfsv3_writes(opts: &str, rdma: bool, flags: &[&str]) -> String {
    use std::io::Write;
    common::kernel::in_vm(&["nfsv3", "nfsv4"]);
    let a = addr();
    let d = Daemon::start(&[&["--lease", "15"][..], flags].concat());
    let (_, xprt) = mount(&format!("{a}:/export"), "/mnt/d4", opts);
    assert_eq!(xprt, if rdma { "rdma" } else { "tcp" });
    mount(
        &format!("{a}:/export"),
        "/mnt/d3",
        "vers=3,proto=tcp,port=2049,mountport=2049,mountproto=tcp,nolock",
    );
    // The kernel client creates and writes a file over NFSv4.2: it opens
    // it for writing and gets a write delegation, kept after the close.
    let first = data(300_000, 21);
    std::fs::write("/mnt/d4/delegated", &first).unwrap();
    assert!(std::fs::read("/mnt/d4/delegated").unwrap() == first);
    assert_eq!(op_count("/mnt/d4", "DELEGRETURN"), 0);
    // NFSv3 rewrites the start of it: its WRITE waits (NFS3ERR_JUKEBOX)
    // while the delegation is recalled over the backchannel and the
    // client returns it, then goes through.
    let second = data(4096, 22);
    let t0 = std::time::Instant::now();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open("/mnt/d3/delegated")
        .unwrap();
    f.write_all(&second).unwrap();
    f.sync_all().unwrap();
    drop(f);
    eprintln!(
        "the NFSv3 write went through {:.1} s after it began",
        t0.elapsed().as_secs_f64()
    );
    assert!(op_count("/mnt/d4", "DELEGRETURN") >= 1);
    // The NFSv4 client reads what NFSv3 wrote, and its own bytes after.
    let got = std::fs::read("/mnt/d4/delegated").unwrap();
    assert_eq!(got.len(), first.len());
    assert!(got[..4096] == second[..], "NFSv3's bytes over NFSv4.2");
    assert!(
        got[4096..] == first[4096..],
        "the rest as the client wrote it"
    );
    sh("timeout 60 umount /mnt/d3; timeout 60 umount /mnt/d4");
    let (ok, report) = d.stop();
    assert!(ok, "nfsrdmad did not exit cleanly:\n{report}");
    eprintln!("{report}");
    // granted read, write, recalled, failed, returned, revoked
    let n = report_numbers(&report, "nfs4 delegations: ");
    assert!(
        n[1] >= 1 && n[2] >= 1 && n[3] == 0 && n[4] >= 1 && n[5] == 0,
        "delegations: {n:?}"
    );
    let cb = report_numbers(&report, "nfs4 backchannel: ");
    assert_eq!(cb[2], 0, "no call back failed: {cb:?}");
    // Over RDMA the probe and the recall were backward calls.
    check_transport_counters(&report, &cb, &n, rdma);
    report
}

/// Removes the network namespace and link of the two-client test.
struct SecondClientNet;

impl Drop for SecondClientNet {
    fn drop(&mut self) {
        sh_quiet("umount -f -l /mnt/db 2>/dev/null; umount -f -l /mnt/da 2>/dev/null; ip link del vdeleg0 2>/dev/null; ip netns del nfsdeleg 2>/dev/null");
    }
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_second_kernel_clients_open_for_writing_recalls_the_first_ones_delegation() {
    second_client_recalls("vers=4.2,proto=tcp", false);
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_second_kernel_clients_open_for_writing_recalls_a_delegation_held_over_rdma() {
    second_client_recalls("vers=4.2,proto=rdma,port=20049", true);
}

/// Client B: the kernel client of a network namespace of its own, with
/// its own client identifier and host name (so a client of its own to
/// the server), behind a veth pair; the namespace and link go with the
/// value returned. Mounted at /mnt/db (after `mount_a`, which mounts
/// client A) with NFSv4.2 over TCP: the guest's one RDMA device serves
/// only its own addresses.
fn second_client(a: &str, mount_a: impl FnOnce()) -> SecondClientNet {
    sh_quiet("umount -f -l /mnt/db 2>/dev/null; ip link del vdeleg0 2>/dev/null; ip netns del nfsdeleg 2>/dev/null");
    let net = SecondClientNet;
    sh(
        "ip netns add nfsdeleg && ip link add vdeleg0 type veth peer name vdeleg1 && \
        ip link set vdeleg1 netns nfsdeleg && ip addr add 10.96.0.1/24 dev vdeleg0 && \
        ip link set vdeleg0 up && \
        ip netns exec nfsdeleg sh -c 'ip addr add 10.96.0.2/24 dev vdeleg1 && \
        ip link set vdeleg1 up && ip link set lo up && ip route add default via 10.96.0.1; \
        echo -n nfsrdma-test-client-b > /sys/fs/nfs/net/nfs_client/identifier 2>/dev/null; true'",
    );
    mount_a();
    sh(&format!(
        "mkdir -p /mnt/db && nsenter --net=/run/netns/nfsdeleg unshare --uts sh -c \
         'hostname nfs-client-b && timeout 120 mount -t nfs -o vers=4.2,proto=tcp,port=2049 {a}:/export /mnt/db'"
    ));
    net
}

/// Client A: the kernel client of this namespace, mounted at /mnt/da
/// with `opts` (over RDMA when `rdma`, checked).
fn mount_a(a: &str, opts: &str, rdma: bool) {
    let (_, xprt) = mount(&format!("{a}:/export"), "/mnt/da", opts);
    assert_eq!(xprt, if rdma { "rdma" } else { "tcp" });
}

/// Client A, mounted with `a_opts`, holds a delegation of a file that
/// client B ([`second_client`]) opens for writing.
fn second_client_recalls(a_opts: &str, rdma: bool) {
    common::kernel::in_vm(&["nfsv4"]);
    let a = addr();
    let d = Daemon::start(&["--lease", "15"]);
    let _net = second_client(&a, || mount_a(&a, a_opts, rdma));
    // A writes the file and keeps it open for reading: it holds a
    // delegation, and reads from its cache.
    let first = data(200_000, 31);
    std::fs::write("/mnt/da/shared", &first).unwrap();
    let held = std::fs::File::open("/mnt/da/shared").unwrap();
    assert!(std::fs::read("/mnt/da/shared").unwrap() == first);
    assert_eq!(op_count("/mnt/da", "DELEGRETURN"), 0);
    // B opens it for writing: A's delegation is recalled over A's
    // backchannel (RDMA's backward direction when A is over RDMA); A moves its open to the server, flushes and returns
    // it; B's OPEN, answered NFS4ERR_DELAY meanwhile, goes through.
    let second = data(8192, 32);
    let t0 = std::time::Instant::now();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/mnt/db/shared")
            .unwrap();
        f.write_all(&second).unwrap();
        f.sync_all().unwrap();
    }
    let waited = t0.elapsed();
    eprintln!(
        "B's open and write went through {:.1} s after B began",
        waited.as_secs_f64()
    );
    let returned = op_count("/mnt/da", "DELEGRETURN");
    // A sees B's bytes at its next open, and its own after them.
    let got = std::fs::read("/mnt/da/shared").unwrap();
    drop(held);
    sh("timeout 60 umount /mnt/db; timeout 60 umount /mnt/da");
    let (ok, report) = d.stop();
    eprintln!("{report}");
    assert!(ok, "nfsrdmad did not exit cleanly");
    assert!(returned >= 1, "A returned no delegation");
    assert_eq!(got.len(), first.len());
    assert!(got[..8192] == second[..], "B's bytes seen by A");
    assert!(got[8192..] == first[8192..], "A's bytes after them");
    // granted read, write, recalled, failed, returned, revoked
    let n = report_numbers(&report, "nfs4 delegations: ");
    assert!(
        n[0] + n[1] >= 1 && n[2] >= 1 && n[3] == 0 && n[4] >= 1 && n[5] == 0,
        "delegations: {n:?}"
    );
    let cb = report_numbers(&report, "nfs4 backchannel: ");
    assert!(cb[0] >= 3 && cb[2] == 0, "backchannel calls: {cb:?}");
    // A's probe and the recall: backward calls over RDMA.
    check_transport_counters(&report, &cb, &n, rdma);
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_second_clients_stat_asks_the_write_delegation_holder_over_rdma_and_recalls_nothing() {
    common::kernel::in_vm(&["nfsv4"]);
    let a = addr();
    let d = Daemon::start(&["--lease", "15"]);
    let _net = second_client(&a, || mount_a(&a, "vers=4.2,proto=rdma,port=20049", true));
    // A creates a file and writes it, and keeps it open: it holds a write
    // delegation, under which it need not send its writes yet.
    let bytes = data(100_000, 41);
    let mut held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open("/mnt/da/growing")
        .unwrap();
    {
        use std::io::Write;
        held.write_all(&bytes).unwrap();
    }
    assert_eq!(op_count("/mnt/da", "DELEGRETURN"), 0);
    // B looks the file up and stats it: its GETATTRs of the size and
    // change attribute have the server ask A with CB_GETATTR, over A's
    // RDMA connection's backward direction; A answers with the size of
    // what it wrote, and keeps its delegation.
    let t0 = std::time::Instant::now();
    let size = std::fs::metadata("/mnt/db/growing").unwrap().len();
    eprintln!(
        "B's stat answered in {:.2} s: size {size}",
        t0.elapsed().as_secs_f64()
    );
    let returned = op_count("/mnt/da", "DELEGRETURN");
    drop(held);
    let got = std::fs::read("/mnt/db/growing").unwrap();
    sh("timeout 60 umount /mnt/db; timeout 60 umount /mnt/da");
    let (ok, report) = d.stop();
    eprintln!("{report}");
    assert!(ok, "nfsrdmad did not exit cleanly");
    assert_eq!(size, bytes.len() as u64, "the size A wrote, seen by B");
    assert_eq!(returned, 0, "A kept its delegation through B's stat");
    assert!(got == bytes, "B reads A's bytes once A has closed the file");
    // granted read, write, recalled, failed, returned, revoked; over RDMA
    // granted, recalled, returned, revoked; CB_GETATTR asked, changed,
    // failed. A's delegation was recalled by nothing before B's read.
    let n = report_numbers(&report, "nfs4 delegations: ");
    assert!(
        n[1] >= 1 && n[6] >= 1,
        "a write delegation over RDMA: {n:?}"
    );
    assert!(
        n[10] >= 1 && n[12] == 0,
        "CB_GETATTR asked and answered: {n:?}"
    );
    let (calls, replies, dropped) = backward_calls(&report);
    assert!(
        calls >= 2 && replies == calls && dropped == 0,
        "A's probe and the CB_GETATTR as backward calls: {calls}, answered {replies}, dropped {dropped}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_delegation_of_a_client_cut_off_goes_with_its_lease_and_the_writer_over_rdma_proceeds() {
    common::kernel::in_vm(&["nfsv4"]);
    let a = addr();
    let lease = 15;
    let d = Daemon::start(&["--lease", &lease.to_string()]);
    let _net = second_client(&a, || mount_a(&a, "vers=4.2,proto=rdma,port=20049", true));
    // B (in the network namespace, over TCP) writes the file (to the
    // server: fsync), then keeps it open for reading: it holds a
    // delegation and reads from its cache.
    let first = data(150_000, 51);
    {
        use std::io::Write;
        let mut f = std::fs::File::create("/mnt/db/cut-off").unwrap();
        f.write_all(&first).unwrap();
        f.sync_all().unwrap();
    }
    let held = std::fs::File::open("/mnt/db/cut-off").unwrap();
    assert!(std::fs::read("/mnt/db/cut-off").unwrap() == first);
    assert_eq!(op_count("/mnt/db", "DELEGRETURN"), 0);
    // B's link is cut: it cannot answer the recall nor renew its lease.
    let b_ids = op_count("/mnt/db", "EXCHANGE_ID");
    sh("ip netns exec nfsdeleg ip link set vdeleg1 down");
    // A (over RDMA) opens the file for writing: answered NFS4ERR_DELAY
    // while the recall to B goes unanswered (sent again at A's retries),
    // until B's state goes with its lease; then A's open and write go
    // through.
    let second = data(8192, 52);
    let t0 = std::time::Instant::now();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open("/mnt/da/cut-off")
            .unwrap();
        f.write_all(&second).unwrap();
        f.sync_all().unwrap();
    }
    eprintln!(
        "A's open and write went through {:.1} s after A began (lease {lease} s)",
        t0.elapsed().as_secs_f64()
    );
    // B's link comes back. B reads the file with O_DIRECT, so from the
    // server, not from its cache (which the Linux client may go on
    // trusting for a while, as it held a delegation): its client finds
    // its lease gone and starts over with a new client ID, and the server
    // gives it A's bytes.
    sh("ip netns exec nfsdeleg sh -c 'ip link set vdeleg1 up && ip route replace default via 10.96.0.1'");
    drop(held);
    let t1 = std::time::Instant::now();
    sh("rm -f /tmp/b-read; timeout 180 dd if=/mnt/db/cut-off of=/tmp/b-read iflag=direct bs=1M status=none");
    let seen_by_b = std::fs::read("/tmp/b-read").unwrap();
    eprintln!(
        "B read the file from the server {:.1} s after its link came back",
        t1.elapsed().as_secs_f64()
    );
    assert!(
        op_count("/mnt/db", "EXCHANGE_ID") > b_ids,
        "B's client started over"
    );
    let seen_by_a = std::fs::read("/mnt/da/cut-off").unwrap();
    sh("timeout 60 umount /mnt/db; timeout 60 umount /mnt/da");
    let (ok, report) = d.stop();
    eprintln!("{report}");
    assert!(ok, "nfsrdmad did not exit cleanly");
    for (who, got) in [("A", &seen_by_a), ("B", &seen_by_b)] {
        assert_eq!(got.len(), first.len(), "{who}");
        assert!(got[..8192] == second[..], "A's bytes seen by {who}");
        assert!(
            got[8192..] == first[8192..],
            "B's first bytes after them, seen by {who}"
        );
    }
    // granted read, write, recalled, failed, ...: the recall to B was sent
    // and failed (no answer).
    let n = report_numbers(&report, "nfs4 delegations: ");
    assert!(n[2] >= 1 && n[3] >= 1, "a recall sent and failed: {n:?}");
    let cb = report_numbers(&report, "nfs4 backchannel: ");
    assert!(cb[2] >= 1, "a call back failed: {cb:?}");
}
