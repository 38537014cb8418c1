//! The TCP front end: many calls in flight, out-of-order replies, and bad
//! input that must be answered per RFC 5531 or close only the offending
//! connection while another client is served the whole time.

mod common;

use bytes::BytesMut;
use common::*;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs3::*;
use nfsrdma_xdr::record::marker;
use nfsrdma_xdr::rpc::{flavor, AcceptStat, AuthStat, AuthSysParms, OpaqueAuth, RejectedReply};
use nfsrdma_xdr::{BoundedVec, Decoder, Xdr};
use std::collections::HashSet;
use std::sync::atomic::Ordering;

const EXPORTS: &str = "/export *(rw,no_root_squash,insecure)";

fn getattr_ok(c: &mut RawClient, fh: &NfsFh3) {
    let r = c.nfs(Nfs3Args::Getattr(Getattr3Args { object: fh.clone() }));
    assert_eq!(r.status(), NfsStat3::Ok);
}

#[test]
fn sixty_four_calls_in_flight_on_one_connection() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut c = RawClient::connect(srv.addr);
    let root = c.mount("/export");
    let f = c.create(&root, "f");
    // 64 WRITEs of distinct 4 KiB blocks sent back to back in one write.
    let mut wire = Vec::new();
    let mut xids = HashSet::new();
    for i in 0..64u32 {
        let xid = c.xid();
        xids.insert(xid);
        let mut a = BytesMut::new();
        Write3Args {
            file: f.clone(),
            offset: u64::from(i) * 4096,
            count: 4096,
            stable: StableHow::FileSync,
            data: Data::new(vec![i as u8; 4096]),
        }
        .encode(&mut a);
        let call = c.call_bytes(xid, PROGRAM, 3, NfsProc3::Write as u32, &a);
        wire.extend_from_slice(&marker(call.len() as u32, true));
        wire.extend_from_slice(&call);
    }
    c.send_raw(&wire).unwrap();
    for _ in 0..64 {
        let r = c.recv().unwrap();
        let mut d = Decoder::new(r);
        let h = nfsrdma_xdr::rpc::RpcMessage::decode(&mut d).unwrap();
        assert!(xids.remove(&h.xid), "unexpected or repeated xid {}", h.xid);
        assert_success(&h);
        let res = Nfs3Res::decode(NfsProc3::Write, &mut d).unwrap();
        assert_eq!(res.status(), NfsStat3::Ok);
    }
    assert!(xids.is_empty());
    // Every block landed where it was sent.
    for i in 0..64u32 {
        match c.nfs(Nfs3Args::Read(Read3Args {
            file: f.clone(),
            offset: u64::from(i) * 4096,
            count: 4096,
        })) {
            Nfs3Res::Read(NfsResult::Ok(r)) => assert!(r.data.bytes().all(|b| b == i as u8)),
            r => panic!("{r:?}"),
        }
    }
}

