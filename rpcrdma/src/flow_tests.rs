//! Requester and responder against each other, with the RDMA operations
//! simulated on plain buffers, and golden header layouts of the calls the
//! Linux client sends.

use crate::requester::{self, CallShape, ReplyExpect, ReplyMessage, RequesterConfig};
use crate::responder::{self, Fault, IncomingCall, Received, ReplyShape, ResponderConfig};
use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::nfs3::*;
use nfsrdma_xdr::rpc::{AcceptStat, OpaqueAuth, RpcMessage};
use nfsrdma_xdr::rpcrdma::{RdmaError, RdmaSegment};
use nfsrdma_xdr::{Decoder, List, Payload, Xdr, XdrSink};

/// Fake registrations: one segment per chunk, rkeys 0x100.. per chunk kind.
fn register(plan: &requester::CallPlan, same_rkey: bool) -> requester::Registrations {
    let key = |k: u32| if same_rkey { 0x777 } else { k };
    requester::Registrations {
        read: plan
            .read
            .as_ref()
            .map(|(_, d)| {
                vec![RdmaSegment {
                    handle: key(0x100),
                    length: d.len() as u32,
                    offset: 0x10_0000,
                }]
            })
            .unwrap_or_default(),
        write: plan
            .write_chunk
            .map(|n| {
                vec![RdmaSegment {
                    handle: key(0x200),
                    length: n,
                    offset: 0x20_0000,
                }]
            })
            .unwrap_or_default(),
        reply: plan
            .reply_chunk
            .map(|n| {
                vec![RdmaSegment {
                    handle: key(0x300),
                    length: n,
                    offset: 0x30_0000,
                }]
            })
            .unwrap_or_default(),
    }
}

fn words(b: &[u8]) -> Vec<u32> {
    b.chunks(4)
        .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
        .collect()
}

fn call_msg(xid: u32, args: &Nfs3Args) -> impl Fn(&mut dyn XdrSink) + '_ {
    move |s: &mut dyn XdrSink| {
        RpcMessage::call(xid, PROGRAM, 3, args.proc_() as u32, OpaqueAuth::none()).encode(s);
        args.encode(s);
    }
}

/// Sends a call from the requester to the responder; returns what the
/// responder received and the Send bytes.
fn send(
    plan: &requester::CallPlan,
    regs: &requester::Registrations,
    cfg: &ResponderConfig,
) -> (Received, Bytes) {
    let mut wire = BytesMut::from(&plan.header(32, regs)[..]);
    for p in &plan.inline {
        wire.extend_from_slice(p);
    }
    let wire = wire.freeze();
    (responder::receive(wire.clone(), cfg), wire)
}

/// The responder's RDMA Reads: the chunk data from the requester's memory.
fn do_reads(call: &IncomingCall, plan: &requester::CallPlan) -> Vec<Payload> {
    call.read_chunks
        .iter()
        .map(|c| {
            assert_eq!(c.total_len() as usize, plan.read.as_ref().unwrap().1.len());
            plan.read.as_ref().unwrap().1.clone()
        })
        .collect()
}

fn decode_call(d: &mut Decoder) -> (u32, Nfs3Args) {
    let h = RpcMessage::decode(d).unwrap();
    let c = h.as_call().unwrap().clone();
    let a = Nfs3Args::decode(NfsProc3::from_u32(c.proc_).unwrap(), d).unwrap();
    (h.xid, a)
}

fn reply_msg(xid: u32, res: &Nfs3Res) -> impl FnOnce(&mut dyn XdrSink) + '_ {
    move |s: &mut dyn XdrSink| {
        RpcMessage::accepted(xid, AcceptStat::Success).encode(s);
        res.encode(s);
    }
}

