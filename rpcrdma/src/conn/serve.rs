//! The life of an incoming call on the responder side: from its receive
//! completion to its reply's Send.
//!
//! ```text
//! received ─ classify ─┬─ drop (RDMA_DONE, short headers, ...): buffer posted again
//!                      ├─ RDMA_ERROR to send ──────────────┐
//!                      └─ call ─ waits for a send slot     │
//!                               (and a chunk slot)         │
//!                               ├─ Read chunks: NeedsReads → land → Reads → Call
//!                               └─ inline: Call            │
//!                     send_reply / reject / no_reply ──────┤
//!                     buffer posted again, credit back     │
//!                     Writes + Send queued ────────────────┴─> send queue
//! ```
//!
//! The message-level decisions (what a header means, the XID rule, the
//! reply's shape and its Send With Invalidate) are
//! [`crate::responder`]'s; this module holds what lasts between messages.

use super::sendq::{Release, SendQueue};
use super::{ConnError, Connection, Event, Piece, ReadOp, RemoteSeg, SendOp, SendWr, Work, WrKind};
use crate::responder::{
    self, Fault, IncomingCall, Received, ReplyError, ReplyPlan, ReplyShape, ResponderConfig,
};
use bytes::Bytes;
use nfsrdma_xdr::rpcrdma::RdmaError;
use nfsrdma_xdr::XdrSink;
use std::collections::VecDeque;

/// A call held by a connection, from its arrival until its reply is
/// posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

#[derive(Debug)]
enum Phase {
    /// Waiting for a send slot (and a chunk slot).
    Waiting,
    /// Its landing memory is asked for.
    Landing,
    /// Its Reads are going out.
    Reading {
        ops: Vec<ReadOp>,
        posted: usize,
        chains_out: u32,
    },
    /// Handed to the application.
    Ready,
}

#[derive(Debug)]
struct CallState {
    buffer: u32,
    incoming: IncomingCall,
    slot: Option<u32>,
    /// Holds a chunk slot.
    chunk: bool,
    landing: u64,
    phase: Phase,
}

/// The calls held, one place per receive buffer (each call holds one).
#[derive(Debug)]
struct CallTable {
    places: Vec<Option<(CallId, CallState)>>,
}

impl CallTable {
    fn new(buffers: u32) -> CallTable {
        CallTable {
            places: (0..buffers).map(|_| None).collect(),
        }
    }

    fn place(id: &CallId) -> usize {
        (id.0 & 0xffff_ffff) as usize
    }

    fn get(&self, id: &CallId) -> Option<&CallState> {
        match self.places.get(Self::place(id)) {
            Some(Some((k, c))) if k == id => Some(c),
            _ => None,
        }
    }

    fn get_mut(&mut self, id: &CallId) -> Option<&mut CallState> {
        match self.places.get_mut(Self::place(id)) {
            Some(Some((k, c))) if k == id => Some(c),
            _ => None,
        }
    }

    /// A place no call holds (calls with shared receive buffers, whose
    /// ids are the pool's, take one of these instead).
    fn free_place(&self) -> Option<u32> {
        self.places
            .iter()
            .position(Option::is_none)
            .map(|p| p as u32)
    }

    fn insert(&mut self, id: CallId, c: CallState) {
        if let Some(p) = self.places.get_mut(Self::place(&id)) {
            debug_assert!(p.is_none(), "two calls in one receive buffer");
            *p = Some((id, c));
        }
    }

    fn remove(&mut self, id: &CallId) -> Option<CallState> {
        let p = self.places.get_mut(Self::place(id))?;
        if p.as_ref().is_some_and(|(k, _)| k == id) {
            p.take().map(|(_, c)| c)
        } else {
            None
        }
    }

    fn values(&self) -> impl Iterator<Item = &CallState> {
        self.places.iter().flatten().map(|(_, c)| c)
    }
}

#[derive(Debug)]
enum Arrival {
    Call(CallId),
    Error { buffer: u32, reply: Bytes },
}

/// A reply (or RDMA_ERROR) on its way to the send queue.
#[derive(Debug)]
struct Outgoing<L> {
    /// RDMA Writes not yet posted, each within the scatter/gather limit.
    writes: VecDeque<(Vec<L>, RemoteSeg)>,
    message: Vec<Bytes>,
    invalidate: Option<u32>,
    slot: u32,
    /// Keeps its chunk slot until the Send completes (data was staged).
    chunk: bool,
}

