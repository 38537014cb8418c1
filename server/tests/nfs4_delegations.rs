//! NFSv4.1 delegations over TCP (RFC 8881 §10.2, §10.4), from raw
//! clients that answer the server's calls on their backchannel: read and
//! write delegations at OPEN, recalled (CB_RECALL) by another client's
//! conflicting OPEN and by NFSv3 access, returned with DELEGRETURN after
//! the holder's own opens move to the server (CLAIM_DELEG_CUR_FH), and
//! revoked when the recall goes unanswered for a lease.

mod common;

use bytes::{Bytes, BytesMut};
use common::nfs4::*;
use common::*;
use nfsrdma_server::service::nfs4::callback::Path;
use nfsrdma_server::service::nfs4::Nfs4Config;
use nfsrdma_server::service::ServiceConfig;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs3::{self, Data, NfsFh3};
use nfsrdma_xdr::nfs4::cb::{CbArgOp, CbCompoundArgs, CbCompoundRes, CbResOp, CbSequenceResOk};
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::*;
use nfsrdma_xdr::{Decoder, Xdr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EXPORTS: &str = "/export *(rw,no_root_squash,insecure)";
const WANT_NO_DELEG: u32 = 0x0400;

fn server(delegations: bool) -> TestServer {
    TestServer::with_config(
        EXPORTS,
        TcpConfig::default(),
        ServiceConfig {
            nfs4: Nfs4Config {
                lease: Duration::from_secs(10),
                delegations,
                ..Nfs4Config::default()
            },
            ..ServiceConfig::default()
        },
    )
}

/// A client with a backchannel whose probe the server has seen answered
/// (delegations need it), recording the delegations recalled from it and
/// answering CB_RECALL with NFS4_OK (and CB_GETATTR with NFS4ERR_BADHANDLE).
fn client(srv: &TestServer, owner: &'static str) -> (V4, Arc<Mutex<Vec<Stateid4>>>) {
    client_with_attrs(srv, owner, Arc::default())
}

/// The change attribute and size a client gives when asked with
/// CB_GETATTR (`None`: it answers NFS4ERR_BADHANDLE).
type HeldAttrs = Arc<Mutex<Option<(u64, u64)>>>;

/// [`client`], answering CB_GETATTR with what `attrs` holds then.
fn client_with_attrs(
    srv: &TestServer,
    owner: &'static str,
    attrs: HeldAttrs,
) -> (V4, Arc<Mutex<Vec<Stateid4>>>) {
    let mut v = V4::with_back(srv.addr, owner);
    let deadline = Instant::now() + Duration::from_secs(20);
    while srv.service.nfs4().state.back_path(&v.sid) != Some(Path::Up) {
        assert!(Instant::now() < deadline, "the probe's answer was not seen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let recalled: Arc<Mutex<Vec<Stateid4>>> = Arc::default();
    let log = recalled.clone();
    v.c.cb_reply = Some(Box::new(move |args: &[u8]| {
        let a = CbCompoundArgs::decode(&mut Decoder::new(Bytes::copy_from_slice(args))).unwrap();
        let CbArgOp::Sequence(s) = &a.ops[0] else {
            panic!("{a:?}")
        };
        let mut results = vec![CbResOp::Sequence(Ok(CbSequenceResOk {
            sessionid: s.sessionid,
            sequenceid: s.sequenceid,
            slotid: s.slotid,
            highest_slotid: 0,
            target_highest_slotid: 0,
        }))];
        for op in &a.ops[1..] {
            match op {
                CbArgOp::Recall(r) => {
                    log.lock().unwrap().push(r.stateid);
                    results.push(CbResOp::Recall(Status::OK));
                }
                CbArgOp::Getattr(g) => {
                    let want = Bitmap4::from_bits([attr::n::CHANGE, attr::n::SIZE]);
                    assert_eq!(g.attr_request, want);
                    results.push(CbResOp::Getattr(match *attrs.lock().unwrap() {
                        Some((change, size)) => {
                            let mut w = attr::AttrWriter::new();
                            w.put(attr::n::CHANGE, &change);
                            w.put(attr::n::SIZE, &size);
                            Ok(w.finish())
                        }
                        None => Err(Status::BADHANDLE),
                    }));
                }
                other => panic!("{other:?}"),
            }
        }
        let mut b = BytesMut::new();
        CbCompoundRes {
            status: Status::OK,
            tag: a.tag.clone(),
            results,
        }
        .encode(&mut b);
        b.to_vec()
    }));
    (v, recalled)
}

fn open_args(v: &V4, name: &str, access: u32, create: bool) -> ArgOp {
    ArgOp::Open(OpenArgs {
        seqid: 0,
        share_access: access,
        share_deny: 0,
        owner: StateOwner4 {
            clientid: v.clientid,
            owner: Opaque4(Bytes::from_static(v.owner.as_bytes())),
        },
        openhow: create.then(|| CreateHow4::Unchecked(attr::SetAttrs::default().to_fattr())),
        claim: OpenClaim4::Null(Utf8Str(Bytes::copy_from_slice(name.as_bytes()))),
    })
}

/// OPEN of /export/`name`: the whole reply (SEQUENCE, PUTROOTFH, LOOKUP,
/// OPEN, GETFH).
fn open(v: &mut V4, name: &str, access: u32, create: bool) -> Compound4Res {
    let op = open_args(v, name, access, create);
    run(
        v,
        vec![
            ArgOp::Putrootfh,
            ArgOp::Lookup("export".into()),
            op,
            ArgOp::Getfh,
        ],
    )
}

fn opened(r: &Compound4Res) -> (OpenResOk, Fh4) {
    let (ResOp::Open(Ok(o)), ResOp::Getfh(Ok(fh))) = (&r.results[3], &r.results[4]) else {
        panic!("{r:?}")
    };
    (o.clone(), fh.clone())
}

/// SEQUENCE and `ops`, whatever SEQUENCE's status flags (`V4::run`
/// wants none).
fn run(v: &mut V4, ops: Vec<ArgOp>) -> Compound4Res {
    let mut all = vec![v.seq_op(0, false)];
    all.extend(ops);
    compound(&mut v.c, 2, "", all)
}

/// SEQUENCE alone: its status flags.
fn flags(v: &mut V4) -> u32 {
    match &run(v, vec![]).results[0] {
        ResOp::Sequence(Ok(s)) => s.status_flags,
        other => panic!("{other:?}"),
    }
}

fn read(v: &mut V4, fh: &Fh4, sid: Stateid4) -> Status {
    run(
        v,
        vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Read(ReadArgs {
                stateid: sid,
                offset: 0,
                count: 100,
            }),
        ],
    )
    .status
}

fn write(v: &mut V4, fh: &Fh4, sid: Stateid4, data: &[u8]) -> Status {
    run(
        v,
        vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Write(WriteArgs {
                stateid: sid,
                offset: 0,
                stable: StableHow4::FileSync,
                data: Data::new(data.to_vec()),
            }),
        ],
    )
    .status
}

fn delegreturn(v: &mut V4, fh: &Fh4, sid: Stateid4) -> Status {
    run(v, vec![ArgOp::Putfh(fh.clone()), ArgOp::Delegreturn(sid)]).status
}

/// Waits for the server's next call on `v`'s connection (answered there).
fn take_call(v: &mut V4) {
    assert!(
        v.c.next_call(Duration::from_secs(10)).is_some(),
        "no call from the server"
    );
}

#[test]
fn read_delegations_are_recalled_by_another_clients_open_for_writing_and_returned() {
    let srv = server(true);
    let stats = &srv.service.nfs4().delegs;
    let (mut a, a_recalls) = client(&srv, "a");
    let (mut b, b_recalls) = client(&srv, "b");
    let (mut c, _) = client(&srv, "c");
    // A creates the file, open for reading only: a read delegation.
    let (oa, fh) = opened(&open(&mut a, "f", share::ACCESS_READ, true));
    let OpenDelegation4::Read(da, false, _) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    // B opens it for reading too: reads do not conflict, B gets one too.
    let (ob, _) = opened(&open(&mut b, "f", share::ACCESS_READ, false));
    let OpenDelegation4::Read(db, false, _) = ob.delegation else {
        panic!("{:?}", ob.delegation)
    };
    // A delegation stateid reads; a read delegation does not write.
    assert_eq!(read(&mut a, &fh, da), Status::OK);
    assert_eq!(write(&mut a, &fh, da, b"x"), Status::OPENMODE);
    // C opens for writing: both are recalled, C waits (NFS4ERR_DELAY).
    let r = open(&mut c, "f", share::ACCESS_BOTH, false);
    assert_eq!(r.status, Status::DELAY, "{r:?}");
    take_call(&mut a);
    take_call(&mut b);
    assert_eq!(*a_recalls.lock().unwrap(), vec![da]);
    assert_eq!(*b_recalls.lock().unwrap(), vec![db]);
    // Asking again sends no second recall, and C still waits.
    assert_eq!(
        open(&mut c, "f", share::ACCESS_BOTH, false).status,
        Status::DELAY
    );
    // B moves its open under the delegation to the server first
    // (CLAIM_DELEG_CUR_FH: with A's delegation it may not), then both
    // return their delegations.
    let claim = |b: &mut V4, sid: Stateid4| {
        b.run(vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Open(OpenArgs {
                claim: OpenClaim4::DelegCurFh(sid),
                ..match open_args(b, "f", share::ACCESS_READ, false) {
                    ArgOp::Open(o) => o,
                    _ => unreachable!(),
                }
            }),
        ])
    };
    assert_eq!(claim(&mut b, da).status, Status::BAD_STATEID);
    let r = claim(&mut b, db);
    let ResOp::Open(Ok(o)) = &r.results[2] else {
        panic!("{r:?}")
    };
    assert_eq!(o.delegation, OpenDelegation4::None);
    assert_eq!(delegreturn(&mut b, &fh, db), Status::OK);
    assert_eq!(
        open(&mut c, "f", share::ACCESS_BOTH, false).status,
        Status::DELAY,
        "A's delegation is still out"
    );
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    assert_eq!(delegreturn(&mut a, &fh, da), Status::BAD_STATEID);
    // Now C's open proceeds, without a delegation: A and B have it open.
    let (oc, _) = opened(&open(&mut c, "f", share::ACCESS_BOTH, false));
    assert_eq!(oc.delegation, OpenDelegation4::None);
    assert_eq!(write(&mut c, &fh, oc.stateid, b"from c"), Status::OK);
    let s = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    assert_eq!(
        (
            s(&stats.granted_read),
            s(&stats.granted_write),
            s(&stats.recalled),
            s(&stats.returned),
            s(&stats.revoked)
        ),
        (2, 0, 2, 2, 0)
    );
    let report = srv.service.report();
    assert!(
        report.contains("nfs4 delegations: granted read 2, write 0, recalled 2 (failed 0), returned 2, revoked 0; over RDMA granted 0, recalled 0, returned 0, revoked 0; CB_GETATTR 0 (changed 0, failed 0)"),
        "{report}"
    );
    assert_metrics(
        &srv.service,
        &[
            "nfsrdmad_nfs4_delegations_granted_read_total 2",
            "nfsrdmad_nfs4_delegations_recalled_total 2",
            "nfsrdmad_nfs4_delegations_returned_total 2",
            "nfsrdmad_nfs4_delegations_revoked_total 0",
            "nfsrdmad_nfs4_delegations_granted_over_rdma_total 0",
        ],
    );
}

