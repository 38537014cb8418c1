//! Many calls in flight, out-of-order replies, and large transfers through
//! read_all / write_all.

mod common;

use bytes::Bytes;
use common::*;
use nfsrdma_client::rpc::{call, Target};
use nfsrdma_client::transport::tcp::{TcpOptions, TcpTransport};
use nfsrdma_client::transport::ReplyExpect;
use nfsrdma_client::xdr::nfs3::*;
use nfsrdma_client::xdr::rpc::{AcceptStat, OpaqueAuth, RpcMessage};
use nfsrdma_client::xdr::Xdr;
use nfsrdma_client::Client;
use std::sync::{Arc, Mutex};
use tokio::task::JoinSet;

/// A fake server that holds every call until 64 are in, then answers them
/// all in reverse order: the client must have 64 calls in flight on one
/// connection and match replies by XID. Each call carries its own number,
/// which the server echoes in the reply to that XID: a caller that got
/// another call's reply would see another number.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_in_flight_answered_in_reverse() {
    // (xid, the call's argument), in arrival order.
    let held: Arc<Mutex<Vec<(u32, u32)>>> = Arc::default();
    let h2 = held.clone();
    let fake = FakeServer::start(
        Arc::new(move |rec: Bytes| {
            let mut h = h2.lock().unwrap();
            let arg = u32::from_be_bytes(rec[rec.len() - 4..].try_into().unwrap());
            h.push((xid_of(&rec), arg));
            if h.len() < 64 {
                return Vec::new();
            }
            let mut out = Vec::new();
            for (xid, arg) in h.drain(..).rev() {
                let mut body = RpcMessage::accepted(xid, AcceptStat::Success)
                    .to_bytes()
                    .to_vec();
                body.extend_from_slice(&arg.to_be_bytes());
                out.extend(record(&body));
            }
            out
        }),
        false,
    )
    .await;
    let t = Arc::new(
        TcpTransport::connect(fake.addr, TcpOptions::default())
            .await
            .unwrap(),
    );
    let mut set = JoinSet::new();
    for i in 0..64u32 {
        let t = t.clone();
        set.spawn(async move {
            let target = Target {
                prog: PROGRAM,
                vers: VERSION,
                proc_: 0,
                name: "NULL",
            };
            let got = call::<_, u32>(&*t, &OpaqueAuth::none(), target, &i, ReplyExpect::small(4))
                .await
                .unwrap();
            (i, got)
        });
    }
    let mut answered = 0;
    let all = tokio::time::timeout(NO_HANG, async {
        while let Some(r) = set.join_next().await {
            let (i, got) = r.unwrap();
            assert_eq!(got, i, "call {i} got the reply of call {got}");
            answered += 1;
        }
    })
    .await;
    assert!(all.is_ok(), "calls did not complete");
    assert_eq!(answered, 64);
    let rec = fake.received.lock().unwrap().clone();
    assert_eq!(rec.len(), 64);
    assert_eq!(t.stats().connects, 1);
}

/// 64 concurrent 4 KiB writes to one file, then 64 concurrent reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_writes_then_reads() {
    let s = TestServer::start(EXPORTS);
    let c = connect(&s, "/export").await;
    let fh = c
        .create(c.root(), "f", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .obj
        .unwrap();
    let mut set = JoinSet::new();
    for i in 0..64u64 {
        let (c, fh) = (c.clone(), fh.clone());
        set.spawn(async move {
            c.write(&fh, i * 4096, pattern(i, 4096), StableHow::FileSync)
                .await
        });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(r.unwrap().unwrap().count, 4096);
    }
    assert_eq!(c.getattr(&fh).await.unwrap().size, 64 * 4096);
    let mut set = JoinSet::new();
    for i in 0..64u64 {
        let (c, fh) = (c.clone(), fh.clone());
        set.spawn(async move { (i, c.read(&fh, i * 4096, 4096).await) });
    }
    while let Some(r) = set.join_next().await {
        let (i, r) = r.unwrap();
        let r = r.unwrap();
        assert_eq!(r.data.to_contiguous(), pattern(i, 4096), "block {i}");
    }
    assert_eq!(s.service.metrics().calls(NfsProc3::Write), 64);
}

/// A 16 MiB file through write_all and read_all, with several RPCs in
/// flight each way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_mib_round_trip() {
    let s = TestServer::start(EXPORTS);
    let mut o = opts_at(s.addr);
    o.rsize = Some(256 << 10);
    o.wsize = Some(256 << 10);
    o.io_depth = 8;
    let c = Client::connect(&o, "127.0.0.1", "/export").await.unwrap();
    assert_eq!((c.rsize(), c.wsize()), (256 << 10, 256 << 10));
    let fh = c
        .create(c.root(), "big", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .obj
        .unwrap();
    let data = pattern(16, 16 << 20);
    let sum = checksum([&data[..]]);
    assert_eq!(c.write_all(&fh, 0, data.clone()).await.unwrap(), 16 << 20);
    assert_eq!(s.service.metrics().calls(NfsProc3::Write), 64);
    let back = c.read_all(&fh).await.unwrap();
    assert_eq!(back.len(), 16 << 20);
    assert_eq!(checksum(back.parts().iter().map(|p| &p[..])), sum);
    // Pieces are the READ replies' data, not one copied buffer.
    assert_eq!(back.parts().len(), 64);

    // A range in the middle, and a write at an offset past the end.
    let (mid, eof) = c.read_range(&fh, 1_000_000, 700_000).await.unwrap();
    assert!(!eof);
    assert_eq!(mid.to_contiguous(), data.slice(1_000_000..1_700_000));
    let tail = pattern(17, 300_000);
    c.write_all(&fh, (16 << 20) + 5, tail.clone())
        .await
        .unwrap();
    let all = c.read_all(&fh).await.unwrap();
    assert_eq!(all.len(), (16 << 20) + 5 + 300_000);
    assert_eq!(all.slice((16 << 20) + 5..all.len()).to_contiguous(), tail);
    // Empty file and empty write.
    let e = c
        .create(c.root(), "empty", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .obj
        .unwrap();
    assert_eq!(c.write_all(&e, 0, Bytes::new()).await.unwrap(), 0);
    assert!(c.read_all(&e).await.unwrap().is_empty());
}