/// The responder's state between messages.
#[derive(Debug)]
pub struct Serve<L> {
    rcfg: ResponderConfig,
    max_sge: usize,
    calls: CallTable,
    arrivals: VecDeque<Arrival>,
    outgoing: VecDeque<Outgoing<L>>,
    chunk_slots_free: u32,
    chunk_slots: u32,
    next: u64,
}

impl<L> Serve<L> {
    pub(super) fn new(cfg: &super::Config) -> Serve<L> {
        Serve {
            rcfg: ResponderConfig {
                inline_send: cfg.inline_send,
                inline_recv: cfg.inline_recv,
                credits: cfg.credits,
                remote_invalidation: cfg.remote_invalidation,
                max_call: u64::from(cfg.chunk_size),
            },
            max_sge: cfg.max_sge as usize,
            calls: CallTable::new(cfg.receive_buffers()),
            arrivals: VecDeque::new(),
            outgoing: VecDeque::new(),
            chunk_slots_free: cfg.chunk_slots,
            chunk_slots: cfg.chunk_slots,
            next: 0,
        }
    }

    /// The grant replies carry from now on.
    pub(super) fn set_grant(&mut self, g: u32) {
        self.rcfg.credits = g;
    }

    pub(super) fn chunk_slots_in_use(&self) -> u32 {
        self.chunk_slots - self.chunk_slots_free
    }

    pub(super) fn landing_bytes(&self) -> u64 {
        self.calls.values().map(|c| c.landing).sum()
    }

    pub(super) fn free_chunk_slot(&mut self) {
        debug_assert!(
            self.chunk_slots_free < self.chunk_slots,
            "a chunk slot freed twice"
        );
        self.chunk_slots_free += 1;
    }

    /// A Read chain of `call` completed.
    pub(super) fn reads_done(&mut self, call: CallId, _reads: u32, events: &mut VecDeque<Event>) {
        let Some(c) = self.calls.get_mut(&call) else {
            return;
        };
        if let Phase::Reading {
            ops,
            posted,
            chains_out,
        } = &mut c.phase
        {
            *chains_out -= 1;
            if *chains_out == 0 && *posted == ops.len() {
                c.phase = Phase::Ready;
                events.push_back(Event::Call(call));
            }
        }
    }
}

impl<L: Piece> Connection<L> {
    /// The responder settings the message-level rules use.
    pub fn responder_config(&self) -> &ResponderConfig {
        &self.serve.rcfg
    }

    /// A received message for the side that answers calls.
    pub(super) fn on_call(&mut self, buffer: u32, msg: Bytes, invalidated: Option<u32>) {
        if let Err(e) = self.credits.arrive() {
            return self.close(ConnError::Protocol(e));
        }
        if let Some(rkey) = invalidated {
            // We expose no memory to a requester; it has nothing of ours
            // to invalidate.
            return self.close(ConnError::Protocol(format!(
                "Send With Invalidate of R_key {rkey:#x} with a call"
            )));
        }
        match responder::receive(msg, &self.serve.rcfg) {
            Received::Discard(_) => {
                self.stats.discarded += 1;
                self.done_with(buffer);
            }
            Received::Error { reply, fault } => {
                match fault {
                    Fault::Vers => self.stats.err_vers += 1,
                    Fault::Chunk(_) => self.stats.err_chunk += 1,
                }
                self.serve
                    .arrivals
                    .push_back(Arrival::Error { buffer, reply });
            }
            Received::Call(incoming) => {
                self.stats.calls += 1;
                if incoming.needs_reads() {
                    self.stats.chunked_calls += 1;
                } else {
                    self.stats.inline_calls += 1;
                }
                self.serve.next = self.serve.next.wrapping_add(1);
                // A call holds its receive buffer: the buffer is its place
                // in the table, the count tells calls in one place apart.
                // A shared buffer's id is the pool's: the call takes a free
                // place instead (there is one: calls are within the grant).
                let place = if self.cfg.shared_receives {
                    match self.serve.calls.free_place() {
                        Some(p) => p,
                        None => {
                            return self.close(ConnError::Driver(
                                "no place for a call within the grant".into(),
                            ))
                        }
                    }
                } else {
                    buffer
                };
                let id = CallId(self.serve.next << 32 | u64::from(place));
                self.serve.calls.insert(
                    id,
                    CallState {
                        buffer,
                        incoming,
                        slot: None,
                        chunk: false,
                        landing: 0,
                        phase: Phase::Waiting,
                    },
                );
                self.serve.arrivals.push_back(Arrival::Call(id));
            }
        }
    }

