//! The daemon's counters in the Prometheus text format, read at each
//! scrape from the counters the service and the transports keep anyway
//! (nothing more is counted on a call's path), and the HTTP endpoint
//! that serves them ([`http`]).
//!
//! Names start with `nfsrdmad_`. Per procedure: `nfs_calls_total`,
//! `nfs_errors_total` (a status other than NFS3_OK) and
//! `nfs_service_seconds` (a histogram of the time a call spent in the
//! service, from its decoded arguments to its reply); per transport,
//! procedure and size class `turnaround_seconds` (from a call's arrival
//! to its reply posted: the server's whole share of the call). NFSv4:
//! `nfs4_compounds_total`, `nfs4_compound_errors_total`, per operation
//! `nfs4_operations_total` and `nfs4_operation_errors_total`, and
//! `nfs4_turnaround_seconds` per transport, main operation and size
//! class (see `Procedure::of_compound`). The duplicate
//! request cache and GARBAGE_ARGS; TCP (`tcp_*`) and RPC-over-RDMA
//! (`rdma_*`) counters when that transport runs; per export (label
//! `export`) the store's bytes and files, used and allowed, WRITE bytes
//! copied or taken over, and a null export's bytes.

pub mod http;

use crate::rdma::RdmaStats;
use crate::service::metrics::Procedure;
use crate::service::Service;
use crate::tcp::TcpStats;
use hdrhistogram::Histogram;
use nfsrdma_xdr::nfs3::NfsProc3;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Upper bounds, in seconds, of the service-time histograms' buckets.
pub const SECONDS_BUCKETS: [f64; 19] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
    5e-2, 0.1, 0.25, 1.0, 10.0,
];

/// What the endpoint reports.
#[derive(Clone)]
pub struct Sources {
    /// The NFS service (its metrics and exports).
    pub service: Arc<Service>,
    /// The TCP front end's counters.
    pub tcp: Option<Arc<TcpStats>>,
    /// The RDMA listener's counters, when it runs.
    pub rdma: Option<Arc<RdmaStats>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources")
            .field("tcp", &self.tcp.is_some())
            .field("rdma", &self.rdma.is_some())
            .finish()
    }
}

