//! The `nfsrdma mount` (FUSE) suite of `common/mount_suite.rs` over
//! RPC-over-RDMA (`proto=rdma`) in the Soft-RoCE VM, against nfsrdmad (the
//! daemon, started per test with `--tcp ADDR:2049 --rdma ADDR:20049
//! --no-rpcbind`) and against the Linux kernel's nfsd (`tests/vm/guest/
//! knfsd-up`, RDMA on 20049, MOUNT through rpcbind and rpc.mountd). Run with
//! `scripts/test-vm -- vm_mount`; ignored on the host.
//!
//! The second client some tests use (to change a file behind the mount's
//! back) is the library over TCP. Each test also checks afterwards that its
//! calls really went over RDMA (the server's RDMA counters grew).

mod common;
#[path = "common/mount_suite.rs"]
mod mount_suite;
#[path = "common/posix.rs"]
mod posix;

use common::root;
use mount_suite::{self as suite, Server, Target};
use nfsrdma_client::xdr::nfs3::NfsProc3;
use nfsrdma_client::ConnectOptions;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const TCP_PORT: u16 = 2049;
const RDMA_PORT: u16 = 20049;
/// A port nothing listens on (for "server down").
const DEAD_PORT: u16 = 20050;
/// Upper bound on waiting for a server to start, report or stop.
const SERVER_WAIT: Duration = Duration::from_secs(120);

fn addr() -> String {
    std::env::var("NFSRDMA_RDMA_ADDR").unwrap_or_else(|_| "10.99.0.1".into())
}

fn in_vm() {
    assert_eq!(
        std::env::var("NFSRDMA_VM").as_deref(),
        Ok("1"),
        "this test runs in the Soft-RoCE VM: scripts/test-vm -- vm_mount"
    );
    suite::require_fuse();
}

/// Stops whatever NFS service another test in this VM boot left running (a
/// kernel nfsd holding ports 2049/20049, its mountd, rpcbind and their
/// registrations).
fn reset_nfs_services() {
    let _ = Command::new("sh")
        .arg("-c")
        .arg(
            "grep -qs nfsd /proc/mounts && rpc.nfsd 0; exportfs -ua 2>/dev/null; \
             pkill -x rpc.mountd; pkill -x rpcbind; rm -rf /run/rpcbind; sleep 1; true",
        )
        .status();
}

/// The nfsrdmad binary of this build (`target/<profile>/nfsrdmad`, next
/// to this test's `deps/` folder), or `$NFSRDMA_NFSRDMAD`.
fn nfsrdmad_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("NFSRDMA_NFSRDMAD") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("nfsrdmad");
    assert!(
        bin.exists(),
        "{} is missing: build the server too (cargo test --workspace --no-run, as \
         scripts/test-vm does), or set NFSRDMA_NFSRDMAD",
        bin.display()
    );
    bin
}

/// A shell, started before any file is opened on a mount, that runs every
/// command the target needs afterwards (restarting or killing a server).
/// The test process itself must not start processes while it holds a file
/// open on the FUSE mount: a child closes its inherited copy of the
/// descriptor at exec, the kernel sends FUSE_FLUSH for that close, and the
/// mount answers a flush with COMMIT (as close does), which would commit
/// the very data a test keeps uncommitted (and, with the server down, make
/// the exec wait for it).
struct Runner {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    dir: PathBuf,
    seq: u64,
}

impl Runner {
    fn start(dir: &Path) -> Runner {
        let mut child = Command::new("sh")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the runner shell");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Runner {
            child,
            input,
            output,
            dir: dir.to_path_buf(),
            seq: 0,
        }
    }

    /// Writes one line to the shell and reads its answer line, which
    /// starts with `tag`.
    fn ask(&mut self, line: &str, tag: &str) -> String {
        writeln!(self.input, "{line}").expect("runner shell gone");
        self.input.flush().unwrap();
        loop {
            let mut got = String::new();
            let n = self.output.read_line(&mut got).unwrap();
            assert!(n > 0, "runner shell exited");
            if let Some(rest) = got.strip_prefix(tag) {
                return rest.trim().to_string();
            }
        }
    }

    /// Runs `cmd` in the shell itself (so `wait` works on its children):
    /// exit status and output (stdout and stderr).
    fn run(&mut self, cmd: &str) -> (i32, String) {
        self.seq += 1;
        let out = self.dir.join(format!("cmd-{}.out", self.seq));
        let rc = self.ask(
            &format!(
                "{{ {cmd}; }} >'{}' 2>&1 </dev/null; echo \"__done $?\"",
                out.display()
            ),
            "__done ",
        );
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        (rc.parse().unwrap(), text)
    }

    fn sh(&mut self, cmd: &str) -> String {
        let (rc, out) = self.run(cmd);
        assert_eq!(rc, 0, "`{cmd}` failed (exit {rc}): {out}");
        out
    }

    /// Starts `cmd` in the background; its pid.
    fn spawn(&mut self, cmd: &str) -> i32 {
        self.ask(&format!("{cmd} </dev/null & echo \"__pid $!\""), "__pid ")
            .parse()
            .unwrap()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn signal(pid: i32, sig: i32) {
    let s = nix::sys::signal::Signal::try_from(sig).expect("a signal number");
    if let Err(e) = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), s) {
        panic!("kill({pid}, {sig}): {e}");
    }
}

