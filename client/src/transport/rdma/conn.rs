//! One connection: its verbs objects, the RFC 8797 exchange, starting a
//! call, dropping the connection, and tearing its objects down in an order
//! the device accepts.

use super::recv::Receives;
use super::reg::{self, Registered, Registrar};
use super::{rdma_err, Counters, NotSent, Outcome, RECV_BUFFERS, SHUT_DOWN};
use super::{AREA_EXTRA, MAX_INLINE, MIN_INLINE, SOFT_ROCE_ACK_TIMEOUT};
use crate::error::ClientError;
use crate::transport::retry::Link;
use crate::transport::RpcCall;
use crate::{PollMode, RdmaOptions};
use bytes::Bytes;
use nfsrdma_rpcrdma::conn::{Config, Connection, Role, Stats, Work};
use nfsrdma_rpcrdma::negotiate::{self, Offer};
use nfsrdma_rpcrdma::requester::{plan_call, RequesterConfig};
use nfsrdma_transport::rdma::engine::Poller;
use nfsrdma_transport::rdma::verbs::{
    Access, CmEventKind, CmId, CompletionChannel, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, ProtectionDomain, QpCaps, QueuePair, RecvRing, VerbsError, WorkCompletion,
    MAX_ACK_TIMEOUT,
};
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::{Xdr, XdrSink};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};

/// Address and route resolution limit.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One of our calls, as the driver keeps it while the core has it.
pub(super) struct SlotCall {
    pub waiter: Option<oneshot::Sender<Outcome>>,
    pub reg: Option<Registered>,
    pub xid: u32,
    /// When the slot was taken for this call (marshalling starts).
    pub started: Instant,
    /// When its Send was posted.
    pub posted: Instant,
    /// When its reply arrived.
    pub replied: Option<Instant>,
    /// Its inline reply is lent in the receive buffer it landed in.
    pub lent: bool,
}

/// What the state lock guards: the connection core and the calls.
pub(super) struct State {
    pub core: Connection<Bytes>,
    pub calls: Vec<Option<SlotCall>>,
    /// The receive buffers (replies lent in place, spares posted in
    /// their stead).
    pub recv: Receives,
    /// The slot of each call in flight, by XID (for its step times).
    pub xids: nfsrdma_rpcrdma::conn::call::XidMap<usize>,
    /// The core's counters as last added to the transport's.
    pub seen: Stats,
}

/// One RDMA connection and everything registered for it.
pub struct Conn {
    pub(super) id: u64,
    pub(super) counters: Arc<Counters>,
    /// Inline thresholds for planning calls.
    pub(super) cfg: RequesterConfig,
    pub(super) reg: Arc<dyn Registrar>,
    pub(super) offered_ri: bool,
    pub(super) poll: PollMode,
    pub(super) qp: Arc<QueuePair>,
    pub(super) cq: Arc<CompletionQueue>,
    pub(super) channel: Option<Arc<CompletionChannel>>,
    pub(super) send_mr: Arc<MemoryRegion>,
    pub(super) send_size: usize,
    pub(super) st: Mutex<State>,
    /// Held by whoever polls the completion queue (so completions are
    /// handled in queue order), with the buffer the completions land in.
    pub(super) poller: Mutex<(Poller, Vec<WorkCompletion>)>,
    pub(super) notify: Notify,
    /// A caller polls the completion queue itself (`busy` mode).
    pub(super) spinning: AtomicBool,
    /// Told when that caller stops polling.
    pub(super) spinner_gone: Notify,
    pub(super) dead: AtomicBool,
    cm: Arc<CmId>,
    pd: Arc<ProtectionDomain>,
    events: Arc<EventChannel>,
    /// Set when the connection is dropped; dropped last of all fields, it
    /// tells the teardown thread that the references above are gone.
    gate: Option<std::sync::mpsc::Sender<()>>,
}

