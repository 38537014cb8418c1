//! A handler that panics (a bug of the server's, here raised on purpose by
//! block memory that panics when asked for) is answered as a server fault,
//! NFS3ERR_SERVERFAULT or NFS4ERR_SERVERFAULT, and counted; the connection,
//! the duplicate request cache, the session's slot and the store go on
//! serving.

mod common;

use bytes::{Bytes, BytesMut};
use common::nfs4::*;
use common::*;
use nfsrdma_server::exports::Exports;
use nfsrdma_server::service::{Service, ServiceConfig};
use nfsrdma_server::store::blocks::{BlockMemory, BlockSource, HeapSource};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs3::{
    Data, Nfs3Args, Nfs3Res, NfsFh3, NfsResult, NfsStat3, Read3Args, StableHow, Write3Args,
    PROGRAM, VERSION,
};
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::{Decoder, Payload, Xdr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const EXPORTS: &str = "/export *(rw,no_root_squash,insecure)";

/// Heap memory that panics when asked for while armed.
#[derive(Clone, Default)]
struct Trap(Arc<AtomicBool>);

impl BlockSource for Trap {
    fn alloc(&self, size: usize) -> Option<Box<dyn BlockMemory>> {
        if self.0.load(Ordering::SeqCst) {
            panic!("block memory asked for while the trap is armed");
        }
        HeapSource.alloc(size)
    }
}

fn server(trap: &Trap) -> TestServer {
    let rules = Exports::parse(EXPORTS).unwrap();
    let t = trap.clone();
    let ex =
        Service::exports_from_rules_with(&rules, &StoreConfig::default(), &|| Box::new(t.clone()));
    TestServer::with_exports(ex, TcpConfig::default(), ServiceConfig::default())
}

fn write3(file: &NfsFh3, data: &[u8]) -> Nfs3Args {
    Nfs3Args::Write(Write3Args {
        file: file.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: StableHow::FileSync,
        data: Data::new(data.to_vec()),
    })
}

/// Sends NFSv3 `args` with this `xid` and returns the decoded result.
fn call_with_xid(c: &mut RawClient, xid: u32, args: &Nfs3Args) -> Nfs3Res {
    let mut a = BytesMut::new();
    args.encode(&mut a);
    let call = c.call_bytes(xid, PROGRAM, VERSION, args.proc_() as u32, &a);
    c.send_record(&call).unwrap();
    let reply = c.recv().expect("a reply, not a closed connection");
    let mut d = Decoder::new(reply);
    let h = RpcMessage::decode(&mut d).unwrap();
    assert_eq!(h.xid, xid);
    assert_success(&h);
    Nfs3Res::decode(args.proc_(), &mut d).unwrap()
}

#[test]
fn an_nfs3_procedure_that_panics_fails_with_serverfault_and_the_server_goes_on() {
    let trap = Trap::default();
    let srv = server(&trap);
    let mut c = RawClient::connect(srv.addr);
    let root = c.mount("/export");
    let f = c.create(&root, "f");

    trap.0.store(true, Ordering::SeqCst);
    let xid = c.xid();
    let w = write3(&f, b"lost to a bug");
    let r = call_with_xid(&mut c, xid, &w);
    assert_eq!(r.status(), NfsStat3::Serverfault, "{r:?}");
    assert_eq!(srv.service.metrics().handler_panics(), 1);

    // The WRITE went through the duplicate request cache: its
    // retransmission is answered from there, not dropped as still in
    // progress for ever.
    let r = call_with_xid(&mut c, xid, &w);
    assert_eq!(r.status(), NfsStat3::Serverfault, "{r:?}");
    assert_eq!(srv.service.metrics().drc_hits(), 1);
    assert_eq!(srv.service.metrics().drc_in_progress_drops(), 0);
    assert_eq!(srv.service.metrics().handler_panics(), 1);

    // The same connection, the same file: served.
    trap.0.store(false, Ordering::SeqCst);
    let r = c.nfs(write3(&f, b"written"));
    assert_eq!(r.status(), NfsStat3::Ok, "{r:?}");
    match c.nfs(Nfs3Args::Read(Read3Args {
        file: f.clone(),
        offset: 0,
        count: 100,
    })) {
        Nfs3Res::Read(NfsResult::Ok(ok)) => assert_eq!(&ok.data.0.to_contiguous()[..], b"written"),
        r => panic!("{r:?}"),
    }
    assert!(srv.service.metrics().report().contains("handler panics: 1"));
}

#[test]
fn an_nfs4_operation_that_panics_fails_with_serverfault_and_the_slot_goes_on() {
    let trap = Trap::default();
    let srv = server(&trap);
    let mut v = V4::new(srv.addr, "faults");
    let (open, fh) = v.open("f", true);
    let write = |text: &'static [u8]| {
        ArgOp::Write(WriteArgs {
            stateid: open,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from_static(text)])),
        })
    };

    let failing = || {
        vec![
            ArgOp::Putfh(fh.clone()),
            write(b"lost to a bug"),
            ArgOp::Getfh,
        ]
    };

    trap.0.store(true, Ordering::SeqCst);
    let r = v.run_cached(failing(), true);
    assert_eq!(r.status, Status::SERVERFAULT, "{r:?}");
    assert_eq!(r.results.len(), 3, "SEQUENCE, PUTFH, the WRITE; no GETFH");
    assert!(matches!(
        &r.results[2],
        ResOp::Write(Err(Status::SERVERFAULT))
    ));
    assert_eq!(srv.service.metrics().handler_panics(), 1);

    // The slot's reply was cached as it went out: its retry is answered
    // from there.
    v.seq[0] -= 1;
    let again = v.run_cached(failing(), true);
    assert_eq!(again, r);
    assert_eq!(srv.service.metrics().handler_panics(), 1);

    // The slot's next sequence id, the same connection and file: served.
    trap.0.store(false, Ordering::SeqCst);
    let r = v.run(vec![
        ArgOp::Putfh(fh.clone()),
        write(b"written"),
        ArgOp::Read(ReadArgs {
            stateid: open,
            offset: 0,
            count: 100,
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Read(Ok(rd)) = &r.results[3] else {
        panic!("{r:?}")
    };
    assert_eq!(&rd.data.0.to_contiguous()[..], b"written");
}
