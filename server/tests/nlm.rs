//! NFSv3 locking over TCP: the lock manager (NLM 4) and the status monitor
//! (NSM 1) against a fake client lock manager that plays the client's
//! rpcbind and lockd (GRANTED callbacks and `_RES` calls arrive there).

mod common;

use bytes::{Bytes, BytesMut};
use common::nfs4::V4;
use common::{accept_stat, assert_success, RawClient, TestServer};
use nfsrdma_server::service::ServiceConfig;
use nfsrdma_server::tcp::TcpConfig;
use nfsrdma_xdr::nfs3::*;
use nfsrdma_xdr::nfs4::{self, ResOp, Status};
use nfsrdma_xdr::nlm::{self, proc_, *};
use nfsrdma_xdr::nsm::{self, SmName, SmStatRes, StatChge};
use nfsrdma_xdr::record::{write_record, RecordReader};
use nfsrdma_xdr::rpc::{AcceptStat, MessageBody, RpcMessage};
use nfsrdma_xdr::{portmap, Decoder, Xdr};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const EXPORTS: &str = "/export *(rw,no_root_squash,insecure)";

/// The client side of the callbacks: rpcbind (GETPORT answers its own
/// port) and a lock manager that records every call and answers GRANTED
/// with `answer`.
struct FakeLockd {
    port: u16,
    calls: Arc<Mutex<Vec<(u32, Bytes)>>>,
    answer: Arc<Mutex<Nlm4Stat>>,
    slow: Arc<Slow>,
}

/// GRANTED calls for owner `svid` are answered after `delay`; every
/// GRANTED call records how many had been answered when it arrived.
#[derive(Default)]
struct Slow {
    svid: Mutex<Option<i32>>,
    answered: Mutex<usize>,
    /// (svid, GRANTEDs answered before it arrived)
    arrivals: Mutex<Vec<(i32, usize)>>,
}

impl FakeLockd {
    fn start() -> FakeLockd {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(Mutex::new(Nlm4Stat::Granted));
        let slow = Arc::new(Slow::default());
        let (c, a, sl) = (calls.clone(), answer.clone(), slow.clone());
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let (c, a, sl) = (c.clone(), a.clone(), sl.clone());
                std::thread::spawn(move || serve_fake(s, port, &c, &a, &sl));
            }
        });
        FakeLockd {
            port,
            calls,
            answer,
            slow,
        }
    }

    fn config(&self) -> ServiceConfig {
        ServiceConfig {
            client_rpcbind_port: self.port,
            ..ServiceConfig::default()
        }
    }

    /// Waits up to 10 s for a call of `proc_`; its arguments.
    fn wait_for(&self, proc_: u32) -> Bytes {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((_, b)) = self.calls.lock().unwrap().iter().find(|(p, _)| *p == proc_) {
                return b.clone();
            }
            assert!(Instant::now() < deadline, "no call of procedure {proc_}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn count(&self, proc_: u32) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(p, _)| *p == proc_)
            .count()
    }
}

fn serve_fake(
    mut s: TcpStream,
    port: u16,
    calls: &Mutex<Vec<(u32, Bytes)>>,
    answer: &Mutex<Nlm4Stat>,
    slow: &Slow,
) {
    let mut r = RecordReader::new(1 << 20);
    let mut buf = [0u8; 4096];
    loop {
        let rec = match r.next_record() {
            Ok(Some(rec)) => rec,
            Ok(None) => match s.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    r.extend(&buf[..n]);
                    continue;
                }
            },
            Err(_) => return,
        };
        let mut d = Decoder::new(rec);
        let h = RpcMessage::decode(&mut d).unwrap();
        let MessageBody::Call(c) = &h.body else {
            return;
        };
        let mut out = BytesMut::new();
        RpcMessage::accepted(h.xid, AcceptStat::Success).encode(&mut out);
        if c.prog == portmap::PROGRAM {
            let m = portmap::Mapping::decode(&mut d).unwrap();
            assert_eq!(m.prog, nlm::PROGRAM);
            u32::from(port).encode(&mut out);
        } else {
            assert_eq!(c.prog, nlm::PROGRAM);
            let args = d.into_rest();
            calls.lock().unwrap().push((c.proc_, args.clone()));
            if c.proc_ == proc_::GRANTED {
                let a = Nlm4TestArgs::from_bytes(args).unwrap();
                let before = *slow.answered.lock().unwrap();
                slow.arrivals.lock().unwrap().push((a.alock.svid, before));
                if *slow.svid.lock().unwrap() == Some(a.alock.svid) {
                    std::thread::sleep(Duration::from_secs(3));
                }
                *slow.answered.lock().unwrap() += 1;
                Nlm4Res {
                    cookie: a.cookie,
                    stat: *answer.lock().unwrap(),
                }
                .encode(&mut out);
            }
        }
        let mut rec = Vec::new();
        write_record(&mut rec, &out);
        if s.write_all(&rec).is_err() {
            return;
        }
    }
}

