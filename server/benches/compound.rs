//! What a call costs in the service layer, NFSv3 against NFSv4.1/4.2
//! sessions: a 4 KiB READ and a 4 KiB UNSTABLE WRITE of one file as NFSv3
//! calls and as the COMPOUNDs the Linux client sends for them (SEQUENCE,
//! PUTFH, READ or WRITE), each decoded from its RPC message, run against
//! the store and its reply encoded into buffers, as a transport hands a
//! call over (`Service::handle`, `Reply::to_parts`). No transport, no
//! clock but criterion's.
//!
//! `cargo bench -p nfsrdma-server --bench compound`
//!
//! The instructions per call, which do not depend on the machine's load:
//! `valgrind --tool=callgrind` over the bench binary with `--bench
//! --profile-time 2 NAME` (see docs/benchmarks.md).

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, Criterion};
use nfsrdma_server::exports::{ExportOptions, Exports};
use nfsrdma_server::service::{CallContext, Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_xdr::nfs3::{
    self, Create3Args, CreateHow3, Data, DirOpArgs3, Nfs3Args, Nfs3Res, NfsFh3, NfsResult,
    Read3Args, Sattr3, StableHow, Write3Args,
};
use nfsrdma_xdr::nfs4::attr::SetAttrs;
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::rpc::{AcceptStat, AuthSysParms, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{mount, BoundedVec, Decoder, Xdr};
use std::cell::Cell;
use std::hint::black_box;

const EXPORT: &str = "/export";
const BLOCK: usize = 4096;

struct Bench {
    service: Service,
    ctx: CallContext,
    cred: OpaqueAuth,
    xid: Cell<u32>,
}

impl Bench {
    fn new() -> Bench {
        let rules = Exports::single(EXPORT, ExportOptions::permissive()).expect("exports");
        let exports = Service::exports_from_rules(&rules, &StoreConfig::default());
        Bench {
            service: Service::new(exports, ServiceConfig::default()),
            ctx: CallContext::from("10.0.0.2:700".parse().expect("address")),
            cred: OpaqueAuth::auth_sys(&AuthSysParms {
                stamp: 0,
                machinename: "bench".into(),
                uid: 0,
                gid: 0,
                gids: BoundedVec(vec![]),
            }),
            xid: Cell::new(1),
        }
    }

    /// One RPC call message.
    fn message(&self, prog: u32, vers: u32, proc_: u32, args: impl FnOnce(&mut BytesMut)) -> Bytes {
        let xid = self.xid.get() + 1;
        self.xid.set(xid);
        let mut b = BytesMut::new();
        RpcMessage::call(xid, prog, vers, proc_, self.cred.clone()).encode(&mut b);
        args(&mut b);
        b.freeze()
    }

    /// Runs `msg` and encodes its reply, as a transport would; returns the
    /// reply's buffers.
    fn run(&self, msg: Bytes) -> Vec<Bytes> {
        self.service
            .handle(&self.ctx, msg)
            .expect("a reply")
            .to_parts()
    }

    /// Runs a call and returns a decoder at its results.
    fn call(&self, prog: u32, vers: u32, proc_: u32, args: impl FnOnce(&mut BytesMut)) -> Decoder {
        let msg = self.message(prog, vers, proc_, args);
        let reply: Vec<u8> = self.run(msg).concat();
        let mut d = Decoder::new(Bytes::from(reply));
        let h = RpcMessage::decode(&mut d).expect("reply header");
        match h.as_reply() {
            Some(ReplyBody::Accepted(a)) if a.stat == AcceptStat::Success => d,
            _ => panic!("call failed: {h:?}"),
        }
    }

    fn nfs3(&self, args: Nfs3Args) -> Nfs3Res {
        let p = args.proc_();
        let mut d = self.call(nfs3::PROGRAM, nfs3::VERSION, p as u32, |b| args.encode(b));
        Nfs3Res::decode(p, &mut d).expect("NFSv3 results")
    }

    fn compound(&self, ops: Vec<ArgOp>) -> Compound4Res {
        let mut d = self.call(PROGRAM, VERSION, PROC_COMPOUND, |b| {
            compound_args(ops).encode(b)
        });
        let r = Compound4Res::decode(&mut d).expect("COMPOUND results");
        assert_eq!(r.status, Status::OK, "{r:?}");
        r
    }
}

fn compound_args(ops: Vec<ArgOp>) -> Compound4Args {
    Compound4Args {
        tag: Utf8Str(Bytes::new()),
        minorversion: 2,
        ops,
    }
}

/// A client record and session, as the Linux client sets them up.
struct Session {
    clientid: u64,
    sid: SessionId4,
    seq: Cell<u32>,
}

impl Session {
    fn new(b: &Bench) -> Session {
        let r = b.compound(vec![ArgOp::ExchangeId(ExchangeIdArgs {
            clientowner: ClientOwner4 {
                verifier: [1; 8],
                ownerid: Opaque4(Bytes::from_static(b"bench")),
            },
            flags: 0,
            state_protect: StateProtectA::None,
            client_impl_id: BoundedVec(vec![]),
        })]);
        let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
            panic!("{r:?}")
        };
        let attrs = ChannelAttrs4 {
            headerpadsize: 0,
            maxrequestsize: 1 << 20,
            maxresponsesize: 1 << 20,
            maxresponsesize_cached: 8192,
            maxoperations: 16,
            maxrequests: 8,
            rdma_ird: BoundedVec(vec![]),
        };
        let clientid = e.clientid;
        let r = b.compound(vec![ArgOp::CreateSession(CreateSessionArgs {
            clientid,
            sequence: e.sequenceid,
            flags: 0,
            fore_chan_attrs: attrs.clone(),
            back_chan_attrs: attrs,
            cb_program: 0x4000_0000,
            sec_parms: BoundedVec(vec![CallbackSecParms::None]),
        })]);
        let ResOp::CreateSession(Ok(s)) = &r.results[0] else {
            panic!("{r:?}")
        };
        let session = Session {
            clientid,
            sid: s.sessionid,
            seq: Cell::new(0),
        };
        let seq = session.sequence();
        b.compound(vec![seq, ArgOp::ReclaimComplete(false)]);
        session
    }

    /// The next SEQUENCE on slot 0, its reply not cached (as the Linux
    /// client sends READ and WRITE).
    fn sequence(&self) -> ArgOp {
        let seq = self.seq.get() + 1;
        self.seq.set(seq);
        ArgOp::Sequence(SequenceArgs {
            sessionid: self.sid,
            sequenceid: seq,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
        })
    }
}

/// The four calls measured, on one file.
struct Cases {
    s: Session,
    fh3: NfsFh3,
    fh4: Fh4,
    stateid: Stateid4,
    data: Bytes,
}

/// The cases' names, as criterion and `NFSRDMA_BENCH_CASE` know them.
const CASES: [&str; 4] = ["v3_read", "v4_read", "v3_write", "v4_write"];

impl Cases {
    /// The file, opened over NFSv4 (its stateid and handle) and found over
    /// NFSv3 (its NFSv3 handle), with 4 KiB of data; each call once
    /// through, checked.
    fn new(b: &Bench) -> Cases {
        let s = Session::new(b);
        let seq = s.sequence();
        let r = b.compound(vec![
            seq,
            ArgOp::Putrootfh,
            ArgOp::Lookup("export".into()),
            ArgOp::Open(OpenArgs {
                seqid: 0,
                share_access: share::ACCESS_BOTH,
                share_deny: 0,
                owner: StateOwner4 {
                    clientid: s.clientid,
                    owner: Opaque4(Bytes::from_static(b"bench-open")),
                },
                openhow: Some(CreateHow4::Unchecked(SetAttrs::default().to_fattr())),
                claim: OpenClaim4::Null(Utf8Str(Bytes::from_static(b"file"))),
            }),
            ArgOp::Getfh,
        ]);
        let ResOp::Open(Ok(open)) = &r.results[3] else {
            panic!("{r:?}")
        };
        let ResOp::Getfh(Ok(fh4)) = &r.results[4] else {
            panic!("{r:?}")
        };
        let (stateid, fh4) = (open.stateid, fh4.clone());
        let mut d = b.call(mount::PROGRAM, mount::VERSION, mount::proc_::MNT, |m| {
            mount::DirPath::new(EXPORT.as_bytes().to_vec()).encode(m)
        });
        let root = match mount::MountRes3::decode(&mut d).expect("MNT results") {
            mount::MountRes3::Ok(ok) => NfsFh3(ok.fhandle.0),
            e => panic!("MNT: {e:?}"),
        };
        let fh3 = match b.nfs3(Nfs3Args::Create(Create3Args {
            where_: DirOpArgs3 {
                dir: root,
                name: "file".into(),
            },
            how: CreateHow3::Unchecked(Sattr3::default()),
        })) {
            Nfs3Res::Create(NfsResult::Ok(ok)) => ok.obj.expect("the file's handle"),
            r => panic!("CREATE: {:?}", r.status()),
        };
        let cases = Cases {
            s,
            fh3,
            fh4,
            stateid,
            data: Bytes::from(vec![7u8; BLOCK]),
        };
        // The writes succeed, then both reads return the block.
        let reply = b.run(cases.message(b, "v3_write")).concat();
        assert!(
            reply.len() > 100,
            "NFSv3 WRITE reply of {} bytes",
            reply.len()
        );
        let mut d = Decoder::new(Bytes::from(b.run(cases.message(b, "v4_write")).concat()));
        RpcMessage::decode(&mut d).expect("reply header");
        let r = Compound4Res::decode(&mut d).expect("COMPOUND results");
        assert_eq!(r.status, Status::OK, "v4 WRITE: {r:?}");
        for name in ["v3_read", "v4_read"] {
            let reply = b.run(cases.message(b, name)).concat();
            assert!(
                reply.windows(BLOCK).any(|w| w == &cases.data[..]),
                "{name}: the reply does not carry the block"
            );
        }
        cases
    }

    /// The next call message of case `name` (as a client builds it).
    fn message(&self, b: &Bench, name: &str) -> Bytes {
        let read3 = || {
            Nfs3Args::Read(Read3Args {
                file: self.fh3.clone(),
                offset: 0,
                count: BLOCK as u32,
            })
        };
        let write3 = || {
            Nfs3Args::Write(Write3Args {
                file: self.fh3.clone(),
                offset: 0,
                count: BLOCK as u32,
                stable: StableHow::Unstable,
                data: Data::new(self.data.clone()),
            })
        };
        let v4 = |op: ArgOp| {
            let ops = vec![self.s.sequence(), ArgOp::Putfh(self.fh4.clone()), op];
            b.message(PROGRAM, VERSION, PROC_COMPOUND, |m| {
                compound_args(ops).encode(m)
            })
        };
        let v3 = |args: Nfs3Args| {
            b.message(nfs3::PROGRAM, nfs3::VERSION, args.proc_() as u32, |m| {
                args.encode(m)
            })
        };
        match name {
            "v3_read" => v3(read3()),
            "v3_write" => v3(write3()),
            "v4_read" => v4(ArgOp::Read(ReadArgs {
                stateid: self.stateid,
                offset: 0,
                count: BLOCK as u32,
            })),
            "v4_write" => v4(ArgOp::Write(WriteArgs {
                stateid: self.stateid,
                offset: 0,
                stable: StableHow4::Unstable,
                data: Data::new(self.data.clone()),
            })),
            _ => panic!("no case {name} (cases: {CASES:?})"),
        }
    }
}

fn bench(c: &mut Criterion) {
    let b = Bench::new();
    let cases = Cases::new(&b);
    // The messages are built outside the measured part (a client's work);
    // what is measured is the server's: decode, run, encode.
    let mut g = c.benchmark_group("service_4k");
    for name in CASES {
        g.bench_function(name, |t| {
            t.iter_batched(
                || cases.message(&b, name),
                |m| black_box(b.run(m)),
                criterion::BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);

/// With `NFSRDMA_BENCH_CALLS=N` and `NFSRDMA_BENCH_CASE=NAME`: N calls of
/// that case in a plain loop, for an instruction count per call
/// (`valgrind --tool=callgrind --toggle-collect=...`, docs/benchmarks.md);
/// otherwise criterion's timed runs.
fn main() {
    if let Ok(n) = std::env::var("NFSRDMA_BENCH_CALLS") {
        let n: u64 = n.parse().expect("NFSRDMA_BENCH_CALLS: a number of calls");
        let name = std::env::var("NFSRDMA_BENCH_CASE").unwrap_or_else(|_| "v4_read".into());
        let b = Bench::new();
        let cases = Cases::new(&b);
        for _ in 0..n {
            let m = cases.message(&b, &name);
            black_box(b.run(m));
        }
        println!("{n} calls of {name}");
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
