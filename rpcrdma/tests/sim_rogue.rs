//! The rogue-requester cases of the Soft-RoCE suite
//! (server/tests/vm_rogue_requester.rs) that need no kernel, against the
//! responder connection core on the simulated fabric: each bad message
//! gets the RDMA_ERROR, the silence or the dropped connection it calls for,
//! and a connection that survives keeps answering.

use bytes::Bytes;
use nfsrdma_rpcrdma::conn::{Config, ConnError};
use nfsrdma_rpcrdma::sim::fabric::SideId;
use nfsrdma_rpcrdma::sim::requester::RequesterOptions;
use nfsrdma_rpcrdma::sim::Pair;
use nfsrdma_xdr::nfs3::{
    Data, Nfs3Args, Nfs3Res, NfsFh3, NfsProc3, NfsResult, Read3Args, StableHow, Write3Args,
};
use nfsrdma_xdr::rpc::{OpaqueAuth, RpcMessage};
use nfsrdma_xdr::rpcrdma::{
    ChunkLists, PaddedBody, RdmaBody, RdmaError, RdmaHeader, RdmaSegment, ReadSegment, WriteChunk,
};
use nfsrdma_xdr::{Decoder, List, Payload, Xdr};

const CREDITS: u32 = 8;
const INLINE: u32 = 4096;
const FILE_LEN: usize = 16 * 1024;

fn server_config() -> Config {
    Config {
        credits: CREDITS,
        send_slots: CREDITS,
        sq_depth: 64,
        read_depth: 4,
        chunk_slots: 2,
        inline_send: INLINE,
        inline_recv: INLINE,
        ..Config::default()
    }
}

fn pair() -> Pair {
    pair_with(server_config(), RequesterOptions::default(), 1_000_000)
}

fn pair_with(cfg: Config, opts: RequesterOptions, rnr: u32) -> Pair {
    Pair::new(cfg, opts, rnr)
}

fn run(p: &mut Pair) {
    assert!(p.drive(&[0, 3, 1], 1_000_000), "did not go quiet");
}

fn no_chunks() -> ChunkLists {
    ChunkLists {
        read_list: List(vec![]),
        write_list: List(vec![]),
        reply_chunk: None,
    }
}

fn header(xid: u32, vers: u32, body: RdmaBody) -> Vec<u8> {
    RdmaHeader {
        xid,
        vers,
        credit: CREDITS,
        body,
    }
    .to_bytes()
    .to_vec()
}

fn rdma_msg(xid: u32, lists: ChunkLists, inline: &[u8]) -> Vec<u8> {
    let mut m = header(xid, 1, RdmaBody::Msg(lists));
    m.extend_from_slice(inline);
    m
}

fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

fn rpc_call(xid: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    RpcMessage::call(
        xid,
        nfsrdma_xdr::nfs3::PROGRAM,
        3,
        proc_,
        OpaqueAuth::none(),
    )
    .encode(&mut b);
    b.extend_from_slice(args);
    b.to_vec()
}

fn null_call(xid: u32) -> Vec<u8> {
    rpc_call(xid, 0, &[])
}

fn file() -> NfsFh3 {
    NfsFh3::new(vec![9u8; 16])
}

/// A FILE_SYNC WRITE of `len` bytes (a multiple of four), reduced: the
/// inline part ends with the data's length word; and the data's position.
fn reduced_write(xid: u32, len: usize) -> (Vec<u8>, u32) {
    let args = Write3Args {
        file: file(),
        offset: 0,
        count: len as u32,
        stable: StableHow::FileSync,
        data: Data::new(vec![0u8; len]),
    };
    let mut full = rpc_call(xid, NfsProc3::Write as u32, &args.to_bytes());
    full.truncate(full.len() - len);
    let pos = full.len() as u32;
    (full, pos)
}

fn read_call(xid: u32) -> Vec<u8> {
    let args = Read3Args {
        file: file(),
        offset: 0,
        count: FILE_LEN as u32,
    };
    rpc_call(xid, NfsProc3::Read as u32, &args.to_bytes())
}

