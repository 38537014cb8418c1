//! nfsrdmad: serves in-memory exports over NFSv3 and MOUNT v3.

use anyhow::{bail, Context, Result};
use clap::Parser;
use nfsrdma_server::exports::{ExportOptions, Exports};
use nfsrdma_server::rdma::{RdmaConfig, RdmaDevice, RdmaListener};
use nfsrdma_server::rpcbind;
use nfsrdma_server::service::{Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_server::tcp::{TcpConfig, TcpServer};
use nfsrdma_xdr::{mount, nfs3};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// An in-memory NFSv3 server over TCP and RPC-over-RDMA.
#[derive(Parser, Debug)]
#[command(name = "nfsrdmad", version)]
struct Args {
    /// Export PATH to every client, read-write, no root squashing, any
    /// source port (a quick start; repeatable).
    #[arg(long = "export", value_name = "PATH")]
    export: Vec<String>,
    /// Make every --export a null export: READs are answered with zeros
    /// and WRITEs acknowledged without storing anything, so that what a
    /// call costs without the store shows (never put data there; cannot
    /// be combined with --state).
    #[arg(long)]
    null: bool,
    /// An exports file (/etc/exports syntax, see docs/operations.md).
    #[arg(long, value_name = "FILE")]
    exports: Option<PathBuf>,
    /// A TOML configuration file; command-line flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// TCP address for NFS, MOUNT and the NFSv3 lock manager (NLM, NSM;
    /// also over UDP on a port of their own) [default: 0.0.0.0:2049].
    #[arg(long, value_name = "ADDR")]
    tcp: Option<SocketAddr>,
    /// Do not register with the local rpcbind (NFSv3 clients then cannot
    /// find the lock manager: they mount with nolock).
    #[arg(long)]
    no_rpcbind: bool,
    /// RPC-over-RDMA address [default: 0.0.0.0:20049]. Given explicitly, a
    /// failure to listen is fatal; by default the daemon carries on over
    /// TCP when the machine has no RDMA device.
    #[arg(long, value_name = "ADDR")]
    rdma: Option<SocketAddr>,
    /// Do not listen for RPC-over-RDMA.
    #[arg(long, conflicts_with = "rdma")]
    no_rdma: bool,
    /// RDMA credits granted per connection [default: 128].
    #[arg(long, value_name = "N")]
    credits: Option<u32>,
    /// RDMA inline threshold, both directions (1K..256K) [default: 4K].
    #[arg(long, value_name = "SIZE")]
    inline: Option<String>,
    /// How RDMA pool threads wait for completions: busy, event,
    /// adaptive[:<microseconds>] (spin that long after the last
    /// completion, then sleep) or auto[:<microseconds>] (spin about as
    /// long as recent calls took to come, never longer than that ceiling,
    /// not at all when calls come further apart) [default: auto:1000].
    #[arg(long, value_name = "MODE")]
    poll: Option<String>,
    /// RDMA: ask for a completion on one reply Send in N (1..=64); the
    /// others are reaped with it, which spares a wake-up per reply
    /// [default: 1 with --poll adaptive or auto, whose spinning then
    /// counts from each reply's completion; 16 otherwise].
    #[arg(long, value_name = "N")]
    signal_every: Option<u32>,
    /// RDMA: threads serving the connections (1..=1024), each waiting for
    /// the completions of the connections placed on it (the one with the
    /// fewest connections takes the next) [default: one per core].
    #[arg(long, value_name = "N")]
    rdma_threads: Option<usize>,
    /// RDMA: receive buffers (of the inline size) per RDMA thread on a
    /// shared receive queue that all its connections receive from, in
    /// place of `--credits` buffers of each connection's own (0..=65536;
    /// 0: each connection its own). Credits are still granted per
    /// connection; a peer that sends beyond them can empty the queue for
    /// the others (see docs/operations.md). Replies to NFSv4.1 callbacks
    /// come in these buffers too [default: 0].
    #[arg(long, value_name = "N")]
    rdma_srq: Option<u32>,
    /// Bytes of file data each export may hold (K, M, G suffixes) [default: 4G].
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Files each export may hold [default: 1048576].
    #[arg(long, value_name = "N")]
    max_inodes: Option<u64>,
    /// Save the stores to FILE on SIGTERM/SIGINT and load them from it at
    /// start, so that a planned restart loses nothing.
    #[arg(long, value_name = "FILE")]
    state: Option<PathBuf>,
    /// Calls executing at once [default: 64].
    #[arg(long, value_name = "N")]
    workers: Option<usize>,
    /// Largest RPC record accepted on TCP (K, M suffixes) [default: 1088K].
    #[arg(long, value_name = "SIZE")]
    max_record: Option<String>,
    /// Connections served at once, over TCP and over RDMA each: further TCP
    /// connections are accepted and closed at once, further RDMA connect
    /// requests rejected, counted and logged [default: over TCP the
    /// open-file limit (soft RLIMIT_NOFILE) less 64; over RDMA as many as
    /// half the machine's memory can register, at the memory per
    /// connection logged at start].
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Close a TCP connection on which no record completes for SECS while
    /// it has no call in flight (silent, or dribbling a record), or whose
    /// client takes none of its replies for SECS; 0: never [default: 360].
    #[arg(long, value_name = "SECS")]
    tcp_idle_timeout: Option<u64>,
    /// Largest READ and WRITE, offered to clients in FSINFO (their rsize
    /// and wsize at most): a multiple of 4K up to 1M (K, M suffixes)
    /// [default: 1M].
    #[arg(long, value_name = "SIZE")]
    max_io: Option<String>,
    /// Serve the daemon's counters (per-procedure calls, errors and
    /// service-time histograms, TCP and RDMA counters, store usage) in the
    /// Prometheus text format at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// NFS versions served, comma-separated, from 3, 4.1 and 4.2
    /// [default: 3,4.1,4.2]. NFSv4.0 is never served: its COMPOUNDs are
    /// answered NFS4ERR_MINOR_VERS_MISMATCH, so a client moves on.
    #[arg(long, value_name = "LIST")]
    versions: Option<String>,
    /// Seconds of an NFSv4 client's lease: state of a client silent for
    /// longer is dropped (10..=3600) [default: 90].
    #[arg(long, value_name = "SECS")]
    lease: Option<u64>,
    /// Seconds of the grace period after a restart with --state: the NFSv4
    /// and NFSv3 (NLM) clients of the previous instance reclaim their opens
    /// and locks, new opens and locks wait (0..=3600; 0: none, reclaims
    /// are refused)
    /// [default: the lease].
    #[arg(long, value_name = "SECS")]
    grace: Option<u64>,
    /// NFSv4.1 delegations, on or off [default: on]: a client whose
    /// session has a working backchannel (over TCP) may get a read or a
    /// write delegation at OPEN, recalled when another client (or an
    /// NFSv3 call) needs the file.
    #[arg(long, value_name = "on|off")]
    delegations: Option<String>,
}

/// The TOML configuration: the same settings as the flags.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    export: Vec<String>,
    null: Option<bool>,
    exports: Option<PathBuf>,
    tcp: Option<SocketAddr>,
    rpcbind: Option<bool>,
    rdma: Option<SocketAddr>,
    credits: Option<u32>,
    inline: Option<String>,
    poll: Option<String>,
    signal_every: Option<u32>,
    rdma_threads: Option<usize>,
    rdma_srq: Option<u32>,
    capacity: Option<String>,
    max_inodes: Option<u64>,
    workers: Option<usize>,
    max_record: Option<String>,
    max_connections: Option<usize>,
    tcp_idle_timeout: Option<u64>,
    max_io: Option<String>,
    metrics: Option<SocketAddr>,
    state: Option<PathBuf>,
    versions: Option<String>,
    lease: Option<u64>,
    grace: Option<u64>,
    delegations: Option<String>,
}

fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => bail!("size {s:?}: unknown suffix {c:?} (use K, M, G or T)"),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .with_context(|| format!("size {s:?} is not a number"))?;
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} is too large"))
}

/// The NFS versions served, as `--versions` spells them.
fn version_list(s: &Service) -> String {
    let c = s.config();
    let mut v = Vec::new();
    if c.v3 {
        v.push("3");
    }
    if c.nfs4.v41 {
        v.push("4.1");
    }
    if c.nfs4.v42 {
        v.push("4.2");
    }
    v.join(",")
}

/// The (program, version) pairs registered with rpcbind.
fn registrations(v3: bool, v4: bool) -> Vec<(u32, u32)> {
    let mut r = Vec::new();
    if v3 {
        r.push((nfs3::PROGRAM, nfs3::VERSION));
    }
    if v4 {
        r.push((nfs3::PROGRAM, nfsrdma_xdr::nfs4::VERSION));
    }
    r.push((mount::PROGRAM, mount::VERSION));
    r
}

/// The lock manager and the status monitor: (program, version).
const LOCK_SERVICES: [(u32, u32); 2] = [
    (nfsrdma_xdr::nlm::PROGRAM, nfsrdma_xdr::nlm::VERSION),
    (nfsrdma_xdr::nsm::PROGRAM, nfsrdma_xdr::nsm::VERSION),
];