    /// A call the connection holds.
    pub fn call(&self, id: CallId) -> Option<&IncomingCall> {
        self.serve.calls.get(&id).map(|c| &c.incoming)
    }

    /// Whether a started call holds a chunk slot (it has chunks): reply
    /// data the driver copies for it counts against that slot, up to
    /// [`super::Config::chunk_size`] bytes.
    pub fn holds_chunk_slot(&self, id: CallId) -> bool {
        self.serve.calls.get(&id).is_some_and(|c| c.chunk)
    }

    /// The landing memory for a call's Read chunks: `reads`, in the order
    /// they are to go out, into `landing_bytes` bytes of blocks the driver
    /// holds for the call.
    pub fn land(&mut self, id: CallId, reads: Vec<ReadOp>, landing_bytes: u64) {
        if self.closed.is_some() {
            return;
        }
        let Some(c) = self.serve.calls.get_mut(&id) else {
            return self.close(ConnError::Driver(format!("land: no call {id:?}")));
        };
        if !matches!(c.phase, Phase::Landing) {
            return self.close(ConnError::Driver(format!("land: {id:?} is not landing")));
        }
        let want: u64 = c.incoming.read_chunks.iter().map(|r| r.total_len()).sum();
        let got: u64 = reads.iter().map(|r| u64::from(r.remote.len)).sum();
        if want != got {
            return self.close(ConnError::Driver(format!(
                "land: {got} bytes of Reads for {want} bytes of Read chunks"
            )));
        }
        self.stats.read_bytes += got;
        c.landing = landing_bytes;
        if reads.is_empty() {
            c.phase = Phase::Ready;
            self.events.push_back(Event::Call(id));
        } else {
            c.phase = Phase::Reading {
                ops: reads,
                posted: 0,
                chains_out: 0,
            };
            self.reads.enqueue(id);
        }
        self.progress();
    }

    /// Plans the reply to a ready call: `encode` writes the RPC reply
    /// message. `None` when the connection holds no such call; an error
    /// means the reply cannot be sent as encoded: answer with
    /// [`Connection::reject`].
    pub fn plan_reply(
        &self,
        id: CallId,
        encode: impl FnOnce(&mut dyn XdrSink),
    ) -> Option<Result<ReplyPlan, ReplyError>> {
        let c = self.serve.calls.get(&id)?;
        Some(responder::plan_reply(&c.incoming, &self.serve.rcfg, encode))
    }

    /// Sends the reply `plan` to a ready call. `local[i]` is where the data
    /// of `plan.writes[i]` is, one piece per part of it; `staged` says
    /// whether any of it was copied for the call (its chunk slot is then
    /// held until the Send completes, as the driver holds the copy).
    pub fn send_reply(&mut self, id: CallId, plan: ReplyPlan, local: Vec<Vec<L>>, staged: bool) {
        if self.closed.is_some() {
            return;
        }
        let Some(c) = self.ready(id, "send_reply") else {
            return;
        };
        if local.len() != plan.writes.len() {
            return self.close(ConnError::Driver(format!(
                "send_reply: {} local lists for {} Writes",
                local.len(),
                plan.writes.len()
            )));
        }
        let mut writes = VecDeque::new();
        for (w, pieces) in plan.writes.iter().zip(local) {
            let n: usize = pieces.iter().map(Piece::len).sum();
            if n != w.data.len() {
                return self.close(ConnError::Driver(format!(
                    "send_reply: {n} local bytes for a Write of {}",
                    w.data.len()
                )));
            }
            let mut addr = w.offset;
            let mut batch = Vec::with_capacity(self.serve.max_sge.min(pieces.len()));
            let mut batch_len = 0usize;
            for p in pieces {
                batch_len += p.len();
                batch.push(p);
                if batch.len() == self.serve.max_sge {
                    let remote = RemoteSeg {
                        rkey: w.rkey,
                        addr,
                        len: batch_len as u32,
                    };
                    writes.push_back((std::mem::take(&mut batch), remote));
                    addr += batch_len as u64;
                    batch_len = 0;
                }
            }
            if !batch.is_empty() {
                writes.push_back((
                    batch,
                    RemoteSeg {
                        rkey: w.rkey,
                        addr,
                        len: batch_len as u32,
                    },
                ));
            }
        }
        self.stats.write_bytes += plan.write_len() as u64;
        match plan.shape {
            ReplyShape::Inline => self.stats.inline_replies += 1,
            ReplyShape::ReplyChunk => self.stats.reply_chunk_replies += 1,
        }
        let chunk = c.chunk && staged;
        if c.chunk && !staged {
            self.serve.free_chunk_slot();
        }
        let mut message = Vec::with_capacity(1 + plan.inline.len());
        message.push(plan.header);
        message.extend(plan.inline);
        self.done_with(c.buffer);
        self.serve.outgoing.push_back(Outgoing {
            writes,
            message,
            invalidate: plan.send_with_invalidate,
            slot: c.slot.expect("a started call holds a slot"),
            chunk,
        });
        self.progress();
    }

