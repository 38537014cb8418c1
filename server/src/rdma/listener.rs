//! The connection manager thread: listens, answers each connect request
//! (the RFC 8797 exchange, the Read depth, each connection's verbs
//! objects, its place in the pool of threads that serve it), and tears
//! connections down when the peer goes or the listener stops.

use super::conn::{Conn, Verbs};
use super::worker::{Placement, Pool, SharedSpec};
use super::{RdmaConfig, RdmaDevice, RdmaStats};
use crate::service::{CallContext, Service};
use nfsrdma_rpcrdma::conn::{Config, Connection};
use nfsrdma_rpcrdma::negotiate::{self, Offer};
use nfsrdma_transport::rdma::verbs::{
    Access, CmEventKind, CmId, CmIdHandle, ConnParam, ConnectRequest, EventChannel, MemoryRegion,
    QpCaps, RecvRing, VerbsError,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// A running RDMA listener.
pub struct RdmaListener {
    port: u16,
    stop: Arc<AtomicBool>,
    /// Requests to drop every connection, each with where to answer how
    /// many were dropped.
    disconnect: mpsc::Sender<mpsc::Sender<usize>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<RdmaStats>,
    shared_receives: bool,
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
        let stats = Arc::new(RdmaStats::default());
        let attrs = device.ctx.query()?;
        let credits = cfg.credits.max(1);
        let per_connection = Pool::entries_per_connection(
            send_queue_depth(credits, attrs.max_qp_wr),
            credits + cfg.backward_calls,
        );
        let shared = if cfg.srq_buffers == 0 {
            None
        } else if attrs.max_srq == 0 {
            tracing::warn!(
                "the RDMA device has no shared receive queues: each connection posts receives of its own"
            );
            None
        } else {
            // All of a thread's buffers may complete on one of its CQs.
            let most = attrs.max_srq_wr.min(attrs.max_cqe / 2);
            if cfg.srq_buffers > most {
                return Err(VerbsError::InvalidArgument(format!(
                    "--rdma-srq {}: this device takes at most {most} buffers on a shared receive \
                     queue (max_srq_wr {}, half its largest CQ {})",
                    cfg.srq_buffers, attrs.max_srq_wr, attrs.max_cqe
                )));
            }
            Some(SharedSpec {
                pd: device.pd.clone(),
                buffers: cfg.srq_buffers,
                size: Offer::responder(cfg.inline_size).inline as usize,
            })
        };
        let pool = Pool::start(
            &device.ctx,
            cfg.threads,
            cfg.poll,
            per_connection,
            attrs.max_cqe,
            shared,
            stats.clone(),
            service.clone(),
        )?;
        let shared_receives = pool.has_shared_receives();
        let channel = EventChannel::new()?;
        let listen = CmId::new(&channel)?;
        listen.bind_addr(cfg.addr)?;
        listen.listen(64)?;
        let port = listen.local_port();
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, st2) = (stop.clone(), stats.clone());
        let (disconnect, requests) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("rdma-cm".into())
            .spawn(move || {
                cm_loop(
                    channel, listen, service, cfg, device, pool, s2, st2, requests,
                )
            })
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
            shared_receives,
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

    /// Whether connections receive on their pool thread's shared receive
    /// queue (asked for, and the device has them).
    pub fn shared_receives(&self) -> bool {
        self.shared_receives
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

    /// Stops listening, disconnects every connection and waits for the
    /// connection manager and pool threads.
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

/// A connection as the connection manager thread knows it.
struct ConnHandle {
    id: Arc<CmId>,
    at: Placement,
    qp_num: u32,
    /// Set by its pool thread once it has dropped the connection.
    done: Arc<AtomicBool>,
}

/// How long the connection manager waits for a pool thread to drop a
/// connection.
const REMOVE_WAIT: Duration = Duration::from_secs(10);

/// Asks each connection's pool thread to drop it and disconnects it, then
/// waits until they are gone and frees their places.
fn shut(pool: &mut Pool, conns: impl IntoIterator<Item = ConnHandle>) {
    let pending: Vec<_> = conns
        .into_iter()
        .map(|c| {
            let gone = pool.remove(&c.at, c.qp_num);
            let _ = c.id.disconnect();
            (c, gone)
        })
        .collect();
    for (c, gone) in pending {
        if gone.recv_timeout(REMOVE_WAIT).is_err() && !c.done.load(Ordering::Acquire) {
            tracing::warn!("RDMA pool thread did not drop a connection in time");
        }
        pool.release(&c.at);
    }
}

#[allow(clippy::too_many_arguments)]
fn cm_loop(
    channel: Arc<EventChannel>,
    _listen: CmId,
    service: Arc<Service>,
    cfg: RdmaConfig,
    device: Arc<RdmaDevice>,
    mut pool: Pool,
    stop: Arc<AtomicBool>,
    stats: Arc<RdmaStats>,
    disconnect: mpsc::Receiver<mpsc::Sender<usize>>,
) {
    let mut conns: HashMap<CmIdHandle, ConnHandle> = HashMap::new();
    // Refusals since the last warning: one line per 10 s at most.
    let mut refused_since_warning = 0u64;
    let mut last_warning: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        forget_ended(&mut conns, &mut pool);
        while let Ok(done) = disconnect.try_recv() {
            let n = conns.len();
            shut(&mut pool, conns.drain().map(|(_, c)| c));
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
                forget_ended(&mut conns, &mut pool);
                if conns.len() >= cfg.max_connections {
                    // Rejected at once: no queue pair, no buffers, no
                    // place in the pool for it.
                    if let Err(e) = req.id.reject(&[]) {
                        tracing::debug!(error = %e, "rejecting an RDMA connect request");
                    }
                    stats.refused_connections.fetch_add(1, Ordering::Relaxed);
                    refused_since_warning += 1;
                    if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(
                            max_connections = cfg.max_connections,
                            refused = refused_since_warning,
                            peer = ?req.id.peer_addr(),
                            "RDMA connect requests rejected: --max-connections connections are open"
                        );
                        refused_since_warning = 0;
                        last_warning = Some(Instant::now());
                    }
                    continue;
                }
                match accept(req, &service, &cfg, &device, &mut pool, &stats) {
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
                    shut(&mut pool, [c]);
                }
            }
            _ => {}
        }
    }
    shut(&mut pool, conns.drain().map(|(_, c)| c));
    pool.stop();
}

