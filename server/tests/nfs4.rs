//! NFSv4.1 and NFSv4.2 over TCP, from a raw COMPOUND client: client
//! records and sessions, the slot table and its reply cache, the
//! COMPOUND rules, one namespace with NFSv3, opens, share reservations,
//! byte-range locks between clients, lease expiry, and the 4.2 operations.

mod common;

use bytes::{Bytes, BytesMut};
use common::nfs4::*;
use common::*;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs3::{self, Data};
use nfsrdma_xdr::nfs4::attr::{n, SetAttrs};
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::{BoundedVec, Decoder, Payload, Xdr};
use std::time::Duration;

const EXPORTS: &str = "/export *(rw,no_root_squash,insecure)";

#[test]
fn minor_version_zero_is_a_mismatch_with_the_tag_echoed() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut c = RawClient::connect(srv.addr);
    let r = compound(&mut c, 0, "mount probe", vec![ArgOp::Putrootfh]);
    assert_eq!(r.status, Status::MINOR_VERS_MISMATCH);
    assert!(r.results.is_empty());
    assert_eq!(r.tag.as_bytes(), b"mount probe");
    let r = compound(&mut c, 3, "", vec![ArgOp::Putrootfh]);
    assert_eq!(r.status, Status::MINOR_VERS_MISMATCH);
    // NULL of version 4 answers; version 5 is a program mismatch naming 3..4.
    let (h, _) = c.call(PROGRAM, VERSION, PROC_NULL, &[]);
    assert_success(&h);
    let (h, _) = c.call(PROGRAM, 5, 0, &[]);
    assert_eq!(
        accept_stat(&h),
        Some(nfsrdma_xdr::rpc::AcceptStat::ProgMismatch { low: 3, high: 4 })
    );
}

#[test]
fn compound_rules_for_sequence_and_sessionless_operations() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut v = V4::new(srv.addr, "rules");
    // Without SEQUENCE first.
    let r = compound(&mut v.c, 1, "", vec![ArgOp::Putrootfh, ArgOp::Getfh]);
    assert_eq!(r.status, Status::OP_NOT_IN_SESSION);
    assert_eq!(r.results.len(), 1);
    // EXCHANGE_ID with company and no SEQUENCE.
    let r = compound(
        &mut v.c,
        1,
        "",
        vec![exchange_id("rules", 1), ArgOp::Putrootfh],
    );
    assert_eq!(r.status, Status::NOT_ONLY_OP);
    // SEQUENCE anywhere but first.
    let s = v.seq_op(0, false);
    let s2 = v.seq_op(1, false);
    let r = compound(&mut v.c, 1, "", vec![s, ArgOp::Putrootfh, s2]);
    assert_eq!(r.status, Status::SEQUENCE_POS);
    assert_eq!(r.results.len(), 3);
    // Without a current filehandle.
    let r = v.run(vec![ArgOp::Getfh]);
    assert_eq!(r.status, Status::NOFILEHANDLE);
    // An undefined operation; an NFSv4.2 operation under minor version 1.
    let r = v.run(vec![ArgOp::Putrootfh, ArgOp::Illegal(9999)]);
    assert_eq!(r.status, Status::OP_ILLEGAL);
    assert_eq!(r.results.last().map(|r| r.num()), Some(opnum::ILLEGAL));
    let s = v.seq_op(0, false);
    let r = compound(
        &mut v.c,
        1,
        "",
        vec![s, ArgOp::Putrootfh, ArgOp::Seek(SeekArgs::default())],
    );
    assert_eq!(r.status, Status::OP_ILLEGAL);
    // A defined operation not implemented (DELEGPURGE): NOTSUPP.
    let r = v.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Unsupported(opnum::DELEGPURGE),
    ]);
    assert_eq!(r.status, Status::NOTSUPP);
    // Arguments that do not decode: the operations before run, the bad
    // one is BADXDR.
    let mut b = BytesMut::new();
    Utf8Str::default().encode(&mut b);
    b.extend_from_slice(&[0, 0, 0, 2, 0, 0, 0, 3]);
    v.seq_op(0, false).encode(&mut b);
    ArgOp::Putrootfh.encode(&mut b);
    b.extend_from_slice(&[0, 0, 0, opnum::LOOKUP as u8, 0, 0, 1, 0, b'x']);
    let (h, mut d) = v.c.call(PROGRAM, VERSION, PROC_COMPOUND, &b);
    assert_success(&h);
    let r = Compound4Res::decode(&mut d).unwrap();
    assert_eq!(r.status, Status::BADXDR);
    assert_eq!(r.results.len(), 3);
    assert_eq!(r.results[1], ResOp::Putrootfh(Ok(())));
}

