//! RPC-over-RDMA version 1 (RFC 8166) with remote invalidation (RFC 8797):
//! the requester side.
//!
//! The protocol decisions (how a call travels, which chunks its reply
//! needs, the transport header, the meaning of the reply header) come from
//! the sans-IO core `nfsrdma_rpcrdma::requester`; this module
//! carries them out with the verbs layer.
//!
//! # Connection
//! rdma_cm to the server (20049 by default), with our RFC 8797 message in
//! the connect request: 4 KiB inline both ways, and the "Send With
//! Invalidate accepted" flag when remote invalidation is asked for AND the
//! registration strategy is memory windows (per-RPC regions made by
//! `ibv_reg_mr` and the persistent pool cannot be invalidated by the peer;
//! the flag is never offered for them). The server's message in the accept
//! gives its receive size (our send threshold; 1 KiB when absent).
//!
//! # Threads and buffers (per connection)
//! - One protection domain, one completion queue for sends and receives,
//!   one RC queue pair, and one completion thread that polls the CQ and
//!   does everything that follows a completion: matching a reply to its
//!   call, invalidation, copying the reply out, completing the caller's
//!   oneshot, releasing the slot. How completions are waited for
//!   ([`PollMode`]): `event` sleeps on the completion channel; `adaptive`
//!   spins 50 µs after the last completion, then sleeps; `busy` makes a
//!   waiting caller poll the CQ itself on its own thread (one caller at a
//!   time, yielding to the runtime every few dozen empty polls), so that a
//!   reply reaches its caller without a wake-up of another thread, while
//!   the completion thread only backs the callers up (it naps while a
//!   caller polls and sleeps on the channel otherwise). One thread polls
//!   at a time and handles what it finds in queue order.
//! - [`RECV_BUFFERS`] receive buffers of 4 KiB, posted before connecting
//!   and reposted as soon as a receive is copied out; that many credits are
//!   asked for. Credits start at 1 and follow the server's grants (zero is
//!   read as one, capped at what we posted); one credit is kept in reserve
//!   (grant − 1 calls in flight, at least one).
//! - A slot table of [`RECV_BUFFERS`] slots: each slot has a send buffer
//!   (the server's inline receive size) and, for the `mw` and `persistent`
//!   strategies, a chunk area of [`RdmaOptions::max_io`] + 64 KiB bytes
//!   ([`AREA`] by default), pre-registered (Read chunk data, then the
//!   Write chunk, then the Reply chunk): with `mw` a region of its own per
//!   slot, plus spare areas (see below); with `persistent` one pool.
//!
//! # Registration ([`RegStrategy`])
//! - `mw`: each slot's area is a window-only region (MW-bind access only:
//!   its own rkey grants nothing, and no work request names it). Each slot
//!   owns three type-2 windows (Read chunk: remote read; Write chunk and
//!   Reply chunk: remote write); per RPC the needed windows are bound over
//!   the used sub-ranges with BIND_MW work requests posted in the same
//!   chain as, and before, the Send. A call whose chunks do not fit the
//!   slot's area gets a per-RPC region (also MW-bind only) under the same
//!   windows. On Soft-RoCE a window's rkey also reaches the rest of its
//!   region (see the verbs docs): with a region per slot, that is the
//!   slot's own area, which holds nothing but this call's chunks.
//! - `reg-mr`: one region with remote read and write access registered per
//!   RPC, dropped (deregistered, which fences it) when the RPC is done.
//! - `persistent`: the pool is registered once with remote read and write
//!   access and its own rkey goes on the wire. Fastest (no per-RPC work)
//!   and least safe: the server can read and write every slot's area of
//!   the connection at any time, for the connection's whole life.
//!
//! When the device has no type-2 memory windows, `mw` falls back to
//! `reg-mr` with a warning.
//!
//! # Invalidation (fencing)
//! A slot is reused only after all its registrations are fenced:
//! - `mw`: a receive completion flagged "with invalidate" must name one of
//!   the RPC's window rkeys (any other rkey — another RPC's, or unknown —
//!   is a protocol violation: the connection is dropped; so is Send With
//!   Invalidate when we did not offer it); the RPC's other windows get a
//!   signaled LOCAL_INV, and the reply is copied out and handed over only
//!   after those complete.
//! - `reg-mr`: the region is dropped (deregistered) before the reply is
//!   handed over.
//! - A slot is also held until its Send completed.
//! - A caller that gives up (future dropped) leaves its slot held until the
//!   reply arrives and is fenced as above. A call that times out drops the
//!   connection: deallocating the windows and destroying the queue pair,
//!   the regions and the protection domain fences everything the
//!   connection registered (its memory is never reused before that). A
//!   failed work request (a failed invalidation included) drops the
//!   connection too (RFC 8166 §4.4).
//!
//! # Reply data: copied or lent
//! Once a call is fenced, its READ data (Write chunk) and Reply chunk reach
//! the caller as `Bytes`:
//! - from a per-RPC region (`reg-mr`, and `mw` calls too large for a slot),
//!   without a copy: the region is deregistered, which proves no peer and
//!   no work request can reach it any more, and its buffer becomes the
//!   reply's memory ([`MemoryRegion::into_bytes`]). With `mw` the windows
//!   the call bound over it are deallocated and allocated anew first (a
//!   window holds every region it was bound to until then).
//! - `mw`, [`LEND_MIN`] bytes or more: in the slot's own area, without a
//!   copy and without deregistering ([`MemoryRegion::lend`]). The slot
//!   takes a spare area instead, and the windows that were ever bound to
//!   its old one are deallocated and allocated anew, so nothing can reach
//!   the lent area until the caller drops the last `Bytes` over it; it is
//!   a spare again then. [`SPARE_AREAS`] spares are registered with the
//!   connection, more as loans need them, up to one per slot; when none is
//!   left (the caller holds that many replies) the reply is copied.
//! - otherwise by copy: smaller `mw` replies (two window operations cost
//!   more than copying them), and the `persistent` pool, which the server
//!   may write at any time by design.
//!
//! The transport counts the bytes of each kind (`reply_bytes_copied`,
//! `reply_bytes_lent`) and the windows renewed (`window_renewals`).
//!
//! # Timeouts, reconnection, retransmission
//! As for TCP: the first connection is made by [`RdmaTransport::connect`]
//! and fails at once; when a connection breaks, the next call reconnects
//! (with backoff) and every waiting call is sent again with the SAME XID.
//! A transmission that gets no reply within `timeo` drops the connection
//! (an RC connection does not lose messages; as the Linux client does) and
//! is retransmitted on a new one. Soft mode fails a call with
//! [`ClientError::TimedOut`] after `timeo × (retrans + 1)`.
//!
//! A dead connection's verbs objects are destroyed on a thread of their
//! own, windows first (see `Teardown`), so that reconnecting and resending
//! never wait for them.

use super::{reply_results, CallFuture, RpcCall, Transport, TransportKind, TransportStats};
use crate::error::ClientError;
use crate::{PollMode, RdmaOptions, RegStrategy};
use bytes::{Bytes, BytesMut};
use nfsrdma_rpcrdma::requester::{
    self, plan_call, CallPlan, Registrations, Reply, ReplyMessage, RequesterConfig,
};
use nfsrdma_transport::rdma::verbs::{
    Access, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, MemoryWindow, MwAccess, ProtectionDomain, QpCaps, QueuePair, RecvWr, SendFlags,
    SendOp, SendWr, VerbsError, WcOpcode, WorkCompletion,
};
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::rpcrdma::{CmPrivate, RdmaSegment};
use nfsrdma_xdr::{Decoder, Payload, Xdr, XdrSink};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch, Notify};

