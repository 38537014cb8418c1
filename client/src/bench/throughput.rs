//! Throughput mode: `--jobs` connections per variant, `--iodepth` calls in
//! flight on each, random reads and/or writes of `--bs` bytes.

use super::latency::{read_record, write_record};
use super::pattern;
use super::server_metrics;
use super::stats::{self, Summary};
use super::{BenchError, BenchResult, Conn, Plan, ThroughputRow};
use crate::xdr::nfs3::NfsFh3;
use crate::Client;
use hdrhistogram::Histogram;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The pass of every byte in throughput mode: the layout and every write
/// store the same function of the offset, so a read racing a write of the
/// same block still has one right answer.
const PASS: u64 = 0;

/// Bytes per WRITE call while laying the file out.
const LAYOUT_CHUNK: u64 = 1 << 20;

/// A small xorshift generator: cheap, deterministic per seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

/// What the calls of one slice measured.
struct Tally {
    reads: Histogram<u64>,
    writes: Histogram<u64>,
    bytes: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            reads: stats::histogram(),
            writes: stats::histogram(),
            bytes: 0,
        }
    }

    fn add(&mut self, other: &Tally) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.reads.add(&other.reads);
        let _ = self.writes.add(&other.writes);
        self.bytes += other.bytes;
    }
}

/// When a slice ends.
#[derive(Clone)]
enum Stop {
    At(Instant),
    Budget(Arc<AtomicU64>),
}

impl Stop {
    /// Takes the next call's share; false when the slice is over.
    fn take(&self, bs: u64) -> bool {
        match self {
            Stop::At(t) => Instant::now() < *t,
            Stop::Budget(left) => left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(bs))
                .is_ok(),
        }
    }
}

struct Worker {
    client: Client,
    file: NfsFh3,
    label: String,
    blocks: u64,
    bs: u64,
    read_percent: u64,
    seed: u64,
    stop: Stop,
    verify: bool,
}

impl Worker {
    /// One call at a time until the slice ends.
    async fn run(self) -> Result<Tally, BenchError> {
        let mut t = Tally::new();
        let mut rng = Rng::new(self.seed);
        let mut scratch = Vec::new();
        while self.stop.take(self.bs) {
            let offset = rng.next() % self.blocks * self.bs;
            let is_read = rng.next() % 100 < self.read_percent;
            if is_read {
                let t0 = Instant::now();
                let parts =
                    read_record(&self.client, &self.file, &self.label, offset, self.bs).await?;
                stats::record(&mut t.reads, t0.elapsed().as_nanos() as u64);
                if let Some((at, expected, found)) = self
                    .verify
                    .then(|| pattern::first_mismatch(&parts, offset, PASS, &mut scratch))
                    .flatten()
                {
                    return Err(BenchError::Mismatch {
                        offset: at,
                        variant: self.label.clone(),
                        phase: "randread",
                        record_offset: offset,
                        record_size: self.bs,
                        expected,
                        found,
                    });
                }
            } else {
                let data = pattern::record(offset, self.bs as usize, PASS);
                let t0 = Instant::now();
                write_record(&self.client, &self.file, &self.label, offset, data).await?;
                stats::record(&mut t.writes, t0.elapsed().as_nanos() as u64);
            }
            t.bytes += self.bs;
        }
        Ok(t)
    }
}

/// Per-variant totals over the slices.
struct Acc {
    tally: Tally,
    elapsed: Duration,
    cpu: Option<f64>,
    /// CPU seconds of the `--server-pid` processes during the slices.
    server_cpu: Option<f64>,
    /// What the server's counters moved by during the slices.
    server_counters: Option<server_metrics::Samples>,
    retransmits_before: u64,
}

fn retransmits(c: &Conn) -> u64 {
    c.clients
        .iter()
        .map(|cl| cl.transport_stats().retransmits)
        .sum()
}