/// Carries out a reply plan against the requester's buffers and decodes the
/// result as the requester would.
fn deliver(
    rplan: &responder::ReplyPlan,
    plan: &requester::CallPlan,
    regs: &requester::Registrations,
    proc_: NfsProc3,
) -> Nfs3Res {
    let mut write_buf = vec![0u8; plan.write_chunk.unwrap_or(0) as usize];
    let mut reply_buf = vec![0u8; plan.reply_chunk.unwrap_or(0) as usize];
    for w in &rplan.writes {
        let (buf, base) = if regs.write.first().map(|s| s.handle) == Some(w.rkey)
            && w.offset >= regs.write[0].offset
            && plan.write_chunk.is_some()
            && (regs.reply.is_empty() || w.offset < regs.reply[0].offset)
        {
            (&mut write_buf, regs.write[0].offset)
        } else {
            (&mut reply_buf, regs.reply[0].offset)
        };
        let at = (w.offset - base) as usize;
        w.data.copy_to_slice(&mut buf[at..at + w.data.len()]);
    }
    let mut send = BytesMut::from(&rplan.header[..]);
    for p in &rplan.inline {
        send.extend_from_slice(p);
    }
    let parsed = requester::parse_reply(send.freeze(), plan).unwrap();
    let requester::Reply::Message {
        message, written, ..
    } = parsed
    else {
        panic!("error reply")
    };
    let msg = match message {
        ReplyMessage::Inline(b) => b,
        ReplyMessage::InReplyChunk(n) => Bytes::copy_from_slice(&reply_buf[..n as usize]),
    };
    let ddp = written.map(|n| Payload::from(write_buf[..n as usize].to_vec()));
    let mut d = requester::reply_decoder(msg, ddp);
    RpcMessage::decode(&mut d).unwrap();
    let r = Nfs3Res::decode(proc_, &mut d).unwrap();
    d.finish("reply").unwrap();
    r
}

fn fh() -> NfsFh3 {
    NfsFh3::new(vec![7u8; 24])
}

#[test]
fn read_4k_uses_a_write_chunk_and_send_with_invalidate() {
    let rq = RequesterConfig::default();
    let args = Nfs3Args::Read(Read3Args {
        file: fh(),
        offset: 0,
        count: 4096,
    });
    let plan = requester::plan_call(
        0x42,
        &rq,
        ReplyExpect {
            max_len: 4096 + 200,
            ddp_max: Some(4096),
        },
        &call_msg(0x42, &args),
    );
    assert_eq!(plan.shape, CallShape::Inline);
    assert_eq!(plan.write_chunk, Some(4096));
    let regs = register(&plan, false);
    // Golden: xid, vers, credits, RDMA_MSG, empty Read list, one Write chunk
    // of one segment, end of Write list, no Reply chunk.
    assert_eq!(
        words(&plan.header(32, &regs)),
        vec![0x42, 1, 32, 0, 0, 1, 1, 0x200, 4096, 0, 0x20_0000, 0, 0]
    );
    let cfg = ResponderConfig {
        remote_invalidation: true,
        ..Default::default()
    };
    let (rx, _) = send(&plan, &regs, &cfg);
    let Received::Call(call) = rx else {
        panic!("{rx:?}")
    };
    assert!(!call.needs_reads());
    assert_eq!(call.write_budget(), Some(4096));
    assert_eq!(call.invalidate_rkey(&cfg), Some(0x200), "one distinct rkey");
    assert_eq!(
        call.invalidate_rkey(&ResponderConfig::default()),
        None,
        "RI not allowed"
    );
    let (xid, a) = decode_call(&mut call.assemble(vec![]).unwrap());
    assert_eq!((xid, &a), (0x42, &args));

    let data = Payload::from(Bytes::from(
        (0..4096u32).map(|i| i as u8).collect::<Vec<_>>(),
    ));
    let res = Nfs3Res::Read(NfsResult::Ok(Read3ResOk {
        file_attributes: None,
        count: 4096,
        eof: false,
        data: Data(data.clone()),
    }));
    let rplan = responder::plan_reply(&call, &cfg, reply_msg(xid, &res)).unwrap();
    assert_eq!(rplan.shape, ReplyShape::Inline);
    assert_eq!(rplan.send_with_invalidate, Some(0x200));
    assert_eq!(rplan.ddp_bytes, 4096);
    assert_eq!(rplan.writes.len(), 1);
    assert_eq!(
        rplan.writes[0].data, data,
        "written straight from the payload"
    );
    // The echoed Write list says 4096 bytes were written.
    let w = words(&rplan.header);
    assert_eq!(&w[..5], &[0x42, 1, 128, 0, 0]);
    assert_eq!(&w[5..11], &[1, 1, 0x200, 4096, 0, 0x20_0000]);
    assert_eq!(deliver(&rplan, &plan, &regs, NfsProc3::Read), res);
}

