//! The rogue-responder cases of the Soft-RoCE suite
//! (client/tests/vm_rogue_responder.rs) against the requester side of the
//! connection core on the simulated fabric: a scripted responder answers
//! each call the way the case says.

use nfsrdma_rpcrdma::conn::{Config, ConnError, RemoteSeg, Role};
use nfsrdma_rpcrdma::responder::{self, IncomingCall, Received, ResponderConfig};
use nfsrdma_rpcrdma::sim::endpoint::SimEndpoint;
use nfsrdma_rpcrdma::sim::rogue::RawPeer;
use nfsrdma_rpcrdma::sim::{app::MiniNfs, Pair};
use nfsrdma_xdr::nfs3::{Data, Nfs3Args, Nfs3Res, NfsFh3, NfsResult, Read3Args, Read3ResOk};
use nfsrdma_xdr::rpc::{AcceptStat, RpcMessage};
use nfsrdma_xdr::rpcrdma::{RdmaBody, RdmaError, RdmaHeader};
use nfsrdma_xdr::{Payload, Xdr};

type Rogue = Pair<SimEndpoint<MiniNfs>, RawPeer>;

fn client() -> Config {
    Config {
        credits: 0,
        calls: 8,
        call_reserve: 1,
        accept_remote_invalidation: true,
        send_slots: 8,
        sq_depth: 64,
        inline_send: 4096,
        inline_recv: 4096,
        role: Role::Requester,
        ..Config::default()
    }
}

fn pair() -> Rogue {
    Pair::rogue_responder(client(), 16, 4096)
}

fn run(p: &mut Rogue) {
    assert!(p.drive(&[0, 3], 1_000_000), "did not go quiet");
}

fn read_args() -> Nfs3Args {
    Nfs3Args::Read(Read3Args {
        file: NfsFh3::new(vec![1; 8]),
        offset: 0,
        count: 8192,
    })
}

/// The calls the rogue got, parsed as a responder would.
fn calls(p: &Rogue) -> Vec<IncomingCall> {
    let cfg = ResponderConfig::default();
    p.server
        .received
        .iter()
        .map(|m| match responder::receive(m.clone(), &cfg) {
            Received::Call(c) => c,
            other => panic!("{other:?}"),
        })
        .collect()
}

/// A well-formed reply to a NULL (`data` None) or READ call, with
/// `credits` granted; the READ data is planned into the Write chunk (the
/// rogue RDMA Writes it itself first).
fn reply(p: &mut Rogue, call: &IncomingCall, data: Option<&[u8]>, credits: u32) -> Vec<u8> {
    let cfg = ResponderConfig {
        credits,
        remote_invalidation: true,
        ..ResponderConfig::default()
    };
    let xid = call.xid;
    let res = match data {
        None => Nfs3Res::Null,
        Some(d) => Nfs3Res::Read(NfsResult::Ok(Read3ResOk {
            file_attributes: None,
            count: d.len() as u32,
            eof: true,
            data: Data(Payload::from(d.to_vec())),
        })),
    };
    let plan = responder::plan_reply(call, &cfg, |s| {
        RpcMessage::accepted(xid, AcceptStat::Success).encode(s);
        res.encode(s);
    })
    .expect("a reply that fits");
    for w in &plan.writes {
        p.server.write(
            &mut p.fabric,
            w.data.to_contiguous().to_vec(),
            RemoteSeg {
                rkey: w.rkey,
                addr: w.offset,
                len: w.data.len() as u32,
            },
        );
    }
    let mut m = plan.header.to_vec();
    for part in &plan.inline {
        m.extend_from_slice(part);
    }
    // The credit field as the case wants it, zero included.
    m[8..12].copy_from_slice(&credits.to_be_bytes());
    m
}

fn write_key(call: &IncomingCall) -> RemoteSeg {
    let s = call.write_list[0].segments.0[0];
    RemoteSeg {
        rkey: s.handle,
        addr: s.offset,
        len: s.length,
    }
}

#[test]
fn a_write_to_a_completed_calls_key_fails_with_local_and_with_remote_invalidation() {
    for remote in [false, true] {
        let mut p = pair();
        let x = p.client.call(read_args());
        run(&mut p);
        let call = calls(&p).remove(0);
        let key = write_key(&call);
        let data = vec![0x3cu8; 8192];
        let m = reply(&mut p, &call, Some(&data), 8);
        p.server.send(&mut p.fabric, m, remote.then_some(key.rkey));
        run(&mut p);
        let o = p.client.done.iter().find(|o| o.xid == x).expect("answered");
        let Ok(Nfs3Res::Read(NfsResult::Ok(r))) = &o.result else {
            panic!("{o:?}")
        };
        assert_eq!(r.data.0.to_contiguous().to_vec(), data);
        assert_eq!(
            p.server.writes_done, 1,
            "the Write while the call was out worked"
        );
        let s = p.client.conn.stats();
        assert_eq!(
            (s.remote_invalidations, s.local_invalidations),
            if remote { (1, 0) } else { (0, 1) }
        );
        // Now the call is done: the same Write fails.
        p.server
            .write(&mut p.fabric, vec![0; 16], RemoteSeg { len: 16, ..key });
        run(&mut p);
        // (The key is invalid; the endpoint has also deregistered the
        // call's region, so the fabric no longer knows it.)
        assert_eq!(p.server.failures.len(), 1, "remote {remote}");
        assert!(
            p.server.failures[0].ends_with("R_key"),
            "{:?}",
            p.server.failures
        );
    }
}