fn parse(buf: &Bytes) -> (RdmaHeader, Bytes) {
    let mut d = Decoder::new(buf.clone());
    let h = RdmaHeader::decode(&mut d).expect("transport header");
    assert!(h.credit >= 1 && h.credit <= CREDITS, "grant {}", h.credit);
    (h, d.into_rest())
}

/// The one raw reply the case got.
fn only_reply(p: &Pair) -> (RdmaHeader, Bytes) {
    assert_eq!(p.client.raw.len(), 1, "replies: {:02x?}", p.client.raw);
    parse(&p.client.raw[0])
}

fn assert_err_chunk(p: &Pair, xid: u32) {
    let (h, rest) = only_reply(p);
    assert_eq!(h.xid, xid);
    assert_eq!(h.body, RdmaBody::Error(RdmaError::Chunk), "{h:?}");
    assert!(rest.is_empty());
    assert_eq!(p.server.conn.stats().err_chunk, 1);
    assert!(p.server.closed.is_none(), "{:?}", p.server.closed);
}

/// The connection still answers a NULL, and the responder is idle after it.
fn usable(p: &mut Pair) {
    let x = p.client.call(Nfs3Args::Null);
    run(p);
    let o = p
        .client
        .done
        .iter()
        .find(|o| o.xid == x)
        .expect("NULL answered");
    assert_eq!(o.result, Ok(Nfs3Res::Null));
    assert!(p.server.closed.is_none(), "{:?}", p.server.closed);
    assert!(p.server.conn.is_idle(), "{:?}", p.server.conn.footprint());
}

/// The responder ended the connection because of `what`.
fn assert_dropped(p: &Pair, what: &str) {
    let e = p
        .server
        .closed
        .as_ref()
        .expect("the responder kept the connection");
    assert!(e.to_string().contains(what), "{e}");
}

fn send_and_run(p: &mut Pair, m: Vec<u8>) {
    p.client.send_raw(&mut p.fabric, m);
    run(p);
}

#[test]
fn case_01_wrong_rdma_vers_gets_err_vers() {
    let mut p = pair();
    let mut m = header(7, 2, RdmaBody::Msg(no_chunks()));
    m.extend_from_slice(&null_call(7));
    send_and_run(&mut p, m);
    let (h, rest) = only_reply(&p);
    assert_eq!((h.xid, h.vers), (7, 1));
    assert_eq!(h.body, RdmaBody::Error(RdmaError::Vers { low: 1, high: 1 }));
    assert!(rest.is_empty());
    assert_eq!(p.server.conn.stats().err_vers, 1);
    usable(&mut p);
}

#[test]
fn case_02_unknown_proc_gets_err_chunk() {
    let mut p = pair();
    send_and_run(&mut p, words(&[8, 1, CREDITS, 7, 0, 0, 0]));
    assert_err_chunk(&p, 8);
    usable(&mut p);
}

#[test]
fn case_03_rdma_msgp_gets_err_chunk() {
    let mut p = pair();
    let mut m = header(
        9,
        1,
        RdmaBody::Msgp(PaddedBody {
            align: 4,
            thresh: 0,
            chunks: no_chunks(),
        }),
    );
    m.extend_from_slice(&null_call(9));
    send_and_run(&mut p, m);
    assert_err_chunk(&p, 9);
    usable(&mut p);
}

#[test]
fn case_04_rdma_nomsg_without_chunks_gets_err_chunk() {
    for with_call in [false, true] {
        let mut p = pair();
        let mut m = header(10, 1, RdmaBody::Nomsg(no_chunks()));
        if with_call {
            m.extend_from_slice(&null_call(10));
        }
        send_and_run(&mut p, m);
        assert_err_chunk(&p, 10);
        usable(&mut p);
    }
}

#[test]
fn case_05_short_headers_are_dropped_silently() {
    let mut p = pair();
    send_and_run(&mut p, words(&[11, 1, CREDITS, 0, 0]));
    send_and_run(&mut p, words(&[12, 1]));
    assert!(p.client.raw.is_empty(), "{:?}", p.client.raw);
    assert_eq!(p.server.conn.stats().discarded, 2);
    usable(&mut p);
}

