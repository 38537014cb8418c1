//! Per-procedure counters and latency histograms: the service time of
//! each NFSv3 procedure, calls and errors of each NFSv4 operation, and
//! each call's turnaround on the server (from its arrival to its reply
//! posted) by transport, procedure (an NFSv4 COMPOUND's: its main
//! operation, see [`Procedure::of_compound`]) and size class.
//!
//! Counters are atomics. A histogram is kept in a few stripes, each behind
//! a mutex of its own and made when first recorded into; a thread always
//! records into the same stripe, and a reader adds them up
//! ([`Striped`]), so that connections on different cores do not queue for
//! one lock per procedure.

use hdrhistogram::Histogram;
use nfsrdma_xdr::nfs3::{NfsProc3, NfsStat3};
use nfsrdma_xdr::nfs4::{opnum, Status};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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

/// What a call is counted under: an NFSv3 procedure, or an NFSv4
/// operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Procedure {
    /// An NFSv3 procedure.
    V3(NfsProc3),
    /// An NFSv4 operation, by number (numbers no operation has count as
    /// ILLEGAL).
    V4(u32),
}

/// Slots for NFSv4 operations: ILLEGAL (any number no operation has),
/// then one per operation from ACCESS (3) to the last.
const V4_SLOTS: usize = opnum::LAST as usize - 1;

impl Procedure {
    /// Every procedure and operation, in report order.
    const SLOTS: usize = NfsProc3::ALL.len() + V4_SLOTS;

    fn index(self) -> usize {
        match self {
            Procedure::V3(p) => p as usize,
            Procedure::V4(op) => NfsProc3::ALL.len() + v4_slot(op),
        }
    }

    fn from_index(i: usize) -> Procedure {
        match i.checked_sub(NfsProc3::ALL.len()) {
            None => Procedure::V3(NfsProc3::ALL[i]),
            Some(slot) => Procedure::V4(v4_op(slot)),
        }
    }

    /// The label value: the procedure's or operation's name.
    pub fn name(self) -> &'static str {
        match self {
            Procedure::V3(p) => p.name(),
            Procedure::V4(op) => opnum::name(op),
        }
    }

    /// What a COMPOUND is counted under: its first operation that is not
    /// SEQUENCE or one that only sets or saves a filehandle (so PUTFH,
    /// READ, GETATTR is a READ and PUTFH, OPEN, GETFH, GETATTR an OPEN),
    /// else its first operation (SEQUENCE alone renews a lease).
    pub fn of_compound(ops: impl IntoIterator<Item = u32>) -> Procedure {
        let mut first = None;
        for op in ops {
            first.get_or_insert(op);
            if !matches!(
                op,
                opnum::SEQUENCE
                    | opnum::PUTFH
                    | opnum::PUTROOTFH
                    | opnum::PUTPUBFH
                    | opnum::SAVEFH
                    | opnum::RESTOREFH
                    | opnum::GETFH
            ) {
                return Procedure::V4(op);
            }
        }
        Procedure::V4(first.unwrap_or(opnum::ILLEGAL))
    }
}

fn v4_slot(op: u32) -> usize {
    match op {
        3..=opnum::LAST => op as usize - 2,
        _ => 0,
    }
}

fn v4_op(slot: usize) -> u32 {
    match slot {
        0 => opnum::ILLEGAL,
        s => s as u32 + 2,
    }
}

/// What a call's turnaround is recorded under: its procedure and, for
/// READ and WRITE, its size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallClass {
    /// The procedure.
    pub proc_: Procedure,
    /// The size class.
    pub size: SizeClass,
}

/// Longest time a histogram holds, in nanoseconds (longer is recorded as
/// this).
const MAX_NS: u64 = 60_000_000_000;

/// A turnaround histogram: nanoseconds from 100 ns to a minute, two
/// significant digits (about 24 KiB each).
fn turnaround_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(100, MAX_NS, 2).expect("valid bounds")
}

