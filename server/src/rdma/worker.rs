//! The pool of threads that serve RDMA connections: a fixed number of
//! threads (`--rdma-threads`, by default one per core), each waiting for
//! the completions of every connection placed on it, so the thread count
//! does not grow with the clients.
//!
//! Each pool thread has one completion channel and a few completion
//! queues on it; a connection's queue pair completes on one of its
//! thread's CQs, shared with other connections (a CQ holds the entries of
//! [`Pool::connections_per_cq`] connections, each
//! [`Pool::entries_per_connection`], so it can never overflow), and each
//! completion goes to its connection by queue pair number. The thread
//! waits in the listener's polling mode ([`PollMode`]), over all of its
//! CQs: while one of its connections is busy it spins for all of them.
//!
//! The connection manager thread decides: which thread and CQ a new
//! connection goes to (the thread with the fewest connections; a CQ with
//! room, or a new one), and when one leaves. A pool thread only carries
//! out what it is sent ([`Msg`]) and reports a connection that ended on
//! its own by setting its `done` flag. A message wakes the thread from its
//! sleep on the completion channel (its [`Waker`]).
//!
//! A call that may run long (a COPY, say) is not run to its end on the
//! pool thread: [`super::long`]'s threads finish it and send the reply
//! back ([`Msg::Answer`]), so the thread's other connections are served
//! meanwhile.