#[test]
fn the_slot_table_replays_cached_replies_and_refuses_misordered_ones() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut v = V4::new(srv.addr, "slots");
    let root = {
        let r = v.run(vec![
            ArgOp::Putrootfh,
            ArgOp::Lookup("export".into()),
            ArgOp::Getfh,
        ]);
        let ResOp::Getfh(Ok(fh)) = &r.results[3] else {
            panic!("{r:?}")
        };
        fh.clone()
    };
    // A GUARDED create with the reply cached, sent twice: the second is
    // the first reply again, not NFS4ERR_EXIST.
    let s = v.seq_op(2, true);
    let ops = vec![
        s,
        ArgOp::Putfh(root.clone()),
        ArgOp::Create(CreateArgs {
            objtype: CreateType4::Dir,
            objname: "d".into(),
            createattrs: SetAttrs {
                mode: Some(0o700),
                ..Default::default()
            }
            .to_fattr(),
        }),
        ArgOp::Getfh,
    ];
    let first = compound(&mut v.c, 2, "", ops.clone());
    assert_eq!(first.status, Status::OK, "{first:?}");
    let again = compound(&mut v.c, 2, "", ops.clone());
    assert_eq!(again, first, "a retry is answered from the slot");
    // The next sequence id runs the create for real: it exists now.
    v.seq[2] -= 1;
    let mut ops2 = ops.clone();
    ops2[0] = v.seq_op(2, true);
    ops2[0] = match &ops2[0] {
        ArgOp::Sequence(s) => ArgOp::Sequence(SequenceArgs {
            sequenceid: s.sequenceid + 1,
            ..s.clone()
        }),
        _ => unreachable!(),
    };
    let r = compound(&mut v.c, 2, "", ops2.clone());
    assert_eq!(r.status, Status::EXIST);
    // Skipping a sequence id, an unknown slot, an unknown session.
    let mut skip = ops2.clone();
    if let ArgOp::Sequence(s) = &mut skip[0] {
        s.sequenceid += 5;
    }
    assert_eq!(
        compound(&mut v.c, 2, "", skip).status,
        Status::SEQ_MISORDERED
    );
    let mut bad = ops2.clone();
    if let ArgOp::Sequence(s) = &mut bad[0] {
        s.slotid = 8;
    }
    assert_eq!(compound(&mut v.c, 2, "", bad).status, Status::BADSLOT);
    let mut gone = ops2.clone();
    if let ArgOp::Sequence(s) = &mut gone[0] {
        s.sessionid = [9; 16];
    }
    assert_eq!(compound(&mut v.c, 2, "", gone).status, Status::BADSESSION);
    // A retry of a request whose reply was not cached.
    let s = v.seq_op(3, false);
    let ops = vec![s, ArgOp::Putrootfh];
    assert_eq!(compound(&mut v.c, 2, "", ops.clone()).status, Status::OK);
    assert_eq!(
        compound(&mut v.c, 2, "", ops).status,
        Status::RETRY_UNCACHED_REP
    );
}

#[test]
fn client_records_follow_exchange_id_and_create_session() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut c = RawClient::connect(srv.addr);
    let r = compound(&mut c, 1, "", vec![exchange_id("rec", 1)]);
    let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
        panic!("{r:?}")
    };
    // CREATE_SESSION with a wrong sequence, an unknown client id.
    let r = compound(
        &mut c,
        1,
        "",
        vec![create_session(e.clientid, e.sequenceid + 1)],
    );
    assert_eq!(r.status, Status::SEQ_MISORDERED);
    let r = compound(&mut c, 1, "", vec![create_session(0x1234, 1)]);
    assert_eq!(r.status, Status::STALE_CLIENTID);
    let r1 = compound(
        &mut c,
        1,
        "",
        vec![create_session(e.clientid, e.sequenceid)],
    );
    assert_eq!(r1.status, Status::OK);
    // Its retry gets the same session back.
    let r2 = compound(
        &mut c,
        1,
        "",
        vec![create_session(e.clientid, e.sequenceid)],
    );
    assert_eq!(r2, r1);
    // The same owner and verifier again: the same, now confirmed, record.
    let r = compound(&mut c, 1, "", vec![exchange_id("rec", 1)]);
    let ResOp::ExchangeId(Ok(e2)) = &r.results[0] else {
        panic!("{r:?}")
    };
    assert_eq!(e2.clientid, e.clientid);
    assert_ne!(e2.flags & exchgid::CONFIRMED_R, 0);
    // A new verifier (the client restarted): a new record, and once it is
    // confirmed the old one's session is gone.
    let r = compound(&mut c, 1, "", vec![exchange_id("rec", 2)]);
    let ResOp::ExchangeId(Ok(e3)) = &r.results[0] else {
        panic!("{r:?}")
    };
    assert_ne!(e3.clientid, e.clientid);
    assert_eq!(
        compound(
            &mut c,
            1,
            "",
            vec![create_session(e3.clientid, e3.sequenceid)]
        )
        .status,
        Status::OK
    );
    let ResOp::CreateSession(Ok(old)) = &r1.results[0] else {
        panic!()
    };
    let r = compound(
        &mut c,
        1,
        "",
        vec![ArgOp::Sequence(SequenceArgs {
            sessionid: old.sessionid,
            sequenceid: 1,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
        })],
    );
    assert_eq!(r.status, Status::BADSESSION);
    // DESTROY_CLIENTID of a client with a session is refused; after
    // DESTROY_SESSION it works.
    assert_eq!(
        compound(&mut c, 1, "", vec![ArgOp::DestroyClientid(e3.clientid)]).status,
        Status::CLIENTID_BUSY
    );
    assert_eq!(srv.service.nfs4().state.counts().0, 1);
}

