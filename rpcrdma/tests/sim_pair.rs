//! A requester and the responder connection core on the simulated fabric,
//! run through random schedules: every call is answered exactly once or
//! its connection is dropped, nothing leaks, no memory is reached after
//! its call was done, and the responder's memory stays within its bound.

use nfsrdma_rpcrdma::conn::Config;
use nfsrdma_rpcrdma::sim::requester::{Outcome, RequesterOptions};
use nfsrdma_rpcrdma::sim::Pair;
use nfsrdma_xdr::nfs3::{
    Data, Nfs3Args, Nfs3Res, NfsFh3, NfsResult, Read3Args, Readdir3Args, StableHow, Write3Args,
};
use nfsrdma_xdr::Payload;
use proptest::prelude::*;
use std::collections::HashMap;

fn fh(n: u32) -> NfsFh3 {
    NfsFh3::new(n.to_be_bytes().repeat(4))
}

/// Bytes of file `n` (a pattern that tells files and offsets apart).
fn content(n: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(n * 7) as u8)
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

fn readdir() -> Nfs3Args {
    Nfs3Args::Readdir(Readdir3Args {
        dir: fh(0),
        cookie: 0,
        cookieverf: [0; 8],
        count: 32 * 1024,
    })
}

/// Sizes that take every path: inline, a Read chunk, a Write chunk, and
/// (with a small inline threshold) long calls.
const SIZES: &[usize] = &[0, 1, 100, 1000, 3000, 4096, 5000, 40_000, 65_536, 200_000];

fn outcome_of(out: &[Outcome], xid: u32) -> Vec<&Outcome> {
    out.iter().filter(|o| o.xid == xid).collect()
}

/// After the run: each call ended once; no key was used after its call
/// was delivered; the responder holds nothing.
fn check_invariants(p: &Pair, xids: &[u32]) {
    for &x in xids {
        let o = outcome_of(&p.client.done, x);
        assert_eq!(o.len(), 1, "call {x:#x} ended {} times", o.len());
    }
    for o in &p.client.done {
        for a in p.fabric.accesses() {
            if o.keys.contains(&a.rkey) {
                assert!(
                    a.step <= o.step,
                    "key {:#x} of call {:#x} used at step {} after the call ended at {}",
                    a.rkey,
                    o.xid,
                    a.step,
                    o.step
                );
            }
        }
    }
    let bound = p.server.conn.config().memory_bound();
    assert!(
        p.server.peak_bytes <= bound,
        "responder held {} bytes, bound {bound}",
        p.server.peak_bytes
    );
    assert!(p.server.peak_held <= p.server.conn.config().credits);
    for (xid, runs) in &p.server.app.runs {
        assert_eq!(*runs, 1, "call {xid:#x} ran {runs} times");
    }
}

fn config(
    credits: u32,
    sq: u32,
    reads: u32,
    chunks: u32,
    every: u32,
    sge: u32,
    inline: u32,
) -> Config {
    Config {
        credits,
        send_slots: credits,
        sq_depth: sq,
        read_depth: reads,
        chunk_slots: chunks,
        max_sge: sge,
        signal_every: every,
        inline_send: inline,
        inline_recv: inline,
        remote_invalidation: true,
        ..Config::default()
    }
}

fn opts(inline: u32) -> RequesterOptions {
    RequesterOptions {
        receives: 16,
        inline,
        peer_inline: inline,
        ..RequesterOptions::default()
    }
}

