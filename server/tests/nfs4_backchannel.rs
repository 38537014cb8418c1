//! The NFSv4.1 backchannel over TCP (RFC 8881 §2.10.3.1, §18.34): the
//! server grants it on the connection that asks at CREATE_SESSION, probes
//! it with CB_NULL, reports it down in SEQUENCE's flags when the client
//! does not answer or its connection ended, and takes another connection
//! for it with BIND_CONN_TO_SESSION.

mod common;

use common::nfs4::*;
use common::*;
use nfsrdma_server::service::nfs4::callback::Path;
use nfsrdma_server::service::nfs4::Nfs4Config;
use nfsrdma_server::service::ServiceConfig;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::rpc::split_message;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const EXPORTS: &str = "/export *(rw,no_root_squash,insecure)";
const DOWN: u32 = seq_status::CB_PATH_DOWN_SESSION | seq_status::CB_PATH_DOWN;

/// A server whose calls to clients wait a second for their reply (a lease
/// of 10 s).
fn server() -> TestServer {
    TestServer::with_config(
        EXPORTS,
        TcpConfig::default(),
        ServiceConfig {
            nfs4: Nfs4Config {
                lease: Duration::from_secs(10),
                ..Nfs4Config::default()
            },
            ..ServiceConfig::default()
        },
    )
}

/// SEQUENCE alone: its status flags.
fn flags(v: &mut V4) -> u32 {
    let s = v.seq_op(0, false);
    let r = compound(&mut v.c, 1, "", vec![s]);
    match &r.results[0] {
        ResOp::Sequence(Ok(s)) => s.status_flags,
        other => panic!("{other:?}"),
    }
}

