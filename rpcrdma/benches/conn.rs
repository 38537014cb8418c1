//! The connection core's own cost per call, with no device: one 4 KiB
//! READ's life on the requester side (a slot, the plan, the Send, the
//! reply with Send With Invalidate, the reply handed over, the Send's
//! completion), and one NULL call's on the responder side (the receive,
//! the reply's Send, its completion).
//!
//! `cargo bench -p nfsrdma-rpcrdma --bench conn`

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use nfsrdma_rpcrdma::conn::{Config, Connection, Event, Role, Work, WrId};
use nfsrdma_rpcrdma::requester::{plan_call, Registrations, ReplyExpect, RequesterConfig};
use nfsrdma_xdr::rpc::{AcceptStat, OpaqueAuth, RpcMessage};
use nfsrdma_xdr::rpcrdma::{ChunkLists, RdmaBody, RdmaHeader, RdmaSegment, WriteChunk};
use nfsrdma_xdr::{List, Xdr, XdrSink};
use std::hint::black_box;

const XID: u32 = 0x5eed;
const RKEY: u32 = 0x1234;

/// A requester core with its receives posted, and what one call needs.
struct Requester {
    core: Connection<Bytes>,
    cfg: RequesterConfig,
    recvs: Vec<WrId>,
    reply: Bytes,
    args: Bytes,
}

fn requester() -> Requester {
    let mut core = Connection::new(Config {
        credits: 0,
        calls: 32,
        call_reserve: 1,
        accept_remote_invalidation: true,
        role: Role::Requester,
        send_slots: 32,
        sq_depth: 256,
        inline_send: 4096,
        inline_recv: 4096,
        ..Config::default()
    });
    let mut recvs = Vec::new();
    while let Some(w) = core.poll_work() {
        if let Work::Recv { wr, .. } = w {
            recvs.push(wr);
        }
    }
    // READ3res: status, no attributes, count, eof, the data's length
    // (the data itself went by RDMA Write).
    let mut results = Vec::new();
    for w in [0u32, 0, 4096, 0, 4096] {
        results.extend_from_slice(&w.to_be_bytes());
    }
    let mut reply = RdmaHeader {
        xid: XID,
        vers: 1,
        credit: 32,
        body: RdmaBody::Msg(ChunkLists {
            read_list: List(vec![]),
            write_list: List(vec![WriteChunk::new(vec![segment()])]),
            reply_chunk: None,
        }),
    }
    .to_bytes()
    .to_vec();
    reply.extend_from_slice(&RpcMessage::accepted(XID, AcceptStat::Success).to_bytes());
    reply.extend_from_slice(&results);
    Requester {
        core,
        cfg: RequesterConfig {
            inline_send: 4096,
            inline_recv: 4096,
        },
        recvs,
        reply: Bytes::from(reply),
        // READ3args: a 32-byte handle, offset, count.
        args: Bytes::from(vec![0u8; 4 + 32 + 8 + 4]),
    }
}

fn segment() -> RdmaSegment {
    RdmaSegment {
        handle: RKEY,
        length: 4096,
        offset: 0x1000,
    }
}

#[inline(never)]
fn one_read(r: &mut Requester, cred: &OpaqueAuth) {
    let core = &mut r.core;
    let slot = core.reserve_call().expect("a slot");
    let msg = RpcMessage::call(XID, 100003, 3, 6, cred.clone());
    let args = &r.args;
    let encode = |s: &mut dyn XdrSink| {
        msg.encode(s);
        s.put_raw(args);
    };
    let plan = plan_call(XID, &r.cfg, ReplyExpect::with_ddp(128, 4096), &encode);
    let regs = Registrations {
        write: vec![segment()],
        ..Registrations::default()
    };
    let mut message = vec![plan.header(32, &regs)];
    message.extend(plan.inline.iter().cloned());
    core.start_call(slot, plan, message, vec![RKEY], 1);
    let mut send = None;
    while let Some(w) = core.poll_work() {
        if let Work::Send(chain) = w {
            send = chain.last().map(|s| s.wr);
        }
    }
    let recv = r.recvs[0];
    core.received(recv, r.reply.clone(), Some(RKEY));
    while core.poll_work().is_some() {}
    match core.poll_event() {
        Some(Event::Reply { slot: s }) => {
            black_box(core.take_reply(s));
            core.finish_call(s);
        }
        other => panic!("expected the reply, got {other:?}"),
    }
    core.completed(send.expect("the call's Send"));
    while core.poll_released().is_some() {}
}

fn requester_read(c: &mut Criterion) {
    let mut r = requester();
    let cred = OpaqueAuth::none();
    c.bench_function("requester: one 4 KiB READ's life", |b| {
        b.iter(|| one_read(&mut r, &cred))
    });
}

criterion_group!(benches, requester_read);
criterion_main!(benches);