/// Forgets the connections that ended on their own (their pool thread has
/// dropped them), freeing their places in the pool.
fn forget_ended(conns: &mut HashMap<CmIdHandle, ConnHandle>, pool: &mut Pool) {
    conns.retain(|_, c| {
        let ended = c.done.load(Ordering::Acquire);
        if ended {
            pool.release(&c.at);
        }
        !ended
    });
}

/// The send queue's depth for `credits`: room for each reply's Send and
/// its RDMA Writes, within the device's limit.
fn send_queue_depth(credits: u32, max_qp_wr: u32) -> u32 {
    (4 * credits).min(max_qp_wr.max(64))
}

/// Backward calls (RFC 8167: the server's NFSv4.1 callbacks) one
/// connection can have waiting for their replies: a receive buffer and a
/// send buffer each. A session's calls go one at a time; the rest stand
/// for other sessions bound to the connection and for calls whose
/// replies never came (they hold their slot until the connection ends).
pub const BACKWARD_CALLS: u32 = 4;

/// Scatter/gather entries per RDMA Write, at most.
const MAX_SEND_SGE: u32 = 16;

/// Receiver-not-ready retries, both ways: how many times a Send that
/// finds no receive posted at the other end is sent again before it fails
/// and the connection with it.
///
/// RFC 8166 leaves no room for an RNR NAK on a well-behaved connection: a
/// requester posts the receive for a reply before it sends the call
/// (§3.3.1), and a responder posts receives before it grants the credits
/// that let the requester send into them. So a NAK means a peer broke the
/// rules, and waiting for ever on it is what must not happen:
/// - our Sends (replies, RDMA_ERROR) are retried at most this many times,
///   whatever the requester asked for in its connect request (7 there
///   would mean "for ever", and a requester that posts no receives would
///   then stall the connection until it disconnects). The requester's RNR
///   timer spaces the tries, 655 ms at the most, so a Send fails within
///   (1 + RNR_RETRY) x 655 ms = 2.6 s; the connection then closes and
///   counts in `peer_not_receiving`;
/// - the requester's Sends get the same count in our accept: a requester
///   beyond its credits finds every receive held by its own calls, and its
///   Send fails on its side once the calls before it are not answered in
///   time. A requester that keeps within its credits never sees a NAK.
///
/// The Linux client asks for 0 retries of our Sends, which is kept (the
/// smaller count wins).
///
/// A connection on a shared receive queue (`--rdma-srq`) is the exception
/// for the requester's Sends: there a requester within its credits can
/// find the queue empty (the queue is sized for the traffic, not for
/// every credit granted), which is no fault of its own. Its Sends are
/// retried for ever ([`SRQ_PEER_RNR_RETRY`]) and spaced by
/// [`SRQ_RNR_TIMER`], so such a Send waits for a buffer to be posted
/// again, not 655 ms per try nor for its connection to fail.
pub const RNR_RETRY: u8 = 3;