    /// Answers a call with RDMA_ERROR ERR_CHUNK instead of running it (its
    /// landing memory could not be had, or its RPC header is at fault:
    /// [`responder::call_header`]).
    pub fn reject(&mut self, id: CallId) {
        if self.closed.is_some() {
            return;
        }
        let Some(c) = self.serve.calls.remove(&id) else {
            return self.close(ConnError::Driver(format!("reject: no call {id:?}")));
        };
        if matches!(c.phase, Phase::Waiting | Phase::Reading { .. }) {
            return self.close(ConnError::Driver(format!(
                "reject: {id:?} is not with the application"
            )));
        }
        self.stats.err_chunk += 1;
        if c.chunk {
            self.serve.free_chunk_slot();
        }
        let reply = responder::error_reply(c.incoming.xid, self.credits.grant(), RdmaError::Chunk);
        self.done_with(c.buffer);
        self.serve.outgoing.push_back(Outgoing {
            writes: VecDeque::new(),
            message: vec![reply],
            invalidate: None,
            slot: c.slot.expect("a started call holds a slot"),
            chunk: false,
        });
        self.progress();
    }

    /// The call gets no reply (a retransmission of a call still in
    /// progress, which the duplicate request cache answers later or not at
    /// all).
    pub fn no_reply(&mut self, id: CallId) {
        if self.closed.is_some() {
            return;
        }
        let Some(c) = self.ready(id, "no_reply") else {
            return;
        };
        if c.chunk {
            self.serve.free_chunk_slot();
        }
        if let Some(s) = c.slot {
            self.sendq.free_slot(s);
        }
        self.done_with(c.buffer);
        self.progress();
    }

    /// Removes a call that is with the application.
    fn ready(&mut self, id: CallId, what: &str) -> Option<CallState> {
        match self.serve.calls.get(&id).map(|c| &c.phase) {
            Some(Phase::Ready) => self.serve.calls.remove(&id),
            Some(_) => {
                self.close(ConnError::Driver(format!("{what}: {id:?} is not ready")));
                None
            }
            None => {
                self.close(ConnError::Driver(format!("{what}: no call {id:?}")));
                None
            }
        }
    }

    /// A message is done with: its buffer goes up again and its credit
    /// comes back.
    fn done_with(&mut self, buffer: u32) {
        self.credits.done();
        self.repost(buffer);
    }
}

/// Starts waiting calls, posts waiting Reads and replies, as far as
/// resources go.
pub(super) fn progress<L: Piece>(c: &mut Connection<L>) {
    start_arrivals(c);
    post_reads(c);
    post_outgoing(c);
}

