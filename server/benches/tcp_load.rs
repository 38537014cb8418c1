//! Load generator for the NFSv3-over-TCP server.
//!
//! Starts servers in this process on loopback ports and drives each with a
//! pipelined NFSv3 client: one TCP connection per client thread, `depth`
//! calls kept in flight on it (replies matched by xid, in any order). The
//! workloads are GETATTR, 4 KiB READ and 4 KiB FILE_SYNC WRITE at random
//! 4 KiB-aligned offsets of a 64 MiB file created and filled beforehand.
//! Every (workload, depth, server) run gets a fresh server.
//!
//! The servers compared are nfsrdmad's TCP front end and the `nfsserve`
//! crate over a small in-memory file system written here.
//!
//! `--rss` instead starts the real `nfsrdmad` binary and reports its
//! resident memory with an empty store and per idle connection.
//!
//! ```text
//! cargo bench -p nfsrdma-server --bench tcp_load -- [--secs N] [--warmup S]
//!     [--depth 1,16] [--workload getattr,read,write] [--server ours,nfsserve]
//!     [--clients N]
//! cargo build --release -p nfsrdma-server
//! cargo bench -p nfsrdma-server --bench tcp_load -- --rss [--conns N]
//! ```

use anyhow::{anyhow, bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use nfsrdma_server::exports::{ExportOptions, Exports};
use nfsrdma_server::service::{Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_server::tcp::{TcpConfig, TcpServer};
use nfsrdma_xdr::nfs3::{
    self, Create3Args, CreateHow3, Data, DirOpArgs3, Getattr3Args, Lookup3Args, Nfs3Args, Nfs3Res,
    NfsFh3, NfsProc3, NfsResult, NfsStat3, Read3Args, Sattr3, Setattr3Args, StableHow, Write3Args,
};
use nfsrdma_xdr::record::{marker, RecordReader};
use nfsrdma_xdr::rpc::{AcceptStat, AuthSysParms, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{mount, BoundedVec, Decoder, Xdr};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of the file the workloads use.
const FILE_SIZE: u64 = 64 << 20;
/// Size of one READ or WRITE.
const BLOCK: u32 = 4096;
/// Size of the WRITEs that fill the file before a run.
const FILL_CHUNK: u32 = 1 << 20;
/// The exported path on both servers.
const EXPORT: &str = "/export";

// ---- options ---------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Workload {
    Getattr,
    Read,
    Write,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Getattr => "GETATTR",
            Workload::Read => "READ 4K",
            Workload::Write => "WRITE 4K",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    Ours,
    Nfsserve,
}

impl Peer {
    fn name(self) -> &'static str {
        match self {
            Peer::Ours => "nfsrdmad",
            Peer::Nfsserve => "nfsserve",
        }
    }
}

#[derive(Debug)]
struct Options {
    secs: f64,
    warmup: f64,
    depths: Vec<usize>,
    workloads: Vec<Workload>,
    servers: Vec<Peer>,
    clients: usize,
    rss: bool,
    conns: usize,
}

const USAGE: &str = "\
usage: tcp_load [--secs N] [--warmup S] [--depth 1,16] [--workload getattr,read,write]
                [--server ours,nfsserve] [--clients N]
       tcp_load --rss [--conns N]   (needs `cargo build --release -p nfsrdma-server`)";

fn parse_list<T>(v: &str, f: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    v.split(',').filter(|s| !s.is_empty()).map(f).collect()
}

fn parse_options() -> Result<Options> {
    let mut o = Options {
        secs: 5.0,
        warmup: 1.0,
        depths: vec![1, 16],
        workloads: vec![Workload::Getattr, Workload::Read, Workload::Write],
        servers: vec![Peer::Ours, Peer::Nfsserve],
        clients: 1,
        rss: false,
        conns: 100,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| {
            args.next()
                .ok_or_else(|| anyhow!("{name} needs a value\n{USAGE}"))
        };
        match a.as_str() {
            // cargo bench passes this to every bench target.
            "--bench" => {}
            "--rss" => o.rss = true,
            "--secs" => o.secs = value("--secs")?.parse().context("--secs")?,
            "--warmup" => o.warmup = value("--warmup")?.parse().context("--warmup")?,
            "--clients" => o.clients = value("--clients")?.parse().context("--clients")?,
            "--conns" => o.conns = value("--conns")?.parse().context("--conns")?,
            "--depth" => {
                o.depths = parse_list(&value("--depth")?, |s| {
                    s.parse::<usize>().with_context(|| format!("--depth {s}"))
                })?
            }
            "--workload" => {
                o.workloads = parse_list(&value("--workload")?, |s| match s {
                    "getattr" => Ok(Workload::Getattr),
                    "read" => Ok(Workload::Read),
                    "write" => Ok(Workload::Write),
                    _ => bail!("unknown workload {s:?}"),
                })?
            }
            "--server" => {
                o.servers = parse_list(&value("--server")?, |s| match s {
                    "ours" | "nfsrdmad" => Ok(Peer::Ours),
                    "nfsserve" => Ok(Peer::Nfsserve),
                    _ => bail!("unknown server {s:?}"),
                })?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => bail!("unknown argument {a:?}\n{USAGE}"),
        }
    }
    ensure!(o.secs > 0.0, "--secs must be positive");
    ensure!(o.warmup >= 0.0, "--warmup must not be negative");
    ensure!(o.clients > 0, "--clients must be at least 1");
    ensure!(
        o.depths.iter().all(|&d| d > 0),
        "--depth must be at least 1"
    );
    Ok(o)
}

// ---- servers -----------------------------------------------------------------

/// A server running in this process on its own runtime.
struct RunningServer {
    addr: SocketAddr,
    shutdown: Option<tokio::sync::watch::Sender<bool>>,
    task: Option<tokio::task::JoinHandle<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

/// Both servers get the same runtime: two worker threads, the machine the
/// benchmark was written for having two cores.
fn server_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

impl RunningServer {
    fn start(peer: Peer) -> Result<RunningServer> {
        match peer {
            Peer::Ours => Self::start_ours(),
            Peer::Nfsserve => Self::start_nfsserve(),
        }
    }

    fn start_ours() -> Result<RunningServer> {
        let rules = Exports::single(EXPORT, ExportOptions::permissive())?;
        let exports = Service::exports_from_rules(&rules, &StoreConfig::default());
        let service = Arc::new(Service::new(exports, ServiceConfig::default()));
        let rt = server_runtime()?;
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
        let addr = listener.local_addr()?;
        let (tx, rx) = tokio::sync::watch::channel(false);
        let server = TcpServer::new(service, TcpConfig::default());
        let task = rt.spawn(async move { server.serve(listener, rx).await });
        Ok(RunningServer {
            addr,
            shutdown: Some(tx),
            task: Some(task),
            rt: Some(rt),
        })
    }

    fn start_nfsserve() -> Result<RunningServer> {
        use nfsserve::tcp::{NFSTcp, NFSTcpListener};
        let rt = server_runtime()?;
        let mut listener = rt.block_on(NFSTcpListener::bind("127.0.0.1:0", memfs::MemFs::new()))?;
        listener.with_export_name(EXPORT);
        // MOUNT is served on the same port as NFS.
        let addr = SocketAddr::from(([127, 0, 0, 1], listener.get_listen_port()));
        let task = rt.spawn(async move {
            if let Err(e) = listener.handle_forever().await {
                eprintln!("nfsserve listener: {e}");
            }
        });
        Ok(RunningServer {
            addr,
            shutdown: None,
            task: Some(task),
            rt: Some(rt),
        })
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let Some(rt) = self.rt.take() else { return };
        if let Some(task) = self.task.take() {
            match self.shutdown.take() {
                Some(tx) => {
                    let _ = tx.send(true);
                    let _ = rt.block_on(async {
                        tokio::time::timeout(Duration::from_secs(2), task).await
                    });
                }
                // nfsserve's listener runs until aborted.
                None => task.abort(),
            }
        }
        rt.shutdown_timeout(Duration::from_secs(2));
    }
}

// ---- client ------------------------------------------------------------------

/// One RPC connection: calls are queued with [`Conn::push_call`], sent with
/// [`Conn::flush`], and replies taken as whole records.
struct Conn {
    s: TcpStream,
    reader: RecordReader,
    cred: OpaqueAuth,
    next_xid: u32,
    out: BytesMut,
    rbuf: Vec<u8>,
}

impl Conn {
    fn connect(addr: SocketAddr, first_xid: u32) -> Result<Conn> {
        let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn {
            s,
            reader: RecordReader::new(4 << 20),
            cred: OpaqueAuth::auth_sys(&AuthSysParms {
                stamp: 0,
                machinename: "tcp-load".into(),
                uid: 0,
                gid: 0,
                gids: BoundedVec(vec![]),
            }),
            next_xid: first_xid,
            out: BytesMut::with_capacity(256 * 1024),
            rbuf: vec![0; 256 * 1024],
        })
    }

    /// Queues one call record; returns its xid.
    fn push_call(&mut self, prog: u32, vers: u32, proc_: u32, args: impl Fn(&mut BytesMut)) -> u32 {
        self.next_xid = self.next_xid.wrapping_add(1);
        let xid = self.next_xid;
        let start = self.out.len();
        self.out.extend_from_slice(&[0; 4]);
        RpcMessage::call(xid, prog, vers, proc_, self.cred.clone()).encode(&mut self.out);
        args(&mut self.out);
        let len = (self.out.len() - start - 4) as u32;
        self.out[start..start + 4].copy_from_slice(&marker(len, true));
        xid
    }

    fn push_nfs(&mut self, args: &Nfs3Args) -> u32 {
        self.push_call(nfs3::PROGRAM, nfs3::VERSION, args.proc_() as u32, |b| {
            args.encode(b)
        })
    }

    fn flush(&mut self) -> Result<()> {
        if !self.out.is_empty() {
            self.s.write_all(&self.out)?;
            self.out.clear();
        }
        Ok(())
    }

    /// A record already received, if any.
    fn ready(&mut self) -> Result<Option<Bytes>> {
        Ok(self.reader.next_record()?)
    }

    /// The next record, waiting for it.
    fn recv(&mut self) -> Result<Bytes> {
        loop {
            if let Some(r) = self.ready()? {
                return Ok(r);
            }
            let n = self.s.read(&mut self.rbuf)?;
            if n == 0 {
                bail!("server closed the connection");
            }
            self.reader.extend(&self.rbuf[..n]);
        }
    }

    /// One call, waiting for its reply; returns the decoder at the results.
    fn call(
        &mut self,
        prog: u32,
        vers: u32,
        proc_: u32,
        args: impl Fn(&mut BytesMut),
    ) -> Result<Decoder> {
        let xid = self.push_call(prog, vers, proc_, args);
        self.flush()?;
        let (got, d) = split_reply(self.recv()?)?;
        ensure!(got == xid, "reply xid {got}, expected {xid}");
        Ok(d)
    }

    fn nfs(&mut self, args: Nfs3Args) -> Result<Nfs3Res> {
        let p = args.proc_();
        let mut d = self.call(nfs3::PROGRAM, nfs3::VERSION, p as u32, |b| args.encode(b))?;
        Ok(Nfs3Res::decode(p, &mut d)?)
    }

    fn mount(&mut self, path: &str) -> Result<NfsFh3> {
        let arg = mount::DirPath::new(path.as_bytes().to_vec());
        let mut d = self.call(mount::PROGRAM, mount::VERSION, mount::proc_::MNT, |b| {
            arg.encode(b)
        })?;
        match mount::MountRes3::decode(&mut d)? {
            mount::MountRes3::Ok(ok) => Ok(NfsFh3(ok.fhandle.0)),
            mount::MountRes3::Err(e) => bail!("MNT {path}: {e:?}"),
        }
    }
}

/// The xid of a successful reply and a decoder at its results.
fn split_reply(rec: Bytes) -> Result<(u32, Decoder)> {
    let mut d = Decoder::new(rec);
    let h = RpcMessage::decode(&mut d)?;
    match h.as_reply() {
        Some(ReplyBody::Accepted(a)) if a.stat == AcceptStat::Success => Ok((h.xid, d)),
        _ => bail!("call {} failed: {h:?}", h.xid),
    }
}

fn status_of(r: &Nfs3Res) -> Result<()> {
    match r.status() {
        NfsStat3::Ok => Ok(()),
        s => bail!("{:?} failed: {s:?}", r.proc_()),
    }
}

/// The byte every position of 4 KiB block `i` of the file holds.
fn fill_byte(block: u64) -> u8 {
    (block % 251) as u8 + 1
}

/// Mounts the export, creates the 64 MiB file, fills it and checks a few
/// blocks; returns the file's handle.
fn prepare(addr: SocketAddr) -> Result<NfsFh3> {
    let mut c = Conn::connect(addr, 1)?;
    let root = c.mount(EXPORT)?;
    let name = "load.dat";
    let created = c.nfs(Nfs3Args::Create(Create3Args {
        where_: DirOpArgs3 {
            dir: root.clone(),
            name: name.into(),
        },
        how: CreateHow3::Unchecked(Sattr3 {
            mode: Some(0o644),
            ..Sattr3::default()
        }),
    }))?;
    status_of(&created)?;
    let fh = match created {
        Nfs3Res::Create(NfsResult::Ok(ok)) if ok.obj.is_some() => ok.obj.unwrap_or_default(),
        _ => match c.nfs(Nfs3Args::Lookup(Lookup3Args {
            what: DirOpArgs3 {
                dir: root,
                name: name.into(),
            },
        }))? {
            Nfs3Res::Lookup(NfsResult::Ok(ok)) => ok.object,
            r => bail!("LOOKUP {name}: {:?}", r.status()),
        },
    };
    status_of(&c.nfs(Nfs3Args::Setattr(Setattr3Args {
        object: fh.clone(),
        new_attributes: Sattr3 {
            size: Some(FILE_SIZE),
            ..Sattr3::default()
        },
        guard: None,
    }))?)?;
    let per_chunk = u64::from(FILL_CHUNK / BLOCK);
    for chunk in 0..FILE_SIZE / u64::from(FILL_CHUNK) {
        let mut data = Vec::with_capacity(FILL_CHUNK as usize);
        for b in 0..per_chunk {
            data.resize(
                data.len() + BLOCK as usize,
                fill_byte(chunk * per_chunk + b),
            );
        }
        status_of(&c.nfs(Nfs3Args::Write(Write3Args {
            file: fh.clone(),
            offset: chunk * u64::from(FILL_CHUNK),
            count: FILL_CHUNK,
            stable: StableHow::Unstable,
            data: Data::new(data),
        }))?)?;
    }
    match c.nfs(Nfs3Args::Getattr(Getattr3Args { object: fh.clone() }))? {
        Nfs3Res::Getattr(NfsResult::Ok(ok)) => ensure!(
            ok.obj_attributes.size == FILE_SIZE,
            "file size {} after filling, expected {FILE_SIZE}",
            ok.obj_attributes.size
        ),
        r => bail!("GETATTR: {:?}", r.status()),
    }
    let mut rng = Rng(0x5eed);
    for _ in 0..16 {
        let block = rng.next() % (FILE_SIZE / u64::from(BLOCK));
        match c.nfs(Nfs3Args::Read(Read3Args {
            file: fh.clone(),
            offset: block * u64::from(BLOCK),
            count: BLOCK,
        }))? {
            Nfs3Res::Read(NfsResult::Ok(ok)) => ensure!(
                ok.data.len() == BLOCK as usize && ok.data.bytes().all(|x| x == fill_byte(block)),
                "READ of block {block} did not return what was written"
            ),
            r => bail!("READ: {:?}", r.status()),
        }
    }
    Ok(fh)
}

/// xorshift64*: offsets need to be spread, not unpredictable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// What one client thread measured.
struct Measured {
    ops: u64,
    hist: Histogram<u64>,
}

fn new_histogram() -> Histogram<u64> {
    // Nanoseconds, 1 ns to 60 s, three significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

/// Keeps `depth` calls of `workload` in flight on one connection until
/// `end`, counting the replies that arrive between `start` and `end`.
fn drive(
    addr: SocketAddr,
    fh: NfsFh3,
    workload: Workload,
    depth: usize,
    seed: u64,
    start: Instant,
    end: Instant,
) -> Result<Measured> {
    // Distinct xid ranges per connection keep replay caches out of play.
    let mut c = Conn::connect(addr, (seed as u32) << 24)?;
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let payload = Bytes::from(vec![0xa5u8; BLOCK as usize]);
    let blocks = FILE_SIZE / u64::from(BLOCK);
    let mut in_flight: HashMap<u32, Instant> = HashMap::with_capacity(depth * 2);
    let mut m = Measured {
        ops: 0,
        hist: new_histogram(),
    };
    let mut issue = |c: &mut Conn, in_flight: &mut HashMap<u32, Instant>| {
        let offset = (rng.next() % blocks) * u64::from(BLOCK);
        let args = match workload {
            Workload::Getattr => Nfs3Args::Getattr(Getattr3Args { object: fh.clone() }),
            Workload::Read => Nfs3Args::Read(Read3Args {
                file: fh.clone(),
                offset,
                count: BLOCK,
            }),
            Workload::Write => Nfs3Args::Write(Write3Args {
                file: fh.clone(),
                offset,
                count: BLOCK,
                stable: StableHow::FileSync,
                data: Data::new(payload.clone()),
            }),
        };
        let xid = c.push_nfs(&args);
        in_flight.insert(xid, Instant::now());
    };
    for _ in 0..depth {
        issue(&mut c, &mut in_flight);
    }
    c.flush()?;
    while !in_flight.is_empty() {
        let mut rec = Some(c.recv()?);
        while let Some(r) = rec {
            let now = Instant::now();
            let (xid, mut d) = split_reply(r)?;
            let sent = in_flight
                .remove(&xid)
                .ok_or_else(|| anyhow!("reply to unknown xid {xid}"))?;
            check_result(workload, &mut d)?;
            if now >= start && now < end {
                m.ops += 1;
                let ns = u64::try_from((now - sent).as_nanos()).unwrap_or(u64::MAX);
                m.hist.saturating_record(ns.max(1));
            }
            if now < end {
                issue(&mut c, &mut in_flight);
            }
            rec = c.ready()?;
        }
        c.flush()?;
    }
    Ok(m)
}

fn check_result(workload: Workload, d: &mut Decoder) -> Result<()> {
    let proc_ = match workload {
        Workload::Getattr => NfsProc3::Getattr,
        Workload::Read => NfsProc3::Read,
        Workload::Write => NfsProc3::Write,
    };
    match Nfs3Res::decode(proc_, d)? {
        Nfs3Res::Getattr(NfsResult::Ok(_)) => Ok(()),
        Nfs3Res::Read(NfsResult::Ok(ok)) if ok.data.len() == BLOCK as usize => Ok(()),
        Nfs3Res::Write(NfsResult::Ok(ok))
            if ok.count == BLOCK && ok.committed == StableHow::FileSync =>
        {
            Ok(())
        }
        r => bail!("unexpected {proc_:?} result: {r:?}"),
    }
}

/// The outcome of one run.
struct RunResult {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
}

fn run_one(peer: Peer, workload: Workload, depth: usize, o: &Options) -> Result<RunResult> {
    let server = RunningServer::start(peer)?;
    let addr = server.addr;
    let fh = prepare(addr).with_context(|| format!("preparing {}", peer.name()))?;
    let t0 = Instant::now();
    let start = t0 + Duration::from_secs_f64(o.warmup);
    let end = start + Duration::from_secs_f64(o.secs);
    let threads: Vec<_> = (0..o.clients)
        .map(|i| {
            let fh = fh.clone();
            std::thread::spawn(move || drive(addr, fh, workload, depth, i as u64 + 1, start, end))
        })
        .collect();
    let mut ops = 0;
    let mut hist = new_histogram();
    for t in threads {
        let m = t
            .join()
            .map_err(|_| anyhow!("client thread panicked"))?
            .with_context(|| format!("{} {} depth {depth}", peer.name(), workload.name()))?;
        ops += m.ops;
        hist.add(&m.hist)
            .map_err(|e| anyhow!("merging histograms: {e:?}"))?;
    }
    drop(server);
    Ok(RunResult {
        ops_per_sec: ops as f64 / o.secs,
        p50_us: hist.value_at_quantile(0.50) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
    })
}

fn load(o: &Options) -> Result<()> {
    println!(
        "tcp_load: {} s per run after {} s warm-up, {} client connection(s), 64 MiB file, \
         fresh server per run, server runtimes with 2 worker threads",
        o.secs, o.warmup, o.clients
    );
    let ours = o.servers.contains(&Peer::Ours);
    let theirs = o.servers.contains(&Peer::Nfsserve);
    let header = format!(
        "| {:<9}| {:>5} | {:>13} | {:>8} | {:>8} | {:>13} | {:>8} | {:>8} | {:>7} |",
        "workload",
        "depth",
        "ours ops/s",
        "p50 µs",
        "p99 µs",
        "nfsserve ops/s",
        "p50 µs",
        "p99 µs",
        "ratio"
    );
    println!("{header}");
    println!(
        "|{}|{}|{}|{}|{}|{}|{}|{}|{}|",
        "-".repeat(10),
        "-".repeat(7),
        "-".repeat(15),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(15),
        "-".repeat(10),
        "-".repeat(10),
        "-".repeat(9)
    );
    let cells = |r: &Option<RunResult>| match r {
        Some(r) => format!(
            "{:>13.0} | {:>8.1} | {:>8.1}",
            r.ops_per_sec, r.p50_us, r.p99_us
        ),
        None => format!("{:>13} | {:>8} | {:>8}", "-", "-", "-"),
    };
    for &w in &o.workloads {
        for &d in &o.depths {
            let a = if ours {
                Some(run_one(Peer::Ours, w, d, o)?)
            } else {
                None
            };
            let b = if theirs {
                Some(run_one(Peer::Nfsserve, w, d, o)?)
            } else {
                None
            };
            let ratio = match (&a, &b) {
                (Some(a), Some(b)) if b.ops_per_sec > 0.0 => {
                    format!("{:.2}x", a.ops_per_sec / b.ops_per_sec)
                }
                _ => "-".into(),
            };
            println!(
                "| {:<9}| {:>5} | {} | {} | {:>7} |",
                w.name(),
                d,
                cells(&a),
                cells(&b),
                ratio
            );
        }
    }
    Ok(())
}

// ---- memory of the real binary -------------------------------------------

/// A `/proc/PID/status` field in KiB.
fn proc_status_kib(pid: u32, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
            let num = rest.trim().trim_end_matches("kB").trim();
            return Ok(num.parse()?);
        }
    }
    bail!("no {field} in /proc/{pid}/status")
}

fn memory_line(pid: u32) -> Result<(u64, String)> {
    let rss = proc_status_kib(pid, "VmRSS")?;
    let anon = proc_status_kib(pid, "RssAnon")?;
    let file = proc_status_kib(pid, "RssFile")?;
    let threads = proc_status_kib(pid, "Threads")?;
    Ok((
        rss,
        format!("VmRSS {rss} KiB (anon {anon}, file {file}), {threads} threads"),
    ))
}

fn rss(o: &Options) -> Result<()> {
    let exe = std::env::current_exe()?;
    // The bench runs from target/<profile>/deps/.
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .ok_or_else(|| anyhow!("cannot place {}", exe.display()))?;
    let bin = dir.join("nfsrdmad");
    if !bin.exists() {
        bail!(
            "{} not found: run `cargo build --release -p nfsrdma-server` first",
            bin.display()
        );
    }
    let mut child = std::process::Command::new(&bin)
        .args([
            "--export",
            "/export",
            "--tcp",
            "127.0.0.1:0",
            "--no-rpcbind",
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let result = measure_rss(&mut child, o);
    let _ = child.kill();
    let _ = child.wait();
    result
}

fn measure_rss(child: &mut std::process::Child, o: &Options) -> Result<()> {
    let pid = child.id();
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let addr: SocketAddr = loop {
        let line = lines
            .next()
            .ok_or_else(|| anyhow!("nfsrdmad exited before listening"))??;
        if let Some(a) = line.strip_prefix("nfsrdmad: listening on tcp ") {
            break a.trim().parse()?;
        }
    };
    let settle = Duration::from_millis(500);
    std::thread::sleep(settle);
    let (empty, line) = memory_line(pid)?;
    println!("nfsrdmad, empty store, no connections: {line}");
    let mut conns = Vec::with_capacity(o.conns);
    for i in 0..o.conns {
        let mut c = Conn::connect(addr, (i as u32) << 20)?;
        // NULL, so that the connection is fully set up on the server.
        c.call(nfs3::PROGRAM, nfs3::VERSION, 0, |_| {})?;
        conns.push(c);
    }
    std::thread::sleep(settle);
    let (busy, line) = memory_line(pid)?;
    println!("nfsrdmad, {} idle connections: {line}", o.conns);
    let per = (busy as f64 - empty as f64) / o.conns as f64;
    println!("| measure | value | target |");
    println!("|---|---|---|");
    println!(
        "| RSS, empty store | {:.1} MiB ({empty} KiB) | < 32 MiB: {} |",
        empty as f64 / 1024.0,
        if empty < 32 * 1024 { "met" } else { "MISSED" }
    );
    println!(
        "| RSS per idle TCP connection ((RSS_{n} - RSS_empty) / {n}) | {per:.1} KiB | < 256 KiB: {} |",
        if per < 256.0 { "met" } else { "MISSED" },
        n = o.conns
    );
    drop(conns);
    Ok(())
}

fn main() -> Result<()> {
    let o = parse_options()?;
    if o.rss {
        ensure!(o.conns > 0, "--conns must be at least 1");
        rss(&o)
    } else {
        load(&o)
    }
}

// ---- the peer's file system --------------------------------------------------

/// A minimal in-memory file system for `nfsserve`: directories and regular
/// files whose data lives in memory; symlinks and rename are not supported.
mod memfs {
    use async_trait::async_trait;
    use nfsserve::nfs::{
        fattr3, fileid3, filename3, ftype3, nfspath3, nfsstat3, nfstime3, sattr3, set_atime,
        set_gid3, set_mode3, set_mtime, set_size3, set_uid3, specdata3,
    };
    use nfsserve::vfs::{DirEntry, NFSFileSystem, ReadDirResult, VFSCapabilities};
    use std::collections::{BTreeMap, HashMap};
    use std::sync::RwLock;
    use std::time::SystemTime;

    const ROOT: fileid3 = 1;

    enum Content {
        File(Vec<u8>),
        Dir(BTreeMap<Vec<u8>, fileid3>),
    }

    struct Node {
        attr: fattr3,
        content: Content,
    }

    struct Inner {
        nodes: HashMap<fileid3, Node>,
        next_id: fileid3,
    }

    pub struct MemFs {
        inner: RwLock<Inner>,
    }

    fn now() -> nfstime3 {
        let d = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        nfstime3 {
            seconds: d.as_secs() as u32,
            nseconds: d.subsec_nanos(),
        }
    }

    fn new_attr(id: fileid3, ftype: ftype3, mode: u32) -> fattr3 {
        let t = now();
        fattr3 {
            ftype,
            mode,
            nlink: if matches!(ftype, ftype3::NF3DIR) {
                2
            } else {
                1
            },
            uid: 0,
            gid: 0,
            size: 0,
            used: 0,
            rdev: specdata3::default(),
            fsid: 1,
            fileid: id,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    impl MemFs {
        pub fn new() -> MemFs {
            let mut nodes = HashMap::new();
            nodes.insert(
                ROOT,
                Node {
                    attr: new_attr(ROOT, ftype3::NF3DIR, 0o755),
                    content: Content::Dir(BTreeMap::new()),
                },
            );
            MemFs {
                inner: RwLock::new(Inner {
                    nodes,
                    next_id: ROOT + 1,
                }),
            }
        }

        fn add(
            &self,
            dirid: fileid3,
            name: &filename3,
            ftype: ftype3,
            exclusive: bool,
        ) -> Result<(fileid3, fattr3), nfsstat3> {
            let mut g = self.inner.write().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let inner = &mut *g;
            let id = inner.next_id;
            let dir = inner.nodes.get_mut(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
            let Content::Dir(entries) = &mut dir.content else {
                return Err(nfsstat3::NFS3ERR_NOTDIR);
            };
            if let Some(&existing) = entries.get(&name.0) {
                if exclusive || !matches!(ftype, ftype3::NF3REG) {
                    return Err(nfsstat3::NFS3ERR_EXIST);
                }
                let node = inner.nodes.get(&existing).ok_or(nfsstat3::NFS3ERR_IO)?;
                return Ok((existing, node.attr));
            }
            entries.insert(name.0.clone(), id);
            let t = now();
            dir.attr.mtime = t;
            dir.attr.ctime = t;
            dir.attr.size = entries.len() as u64;
            let (mode, content) = match ftype {
                ftype3::NF3DIR => (0o755, Content::Dir(BTreeMap::new())),
                _ => (0o644, Content::File(Vec::new())),
            };
            let attr = new_attr(id, ftype, mode);
            inner.nodes.insert(id, Node { attr, content });
            inner.next_id += 1;
            Ok((id, attr))
        }
    }

    fn apply(node: &mut Node, s: &sattr3) -> Result<(), nfsstat3> {
        let t = now();
        if let set_mode3::mode(m) = s.mode {
            node.attr.mode = m;
        }
        if let set_uid3::uid(u) = s.uid {
            node.attr.uid = u;
        }
        if let set_gid3::gid(g) = s.gid {
            node.attr.gid = g;
        }
        if let set_size3::size(n) = s.size {
            let Content::File(data) = &mut node.content else {
                return Err(nfsstat3::NFS3ERR_ISDIR);
            };
            let n = usize::try_from(n).map_err(|_| nfsstat3::NFS3ERR_FBIG)?;
            data.resize(n, 0);
            node.attr.size = n as u64;
            node.attr.used = n as u64;
            node.attr.mtime = t;
        }
        match s.atime {
            set_atime::DONT_CHANGE => {}
            set_atime::SET_TO_SERVER_TIME => node.attr.atime = t,
            set_atime::SET_TO_CLIENT_TIME(c) => node.attr.atime = c,
        }
        match s.mtime {
            set_mtime::DONT_CHANGE => {}
            set_mtime::SET_TO_SERVER_TIME => node.attr.mtime = t,
            set_mtime::SET_TO_CLIENT_TIME(c) => node.attr.mtime = c,
        }
        node.attr.ctime = t;
        Ok(())
    }

    #[async_trait]
    impl NFSFileSystem for MemFs {
        fn capabilities(&self) -> VFSCapabilities {
            VFSCapabilities::ReadWrite
        }

        fn root_dir(&self) -> fileid3 {
            ROOT
        }

        async fn lookup(&self, dirid: fileid3, filename: &filename3) -> Result<fileid3, nfsstat3> {
            let g = self.inner.read().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let dir = g.nodes.get(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
            let Content::Dir(entries) = &dir.content else {
                return Err(nfsstat3::NFS3ERR_NOTDIR);
            };
            match filename.0.as_slice() {
                b"." => Ok(dirid),
                name => entries.get(name).copied().ok_or(nfsstat3::NFS3ERR_NOENT),
            }
        }

        async fn getattr(&self, id: fileid3) -> Result<fattr3, nfsstat3> {
            let g = self.inner.read().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            g.nodes
                .get(&id)
                .map(|n| n.attr)
                .ok_or(nfsstat3::NFS3ERR_STALE)
        }

        async fn setattr(&self, id: fileid3, setattr: sattr3) -> Result<fattr3, nfsstat3> {
            let mut g = self.inner.write().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let node = g.nodes.get_mut(&id).ok_or(nfsstat3::NFS3ERR_STALE)?;
            apply(node, &setattr)?;
            Ok(node.attr)
        }

        async fn read(
            &self,
            id: fileid3,
            offset: u64,
            count: u32,
        ) -> Result<(Vec<u8>, bool), nfsstat3> {
            let g = self.inner.read().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let node = g.nodes.get(&id).ok_or(nfsstat3::NFS3ERR_STALE)?;
            let Content::File(data) = &node.content else {
                return Err(nfsstat3::NFS3ERR_ISDIR);
            };
            let start = usize::try_from(offset)
                .unwrap_or(usize::MAX)
                .min(data.len());
            let end = start.saturating_add(count as usize).min(data.len());
            Ok((data[start..end].to_vec(), end == data.len()))
        }

        async fn write(&self, id: fileid3, offset: u64, buf: &[u8]) -> Result<fattr3, nfsstat3> {
            let mut g = self.inner.write().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let node = g.nodes.get_mut(&id).ok_or(nfsstat3::NFS3ERR_STALE)?;
            let Content::File(data) = &mut node.content else {
                return Err(nfsstat3::NFS3ERR_ISDIR);
            };
            let start = usize::try_from(offset).map_err(|_| nfsstat3::NFS3ERR_FBIG)?;
            let end = start.checked_add(buf.len()).ok_or(nfsstat3::NFS3ERR_FBIG)?;
            if data.len() < end {
                data.resize(end, 0);
            }
            data[start..end].copy_from_slice(buf);
            let t = now();
            node.attr.size = data.len() as u64;
            node.attr.used = data.len() as u64;
            node.attr.mtime = t;
            node.attr.ctime = t;
            Ok(node.attr)
        }

        async fn create(
            &self,
            dirid: fileid3,
            filename: &filename3,
            attr: sattr3,
        ) -> Result<(fileid3, fattr3), nfsstat3> {
            let (id, _) = self.add(dirid, filename, ftype3::NF3REG, false)?;
            self.setattr(id, attr).await.map(|a| (id, a))
        }

        async fn create_exclusive(
            &self,
            dirid: fileid3,
            filename: &filename3,
        ) -> Result<fileid3, nfsstat3> {
            self.add(dirid, filename, ftype3::NF3REG, true)
                .map(|(id, _)| id)
        }

        async fn mkdir(
            &self,
            dirid: fileid3,
            dirname: &filename3,
        ) -> Result<(fileid3, fattr3), nfsstat3> {
            self.add(dirid, dirname, ftype3::NF3DIR, true)
        }

        async fn remove(&self, dirid: fileid3, filename: &filename3) -> Result<(), nfsstat3> {
            let mut g = self.inner.write().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let inner = &mut *g;
            let dir = inner.nodes.get(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
            let Content::Dir(entries) = &dir.content else {
                return Err(nfsstat3::NFS3ERR_NOTDIR);
            };
            let id = *entries.get(&filename.0).ok_or(nfsstat3::NFS3ERR_NOENT)?;
            if let Some(Node {
                content: Content::Dir(sub),
                ..
            }) = inner.nodes.get(&id)
            {
                if !sub.is_empty() {
                    return Err(nfsstat3::NFS3ERR_NOTEMPTY);
                }
            }
            inner.nodes.remove(&id);
            let dir = inner.nodes.get_mut(&dirid).ok_or(nfsstat3::NFS3ERR_IO)?;
            if let Content::Dir(entries) = &mut dir.content {
                entries.remove(&filename.0);
                dir.attr.size = entries.len() as u64;
            }
            let t = now();
            dir.attr.mtime = t;
            dir.attr.ctime = t;
            Ok(())
        }

        async fn rename(
            &self,
            _from_dirid: fileid3,
            _from_filename: &filename3,
            _to_dirid: fileid3,
            _to_filename: &filename3,
        ) -> Result<(), nfsstat3> {
            Err(nfsstat3::NFS3ERR_NOTSUPP)
        }

        async fn readdir(
            &self,
            dirid: fileid3,
            start_after: fileid3,
            max_entries: usize,
        ) -> Result<ReadDirResult, nfsstat3> {
            let g = self.inner.read().map_err(|_| nfsstat3::NFS3ERR_IO)?;
            let dir = g.nodes.get(&dirid).ok_or(nfsstat3::NFS3ERR_STALE)?;
            let Content::Dir(entries) = &dir.content else {
                return Err(nfsstat3::NFS3ERR_NOTDIR);
            };
            let mut it = entries.iter().peekable();
            if start_after != 0 {
                for (_, &id) in it.by_ref() {
                    if id == start_after {
                        break;
                    }
                }
            }
            let mut out = ReadDirResult {
                entries: Vec::new(),
                end: false,
            };
            while out.entries.len() < max_entries {
                let Some((name, &id)) = it.next() else { break };
                let attr = g.nodes.get(&id).map(|n| n.attr).unwrap_or_default();
                out.entries.push(DirEntry {
                    fileid: id,
                    name: name.clone().into(),
                    attr,
                });
            }
            out.end = it.peek().is_none();
            Ok(out)
        }

        async fn symlink(
            &self,
            _dirid: fileid3,
            _linkname: &filename3,
            _symlink: &nfspath3,
            _attr: &sattr3,
        ) -> Result<(fileid3, fattr3), nfsstat3> {
            Err(nfsstat3::NFS3ERR_NOTSUPP)
        }

        async fn readlink(&self, _id: fileid3) -> Result<nfspath3, nfsstat3> {
            Err(nfsstat3::NFS3ERR_NOTSUPP)
        }
    }
}
