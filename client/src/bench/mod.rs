//! `nfsrdma bench`: the latency lab.
//!
//! Two modes, each run for one or more *variants* of the connection
//! options (every combination of the values given as comma lists to
//! `--transport`, `--remote-inv`, `--reg`, `--poll` and `--inline`):
//!
//! - **latency** (default): one call in flight (QD1), no client cache; for
//!   each record size, the phases write, rewrite, read and reread cover
//!   the whole file record by record, and every call's time goes into an
//!   HDR histogram per (variant, record size, phase).
//! - **throughput**: `--jobs` connections per variant, `--iodepth` calls in
//!   flight on each, random reads and/or writes of `--bs` bytes for
//!   `--runtime` (or `--bytes`); IOPS, MB/s, latency and the CPU the
//!   client used.
//!
//! The variants take turns: each phase is cut into `--rounds` slices and
//! the variants run slice by slice (A B A B ...), so that drift on a noisy
//! machine hits them alike. Every byte written is a function of its file
//! offset and of the pass ([`pattern`]); every read is checked, and a
//! difference ends the run with [`BenchError::Mismatch`], which names the
//! offset.
//!
//! [`main`] is the command; [`Plan::from_args`], [`run`] and
//! [`run_with_hooks`] are the library form; [`report`] renders the text
//! tables, JSON, CSV and SVG.

mod latency;
pub mod pattern;
pub mod report;
pub mod server_metrics;
mod stats;
mod throughput;

pub use stats::Summary;

use crate::cli::{ConnArgs, ConnChoice, RemotePath, TransportArg};
use crate::error::ClientError;
use crate::transport::TransportStats;
use crate::xdr::nfs3::{CreateHow3, Ftype3, NfsFh3, Sattr3};
use crate::{Client, ConnectOptions};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::future::Future;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The largest record size (and `--bs`).
pub const MAX_RECORD: u64 = 1 << 20;

/// Record sizes of a latency run when `--record-sizes` is not given.
pub const DEFAULT_RECORD_SIZES: &str = "1k,2k,4k,8k,16k,32k,64k";

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// QD1 latency per record size: write, rewrite, read, reread.
    Latency,
    /// Jobs × iodepth calls in flight: IOPS, MB/s, latency, CPU.
    Throughput,
}

impl Mode {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Latency => "latency",
            Mode::Throughput => "throughput",
        }
    }
}

/// `--rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RwMode {
    /// Random reads.
    Randread,
    /// Random writes.
    Randwrite,
    /// Random reads and writes, `--mix` percent reads.
    Randrw,
}

impl RwMode {
    /// The flag's spelling.
    pub fn name(self) -> &'static str {
        match self {
            RwMode::Randread => "randread",
            RwMode::Randwrite => "randwrite",
            RwMode::Randrw => "randrw",
        }
    }
}

/// A comma list of sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeList(pub Vec<u64>);

/// Parses a size: bytes, or a number with `k`, `m`, `g` or `t` (powers of
/// 1024; `kb`, `kib`, ... accepted, any case): `4k`, `1m`, `1.5m`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || format!("{s:?} is not a size (bytes, or a number with k, m or g: 4k, 1m, 128m)");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult: u64 = match unit.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(bad()),
    };
    if num.is_empty() {
        return Err(bad());
    }
    let v: f64 = num.parse().map_err(|_| bad())?;
    let bytes = v * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > (1u64 << 50) as f64 || bytes.fract() != 0.0 {
        return Err(bad());
    }
    Ok(bytes as u64)
}

fn parse_list(s: &str, one: fn(&str) -> Result<u64, String>) -> Result<SizeList, String> {
    if s.trim().is_empty() {
        return Err("empty list: give one or more sizes separated by commas (4k,64k)".into());
    }
    let mut out = Vec::new();
    for item in s.split(',') {
        if item.trim().is_empty() {
            return Err(format!("{s:?} has an empty item"));
        }
        out.push(one(item)?);
    }
    Ok(SizeList(out))
}

/// `--server-pid`: a comma list of PIDs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PidList(pub Vec<u32>);

