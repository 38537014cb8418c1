//! Serving RPC over TCP with record marking.
//!
//! Each connection has a reader that reassembles records and starts one task
//! per call, and a writer that sends replies as they complete (out of order
//! when calls finish out of order), gathering whatever replies are ready
//! into one `writev`. Calls executing at once are bounded for the whole
//! server (the worker pool); per connection, the calls whose replies are not
//! yet written are bounded in number and in bytes (see [`TcpConfig`]): a
//! call holds its share until the writer has written its reply, and the
//! reader takes no further call from a connection over its share, so a
//! client that sends calls and never reads the replies stops being read
//! instead of growing the server's memory. A record larger than the maximum
//! closes that connection only, and a record's buffer grows as its bytes
//! arrive, not at its claimed length. A connection on which no record
//! completes, or whose replies go unread, for the idle timeout is closed;
//! beyond the connection cap, new connections are accepted and closed at
//! once.

use crate::service::metrics::Transport;
use crate::service::nfs4::callback::BackConn;
use crate::service::{CallContext, Service};
use bytes::{Buf, Bytes};
use nfsrdma_xdr::record::{marker, RecordReader};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};

/// Bytes the reader makes room for at a time (it reads at most this much
/// ahead of what a connection's records need).
pub const READ_CHUNK: usize = 64 * 1024;
/// Bytes a call is charged for its reply before it runs when its reply
/// cannot be large (every NFSv3 procedure but READ, READLINK, READDIR and
/// READDIRPLUS; MOUNT but DUMP and EXPORT; NLM; NSM; anything refused).
pub const SMALL_REPLY: usize = 4096;
/// Bytes a reply waiting for the writer is charged beyond its own: its
/// record marker and bookkeeping.
pub const REPLY_OVERHEAD: usize = 256;
/// Bytes of a connection's own state (tasks, channel, counters), beyond its
/// buffers.
pub const CONNECTION_OVERHEAD: usize = 16 * 1024;
/// Descriptors kept for everything but TCP connections when the connection
/// cap is derived from the open-file limit.
pub const FD_RESERVE: usize = 64;
/// When the daemon is stopping, a connection whose writer makes no progress
/// for this long is closed with its replies unsent.
const SHUTDOWN_STALL: Duration = Duration::from_secs(5);
/// The least time between two log lines about refused connections.
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// TCP listener settings.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Largest record accepted; a bigger one closes the connection.
    pub max_record: usize,
    /// Calls executing at once across all connections.
    pub workers: usize,
    /// Calls in flight on one connection: from the reader taking the call
    /// until the writer has written its reply.
    pub per_connection: usize,
    /// Bytes one connection's calls in flight may hold: their requests
    /// until they have run, their replies until written. A call is charged
    /// its request's length and the most its reply may be ([`SMALL_REPLY`]
    /// or `max_reply`) before it starts, the reply's real size once it is
    /// made, and nothing once written. The reader takes no new call while
    /// the connection's charge would go past this (a call on a connection
    /// with nothing in flight always starts).
    pub call_budget: usize,
    /// The most one reply may be, charged before the call runs to a call
    /// whose reply may be large (NFSv4 COMPOUND, NFSv3 READ, READLINK,
    /// READDIR, READDIRPLUS, MOUNT DUMP and EXPORT). A reply that turns out
    /// larger is charged its real size.
    pub max_reply: usize,
    /// A connection on which no record completes for this long while it has
    /// no call in flight (silent, or dribbling a record that never
    /// completes), or whose writer cannot write any of its replies for this
    /// long, is closed. `None`: never.
    pub idle_timeout: Option<Duration>,
    /// Connections served at once; further ones are accepted and closed at
    /// once (counted in [`TcpStats::refused_connections`]).
    pub max_connections: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_record: (1 << 20) + 64 * 1024,
            workers: 64,
            per_connection: 64,
            call_budget: 16 << 20,
            max_reply: (1 << 20) + 16 * 1024,
            idle_timeout: Some(Duration::from_secs(360)),
            max_connections: default_max_connections(),
        }
    }
}

