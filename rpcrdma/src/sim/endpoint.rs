//! An endpoint on the simulated fabric: a [`Connection`] driven the way
//! the verbs drivers drive it, answering calls with an [`App`] and sending
//! calls of its own.
//!
//! Answering: landing memory is one local region per Read chunk; reply
//! data is written from the reply's own bytes, and a reply through the
//! Reply chunk counts as copied for the call, holding its chunk slot (as
//! the server's encoded replies are).
//!
//! Calling: each call's chunks get a region of their own, exposed by one
//! key per chunk that the peer may invalidate (memory windows); the keys
//! are the call's fence list.

use super::app::App;
use super::fabric::{Fabric, RemoteAccess, SideId, SimCompletion, SimWr, Status};
use super::requester::Outcome;
use crate::conn::{CallId, Config, ConnError, Connection, Event, SendOp, Work, WrId};
use crate::requester::{self, Registrations, Reply, ReplyExpect, ReplyMessage, RequesterConfig};
use crate::responder::{self, ReplyShape};
use bytes::Bytes;
use nfsrdma_xdr::nfs3::{Nfs3Args, Nfs3Res, NfsProc3};
use nfsrdma_xdr::rpc::{AcceptStat, OpaqueAuth, RpcMessage};
use nfsrdma_xdr::rpcrdma::RdmaSegment;
use nfsrdma_xdr::{Payload, Xdr, XdrSink};
use std::collections::{HashMap, VecDeque};

/// The memory of one of our calls in flight.
#[derive(Debug)]
struct CallMem {
    xid: u32,
    proc_: NfsProc3,
    region: Option<u32>,
    keys: Vec<u32>,
    write_at: usize,
    reply_at: usize,
}

/// An endpoint.
#[derive(Debug)]
pub struct SimEndpoint<A> {
    /// The connection core.
    pub conn: Connection<Bytes>,
    /// The service.
    pub app: A,
    side: SideId,
    /// Per call: the landing region of each Read chunk.
    landing: HashMap<CallId, Vec<u32>>,
    /// Why the connection ended, once it did.
    pub closed: Option<ConnError>,
    /// The most bytes the connection held at any time
    /// ([`crate::conn::Footprint::bytes`]).
    pub peak_bytes: u64,
    /// The most receive buffers held at once.
    pub peak_held: u32,
    /// Calls of ours waiting for a slot.
    queue: VecDeque<(u32, Nfs3Args)>,
    /// Per slot: our call's memory.
    mem: HashMap<u32, CallMem>,
    next_xid: u32,
    /// Our calls, delivered or failed, in order.
    pub done: Vec<Outcome>,
    /// The most of our calls in flight at once.
    pub peak_calls: u32,
}

impl<A: App> SimEndpoint<A> {
    /// An endpoint on `side` with `cfg`.
    pub fn new(side: SideId, cfg: Config, app: A) -> SimEndpoint<A> {
        SimEndpoint {
            conn: Connection::new(cfg),
            app,
            side,
            landing: HashMap::new(),
            closed: None,
            peak_bytes: 0,
            peak_held: 0,
            queue: VecDeque::new(),
            mem: HashMap::new(),
            next_xid: if side == SideId::A {
                0x1000
            } else {
                0x9000_0000
            },
            done: Vec::new(),
            peak_calls: 0,
        }
    }

    /// Queues a call of ours; returns its XID.
    pub fn call(&mut self, args: Nfs3Args) -> u32 {
        self.next_xid += 1;
        self.queue.push_back((self.next_xid, args));
        self.next_xid
    }

    /// Calls of ours queued or in flight.
    pub fn outstanding(&self) -> usize {
        self.queue.len() + self.mem.len()
    }

    /// Hands the next completion of our side to the core; false when
    /// there was none.
    pub fn complete_one(&mut self, f: &mut Fabric) -> bool {
        let Some(c) = f.poll(self.side) else {
            return false;
        };
        self.completion(c);
        true
    }