/// A client host of the lock manager: one connection, one caller name.
struct Locker {
    c: RawClient,
    name: &'static str,
}

impl Locker {
    fn new(addr: std::net::SocketAddr, name: &'static str) -> Locker {
        Locker {
            c: RawClient::connect(addr),
            name,
        }
    }

    fn lock_of(&self, fh: &NfsFh3, svid: i32, offset: u64, len: u64) -> Nlm4Lock {
        Nlm4Lock {
            caller_name: CallerName::new(self.name.as_bytes().to_vec()),
            fh: NetObj(fh.0.clone()),
            oh: NetObj::new(format!("{svid}@{}", self.name).into_bytes()),
            svid,
            l_offset: offset,
            l_len: len,
        }
    }

    fn call<T: Xdr>(&mut self, proc_: u32, args: &impl Xdr) -> T {
        let mut b = BytesMut::new();
        args.encode(&mut b);
        let (h, mut d) = self.c.call(nlm::PROGRAM, nlm::VERSION, proc_, &b);
        assert_success(&h);
        let r = T::decode(&mut d).unwrap();
        d.finish("NLM result").unwrap();
        r
    }

    #[allow(clippy::too_many_arguments)]
    fn lock(
        &mut self,
        fh: &NfsFh3,
        svid: i32,
        write: bool,
        offset: u64,
        len: u64,
        block: bool,
        reclaim: bool,
    ) -> Nlm4Stat {
        let r: Nlm4Res = self.call(
            proc_::LOCK,
            &Nlm4LockArgs {
                cookie: NetObj::from(b"ck".to_vec()),
                block,
                exclusive: write,
                alock: self.lock_of(fh, svid, offset, len),
                reclaim,
                state: 3,
            },
        );
        assert_eq!(r.cookie.as_bytes(), b"ck");
        r.stat
    }

    fn test(
        &mut self,
        fh: &NfsFh3,
        svid: i32,
        write: bool,
        offset: u64,
        len: u64,
    ) -> Nlm4TestReply {
        let r: Nlm4TestRes = self.call(
            proc_::TEST,
            &Nlm4TestArgs {
                cookie: NetObj::from(vec![9]),
                exclusive: write,
                alock: self.lock_of(fh, svid, offset, len),
            },
        );
        r.stat
    }

    fn unlock(&mut self, fh: &NfsFh3, svid: i32, offset: u64, len: u64) -> Nlm4Stat {
        let r: Nlm4Res = self.call(
            proc_::UNLOCK,
            &Nlm4UnlockArgs {
                cookie: NetObj::from(vec![1]),
                alock: self.lock_of(fh, svid, offset, len),
            },
        );
        r.stat
    }

    fn cancel(&mut self, fh: &NfsFh3, svid: i32, write: bool, offset: u64, len: u64) -> Nlm4Stat {
        let r: Nlm4Res = self.call(
            proc_::CANCEL,
            &Nlm4CancArgs {
                cookie: NetObj::from(vec![2]),
                block: true,
                exclusive: write,
                alock: self.lock_of(fh, svid, offset, len),
            },
        );
        r.stat
    }
}

fn create(c: &mut RawClient, name: &str) -> (NfsFh3, NfsFh3) {
    let root = c.mount("/export");
    match c.nfs(Nfs3Args::Create(Create3Args {
        where_: DirOpArgs3 {
            dir: root.clone(),
            name: Filename3::new(name.as_bytes().to_vec()),
        },
        how: CreateHow3::Unchecked(Sattr3::default()),
    })) {
        Nfs3Res::Create(NfsResult::Ok(ok)) => (root, ok.obj.unwrap()),
        r => panic!("{r:?}"),
    }
}

fn denied_by(r: Nlm4TestReply) -> Nlm4Holder {
    match r {
        Nlm4TestReply::Denied(h) => h,
        other => panic!("expected DENIED, got {other:?}"),
    }
}