/// A Read segment over `len` bytes of memory registered by the requester.
fn read_seg(p: &mut Pair, position: u32, len: u32) -> ReadSegment {
    let (_, key, addr) = p
        .client
        .register(&mut p.fabric, &vec![0u8; len.max(4) as usize]);
    ReadSegment {
        position,
        target: RdmaSegment {
            handle: key,
            length: len,
            offset: addr,
        },
    }
}

#[test]
fn case_06_misaligned_read_chunk_position_gets_err_chunk() {
    let mut p = pair();
    let s = read_seg(&mut p, 6, 4);
    let lists = ChunkLists {
        read_list: List(vec![s]),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(13, lists, &null_call(13)));
    assert_err_chunk(&p, 13);
    usable(&mut p);
}

#[test]
fn case_07_read_chunk_position_past_the_end_gets_err_chunk() {
    let mut p = pair();
    let (inline, pos) = reduced_write(14, FILE_LEN);
    let s = read_seg(&mut p, pos + 8, FILE_LEN as u32);
    let lists = ChunkLists {
        read_list: List(vec![s]),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(14, lists, &inline));
    assert_err_chunk(&p, 14);
    assert_eq!(p.server.conn.stats().read_bytes, 0);
    usable(&mut p);
}

#[test]
fn case_08_oversized_read_list_gets_err_chunk_without_reads() {
    let mut p = pair();
    let (inline, pos) = reduced_write(15, FILE_LEN);
    let s = read_seg(&mut p, pos, 16);
    let segs = (0..4)
        .map(|_| ReadSegment {
            target: RdmaSegment {
                length: u32::MAX,
                ..s.target
            },
            ..s
        })
        .collect();
    let lists = ChunkLists {
        read_list: List(segs),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(15, lists, &inline));
    assert_err_chunk(&p, 15);
    assert!(p.fabric.accesses().is_empty(), "{:?}", p.fabric.accesses());
    usable(&mut p);
}

#[test]
fn case_09_empty_write_chunk_gets_err_chunk() {
    let mut p = pair();
    let lists = ChunkLists {
        write_list: List(vec![WriteChunk::new(vec![])]),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(16, lists, &read_call(16)));
    assert_err_chunk(&p, 16);
    usable(&mut p);
}

/// Writes the file through the well-behaved path first.
fn with_file(p: &mut Pair) -> Vec<u8> {
    let data: Vec<u8> = (0..FILE_LEN).map(|i| (i * 7) as u8).collect();
    let x = p.client.call(Nfs3Args::Write(Write3Args {
        file: file(),
        offset: 0,
        count: FILE_LEN as u32,
        stable: StableHow::FileSync,
        data: Data(Payload::from(data.clone())),
    }));
    run(p);
    let o = p
        .client
        .done
        .iter()
        .find(|o| o.xid == x)
        .expect("WRITE answered");
    assert!(
        matches!(o.result, Ok(Nfs3Res::Write(NfsResult::Ok(_)))),
        "{o:?}"
    );
    data
}

/// A READ of the file whose Write chunk is `seg`.
fn read_into(xid: u32, seg: RdmaSegment) -> Vec<u8> {
    let lists = ChunkLists {
        write_list: List(vec![WriteChunk::new(vec![seg])]),
        ..no_chunks()
    };
    rdma_msg(xid, lists, &read_call(xid))
}

#[test]
fn case_10_unregistered_write_chunk_rkey_drops_the_connection() {
    let mut p = pair();
    let data = with_file(&mut p);
    // With a real key first: the data lands, the reply says how much.
    let (region, key, addr) = p.client.register(&mut p.fabric, &vec![0u8; FILE_LEN]);
    let seg = RdmaSegment {
        handle: key,
        length: FILE_LEN as u32,
        offset: addr,
    };
    send_and_run(&mut p, read_into(17, seg));
    let (h, _) = only_reply(&p);
    let RdmaBody::Msg(lists) = &h.body else {
        panic!("{h:?}")
    };
    assert_eq!(lists.write_list.0[0].total_len(), FILE_LEN as u64);
    assert_eq!(
        p.fabric
            .memory_ref(SideId::A)
            .read(region, 0, FILE_LEN)
            .unwrap(),
        data
    );
    // Then with a key nothing was registered with.
    send_and_run(
        &mut p,
        read_into(
            18,
            RdmaSegment {
                handle: 0xdead_0000,
                ..seg
            },
        ),
    );
    assert_dropped(&p, "RDMA Write failed");
}

