//! A responder on the simulated fabric: a [`Connection`] driven the way the
//! verbs driver drives it, with an [`App`] to run the calls.
//!
//! Landing memory is one local region per Read chunk; reply data is
//! written from the reply's own bytes, and a reply through the Reply
//! chunk counts as copied into the call's chunk buffer (as the server's
//! encoded replies are).

use super::app::App;
use super::fabric::{Fabric, RemoteAccess, SideId, SimCompletion, SimWr, Status};
use crate::conn::{CallId, Config, ConnError, Connection, Event, SendOp, Work, WrId};
use crate::responder::{self, ReplyShape};
use bytes::Bytes;
use nfsrdma_xdr::rpc::{AcceptStat, RpcMessage};
use nfsrdma_xdr::{Payload, Xdr};
use std::collections::HashMap;

/// The responder endpoint.
#[derive(Debug)]
pub struct SimResponder<A> {
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
}

impl<A: App> SimResponder<A> {
    /// A responder on side B with `cfg`.
    pub fn new(cfg: Config, app: A) -> SimResponder<A> {
        SimResponder {
            conn: Connection::new(cfg),
            app,
            side: SideId::B,
            landing: HashMap::new(),
            closed: None,
            peak_bytes: 0,
            peak_held: 0,
        }
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
            Event::Closed(e) => {
                self.closed.get_or_insert(e);
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
        let staged = plan.shape == ReplyShape::ReplyChunk && self.conn.chunk_buffer(id).is_some();
        self.conn.send_reply(id, plan, local, staged);
    }
}
