//! A requester on the simulated fabric, for exercising a responder: it
//! plans its calls with [`crate::requester`], registers each call's chunks
//! as keys over a region of its own (memory windows, which the peer may
//! invalidate), checks a Send With Invalidate against the call's keys,
//! invalidates the rest locally before it delivers the reply, and can
//! misbehave on purpose (ignore its credits, post no receives, send raw
//! bytes).

use super::fabric::{Fabric, RemoteAccess, SideId, SimCompletion, SimWr, Status};
use crate::requester::RequesterConfig;
use crate::requester::{self, CallPlan, Registrations, Reply, ReplyExpect, ReplyMessage};
use bytes::Bytes;
use nfsrdma_xdr::nfs3::{Nfs3Args, Nfs3Res, NfsProc3};
use nfsrdma_xdr::rpc::{OpaqueAuth, RpcMessage};
use nfsrdma_xdr::rpcrdma::RdmaSegment;
use nfsrdma_xdr::{Payload, Xdr, XdrSink};
use std::collections::{HashMap, VecDeque};

/// How the requester behaves.
#[derive(Debug, Clone)]
pub struct RequesterOptions {
    /// Receive buffers posted, and credits asked for.
    pub receives: u32,
    /// Inline threshold, both directions.
    pub inline: u32,
    /// The responder's receive size (our send threshold).
    pub peer_inline: u32,
    /// Sends calls without waiting for credits.
    pub ignore_credits: bool,
    /// Posts receives (a requester that does not leaves the responder's
    /// replies without a place to land).
    pub post_receives: bool,
}

impl Default for RequesterOptions {
    fn default() -> Self {
        RequesterOptions {
            receives: 32,
            inline: 4096,
            peer_inline: 4096,
            ignore_credits: false,
            post_receives: true,
        }
    }
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// Its XID.
    pub xid: u32,
    /// The result, or why there is none.
    pub result: Result<Nfs3Res, String>,
    /// The fabric's step count when it was delivered.
    pub step: u64,
    /// The keys the call exposed.
    pub keys: Vec<u32>,
}

#[derive(Debug)]
struct Inflight {
    proc_: NfsProc3,
    plan: CallPlan,
    region: Option<u32>,
    all_keys: Vec<u32>,
    /// Keys still valid.
    keys: Vec<u32>,
    write_at: usize,
    reply_at: usize,
    send_done: bool,
    reply: Option<Reply>,
    invs_left: u32,
}

const TAG_SEND: u64 = 1 << 40;
const TAG_LINV: u64 = 2 << 40;
const TAG_RAW: u64 = 3 << 40;
const TAG_RECV: u64 = 4 << 40;

/// The requester endpoint.
#[derive(Debug)]
pub struct SimRequester {
    opts: RequesterOptions,
    cfg: RequesterConfig,
    side: SideId,
    next_xid: u32,
    queue: VecDeque<(u32, Nfs3Args)>,
    inflight: HashMap<u32, Inflight>,
    limit: u32,
    raw_sent: u64,
    /// Calls delivered or failed, in order.
    pub done: Vec<Outcome>,
    /// Messages received that match no call (replies to raw sends).
    pub raw: Vec<Bytes>,
    /// Why the connection broke, when it did (a failed or flushed request,
    /// or a protocol violation the requester saw).
    pub broken: Option<String>,
    /// The most calls in flight at once.
    pub peak_inflight: usize,
    /// Raw Sends that completed.
    pub raw_completed: u64,
}

impl SimRequester {
    /// A requester on side A; posts its receives at once.
    pub fn new(opts: RequesterOptions, f: &mut Fabric) -> SimRequester {
        let r = SimRequester {
            cfg: RequesterConfig {
                inline_send: opts.peer_inline.min(opts.inline),
                inline_recv: opts.inline,
            },
            side: SideId::A,
            next_xid: 0x1000,
            queue: VecDeque::new(),
            inflight: HashMap::new(),
            limit: 1,
            raw_sent: 0,
            done: Vec::new(),
            raw: Vec::new(),
            broken: None,
            peak_inflight: 0,
            raw_completed: 0,
            opts,
        };
        if r.opts.post_receives {
            for i in 0..r.opts.receives {
                f.post_recv(r.side, TAG_RECV | u64::from(i), r.opts.inline as usize);
            }
        }
        r
    }