#[test]
fn write_1m_travels_in_a_read_chunk_at_its_position() {
    let rq = RequesterConfig::default();
    let data = Payload::from(Bytes::from(vec![0xabu8; 1 << 20]));
    let args = Nfs3Args::Write(Write3Args {
        file: fh(),
        offset: 1 << 20,
        count: 1 << 20,
        stable: StableHow::Unstable,
        data: Data(data.clone()),
    });
    let plan = requester::plan_call(
        7,
        &rq,
        ReplyExpect {
            max_len: 512,
            ddp_max: None,
        },
        &call_msg(7, &args),
    );
    assert_eq!(plan.shape, CallShape::ReadChunk);
    let (pos, rd) = plan.read.clone().unwrap();
    // RPC call header with AUTH_NONE (40) + fh (4 + 24) + offset 8 + count 4
    // + stable 4 + the data's length word 4.
    assert_eq!(pos, 40 + 28 + 8 + 4 + 4 + 4);
    assert_eq!(rd, data, "the payload itself is exposed, not a copy");
    assert_eq!(
        plan.inline.iter().map(Bytes::len).sum::<usize>(),
        pos as usize
    );
    let regs = register(&plan, false);
    assert_eq!(
        words(&plan.header(32, &regs)),
        vec![7, 1, 32, 0, 1, pos, 0x100, 1 << 20, 0, 0x10_0000, 0, 0, 0]
    );
    let cfg = ResponderConfig::default();
    let (rx, _) = send(&plan, &regs, &cfg);
    let Received::Call(call) = rx else {
        panic!("{rx:?}")
    };
    assert_eq!(call.read_chunks.len(), 1);
    assert_eq!(call.read_chunks[0].position, pos);
    let chunks = do_reads(&call, &plan);
    let mut d = call.assemble(chunks).unwrap();
    let (_, a) = decode_call(&mut d);
    d.finish("call").unwrap();
    assert_eq!(a, args);
    if let Nfs3Args::Write(w) = a {
        assert_eq!(
            w.data.parts()[0].as_ptr(),
            data.parts()[0].as_ptr(),
            "decoded WRITE data is the chunk data"
        );
    }
    // A padded chunk (a requester that rounded the length up) is accepted.
    let odd = Nfs3Args::Write(Write3Args {
        file: fh(),
        offset: 0,
        count: 5001,
        stable: StableHow::FileSync,
        data: Data::new(vec![1u8; 5001]),
    });
    let plan = requester::plan_call(
        8,
        &rq,
        ReplyExpect {
            max_len: 512,
            ddp_max: None,
        },
        &call_msg(8, &odd),
    );
    assert_eq!(plan.shape, CallShape::ReadChunk);
    let mut padded = plan.read.as_ref().unwrap().1.to_contiguous().to_vec();
    padded.extend_from_slice(&[0, 0, 0]);
    let mut regs = register(&plan, false);
    regs.read[0].length = padded.len() as u32;
    let (rx, _) = send(&plan, &regs, &cfg);
    let Received::Call(call) = rx else { panic!() };
    let (_, a) = decode_call(&mut call.assemble(vec![Payload::from(padded)]).unwrap());
    assert_eq!(a, odd);
}

