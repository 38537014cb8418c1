//! The state of one RPC-over-RDMA connection, and every rule that spans
//! more than one message. No verbs, no clock, no threads: the driver feeds
//! it events and carries out the work it yields, in order.
//!
//! ```text
//!  driver                                  Connection
//!  ------                                  ----------
//!  receive completed (buffer, bytes) ----> received()
//!  work request completed / failed  ----> completed() / failed()
//!  landing memory for a call's Reads ----> land()
//!  the application's reply          ----> send_reply() / reject() / no_reply()
//!  post what poll_work() yields     <---- Work: receives, Read chains, Write+Send chains
//!  run what poll_event() yields     <---- Event: NeedsReads, Call, Closed
//! ```
//!
//! Where each rule is decided:
//!
//! | rule | file |
//! | --- | --- |
//! | receive buffers: posted before credit is granted, held by a message until it is done | [`recv`] |
//! | credits granted, used, overrun (RFC 8166 §3.3) | [`credits`] |
//! | send queue depth, send slots, which work requests ask for a completion | [`sendq`] |
//! | RDMA Read depth and the order waiting Reads go out | [`reads`] |
//! | the life of an incoming call: classification, resources, reply, RDMA_ERROR | [`serve`] |
//! | the message-level rules (header checks, XID, reply planning, Send With Invalidate) | [`crate::responder`] |
//!
//! # Policies
//! - **Resources, not queues.** A message holds its receive buffer from its
//!   receive completion until its reply (or RDMA_ERROR) is posted, or it is
//!   dropped; the buffer is posted again then, before the reply's Send. So
//!   a connection never holds more messages than it has receive buffers,
//!   and a requester that ignores its credits finds no receive posted: its
//!   extra Sends wait in its own queue (receiver-not-ready retries), not in
//!   ours. Nothing here grows with what the peer sends.
//! - A started call holds a send slot (for its reply) and, when it has
//!   chunks, a chunk slot (the right to landing memory and staged reply
//!   data of up to [`Config::chunk_size`] each, in memory the driver
//!   provides), from the start until its reply's Send completes (the
//!   chunk slot only while the driver holds data copied for the reply).
//!   Calls start in arrival order; the oldest waits for what it needs, and
//!   the rest wait behind it.
//! - Every failed work request ends the connection (RFC 8166 §4.4 leaves
//!   no way to resume one whose RDMA operation failed).
//!
//! # Memory bound
//! Whatever the peer sends, one connection holds at most
//! [`Config::memory_bound`] bytes of messages and reply data in this
//! state and in the buffers it accounts for (see [`Footprint`]).

pub mod call;
pub mod credits;
pub mod reads;
pub mod recv;
pub mod sendq;
pub mod serve;

use bytes::Bytes;
use std::collections::VecDeque;

pub use serve::CallId;

/// A work request's id: what it is, and which buffer, slot or call it
/// belongs to. The driver passes it through verbs unchanged and hands it
/// back with the completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WrId(pub u64);

/// Kinds of work requests, in the top byte of a [`WrId`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum WrKind {
    /// A receive.
    Recv = 1,
    /// A Send (or Send With Invalidate).
    Send = 2,
    /// An RDMA Write.
    Write = 3,
    /// An RDMA Read.
    Read = 4,
    /// A LOCAL_INV.
    LocalInv = 5,
    /// A request of the driver's own in a chain (a window bind).
    Driver = 6,
}

impl WrId {
    const VALUE_BITS: u32 = 56;

    pub(crate) fn new(kind: WrKind, value: u64) -> WrId {
        WrId((kind as u64) << Self::VALUE_BITS | (value & ((1 << Self::VALUE_BITS) - 1)))
    }

    /// The kind, if the top byte names one.
    pub fn kind(self) -> Option<WrKind> {
        match self.0 >> Self::VALUE_BITS {
            1 => Some(WrKind::Recv),
            2 => Some(WrKind::Send),
            3 => Some(WrKind::Write),
            4 => Some(WrKind::Read),
            5 => Some(WrKind::LocalInv),
            6 => Some(WrKind::Driver),
            _ => None,
        }
    }

    pub(crate) fn value(self) -> u64 {
        self.0 & ((1 << Self::VALUE_BITS) - 1)
    }

    /// The id of a request of the driver's own in a chain (a window bind),
    /// seen only if it fails.
    pub fn driver(value: u64) -> WrId {
        WrId::new(WrKind::Driver, value)
    }