#[test]
fn locks_conflict_between_owners_and_ranges_split_and_merge() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let (_, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    // An exclusive lock of bytes [100, 200).
    assert_eq!(a.lock(&f, 1, true, 100, 100, false, false), Granted);
    // Another host: TEST names the holder; LOCK without blocking is DENIED.
    let h = denied_by(b.test(&f, 7, false, 150, 1));
    assert_eq!(
        (h.exclusive, h.svid, h.l_offset, h.l_len),
        (true, 1, 100, 100)
    );
    assert_eq!(b.lock(&f, 7, false, 0, 101, false, false), Denied);
    // Another owner on the same host conflicts too; the owner itself not.
    assert_eq!(a.lock(&f, 2, true, 199, 1, false, false), Denied);
    assert_eq!(a.test(&f, 1, true, 0, 0), Nlm4TestReply::Other(Granted));
    // Around the range is free.
    assert_eq!(b.lock(&f, 7, true, 0, 100, false, false), Granted);
    assert_eq!(b.lock(&f, 7, true, 200, 50, false, false), Granted);
    // Length 0 runs to the end of the file: it meets b's lock at 200.
    assert_eq!(a.lock(&f, 3, false, 150, 0, false, false), Denied);
    // Unlocking the middle of a's range splits it: [100, 120) and [180, 200)
    // stay.
    assert_eq!(a.unlock(&f, 1, 120, 60), Granted);
    assert_eq!(a.test(&f, 2, true, 130, 40), Nlm4TestReply::Other(Granted));
    let h = denied_by(a.test(&f, 2, true, 110, 1));
    assert_eq!((h.l_offset, h.l_len), (100, 20));
    let h = denied_by(a.test(&f, 2, true, 185, 1));
    assert_eq!((h.l_offset, h.l_len), (180, 20));
    // Read locks share; a writer is kept out of them.
    assert_eq!(a.lock(&f, 4, false, 1000, 10, false, false), Granted);
    assert_eq!(b.lock(&f, 8, false, 1000, 10, false, false), Granted);
    assert_eq!(b.lock(&f, 9, true, 1005, 1, false, false), Denied);
    // A lock changes type in place (POSIX): a's read lock becomes a write
    // lock once b's read lock goes.
    assert_eq!(a.lock(&f, 4, true, 1000, 10, false, false), Denied);
    assert_eq!(b.unlock(&f, 8, 1000, 10), Granted);
    assert_eq!(a.lock(&f, 4, true, 1000, 10, false, false), Granted);
    let h = denied_by(b.test(&f, 8, false, 1000, 1));
    assert!(h.exclusive);
    // A range past the largest offset runs to the end (length 0 in TEST).
    assert_eq!(
        b.lock(&f, 10, true, u64::MAX - 5, 100, false, false),
        Granted
    );
    let h = denied_by(a.test(&f, 9, false, u64::MAX - 2, 1));
    assert_eq!((h.svid, h.l_offset, h.l_len), (10, u64::MAX - 5, 0));
    let rep = srv.service.nlm().report();
    assert!(rep.starts_with("nlm: locks granted "), "{rep}");
}

