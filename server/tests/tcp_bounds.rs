//! nfsrdmad over TCP stays within its stated memory budget whatever a peer
//! does: a client that sends calls and never reads the replies, a crowd of
//! connections beyond --max-connections, record markers that claim far more
//! than they send, a client that dribbles a record that never completes.
//!
//! Each case runs the real daemon, reads its resident memory (VmRSS) and
//! address space (VmData) from /proc, its CPU time from /proc/PID/stat, its
//! budget from the line it logs at start and its counters from the report
//! it prints on SIGUSR1, while a well-behaved client on a connection of its
//! own keeps calling (its latencies are printed, not judged).

mod common;

use bytes::BytesMut;
use common::{serving, RawClient};
use nfsrdma_xdr::nfs3::{
    self, Create3Args, CreateHow3, DirOpArgs3, Getattr3Args, Nfs3Args, Nfs3Res, NfsFh3, NfsProc3,
    NfsResult, Readdirplus3Args, Sattr3,
};
use nfsrdma_xdr::record::marker;
use nfsrdma_xdr::Xdr;
use std::io::{BufRead, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The daemon under test, its stderr collected as it comes.
struct Daemon {
    child: Option<Child>,
    pid: u32,
    addr: SocketAddr,
    stderr: Arc<Mutex<String>>,
}

impl Daemon {
    fn start(args: &[&str]) -> Daemon {
        let mut all = vec!["--no-rdma"];
        all.extend_from_slice(args);
        let (mut child, addr) = serving(&all, Stdio::piped());
        let pid = child.id();
        let stderr = Arc::new(Mutex::new(String::new()));
        let err = child.stderr.take().expect("stderr");
        let sink = stderr.clone();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        let d = Daemon {
            child: Some(child),
            pid,
            addr,
            stderr,
        };
        // The limits line comes before the listening line on stdout, but
        // through another pipe: wait for it.
        let log = d.wait_for_log("memory_per_connection=", 1);
        // A log that goes to a pipe or a file, not a terminal, has no
        // colour sequences in it.
        assert!(
            !log.contains('\x1b'),
            "colour sequences in the log: {log:?}"
        );
        d
    }

    fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits until `needle` occurs `n` times in stderr; returns stderr.
    fn wait_for_log(&self, needle: &str, n: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let log = self.log();
            if log.matches(needle).count() >= n {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "{needle:?} not logged {n} times: {log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A figure of the TCP limits line, `name=N`.
    fn limit(&self, name: &str) -> u64 {
        let log = self.log();
        let line = log
            .lines()
            .find(|l| l.contains("TCP limits"))
            .unwrap_or_else(|| panic!("no TCP limits line: {log}"));
        field(line, &format!("{name}="))
    }

    /// The `tcp:` line of a fresh SIGUSR1 report.
    fn report(&self) -> Counters {
        let n = self.log().matches("tcp: connections").count();
        signal(self.pid, "USR1");
        let log = self.wait_for_log("tcp: connections", n + 1);
        let line = log
            .lines()
            .rfind(|l| l.starts_with("tcp: connections"))
            .expect("tcp line")
            .to_string();
        Counters::parse(&line)
    }

    /// Resident memory, KiB.
    fn rss_kib(&self) -> u64 {
        status_kib(self.pid, "VmRSS:")
    }

    /// Private address space (heap and anonymous mappings), KiB.
    fn data_kib(&self) -> u64 {
        status_kib(self.pid, "VmData:")
    }

    /// User and system CPU time so far, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).expect("stat");
        // Fields after the command name, which is in parentheses.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line.
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    }

    /// CPU ticks (1/100 s) the daemon uses over `secs` seconds, with no
    /// client left: asserted to be near idle.
    fn assert_idle(&self, case: &str) {
        let before = self.cpu_ticks();
        std::thread::sleep(Duration::from_secs(2));
        let used = self.cpu_ticks() - before;
        println!("{case}: daemon CPU over 2 s after the peer left: {used} ticks of 1/100 s");
        assert!(
            used <= 40,
            "{case}: the daemon used {used}/200 ticks of CPU over 2 s with no client"
        );
    }

    /// Stops the daemon with SIGTERM; it must exit 0 (within the hang
    /// guard) and print its final report.
    fn stop(mut self) -> String {
        signal(self.pid, "TERM");
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("nfsrdmad did not stop on SIGTERM: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "nfsrdmad exited with {status}");
        self.wait_for_log("tcp: connections", 1)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

fn status_kib(pid: u32, key: &str) -> u64 {
    try_status_kib(pid, key).unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// A figure of /proc/PID/status, `None` once the process is gone.
fn try_status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The number after `key` in `line`.
fn field(line: &str, key: &str) -> u64 {
    let at = line
        .find(key)
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        + key.len();
    line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("no number after {key} in {line:?}"))
}

/// The daemon's TCP counters.
#[derive(Debug, Clone, Copy)]
struct Counters {
    connections: u64,
    open: u64,
    refused_connections: u64,
    closed_idle: u64,
    closed_unread: u64,
    records: u64,
    refused_records: u64,
    pauses: u64,
}

impl Counters {
    fn parse(line: &str) -> Counters {
        Counters {
            connections: field(line, "tcp: connections "),
            open: field(line, "(open "),
            refused_connections: field(line, "refused over --max-connections "),
            closed_idle: field(line, "closed idle "),
            closed_unread: field(line, "closed with replies unread "),
            records: field(line, "records "),
            refused_records: field(line, "(refused "),
            pauses: field(line, "reader pauses for unsent replies "),
        }
    }
}

/// A client on a connection of its own that calls GETATTR every 20 ms,
/// each with a hang guard (the client's 10 s read timeout), and keeps the
/// latencies.
struct GoodClient {
    stop: Arc<AtomicBool>,
    calls: Arc<AtomicU64>,
    thread: Option<JoinHandle<Vec<Duration>>>,
}

impl GoodClient {
    fn start(addr: SocketAddr) -> GoodClient {
        let mut c = RawClient::connect(addr);
        let root = c.mount("/export");
        let stop = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicU64::new(0));
        let (s, n) = (stop.clone(), calls.clone());
        let thread = std::thread::spawn(move || {
            let mut lat = Vec::new();
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = c.nfs(Nfs3Args::Getattr(Getattr3Args {
                    object: root.clone(),
                }));
                assert!(matches!(r, Nfs3Res::Getattr(NfsResult::Ok(_))), "{r:?}");
                lat.push(t.elapsed());
                n.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
            lat
        });
        GoodClient {
            stop,
            calls,
            thread: Some(thread),
        }
    }

    /// Waits until the client has been answered `more` more times.
    fn answered(&self, more: u64) {
        let target = self.calls.load(Ordering::Relaxed) + more;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.calls.load(Ordering::Relaxed) < target {
            assert!(
                self.thread.as_ref().is_some_and(|t| !t.is_finished()),
                "the well-behaved client failed"
            );
            assert!(
                Instant::now() < deadline,
                "the well-behaved client got no answers"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops the client and prints its latencies.
    fn finish(mut self, case: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let mut lat = match self.thread.take().unwrap().join() {
            Ok(l) => l,
            Err(e) => std::panic::resume_unwind(e),
        };
        assert!(
            !lat.is_empty(),
            "{case}: the well-behaved client got no answer"
        );
        lat.sort();
        let at = |q: f64| lat[((lat.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e6;
        println!(
            "{case}: well-behaved client: {} GETATTRs answered, latency p50 {:.0} us, p99 {:.0} us, max {:.0} us",
            lat.len(),
            at(0.5),
            at(0.99),
            at(1.0)
        );
    }
}

/// Creates `n` files in /export (so that a READDIRPLUS of it has a large
/// reply, made afresh for each call); the root's handle.
fn make_files(addr: SocketAddr, n: usize) -> NfsFh3 {
    let mut c = RawClient::connect(addr);
    let root = c.mount("/export");
    for i in 0..n {
        match c.nfs(Nfs3Args::Create(Create3Args {
            where_: DirOpArgs3 {
                dir: root.clone(),
                name: format!("file-with-a-longish-name-{i:05}")
                    .into_bytes()
                    .into(),
            },
            how: CreateHow3::Unchecked(Sattr3::default()),
        })) {
            Nfs3Res::Create(NfsResult::Ok(_)) => {}
            r => panic!("CREATE: {r:?}"),
        }
    }
    root
}

/// Samples the daemon's RSS every 20 ms; the peak, KiB. Kills the daemon
/// when it passes `kill_above` (an unbounded server would take the machine).
struct RssWatch {
    stop: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: JoinHandle<()>,
}

impl RssWatch {
    fn start(pid: u32, kill_above: u64) -> RssWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let killed = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let (s, k, p) = (stop.clone(), killed.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Some(rss) = try_status_kib(pid, "VmRSS:") else {
                    break;
                };
                p.fetch_max(rss, Ordering::Relaxed);
                if rss > kill_above {
                    signal(pid, "KILL");
                    k.store(true, Ordering::Relaxed);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        RssWatch {
            stop,
            killed,
            peak,
            thread,
        }
    }

    /// The peak so far; fails if the daemon had to be killed.
    fn check(&self, case: &str, limit: u64) -> u64 {
        let peak = self.peak.load(Ordering::Relaxed);
        assert!(
            !self.killed.load(Ordering::Relaxed),
            "{case}: RSS reached {peak} KiB, far over the limit of {limit} KiB: the daemon was killed"
        );
        peak
    }

    fn finish(self, case: &str, limit: u64) -> u64 {
        let peak = self.check(case, limit);
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        peak.max(self.peak.load(Ordering::Relaxed))
    }
}

/// Slack over the stated budget for what is not the connection's: the
/// allocator's per-thread arenas and rounding, the runtime's threads.
const SLACK_KIB: u64 = 16 * 1024;

/// A client pipelines 10,000 NULL calls, then 10,000 READDIRPLUS calls
/// whose replies are about 32 KiB each (over 300 MiB of replies), and never
/// reads a reply. The daemon stops reading
/// it once its unsent replies hold the connection's budget, its RSS stays
/// within the stated per-connection figure, the connection is closed after
/// the idle timeout without a reply taken, and its memory goes back.
#[test]
fn a_client_that_never_reads_is_paused_then_closed() {
    const CASE: &str = "never reads";
    let d = Daemon::start(&["--tcp-idle-timeout", "5"]);
    let per_conn_kib = d.limit("memory_per_connection") / 1024;
    let root = make_files(d.addr, 200);
    let good = GoodClient::start(d.addr);
    good.answered(5);
    let base = d.rss_kib();
    let limit = base + per_conn_kib + SLACK_KIB;
    let watch = RssWatch::start(d.pid, limit + 64 * 1024);

    let mut bad = RawClient::connect(d.addr);
    bad.s
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut wire = Vec::new();
    for _ in 0..10_000 {
        let xid = bad.xid();
        let call = bad.call_bytes(xid, nfs3::PROGRAM, 3, NfsProc3::Null as u32, &[]);
        wire.extend_from_slice(&marker(call.len() as u32, true));
        wire.extend_from_slice(&call);
    }
    let readdirs_at = wire.len();
    let mut args = BytesMut::new();
    Readdirplus3Args {
        dir: root,
        cookie: 0,
        cookieverf: Default::default(),
        dircount: 32 * 1024,
        maxcount: 32 * 1024,
    }
    .encode(&mut args);
    for _ in 0..10_000 {
        let xid = bad.xid();
        let call = bad.call_bytes(xid, nfs3::PROGRAM, 3, NfsProc3::Readdirplus as u32, &args);
        wire.extend_from_slice(&marker(call.len() as u32, true));
        wire.extend_from_slice(&call);
    }
    // Sent in pieces: a write that makes no progress for 2 s means the
    // daemon stopped reading (which is what a bounded server does).
    let mut sent = 0;
    let mut blocked = false;
    for piece in wire.chunks(64 * 1024) {
        match bad.s.write_all(piece) {
            Ok(()) => sent += piece.len(),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                blocked = true;
                break;
            }
            Err(e) => panic!("{CASE}: send: {e} (daemon: {})", d.log()),
        }
    }
    println!(
        "{CASE}: sent {sent} of {} bytes of calls; the daemon stopped reading: {blocked}",
        wire.len()
    );
    // Let the daemon do what it will with what it got.
    std::thread::sleep(Duration::from_secs(1));
    let peak = watch.check(CASE, limit);
    let held = d.rss_kib();
    assert!(
        held.max(peak) <= limit,
        "{CASE}: RSS at {} KiB, over {base} KiB before + {per_conn_kib} KiB per connection + {SLACK_KIB} KiB slack",
        held.max(peak)
    );
    good.answered(5);
    let c = d.report();
    println!("{CASE}: counters while held: {c:?}");
    // Closed after the idle timeout (5 s) with none of its replies taken.
    let deadline = Instant::now() + Duration::from_secs(30);
    let c = loop {
        let c = d.report();
        if c.closed_unread >= 1 || Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    good.answered(5);
    let peak = watch.finish(CASE, limit);
    println!(
        "{CASE}: RSS before {base} KiB, held {held} KiB, peak {peak} KiB; stated per connection {per_conn_kib} KiB, limit asserted {limit} KiB"
    );
    assert!(
        peak <= limit,
        "{CASE}: RSS peaked at {peak} KiB, over {base} KiB before + {per_conn_kib} KiB per connection + {SLACK_KIB} KiB slack"
    );
    assert!(c.pauses >= 1, "{CASE}: the reader never paused: {c:?}");
    assert!(c.records >= 10_000, "{CASE}: {c:?}");
    assert_eq!(c.closed_unread, 1, "{CASE}: {c:?}");
    drop(bad);
    std::thread::sleep(Duration::from_millis(500));
    let after = d.rss_kib();
    println!("{CASE}: RSS after the client left {after} KiB; counters {c:?}");
    assert!(
        after <= base + per_conn_kib + SLACK_KIB,
        "{CASE}: RSS {after} KiB after the client left, from {base} KiB"
    );
    good.finish(CASE);
    d.assert_idle(CASE);
    // A second one is there when the daemon is told to stop: the daemon
    // does not wait for it for long (its replies go unsent).
    let mut bad = RawClient::connect(d.addr);
    bad.s
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let _ = bad.s.write_all(&wire[readdirs_at..]);
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let end = d.stop();
    println!(
        "{CASE}: stopped in {:?} with a client that does not read",
        t.elapsed()
    );
    assert!(!end.contains("panicked"), "{end}");
    // Closed by the stop (no progress for 5 s), or by the idle timeout
    // (also 5 s here) just before.
    assert!(
        end.contains("stopping: replies unread") || end.contains("closed with replies unread 2"),
        "{end}"
    );
    drop(bad);
}

/// 10,000 connections opened and held against --max-connections 9000: the
/// first 9,000 are served (and cost little each), the rest are closed at
/// once and counted, one log line says so, and the well-behaved client,
/// connected first, is served throughout.
#[test]
fn connections_beyond_the_cap_are_closed_at_once_and_counted() {
    const CASE: &str = "10,000 connections";
    // This process and the daemon each hold one descriptor per
    // connection: ask for the hard limit, and on a machine whose limit is
    // still too low, use as many as it allows (and say so).
    let fds = raise_open_file_limit();
    let n_max = fds.saturating_sub(256).min(10_000);
    assert!(
        n_max >= 1000,
        "{CASE}: open-file limit {fds} is too low for this test"
    );
    if n_max < 10_000 {
        println!("{CASE}: the open-file limit is {fds}: {n_max} connections instead");
    }
    let (n, cap) = (n_max, n_max * 9 / 10);
    let d = Daemon::start(&["--max-connections", &cap.to_string()]);
    assert_eq!(d.limit("max_connections"), cap as u64);
    let per_conn = d.limit("memory_per_connection");
    let total = d.limit("memory_total");
    println!(
        "{CASE}: stated per connection {} KiB, in all {} MiB",
        per_conn / 1024,
        total >> 20
    );
    let good = GoodClient::start(d.addr);
    good.answered(3);
    let base = d.rss_kib();
    let mut held = Vec::with_capacity(n);
    let t = Instant::now();
    for i in 0..n {
        match TcpStream::connect(d.addr) {
            Ok(s) => held.push(s),
            Err(e) => panic!("{CASE}: connection {i}: {e}"),
        }
    }
    println!("{CASE}: {n} connected in {:?}", t.elapsed());
    // Every connection beyond the cap (the good client holds one) is
    // accepted and closed: the client reads the end of the stream.
    let deadline = Instant::now() + Duration::from_secs(30);
    let c = loop {
        let c = d.report();
        if c.refused_connections as usize >= n + 1 - cap || Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("{CASE}: counters with all held: {c:?}");
    assert_eq!(c.open as usize, cap, "{c:?}");
    assert_eq!(c.refused_connections as usize, n + 1 - cap, "{c:?}");
    for s in &mut held[n - 10..] {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 1];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            r => panic!("{CASE}: a connection over the cap: {r:?}"),
        }
    }
    // The well-behaved client, served before the crowd came, still is.
    good.answered(5);
    let rss = d.rss_kib();
    let per = (rss.saturating_sub(base)) * 1024 / cap as u64;
    println!(
        "{CASE}: RSS before {base} KiB, with {cap} served and {} refused {rss} KiB: {per} bytes per connection",
        n - cap
    );
    assert!(
        per <= 16 * 1024,
        "{CASE}: {per} bytes of RSS per idle connection, over the 16 KiB stated for a connection's own state"
    );
    let log = d.log();
    let lines = log.matches("TCP connection refused").count();
    assert!(
        (1..=3).contains(&lines),
        "{CASE}: {lines} refusal lines (one per 10 s at most): {log}"
    );
    drop(held);
    // The slots come back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = d.report();
        if c.open == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "{CASE}: {c:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut again = RawClient::connect(d.addr);
    again.mount("/export");
    drop(again);
    let after = d.rss_kib();
    // The allocator keeps what the crowd's connections held (RSS does not
    // go down); a second crowd costs no more per connection than the
    // first.
    let held: Vec<TcpStream> = (0..cap - 1)
        .map(|_| TcpStream::connect(d.addr).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    while d.report().open as usize != cap {
        assert!(Instant::now() < deadline, "{CASE}: the second crowd");
        std::thread::sleep(Duration::from_millis(100));
    }
    let second = d.rss_kib();
    drop(held);
    println!(
        "{CASE}: RSS after they closed {after} KiB, with a second crowd of {} {second} KiB",
        cap - 1
    );
    assert!(
        second <= after + (cap as u64) * 16,
        "{CASE}: RSS {after} KiB after the first crowd, {second} KiB with the second"
    );
    good.finish(CASE);
    d.assert_idle(CASE);
    let c = d.report();
    println!("{CASE}: counters at the end: {c:?}");
    // The first crowd and the client, the one after it, the second crowd.
    assert_eq!(c.connections as usize, cap + 1 + (cap - 1), "{c:?}");
    d.stop();
}

/// Record markers that claim more than is sent: 1 GiB (over the maximum,
/// refused at the marker) and just under the maximum, each followed by 10
/// bytes, on 16 connections each. The claims allocate nothing like what
/// they claim: neither RSS nor the address space grows by the maximum.
#[test]
fn record_markers_claiming_more_than_sent_allocate_nothing_like_it() {
    const CASE: &str = "large claims";
    const MAX: u32 = 64 << 20;
    const CONNS: usize = 16;
    let d = Daemon::start(&["--max-record", "64M"]);
    let good = GoodClient::start(d.addr);
    good.answered(3);
    let (rss0, data0) = (d.rss_kib(), d.data_kib());

    let mut refused = Vec::new();
    let mut waiting = Vec::new();
    for _ in 0..CONNS {
        let mut s = TcpStream::connect(d.addr).unwrap();
        s.write_all(&marker(1 << 30, true)).unwrap();
        let _ = s.write_all(&[7; 10]);
        refused.push(s);
        let mut s = TcpStream::connect(d.addr).unwrap();
        s.write_all(&marker(MAX - 4, true)).unwrap();
        s.write_all(&[7; 10]).unwrap();
        waiting.push(s);
    }
    // The 1 GiB claims are refused: their connections end.
    for s in &mut refused {
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            r => panic!("{CASE}: a 1 GiB claim: {r:?}"),
        }
    }
    good.answered(5);
    let c = d.report();
    let (rss, data) = (d.rss_kib(), d.data_kib());
    println!(
        "{CASE}: RSS {rss0} -> {rss} KiB, address space (VmData) {data0} -> {data} KiB with {CONNS} claims of {} MiB waiting; counters {c:?}",
        MAX >> 20
    );
    assert_eq!(c.refused_records as usize, CONNS, "{c:?}");
    assert_eq!(c.open as usize, CONNS + 1, "{c:?}");
    let max_kib = u64::from(MAX) / 1024;
    assert!(
        data.saturating_sub(data0) < max_kib,
        "{CASE}: the address space grew by {} KiB for {CONNS} claims of {max_kib} KiB",
        data - data0
    );
    assert!(
        rss.saturating_sub(rss0) < max_kib / 4,
        "{CASE}: RSS grew by {} KiB",
        rss - rss0
    );
    drop(waiting);
    drop(refused);
    good.finish(CASE);
    d.assert_idle(CASE);
    d.stop();
}

/// A client that sends a record marker and then one byte every 300 ms, and
/// one that connects and sends nothing, are closed after the idle timeout
/// (2 s here); a client that calls every 20 ms is not.
#[test]
fn a_dribbler_and_a_silent_client_are_closed_after_the_idle_timeout() {
    const CASE: &str = "dribbler";
    const IDLE: Duration = Duration::from_secs(2);
    let d = Daemon::start(&["--tcp-idle-timeout", "2"]);
    assert_eq!(d.limit("idle_timeout_secs"), 2);
    let good = GoodClient::start(d.addr);
    good.answered(3);
    let silent = TcpStream::connect(d.addr).unwrap();
    let mut drip = TcpStream::connect(d.addr).unwrap();
    let start = Instant::now();
    drip.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    drip.write_all(&marker(1000, true)).unwrap();
    let mut dripped = 0;
    let closed_after = loop {
        if drip.write_all(&[0]).is_err() {
            break start.elapsed();
        }
        dripped += 1;
        let mut b = [0u8; 1];
        match drip.read(&mut b) {
            Ok(0) => break start.elapsed(),
            Ok(_) => panic!("{CASE}: a reply to a record never completed"),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break start.elapsed(),
            Err(_) => {}
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{CASE}: the dribbler was never closed"
        );
    };
    println!("{CASE}: dribbler closed after {closed_after:?} and {dripped} bytes");
    assert!(
        closed_after >= IDLE - Duration::from_millis(100),
        "{CASE}: closed before the idle timeout: {closed_after:?}"
    );
    let mut silent = silent;
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    assert!(
        matches!(silent.read(&mut b), Ok(0)),
        "{CASE}: the silent connection is open"
    );
    good.answered(5);
    let c = d.report();
    println!("{CASE}: counters {c:?}");
    // The dribbler and the silent one; not the client calling every 20 ms.
    assert_eq!(c.closed_idle, 2, "{c:?}");
    assert_eq!(c.open, 1, "{c:?}");
    assert_eq!(c.refused_records, 0, "{c:?}");
    let log = d.log();
    assert!(
        log.contains("closing idle TCP connection"),
        "{CASE}: no log line: {log}"
    );
    good.finish(CASE);
    d.assert_idle(CASE);
    d.stop();
}

/// The flags' bad values are refused by name; the configuration file's
/// keys set the same limits, and the start line shows them.
#[test]
fn limit_flags_and_config_keys() {
    for (args, says) in [
        (
            &["--max-connections", "0"][..],
            "--max-connections must be at least 1",
        ),
        (
            &["--tcp-idle-timeout", "100000"][..],
            "--tcp-idle-timeout must be between 0 and 86400 seconds",
        ),
    ] {
        let out = common::nfsrdmad(args)
            .arg("--no-rdma")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("run nfsrdmad");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let cfg = std::env::temp_dir().join(format!("nfsrdmad-limits-{}.toml", std::process::id()));
    std::fs::write(&cfg, "max_connections = 5\ntcp_idle_timeout = 0\n").unwrap();
    let d = Daemon::start(&["--config", cfg.to_str().unwrap()]);
    let _ = std::fs::remove_file(&cfg);
    assert_eq!(d.limit("max_connections"), 5);
    assert_eq!(d.limit("idle_timeout_secs"), 0);
    let per = d.limit("memory_per_connection");
    // Five connections at their most, and the buffers the 64 workers'
    // calls may keep (twice the largest record and a read chunk each).
    let executing = 64 * 2 * ((1088 << 10) + (64 << 10));
    assert_eq!(d.limit("memory_total"), 5 * per + executing, "{}", d.log());
    d.stop();
}

/// Raises this process's soft open-file limit to its hard limit (with
/// `prlimit`, so that no unsafe code is needed; children inherit it) and
/// returns the soft limit then in force.
fn raise_open_file_limit() -> usize {
    let pid = std::process::id().to_string();
    let soft_hard = || -> Option<(usize, usize)> {
        let t = std::fs::read_to_string("/proc/self/limits").ok()?;
        let l = t.lines().find(|l| l.starts_with("Max open files"))?;
        let mut f = l.trim_start_matches("Max open files").split_whitespace();
        let parse = |v: &str| {
            if v == "unlimited" {
                Some(1 << 20)
            } else {
                v.parse().ok()
            }
        };
        Some((parse(f.next()?)?, parse(f.next()?)?))
    };
    let Some((soft, hard)) = soft_hard() else {
        return 1024;
    };
    if soft < hard {
        let _ = std::process::Command::new("prlimit")
            .args(["--pid", &pid, &format!("--nofile={hard}:{hard}")])
            .status();
    }
    soft_hard().map_or(soft, |(s, _)| s)
}