#[test]
fn a_write_delegation_is_recalled_by_nfsv3_reads_writes_and_removes() {
    let srv = server(true);
    let (mut a, recalls) = client(&srv, "writer");
    let (oa, fh) = opened(&open(&mut a, "g", share::ACCESS_BOTH, true));
    let OpenDelegation4::Write(da, false, SpaceLimit4::Size(_), _) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    assert_eq!(write(&mut a, &fh, da, b"under the delegation"), Status::OK);
    // Over NFSv3 (the same handle), a READ waits for the recall
    // (NFS3ERR_JUKEBOX): the data may be cached at the holder.
    let mut c3 = RawClient::connect(srv.addr);
    let f3 = NfsFh3(fh.0.clone());
    let read3 = |c3: &mut RawClient| match c3.nfs(nfs3::Nfs3Args::Read(nfs3::Read3Args {
        file: f3.clone(),
        offset: 0,
        count: 100,
    })) {
        nfs3::Nfs3Res::Read(nfs3::NfsResult::Ok(ok)) => Ok(ok.data.0.to_contiguous().to_vec()),
        nfs3::Nfs3Res::Read(nfs3::NfsResult::Err(e, _)) => Err(e),
        r => panic!("{r:?}"),
    };
    assert_eq!(read3(&mut c3), Err(nfs3::NfsStat3::Jukebox));
    take_call(&mut a);
    assert_eq!(*recalls.lock().unwrap(), vec![da]);
    assert_eq!(read3(&mut c3), Err(nfs3::NfsStat3::Jukebox));
    // The holder writes back what it cached, returns the delegation; the
    // v3 READ then proceeds and sees it.
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    assert_eq!(read3(&mut c3).unwrap(), b"under the delegation");

    // A new write delegation (A closes and opens again), then an NFSv3
    // REMOVE of the file's name: recalled too.
    let r = a.run(vec![
        ArgOp::Putfh(fh.clone()),
        ArgOp::Close(CloseArgs {
            seqid: 0,
            open_stateid: oa.stateid,
        }),
    ]);
    assert_eq!(r.status, Status::OK);
    let (oa, _) = opened(&open(&mut a, "g", share::ACCESS_BOTH, false));
    let OpenDelegation4::Write(da, ..) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    let root3 = c3.mount("/export");
    let remove3 = |c3: &mut RawClient| match c3.nfs(nfs3::Nfs3Args::Remove(nfs3::Remove3Args {
        object: nfs3::DirOpArgs3 {
            dir: root3.clone(),
            name: "g".into(),
        },
    })) {
        nfs3::Nfs3Res::Remove(nfs3::NfsResult::Ok(_)) => Ok(()),
        nfs3::Nfs3Res::Remove(nfs3::NfsResult::Err(e, _)) => Err(e),
        r => panic!("{r:?}"),
    };
    assert_eq!(remove3(&mut c3), Err(nfs3::NfsStat3::Jukebox));
    take_call(&mut a);
    assert_eq!(recalls.lock().unwrap().last(), Some(&da));
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    assert_eq!(remove3(&mut c3), Ok(()));
}