/// A service-time histogram: nanoseconds from 1 ns to a minute, three
/// significant digits (about 220 KiB each).
fn service_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid bounds")
}

/// Stripes of a histogram.
const STRIPES: usize = 4;

/// The stripe this thread records into: threads take them in turn.
fn my_stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    STRIPE.with(|s| *s)
}

/// A histogram recorded into from many threads (see the module's
/// documentation).
struct Striped {
    stripes: [OnceLock<Mutex<Histogram<u64>>>; STRIPES],
    make: fn() -> Histogram<u64>,
}

impl Striped {
    fn new(make: fn() -> Histogram<u64>) -> Striped {
        Striped {
            stripes: Default::default(),
            make,
        }
    }

    /// Records `v` (saturated at the histogram's bounds by the caller).
    fn record(&self, v: u64) {
        let h = self.stripes[my_stripe()].get_or_init(|| Mutex::new((self.make)()));
        let _ = h.lock().unwrap_or_else(|e| e.into_inner()).record(v);
    }

    /// The stripes added up; `None` when nothing was recorded.
    fn total(&self) -> Option<Histogram<u64>> {
        let mut out: Option<Histogram<u64>> = None;
        for h in self.stripes.iter().filter_map(OnceLock::get) {
            let h = h.lock().unwrap_or_else(|e| e.into_inner());
            match &mut out {
                None => out = Some(h.clone()),
                // Same bounds: adding cannot fail.
                Some(o) => {
                    let _ = o.add(&*h);
                }
            }
        }
        out
    }
}

struct ProcStats {
    calls: AtomicU64,
    errors: AtomicU64,
    /// Service time in nanoseconds.
    hist: Striped,
}

/// Counters of one NFSv4 operation.
#[derive(Default)]
struct OpStats {
    calls: AtomicU64,
    errors: AtomicU64,
}

