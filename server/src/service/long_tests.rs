//! Which calls [`Service::begin_call`] leaves to be finished elsewhere:
//! exactly the COMPOUNDs with an operation whose work grows with the
//! bytes it names, and finishing one gives the reply that running it at
//! once gives.

use super::*;
use crate::exports::Exports;
use bytes::BytesMut;
use nfsrdma_xdr::nfs3::Data;
use nfsrdma_xdr::nfs4::ops::{CloneArgs, CopyArgs, ReadArgs, SpaceArgs, WriteArgs};
use nfsrdma_xdr::nfs4::{ArgOp, Compound4Args, StableHow4, Stateid4, Utf8Str};
use nfsrdma_xdr::rpc::{MessageBody, OpaqueAuth};
use nfsrdma_xdr::{BoundedVec, Payload};

fn service() -> Service {
    let rules = Exports::parse("/export *(rw,no_root_squash,insecure)").unwrap();
    let exports = Service::exports_from_rules(&rules, &StoreConfig::default());
    Service::new(exports, ServiceConfig::default())
}

fn ctx() -> CallContext {
    CallContext::from("127.0.0.1:700".parse().unwrap())
}

/// A COMPOUND (minor version 2) of `ops`: its call header and arguments.
fn compound(xid: u32, ops: Vec<ArgOp>) -> (CallBody, Decoder) {
    let mut b = BytesMut::new();
    RpcMessage::call(
        xid,
        nfs3::PROGRAM,
        nfsrdma_xdr::nfs4::VERSION,
        nfsrdma_xdr::nfs4::PROC_COMPOUND,
        OpaqueAuth::none(),
    )
    .encode(&mut b);
    Compound4Args {
        tag: Utf8Str(Bytes::new()),
        minorversion: 2,
        ops,
    }
    .encode(&mut b);
    let mut d = Decoder::new(b.freeze());
    let m = RpcMessage::decode(&mut d).unwrap();
    let MessageBody::Call(c) = m.body else {
        panic!("not a call")
    };
    (c, d)
}

fn encoded(r: &Reply) -> Vec<u8> {
    let mut b = BytesMut::new();
    r.encode(&mut b);
    b.to_vec()
}

const ANON: Stateid4 = Stateid4 {
    seqid: 0,
    other: [0; 12],
};

fn space() -> SpaceArgs {
    SpaceArgs {
        stateid: ANON,
        offset: 0,
        length: 1 << 30,
    }
}

#[test]
fn only_compounds_with_work_in_proportion_to_their_bytes_are_left_to_finish_elsewhere() {
    let svc = service();
    let long = [
        ArgOp::Copy(CopyArgs {
            src_stateid: ANON,
            dst_stateid: ANON,
            src_offset: 0,
            dst_offset: 0,
            count: 0,
            consecutive: true,
            synchronous: true,
            source_server: BoundedVec(vec![]),
        }),
        ArgOp::Clone(CloneArgs {
            src_stateid: ANON,
            dst_stateid: ANON,
            src_offset: 0,
            dst_offset: 0,
            count: 0,
        }),
        ArgOp::Allocate(space()),
        ArgOp::Deallocate(space()),
    ];
    let short = [
        ArgOp::Getattr(Default::default()),
        ArgOp::Read(ReadArgs {
            stateid: ANON,
            offset: 0,
            count: 1 << 20,
        }),
        ArgOp::Write(WriteArgs {
            stateid: ANON,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from(vec![7u8; 4096])])),
        }),
        ArgOp::Savefh,
    ];
    for (i, op) in long.into_iter().enumerate() {
        let ops = vec![ArgOp::Putrootfh, ArgOp::Getfh, op];
        let xid = 10 + i as u32;
        let (c, d) = compound(xid, ops.clone());
        let Begun::Long(l) = svc.begin_call(&ctx(), xid, &c, d) else {
            panic!("{:?} was run at once", ops[2].num())
        };
        let later = svc.finish_call(l);
        let (c, d) = compound(xid, ops);
        let now = svc.handle_call(&ctx(), xid, &c, d).expect("a reply");
        assert_eq!(encoded(&later), encoded(&now), "op {i}");
    }
    for (i, op) in short.into_iter().enumerate() {
        let xid = 20 + i as u32;
        let (c, d) = compound(xid, vec![ArgOp::Putrootfh, op]);
        assert!(
            matches!(svc.begin_call(&ctx(), xid, &c, d), Begun::Done(Some(_))),
            "short op {i} was left to finish elsewhere"
        );
    }
}