#[test]
fn a_blocked_lock_is_granted_by_a_callback_when_the_range_frees() {
    let fake = FakeLockd::start();
    let srv = TestServer::with_config(EXPORTS, TcpConfig::default(), fake.config());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let (_, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    assert_eq!(a.lock(&f, 1, true, 0, 0, false, false), Granted);
    assert_eq!(b.lock(&f, 5, true, 10, 20, true, false), Blocked);
    // Asking again (the Linux client polls) keeps one waiter.
    assert_eq!(b.lock(&f, 5, true, 10, 20, true, false), Blocked);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fake.count(proc_::GRANTED), 0, "granted while still held");
    assert_eq!(a.unlock(&f, 1, 0, 0), Granted);
    let g = Nlm4TestArgs::from_bytes(fake.wait_for(proc_::GRANTED)).unwrap();
    // The waiter's own lock comes back: handle, svid, range, type, cookie.
    assert_eq!(g.alock, b.lock_of(&f, 5, 10, 20));
    assert!(g.exclusive);
    assert_eq!(g.cookie.as_bytes(), b"ck");
    // b holds it now: a is denied, and b's poll is answered GRANTED.
    let h = denied_by(a.test(&f, 1, false, 15, 1));
    assert_eq!((h.svid, h.l_offset, h.l_len), (5, 10, 20));
    assert_eq!(b.lock(&f, 5, true, 10, 20, true, false), Granted);
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(fake.count(proc_::GRANTED), 1);
    let stats = srv.service.nlm().stats();
    assert_eq!(
        stats
            .granted_callbacks
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[test]
fn a_grant_the_client_refuses_is_released_and_a_cancelled_wait_is_never_granted() {
    let fake = FakeLockd::start();
    let srv = TestServer::with_config(EXPORTS, TcpConfig::default(), fake.config());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let (_, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    // A cancelled waiter gets nothing when the range frees.
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, false), Granted);
    assert_eq!(b.lock(&f, 5, true, 0, 10, true, false), Blocked);
    assert_eq!(b.cancel(&f, 5, true, 0, 10), Granted);
    assert_eq!(a.unlock(&f, 1, 0, 10), Granted);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fake.count(proc_::GRANTED), 0);
    assert_eq!(a.test(&f, 1, true, 0, 10), Nlm4TestReply::Other(Granted));
    // A client that answers GRANTED with DENIED (it stopped waiting) does
    // not keep the lock.
    *fake.answer.lock().unwrap() = Denied;
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, false), Granted);
    assert_eq!(b.lock(&f, 6, true, 0, 10, true, false), Blocked);
    assert_eq!(a.unlock(&f, 1, 0, 10), Granted);
    fake.wait_for(proc_::GRANTED);
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.lock(&f, 2, true, 0, 10, false, false) != Granted {
        assert!(
            Instant::now() < deadline,
            "the refused grant was never released"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let failures = srv
        .service
        .nlm()
        .stats()
        .callback_failures
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(failures, 1);
}

#[test]
fn nfsv3_and_nfsv4_locks_on_the_same_bytes_conflict() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let (_, f) = create(&mut a.c, "shared");
    let mut v = V4::new(srv.addr, "v4 client");
    let (open, fh4) = v.open("shared", false);
    use Nlm4Stat::*;
    // A v3 lock keeps a v4 LOCK out, and LOCKT reports it.
    assert_eq!(a.lock(&f, 1, true, 0, 100, false, false), Granted);
    match v.lock(&fh4, open, 50, 10) {
        nfs4::ops::LockRes::Denied(d) => assert_eq!((d.offset, d.length), (0, 100)),
        other => panic!("{other:?}"),
    }
    assert_eq!(a.unlock(&f, 1, 0, 100), Granted);
    // A v4 lock keeps a v3 lock out, and TEST reports it.
    let sid = match v.lock(&fh4, open, 50, 10) {
        nfs4::ops::LockRes::Ok(sid) => sid,
        other => panic!("{other:?}"),
    };
    assert_eq!(a.lock(&f, 1, false, 0, 0, false, false), Denied);
    let h = denied_by(a.test(&f, 1, false, 55, 1));
    assert_eq!((h.exclusive, h.l_offset, h.l_len), (true, 50, 10));
    // Released over v4, the v3 lock goes through.
    let r = v.run(vec![
        nfs4::ArgOp::Putfh(fh4.clone()),
        nfs4::ArgOp::Locku(nfs4::ops::LockuArgs {
            locktype: nfs4::LockType4::Write,
            seqid: 0,
            lock_stateid: sid,
            offset: 50,
            length: 10,
        }),
    ]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    assert!(matches!(r.results.last(), Some(ResOp::Locku(Ok(_)))));
    assert_eq!(a.lock(&f, 1, false, 0, 0, false, false), Granted);
}

#[test]
fn the_grace_period_admits_reclaims_only_for_nlm_and_nfsv4() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let (_, f) = create(&mut a.c, "f");
    let mut v = V4::new(srv.addr, "v4 client");
    let (open, fh4) = v.open("f", false);
    use Nlm4Stat::*;
    let state = &srv.service.nfs4().state;
    state.start_nlm_grace(Instant::now() + Duration::from_secs(600));
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, false), DeniedGracePeriod);
    assert_eq!(
        a.test(&f, 1, true, 0, 10),
        Nlm4TestReply::Other(DeniedGracePeriod)
    );
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, true), Granted);
    // New NFSv4 locks wait for it too.
    match v.lock(&fh4, open, 100, 10) {
        nfs4::ops::LockRes::Err(st) => assert_eq!(st, Status::GRACE),
        other => panic!("{other:?}"),
    }
    // Over, reclaims are refused and new locks taken.
    state.start_nlm_grace(Instant::now());
    assert_eq!(a.lock(&f, 2, true, 20, 10, false, true), DeniedGracePeriod);
    assert_eq!(a.lock(&f, 2, true, 20, 10, false, false), Granted);
    assert!(matches!(
        v.lock(&fh4, open, 100, 10),
        nfs4::ops::LockRes::Ok(_)
    ));
}