/// Counters of the NFS service.
pub struct Metrics {
    procs: Vec<ProcStats>,
    ops4: Vec<OpStats>,
    compounds: AtomicU64,
    compound_errors: AtomicU64,
    /// By transport, procedure and size class (see [`Metrics::slot`]).
    turnaround: Vec<Striped>,
    drc_hits: AtomicU64,
    drc_in_progress: AtomicU64,
    garbage: AtomicU64,
    panicked: AtomicU64,
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
                    hist: Striped::new(service_histogram),
                })
                .collect(),
            ops4: (0..V4_SLOTS).map(|_| OpStats::default()).collect(),
            compounds: AtomicU64::new(0),
            compound_errors: AtomicU64::new(0),
            turnaround: (0..Transport::ALL.len() * Procedure::SLOTS * SizeClass::ALL.len())
                .map(|_| Striped::new(turnaround_histogram))
                .collect(),
            drc_hits: AtomicU64::new(0),
            drc_in_progress: AtomicU64::new(0),
            garbage: AtomicU64::new(0),
            panicked: AtomicU64::new(0),
        }
    }

    /// Records one call.
    pub fn record(&self, p: NfsProc3, status: NfsStat3, took: Duration) {
        let s = &self.procs[p as usize];
        s.calls.fetch_add(1, Ordering::Relaxed);
        if status != NfsStat3::Ok {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
        s.hist.record((took.as_nanos() as u64).clamp(1, MAX_NS));
    }

    /// Records one NFSv4 COMPOUND: the status of each operation it ran,
    /// and its own.
    pub fn record_compound(&self, ops: impl IntoIterator<Item = (u32, Status)>, status: Status) {
        self.compounds.fetch_add(1, Ordering::Relaxed);
        if !status.is_ok() {
            self.compound_errors.fetch_add(1, Ordering::Relaxed);
        }
        for (op, st) in ops {
            let s = &self.ops4[v4_slot(op)];
            s.calls.fetch_add(1, Ordering::Relaxed);
            if !st.is_ok() {
                s.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// NFSv4 COMPOUNDs executed, and those whose status was not NFS4_OK.
    pub fn compounds(&self) -> (u64, u64) {
        (
            self.compounds.load(Ordering::Relaxed),
            self.compound_errors.load(Ordering::Relaxed),
        )
    }

    /// Every NFSv4 operation executed at least once: its number, how
    /// often, and how often with a status other than NFS4_OK.
    pub fn operations(&self) -> Vec<(u32, u64, u64)> {
        self.ops4
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                let calls = s.calls.load(Ordering::Relaxed);
                (calls > 0).then(|| (v4_op(slot), calls, s.errors.load(Ordering::Relaxed)))
            })
            .collect()
    }

    fn slot(t: Transport, c: CallClass) -> usize {
        (t as usize * Procedure::SLOTS + c.proc_.index()) * SizeClass::ALL.len() + c.size as usize
    }

    /// Records one call's turnaround: from its arrival on transport `t`
    /// to its reply posted.
    pub fn record_turnaround(&self, t: Transport, c: CallClass, took: Duration) {
        self.turnaround[Self::slot(t, c)].record((took.as_nanos() as u64).clamp(100, MAX_NS));
    }

    /// A copy of every turnaround histogram recorded into, with what it
    /// is recorded under, in report order.
    pub fn turnarounds(&self) -> Vec<(Transport, CallClass, Histogram<u64>)> {
        let mut out = Vec::new();
        for t in Transport::ALL {
            for proc_ in (0..Procedure::SLOTS).map(Procedure::from_index) {
                for size in SizeClass::ALL {
                    let c = CallClass { proc_, size };
                    if let Some(h) = self.turnaround[Self::slot(t, c)].total() {
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

    pub(crate) fn panicked(&self) {
        self.panicked.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls of procedure `p` executed.
    pub fn calls(&self, p: NfsProc3) -> u64 {
        self.procs[p as usize].calls.load(Ordering::Relaxed)
    }

    /// A copy of procedure `p`'s service-time histogram (nanoseconds).
    pub fn service_time(&self, p: NfsProc3) -> Histogram<u64> {
        self.procs[p as usize]
            .hist
            .total()
            .unwrap_or_else(service_histogram)
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

    /// Handlers that panicked (each answered as a server fault).
    pub fn handler_panics(&self) -> u64 {
        self.panicked.load(Ordering::Relaxed)
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
            let h = s.hist.total().unwrap_or_else(service_histogram);
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
        let (compounds, compound_errors) = self.compounds();
        if compounds > 0 {
            let _ = writeln!(
                out,
                "NFSv4: {compounds} COMPOUNDs ({compound_errors} not NFS4_OK)\n{:<22} {:>10} {:>8}",
                "operation", "calls", "errors"
            );
            for (op, calls, errors) in self.operations() {
                let _ = writeln!(out, "{:<22} {calls:>10} {errors:>8}", opnum::name(op));
            }
        }
        let turnarounds = self.turnarounds();
        if !turnarounds.is_empty() {
            let _ = writeln!(
                out,
                "turnaround, from a call's arrival to its reply posted (NFSv4: by COMPOUND, under its main operation):\n{:<9} {:<4} {:<22} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
                "transport", "vers", "procedure", "size", "calls", "p50 us", "p99 us", "p99.9 us", "max us"
            );
            for (t, c, h) in turnarounds {
                let us = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
                let _ = writeln!(
                    out,
                    "{:<9} {:<4} {:<22} {:>5} {:>10} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    t.name(),
                    match c.proc_ {
                        Procedure::V3(_) => "3",
                        Procedure::V4(_) => "4",
                    },
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
            "duplicate request cache: {} replayed, {} dropped in progress; GARBAGE_ARGS: {}; handler panics: {}",
            self.drc_hits(),
            self.drc_in_progress_drops(),
            self.garbage_args(),
            self.handler_panics()
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_histogram_recorded_from_many_threads_adds_up_every_value() {
        let m = Metrics::new();
        std::thread::scope(|s| {
            for t in 1..=8u64 {
                let m = &m;
                s.spawn(move || {
                    for i in 0..1000 {
                        m.record(
                            NfsProc3::Read,
                            NfsStat3::Ok,
                            Duration::from_nanos(t * 1000 + i),
                        );
                        m.record_turnaround(
                            Transport::Rdma,
                            CallClass {
                                proc_: Procedure::V3(NfsProc3::Read),
                                size: SizeClass::UpTo4K,
                            },
                            Duration::from_micros(t),
                        );
                    }
                });
            }
        });
        let h = m.service_time(NfsProc3::Read);
        assert_eq!(h.len(), 8000);
        assert_eq!((h.min(), h.max()), (1000, 8999));
        assert_eq!(m.calls(NfsProc3::Read), 8000);
        let t = m.turnarounds();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].2.len(), 8000);
        assert!(t[0].2.max() >= 8000 && t[0].2.min() <= 1000);
        assert!(m.service_time(NfsProc3::Write).is_empty());
    }

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
    fn a_compound_counts_under_its_first_operation_past_sequence_and_filehandles() {
        use opnum::*;
        for (ops, want) in [
            (&[SEQUENCE, PUTFH, READ][..], READ),
            (&[SEQUENCE, PUTFH, WRITE, GETATTR], WRITE),
            (&[SEQUENCE, PUTFH, OPEN, GETFH, ACCESS, GETATTR], OPEN),
            (&[SEQUENCE, PUTFH, SAVEFH, PUTFH, COPY], COPY),
            (&[SEQUENCE, PUTROOTFH, GETFH], SEQUENCE),
            (&[SEQUENCE], SEQUENCE),
            (&[EXCHANGE_ID], EXCHANGE_ID),
            (&[PUTFH, GETATTR], GETATTR),
            (&[], ILLEGAL),
        ] {
            assert_eq!(
                Procedure::of_compound(ops.iter().copied()),
                Procedure::V4(want),
                "{ops:?}"
            );
        }
        // Every slot names what it counts, and back.
        for i in 0..Procedure::SLOTS {
            assert_eq!(Procedure::from_index(i).index(), i);
        }
        assert_eq!(Procedure::V4(ILLEGAL).index(), Procedure::V4(0).index());
        assert_eq!(Procedure::V4(CLONE).name(), "CLONE");
        assert_eq!(Procedure::V3(NfsProc3::Read).name(), "READ");
    }

    #[test]
    fn operations_and_compounds_are_counted_with_their_errors() {
        let m = Metrics::new();
        m.record_compound(
            [
                (opnum::SEQUENCE, Status::OK),
                (opnum::PUTFH, Status::OK),
                (opnum::READ, Status::OK),
            ],
            Status::OK,
        );
        m.record_compound(
            [
                (opnum::SEQUENCE, Status::OK),
                (opnum::LOOKUP, Status::NOENT),
            ],
            Status::NOENT,
        );
        m.record_compound([(99, Status::OP_ILLEGAL)], Status::OP_ILLEGAL);
        assert_eq!(m.compounds(), (3, 2));
        assert_eq!(
            m.operations(),
            vec![
                (opnum::ILLEGAL, 1, 1),
                (opnum::LOOKUP, 1, 1),
                (opnum::PUTFH, 1, 0),
                (opnum::READ, 1, 0),
                (opnum::SEQUENCE, 2, 0),
            ]
        );
        let r = m.report();
        assert!(r.contains("NFSv4: 3 COMPOUNDs (2 not NFS4_OK)"), "{r}");
        assert!(
            r.lines()
                .any(|l| l.starts_with("SEQUENCE") && l.ends_with(" 2        0")),
            "{r}"
        );
    }

    #[test]
    fn turnarounds_are_kept_apart_by_transport_procedure_and_size() {
        let m = Metrics::new();
        let read4k = CallClass {
            proc_: Procedure::V3(NfsProc3::Read),
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