impl TcpConfig {
    /// The most memory one connection may hold: its receive buffer (a
    /// record being assembled grows with the bytes received, at most
    /// doubling its allocation, plus [`READ_CHUNK`]), its calls in flight
    /// (`call_budget`, or one call's request and largest reply when that
    /// is more) and its own state.
    pub fn memory_per_connection(&self) -> usize {
        let receive = 2 * (self.max_record + READ_CHUNK);
        let one_call = self.max_record + self.max_reply + REPLY_OVERHEAD;
        receive + self.call_budget.max(one_call) + CONNECTION_OVERHEAD
    }

    /// The most memory the TCP front end may hold: every connection at its
    /// most, and the requests of the calls executing (each may keep a
    /// receive buffer it was cut from alive until it has run).
    pub fn memory_total(&self) -> usize {
        let per_call = 2 * (self.max_record + READ_CHUNK);
        self.memory_per_connection()
            .saturating_mul(self.max_connections.max(1))
            .saturating_add(per_call.saturating_mul(self.workers.max(1)))
    }
}

/// The default connection cap: the process's open-file limit (its soft
/// `RLIMIT_NOFILE`, read from `/proc/self/limits`) less [`FD_RESERVE`]
/// descriptors for everything else, at least 16; 1024 less the reserve when
/// the limit cannot be read, 65536 when it is unlimited.
pub fn default_max_connections() -> usize {
    let soft = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("Max open files"))?;
            let soft = line
                .trim_start_matches("Max open files")
                .split_whitespace()
                .next()?;
            Some(if soft == "unlimited" {
                65536 + FD_RESERVE
            } else {
                soft.parse::<usize>().ok()?
            })
        })
        .unwrap_or(1024);
    soft.saturating_sub(FD_RESERVE).max(16)
}

/// Counters of the TCP listener.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Connections accepted and served.
    pub accepted: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections accepted and closed at once because `max_connections`
    /// were open.
    pub refused_connections: AtomicU64,
    /// Connections closed because no record completed for the idle timeout.
    pub closed_idle: AtomicU64,
    /// Connections closed because none of their replies could be written
    /// for the idle timeout (the client does not read them).
    pub closed_unread: AtomicU64,
    /// Times a connection's reader paused because the connection's calls
    /// in flight held its whole call budget (or all its call slots).
    pub reader_pauses: AtomicU64,
    /// Connections closed because a record was too large or malformed.
    pub refused_records: AtomicU64,
    /// Records received.
    pub records: AtomicU64,
}

impl TcpStats {
    /// The counters as the daemon prints them: one line.
    pub fn report(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "tcp: connections {} (open {}, refused over --max-connections {}, closed idle {}, \
             closed with replies unread {}), records {} (refused {}), reader pauses for unsent replies {}\n",
            g(&self.accepted),
            g(&self.open),
            g(&self.refused_connections),
            g(&self.closed_idle),
            g(&self.closed_unread),
            g(&self.records),
            g(&self.refused_records),
            g(&self.reader_pauses),
        )
    }
}

/// A running TCP front end.
pub struct TcpServer {
    service: Arc<Service>,
    config: TcpConfig,
    workers: Arc<Semaphore>,
    stats: Arc<TcpStats>,
}

impl TcpServer {
    /// A front end for `service`.
    pub fn new(service: Arc<Service>, config: TcpConfig) -> TcpServer {
        TcpServer {
            workers: Arc::new(Semaphore::new(config.workers.max(1))),
            service,
            config,
            stats: Arc::new(TcpStats::default()),
        }
    }

    /// The listener's counters.
    pub fn stats(&self) -> Arc<TcpStats> {
        self.stats.clone()
    }

    /// Accepts connections until `shutdown` turns true, then waits for the
    /// calls in flight to finish.
    pub async fn serve(&self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
        let mut conns = tokio::task::JoinSet::new();
        let max = self.config.max_connections.max(1);
        // Refusals since the last line about them, and when that was.
        let mut refused_unlogged = 0u64;
        let mut last_refusal_log: Option<Instant> = None;
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((stream, peer)) => {
                        while conns.try_join_next().is_some() {}
                        if conns.len() >= max {
                            // Accepted and closed at once: the client sees
                            // the connection end before any reply.
                            drop(stream);
                            self.stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                            refused_unlogged += 1;
                            if last_refusal_log.is_none_or(|t| t.elapsed() >= REFUSAL_LOG_EVERY) {
                                tracing::warn!(
                                    peer = %peer,
                                    open = conns.len(),
                                    max_connections = max,
                                    refused = refused_unlogged,
                                    "TCP connection refused: --max-connections are open (refused counts those since the last such line; one line per 10 s at most)"
                                );
                                refused_unlogged = 0;
                                last_refusal_log = Some(Instant::now());
                            }
                            continue;
                        }
                        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        let conn = Connection {
                            service: self.service.clone(),
                            config: self.config.clone(),
                            workers: self.workers.clone(),
                            stats: self.stats.clone(),
                            peer,
                        };
                        let sd = shutdown.clone();
                        conns.spawn(async move { conn.run(stream, sd).await });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = shutdown.changed() => break,
            }
        }
        // Each connection stops reading, sends the replies of its calls in
        // flight, and closes.
        while conns.join_next().await.is_some() {}
        let n = self.config.workers.max(1) as u32;
        let _all = self.workers.acquire_many(n).await;
    }
}