fn parse_pids(s: &str) -> Result<PidList, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        let pid: u32 = item
            .trim()
            .parse()
            .ok()
            .filter(|&p| p > 0)
            .ok_or_else(|| format!("{item:?} is not a process ID"))?;
        out.push(pid);
    }
    Ok(PidList(out))
}

/// A record size: 1 byte to 1 MiB.
pub fn parse_record_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v == 0 {
        return Err(format!("{s:?}: a record size must be at least 1 byte"));
    }
    if v > MAX_RECORD {
        return Err(format!(
            "{s:?}: record size {} is above the largest, 1 MiB",
            report::fmt_size(v)
        ));
    }
    Ok(v)
}

/// `--record-sizes`: a comma list of record sizes.
pub fn parse_record_sizes(s: &str) -> Result<SizeList, String> {
    parse_list(s, parse_record_size)
}

fn parse_inline(s: &str) -> Result<SizeList, String> {
    parse_list(s, |x| {
        let v = parse_size(x)?;
        if !(1024..=MAX_RECORD).contains(&v) {
            return Err(format!("{x:?}: an inline threshold is 1k to 1m"));
        }
        Ok(v)
    })
}

/// `-s/--file-size`: 4 KiB to 1 TiB.
pub fn parse_file_size(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if !(4096..=1 << 40).contains(&v) {
        return Err(format!("{s:?}: the file size must be 4k to 1t"));
    }
    Ok(v)
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let v = parse_size(s)?;
    if v == 0 {
        return Err(format!("{s:?}: --bytes must be above 0"));
    }
    Ok(v)
}

/// `--mix`: a percentage of reads, 0 to 100.
pub fn parse_mix(s: &str) -> Result<u8, String> {
    match s.trim().parse::<u32>() {
        Ok(v) if v <= 100 => Ok(v as u8),
        _ => Err(format!(
            "{s:?}: --mix is the percentage of reads, a whole number from 0 to 100"
        )),
    }
}

/// A duration: seconds, or a number with `ms`, `s`, `m` or `h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim().to_ascii_lowercase();
    let bad = || format!("{s:?} is not a duration (10s, 500ms, 2m)");
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let secs: f64 = match unit {
        "" | "s" => 1.0,
        "ms" => 0.001,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => return Err(bad()),
    };
    let v: f64 = num.parse().map_err(|_| bad())?;
    let d = v * secs;
    if !d.is_finite() || d <= 0.0 || d > 86_400.0 * 7.0 {
        return Err(format!(
            "{s:?}: the duration must be above 0 and at most a week"
        ));
    }
    Ok(Duration::from_secs_f64(d))
}

