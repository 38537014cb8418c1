//! One connection, as a pool thread ([`super::worker`]) drives it: each
//! completion of its queue pair goes to the connection core, and what the
//! core yields is carried out: receives posted (once nothing holds their
//! buffer), RDMA Read chains into landing blocks, RDMA Writes and Sends.
//! It decides nothing about the protocol.

use super::backward;
use super::calls::{self, Landing, Local};
use super::shared::SharedRecv;
use super::RdmaStats;
use crate::service::metrics::{CallClass, Transport};
use crate::service::{CallContext, LongCall, Reply, Service};
use bytes::Bytes;
use nfsrdma_rpcrdma::conn::{
    CallId, ConnError as CoreError, Connection, Event, SendOp, Stats, Work, WrId, WrKind,
};
use nfsrdma_transport::rdma::verbs::{
    Arena, CompletionError, MemoryRegion, QueuePair, RecvRing, RemoteBuf, SendFlags,
    SendOp as VerbsOp, SendWr, Sge, VerbsError, WorkCompletion,
};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a call whose Read chunks find the arena exhausted waits for
/// memory (other calls' landing and staging blocks come back as their
/// replies go out, a file's blocks as it is overwritten or removed)
/// before it is refused with ERR_CHUNK.
pub const ARENA_WAIT: Duration = Duration::from_secs(5);

/// A connection's verbs objects and registered memory.
pub struct Verbs {
    /// The queue pair.
    pub qp: Arc<QueuePair>,
    /// Receive buffers: one per credit, or the pool thread's shared ones.
    pub ring: RecvRing,
    /// The pool thread's shared receive queue, when the queue pair takes
    /// its receives from one (`ring` is then its buffers).
    pub shared: Option<Arc<SharedRecv>>,
    /// Send buffers, one per send slot.
    pub send_mr: Arc<MemoryRegion>,
    /// The arena of the store's blocks.
    pub arena: Arc<Arena>,
    /// Bytes of a send buffer.
    pub slot_size: usize,
}

/// Why a connection ends.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The connection core ended the connection.
    #[error(transparent)]
    Core(CoreError),
    /// Work requests flushed before any failed: the queue pair left the
    /// connected state, as it does when the peer disconnects.
    #[error("work requests flushed: the queue pair is no longer connected")]
    Flushed,
}

/// One connection: its core and what carries its work out.
pub struct Conn {
    core: Connection<Local>,
    v: Verbs,
    service: Arc<Service>,
    ctx: CallContext,
    stats: Arc<RdmaStats>,
    /// The core's counters as last added to `stats`.
    seen: Stats,
    /// Calls whose Read chunks are being read, with when they arrived.
    landing: HashMap<CallId, (Landing, Instant)>,
    /// When the completions being handled were seen: a call's arrival.
    batch_at: Instant,
    /// Replies posted in this round of work, with their calls' arrivals:
    /// their turnarounds are recorded with one reading of the clock once
    /// the round's work is posted.
    posted: Vec<(CallClass, Instant)>,
    /// The signaled Read of each chain in flight, and its call.
    read_wrs: HashMap<u64, CallId>,
    /// Per send slot: the reply data its Writes read, kept (and its store
    /// blocks shared, so not written) until the Send completes.
    holds: HashMap<u32, Vec<Local>>,
    /// Receives to post once nothing holds their buffer.
    deferred: Vec<(u32, WrId)>,
    /// The most receive buffers this connection's messages held at once.
    held_peak: u32,
    /// Calls begun that may run long, for the pool thread to send to
    /// the threads for long calls ([`Conn::take_long`]).
    long: Vec<(CallId, Box<LongCall>)>,
    /// Calls running off the pool thread, with their arrivals.
    away: HashMap<CallId, Instant>,
    /// Calls whose Read chunks wait for arena memory to land in, oldest
    /// first: since when, and their arrivals.
    starved: VecDeque<(CallId, Instant, Instant)>,
    /// Backward calls (RFC 8167) waiting for a call slot within the
    /// client's grant.
    backward: VecDeque<Vec<Bytes>>,
}