/// Registers NLM and NSM over TCP on the NFS port and over UDP on
/// `udp_port`, first removing what is there where rpcbind allows it (an
/// earlier nfsrdmad's; not another owner's, such as the kernel lockd's).
fn register_lock_services(
    rpcbind_addr: SocketAddr,
    tcp_port: u16,
    udp_port: Option<u16>,
) -> Result<(), rpcbind::RpcbindError> {
    use nfsrdma_xdr::portmap::{IPPROTO_TCP, IPPROTO_UDP};
    for (p, v) in LOCK_SERVICES {
        let _ = rpcbind::unset(rpcbind_addr, p, v);
        let mut regs = vec![(IPPROTO_TCP, tcp_port)];
        regs.extend(udp_port.map(|u| (IPPROTO_UDP, u)));
        for (prot, port) in regs {
            if !rpcbind::set_prot(rpcbind_addr, p, v, prot, port)? {
                return Err(rpcbind::RpcbindError::BadReply {
                    addr: rpcbind_addr,
                    why: format!("rpcbind refused program {p} version {v} (protocol {prot})"),
                });
            }
        }
    }
    Ok(())
}

fn main() -> std::process::ExitCode {
    match start() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The message and its causes on one line; a backtrace (which
            // anyhow adds when RUST_BACKTRACE is set) says nothing to a user.
            eprintln!("nfsrdmad: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn start() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours for a terminal only, not for a log file or the journal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let cfg: Config = match &args.config {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("reading config {}", p.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing config {}", p.display()))?
        }
        None => Config::default(),
    };

    let mut rules = Exports::default();
    if let Some(file) = args.exports.as_ref().or(cfg.exports.as_ref()) {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("reading exports file {}", file.display()))?;
        rules = Exports::parse(&text).with_context(|| format!("in {}", file.display()))?;
    }
    let null = args.null || cfg.null.unwrap_or(false);
    if null && cfg.export.is_empty() && args.export.is_empty() {
        bail!("--null applies to --export PATH, and none is given (an exports file says `null` per export)");
    }
    for p in cfg.export.iter().chain(&args.export) {
        let options = ExportOptions {
            null,
            ..ExportOptions::permissive()
        };
        let one = Exports::single(p, options).with_context(|| format!("--export {p}"))?;
        for e in one.entries {
            if rules.find(&e.path).is_some() {
                bail!("export {} is given twice", e.path);
            }
            rules.entries.push(e);
        }
    }
    if rules.entries.is_empty() {
        bail!("nothing to export: give --export PATH or --exports FILE");
    }

    let mut store = StoreConfig::default();
    if let Some(c) = args.capacity.as_ref().or(cfg.capacity.as_ref()) {
        store.capacity_bytes = parse_size(c).context("--capacity")?;
    }
    if let Some(n) = args.max_inodes.or(cfg.max_inodes) {
        store.max_inodes = n;
    }
    let mut tcp = TcpConfig::default();
    if let Some(n) = args.workers.or(cfg.workers) {
        if n == 0 {
            bail!("--workers must be at least 1");
        }
        tcp.workers = n;
    }
    if let Some(s) = args.max_record.as_ref().or(cfg.max_record.as_ref()) {
        tcp.max_record = usize::try_from(parse_size(s).context("--max-record")?)?;
        if tcp.max_record < 4096 {
            bail!("--max-record must be at least 4K");
        }
    }
    if let Some(n) = args.max_connections.or(cfg.max_connections) {
        if n == 0 {
            bail!("--max-connections must be at least 1");
        }
        tcp.max_connections = n;
    }
    if let Some(t) = args.tcp_idle_timeout.or(cfg.tcp_idle_timeout) {
        if t > 86_400 {
            bail!("--tcp-idle-timeout must be between 0 and 86400 seconds (got {t})");
        }
        tcp.idle_timeout = (t > 0).then(|| std::time::Duration::from_secs(t));
    }
    let mut service_config = ServiceConfig::default();
    if let Some(s) = args.max_io.as_ref().or(cfg.max_io.as_ref()) {
        let n = parse_size(s).context("--max-io")?;
        if !(4096..=1 << 20).contains(&n) || n % 4096 != 0 {
            bail!("--max-io must be a multiple of 4K between 4K and 1M (got {s})");
        }
        service_config.max_io = n as u32;
    }
    // The largest reply: a READ of max_io, or an NFSv4 COMPOUND within its
    // session's limit (max_io and 16K).
    tcp.max_reply = service_config.max_io as usize + 16 * 1024;
    if let Some(v) = args.versions.as_ref().or(cfg.versions.as_ref()) {
        let (mut v3, mut v41, mut v42) = (false, false, false);
        for part in v.split(',').map(str::trim) {
            match part {
                "3" => v3 = true,
                "4.1" => v41 = true,
                "4.2" => v42 = true,
                "4" | "4.0" => bail!("--versions: NFSv4.0 is not served (4.1 and 4.2 are)"),
                other => bail!("--versions: unknown NFS version {other:?} (use 3, 4.1, 4.2)"),
            }
        }
        if !(v3 || v41 || v42) {
            bail!("--versions names no version");
        }
        service_config.v3 = v3;
        service_config.nfs4.v41 = v41;
        service_config.nfs4.v42 = v42;
    }
    if let Some(l) = args.lease.or(cfg.lease) {
        if !(10..=3600).contains(&l) {
            bail!("--lease must be between 10 and 3600 seconds (got {l})");
        }
        service_config.nfs4.lease = std::time::Duration::from_secs(l);
    }
    if let Some(d) = args.delegations.as_ref().or(cfg.delegations.as_ref()) {
        service_config.nfs4.delegations = match d.as_str() {
            "on" => true,
            "off" => false,
            other => bail!("--delegations must be on or off (got {other:?})"),
        };
    }
    if let Some(g) = args.grace.or(cfg.grace) {
        if g > 3600 {
            bail!("--grace must be between 0 and 3600 seconds (got {g})");
        }
        service_config.nfs4.grace = Some(std::time::Duration::from_secs(g));
    }
    let addr = args
        .tcp
        .or(cfg.tcp)
        .unwrap_or_else(|| "0.0.0.0:2049".parse().expect("valid address"));
    // The server owner names the address (and, for a port the system
    // picks, the process): two daemons on one host are two servers to a
    // client, and a restart on the same address is the same server.
    service_config.nfs4.instance = if addr.port() == 0 {
        format!("{addr}#{}", std::process::id())
    } else {
        addr.to_string()
    };
    let use_rpcbind = !args.no_rpcbind && cfg.rpcbind.unwrap_or(true);

    let mut rdma = RdmaConfig {
        max_io: service_config.max_io,
        ..RdmaConfig::default()
    };
    if !service_config.nfs4.enabled() {
        // No NFSv4: nothing calls the client back.
        rdma.backward_calls = 0;
    }
    if let Some(n) = args.max_connections.or(cfg.max_connections) {
        rdma.max_connections = n;
    }
    let rdma_explicit = args.rdma.or(cfg.rdma);
    if let Some(a) = rdma_explicit {
        rdma.addr = a;
    }
    if let Some(c) = args.credits.or(cfg.credits) {
        if c == 0 {
            bail!("--credits must be at least 1");
        }
        rdma.credits = c;
    }
    if let Some(s) = args.inline.as_ref().or(cfg.inline.as_ref()) {
        let n = parse_size(s).context("--inline")?;
        if !(1024..=256 * 1024).contains(&n) || n % 1024 != 0 {
            bail!("--inline must be a multiple of 1K between 1K and 256K");
        }
        rdma.inline_size = n as u32;
    }
    if let Some(p) = args.poll.as_ref().or(cfg.poll.as_ref()) {
        rdma.poll = p.parse().context("--poll")?;
    }
    if let Some(n) = args.signal_every.or(cfg.signal_every) {
        if !(1..=64).contains(&n) {
            bail!("--signal-every must be between 1 and 64 (got {n})");
        }
        rdma.signal_every = n;
    } else {
        rdma.signal_every = RdmaConfig::default_signal_every(rdma.poll);
    }
    if let Some(n) = args.rdma_threads.or(cfg.rdma_threads) {
        if !(1..=1024).contains(&n) {
            bail!("--rdma-threads must be between 1 and 1024 (got {n})");
        }
        rdma.threads = n;
    }
    if let Some(n) = args.rdma_srq.or(cfg.rdma_srq) {
        if n > 65_536 {
            bail!("--rdma-srq must be between 0 and 65536 (got {n})");
        }
        rdma.srq_buffers = n;
    }
    if args.max_connections.or(cfg.max_connections).is_none() {
        // As many connections as half the machine's memory can register
        // (the settings above decide how much each takes).
        if let Some(total) = memory_total() {
            rdma.max_connections = rdma.default_max_connections(total);
        }
    }
    // The RDMA device comes first: the stores take their blocks from its
    // registered arena.
    let mut device = None;
    if !args.no_rdma {
        // Every export's capacity, plus room for the arena's first region of
        // each block size and for calls' landing and staging blocks in
        // flight (shared by every connection: a call whose Read chunks find
        // none left waits for some, up to `rdma::conn::ARENA_WAIT`, and is
        // then answered ERR_CHUNK and counted).
        let limit = (store.capacity_bytes as usize)
            .saturating_mul(rules.entries.len().max(1))
            .saturating_add(6 * (64 << 20));
        match RdmaDevice::open(rdma.addr, limit) {
            Ok(d) => device = Some(d),
            Err(e) if rdma_explicit.is_none() => {
                tracing::warn!(error = %e, "RPC-over-RDMA not available; serving TCP only")
            }
            Err(e) => return Err(e).with_context(|| format!("RDMA device for {}", rdma.addr)),
        }
    }
    let mut exports = match &device {
        Some(d) => Service::exports_from_rules_with(&rules, &store, &|| d.block_source()),
        None => Service::exports_from_rules(&rules, &store),
    };
    let state = args.state.clone().or(cfg.state.clone());
    if let (Some(path), Some(e)) = (
        &state,
        exports.iter().find(|e| e.store.read().config().null),
    ) {
        bail!(
            "--state {} keeps data across a restart, and export {} is a null export, which keeps none",
            path.display(),
            e.path
        );
    }
    let mut reclaimers = Vec::new();
    let mut nsm_saved = None;
    if let Some(path) = &state {
        let source =
            |d: &Option<Arc<RdmaDevice>>| -> Box<dyn nfsrdma_server::store::blocks::BlockSource> {
                match d {
                    Some(d) => d.block_source(),
                    None => Box::new(nfsrdma_server::store::blocks::HeapSource),
                }
            };
        let l = nfsrdma_server::state::load(path, &mut exports, &|| source(&device))?;
        for p in &l.exports {
            tracing::info!(path = %p, state = %path.display(), "export loaded from the state file");
        }
        for p in &l.dropped {
            tracing::warn!(path = %p, "the state file has an export that is no longer configured; it is dropped");
        }
        reclaimers = l.nfs4_clients;
        nsm_saved = l.nsm;
    }
    let rdma = device.map(|d| (rdma, d));
    for e in &exports {
        tracing::info!(path = %e.path, fsid = e.store.fsid(), "export");
        if e.store.read().config().null {
            tracing::warn!(path = %e.path, "null export: READs return zeros, WRITEs are discarded");
        }
    }
    let service = Arc::new(Service::new(exports, service_config));
    if service.config().nfs4.enabled() && !reclaimers.is_empty() {
        let grace = service.config().nfs4.grace();
        tracing::info!(
            seconds = grace.as_secs(),
            clients = reclaimers.len(),
            "NFSv4 grace period: the clients of the previous instance reclaim their opens and locks"
        );
        service
            .nfs4()
            .state
            .start_grace(reclaimers, grace, std::time::Instant::now());
    }

    // The status monitor: a state number one step past the previous
    // instance's; its NFSv3 lock clients are told and get a grace period
    // to reclaim.
    if state.is_some() {
        let prev = nsm_saved.as_ref().map_or(0, |n| n.state);
        service
            .nsm()
            .set_state(nfsrdma_server::service::nsm::Nsm::next_state(prev));
    }
    if let Some(saved) = nsm_saved.filter(|n| !n.watchers.is_empty() && service.config().v3) {
        let grace = service.config().nfs4.grace();
        let now = std::time::Instant::now();
        tracing::info!(
            seconds = grace.as_secs(),
            clients = saved.watchers.len(),
            nsm_state = service.nsm().state(),
            "NLM grace period: the NFSv3 lock clients of the previous instance reclaim their locks"
        );
        service.nfs4().state.start_nlm_grace(now + grace);
        nfsrdma_server::service::nsm::notify_restart(
            saved.watchers,
            service.nsm().state(),
            service.config().client_rpcbind_port,
            std::time::Duration::from_secs(2),
            now + grace,
        );
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("nfsrdmad")
        .build()?;
    let metrics = args.metrics.or(cfg.metrics);
    rt.block_on(run(service.clone(), addr, tcp, use_rpcbind, rdma, metrics))?;
    if let Some(path) = &state {
        let reclaimers = if service.config().nfs4.enabled() {
            service.nfs4().state.reclaimers(std::time::Instant::now())
        } else {
            Vec::new()
        };
        let nsm = nfsrdma_server::state::NsmSaved {
            state: service.nsm().state(),
            watchers: service.nsm_watchers(),
        };
        nfsrdma_server::state::save(path, service.exports(), &reclaimers, &nsm)
            .with_context(|| format!("saving the state to {}", path.display()))?;
        tracing::info!(state = %path.display(), "stores saved");
    }
    Ok(())
}

