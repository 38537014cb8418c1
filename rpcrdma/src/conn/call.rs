//! The life of an outgoing call on the requester side: from a slot within
//! the credits to the reply handed over once every registration of the
//! call is fenced.
//!
//! ```text
//! reserve_call (a slot within the credit limit)
//!   -> the driver registers the call's chunks (its registration strategy)
//!   -> start_call: the Send (after the driver's own requests, e.g. window
//!      binds, in the same chain)
//! received: the reply's XID finds the call
//!   -> a Send With Invalidate must name one of the call's keys
//!   -> the reply header must fit the call (requester::parse_reply)
//!   -> the grant moves the credit limit
//!   -> LOCAL_INV of every key the peer did not invalidate
//! fenced -> Event::Reply -> take_reply, finish_call (the slot is free
//!   once the call's Send has completed as well)
//! ```
//!
//! # Policies
//! - The credit limit is the responder's last grant (zero read as one,
//!   RFC 8166 §3.3.1), minus `call_reserve` (one, as the Linux client
//!   keeps: RFC 8267 §4), never below one, never above the slots.
//! - A Send With Invalidate must name a key of the call it answers (RFC
//!   8797 §4.1: "an STag associated only with the XID in the rdma_xid
//!   field"); any other key, or one with a reply that matches no call,
//!   ends the connection: that memory cannot be taken as fenced. So does
//!   a Send With Invalidate when this side did not offer to accept it.
//! - A reply whose header does not fit its call fails that call and ends
//!   the connection. A reply whose XID matches no call is dropped and
//!   counted.
//! - The reply is handed over only after every key of the call is
//!   invalidated (by the peer or by LOCAL_INV): no peer access can reach
//!   the call's memory any more. The slot (its send buffer) is given to
//!   another call only once the call's Send has completed too, so no work
//!   request of ours still reads it. (A Send's completion often comes
//!   after the reply, the acknowledgement riding behind it; the caller
//!   need not wait for it.)

use super::sendq::Release;
use super::{ConnError, Connection, Event, Piece, SendOp, SendWr, Work, WrKind};
use crate::requester::{self, CallPlan, Reply};
use bytes::Bytes;
use std::collections::{HashMap, VecDeque};

/// A hasher for our own XIDs (chosen by us, so no peer can aim collisions
/// at it): one multiplication instead of SipHash on every reply.
#[derive(Debug, Default, Clone, Copy)]
pub struct XidHasher(u64);