/// Backward calls one connection keeps waiting for a slot: more are
/// dropped (the callback thread's wait for their replies times out, and
/// the session's path is reported down).
const BACKWARD_WAITING: usize = 8;

impl Conn {
    /// A connection; nothing is posted until [`Conn::drive`].
    pub fn new(
        core: Connection<Local>,
        v: Verbs,
        service: Arc<Service>,
        ctx: CallContext,
        stats: Arc<RdmaStats>,
    ) -> Conn {
        stats
            .credits_granted
            .store(u64::from(core.config().credits), Ordering::Relaxed);
        Conn {
            core,
            v,
            service,
            ctx,
            stats,
            seen: Stats::default(),
            landing: HashMap::new(),
            batch_at: Instant::now(),
            posted: Vec::new(),
            read_wrs: HashMap::new(),
            holds: HashMap::new(),
            deferred: Vec::new(),
            held_peak: 0,
            long: Vec::new(),
            away: HashMap::new(),
            starved: VecDeque::new(),
            backward: VecDeque::new(),
        }
    }

    /// Grants the peer `n` credits from the next reply on (within 1..=the
    /// connection's credits); returns the grant in force.
    pub fn set_grant(&mut self, n: u32) -> u32 {
        self.core.set_grant(n)
    }

    /// Backward calls this connection may have in flight at once: the
    /// receives their replies may take besides the peer's calls.
    pub fn backward_slots(&self) -> u32 {
        self.core.config().calls
    }

    /// The peer's address.
    pub fn peer(&self) -> std::net::SocketAddr {
        self.ctx.peer
    }

    /// The queue pair's number: its completions carry it.
    pub fn qp_num(&self) -> u32 {
        self.v.qp.qp_num()
    }

    /// Whether receives wait for their buffers, or calls for arena memory:
    /// its pool thread then looks again soon instead of sleeping until a
    /// completion comes.
    pub fn has_deferred(&self) -> bool {
        !self.deferred.is_empty() || !self.starved.is_empty()
    }