#[test]
fn one_namespace_with_nfsv3_data_and_handles() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    // NFSv3 writes a file.
    let mut c3 = RawClient::connect(srv.addr);
    let root3 = c3.mount("/export");
    let f3 = match c3.nfs(nfs3::Nfs3Args::Create(nfs3::Create3Args {
        where_: nfs3::DirOpArgs3 {
            dir: root3.clone(),
            name: "shared".into(),
        },
        how: nfs3::CreateHow3::Unchecked(nfs3::Sattr3::default()),
    })) {
        nfs3::Nfs3Res::Create(nfs3::NfsResult::Ok(ok)) => ok.obj.unwrap(),
        r => panic!("{r:?}"),
    };
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    match c3.nfs(nfs3::Nfs3Args::Write(nfs3::Write3Args {
        file: f3.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: nfs3::StableHow::FileSync,
        data: Data::new(data.clone()),
    })) {
        nfs3::Nfs3Res::Write(nfs3::NfsResult::Ok(_)) => {}
        r => panic!("{r:?}"),
    }
    // NFSv4.2 opens it by name: the same handle, the same file id, the
    // same bytes.
    let mut v = V4::new(srv.addr, "ns");
    let (open, fh) = v.open("shared", false);
    assert_eq!(fh.0, f3.0, "v3 and v4 handles of a file are the same");
    let r = v.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Read(ReadArgs {
            stateid: open,
            offset: 0,
            count: 1 << 20,
        }),
        ArgOp::Getattr(Bitmap4::from_bits([n::CHANGE, n::SIZE, n::FILEID])),
    ]);
    let ResOp::Read(Ok(rd)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert!(rd.eof);
    assert_eq!(rd.data.0.to_contiguous().as_ref(), &data[..]);
    let ResOp::Getattr(Ok(attrs)) = &r.results[3] else {
        panic!("{r:?}")
    };
    // The same with the reply to be cached: too big for the slot.
    let r = v.run_cached(
        vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Read(ReadArgs {
                stateid: open,
                offset: 0,
                count: 1 << 20,
            }),
        ],
        true,
    );
    assert_eq!(r.status, Status::REP_TOO_BIG_TO_CACHE);
    let mut d = Decoder::new(attrs.attr_vals.0.clone());
    let change1 = d.u64("change").unwrap();
    assert_eq!(d.u64("size").unwrap(), data.len() as u64);
    let a3 = match c3.nfs(nfs3::Nfs3Args::Getattr(nfs3::Getattr3Args {
        object: f3.clone(),
    })) {
        nfs3::Nfs3Res::Getattr(nfs3::NfsResult::Ok(a)) => a.obj_attributes,
        r => panic!("{r:?}"),
    };
    assert_eq!(d.u64("fileid").unwrap(), a3.fileid);
    // NFSv4.2 writes; NFSv3 reads it back, and the change attribute moved.
    let r = v.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Write(WriteArgs {
            stateid: open,
            offset: 10,
            stable: StableHow4::Unstable,
            data: Data(Payload::from_parts([Bytes::from_static(b"written by v4")])),
        }),
        ArgOp::Commit(CommitArgs {
            offset: 0,
            count: 0,
        }),
        ArgOp::Getattr(Bitmap4::from_bits([n::CHANGE])),
    ]);
    let ResOp::Write(Ok(w)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert_eq!((w.count, w.committed), (13, StableHow4::Unstable));
    let ResOp::Commit(Ok(verf)) = &r.results[3] else {
        panic!("{r:?}")
    };
    assert_eq!(*verf, w.writeverf);
    assert_eq!(
        *verf,
        srv.service.write_verf(),
        "one write verifier for v3 and v4"
    );
    let ResOp::Getattr(Ok(a)) = &r.results[4] else {
        panic!("{r:?}")
    };
    let change2 = Decoder::new(a.attr_vals.0.clone()).u64("change").unwrap();
    assert!(change2 > change1);
    match c3.nfs(nfs3::Nfs3Args::Read(nfs3::Read3Args {
        file: f3,
        offset: 10,
        count: 13,
    })) {
        nfs3::Nfs3Res::Read(nfs3::NfsResult::Ok(r)) => {
            assert_eq!(r.data.0.to_contiguous().as_ref(), b"written by v4")
        }
        r => panic!("{r:?}"),
    }
    // The pseudo root lists the export, and LOOKUPP leads back to it.
    let r = v.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Readdir(ReaddirArgs {
            cookie: 0,
            cookieverf: [0; 8],
            dircount: 4096,
            maxcount: 8192,
            attr_request: Bitmap4::from_bits([n::FSID, n::MOUNTED_ON_FILEID]),
        }),
        ArgOp::Lookup("export".into()),
        ArgOp::Lookupp,
        ArgOp::Getfh,
    ]);
    let ResOp::Readdir(Ok(dir)) = &r.results[2] else {
        panic!("{r:?}")
    };
    let names: Vec<&[u8]> = dir.entries.0.iter().map(|e| e.name.as_bytes()).collect();
    assert_eq!(names, vec![&b"export"[..]]);
    assert!(dir.eof);
    let ResOp::Getfh(Ok(back)) = &r.results[5] else {
        panic!("{r:?}")
    };
    let r = v.run(vec![ArgOp::Putrootfh, ArgOp::Getfh]);
    let ResOp::Getfh(Ok(rootfh)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert_eq!(back, rootfh);
}