    fn completion(&mut self, c: SimCompletion) {
        let wr = WrId(c.wr);
        match c.status {
            Status::Ok if c.recv => self.conn.received(wr, Bytes::from(c.data), c.invalidated),
            Status::Ok => self.conn.completed(wr),
            Status::Flushed => self.conn.failed(wr, true, "flushed"),
            Status::Failed(why) => self.conn.failed(wr, false, why),
        }
    }

    /// Carries out the core's work and runs what it asks for; false when
    /// there was nothing to do.
    pub fn drive(&mut self, f: &mut Fabric) -> bool {
        let mut did = false;
        loop {
            let mut moved = false;
            while let Some(w) = self.conn.poll_work() {
                moved = true;
                self.post(f, w);
            }
            while self.conn.poll_released().is_some() {}
            while !self.queue.is_empty() && self.closed.is_none() {
                let Some(slot) = self.conn.reserve_call() else {
                    break;
                };
                let (xid, args) = self.queue.pop_front().expect("checked");
                moved = true;
                self.start(f, slot, xid, args);
            }
            self.peak_calls = self.peak_calls.max(self.mem.len() as u32);
            if let Some(e) = self.conn.poll_event() {
                moved = true;
                self.event(f, e);
            }
            self.note_footprint();
            if !moved {
                return did;
            }
            did = true;
        }
    }

    fn note_footprint(&mut self) {
        let fp = self.conn.footprint();
        self.peak_bytes = self.peak_bytes.max(fp.bytes(self.conn.config()));
        self.peak_held = self.peak_held.max(fp.held_receives);
    }

    fn post(&mut self, f: &mut Fabric, w: Work<Bytes>) {
        match w {
            Work::Recv { wr, .. } => {
                f.post_recv(self.side, wr.0, self.conn.config().inline_recv as usize);
            }
            Work::Reads {
                call,
                reads,
                wr,
                quiet,
            } => {
                let regions = self.landing.get(&call).cloned().unwrap_or_default();
                let n = reads.len();
                for (i, r) in reads.into_iter().enumerate() {
                    let last = i + 1 == n;
                    f.post_send(
                        self.side,
                        SimWr::Read {
                            wr: if last { wr.0 } else { quiet.0 },
                            signaled: last,
                            remote: r.remote,
                            region: regions.get(r.block as usize).copied().unwrap_or(0),
                            offset: r.offset as usize,
                        },
                    );
                }
            }
            Work::Send(chain) => {
                for s in chain {
                    let wr = match s.op {
                        SendOp::Send {
                            message,
                            invalidate,
                            ..
                        } => SimWr::Send {
                            wr: s.wr.0,
                            signaled: s.signaled,
                            data: message.concat(),
                            invalidate,
                        },
                        SendOp::Write { local, remote, .. } => SimWr::Write {
                            wr: s.wr.0,
                            signaled: s.signaled,
                            data: local.concat(),
                            remote,
                        },
                        SendOp::Call { message, .. } => SimWr::Send {
                            wr: s.wr.0,
                            signaled: s.signaled,
                            data: message.concat(),
                            invalidate: None,
                        },
                        SendOp::LocalInv { rkey } => SimWr::LocalInv {
                            wr: s.wr.0,
                            signaled: s.signaled,
                            rkey,
                        },
                    };
                    f.post_send(self.side, wr);
                }
            }
        }
    }