fn start_arrivals<L: Piece>(c: &mut Connection<L>) {
    while let Some(a) = c.serve.arrivals.front() {
        match a {
            Arrival::Error { .. } => {
                let Some(slot) = c.sendq.reserve_slot() else {
                    return;
                };
                let Some(Arrival::Error { buffer, reply }) = c.serve.arrivals.pop_front() else {
                    unreachable!("front checked")
                };
                c.done_with(buffer);
                c.serve.outgoing.push_back(Outgoing {
                    writes: VecDeque::new(),
                    message: vec![reply],
                    invalidate: None,
                    slot,
                    chunk: false,
                });
            }
            &Arrival::Call(id) => {
                let call = c.serve.calls.get(&id).expect("an arrival is held");
                let inc = &call.incoming;
                let chunked =
                    inc.needs_reads() || !inc.write_list.is_empty() || inc.reply_chunk.is_some();
                if c.sendq.free_slots() == 0 || (chunked && c.serve.chunk_slots_free == 0) {
                    return;
                }
                let slot = c.sendq.reserve_slot();
                if chunked {
                    c.serve.chunk_slots_free -= 1;
                }
                let needs_reads = inc.needs_reads();
                let call = c.serve.calls.get_mut(&id).expect("an arrival is held");
                call.slot = slot;
                call.chunk = chunked;
                c.serve.arrivals.pop_front();
                if needs_reads {
                    call.phase = Phase::Landing;
                    c.events.push_back(Event::NeedsReads(id));
                } else {
                    call.phase = Phase::Ready;
                    c.events.push_back(Event::Call(id));
                }
            }
        }
    }
}

fn post_reads<L: Piece>(c: &mut Connection<L>) {
    while let Some(id) = c.reads.front() {
        let room = c.reads.room(c.sendq.room());
        let Some(call) = c.serve.calls.get_mut(&id) else {
            c.reads.pop_front();
            continue;
        };
        let Phase::Reading {
            ops,
            posted,
            chains_out,
        } = &mut call.phase
        else {
            c.reads.pop_front();
            continue;
        };
        let take = (room as usize).min(ops.len() - *posted);
        if take == 0 {
            return;
        }
        let chain: Vec<ReadOp> = ops[*posted..*posted + take].to_vec();
        *posted += take;
        *chains_out += 1;
        let all_posted = *posted == ops.len();
        for _ in 1..take {
            c.sendq.push(WrKind::Read, false, Release::Nothing);
        }
        let wr = c.sendq.push(
            WrKind::Read,
            true,
            Release::ReadChain {
                call: id,
                reads: take as u32,
            },
        );
        c.reads.posted(take as u32);
        c.stats.read_chains += 1;
        c.work.push_back(Work::Reads {
            call: id,
            reads: chain,
            wr,
            quiet: SendQueue::quiet_read(),
        });
        if !all_posted {
            return;
        }
        c.reads.pop_front();
    }
}

fn post_outgoing<L: Piece>(c: &mut Connection<L>) {
    while let Some(o) = c.serve.outgoing.front_mut() {
        let room = c.sendq.room() as usize;
        let writes = o.writes.len();
        if room > writes {
            // Everything left in one chain, the Send last.
            let mut o = c.serve.outgoing.pop_front().expect("front");
            let signaled = c.sendq.send_signaled(writes as u32, o.chunk);
            let mut chain = Vec::with_capacity(writes + 1);
            for (local, remote) in o.writes.drain(..) {
                let wr = c.sendq.push(WrKind::Write, false, Release::Nothing);
                chain.push(SendWr {
                    wr,
                    signaled: false,
                    op: SendOp::Write {
                        local,
                        remote,
                        slot: o.slot,
                    },
                });
            }
            let wr = c.sendq.push(
                WrKind::Send,
                signaled,
                Release::Slot {
                    slot: o.slot,
                    chunk: o.chunk,
                },
            );
            if o.invalidate.is_some() {
                c.stats.sends_with_inv += 1;
            } else {
                c.stats.sends += 1;
            }
            if !signaled {
                c.stats.unsignaled_sends += 1;
            }
            chain.push(SendWr {
                wr,
                signaled,
                op: SendOp::Send {
                    slot: o.slot,
                    message: o.message,
                    invalidate: o.invalidate,
                },
            });
            c.work.push_back(Work::Send(chain));
        } else if room >= 2 {
            // Part of the Writes, the last one signaled so that room comes
            // back.
            let n = room - 1;
            let mut chain = Vec::with_capacity(n);
            for i in 0..n {
                let (local, remote) = o.writes.pop_front().expect("more writes than room");
                let signaled = i + 1 == n;
                let wr = c.sendq.push(WrKind::Write, signaled, Release::Nothing);
                chain.push(SendWr {
                    wr,
                    signaled,
                    op: SendOp::Write {
                        local,
                        remote,
                        slot: o.slot,
                    },
                });
            }
            c.work.push_back(Work::Send(chain));
            return;
        } else {
            return;
        }
    }
}