    /// The receive buffer of a receive's id.
    pub fn recv_buffer(self) -> Option<u32> {
        (self.kind() == Some(WrKind::Recv)).then(|| self.value() as u32)
    }
}

/// A range of the peer's registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteSeg {
    /// The peer's R_key.
    pub rkey: u32,
    /// The peer's address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
}

/// A piece of local memory a driver names in a work request (a registered
/// store block, a copy in staging memory, ...). The core needs only its
/// length.
pub trait Piece {
    /// Bytes.
    fn len(&self) -> usize;

    /// True when empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Piece for Bytes {
    fn len(&self) -> usize {
        Bytes::len(self)
    }
}

/// One RDMA Read: from the peer's memory into `offset` of the call's
/// landing block `block` (the blocks the driver named in
/// [`Connection::land`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOp {
    /// Index of the landing block.
    pub block: u32,
    /// Offset in it.
    pub offset: u32,
    /// The peer's memory.
    pub remote: RemoteSeg,
}

/// One send-queue work request of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr<L> {
    /// Its id.
    pub wr: WrId,
    /// Asks for a completion. An unsignaled one is covered by the next
    /// signaled one (a queue pair completes its work in order).
    pub signaled: bool,
    /// What it does.
    pub op: SendOp<L>,
}

/// What a send-queue work request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOp<L> {
    /// A Send of `message` (header and inline part, in order) from send
    /// slot `slot`; a Send With Invalidate of `invalidate` when set.
    Send {
        /// The send buffer to copy the message into.
        slot: u32,
        /// The message.
        message: Vec<Bytes>,
        /// The peer's R_key to invalidate.
        invalidate: Option<u32>,
    },
    /// An RDMA Write of `local` (gathered in order) to `remote`, for the
    /// reply whose Send will use `slot`: the pieces must stay as they are
    /// until [`Connection::poll_released`] yields that slot.
    Write {
        /// The local pieces.
        local: Vec<L>,
        /// The peer's memory.
        remote: RemoteSeg,
        /// The reply's send slot.
        slot: u32,
    },
    /// A call's Send of `message` from send slot `slot`, after `pre`
    /// requests of the driver's own (window binds) in the same chain.
    Call {
        /// The call's slot (and its send buffer).
        slot: u32,
        /// The message.
        message: Vec<Bytes>,
        /// Driver requests to put before it.
        pre: u32,
    },
    /// Invalidates one of our own keys.
    LocalInv {
        /// The key.
        rkey: u32,
    },
}

/// Work for the driver, to be carried out in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work<L> {
    /// Post receive buffer `buffer` with id `wr`.
    Recv {
        /// The buffer.
        buffer: u32,
        /// The id.
        wr: WrId,
    },
    /// Post `reads` for `call` as one chain whose last request alone is
    /// signaled, with `wr`; the others carry `quiet` (reported only if
    /// they fail).
    Reads {
        /// The call.
        call: CallId,
        /// The reads, in order.
        reads: Vec<ReadOp>,
        /// The last one's id.
        wr: WrId,
        /// The others' id.
        quiet: WrId,
    },
    /// Post these send-queue work requests as one chain.
    Send(Vec<SendWr<L>>),
}

/// What the application is to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The call needs its Read chunks read: the driver finds landing
    /// memory for them and answers with [`Connection::land`] (or
    /// [`Connection::reject`]).
    NeedsReads(CallId),
    /// The call is ready to run (its chunks read, if any): the driver
    /// assembles it and answers with [`Connection::send_reply`],
    /// [`Connection::reject`] or [`Connection::no_reply`].
    Call(CallId),
    /// The reply to the call in `slot` is fenced and ready: take it with
    /// [`Connection::take_reply`], then [`Connection::finish_call`].
    Reply {
        /// The call's slot.
        slot: u32,
    },
    /// The call in `slot` failed for good (its reply broke the protocol);
    /// the connection is closed next.
    CallFailed {
        /// The call's slot.
        slot: u32,
        /// Why.
        error: String,
    },
    /// The connection is over; nothing more will be yielded (the replies
    /// and failures yielded before it still stand). Calls still in flight
    /// have no reply on it.
    Closed(ConnError),
}

