//! Two connection cores on the simulated fabric: the requester side's
//! credit limit, XID matching, Send With Invalidate checks and local
//! invalidation against the responder side, and calls in both directions
//! on one connection (RFC 8167), through random schedules.

use nfsrdma_rpcrdma::conn::{Config, Role};
use nfsrdma_rpcrdma::sim::endpoint::SimEndpoint;
use nfsrdma_rpcrdma::sim::requester::Outcome;
use nfsrdma_rpcrdma::sim::{app::MiniNfs, Pair};
use nfsrdma_xdr::nfs3::{
    Data, Nfs3Args, Nfs3Res, NfsFh3, NfsResult, Read3Args, Readdir3Args, StableHow, Write3Args,
};
use nfsrdma_xdr::Payload;
use proptest::prelude::*;
use std::collections::HashMap;

type Cores = Pair<SimEndpoint<MiniNfs>>;

fn fh(n: u32) -> NfsFh3 {
    NfsFh3::new(n.to_be_bytes().repeat(4))
}

fn content(n: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(13).wrapping_add(n * 5) as u8)
        .collect()
}

fn write(n: u32, len: usize) -> Nfs3Args {
    Nfs3Args::Write(Write3Args {
        file: fh(n),
        offset: 0,
        count: len as u32,
        stable: StableHow::FileSync,
        data: Data(Payload::from(content(n, len))),
    })
}

fn read(n: u32, len: usize) -> Nfs3Args {
    Nfs3Args::Read(Read3Args {
        file: fh(n),
        offset: 0,
        count: len as u32,
    })
}

const SIZES: &[usize] = &[0, 7, 1000, 4096, 5000, 40_000, 65_536, 200_000];

/// The responder side (B), answering forward calls, and sending
/// `backward` calls of its own.
fn server(credits: u32, backward: u32, sq: u32, every: u32, inline: u32) -> Config {
    Config {
        credits,
        send_slots: credits + backward,
        calls: backward,
        call_reserve: 0,
        sq_depth: sq,
        read_depth: 2,
        chunk_slots: 2,
        signal_every: every,
        inline_send: inline,
        inline_recv: inline,
        remote_invalidation: true,
        role: Role::Responder,
        ..Config::default()
    }
}

/// The requester side (A), with `slots` for forward calls and
/// `backchannel` credits for the peer's backward calls.
fn client(slots: u32, backchannel: u32, sq: u32, inline: u32) -> Config {
    Config {
        credits: backchannel,
        send_slots: slots + backchannel,
        calls: slots,
        call_reserve: 1,
        accept_remote_invalidation: true,
        sq_depth: sq,
        read_depth: 2,
        chunk_slots: 1,
        inline_send: inline,
        inline_recv: inline,
        role: Role::Requester,
        ..Config::default()
    }
}

fn ended_once(done: &[Outcome], xid: u32) -> &Outcome {
    let o: Vec<&Outcome> = done.iter().filter(|o| o.xid == xid).collect();
    assert_eq!(o.len(), 1, "call {xid:#x} ended {} times", o.len());
    o[0]
}

/// No key of a call was used after the call ended.
fn no_late_access(p: &Cores, done: &[Outcome]) {
    for o in done {
        for a in p.fabric.accesses() {
            if o.keys.contains(&a.rkey) {
                assert!(
                    a.step <= o.step,
                    "key {:#x} of call {:#x} used at step {} after it ended at {}",
                    a.rkey,
                    o.xid,
                    a.step,
                    o.step
                );
            }
        }
    }
}

fn run_forward(p: &mut Cores, sizes: &[usize], choices: &[u32]) {
    let mut writes = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        writes.push(p.client.call(write(i as u32 + 1, n)));
    }
    assert!(p.drive(choices, 1_000_000), "did not go quiet");
    let mut reads = HashMap::new();
    for (i, &n) in sizes.iter().enumerate() {
        reads.insert(p.client.call(read(i as u32 + 1, n)), (i as u32 + 1, n));
    }
    let dir = p.client.call(Nfs3Args::Readdir(Readdir3Args {
        dir: fh(0),
        cookie: 0,
        cookieverf: [0; 8],
        count: 32 * 1024,
    }));
    assert!(p.drive(choices, 1_000_000), "did not go quiet");
    for x in &writes {
        let o = ended_once(&p.client.done, *x);
        assert!(
            matches!(o.result, Ok(Nfs3Res::Write(NfsResult::Ok(_)))),
            "{o:?}"
        );
    }
    for (x, (n, len)) in &reads {
        let o = ended_once(&p.client.done, *x);
        let Ok(Nfs3Res::Read(NfsResult::Ok(r))) = &o.result else {
            panic!("{o:?}")
        };
        assert_eq!(r.data.0.to_contiguous().to_vec(), content(*n, *len));
    }
    let o = ended_once(&p.client.done, dir);
    assert!(
        matches!(o.result, Ok(Nfs3Res::Readdir(NfsResult::Ok(_)))),
        "{o:?}"
    );
    no_late_access(p, &p.client.done);
}

#[test]
fn a_core_requester_and_a_core_responder_move_every_kind_of_call() {
    let mut p = Pair::cores(server(8, 0, 64, 1, 4096), client(8, 0, 64, 4096), 1_000_000);
    run_forward(&mut p, SIZES, &[0]);
    let c = p.client.conn.stats();
    let s = p.server.conn.stats();
    // Each call here exposes one key, which the responder invalidates
    // with its Send.
    assert!(c.remote_invalidations > 0, "{c:?}");
    assert_eq!(c.local_invalidations, 0, "{c:?}");
    assert_eq!(s.sends_with_inv, c.remote_invalidations);
    assert_eq!(c.unmatched_replies, 0);
    assert_eq!(c.calls_sent, s.calls);
    // The grant (8) minus the reserve (1) bounds the calls in flight.
    assert!(
        p.client.peak_calls <= 7,
        "{} in flight",
        p.client.peak_calls
    );
    assert!(p.client.conn.is_idle() && p.server.conn.is_idle());
}