    fn event(&mut self, f: &mut Fabric, e: Event) {
        match e {
            Event::NeedsReads(id) => {
                let Some(call) = self.conn.call(id).cloned() else {
                    return;
                };
                let mut regions = Vec::new();
                let mut reads = Vec::new();
                let mut bytes = 0u64;
                for (block, chunk) in call.read_chunks.iter().enumerate() {
                    let len = chunk.total_len() as usize;
                    bytes += len as u64;
                    regions.push(f.memory(self.side).register(len, RemoteAccess::default()));
                    let mut at = 0u32;
                    for s in &chunk.segments {
                        reads.push(crate::conn::ReadOp {
                            block: block as u32,
                            offset: at,
                            remote: crate::conn::RemoteSeg {
                                rkey: s.handle,
                                addr: s.offset,
                                len: s.length,
                            },
                        });
                        at += s.length;
                    }
                }
                self.landing.insert(id, regions);
                self.conn.land(id, reads, bytes);
            }
            Event::Call(id) => self.run(f, id),
            Event::Reply { slot } => self.deliver(f, slot),
            Event::CallFailed { slot, error } => {
                if let Some(m) = self.mem.remove(&slot) {
                    self.release(f, &m);
                    self.done.push(Outcome {
                        xid: m.xid,
                        result: Err(error),
                        step: f.steps(),
                        keys: m.keys,
                    });
                }
                self.conn.finish_call(slot);
            }
            Event::Closed(e) => {
                self.closed.get_or_insert(e.clone());
                let step = f.steps();
                let mut lost: Vec<(u32, CallMem)> = self.mem.drain().collect();
                lost.sort_by_key(|(_, m)| m.xid);
                for (_, m) in lost {
                    if let Some(r) = m.region {
                        f.memory(self.side).deregister(r);
                    }
                    self.done.push(Outcome {
                        xid: m.xid,
                        result: Err(format!("connection lost: {e}")),
                        step,
                        keys: m.keys,
                    });
                }
                for (_, regions) in self.landing.drain() {
                    for r in regions {
                        f.memory(self.side).deregister(r);
                    }
                }
                f.disconnect();
            }
        }
    }

    fn run(&mut self, f: &mut Fabric, id: CallId) {
        let Some(call) = self.conn.call(id).cloned() else {
            return;
        };
        let regions = self.landing.remove(&id).unwrap_or_default();
        let data: Vec<Payload> = call
            .read_chunks
            .iter()
            .zip(&regions)
            .map(|(c, r)| {
                Payload::from(
                    f.memory_ref(self.side)
                        .read(*r, 0, c.total_len() as usize)
                        .unwrap_or_default(),
                )
            })
            .collect();
        for r in regions {
            f.memory(self.side).deregister(r);
        }
        let Ok(mut d) = call.assemble(data) else {
            return self.conn.reject(id);
        };
        let Ok(body) = responder::call_header(&mut d, call.xid) else {
            return self.conn.reject(id);
        };
        let Some(res) = self.app.call(call.xid, &body, d) else {
            return self.conn.no_reply(id);
        };
        let xid = call.xid;
        let plan = self.conn.plan_reply(id, |s| {
            RpcMessage::accepted(xid, AcceptStat::Success).encode(s);
            res.encode(s);
        });
        let Some(Ok(plan)) = plan else {
            return self.conn.reject(id);
        };
        let local = plan
            .writes
            .iter()
            .map(|w| w.data.parts().to_vec())
            .collect();
        let staged = plan.shape == ReplyShape::ReplyChunk && self.conn.holds_chunk_slot(id);
        self.conn.send_reply(id, plan, local, staged);
    }

    fn expect(args: &Nfs3Args) -> ReplyExpect {
        match args {
            Nfs3Args::Read(r) => ReplyExpect {
                max_len: 512 + r.count,
                ddp_max: Some(r.count),
            },
            Nfs3Args::Readdir(r) => ReplyExpect {
                max_len: 512 + r.count,
                ddp_max: None,
            },
            _ => ReplyExpect {
                max_len: 512,
                ddp_max: None,
            },
        }
    }