#[test]
fn case_11_bogus_read_chunk_rkey_drops_the_connection() {
    let mut p = pair();
    let (inline, pos) = reduced_write(19, FILE_LEN);
    let lists = ChunkLists {
        read_list: List(vec![ReadSegment {
            position: pos,
            target: RdmaSegment {
                handle: 0xdead_0000,
                length: FILE_LEN as u32,
                offset: 0x1000,
            },
        }]),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(19, lists, &inline));
    assert_dropped(&p, "RDMA Read failed");
    assert!(p.server.app.runs.is_empty(), "the WRITE must not run");
}

#[test]
fn case_12_more_calls_than_credits_wait_at_the_requester() {
    // The documented policy (conn::credits): the responder holds at most
    // its credits' worth of messages; the extra Sends find no receive
    // posted and wait in the requester's queue. With retries left, every
    // call is answered once, as buffers come back.
    let mut p = pair();
    let n = CREDITS + 4;
    for x in 0..n {
        p.client.send_raw(
            &mut p.fabric,
            rdma_msg(100 + x, no_chunks(), &null_call(100 + x)),
        );
    }
    run(&mut p);
    assert_eq!(p.client.raw.len(), n as usize);
    let mut xids: Vec<u32> = p.client.raw.iter().map(|r| parse(r).0.xid).collect();
    xids.sort_unstable();
    assert_eq!(xids, (100..100 + n).collect::<Vec<_>>());
    assert!(p.server.peak_held <= CREDITS, "held {}", p.server.peak_held);
    usable(&mut p);

    // Without retries the first Send beyond the credits fails at the
    // requester, which loses its connection; the responder never held more.
    let mut p = pair_with(server_config(), RequesterOptions::default(), 0);
    for x in 0..n {
        p.client.send_raw(
            &mut p.fabric,
            rdma_msg(200 + x, no_chunks(), &null_call(200 + x)),
        );
    }
    for _ in 0..n {
        p.fabric.step(SideId::A);
    }
    run(&mut p);
    let broken = p.client.broken.as_deref().unwrap_or_default();
    assert!(broken.contains("receiver not ready"), "{broken:?}");
    assert!(p.server.peak_held <= CREDITS, "held {}", p.server.peak_held);
    assert!(p.server.conn.is_closed());
}

#[test]
fn case_13_oversized_inline_send_drops_the_connection() {
    let mut p = pair();
    let mut m = rdma_msg(20, no_chunks(), &null_call(20));
    m.resize(2 * INLINE as usize, 0);
    send_and_run(&mut p, m);
    assert_dropped(&p, "receive failed");
}

#[test]
fn case_14_15_rdma_error_and_rdma_done_from_a_requester_are_dropped() {
    let mut p = pair();
    send_and_run(
        &mut p,
        header(21, 1, RdmaBody::Error(RdmaError::Vers { low: 1, high: 1 })),
    );
    let mut m = header(22, 1, RdmaBody::Error(RdmaError::Chunk));
    m.resize(28, 0);
    send_and_run(&mut p, m);
    let mut m = header(23, 1, RdmaBody::Done);
    m.resize(28, 0);
    send_and_run(&mut p, m);
    send_and_run(&mut p, header(24, 1, RdmaBody::Done));
    assert!(p.client.raw.is_empty(), "{:?}", p.client.raw);
    assert_eq!(p.server.conn.stats().discarded, 4);
    usable(&mut p);
}

#[test]
fn case_16_idle_peer_that_disconnects_is_a_flush_not_a_fault() {
    let mut p = pair();
    p.fabric.disconnect();
    run(&mut p);
    assert_eq!(p.server.closed, Some(ConnError::Flushed));
}