/// What one connection's calls in flight hold, shared by its reader, its
/// calls and its writer.
struct Flow {
    /// Bytes charged to calls in flight (see [`TcpConfig::call_budget`]).
    held: AtomicUsize,
    /// Calls started and not yet answered (their reply made or dropped).
    running: AtomicUsize,
    /// Bumped whenever the writer writes or a call finishes.
    progress: AtomicU64,
    /// The writer has stopped (the connection is broken or closed).
    closed: AtomicBool,
    /// Wakes the reader when charge is released or the writer stops.
    wake: Notify,
    /// Wakes the reader when the writer stops.
    dead: Notify,
}

impl Flow {
    fn new() -> Flow {
        Flow {
            held: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            progress: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            wake: Notify::new(),
            dead: Notify::new(),
        }
    }

    /// Charges `n` bytes if the budget allows (or nothing is held).
    fn try_charge(&self, n: usize, budget: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |h| {
                (h == 0 || h.saturating_add(n) <= budget).then(|| h.saturating_add(n))
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.held.fetch_sub(n, Ordering::AcqRel);
        self.wake.notify_one();
    }
}

/// A call's task, counted in [`Flow::running`] until it ends, however it
/// ends. A task that unwinds (a bug while making the reply; the handler's
/// own panics are answered by the service) leaves its call unanswered:
/// the connection is closed, so that the client sends the call again on
/// a new one rather than wait for ever.
struct Running(Arc<Flow>);

impl Running {
    fn new(flow: Arc<Flow>) -> Running {
        flow.running.fetch_add(1, Ordering::AcqRel);
        Running(flow)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let flow = &self.0;
        if std::thread::panicking() {
            tracing::error!(
                "a call's task panicked before its reply was queued: closing the connection"
            );
            flow.closed.store(true, Ordering::Release);
            flow.wake.notify_one();
            flow.dead.notify_one();
        }
        flow.running.fetch_sub(1, Ordering::AcqRel);
        flow.progress.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bytes charged to a call; released when dropped.
struct Charge {
    flow: Arc<Flow>,
    bytes: usize,
}

impl Charge {
    /// Changes the charge to `bytes` (more is taken whatever the budget:
    /// the memory is already in use).
    fn set(&mut self, bytes: usize) {
        if bytes > self.bytes {
            self.flow
                .held
                .fetch_add(bytes - self.bytes, Ordering::AcqRel);
            self.bytes = bytes;
        } else if bytes < self.bytes {
            self.flow.release(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.flow.release(self.bytes);
        }
    }
}

/// A reply waiting for the writer, with the call's slot and charge (a
/// call of the server's to the client, on its backchannel, holds neither).
struct Queued {
    parts: Vec<Bytes>,
    _charge: Option<Charge>,
    _slot: Option<OwnedSemaphorePermit>,
}

/// What a call's reply is charged before the call runs: [`SMALL_REPLY`]
/// unless the RPC header names a procedure whose reply may be large.
fn reply_estimate(rec: &[u8], max_reply: usize) -> usize {
    let word = |i: usize| {
        rec.get(i..i + 4)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_be_bytes)
    };
    const CALL: u32 = 0;
    const NFS: u32 = nfsrdma_xdr::nfs3::PROGRAM;
    const MOUNT: u32 = nfsrdma_xdr::mount::PROGRAM;
    let large = match (word(4), word(12), word(16), word(20)) {
        // READLINK, READ, READDIR, READDIRPLUS.
        (Some(CALL), Some(NFS), Some(3), Some(5 | 6 | 16 | 17)) => true,
        // COMPOUND.
        (Some(CALL), Some(NFS), Some(4), Some(1)) => true,
        // DUMP, EXPORT.
        (Some(CALL), Some(MOUNT), _, Some(2 | 5)) => true,
        _ => false,
    };
    if large {
        max_reply.max(SMALL_REPLY)
    } else {
        SMALL_REPLY
    }
}

struct Connection {
    service: Arc<Service>,
    config: TcpConfig,
    workers: Arc<Semaphore>,
    stats: Arc<TcpStats>,
    peer: SocketAddr,
}

/// Why a connection's reader stopped.
enum End {
    /// The peer closed, a read failed, or the writer stopped.
    Peer,
    /// The daemon is stopping.
    Shutdown,
}

impl Connection {
    async fn run(self, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
        let _ = stream.set_nodelay(true);
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer = %self.peer, "connection open");
        // The server's calls to the client (an NFSv4.1 backchannel) go out
        // through the writer too.
        let (cb_tx, cb_rx) = mpsc::unbounded_channel::<Vec<Bytes>>();
        let back = BackConn::new(Transport::Tcp, move |mut parts: Vec<Bytes>| {
            let len: usize = parts.iter().map(Bytes::len).sum();
            parts.insert(0, Bytes::copy_from_slice(&marker(len as u32, true)));
            cb_tx.send(parts).is_ok()
        });
        let ctx = CallContext {
            peer: self.peer,
            local: stream.local_addr().ok(),
            back: Some(back.clone()),
        };
        let (rd, wr) = stream.into_split();
        let slots = self.config.per_connection.max(1);
        // Every queued reply holds one of the connection's slots: the
        // channel never holds more.
        let (tx, rx) = mpsc::channel::<Queued>(slots);
        let flow = Arc::new(Flow::new());
        let mut writer = tokio::spawn(write_replies(
            wr,
            rx,
            cb_rx,
            flow.clone(),
            self.stats.clone(),
            self.peer,
            self.config.idle_timeout,
        ));
        let per_conn = Arc::new(Semaphore::new(slots));
        let budget = self.config.call_budget;
        let mut reader = RecordReader::new(self.config.max_record);
        // The idle clock: restarted by each record completed.
        let mut last_record = Instant::now();
        let end = 'conn: loop {
            // Hand out every complete record before reading more.
            loop {
                if flow.closed.load(Ordering::Acquire) {
                    break 'conn End::Peer;
                }
                match reader.next_record() {
                    Ok(Some(rec)) if is_reply(&rec) => {
                        // The client's answer to a call of ours.
                        last_record = Instant::now();
                        self.stats.records.fetch_add(1, Ordering::Relaxed);
                        if !back.deliver(rec) {
                            tracing::debug!(peer = %self.peer, "a reply to no call waiting: dropped");
                        }
                    }
                    Ok(Some(rec)) => {
                        // The turnaround counts from here: waiting for a
                        // worker is the server's time too.
                        let arrived = Instant::now();
                        last_record = arrived;
                        self.stats.records.fetch_add(1, Ordering::Relaxed);
                        let cost = rec.len() + reply_estimate(&rec, self.config.max_reply);
                        // A slot and the charge: while the connection's
                        // calls in flight hold either, read nothing more.
                        let mut paused = false;
                        let slot = match per_conn.clone().try_acquire_owned() {
                            Ok(p) => p,
                            Err(_) => {
                                paused = true;
                                self.stats.reader_pauses.fetch_add(1, Ordering::Relaxed);
                                tokio::select! {
                                    p = per_conn.clone().acquire_owned() => match p {
                                        Ok(p) => p,
                                        Err(_) => break 'conn End::Peer,
                                    },
                                    _ = flow.dead.notified() => break 'conn End::Peer,
                                    _ = shutdown.changed() => break 'conn End::Shutdown,
                                }
                            }
                        };
                        loop {
                            let woken = flow.wake.notified();
                            tokio::pin!(woken);
                            woken.as_mut().enable();
                            if flow.closed.load(Ordering::Acquire) {
                                break 'conn End::Peer;
                            }
                            if flow.try_charge(cost, budget) {
                                break;
                            }
                            if !paused {
                                paused = true;
                                self.stats.reader_pauses.fetch_add(1, Ordering::Relaxed);
                            }
                            tokio::select! {
                                _ = woken => {}
                                _ = shutdown.changed() => break 'conn End::Shutdown,
                            }
                        }
                        let charge = Charge {
                            flow: flow.clone(),
                            bytes: cost,
                        };
                        if paused {
                            tracing::trace!(peer = %self.peer, "reader resumed");
                        }
                        let Ok(worker) = self.workers.clone().acquire_owned().await else {
                            break 'conn End::Peer;
                        };
                        let service = self.service.clone();
                        let tx = tx.clone();
                        let ctx = ctx.clone();
                        let running = Running::new(flow.clone());
                        tokio::spawn(async move {
                            let mut charge = charge;
                            let reply = service.handle(&ctx, rec);
                            drop(worker);
                            let _running = running;
                            if let Some(reply) = reply {
                                let mut parts = reply.to_parts();
                                let len: usize = parts.iter().map(Bytes::len).sum();
                                parts.insert(0, Bytes::copy_from_slice(&marker(len as u32, true)));
                                // The request is gone; the reply is what
                                // the call holds now.
                                charge.set(len + REPLY_OVERHEAD);
                                let _ = tx
                                    .send(Queued {
                                        parts,
                                        _charge: Some(charge),
                                        _slot: Some(slot),
                                    })
                                    .await;
                                if let Some(c) = reply.class {
                                    service.metrics().record_turnaround(
                                        Transport::Tcp,
                                        c,
                                        arrived.elapsed(),
                                    );
                                }
                            }
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.stats.refused_records.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer = %self.peer, error = %e, "closing connection");
                        break 'conn End::Peer;
                    }
                }
            }
            let idle_deadline = self
                .config
                .idle_timeout
                .map(|t| tokio::time::Instant::from_std(last_record) + t);
            // Room for the bytes is made once they are there: a connection
            // that sends nothing holds no receive buffer.
            tokio::select! {
                r = rd.readable() => {
                    let buf = reader.buffer_mut();
                    if buf.capacity() - buf.len() < 4096 {
                        buf.reserve(READ_CHUNK);
                    }
                    match r.and_then(|()| rd.try_read_buf(buf)) {
                        Ok(0) => break End::Peer,
                        Ok(_) => {}
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                        Err(e) => {
                            tracing::debug!(peer = %self.peer, error = %e, "read failed");
                            break End::Peer;
                        }
                    }
                },
                _ = flow.dead.notified() => break End::Peer,
                _ = sleep_until(idle_deadline) => {
                    if flow.held.load(Ordering::Acquire) > 0
                        || flow.running.load(Ordering::Acquire) > 0
                    {
                        // Calls in flight: the client waits for us, and the
                        // writer watches its own progress.
                        last_record = Instant::now();
                    } else {
                        self.stats.closed_idle.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(
                            peer = %self.peer,
                            seconds = self.config.idle_timeout.unwrap_or_default().as_secs_f64(),
                            partial_record_bytes = reader.buffered(),
                            "closing idle TCP connection: no record completed for the idle timeout"
                        );
                        break End::Peer;
                    }
                }
                _ = shutdown.changed() => break End::Shutdown,
            }
        };
        back.close();
        drop(ctx);
        drop(tx);
        drop(rd);
        // The writer ends once every call of this connection has replied
        // (or the peer stops taking replies for the idle timeout). When the
        // daemon stops, a writer that makes no progress for a few seconds
        // is not waited for.
        let mut stopping = matches!(end, End::Shutdown) || *shutdown.borrow();
        let mut finished = false;
        if !stopping {
            tokio::select! {
                _ = &mut writer => finished = true,
                _ = shutdown.changed() => stopping = true,
            }
        }
        while stopping && !finished {
            let before = flow.progress.load(Ordering::Relaxed);
            match tokio::time::timeout(SHUTDOWN_STALL, &mut writer).await {
                Ok(_) => finished = true,
                Err(_) if flow.progress.load(Ordering::Relaxed) != before => {}
                Err(_) if flow.running.load(Ordering::Acquire) > 0 => {}
                Err(_) => {
                    tracing::info!(peer = %self.peer, "stopping: replies unread, connection closed");
                    writer.abort();
                    let _ = (&mut writer).await;
                    finished = true;
                }
            }
        }
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(peer = %self.peer, "connection closed");
    }
}

/// Sleeps until `deadline`, or forever without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Whether a record is an RPC reply (`msg_type` REPLY), not a call.
fn is_reply(rec: &[u8]) -> bool {
    rec.get(4..8) == Some(&[0, 0, 0, 1])
}

/// Sends replies in completion order, gathering ready ones into one write,
/// and the server's calls to the client. Each reply's slot and charge are
/// released once it is written. It ends when the replies' channel closes.
async fn write_replies(
    mut w: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Queued>,
    mut calls: mpsc::UnboundedReceiver<Vec<Bytes>>,
    flow: Arc<Flow>,
    stats: Arc<TcpStats>,
    peer: SocketAddr,
    stall_limit: Option<Duration>,
) {
    let mut batch: Vec<Queued> = Vec::new();
    loop {
        let first = tokio::select! {
            biased;
            q = rx.recv() => match q {
                Some(q) => q,
                None => break,
            },
            Some(parts) = calls.recv() => Queued {
                parts,
                _charge: None,
                _slot: None,
            },
        };
        batch.push(first);
        let mut n_parts = batch[0].parts.len();
        while n_parts < 256 {
            match rx.try_recv() {
                Ok(more) => {
                    n_parts += more.parts.len();
                    batch.push(more);
                }
                Err(_) => break,
            }
        }
        let parts: Vec<Bytes> = batch
            .iter_mut()
            .flat_map(|q| std::mem::take(&mut q.parts))
            .collect();
        match write_all_parts(&mut w, parts, &flow, stall_limit).await {
            Ok(()) => batch.clear(),
            Err(e) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    stats.closed_unread.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        peer = %peer,
                        seconds = stall_limit.unwrap_or_default().as_secs_f64(),
                        "closing TCP connection: the client took none of its replies for the idle timeout"
                    );
                } else {
                    tracing::debug!(peer = %peer, error = %e, "write failed");
                }
                // The connection is gone: its reader stops, and replies
                // still to come are dropped with the channel.
                flow.closed.store(true, Ordering::Release);
                drop(batch);
                rx.close();
                flow.wake.notify_one();
                flow.dead.notify_one();
                return;
            }
        }
    }
    let _ = w.shutdown().await;
}