#[test]
fn long_getattr_travels_in_a_position_zero_chunk() {
    // A tiny inline threshold makes even GETATTR a long call.
    let rq = RequesterConfig {
        inline_send: 64,
        inline_recv: 4096,
    };
    let args = Nfs3Args::Getattr(Getattr3Args { object: fh() });
    let plan = requester::plan_call(
        9,
        &rq,
        ReplyExpect {
            max_len: 200,
            ddp_max: None,
        },
        &call_msg(9, &args),
    );
    assert_eq!(plan.shape, CallShape::LongCall);
    assert!(plan.inline.is_empty());
    let (pos, whole) = plan.read.clone().unwrap();
    assert_eq!(pos, 0);
    let regs = register(&plan, true);
    assert_eq!(
        words(&plan.header(4, &regs)),
        vec![
            9,
            1,
            4,
            1,
            1,
            0,
            0x777,
            whole.len() as u32,
            0,
            0x10_0000,
            0,
            0,
            0
        ]
    );
    let cfg = ResponderConfig::default();
    let (rx, _) = send(&plan, &regs, &cfg);
    let Received::Call(call) = rx else {
        panic!("{rx:?}")
    };
    let chunks = do_reads(&call, &plan);
    let (_, a) = decode_call(&mut call.assemble(chunks).unwrap());
    assert_eq!(a, args);
}