/// Whether `pid` runs (exists and is not a zombie).
fn alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit(") ").next().and_then(|s| s.chars().next());
    matches!(state, Some(c) if c != 'Z' && c != 'X')
}

/// One nfsrdmad process, a child of the [`Runner`]; its stdout and stderr
/// (logs and counter reports) go to files.
struct Daemon {
    pid: i32,
    out: PathBuf,
    err: PathBuf,
}

impl Daemon {
    fn start(r: &mut Runner, work: &Path, state: &Path, instance: usize) -> Daemon {
        let a = addr();
        let out = work.join(format!("nfsrdmad-{instance}.out"));
        let err = work.join(format!("nfsrdmad-{instance}.err"));
        let pid = r.spawn(&format!(
            "RUST_LOG=warn '{}' --export /export --no-rpcbind --tcp {a}:{TCP_PORT} \
             --rdma {a}:{RDMA_PORT} --state '{}' >'{}' 2>'{}'",
            nfsrdmad_bin().display(),
            state.display(),
            out.display(),
            err.display()
        ));
        let err_path = err.clone();
        let d = Daemon { pid, out, err };
        let start = Instant::now();
        loop {
            let text = std::fs::read_to_string(&d.out).unwrap_or_default();
            if text.matches("nfsrdmad: listening").count() >= 2 {
                break;
            }
            let alive = alive(pid);
            if !alive || start.elapsed() > SERVER_WAIT {
                if alive {
                    d.kill(r);
                } else {
                    r.run(&format!("wait {pid}"));
                }
                panic!(
                    "nfsrdmad did not start: {text}{}",
                    std::fs::read_to_string(&err_path).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        d
    }

    fn reports(&self) -> usize {
        std::fs::read_to_string(&self.err)
            .unwrap()
            .matches("duplicate request cache:")
            .count()
    }

    /// The last complete counter report in the stderr file: from its
    /// `procedure` header (a line that starts with the word) to its
    /// `rdma:` line.
    fn last_report(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.err).unwrap();
        let at = text
            .match_indices("procedure ")
            .map(|(i, _)| i)
            .filter(|&i| i == 0 || text.as_bytes()[i - 1] == b'\n')
            .last()?;
        let block = &text[at..];
        let i = block.find("\nrdma:")?;
        let j = block[i + 1..].find('\n')?;
        Some(block[..i + 1 + j + 1].to_string())
    }

    /// SIGUSR1, then the report it printed.
    fn report(&self) -> String {
        let before = self.reports();
        signal(self.pid, libc::SIGUSR1);
        let start = Instant::now();
        loop {
            if self.reports() > before {
                if let Some(r) = self.last_report() {
                    return r;
                }
            }
            assert!(
                start.elapsed() < SERVER_WAIT && alive(self.pid),
                "no report after SIGUSR1: {}",
                std::fs::read_to_string(&self.err).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM (the store is saved to the state file); the final report.
    fn stop(self, r: &mut Runner) -> String {
        let before = self.reports();
        signal(self.pid, libc::SIGTERM);
        let (rc, _) = r.run(&format!("wait {}", self.pid));
        assert_eq!(
            rc,
            0,
            "nfsrdmad exited with {rc}: {}",
            std::fs::read_to_string(&self.err).unwrap_or_default()
        );
        assert!(self.reports() > before, "no final report");
        self.last_report().expect("final report")
    }

    /// SIGKILL.
    fn kill(self, r: &mut Runner) {
        signal(self.pid, libc::SIGKILL);
        let (rc, _) = r.run(&format!("wait {}", self.pid));
        assert_eq!(rc, 128 + libc::SIGKILL, "nfsrdmad after SIGKILL");
    }
}

/// Calls of `proc` in an nfsrdmad counter report (absent: none).
fn report_calls(report: &str, proc: NfsProc3) -> u64 {
    report
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(proc.name())).then(|| f.next().unwrap().parse().unwrap())
        })
        .unwrap_or(0)
}

/// RDMA calls in an nfsrdmad counter report (`rdma: connections N (open
/// M), calls K ...`).
fn report_rdma_calls(report: &str) -> u64 {
    let line = report
        .lines()
        .find(|l| l.starts_with("rdma:"))
        .expect("rdma: line");
    let at = line.find("calls ").expect("calls in the rdma: line") + "calls ".len();
    line[at..].split(' ').next().unwrap().parse().unwrap()
}

/// The kernel nfsd's NFSv3 call counts (`proc3` of /proc/net/rpc/nfsd), by
/// procedure number.
fn knfsd_proc3() -> [u64; 22] {
    let text = std::fs::read_to_string("/proc/net/rpc/nfsd").unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("proc3 "))
        .expect("proc3 line in /proc/net/rpc/nfsd");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(2)
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(v.len(), 22, "{line}");
    v.try_into().unwrap()
}

/// RPC-over-RDMA messages the kernel's server side received.
fn knfsd_rdma_recvs() -> u64 {
    let p = "/proc/sys/sunrpc/svc_rdma/rdma_stat_recv";
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{p}: {e}"))
        .trim()
        .parse()
        .unwrap()
}

fn knfsd_up(r: &mut Runner) {
    let up = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/vm/guest/knfsd-up");
    r.sh(&format!("{} /export", up.display()));
}

/// A server in the guest, reached over RDMA.
struct VmTarget {
    server: Server,
    work: PathBuf,
    /// Starts every process the target needs once mounts exist.
    runner: Runner,
    /// nfsrdmad (Server::Ours).
    daemon: Option<Daemon>,
    instances: usize,
    /// Calls executed by earlier nfsrdmad instances (or before the kernel
    /// nfsd's counters were reset), by procedure number.
    past: [u64; 22],
    past_rdma: u64,
    /// The last report of a killed nfsrdmad.
    dead_report: Option<String>,
}

impl VmTarget {
    fn new(server: Server) -> VmTarget {
        in_vm();
        reset_nfs_services();
        let work = suite::scratch("vm-target");
        let runner = Runner::start(&work);
        let mut t = VmTarget {
            server,
            work,
            runner,
            daemon: None,
            instances: 0,
            past: [0; 22],
            past_rdma: 0,
            dead_report: None,
        };
        match server {
            Server::Ours => t.start_daemon(),
            Server::KernelNfsd => {
                knfsd_up(&mut t.runner);
                // An empty export, whatever an earlier test left in it.
                t.runner.sh("find /export -mindepth 1 -delete");
            }
        }
        t
    }