/// Why a connection ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// Work requests were flushed before any failed: the queue pair left
    /// the connected state, as it does when the peer disconnects.
    #[error("work requests flushed: the queue pair is no longer connected")]
    Flushed,
    /// A work request failed.
    #[error("{what} failed: {detail}")]
    Failed {
        /// Which kind of work request.
        what: &'static str,
        /// The status.
        detail: String,
    },
    /// The peer broke the protocol in a way that leaves no way to go on.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// The driver broke the core's contract (a bug, never the peer).
    #[error("driver contract: {0}")]
    Driver(String),
    /// The driver closed it.
    #[error("closed")]
    Closed,
}

/// A connection's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Credits granted to the peer for calls to us (0: this side answers
    /// no calls): receive buffers posted for calls, and the most calls
    /// held at once.
    pub credits: u32,
    /// Slots for calls we send (0: this side sends no calls); a receive
    /// buffer is posted for each call's reply.
    pub calls: u32,
    /// Credits kept in reserve below the peer's grant.
    pub call_reserve: u32,
    /// We offered to accept Send With Invalidate (replies to our calls).
    pub accept_remote_invalidation: bool,
    /// Which side of the forward direction this is.
    pub role: Role,
    /// Send buffers (each [`Config::inline_send`] bytes): one per started
    /// call, held until its reply's Send completes.
    pub send_slots: u32,
    /// Work requests the send queue holds.
    pub sq_depth: u32,
    /// RDMA Reads we may have outstanding towards the peer (the initiator
    /// depth agreed at connect time).
    pub read_depth: u32,
    /// Chunk slots: calls with chunks in progress at once. Each may hold
    /// up to [`Config::chunk_size`] bytes of landing memory for its Read
    /// chunks and as much reply data copied for its Write or Reply chunks,
    /// both in memory the driver provides.
    pub chunk_slots: u32,
    /// The largest call assembled from chunks, and the most reply data
    /// copied for one call.
    pub chunk_size: u32,
    /// Scatter/gather entries per RDMA Write.
    pub max_sge: u32,
    /// One reply Send in this many asks for a completion (see
    /// [`sendq`]).
    pub signal_every: u32,
    /// Largest message we send inline.
    pub inline_send: u32,
    /// Our receive buffers' size.
    pub inline_recv: u32,
    /// The peer accepts Send With Invalidate.
    pub remote_invalidation: bool,
    /// Receives come from a shared receive queue the driver posts to.
    /// Nothing is posted at the start, a receive may complete in any
    /// buffer of the pool (its work request id names it), and each buffer
    /// is given back to be posted once its message is done with: a call's
    /// when the call is, a reply's (to one of our `calls`) as soon as it
    /// is parsed. The grant starts at `credits` and the driver may lower
    /// it ([`Connection::set_grant`]); a call beyond `credits` ends the
    /// connection.
    pub shared_receives: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            credits: 128,
            calls: 0,
            call_reserve: 1,
            accept_remote_invalidation: false,
            role: Role::Responder,
            send_slots: 128,
            sq_depth: 512,
            read_depth: 16,
            chunk_slots: 4,
            chunk_size: (1 << 20) + (64 << 10),
            max_sge: 16,
            signal_every: 1,
            inline_send: 4096,
            inline_recv: 4096,
            remote_invalidation: false,
            shared_receives: false,
        }
    }
}

impl Config {
    /// The most bytes one connection's messages and reply data take,
    /// whatever the peer does: every receive buffer held by a message,
    /// every send slot with a reply waiting or in flight, every chunk
    /// slot with landing memory of the largest call and with staged reply
    /// data.
    pub fn memory_bound(&self) -> u64 {
        let c = u64::from(self.receive_buffers()) * u64::from(self.inline_recv);
        let s = u64::from(self.send_slots) * u64::from(self.inline_send);
        let k = 2 * u64::from(self.chunk_slots) * u64::from(self.chunk_size);
        c + s + k
    }

    /// Receive buffers posted: one per credit, one per call slot.
    pub fn receive_buffers(&self) -> u32 {
        self.credits + self.calls
    }

    fn checked(mut self) -> Config {
        if self.calls == 0 {
            self.credits = self.credits.max(1);
        }
        self.send_slots = self.send_slots.max(1);
        self.sq_depth = self.sq_depth.max(4);
        self.read_depth = self.read_depth.max(1);
        self.chunk_slots = self.chunk_slots.max(1);
        self.max_sge = self.max_sge.max(1);
        self.signal_every = self.signal_every.max(1);
        self
    }
}