/// Receive buffers posted, credits asked for, and slots in the table.
pub const RECV_BUFFERS: u32 = 32;
/// Our default inline threshold, both directions (advertised in RFC 8797
/// form); [`RdmaOptions::inline`] overrides it.
pub const INLINE_SIZE: u32 = 4096;
/// The smallest inline threshold RFC 8166 §3.3.3 allows.
pub const MIN_INLINE: u32 = 1024;
/// The largest inline threshold we accept (one receive buffer per credit).
pub const MAX_INLINE: u32 = 1 << 20;
/// Chunk memory of one slot in the pre-registered pool by default: a 1 MiB
/// READ or WRITE payload plus room for the rest of the call or reply.
pub const AREA: usize = (1 << 20) + AREA_EXTRA;
/// Room in a slot's area beyond [`RdmaOptions::max_io`].
const AREA_EXTRA: usize = 64 << 10;
/// Alignment of each chunk within an area.
const ALIGN: usize = 64;
/// `mw`: reply data (Write chunk and Reply chunk) of at least this many
/// bytes is lent to the caller in its slot's area, which the slot trades
/// for a spare; smaller replies are copied (cheaper than the two window
/// operations a loan costs).
const LEND_MIN: usize = 16 << 10;
/// `mw`: spare areas registered when the connection is made; more are
/// registered as loans need them, up to one per slot.
const SPARE_AREAS: usize = 2;

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
const SHORT_LIVED: Duration = Duration::from_secs(5);
/// Address and route resolution limit.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);
/// Work completions taken per poll of the completion queue.
const POLL_BATCH: usize = 64;
/// Busy mode: empty polls by a waiting caller between two yields to the
/// async runtime (which lets timers and other tasks run).
const SPINS_PER_YIELD: u32 = 64;
/// Busy mode: how long the completion thread sleeps at a time while
/// callers poll for themselves.
const BACKSTOP_NAP: Duration = Duration::from_millis(1);

/// Settings of an RDMA transport.
#[derive(Debug, Clone)]
pub struct RdmaTransportOptions {
    /// Registration, remote invalidation and polling.
    pub rdma: RdmaOptions,
    /// How long one transmission waits for its reply before the connection
    /// is dropped and the call sent again on a new one.
    pub timeo: Duration,
    /// Soft mode: retransmissions before giving up.
    pub retrans: u32,
    /// Soft mode: give up after `timeo × (retrans + 1)`.
    pub soft: bool,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
}

impl Default for RdmaTransportOptions {
    fn default() -> Self {
        RdmaTransportOptions {
            rdma: RdmaOptions::default(),
            timeo: Duration::from_secs(60),
            retrans: 2,
            soft: false,
            connect_timeout: Duration::from_secs(30),
        }
    }
}

/// Connects an RPC-over-RDMA transport to `addr`.
pub async fn connect(
    addr: SocketAddr,
    opts: RdmaTransportOptions,
) -> Result<Arc<dyn Transport>, ClientError> {
    Ok(Arc::new(RdmaTransport::connect(addr, opts).await?))
}