    fn ours() -> VmTarget {
        Self::new(Server::Ours)
    }

    fn knfsd() -> VmTarget {
        Self::new(Server::KernelNfsd)
    }

    fn start_daemon(&mut self) {
        let state = self.work.join("state");
        self.daemon = Some(Daemon::start(
            &mut self.runner,
            &self.work,
            &state,
            self.instances,
        ));
        self.instances += 1;
    }

    fn report(&self) -> String {
        match &self.daemon {
            Some(d) => d.report(),
            None => self.dead_report.clone().expect("nfsrdmad is not running"),
        }
    }

    /// Calls (messages, for the kernel nfsd) received over RDMA so far.
    fn rdma_calls(&mut self) -> u64 {
        match self.server {
            Server::Ours => self.past_rdma + report_rdma_calls(&self.report()),
            Server::KernelNfsd => knfsd_rdma_recvs(),
        }
    }
}

impl Target for VmTarget {
    fn server(&self) -> Server {
        self.server
    }

    fn host(&self) -> String {
        addr()
    }

    fn conn_opts(&self) -> String {
        match self.server {
            Server::Ours => {
                format!("proto=rdma,port={RDMA_PORT},mountport={TCP_PORT},uid=0,gid=0")
            }
            // MOUNT is rpc.mountd's, found through rpcbind.
            Server::KernelNfsd => format!("proto=rdma,port={RDMA_PORT},uid=0,gid=0"),
        }
    }

    fn dead_conn_opts(&self) -> (String, String) {
        let mount = match self.server {
            Server::Ours => format!(",mountport={TCP_PORT}"),
            Server::KernelNfsd => String::new(),
        };
        (
            format!("proto=rdma,port={DEAD_PORT}{mount},uid=0,gid=0"),
            format!("{}:{DEAD_PORT}", addr()),
        )
    }

    fn other_client(&self) -> ConnectOptions {
        ConnectOptions {
            port: Some(TCP_PORT),
            mount_port: match self.server {
                Server::Ours => Some(TCP_PORT),
                Server::KernelNfsd => None,
            },
            auth: root(),
            ..ConnectOptions::default()
        }
    }