    /// Queues a call; returns its XID.
    pub fn call(&mut self, args: Nfs3Args) -> u32 {
        self.next_xid += 1;
        let xid = self.next_xid;
        self.queue.push_back((xid, args));
        xid
    }

    /// Calls queued or in flight.
    pub fn outstanding(&self) -> usize {
        self.queue.len() + self.inflight.len()
    }

    /// Sends a message as it is.
    pub fn send_raw(&mut self, f: &mut Fabric, data: Vec<u8>) {
        self.raw_sent += 1;
        f.post_send(
            self.side,
            SimWr::Send {
                wr: TAG_RAW | self.raw_sent,
                signaled: true,
                data,
                invalidate: None,
            },
        );
    }

    /// Registers `len` bytes for the peer to read and write; returns the
    /// region, its key and its address.
    pub fn register(&mut self, f: &mut Fabric, data: &[u8]) -> (u32, u32, u64) {
        let m = f.memory(self.side);
        let r = m.register(
            data.len(),
            RemoteAccess {
                read: true,
                write: true,
            },
        );
        m.write(r, 0, data);
        (r, m.region_key(r), m.addr(r, 0))
    }

    /// Sends what the credits allow; false when nothing was sent.
    pub fn pump(&mut self, f: &mut Fabric) -> bool {
        let mut did = false;
        while self.broken.is_none()
            && (self.opts.ignore_credits || (self.inflight.len() as u32) < self.limit)
        {
            let Some((xid, args)) = self.queue.pop_front() else {
                break;
            };
            self.send(f, xid, args);
            did = true;
        }
        did
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

    fn send(&mut self, f: &mut Fabric, xid: u32, args: Nfs3Args) {
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
        let plan = requester::plan_call(xid, &self.cfg, Self::expect(&args), &encode);
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
            let mut seg = |at: usize, len: usize, access: RemoteAccess| {
                let k = m.bind(r, at, len, access);
                keys.push(k);
                RdmaSegment {
                    handle: k,
                    length: len as u32,
                    offset: m.addr(r, at),
                }
            };
            if plan.read.is_some() {
                let s = seg(
                    0,
                    read_len,
                    RemoteAccess {
                        read: true,
                        write: false,
                    },
                );
                regs.read.push(s);
            }
            let w = RemoteAccess {
                read: false,
                write: true,
            };
            if plan.write_chunk.is_some() {
                regs.write.push(seg(write_at, write_len, w));
            }
            if plan.reply_chunk.is_some() {
                regs.reply.push(seg(reply_at, reply_len, w));
            }
            if let Some((_, data)) = &plan.read {
                m.write(r, 0, &data.to_contiguous());
            }
            r
        });
        let mut msg = plan.header(self.opts.receives, &regs).to_vec();
        for p in &plan.inline {
            msg.extend_from_slice(p);
        }
        f.post_send(
            self.side,
            SimWr::Send {
                wr: TAG_SEND | u64::from(xid),
                signaled: true,
                data: msg,
                invalidate: None,
            },
        );
        self.inflight.insert(
            xid,
            Inflight {
                proc_,
                plan,
                region,
                all_keys: keys.clone(),
                keys,
                write_at,
                reply_at,
                send_done: false,
                reply: None,
                invs_left: 0,
            },
        );
        self.peak_inflight = self.peak_inflight.max(self.inflight.len());
    }

    /// Handles the next completion of our side; false when there was none.
    pub fn complete_one(&mut self, f: &mut Fabric) -> bool {
        let Some(c) = f.poll(self.side) else {
            return false;
        };
        self.completion(f, c);
        true
    }

    fn break_off(&mut self, f: &mut Fabric, why: String) {
        if self.broken.is_none() {
            self.broken = Some(why.clone());
        }
        f.disconnect();
        let step = f.steps();
        let mut lost: Vec<(u32, Inflight)> = self.inflight.drain().collect();
        lost.sort_by_key(|(x, _)| *x);
        for (xid, inf) in lost {
            if let Some(r) = inf.region {
                f.memory(self.side).deregister(r);
            }
            self.done.push(Outcome {
                xid,
                result: Err(format!("connection lost: {why}")),
                step,
                keys: inf.all_keys,
            });
        }
    }

    fn completion(&mut self, f: &mut Fabric, c: SimCompletion) {
        match c.status {
            Status::Ok => {}
            Status::Flushed => return self.break_off(f, "flushed".into()),
            Status::Failed(why) => return self.break_off(f, why.into()),
        }
        if c.recv {
            f.post_recv(self.side, c.wr, self.opts.inline as usize);
            return self.on_reply(f, Bytes::from(c.data), c.invalidated);
        }
        let xid = (c.wr & 0xffff_ffff) as u32;
        match c.wr & !0xff_ffff_ffff {
            TAG_SEND => {
                if let Some(inf) = self.inflight.get_mut(&xid) {
                    inf.send_done = true;
                }
                self.try_deliver(f, xid);
            }
            TAG_LINV => {
                if let Some(inf) = self.inflight.get_mut(&xid) {
                    inf.invs_left -= 1;
                }
                self.try_deliver(f, xid);
            }
            TAG_RAW => self.raw_completed += 1,
            _ => {}
        }
    }

    fn on_reply(&mut self, f: &mut Fabric, msg: Bytes, invalidated: Option<u32>) {
        let xid = requester::reply_xid(&msg);
        let Some(inf) = xid.and_then(|x| self.inflight.get_mut(&x)) else {
            if let Some(k) = invalidated {
                return self.break_off(f, format!("Send With Invalidate of {k:#x} for no call"));
            }
            self.raw.push(msg);
            return;
        };
        let xid = xid.expect("found");
        if let Some(k) = invalidated {
            match inf.keys.iter().position(|x| *x == k) {
                Some(p) => {
                    inf.keys.swap_remove(p);
                }
                None => {
                    return self.break_off(
                        f,
                        format!("Send With Invalidate of {k:#x}, not one of the call's keys"),
                    )
                }
            }
        }
        let reply = match requester::parse_reply(msg, &inf.plan) {
            Ok(r) => r,
            Err(e) => return self.break_off(f, format!("bad reply header: {e}")),
        };
        let granted = match &reply {
            Reply::Message { credits, .. } | Reply::Error { credits, .. } => *credits,
        };
        self.limit = granted.clamp(1, self.opts.receives);
        inf.reply = Some(reply);
        for k in std::mem::take(&mut inf.keys) {
            inf.invs_left += 1;
            f.post_send(
                self.side,
                SimWr::LocalInv {
                    wr: TAG_LINV | u64::from(xid),
                    signaled: true,
                    rkey: k,
                },
            );
        }
        self.try_deliver(f, xid);
    }

    fn try_deliver(&mut self, f: &mut Fabric, xid: u32) {
        let ready = self
            .inflight
            .get(&xid)
            .is_some_and(|i| i.send_done && i.invs_left == 0 && i.reply.is_some());
        if !ready {
            return;
        }
        let inf = self.inflight.remove(&xid).expect("checked");
        let read = |at: usize, n: u32| -> Bytes {
            inf.region
                .and_then(|r| f.memory_ref(self.side).read(r, at, n as usize))
                .map(Bytes::from)
                .unwrap_or_default()
        };
        let result = match inf.reply.expect("checked") {
            Reply::Message {
                message, written, ..
            } => {
                let m = match message {
                    ReplyMessage::Inline(b) => b,
                    ReplyMessage::InReplyChunk(n) => read(inf.reply_at, n),
                };
                let ddp = written
                    .filter(|n| *n > 0)
                    .map(|n| Payload::from(read(inf.write_at, n)));
                let mut d = requester::reply_decoder(m, ddp);
                RpcMessage::decode(&mut d)
                    .map_err(|e| e.to_string())
                    .and_then(|_| Nfs3Res::decode(inf.proc_, &mut d).map_err(|e| e.to_string()))
            }
            Reply::Error { error, .. } => Err(format!("RDMA_ERROR {error:?}")),
        };
        if let Some(r) = inf.region {
            f.memory(self.side).deregister(r);
        }
        self.done.push(Outcome {
            xid,
            result,
            step: f.steps(),
            keys: inf.all_keys,
        });
    }
}