/// The options of `nfsrdma bench` besides the connection options (which
/// are the [`ConnArgs`] every subcommand takes).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// SERVER:/export[/DIR]: the directory the bench files go in.
    pub target: RemotePath,
    /// latency (QD1 per record size) or throughput.
    #[arg(long, value_enum, default_value_t = Mode::Latency)]
    pub mode: Mode,
    /// Size of each variant's file (4k to 1t): 4m, 128m, 1g.
    #[arg(short = 's', long, default_value = "128m", value_parser = parse_file_size)]
    pub file_size: u64,
    /// Latency: record sizes, a comma list, each at most 1m.
    #[arg(short = 'r', long, default_value = DEFAULT_RECORD_SIZES, value_parser = parse_record_sizes)]
    pub record_sizes: SizeList,
    /// Slices per phase (throughput: per run); the variants take turns slice
    /// by slice.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub rounds: u32,
    /// RDMA inline threshold (our receive buffer size, advertised to the
    /// server), a comma list of 1k to 1m [default: 4k].
    #[arg(long, value_parser = parse_inline)]
    pub inline: Option<SizeList>,
    /// Throughput: connections per variant.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: u32,
    /// Throughput: calls in flight per connection.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub iodepth: u32,
    /// Throughput: the workload.
    #[arg(long, value_enum, default_value_t = RwMode::Randread)]
    pub rw: RwMode,
    /// Throughput, randrw: percentage of reads (0 to 100).
    #[arg(long, default_value_t = 50, value_parser = parse_mix)]
    pub mix: u8,
    /// Throughput: block size (at most 1m).
    #[arg(long, default_value = "4k", value_parser = parse_record_size)]
    pub bs: u64,
    /// Throughput: run time per variant (10s, 500ms, 2m).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub runtime: Duration,
    /// Throughput: stop after this many bytes per variant instead of after
    /// --runtime.
    #[arg(long, value_parser = parse_bytes)]
    pub bytes: Option<u64>,
    /// Throughput: processes whose CPU time counts as the server's, a
    /// comma list of PIDs on this machine (nfsrdmad's; or the kernel's
    /// `nfsd` threads: `$(pgrep -d, -x nfsd)`); the report then gives
    /// server cores. Without it, server CPU is n/a.
    #[arg(long, value_name = "PID,...", value_parser = parse_pids)]
    pub server_pid: Option<PidList>,
    /// Throughput: the server's Prometheus endpoint (nfsrdmad --metrics),
    /// e.g. http://10.0.0.1:9420/metrics, read before and after each slice:
    /// the report then gives the server's mean turnaround of the run's
    /// READs and WRITEs (arrival to reply posted) beside the client's mean
    /// latency, and the JSON every server counter's change.
    #[arg(long, value_name = "URL", value_parser = server_metrics::parse_url)]
    pub server_metrics: Option<server_metrics::MetricsUrl>,
    /// Write every summary and the whole configuration as JSON
    /// (docs/bench.schema.json).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write every summary and the configuration as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write an SVG chart, one line per variant (latency mode: median latency
    /// against record size; throughput mode: latency by percentile).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Name of the bench files in the directory (variant N uses NAME.N)
    /// [default: nfsrdma-bench.PID].
    #[arg(long, value_name = "NAME")]
    pub file: Option<String>,
    /// Keep the bench files at the end.
    #[arg(long)]
    pub keep: bool,
    /// Do not check what reads return (for a server that does not keep
    /// data, such as an nfsrdmad null export; reads are checked otherwise).
    #[arg(long)]
    pub no_verify: bool,
    /// No progress bar (there is none anyway when stderr is not a
    /// terminal).
    #[arg(long)]
    pub no_progress: bool,
}

/// One variant: a combination of the list-valued options.
#[derive(Debug, Clone)]
pub struct VariantSpec {
    /// Short name: A, B, C, ...
    pub label: String,
    /// The connection options chosen.
    pub choice: ConnChoice,
    /// `--inline` value, if given.
    pub inline: Option<u64>,
    /// The client options.
    pub options: ConnectOptions,
}

impl VariantSpec {
    /// `transport=tcp remote-inv=on reg=mw poll=adaptive [inline=4k]`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "transport={} remote-inv={} reg={} poll={}",
            self.choice.transport.name(),
            self.choice.remote_inv.name(),
            self.choice.reg.name(),
            self.choice.poll.name()
        );
        if let Some(i) = self.inline {
            s.push_str(&format!(" inline={}", report::fmt_size_short(i)));
        }
        s
    }
}

/// Throughput settings.
#[derive(Debug, Clone)]
pub struct ThroughputSpec {
    /// Connections per variant.
    pub jobs: u32,
    /// Calls in flight per connection.
    pub iodepth: u32,
    /// Workload.
    pub rw: RwMode,
    /// Percentage of reads (randrw).
    pub mix: u8,
    /// Block size.
    pub bs: u64,
    /// Run time per variant.
    pub runtime: Duration,
    /// Bytes per variant (instead of the run time).
    pub bytes: Option<u64>,
    /// Processes whose CPU time is the server's (`--server-pid`).
    pub server_pids: Vec<u32>,
    /// The server's metrics endpoint (`--server-metrics`).
    pub server_metrics: Option<server_metrics::MetricsUrl>,
}

impl ThroughputSpec {
    /// The share of reads, in percent, the workload asks for.
    pub fn read_percent(&self) -> u8 {
        match self.rw {
            RwMode::Randread => 100,
            RwMode::Randwrite => 0,
            RwMode::Randrw => self.mix,
        }
    }
}