#[test]
fn share_reservations_and_byte_range_locks_between_clients() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = V4::new(srv.addr, "client a");
    let mut b = V4::new(srv.addr, "client b");
    let (sa, fh) = a.open("locked", true);
    let (sb, _) = b.open("locked", false);
    let la = match a.lock(&fh, sa, 0, 100) {
        LockRes::Ok(s) => s,
        other => panic!("{other:?}"),
    };
    // B's overlapping lock is denied, naming A's range and owner.
    match b.lock(&fh, sb, 50, 10) {
        LockRes::Denied(d) => {
            assert_eq!((d.offset, d.length, d.owner.clientid), (0, 100, a.clientid));
            assert_eq!(d.locktype, LockType4::Write);
        }
        other => panic!("{other:?}"),
    }
    // A range beside it is granted.
    assert!(matches!(b.lock(&fh, sb, 100, 10), LockRes::Ok(_)));
    // A releases the middle; B may lock there, not at the ends.
    let r = a.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Locku(LockuArgs {
            locktype: LockType4::Write,
            seqid: 0,
            lock_stateid: la,
            offset: 40,
            length: 20,
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let r = b.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Lockt(LocktArgs {
            locktype: LockType4::Write,
            offset: 45,
            length: 10,
            owner: StateOwner4 {
                clientid: b.clientid,
                owner: Opaque4(Bytes::from_static(b"lock owner")),
            },
        }),
    ]);
    assert_eq!(r.status, Status::OK);
    assert!(matches!(b.lock(&fh, sb, 0, 41), LockRes::Denied(_)));
    // A's CLOSE with locks held is refused.
    let r = a.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Close(CloseArgs {
            seqid: 0,
            open_stateid: sa,
        }),
    ]);
    assert_eq!(r.status, Status::LOCKS_HELD);
    // A deny-write open by a third owner is refused while others write.
    let r = b.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Open(OpenArgs {
            seqid: 0,
            share_access: share::ACCESS_READ,
            share_deny: share::DENY_WRITE,
            owner: StateOwner4 {
                clientid: b.clientid,
                owner: Opaque4(Bytes::from_static(b"another owner")),
            },
            openhow: None,
            claim: OpenClaim4::Null("locked".into()),
        }),
    ]);
    assert_eq!(r.status, Status::SHARE_DENIED);
    // A's lease runs out: its state goes, and B can take A's range.
    srv.service
        .nfs4()
        .state
        .age_client(a.clientid, Duration::from_secs(3600));
    assert!(matches!(b.lock(&fh, sb, 0, 41), LockRes::Ok(_)));
    let s = a.seq_op(0, false);
    let r = compound(&mut a.c, 2, "", vec![s]);
    assert_eq!(
        r.status,
        Status::BADSESSION,
        "the expired client's session is gone"
    );
    // A stateid of the expired client is unknown now.
    let r = b.run(vec![ArgOp::TestStateid(BoundedVec(vec![sa, sb]))]);
    let ResOp::TestStateid(Ok(codes)) = &r.results[1] else {
        panic!("{r:?}")
    };
    assert_eq!(codes.0, vec![Status::BAD_STATEID, Status::OK]);
}