/// SEQUENCE until its flags are `want` (the server learns of an answer, a
/// timeout or a closed connection on its own threads): the flags seen
/// last.
fn flags_until(v: &mut V4, want: u32) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let f = flags(v);
        if f == want || Instant::now() > deadline {
            return f;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the server has seen the session's probe answered.
fn wait_up(srv: &TestServer, v: &V4) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.service.nfs4().state.back_path(&v.sid) != Some(Path::Up) {
        assert!(Instant::now() < deadline, "the probe's answer was not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn bind(v: &mut V4, dir: u32) -> Result<BindConnResOk, Status> {
    let r = compound(
        &mut v.c,
        1,
        "",
        vec![ArgOp::BindConnToSession(BindConnArgs {
            sessid: v.sid,
            dir,
            use_conn_in_rdma_mode: false,
        })],
    );
    match &r.results[0] {
        ResOp::BindConnToSession(b) => b.clone(),
        other => panic!("{other:?}"),
    }
}

/// Asserts a call of the server's is CB_NULL to the session's callback
/// program.
fn assert_cb_null(call: Option<bytes::Bytes>) {
    let call = call.expect("a call from the server");
    let (h, d) = split_message(call).unwrap();
    let b = h.as_call().expect("a call");
    assert_eq!((b.prog, b.vers, b.proc_), (0x4000_0000, 1, 0));
    assert_eq!(d.remaining(), 0, "CB_NULL has no arguments");
}

/// A session made by hand, the client not answering calls yet.
fn session_not_answering(addr: std::net::SocketAddr, owner: &'static str) -> V4 {
    let mut c = RawClient::connect(addr);
    c.answer_calls = false;
    let r = compound(&mut c, 1, "", vec![exchange_id(owner, 1)]);
    let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
        panic!("{r:?}")
    };
    let (clientid, seq) = (e.clientid, e.sequenceid);
    let r = compound(&mut c, 1, "", vec![create_session_back(clientid, seq)]);
    let ResOp::CreateSession(Ok(s)) = &r.results[0] else {
        panic!("{r:?}")
    };
    assert_ne!(s.flags & session_flags::CONN_BACK_CHAN, 0);
    V4 {
        c,
        clientid,
        sid: s.sessionid,
        seq: vec![0; 8],
        owner,
    }
}

#[test]
fn a_backchannel_that_does_not_answer_its_probe_is_reported_down_until_a_bound_one_does() {
    let srv = server();
    let cb = &srv.service.nfs4().callbacks;
    let mut v = session_not_answering(srv.addr, "silent");
    // CB_NULL comes on the session's connection; left unanswered, the
    // server gives up after its timeout and SEQUENCE says the path is down.
    assert_cb_null(v.c.next_call(Duration::from_secs(10)));
    assert_eq!(flags_until(&mut v, DOWN), DOWN);
    assert_eq!(cb.stats().failed.load(Ordering::Relaxed), 1);
    // The client binds its connection to the backchannel again, and now
    // answers: the server probes again and the flags clear.
    v.c.answer_calls = true;
    let b = bind(&mut v, 7).expect("BIND_CONN_TO_SESSION back or both");
    assert_eq!(b.dir, 3, "bound to both channels");
    assert_cb_null(v.c.next_call(Duration::from_secs(10)));
    wait_up(&srv, &v);
    assert_eq!(flags(&mut v), 0);
    let s = cb.stats();
    assert_eq!(
        (
            s.sent.load(Ordering::Relaxed),
            s.answered.load(Ordering::Relaxed),
            s.failed.load(Ordering::Relaxed)
        ),
        (2, 1, 1)
    );
    assert!(
        srv.service
            .report()
            .contains("nfs4 backchannel: calls sent 2, answered 1, failed 1; over RDMA sent 0, answered 0, failed 0\n"),
        "{}",
        srv.service.report()
    );
    assert_metrics(
        &srv.service,
        &[
            "nfsrdmad_nfs4_callbacks_sent_total 2",
            "nfsrdmad_nfs4_callbacks_answered_total 1",
            "nfsrdmad_nfs4_callbacks_failed_total 1",
            "nfsrdmad_nfs4_callbacks_over_rdma_sent_total 0",
            "nfsrdmad_nfs4_callback_panics_total 0",
        ],
    );
}

#[test]
fn a_session_whose_backchannel_connection_ended_reports_it_until_another_is_bound() {
    let srv = server();
    // The probe on connection A is answered (V4::with_back waits for it).
    let mut v = V4::with_back(srv.addr, "moving");
    let a = std::mem::replace(&mut v.c, RawClient::connect(srv.addr));
    // On connection B, the fore channel is bound by SEQUENCE alone; the
    // backchannel is still A, which is up.
    assert_eq!(flags(&mut v), 0);
    // A goes: the session has no backchannel connection left.
    drop(a);
    assert_eq!(flags_until(&mut v, DOWN), DOWN);
    // B is bound to both channels, probed, and the path is up again.
    let b = bind(&mut v, 3).expect("BIND_CONN_TO_SESSION fore or both");
    assert_eq!(b.dir, 3);
    assert_cb_null(v.c.next_call(Duration::from_secs(10)));
    wait_up(&srv, &v);
    assert_eq!(flags(&mut v), 0);
    // Calls go on as before on B.
    let r = v.run(vec![ArgOp::Putrootfh, ArgOp::Getfh]);
    assert_eq!(r.status, Status::OK);
}

#[test]
fn a_session_created_without_a_backchannel_gets_none_and_reports_none_down() {
    let srv = server();
    let mut c = RawClient::connect(srv.addr);
    let r = compound(&mut c, 1, "", vec![exchange_id("fore only", 1)]);
    let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
        panic!("{r:?}")
    };
    let args = match create_session(e.clientid, e.sequenceid) {
        ArgOp::CreateSession(a) => a,
        _ => unreachable!(),
    };
    assert_eq!(args.flags, 0);
    let r = compound(&mut c, 1, "", vec![ArgOp::CreateSession(args)]);
    let ResOp::CreateSession(Ok(s)) = &r.results[0] else {
        panic!("{r:?}")
    };
    assert_eq!(s.flags & session_flags::CONN_BACK_CHAN, 0);
    let mut v = V4 {
        c,
        clientid: e.clientid,
        sid: s.sessionid,
        seq: vec![0; 8],
        owner: "fore only",
    };
    // No probe, no flags; the backchannel alone cannot be bound (there is
    // no callback program), fore-or-both binds the fore channel.
    assert!(v.c.next_call(Duration::from_millis(1500)).is_none());
    assert_eq!(flags(&mut v), 0);
    assert_eq!(bind(&mut v, 2).unwrap_err(), Status::INVAL);
    assert_eq!(bind(&mut v, 3).unwrap().dir, 1);
    // A client offering only RPCSEC_GSS for calls back gets no
    // backchannel either: the server cannot send with it.
    let mut c = RawClient::connect(srv.addr);
    let r = compound(&mut c, 1, "", vec![exchange_id("gss only", 1)]);
    let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
        panic!("{r:?}")
    };
    let mut args = match create_session_back(e.clientid, e.sequenceid) {
        ArgOp::CreateSession(a) => a,
        _ => unreachable!(),
    };
    args.sec_parms = nfsrdma_xdr::BoundedVec(vec![CallbackSecParms::Gss(GssCbHandles::default())]);
    let r = compound(&mut c, 1, "", vec![ArgOp::CreateSession(args)]);
    let ResOp::CreateSession(Ok(s)) = &r.results[0] else {
        panic!("{r:?}")
    };
    assert_eq!(s.flags & session_flags::CONN_BACK_CHAN, 0);
    assert_eq!(
        srv.service
            .nfs4()
            .callbacks
            .stats()
            .sent
            .load(Ordering::Relaxed),
        0
    );
}
