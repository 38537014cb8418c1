//! What the tests that run the Linux kernel's NFS client in the Soft-RoCE
//! VM share: the guest's address, shell commands, nfsrdmad as a daemon.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};

pub fn addr() -> String {
    std::env::var("NFSRDMA_RDMA_ADDR").unwrap_or_else(|_| "10.99.0.1".into())
}

/// The number after `name` in a daemon's report (its first occurrence).
pub fn counter(report: &str, name: &str) -> u64 {
    let at = report
        .find(name)
        .unwrap_or_else(|| panic!("{name} missing from {report}"));
    report[at + name.len()..]
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .unwrap()
        .parse()
        .unwrap()
}

pub fn sh(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().unwrap();
    assert!(
        o.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into()
}

/// Checks that this runs in the VM, loads the NFS client modules named
/// (beside rpcrdma and nfs) and leaves no NFS service running.
pub fn in_vm(modules: &[&str]) {
    assert_eq!(
        std::env::var("NFSRDMA_VM").as_deref(),
        Ok("1"),
        "this test runs in the Soft-RoCE VM: scripts/test-vm"
    );
    sh("modprobe rpcrdma && modprobe nfs");
    for m in modules {
        sh(&format!("modprobe {m}"));
    }
    reset_nfs_services();
}

/// Stops whatever NFS service another test in this VM boot left running
/// (a kernel nfsd holding ports 2049/20049, its mountd, rpcbind and their
/// registrations), so that each test starts from a clean guest.
pub fn reset_nfs_services() {
    let _ = Command::new("sh")
        .arg("-c")
        .arg(
            "grep -qs nfsd /proc/mounts && rpc.nfsd 0; exportfs -ua 2>/dev/null; \
             pkill -x rpc.mountd; pkill -x rpcbind; rm -rf /run/rpcbind; sleep 1; true",
        )
        .status();
}

/// nfsrdmad started by a test; killed if the test panics before stopping it
/// (a daemon left running would hold the guest's ports for the next test).
pub struct Daemon {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Daemon {
    /// nfsrdmad on the usual ports, with `extra` flags, not registered with
    /// rpcbind.
    pub fn start(extra: &[&str]) -> Daemon {
        Self::spawn(&[&["--no-rpcbind"], extra].concat(), "warn")
    }

    /// nfsrdmad on the usual ports registered with the guest's rpcbind
    /// (NFS, MOUNT, NLM, NSM), with `extra` flags and `RUST_LOG=log`.
    /// Returns once the daemon says all four are registered.
    pub fn start_registered(extra: &[&str], log: &str) -> Daemon {
        let mut d = Self::spawn(extra, log);
        let mut line = String::new();
        d.out.read_line(&mut line).unwrap();
        assert_eq!(
            line.trim_end(),
            "nfsrdmad: registered with rpcbind: NFS MOUNT NLM NSM"
        );
        d
    }

    fn spawn(extra: &[&str], log: &str) -> Daemon {
        let a = addr();
        let mut child = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
            .args([
                "--export",
                "/export",
                "--tcp",
                &format!("{a}:2049"),
                "--rdma",
                &format!("{a}:20049"),
            ])
            .args(extra)
            .env("RUST_LOG", log)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        for _ in 0..2 {
            let mut line = String::new();
            out.read_line(&mut line).unwrap();
            assert!(line.starts_with("nfsrdmad: listening"), "{line}");
        }
        Daemon { child, out }
    }

    /// SIGTERM; returns the exit status and stderr (with the counters).
    pub fn stop(mut self) -> (bool, String) {
        sh(&format!("kill -TERM {}", self.child.id()));
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let ok = self.child.wait().unwrap().success();
        (ok, err)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