/// The NFS listener, with room for 4096 connections waiting to be accepted
/// (the kernel caps it at net.core.somaxconn): a crowd of clients
/// connecting at once is not turned away as with the default of 128.
fn listen_tcp(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    sock.bind(addr)?;
    sock.listen(4096)
}

async fn run(
    service: Arc<Service>,
    addr: SocketAddr,
    tcp: TcpConfig,
    use_rpcbind: bool,
    rdma: Option<(RdmaConfig, Arc<RdmaDevice>)>,
    metrics: Option<SocketAddr>,
) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    // Handlers first: whoever reads the "listening" lines below may signal
    // at once, and the default action of SIGUSR1 and SIGTERM would end the
    // process without a report or a saved state.
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut usr1 = signal(SignalKind::user_defined1())?;
    let listener = listen_tcp(addr).with_context(|| format!("binding TCP {addr}"))?;
    let local = listener.local_addr()?;
    tracing::info!(addr = %local, versions = %version_list(&service), "serving NFS, MOUNT v3, NLM 4 and NSM 1 over TCP");
    tracing::info!(
        max_connections = tcp.max_connections,
        idle_timeout_secs = tcp.idle_timeout.map_or(0, |t| t.as_secs()),
        call_budget = tcp.call_budget,
        memory_per_connection = tcp.memory_per_connection(),
        memory_total = tcp.memory_total(),
        "TCP limits (bytes): per connection its receive buffer, calls in flight and state; in all, every connection and the calls executing"
    );
    // Tests and scripts read this line to learn the port.
    announce(&format!("listening on tcp {local}"));

    let mut rdma_listener = None;
    if let Some((cfg, device)) = rdma {
        let addr = cfg.addr;
        let per_conn_shared = cfg.memory_per_connection();
        let shared_memory = cfg.shared_receive_memory();
        let per_conn_own = RdmaConfig {
            srq_buffers: 0,
            ..cfg.clone()
        }
        .memory_per_connection();
        let chunk_per_conn = cfg.chunk_memory_per_connection();
        let arena_limit = device.arena_limit();
        let (poll, signal_every, max_connections, threads) =
            (cfg.poll, cfg.signal_every, cfg.max_connections, cfg.threads);
        let l = RdmaListener::start(service.clone(), cfg, device)
            .with_context(|| format!("RDMA listener on {addr}"))?;
        let (per_conn, shared_receive_memory) = if l.shared_receives() {
            (per_conn_shared, shared_memory)
        } else {
            (per_conn_own, 0)
        };
        tracing::info!(
            addr = %addr,
            memory_per_connection = per_conn,
            shared_receive_memory,
            chunk_memory_per_connection = chunk_per_conn,
            arena_limit,
            max_connections,
            poll = %poll,
            signal_every,
            threads,
            "serving NFS over RPC-over-RDMA"
        );
        announce(&format!("listening on rdma {}:{}", addr.ip(), l.port()));
        rdma_listener = Some(l);
    }
    let rdma_stats = rdma_listener.as_ref().map(|l| l.stats());

    let (tx, rx) = tokio::sync::watch::channel(false);
    // NLM and NSM over UDP (a client's status monitor notifies over UDP).
    let udp = if service.config().v3 {
        match tokio::net::UdpSocket::bind(SocketAddr::new(addr.ip(), 0)).await {
            Ok(sock) => {
                let port = sock.local_addr()?.port();
                tracing::info!(port, "serving NLM and NSM over UDP");
                let task = tokio::spawn(nfsrdma_server::udp::serve(
                    service.clone(),
                    sock,
                    rx.clone(),
                ));
                Some((port, task))
            }
            Err(e) => {
                tracing::warn!(error = %e, "no UDP socket for NLM and NSM");
                None
            }
        }
    } else {
        None
    };
    let udp_port = udp.as_ref().map(|(p, _)| *p);

    let rpcbind_addr: SocketAddr = ([127, 0, 0, 1], nfsrdma_xdr::portmap::PORT).into();
    let mut registered = false;
    let mut lock_registered = false;
    let (v3_on, v4_on) = (service.config().v3, service.config().nfs4.enabled());
    if use_rpcbind {
        let port = local.port();
        let reg = tokio::task::spawn_blocking(move || -> Result<(), rpcbind::RpcbindError> {
            for (p, v) in registrations(v3_on, v4_on) {
                let _ = rpcbind::unset(rpcbind_addr, p, v);
                if !rpcbind::set(rpcbind_addr, p, v, port)? {
                    return Err(rpcbind::RpcbindError::BadReply {
                        addr: rpcbind_addr,
                        why: format!(
                            "rpcbind refused to register program {p} version {v} (another server holds it?)"
                        ),
                    });
                }
            }
            Ok(())
        })
        .await?;
        match reg {
            Ok(()) => {
                registered = true;
                tracing::info!("registered NFS and MOUNT with rpcbind");
            }
            // No rpcbind: nothing to register with (clients give ports).
            Err(e @ rpcbind::RpcbindError::Unreachable { .. }) => {
                tracing::info!(error = %e, "not registered with rpcbind")
            }
            // One that refuses (another server's registrations, which only
            // their owner may remove): say so.
            Err(e) => tracing::warn!(
                error = %e,
                "not registered with rpcbind: clients that ask it find another server, and NFSv3 clients cannot lock here"
            ),
        }
    }
    if use_rpcbind && registered && v3_on {
        let port = local.port();
        let reg = tokio::task::spawn_blocking(move || {
            register_lock_services(rpcbind_addr, port, udp_port)
        })
        .await?;
        match reg {
            Ok(()) => {
                lock_registered = true;
                tracing::info!("registered NLM 4 and NSM 1 with rpcbind: NFSv3 clients can lock");
            }
            Err(e) => tracing::warn!(
                error = %e,
                "NLM and NSM not registered with rpcbind: NFSv3 mounts without `nolock` cannot lock"
            ),
        }
    }
    if registered {
        // After every registration: a script that finds the services
        // through rpcbind waits for this line, not for the listening ones.
        let mut names = vec!["NFS", "MOUNT"];
        if lock_registered {
            names.extend(["NLM", "NSM"]);
        }
        announce(&format!("registered with rpcbind: {}", names.join(" ")));
    }

    let server = TcpServer::new(service.clone(), tcp);
    let tcp_stats = server.stats();
    let mut exporting = None;
    if let Some(addr) = metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding the metrics endpoint --metrics {addr}"))?;
        let local = listener.local_addr()?;
        let sources = nfsrdma_server::exporter::Sources {
            service: service.clone(),
            tcp: Some(server.stats()),
            rdma: rdma_stats.clone(),
        };
        tracing::info!(addr = %local, "serving metrics over HTTP at /metrics");
        announce(&format!("metrics on http {local}"));
        let rx = rx.clone();
        exporting = Some(tokio::spawn(nfsrdma_server::exporter::http::serve(
            listener, sources, rx,
        )));
    }
    let serving = tokio::spawn(async move { server.serve(listener, rx).await });

    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = usr1.recv() => {
                eprint!("{}", service.report());
                eprint!("{}", tcp_stats.report());
                if let Some(s) = &rdma_stats {
                    eprint!("{}", s.report());
                }
            }
        }
    }
    tracing::info!("shutting down: finishing calls in flight");
    let _ = tx.send(true);
    let _ = serving.await;
    if let Some(e) = exporting {
        let _ = e.await;
    }
    if let Some(mut l) = rdma_listener {
        tokio::task::spawn_blocking(move || l.stop()).await?;
    }
    if let Some((_, task)) = udp {
        let _ = task.await;
    }
    if registered {
        let _ = tokio::task::spawn_blocking(move || {
            let mut all = registrations(v3_on, v4_on);
            if lock_registered {
                all.extend(LOCK_SERVICES);
            }
            for (p, v) in all {
                let _ = rpcbind::unset(rpcbind_addr, p, v);
            }
        })
        .await;
    }
    eprint!("{}", service.report());
    eprint!("{}", tcp_stats.report());
    if let Some(s) = &rdma_stats {
        eprint!("{}", s.report());
    }
    Ok(())
}

/// A line on stdout for scripts to wait for. Whoever started the daemon
/// may have stopped reading (closed the pipe): the daemon goes on.
fn announce(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "nfsrdmad: {what}");
}

/// The machine's memory in bytes (`MemTotal` of `/proc/meminfo`).
fn memory_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}