    /// The calls begun since the last look whose rest may run long: the
    /// pool thread has them finished elsewhere and brings each reply back
    /// to [`Conn::answer`].
    pub fn take_long(&mut self) -> std::vec::Drain<'_, (CallId, Box<LongCall>)> {
        self.long.drain(..)
    }

    /// The reply of a call finished off the pool thread: sent as any
    /// other (unless the connection has ended meanwhile), and the work it
    /// leads to carried out.
    pub fn answer(&mut self, id: CallId, reply: Box<Reply>) -> Result<(), ConnError> {
        let Some(arrived) = self.away.remove(&id) else {
            return Ok(());
        };
        if let Some(c) = calls::answer(&mut self.core, id, *reply, &self.ctx, &self.v, &self.stats)?
        {
            self.posted.push((c, arrived));
        }
        self.drive()?;
        self.post_deferred()
    }

    /// Sends a backward call (the RPC call message's parts) as soon as the
    /// client's grant allows, and carries out the work it leads to.
    pub fn back_call(&mut self, parts: Vec<Bytes>) -> Result<(), ConnError> {
        if self.core.is_closed() {
            return Ok(());
        }
        if self.backward.len() >= BACKWARD_WAITING {
            self.stats.backward_dropped.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        self.backward.push_back(parts);
        self.start_backward();
        self.drive()?;
        self.post_deferred()
    }

    /// Starts the waiting backward calls the client's grant has room for.
    fn start_backward(&mut self) {
        while !self.backward.is_empty() {
            let Some(slot) = self.core.reserve_call() else {
                return;
            };
            let parts = self.backward.pop_front().expect("not empty");
            match backward::plan(parts, self.core.config()) {
                Some(plan) => {
                    let header = plan.header(self.core.credits_to_ask(), &Default::default());
                    let mut message = Vec::with_capacity(plan.inline.len() + 1);
                    message.push(header);
                    message.extend(plan.inline.iter().cloned());
                    self.core.start_call(slot, plan, message, Vec::new(), 0);
                }
                None => {
                    self.core.unreserve_call(slot);
                    self.stats.backward_dropped.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Ends the connection at once (the listener is stopping or the
    /// connection manager reported the peer gone): nothing more is posted.
    pub fn close_now(&mut self) {
        self.core.close_now();
    }

    /// One completion of this connection's queue pair, seen at `seen`
    /// (the arrival of a call it brings).
    pub fn completion(&mut self, wc: WorkCompletion, seen: Instant) -> Result<(), ConnError> {
        self.batch_at = seen;
        self.complete(wc)
    }

    /// After a batch of completions: records the receives held (the
    /// connection's peak includes every call the batch brought, none of
    /// them answered yet), carries out the work they led to and posts the
    /// receives whose buffers came free.
    pub fn after_batch(&mut self) -> Result<(), ConnError> {
        // (Once ended, a connection on a shared receive queue also holds
        // the buffers it took after the end, for its pool thread to give
        // back: not messages of its calls.)
        let held = self.core.held_receives();
        if held > self.held_peak && !self.core.is_closed() {
            self.held_peak = held;
            self.stats
                .receives_held_peak
                .fetch_max(u64::from(held), Ordering::Relaxed);
        }
        self.drive()?;
        self.post_deferred()
    }

    fn complete(&mut self, wc: WorkCompletion) -> Result<(), ConnError> {
        let wr = WrId(wc.wr_id);
        if wr.kind() == Some(WrKind::Read) {
            // The chain's blocks come back to its landing whatever the
            // status.
            if let Some(call) = self.read_wrs.remove(&wc.wr_id) {
                if let Some((l, _)) = self.landing.get_mut(&call) {
                    l.reads.complete(wc.wr_id);
                }
            }
        }
        match wc.status {
            Ok(()) => match wr.recv_buffer() {
                Some(b) => {
                    let msg = self.v.ring.take(b as usize, wc.byte_len as usize)?;
                    self.core.received(wr, msg, wc.invalidated_rkey);
                }
                None => self.core.completed(wr),
            },
            Err(e) => {
                if let Some(b) = wr.recv_buffer() {
                    self.v.ring.cancel(b as usize);
                    // A shared buffer goes back to the queue for the
                    // others; a buffer of its own goes with the queue pair.
                    if let Some(s) = &self.v.shared {
                        s.give_back(b)?;
                    }
                }
                if e == CompletionError::RnrRetryExceeded {
                    self.stats
                        .peer_not_receiving
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        peer = %self.ctx.peer,
                        "RDMA connection closed: the peer posted no receive for a Send of ours \
                         through its receiver-not-ready retries"
                    );
                }
                self.core
                    .failed(wr, matches!(e, CompletionError::Flushed), &e.to_string());
            }
        }
        Ok(())
    }

    /// Carries out the core's work and runs what it hands over, until
    /// there is nothing left; an error once the connection is over.
    pub fn drive(&mut self) -> Result<(), ConnError> {
        loop {
            // Slots the completions gave back, before any new work can
            // reuse them.
            while let Some(slot) = self.core.poll_released() {
                self.holds.remove(&slot);
            }
            let mut moved = false;
            while let Some(w) = self.core.poll_work() {
                moved = true;
                self.post(w)?;
            }
            if let Some(e) = self.core.poll_event() {
                moved = true;
                self.event(e)?;
            }
            if !moved {
                break;
            }
        }
        if !self.posted.is_empty() {
            let now = Instant::now();
            let m = self.service.metrics();
            for (c, arrived) in self.posted.drain(..) {
                m.record_turnaround(Transport::Rdma, c, now.saturating_duration_since(arrived));
            }
        }
        let now = self.core.stats();
        self.stats.add(&self.seen, &now);
        self.seen = now;
        Ok(())
    }

    fn event(&mut self, e: Event) -> Result<(), ConnError> {
        match e {
            Event::NeedsReads(id) => {
                // Behind the connection's calls that wait already, in
                // order.
                if !self.starved.is_empty() || !self.land(id, self.batch_at)? {
                    self.stats.arena_waits.fetch_add(1, Ordering::Relaxed);
                    self.starved.push_back((id, Instant::now(), self.batch_at));
                }
            }
            Event::Call(id) => {
                let (data, arrived) = match self.landing.remove(&id) {
                    Some((l, at)) => (calls::landed(l)?, at),
                    None => (Vec::new(), self.batch_at),
                };
                match calls::run(
                    &mut self.core,
                    id,
                    data,
                    &self.service,
                    &self.ctx,
                    &self.v,
                    &self.stats,
                )? {
                    calls::Ran::Answered(Some(c)) => self.posted.push((c, arrived)),
                    calls::Ran::Answered(None) => {}
                    calls::Ran::Long(c) => {
                        self.away.insert(id, arrived);
                        self.long.push((id, c));
                    }
                }
            }
            Event::Reply { slot } => {
                let reply = self.core.take_reply(slot);
                self.core.finish_call(slot);
                match backward::reply_message(reply) {
                    Some(msg) => {
                        self.stats.backward_replies.fetch_add(1, Ordering::Relaxed);
                        if let Some(b) = &self.ctx.back {
                            b.deliver(msg);
                        }
                    }
                    None => {
                        // (Its waiter times out: the path is down.)
                        self.stats.backward_dropped.fetch_add(1, Ordering::Relaxed);
                        tracing::info!(peer = %self.ctx.peer, "a backward call answered with RDMA_ERROR");
                    }
                }
                self.start_backward();
            }
            // The connection closes next: the backchannel's waiters fail
            // then.
            Event::CallFailed { error, .. } => {
                tracing::info!(peer = %self.ctx.peer, %error, "a backward call's reply broke the protocol");
            }
            Event::Closed(CoreError::Flushed) => return Err(ConnError::Flushed),
            Event::Closed(CoreError::Closed) => {}
            Event::Closed(e) => return Err(ConnError::Core(e)),
        }
        Ok(())
    }

    /// Lands call `id`'s Read chunks in arena blocks and has the core read
    /// them; false when the arena has not the memory for them now.
    fn land(&mut self, id: CallId, arrived: Instant) -> Result<bool, ConnError> {
        let Some(call) = self.core.call(id) else {
            // Gone meanwhile (the connection is closing): nothing to land.
            return Ok(true);
        };
        match calls::land(call, &self.v)? {
            Some((l, reads, bytes)) => {
                self.landing.insert(id, (l, arrived));
                self.core.land(id, reads, bytes);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// The calls waiting for arena memory, oldest first: landed while
    /// there is memory; one that has waited [`ARENA_WAIT`] is refused
    /// (ERR_CHUNK). True if any moved.
    fn retry_starved(&mut self) -> Result<bool, ConnError> {
        let mut moved = false;
        while let Some(&(id, since, arrived)) = self.starved.front() {
            if !self.land(id, arrived)? {
                if since.elapsed() < ARENA_WAIT {
                    break;
                }
                self.stats.arena_exhausted.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer = %self.ctx.peer, "arena exhausted: call refused");
                self.core.reject(id);
            }
            self.starved.pop_front();
            moved = true;
        }
        Ok(moved)
    }

    fn post(&mut self, w: Work<Local>) -> Result<(), ConnError> {
        match w {
            Work::Recv { buffer, wr } => match &self.v.shared {
                // (A buffer still lent waits with the queue's orphans.)
                Some(s) => s.give_back(buffer)?,
                None => {
                    if !self.v.ring.post(&self.v.qp, buffer as usize, wr.0)? {
                        self.deferred.push((buffer, wr));
                    }
                }
            },
            Work::Reads {
                call,
                reads,
                wr,
                quiet,
            } => {
                let (l, _) = self.landing.get_mut(&call).ok_or_else(|| {
                    VerbsError::InvalidArgument(format!("Reads for {call:?}, which has no landing"))
                })?;
                calls::post_reads(l, &self.v, &reads, wr.0, quiet.0)?;
                self.read_wrs.insert(wr.0, call);
            }
            Work::Send(chain) => self.post_chain(chain)?,
        }
        Ok(())
    }

    /// Receives whose buffers were still held when the core gave them
    /// back, and calls waiting for arena memory.
    pub fn post_deferred(&mut self) -> Result<(), ConnError> {
        if !self.starved.is_empty() && self.retry_starved()? {
            self.drive()?;
        }
        let mut i = 0;
        while i < self.deferred.len() {
            let (b, wr) = self.deferred[i];
            if self.v.ring.post(&self.v.qp, b as usize, wr.0)? {
                self.deferred.swap_remove(i);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// One chain of Writes and Sends, posted in one call (one doorbell).
    fn post_chain(
        &mut self,
        chain: Vec<nfsrdma_rpcrdma::conn::SendWr<Local>>,
    ) -> Result<(), ConnError> {
        let v = &self.v;
        // Every request's scatter/gather entries first, in one list (the
        // Sends' messages copied into their send buffers), then the
        // requests over their stretches of it.
        let mut flat: Vec<Sge<'_>> = Vec::with_capacity(chain.len() + 4);
        let mut ends: Vec<usize> = Vec::with_capacity(chain.len());
        for s in &chain {
            match &s.op {
                SendOp::Call { pre, .. } if *pre > 0 => {
                    return Err(VerbsError::InvalidArgument(
                        "a call with requests of the driver's own, which the server has none of"
                            .into(),
                    )
                    .into())
                }
                SendOp::LocalInv { .. } => {}
                SendOp::Send { slot, message, .. } | SendOp::Call { slot, message, .. } => {
                    // Replies' send buffers first, then the backward
                    // calls'.
                    let buffer = match &s.op {
                        SendOp::Call { .. } => self.core.config().send_slots + slot,
                        _ => *slot,
                    };
                    let base = buffer as usize * v.slot_size;
                    let mut len = 0usize;
                    for part in message {
                        if len + part.len() > v.slot_size {
                            return Err(VerbsError::InvalidArgument(format!(
                                "a message of more than {} bytes for a send buffer",
                                v.slot_size
                            ))
                            .into());
                        }
                        v.send_mr.write_at(base + len, part)?;
                        len += part.len();
                    }
                    flat.push(v.send_mr.sge(base, len)?);
                }
                SendOp::Write { local, .. } => {
                    for Local(b) in local {
                        flat.push(v.arena.sge_for(b).ok_or_else(|| {
                            VerbsError::InvalidArgument("reply data left the arena".into())
                        })?);
                    }
                }
            }
            ends.push(flat.len());
        }
        let sges: Vec<&[Sge<'_>]> = ends
            .iter()
            .scan(0, |start, &end| {
                let part = &flat[*start..end];
                *start = end;
                Some(part)
            })
            .collect();
        let wrs: Vec<SendWr<'_>> = chain
            .iter()
            .zip(sges.iter().copied())
            .map(|(s, sges)| SendWr {
                wr_id: s.wr.0,
                op: match &s.op {
                    SendOp::Send {
                        invalidate: Some(rkey),
                        ..
                    } => VerbsOp::SendWithInv {
                        sges,
                        invalidate_rkey: *rkey,
                    },
                    SendOp::Send { .. } | SendOp::Call { .. } => VerbsOp::Send { sges },
                    SendOp::LocalInv { rkey } => VerbsOp::LocalInv { rkey: *rkey },
                    SendOp::Write { remote, .. } => VerbsOp::RdmaWrite {
                        sges,
                        remote: RemoteBuf {
                            addr: remote.addr,
                            len: remote.len,
                            rkey: remote.rkey,
                        },
                    },
                },
                flags: if s.signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::UNSIGNALED
                },
            })
            .collect();
        v.qp.post_send(&wrs)?;
        drop(wrs);
        drop(sges);
        drop(flat);
        for s in chain {
            if let SendOp::Write { local, slot, .. } = s.op {
                self.holds.entry(slot).or_default().extend(local);
            }
        }
        Ok(())
    }
}

impl Drop for Conn {
    /// The backchannel's calls waiting on the connection fail at once.
    /// Shared receive buffers the connection still holds (its calls',
    /// and those it had given back without posting) go back to the
    /// queue: the other connections of the pool thread receive in them.
    fn drop(&mut self) {
        if let Some(b) = &self.ctx.back {
            b.close();
        }
        let Some(s) = self.v.shared.clone() else {
            return;
        };
        self.core.close_now();
        for b in self.core.held_buffers() {
            if let Err(e) = s.give_back(b) {
                tracing::error!(error = %e, buffer = b, "a shared receive buffer not posted again");
            }
        }
    }
}