/// The requester's RNR retries on a shared receive queue: 7, for ever.
pub const SRQ_PEER_RNR_RETRY: u8 = 7;

/// The wait asked of a requester whose Send found the shared receive
/// queue empty: IB RNR timer code 14, 1.28 ms (the connection manager's
/// default, code 0, is 655.36 ms). A buffer comes back as soon as a call
/// that held one is done with.
pub const SRQ_RNR_TIMER: u8 = 14;

/// Chooses both sides' parameters, sets the connection up on its place
/// in the pool (its receives posted before the first credit is granted)
/// and accepts.
fn accept(
    req: ConnectRequest,
    service: &Arc<Service>,
    cfg: &RdmaConfig,
    device: &Arc<RdmaDevice>,
    pool: &mut Pool,
    stats: &Arc<RdmaStats>,
) -> Result<ConnHandle, VerbsError> {
    let ctx = req.id.context()?;
    if !ctx.same_as(&device.ctx) {
        return Err(VerbsError::InvalidArgument(
            "connection on another RDMA device than the store's".into(),
        ));
    }
    let at = pool.place()?;
    let r = set_up(req, service, cfg, device, pool, stats, &at);
    if r.is_err() {
        pool.release(&at);
    }
    r
}

/// [`accept`] once the connection has its place in the pool (`at`).
fn set_up(
    req: ConnectRequest,
    service: &Arc<Service>,
    cfg: &RdmaConfig,
    device: &Arc<RdmaDevice>,
    pool: &Pool,
    stats: &Arc<RdmaStats>,
    at: &Placement,
) -> Result<ConnHandle, VerbsError> {
    let offer = Offer::responder(cfg.inline_size);
    let agreed = negotiate::agree(&offer, Some(&req.param.private_data));
    let ours = offer.inline;
    let peer = req
        .id
        .peer_addr()
        .unwrap_or_else(|| ([0, 0, 0, 0], 0).into());
    let attrs = device.ctx.query()?;
    let pd = device.pd.clone();
    let credits = cfg.credits.max(1);
    // Backward calls (RFC 8167): none without NFSv4, the only protocol
    // that calls the client back over RDMA. Their replies take receives
    // as calls do: the connection's own, or the shared queue's.
    let backward = if service.config().nfs4.enabled() {
        cfg.backward_calls
    } else {
        0
    };
    let sq_depth = send_queue_depth(credits, attrs.max_qp_wr);
    let max_sge = attrs.max_sge.clamp(1, MAX_SEND_SGE);
    let caps = QpCaps {
        max_send_wr: sq_depth,
        max_recv_wr: credits + backward,
        max_send_sge: max_sge,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let (qp, ring) = match &at.shared {
        Some(s) => (
            req.id.create_qp_on_srq(&pd, &at.cq, &at.cq, caps, &s.srq)?,
            s.ring.clone(),
        ),
        None => (
            req.id.create_qp(&pd, &at.cq, &at.cq, caps)?,
            RecvRing::new(&pd, (credits + backward) as usize, ours as usize)?,
        ),
    };
    let qp_num = qp.qp_num();
    // One send buffer per credit (replies), then one per backward call.
    let send_mr = MemoryRegion::new(
        &pd,
        (credits + backward) as usize * ours as usize,
        Access::LOCAL,
    )?;
    // In the request as the listener sees it, `initiator_depth` bounds the
    // RDMA Reads we may have outstanding towards the peer and
    // `responder_resources` the peer's Reads we must serve (none, in this
    // protocol); both within the device's limits.
    let read_depth = req
        .param
        .initiator_depth
        .min(attrs.max_qp_init_rd_atom.min(255) as u8)
        .max(1);
    let core = Connection::new(Config {
        credits,
        calls: backward,
        // (What the client grants for backward calls is all the limit:
        // none kept in reserve.)
        call_reserve: 0,
        send_slots: credits,
        sq_depth,
        read_depth: u32::from(read_depth),
        chunk_slots: cfg.chunk_slots.max(1) as u32,
        chunk_size: cfg.chunk_size() as u32,
        max_sge,
        signal_every: cfg.signal_every.max(1),
        inline_send: agreed.inline_send,
        inline_recv: ours,
        remote_invalidation: agreed.peer_accepts_remote_invalidation,
        shared_receives: at.shared.is_some(),
        ..Config::default()
    });
    let accept_param = ConnParam {
        private_data: offer.message().to_vec(),
        responder_resources: req
            .param
            .responder_resources
            .min(attrs.max_qp_rd_atom.min(255) as u8),
        initiator_depth: read_depth,
        rnr_retry_count: if at.shared.is_some() {
            SRQ_PEER_RNR_RETRY
        } else {
            RNR_RETRY
        },
        ..ConnParam::default()
    };
    let rnr_timer = at.shared.is_some().then_some(SRQ_RNR_TIMER);
    let id = Arc::new(req.id);
    let mut call_ctx = CallContext::from(peer);
    if backward > 0 {
        call_ctx.back = Some(pool.back_conn(at, qp_num, agreed.inline_send)?);
    }
    let mut conn = Conn::new(
        core,
        Verbs {
            qp,
            ring,
            shared: at.shared.clone(),
            send_mr,
            arena: device.arena.clone(),
            slot_size: ours as usize,
        },
        service.clone(),
        call_ctx,
        stats.clone(),
    );
    // Receives go up before the first credit is granted, and the pool
    // thread has the connection before the peer can send: a completion of
    // its queue pair always finds it there.
    conn.drive()
        .map_err(|e| VerbsError::InvalidArgument(format!("posting receives: {e}")))?;
    let done = Arc::new(AtomicBool::new(false));
    pool.adopt(at, conn, id.clone(), done.clone())?;
    let handle = ConnHandle {
        id,
        at: at.clone(),
        qp_num,
        done,
    };
    let rnr_retry = match handle
        .id
        .accept_bounding_rnr(&accept_param, RNR_RETRY, rnr_timer)
    {
        Ok(r) => r,
        Err(e) => {
            let gone = pool.remove(at, qp_num);
            let _ = gone.recv_timeout(REMOVE_WAIT);
            return Err(e);
        }
    };
    stats.connections.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        peer = %peer,
        credits,
        rnr_retry,
        peer_rnr_retry = accept_param.rnr_retry_count,
        backward_calls = backward,
        inline_send = agreed.inline_send,
        remote_invalidation = agreed.peer_accepts_remote_invalidation,
        read_depth,
        thread = at.thread,
        "RDMA connection"
    );
    Ok(handle)
}
