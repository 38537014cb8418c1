//! Per-procedure counters and latency histograms: the service time of
//! each procedure, and each call's turnaround on the server (from its
//! arrival to its reply posted) by transport, procedure and size class.

use hdrhistogram::Histogram;
use nfsrdma_xdr::nfs3::{NfsProc3, NfsStat3};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The transport a call came by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// TCP.
    Tcp = 0,
    /// RPC-over-RDMA.
    Rdma = 1,
}

impl Transport {
    /// Both, in report order.
    pub const ALL: [Transport; 2] = [Transport::Tcp, Transport::Rdma];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma => "rdma",
        }
    }
}

/// A READ's or WRITE's size, in classes (each up to its bound); other
/// procedures are [`SizeClass::Any`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeClass {
    /// A procedure that moves no file data.
    Any = 0,
    /// Up to 4 KiB.
    UpTo4K = 1,
    /// Up to 16 KiB.
    UpTo16K = 2,
    /// Up to 64 KiB.
    UpTo64K = 3,
    /// Up to 256 KiB.
    UpTo256K = 4,
    /// More than 256 KiB.
    Above256K = 5,
}

impl SizeClass {
    /// Every class, in report order.
    pub const ALL: [SizeClass; 6] = [
        SizeClass::Any,
        SizeClass::UpTo4K,
        SizeClass::UpTo16K,
        SizeClass::UpTo64K,
        SizeClass::UpTo256K,
        SizeClass::Above256K,
    ];

    /// The class of a READ or WRITE of `bytes`.
    pub fn of(bytes: u32) -> SizeClass {
        match bytes {
            0..=4096 => SizeClass::UpTo4K,
            4097..=16384 => SizeClass::UpTo16K,
            16385..=65536 => SizeClass::UpTo64K,
            65537..=262144 => SizeClass::UpTo256K,
            _ => SizeClass::Above256K,
        }
    }

    /// The label value: `any`, or the class's upper bound (`4k` ... `256k`,
    /// then `1m` for anything above 256 KiB, up to the largest transfer).
    pub fn name(self) -> &'static str {
        match self {
            SizeClass::Any => "any",
            SizeClass::UpTo4K => "4k",
            SizeClass::UpTo16K => "16k",
            SizeClass::UpTo64K => "64k",
            SizeClass::UpTo256K => "256k",
            SizeClass::Above256K => "1m",
        }
    }
}

/// What a call's turnaround is recorded under: its procedure and, for
/// READ and WRITE, its size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallClass {
    /// The procedure.
    pub proc_: NfsProc3,
    /// The size class.
    pub size: SizeClass,
}

/// Longest time a histogram holds, in nanoseconds (longer is recorded as
/// this).
const MAX_NS: u64 = 60_000_000_000;

/// A turnaround histogram: nanoseconds from 100 ns to a minute, two
/// significant digits (about 24 KiB each), made when first recorded into.
fn turnaround_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(100, MAX_NS, 2).expect("valid bounds")
}

struct ProcStats {
    calls: AtomicU64,
    errors: AtomicU64,
    /// Service time in nanoseconds.
    hist: Mutex<Histogram<u64>>,
}

/// Counters of the NFS service.
pub struct Metrics {
    procs: Vec<ProcStats>,
    /// By transport, procedure and size class (see [`Metrics::slot`]).
    turnaround: Vec<OnceLock<Mutex<Histogram<u64>>>>,
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
            turnaround: (0..Transport::ALL.len() * NfsProc3::ALL.len() * SizeClass::ALL.len())
                .map(|_| OnceLock::new())
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

    fn slot(t: Transport, c: CallClass) -> usize {
        (t as usize * NfsProc3::ALL.len() + c.proc_ as usize) * SizeClass::ALL.len()
            + c.size as usize
    }

    /// Records one call's turnaround: from its arrival on transport `t`
    /// to its reply posted.
    pub fn record_turnaround(&self, t: Transport, c: CallClass, took: Duration) {
        let h =
            self.turnaround[Self::slot(t, c)].get_or_init(|| Mutex::new(turnaround_histogram()));
        let ns = (took.as_nanos() as u64).clamp(100, MAX_NS);
        if let Ok(mut h) = h.lock() {
            let _ = h.record(ns);
        }
    }

    /// A copy of every turnaround histogram recorded into, with what it
    /// is recorded under, in report order.
    pub fn turnarounds(&self) -> Vec<(Transport, CallClass, Histogram<u64>)> {
        let mut out = Vec::new();
        for t in Transport::ALL {
            for proc_ in NfsProc3::ALL {
                for size in SizeClass::ALL {
                    let c = CallClass { proc_, size };
                    if let Some(h) = self.turnaround[Self::slot(t, c)].get() {
                        let h = h.lock().unwrap_or_else(|e| e.into_inner()).clone();
                        if !h.is_empty() {
                            out.push((t, c, h));
                        }
                    }
                }
            }
        }
        out
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
        let turnarounds = self.turnarounds();
        if !turnarounds.is_empty() {
            let _ = writeln!(
                out,
                "turnaround, from a call's arrival to its reply posted:\n{:<9} {:<12} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
                "transport", "procedure", "size", "calls", "p50 us", "p99 us", "p99.9 us", "max us"
            );
            for (t, c, h) in turnarounds {
                let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                let _ = writeln!(
                    out,
                    "{:<9} {:<12} {:>5} {:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    t.name(),
                    c.proc_.name(),
                    c.size.name(),
                    h.len(),
                    us(0.5),
                    us(0.99),
                    us(0.999),
                    h.max() as f64 / 1000.0
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_end_at_their_bounds() {
        for (bytes, class) in [
            (0, SizeClass::UpTo4K),
            (4096, SizeClass::UpTo4K),
            (4097, SizeClass::UpTo16K),
            (16384, SizeClass::UpTo16K),
            (65536, SizeClass::UpTo64K),
            (65537, SizeClass::UpTo256K),
            (262144, SizeClass::UpTo256K),
            (262145, SizeClass::Above256K),
            (1 << 20, SizeClass::Above256K),
        ] {
            assert_eq!(SizeClass::of(bytes), class, "{bytes}");
        }
    }

    #[test]
    fn turnarounds_are_kept_apart_by_transport_procedure_and_size() {
        let m = Metrics::new();
        let read4k = CallClass {
            proc_: NfsProc3::Read,
            size: SizeClass::UpTo4K,
        };
        let read64k = CallClass {
            size: SizeClass::UpTo64K,
            ..read4k
        };
        m.record_turnaround(Transport::Rdma, read4k, Duration::from_micros(10));
        m.record_turnaround(Transport::Rdma, read4k, Duration::from_micros(30));
        m.record_turnaround(Transport::Rdma, read64k, Duration::from_micros(50));
        m.record_turnaround(Transport::Tcp, read4k, Duration::from_micros(70));
        let got: Vec<(Transport, CallClass, u64, u64)> = m
            .turnarounds()
            .into_iter()
            .map(|(t, c, h)| (t, c, h.len(), h.max() / 1000))
            .collect();
        assert_eq!(
            got,
            vec![
                (Transport::Tcp, read4k, 1, 70),
                (Transport::Rdma, read4k, 2, 30),
                (Transport::Rdma, read64k, 1, 50),
            ]
        );
        let r = m.report();
        assert!(
            r.contains("turnaround, from a call's arrival to its reply posted"),
            "{r}"
        );
        assert!(
            r.lines()
                .any(|l| l.starts_with("rdma") && l.contains("READ") && l.contains(" 64k ")),
            "{r}"
        );
    }
}