#[test]
fn case_17_rpc_xid_mismatch_gets_err_chunk_with_rdma_xid() {
    let mut p = pair();
    send_and_run(
        &mut p,
        rdma_msg(25, no_chunks(), &null_call(25 ^ 0x00ff_0000)),
    );
    assert_err_chunk(&p, 25);
    usable(&mut p);
}

#[test]
fn case_18_read_chunks_out_of_order_get_err_chunk() {
    let mut p = pair();
    let (inline, pos) = reduced_write(26, FILE_LEN);
    let a = read_seg(&mut p, pos, (FILE_LEN / 2) as u32);
    let b = read_seg(&mut p, pos - 4, (FILE_LEN / 2) as u32);
    let lists = ChunkLists {
        read_list: List(vec![a, b]),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(26, lists, &inline));
    assert_err_chunk(&p, 26);
    usable(&mut p);
}

#[test]
fn case_19_write_chunk_of_10000_segments_gets_err_chunk_without_writes() {
    let mut p = pair();
    let (_, key, addr) = p.client.register(&mut p.fabric, &vec![0u8; FILE_LEN]);
    let mut w = vec![27, 1, CREDITS, 0, 0, 1, 10_000];
    for i in 0..200u64 {
        let at = addr + i * 16;
        w.extend([key, 16, (at >> 32) as u32, at as u32]);
    }
    let m = words(&w);
    assert!(m.len() <= INLINE as usize);
    send_and_run(&mut p, m);
    assert_err_chunk(&p, 27);
    assert!(p.fabric.accesses().is_empty());
    usable(&mut p);
}

#[test]
fn case_20_write_chunk_outside_the_registration_drops_the_connection() {
    let mut p = pair();
    with_file(&mut p);
    let (_, key, addr) = p.client.register(&mut p.fabric, &vec![0u8; FILE_LEN]);
    let seg = RdmaSegment {
        handle: key,
        length: FILE_LEN as u32,
        offset: addr + FILE_LEN as u64,
    };
    send_and_run(&mut p, read_into(28, seg));
    assert_dropped(&p, "RDMA Write failed");
}

#[test]
fn case_21_disconnect_during_the_rdma_read_does_not_run_the_write() {
    let mut p = pair();
    let big = 1 << 20;
    let (_, key, addr) = p.client.register(&mut p.fabric, &vec![5u8; big]);
    let (inline, pos) = reduced_write(29, big);
    let lists = ChunkLists {
        read_list: List(vec![ReadSegment {
            position: pos,
            target: RdmaSegment {
                handle: key,
                length: big as u32,
                offset: addr,
            },
        }]),
        ..no_chunks()
    };
    p.client
        .send_raw(&mut p.fabric, rdma_msg(29, lists, &inline));
    // The Send lands; the responder posts its Reads; then the peer goes.
    p.fabric.step(SideId::A);
    p.server.complete_one(&mut p.fabric);
    p.server.drive(&mut p.fabric);
    assert!(p.fabric.has_work(SideId::B), "the Reads were posted");
    p.fabric.disconnect();
    run(&mut p);
    assert_eq!(p.server.closed, Some(ConnError::Flushed));
    assert!(
        p.server.app.runs.is_empty(),
        "the WRITE ran without its data"
    );
}

#[test]
fn case_22_more_read_segments_than_the_read_depth_all_land_in_place() {
    const SEG: usize = 256;
    let mut p = pair();
    let n = FILE_LEN / SEG;
    let written: Vec<u8> = (0..FILE_LEN).map(|i| (i / SEG) as u8 ^ 0xa5).collect();
    // Segment i of the chunk sits at slot n-1-i of our memory.
    let mut mem = vec![0u8; FILE_LEN];
    for i in 0..n {
        let slot = n - 1 - i;
        mem[slot * SEG..(slot + 1) * SEG].copy_from_slice(&written[i * SEG..(i + 1) * SEG]);
    }
    let (_, key, addr) = p.client.register(&mut p.fabric, &mem);
    let (inline, pos) = reduced_write(30, FILE_LEN);
    let lists = ChunkLists {
        read_list: List(
            (0..n)
                .map(|i| ReadSegment {
                    position: pos,
                    target: RdmaSegment {
                        handle: key,
                        length: SEG as u32,
                        offset: addr + ((n - 1 - i) * SEG) as u64,
                    },
                })
                .collect(),
        ),
        ..no_chunks()
    };
    send_and_run(&mut p, rdma_msg(30, lists, &inline));
    let s = p.server.conn.stats();
    assert!(s.read_chains >= (n / 4) as u64, "depth 4: {s:?}");
    assert_eq!(p.server.app.files[&file().as_bytes().to_vec()], written);
    usable(&mut p);
}