/// Everything a run needs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Server host name or address.
    pub server: String,
    /// Directory on the server (export path, possibly with a
    /// subdirectory).
    pub path: String,
    /// Base name of the bench files.
    pub file_name: String,
    /// The variants, in order.
    pub variants: Vec<VariantSpec>,
    /// Mode.
    pub mode: Mode,
    /// File size per variant.
    pub file_size: u64,
    /// Latency: record sizes.
    pub record_sizes: Vec<u64>,
    /// Slices per phase.
    pub rounds: u32,
    /// Throughput settings.
    pub throughput: ThroughputSpec,
    /// Draw a progress bar (when stderr is a terminal).
    pub progress: bool,
    /// Keep the files.
    pub keep: bool,
    /// Check what reads return against what was written.
    pub verify: bool,
}

fn label(i: usize) -> String {
    if i < 26 {
        char::from(b'A' + i as u8).to_string()
    } else {
        format!("V{}", i + 1)
    }
}

impl Plan {
    /// The plan the command line asks for.
    pub fn from_args(conn: &ConnArgs, args: &BenchArgs) -> Result<Plan, BenchError> {
        let inlines: Vec<Option<u64>> = match &args.inline {
            Some(l) => l.0.iter().map(|&v| Some(v)).collect(),
            None => vec![None],
        };
        let mut variants = Vec::new();
        for choice in conn.choices() {
            for &inline in &inlines {
                let mut options = conn.options_for(&choice);
                if let Some(i) = inline {
                    // parse_inline keeps it within 1 KiB..=1 MiB.
                    options.rdma.inline = i as u32;
                }
                variants.push(VariantSpec {
                    label: label(variants.len()),
                    choice,
                    inline,
                    options,
                });
            }
        }
        if variants.is_empty() {
            return Err(BenchError::Config("no variant to run".into()));
        }
        if args.mode == Mode::Throughput && args.bs > args.file_size {
            return Err(BenchError::Config(format!(
                "--bs {} is larger than the file (-s {})",
                report::fmt_size(args.bs),
                report::fmt_size(args.file_size)
            )));
        }
        if let Some(pids) = &args.server_pid {
            for &pid in &pids.0 {
                if stats::process_cpu_seconds(Some(pid)).is_none() {
                    return Err(BenchError::Config(format!(
                        "--server-pid {pid}: no such process on this machine (/proc/{pid}/stat)"
                    )));
                }
            }
        }
        Ok(Plan {
            server: args.target.server.clone(),
            path: args.target.path.clone(),
            file_name: args
                .file
                .clone()
                .unwrap_or_else(|| format!("nfsrdma-bench.{}", std::process::id())),
            variants,
            mode: args.mode,
            file_size: args.file_size,
            record_sizes: args.record_sizes.0.clone(),
            rounds: args.rounds,
            throughput: ThroughputSpec {
                jobs: args.jobs,
                iodepth: args.iodepth,
                rw: args.rw,
                mix: args.mix,
                bs: args.bs,
                runtime: args.runtime,
                bytes: args.bytes,
                server_pids: args
                    .server_pid
                    .as_ref()
                    .map(|p| p.0.clone())
                    .unwrap_or_default(),
                server_metrics: args.server_metrics.clone(),
            },
            progress: !args.no_progress,
            keep: args.keep,
            verify: !args.no_verify,
        })
    }
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The options cannot be used.
    #[error("{0}")]
    Config(String),
    /// No variant could connect (each one's reason is in the message).
    #[error("no variant could run: {0}")]
    NoVariant(String),
    /// A call failed during the run.
    #[error("variant {variant}: {what}: {source}")]
    Client {
        /// The variant's label.
        variant: String,
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: ClientError,
    },
    /// Data read back differs from what was written.
    #[error(
        "data mismatch at offset {offset} (variant {variant}, {phase}, record of {record_size} \
         bytes at offset {record_offset}): expected byte {expected:#04x}, read {found:#04x}"
    )]
    Mismatch {
        /// File offset of the first byte that differs.
        offset: u64,
        /// The variant's label.
        variant: String,
        /// The phase.
        phase: &'static str,
        /// Offset of the record.
        record_offset: u64,
        /// Size of the record.
        record_size: u64,
        /// The byte expected.
        expected: u8,
        /// The byte read.
        found: u8,
    },
    /// A read ended early.
    #[error("variant {variant}: short read at offset {offset}: {got} of {want} bytes")]
    ShortRead {
        /// The variant's label.
        variant: String,
        /// Offset of the read.
        offset: u64,
        /// Bytes read.
        got: u64,
        /// Bytes asked for.
        want: u64,
    },
}