/// Counters of one connection (a snapshot; add them up across
/// connections as the report needs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Calls received.
    pub calls: u64,
    /// Calls that arrived entirely inline.
    pub inline_calls: u64,
    /// Calls with Read chunks.
    pub chunked_calls: u64,
    /// Replies sent inline.
    pub inline_replies: u64,
    /// Replies sent through the Reply chunk.
    pub reply_chunk_replies: u64,
    /// Bytes moved by RDMA Read.
    pub read_bytes: u64,
    /// Bytes moved by RDMA Write.
    pub write_bytes: u64,
    /// Plain Sends.
    pub sends: u64,
    /// Sends With Invalidate.
    pub sends_with_inv: u64,
    /// Reply Sends posted without asking for a completion.
    pub unsignaled_sends: u64,
    /// RDMA_ERROR ERR_VERS sent.
    pub err_vers: u64,
    /// RDMA_ERROR ERR_CHUNK sent.
    pub err_chunk: u64,
    /// Messages dropped without a reply.
    pub discarded: u64,
    /// RDMA Read chains posted.
    pub read_chains: u64,
    /// Calls sent.
    pub calls_sent: u64,
    /// Replies that matched no call (dropped).
    pub unmatched_replies: u64,
    /// Our keys the peer invalidated (Send With Invalidate).
    pub remote_invalidations: u64,
    /// Our keys invalidated with LOCAL_INV.
    pub local_invalidations: u64,
}

/// What a connection holds now, against [`Config::memory_bound`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Footprint {
    /// Receive buffers held by messages.
    pub held_receives: u32,
    /// Send slots in use (reserved by a call, or by a Send in flight).
    pub send_slots: u32,
    /// Chunk slots in use.
    pub chunk_slots: u32,
    /// Bytes of landing memory asked for (calls being read).
    pub landing_bytes: u64,
    /// Send-queue entries in use.
    pub sq_entries: u32,
    /// RDMA Reads outstanding.
    pub reads: u32,
}

impl Footprint {
    /// Bytes these take, counted as [`Config::memory_bound`] counts them.
    pub fn bytes(&self, cfg: &Config) -> u64 {
        u64::from(self.held_receives) * u64::from(cfg.inline_recv)
            + u64::from(self.send_slots) * u64::from(cfg.inline_send)
            + u64::from(self.chunk_slots) * u64::from(cfg.chunk_size)
            + self.landing_bytes
    }
}

/// One RPC-over-RDMA connection: the side that answers calls, the side
/// that sends them, or both (RFC 8167).
#[derive(Debug)]
pub struct Connection<L> {
    cfg: Config,
    recv: recv::RecvBuffers,
    credits: credits::Credits,
    sendq: sendq::SendQueue,
    reads: reads::ReadScheduler,
    serve: serve::Serve<L>,
    calls: call::Calls,
    work: VecDeque<Work<L>>,
    events: VecDeque<Event>,
    released: VecDeque<u32>,
    /// Reused for what a completion gives back.
    scratch: Vec<sendq::Release>,
    stats: Stats,
    closed: Option<ConnError>,
}

impl<L: Piece> Connection<L> {
    /// A connection with `cfg`; its first work posts every receive buffer
    /// (before any credit is granted, RFC 8166 §3.3.1).
    pub fn new(cfg: Config) -> Connection<L> {
        let cfg = cfg.checked();
        let mut c = Connection {
            recv: if cfg.shared_receives {
                recv::RecvBuffers::shared()
            } else {
                recv::RecvBuffers::new(cfg.receive_buffers())
            },
            credits: credits::Credits::new(cfg.credits),
            sendq: sendq::SendQueue::new(&cfg),
            reads: reads::ReadScheduler::new(cfg.read_depth),
            serve: serve::Serve::new(&cfg),
            calls: call::Calls::new(&cfg),
            work: VecDeque::new(),
            events: VecDeque::new(),
            released: VecDeque::new(),
            scratch: Vec::new(),
            stats: Stats::default(),
            closed: None,
            cfg,
        };
        let own = if c.cfg.shared_receives {
            0
        } else {
            c.cfg.receive_buffers()
        };
        for b in 0..own {
            c.recv.post(b);
            c.work.push_back(Work::Recv {
                buffer: b,
                wr: recv::wr_id(b),
            });
        }
        c
    }

    /// Grants the peer `n` credits in the replies built from now on,
    /// within 1..=[`Config::credits`] (which stays the bound on its calls:
    /// see [`credits`]); returns the grant in force. For a driver whose
    /// connections share receive buffers ([`Config::shared_receives`]).
    pub fn set_grant(&mut self, n: u32) -> u32 {
        let g = self.credits.set_grant(n);
        self.serve.set_grant(g);
        g
    }

