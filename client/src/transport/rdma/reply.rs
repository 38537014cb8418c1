//! Completions to the connection core, the core's work to the queue pair,
//! and replies to their callers: the reply's chunk data taken from the
//! call's memory by its registration strategy (lent without a copy where
//! the strategy can), its counters and step times.

use super::conn::{Conn, State};
use super::Outcome;
use crate::error::ClientError;
use bytes::Bytes;
use nfsrdma_rpcrdma::conn::{Event, SendOp, Work, WrId};
use nfsrdma_rpcrdma::requester::{self, Reply, ReplyMessage};
use nfsrdma_transport::rdma::verbs::{
    CompletionError, SendFlags, SendOp as VerbsOp, SendWr, WorkCompletion,
};
use nfsrdma_xdr::Payload;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Conn {
    /// Hands one completion to the core.
    pub(super) fn completion(&self, st: &mut State, wc: &WorkCompletion) {
        let wr = WrId(wc.wr_id);
        match wc.status {
            Ok(()) => match wr.recv_buffer() {
                Some(b) => {
                    // Lent in place where a spare buffer can be posted
                    // instead (see `recv`).
                    let (msg, lent) = match st.recv.take(b, wc.byte_len as usize, &self.counters) {
                        Ok(m) => m,
                        Err(e) => return self.kill_locked(st, &e),
                    };
                    if let Some(slot) = requester::reply_xid(&msg).and_then(|x| st.xids.get(&x)) {
                        if let Some(c) = st.calls[*slot].as_mut() {
                            c.replied = Some(Instant::now());
                            c.lent = lent;
                        }
                    }
                    st.core.received(wr, msg, wc.invalidated_rkey);
                }
                None => st.core.completed(wr),
            },
            Err(e) => {
                if let Some(b) = wr.recv_buffer() {
                    st.recv.cancel(b);
                }
                st.core
                    .failed(wr, matches!(e, CompletionError::Flushed), &e.to_string())
            }
        }
    }

    /// Carries out the core's work and hands over what it yields, until
    /// nothing is left.
    pub(super) fn drive(&self, st: &mut State) {
        loop {
            let mut moved = false;
            while let Some(w) = st.core.poll_work() {
                moved = true;
                if let Err(e) = self.post(st, w) {
                    return self.kill_locked(st, &e);
                }
            }
            while st.core.poll_released().is_some() {}
            if let Some(e) = st.core.poll_event() {
                moved = true;
                self.event(st, e);
            }
            if !moved {
                break;
            }
        }
        self.sync_counters(st);
    }

    /// Adds what the core counted since the last time to the transport's
    /// counters (before a caller is woken, so that it sees them).
    fn sync_counters(&self, st: &mut State) {
        let now = st.core.stats();
        let c = &self.counters;
        let add = |a: &std::sync::atomic::AtomicU64, was: u64, is: u64| {
            if is != was {
                a.fetch_add(is - was, Ordering::Relaxed);
            }
        };
        add(
            &c.unmatched,
            st.seen.unmatched_replies,
            now.unmatched_replies,
        );
        add(
            &c.send_with_inv,
            st.seen.remote_invalidations,
            now.remote_invalidations,
        );
        add(
            &c.local_invs,
            st.seen.local_invalidations,
            now.local_invalidations,
        );
        st.seen = now;
    }

    fn post(&self, st: &mut State, w: Work<Bytes>) -> Result<(), String> {
        match w {
            Work::Recv { buffer, wr } => st.recv.post(&self.qp, buffer, wr.0),
            Work::Reads { .. } => Err("RDMA Reads asked of a client".into()),
            Work::Send(chain) => {
                let mut invs = Vec::new();
                for s in chain {
                    let flags = if s.signaled {
                        SendFlags::SIGNALED
                    } else {
                        SendFlags::UNSIGNALED
                    };
                    match s.op {
                        SendOp::Call { slot, message, .. } => {
                            let base = slot as usize * self.send_size;
                            let mut len = 0;
                            for part in &message {
                                self.send_mr
                                    .write_at(base + len, part)
                                    .map_err(|e| format!("send buffer: {e}"))?;
                                len += part.len();
                            }
                            let sge = self
                                .send_mr
                                .sge(base, len)
                                .map_err(|e| format!("send buffer: {e}"))?;
                            let sges = [sge];
                            let send = SendWr {
                                wr_id: s.wr.0,
                                op: VerbsOp::Send { sges: &sges },
                                flags,
                            };
                            let call = st.calls[slot as usize]
                                .as_mut()
                                .ok_or("a Send for a slot without a call")?;
                            call.posted = Instant::now();
                            let reg = call.reg.as_ref().ok_or("a call without its registration")?;
                            self.reg
                                .post(&self.qp, slot as usize, reg, send)
                                .map_err(|e| format!("posting the call: {e}"))?;
                        }
                        SendOp::LocalInv { rkey } => invs.push(SendWr {
                            wr_id: s.wr.0,
                            op: VerbsOp::LocalInv { rkey },
                            flags,
                        }),
                        SendOp::Send { .. } | SendOp::Write { .. } => {
                            return Err("a reply asked of a client".into())
                        }
                    }
                }
                if !invs.is_empty() {
                    self.qp
                        .post_send(&invs)
                        .map_err(|e| format!("posting local invalidation: {e}"))?;
                }
                Ok(())
            }
        }
    }

    fn event(&self, st: &mut State, e: Event) {
        match e {
            Event::Reply { slot } => {
                if let Err(e) = self.deliver(st, slot as usize) {
                    self.kill_locked(st, &e);
                }
            }
            Event::CallFailed { slot, error } => {
                // Its memory is fenced when the connection, closing next,
                // is torn down.
                if let Some(w) = st.calls[slot as usize]
                    .as_mut()
                    .and_then(|c| c.waiter.take())
                {
                    let _ = w.send(Outcome::Fatal(ClientError::Rdma(error)));
                }
            }
            Event::Closed(e) => self.kill_locked(st, &e.to_string()),
            Event::NeedsReads(_) | Event::Call(_) => self.kill_locked(
                st,
                "a call from the server, which this client does not serve",
            ),
        }
    }

    /// Every registration of the slot's call is fenced and its Send has
    /// completed: hands the reply over and frees the slot.
    fn deliver(&self, st: &mut State, slot: usize) -> Result<(), String> {
        let Some(reply) = st.core.take_reply(slot as u32) else {
            return Ok(());
        };
        let fenced = Instant::now();
        let mut call = st.calls[slot]
            .take()
            .ok_or("a reply for a slot without a call")?;
        st.xids.remove(&call.xid);
        let reg = call.reg.take().ok_or("a call without its registration")?;
        let layout = reg.layout;
        let outcome = match reply {
            Reply::Message {
                message, written, ..
            } => {
                let mut ranges = Vec::with_capacity(2);
                if let ReplyMessage::InReplyChunk(n) = message {
                    ranges.push((layout.reply_at, n as usize));
                }
                let ddp = written.filter(|n| *n > 0);
                if let Some(n) = ddp {
                    ranges.push((layout.write_at, n as usize));
                }
                let mut data = self.reg.finish(slot, reg, &ranges)?.into_iter();
                let (msg, lent) = match message {
                    ReplyMessage::Inline(b) => (b, call.lent),
                    ReplyMessage::InReplyChunk(_) => (data.next().unwrap_or_default(), false),
                };
                let ddp = ddp.map(|_| Payload::from(data.next().unwrap_or_default()));
                Outcome::Reply {
                    message: msg,
                    ddp,
                    lent,
                }
            }
            Reply::Error { error, .. } => {
                self.reg.finish(slot, reg, &[])?;
                Outcome::Fatal(ClientError::Rdma(format!(
                    "the server answered RDMA_ERROR: {error:?}"
                )))
            }
        };
        if let Some(replied) = call.replied {
            let ns = |a: Instant, b: Instant| b.saturating_duration_since(a).as_nanos() as u64;
            let c = &self.counters;
            c.register_ns
                .fetch_add(ns(call.started, call.posted), Ordering::Relaxed);
            c.wire_ns
                .fetch_add(ns(call.posted, replied), Ordering::Relaxed);
            c.invalidate_ns
                .fetch_add(ns(replied, fenced), Ordering::Relaxed);
            c.copy_out_ns
                .fetch_add(ns(fenced, Instant::now()), Ordering::Relaxed);
            c.timed_calls.fetch_add(1, Ordering::Relaxed);
        }
        self.sync_counters(st);
        if let Some(w) = call.waiter.take() {
            let _ = w.send(outcome);
        }
        st.core.finish_call(slot as u32);
        self.notify.notify_one();
        Ok(())
    }
}