impl Sources {
    /// The whole exposition, as served.
    pub fn render(&self) -> String {
        let mut registry = Registry::with_prefix("nfsrdmad");
        registry.register_collector(Box::new(self.clone()));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            .expect("writing to a String does not fail");
        out
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    let c = ConstCounter::new(v);
    c.encode(e.encode_descriptor(name, help, None, c.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

/// A histogram of nanoseconds as one of seconds with [`SECONDS_BUCKETS`].
fn seconds(m: &mut MetricEncoder, hist: &Histogram<u64>) -> std::fmt::Result {
    let mut buckets: Vec<(f64, u64)> = SECONDS_BUCKETS.iter().map(|b| (*b, 0)).collect();
    let mut sum_ns = 0u128;
    for v in hist.iter_recorded() {
        let ns = v.value_iterated_to();
        let n = v.count_at_value();
        sum_ns += u128::from(ns) * u128::from(n);
        let s = ns as f64 / 1e9;
        if let Some(b) = buckets.iter_mut().find(|(le, _)| s <= *le) {
            b.1 += n;
        }
    }
    m.encode_histogram::<NoLabelSet>(sum_ns as f64 / 1e9, hist.len(), &buckets, None)
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

/// One family with a value per label: (label value, value).
fn labelled(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    label: &str,
    values: &[(String, u64)],
) -> std::fmt::Result {
    if values.is_empty() {
        return Ok(());
    }
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (l, v) in values {
        let labels = [(label, l.as_str())];
        let mut f = m.encode_family(&labels)?;
        match kind {
            MetricType::Counter => f.encode_counter::<NoLabelSet, _, u64>(v, None)?,
            _ => f.encode_gauge(v)?,
        }
    }
    Ok(())
}

impl Collector for Sources {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let m = self.service.metrics();
        let called: Vec<NfsProc3> = NfsProc3::ALL
            .iter()
            .copied()
            .filter(|p| m.calls(*p) > 0)
            .collect();
        let per_proc = |f: &dyn Fn(NfsProc3) -> u64| -> Vec<(String, u64)> {
            called
                .iter()
                .map(|p| (p.name().to_string(), f(*p)))
                .collect()
        };
        labelled(
            &mut e,
            "nfs_calls",
            "NFSv3 calls executed, by procedure",
            MetricType::Counter,
            "procedure",
            &per_proc(&|p| m.calls(p)),
        )?;
        labelled(
            &mut e,
            "nfs_errors",
            "NFSv3 calls answered with a status other than NFS3_OK, by procedure",
            MetricType::Counter,
            "procedure",
            &per_proc(&|p| m.errors(p)),
        )?;
        if !called.is_empty() {
            let mut h = e.encode_descriptor(
                "nfs_service_seconds",
                "Time a call spent in the service, from its decoded arguments to its reply, by procedure",
                None,
                MetricType::Histogram,
            )?;
            for p in &called {
                let labels = [("procedure", p.name())];
                seconds(&mut h.encode_family(&labels)?, &m.service_time(*p))?;
            }
        }
        let (compounds, compound_errors) = m.compounds();
        if compounds > 0 {
            counter(
                &mut e,
                "nfs4_compounds",
                "NFSv4 COMPOUNDs executed",
                compounds,
            )?;
            counter(
                &mut e,
                "nfs4_compound_errors",
                "NFSv4 COMPOUNDs answered with a status other than NFS4_OK",
                compound_errors,
            )?;
            let ops = m.operations();
            let per_op = |f: &dyn Fn(&(u32, u64, u64)) -> u64| -> Vec<(String, u64)> {
                ops.iter()
                    .map(|o| (nfsrdma_xdr::nfs4::opnum::name(o.0).to_string(), f(o)))
                    .collect()
            };
            labelled(
                &mut e,
                "nfs4_operations",
                "NFSv4 operations executed, by operation",
                MetricType::Counter,
                "operation",
                &per_op(&|o| o.1),
            )?;
            labelled(
                &mut e,
                "nfs4_operation_errors",
                "NFSv4 operations answered with a status other than NFS4_OK, by operation",
                MetricType::Counter,
                "operation",
                &per_op(&|o| o.2),
            )?;
        }
        let turnarounds = m.turnarounds();
        let (v3, v4): (Vec<_>, Vec<_>) = turnarounds
            .iter()
            .partition(|(_, c, _)| matches!(c.proc_, Procedure::V3(_)));
        const ARRIVAL: &str = "Time from a call's arrival (its receive completion over RDMA, its whole record over TCP) \
             to its reply posted (the reply's Send over RDMA, handed to the connection's writer over TCP)";
        for (name, help, label, set) in [
            (
                "turnaround_seconds",
                format!(
                    "{ARRIVAL}, of NFSv3 and MOUNT calls, by transport, procedure and size class \
                     (READ and WRITE: up to 4k, 16k, 64k, 256k, 1m; others: any)"
                ),
                "procedure",
                v3,
            ),
            (
                "nfs4_turnaround_seconds",
                format!(
                    "{ARRIVAL}, of NFSv4 COMPOUNDs, by transport, main operation (the first that is not \
                     SEQUENCE or a filehandle operation) and size class (READ and WRITE: up to 4k, 16k, 64k, \
                     256k, 1m; others: any)"
                ),
                "operation",
                v4,
            ),
        ] {
            if set.is_empty() {
                continue;
            }
            let mut h = e.encode_descriptor(name, &help, None, MetricType::Histogram)?;
            for (t, c, hist) in set {
                let labels = [
                    ("transport", t.name()),
                    (label, c.proc_.name()),
                    ("size", c.size.name()),
                ];
                seconds(&mut h.encode_family(&labels)?, hist)?;
            }
        }
        counter(
            &mut e,
            "drc_replays",
            "Retransmissions answered from the duplicate request cache",
            m.drc_hits(),
        )?;
        counter(
            &mut e,
            "drc_in_progress_drops",
            "Retransmissions dropped because the original was still executing",
            m.drc_in_progress_drops(),
        )?;
        counter(
            &mut e,
            "garbage_args",
            "Calls answered with GARBAGE_ARGS",
            m.garbage_args(),
        )?;
        counter(
            &mut e,
            "handler_panics",
            "Calls whose handler panicked, answered with SERVERFAULT or SYSTEM_ERR",
            m.handler_panics(),
        )?;
        let cb = self.service.nfs4().callbacks.stats();
        counter(
            &mut e,
            "nfs4_callbacks_sent",
            "Calls sent to NFSv4.1 clients on their backchannels (CB_NULL, CB_COMPOUND)",
            load(&cb.sent),
        )?;
        counter(
            &mut e,
            "nfs4_callbacks_answered",
            "Calls to NFSv4.1 clients answered with RPC success",
            load(&cb.answered),
        )?;
        for (name, help, v) in [
            (
                "nfs4_callbacks_over_rdma_sent",
                "Calls to NFSv4.1 clients sent on RDMA connections (RFC 8167 backward calls)",
                &cb.rdma_sent,
            ),
            (
                "nfs4_callbacks_over_rdma_answered",
                "Calls to NFSv4.1 clients on RDMA connections answered with RPC success",
                &cb.rdma_answered,
            ),
            (
                "nfs4_callbacks_over_rdma_failed",
                "Calls to NFSv4.1 clients on RDMA connections that failed",
                &cb.rdma_failed,
            ),
        ] {
            counter(&mut e, name, help, load(v))?;
        }
        let dl = &self.service.nfs4().delegs;
        for (name, help, v) in [
            (
                "nfs4_delegations_granted_read",
                "NFSv4.1 read delegations granted",
                &dl.granted_read,
            ),
            (
                "nfs4_delegations_granted_write",
                "NFSv4.1 write delegations granted",
                &dl.granted_write,
            ),
            (
                "nfs4_delegations_recalled",
                "NFSv4.1 delegations recalled (CB_RECALL sent)",
                &dl.recalled,
            ),
            (
                "nfs4_delegations_recall_failed",
                "NFSv4.1 recalls that failed (no backchannel, no answer, an error)",
                &dl.recall_failed,
            ),
            (
                "nfs4_delegations_returned",
                "NFSv4.1 delegations returned (DELEGRETURN)",
                &dl.returned,
            ),
            (
                "nfs4_delegations_revoked",
                "NFSv4.1 delegations revoked: their recall went unanswered for a lease",
                &dl.revoked,
            ),
            (
                "nfs4_delegations_granted_over_rdma",
                "NFSv4.1 delegations granted to sessions whose backchannel is on an RDMA connection",
                &dl.granted_over_rdma,
            ),
            (
                "nfs4_delegations_recalled_over_rdma",
                "NFSv4.1 recalls of delegations granted over RDMA",
                &dl.recalled_over_rdma,
            ),
            (
                "nfs4_delegations_returned_over_rdma",
                "NFSv4.1 delegations granted over RDMA and returned",
                &dl.returned_over_rdma,
            ),
            (
                "nfs4_delegations_revoked_over_rdma",
                "NFSv4.1 delegations granted over RDMA and revoked",
                &dl.revoked_over_rdma,
            ),
            (
                "nfs4_delegations_getattr_asked",
                "CB_GETATTRs sent to write delegation holders for another client's GETATTR",
                &dl.getattr_asked,
            ),
            (
                "nfs4_delegations_getattr_changed",
                "CB_GETATTR answers that said the holder changed the file",
                &dl.getattr_changed,
            ),
            (
                "nfs4_delegations_getattr_failed",
                "CB_GETATTRs that failed (the delegation is recalled then)",
                &dl.getattr_failed,
            ),
        ] {
            counter(&mut e, name, help, load(v))?;
        }
        counter(
            &mut e,
            "nfs4_callbacks_failed",
            "Calls to NFSv4.1 clients that failed: no backchannel connection, no reply in time, an RPC error",
            load(&cb.failed),
        )?;
        counter(
            &mut e,
            "nfs4_callback_panics",
            "Panics while making a call to an NFSv4.1 client or handing its result back (a bug; the call failed)",
            load(&cb.panicked),
        )?;

        if let Some(t) = &self.tcp {
            counter(
                &mut e,
                "tcp_connections",
                "TCP connections accepted",
                load(&t.accepted),
            )?;
            gauge(
                &mut e,
                "tcp_connections_open",
                "TCP connections open",
                load(&t.open) as i64,
            )?;
            counter(
                &mut e,
                "tcp_records",
                "RPC records received over TCP",
                load(&t.records),
            )?;
            counter(
                &mut e,
                "tcp_refused_records",
                "TCP connections closed for a record too large or malformed",
                load(&t.refused_records),
            )?;
            counter(
                &mut e,
                "tcp_refused_connections",
                "TCP connections accepted and closed at once because --max-connections were open",
                load(&t.refused_connections),
            )?;
            counter(
                &mut e,
                "tcp_closed_idle",
                "TCP connections closed because no record completed for the idle timeout",
                load(&t.closed_idle),
            )?;
            counter(
                &mut e,
                "tcp_closed_unread",
                "TCP connections closed because the client took none of their replies for the idle timeout",
                load(&t.closed_unread),
            )?;
            counter(
                &mut e,
                "tcp_reader_pauses",
                "Times a TCP connection's reader paused because its calls in flight held its budget",
                load(&t.reader_pauses),
            )?;
        }

        if let Some(r) = &self.rdma {
            gauge(
                &mut e,
                "rdma_connections_open",
                "RPC-over-RDMA connections open",
                load(&r.open) as i64,
            )?;
            gauge(
                &mut e,
                "rdma_credits_granted",
                "The last credit grant sent",
                load(&r.credits_granted) as i64,
            )?;
            gauge(
                &mut e,
                "rdma_receives_held_peak",
                "The most receive buffers one connection's messages held at once",
                load(&r.receives_held_peak) as i64,
            )?;
            gauge(
                &mut e,
                "rdma_shared_receive_buffers",
                "Receive buffers of the pool threads' shared receive queues (0: none, each connection has its own)",
                load(&r.shared_receive_buffers) as i64,
            )?;
            gauge(
                &mut e,
                "rdma_shared_receives_posted",
                "Buffers of the shared receive queues posted now",
                load(&r.shared_receives_posted) as i64,
            )?;
            gauge(
                &mut e,
                "rdma_shared_receives_taken_peak",
                "The most buffers of one pool thread's shared receive queue taken at once",
                load(&r.shared_receives_taken_peak) as i64,
            )?;
            for (name, help, a) in [
                (
                    "rdma_connections",
                    "RPC-over-RDMA connections accepted",
                    &r.connections,
                ),
                ("rdma_calls", "Calls received over RPC-over-RDMA", &r.calls),
                (
                    "rdma_inline_calls",
                    "Calls that arrived entirely inline",
                    &r.inline_calls,
                ),
                (
                    "rdma_chunked_calls",
                    "Calls with Read chunks",
                    &r.chunked_calls,
                ),
                (
                    "rdma_inline_replies",
                    "Replies sent inline",
                    &r.inline_replies,
                ),
                (
                    "rdma_reply_chunk_replies",
                    "Replies sent through the Reply chunk",
                    &r.reply_chunk_replies,
                ),
                ("rdma_read_bytes", "Bytes moved by RDMA Read", &r.read_bytes),
                (
                    "rdma_write_bytes",
                    "Bytes moved by RDMA Write",
                    &r.write_bytes,
                ),
                ("rdma_sends", "Plain Sends", &r.sends),
                (
                    "rdma_sends_with_invalidate",
                    "Sends With Invalidate (RFC 8797)",
                    &r.sends_with_inv,
                ),
                (
                    "rdma_unsignaled_sends",
                    "Reply Sends posted without asking for a completion",
                    &r.unsignaled_sends,
                ),
                ("rdma_err_vers", "RDMA_ERROR ERR_VERS sent", &r.err_vers),
                ("rdma_err_chunk", "RDMA_ERROR ERR_CHUNK sent", &r.err_chunk),
                (
                    "rdma_discarded",
                    "Messages dropped without a reply",
                    &r.discarded,
                ),
                (
                    "rdma_payload_copied_bytes",
                    "Payload bytes copied between chunk buffers and the store",
                    &r.payload_copies,
                ),
                (
                    "rdma_arena_waits",
                    "Calls whose Read chunks waited for arena memory to land in",
                    &r.arena_waits,
                ),
                (
                    "rdma_arena_refusals",
                    "Calls refused (ERR_CHUNK) for want of arena memory",
                    &r.arena_exhausted,
                ),
                (
                    "rdma_connection_errors",
                    "Connections ended by an error",
                    &r.errors,
                ),
                (
                    "rdma_refused_connections",
                    "Connect requests rejected over the connection cap",
                    &r.refused_connections,
                ),
                (
                    "rdma_peer_not_receiving",
                    "Connections closed when a Send found no receive at the peer through its RNR retries",
                    &r.peer_not_receiving,
                ),
                (
                    "rdma_polled_calls",
                    "Calls found by a pool thread that was polling",
                    &r.polled_calls,
                ),
                (
                    "rdma_woken_calls",
                    "Calls found by a pool thread woken from the completion channel",
                    &r.woken_calls,
                ),
                (
                    "rdma_idle_wakeups",
                    "Sleeps of a pool thread that ended by their time limit with nothing to do",
                    &r.idle_wakeups,
                ),
                (
                    "rdma_long_calls",
                    "Calls that may run long (COPY, CLONE, ALLOCATE, DEALLOCATE) run off the pool threads",
                    &r.long_calls,
                ),
            ] {
                counter(&mut e, name, help, load(a))?;
            }
        }

        let mut used = Vec::new();
        let mut capacity = Vec::new();
        let mut files = Vec::new();
        let mut max_files = Vec::new();
        let mut copied = Vec::new();
        let mut adopted = Vec::new();
        let mut null_zeros = Vec::new();
        let mut null_discarded = Vec::new();
        for x in self.service.exports() {
            let fs = x.store.read();
            let (total, free, inodes, free_inodes) = fs.fsstat();
            let (c, a) = fs.write_stats();
            let p = x.path.clone();
            used.push((p.clone(), total - free));
            capacity.push((p.clone(), total));
            files.push((p.clone(), inodes - free_inodes));
            max_files.push((p.clone(), inodes));
            copied.push((p.clone(), c));
            adopted.push((p.clone(), a));
            if fs.config().null {
                let (z, d) = fs.null_stats();
                null_zeros.push((p.clone(), z));
                null_discarded.push((p, d));
            }
        }
        use MetricType::{Counter as C, Gauge as G};
        labelled(
            &mut e,
            "store_used_bytes",
            "Bytes of block memory the export's files hold",
            G,
            "export",
            &used,
        )?;
        labelled(
            &mut e,
            "store_capacity_bytes",
            "Bytes of file data the export may hold",
            G,
            "export",
            &capacity,
        )?;
        labelled(
            &mut e,
            "store_files",
            "Files, directories, links and nodes in the export",
            G,
            "export",
            &files,
        )?;
        labelled(
            &mut e,
            "store_max_files",
            "Files the export may hold",
            G,
            "export",
            &max_files,
        )?;
        labelled(
            &mut e,
            "store_write_copied_bytes",
            "WRITE bytes copied into file blocks",
            C,
            "export",
            &copied,
        )?;
        labelled(
            &mut e,
            "store_write_adopted_bytes",
            "WRITE bytes whose landing blocks became file blocks without a copy",
            C,
            "export",
            &adopted,
        )?;
        labelled(
            &mut e,
            "null_read_bytes",
            "A null export's READ bytes answered with zeros",
            C,
            "export",
            &null_zeros,
        )?;
        labelled(
            &mut e,
            "null_discarded_bytes",
            "A null export's WRITE bytes discarded",
            C,
            "export",
            &null_discarded,
        )?;
        Ok(())
    }
}