    /// The credits granted in replies now.
    pub fn grant(&self) -> u32 {
        self.credits.grant()
    }

    /// The settings in force.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The next work to carry out, in order.
    pub fn poll_work(&mut self) -> Option<Work<L>> {
        self.work.pop_front()
    }

    /// The next thing for the application to do.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next send slot whose Send has completed: what the driver kept
    /// for it (the Writes' local pieces, the send buffer) is free.
    pub fn poll_released(&mut self) -> Option<u32> {
        self.released.pop_front()
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        Stats {
            unmatched_replies: self.calls.unmatched,
            remote_invalidations: self.calls.remote_invalidations,
            local_invalidations: self.calls.local_invalidations,
            ..self.stats
        }
    }

    /// What the connection holds now.
    pub fn footprint(&self) -> Footprint {
        Footprint {
            held_receives: self.recv.held(),
            send_slots: self.cfg.send_slots - self.sendq.free_slots(),
            chunk_slots: self.serve.chunk_slots_in_use(),
            landing_bytes: self.serve.landing_bytes(),
            sq_entries: self.sendq.in_use(),
            reads: self.reads.outstanding(),
        }
    }

    /// Receive buffers held by messages now.
    pub fn held_receives(&self) -> u32 {
        self.recv.held()
    }

    /// The receive buffers not handed to the driver to post: held by
    /// messages, and, once the connection has ended, those it had given
    /// back but whose posting it dropped with the rest of its work. With
    /// shared receives ([`Config::shared_receives`]) the driver returns
    /// these to the pool when it drops the connection.
    pub fn held_buffers(&self) -> Vec<u32> {
        self.recv.held_ids()
    }

    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
    }

    /// True when nothing is in progress: no message held, no work request
    /// outstanding but the posted receives (a connection that went quiet).
    pub fn is_idle(&self) -> bool {
        let f = self.footprint();
        f.held_receives == 0
            && self.calls.in_flight() == 0
            && f.send_slots == self.sendq.unreaped_slots()
            && f.chunk_slots == 0
            && f.landing_bytes == 0
            && f.reads == 0
            && self.work.is_empty()
            && self.events.is_empty()
    }

    /// A work request completed successfully (a signaled one; it stands
    /// for the unsignaled ones before it on the send queue).
    pub fn completed(&mut self, wr: WrId) {
        if self.closed.is_some() {
            return;
        }
        match wr.kind() {
            Some(WrKind::Send | WrKind::Write | WrKind::Read | WrKind::LocalInv) => {
                let mut released = std::mem::take(&mut self.scratch);
                match self.sendq.complete(wr, &mut released) {
                    Ok(()) => {
                        for r in released.drain(..) {
                            self.release(r);
                        }
                        self.scratch = released;
                        self.progress();
                    }
                    Err(e) => self.close(ConnError::Driver(e)),
                }
            }
            Some(WrKind::Recv | WrKind::Driver) => self.close(ConnError::Driver(format!(
                "completion of {:?} work request {:#x} through completed()",
                wr.kind(),
                wr.0
            ))),
            None => self.close(ConnError::Driver(format!(
                "completion of unknown work request {:#x}",
                wr.0
            ))),
        }
    }

    /// A work request failed (`flushed`: the queue pair left the connected
    /// state before running it).
    pub fn failed(&mut self, wr: WrId, flushed: bool, detail: &str) {
        if self.closed.is_some() {
            return;
        }
        if flushed {
            return self.close(ConnError::Flushed);
        }
        let what = match wr.kind() {
            Some(WrKind::Recv) => "receive",
            Some(WrKind::Send) => "send",
            Some(WrKind::Write) => "RDMA Write",
            Some(WrKind::Read) => "RDMA Read",
            Some(WrKind::LocalInv) => "local invalidation",
            Some(WrKind::Driver) => "memory window bind",
            None => "work request",
        };
        self.close(ConnError::Failed {
            what,
            detail: detail.to_string(),
        });
    }

    /// The driver ends the connection (a disconnect, a stop).
    pub fn close_now(&mut self) {
        if self.closed.is_none() {
            self.close(ConnError::Closed);
        }
    }

    fn close(&mut self, e: ConnError) {
        if self.closed.is_some() {
            return;
        }
        self.closed = Some(e.clone());
        for w in self.work.drain(..) {
            if let Work::Recv { buffer, .. } = w {
                self.recv.unpost(buffer);
            }
        }
        // A call that failed for good keeps its failure (it is not to be
        // sent again on another connection), and a reply already fenced
        // is still handed over; nothing else is left to do.
        self.events
            .retain(|ev| matches!(ev, Event::CallFailed { .. } | Event::Reply { .. }));
        self.events.push_back(Event::Closed(e));
    }

    fn release(&mut self, r: sendq::Release) {
        match r {
            sendq::Release::Nothing => {}
            sendq::Release::Slot { slot, chunk } => {
                self.sendq.free_slot(slot);
                self.released.push_back(slot);
                if chunk {
                    self.serve.free_chunk_slot();
                }
            }
            sendq::Release::ReadChain { call, reads } => {
                self.reads.chain_done(reads);
                self.serve.reads_done(call, reads, &mut self.events);
            }
            sendq::Release::CallSent { slot } => self.call_sent(slot),
            sendq::Release::Fenced { slot } => self.call_fenced(slot),
        }
    }

    /// Moves everything that can move: waiting calls start, waiting Reads
    /// and replies go out.
    fn progress(&mut self) {
        if self.closed.is_some() {
            return;
        }
        call::progress(self);
        serve::progress(self);
    }

    /// A receive completed: buffer `wr` holds `msg` (which may be a view
    /// of the buffer: the buffer is not posted again until the message is
    /// done with). `invalidated` is the R_key a Send With Invalidate
    /// named.
    ///
    /// On a connection that both answers and sends calls (RFC 8167), a
    /// message goes to the side of its RPC message type: on the side that
    /// answers forward calls, an inline RDMA_MSG with no chunks whose
    /// `msg_type` is REPLY answers one of our (backward) calls; on the
    /// side that sends forward calls, such a message whose `msg_type` is
    /// CALL is a backward call. Everything else belongs to the
    /// connection's forward direction.
    pub fn received(&mut self, wr: WrId, msg: Bytes, invalidated: Option<u32>) {
        if self.closed.is_some() {
            // A shared buffer is the driver's to give back to its pool.
            if let (true, Some(b)) = (self.cfg.shared_receives, wr.recv_buffer()) {
                let _ = self.recv.take(b);
            }
            return;
        }
        let Some(buffer) = wr.recv_buffer() else {
            return self.close(ConnError::Driver(format!(
                "receive completion for work request {:#x}",
                wr.0
            )));
        };
        if let Err(e) = self.recv.take(buffer) {
            return self.close(ConnError::Driver(e));
        }
        let serving = self.cfg.credits > 0;
        let calling = self.cfg.calls > 0;
        let to_calls = match (serving, calling) {
            (true, false) => false,
            (false, _) => true,
            // The backward direction is inline only: a bare REPLY answers
            // a backward call of ours; everything else is a forward call.
            (true, true) if self.cfg.role == Role::Responder => {
                backward_msg_type(&msg) == Some(REPLY)
            }
            // A bare CALL is a backward call; everything else answers a
            // forward call of ours.
            (true, true) => backward_msg_type(&msg) != Some(CALL),
        };
        if to_calls {
            self.on_reply(buffer, msg, invalidated);
        } else {
            self.on_call(buffer, msg, invalidated);
        }
        self.progress();
    }

    /// Posts receive buffer `buffer` again.
    fn repost(&mut self, buffer: u32) {
        self.recv.post(buffer);
        self.work.push_back(Work::Recv {
            buffer,
            wr: recv::wr_id(buffer),
        });
    }
}

/// RPC `msg_type` CALL.
const CALL: u32 = 0;
/// RPC `msg_type` REPLY.
const REPLY: u32 = 1;

/// Which side of the forward direction a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    /// It accepted the connection and answers forward calls (a server);
    /// the calls it sends are backward calls.
    #[default]
    Responder,
    /// It connected and sends forward calls (a client); the calls it
    /// answers are backward calls.
    Requester,
}

/// The RPC message type of a message that can travel in the backward
/// direction (RFC 8167 §4: an inline RDMA_MSG with three empty chunk
/// lists, whose RPC XID is the transport XID); `None` for anything else.
fn backward_msg_type(msg: &[u8]) -> Option<u32> {
    let w = |i: usize| {
        msg.get(i * 4..i * 4 + 4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
    };
    let bare = w(1)? == 1 && w(3)? == 0 && w(4)? == 0 && w(5)? == 0 && w(6)? == 0;
    (bare && w(7)? == w(0)?).then(|| w(8)).flatten()
}

#[cfg(test)]
mod shared_tests;