/// The future a hook returns.
pub type HookFuture = Pin<Box<dyn Future<Output = Result<(), ClientError>> + Send>>;

/// A hook called with a variant's client, its file's handle and the record
/// size.
pub type Hook = Arc<dyn Fn(Client, NfsFh3, u64) -> HookFuture + Send + Sync>;

/// Points where a caller (a test) can act during a run.
#[derive(Clone, Default)]
pub struct Hooks {
    /// Latency mode: called for each variant and record size after the
    /// write and rewrite phases, before the read phase.
    pub after_writes: Option<Hook>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("after_writes", &self.after_writes.is_some())
            .finish()
    }
}

/// What became of a variant.
#[derive(Debug, Clone)]
pub struct VariantOutcome {
    /// The variant.
    pub spec: VariantSpec,
    /// Why it could not run, if it could not.
    pub error: Option<String>,
    /// READ size in use (0 when it did not connect).
    pub rsize: u32,
    /// WRITE size in use (0 when it did not connect).
    pub wsize: u32,
    /// The transport's counters summed over the variant's connections at
    /// the end of the run (RDMA: chunks offered, invalidations, binds).
    pub transport: Option<TransportStats>,
}

/// The four phases of a latency run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// First write of every record of a new (truncated) file.
    Write,
    /// Second write of every record.
    Rewrite,
    /// First read of every record.
    Read,
    /// Second read of every record.
    Reread,
}

impl Phase {
    /// All four, in order.
    pub const ALL: [Phase; 4] = [Phase::Write, Phase::Rewrite, Phase::Read, Phase::Reread];

    /// `write`, `rewrite`, `read`, `reread`.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Write => "write",
            Phase::Rewrite => "rewrite",
            Phase::Read => "read",
            Phase::Reread => "reread",
        }
    }
}

/// One latency summary: a variant, a record size, a phase.
#[derive(Debug, Clone)]
pub struct LatencyRow {
    /// Index into [`BenchResult::variants`].
    pub variant: usize,
    /// Record size in bytes.
    pub record_size: u64,
    /// Phase.
    pub phase: Phase,
    /// Latency of the records.
    pub summary: Summary,
    /// Retransmissions the transport counted during the phase.
    pub retransmits: u64,
    /// Time per step of a call (name, µs), when the transport reports
    /// it; `None` today: the transports report counters, not timings.
    pub breakdown: Option<Vec<(String, f64)>>,
}

/// One throughput result: a variant.
#[derive(Debug, Clone)]
pub struct ThroughputRow {
    /// Index into [`BenchResult::variants`].
    pub variant: usize,
    /// Calls completed.
    pub ops: u64,
    /// Of which READs.
    pub read_ops: u64,
    /// Of which WRITEs.
    pub write_ops: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Wall time measured, in seconds (the sum of the slices).
    pub elapsed_s: f64,
    /// Latency of all calls.
    pub summary: Summary,
    /// Latency of the READs, if any.
    pub read_summary: Option<Summary>,
    /// Latency of the WRITEs, if any.
    pub write_summary: Option<Summary>,
    /// Client CPU (user + system of this process) over wall time, in
    /// cores; `None` when /proc/self/stat cannot be read.
    pub client_cpu_cores: Option<f64>,
    /// Server CPU in cores; `None`: the server does not expose it.
    pub server_cpu_cores: Option<f64>,
    /// Retransmissions the transports counted.
    pub retransmits: u64,
    /// How each cumulative series of the server's endpoint moved during
    /// the variant's slices (`--server-metrics`).
    pub server_counters: Option<server_metrics::Samples>,
    /// The server's mean turnaround of the READs and WRITEs during the
    /// variant's slices, in microseconds (`--server-metrics`).
    pub server_turnaround_us: Option<f64>,
}