#[test]
fn without_remote_invalidation_every_key_is_invalidated_locally() {
    let mut srv = server(8, 0, 64, 1, 4096);
    srv.remote_invalidation = false;
    let mut p = Pair::cores(srv, client(8, 0, 64, 4096), 1_000_000);
    run_forward(&mut p, SIZES, &[2, 0]);
    let c = p.client.conn.stats();
    assert_eq!(c.remote_invalidations, 0, "{c:?}");
    assert!(c.local_invalidations > 0, "{c:?}");
}

#[test]
fn one_credit_means_one_call_at_a_time() {
    let mut p = Pair::cores(server(1, 0, 16, 1, 4096), client(8, 0, 16, 4096), 1_000_000);
    run_forward(&mut p, &[100, 5000, 100, 70_000], &[1, 2]);
    assert_eq!(p.client.peak_calls, 1);
}

#[test]
fn calls_go_both_ways_on_one_connection() {
    // The server sends backward calls (inline NULLs and small WRITEs) to
    // the client's backchannel while the client's forward calls run.
    let mut p = Pair::cores(server(8, 2, 64, 2, 4096), client(8, 4, 64, 4096), 1_000_000);
    let mut back = Vec::new();
    for i in 0..6 {
        back.push(p.server.call(Nfs3Args::Null));
        back.push(p.server.call(write(100 + i, 200)));
    }
    run_forward(&mut p, &[10, 5000, 70_000], &[0, 5, 2]);
    assert!(p.drive(&[0], 1_000_000));
    for x in &back {
        let o = ended_once(&p.server.done, *x);
        assert!(o.result.is_ok(), "{o:?}");
    }
    assert!(
        p.server.peak_calls <= 2,
        "backward slots: {}",
        p.server.peak_calls
    );
    assert_eq!(
        p.client.app.files[&fh(103).as_bytes().to_vec()],
        content(103, 200),
        "the backward WRITE reached the client's service"
    );
    let (c, s) = (p.client.conn.stats(), p.server.conn.stats());
    assert_eq!(
        c.calls,
        back.len() as u64,
        "the client answered every backward call: {c:?}"
    );
    assert_eq!(s.calls_sent, back.len() as u64);
    assert!(p.client.conn.is_idle() && p.server.conn.is_idle());
    assert!(p.client.closed.is_none() && p.server.closed.is_none());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_schedules_both_ways(
        credits in 1u32..5,
        backward in 0u32..3,
        backchannel in 1u32..4,
        slots in 1u32..6,
        sq in 8u32..40,
        every in 1u32..4,
        small in any::<bool>(),
        sizes in proptest::collection::vec(proptest::sample::select(SIZES), 1..5),
        nback in 0usize..6,
        choices in proptest::collection::vec(any::<u32>(), 1..48),
    ) {
        let inline = if small { 1024 } else { 4096 };
        let mut p = Pair::cores(
            server(credits, backward, sq, every, inline),
            client(slots, if backward > 0 { backchannel } else { 0 }, sq, inline),
            1_000_000,
        );
        let back: Vec<u32> = if backward > 0 {
            (0..nback).map(|i| p.server.call(if i % 2 == 0 { Nfs3Args::Null } else { write(200 + i as u32, 64) })).collect()
        } else {
            Vec::new()
        };
        run_forward(&mut p, &sizes, &choices);
        prop_assert!(p.drive(&choices, 1_000_000));
        for x in &back {
            let o = ended_once(&p.server.done, *x);
            prop_assert!(o.result.is_ok(), "{:?}", o);
        }
        for e in [&p.server, &p.client] {
            let cfg = e.conn.config();
            prop_assert!(e.peak_bytes <= cfg.memory_bound());
            prop_assert!(e.conn.is_idle(), "{:?}", e.conn.footprint());
        }
    }

    #[test]
    fn a_disconnect_ends_every_call_once_on_both_sides(
        at in 0u64..300,
        choices in proptest::collection::vec(any::<u32>(), 1..32),
    ) {
        let mut p = Pair::cores(server(4, 2, 32, 2, 4096), client(4, 2, 32, 4096), 1_000);
        let mut fwd = Vec::new();
        let mut back = Vec::new();
        for (i, &n) in SIZES.iter().enumerate() {
            fwd.push(p.client.call(write(i as u32 + 1, n)));
            back.push(p.server.call(Nfs3Args::Null));
        }
        p.drive(&choices, at);
        p.fabric.disconnect();
        prop_assert!(p.drive(&choices, 1_000_000));
        let (pc, ps) = (p.client.outstanding(), p.server.outstanding());
        let ended_c = fwd.iter().filter(|x| p.client.done.iter().any(|o| o.xid == **x)).count();
        let ended_s = back.iter().filter(|x| p.server.done.iter().any(|o| o.xid == **x)).count();
        prop_assert_eq!(ended_c + pc, fwd.len());
        prop_assert_eq!(ended_s + ps, back.len());
        for x in fwd.iter().chain(&back) {
            let n = p.client.done.iter().chain(&p.server.done).filter(|o| o.xid == *x).count();
            prop_assert!(n <= 1, "call {:#x} ended {} times", x, n);
        }
        no_late_access(&p, &p.client.done);
        no_late_access(&p, &p.server.done);
    }
}
