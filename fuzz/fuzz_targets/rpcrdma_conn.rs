//! The connection core under any sequence of events a peer and a driver
//! can produce: messages of any bytes into posted receive buffers,
//! completions and failures of outstanding work in any order, the
//! application's answers (landing, reply, RDMA_ERROR, no reply), and calls
//! of its own (backward calls, RFC 8167). It must never panic, never hold
//! more receive buffers than it has, and never hold more than its stated
//! memory bound.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use nfsrdma_rpcrdma::conn::{Config, Connection, Event, ReadOp, RemoteSeg, SendOp, Work, WrId};
use nfsrdma_rpcrdma::requester::{self, ReplyExpect, RequesterConfig};
use nfsrdma_xdr::{Payload, XdrSink};

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*b)
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, rest) = self.0.split_at(n);
        self.0 = rest;
        a
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let (Some(a), Some(b), Some(c)) = (inp.byte(), inp.byte(), inp.byte()) else {
        return;
    };
    let cfg = Config {
        credits: u32::from(a % 8) + 1,
        send_slots: u32::from(a % 8) + 1,
        sq_depth: u32::from(b % 32) + 4,
        read_depth: u32::from(b >> 5) + 1,
        chunk_slots: u32::from(c % 3) + 1,
        chunk_size: 64 * 1024,
        max_sge: u32::from(c >> 4 & 3) + 1,
        signal_every: u32::from(c >> 6) + 1,
        inline_send: 1024,
        inline_recv: 1024,
        remote_invalidation: c & 8 != 0,
        calls: u32::from(a >> 6),
        call_reserve: 0,
        accept_remote_invalidation: a & 0x20 != 0,
        ..Config::default()
    };
    let bound = cfg.memory_bound();
    let credits = cfg.credits;
    let mut conn: Connection<Bytes> = Connection::new(cfg.clone());
    let mut posted: Vec<WrId> = Vec::new();
    let mut outstanding: Vec<WrId> = Vec::new();
    let mut events = Vec::new();
    while let Some(op) = inp.byte() {
        while let Some(w) = conn.poll_work() {
            match w {
                Work::Recv { wr, .. } => posted.push(wr),
                Work::Reads { wr, .. } => outstanding.push(wr),
                Work::Send(chain) => {
                    for s in chain {
                        if let SendOp::Write { local, .. } = &s.op {
                            assert!(local.len() <= cfg.max_sge as usize);
                        }
                        if s.signaled {
                            outstanding.push(s.wr);
                        }
                    }
                }
            }
        }
        while conn.poll_released().is_some() {}
        while let Some(e) = conn.poll_event() {
            events.push(e);
        }
        let f = conn.footprint();
        assert!(f.held_receives <= credits + cfg.calls, "{f:?}");
        assert!(f.bytes(&cfg) <= bound, "{f:?}");
        match op % 8 {
            // A message into a posted buffer.
            0 | 1 if !posted.is_empty() => {
                let wr = posted.remove(usize::from(op >> 3) % posted.len());
                let n = usize::from(inp.byte().unwrap_or(0)) * 4;
                let msg = Bytes::copy_from_slice(inp.bytes(n));
                let inv = (op & 0x80 != 0).then_some(0x1234);
                conn.received(wr, msg, inv);
            }
            // A signaled request completes (oldest first, as a queue pair
            // completes them; sometimes out of order, which the core must
            // refuse without panicking).
            2 | 3 if !outstanding.is_empty() => {
                let at = if op & 0x80 != 0 {
                    usize::from(op >> 3) % outstanding.len()
                } else {
                    0
                };
                let wr = outstanding.remove(at);
                conn.completed(wr);
            }
            4 if !outstanding.is_empty() => {
                let wr = outstanding.remove(0);
                conn.failed(wr, op & 0x80 != 0, "fuzzed failure");
            }
            // The application answers the oldest event.
            5 | 6 if !events.is_empty() => match events.remove(0) {
                Event::NeedsReads(id) => {
                    let Some(call) = conn.call(id) else { continue };
                    if op & 0x80 != 0 {
                        conn.reject(id);
                        continue;
                    }
                    let mut reads = Vec::new();
                    let mut bytes = 0u64;
                    for (bi, ch) in call.read_chunks.iter().enumerate() {
                        let mut at = 0u32;
                        for s in &ch.segments {
                            reads.push(ReadOp {
                                block: bi as u32,
                                offset: at,
                                remote: RemoteSeg {
                                    rkey: s.handle,
                                    addr: s.offset,
                                    len: s.length,
                                },
                            });
                            at = at.wrapping_add(s.length);
                        }
                        bytes += ch.total_len();
                    }
                    conn.land(id, reads, bytes);
                }
                Event::Call(id) => match op >> 6 {
                    0 => conn.reject(id),
                    1 => conn.no_reply(id),
                    _ => {
                        let n = usize::from(inp.byte().unwrap_or(0)) * 64;
                        let body = Bytes::copy_from_slice(inp.bytes(n));
                        let plan = conn.plan_reply(id, |s: &mut dyn XdrSink| {
                            s.put_raw(&[0u8; 24]);
                            nfsrdma_xdr::encode_payload(s, &Payload::from(body.clone()));
                        });
                        match plan {
                            Some(Ok(plan)) => {
                                let local = plan
                                    .writes
                                    .iter()
                                    .map(|w| w.data.parts().to_vec())
                                    .collect();
                                let staged = op & 0x20 != 0 && conn.holds_chunk_slot(id);
                                conn.send_reply(id, plan, local, staged);
                            }
                            Some(Err(_)) => conn.reject(id),
                            None => {}
                        }
                    }
                },
                Event::Reply { slot } => {
                    let _ = conn.take_reply(slot);
                    conn.finish_call(slot);
                }
                Event::CallFailed { slot, .. } => conn.finish_call(slot),
                Event::Closed(_) => {}
            },
            // A backward call of ours (a NULL).
            7 if op & 0x80 != 0 => {
                if let Some(slot) = conn.reserve_call() {
                    let xid = u32::from(op) << 8 | u32::from(inp.byte().unwrap_or(0));
                    let plan = requester::plan_call(
                        xid,
                        &RequesterConfig {
                            inline_send: 1024,
                            inline_recv: 1024,
                        },
                        ReplyExpect {
                            max_len: 200,
                            ddp_max: None,
                        },
                        &|s: &mut dyn XdrSink| s.put_raw(&xid.to_be_bytes()),
                    );
                    let mut message = vec![plan.header(1, &Default::default())];
                    message.extend(plan.inline.iter().cloned());
                    conn.start_call(slot, plan, message, Vec::new(), 0);
                }
            }
            7 => conn.close_now(),
            _ => {}
        }
    }
});