impl ThroughputRow {
    /// Calls per second.
    pub fn iops(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.ops as f64 / self.elapsed_s
        } else {
            0.0
        }
    }

    /// Megabytes (10^6 bytes) per second.
    pub fn mb_per_s(&self) -> f64 {
        if self.elapsed_s > 0.0 {
            self.bytes as f64 / self.elapsed_s / 1e6
        } else {
            0.0
        }
    }
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct BenchResult {
    /// The plan that ran.
    pub plan: Plan,
    /// Start time (RFC 3339, UTC).
    pub date: String,
    /// The variants and what became of them.
    pub variants: Vec<VariantOutcome>,
    /// Latency mode: the summaries.
    pub latency: Vec<LatencyRow>,
    /// Throughput mode: the results.
    pub throughput: Vec<ThroughputRow>,
    /// Remarks on the run (skipped record sizes, what is not measured).
    pub notes: Vec<String>,
    /// The machine the bench ran on.
    pub host: HostInfo,
}

/// The client machine, as far as the bench can tell.
#[derive(Debug, Clone, Default)]
pub struct HostInfo {
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: Option<String>,
    /// CPUs available to the process.
    pub cpus: usize,
    /// Names of the RDMA devices present (`/sys/class/infiniband`:
    /// `rxe0`, `mlx5_0`).
    pub rdma_devices: Vec<String>,
}

impl HostInfo {
    /// Reads the facts of this machine.
    pub fn probe() -> HostInfo {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut rdma_devices: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        rdma_devices.sort();
        HostInfo {
            kernel,
            cpus,
            rdma_devices,
        }
    }
}

/// A connected variant.
pub(crate) struct Conn {
    /// Index into the plan's variants.
    pub idx: usize,
    pub label: String,
    /// Its clients: one in latency mode, `--jobs` in throughput mode.
    pub clients: Vec<Client>,
    /// The directory of the bench files.
    pub dir: NfsFh3,
    /// Its file.
    pub file: NfsFh3,
    pub name: String,
}

impl Conn {
    pub fn client(&self) -> &Client {
        &self.clients[0]
    }

    pub fn err(&self, what: impl Into<String>) -> impl FnOnce(ClientError) -> BenchError + '_ {
        let what = what.into();
        move |source| BenchError::Client {
            variant: self.label.clone(),
            what,
            source,
        }
    }
}

async fn connect_variant(
    plan: &Plan,
    v: &VariantSpec,
    n: usize,
) -> Result<Vec<(Client, NfsFh3)>, String> {
    let mut out = Vec::new();
    for _ in 0..n {
        let (c, rest) = Client::connect_path(&v.options, &plan.server, &plan.path)
            .await
            .map_err(|e| e.to_string())?;
        let (dir, attr) = match c.lookup_path(&rest).await {
            Ok(x) => x,
            Err(e) => {
                c.shutdown();
                return Err(format!("{}: {e}", plan.path));
            }
        };
        if attr.type_ != Ftype3::Dir {
            c.shutdown();
            return Err(format!("{}: not a directory", plan.path));
        }
        out.push((c, dir));
    }
    Ok(out)
}