#[test]
fn a_reply_to_no_call_is_dropped_and_the_call_completes() {
    let mut p = pair();
    let x = p.client.call(Nfs3Args::Null);
    run(&mut p);
    let call = calls(&p).remove(0);
    let mut stray = call.clone();
    stray.xid ^= 0x5555;
    let m = reply(&mut p, &stray, None, 8);
    p.server.send(&mut p.fabric, m, None);
    let m = reply(&mut p, &call, None, 8);
    p.server.send(&mut p.fabric, m, None);
    run(&mut p);
    assert_eq!(p.client.conn.stats().unmatched_replies, 1);
    let o = p.client.done.iter().find(|o| o.xid == x).expect("answered");
    assert_eq!(o.result, Ok(Nfs3Res::Null));
    assert!(p.client.closed.is_none());
}

#[test]
fn zero_credits_mean_one_call_at_a_time() {
    let mut p = pair();
    for _ in 0..6 {
        p.client.call(Nfs3Args::Null);
    }
    for answered in 0..6 {
        run(&mut p);
        let got = calls(&p);
        assert_eq!(
            got.len(),
            answered + 1,
            "a second call while one was unanswered"
        );
        let m = reply(&mut p, &got[answered], None, 0);
        p.server.send(&mut p.fabric, m, None);
    }
    run(&mut p);
    assert_eq!(p.client.done.iter().filter(|o| o.result.is_ok()).count(), 6);
    assert_eq!(p.client.peak_calls, 1);
}

#[test]
fn send_with_invalidate_of_another_calls_key_drops_the_connection() {
    let mut p = pair();
    p.client.call(read_args());
    p.client.call(read_args());
    // The first reply grants room for the second call.
    run(&mut p);
    let first = calls(&p).remove(0);
    let m = reply(&mut p, &first, Some(&[1; 8192]), 8);
    p.server
        .send(&mut p.fabric, m, Some(write_key(&first).rkey));
    run(&mut p);
    let second = calls(&p).remove(1);
    p.client.call(read_args());
    run(&mut p);
    let third = calls(&p).remove(2);
    // The reply to the second call invalidates the third's key.
    let m = reply(&mut p, &second, Some(&[2; 8192]), 8);
    p.server
        .send(&mut p.fabric, m, Some(write_key(&third).rkey));
    run(&mut p);
    let Some(ConnError::Protocol(why)) = &p.client.closed else {
        panic!("{:?}", p.client.closed)
    };
    assert!(why.contains("not one of call"), "{why}");
    // Both outstanding calls ended with the connection, each once.
    let lost = p.client.done.iter().filter(|o| o.result.is_err()).count();
    assert_eq!(lost, 2, "{:?}", p.client.done);
}

#[test]
fn a_reply_header_of_another_version_fails_the_call() {
    let mut p = pair();
    let x = p.client.call(Nfs3Args::Null);
    run(&mut p);
    let call = calls(&p).remove(0);
    let mut m = reply(&mut p, &call, None, 8);
    m[4..8].copy_from_slice(&2u32.to_be_bytes());
    p.server.send(&mut p.fabric, m, None);
    run(&mut p);
    let o = p.client.done.iter().find(|o| o.xid == x).expect("ended");
    // The call itself fails (it is not to be sent again, as a call whose
    // connection was merely lost is), and the connection ends.
    let e = o.result.as_ref().expect_err("the call fails");
    assert!(e.starts_with("bad reply header"), "{e}");
    assert!(matches!(p.client.closed, Some(ConnError::Protocol(_))));
}

#[test]
fn rdma_error_as_the_reply_fails_the_call() {
    let mut p = pair();
    let x = p.client.call(Nfs3Args::Null);
    run(&mut p);
    let call = calls(&p).remove(0);
    let m = RdmaHeader {
        xid: call.xid,
        vers: 1,
        credit: 8,
        body: RdmaBody::Error(RdmaError::Vers { low: 1, high: 1 }),
    }
    .to_bytes()
    .to_vec();
    p.server.send(&mut p.fabric, m, None);
    run(&mut p);
    let o = p.client.done.iter().find(|o| o.xid == x).expect("ended");
    let e = o.result.as_ref().expect_err("the call fails");
    assert!(e.contains("RDMA_ERROR"), "{e}");
    assert!(
        p.client.closed.is_none(),
        "an RDMA_ERROR is an answer, not a fault"
    );
}