    /// Registers one of our calls' chunks and starts it in `slot`.
    fn start(&mut self, f: &mut Fabric, slot: u32, xid: u32, args: Nfs3Args) {
        let proc_ = args.proc_();
        let encode = |s: &mut dyn XdrSink| {
            RpcMessage::call(
                xid,
                nfsrdma_xdr::nfs3::PROGRAM,
                3,
                proc_ as u32,
                OpaqueAuth::none(),
            )
            .encode(s);
            args.encode(s);
        };
        let cfg = RequesterConfig {
            inline_send: self.conn.config().inline_send,
            inline_recv: self.conn.config().inline_recv,
        };
        let plan = requester::plan_call(xid, &cfg, Self::expect(&args), &encode);
        let align = |n: usize| n.div_ceil(64) * 64;
        let read_len = plan.read.as_ref().map_or(0, |(_, p)| p.len());
        let write_len = plan.write_chunk.unwrap_or(0) as usize;
        let reply_len = plan.reply_chunk.unwrap_or(0) as usize;
        let write_at = align(read_len);
        let reply_at = align(write_at + write_len);
        let total = reply_at + reply_len;
        let mut regs = Registrations::default();
        let mut keys = Vec::new();
        let region = (total > 0).then(|| {
            let m = f.memory(self.side);
            let r = m.register(total, RemoteAccess::default());
            if let Some((_, data)) = &plan.read {
                m.write(r, 0, &data.to_contiguous());
            }
            let mut seg = |at: usize, len: usize, access: RemoteAccess| {
                let k = m.bind(r, at, len, access);
                keys.push(k);
                RdmaSegment {
                    handle: k,
                    length: len as u32,
                    offset: m.addr(r, at),
                }
            };
            let read = RemoteAccess {
                read: true,
                write: false,
            };
            let write = RemoteAccess {
                read: false,
                write: true,
            };
            if plan.read.is_some() {
                regs.read.push(seg(0, read_len, read));
            }
            if plan.write_chunk.is_some() {
                regs.write.push(seg(write_at, write_len, write));
            }
            if plan.reply_chunk.is_some() {
                regs.reply.push(seg(reply_at, reply_len, write));
            }
            r
        });
        let mut message = vec![plan.header(self.conn.credits_to_ask(), &regs)];
        message.extend(plan.inline.iter().cloned());
        self.mem.insert(
            slot,
            CallMem {
                xid,
                proc_,
                region,
                keys: keys.clone(),
                write_at,
                reply_at,
            },
        );
        self.conn.start_call(slot, plan, message, keys, 0);
    }

    fn release(&self, f: &mut Fabric, m: &CallMem) {
        if let Some(r) = m.region {
            f.memory(self.side).deregister(r);
        }
    }

    /// Hands over the reply of our call in `slot`.
    fn deliver(&mut self, f: &mut Fabric, slot: u32) {
        let Some(reply) = self.conn.take_reply(slot) else {
            return;
        };
        let Some(m) = self.mem.remove(&slot) else {
            return;
        };
        // Every key of the call is invalid by now: the core handed the
        // reply over only once they were.
        for k in &m.keys {
            assert!(
                !f.memory_ref(self.side).is_valid(*k),
                "key {k:#x} of call {:#x} still valid at delivery",
                m.xid
            );
        }
        let read = |at: usize, n: u32| -> Bytes {
            m.region
                .and_then(|r| f.memory_ref(self.side).read(r, at, n as usize))
                .map(Bytes::from)
                .unwrap_or_default()
        };
        let result = match reply {
            Reply::Message {
                message, written, ..
            } => {
                let msg = match message {
                    ReplyMessage::Inline(b) => b,
                    ReplyMessage::InReplyChunk(n) => read(m.reply_at, n),
                };
                let ddp = written
                    .filter(|n| *n > 0)
                    .map(|n| Payload::from(read(m.write_at, n)));
                let mut d = requester::reply_decoder(msg, ddp);
                RpcMessage::decode(&mut d)
                    .map_err(|e| e.to_string())
                    .and_then(|_| Nfs3Res::decode(m.proc_, &mut d).map_err(|e| e.to_string()))
            }
            Reply::Error { error, .. } => Err(format!("RDMA_ERROR {error:?}")),
        };
        self.release(f, &m);
        self.done.push(Outcome {
            xid: m.xid,
            result,
            step: f.steps(),
            keys: m.keys,
        });
        self.conn.finish_call(slot);
    }
}
