//! Per-procedure counters and latency histograms.

use hdrhistogram::Histogram;
use nfsrdma_xdr::nfs3::{NfsProc3, NfsStat3};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

struct ProcStats {
    calls: AtomicU64,
    errors: AtomicU64,
    /// Service time in nanoseconds.
    hist: Mutex<Histogram<u64>>,
}

/// Counters of the NFS service.
pub struct Metrics {
    procs: Vec<ProcStats>,
    drc_hits: AtomicU64,
    drc_in_progress: AtomicU64,
    garbage: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Zeroed counters.
    pub fn new() -> Metrics {
        Metrics {
            procs: NfsProc3::ALL
                .iter()
                .map(|_| ProcStats {
                    calls: AtomicU64::new(0),
                    errors: AtomicU64::new(0),
                    hist: Mutex::new(
                        Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
                    ),
                })
                .collect(),
            drc_hits: AtomicU64::new(0),
            drc_in_progress: AtomicU64::new(0),
            garbage: AtomicU64::new(0),
        }
    }

    /// Records one call.
    pub fn record(&self, p: NfsProc3, status: NfsStat3, took: Duration) {
        let s = &self.procs[p as usize];
        s.calls.fetch_add(1, Ordering::Relaxed);
        if status != NfsStat3::Ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        let ns = (took.as_nanos() as u64).clamp(1, 60_000_000_000);
        if let Ok(mut h) = s.hist.lock() {
            let _ = h.record(ns);
        }
    }

    pub(crate) fn drc_hit(&self) {
        self.drc_hits.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn drc_in_progress(&self) {
        self.drc_in_progress.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn garbage(&self) {
        self.garbage.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls of procedure `p` executed.
    pub fn calls(&self, p: NfsProc3) -> u64 {
        self.procs[p as usize].calls.load(Ordering::Relaxed)
    }

    /// A copy of procedure `p`'s service-time histogram (nanoseconds).
    pub fn service_time(&self, p: NfsProc3) -> Histogram<u64> {
        self.procs[p as usize]
            .hist
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Calls of procedure `p` that ended with an error status.
    pub fn errors(&self, p: NfsProc3) -> u64 {
        self.procs[p as usize].errors.load(Ordering::Relaxed)
    }

    /// Retransmissions answered from the duplicate request cache.
    pub fn drc_hits(&self) -> u64 {
        self.drc_hits.load(Ordering::Relaxed)
    }

    /// Retransmissions dropped because the original was still executing.
    pub fn drc_in_progress_drops(&self) -> u64 {
        self.drc_in_progress.load(Ordering::Relaxed)
    }

    /// Calls answered with GARBAGE_ARGS.
    pub fn garbage_args(&self) -> u64 {
        self.garbage.load(Ordering::Relaxed)
    }

    /// A table of every procedure that was called: calls, errors, and
    /// service-time percentiles in microseconds.
    pub fn report(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<12} {:>10} {:>8} {:>10} {:>10} {:>10} {:>10}",
            "procedure", "calls", "errors", "p50 us", "p99 us", "p99.9 us", "max us"
        );
        for p in NfsProc3::ALL {
            let s = &self.procs[p as usize];
            let calls = s.calls.load(Ordering::Relaxed);
            if calls == 0 {
                continue;
            }
            let h = s.hist.lock().unwrap_or_else(|e| e.into_inner());
            let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
            let _ = writeln!(
                out,
                "{:<12} {:>10} {:>8} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                p.name(),
                calls,
                s.errors.load(Ordering::Relaxed),
                us(0.5),
                us(0.99),
                us(0.999),
                h.max() as f64 / 1000.0
            );
        }
        let _ = writeln!(
            out,
            "duplicate request cache: {} replayed, {} dropped in progress; GARBAGE_ARGS: {}",
            self.drc_hits(),
            self.drc_in_progress_drops(),
            self.garbage_args()
        );
        out
    }
}