#[test]
fn nfsv42_copy_seek_allocate_and_deallocate() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut v = V4::new(srv.addr, "v42");
    let (src, sfh) = v.open("src", true);
    let (dst, dfh) = v.open("dst", true);
    let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let r = v.run(vec![
        ArgOp::Putfh(sfh.clone()),
        ArgOp::Write(WriteArgs {
            stateid: src,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from(body.clone())])),
        }),
        // COPY: the saved handle is the source.
        ArgOp::Savefh,
        ArgOp::Putfh(dfh.clone()),
        ArgOp::Copy(CopyArgs {
            src_stateid: src,
            dst_stateid: dst,
            src_offset: 1000,
            dst_offset: 0,
            count: 0,
            consecutive: true,
            synchronous: true,
            source_server: BoundedVec(vec![]),
        }),
        ArgOp::Read(ReadArgs {
            stateid: dst,
            offset: 0,
            count: 1 << 20,
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Copy(Ok(c)) = &r.results[5] else {
        panic!("{r:?}")
    };
    assert_eq!(c.response.count, body.len() as u64 - 1000);
    let ResOp::Read(Ok(rd)) = &r.results[6] else {
        panic!("{r:?}")
    };
    assert_eq!(rd.data.0.to_contiguous().as_ref(), &body[1000..]);
    // DEALLOCATE zeroes a range and keeps the size; ALLOCATE extends it;
    // SEEK finds data where asked and the hole at the end.
    let r = v.run(vec![
        ArgOp::Putfh(dfh.clone()),
        ArgOp::Deallocate(SpaceArgs {
            stateid: dst,
            offset: 10,
            length: 20,
        }),
        ArgOp::Read(ReadArgs {
            stateid: dst,
            offset: 0,
            count: 40,
        }),
        ArgOp::Allocate(SpaceArgs {
            stateid: dst,
            offset: 0,
            length: 400_000,
        }),
        ArgOp::Seek(SeekArgs {
            stateid: dst,
            offset: 5,
            what: 1,
        }),
        ArgOp::Getattr(Bitmap4::from_bits([n::SIZE])),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Read(Ok(rd)) = &r.results[3] else {
        panic!("{r:?}")
    };
    let got = rd.data.0.to_contiguous();
    assert_eq!(&got[..10], &body[1000..1010]);
    assert!(got[10..30].iter().all(|b| *b == 0));
    assert_eq!(&got[30..40], &body[1030..1040]);
    let ResOp::Seek(Ok(s)) = &r.results[5] else {
        panic!("{r:?}")
    };
    assert_eq!((s.eof, s.offset), (true, 400_000));
    let ResOp::Getattr(Ok(a)) = &r.results[6] else {
        panic!("{r:?}")
    };
    assert_eq!(
        Decoder::new(a.attr_vals.0.clone()).u64("size").unwrap(),
        400_000
    );
    // A COPY of more than 64 MiB moves 64 MiB; the client sends another
    // for the rest. (The source is a 65 MiB hole: no memory for it.)
    let r = v.run(vec![
        ArgOp::Putfh(sfh.clone()),
        ArgOp::Setattr(SetattrArgs {
            stateid: src,
            obj_attributes: SetAttrs {
                size: Some(65 << 20),
                ..Default::default()
            }
            .to_fattr(),
        }),
        ArgOp::Savefh,
        ArgOp::Putfh(dfh.clone()),
        copy_whole(src, dst),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Copy(Ok(c)) = &r.results[5] else {
        panic!("{r:?}")
    };
    assert_eq!(c.response.count, 64 << 20);
}

#[test]
fn nfsv42_clone_within_and_between_files() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut v = V4::new(srv.addr, "clone");
    let (src, sfh) = v.open("src", true);
    let (dst, dfh) = v.open("dst", true);
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8 + 1).collect();
    let clone = |src_offset, dst_offset, count| {
        ArgOp::Clone(CloneArgs {
            src_stateid: src,
            dst_stateid: dst,
            src_offset,
            dst_offset,
            count,
        })
    };
    let read_dst = ArgOp::Read(ReadArgs {
        stateid: dst,
        offset: 0,
        count: 1 << 20,
    });
    // All of src from 65536 (count 0: to its end) to dst at 0 (aligned
    // whole blocks shared, the tail copied), then a piece at an odd place.
    let r = v.run(vec![
        ArgOp::Putfh(sfh.clone()),
        ArgOp::Write(WriteArgs {
            stateid: src,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from(body.clone())])),
        }),
        ArgOp::Savefh,
        ArgOp::Putfh(dfh.clone()),
        clone(65536, 0, 0),
        clone(7, 150_000, 1000),
        read_dst.clone(),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let mut want = body[65536..].to_vec();
    want.resize(151_000, 0);
    want[150_000..].copy_from_slice(&body[7..1007]);
    let ResOp::Read(Ok(rd)) = &r.results[7] else {
        panic!("{r:?}")
    };
    assert_eq!(rd.data.0.to_contiguous().as_ref(), &want[..]);
    // Errors: past the source's end; overlapping ranges of one file; the
    // source handle from nowhere (no saved handle).
    let r = v.run(vec![
        ArgOp::Putfh(sfh.clone()),
        ArgOp::Savefh,
        ArgOp::Putfh(dfh.clone()),
        clone(199_000, 0, 1001),
    ]);
    assert_eq!(r.status, Status::INVAL, "past the end: {r:?}");
    let r = v.run(vec![
        ArgOp::Putfh(dfh.clone()),
        ArgOp::Savefh,
        ArgOp::Clone(CloneArgs {
            src_stateid: dst,
            dst_stateid: dst,
            src_offset: 0,
            dst_offset: 1000,
            count: 4096,
        }),
    ]);
    assert_eq!(r.status, Status::INVAL, "overlap: {r:?}");
    let r = v.run(vec![ArgOp::Putfh(dfh.clone()), clone(0, 0, 1)]);
    assert_eq!(r.status, Status::NOFILEHANDLE, "{r:?}");
    // Not a write open of the destination: the source's stateid for it.
    let r = v.run(vec![
        ArgOp::Putfh(sfh.clone()),
        ArgOp::Savefh,
        ArgOp::Putfh(dfh.clone()),
        ArgOp::Clone(CloneArgs {
            src_stateid: src,
            dst_stateid: src,
            src_offset: 0,
            dst_offset: 0,
            count: 1,
        }),
    ]);
    assert_eq!(r.status, Status::BAD_STATEID, "{r:?}");
    // Nothing of that changed dst.
    let r = v.run(vec![ArgOp::Putfh(dfh.clone()), read_dst]);
    let ResOp::Read(Ok(rd)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert_eq!(rd.data.0.to_contiguous().as_ref(), &want[..]);
    // A clone of several pieces (the server takes its lock per MiB): src
    // grows to 3 MiB + 5 with a mark near its end, all of it goes to dst
    // at 192 KiB.
    let mark = ArgOp::Write(WriteArgs {
        stateid: src,
        offset: (3 << 20) - 3,
        stable: StableHow4::FileSync,
        data: Data(Payload::from_parts([Bytes::from_static(b"markend")])),
    });
    let r = v.run(vec![
        ArgOp::Putfh(sfh.clone()),
        mark,
        ArgOp::Savefh,
        ArgOp::Putfh(dfh.clone()),
        clone(0, 192 << 10, 0),
        ArgOp::Read(ReadArgs {
            stateid: dst,
            offset: (192 << 10) + (3 << 20) - 3,
            count: 100,
        }),
        ArgOp::Read(ReadArgs {
            stateid: dst,
            offset: 192 << 10,
            count: 200_000,
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Read(Ok(end)) = &r.results[6] else {
        panic!("{r:?}")
    };
    assert_eq!(end.data.0.to_contiguous().as_ref(), b"markend");
    assert!(end.eof);
    let ResOp::Read(Ok(start)) = &r.results[7] else {
        panic!("{r:?}")
    };
    assert_eq!(start.data.0.to_contiguous().as_ref(), &body[..]);
}

#[test]
fn a_file_removed_while_open_stays_until_its_last_close() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = V4::new(srv.addr, "holder");
    let mut b = V4::new(srv.addr, "remover");
    let (sa, fh) = a.open("doomed", true);
    let (sb, _) = b.open("doomed", false);
    let r = a.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Write(WriteArgs {
            stateid: sa,
            offset: 0,
            stable: StableHow4::FileSync,
            data: Data(Payload::from_parts([Bytes::from_static(b"still here")])),
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    // OPEN said so: OPEN4_RESULT_PRESERVE_UNLINKED.
    let r = a.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Open(OpenArgs {
            seqid: 0,
            share_access: share::ACCESS_READ,
            share_deny: 0,
            owner: StateOwner4 {
                clientid: a.clientid,
                owner: Opaque4(Bytes::from_static(b"another owner")),
            },
            openhow: None,
            claim: OpenClaim4::Null(Utf8Str(Bytes::from_static(b"doomed"))),
        }),
    ]);
    let ResOp::Open(Ok(o)) = &r.results[3] else {
        panic!("{r:?}")
    };
    assert_eq!(o.rflags & 8, 8, "OPEN4_RESULT_PRESERVE_UNLINKED");
    let sa2 = o.stateid;
    let r = b.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Remove("doomed".into()),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let read = |v: &mut V4, sid| {
        v.run(vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Read(ReadArgs {
                stateid: sid,
                offset: 0,
                count: 100,
            }),
            ArgOp::Getattr(Bitmap4::from_bits([n::NUMLINKS])),
        ])
    };
    let close = |v: &mut V4, sid| {
        v.run(vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Close(CloseArgs {
                seqid: 0,
                open_stateid: sid,
            }),
        ])
    };
    // Gone from the directory, still there through its handle, with no
    // links, for as long as any open of it is left.
    for (sid, who) in [(sa, &mut a), (sb, &mut b)] {
        let r = read(who, sid);
        assert_eq!(r.status, Status::OK, "{r:?}");
        let ResOp::Read(Ok(rd)) = &r.results[2] else {
            panic!("{r:?}")
        };
        assert_eq!(rd.data.0.to_contiguous().as_ref(), b"still here");
        let ResOp::Getattr(Ok(at)) = &r.results[3] else {
            panic!("{r:?}")
        };
        assert_eq!(
            Decoder::new(at.attr_vals.0.clone()).u32("nlink").unwrap(),
            0
        );
    }
    assert_eq!(close(&mut b, sb).status, Status::OK);
    assert_eq!(close(&mut a, sa).status, Status::OK);
    assert_eq!(read(&mut a, sa2).status, Status::OK, "one open is left");
    assert_eq!(close(&mut a, sa2).status, Status::OK);
    // The last CLOSE freed it.
    let r = a.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Getattr(Bitmap4::from_bits([n::SIZE])),
    ]);
    assert_eq!(r.status, Status::STALE, "{r:?}");

    // A client's state going (its lease ran out) frees a file it held
    // open and that was renamed over meanwhile.
    let mut c = V4::new(srv.addr, "short-lived");
    let (_, fh2) = c.open("replaced", true);
    let (_, _) = a.open("newer", true);
    let r = a.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Savefh,
        ArgOp::Rename(RenameArgs {
            oldname: "newer".into(),
            newname: "replaced".into(),
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let getattr = |v: &mut V4| {
        v.run(vec![
            ArgOp::Putfh(fh2.clone()),
            ArgOp::Getattr(Bitmap4::from_bits([n::SIZE])),
        ])
        .status
    };
    assert_eq!(getattr(&mut a), Status::OK, "kept while c holds it open");
    srv.service
        .nfs4()
        .state
        .age_client(c.clientid, Duration::from_secs(3600));
    assert_eq!(getattr(&mut a), Status::STALE, "freed with c's state");
}

/// OPEN of the file `fh` names, with `claim` (CLAIM_PREVIOUS or CLAIM_FH).
fn open_fh(v: &mut V4, fh: &Fh4, claim: OpenClaim4) -> Compound4Res {
    let owner = Opaque4(Bytes::from_static(v.owner.as_bytes()));
    let clientid = v.clientid;
    v.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Open(OpenArgs {
            seqid: 0,
            share_access: share::ACCESS_BOTH,
            share_deny: 0,
            owner: StateOwner4 { clientid, owner },
            openhow: None,
            claim,
        }),
    ])
}

/// LOCK of `[offset, offset + length)` in `fh` for `open`, reclaimed or
/// new.
fn lock_as(v: &mut V4, fh: &Fh4, open: Stateid4, reclaim: bool, offset: u64) -> LockRes<Stateid4> {
    let clientid = v.clientid;
    let r = v.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Lock(LockArgs {
            locktype: LockType4::Write,
            reclaim,
            offset,
            length: 100,
            locker: Locker4::New(OpenToLockOwner {
                open_seqid: 0,
                open_stateid: open,
                lock_seqid: 0,
                lock_owner: StateOwner4 {
                    clientid,
                    owner: Opaque4(Bytes::from_static(b"lock owner")),
                },
            }),
        }),
    ]);
    match r.results.last() {
        Some(ResOp::Lock(l)) => l.clone(),
        other => panic!("{other:?}"),
    }
}