impl std::hash::Hasher for XidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.0 = u64::from(v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by our XIDs.
pub type XidMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<XidHasher>>;

#[derive(Debug)]
struct OutCall {
    xid: u32,
    plan: CallPlan,
    /// Keys still to invalidate.
    fence: Vec<u32>,
    send_done: bool,
    reply: Option<Reply>,
    fencing: bool,
    /// `Event::Reply` was yielded.
    announced: bool,
    /// The driver is done with the call; the slot waits for the Send.
    finished: bool,
}

/// A call's Send waiting for send-queue room.
#[derive(Debug)]
struct PendingSend {
    slot: u32,
    message: Vec<Bytes>,
    pre: u32,
}

/// The requester's state between messages.
#[derive(Debug)]
pub struct Calls {
    slots: Vec<Option<OutCall>>,
    free: Vec<u32>,
    xids: XidMap<u32>,
    limit: u32,
    in_flight: u32,
    reserve: u32,
    ask: u32,
    accepts_remote_invalidation: bool,
    sends: VecDeque<PendingSend>,
    invs: VecDeque<(u32, Vec<u32>)>,
    /// Replies that matched no call.
    pub(super) unmatched: u64,
    /// Keys the peer invalidated with Send With Invalidate.
    pub(super) remote_invalidations: u64,
    /// Keys invalidated with LOCAL_INV.
    pub(super) local_invalidations: u64,
}

impl Calls {
    pub(super) fn new(cfg: &super::Config) -> Calls {
        Calls {
            slots: (0..cfg.calls).map(|_| None).collect(),
            free: (0..cfg.calls).rev().collect(),
            xids: XidMap::default(),
            limit: 1,
            in_flight: 0,
            reserve: cfg.call_reserve,
            ask: cfg.calls.max(1),
            accepts_remote_invalidation: cfg.accept_remote_invalidation,
            sends: VecDeque::new(),
            invs: VecDeque::new(),
            unmatched: 0,
            remote_invalidations: 0,
            local_invalidations: 0,
        }
    }

    pub(super) fn in_flight(&self) -> u32 {
        self.in_flight
    }
}

impl<L: Piece> Connection<L> {
    /// A free call slot within the credit limit, taken; `None` while the
    /// limit or the slots are used up (try again after the next reply).
    pub fn reserve_call(&mut self) -> Option<u32> {
        let c = &mut self.calls;
        if self.closed.is_some() || c.in_flight >= c.limit {
            return None;
        }
        let s = c.free.pop()?;
        c.in_flight += 1;
        Some(s)
    }

    /// Whether [`Connection::reserve_call`] would give a slot now.
    pub fn can_call(&self) -> bool {
        self.closed.is_none()
            && self.calls.in_flight < self.calls.limit
            && !self.calls.free.is_empty()
    }

    /// Calls allowed in flight now (the credit limit).
    pub fn call_limit(&self) -> u32 {
        self.calls.limit
    }

    /// Gives back a reserved slot whose call was never started.
    pub fn unreserve_call(&mut self, slot: u32) {
        let c = &mut self.calls;
        if c.slots.get(slot as usize).is_some_and(Option::is_none) && !c.free.contains(&slot) {
            c.free.push(slot);
            c.in_flight -= 1;
        }
    }

    /// The credits to ask for in a call's header.
    pub fn credits_to_ask(&self) -> u32 {
        self.calls.ask
    }

    /// Starts the call in a reserved slot: `message` (its header, built
    /// with the registrations' segments, and its inline part) goes out
    /// in one chain after `pre` work requests of the driver's own (window
    /// binds), which the core counts on the send queue. `fence` lists
    /// every key the call exposes: each is invalidated (by the peer or
    /// locally) before the reply is handed over.
    pub fn start_call(
        &mut self,
        slot: u32,
        plan: CallPlan,
        message: Vec<Bytes>,
        fence: Vec<u32>,
        pre: u32,
    ) {
        if self.closed.is_some() {
            return;
        }
        if self.calls.xids.contains_key(&plan.xid) {
            return self.close(ConnError::Driver(format!(
                "start_call: XID {:#x} is in flight already",
                plan.xid
            )));
        }
        let c = &mut self.calls;
        let Some(entry) = c.slots.get_mut(slot as usize).filter(|e| e.is_none()) else {
            return self.close(ConnError::Driver(format!(
                "start_call: slot {slot} is not free"
            )));
        };
        c.xids.insert(plan.xid, slot);
        *entry = Some(OutCall {
            xid: plan.xid,
            plan,
            fence,
            send_done: false,
            reply: None,
            fencing: false,
            announced: false,
            finished: false,
        });
        c.sends.push_back(PendingSend { slot, message, pre });
        self.stats.calls_sent += 1;
        self.progress();
    }

    /// A received message that answers one of our calls.
    pub(super) fn on_reply(&mut self, buffer: u32, msg: Bytes, invalidated: Option<u32>) {
        // The message is parsed now; its buffer goes up again at once.
        self.repost(buffer);
        let xid = requester::reply_xid(&msg);
        let Some(slot) = xid.and_then(|x| self.calls.xids.get(&x).copied()) else {
            if let Some(k) = invalidated {
                return self.close(ConnError::Protocol(format!(
                    "Send With Invalidate of R_key {k:#x} with a reply that matches no call"
                )));
            }
            self.calls.unmatched += 1;
            return;
        };
        if invalidated.is_some() && !self.calls.accepts_remote_invalidation {
            return self.close(ConnError::Protocol(
                "Send With Invalidate although we did not offer to accept it".into(),
            ));
        }
        let slots = self.calls.slots.len() as u32;
        let call = self.calls.slots[slot as usize]
            .as_mut()
            .expect("an XID maps to a call");
        let xid = call.xid;
        if let Some(k) = invalidated {
            match call.fence.iter().position(|x| *x == k) {
                Some(p) => {
                    call.fence.swap_remove(p);
                }
                None => {
                    return self.close(ConnError::Protocol(format!(
                    "Send With Invalidate named R_key {k:#x}, which is not one of call {xid:#x}'s"
                )))
                }
            }
            self.calls.remote_invalidations += 1;
        }
        let call = self.calls.slots[slot as usize]
            .as_mut()
            .expect("an XID maps to a call");
        let reply = match requester::parse_reply(msg, &call.plan) {
            Ok(r) => r,
            Err(e) => {
                self.events.push_back(Event::CallFailed {
                    slot,
                    error: format!("bad reply header: {e}"),
                });
                return self.close(ConnError::Protocol(format!(
                    "reply to {xid:#x}: bad reply header: {e}"
                )));
            }
        };
        let granted = match &reply {
            Reply::Message { credits, .. } | Reply::Error { credits, .. } => *credits,
        };
        call.reply = Some(reply);
        call.fencing = true;
        let keys = std::mem::take(&mut call.fence);
        let c = &mut self.calls;
        c.limit = granted
            .clamp(1, slots.max(1))
            .saturating_sub(c.reserve)
            .max(1);
        c.xids.remove(&xid);
        if keys.is_empty() {
            self.call_fenced(slot);
        } else {
            c.local_invalidations += keys.len() as u64;
            c.invs.push_back((slot, keys));
        }
    }

    fn maybe_deliver(&mut self, slot: u32) {
        let Some(call) = self.calls.slots[slot as usize].as_mut() else {
            return;
        };
        if !call.fencing && call.reply.is_some() && !call.announced {
            call.announced = true;
            self.events.push_back(Event::Reply { slot });
        }
    }

    /// The reply of a call [`Event::Reply`] named.
    pub fn take_reply(&mut self, slot: u32) -> Option<Reply> {
        self.calls
            .slots
            .get_mut(slot as usize)?
            .as_mut()?
            .reply
            .take()
    }

    /// The call in `slot` is done with: the slot is free for another, at
    /// once or when the call's Send completes.
    pub fn finish_call(&mut self, slot: u32) {
        let c = &mut self.calls;
        match c.slots.get_mut(slot as usize) {
            Some(Some(call)) if call.send_done => self.free_call(slot),
            Some(Some(call)) => call.finished = true,
            _ => {}
        }
    }

    fn free_call(&mut self, slot: u32) {
        let c = &mut self.calls;
        if let Some(call) = c.slots.get_mut(slot as usize).and_then(Option::take) {
            c.xids.remove(&call.xid);
            c.free.push(slot);
            c.in_flight -= 1;
        }
    }

    /// A call's Send completed.
    pub(super) fn call_sent(&mut self, slot: u32) {
        match self.calls.slots[slot as usize].as_mut() {
            Some(call) if call.finished => self.free_call(slot),
            Some(call) => {
                call.send_done = true;
                self.maybe_deliver(slot);
            }
            None => {}
        }
    }

    /// A call's local invalidations completed.
    pub(super) fn call_fenced(&mut self, slot: u32) {
        if let Some(call) = self.calls.slots[slot as usize].as_mut() {
            call.fencing = false;
        }
        self.maybe_deliver(slot);
    }
}

/// Posts waiting call Sends and local invalidations as far as the send
/// queue allows.
pub(super) fn progress<L: Piece>(c: &mut Connection<L>) {
    while let Some((_, keys)) = c.calls.invs.front() {
        let n = keys.len() as u32;
        if c.sendq.room() < n {
            break;
        }
        let (slot, keys) = c.calls.invs.pop_front().expect("front");
        let mut chain = Vec::with_capacity(keys.len());
        for (i, rkey) in keys.into_iter().enumerate() {
            let last = i as u32 + 1 == n;
            let release = if last {
                Release::Fenced { slot }
            } else {
                Release::Nothing
            };
            let wr = c.sendq.push(WrKind::LocalInv, last, release);
            chain.push(SendWr {
                wr,
                signaled: last,
                op: SendOp::LocalInv { rkey },
            });
        }
        c.work.push_back(Work::Send(chain));
    }
    while let Some(s) = c.calls.sends.front() {
        if c.sendq.room() < s.pre + 1 {
            break;
        }
        let s = c.calls.sends.pop_front().expect("front");
        for _ in 0..s.pre {
            c.sendq.push(WrKind::Driver, false, Release::Nothing);
        }
        let wr = c
            .sendq
            .push(WrKind::Send, true, Release::CallSent { slot: s.slot });
        c.work.push_back(Work::Send(vec![SendWr {
            wr,
            signaled: true,
            op: SendOp::Call {
                slot: s.slot,
                message: s.message,
                pre: s.pre,
            },
        }]));
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::{Config, Role, Work};
    use super::*;
    use crate::requester::{plan_call, Registrations, ReplyExpect, RequesterConfig};
    use nfsrdma_xdr::rpc::{AcceptStat, RpcMessage};
    use nfsrdma_xdr::rpcrdma::{ChunkLists, RdmaBody, RdmaHeader};
    use nfsrdma_xdr::{List, Xdr};

    fn one_slot() -> Connection<Bytes> {
        Connection::new(Config {
            credits: 0,
            calls: 1,
            call_reserve: 0,
            role: Role::Requester,
            ..Config::default()
        })
    }

    /// An inline RDMA_MSG carrying an accepted RPC reply (no results) to
    /// `xid`.
    pub(in crate::conn) fn null_reply(xid: u32) -> Bytes {
        let mut m = RdmaHeader {
            xid,
            vers: 1,
            credit: 1,
            body: RdmaBody::Msg(ChunkLists {
                read_list: List(vec![]),
                write_list: List(vec![]),
                reply_chunk: None,
            }),
        }
        .to_bytes()
        .to_vec();
        m.extend_from_slice(&RpcMessage::accepted(xid, AcceptStat::Success).to_bytes());
        Bytes::from(m)
    }

    #[test]
    fn a_reply_is_handed_over_before_the_send_completes_but_the_slot_waits_for_it() {
        let mut c = one_slot();
        let mut recv = None;
        while let Some(w) = c.poll_work() {
            if let Work::Recv { wr, .. } = w {
                recv = Some(wr);
            }
        }
        let slot = c.reserve_call().unwrap();
        let plan = plan_call(
            7,
            &RequesterConfig::default(),
            ReplyExpect::small(0),
            &|s: &mut dyn nfsrdma_xdr::XdrSink| s.put_raw(&[0; 40]),
        );
        let message = vec![plan.header(1, &Registrations::default())];
        c.start_call(slot, plan, message, Vec::new(), 0);
        let Some(Work::Send(chain)) = c.poll_work() else {
            panic!("the call's Send")
        };
        let send = chain[0].wr;
        // The reply comes before the Send's completion.
        c.received(recv.unwrap(), null_reply(7), None);
        assert_eq!(c.poll_event(), Some(Event::Reply { slot }));
        assert!(c.take_reply(slot).is_some());
        c.finish_call(slot);
        assert_eq!(c.reserve_call(), None, "the slot's Send is still out");
        c.completed(send);
        assert_eq!(c.reserve_call(), Some(slot));
    }
}