/// An RPC client endpoint over RPC-over-RDMA. Dropping it closes the
/// connection.
#[derive(Debug)]
pub struct RdmaTransport {
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Counters {
    connects: AtomicU64,
    retransmits: AtomicU64,
    unmatched: AtomicU64,
    send_with_inv: AtomicU64,
    local_invs: AtomicU64,
    binds: AtomicU64,
    window_renewals: AtomicU64,
    mr_regs: AtomicU64,
    read_chunks: AtomicU64,
    write_chunks: AtomicU64,
    reply_chunks: AtomicU64,
    timed_calls: AtomicU64,
    register_ns: AtomicU64,
    wire_ns: AtomicU64,
    invalidate_ns: AtomicU64,
    copy_out_ns: AtomicU64,
    bytes_copied: AtomicU64,
    bytes_lent: AtomicU64,
    by_caller: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    opts: RdmaTransportOptions,
    next_xid: AtomicU32,
    conn: tokio::sync::Mutex<Option<Arc<Conn>>>,
    closed: watch::Sender<bool>,
    redial: Mutex<(Instant, Duration)>,
    counters: Arc<Counters>,
    conn_ids: AtomicU64,
}

/// Why a call could not be sent.
enum NotSent {
    /// The connection is gone: send on a new one.
    Lost,
    /// The call cannot be sent at all.
    Fatal(ClientError),
}

/// What the completion thread hands a waiting call.
enum Outcome {
    /// The reply message and the data placed in the Write chunk.
    Reply(Bytes, Option<Payload>),
    /// The connection went away before the reply: send again.
    Lost,
    /// The call failed for good.
    Fatal(ClientError),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn rdma_err(what: &str, e: impl std::fmt::Display) -> ClientError {
    ClientError::Rdma(format!("{what}: {e}"))
}

impl RdmaTransport {
    /// Connects to `addr`. Fails at once when the connection cannot be
    /// made; later reconnections follow the hard/soft policy.
    pub async fn connect(
        addr: SocketAddr,
        opts: RdmaTransportOptions,
    ) -> Result<RdmaTransport, ClientError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(20))
            .unwrap_or(0)
            ^ std::process::id().rotate_left(12);
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            addr,
            opts,
            next_xid: AtomicU32::new(seed),
            conn: tokio::sync::Mutex::new(None),
            closed,
            redial: Mutex::new((Instant::now(), MIN_BACKOFF)),
            counters: Arc::new(Counters::default()),
            conn_ids: AtomicU64::new(0),
        });
        let conn = shared.open().await?;
        *shared.conn.lock().await = Some(conn);
        Ok(RdmaTransport { shared })
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The transport's counters.
    pub fn stats(&self) -> TransportStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransportStats {
            connects: g(&c.connects),
            retransmits: g(&c.retransmits),
            unmatched_replies: g(&c.unmatched),
            send_with_invalidate: g(&c.send_with_inv),
            local_invalidations: g(&c.local_invs),
            window_binds: g(&c.binds),
            window_renewals: g(&c.window_renewals),
            mr_registrations: g(&c.mr_regs),
            read_chunk_calls: g(&c.read_chunks),
            write_chunk_calls: g(&c.write_chunks),
            reply_chunk_calls: g(&c.reply_chunks),
            timed_calls: g(&c.timed_calls),
            register_ns: g(&c.register_ns),
            send_to_reply_ns: g(&c.wire_ns),
            invalidate_ns: g(&c.invalidate_ns),
            copy_out_ns: g(&c.copy_out_ns),
            reply_bytes_copied: g(&c.bytes_copied),
            reply_bytes_lent: g(&c.bytes_lent),
            completions_by_caller: g(&c.by_caller),
        }
    }

    async fn do_call(&self, call: RpcCall<'_>) -> Result<Decoder, ClientError> {
        let sh = &self.shared;
        if *sh.closed.borrow() {
            return Err(ClientError::Shutdown);
        }
        let xid = loop {
            let x = sh.next_xid.fetch_add(1, Ordering::Relaxed);
            if x != 0 {
                break x;
            }
        };
        let started = tokio::time::Instant::now();
        let timeo = sh.opts.timeo.max(Duration::from_millis(1));
        let deadline = sh
            .opts
            .soft
            .then(|| started + timeo.saturating_mul(sh.opts.retrans.saturating_add(1)));
        let timed_out = || ClientError::TimedOut {
            what: call.name.to_string(),
            after: started.elapsed(),
        };
        let mut closed = sh.closed.subscribe();
        let mut sends = 0u32;
        loop {
            let conn = sh.connection(deadline).await.map_err(|e| match e {
                ClientError::TimedOut { .. } => timed_out(),
                e => e,
            })?;
            let mut try_end = tokio::time::Instant::now() + timeo;
            if let Some(d) = deadline {
                try_end = try_end.min(d);
            }
            let rx = tokio::select! {
                biased;
                _ = closed.wait_for(|c| *c) => return Err(ClientError::Shutdown),
                r = conn.start_call(xid, &call) => r,
                _ = tokio::time::sleep_until(try_end) => {
                    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        return Err(timed_out());
                    }
                    continue;
                }
            };
            let rx = match rx {
                Ok(rx) => rx,
                Err(NotSent::Lost) => continue,
                Err(NotSent::Fatal(e)) => return Err(e),
            };
            if sends > 0 {
                sh.counters.retransmits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(xid, conn = conn.id, "retransmitted");
            }
            sends += 1;
            let mut rx = rx;
            let busy = conn.poll == PollMode::Busy;
            let outcome = async {
                if busy {
                    conn.wait_busy(&mut rx).await
                } else {
                    (&mut rx).await.ok()
                }
            };
            tokio::select! {
                biased;
                r = outcome => match r {
                    Some(Outcome::Reply(msg, ddp)) => {
                        let d = requester::reply_decoder(msg, ddp);
                        return reply_results(d, call.prog, call.vers, call.proc_);
                    }
                    Some(Outcome::Fatal(e)) => return Err(e),
                    Some(Outcome::Lost) | None => {
                        tracing::debug!(xid, conn = conn.id, "connection lost while waiting");
                    }
                },
                _ = closed.wait_for(|c| *c) => return Err(ClientError::Shutdown),
                _ = tokio::time::sleep_until(try_end) => {
                    // Drop the connection: tearing it down fences this
                    // call's registrations (and every other one).
                    conn.kill("no reply in time");
                    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        return Err(timed_out());
                    }
                    tracing::warn!(xid, conn = conn.id, call = call.name, "no reply in {timeo:?}; reconnecting");
                }
            }
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl Transport for RdmaTransport {
    fn call<'a>(&'a self, call: RpcCall<'a>) -> CallFuture<'a> {
        Box::pin(self.do_call(call))
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn stats(&self) -> TransportStats {
        RdmaTransport::stats(self)
    }

    fn shutdown(&self) {
        self.shared.close();
    }
}

/// Why a connection is closed when its transport is shut down (the one
/// reason that is not a fault).
const SHUT_DOWN: &str = "transport shut down";

impl Shared {
    fn close(&self) {
        self.closed.send_replace(true);
        if let Ok(mut c) = self.conn.try_lock() {
            if let Some(c) = c.take() {
                c.kill(SHUT_DOWN);
            }
        }
    }

    /// The current connection, reconnecting (with backoff) when it broke.
    async fn connection(
        self: &Arc<Self>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Arc<Conn>, ClientError> {
        let work = async {
            let mut slot = self.conn.lock().await;
            if let Some(c) = slot.as_ref().filter(|c| !c.is_dead()) {
                return Ok(c.clone());
            }
            let mut backoff = {
                let mut r = lock(&self.redial);
                if r.0.elapsed() < SHORT_LIVED {
                    let d = r.1;
                    r.1 = (r.1 * 2).min(MAX_BACKOFF);
                    d
                } else {
                    r.1 = MIN_BACKOFF;
                    Duration::ZERO
                }
            };
            if !backoff.is_zero() {
                tracing::debug!(addr = %self.addr, "connection was short-lived; reconnecting in {backoff:?}");
                tokio::time::sleep(backoff).await;
            }
            loop {
                if *self.closed.borrow() {
                    return Err(ClientError::Shutdown);
                }
                match self.open().await {
                    Ok(c) if *self.closed.borrow() => {
                        // Shut down while connecting: `close` could not
                        // reach this connection.
                        c.kill(SHUT_DOWN);
                        return Err(ClientError::Shutdown);
                    }
                    Ok(c) => {
                        tracing::info!(addr = %self.addr, conn = c.id, "RDMA reconnected");
                        *slot = Some(c.clone());
                        return Ok(c);
                    }
                    Err(e) => {
                        backoff = (backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                        tracing::warn!(addr = %self.addr, error = %e, "RDMA reconnect failed; retrying in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout_at(d, work).await.unwrap_or_else(|_| {
                Err(ClientError::TimedOut {
                    what: "connect".into(),
                    after: Duration::ZERO,
                })
            }),
            None => work.await,
        }
    }

    /// Opens a connection (blocking verbs work on a blocking thread) and
    /// starts its completion thread.
    async fn open(self: &Arc<Self>) -> Result<Arc<Conn>, ClientError> {
        let addr = self.addr;
        let rdma = self.opts.rdma;
        let timeout = self.opts.connect_timeout;
        let id = self.conn_ids.fetch_add(1, Ordering::Relaxed) + 1;
        let counters = self.counters.clone();
        let conn =
            tokio::task::spawn_blocking(move || Conn::open(addr, rdma, timeout, id, counters))
                .await
                .map_err(|e| ClientError::Rdma(format!("connecting to {addr}: {e}")))??;
        self.counters.connects.fetch_add(1, Ordering::Relaxed);
        lock(&self.redial).0 = Instant::now();
        let c2 = conn.clone();
        std::thread::Builder::new()
            .name(format!("rdma-cq-{id}"))
            .spawn(move || c2.run())
            .map_err(|e| ClientError::Rdma(format!("starting the completion thread: {e}")))?;
        let c3 = conn.clone();
        if let Err(e) = std::thread::Builder::new()
            .name(format!("rdma-cm-{id}"))
            .spawn(move || c3.watch_cm())
        {
            conn.kill("no connection manager thread");
            return Err(ClientError::Rdma(format!(
                "starting the connection manager thread: {e}"
            )));
        }
        Ok(conn)
    }
}

/// Work request kinds, in the top byte of the work request id.
const WR_RECV: u64 = 1;
const WR_SEND: u64 = 2;
const WR_LINV: u64 = 3;
const WR_BIND: u64 = 4;

fn wr(kind: u64, v: usize) -> u64 {
    (kind << 56) | v as u64
}

/// Windows of a slot, by use.
const W_READ: usize = 0;
const W_WRITE: usize = 1;
const W_REPLY: usize = 2;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// One RPC whose slot is taken.
struct Inflight {
    plan: CallPlan,
    waiter: Option<oneshot::Sender<Outcome>>,
    /// The region holding the chunks (the pool or a per-RPC region).
    mem: Option<Arc<MemoryRegion>>,
    /// Where this RPC's chunk memory starts in `mem`.
    base: usize,
    write_at: usize,
    reply_at: usize,
    /// Window rkeys still valid (to invalidate).
    rkeys: Vec<u32>,
    /// The slot's windows this call bound (bit per window).
    bound: u8,
    send_done: bool,
    reply: Option<Reply>,
    invs_left: u32,
    delivered: bool,
    /// When the slot was taken for this call (marshalling starts).
    started: Instant,
    /// When its Send was posted.
    posted: Instant,
    /// When its reply was handled.
    replied: Option<Instant>,
}

struct State {
    /// Calls allowed in flight (the grant minus the reserve).
    limit: u32,
    in_flight: u32,
    free: Vec<usize>,
    slots: Vec<Option<Inflight>>,
    xids: HashMap<u32, usize>,
}

/// `mw`: what one slot binds windows over.
struct SlotMem {
    /// Read chunk, Write chunk and Reply chunk windows.
    windows: [MemoryWindow; 3],
    /// The slot's chunk area: a window-only region of `Conn::area` bytes.
    area: Arc<MemoryRegion>,
    /// Windows bound to `area` since they were allocated (bit per window).
    on_area: u8,
}

/// One RDMA connection and everything registered for it.
struct Conn {
    id: u64,
    counters: Arc<Counters>,
    /// Bytes of one slot's chunk area in the pool.
    area: usize,
    cfg: RequesterConfig,
    strategy: RegStrategy,
    offered_ri: bool,
    poll: PollMode,
    qp: Arc<QueuePair>,
    cq: Arc<CompletionQueue>,
    channel: Option<Arc<CompletionChannel>>,
    recv_mr: Arc<MemoryRegion>,
    send_mr: Arc<MemoryRegion>,
    send_size: usize,
    /// `persistent`: all slots' areas in one region.
    pool: Option<Arc<MemoryRegion>>,
    /// `mw`: each slot's windows and window-only area.
    slot_mem: Vec<Mutex<SlotMem>>,
    /// `mw`: areas not in use by a slot nor lent out.
    spares: Arc<Mutex<Vec<Arc<MemoryRegion>>>>,
    /// `mw`: areas registered beyond one per slot (spares and loans).
    spare_areas: AtomicU32,
    st: Mutex<State>,
    /// Held by whoever polls the completion queue (so completions are
    /// handled in queue order), with the buffer the completions land in.
    poller: Mutex<Vec<WorkCompletion>>,
    notify: Notify,
    /// A caller polls the completion queue itself (`busy` mode).
    spinning: AtomicBool,
    /// Told when that caller stops polling.
    spinner_gone: Notify,
    dead: AtomicBool,
    cm: Arc<CmId>,
    _pd: Arc<ProtectionDomain>,
    events: Arc<EventChannel>,
    /// Set when the connection is dropped; dropped last of all fields, it
    /// tells the teardown thread that the references above are gone.
    gate: Option<std::sync::mpsc::Sender<()>>,
}

impl Drop for Conn {
    /// The verbs objects are destroyed on a thread of their own: whoever
    /// drops the last reference (often the task that has just reconnected,
    /// on an async worker, holding the connection lock) must not wait for
    /// verbs calls.
    fn drop(&mut self) {
        let t = Teardown {
            id: self.id,
            slot_mem: std::mem::take(&mut self.slot_mem),
            qp: self.qp.clone(),
            slots: std::mem::take(&mut lock(&self.st).slots),
            pool: self.pool.take(),
            regions: [self.recv_mr.clone(), self.send_mr.clone()],
            cq: self.cq.clone(),
            channel: self.channel.take(),
            cm: self.cm.clone(),
            pd: self._pd.clone(),
            events: self.events.clone(),
        };
        let (gate, fields_dropped) = std::sync::mpsc::channel::<()>();
        self.gate = Some(gate);
        // Without a thread the closure, and all it holds, is dropped right
        // here, in the same order.
        if let Err(e) = std::thread::Builder::new()
            .name(format!("rdma-down-{}", self.id))
            .spawn(move || {
                // Ours are the last references once the fields are gone.
                let _ = fields_dropped.recv();
                t.run();
            })
        {
            tracing::warn!(conn = self.id, error = %e, "no teardown thread; releasing in place");
        }
    }
}

/// A teardown that takes longer than this is reported: something still
/// held a reference to one of the connection's objects.
const SLOW_TEARDOWN: Duration = Duration::from_secs(5);

/// What a connection created and registered, in the order it is destroyed
/// (fields drop in declaration order too).
///
/// The memory windows go before the queue pair: a bound type-2 window holds
/// a reference to the queue pair it was bound through until it is
/// invalidated or deallocated, and destroying a queue pair waits for its
/// references. The calls in flight when a connection breaks leave their
/// windows bound; with the queue pair destroyed first, Soft-RoCE (Linux
/// 6.1) waited 50 s for them, then logged a warning and went on. Regions go
/// after the queue pair (its responder may hold one while a peer's RDMA
/// operation is under way).
struct Teardown {
    id: u64,
    slot_mem: Vec<Mutex<SlotMem>>,
    qp: Arc<QueuePair>,
    slots: Vec<Option<Inflight>>,
    pool: Option<Arc<MemoryRegion>>,
    regions: [Arc<MemoryRegion>; 2],
    cq: Arc<CompletionQueue>,
    channel: Option<Arc<CompletionChannel>>,
    cm: Arc<CmId>,
    pd: Arc<ProtectionDomain>,
    events: Arc<EventChannel>,
}

impl Teardown {
    fn run(self) {
        let t0 = Instant::now();
        let Teardown {
            id,
            slot_mem,
            qp,
            slots,
            pool,
            regions,
            cq,
            channel,
            cm,
            pd,
            events,
        } = self;
        let (windows, areas): (Vec<_>, Vec<_>) = slot_mem
            .into_iter()
            .map(|m| {
                let m = m.into_inner().unwrap_or_else(|p| p.into_inner());
                (m.windows, m.area)
            })
            .unzip();
        drop(windows);
        let t1 = Instant::now();
        drop(qp);
        let qp_took = t1.elapsed();
        drop((slots, pool, areas, regions));
        drop((cq, channel));
        drop(cm);
        drop((pd, events));
        let took = t0.elapsed();
        if took > SLOW_TEARDOWN {
            tracing::warn!(conn = id, ?took, queue_pair = ?qp_took, "slow connection teardown");
        } else {
            tracing::debug!(conn = id, ?took, queue_pair = ?qp_took, "connection torn down");
        }
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.id)
            .field("strategy", &self.strategy)
            .field("remote_invalidation", &self.offered_ri)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Sets up and connects (blocking).
    fn open(
        addr: SocketAddr,
        opts: RdmaOptions,
        timeout: Duration,
        id: u64,
        counters: Arc<Counters>,
    ) -> Result<Arc<Conn>, ClientError> {
        if !(MIN_INLINE..=MAX_INLINE).contains(&opts.inline) {
            return Err(ClientError::InvalidArgument(format!(
                "inline threshold {} is outside {MIN_INLINE}..={MAX_INLINE} bytes",
                opts.inline
            )));
        }
        let e = |what: &str| {
            let what = format!("{addr}: {what}");
            move |err: VerbsError| rdma_err(&what, err)
        };
        let events = EventChannel::new().map_err(e("event channel"))?;
        let cm = CmId::new(&events).map_err(e("CM id"))?;
        cm.resolve(addr, RESOLVE_TIMEOUT)
            .map_err(e("resolving the address"))?;
        let ctx = cm.context().map_err(e("device"))?;
        let attrs = ctx.query().map_err(e("querying the device"))?;
        let mut strategy = opts.reg;
        if strategy == RegStrategy::Mw && !attrs.supports_type2_windows() {
            tracing::warn!(device = %ctx.name(), "no type-2 memory windows; registering a memory region per RPC instead");
            strategy = RegStrategy::RegMr;
        }
        let pd = ProtectionDomain::new(&ctx).map_err(e("protection domain"))?;
        let channel = match opts.poll {
            PollMode::Busy => None,
            _ => Some(CompletionChannel::new(&ctx).map_err(e("completion channel"))?),
        };
        let slots = RECV_BUFFERS as usize;
        let sq_depth = (RECV_BUFFERS * 8).min(attrs.max_qp_wr.max(64));
        let cq = CompletionQueue::new(&ctx, sq_depth + RECV_BUFFERS + 16, channel.as_ref())
            .map_err(e("completion queue"))?;
        let qp = cm
            .create_qp(
                &pd,
                &cq,
                &cq,
                QpCaps {
                    max_send_wr: sq_depth,
                    max_recv_wr: RECV_BUFFERS,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
            )
            .map_err(e("queue pair"))?;
        let inline = opts.inline as usize;
        let recv_mr = MemoryRegion::new(&pd, slots * inline, Access::LOCAL)
            .map_err(e("registering receive buffers"))?;
        for i in 0..slots {
            let sge = recv_mr.sge(i * inline, inline).map_err(e("receive"))?;
            qp.post_recv_one(wr(WR_RECV, i), &[sge])
                .map_err(e("posting receives"))?;
        }
        let mut windows: Vec<[MemoryWindow; 3]> = Vec::new();
        if strategy == RegStrategy::Mw {
            let alloc = || -> Result<[MemoryWindow; 3], VerbsError> {
                Ok([
                    MemoryWindow::new(&pd)?,
                    MemoryWindow::new(&pd)?,
                    MemoryWindow::new(&pd)?,
                ])
            };
            for _ in 0..slots {
                match alloc() {
                    Ok(w) => windows.push(w),
                    Err(err) => {
                        tracing::warn!(error = %err, "memory windows unavailable; registering a memory region per RPC instead");
                        windows.clear();
                        strategy = RegStrategy::RegMr;
                        break;
                    }
                }
            }
        }
        let area = align(opts.max_io.clamp(4096, 1 << 20) as usize + AREA_EXTRA);
        let pool = match strategy {
            RegStrategy::Persistent => Some(
                MemoryRegion::new(&pd, slots * area, Access::REMOTE)
                    .map_err(e("registering the chunk pool"))?,
            ),
            RegStrategy::Mw | RegStrategy::RegMr => None,
        };
        // `mw`: a window-only region per slot (a window's rkey then reaches
        // nothing beyond its own slot's area, whatever the device), and a
        // few spares to trade for areas lent out.
        let mut slot_mem = Vec::with_capacity(windows.len());
        for w in windows {
            let area =
                MemoryRegion::new_window_only(&pd, area).map_err(e("registering chunk areas"))?;
            slot_mem.push(Mutex::new(SlotMem {
                windows: w,
                area,
                on_area: 0,
            }));
        }
        let mut spares = Vec::new();
        if strategy == RegStrategy::Mw {
            for _ in 0..SPARE_AREAS {
                spares.push(
                    MemoryRegion::new_window_only(&pd, area)
                        .map_err(e("registering chunk areas"))?,
                );
            }
        }
        // Only windows can be invalidated by the peer; per-RPC regions and
        // the persistent pool must not be (RFC 8797 lets us not offer it).
        let offered_ri = opts.remote_inv && strategy == RegStrategy::Mw;
        let depth = attrs
            .max_qp_rd_atom
            .min(attrs.max_qp_init_rd_atom)
            .clamp(1, 16) as u8;
        let param = ConnParam {
            private_data: CmPrivate {
                remote_invalidation: offered_ri,
                send_size: opts.inline,
                recv_size: opts.inline,
            }
            .encode()
            .to_vec(),
            responder_resources: depth,
            initiator_depth: depth,
            ..ConnParam::default()
        };
        let peer = cm
            .connect_and_wait(&param, timeout)
            .map_err(e("connecting"))?;
        let peer_msg = CmPrivate::from_peer(Some(&peer.private_data));
        let cfg = RequesterConfig {
            inline_send: peer_msg.recv_size.min(opts.inline),
            inline_recv: opts.inline,
        };
        let send_size = cfg.inline_send as usize;
        let send_mr = MemoryRegion::new(&pd, slots * send_size, Access::LOCAL)
            .map_err(e("registering send buffers"))?;
        tracing::info!(
            %addr,
            conn = id,
            inline_send = cfg.inline_send,
            inline_recv = cfg.inline_recv,
            strategy = ?strategy,
            remote_invalidation = offered_ri,
            server_accepts_remote_invalidation = peer_msg.remote_invalidation,
            "RPC-over-RDMA connection up"
        );
        Ok(Arc::new(Conn {
            id,
            counters,
            area,
            cfg,
            strategy,
            offered_ri,
            poll: opts.poll,
            qp,
            cq,
            channel,
            recv_mr,
            send_mr,
            send_size,
            pool,
            slot_mem,
            spare_areas: AtomicU32::new(spares.len() as u32),
            spares: Arc::new(Mutex::new(spares)),
            st: Mutex::new(State {
                limit: 1,
                in_flight: 0,
                free: (0..slots).rev().collect(),
                slots: (0..slots).map(|_| None).collect(),
                xids: HashMap::new(),
            }),
            poller: Mutex::new(Vec::with_capacity(POLL_BATCH)),
            notify: Notify::new(),
            spinning: AtomicBool::new(false),
            spinner_gone: Notify::new(),
            dead: AtomicBool::new(false),
            cm: Arc::new(cm),
            _pd: pd,
            events,
            gate: None,
        }))
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn kill(&self, reason: &str) {
        let mut st = lock(&self.st);
        self.kill_locked(&mut st, reason);
    }

    /// Marks the connection dead and sends every waiting call off to be
    /// retransmitted. The registrations are fenced when the connection's
    /// objects are destroyed (windows, queue pair, regions, PD; see
    /// [`Teardown`]) once the last reference to it is gone.
    fn kill_locked(&self, st: &mut State, reason: &str) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        if reason == SHUT_DOWN {
            // Asked for: nothing went wrong.
            tracing::debug!(conn = self.id, reason, "closing the RDMA connection");
        } else {
            tracing::warn!(conn = self.id, reason, "dropping the RDMA connection");
        }
        for inf in st.slots.iter_mut().flatten() {
            if let Some(w) = inf.waiter.take() {
                let _ = w.send(Outcome::Lost);
            }
        }
        st.xids.clear();
        let _ = self.cm.disconnect();
        self.notify.notify_waiters();
    }

    /// Waits for a free slot within the credit limit.
    async fn acquire(&self) -> Option<usize> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = lock(&self.st);
                if self.is_dead() {
                    return None;
                }
                if st.in_flight < st.limit {
                    if let Some(s) = st.free.pop() {
                        st.in_flight += 1;
                        return Some(s);
                    }
                }
            }
            notified.await;
        }
    }

    fn release(&self, st: &mut State, slot: usize) {
        st.slots[slot] = None;
        st.free.push(slot);
        st.in_flight -= 1;
        self.notify.notify_waiters();
    }

    /// Takes a slot, registers what the call needs and posts the Send.
    /// Returns the receiver of the outcome.
    async fn start_call(
        &self,
        xid: u32,
        call: &RpcCall<'_>,
    ) -> Result<oneshot::Receiver<Outcome>, NotSent> {
        let slot = self.acquire().await.ok_or(NotSent::Lost)?;
        // From here on nothing awaits: the slot is either installed or
        // released before this returns.
        match self.post_call(slot, xid, call) {
            Ok(rx) => Ok(rx),
            Err(o) => {
                let mut st = lock(&self.st);
                if st.slots[slot].is_none() {
                    st.free.push(slot);
                    st.in_flight -= 1;
                    self.notify.notify_waiters();
                }
                Err(o)
            }
        }
    }

    fn post_call(
        &self,
        slot: usize,
        xid: u32,
        call: &RpcCall<'_>,
    ) -> Result<oneshot::Receiver<Outcome>, NotSent> {
        let started = Instant::now();
        let fatal = |e: String| NotSent::Fatal(ClientError::Rdma(format!("{}: {e}", call.name)));
        let msg = RpcMessage::call(xid, call.prog, call.vers, call.proc_, call.cred.clone());
        let encode = |s: &mut dyn XdrSink| {
            msg.encode(s);
            (call.args)(s);
        };
        let expect = requester::ReplyExpect {
            max_len: call.expect.max_len,
            ddp_max: call.expect.ddp_max,
        };
        let plan = plan_call(xid, &self.cfg, expect, &encode);
        let read_len = plan.read.as_ref().map_or(0, |(_, p)| p.len());
        let write_len = plan.write_chunk.unwrap_or(0) as usize;
        let reply_len = plan.reply_chunk.unwrap_or(0) as usize;
        let write_at = align(read_len);
        let reply_at = align(write_at + write_len);
        let total = reply_at + reply_len;
        if (plan.read.is_some() && read_len == 0)
            || plan.write_chunk == Some(0)
            || plan.reply_chunk == Some(0)
        {
            return Err(fatal("empty chunk planned".into()));
        }

        // Memory for the chunks.
        let (mem, base) = if total == 0 {
            (None, 0)
        } else {
            let per_rpc_access = match self.strategy {
                RegStrategy::Mw => Access::MW_BIND,
                _ => Access::REMOTE,
            };
            match (&self.pool, self.strategy) {
                (Some(pool), RegStrategy::Persistent) if total <= self.area => {
                    (Some(pool.clone()), slot * self.area)
                }
                (_, RegStrategy::Mw) if total <= self.area => {
                    let area = self
                        .slot_mem
                        .get(slot)
                        .map(|m| lock(m).area.clone())
                        .ok_or_else(|| fatal("slot without chunk area".into()))?;
                    (Some(area), 0)
                }
                _ => {
                    let mr = MemoryRegion::new(self.qp.pd(), total, per_rpc_access)
                        .map_err(|e| fatal(format!("registering {total} bytes: {e}")))?;
                    self.counters.mr_regs.fetch_add(1, Ordering::Relaxed);
                    (Some(mr), 0)
                }
            }
        };
        let mut regs = Registrations::default();
        let mut binds: Vec<(usize, usize, usize, MwAccess)> = Vec::new();
        let mut rkeys = Vec::new();
        // The slot's windows, held until the call is posted (nothing else
        // touches them while the slot is taken; the lock is per slot).
        let mut sm = self.slot_mem.get(slot).map(|m| lock(m));
        if let Some(mem) = &mem {
            if let Some((_, data)) = &plan.read {
                let mut at = base;
                for p in data.parts() {
                    mem.write_at(at, p)
                        .map_err(|e| fatal(format!("copying call data: {e}")))?;
                    at += p.len();
                }
            }
            let mut seg = |at: usize, len: usize, w: usize, access: MwAccess| {
                let handle = if let Some(sm) = sm.as_ref() {
                    let rkey = nfsrdma_transport::rdma::verbs::next_rkey(sm.windows[w].rkey());
                    binds.push((w, base + at, len, access));
                    rkeys.push(rkey);
                    rkey
                } else {
                    mem.rkey()
                };
                RdmaSegment {
                    handle,
                    length: len as u32,
                    offset: mem.addr() + (base + at) as u64,
                }
            };
            if plan.read.is_some() {
                regs.read.push(seg(0, read_len, W_READ, MwAccess::READ));
            }
            if plan.write_chunk.is_some() {
                regs.write
                    .push(seg(write_at, write_len, W_WRITE, MwAccess::WRITE));
            }
            if plan.reply_chunk.is_some() {
                regs.reply
                    .push(seg(reply_at, reply_len, W_REPLY, MwAccess::WRITE));
            }
        }
        let header = plan.header(RECV_BUFFERS, &regs);
        for (used, n) in [
            (plan.read.is_some(), &self.counters.read_chunks),
            (plan.write_chunk.is_some(), &self.counters.write_chunks),
            (plan.reply_chunk.is_some(), &self.counters.reply_chunks),
        ] {
            if used {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
        let len = header.len() + plan.inline.iter().map(Bytes::len).sum::<usize>();
        if len > self.send_size {
            return Err(fatal(format!(
                "a call of {len} bytes exceeds the inline threshold {}",
                self.send_size
            )));
        }
        let mut buf = BytesMut::with_capacity(len);
        buf.extend_from_slice(&header);
        for p in &plan.inline {
            buf.extend_from_slice(p);
        }
        let off = slot * self.send_size;
        self.send_mr
            .write_at(off, &buf)
            .map_err(|e| fatal(format!("send buffer: {e}")))?;

        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.st);
        if self.is_dead() {
            return Err(NotSent::Lost);
        }
        let bound = binds.iter().fold(0u8, |m, (w, ..)| m | 1 << w);
        st.slots[slot] = Some(Inflight {
            plan,
            waiter: Some(tx),
            mem: mem.clone(),
            base,
            write_at,
            reply_at,
            rkeys,
            bound,
            send_done: false,
            reply: None,
            invs_left: 0,
            delivered: false,
            started,
            posted: started,
            replied: None,
        });
        st.xids.insert(xid, slot);
        let sge = match self.send_mr.sge(off, len) {
            Ok(s) => s,
            Err(e) => {
                self.kill_locked(&mut st, &format!("send buffer: {e}"));
                return Ok(rx);
            }
        };
        let sges = [sge];
        let mut wrs = Vec::with_capacity(binds.len() + 1);
        if let (Some(mem), Some(sm)) = (&mem, sm.as_deref()) {
            for (w, offset, len, access) in &binds {
                wrs.push(SendWr {
                    wr_id: wr(WR_BIND, slot),
                    op: SendOp::BindMw {
                        mw: &sm.windows[*w],
                        mr: mem,
                        offset: *offset,
                        len: *len,
                        access: *access,
                    },
                    flags: SendFlags::UNSIGNALED,
                });
            }
        }
        wrs.push(SendWr {
            wr_id: wr(WR_SEND, slot),
            op: SendOp::Send { sges: &sges },
            flags: SendFlags::SIGNALED,
        });
        if let Some(inf) = st.slots[slot].as_mut() {
            inf.posted = Instant::now();
        }
        if let Err(e) = self.qp.post_send(&wrs) {
            self.kill_locked(&mut st, &format!("posting the call: {e}"));
            return Ok(rx);
        }
        self.counters
            .binds
            .fetch_add(binds.len() as u64, Ordering::Relaxed);

        // Our reference to the chunk memory goes before the slot table is
        // unlocked: once it is, the reply may be handled at once, and a
        // per-RPC region is handed over without a copy only when the call
        // is its sole holder.
        drop(wrs);
        if let (Some(sm), Some(mem)) = (sm.as_mut(), &mem) {
            if Arc::ptr_eq(&sm.area, mem) {
                sm.on_area |= bound;
            }
        }
        drop(sm);
        drop(mem);
        drop(st);
        Ok(rx)
    }

    /// Watches the connection manager: a disconnect by the server (or the
    /// device going away) drops the connection at once, instead of when a
    /// call times out.
    fn watch_cm(self: Arc<Self>) {
        while !self.is_dead() {
            match self.events.get_event(Some(Duration::from_millis(200))) {
                Ok(ev) => match ev.kind {
                    CmEventKind::Disconnected
                    | CmEventKind::DeviceRemoval
                    | CmEventKind::AddrChange
                    | CmEventKind::ConnectError
                    | CmEventKind::Unreachable => {
                        self.kill(&format!("connection manager event {:?}", ev.kind));
                    }
                    _ => {}
                },
                Err(VerbsError::Timeout { .. }) => {}
                Err(e) => {
                    self.kill(&format!("connection manager: {e}"));
                }
            }
        }
    }

    /// Polls the completion queue once and handles what it returns. The
    /// caller holds `poller` (one poller at a time: completions are handled
    /// in the order the queue gives them); the state is locked only when
    /// there is something to handle, so that a caller spinning on an empty
    /// queue does not keep others from posting. Returns how many were
    /// handled, or `None` when polling failed (the connection is then
    /// dead).
    fn poll_once(&self, wcs: &mut Vec<WorkCompletion>) -> Option<usize> {
        wcs.clear();
        if let Err(e) = self.cq.poll(wcs, POLL_BATCH) {
            self.kill(&format!("polling the completion queue: {e}"));
            return None;
        }
        let n = wcs.len();
        if n > 0 {
            let mut st = lock(&self.st);
            for wc in wcs.drain(..) {
                if self.is_dead() {
                    break;
                }
                if let Err(reason) = self.completion(&mut st, &wc) {
                    self.kill_locked(&mut st, &reason);
                }
            }
        }
        Some(n)
    }

    /// One poll by a waiting caller (`busy` mode). False when nothing was
    /// handled (the queue was empty, or another thread is polling).
    fn poll_inline(&self) -> bool {
        let Ok(mut wcs) = self.poller.try_lock() else {
            return false;
        };
        let n = self.poll_once(&mut wcs).unwrap_or(0);
        self.counters
            .by_caller
            .fetch_add(n as u64, Ordering::Relaxed);
        n > 0
    }

    /// Busy mode: waits for the outcome by polling the completion queue on
    /// the caller's own thread, so the reply needs no hand-off between
    /// threads. One caller polls at a time (the others' replies reach them
    /// through their oneshots, and one of them takes over when it leaves):
    /// more spinning threads would only take CPU from everything else.
    /// `None` when the outcome's sender is gone.
    async fn wait_busy(&self, rx: &mut oneshot::Receiver<Outcome>) -> Option<Outcome> {
        struct Spinning<'a>(&'a Conn);
        impl Drop for Spinning<'_> {
            fn drop(&mut self) {
                self.0.spinning.store(false, Ordering::Release);
                self.0.spinner_gone.notify_one();
            }
        }
        loop {
            if self
                .spinning
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                // Another caller polls; `notify_one` keeps a permit, so
                // leaving between the check and here is not missed.
                tokio::select! {
                    biased;
                    r = &mut *rx => return r.ok(),
                    _ = self.spinner_gone.notified() => continue,
                }
            }
            let _spinning = Spinning(self);
            let mut idle = 0u32;
            loop {
                match rx.try_recv() {
                    Ok(o) => return Some(o),
                    Err(oneshot::error::TryRecvError::Closed) => return None,
                    Err(oneshot::error::TryRecvError::Empty) => {}
                }
                if self.poll_inline() {
                    continue;
                }
                idle += 1;
                if idle.is_multiple_of(SPINS_PER_YIELD) {
                    tokio::task::yield_now().await;
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// The completion thread. In `busy` mode it is the backstop for
    /// completions no caller is waiting for (it naps while a caller polls
    /// and spins otherwise); in
    /// `event` mode it sleeps on the channel whenever the queue is empty;
    /// in `adaptive` mode it spins 50 µs after the last completion first.
    fn run(self: Arc<Self>) {
        let mut last_work = Instant::now();
        let spin = Duration::from_micros(50);
        while !self.is_dead() {
            let Some(n) = self.poll_once(&mut lock(&self.poller)) else {
                break;
            };
            if n > 0 {
                last_work = Instant::now();
                continue;
            }
            let sleep = match self.poll {
                PollMode::Busy => {
                    if self.spinning.load(Ordering::Acquire) {
                        std::thread::park_timeout(BACKSTOP_NAP);
                        continue;
                    }
                    true
                }
                PollMode::Event => true,
                PollMode::Adaptive => last_work.elapsed() >= spin,
            };
            let Some(ch) = self.channel.as_ref().filter(|_| sleep) else {
                std::hint::spin_loop();
                continue;
            };
            if let Err(e) = self.cq.req_notify(false) {
                self.kill(&format!("arming the completion queue: {e}"));
                break;
            }
            let Some(n) = self.poll_once(&mut lock(&self.poller)) else {
                break;
            };
            if n > 0 {
                last_work = Instant::now();
                continue;
            }
            if let Err(e) = ch.get_event(Some(Duration::from_millis(50))) {
                self.kill(&format!("waiting for completions: {e}"));
                break;
            }
        }
        tracing::debug!(conn = self.id, "completion thread ends");
    }

    fn completion(&self, st: &mut State, wc: &WorkCompletion) -> Result<(), String> {
        let kind = wc.wr_id >> 56;
        let v = (wc.wr_id & ((1 << 56) - 1)) as usize;
        if let Err(e) = wc.status {
            let what = match kind {
                WR_RECV => "receive",
                WR_SEND => "send",
                WR_LINV => "local invalidation",
                WR_BIND => "memory window bind",
                _ => "work request",
            };
            return Err(format!("{what} failed: {e}"));
        }
        match kind {
            WR_RECV => self.on_recv(st, v, wc),
            WR_SEND => {
                if let Some(inf) = st.slots.get_mut(v).and_then(Option::as_mut) {
                    inf.send_done = true;
                    if inf.delivered {
                        self.release(st, v);
                    }
                }
                Ok(())
            }
            WR_LINV => {
                debug_assert_eq!(wc.opcode, WcOpcode::LocalInv);
                let ready = match st.slots.get_mut(v).and_then(Option::as_mut) {
                    Some(inf) => {
                        inf.invs_left = inf.invs_left.saturating_sub(1);
                        inf.invs_left == 0 && inf.reply.is_some()
                    }
                    None => false,
                };
                if ready {
                    self.finish(st, v)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn on_recv(&self, st: &mut State, idx: usize, wc: &WorkCompletion) -> Result<(), String> {
        let inline = self.cfg.inline_recv as usize;
        let off = idx * inline;
        let len = (wc.byte_len as usize).min(inline);
        let msg = self
            .recv_mr
            .to_vec(off, len)
            .map_err(|e| format!("receive buffer: {e}"))?;
        let sge = self
            .recv_mr
            .sge(off, inline)
            .map_err(|e| format!("receive buffer: {e}"))?;
        self.qp
            .post_recv(&[RecvWr {
                wr_id: wc.wr_id,
                sges: &[sge],
            }])
            .map_err(|e| format!("reposting a receive: {e}"))?;
        let inv = wc.invalidated_rkey;
        if inv.is_some() && !self.offered_ri {
            return Err(
                "Send With Invalidate although we did not offer remote invalidation".into(),
            );
        }
        let xid = (msg.len() >= nfsrdma_xdr::rpcrdma::MIN_HEADER_LEN)
            .then(|| requester::reply_xid(&msg))
            .flatten();
        let slot = xid.and_then(|x| st.xids.get(&x).copied());
        let Some(slot) = slot else {
            self.counters.unmatched.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(?xid, len, "reply for no waiting call dropped");
            if let Some(k) = inv {
                return Err(format!(
                    "Send With Invalidate of rkey {k:#x} with a reply that matches no call"
                ));
            }
            return Ok(());
        };
        st.xids.remove(&xid.unwrap_or_default());
        let inf = st.slots[slot].as_mut().ok_or("slot table out of step")?;
        if let Some(k) = inv {
            match inf.rkeys.iter().position(|r| *r == k) {
                Some(p) => {
                    inf.rkeys.swap_remove(p);
                    self.counters.send_with_inv.fetch_add(1, Ordering::Relaxed);
                }
                None => {
                    return Err(format!(
                        "Send With Invalidate named rkey {k:#x}, which is not one of this call's"
                    ))
                }
            }
        }
        let reply = match requester::parse_reply(Bytes::from(msg), &inf.plan) {
            Ok(r) => r,
            Err(e) => {
                if let Some(w) = inf.waiter.take() {
                    let _ = w.send(Outcome::Fatal(ClientError::Rdma(format!(
                        "bad reply header: {e}"
                    ))));
                }
                return Err(format!("bad reply header: {e}"));
            }
        };
        let granted = match &reply {
            Reply::Message { credits, .. } | Reply::Error { credits, .. } => *credits,
        }
        .clamp(1, RECV_BUFFERS);
        inf.reply = Some(reply);
        inf.replied = Some(Instant::now());
        // Fence what the server did not invalidate.
        let keys = std::mem::take(&mut inf.rkeys);
        if !keys.is_empty() {
            let wrs: Vec<SendWr<'_>> = keys
                .iter()
                .map(|&rkey| SendWr {
                    wr_id: wr(WR_LINV, slot),
                    op: SendOp::LocalInv { rkey },
                    flags: SendFlags::SIGNALED,
                })
                .collect();
            self.qp
                .post_send(&wrs)
                .map_err(|e| format!("posting local invalidation: {e}"))?;
            inf.invs_left = keys.len() as u32;
            self.counters
                .local_invs
                .fetch_add(keys.len() as u64, Ordering::Relaxed);
        }
        let ready = inf.invs_left == 0;
        let limit = if granted > 1 { granted - 1 } else { 1 };
        if limit != st.limit {
            let more = limit > st.limit;
            st.limit = limit;
            if more {
                self.notify.notify_waiters();
            }
        }
        if ready {
            self.finish(st, slot)?;
        }
        Ok(())
    }

    /// Replaces the slot's windows in `mask` with newly allocated ones
    /// (the old ones are deallocated, which also lets go of every region
    /// they were bound to).
    fn renew_windows(&self, slot: usize, mask: u8) -> Result<(), String> {
        if mask == 0 {
            return Ok(());
        }
        let mut sm = lock(&self.slot_mem[slot]);
        for (w, window) in sm.windows.iter_mut().enumerate() {
            if mask & (1 << w) != 0 {
                *window = MemoryWindow::new(&self._pd)
                    .map_err(|e| format!("allocating a memory window: {e}"))?;
                self.counters
                    .window_renewals
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// A spare chunk area, registering one if fewer than one per slot
    /// exist; `None` when none can be had (the reply is then copied).
    fn take_spare(&self) -> Option<Arc<MemoryRegion>> {
        if let Some(a) = lock(&self.spares).pop() {
            return Some(a);
        }
        let made = self.spare_areas.load(Ordering::Relaxed);
        if made as usize >= self.slot_mem.len() {
            return None;
        }
        match MemoryRegion::new_window_only(&self._pd, self.area) {
            Ok(a) => {
                self.spare_areas.store(made + 1, Ordering::Relaxed);
                Some(a)
            }
            Err(e) => {
                // No more: copying still works.
                self.spare_areas.store(u32::MAX, Ordering::Relaxed);
                tracing::warn!(conn = self.id, error = %e, "registering a spare chunk area failed; replies are copied from now on");
                None
            }
        }
    }

    /// Every registration of the slot's RPC is fenced: hand the reply over
    /// (copied out of the pool, or, from a per-RPC region, the region's
    /// own memory once deregistered) and free the slot once its Send
    /// completed too.
    fn finish(&self, st: &mut State, slot: usize) -> Result<(), String> {
        let inf = st.slots[slot].as_mut().ok_or("slot table out of step")?;
        let Some(reply) = inf.reply.take() else {
            return Ok(());
        };
        let fenced = Instant::now();
        let data = match &reply {
            Reply::Message {
                message, written, ..
            } => {
                let chunk = match message {
                    ReplyMessage::InReplyChunk(n) => *n as usize,
                    ReplyMessage::Inline(_) => 0,
                };
                chunk + written.unwrap_or(0) as usize
            }
            Reply::Error { .. } => 0,
        };
        let has_data = data > 0;
        let mut lent: Option<Bytes> = None;
        // `mw`: the windows this call bound over a per-RPC region hold it
        // until they are deallocated: new ones take their place, so that
        // the region can be given up below (and is not kept alive).
        let area = self.slot_mem.get(slot).map(|m| lock(m).area.clone());
        let in_area = matches!((&area, &inf.mem), (Some(a), Some(m)) if Arc::ptr_eq(a, m));
        drop(area);
        if inf.mem.is_some() && !in_area && inf.bound != 0 {
            self.renew_windows(slot, inf.bound)?;
        }
        // `mw`: enough reply data in the slot's area is lent to the caller
        // in place: the slot takes a spare area, and the windows that were
        // bound to its old one are replaced, so that nothing can reach the
        // old area any more while the caller holds it.
        if in_area && data >= LEND_MIN {
            if let Some(spare) = self.take_spare() {
                let old = {
                    let mut sm = lock(&self.slot_mem[slot]);
                    let mask = std::mem::take(&mut sm.on_area);
                    let old = std::mem::replace(&mut sm.area, spare);
                    drop(sm);
                    self.renew_windows(slot, mask)?;
                    old
                };
                inf.mem = None;
                let spares = self.spares.clone();
                let len = old.len();
                match MemoryRegion::lend(old, 0, len, move |r| lock(&spares).push(r)) {
                    Ok(b) => lent = Some(b),
                    Err(old) => {
                        // Held elsewhere after all: copy from it, and let
                        // it go.
                        tracing::warn!(conn = self.id, slot, "chunk area not lendable; copying");
                        inf.mem = Some(old);
                    }
                }
            }
        }
        // A per-RPC region that nothing else holds is deregistered here
        // (that fences it) and its buffer becomes the reply's memory. The
        // persistent pool is never lent out: the server may write it at
        // any time.
        let pool = self.pool.as_ref();
        let per_rpc = inf.mem.take_if(|m| {
            lent.is_none() && has_data && !in_area && !pool.is_some_and(|p| Arc::ptr_eq(p, m))
        });
        if let Some(mem) = per_rpc {
            let len = mem.len().saturating_sub(inf.base);
            match MemoryRegion::into_bytes(mem, inf.base, len) {
                Ok(b) => lent = Some(b),
                Err(Ok(mem)) => inf.mem = Some(mem),
                Err(Err(e)) => return Err(format!("deregistering chunk memory: {e}")),
            }
        }
        let counters = &self.counters;
        let copy = |at: usize, n: u32| -> Result<Bytes, String> {
            let n = n as usize;
            if let Some(b) = &lent {
                if at.checked_add(n).is_none_or(|end| end > b.len()) {
                    return Err(format!("reply data {at}+{n} outside the chunk memory"));
                }
                counters.bytes_lent.fetch_add(n as u64, Ordering::Relaxed);
                return Ok(b.slice(at..at + n));
            }
            let mem = inf.mem.as_ref().ok_or("reply data without chunk memory")?;
            counters.bytes_copied.fetch_add(n as u64, Ordering::Relaxed);
            mem.to_vec(inf.base + at, n)
                .map(Bytes::from)
                .map_err(|e| format!("chunk memory: {e}"))
        };
        let outcome = match reply {
            Reply::Message {
                message, written, ..
            } => {
                let msg = match message {
                    ReplyMessage::Inline(b) => b,
                    ReplyMessage::InReplyChunk(n) => copy(inf.reply_at, n)?,
                };
                let ddp = match written {
                    Some(n) if n > 0 => Some(Payload::from(copy(inf.write_at, n)?)),
                    _ => None,
                };
                Outcome::Reply(msg, ddp)
            }
            Reply::Error { error, .. } => Outcome::Fatal(ClientError::Rdma(format!(
                "the server answered RDMA_ERROR: {error:?}"
            ))),
        };
        if let Some(replied) = inf.replied {
            let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
            let c = &self.counters;
            c.register_ns
                .fetch_add(ns(inf.started, inf.posted), Ordering::Relaxed);
            c.wire_ns
                .fetch_add(ns(inf.posted, replied), Ordering::Relaxed);
            c.invalidate_ns
                .fetch_add(ns(replied, fenced), Ordering::Relaxed);
            c.copy_out_ns
                .fetch_add(ns(fenced, Instant::now()), Ordering::Relaxed);
            c.timed_calls.fetch_add(1, Ordering::Relaxed);
        }
        // A per-RPC region is deregistered (fenced) here; the pool and the
        // slot's area stay.
        inf.mem = None;
        inf.delivered = true;
        if let Some(w) = inf.waiter.take() {
            let _ = w.send(outcome);
        }
        if inf.send_done {
            self.release(st, slot);
        }
        Ok(())
    }
}