#[test]
fn a_delegation_whose_recall_goes_unanswered_is_revoked_after_a_lease() {
    let srv = server(true);
    let (mut a, _) = client(&srv, "silent holder");
    let (mut c, _) = client(&srv, "waiting");
    let (oa, fh) = opened(&open(&mut a, "h", share::ACCESS_READ, true));
    let OpenDelegation4::Read(da, ..) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    // A stops answering its backchannel (it still renews its lease).
    a.c.answer_calls = false;
    let t0 = Instant::now();
    let oc = loop {
        let r = open(&mut c, "h", share::ACCESS_BOTH, false);
        if r.status == Status::OK {
            break opened(&r).0;
        }
        assert_eq!(r.status, Status::DELAY, "{r:?}");
        assert!(t0.elapsed() < Duration::from_secs(60), "never revoked");
        flags(&mut a);
        std::thread::sleep(Duration::from_millis(250));
    };
    // Not before the lease (10 s) since the recall.
    assert!(
        t0.elapsed() >= Duration::from_secs(10),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(write(&mut c, &fh, oc.stateid, b"c's"), Status::OK);
    // A learns it: SEQUENCE says so until A frees the stateid, which
    // answers DELEG_REVOKED meanwhile.
    let revoked = seq_status::RECALLABLE_STATE_REVOKED;
    assert_ne!(flags(&mut a) & revoked, 0);
    assert_eq!(read(&mut a, &fh, da), Status::DELEG_REVOKED);
    assert_eq!(delegreturn(&mut a, &fh, da), Status::DELEG_REVOKED);
    assert_eq!(run(&mut a, vec![ArgOp::FreeStateid(da)]).status, Status::OK);
    assert_eq!(flags(&mut a) & revoked, 0);
    let stats = &srv.service.nfs4().delegs;
    assert_eq!(stats.revoked.load(Ordering::Relaxed), 1);
    // Each recall that went unanswered (a second's timeout, with a lease
    // of 10 s) was sent again at C's next try.
    let (recalled, failed) = (
        stats.recalled.load(Ordering::Relaxed),
        stats.recall_failed.load(Ordering::Relaxed),
    );
    assert!(
        recalled >= 3 && failed >= 2,
        "recalled {recalled}, failed {failed}"
    );
}

#[test]
fn no_delegation_when_turned_off_unwanted_or_without_a_working_backchannel() {
    // --delegations off.
    let srv = server(false);
    let (mut a, _) = client(&srv, "off");
    let (o, _) = opened(&open(&mut a, "f", share::ACCESS_READ, true));
    assert_eq!(o.delegation, OpenDelegation4::None);

    let srv = server(true);
    // OPEN4_SHARE_ACCESS_WANT_NO_DELEG: none, and the reply says why.
    let (mut a, _) = client(&srv, "unwanted");
    let (o, _) = opened(&open(&mut a, "f", share::ACCESS_READ | WANT_NO_DELEG, true));
    assert_eq!(o.delegation, OpenDelegation4::NoneExt(0));
    // A session with no backchannel gets none.
    let mut n = V4::new(srv.addr, "no backchannel");
    let (o, _) = opened(&open(&mut n, "g", share::ACCESS_READ, true));
    assert_eq!(o.delegation, OpenDelegation4::None);
    // Nor one whose backchannel connection is gone.
    let mut s = V4::with_back(srv.addr, "gone");
    drop(std::mem::replace(&mut s.c, RawClient::connect(srv.addr)));
    // Once the server has seen the connection close (SEQUENCE says so).
    let deadline = Instant::now() + Duration::from_secs(20);
    while flags(&mut s) & seq_status::CB_PATH_DOWN_SESSION == 0 {
        assert!(
            Instant::now() < deadline,
            "the closed connection was not seen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (o, _) = opened(&open(&mut s, "h", share::ACCESS_READ, true));
    assert_eq!(o.delegation, OpenDelegation4::None);
    assert_eq!(
        srv.service
            .nfs4()
            .delegs
            .granted_read
            .load(Ordering::Relaxed),
        0
    );
}

/// GETATTR of `fh` asking for `bits`: the status, and the change
/// attribute and size when asked for and answered.
fn getattr(v: &mut V4, fh: &Fh4, bits: &[u32]) -> (Status, Option<(u64, u64)>) {
    let r = run(
        v,
        vec![
            ArgOp::Putfh(fh.clone()),
            ArgOp::Getattr(Bitmap4::from_bits(bits.iter().copied())),
        ],
    );
    let got = match r.results.get(2) {
        Some(ResOp::Getattr(Ok(f))) => match attr::change_and_size(f).unwrap() {
            (Some(c), Some(s)) => Some((c, s)),
            _ => None,
        },
        _ => None,
    };
    (r.status, got)
}

/// [`getattr`] again while it is answered NFS4ERR_DELAY, as a client
/// retries (the holder's answer, sent already, is on its way to the
/// server), for at most 10 s.
fn getattr_retried(v: &mut V4, fh: &Fh4, bits: &[u32]) -> (Status, Option<(u64, u64)>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = getattr(v, fh, bits);
        if r.0 != Status::DELAY || Instant::now() > deadline {
            return r;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Another client's GETATTR of the size and change of a file under a write
/// delegation asks the holder with CB_GETATTR (RFC 8881 §10.4.3) instead
/// of recalling it: NFS4ERR_DELAY until the holder answers, then the
/// holder's answer (unchanged: the server's attributes; changed: its size
/// and a new change attribute). Other attributes ask nothing. A holder
/// that fails CB_GETATTR has the delegation recalled.
#[test]
fn another_clients_getattr_asks_the_write_delegation_holder_with_cb_getattr() {
    const CS: [u32; 2] = [attr::n::CHANGE, attr::n::SIZE];
    let srv = server(true);
    let held: HeldAttrs = Arc::default();
    let (mut a, recalls) = client_with_attrs(&srv, "holder", held.clone());
    let (mut b, _) = client(&srv, "asker");
    let (oa, fh) = opened(&open(&mut a, "k", share::ACCESS_BOTH, true));
    let OpenDelegation4::Write(da, ..) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    let cb = srv.service.nfs4().callbacks.stats();
    let sent = || cb.sent.load(Ordering::Relaxed);
    // A's own GETATTR is answered: it is the holder.
    let (st, Some((c0, 0))) = getattr(&mut a, &fh, &CS) else {
        panic!("the holder's own GETATTR")
    };
    assert_eq!(st, Status::OK);
    // B's GETATTR of the mode alone asks nothing.
    let before = sent();
    assert_eq!(getattr(&mut b, &fh, &[attr::n::MODE]).0, Status::OK);
    assert_eq!(sent(), before, "no callback for the mode");
    // B's of the size and change: A is asked; it answers only when it
    // next reads its connection, so B is told to wait, then gets the
    // answer: unchanged, the server's own attributes.
    *held.lock().unwrap() = Some((c0, 0));
    assert_eq!(getattr(&mut b, &fh, &CS), (Status::DELAY, None));
    take_call(&mut a);
    assert_eq!(
        getattr_retried(&mut b, &fh, &CS),
        (Status::OK, Some((c0, 0)))
    );
    // A has written 5 bytes it keeps under its delegation: once the
    // answer above is stale, B sees A's size and a new change attribute.
    *held.lock().unwrap() = Some((c0 + 1, 5));
    std::thread::sleep(nfsrdma_server::service::nfs4::CB_GETATTR_FRESH);
    assert_eq!(getattr(&mut b, &fh, &CS), (Status::DELAY, None));
    take_call(&mut a);
    let (st, Some((c1, 5))) = getattr_retried(&mut b, &fh, &CS) else {
        panic!("the holder's size")
    };
    assert_eq!(st, Status::OK);
    assert!(c1 > c0, "change {c1} after {c0}");
    // Asked again while the answer serves: the same change attribute (it
    // moves once per change the holder reports, not at each GETATTR).
    assert_eq!(getattr(&mut b, &fh, &CS), (Status::OK, Some((c1, 5))));
    assert!(recalls.lock().unwrap().is_empty(), "nothing recalled");
    // A fails CB_GETATTR: the delegation is recalled, then returned.
    *held.lock().unwrap() = None;
    std::thread::sleep(nfsrdma_server::service::nfs4::CB_GETATTR_FRESH);
    assert_eq!(getattr(&mut b, &fh, &CS), (Status::DELAY, None));
    take_call(&mut a);
    // B waits while the failure reaches the server, and the recall goes.
    let recalled = &srv.service.nfs4().delegs.recalled;
    let deadline = Instant::now() + Duration::from_secs(10);
    while recalled.load(Ordering::Relaxed) == 0 {
        assert!(
            Instant::now() < deadline,
            "no recall after CB_GETATTR failed"
        );
        assert_eq!(getattr(&mut b, &fh, &CS), (Status::DELAY, None));
        std::thread::sleep(Duration::from_millis(10));
    }
    take_call(&mut a);
    assert_eq!(*recalls.lock().unwrap(), vec![da]);
    let dl = &srv.service.nfs4().delegs;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    assert_eq!(
        (
            n(&dl.getattr_asked),
            n(&dl.getattr_changed),
            n(&dl.getattr_failed)
        ),
        (3, 1, 1)
    );
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    let (st, Some((c2, 0))) = getattr(&mut b, &fh, &CS) else {
        panic!("after the return: the server's size (A wrote nothing to it)")
    };
    assert_eq!(st, Status::OK);
    assert!(c2 >= c1, "change {c2} after {c1}");
}

/// Another client's LOCKT recalls a write delegation: its holder may hold
/// byte-range locks of its own locally.
#[test]
fn another_clients_lock_test_recalls_a_write_delegation() {
    let srv = server(true);
    let (mut a, recalls) = client(&srv, "holder");
    let (mut b, _) = client(&srv, "asker");
    let (oa, fh) = opened(&open(&mut a, "k", share::ACCESS_BOTH, true));
    let OpenDelegation4::Write(da, ..) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    let lockt = |v: &mut V4| {
        let owner = StateOwner4 {
            clientid: v.clientid,
            owner: Opaque4(Bytes::from_static(b"tester")),
        };
        run(
            v,
            vec![
                ArgOp::Putfh(fh.clone()),
                ArgOp::Lockt(LocktArgs {
                    locktype: LockType4::Read,
                    offset: 0,
                    length: u64::MAX,
                    owner,
                }),
            ],
        )
        .status
    };
    assert_eq!(lockt(&mut b), Status::DELAY);
    take_call(&mut a);
    assert_eq!(recalls.lock().unwrap().last(), Some(&da));
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    assert_eq!(lockt(&mut b), Status::OK);
}

#[test]
fn a_client_answering_its_recall_with_garbage_has_its_path_down_and_others_are_served() {
    let srv = server(true);
    let stats = &srv.service.nfs4().delegs;
    let (mut a, recalls) = client(&srv, "garbled");
    let (mut c, _) = client(&srv, "other");
    let (oa, fh) = opened(&open(&mut a, "g", share::ACCESS_READ, true));
    let OpenDelegation4::Read(da, ..) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    // A answers its calls with RPC success and results that are no
    // CB_COMPOUND4res, and sends a reply record to no call of the
    // server's, cut short.
    let good =
        a.c.cb_reply
            .replace(Box::new(|_: &[u8]| vec![0xde, 0xad, 0xbe]));
    a.c.send_record(&[0, 0, 0, 7, 0, 0, 0, 1, 0xff, 0xff, 0xff])
        .unwrap();
    assert_eq!(
        open(&mut c, "g", share::ACCESS_BOTH, false).status,
        Status::DELAY
    );
    take_call(&mut a);
    let deadline = Instant::now() + Duration::from_secs(20);
    while stats.recall_failed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "the garbled answer was taken");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A's SEQUENCE says its callback path is down, and A gets no new
    // delegation meanwhile.
    let down = seq_status::CB_PATH_DOWN_SESSION | seq_status::CB_PATH_DOWN;
    assert_eq!(flags(&mut a) & down, down);
    let (o2, _) = opened(&open(&mut a, "g2", share::ACCESS_READ, true));
    assert_eq!(o2.delegation, OpenDelegation4::None);
    // The server goes on serving the others: C creates and writes a file
    // of its own (with a delegation: its path works).
    let (oc2, fh2) = opened(&open(&mut c, "c2", share::ACCESS_BOTH, true));
    assert!(matches!(oc2.delegation, OpenDelegation4::Write(..)));
    assert_eq!(write(&mut c, &fh2, oc2.stateid, b"c2"), Status::OK);
    assert!(recalls.lock().unwrap().is_empty());
    // A answers well again: C's next try sends the recall again, A
    // returns the delegation and C's open goes through.
    a.c.cb_reply = good;
    assert_eq!(
        open(&mut c, "g", share::ACCESS_BOTH, false).status,
        Status::DELAY
    );
    take_call(&mut a);
    assert_eq!(*recalls.lock().unwrap(), vec![da]);
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    let (oc, _) = opened(&open(&mut c, "g", share::ACCESS_BOTH, false));
    assert_eq!(write(&mut c, &fh, oc.stateid, b"c's"), Status::OK);
    assert_eq!(stats.recall_failed.load(Ordering::Relaxed), 1);
    assert_eq!(stats.recalled.load(Ordering::Relaxed), 2);
}

#[test]
fn another_clients_io_with_the_anonymous_stateid_recalls_a_conflicting_delegation() {
    let srv = server(true);
    let (mut a, recalls) = client(&srv, "holder");
    let (mut b, _) = client(&srv, "anonymous");
    // A holds a read delegation: B's anonymous READ goes through (reads
    // do not conflict), B's anonymous WRITE recalls it.
    let (oa, fh) = opened(&open(&mut a, "anon", share::ACCESS_READ, true));
    let OpenDelegation4::Read(da, ..) = oa.delegation else {
        panic!("{:?}", oa.delegation)
    };
    assert_eq!(read(&mut b, &fh, Stateid4::ANONYMOUS), Status::OK);
    assert!(recalls.lock().unwrap().is_empty());
    assert_eq!(write(&mut b, &fh, Stateid4::ANONYMOUS, b"b"), Status::DELAY);
    take_call(&mut a);
    assert_eq!(*recalls.lock().unwrap(), vec![da]);
    assert_eq!(delegreturn(&mut a, &fh, da), Status::OK);
    assert_eq!(write(&mut b, &fh, Stateid4::ANONYMOUS, b"b"), Status::OK);
    // A write delegation (on another file) is recalled by B's anonymous
    // READ, and by the READ bypass stateid's too.
    let (ow, fw) = opened(&open(&mut a, "anon-w", share::ACCESS_BOTH, true));
    let OpenDelegation4::Write(dw, ..) = ow.delegation else {
        panic!("{:?}", ow.delegation)
    };
    assert_eq!(write(&mut a, &fw, dw, b"cached at a"), Status::OK);
    assert_eq!(read(&mut b, &fw, Stateid4::BYPASS), Status::DELAY);
    take_call(&mut a);
    assert_eq!(recalls.lock().unwrap().last(), Some(&dw));
    assert_eq!(read(&mut b, &fw, Stateid4::ANONYMOUS), Status::DELAY);
    assert_eq!(delegreturn(&mut a, &fw, dw), Status::OK);
    assert_eq!(read(&mut b, &fw, Stateid4::ANONYMOUS), Status::OK);
}