async fn write_all_parts(
    w: &mut OwnedWriteHalf,
    mut parts: Vec<Bytes>,
    flow: &Flow,
    stall_limit: Option<Duration>,
) -> std::io::Result<()> {
    let mut i = 0;
    while i < parts.len() {
        let slices: Vec<IoSlice<'_>> = parts[i..]
            .iter()
            .take(64)
            .map(|b| IoSlice::new(b))
            .collect();
        let write = w.write_vectored(&slices);
        let mut n = match stall_limit {
            Some(t) => match tokio::time::timeout(t, write).await {
                Ok(r) => r?,
                Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
            },
            None => write.await?,
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        flow.progress.fetch_add(1, Ordering::Relaxed);
        while n > 0 {
            let l = parts[i].len();
            if n >= l {
                n -= l;
                i += 1;
            } else {
                parts[i].advance(n);
                n = 0;
            }
        }
        while i < parts.len() && parts[i].is_empty() {
            i += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's task that unwinds is no longer counted as running (which
    /// would keep an idle connection open and a stopping daemon waiting
    /// for ever) and closes its connection (its call has no reply); one
    /// that ends normally closes nothing.
    #[tokio::test]
    async fn a_call_task_that_panics_ends_its_count_and_closes_the_connection() {
        let flow = Arc::new(Flow::new());
        let done = Running::new(flow.clone());
        let unwound = Running::new(flow.clone());
        assert_eq!(flow.running.load(Ordering::Acquire), 2);
        drop(done);
        assert_eq!(flow.running.load(Ordering::Acquire), 1);
        assert!(!flow.closed.load(Ordering::Acquire));
        let task = tokio::spawn(async move {
            let _running = unwound;
            panic!("a bug while making a reply");
        });
        assert!(task.await.unwrap_err().is_panic());
        assert_eq!(flow.running.load(Ordering::Acquire), 0);
        assert!(flow.closed.load(Ordering::Acquire));
        // The reader, waiting on `dead`, is woken.
        tokio::time::timeout(Duration::from_secs(10), flow.dead.notified())
            .await
            .expect("the reader woken");
    }
}