    fn calls(&mut self, proc: NfsProc3) -> u64 {
        let now = match self.server {
            Server::Ours => report_calls(&self.report(), proc),
            Server::KernelNfsd => knfsd_proc3()[proc as usize],
        };
        self.past[proc as usize] + now
    }

    fn restart_keeping_data(&mut self) {
        match self.server {
            Server::Ours => {
                let d = self.daemon.take().expect("nfsrdmad is running");
                let last = d.stop(&mut self.runner);
                for p in NfsProc3::ALL {
                    self.past[p as usize] += report_calls(&last, p);
                }
                self.past_rdma += report_rdma_calls(&last);
                assert!(
                    self.work.join("state").exists(),
                    "SIGTERM saved no state file"
                );
                self.start_daemon();
            }
            Server::KernelNfsd => {
                let before = knfsd_proc3();
                // No threads: the server goes away (the export's tmpfs
                // stays); knfsd-up starts it again with RDMA.
                self.runner.sh("rpc.nfsd 0");
                knfsd_up(&mut self.runner);
                let after = knfsd_proc3();
                for p in 0..22 {
                    if after[p] < before[p] {
                        self.past[p] += before[p];
                    }
                }
            }
        }
    }

    fn kill(&mut self) {
        match self.server {
            Server::Ours => {
                let d = self.daemon.take().expect("nfsrdmad is running");
                self.dead_report = Some(d.report());
                d.kill(&mut self.runner);
            }
            Server::KernelNfsd => {
                self.runner.sh("rpc.nfsd 0");
            }
        }
    }
}

impl Drop for VmTarget {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            if std::thread::panicking() {
                // No asserts here: a second panic would abort the run.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(d.pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                let _ = self.runner.run(&format!("wait {}", d.pid));
            } else {
                // A clean stop is part of every case.
                let report = d.stop(&mut self.runner);
                println!("nfsrdmad counters at the end:\n{report}");
            }
        }
        if self.server == Server::KernelNfsd {
            reset_nfs_services();
        }
        let _ = std::fs::remove_dir_all(&self.work);
    }
}

/// Runs one suite case against `t` and checks that the mount's calls went
/// over RDMA.
fn over_rdma(mut t: VmTarget, case: fn(&mut dyn Target)) {
    let before = t.rdma_calls();
    case(&mut t);
    let after = t.rdma_calls();
    println!("{:?}: {} calls over RDMA", t.server, after - before);
    assert!(
        after > before + 10,
        "the mount made {} calls over RDMA",
        after - before
    );
}

/// The same cases against each server.
macro_rules! vm_cases {
    ($module:ident, $target:expr) => {
        mod $module {
            use super::*;

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn posix_suite() {
                over_rdma($target, suite::posix_suite);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn readdir_of_10000_entries() {
                over_rdma($target, suite::readdir_of_10000_entries);
            }

            /// 64 MiB instead of the host's 256 MiB: under TCG emulation
            /// (and a debug build) the copy in and out and the checksums of
            /// 256 MiB take too long for one test.
            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn large_file_copy_64mib() {
                over_rdma($target, |t| suite::large_file_copy(t, 64));
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn concurrent_writers_to_different_files() {
                over_rdma($target, suite::concurrent_writers_to_different_files);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn close_to_open_sees_other_clients_changes() {
                over_rdma($target, suite::close_to_open_sees_other_clients_changes);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn standard_tools_through_the_mount() {
                over_rdma($target, suite::standard_tools_through_the_mount);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn daemon_mode_and_sigterm() {
                over_rdma($target, suite::daemon_mode_and_sigterm);
            }

            /// No RDMA check here: every mount in this case fails before
            /// NFS traffic (MOUNT refuses, the RDMA connection is refused,
            /// or the options are rejected).
            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn bad_input() {
                suite::bad_input(&mut $target);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn server_dies_mid_copy_soft() {
                over_rdma($target, suite::server_dies_mid_copy_soft);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn write_verifier_change_resends_uncommitted_data() {
                over_rdma(
                    $target,
                    suite::write_verifier_change_resends_uncommitted_data,
                );
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn open_file_survives_unlink_and_replace() {
                over_rdma($target, suite::open_file_survives_unlink_and_replace);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn read_only_mount() {
                over_rdma($target, suite::read_only_mount);
            }

            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn noac_mount() {
                over_rdma($target, suite::noac_mount);
            }
        }
    };
}

vm_cases!(vm_mount_ours, VmTarget::ours());
vm_cases!(vm_mount_knfsd, VmTarget::knfsd());