impl Link for Conn {
    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn id(&self) -> u64 {
        self.id
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("id", &self.id)
            .field("strategy", &self.reg.strategy())
            .field("remote_invalidation", &self.offered_ri)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Sets up and connects (blocking).
    pub(super) fn open(
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
        if let Some(t) = opts
            .ack_timeout
            .filter(|t| !(1..=MAX_ACK_TIMEOUT).contains(t))
        {
            return Err(ClientError::InvalidArgument(format!(
                "ACK timeout exponent {t} is outside 1..={MAX_ACK_TIMEOUT}"
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
        let ack_timeout = opts
            .ack_timeout
            .or(attrs.is_soft_roce().then_some(SOFT_ROCE_ACK_TIMEOUT));
        if let Some(t) = ack_timeout {
            cm.set_ack_timeout(t)
                .map_err(e("setting the ACK timeout"))?;
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
        let area = (opts.max_io.clamp(4096, 1 << 20) as usize + AREA_EXTRA).div_ceil(64) * 64;
        let reg: Arc<dyn Registrar> = reg::new(
            opts.reg,
            &reg::Setup {
                pd: &pd,
                attrs: &attrs,
                slots,
                area,
                counters: &counters,
            },
        )
        .map_err(e("registering chunk memory"))?
        .into();
        // Only memory the peer can invalidate may be offered to it.
        let offered_ri = opts.remote_inv && reg.remote_invalidation();
        let offer = Offer::requester(opts.inline, offered_ri);
        let mut recv = Receives::new(&pd, RECV_BUFFERS, offer.inline as usize)
            .map_err(e("registering receive buffers"))?;
        let mut core = Connection::new(Config {
            credits: 0,
            calls: RECV_BUFFERS,
            call_reserve: 1,
            accept_remote_invalidation: offered_ri,
            role: Role::Requester,
            send_slots: RECV_BUFFERS,
            sq_depth,
            inline_send: offer.inline,
            inline_recv: offer.inline,
            ..Config::default()
        });
        // Receives go up before connecting.
        while let Some(w) = core.poll_work() {
            if let Work::Recv { buffer, wr } = w {
                recv.post(&qp, buffer, wr.0)
                    .map_err(|err| rdma_err(&format!("{addr}: receive"), err))?;
            }
        }
        let depth = attrs
            .max_qp_rd_atom
            .min(attrs.max_qp_init_rd_atom)
            .clamp(1, 16) as u8;
        let param = ConnParam {
            private_data: offer.message().to_vec(),
            responder_resources: depth,
            initiator_depth: depth,
            ..ConnParam::default()
        };
        let peer = cm
            .connect_and_wait(&param, timeout)
            .map_err(e("connecting"))?;
        let agreed = negotiate::agree(&offer, Some(&peer.private_data));
        let ack = qp.ack_timeout().map_err(e("querying the queue pair"))?;
        counters
            .ack_timeout
            .store(u64::from(ack), Ordering::Relaxed);
        let cfg = RequesterConfig {
            inline_send: agreed.inline_send,
            inline_recv: agreed.inline_recv,
        };
        let send_size = cfg.inline_send as usize;
        let send_mr = MemoryRegion::new(&pd, slots * send_size, Access::LOCAL)
            .map_err(e("registering send buffers"))?;
        let poller = Poller::new(vec![cq.clone()], opts.poll)
            .map_err(|err| rdma_err(&format!("{addr}: completion engine"), err))?;
        tracing::info!(
            %addr,
            conn = id,
            inline_send = cfg.inline_send,
            inline_recv = cfg.inline_recv,
            strategy = ?reg.strategy(),
            remote_invalidation = offered_ri,
            server_accepts_remote_invalidation = agreed.peer_accepts_remote_invalidation,
            ack_timeout = ack,
            "RPC-over-RDMA connection up"
        );
        Ok(Arc::new(Conn {
            id,
            counters,
            cfg,
            reg,
            offered_ri,
            poll: opts.poll,
            qp,
            cq,
            channel,
            send_mr,
            send_size,
            st: Mutex::new(State {
                core,
                calls: (0..slots).map(|_| None).collect(),
                recv,
                xids: Default::default(),
                seen: Stats::default(),
            }),
            poller: Mutex::new((poller, Vec::with_capacity(64))),
            notify: Notify::new(),
            spinning: AtomicBool::new(false),
            spinner_gone: Notify::new(),
            dead: AtomicBool::new(false),
            cm: Arc::new(cm),
            pd,
            events,
            gate: None,
        }))
    }

    /// Starts the completion thread and the connection manager watcher.
    pub(super) fn start_threads(self: &Arc<Self>) -> Result<(), ClientError> {
        let c2 = self.clone();
        std::thread::Builder::new()
            .name(format!("rdma-cq-{}", self.id))
            .spawn(move || c2.run())
            .map_err(|e| ClientError::Rdma(format!("starting the completion thread: {e}")))?;
        let c3 = self.clone();
        if let Err(e) = std::thread::Builder::new()
            .name(format!("rdma-cm-{}", self.id))
            .spawn(move || c3.watch_cm())
        {
            self.kill("no connection manager thread");
            return Err(ClientError::Rdma(format!(
                "starting the connection manager thread: {e}"
            )));
        }
        Ok(())
    }

    pub(super) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Drops the connection (see [`Conn::kill_locked`]).
    pub fn kill(&self, reason: &str) {
        let mut st = lock(&self.st);
        self.kill_locked(&mut st, reason);
    }

    /// Marks the connection dead and sends every waiting call off to be
    /// retransmitted. The registrations are fenced when the connection's
    /// objects are destroyed (windows, queue pair, regions, PD; see
    /// [`Teardown`]) once the last reference to it is gone.
    pub(super) fn kill_locked(&self, st: &mut State, reason: &str) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        if reason == SHUT_DOWN {
            // Asked for: nothing went wrong.
            tracing::debug!(conn = self.id, reason, "closing the RDMA connection");
        } else {
            tracing::warn!(conn = self.id, reason, "dropping the RDMA connection");
        }
        for c in st.calls.iter_mut().flatten() {
            if let Some(w) = c.waiter.take() {
                let _ = w.send(Outcome::Lost);
            }
        }
        st.xids.clear();
        st.core.close_now();
        let _ = self.cm.disconnect();
        self.notify.notify_waiters();
    }

    /// Waits for a free slot within the credit limit.
    ///
    /// Waiters queue on `notify` and are woken one at a time
    /// (`notify_one`): whatever may free a slot wakes one, and a waiter that
    /// takes a slot wakes the next, who takes another or waits again. Waking
    /// them all on every reply made each completion cost a poll of every
    /// waiting caller (docs/benchmarks.md has the figures at 256 calls in
    /// flight on one connection).
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
                if let Some(s) = st.core.reserve_call() {
                    drop(st);
                    // Another slot may be free as well (several replies
                    // handled at once, or a higher credit limit).
                    self.notify.notify_one();
                    return Some(s as usize);
                }
            }
            notified.await;
        }
    }

    /// Takes a slot, registers what the call needs and posts the Send.
    /// Returns the receiver of the outcome.
    pub(super) async fn start_call(
        &self,
        xid: u32,
        call: &RpcCall<'_>,
    ) -> Result<oneshot::Receiver<Outcome>, NotSent> {
        let slot = self.acquire().await.ok_or(NotSent::Lost)?;
        // From here on nothing awaits: the slot is either given to the
        // core's call or handed back before this returns.
        match self.post_call(slot, xid, call) {
            Ok(rx) => Ok(rx),
            Err(o) => {
                let mut st = lock(&self.st);
                if st.calls[slot].is_none() {
                    st.core.unreserve_call(slot as u32);
                    self.notify.notify_one();
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
        let plan = plan_call(xid, &self.cfg, call.expect, &encode);
        if (plan.read.as_ref().is_some_and(|(_, p)| p.is_empty()))
            || plan.write_chunk == Some(0)
            || plan.reply_chunk == Some(0)
        {
            return Err(fatal("empty chunk planned".into()));
        }
        for (used, n) in [
            (plan.read.is_some(), &self.counters.read_chunks),
            (plan.write_chunk.is_some(), &self.counters.write_chunks),
            (plan.reply_chunk.is_some(), &self.counters.reply_chunks),
        ] {
            if used {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
        let mut reg = self.reg.register(slot, &plan).map_err(fatal)?;
        let header = plan.header(RECV_BUFFERS, &reg.segments);
        let len = header.len() + plan.inline.iter().map(Bytes::len).sum::<usize>();
        if len > self.send_size {
            return Err(fatal(format!(
                "a call of {len} bytes exceeds the inline threshold {}",
                self.send_size
            )));
        }
        let mut message = Vec::with_capacity(1 + plan.inline.len());
        message.push(header);
        message.extend(plan.inline.iter().cloned());
        let (tx, rx) = oneshot::channel();
        let mut st = lock(&self.st);
        if self.is_dead() {
            return Err(NotSent::Lost);
        }
        let fence = std::mem::take(&mut reg.fence);
        let pre = reg.pre;
        st.calls[slot] = Some(SlotCall {
            waiter: Some(tx),
            reg: Some(reg),
            xid,
            started,
            posted: started,
            replied: None,
            lent: false,
        });
        st.xids.insert(xid, slot);
        st.core.start_call(slot as u32, plan, message, fence, pre);
        self.drive(&mut st);
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
}

impl Drop for Conn {
    /// The verbs objects are destroyed on a thread of their own: whoever
    /// drops the last reference (often the task that has just reconnected,
    /// on an async worker, holding the connection lock) must not wait for
    /// verbs calls.
    fn drop(&mut self) {
        let (calls, recv) = {
            let mut st = lock(&self.st);
            (std::mem::take(&mut st.calls), st.recv.ring().clone())
        };
        let t = Teardown {
            id: self.id,
            reg: self.reg.clone(),
            qp: self.qp.clone(),
            calls,
            recv,
            send: self.send_mr.clone(),
            cq: self.cq.clone(),
            channel: self.channel.take(),
            cm: self.cm.clone(),
            pd: self.pd.clone(),
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

/// What a connection created and registered, in the order it is destroyed.
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
    reg: Arc<dyn Registrar>,
    qp: Arc<QueuePair>,
    calls: Vec<Option<SlotCall>>,
    recv: RecvRing,
    send: Arc<MemoryRegion>,
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
            reg,
            qp,
            calls,
            recv,
            send,
            cq,
            channel,
            cm,
            pd,
            events,
        } = self;
        reg.release_windows();
        let t1 = Instant::now();
        drop(qp);
        let qp_took = t1.elapsed();
        // A reply still held by its caller keeps the receive ring's
        // region (and the protection domain) until it is dropped.
        drop((calls, reg, recv, send));
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
