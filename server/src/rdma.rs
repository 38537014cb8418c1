//! Serving NFSv3 over RPC-over-RDMA version 1 (RFC 8166): the responder
//! driver.
//!
//! A connection manager thread listens (port 20049 by default), reads the
//! requester's RFC 8797 message from the connect request and answers with
//! ours, and sets each connection up: a completion queue, an RC queue pair,
//! receive buffers posted before the first credit is granted, send buffers,
//! and chunk buffers for RDMA Read and Write data. Each connection then has
//! a thread that waits for completions (busy, event, adaptive or auto polling)
//! and carries out what the protocol core in
//! [`nfsrdma_transport::rpcrdma::responder`] decides: RDMA Reads to
//! assemble a call, the call through the [`Service`], RDMA Writes of the
//! reply's chunk data, then the Send (with invalidate when allowed), which
//! the queue pair orders after the Writes.
//!
//! Every region the server registers has local access only: the server
//! never hands an rkey to a peer.
//!
//! Limits respected with queuing, not failure: the send queue depth, the
//! RDMA Read depth agreed with the peer (initiator depth), and the number
//! of chunk buffers.
//!
//! A completion error (the peer's memory refused a Read or Write, the peer
//! went away) ends that connection only: its queue pair is flushed and
//! everything it held is released.

use crate::service::{CallContext, Service};
use crate::store::blocks::{Block, BlockMemory, BlockSource, LandingBlocks};
use bytes::Bytes;
use nfsrdma_transport::rdma::engine::{PollMode, SpinTuner, AUTO_MAX_DEFAULT};
use nfsrdma_transport::rdma::verbs::{
    Access, Arena, ArenaBlock, CmEventKind, CmId, CmIdHandle, CompletionChannel, CompletionError,
    CompletionQueue, ConnParam, ConnectRequest, Context, DeviceList, EventChannel, MemoryRegion,
    PendingRead, ProtectionDomain, QpCaps, QueuePair, RecvWr, RemoteBuf, SendFlags, SendOp, SendWr,
    Sge, VerbsError, WcOpcode, WorkCompletion,
};
use nfsrdma_transport::rpcrdma::responder::{
    self, Fault, IncomingCall, Received, ReplyShape, ResponderConfig,
};
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::rpcrdma::{CmPrivate, RdmaError};
use nfsrdma_xdr::{Payload, Xdr};
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The RDMA device the server uses: one protection domain shared by every
/// connection, and the arena the stores' file blocks come from (registered
/// once, local access only), so that READ data is RDMA-Written straight
/// from file blocks and WRITE data is RDMA-Read straight into registered
/// blocks.
pub struct RdmaDevice {
    ctx: Context,
    pd: Arc<ProtectionDomain>,
    arena: Arc<Arena>,
}

impl RdmaDevice {
    /// Opens the device that owns `addr` (the first device for a wildcard
    /// address) with an arena that may register up to `arena_limit` bytes,
    /// 64 MiB at a time.
    pub fn open(addr: SocketAddr, arena_limit: usize) -> Result<Arc<RdmaDevice>, VerbsError> {
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch)?;
        id.bind_addr(SocketAddr::new(addr.ip(), 0))?;
        let ctx = match id.context() {
            Ok(c) => c,
            Err(_) => {
                let list = DeviceList::new()?;
                if list.is_empty() {
                    return Err(VerbsError::NoDevice {
                        detail: "no RDMA device found".into(),
                    });
                }
                list.open(0)?
            }
        };
        let pd = ProtectionDomain::new(&ctx)?;
        let arena = Arena::new(&pd, 64 << 20, arena_limit);
        Ok(Arc::new(RdmaDevice { ctx, pd, arena }))
    }

    /// A block source for a store, taking blocks from the device's arena.
    pub fn block_source(&self) -> Box<dyn BlockSource> {
        Box::new(ArenaSource(self.arena.clone()))
    }

    /// Regions registered on the server's PD with any remote access: the
    /// server never exposes its memory, so this is always 0.
    pub fn remote_access_regions(&self) -> usize {
        self.pd.remote_access_regions()
    }

    /// Bytes the arena has registered.
    pub fn arena_bytes(&self) -> usize {
        self.arena.registered_bytes()
    }
}

struct ArenaSource(Arc<Arena>);

impl BlockMemory for ArenaBlock {}

impl BlockSource for ArenaSource {
    fn alloc(&self, size: usize) -> Option<Box<dyn BlockMemory>> {
        match self.0.alloc(size) {
            Ok(b) => b.map(|b| Box::new(b) as Box<dyn BlockMemory>),
            Err(e) => {
                tracing::warn!(error = %e, "arena registration failed");
                None
            }
        }
    }
}

/// RDMA listener settings.
#[derive(Debug, Clone)]
pub struct RdmaConfig {
    /// Address to listen on.
    pub addr: SocketAddr,
    /// Credits granted (and receive buffers posted) per connection.
    pub credits: u32,
    /// Our inline threshold, both directions (advertised in the RFC 8797
    /// message; 1 KiB .. 256 KiB).
    pub inline_size: u32,
    /// Largest READ/WRITE payload (sizes the chunk buffers).
    pub max_io: u32,
    /// Chunk buffers per connection: calls with chunks in progress at once.
    pub chunk_buffers: usize,
    /// How connection threads wait for completions.
    pub poll: PollMode,
    /// One reply Send in this many asks for a completion (1: every one).
    /// The unsignaled ones are reaped with the next signaled one, whose
    /// completion means they completed too (a queue pair completes its
    /// work requests in order). A Send is signaled anyway when it uses a
    /// chunk buffer, when send slots run low, or when the unreaped work
    /// requests would fill half the send queue, so that resources always
    /// come back.
    pub signal_every: u32,
}

impl Default for RdmaConfig {
    fn default() -> Self {
        RdmaConfig {
            addr: ([0, 0, 0, 0], 20049).into(),
            credits: 128,
            inline_size: 4096,
            max_io: 1 << 20,
            chunk_buffers: 4,
            poll: PollMode::Auto {
                max: AUTO_MAX_DEFAULT,
            },
            signal_every: 1,
        }
    }
}

impl RdmaConfig {
    /// Bytes of registered memory one connection holds: receive buffers ×
    /// credits, send buffers, chunk buffers.
    pub fn memory_per_connection(&self) -> usize {
        let inline = CmPrivate::representable(self.inline_size) as usize;
        let slots = self.credits as usize;
        slots * inline + slots * inline + self.chunk_buffers * self.chunk_size()
    }