#[test]
fn a_requester_that_posts_no_receives_loses_its_connection_and_costs_nothing() {
    // Its reply finds no receive: the responder's Send fails when the
    // retries run out, and the connection ends.
    let opts = RequesterOptions {
        post_receives: false,
        ..RequesterOptions::default()
    };
    let mut p = pair_with(server_config(), opts, 3);
    for _ in 0..3 * CREDITS {
        p.client.call(Nfs3Args::Null);
    }
    run(&mut p);
    assert_dropped(&p, "send failed");
    assert!(p.server.peak_held <= CREDITS);
    assert!(p.server.peak_bytes <= p.server.conn.config().memory_bound());
}

/// A message a hostile requester might send: garbage, a truncated or
/// mangled header, a valid call, a call with chunks naming memory it does
/// not have.
fn hostile(kind: u8, xid: u32, junk: &[u8]) -> Vec<u8> {
    match kind % 6 {
        0 => junk.to_vec(),
        1 => {
            let mut m = rdma_msg(xid, no_chunks(), &null_call(xid));
            m.truncate(junk.len() % m.len());
            m
        }
        2 => {
            let mut m = rdma_msg(xid, no_chunks(), &null_call(xid));
            for (i, b) in junk.iter().enumerate() {
                let at = i * 7 % m.len();
                m[at] ^= b;
            }
            m
        }
        3 => rdma_msg(xid, no_chunks(), &null_call(xid)),
        4 => {
            let (inline, pos) = reduced_write(xid, 4096);
            let lists = ChunkLists {
                read_list: List(vec![ReadSegment {
                    position: pos,
                    target: RdmaSegment {
                        handle: u32::from_be_bytes([junk.first().copied().unwrap_or(0), 1, 2, 3]),
                        length: 4096,
                        offset: 0x1000,
                    },
                }]),
                ..no_chunks()
            };
            rdma_msg(xid, lists, &inline)
        }
        _ => {
            let mut m = header(xid, 1, RdmaBody::Msg(no_chunks()));
            m.extend_from_slice(junk);
            m
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    #[test]
    fn whatever_a_requester_sends_the_responder_stays_within_its_bound(
        msgs in proptest::collection::vec(
            (proptest::prelude::any::<u8>(), proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64)),
            1..40,
        ),
        choices in proptest::collection::vec(proptest::prelude::any::<u32>(), 1..16),
    ) {
        let mut p = pair_with(server_config(), RequesterOptions::default(), 1_000_000);
        for (i, (kind, junk)) in msgs.iter().enumerate() {
            let m = hostile(*kind, 0x5000 + i as u32, junk);
            p.client.send_raw(&mut p.fabric, m);
        }
        proptest::prop_assert!(p.drive(&choices, 1_000_000), "did not go quiet");
        let cfg = p.server.conn.config().clone();
        proptest::prop_assert!(p.server.peak_held <= cfg.credits);
        proptest::prop_assert!(p.server.peak_bytes <= cfg.memory_bound());
        // Either the connection ended (a Read of memory the requester does
        // not have, a Send larger than a buffer), or every message was
        // answered or dropped and nothing is left held.
        if p.server.closed.is_none() {
            proptest::prop_assert!(p.server.conn.is_idle(), "{:?}", p.server.conn.footprint());
            let s = p.server.conn.stats();
            proptest::prop_assert_eq!(
                s.discarded + s.err_vers + s.err_chunk + s.inline_replies + s.reply_chunk_replies,
                msgs.len() as u64,
                "{:?}", s
            );
        }
    }
}