/// Lays out every variant's file, then runs the slices.
pub(super) async fn run(
    plan: &Plan,
    conns: &[Conn],
    result: &mut BenchResult,
) -> Result<(), BenchError> {
    let spec = &plan.throughput;
    let blocks = plan.file_size / spec.bs;
    let read_percent = u64::from(spec.read_percent());
    if read_percent > 0 {
        // Reads need the whole file in place first (not measured).
        for c in conns {
            let mut at = 0u64;
            while at < plan.file_size {
                let n = (plan.file_size - at).min(LAYOUT_CHUNK);
                c.client()
                    .write_all(&c.file, at, pattern::record(at, n as usize, PASS))
                    .await
                    .map_err(c.err(format!("laying out the file at offset {at}")))?;
                at += n;
            }
        }
    }
    let rounds = plan.rounds;
    let pb = super::progress_bar(plan, u64::from(rounds) * conns.len() as u64, "slices");
    let mut accs: Vec<Acc> = conns
        .iter()
        .map(|c| Acc {
            tally: Tally::new(),
            elapsed: Duration::ZERO,
            cpu: Some(0.0),
            server_cpu: (!spec.server_pids.is_empty()).then_some(0.0),
            server_counters: spec.server_metrics.as_ref().map(|_| Default::default()),
            retransmits_before: retransmits(c),
        })
        .collect();
    let slice_time = spec.runtime / rounds;
    let slice_bytes = spec
        .bytes
        .map(|b| b.div_ceil(u64::from(rounds)).max(spec.bs));
    for round in 0..rounds {
        for (ci, c) in conns.iter().enumerate() {
            pb.set_message(format!("round {}/{rounds} variant {}", round + 1, c.label));
            let cpu0 = stats::process_cpu_seconds(None);
            let server0 = stats::processes_cpu_seconds(&spec.server_pids);
            let metrics0 = match &spec.server_metrics {
                Some(u) => Some(
                    server_metrics::scrape(u)
                        .await
                        .map_err(|e| BenchError::Config(format!("--server-metrics: {e}")))?,
                ),
                None => None,
            };
            let t0 = Instant::now();
            let stop = match slice_bytes {
                Some(b) => Stop::Budget(Arc::new(AtomicU64::new(b))),
                None => Stop::At(t0 + slice_time),
            };
            let mut set = JoinSet::new();
            for (job, client) in c.clients.iter().enumerate() {
                for d in 0..spec.iodepth {
                    let w = Worker {
                        client: client.clone(),
                        file: c.file.clone(),
                        label: c.label.clone(),
                        blocks,
                        bs: spec.bs,
                        read_percent,
                        seed: (u64::from(round) << 40)
                            ^ ((c.idx as u64) << 24)
                            ^ ((job as u64) << 12)
                            ^ u64::from(d),
                        stop: stop.clone(),
                        verify: plan.verify,
                    };
                    set.spawn(w.run());
                }
            }
            while let Some(joined) = set.join_next().await {
                let tally = joined.map_err(|e| BenchError::Client {
                    variant: c.label.clone(),
                    what: "I/O task".into(),
                    source: crate::ClientError::Protocol(format!("task failed: {e}")),
                })??;
                accs[ci].tally.add(&tally);
            }
            accs[ci].elapsed += t0.elapsed();
            if let (Some(u), Some(before)) = (&spec.server_metrics, &metrics0) {
                let after = server_metrics::scrape(u)
                    .await
                    .map_err(|e| BenchError::Config(format!("--server-metrics: {e}")))?;
                if let Some(acc) = accs[ci].server_counters.as_mut() {
                    server_metrics::add_delta(acc, before, &after);
                }
            }
            accs[ci].cpu = match (accs[ci].cpu, cpu0, stats::process_cpu_seconds(None)) {
                (Some(sum), Some(a), Some(b)) => Some(sum + (b - a)),
                _ => None,
            };
            accs[ci].server_cpu = match (
                accs[ci].server_cpu,
                server0,
                stats::processes_cpu_seconds(&spec.server_pids),
            ) {
                (Some(sum), Some(a), Some(b)) => Some(sum + (b - a)),
                _ => None,
            };
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    for (ci, c) in conns.iter().enumerate() {
        let a = &accs[ci];
        let mut all = stats::histogram();
        let _ = all.add(&a.tally.reads);
        let _ = all.add(&a.tally.writes);
        let secs = a.elapsed.as_secs_f64();
        let summary_or_none = |h: &Histogram<u64>| (!h.is_empty()).then(|| Summary::of(h));
        result.throughput.push(ThroughputRow {
            variant: c.idx,
            ops: all.len(),
            read_ops: a.tally.reads.len(),
            write_ops: a.tally.writes.len(),
            bytes: a.tally.bytes,
            elapsed_s: secs,
            summary: Summary::of(&all),
            read_summary: summary_or_none(&a.tally.reads),
            write_summary: summary_or_none(&a.tally.writes),
            client_cpu_cores: a.cpu.filter(|_| secs > 0.0).map(|cpu| cpu / secs),
            server_cpu_cores: a.server_cpu.filter(|_| secs > 0.0).map(|cpu| cpu / secs),
            retransmits: retransmits(c).saturating_sub(a.retransmits_before),
            server_turnaround_us: a
                .server_counters
                .as_ref()
                .and_then(server_metrics::mean_turnaround_us),
            server_counters: a.server_counters.clone(),
        });
    }
    if spec.server_pids.is_empty() {
        result.notes.push(
            "server CPU: n/a (give --server-pid when the server runs on this machine)".into(),
        );
    } else {
        result.notes.push(format!(
            "server CPU: user + system time of PIDs {:?} (/proc/PID/stat) over wall time; \
             work done for them in interrupt context is not counted",
            spec.server_pids
        ));
    }
    result.notes.push(
        "client CPU: user + system time of this process (/proc/self/stat) over wall time".into(),
    );
    if let Some(u) = &spec.server_metrics {
        result.notes.push(format!(
            "server turnaround: the mean, over the run's READs and WRITEs, of the time from a call's \
             arrival to its reply posted, from {u} read before and after each slice (it counts \
             every client's calls of those slices)"
        ));
    }
    Ok(())
}