    fn chunk_size(&self) -> usize {
        self.max_io as usize + 64 * 1024
    }

    /// The `signal_every` that suits a polling mode when none is asked
    /// for: 1 with adaptive and auto polling, 16 otherwise. Such a thread
    /// spins for a while after its last completion; with every reply Send
    /// signaled, that time counts from when the reply went out (its data
    /// Writes included) rather than from when the call arrived, so a
    /// client that sends its next call soon after a large reply still
    /// finds the thread awake (and `auto` learns the gap between a reply
    /// and the next call, which is what the client controls). In event
    /// and busy mode a completion per reply would only cost a wake-up or a
    /// poll.
    pub fn default_signal_every(poll: PollMode) -> u32 {
        match poll {
            PollMode::Adaptive { .. } | PollMode::Auto { .. } => 1,
            PollMode::Busy | PollMode::Event => 16,
        }
    }
}

/// Counters of the RDMA transport (totals over all connections).
#[derive(Debug, Default)]
pub struct RdmaStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Calls received.
    pub calls: AtomicU64,
    /// Calls that arrived entirely inline.
    pub inline_calls: AtomicU64,
    /// Calls with Read chunks.
    pub chunked_calls: AtomicU64,
    /// Replies sent inline.
    pub inline_replies: AtomicU64,
    /// Replies sent through the Reply chunk.
    pub reply_chunk_replies: AtomicU64,
    /// Bytes moved by RDMA Read.
    pub read_bytes: AtomicU64,
    /// Bytes moved by RDMA Write.
    pub write_bytes: AtomicU64,
    /// Plain Sends.
    pub sends: AtomicU64,
    /// Sends With Invalidate.
    pub sends_with_inv: AtomicU64,
    /// Reply Sends posted without asking for a completion (reaped with a
    /// later one; see [`RdmaConfig::signal_every`]).
    pub unsignaled_sends: AtomicU64,
    /// RDMA_ERROR ERR_VERS sent.
    pub err_vers: AtomicU64,
    /// RDMA_ERROR ERR_CHUNK sent.
    pub err_chunk: AtomicU64,
    /// Messages dropped without a reply.
    pub discarded: AtomicU64,
    /// The last credit grant.
    pub credits_granted: AtomicU64,
    /// Payload bytes copied between chunk buffers and the store.
    pub payload_copies: AtomicU64,
    /// Connections ended by an error.
    pub errors: AtomicU64,
    /// Connections dropped by [`RdmaListener::disconnect_all`].
    pub forced_disconnects: AtomicU64,
    /// Calls found by a connection thread that was polling (busy, or
    /// spinning after its last completion).
    pub polled_calls: AtomicU64,
    /// Calls found by a connection thread that had gone to sleep on the
    /// completion channel (each a wake-up on the call's path).
    pub woken_calls: AtomicU64,
}

impl RdmaStats {
    /// A one-paragraph report.
    pub fn report(&self) -> String {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        format!(
            "rdma: connections {} (open {}), calls {} (inline {}, chunked {}), replies inline {} / reply chunk {}, \
             RDMA Read {} B, RDMA Write {} B, Send {} / Send With Invalidate {} (unsignaled {}), RDMA_ERROR vers {} chunk {}, \
             discarded {}, credits granted {}, payload bytes copied {}, connection errors {}, \
             calls found polling {} / after a wake-up {}\n",
            g(&self.connections),
            g(&self.open),
            g(&self.calls),
            g(&self.inline_calls),
            g(&self.chunked_calls),
            g(&self.inline_replies),
            g(&self.reply_chunk_replies),
            g(&self.read_bytes),
            g(&self.write_bytes),
            g(&self.sends),
            g(&self.sends_with_inv),
            g(&self.unsignaled_sends),
            g(&self.err_vers),
            g(&self.err_chunk),
            g(&self.discarded),
            g(&self.credits_granted),
            g(&self.payload_copies),
            g(&self.errors),
            g(&self.polled_calls),
            g(&self.woken_calls),
        )
    }
}

/// A running RDMA listener.
pub struct RdmaListener {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Requests to drop every connection, each with where to answer how
    /// many were dropped.
    disconnect: mpsc::Sender<mpsc::Sender<usize>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<RdmaStats>,
}

impl RdmaListener {
    /// Binds, listens and starts the connection manager thread. Fails (with
    /// the verbs layer's "no RDMA device" message when there is none) if
    /// the address cannot be bound.
    pub fn start(
        service: Arc<Service>,
        cfg: RdmaConfig,
        device: Arc<RdmaDevice>,
    ) -> Result<RdmaListener, VerbsError> {
        let channel = EventChannel::new()?;
        let listen = CmId::new(&channel)?;
        listen.bind_addr(cfg.addr)?;
        listen.listen(64)?;
        let port = listen.local_port();
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(RdmaStats::default());
        let (s2, st2) = (stop.clone(), stats.clone());
        let (disconnect, requests) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("rdma-cm".into())
            .spawn(move || cm_loop(channel, listen, service, cfg, device, s2, st2, requests))
            .map_err(|e| VerbsError::Call {
                call: "spawn",
                source: e,
            })?;
        Ok(RdmaListener {
            port,
            stop,
            disconnect,
            thread: Some(thread),
            stats,
        })
    }

    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The counters.
    pub fn stats(&self) -> Arc<RdmaStats> {
        self.stats.clone()
    }

    /// Disconnects every current connection (as if each peer had gone
    /// away) and keeps listening: peers may connect again. Returns once
    /// the connections are torn down, with how many there were (0 when
    /// the listener is stopped).
    pub fn disconnect_all(&self) -> usize {
        let (tx, rx) = mpsc::channel();
        if self.disconnect.send(tx).is_err() {
            return 0;
        }
        rx.recv().unwrap_or(0)
    }

    /// Stops listening, disconnects every connection and waits for their
    /// threads.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RdmaListener {
    fn drop(&mut self) {
        self.stop();
    }
}