#[test]
fn nolock_exports_stale_handles_and_bad_calls_get_clear_answers() {
    let srv = TestServer::start(
        "/export *(rw,no_root_squash,insecure)\n/quiet *(rw,insecure,nolock)",
        TcpConfig::default(),
    );
    let mut a = Locker::new(srv.addr, "host-a");
    let (root, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    // A `nolock` export refuses at once.
    let quiet = a.c.mount("/quiet");
    assert_eq!(a.lock(&quiet, 1, true, 0, 0, false, false), DeniedNolocks);
    assert_eq!(
        a.test(&quiet, 1, true, 0, 0),
        Nlm4TestReply::Other(DeniedNolocks)
    );
    // A handle that is not one of ours, or of a removed file: STALE_FH.
    let bogus = NfsFh3(Bytes::from_static(b"not a handle"));
    assert_eq!(a.lock(&bogus, 1, true, 0, 0, false, false), StaleFh);
    let (_, g) = create(&mut a.c, "g");
    let r = a.c.nfs(Nfs3Args::Remove(Remove3Args {
        object: DirOpArgs3 {
            dir: root.clone(),
            name: "g".into(),
        },
    }));
    assert_eq!(r.status(), NfsStat3::Ok);
    assert_eq!(a.lock(&g, 1, true, 0, 0, false, false), StaleFh);
    // Truncated arguments, another version, an unknown procedure.
    let (h, _) = a.c.call(nlm::PROGRAM, 4, proc_::LOCK, &[0, 0, 0, 4]);
    assert_eq!(accept_stat(&h), Some(AcceptStat::GarbageArgs));
    let (h, _) = a.c.call(nlm::PROGRAM, 1, proc_::NULL, &[]);
    assert_eq!(
        accept_stat(&h),
        Some(AcceptStat::ProgMismatch { low: 4, high: 4 })
    );
    let (h, _) = a.c.call(nlm::PROGRAM, 4, 99, &[]);
    assert_eq!(accept_stat(&h), Some(AcceptStat::ProcUnavail));
    // The lock manager still works.
    assert_eq!(a.lock(&f, 1, true, 0, 0, false, false), Granted);
}

#[test]
fn a_locked_file_outlives_its_last_name_until_its_lock_goes() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let (root, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    assert_eq!(a.lock(&f, 1, true, 0, 0, false, false), Granted);
    let r = a.c.nfs(Nfs3Args::Remove(Remove3Args {
        object: DirOpArgs3 {
            dir: root,
            name: "f".into(),
        },
    }));
    assert_eq!(r.status(), NfsStat3::Ok);
    // The handle still names the file while the lock lasts.
    let r =
        a.c.nfs(Nfs3Args::Getattr(Getattr3Args { object: f.clone() }));
    assert_eq!(r.status(), NfsStat3::Ok);
    assert_eq!(a.unlock(&f, 1, 0, 0), Granted);
    let r =
        a.c.nfs(Nfs3Args::Getattr(Getattr3Args { object: f.clone() }));
    assert_eq!(r.status(), NfsStat3::Stale);
}

#[test]
fn free_all_and_sm_notify_release_a_hosts_locks() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let (_, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, false), Granted);
    assert_eq!(a.lock(&f, 2, true, 10, 10, false, false), Granted);
    assert_eq!(b.lock(&f, 3, true, 20, 10, false, false), Granted);
    let w = srv.service.nsm_watchers();
    assert_eq!(w.len(), 2, "{w:?}");
    // FREE_ALL names a host: only its locks go.
    let () = a.call(
        proc_::FREE_ALL,
        &Nlm4Notify {
            name: NotifyName::from("host-a"),
            state: 5,
        },
    );
    assert_eq!(b.lock(&f, 4, true, 0, 20, false, false), Granted);
    assert_eq!(a.lock(&f, 1, true, 25, 1, false, false), Denied);
    // SM_NOTIFY from a restarted host drops the locks of the hosts at its
    // address (every test host calls from 127.0.0.1: b's lock goes, and
    // so does what a had left).
    let mut b2 = RawClient::connect(srv.addr);
    let mut args = BytesMut::new();
    StatChge {
        mon_name: SmName::from("host-b"),
        state: 9,
    }
    .encode(&mut args);
    let (h, _) = b2.call(nsm::PROGRAM, nsm::VERSION, nsm::proc_::NOTIFY, &args);
    assert_success(&h);
    assert!(srv.service.nsm_watchers().is_empty());
    assert_eq!(a.lock(&f, 1, true, 0, 30, false, false), Granted);
    // SM_STAT answers the state number; SM_MON is not offered.
    let mut args = BytesMut::new();
    SmName::from("x").encode(&mut args);
    let (h, mut d) = b2.call(nsm::PROGRAM, nsm::VERSION, nsm::proc_::STAT, &args);
    assert_success(&h);
    let r = SmStatRes::decode(&mut d).unwrap();
    assert_eq!((r.res_stat, r.state), (nsm::SmRes::Succ, 1));
    let mut args = BytesMut::new();
    nsm::Mon::default().encode(&mut args);
    let (h, mut d) = b2.call(nsm::PROGRAM, nsm::VERSION, nsm::proc_::MON, &args);
    assert_success(&h);
    assert_eq!(
        SmStatRes::decode(&mut d).unwrap().res_stat,
        nsm::SmRes::Fail
    );
}