use super::conn::{Conn, ConnError};
use super::long::{Back, LongSender, LongThreads};
use super::shared::SharedRecv;
use super::RdmaStats;
use crate::service::metrics::Transport;
use crate::service::nfs4::callback::BackConn;
use crate::service::{Reply, Service};
use bytes::Bytes;
use nfsrdma_rpcrdma::conn::{CallId, WrId, WrKind};
use nfsrdma_transport::rdma::engine::{PollMode, Poller, WAIT_SLICE};
use nfsrdma_transport::rdma::verbs::{
    CmId, CompletionChannel, CompletionQueue, Context, ProtectionDomain, VerbsError, Waker,
    WorkCompletion,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest sleep of a pool thread while every receive of its
/// connections is posted. Only a completion or a message has work for the
/// thread then, and each wakes it: a completion through the completion
/// channel, a message (from the connection manager, or the reply of a
/// long call) through the thread's [`Waker`]. The limit only bounds how
/// long a wake-up that never comes could delay work; each pool thread pays one
/// wake-up per `IDLE_WAIT` when idle ([`RdmaStats::idle_wakeups`]),
/// however many connections it holds. While a receive waits for its
/// buffer (deferred), the thread looks again every [`WAIT_SLICE`].
pub const IDLE_WAIT: Duration = Duration::from_secs(1);

/// How long a connection whose work was flushed waits for the connection
/// manager's report of a disconnect before it counts as an error.
pub const FLUSH_GRACE: Duration = Duration::from_secs(2);

/// Bytes of an RDMA_MSG transport header with three empty chunk lists:
/// the header of every message in the backward direction (RFC 8167 §4).
pub const BARE_HEADER: u32 = 28;

/// The most connections sharing one completion queue.
pub const MAX_CONNECTIONS_PER_CQ: u32 = 32;

/// What the connection manager sends a pool thread.
pub enum Msg {
    /// Serve this connection (its receives are posted; its queue pair
    /// completes on `cq`, which the thread polls from now on).
    Add {
        /// The connection.
        conn: Box<Conn>,
        /// Its connection manager id: disconnected if the connection ends
        /// with an error of its own.
        id: Arc<CmId>,
        /// The CQ its queue pair completes on.
        cq: Arc<CompletionQueue>,
        /// Set once the thread has dropped the connection.
        done: Arc<AtomicBool>,
        /// The connection's number in the pool ([`Placement::serial`]).
        serial: u64,
    },
    /// Drop this connection (the peer went away, or the listener drops
    /// every connection); answer on `ack` once it is dropped.
    Remove {
        /// The connection's queue pair number.
        qp_num: u32,
        /// The connection's number in the pool: a queue pair number can
        /// be taken again by a new connection once its queue pair is
        /// destroyed, and only the connection meant is dropped.
        serial: u64,
        /// Told when the connection is gone.
        ack: mpsc::Sender<()>,
    },
    /// Stop polling this CQ: no connection of the thread is on it.
    DropCq(Arc<CompletionQueue>),
    /// Drop every connection and stop.
    Stop,
    /// The reply of a call of this connection, finished on a thread for
    /// long calls ([`super::long`]); dropped if the connection is gone.
    Answer {
        /// The connection's queue pair number.
        qp_num: u32,
        /// The connection's number in the pool.
        serial: u64,
        /// The call.
        call: CallId,
        /// Its reply.
        reply: Box<Reply>,
    },
    /// A backward call (RFC 8167) to send on this connection: the RPC
    /// call message's parts (the backchannel's, [`BackConn`]).
    BackCall {
        /// The connection's queue pair number.
        qp_num: u32,
        /// The connection's number in the pool.
        serial: u64,
        /// The RPC call message.
        parts: Vec<Bytes>,
    },
}

/// Where a connection is served: a pool thread and one of its CQs.
#[derive(Clone)]
pub struct Placement {
    /// The pool thread.
    pub thread: usize,
    /// The CQ its queue pair is to complete on.
    pub cq: Arc<CompletionQueue>,
    /// The connection's number in the pool, never reused.
    pub serial: u64,
    /// The thread's shared receive queue, when it has one: the queue pair
    /// takes its receives from it.
    pub shared: Option<Arc<SharedRecv>>,
}

struct CqRoom {
    cq: Arc<CompletionQueue>,
    connections: u32,
}

struct Thread {
    tx: mpsc::Sender<Msg>,
    /// Wakes the thread for a message.
    waker: Arc<Waker>,
    channel: Arc<CompletionChannel>,
    /// The thread's CQs; the first stays for the thread's life.
    cqs: Vec<CqRoom>,
    connections: usize,
    handle: Option<JoinHandle<()>>,
    shared: Option<Arc<SharedRecv>>,
}

/// The pool, as the connection manager thread holds it.
pub struct Pool {
    ctx: Context,
    threads: Vec<Thread>,
    per_connection: u32,
    per_cq: u32,
    /// CQ entries beyond the connections' own: a thread's shared receive
    /// queue's buffers, all of which may complete on one CQ.
    extra_cqe: u32,
    placed: u64,
    long: LongThreads,
}

/// Shared receive queues for the pool threads: `buffers` each, of `size`
/// bytes, on `pd` ([`super::shared`]).
pub struct SharedSpec {
    /// The protection domain the queue pairs are on.
    pub pd: Arc<ProtectionDomain>,
    /// Buffers per thread.
    pub buffers: u32,
    /// Bytes per buffer (our inline threshold).
    pub size: usize,
}

impl Pool {
    /// Starts `threads` pool threads (at least 1) on the device `ctx`,
    /// waiting in `mode`, for connections whose queue pairs take at most
    /// `per_connection` CQ entries each; CQs of at most `max_cqe` entries.
    /// As many threads for long calls ([`super::long`]) start with them.
    /// With `shared`, each thread gets a shared receive queue; a device
    /// that has none leaves every thread without one (logged: see
    /// [`Pool::has_shared_receives`]).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        ctx: &Context,
        threads: usize,
        mode: PollMode,
        per_connection: u32,
        max_cqe: u32,
        shared: Option<SharedSpec>,
        stats: Arc<RdmaStats>,
        service: Arc<Service>,
    ) -> Result<Pool, VerbsError> {
        let per_connection = per_connection.max(1);
        let extra_cqe = shared.as_ref().map_or(0, |s| s.buffers);
        let per_cq = Pool::connections_per_cq(per_connection, max_cqe.saturating_sub(extra_cqe));
        let threads = threads.max(1);
        let mut pool = Pool {
            ctx: ctx.clone(),
            threads: Vec::new(),
            per_connection,
            per_cq,
            extra_cqe,
            placed: 0,
            long: LongThreads::start(threads, service, stats.clone())?,
        };
        let mut shared = shared;
        for i in 0..threads {
            let srq = match &shared {
                Some(spec) => {
                    match SharedRecv::new(&spec.pd, spec.buffers, spec.size, stats.clone()) {
                        Ok(s) => Some(s),
                        Err(e) if i == 0 => {
                            tracing::warn!(
                                error = %e,
                                buffers = spec.buffers,
                                "no shared receive queue could be created: each connection posts receives of its own"
                            );
                            shared = None;
                            pool.extra_cqe = 0;
                            pool.per_cq = Pool::connections_per_cq(per_connection, max_cqe);
                            None
                        }
                        Err(e) => return Err(e),
                    }
                }
                None => None,
            };
            let channel = CompletionChannel::new(ctx)?;
            let cq = CompletionQueue::new(
                ctx,
                per_connection * pool.per_cq + pool.extra_cqe,
                Some(&channel),
            )?;
            let mut poller = Poller::new(vec![cq.clone()], mode)
                .map_err(|e| VerbsError::InvalidArgument(format!("completion engine: {e}")))?;
            let waker = Arc::new(Waker::new()?);
            poller.set_waker(waker.clone());
            let (tx, rx) = mpsc::channel();
            let t = PoolThread::new(
                poller,
                rx,
                stats.clone(),
                pool.long.sender(),
                (tx.clone(), waker.clone()),
                srq.clone(),
            );
            let handle = std::thread::Builder::new()
                .name(format!("rdma-pool-{i}"))
                .spawn(move || t.run())
                .map_err(|e| VerbsError::Call {
                    call: "spawn",
                    source: e,
                })?;
            pool.threads.push(Thread {
                tx,
                waker,
                channel,
                cqs: vec![CqRoom { cq, connections: 0 }],
                connections: 0,
                handle: Some(handle),
                shared: srq,
            });
        }
        Ok(pool)
    }

    /// Whether the threads receive on shared receive queues.
    pub fn has_shared_receives(&self) -> bool {
        self.threads.iter().any(|t| t.shared.is_some())
    }

    /// Connections sharing one CQ: as many as a CQ of the device's largest
    /// size holds entries for, at most [`MAX_CONNECTIONS_PER_CQ`], at
    /// least 1.
    pub fn connections_per_cq(per_connection: u32, max_cqe: u32) -> u32 {
        (max_cqe / per_connection.max(1)).clamp(1, MAX_CONNECTIONS_PER_CQ)
    }

    /// The CQ entries a connection's queue pair may take: its send queue
    /// and its receive queue, and a margin.
    pub fn entries_per_connection(sq_depth: u32, credits: u32) -> u32 {
        sq_depth + credits + 16
    }

    /// Where a new connection goes: the thread with the fewest
    /// connections, on a CQ of its with room (a new one, armed, when none
    /// has). The room is taken until [`Pool::release`].
    pub fn place(&mut self) -> Result<Placement, VerbsError> {
        let (i, t) = self
            .threads
            .iter_mut()
            .enumerate()
            .min_by_key(|(_, t)| t.connections)
            .ok_or_else(|| VerbsError::InvalidArgument("no pool threads".into()))?;
        let room = match t.cqs.iter_mut().find(|r| r.connections < self.per_cq) {
            Some(r) => r,
            None => {
                let cq = CompletionQueue::new(
                    &self.ctx,
                    self.per_connection * self.per_cq + self.extra_cqe,
                    Some(&t.channel),
                )?;
                // Armed before any queue pair completes on it: its first
                // completion wakes the thread even before the thread polls
                // it (the thread then takes the connection from its
                // messages first).
                cq.req_notify(false)?;
                t.cqs.push(CqRoom { cq, connections: 0 });
                t.cqs.last_mut().expect("just pushed")
            }
        };
        room.connections += 1;
        t.connections += 1;
        self.placed += 1;
        Ok(Placement {
            thread: i,
            cq: room.cq.clone(),
            serial: self.placed,
            shared: t.shared.clone(),
        })
    }

    /// Hands a connection (its receives posted) to its thread.
    pub fn adopt(
        &self,
        at: &Placement,
        conn: Conn,
        id: Arc<CmId>,
        done: Arc<AtomicBool>,
    ) -> Result<(), VerbsError> {
        let t = &self.threads[at.thread];
        t.tx.send(Msg::Add {
            conn: Box::new(conn),
            id,
            cq: at.cq.clone(),
            done,
            serial: at.serial,
        })
        .map_err(|_| VerbsError::InvalidArgument("the pool thread has stopped".into()))?;
        t.waker.wake();
        Ok(())
    }

    /// The backchannel of the connection at `at` (queue pair `qp_num`),
    /// for the NFSv4.1 service: a call handed to it goes to the
    /// connection's pool thread, which sends it as a backward call; the
    /// reply comes back through [`BackConn::deliver`]. A call too large to
    /// travel inline (`inline_send`, the client's receive size, less the
    /// transport header) is refused at once, as is any once the thread
    /// has stopped.
    pub fn back_conn(
        &self,
        at: &Placement,
        qp_num: u32,
        inline_send: u32,
    ) -> Result<Arc<BackConn>, VerbsError> {
        let t = &self.threads[at.thread];
        let (tx, waker) = (t.tx.clone(), t.waker.clone());
        let serial = at.serial;
        let room = inline_send.saturating_sub(BARE_HEADER) as usize;
        let home = t.handle.as_ref().map(|h| h.thread().id());
        Ok(BackConn::served_by(
            Transport::Rdma,
            home,
            move |parts: Vec<Bytes>| {
                if parts.iter().map(Bytes::len).sum::<usize>() > room {
                    return false;
                }
                let sent = tx
                    .send(Msg::BackCall {
                        qp_num,
                        serial,
                        parts,
                    })
                    .is_ok();
                if sent {
                    waker.wake();
                }
                sent
            },
        ))
    }

    /// Asks the connection's thread to drop it; the answer comes on the
    /// returned receiver once it is gone (or the thread has stopped).
    pub fn remove(&self, at: &Placement, qp_num: u32) -> mpsc::Receiver<()> {
        let (ack, rx) = mpsc::channel();
        let t = &self.threads[at.thread];
        let _ = t.tx.send(Msg::Remove {
            qp_num,
            serial: at.serial,
            ack,
        });
        t.waker.wake();
        rx
    }

    /// The connection at `at` is gone: its CQ room is free again, and a
    /// CQ left empty (other than the thread's first) is dropped.
    pub fn release(&mut self, at: &Placement) {
        let t = &mut self.threads[at.thread];
        t.connections = t.connections.saturating_sub(1);
        let Some(k) = t.cqs.iter().position(|r| Arc::ptr_eq(&r.cq, &at.cq)) else {
            return;
        };
        t.cqs[k].connections = t.cqs[k].connections.saturating_sub(1);
        if k > 0 && t.cqs[k].connections == 0 {
            let r = t.cqs.swap_remove(k);
            let _ = t.tx.send(Msg::DropCq(r.cq));
            t.waker.wake();
        }
    }

    /// Stops every pool thread (after their connections were removed) and
    /// waits for them, then the threads for long calls.
    pub fn stop(&mut self) {
        for t in &mut self.threads {
            // (The thread holds a sender of its own, for replies of long
            // calls, so its channel does not end.)
            let _ = t.tx.send(Msg::Stop);
            t.waker.wake();
        }
        for t in &mut self.threads {
            if let Some(h) = t.handle.take() {
                let _ = h.join();
            }
        }
        self.long.stop();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A connection on a pool thread.
struct Entry {
    serial: u64,
    conn: Box<Conn>,
    id: Arc<CmId>,
    done: Arc<AtomicBool>,
    /// Its work was flushed at this time: the thread waits for the
    /// connection manager's report of the disconnect.
    flushed: Option<Instant>,
    /// It has carried a backward call: replies to its backward calls may
    /// take buffers of the shared receive queue.
    backchannel: bool,
}

/// A pool thread's state.
struct PoolThread {
    poller: Poller,
    rx: mpsc::Receiver<Msg>,
    stats: Arc<RdmaStats>,
    conns: HashMap<u32, Entry>,
    /// Connections with completions in the batch being handled.
    touched: Vec<u32>,
    /// Connections to look at between batches, whatever completes: those
    /// with receives waiting for their buffers, and flushed ones waiting
    /// for the connection manager's report. Only these are looked at, so
    /// a batch costs the connections it touches, not all of the thread's.
    waiting: Vec<u32>,
    /// Where long calls go.
    long: LongSender,
    /// Where their replies come back: this thread's messages and waker.
    back: (mpsc::Sender<Msg>, Arc<Waker>),
    /// The thread's shared receive queue, if it has one.
    shared: Option<Arc<SharedRecv>>,
    /// Connections came, went or began backward calls since the shared
    /// queue's buffers were last shared ([`PoolThread::share_receives`]).
    reshare: bool,
}

impl PoolThread {
    fn new(
        poller: Poller,
        rx: mpsc::Receiver<Msg>,
        stats: Arc<RdmaStats>,
        long: LongSender,
        back: (mpsc::Sender<Msg>, Arc<Waker>),
        shared: Option<Arc<SharedRecv>>,
    ) -> PoolThread {
        PoolThread {
            poller,
            rx,
            stats,
            conns: HashMap::new(),
            touched: Vec::new(),
            waiting: Vec::new(),
            long,
            back,
            shared,
            reshare: false,
        }
    }

    /// On a shared receive queue, each connection is granted its share of
    /// the queue's buffers (at least one, at most its credits), set again
    /// whenever the thread's connections come or go: requesters that keep
    /// to their grants then never find the queue empty, where a grant of
    /// every connection's full credits would let a few busy ones take
    /// every buffer and leave the others' Sends to receiver-not-ready
    /// retries. The replies to backward calls (RFC 8167) land in the queue
    /// too: each connection that has carried one keeps its backward call
    /// slots out of what is shared. (Calls sent under a connection's
    /// earlier, higher grant are still served: see
    /// `nfsrdma_rpcrdma::conn::credits`.)
    fn share_receives(&mut self) {
        let Some(s) = &self.shared else {
            return;
        };
        if !std::mem::take(&mut self.reshare) || self.conns.is_empty() {
            return;
        }
        let n = self.conns.len();
        let kept: usize = (self.conns.values())
            .filter(|e| e.backchannel)
            .map(|e| e.conn.backward_slots() as usize)
            .sum();
        let share = u32::try_from(s.ring.len().saturating_sub(kept) / n)
            .unwrap_or(u32::MAX)
            .max(1);
        let mut granted = 0;
        for e in self.conns.values_mut() {
            granted = e.conn.set_grant(share);
        }
        self.stats
            .credits_granted
            .store(u64::from(granted), Ordering::Relaxed);
        tracing::debug!(
            connections = n,
            buffers = s.ring.len(),
            kept_for_backward_replies = kept,
            grant = granted,
            "RDMA pool thread: credits granted on the shared receive queue"
        );
    }

    /// Whether buffers of the shared receive queue wait to be posted once
    /// free.
    fn has_orphans(&self) -> bool {
        self.shared.as_ref().is_some_and(|s| s.has_orphans())
    }

    fn run(mut self) {
        let mut wcs: Vec<WorkCompletion> = Vec::with_capacity(64);
        let mut timeouts = self.poller.stats().wait_timeouts;
        loop {
            if !self.messages() {
                break;
            }
            self.share_receives();
            self.poller
                .set_wait_slice(if self.waiting.is_empty() && !self.has_orphans() {
                    IDLE_WAIT
                } else {
                    WAIT_SLICE
                });
            wcs.clear();
            let n = match self.poller.wait(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    // The CQs cannot be polled: nothing this thread holds
                    // can be served any more.
                    tracing::error!(error = %e, "RDMA pool thread: polling failed");
                    break;
                }
            };
            if n == 0 {
                let now = self.poller.stats().wait_timeouts;
                if now != timeouts {
                    self.stats
                        .idle_wakeups
                        .fetch_add(now - timeouts, Ordering::Relaxed);
                    timeouts = now;
                }
                self.between_batches();
                continue;
            }
            self.batch(&mut wcs);
            self.between_batches();
            self.share_receives();
        }
        for (_, e) in self.conns.drain() {
            drop_entry(e, &self.stats, true);
        }
    }

    /// Takes the connection manager's messages; false once it is gone.
    fn messages(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Add {
                    conn,
                    id,
                    cq,
                    done,
                    serial,
                }) => {
                    self.stats.open.fetch_add(1, Ordering::Relaxed);
                    let qp = conn.qp_num();
                    let e = Entry {
                        serial,
                        conn,
                        id,
                        done,
                        flushed: None,
                        backchannel: false,
                    };
                    if let Err(err) = self.poller.add_cq(cq) {
                        tracing::error!(error = %err, "RDMA pool thread: a CQ it cannot poll");
                        drop_entry(e, &self.stats, true);
                        continue;
                    }
                    let stale = self.conns.insert(qp, e);
                    self.reshare = true;
                    // None can be there: an entry holds its queue pair, so
                    // its number is not given to another until it is gone.
                    if let Some(e) = stale {
                        drop_entry(e, &self.stats, true);
                    }
                }
                Ok(Msg::Remove {
                    qp_num,
                    serial,
                    ack,
                }) => {
                    let meant = self.conns.get(&qp_num).is_some_and(|e| e.serial == serial);
                    if let Some(e) = meant.then(|| self.conns.remove(&qp_num)).flatten() {
                        self.reshare = true;
                        if e.flushed.is_some() {
                            tracing::debug!(peer = %e.conn.peer(), "RDMA connection closed by the peer");
                        }
                        drop_entry(e, &self.stats, true);
                    }
                    let _ = ack.send(());
                }
                Ok(Msg::DropCq(cq)) => {
                    self.poller.remove_cq(&cq);
                }
                Ok(Msg::Answer {
                    qp_num,
                    serial,
                    call,
                    reply,
                }) => {
                    let Some(e) = self.conns.get_mut(&qp_num) else {
                        continue;
                    };
                    if e.serial != serial || e.flushed.is_some() {
                        continue;
                    }
                    match e.conn.answer(call, reply) {
                        Ok(()) => self.after_work(qp_num),
                        Err(err) => self.ended(qp_num, err),
                    }
                }
                Ok(Msg::BackCall {
                    qp_num,
                    serial,
                    parts,
                }) => {
                    // (A connection gone meanwhile has closed its
                    // backchannel: the call's waiter has failed already.)
                    let Some(e) = self.conns.get_mut(&qp_num) else {
                        continue;
                    };
                    if e.serial != serial || e.flushed.is_some() {
                        continue;
                    }
                    if !e.backchannel {
                        e.backchannel = true;
                        self.reshare = true;
                    }
                    match e.conn.back_call(parts) {
                        Ok(()) => self.after_work(qp_num),
                        Err(err) => self.ended(qp_num, err),
                    }
                }
                Ok(Msg::Stop) => return false,
                Err(mpsc::TryRecvError::Empty) => return true,
                Err(mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    /// One batch of completions, each to its connection.
    fn batch(&mut self, wcs: &mut Vec<WorkCompletion>) {
        // What the thread waits for is the next call: the time it took to
        // come after the last work is what `auto` learns, and whether the
        // thread was awake to see it is what the counters tell.
        if wcs
            .iter()
            .any(|wc| wc.is_ok() && WrId(wc.wr_id).kind() == Some(WrKind::Recv))
        {
            let found = self.poller.awaited();
            let counter = if found.polling {
                &self.stats.polled_calls
            } else {
                &self.stats.woken_calls
            };
            counter.fetch_add(1, Ordering::Relaxed);
            if let Some(gap) = found.gap {
                self.stats.note_gap(gap);
            }
        }
        let seen = self.poller.worked();
        self.touched.clear();
        for wc in wcs.drain(..) {
            let qp = wc.qp_num;
            let shared_buffer = match &self.shared {
                Some(s) => WrId(wc.wr_id).recv_buffer().inspect(|_| s.consumed()),
                None => None,
            };
            // A completion of a connection already dropped (its queue pair
            // flushed as it was destroyed) has nobody to go to; a shared
            // receive buffer it took goes back to the queue.
            let e = match self.conns.get_mut(&qp) {
                Some(e) if e.flushed.is_none() => e,
                _ => {
                    if let (Some(s), Some(b)) = (&self.shared, shared_buffer) {
                        if let Err(err) = s.unclaimed(b) {
                            tracing::error!(error = %err, "RDMA pool thread: a shared receive buffer not posted again");
                        }
                    }
                    continue;
                }
            };
            if !self.touched.contains(&qp) {
                self.touched.push(qp);
            }
            if let Err(err) = e.conn.completion(wc, seen) {
                self.ended(qp, err);
            }
        }
        for i in 0..self.touched.len() {
            let qp = self.touched[i];
            let Some(e) = self.conns.get_mut(&qp) else {
                continue;
            };
            if e.flushed.is_some() {
                continue;
            }
            match e.conn.after_batch() {
                Ok(()) => self.after_work(qp),
                Err(err) => self.ended(qp, err),
            }
        }
    }

    /// After a connection's work: its long calls go to the threads for
    /// them, and it is looked at between batches if receives wait for
    /// their buffers.
    fn after_work(&mut self, qp: u32) {
        let Some(e) = self.conns.get_mut(&qp) else {
            return;
        };
        for (call, c) in e.conn.take_long() {
            self.long.send(
                c,
                Back {
                    tx: self.back.0.clone(),
                    waker: self.back.1.clone(),
                    qp_num: qp,
                    serial: e.serial,
                    call,
                },
            );
        }
        if e.conn.has_deferred() && !self.waiting.contains(&qp) {
            self.waiting.push(qp);
        }
    }

    /// Between batches: receives whose buffers came free, and flushed
    /// connections whose disconnect report never came.
    fn between_batches(&mut self) {
        if let Some(s) = &self.shared {
            if s.has_orphans() {
                if let Err(err) = s.retry_orphans() {
                    tracing::error!(error = %err, "RDMA pool thread: shared receive buffers not posted again");
                }
            }
        }
        if self.waiting.is_empty() {
            return;
        }
        let mut failed = Vec::new();
        let mut overdue = Vec::new();
        let mut worked = Vec::new();
        let conns = &mut self.conns;
        self.waiting.retain(|qp| {
            let Some(e) = conns.get_mut(qp) else {
                return false;
            };
            match e.flushed {
                Some(at) => {
                    if at.elapsed() >= FLUSH_GRACE {
                        overdue.push(*qp);
                        return false;
                    }
                    true
                }
                None => {
                    if let Err(err) = e.conn.post_deferred() {
                        failed.push((*qp, err));
                        return false;
                    }
                    worked.push(*qp);
                    e.conn.has_deferred()
                }
            }
        });
        for (qp, err) in failed {
            self.ended(qp, err);
        }
        // (A call landed at last may lead to a long call.)
        for qp in worked {
            self.after_work(qp);
        }
        for qp in overdue {
            if let Some(e) = self.conns.remove(&qp) {
                self.reshare = true;
                self.stats.errors.fetch_add(1, Ordering::Relaxed);
                tracing::info!(
                    peer = %e.conn.peer(),
                    error = %ConnError::Flushed,
                    "RDMA connection ended"
                );
                let _ = e.id.disconnect();
                drop_entry(e, &self.stats, true);
            }
        }
    }

    /// A connection ended with `err`. The peer disconnecting flushes its
    /// work before the connection manager reports it: the connection then
    /// waits for that report ([`FLUSH_GRACE`]), not counted as an error.
    /// Any other end is an error: counted, logged, and the connection
    /// disconnected and dropped.
    fn ended(&mut self, qp: u32, err: ConnError) {
        if matches!(err, ConnError::Flushed) {
            if let Some(e) = self.conns.get_mut(&qp) {
                e.flushed = Some(Instant::now());
                if !self.waiting.contains(&qp) {
                    self.waiting.push(qp);
                }
            }
            return;
        }
        if let Some(e) = self.conns.remove(&qp) {
            self.reshare = true;
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            tracing::info!(peer = %e.conn.peer(), error = %err, "RDMA connection ended");
            let _ = e.id.disconnect();
            drop_entry(e, &self.stats, false);
        }
    }
}

/// Drops a connection (first ending it if `close`, so that nothing more is
/// posted) and reports it gone.
fn drop_entry(mut e: Entry, stats: &RdmaStats, close: bool) {
    if close {
        e.conn.close_now();
    }
    let done = e.done.clone();
    drop(e);
    stats.open.fetch_sub(1, Ordering::Relaxed);
    done.store(true, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cq_holds_every_entry_its_connections_can_take() {
        // The defaults: 128 credits, a send queue of 512.
        let per = Pool::entries_per_connection(512, 128);
        assert_eq!(per, 512 + 128 + 16);
        // Soft-RoCE's largest CQ (32,767 entries) holds 49 such
        // connections; a CQ is shared by 32 at most.
        assert_eq!(
            Pool::connections_per_cq(per, 32_767),
            MAX_CONNECTIONS_PER_CQ
        );
        // A device with smaller CQs: as many as fit, never more.
        let n = Pool::connections_per_cq(per, 8_192);
        assert_eq!(n, 12);
        assert!(n * per <= 8_192 && (n + 1) * per > 8_192);
        // A device whose CQs cannot hold one connection's entries: one per
        // CQ (creating it then fails on the device's limit, and the
        // connection is refused, as it was with a CQ per connection).
        assert_eq!(Pool::connections_per_cq(per, 100), 1);
        assert_eq!(Pool::connections_per_cq(0, 100), MAX_CONNECTIONS_PER_CQ);
    }
}
