//! Random NFSv4.2 COMPOUNDs against the service over TCP: whatever the
//! operations and their arguments, each COMPOUND gets a well-formed reply
//! (one result per operation up to the first failure, the COMPOUND's
//! status that of its last result) and the server goes on serving. The
//! operations come from the wire types' generators, with most filehandles
//! and stateids swapped for ones the server gave out, so that they reach
//! the operations' code and not only the handle checks.

mod common;

use bytes::Bytes;
use common::nfs4::*;
use common::*;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs3::Data;
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::Payload;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

/// Handles and stateids the server gave out.
struct Known {
    fhs: Vec<Fh4>,
    sids: Vec<Stateid4>,
}

impl Known {
    fn fh(&self, pick: usize) -> Fh4 {
        self.fhs[pick % self.fhs.len()].clone()
    }

    /// A stateid the server gave out, a special one, or `other` as drawn.
    fn sid(&self, pick: usize, other: Stateid4) -> Stateid4 {
        match pick % 8 {
            0 => other,
            1 => Stateid4::ANONYMOUS,
            2 => Stateid4::CURRENT,
            n => self.sids[n % self.sids.len()],
        }
    }

    fn fix(&self, op: ArgOp, pick: usize) -> ArgOp {
        let s = |x: Stateid4| self.sid(pick, x);
        // Offsets and lengths spread over every scale up to 16 MiB, so that
        // ranges within one block, across blocks and past the end all come.
        let small = |x: u64| x % (1u64 << (pick % 24 + 1));
        match op {
            ArgOp::Putfh(_) if !pick.is_multiple_of(5) => ArgOp::Putfh(self.fh(pick / 5)),
            ArgOp::Read(a) => ArgOp::Read(ReadArgs {
                stateid: s(a.stateid),
                // Mostly within the files.
                offset: small(a.offset),
                ..a
            }),
            ArgOp::Write(a) => ArgOp::Write(WriteArgs {
                stateid: s(a.stateid),
                offset: small(a.offset),
                ..a
            }),
            ArgOp::Close(a) => ArgOp::Close(CloseArgs {
                open_stateid: s(a.open_stateid),
                ..a
            }),
            ArgOp::OpenDowngrade(a) => ArgOp::OpenDowngrade(OpenDowngradeArgs {
                open_stateid: s(a.open_stateid),
                ..a
            }),
            ArgOp::Lock(mut a) => {
                match &mut a.locker {
                    Locker4::New(o) => o.open_stateid = s(o.open_stateid),
                    Locker4::Existing(e) => e.lock_stateid = s(e.lock_stateid),
                }
                ArgOp::Lock(a)
            }
            ArgOp::Locku(a) => ArgOp::Locku(LockuArgs {
                lock_stateid: s(a.lock_stateid),
                ..a
            }),
            ArgOp::Setattr(a) => ArgOp::Setattr(SetattrArgs {
                stateid: s(a.stateid),
                ..a
            }),
            ArgOp::Allocate(a) => ArgOp::Allocate(SpaceArgs {
                stateid: s(a.stateid),
                offset: small(a.offset),
                length: small(a.length),
            }),
            ArgOp::Deallocate(a) => ArgOp::Deallocate(SpaceArgs {
                stateid: s(a.stateid),
                offset: small(a.offset),
                length: small(a.length),
            }),
            ArgOp::Seek(a) => ArgOp::Seek(SeekArgs {
                stateid: s(a.stateid),
                offset: small(a.offset),
                ..a
            }),
            ArgOp::Copy(a) => ArgOp::Copy(CopyArgs {
                src_stateid: s(a.src_stateid),
                dst_stateid: self.sid(pick / 8, a.dst_stateid),
                src_offset: small(a.src_offset),
                dst_offset: small(a.dst_offset),
                count: small(a.count),
                ..a
            }),
            ArgOp::FreeStateid(x) => ArgOp::FreeStateid(s(x)),
            op => op,
        }
    }
}

#[test]
fn random_compounds_get_well_formed_replies_and_the_server_keeps_serving() {
    let srv = TestServer::start(
        "/export *(rw,no_root_squash,insecure)",
        TcpConfig::default(),
    );
    let v = std::cell::RefCell::new(V4::new(srv.addr, "random"));
    let (s1, f1) = v.borrow_mut().open("one", true);
    let (s2, f2) = v.borrow_mut().open("two", true);
    let r = v.borrow_mut().run(vec![
        ArgOp::Putfh(f1.clone()),
        ArgOp::Write(WriteArgs {
            stateid: s1,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from(vec![1u8; 200_000])])),
        }),
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Getfh,
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Getfh(Ok(dir)) = &r.results[5] else {
        panic!("{r:?}")
    };
    let known = Known {
        fhs: vec![f1, f2, dir.clone()],
        sids: vec![s1, s2],
    };
    // Each COMPOUND starts at one of the known handles.
    let ops = (
        any::<usize>(),
        proptest::collection::vec((any::<ArgOp>(), any::<usize>()), 1..8),
    );
    let mut runner = TestRunner::new(Config {
        cases: 1000,
        failure_persistence: None,
        // A failing case is reported as drawn: after a server panic every
        // later call fails too, and shrinking would only wait on them.
        max_shrink_iters: 0,
        ..Config::default()
    });
    runner
        .run(&ops, |(start, ops)| {
            let ops: Vec<ArgOp> = std::iter::once(ArgOp::Putfh(known.fh(start)))
                .chain(ops.into_iter().map(|(op, p)| known.fix(op, p)))
                .collect();
            let n = ops.len();
            let r = v.borrow_mut().run(ops);
            // SEQUENCE, then one result per operation up to the first
            // failure; the COMPOUND's status is its last result's.
            prop_assert!(r.results.len() >= 2 && r.results.len() <= n + 1, "{r:?}");
            let last = r.results.last().expect("results").status();
            prop_assert_eq!(r.status, last);
            for res in &r.results[..r.results.len() - 1] {
                prop_assert!(res.status().is_ok(), "{r:?}");
            }
            Ok(())
        })
        .unwrap();
    // Still serving, the files still there.
    let r = v.borrow_mut().run(vec![
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Lookup("one".into()),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
}