#[test]
fn share_reservations_between_hosts() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let (_, f) = create(&mut a.c, "f");
    let share = |l: &Locker, mode: Fsh4Mode, access: Fsh4Access| Nlm4ShareArgs {
        cookie: NetObj::from(vec![1]),
        share: Nlm4Share {
            caller_name: CallerName::new(l.name.as_bytes().to_vec()),
            fh: NetObj(f.0.clone()),
            oh: NetObj::from(vec![7]),
            mode,
            access,
        },
        reclaim: false,
    };
    let call = |l: &mut Locker, proc_: u32, mode: Fsh4Mode, access: Fsh4Access| {
        let args = share(l, mode, access);
        l.call::<Nlm4ShareRes>(proc_, &args).stat
    };
    use Fsh4Access as A;
    use Fsh4Mode as M;
    use Nlm4Stat::*;
    assert_eq!(call(&mut a, proc_::SHARE, M::DenyWrite, A::Read), Granted);
    // b may read but not write while a denies writing.
    assert_eq!(call(&mut b, proc_::SHARE, M::DenyNone, A::Write), Denied);
    assert_eq!(call(&mut b, proc_::SHARE, M::DenyNone, A::Read), Granted);
    assert_eq!(call(&mut a, proc_::UNSHARE, M::DenyWrite, A::Read), Granted);
    assert_eq!(
        call(&mut b, proc_::SHARE, M::DenyNone, A::ReadWrite),
        Granted
    );
}

#[test]
fn a_flood_of_waiting_locks_from_one_host_is_bounded_and_others_are_served() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let mut c = Locker::new(srv.addr, "host-c");
    let (_, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    assert_eq!(a.lock(&f, 1, true, 0, 0, false, false), Granted);
    let max = nfsrdma_server::service::nlm::MAX_WAITERS as i32;
    for svid in 0..max {
        assert_eq!(b.lock(&f, 100 + svid, true, 0, 1, true, false), Blocked);
    }
    assert_eq!(
        b.lock(&f, 100 + max, true, 0, 1, true, false),
        DeniedNolocks
    );
    // Another host still waits, and locks elsewhere are served.
    assert_eq!(c.lock(&f, 1, true, 0, 1, true, false), Blocked);
    let (_, g) = create(&mut a.c, "g");
    assert_eq!(c.lock(&g, 1, true, 0, 0, false, false), Granted);
}

#[test]
fn msg_forms_answer_with_res_calls_to_the_callers_lock_manager() {
    let fake = FakeLockd::start();
    let srv = TestServer::with_config(EXPORTS, TcpConfig::default(), fake.config());
    let mut a = Locker::new(srv.addr, "host-a");
    let (_, f) = create(&mut a.c, "f");
    let args = Nlm4LockArgs {
        cookie: NetObj::from(vec![4, 2]),
        block: false,
        exclusive: true,
        alock: a.lock_of(&f, 1, 0, 10),
        reclaim: false,
        state: 3,
    };
    let () = a.call(proc_::LOCK_MSG, &args);
    let r = Nlm4Res::from_bytes(fake.wait_for(proc_::LOCK_RES)).unwrap();
    assert_eq!(
        (r.cookie.as_bytes(), r.stat),
        (&[4u8, 2][..], Nlm4Stat::Granted)
    );
    let mut b = Locker::new(srv.addr, "host-b");
    let () = b.call(
        proc_::TEST_MSG,
        &Nlm4TestArgs {
            cookie: NetObj::from(vec![5]),
            exclusive: true,
            alock: b.lock_of(&f, 2, 5, 1),
        },
    );
    let r = Nlm4TestRes::from_bytes(fake.wait_for(proc_::TEST_RES)).unwrap();
    let h = denied_by(r.stat);
    assert_eq!((h.svid, h.l_offset, h.l_len), (1, 0, 10));
}