#[test]
fn large_readdirplus_reply_goes_in_the_reply_chunk() {
    let rq = RequesterConfig::default();
    let args = Nfs3Args::Readdirplus(Readdirplus3Args {
        dir: fh(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 8192,
        maxcount: 32768,
    });
    let plan = requester::plan_call(
        10,
        &rq,
        ReplyExpect {
            max_len: 32768 + 200,
            ddp_max: None,
        },
        &call_msg(10, &args),
    );
    assert_eq!(
        (plan.write_chunk, plan.reply_chunk),
        (None, Some(32768 + 200))
    );
    let regs = register(&plan, false);
    assert_eq!(
        words(&plan.header(32, &regs)),
        vec![10, 1, 32, 0, 0, 0, 1, 1, 0x300, 32968, 0, 0x30_0000]
    );
    let cfg = ResponderConfig::default();
    let (rx, _) = send(&plan, &regs, &cfg);
    let Received::Call(call) = rx else { panic!() };
    let entries = (0..100u64)
        .map(|i| EntryPlus3 {
            fileid: i,
            name: Filename3::new(format!("entry-{i}").into_bytes()),
            cookie: i + 3,
            name_attributes: Some(Fattr3::default()),
            name_handle: Some(fh()),
        })
        .collect();
    let res = Nfs3Res::Readdirplus(NfsResult::Ok(Readdirplus3ResOk {
        dir_attributes: None,
        cookieverf: [1; 8],
        reply: DirListPlus3 {
            entries: List(entries),
            eof: true,
        },
    }));
    let rplan = responder::plan_reply(&call, &cfg, reply_msg(10, &res)).unwrap();
    assert_eq!(rplan.shape, ReplyShape::ReplyChunk);
    assert!(rplan.inline.is_empty());
    let w = words(&rplan.header);
    assert_eq!(&w[..6], &[10, 1, 128, 1, 0, 0], "RDMA_NOMSG, no lists");
    assert_eq!(&w[6..8], &[1, 1], "Reply chunk echoed");
    assert_eq!(w[9] as usize, rplan.write_len(), "with the length written");
    assert_eq!(deliver(&rplan, &plan, &regs, NfsProc3::Readdirplus), res);
    // Without a Reply chunk the same reply cannot be sent.
    let mut no_rc = call.clone();
    no_rc.reply_chunk = None;
    assert!(matches!(
        responder::plan_reply(&no_rc, &cfg, reply_msg(10, &res)),
        Err(responder::ReplyError::TooLarge { .. })
    ));
}

#[test]
fn small_replies_stay_inline_and_unused_write_chunks_echo_zero() {
    let rq = RequesterConfig::default();
    let args = Nfs3Args::Read(Read3Args {
        file: fh(),
        offset: 0,
        count: 65536,
    });
    let plan = requester::plan_call(
        11,
        &rq,
        ReplyExpect {
            max_len: 65536 + 200,
            ddp_max: Some(65536),
        },
        &call_msg(11, &args),
    );
    let regs = register(&plan, false);
    let cfg = ResponderConfig::default();
    let (rx, _) = send(&plan, &regs, &cfg);
    let Received::Call(call) = rx else { panic!() };
    let res = Nfs3Res::Read(NfsResult::Err(NfsStat3::Stale, AttrOnly::default()));
    let rplan = responder::plan_reply(&call, &cfg, reply_msg(11, &res)).unwrap();
    assert!(rplan.writes.is_empty());
    let w = words(&rplan.header);
    assert_eq!(
        &w[5..12],
        &[1, 1, 0x200, 0, 0, 0x20_0000, 0],
        "segment length 0"
    );
    assert_eq!(deliver(&rplan, &plan, &regs, NfsProc3::Read), res);
}

fn rx_bytes(words: &[u32]) -> Bytes {
    Bytes::from(
        words
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect::<Vec<u8>>(),
    )
}

fn error_of(r: Received) -> (Vec<u32>, Fault) {
    match r {
        Received::Error { reply, fault } => (words(&reply), fault),
        other => panic!("expected an RDMA_ERROR, got {other:?}"),
    }
}

#[test]
fn faults_are_answered_as_rfc_8166_says() {
    let cfg = ResponderConfig::default();
    // Wrong version: ERR_VERS 1..1 with the caller's XID.
    let (w, f) = error_of(responder::receive(rx_bytes(&[5, 2, 1, 0, 0, 0, 0]), &cfg));
    assert_eq!((w, f), (vec![5, 1, 128, 4, 1, 1, 1], Fault::Vers));
    // RDMA_MSGP and an unknown procedure: ERR_CHUNK.
    let (w, _) = error_of(responder::receive(
        rx_bytes(&[6, 1, 1, 2, 0, 0, 0, 0, 0]),
        &cfg,
    ));
    assert_eq!(w, vec![6, 1, 128, 4, 2]);
    let (_, f) = error_of(responder::receive(rx_bytes(&[6, 1, 1, 9, 0, 0, 0]), &cfg));
    assert_eq!(f, Fault::Chunk("unknown procedure"));
    // RDMA_NOMSG without chunks.
    let (_, f) = error_of(responder::receive(rx_bytes(&[6, 1, 1, 1, 0, 0, 0]), &cfg));
    assert_eq!(
        f,
        Fault::Chunk("RDMA_NOMSG without a Position-Zero Read chunk")
    );
    // A misaligned Read chunk position.
    let r = responder::receive(
        rx_bytes(&[6, 1, 1, 0, 1, 6, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0]),
        &cfg,
    );
    assert_eq!(
        error_of(r).1,
        Fault::Chunk("misaligned Read chunk position")
    );
    // A position past the end of the inline message.
    let r = responder::receive(
        rx_bytes(&[6, 1, 1, 0, 1, 400, 1, 8, 0, 0, 0, 0, 0, 0, 0, 0]),
        &cfg,
    );
    assert_eq!(
        error_of(r).1,
        Fault::Chunk("Read chunk position past the end")
    );
    // Read chunk lengths that overflow any sane sum.
    let mut v = vec![6, 1, 1, 0];
    for _ in 0..4 {
        v.extend_from_slice(&[1, 8, 1, 0xffff_ffff, 0, 0]);
    }
    v.extend_from_slice(&[0, 0, 0, 0, 0]);
    let r = responder::receive(rx_bytes(&v), &cfg);
    assert_eq!(
        error_of(r).1,
        Fault::Chunk("Read chunks larger than the largest call")
    );
    // A segment that ends past the last address, in the Read list, a
    // Write chunk or the Reply chunk (0xffff_ffff_ffff_fffc + 8).
    let wraps = "segment ends past the address space";
    let (hi, lo) = (0xffff_ffff, 0xffff_fffc);
    let read = [6, 1, 1, 0, 1, 4, 7, 8, hi, lo, 0, 0, 0, 1, 2];
    let write = [6, 1, 1, 0, 0, 1, 2, 7, 4, 0, 0, 7, 8, hi, lo, 0, 0];
    let reply = [6, 1, 1, 1, 0, 0, 1, 1, 7, 8, hi, lo];
    for v in [&read[..], &write[..], &reply[..]] {
        let r = responder::receive(rx_bytes(v), &cfg);
        assert_eq!(error_of(r).1, Fault::Chunk(wraps), "{v:?}");
    }
    // One byte less, its end address fits in 64 bits: a call.
    let r = responder::receive(
        rx_bytes(&[6, 1, 1, 0, 0, 1, 1, 7, 3, hi, lo, 0, 0, 9]),
        &cfg,
    );
    assert!(matches!(r, Received::Call(_)), "{r:?}");
    // A Write chunk with no segments.
    let r = responder::receive(rx_bytes(&[6, 1, 1, 0, 0, 1, 0, 0, 0]), &cfg);
    assert_eq!(error_of(r).1, Fault::Chunk("Write chunk without segments"));
    // A Write chunk claiming 10,000 segments: undecodable here (ERR_CHUNK).
    let r = responder::receive(rx_bytes(&[6, 1, 1, 0, 0, 1, 10_000, 0, 0]), &cfg);
    assert_eq!(error_of(r).1, Fault::Chunk("undecodable header"));
    // Too short to be a header, RDMA_DONE, RDMA_ERROR: dropped.
    assert!(matches!(
        responder::receive(rx_bytes(&[1, 1, 1]), &cfg),
        Received::Discard(_)
    ));
    assert!(matches!(
        responder::receive(rx_bytes(&[1, 1, 1, 0, 0, 0]), &cfg),
        Received::Discard(_)
    ));
    assert!(matches!(
        responder::receive(rx_bytes(&[1, 1, 1, 3, 0, 0, 0]), &cfg),
        Received::Discard(_)
    ));
    assert!(matches!(
        responder::receive(rx_bytes(&[1, 1, 1, 4, 2, 0, 0]), &cfg),
        Received::Discard(_)
    ));
}

#[test]
fn requester_rejects_inconsistent_replies() {
    let rq = RequesterConfig::default();
    let args = Nfs3Args::Getattr(Getattr3Args { object: fh() });
    let plan = requester::plan_call(
        20,
        &rq,
        ReplyExpect {
            max_len: 200,
            ddp_max: None,
        },
        &call_msg(20, &args),
    );
    // RDMA_ERROR is reported as such, with a zero grant read as one.
    let r = requester::parse_reply(rx_bytes(&[20, 1, 0, 4, 2]), &plan).unwrap();
    assert_eq!(
        r,
        requester::Reply::Error {
            credits: 1,
            error: RdmaError::Chunk
        }
    );
    // Another XID, a Write list nobody asked for, a NOMSG without a Reply chunk.
    assert!(requester::parse_reply(rx_bytes(&[21, 1, 1, 0, 0, 0, 0]), &plan).is_err());
    assert!(
        requester::parse_reply(rx_bytes(&[20, 1, 1, 0, 0, 1, 1, 5, 4, 0, 0, 0, 0]), &plan).is_err()
    );
    assert!(requester::parse_reply(rx_bytes(&[20, 1, 1, 1, 0, 0, 0]), &plan).is_err());
    assert_eq!(requester::reply_xid(&rx_bytes(&[20, 1, 1, 0])), Some(20));
}