/// Writes files, then reads them back and lists the directory, with
/// `choices` as the schedule; returns the pair after it went quiet.
fn run_workload(cfg: Config, inline: u32, sizes: &[usize], choices: &[u32]) -> Pair {
    let mut p = Pair::new(cfg, opts(inline), 1_000_000);
    let mut xids = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        xids.push(p.client.call(write(i as u32 + 1, n)));
    }
    assert!(p.drive(choices, 1_000_000), "did not go quiet");
    let mut reads = HashMap::new();
    for (i, &n) in sizes.iter().enumerate() {
        let x = p.client.call(read(i as u32 + 1, n));
        reads.insert(x, (i as u32 + 1, n));
        xids.push(x);
    }
    let dir = p.client.call(readdir());
    xids.push(dir);
    assert!(p.drive(choices, 1_000_000), "did not go quiet");
    check_invariants(&p, &xids);
    assert!(p.client.broken.is_none(), "{:?}", p.client.broken);
    assert!(p.server.closed.is_none(), "{:?}", p.server.closed);
    for o in &p.client.done {
        let res = o
            .result
            .as_ref()
            .unwrap_or_else(|e| panic!("{:#x}: {e}", o.xid));
        if let Some(&(n, len)) = reads.get(&o.xid) {
            let Nfs3Res::Read(NfsResult::Ok(r)) = res else {
                panic!("{res:?}")
            };
            assert_eq!(r.data.0.to_contiguous().to_vec(), content(n, len));
        } else if o.xid == dir {
            let Nfs3Res::Readdir(NfsResult::Ok(r)) = res else {
                panic!("{res:?}")
            };
            assert_eq!(r.reply.entries.0.len(), 300);
        } else {
            assert!(matches!(res, Nfs3Res::Write(NfsResult::Ok(_))), "{res:?}");
        }
    }
    assert!(p.server.conn.is_idle(), "{:?}", p.server.conn.footprint());
    p
}

#[test]
fn every_call_kind_round_trips_with_the_default_settings() {
    let p = run_workload(config(8, 64, 4, 2, 1, 16, 4096), 4096, SIZES, &[0]);
    let s = p.server.conn.stats();
    assert!(s.chunked_calls > 0 && s.inline_calls > 0, "{s:?}");
    assert!(
        s.reply_chunk_replies > 0,
        "the READDIR goes by Reply chunk: {s:?}"
    );
    assert!(s.sends_with_inv > 0, "{s:?}");
    assert_eq!(s.err_chunk + s.err_vers + s.discarded, 0, "{s:?}");
}

#[test]
fn calls_that_do_not_fit_inline_travel_in_position_zero_chunks() {
    // A requester that sends at most 64 bytes inline (less than the 1 KiB
    // it may) sends every call, WRITEs included, as a long call.
    let mut o = opts(1024);
    o.peer_inline = 64;
    let mut p = Pair::new(config(4, 32, 2, 1, 2, 2, 1024), o, 1_000_000);
    let w = p.client.call(write(1, 3000));
    let r = p.client.call(read(1, 3000));
    assert!(p.drive(&[3, 1], 1_000_000));
    check_invariants(&p, &[w, r]);
    let s = p.server.conn.stats();
    assert_eq!(s.chunked_calls, 2, "{s:?}");
    assert_eq!(s.inline_calls, 0, "{s:?}");
    let back = &outcome_of(&p.client.done, r)[0].result;
    let Ok(Nfs3Res::Read(NfsResult::Ok(res))) = back else {
        panic!("{back:?}")
    };
    assert_eq!(res.data.0.to_contiguous().to_vec(), content(1, 3000));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_schedules_and_settings_answer_every_call_once(
        credits in 1u32..6,
        sq in 4u32..40,
        reads in 1u32..5,
        chunks in 1u32..3,
        every in 1u32..5,
        sge in 1u32..4,
        small_inline in any::<bool>(),
        sizes in proptest::collection::vec(proptest::sample::select(SIZES), 1..8),
        choices in proptest::collection::vec(any::<u32>(), 1..64),
    ) {
        let inline = if small_inline { 1024 } else { 4096 };
        run_workload(config(credits, sq, reads, chunks, every, sge, inline), inline, &sizes, &choices);
    }

    #[test]
    fn a_disconnect_at_any_step_ends_every_call_once(
        at in 0u64..400,
        sizes in proptest::collection::vec(proptest::sample::select(SIZES), 1..8),
        choices in proptest::collection::vec(any::<u32>(), 1..32),
    ) {
        let mut p = Pair::new(config(4, 16, 2, 2, 2, 2, 4096), opts(4096), 1000);
        let mut xids = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            xids.push(p.client.call(write(i as u32 + 1, n)));
            xids.push(p.client.call(read(i as u32 + 1, n)));
        }
        p.drive(&choices, at);
        p.fabric.disconnect();
        prop_assert!(p.drive(&choices, 1_000_000));
        // Calls that never went out are still queued; the rest ended once.
        let sent: Vec<u32> = xids
            .iter()
            .copied()
            .filter(|x| !outcome_of(&p.client.done, *x).is_empty())
            .collect();
        prop_assert_eq!(sent.len() + p.client.outstanding(), xids.len());
        check_invariants(&p, &sent);
        prop_assert!(p.server.closed.is_some() || p.server.conn.is_idle());
    }
}