#[test]
fn a_restart_with_state_raises_the_nsm_state_and_gives_lock_clients_a_grace_period() {
    let dir = std::env::temp_dir().join(format!("nfsrdmad-nlm-grace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let state = dir.join("state");
    let args = [
        "--no-rdma",
        "--state",
        state.to_str().unwrap(),
        "--grace",
        "120",
    ];
    let nsm_state = |addr| {
        let mut c = RawClient::connect(addr);
        let mut a = BytesMut::new();
        SmName::from("me").encode(&mut a);
        let (h, mut d) = c.call(nsm::PROGRAM, nsm::VERSION, nsm::proc_::STAT, &a);
        assert_success(&h);
        SmStatRes::decode(&mut d).unwrap().state
    };
    use Nlm4Stat::*;
    let (child, addr) = common::serving(&args, std::process::Stdio::null());
    let first = nsm_state(addr);
    assert_eq!(first % 2, 1, "odd while up");
    let mut a = Locker::new(addr, "host-a");
    let (_, f) = create(&mut a.c, "f");
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, false), Granted);
    common::stop_daemon(child);

    // The next instance: a higher odd state; new locks wait, the old
    // client's reclaim is taken, and the file (and its handle) survived.
    let (child, addr) = common::serving(&args, std::process::Stdio::null());
    assert_eq!(nsm_state(addr), first + 2);
    let mut a = Locker::new(addr, "host-a");
    let mut b = Locker::new(addr, "host-b");
    assert_eq!(b.lock(&f, 7, true, 20, 10, false, false), DeniedGracePeriod);
    assert_eq!(a.lock(&f, 1, true, 0, 10, false, true), Granted);
    assert_eq!(
        b.test(&f, 7, true, 0, 1),
        Nlm4TestReply::Other(DeniedGracePeriod)
    );
    common::stop_daemon(child);

    // a's reclaimed lock was saved: grace again at the next start; a
    // gives up its locks (FREE_ALL) meanwhile.
    let (child, addr) = common::serving(&args, std::process::Stdio::null());
    assert_eq!(nsm_state(addr), first + 4);
    let mut a = Locker::new(addr, "host-a");
    let mut b = Locker::new(addr, "host-b");
    assert_eq!(b.lock(&f, 7, true, 20, 10, false, false), DeniedGracePeriod);
    let () = a.call(
        proc_::FREE_ALL,
        &Nlm4Notify {
            name: NotifyName::from("host-a"),
            state: 5,
        },
    );
    common::stop_daemon(child);
    // No lock clients at the stop: no grace period.
    let (child, addr) = common::serving(&args, std::process::Stdio::null());
    let mut b = Locker::new(addr, "host-b");
    assert_eq!(b.lock(&f, 7, true, 0, 10, false, false), Granted);
    common::stop_daemon(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_grant_to_a_client_that_is_gone_is_released_and_others_are_served() {
    // The client's rpcbind port answers nothing: its lock manager is gone.
    let dead = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = dead.local_addr().unwrap().port();
    drop(dead);
    let config = ServiceConfig {
        client_rpcbind_port: port,
        ..ServiceConfig::default()
    };
    let srv = TestServer::with_config(EXPORTS, TcpConfig::default(), config);
    let mut a = Locker::new(srv.addr, "host-a");
    let mut gone = Locker::new(srv.addr, "host-gone");
    let mut c = Locker::new(srv.addr, "host-c");
    let (_, f) = create(&mut a.c, "f");
    use Nlm4Stat::*;
    assert_eq!(a.lock(&f, 1, true, 0, 0, false, false), Granted);
    assert_eq!(gone.lock(&f, 2, true, 0, 0, true, false), Blocked);
    assert_eq!(a.unlock(&f, 1, 0, 0), Granted);
    // The grant cannot be delivered: the lock goes again, and c gets it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.lock(&f, 3, true, 0, 0, false, false) != Granted {
        assert!(
            Instant::now() < deadline,
            "the undeliverable grant kept the lock"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let st = srv.service.nlm().stats();
    assert_eq!(
        st.callback_failures
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        st.granted_callbacks
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
}

#[test]
fn the_host_table_forgets_idle_hosts_and_refuses_only_when_all_hold_locks() {
    let srv = TestServer::start(EXPORTS, TcpConfig::default());
    let mut a = Locker::new(srv.addr, "host-a");
    let (_, f) = create(&mut a.c, "f");
    let max = nfsrdma_server::service::nlm::MAX_HOSTS as u64;
    let name = |i: u64| -> &'static str { Box::leak(format!("idle-{i}").into_boxed_str()) };
    // A full table of hosts that only asked (TEST): a new host is served.
    for i in 0..max {
        a.name = name(i);
        assert_eq!(
            a.test(&f, 1, true, i, 1),
            Nlm4TestReply::Other(Nlm4Stat::Granted)
        );
    }
    a.name = "newcomer";
    assert_eq!(a.lock(&f, 1, true, 0, 1, false, false), Nlm4Stat::Granted);
    // A full table of hosts that each hold a lock: the next is refused.
    for i in 1..max {
        a.name = name(max + i);
        assert_eq!(
            a.lock(&f, 1, true, i, 1, false, false),
            Nlm4Stat::Granted,
            "host {i}"
        );
    }
    a.name = "one too many";
    assert_eq!(
        a.lock(&f, 1, true, max + 1, 1, false, false),
        Nlm4Stat::DeniedNolocks
    );
}

#[test]
fn nlm_and_nsm_answer_over_udp_and_nothing_else_does() {
    use nfsrdma_server::exports::Exports;
    use nfsrdma_server::service::Service;
    use nfsrdma_server::store::StoreConfig;
    let rules = Exports::parse(EXPORTS).unwrap();
    let ex = Service::exports_from_rules(&rules, &StoreConfig::default());
    let service = Arc::new(Service::new(ex, ServiceConfig::default()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let sock = rt
        .block_on(tokio::net::UdpSocket::bind("127.0.0.1:0"))
        .unwrap();
    let addr = sock.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    let task = rt.spawn(nfsrdma_server::udp::serve(service.clone(), sock, rx));
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_nonblocking(true).unwrap();
    let mut xid = 0x100;
    let mut call = |prog: u32, vers: u32, proc_: u32, args: &[u8]| -> (RpcMessage, Decoder) {
        xid += 1;
        let mut b = BytesMut::new();
        RpcMessage::call(xid, prog, vers, proc_, nfsrdma_xdr::rpc::OpaqueAuth::none())
            .encode(&mut b);
        b.extend_from_slice(args);
        client.send_to(&b, addr).unwrap();
        let mut buf = vec![0u8; 65536];
        let n = rt.block_on(async {
            // The server runs on this runtime: let it go while we wait.
            tokio::task::yield_now().await;
            tokio::time::timeout(Duration::from_secs(5), async {
                loop {
                    match client.recv(&mut buf) {
                        Ok(n) => return n,
                        Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                    }
                }
            })
            .await
            .expect("a UDP reply")
        });
        let mut d = Decoder::new(Bytes::copy_from_slice(&buf[..n]));
        let h = RpcMessage::decode(&mut d).unwrap();
        assert_eq!(h.xid, xid);
        (h, d)
    };
    let (h, _) = call(nlm::PROGRAM, nlm::VERSION, proc_::NULL, &[]);
    assert_success(&h);
    let mut a = BytesMut::new();
    SmName::from("me").encode(&mut a);
    let (h, mut d) = call(nsm::PROGRAM, nsm::VERSION, nsm::proc_::STAT, &a);
    assert_success(&h);
    assert_eq!(SmStatRes::decode(&mut d).unwrap().state, 1);
    // NFS is not served over UDP.
    let (h, _) = call(nfsrdma_xdr::nfs3::PROGRAM, 3, 0, &[]);
    assert_eq!(accept_stat(&h), Some(AcceptStat::ProgUnavail));
    let _ = tx.send(true);
    rt.block_on(task).unwrap();
}

#[test]
fn a_slow_client_does_not_hold_up_the_grants_of_others() {
    let fake = FakeLockd::start();
    *fake.slow.svid.lock().unwrap() = Some(666);
    let srv = TestServer::with_config(EXPORTS, TcpConfig::default(), fake.config());
    let mut a = Locker::new(srv.addr, "host-a");
    let mut b = Locker::new(srv.addr, "host-b");
    let (_, f) = create(&mut a.c, "f");
    let (_, g) = create(&mut a.c, "g");
    use Nlm4Stat::*;
    assert_eq!(a.lock(&f, 1, true, 0, 0, false, false), Granted);
    assert_eq!(a.lock(&g, 1, true, 0, 0, false, false), Granted);
    assert_eq!(b.lock(&f, 666, true, 0, 0, true, false), Blocked);
    assert_eq!(b.lock(&g, 5, true, 0, 0, true, false), Blocked);
    // The slow client's grant goes first; the other's arrives while the
    // slow one is still unanswered.
    assert_eq!(a.unlock(&f, 1, 0, 0), Granted);
    let deadline = Instant::now() + Duration::from_secs(10);
    while fake.slow.arrivals.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(a.unlock(&g, 1, 0, 0), Granted);
    while fake.slow.arrivals.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "the second grant never came");
        std::thread::sleep(Duration::from_millis(10));
    }
    let arrivals = fake.slow.arrivals.lock().unwrap().clone();
    assert_eq!(arrivals, vec![(666, 0), (5, 0)]);
}