struct ConnHandle {
    id: Arc<CmId>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ConnHandle {
    fn shut(mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.id.disconnect();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn cm_loop(
    channel: Arc<EventChannel>,
    _listen: CmId,
    service: Arc<Service>,
    cfg: RdmaConfig,
    device: Arc<RdmaDevice>,
    stop: Arc<AtomicBool>,
    stats: Arc<RdmaStats>,
    disconnect: mpsc::Receiver<mpsc::Sender<usize>>,
) {
    let mut conns: HashMap<CmIdHandle, ConnHandle> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        conns.retain(|_, c| c.thread.as_ref().is_some_and(|t| !t.is_finished()));
        while let Ok(done) = disconnect.try_recv() {
            let n = conns.len();
            for (_, c) in conns.drain() {
                c.shut();
            }
            stats
                .forced_disconnects
                .fetch_add(n as u64, Ordering::Relaxed);
            let _ = done.send(n);
        }
        let ev = match channel.get_event(Some(Duration::from_millis(100))) {
            Ok(ev) => ev,
            Err(VerbsError::Timeout { .. }) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "RDMA connection manager event");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        match ev.kind {
            CmEventKind::ConnectRequest => {
                let Some(req) = ev.into_request() else {
                    continue;
                };
                match accept(req, &service, &cfg, &device, &stats) {
                    Ok(c) => {
                        conns.insert(c.id.handle(), c);
                    }
                    Err(e) => tracing::warn!(error = %e, "RDMA connection refused"),
                }
            }
            CmEventKind::Disconnected
            | CmEventKind::DeviceRemoval
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::Rejected => {
                if let Some(c) = conns.remove(&ev.id) {
                    c.shut();
                }
            }
            _ => {}
        }
    }
    for (_, c) in conns.drain() {
        c.shut();
    }
}

/// Chooses both sides' parameters and accepts.
fn accept(
    req: ConnectRequest,
    service: &Arc<Service>,
    cfg: &RdmaConfig,
    device: &Arc<RdmaDevice>,
    stats: &Arc<RdmaStats>,
) -> Result<ConnHandle, VerbsError> {
    let peer_msg = CmPrivate::from_peer(Some(&req.param.private_data));
    let ours = CmPrivate::representable(cfg.inline_size);
    let peer = req
        .id
        .peer_addr()
        .unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
    let ctx = req.id.context()?;
    if !ctx.same_as(&device.ctx) {
        return Err(VerbsError::InvalidArgument(
            "connection on another RDMA device than the store's".into(),
        ));
    }
    let attrs = ctx.query()?;
    let pd = device.pd.clone();
    let channel = CompletionChannel::new(&ctx)?;
    let credits = cfg.credits.max(1);
    let send_slots = credits as usize;
    let sq_depth = (4 * credits).min(attrs.max_qp_wr.max(64));
    let cq = CompletionQueue::new(&ctx, sq_depth + credits + 16, Some(&channel))?;
    let caps = QpCaps {
        max_send_wr: sq_depth,
        max_recv_wr: credits,
        max_send_sge: attrs.max_sge.clamp(1, MAX_SEND_SGE as u32),
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let qp = req.id.create_qp(&pd, &cq, &cq, caps)?;
    let recv_mr = MemoryRegion::new(&pd, credits as usize * ours as usize, Access::LOCAL)?;
    let send_mr = MemoryRegion::new(&pd, send_slots * ours as usize, Access::LOCAL)?;
    let chunk_mr = MemoryRegion::new(
        &pd,
        cfg.chunk_buffers.max(1) * cfg.chunk_size(),
        Access::LOCAL,
    )?;
    // Receives go up before the first credit is granted.
    for slot in 0..credits as usize {
        let sge = recv_mr.sge(slot * ours as usize, ours as usize)?;
        qp.post_recv_one(wr(Kind::Recv, slot as u64), &[sge])?;
    }
    // In the request as the listener sees it, `initiator_depth` bounds the
    // RDMA Reads we may have outstanding towards the peer and
    // `responder_resources` the peer's Reads we must serve (none, in this
    // protocol); both within the device's limits.
    let read_depth = req
        .param
        .initiator_depth
        .min(attrs.max_qp_init_rd_atom.min(255) as u8)
        .max(1);
    let accept_param = ConnParam {
        private_data: CmPrivate {
            remote_invalidation: false,
            send_size: ours,
            recv_size: ours,
        }
        .encode()
        .to_vec(),
        responder_resources: req
            .param
            .responder_resources
            .min(attrs.max_qp_rd_atom.min(255) as u8),
        initiator_depth: read_depth,
        ..ConnParam::default()
    };
    let id = Arc::new(req.id);
    id.accept(&accept_param)?;
    stats.connections.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        peer = %peer,
        credits,
        inline_send = peer_msg.recv_size.min(ours),
        remote_invalidation = peer_msg.remote_invalidation,
        read_depth,
        "RDMA connection"
    );
    let conn = Conn {
        service: service.clone(),
        ctx: CallContext { peer },
        rcfg: ResponderConfig {
            inline_send: peer_msg.recv_size.min(ours),
            inline_recv: ours,
            credits,
            remote_invalidation: peer_msg.remote_invalidation,
            max_call: cfg.chunk_size() as u64,
        },
        qp,
        cq,
        channel,
        recv_mr,
        send_mr,
        chunk_mr,
        arena: device.arena.clone(),
        max_sge: attrs.max_sge.clamp(1, MAX_SEND_SGE as u32) as usize,
        holds: HashMap::new(),
        unsignaled_writes: 0,
        send_writes: HashMap::new(),
        covers: HashMap::new(),
        trail: Vec::new(),
        trail_wrs: 0,
        signal_every: cfg.signal_every.max(1) as usize,
        slot_size: ours as usize,
        chunk_size: cfg.chunk_size(),
        free_send: (0..send_slots).collect(),
        free_chunks: (0..cfg.chunk_buffers.max(1)).collect(),
        sq_free: sq_depth as usize,
        sq_depth: sq_depth as usize,
        reads_free: usize::from(read_depth),
        queue: VecDeque::new(),
        reading: HashMap::new(),
        waiting_reads: VecDeque::new(),
        next_call: 0,
        poll: cfg.poll,
        stats: stats.clone(),
        id: id.clone(),
    };
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let st = stats.clone();
    let thread = std::thread::Builder::new()
        .name("rdma-conn".into())
        .spawn(move || {
            st.open.fetch_add(1, Ordering::Relaxed);
            let mut conn = conn;
            match conn.run(&s2) {
                Ok(()) => {}
                // The peer disconnected: its queue pair's work is flushed
                // as the connection manager reports the disconnect, which
                // stops this thread. Not an error, unless no such report
                // comes.
                Err(ConnError::Flushed) if wait_for(&s2, FLUSH_GRACE) => {
                    tracing::debug!(peer = %conn.ctx.peer, "RDMA connection closed by the peer");
                }
                Err(e) => {
                    st.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(peer = %conn.ctx.peer, error = %e, "RDMA connection ended");
                    let _ = conn.id.disconnect();
                }
            }
            st.open.fetch_sub(1, Ordering::Relaxed);
        })
        .map_err(|e| VerbsError::Call {
            call: "spawn",
            source: e,
        })?;
    Ok(ConnHandle {
        id,
        stop,
        thread: Some(thread),
    })
}

/// How long a connection thread whose work was flushed waits for the
/// connection manager's report of a disconnect before it counts an error.
const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// Waits up to `limit` for `flag` to be set; returns whether it was.
fn wait_for(flag: &AtomicBool, limit: Duration) -> bool {
    let until = Instant::now() + limit;
    while !flag.load(Ordering::Acquire) {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Scatter/gather entries per RDMA Write, at most.
const MAX_SEND_SGE: usize = 16;

/// One RDMA Write of a reply: local pieces, the peer's target.
struct WriteDesc<'a> {
    sges: Vec<Sge<'a>>,
    addr: u64,
    rkey: u32,
    len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Recv = 1,
    Send = 2,
    Read = 3,
    Write = 4,
}

/// wr_id: kind in the top byte, a value below.
fn wr(kind: Kind, v: u64) -> u64 {
    ((kind as u64) << 56) | (v & ((1 << 56) - 1))
}

fn wr_kind(id: u64) -> u64 {
    id >> 56
}

fn wr_val(id: u64) -> u64 {
    id & ((1 << 56) - 1)
}

/// A send's value: send slot, and the chunk buffer to release (or none).
fn send_val(slot: usize, chunk: Option<usize>) -> u64 {
    ((chunk.map_or(0xffff, |c| c as u64)) << 32) | slot as u64
}

/// A received message waiting for resources.
enum Pending {
    /// Not yet classified.
    Message(Bytes),
    /// A call waiting for a chunk buffer.
    Call(IncomingCall),
}

/// A call whose Read chunks are being read, into arena blocks.
struct Reading {
    call: IncomingCall,
    /// The chunk buffer the call holds for its reply.
    chunk: usize,
    /// The blocks and the reads posted into them.
    reads: PendingRead,
    /// The call's reads (block, offset in it, peer memory) in order, and
    /// how many of them were posted.
    ops: Vec<(usize, usize, RemoteBuf)>,
    posted: usize,
    /// Chains posted so far (numbers their signaled requests' wr_ids).
    chains: u64,
    /// Per Read chunk: the bytes landing in each block it spans (a head
    /// block may be larger than its piece).
    layout: Vec<Vec<usize>>,
    started: Instant,
}

impl Reading {
    /// Whether every read was posted and has completed: the call can run.
    fn done(&self) -> bool {
        self.posted == self.ops.len() && !self.reads.in_flight()
    }
}

/// The wr_id value of a call's Read requests that are not signaled.
const QUIET_READ: u64 = 0xffff;

struct Conn {
    service: Arc<Service>,
    ctx: CallContext,
    rcfg: ResponderConfig,
    qp: Arc<QueuePair>,
    cq: Arc<CompletionQueue>,
    channel: Arc<CompletionChannel>,
    recv_mr: Arc<MemoryRegion>,
    send_mr: Arc<MemoryRegion>,
    chunk_mr: Arc<MemoryRegion>,
    arena: Arc<Arena>,
    /// Scatter/gather entries per RDMA Write.
    max_sge: usize,
    /// Payloads a posted Send's RDMA Writes read from, kept alive (and the
    /// blocks shared, so not written) until the Send completes.
    holds: HashMap<usize, Vec<Payload>>,
    /// Unsignaled RDMA Writes posted since the last Send.
    unsignaled_writes: usize,
    /// Per signaled send slot: the unsignaled work requests (Writes and
    /// Sends) its completion covers besides its own.
    send_writes: HashMap<usize, usize>,
    /// Per signaled send slot: the slots of unsignaled Sends before it,
    /// freed with it.
    covers: HashMap<usize, Vec<usize>>,
    /// Slots of unsignaled Sends since the last signaled one.
    trail: Vec<usize>,
    /// Unsignaled Sends' work requests (with their Writes) since the last
    /// signaled Send.
    trail_wrs: usize,
    signal_every: usize,
    slot_size: usize,
    chunk_size: usize,
    free_send: Vec<usize>,
    free_chunks: Vec<usize>,
    /// Send queue entries not in use.
    sq_free: usize,
    /// Send queue entries in all.
    sq_depth: usize,
    /// RDMA Reads we may still start.
    reads_free: usize,
    queue: VecDeque<Pending>,
    reading: HashMap<u64, Reading>,
    /// Calls with reads not yet posted, oldest first.
    waiting_reads: VecDeque<u64>,
    next_call: u64,
    poll: PollMode,
    stats: Arc<RdmaStats>,
    id: Arc<CmId>,
}

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
enum ConnError {
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    #[error("work request {0:#x} failed: {1}")]
    Completion(u64, String),
    /// Work requests flushed before any failed: the queue pair left the
    /// connected state, as it does when the peer disconnects.
    #[error("work requests flushed: the queue pair is no longer connected")]
    Flushed,
}

impl Conn {
    fn run(&mut self, stop: &AtomicBool) -> Result<(), ConnError> {
        let mut wcs = Vec::with_capacity(64);
        let mut last_work = Instant::now();
        let mut tuner = match self.poll {
            PollMode::Auto { max } => Some(SpinTuner::new(max)),
            _ => None,
        };
        // Whether the thread has slept since its last work.
        let mut slept = false;
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(());
            }
            wcs.clear();
            self.cq.poll(&mut wcs, 64)?;
            if wcs.is_empty() {
                let wait = match self.poll {
                    PollMode::Busy => false,
                    PollMode::Event => true,
                    PollMode::Adaptive { spin } => last_work.elapsed() >= spin,
                    PollMode::Auto { .. } => {
                        last_work.elapsed()
                            >= tuner.as_ref().map_or(Duration::ZERO, SpinTuner::budget)
                    }
                };
                if wait {
                    self.cq.req_notify(false)?;
                    // Completions that came before arming.
                    self.cq.poll(&mut wcs, 64)?;
                    if wcs.is_empty() {
                        self.channel.get_event(Some(Duration::from_millis(50)))?;
                        slept = true;
                        continue;
                    }
                } else {
                    std::hint::spin_loop();
                    continue;
                }
            }
            // What the thread waits for is the next call: the time it took
            // to come after the last work (a reply's completion, mostly)
            // is what `auto` learns, and whether the thread was awake to
            // see it is what the counters tell.
            if wcs.iter().any(|wc| wr_kind(wc.wr_id) == Kind::Recv as u64) {
                if let Some(t) = tuner.as_mut() {
                    t.observe(last_work.elapsed());
                }
                let found = if slept {
                    &self.stats.woken_calls
                } else {
                    &self.stats.polled_calls
                };
                found.fetch_add(1, Ordering::Relaxed);
            }
            slept = false;
            last_work = Instant::now();
            for wc in wcs.drain(..) {
                self.completion(wc)?;
            }
            self.post_waiting_reads()?;
            self.drain_queue()?;
        }
    }

    fn completion(&mut self, wc: WorkCompletion) -> Result<(), ConnError> {
        if let Err(e) = wc.status {
            if matches!(e, CompletionError::Flushed) {
                return Err(ConnError::Flushed);
            }
            return Err(ConnError::Completion(wc.wr_id, e.to_string()));
        }
        let v = wr_val(wc.wr_id);
        match wr_kind(wc.wr_id) {
            k if k == Kind::Recv as u64 => {
                let slot = v as usize;
                let off = slot * self.slot_size;
                let msg = Bytes::from(self.recv_mr.to_vec(off, wc.byte_len as usize)?);
                // The buffer was copied out: it goes straight back up.
                let sge = self.recv_mr.sge(off, self.slot_size)?;
                self.qp.post_recv(&[RecvWr {
                    wr_id: wc.wr_id,
                    sges: &[sge],
                }])?;
                self.queue.push_back(Pending::Message(msg));
            }
            k if k == Kind::Send as u64 => {
                let slot = (v & 0xffff_ffff) as usize;
                self.sq_free += 1 + self.send_writes.remove(&slot).unwrap_or(0);
                for s in self.covers.remove(&slot).unwrap_or_default() {
                    self.holds.remove(&s);
                    self.free_send.push(s);
                }
                self.holds.remove(&slot);
                self.free_send.push(slot);
                let chunk = (v >> 32) as usize;
                if chunk != 0xffff {
                    self.free_chunks.push(chunk);
                }
            }
            k if k == Kind::Write as u64 => {
                // Its own entry and those of the unsignaled ones it covers.
                self.sq_free += 1 + v as usize;
            }
            k if k == Kind::Read as u64 => {
                debug_assert_eq!(wc.opcode, WcOpcode::RdmaRead);
                let call_id = v >> 16;
                let Some(r) = self.reading.get_mut(&call_id) else {
                    return Ok(());
                };
                // One signaled completion ends its whole chain.
                let Some(n) = r.reads.complete(wc.wr_id) else {
                    return Ok(());
                };
                self.sq_free += n;
                self.reads_free += n;
                // (Reads still to post go out from `post_waiting_reads`.)
                if r.done() {
                    let r = self.reading.remove(&call_id).expect("present");
                    self.finish_reads(r)?;
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Works through waiting messages while resources last.
    fn drain_queue(&mut self) -> Result<(), ConnError> {
        while let Some(p) = self.queue.pop_front() {
            // Every message may need a send slot; a call with chunks also a
            // chunk buffer. Wait (keep it queued, in order) until they are
            // free.
            if self.free_send.is_empty() || self.sq_free < 2 {
                self.queue.push_front(p);
                return Ok(());
            }
            let received = match p {
                Pending::Message(m) => responder::receive(m, &self.rcfg),
                Pending::Call(c) => Received::Call(c),
            };
            if let Received::Call(c) = &received {
                let needs_chunk =
                    c.needs_reads() || !c.write_list.is_empty() || c.reply_chunk.is_some();
                if needs_chunk && self.free_chunks.is_empty() {
                    let Received::Call(c) = received else {
                        unreachable!()
                    };
                    self.queue.push_front(Pending::Call(c));
                    return Ok(());
                }
            }
            self.message(received)?;
        }
        Ok(())
    }

    /// Handles one classified message (its resources are available).
    fn message(&mut self, received: Received) -> Result<(), ConnError> {
        match received {
            Received::Discard(why) => {
                self.stats.discarded.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(peer = %self.ctx.peer, why, "RDMA message dropped");
            }
            Received::Error { reply, fault } => {
                match fault {
                    Fault::Vers => self.stats.err_vers.fetch_add(1, Ordering::Relaxed),
                    Fault::Chunk(why) => {
                        tracing::debug!(peer = %self.ctx.peer, why, "ERR_CHUNK");
                        self.stats.err_chunk.fetch_add(1, Ordering::Relaxed)
                    }
                };
                self.post_send(&reply, &[], None, None)?;
            }
            Received::Call(call) => {
                self.stats.calls.fetch_add(1, Ordering::Relaxed);
                if call.needs_reads() {
                    self.stats.chunked_calls.fetch_add(1, Ordering::Relaxed);
                    self.start_reads(call)?;
                } else {
                    self.stats.inline_calls.fetch_add(1, Ordering::Relaxed);
                    let chunk = if call.write_list.is_empty() && call.reply_chunk.is_none() {
                        None
                    } else {
                        Some(self.free_chunks.pop().expect("checked above"))
                    };
                    self.execute(call, Vec::new(), chunk)?;
                }
            }
        }
        Ok(())
    }

    /// Reads the call's chunks straight into arena blocks (64 KiB each, a
    /// smaller one for a short tail): the data reaches the decoder, and the
    /// store, without being copied on the way.
    fn start_reads(&mut self, call: IncomingCall) -> Result<(), ConnError> {
        use crate::store::blocks::BLOCK_SIZE as BLK;
        let chunk = self.free_chunks.pop().expect("checked by drain_queue()");
        let id = self.next_call;
        self.next_call += 1;
        let class = |n: usize| n.max(4096).next_power_of_two().min(BLK);
        // A WRITE's data lands so that its file blocks line up with landing
        // blocks: the store can then take whole landing blocks over.
        let skew = write_offset(&call.inline).map_or(0, |o| (o % BLK as u64) as usize);
        // Plan: per landing block, its size and the reads landing in it.
        let mut blocks: Vec<(usize, Vec<(usize, RemoteBuf)>)> = Vec::new();
        let mut layout = Vec::new();
        for c in &call.read_chunks {
            let total = c.total_len() as usize;
            let first = blocks.len();
            let head = if c.position != 0 && skew > 0 {
                BLK - skew
            } else {
                BLK
            };
            let bounds = landing_pieces(total, head);
            for &n in &bounds {
                blocks.push((class(n), Vec::new()));
            }
            let mut piece = first;
            let mut in_piece = 0usize;
            for seg in &c.segments {
                let mut done = 0usize;
                while done < seg.length as usize {
                    if in_piece == bounds[piece - first] {
                        piece += 1;
                        in_piece = 0;
                    }
                    let n = (seg.length as usize - done).min(bounds[piece - first] - in_piece);
                    blocks[piece].1.push((
                        in_piece,
                        RemoteBuf {
                            addr: seg.offset + done as u64,
                            len: n as u32,
                            rkey: seg.handle,
                        },
                    ));
                    done += n;
                    in_piece += n;
                }
            }
            layout.push(bounds);
        }
        let mut allocated = Vec::with_capacity(blocks.len());
        for (size, _) in &blocks {
            match self.arena.alloc(*size)? {
                Some(b) => allocated.push(b),
                None => {
                    tracing::warn!("arena exhausted: call refused");
                    self.free_chunks.push(chunk);
                    return self.send_error(call.xid, None);
                }
            }
        }
        let ops: Vec<(usize, usize, RemoteBuf)> = blocks
            .into_iter()
            .enumerate()
            .flat_map(|(bi, (_, ops))| ops.into_iter().map(move |(off, r)| (bi, off, r)))
            .collect();
        let bytes: u64 = ops.iter().map(|(_, _, r)| u64::from(r.len)).sum();
        self.stats.read_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.reading.insert(
            id,
            Reading {
                call,
                chunk,
                reads: PendingRead::new(allocated, &self.qp),
                ops,
                posted: 0,
                chains: 0,
                layout,
                started: Instant::now(),
            },
        );
        self.waiting_reads.push_back(id);
        self.post_waiting_reads()
    }

    /// Posts the reads of calls waiting for room, oldest call first, as far
    /// as the RDMA Read depth and the send queue allow: per call one chain
    /// whose last request alone is signaled (the queue completes in order,
    /// so its one completion covers the chain). What does not fit goes out
    /// as completions give room back; a call whose reads all completed is
    /// run.
    fn post_waiting_reads(&mut self) -> Result<(), ConnError> {
        while let Some(&id) = self.waiting_reads.front() {
            let Some(r) = self.reading.get_mut(&id) else {
                self.waiting_reads.pop_front();
                continue;
            };
            // One send queue entry stays free for a reply.
            let room = self.reads_free.min(self.sq_free.saturating_sub(1));
            let take = room.min(r.ops.len() - r.posted);
            if take > 0 {
                let wrid = wr(Kind::Read, (id << 16) | (r.chains % QUIET_READ));
                let quiet = wr(Kind::Read, (id << 16) | QUIET_READ);
                r.chains += 1;
                let chain = &r.ops[r.posted..r.posted + take];
                r.reads.post(&self.qp, chain, wrid, quiet)?;
                r.posted += take;
                self.reads_free -= take;
                self.sq_free -= take;
            }
            if r.posted < r.ops.len() {
                return Ok(());
            }
            self.waiting_reads.pop_front();
            if r.done() {
                // Nothing to read after all (chunks of zero bytes).
                let r = self.reading.remove(&id).expect("present");
                self.finish_reads(r)?;
            }
        }
        Ok(())
    }

    fn finish_reads(&mut self, r: Reading) -> Result<(), ConnError> {
        let blocks = r.reads.finish().map_err(|_| {
            ConnError::Completion(
                u64::from(r.call.xid),
                "call run with reads in flight".into(),
            )
        })?;
        let mut blocks = blocks.into_iter();
        let mut data = Vec::with_capacity(r.layout.len());
        for pieces in &r.layout {
            let mut p = Payload::new();
            let mut landing = Vec::with_capacity(pieces.len());
            for &n in pieces {
                let b = blocks.next().expect("a block per piece");
                let block = Block::from_memory(Box::new(b));
                p.push(block.slice(0..n));
                landing.push(block);
            }
            // The landing blocks travel with the data: the store takes
            // whole ones over instead of copying them.
            data.push(p.with_attachment(Arc::new(LandingBlocks(landing))));
        }
        tracing::trace!(xid = r.call.xid, took = ?r.started.elapsed(), "chunks read");
        self.execute(r.call, data, Some(r.chunk))
    }

    /// Runs the call and sends the reply; `chunk` is the chunk buffer the
    /// call holds (released when its Send completes).
    fn execute(
        &mut self,
        call: IncomingCall,
        data: Vec<Payload>,
        chunk: Option<usize>,
    ) -> Result<(), ConnError> {
        let xid = call.xid;
        let mut d = match call.assemble(data) {
            Ok(d) => d,
            Err(_) => return self.send_error(xid, chunk),
        };
        let header = match RpcMessage::decode(&mut d) {
            Ok(h) if h.xid == xid => h,
            // An RPC header that does not decode, or whose XID is not the
            // transport header's: a chunk/header fault.
            _ => return self.send_error(xid, chunk),
        };
        let Some(body) = header.as_call() else {
            return self.send_error(xid, chunk);
        };
        let Some(reply) = self.service.handle_call(&self.ctx, xid, body, d) else {
            // A retransmission still in progress: no reply.
            tracing::debug!(peer = %self.ctx.peer, xid, "retransmission of a call in progress: no reply");
            if let Some(c) = chunk {
                self.free_chunks.push(c);
            }
            return Ok(());
        };
        let plan = match responder::plan_reply(&call, &self.rcfg, |s| reply.encode(s)) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(peer = %self.ctx.peer, error = %e, "reply cannot be sent");
                return self.send_error(xid, chunk);
            }
        };
        // RDMA Writes: data in arena memory (file blocks) goes straight
        // from there; anything else is copied into the call's chunk buffer.
        // The Send after them completes only after they did.
        let arena = self.arena.clone();
        let chunk_mr = self.chunk_mr.clone();
        let mut chunk_at = chunk.map(|c| (c * self.chunk_size, (c + 1) * self.chunk_size));
        let mut ddp_left = plan.ddp_bytes;
        let mut holds = Vec::with_capacity(plan.writes.len());
        let mut writes: Vec<WriteDesc<'_>> = Vec::new();
        for w in &plan.writes {
            let mut remote = w.offset;
            let mut batch: Vec<Sge<'_>> = Vec::with_capacity(self.max_sge);
            let mut batch_len = 0usize;
            for p in w.data.parts() {
                let ddp = p.len().min(ddp_left);
                ddp_left -= ddp;
                let sge = match arena.sge_for(p) {
                    Some(sge) => sge,
                    None => {
                        let Some((at, end)) = chunk_at.as_mut() else {
                            return self.send_error(xid, chunk);
                        };
                        if *at + p.len() > *end {
                            return self.send_error(xid, chunk);
                        }
                        chunk_mr.write_at(*at, p)?;
                        let sge = chunk_mr.sge(*at, p.len())?;
                        *at += p.len();
                        self.stats
                            .payload_copies
                            .fetch_add(ddp as u64, Ordering::Relaxed);
                        sge
                    }
                };
                batch.push(sge);
                batch_len += p.len();
                if batch.len() == self.max_sge {
                    writes.push(WriteDesc {
                        sges: std::mem::replace(&mut batch, Vec::with_capacity(self.max_sge)),
                        addr: remote,
                        rkey: w.rkey,
                        len: batch_len,
                    });
                    remote += batch_len as u64;
                    batch_len = 0;
                }
            }
            if !batch.is_empty() {
                writes.push(WriteDesc {
                    sges: batch,
                    addr: remote,
                    rkey: w.rkey,
                    len: batch_len,
                });
            }
            holds.push(w.data.clone());
        }
        // A chunk buffer nothing was copied into is free again at once
        // (the common case: READ data lives in arena blocks), so that the
        // reply's Send need not be signaled to give it back.
        let copied =
            matches!((chunk, chunk_at), (Some(c), Some((at, _))) if at != c * self.chunk_size);
        let chunk = match chunk {
            Some(c) if !copied => {
                self.free_chunks.push(c);
                None
            }
            c => c,
        };
        match plan.shape {
            ReplyShape::Inline => self.stats.inline_replies.fetch_add(1, Ordering::Relaxed),
            ReplyShape::ReplyChunk => self
                .stats
                .reply_chunk_replies
                .fetch_add(1, Ordering::Relaxed),
        };
        let slot = self.post_reply(
            &writes,
            &plan.header,
            &plan.inline,
            plan.send_with_invalidate,
            chunk,
        )?;
        if !holds.is_empty() {
            self.holds.insert(slot, holds);
        }
        Ok(())
    }

    fn post_write(
        &mut self,
        sges: &[Sge<'_>],
        addr: u64,
        rkey: u32,
        len: usize,
    ) -> Result<(), ConnError> {
        while self.sq_free < 2 {
            self.wait_some()?;
        }
        // With the send queue running low, this Write asks for a
        // completion that gives back the entries of the unsignaled work
        // requests before it too (nothing else may be signaled).
        let signaled = self.sq_free <= self.sq_depth / 4;
        let covers = if signaled {
            std::mem::take(&mut self.unsignaled_writes) + std::mem::take(&mut self.trail_wrs)
        } else {
            0
        };
        self.qp.post_send(&[SendWr {
            wr_id: wr(Kind::Write, covers as u64),
            op: SendOp::RdmaWrite {
                sges,
                remote: RemoteBuf {
                    addr,
                    len: len as u32,
                    rkey,
                },
            },
            // Otherwise unsignaled: the Send that follows completes only
            // after it, and its completion gives this entry back (fewer
            // completions to wake up for).
            flags: if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::UNSIGNALED
            },
        }])?;
        self.sq_free -= 1;
        if !signaled {
            self.unsignaled_writes += 1;
        }
        self.stats
            .write_bytes
            .fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }

    fn wait_some(&mut self) -> Result<(), ConnError> {
        let mut wcs = Vec::new();
        if self.cq.poll(&mut wcs, 16)? == 0 {
            std::hint::spin_loop();
        }
        for wc in wcs {
            self.completion(wc)?;
        }
        Ok(())
    }

    fn send_error(&mut self, xid: u32, chunk: Option<usize>) -> Result<(), ConnError> {
        self.stats.err_chunk.fetch_add(1, Ordering::Relaxed);
        let e = responder::error_reply(xid, self.rcfg.credits, RdmaError::Chunk);
        self.post_send(&e, &[], None, chunk).map(|_| ())
    }

    /// One Send of `header` + `inline` from a send slot.
    fn post_send(
        &mut self,
        header: &[u8],
        inline: &[Bytes],
        invalidate: Option<u32>,
        chunk: Option<usize>,
    ) -> Result<usize, ConnError> {
        self.post_reply(&[], header, inline, invalidate, chunk)
    }

    /// The reply's RDMA Writes (unsignaled) and its Send, posted in one
    /// call (one doorbell) when the send queue can take them all; the
    /// Send's completion stands for the Writes before it.
    fn post_reply(
        &mut self,
        writes: &[WriteDesc<'_>],
        header: &[u8],
        inline: &[Bytes],
        invalidate: Option<u32>,
        chunk: Option<usize>,
    ) -> Result<usize, ConnError> {
        let together = writes.len() < self.sq_depth;
        if !together {
            // More Writes than the queue holds: post them as room frees.
            for w in writes {
                self.post_write(&w.sges, w.addr, w.rkey, w.len)?;
            }
        }
        let posting = if together { writes.len() } else { 0 };
        while self.free_send.is_empty() || self.sq_free < posting + 1 {
            self.wait_some()?;
        }
        let slot = self.free_send.pop().expect("checked");
        let base = slot * self.slot_size;
        let mut len = header.len();
        self.send_mr.write_at(base, header)?;
        for p in inline {
            if len + p.len() > self.slot_size {
                // Cannot happen: the plan checked the inline threshold.
                return Err(ConnError::Completion(
                    0,
                    "reply larger than a send slot".into(),
                ));
            }
            self.send_mr.write_at(base + len, p)?;
            len += p.len();
        }
        let sge = self.send_mr.sge(base, len)?;
        let sges = [sge];
        let op = match invalidate {
            Some(rkey) => {
                self.stats.sends_with_inv.fetch_add(1, Ordering::Relaxed);
                SendOp::SendWithInv {
                    sges: &sges,
                    invalidate_rkey: rkey,
                }
            }
            None => {
                self.stats.sends.fetch_add(1, Ordering::Relaxed);
                SendOp::Send { sges: &sges }
            }
        };
        let mut wrs = Vec::with_capacity(posting + 1);
        for w in &writes[..posting] {
            wrs.push(SendWr {
                wr_id: wr(Kind::Write, 0),
                op: SendOp::RdmaWrite {
                    sges: &w.sges,
                    remote: RemoteBuf {
                        addr: w.addr,
                        len: w.len as u32,
                        rkey: w.rkey,
                    },
                },
                // Unsignaled: the Send after them completes only after
                // they did, and its completion gives their entries back.
                flags: SendFlags::UNSIGNALED,
            });
        }
        // Unsignaled only while everything it holds comes back with a
        // later signaled Send: no chunk buffer (few), enough free send
        // slots and send queue entries to reach the next signaled one.
        let unreaped = self.trail_wrs + self.unsignaled_writes + posting + 1;
        let signaled = self.trail.len() + 1 >= self.signal_every
            || chunk.is_some()
            || self.free_send.len() < self.signal_every
            || unreaped > self.sq_depth / 2;
        wrs.push(SendWr {
            wr_id: wr(Kind::Send, send_val(slot, chunk)),
            op,
            flags: if signaled {
                SendFlags::SIGNALED
            } else {
                SendFlags::UNSIGNALED
            },
        });
        self.qp.post_send(&wrs)?;
        self.sq_free -= posting + 1;
        self.unsignaled_writes += posting;
        let written: usize = writes[..posting].iter().map(|w| w.len).sum();
        self.stats
            .write_bytes
            .fetch_add(written as u64, Ordering::Relaxed);
        if signaled {
            let covered =
                std::mem::take(&mut self.unsignaled_writes) + std::mem::take(&mut self.trail_wrs);
            if covered > 0 {
                self.send_writes.insert(slot, covered);
            }
            let trail = std::mem::take(&mut self.trail);
            if !trail.is_empty() {
                self.covers.insert(slot, trail);
            }
        } else {
            self.trail_wrs += std::mem::take(&mut self.unsignaled_writes) + 1;
            self.trail.push(slot);
            self.stats.unsignaled_sends.fetch_add(1, Ordering::Relaxed);
        }
        self.stats
            .credits_granted
            .store(u64::from(self.rcfg.credits), Ordering::Relaxed);
        Ok(slot)
    }
}

/// How `total` bytes of a Read chunk land: a head of up to `head` bytes
/// (up to the file's next 64 KiB boundary), 64 KiB pieces, a tail. A head
/// or tail shorter than 64 KiB lands in pieces of powers of two (from
/// 4 KiB; the last may be shorter), each in a block of exactly its size:
/// the store takes whole pages of landing blocks over and keeps each such
/// block alive whole, so none is left mostly empty.
fn landing_pieces(total: usize, head: usize) -> Vec<usize> {
    use crate::store::blocks::{BLOCK_SIZE as BLK, PAGE};
    let mut pieces = Vec::new();
    let mut left = total;
    let mut span = left.min(head);
    while left > 0 {
        let n = if span >= BLK || span <= PAGE {
            span
        } else {
            1 << (usize::BITS - 1 - span.leading_zeros())
        };
        pieces.push(n);
        left -= n;
        span -= n;
        if span == 0 {
            span = left.min(BLK);
        }
    }
    pieces
}

/// The file offset of an NFSv3 WRITE call, from its inline part (the RPC
/// header and the arguments up to the data).
fn write_offset(inline: &Bytes) -> Option<u64> {
    use nfsrdma_xdr::nfs3::{NfsFh3, NfsProc3, PROGRAM, VERSION};
    let mut d = nfsrdma_xdr::Decoder::new(inline.clone());
    let h = RpcMessage::decode(&mut d).ok()?;
    let c = h.as_call()?;
    if (c.prog, c.vers, c.proc_) != (PROGRAM, VERSION, NfsProc3::Write as u32) {
        return None;
    }
    NfsFh3::decode(&mut d).ok()?;
    d.u64("offset").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_chunks_land_in_blocks_they_fill() {
        const K: usize = 1024;
        // Aligned records: one piece per 64 KiB, a 4 KiB record alone.
        assert_eq!(landing_pieces(4 * K, 64 * K), [4 * K]);
        assert_eq!(landing_pieces(4 * K, 8 * K), [4 * K]);
        assert_eq!(landing_pieces(128 * K, 64 * K), [64 * K, 64 * K]);
        // A head up to the next 64 KiB boundary and a tail, in powers of
        // two (a sub-page remainder last).
        assert_eq!(
            landing_pieces(40 * K + 64 * K + 12_345, 40 * K),
            [32 * K, 8 * K, 64 * K, 8 * K, 4 * K, 57]
        );
        assert_eq!(landing_pieces(4097, 64 * K), [4096, 1]);
        // Every byte exactly once.
        for (total, head) in [(1, 1), (65_537, 3000), (300_000, 65_536), (12_288, 4096)] {
            let p = landing_pieces(total, head);
            assert_eq!(p.iter().sum::<usize>(), total);
            assert!(p.iter().all(|&n| n > 0 && n <= 64 * K));
        }
    }

    #[test]
    fn adaptive_polling_signals_every_reply_by_default() {
        assert_eq!(RdmaConfig::default_signal_every(PollMode::default()), 1);
        let auto = RdmaConfig::default().poll;
        assert!(matches!(auto, PollMode::Auto { .. }), "{auto}");
        assert_eq!(RdmaConfig::default_signal_every(auto), 1);
        assert_eq!(RdmaConfig::default().signal_every, 1);
        assert_eq!(
            RdmaConfig::default_signal_every("adaptive:1000".parse().unwrap()),
            1
        );
        assert_eq!(RdmaConfig::default_signal_every(PollMode::Event), 16);
        assert_eq!(RdmaConfig::default_signal_every(PollMode::Busy), 16);
        assert_eq!(
            RdmaConfig::default().signal_every,
            RdmaConfig::default_signal_every(RdmaConfig::default().poll)
        );
    }
}