fn reclaim_complete(v: &mut V4) -> Status {
    v.run(vec![ArgOp::ReclaimComplete(false)]).status
}

#[test]
fn a_restart_with_state_gives_the_previous_clients_a_grace_period_to_reclaim() {
    let dir = std::env::temp_dir().join(format!("nfsrdmad-grace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let state_s = state.to_str().unwrap();
    let args = [
        "--no-rdma",
        "--state",
        state_s,
        "--lease",
        "10",
        "--grace",
        "120",
    ];
    let (child, addr) = serving(&args, std::process::Stdio::null());
    // A opens a file and locks a range; B opens another file and holds
    // nothing else; D has no state and is not to be let reclaim.
    let mut a = V4::new(addr, "client a");
    let (sa, fha) = a.open("a-file", true);
    assert!(matches!(
        lock_as(&mut a, &fha, sa, false, 0),
        LockRes::Ok(_)
    ));
    let mut b = V4::new(addr, "client b");
    let (_, fhb) = b.open("b-file", true);
    let _d = V4::new(addr, "client d");
    stop_daemon(child);

    let (child, addr) = serving(&args, std::process::Stdio::null());
    // A's old session and client id are gone: BADSESSION, then
    // STALE_CLIENTID, as a client learns of a restart.
    let s = a.seq_op(0, false);
    let mut c0 = RawClient::connect(addr);
    assert_eq!(compound(&mut c0, 2, "", vec![s]).status, Status::BADSESSION);
    let r = compound(&mut c0, 1, "", vec![create_session(a.clientid, 3)]);
    assert_eq!(r.status, Status::STALE_CLIENTID);
    // A comes back (same owner and verifier) and reclaims its open, by the
    // handle it had, and its lock.
    let mut a = V4::reclaiming(addr, "client a");
    let r = open_fh(&mut a, &fha, OpenClaim4::Previous(0));
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Open(Ok(o)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert!(matches!(
        lock_as(&mut a, &fha, o.stateid, true, 0),
        LockRes::Ok(_)
    ));
    // A client the previous instance did not know (or knew without state)
    // cannot reclaim, and neither it nor anyone opens, locks, removes or
    // renames anew meanwhile.
    let mut d = V4::reclaiming(addr, "client d");
    let r = open_fh(&mut d, &fhb, OpenClaim4::Previous(0));
    assert_eq!(r.status, Status::RECLAIM_BAD, "{r:?}");
    assert_eq!(reclaim_complete(&mut d), Status::OK);
    let r = open_fh(&mut d, &fhb, OpenClaim4::Fh);
    assert_eq!(r.status, Status::GRACE, "{r:?}");
    let r = d.run(vec![
        ArgOp::Putrootfh,
        ArgOp::Lookup("export".into()),
        ArgOp::Remove("a-file".into()),
    ]);
    assert_eq!(r.status, Status::GRACE, "{r:?}");
    let r = open_fh(&mut a, &fhb, OpenClaim4::Fh);
    assert_eq!(
        r.status,
        Status::GRACE,
        "even a reclaiming client waits for new opens"
    );
    // Once A says RECLAIM_COMPLETE its reclaims are over; the grace period
    // goes on while B has not said it.
    assert_eq!(reclaim_complete(&mut a), Status::OK);
    assert_eq!(reclaim_complete(&mut a), Status::COMPLETE_ALREADY);
    let r = open_fh(&mut a, &fha, OpenClaim4::Previous(0));
    assert_eq!(r.status, Status::NO_GRACE, "{r:?}");
    let r = open_fh(&mut d, &fhb, OpenClaim4::Fh);
    assert_eq!(r.status, Status::GRACE, "{r:?}");
    // B reclaims nothing and says RECLAIM_COMPLETE: every client of the
    // previous instance is done, so the period ends before its 120 s.
    let mut b = V4::reclaiming(addr, "client b");
    assert_eq!(reclaim_complete(&mut b), Status::OK);
    let r = open_fh(&mut d, &fha, OpenClaim4::Fh);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let ResOp::Open(Ok(od)) = &r.results[2] else {
        panic!("{r:?}")
    };
    // A's reclaimed lock holds against D.
    match lock_as(&mut d, &fha, od.stateid, false, 50) {
        LockRes::Denied(den) => assert_eq!((den.offset, den.owner.clientid), (0, a.clientid)),
        other => panic!("{other:?}"),
    }
    let r = open_fh(&mut b, &fhb, OpenClaim4::Previous(0));
    assert_eq!(r.status, Status::NO_GRACE, "{r:?}");
    stop_daemon(child);

    // A third start: A and D hold state, so both may reclaim; with
    // --grace 0 there is no grace period and a reclaim is refused.
    let args0 = ["--no-rdma", "--state", state_s, "--grace", "0"];
    let (child, addr) = serving(&args0, std::process::Stdio::null());
    let mut a = V4::reclaiming(addr, "client a");
    let r = open_fh(&mut a, &fha, OpenClaim4::Previous(0));
    assert_eq!(r.status, Status::NO_GRACE, "{r:?}");
    // Before its RECLAIM_COMPLETE a client opens nothing new, grace or no.
    let r = open_fh(&mut a, &fha, OpenClaim4::Fh);
    assert_eq!(r.status, Status::GRACE, "{r:?}");
    assert_eq!(reclaim_complete(&mut a), Status::OK);
    let r = open_fh(&mut a, &fha, OpenClaim4::Fh);
    assert_eq!(r.status, Status::OK, "{r:?}");
    stop_daemon(child);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_daemons_on_one_host_are_two_servers_to_a_client() {
    let owner = |addr| {
        let mut c = RawClient::connect(addr);
        let r = compound(&mut c, 1, "", vec![exchange_id("who", 1)]);
        let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
            panic!("{r:?}")
        };
        assert_eq!(e.server_scope.0, e.server_owner.major_id.0);
        e.server_owner.major_id.0.clone()
    };
    let (mut a, addr_a) = serving(&["--no-rdma"], std::process::Stdio::null());
    let (mut b, addr_b) = serving(&["--no-rdma"], std::process::Stdio::null());
    let (oa, ob) = (owner(addr_a), owner(addr_b));
    for c in [&mut a, &mut b] {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(oa.starts_with(b"nfsrdmad@"), "{oa:?}");
    assert_ne!(oa, ob, "one server owner for two servers");
}

#[test]
fn a_delegation_held_before_a_restart_is_granted_again_at_its_reclaim() {
    let dir = std::env::temp_dir().join(format!("nfsrdmad-redeleg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let args = [
        "--no-rdma",
        "--state",
        state.to_str().unwrap(),
        "--lease",
        "10",
        "--grace",
        "120",
    ];
    let (child, addr) = serving(&args, std::process::Stdio::null());
    let mut a = V4::new(addr, "client a");
    let (_, fha) = a.open("a-file", true);
    let mut b = V4::new(addr, "client b");
    let (_, fhb) = b.open("b-file", true);
    stop_daemon(child);

    let (child, addr) = serving(&args, std::process::Stdio::null());
    // A comes back with a backchannel (its probe answered) and reclaims
    // its open with the write delegation it held: granted again, not to
    // be returned at once.
    let mut a = V4::reclaiming_with_back(addr, "client a");
    let r = open_fh(&mut a, &fha, OpenClaim4::Previous(2));
    let ResOp::Open(Ok(o)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert!(
        matches!(o.delegation, OpenDelegation4::Write(_, false, ..)),
        "{:?}",
        o.delegation
    );
    // B comes back without a backchannel and reclaims a read delegation:
    // granted, with `recall` set, for B to return it at once.
    let mut b = V4::reclaiming(addr, "client b");
    let r = open_fh(&mut b, &fhb, OpenClaim4::Previous(1));
    let ResOp::Open(Ok(o)) = &r.results[2] else {
        panic!("{r:?}")
    };
    let OpenDelegation4::Read(db, true, _) = o.delegation else {
        panic!("{:?}", o.delegation)
    };
    let r = b.run(vec![ArgOp::Putfh(fhb.clone()), ArgOp::Delegreturn(db)]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    // Reclaiming with no delegation held gets none.
    let r = open_fh(&mut b, &fhb, OpenClaim4::Previous(0));
    let ResOp::Open(Ok(o)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert_eq!(o.delegation, OpenDelegation4::None);
    stop_daemon(child);
    std::fs::remove_dir_all(&dir).unwrap();
}