#[test]
fn bad_input_is_answered_or_closes_only_that_connection() {
    let srv = TestServer::start(
        EXPORTS,
        TcpConfig {
            max_record: 256 * 1024,
            ..TcpConfig::default()
        },
    );
    let mut good = RawClient::connect(srv.addr);
    let root = good.mount("/export");
    getattr_ok(&mut good, &root);

    // A 4 GiB record-length claim: the connection is closed at once.
    let mut bad = RawClient::connect(srv.addr);
    bad.send_raw(&[0xff, 0xff, 0xff, 0xff]).unwrap();
    assert!(bad.recv().is_none(), "connection closed");
    getattr_ok(&mut good, &root);

    // A record just over the maximum: closed, before the body is sent.
    let mut bad = RawClient::connect(srv.addr);
    bad.send_raw(&marker(256 * 1024 + 1, true)).unwrap();
    assert!(bad.recv().is_none());
    getattr_ok(&mut good, &root);
    assert_eq!(srv.stats.refused_records.load(Ordering::Relaxed), 2);

    // A truncated record followed by a hang-up: nothing to answer.
    let mut bad = RawClient::connect(srv.addr);
    bad.send_raw(&marker(100, true)).unwrap();
    bad.send_raw(&[0u8; 50]).unwrap();
    bad.s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(bad.recv().is_none());
    getattr_ok(&mut good, &root);

    // A record holding garbage that is not even an RPC header: dropped, and
    // the connection keeps working.
    let mut bad = RawClient::connect(srv.addr);
    bad.send_record(&[1, 2, 3]).unwrap();
    getattr_ok(&mut bad, &root);

    // Garbage after a valid call header: GARBAGE_ARGS.
    let mut a = BytesMut::new();
    Getattr3Args {
        object: root.clone(),
    }
    .encode(&mut a);
    a.extend_from_slice(b"junkjunk");
    let (h, _) = bad.call(PROGRAM, 3, NfsProc3::Getattr as u32, &a);
    assert_eq!(accept_stat(&h), Some(AcceptStat::GarbageArgs));

    // An unknown program (NFSACL): PROG_UNAVAIL; a wrong version:
    // PROG_MISMATCH.
    let (h, _) = bad.call(100_227, 3, 0, &[]);
    assert_eq!(accept_stat(&h), Some(AcceptStat::ProgUnavail));
    let (h, _) = bad.call(PROGRAM, 2, 0, &[]);
    assert_eq!(
        accept_stat(&h),
        Some(AcceptStat::ProgMismatch { low: 3, high: 4 })
    );

    // AUTH_SYS with 17 groups: AUTH_ERROR / AUTH_BADCRED.
    let p = AuthSysParms {
        gids: BoundedVec((0..17).collect()),
        ..Default::default()
    };
    bad.cred = OpaqueAuth {
        flavor: flavor::AUTH_SYS,
        body: nfsrdma_xdr::rpc::AuthBody(p.to_bytes()),
    };
    let (h, _) = bad.call(PROGRAM, 3, NfsProc3::Getattr as u32, &a[..a.len() - 8]);
    assert!(matches!(
        h.as_reply(),
        Some(nfsrdma_xdr::rpc::ReplyBody::Denied(
            RejectedReply::AuthError(AuthStat::BadCred)
        ))
    ));
    getattr_ok(&mut good, &root);
}

#[test]
fn shutdown_finishes_calls_in_flight() {
    let mut srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut c = RawClient::connect(srv.addr);
    let root = c.mount("/export");
    getattr_ok(&mut c, &root);
    // Hold the file system so that the next call, once received, stays in
    // flight until we let go.
    let store = srv.service.exports()[0].store.clone();
    let held = store.write();
    let records = srv.stats.records.load(Ordering::Relaxed);
    let xid = c.xid();
    let mut a = BytesMut::new();
    Getattr3Args {
        object: root.clone(),
    }
    .encode(&mut a);
    let call = c.call_bytes(xid, PROGRAM, 3, NfsProc3::Getattr as u32, &a);
    let mut wire = marker(call.len() as u32, true).to_vec();
    wire.extend_from_slice(&call);
    c.send_raw(&wire).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while srv.stats.records.load(Ordering::Relaxed) == records {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let stats = srv.stats.clone();
    let stopping = std::thread::spawn(move || {
        srv.stop();
        srv
    });
    // The stop waits for the call in flight.
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!stopping.is_finished(), "stopped with a call in flight");
    drop(held);
    // The call in flight gets its reply, then the connection closes.
    let r = c.recv().expect("the reply to the call in flight");
    let mut d = Decoder::new(r);
    let h = nfsrdma_xdr::rpc::RpcMessage::decode(&mut d).unwrap();
    assert_eq!(h.xid, xid);
    assert_success(&h);
    assert_eq!(
        Nfs3Res::decode(NfsProc3::Getattr, &mut d).unwrap().status(),
        NfsStat3::Ok
    );
    assert!(
        c.recv().is_none(),
        "the connection stays open after shutdown"
    );
    let _srv = stopping.join().unwrap();
    assert_eq!(stats.open.load(Ordering::Relaxed), 0);
}
