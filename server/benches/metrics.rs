//! What the service's counters cost a call: recording one service time
//! (the existing per-procedure histogram) and one turnaround (by
//! transport, procedure and size class), and reading the clock once, as
//! the RDMA connection thread does per round of work.
//!
//! `cargo bench -p nfsrdma-server --bench metrics`

use criterion::{criterion_group, criterion_main, Criterion};
use nfsrdma_server::service::metrics::{CallClass, Metrics, Procedure, SizeClass, Transport};
use nfsrdma_xdr::nfs3::{NfsProc3, NfsStat3};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn bench(c: &mut Criterion) {
    let m = Metrics::new();
    let read4k = CallClass {
        proc_: Procedure::V3(NfsProc3::Read),
        size: SizeClass::UpTo4K,
    };
    let mut ns = 0u64;
    c.bench_function("record_service_time", |b| {
        b.iter(|| {
            ns = (ns + 997) % 200_000;
            m.record(
                NfsProc3::Read,
                NfsStat3::Ok,
                Duration::from_nanos(black_box(ns)),
            )
        })
    });
    c.bench_function("record_turnaround", |b| {
        b.iter(|| {
            ns = (ns + 997) % 200_000;
            m.record_turnaround(Transport::Rdma, read4k, Duration::from_nanos(black_box(ns)))
        })
    });
    c.bench_function("clock_reading", |b| b.iter(|| black_box(Instant::now())));
}

criterion_group!(benches, bench);
criterion_main!(benches);