pub(crate) fn progress_bar(plan: &Plan, len: u64, unit: &str) -> ProgressBar {
    if !plan.progress || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    let template = format!("{{msg:28}} [{{bar:30}}] {{pos}}/{{len}} {unit} ETA {{eta}}");
    if let Ok(style) = ProgressStyle::with_template(&template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// The current time as RFC 3339 UTC (`2026-01-31T12:00:00Z`).
pub fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Runs `plan` without hooks.
pub async fn run(plan: &Plan) -> Result<BenchResult, BenchError> {
    run_with_hooks(plan, &Hooks::default()).await
}

/// Runs `plan`, calling `hooks` on the way. Variants that cannot connect
/// (today: every RDMA variant, the transport is not built yet) are
/// reported in [`BenchResult::variants`] and skipped; when none can
/// connect, the run fails with [`BenchError::NoVariant`].
pub async fn run_with_hooks(plan: &Plan, hooks: &Hooks) -> Result<BenchResult, BenchError> {
    let date = rfc3339_now();
    let per_variant = match plan.mode {
        Mode::Latency => 1,
        Mode::Throughput => plan.throughput.jobs as usize,
    };
    let mut outcomes = Vec::new();
    let mut conns = Vec::new();
    let mut failures = Vec::new();
    for (idx, v) in plan.variants.iter().enumerate() {
        match connect_variant(plan, v, per_variant).await {
            Ok(clients) => {
                let dir = clients[0].1.clone();
                let clients: Vec<Client> = clients.into_iter().map(|(c, _)| c).collect();
                outcomes.push(VariantOutcome {
                    spec: v.clone(),
                    error: None,
                    rsize: clients[0].rsize(),
                    wsize: clients[0].wsize(),
                    transport: None,
                });
                conns.push(Conn {
                    idx,
                    label: v.label.clone(),
                    clients,
                    dir: dir.clone(),
                    file: dir,
                    name: format!("{}.{}", plan.file_name, idx),
                });
            }
            Err(e) => {
                tracing::info!(variant = %v.label, error = %e, "variant cannot run");
                failures.push(format!("{} ({}): {e}", v.label, v.describe()));
                outcomes.push(VariantOutcome {
                    spec: v.clone(),
                    error: Some(e),
                    rsize: 0,
                    wsize: 0,
                    transport: None,
                });
            }
        }
    }
    if conns.is_empty() {
        return Err(BenchError::NoVariant(failures.join("; ")));
    }
    let mut result = BenchResult {
        plan: plan.clone(),
        date,
        variants: outcomes,
        latency: Vec::new(),
        throughput: Vec::new(),
        notes: Vec::new(),
        host: HostInfo::probe(),
    };
    if plan
        .variants
        .iter()
        .any(|v| v.inline.is_some() && v.choice.transport == TransportArg::Tcp)
    {
        result
            .notes
            .push("--inline applies to RDMA only; the TCP variants ignore it".into());
    }
    let outcome = async {
        for c in conns.iter_mut() {
            let created = c
                .client()
                .create(
                    &c.dir,
                    &c.name,
                    CreateHow3::Unchecked(Sattr3 {
                        mode: Some(0o644),
                        size: Some(0),
                        ..Sattr3::default()
                    }),
                )
                .await
                .map_err(c.err(format!("create {}", c.name)))?;
            c.file = match created.obj {
                Some(fh) => fh,
                None => {
                    c.client()
                        .lookup(&c.dir, &c.name)
                        .await
                        .map_err(c.err(format!("lookup {}", c.name)))?
                        .object
                }
            };
        }
        match plan.mode {
            Mode::Latency => latency::run(plan, &conns, hooks, &mut result).await,
            Mode::Throughput => throughput::run(plan, &conns, &mut result).await,
        }
    }
    .await;
    for c in &conns {
        let sum = c.clients.iter().fold(TransportStats::default(), |a, cl| {
            a.plus(&cl.transport_stats())
        });
        result.variants[c.idx].transport = Some(sum);
    }
    for c in &conns {
        if !plan.keep {
            if let Err(e) = c.client().remove(&c.dir, &c.name).await {
                tracing::info!(file = %c.name, error = %e, "cannot remove the bench file");
            }
        }
        for cl in &c.clients {
            cl.shutdown();
        }
    }
    outcome?;
    Ok(result)
}

/// `nfsrdma bench`: runs, prints the tables on stdout, writes the files
/// asked for.
pub async fn main(conn: &ConnArgs, args: &BenchArgs) -> anyhow::Result<()> {
    let plan = Plan::from_args(conn, args)?;
    let result = run(&plan).await?;
    for v in &result.variants {
        if let Some(e) = &v.error {
            eprintln!(
                "nfsrdma bench: variant {} ({}) did not run: {e}",
                v.spec.label,
                v.spec.describe()
            );
        }
    }
    print!("{}", report::text(&result));
    let write = |path: &PathBuf, text: String| -> anyhow::Result<()> {
        std::fs::write(path, text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))
    };
    if let Some(p) = &args.json {
        let text = serde_json::to_string_pretty(&report::json(&result))?;
        write(p, text + "\n")?;
    }
    if let Some(p) = &args.csv {
        write(p, report::csv(&result))?;
    }
    if let Some(p) = &args.plot {
        write(p, report::svg(&result))?;
    }
    Ok(())
}
