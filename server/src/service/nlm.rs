//! NFSv3 file locking: the Network Lock Manager, version 4 (XNFS chapter
//! 10; the Linux lockd's behaviour as the reference), program 100021.
//!
//! - Locks live in the same table as NFSv4's ([`State4`]'s `nlm_*`
//!   methods), so a v3 lock and a v4 lock on the same bytes conflict. An
//!   owner is a client host (its address and `caller_name`) with the `svid`
//!   it sends, as the Linux lockd identifies owners.
//! - A blocking LOCK that conflicts is answered NLM4_BLOCKED and waits in
//!   a queue (first come, first granted); when the range frees up the lock
//!   is taken for the waiter and the server calls GRANTED on the client's
//!   lock manager (found through the client's rpcbind), from the address
//!   the client sent the LOCK to, since the Linux client matches GRANTED
//!   against the server's address. A client that refuses or cannot be
//!   reached loses the lock again. The queue is retried when an NLM lock
//!   goes and once a second (NFSv4 unlocks).
//! - The `_MSG` forms run the procedure and send the result back as the
//!   matching `_RES` call to the caller's lock manager.
//! - SHARE/UNSHARE keep DOS-style share reservations among NLM clients.
//! - After a restart with `--state`, a grace period lets the clients of the
//!   previous instance reclaim (`reclaim` set): new locks are refused with
//!   NLM4_DENIED_GRACE_PERIOD until it ends (the status monitor, `nsm`,
//!   tells them).
//! - A file with NLM locks or waiters is kept by the store while it has
//!   them, even if its last name goes (as the Linux lockd keeps it open).
//! - Bounds: at most [`MAX_HOSTS`] client hosts holding something (hosts
//!   that hold nothing are forgotten when the table is full) and
//!   [`MAX_WAITERS`] waiting locks per host; beyond them,
//!   NLM4_DENIED_NOLOCKS.
//!
//! NLM and NSM are served over TCP (on the NFS port) and UDP (a port of
//! their own), never over RPC-over-RDMA: the Linux client sends its lock
//! calls over TCP also when its NFS mount is over RDMA.

use super::nfs4::state::{FileKey, NlmOwner, State4};
use super::nsm::Watcher;
use super::{Caller, Reply, ReplyBody, Service};
use crate::rpc_client::call_registered;
use crate::store::{handle_fsid, Store};
use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::nfs4::ops::LockDenied;
use nfsrdma_xdr::nfs4::LockType4;
use nfsrdma_xdr::nlm::{self, proc_, *};
use nfsrdma_xdr::rpc::AcceptStat;
use nfsrdma_xdr::{Decoder, Xdr};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most client hosts the lock manager keeps.
pub const MAX_HOSTS: usize = 4096;
/// Most waiting (blocked) locks per host.
pub const MAX_WAITERS: usize = 256;
/// How often the waiting locks are retried without a wake-up.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// A client host: where it calls from and the name it gives.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host {
    /// Its address.
    pub ip: IpAddr,
    /// Its `caller_name`.
    pub name: Bytes,
}

#[derive(Debug, Clone)]
struct HostInfo {
    host: Host,
    /// Our address as the host knows it (where its calls arrive).
    local: Option<IpAddr>,
}

/// A blocked LOCK, waiting.
#[derive(Debug, Clone)]
struct Waiter {
    owner: NlmOwner,
    file: FileKey,
    write: bool,
    start: u64,
    end: u64,
    /// Echoed in GRANTED (the Linux client matches the handle, svid and
    /// range).
    args: Nlm4TestArgs,
}

#[derive(Debug, Clone)]
struct ShareRes {
    host: u32,
    oh: Bytes,
    /// Denied to others (`fsh4_mode`, bit 0 read, bit 1 write).
    deny: u32,
    /// Used (`fsh4_access`).
    access: u32,
}

#[derive(Default)]
struct Tables {
    ids: HashMap<Host, u32>,
    hosts: HashMap<u32, HostInfo>,
    next: u32,
    waiting: Vec<Waiter>,
    shares: HashMap<FileKey, Vec<ShareRes>>,
}

/// Counters of the lock manager.
#[derive(Debug, Default)]
pub struct NlmStats {
    /// Locks granted at once.
    pub granted: AtomicU64,
    /// LOCKs and TESTs that found a conflict.
    pub denied: AtomicU64,
    /// LOCKs answered NLM4_BLOCKED.
    pub blocked: AtomicU64,
    /// GRANTED calls the client accepted.
    pub granted_callbacks: AtomicU64,
    /// GRANTED calls that failed or were refused (the lock went again).
    pub callback_failures: AtomicU64,
    /// Calls refused with NLM4_DENIED_GRACE_PERIOD.
    pub grace_refusals: AtomicU64,
    /// Calls refused with NLM4_DENIED_NOLOCKS.
    pub nolocks: AtomicU64,
}

struct Shared {
    state: Arc<State4>,
    /// Where a client's rpcbind listens (111; tests change it).
    rpcbind_port: u16,
    stores: Vec<Arc<Store>>,
    t: Mutex<Tables>,
    stats: NlmStats,
}

enum Job {
    /// Locks went: retry the waiters now.
    Wake,
    /// A call to a client.
    Call(Box<dyn FnOnce(&Shared) + Send>),
}

/// The lock manager.
pub struct Nlm {
    shared: Arc<Shared>,
    jobs: mpsc::Sender<Job>,
}

/// An NLM lock's range as `[start, end)`: length 0, or one that runs past
/// the largest offset, is "to the end of the file".
fn range(offset: u64, len: u64) -> (u64, u64) {
    match offset.checked_add(len) {
        Some(end) if len != 0 => (offset, end),
        _ => (offset, u64::MAX),
    }
}

fn holder(d: &LockDenied) -> Nlm4Holder {
    Nlm4Holder {
        exclusive: d.locktype == LockType4::Write || d.locktype == LockType4::WriteW,
        svid: NlmOwner::of(d).map_or(0, |o| o.svid),
        oh: NetObj(d.owner.owner.0.clone()),
        l_offset: d.offset,
        l_len: if d.length == u64::MAX { 0 } else { d.length },
    }
}

impl Nlm {
    /// A lock manager over `state`'s lock table and the exports' stores,
    /// finding clients' lock managers through their rpcbind at
    /// `rpcbind_port`.
    pub fn new(state: Arc<State4>, stores: Vec<Arc<Store>>, rpcbind_port: u16) -> Nlm {
        let shared = Arc::new(Shared {
            state,
            rpcbind_port,
            stores,
            t: Mutex::new(Tables::default()),
            stats: NlmStats::default(),
        });
        let (jobs, rx) = mpsc::channel();
        let s = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("nlm-callbacks".into())
            .spawn(move || callbacks(&s, &rx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the lock manager's callback thread: blocked locks are granted only when their clients ask again");
        }
        Nlm { shared, jobs }
    }

    /// The counters.
    pub fn stats(&self) -> &NlmStats {
        &self.shared.stats
    }

    /// One line of the stop report (empty while no lock call came).
    pub fn report(&self) -> String {
        let s = &self.shared.stats;
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let all = [
            &s.granted,
            &s.denied,
            &s.blocked,
            &s.grace_refusals,
            &s.nolocks,
        ];
        if all.iter().all(|c| v(c) == 0) {
            return String::new();
        }
        format!(
            "nlm: locks granted {}, denied {}, blocked {}, GRANTED callbacks taken {} failed {}, \
             refused in grace {}, refused NOLOCKS {}\n",
            v(&s.granted),
            v(&s.denied),
            v(&s.blocked),
            v(&s.granted_callbacks),
            v(&s.callback_failures),
            v(&s.grace_refusals),
            v(&s.nolocks)
        )
    }

    /// The hosts holding locks now, with our address as each knew it
    /// (for the status monitor to tell after a restart).
    pub fn watchers(&self) -> Vec<Watcher> {
        let ids = self.shared.state.nlm_hosts_holding();
        let t = self.shared.lock();
        let mut v: Vec<Watcher> = ids
            .iter()
            .filter_map(|id| t.hosts.get(id))
            .map(|h| Watcher {
                host: h.host.clone(),
                local: h.local,
            })
            .collect();
        v.sort_by(|a, b| (a.host.ip, &a.host.name).cmp(&(b.host.ip, &b.host.name)));
        v.dedup();
        v
    }

    /// Drops every lock, share and waiter of the hosts `gone` picks (FREE_ALL,
    /// or the host restarted); the number of locks and shares dropped.
    pub fn forget_hosts(&self, gone: impl Fn(&Host) -> bool) -> usize {
        let sh = &self.shared;
        let mut files = Vec::new();
        let mut shares = 0;
        let ids: Vec<u32> = {
            let mut t = sh.lock();
            let ids: Vec<u32> = t
                .hosts
                .iter()
                .filter(|(_, h)| gone(&h.host))
                .map(|(id, _)| *id)
                .collect();
            t.waiting.retain(|w| {
                let keep = !ids.contains(&w.owner.host);
                if !keep {
                    files.push(w.file);
                }
                keep
            });
            t.shares.retain(|f, v| {
                let before = v.len();
                v.retain(|s| !ids.contains(&s.host));
                if before != v.len() {
                    shares += before - v.len();
                    files.push(*f);
                }
                !v.is_empty()
            });
            ids
        };
        files.extend(sh.state.nlm_files_of(|h| ids.contains(&h)));
        let locks = sh.state.nlm_release_hosts(|h| ids.contains(&h));
        files.sort();
        files.dedup();
        for f in files {
            sh.unpin(f);
        }
        let _ = self.jobs.send(Job::Wake);
        locks + shares
    }

    /// Whether the lock manager keeps `file`: a lock, a share or a waiter
    /// on it (the store must not free it).
    pub fn uses(&self, file: FileKey) -> bool {
        self.shared.uses(file)
    }

    fn host_id(&self, caller: &Caller, name: &CallerName) -> Option<u32> {
        let host = Host {
            ip: caller.ctx.ip(),
            name: name.0.clone(),
        };
        let mut t = self.shared.lock();
        if let Some(id) = t.ids.get(&host) {
            return Some(*id);
        }
        if t.hosts.len() >= MAX_HOSTS {
            // Forget the hosts that hold nothing (no lock, waiter or
            // share); refuse only when every one holds something.
            let holding = self.shared.state.nlm_hosts_holding();
            let Tables {
                ids,
                hosts,
                waiting,
                shares,
                ..
            } = &mut *t;
            hosts.retain(|id, _| {
                holding.contains(id)
                    || waiting.iter().any(|w| w.owner.host == *id)
                    || shares.values().flatten().any(|s| s.host == *id)
            });
            ids.retain(|_, id| hosts.contains_key(id));
            if hosts.len() >= MAX_HOSTS {
                return None;
            }
        }
        t.next = t.next.wrapping_add(1);
        let id = t.next;
        t.ids.insert(host.clone(), id);
        t.hosts.insert(
            id,
            HostInfo {
                host,
                local: caller.ctx.local.map(|a| a.ip()),
            },
        );
        Some(id)
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets the store free `file` if nothing keeps it any more: no NFSv4
    /// open, no NLM lock, share or waiter. Takes the store's lock first
    /// (the order everywhere: store, then these tables, then the state).
    fn unpin(&self, file: FileKey) {
        let Some(store) = self.stores.get(file.0) else {
            return;
        };
        let mut fs = store.write();
        if !self.uses(file) && !self.state.is_open(file) {
            fs.release(file.1);
        }
    }

    fn uses(&self, file: FileKey) -> bool {
        let t = self.lock();
        t.waiting.iter().any(|w| w.file == file)
            || t.shares.contains_key(&file)
            || self.state.nlm_file_locked(file)
    }

    /// Takes the locks of the waiters that can have them now; they are
    /// then told with GRANTED.
    fn retry_waiters(&self) -> Vec<(Waiter, HostInfo)> {
        let mut t = self.lock();
        if t.waiting.is_empty() {
            return Vec::new();
        }
        let mut granted = Vec::new();
        let mut i = 0;
        while i < t.waiting.len() {
            let w = &t.waiting[i];
            if self
                .state
                .nlm_lock(w.owner, w.file, w.write, w.start, w.end)
                .is_ok()
            {
                let w = t.waiting.remove(i);
                if let Some(h) = t.hosts.get(&w.owner.host) {
                    granted.push((w, h.clone()));
                }
            } else {
                i += 1;
            }
        }
        granted
    }

    /// Tells a waiter's client that it holds its lock now; if it does not
    /// take it, the lock goes again.
    fn send_granted(&self, w: &Waiter, h: &HostInfo) {
        let r = call_registered::<Nlm4Res>(
            h.host.ip,
            self.rpcbind_port,
            h.local,
            nlm::PROGRAM,
            nlm::VERSION,
            proc_::GRANTED,
            &w.args,
        );
        let why = match r {
            Ok(res) if res.stat == Nlm4Stat::Granted => {
                self.stats.granted_callbacks.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(res) => format!("the client answered {:?}", res.stat),
            Err(e) => e.to_string(),
        };
        self.stats.callback_failures.fetch_add(1, Ordering::Relaxed);
        tracing::info!(client = %h.host.ip, svid = w.owner.svid, why = %why,
            "NLM GRANTED not taken: the lock is released");
        self.state.nlm_unlock(w.owner, w.file, w.start, w.end);
        self.unpin(w.file);
    }
}

/// The most calls to clients in flight at once; more wait their turn on
/// the lock manager's own thread.
const MAX_CALLS_IN_FLIGHT: usize = 16;

fn callbacks(sh: &Arc<Shared>, rx: &mpsc::Receiver<Job>) {
    let in_flight = Arc::new(AtomicUsize::new(0));
    // A call to a slow or silent client takes seconds: each goes on a
    // thread of its own so that the others are not held up behind it.
    let run = |f: Box<dyn FnOnce(&Shared) + Send>| {
        if in_flight.fetch_add(1, Ordering::AcqRel) >= MAX_CALLS_IN_FLIGHT {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            return f(sh);
        }
        let (sh2, n) = (sh.clone(), in_flight.clone());
        let spawned = std::thread::Builder::new()
            .name("nlm-call".into())
            .spawn(move || {
                f(&sh2);
                n.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            in_flight.fetch_sub(1, Ordering::AcqRel);
            // A GRANTED lost so leaves the lock with its waiter, whose
            // client finds it when it asks again (every 30 s on Linux).
            tracing::warn!(error = %e, "no thread for a call to a client: it is dropped");
        }
    };
    loop {
        match rx.recv_timeout(RETRY_EVERY) {
            Ok(Job::Call(f)) => run(f),
            Ok(Job::Wake) | Err(RecvTimeoutError::Timeout) => {
                for (w, h) in sh.retry_waiters() {
                    run(Box::new(move |sh: &Shared| sh.send_granted(&w, &h)));
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// What a procedure answers: a result to encode, or (for the `_MSG`
/// forms) the same sent back as a `_RES` call.
enum Answer {
    Res(Nlm4Res),
    Test(Nlm4TestRes),
    Share(Nlm4ShareRes),
    Void,
}

impl Answer {
    fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            Answer::Res(r) => r.encode(&mut b),
            Answer::Test(r) => r.encode(&mut b),
            Answer::Share(r) => r.encode(&mut b),
            Answer::Void => {}
        }
        b.freeze()
    }
}

impl Service {
    /// An NLM call (any version: only 4 is served).
    pub(super) fn nlm_call(
        &self,
        caller: &Caller,
        xid: u32,
        vers: u32,
        proc_: u32,
        mut args: Decoder,
    ) -> Reply {
        if vers != nlm::VERSION {
            return Reply::error(xid, AcceptStat::ProgMismatch { low: 4, high: 4 });
        }
        let answer = match self.nlm_dispatch(caller, proc_, &mut args) {
            Ok(a) => a,
            Err(AcceptStat::GarbageArgs) => {
                tracing::debug!(peer = %caller.ctx.peer, proc = proc_, "NLM GARBAGE_ARGS");
                self.metrics.garbage();
                return Reply::error(xid, AcceptStat::GarbageArgs);
            }
            Err(e) => return Reply::error(xid, e),
        };
        if let Err(e) = args.finish("NLM arguments") {
            tracing::debug!(peer = %caller.ctx.peer, proc = proc_, error = %e, "NLM GARBAGE_ARGS");
            self.metrics.garbage();
            return Reply::error(xid, AcceptStat::GarbageArgs);
        }
        // The `_MSG` forms: the result goes back as a call.
        let res_proc = match proc_ {
            proc_::TEST_MSG => Some(proc_::TEST_RES),
            proc_::LOCK_MSG => Some(proc_::LOCK_RES),
            proc_::CANCEL_MSG => Some(proc_::CANCEL_RES),
            proc_::UNLOCK_MSG => Some(proc_::UNLOCK_RES),
            proc_::GRANTED_MSG => Some(proc_::GRANTED_RES),
            _ => None,
        };
        match res_proc {
            Some(p) => {
                self.nlm_send_res(caller, p, answer);
                Reply::success(xid, ReplyBody::Void)
            }
            None => Reply::success(xid, ReplyBody::Raw(answer.encode())),
        }
    }

    fn nlm_send_res(&self, caller: &Caller, proc_: u32, answer: Answer) {
        let ip = caller.ctx.ip();
        let from = caller.ctx.local.map(|a| a.ip());
        let send = move |sh: &Shared| {
            let port = sh.rpcbind_port;
            let r = match &answer {
                Answer::Res(r) => {
                    call_registered::<()>(ip, port, from, nlm::PROGRAM, nlm::VERSION, proc_, r)
                }
                Answer::Test(r) => {
                    call_registered::<()>(ip, port, from, nlm::PROGRAM, nlm::VERSION, proc_, r)
                }
                Answer::Share(_) | Answer::Void => Ok(()),
            };
            if let Err(e) = r {
                tracing::info!(client = %ip, proc = proc_, error = %e, "NLM _RES call failed");
            }
        };
        let _ = self.nlm.jobs.send(Job::Call(Box::new(send)));
    }

    fn nlm_dispatch(
        &self,
        caller: &Caller,
        proc_: u32,
        args: &mut Decoder,
    ) -> Result<Answer, AcceptStat> {
        let garbage = |_| AcceptStat::GarbageArgs;
        Ok(match proc_ {
            proc_::NULL => Answer::Void,
            proc_::TEST | proc_::TEST_MSG => {
                let a = Nlm4TestArgs::decode(args).map_err(garbage)?;
                Answer::Test(self.nlm_test(caller, a))
            }
            proc_::LOCK | proc_::LOCK_MSG | proc_::NM_LOCK => {
                let mut a = Nlm4LockArgs::decode(args).map_err(garbage)?;
                if proc_ == proc_::NM_LOCK {
                    a.block = false;
                }
                Answer::Res(self.nlm_lock(caller, a))
            }
            proc_::CANCEL | proc_::CANCEL_MSG => {
                let a = Nlm4CancArgs::decode(args).map_err(garbage)?;
                Answer::Res(self.nlm_cancel(caller, a))
            }
            proc_::UNLOCK | proc_::UNLOCK_MSG => {
                let a = Nlm4UnlockArgs::decode(args).map_err(garbage)?;
                Answer::Res(self.nlm_unlock(caller, a))
            }
            // This server has no blocked locks of its own to be granted.
            proc_::GRANTED | proc_::GRANTED_MSG => {
                let a = Nlm4TestArgs::decode(args).map_err(garbage)?;
                Answer::Res(Nlm4Res {
                    cookie: a.cookie,
                    stat: Nlm4Stat::Denied,
                })
            }
            // Results of calls this server does not make: taken and dropped.
            proc_::TEST_RES => {
                Nlm4TestRes::decode(args).map_err(garbage)?;
                Answer::Void
            }
            proc_::LOCK_RES | proc_::CANCEL_RES | proc_::UNLOCK_RES | proc_::GRANTED_RES => {
                Nlm4Res::decode(args).map_err(garbage)?;
                Answer::Void
            }
            proc_::SHARE | proc_::UNSHARE => {
                let a = Nlm4ShareArgs::decode(args).map_err(garbage)?;
                Answer::Share(self.nlm_share(caller, a, proc_ == proc_::SHARE))
            }
            proc_::FREE_ALL => {
                let a = Nlm4Notify::decode(args).map_err(garbage)?;
                let n = self
                    .nlm
                    .forget_hosts(|h| h.ip == caller.ctx.ip() && h.name == a.name.0);
                tracing::info!(client = %caller.ctx.ip(), locks = n, "NLM FREE_ALL");
                Answer::Void
            }
            _ => return Err(AcceptStat::ProcUnavail),
        })
    }

    /// The file a lock call names, checked against the export's rules: a
    /// host the export does not list, or a `nolock` export, gets
    /// NLM4_DENIED_NOLOCKS; a handle that is not (or no longer) a file of
    /// ours NLM4_STALE_FH.
    fn nlm_file(&self, caller: &Caller, fh: &NetObj) -> Result<FileKey, Nlm4Stat> {
        let fsid = handle_fsid(fh).ok_or(Nlm4Stat::StaleFh)?;
        let idx = self
            .exports
            .iter()
            .position(|e| e.store.fsid() as u32 == fsid)
            .ok_or(Nlm4Stat::StaleFh)?;
        let ex = &self.exports[idx];
        let opts = ex.rules.options_for(caller.ctx.ip(), None);
        if opts.is_none_or(|o| o.nolock) {
            self.nlm.stats().nolocks.fetch_add(1, Ordering::Relaxed);
            return Err(Nlm4Stat::DeniedNolocks);
        }
        let ino = ex.store.read().resolve(fh).map_err(|_| Nlm4Stat::StaleFh)?;
        Ok((idx, ino))
    }

    fn nlm_owner(&self, caller: &Caller, l: &Nlm4Lock) -> Result<NlmOwner, Nlm4Stat> {
        match self.nlm.host_id(caller, &l.caller_name) {
            Some(host) => Ok(NlmOwner { host, svid: l.svid }),
            None => {
                self.nlm.stats().nolocks.fetch_add(1, Ordering::Relaxed);
                Err(Nlm4Stat::DeniedNolocks)
            }
        }
    }

    /// What TEST, CANCEL and UNLOCK act on: the file, the owner and the
    /// range; NLM4_DENIED_GRACE_PERIOD while a grace period is on (as the
    /// Linux lockd answers them then).
    fn nlm_target(
        &self,
        caller: &Caller,
        l: &Nlm4Lock,
    ) -> Result<(FileKey, NlmOwner, u64, u64), Nlm4Stat> {
        let file = self.nlm_file(caller, &l.fh)?;
        if self.nfs4.state.locks_in_grace(Instant::now()) {
            self.nlm
                .stats()
                .grace_refusals
                .fetch_add(1, Ordering::Relaxed);
            return Err(Nlm4Stat::DeniedGracePeriod);
        }
        let owner = self.nlm_owner(caller, l)?;
        let (start, end) = range(l.l_offset, l.l_len);
        Ok((file, owner, start, end))
    }

    fn nlm_test(&self, caller: &Caller, a: Nlm4TestArgs) -> Nlm4TestRes {
        let stat = (|| {
            let (file, owner, start, end) = self.nlm_target(caller, &a.alock)?;
            Ok(self
                .nfs4
                .state
                .nlm_test(owner, file, a.exclusive, start, end))
        })();
        Nlm4TestRes {
            cookie: a.cookie,
            stat: match stat {
                Ok(None) => Nlm4TestReply::Other(Nlm4Stat::Granted),
                Ok(Some(d)) => {
                    self.nlm.stats().denied.fetch_add(1, Ordering::Relaxed);
                    Nlm4TestReply::Denied(holder(&d))
                }
                Err(st) => Nlm4TestReply::Other(st),
            },
        }
    }

    fn nlm_lock(&self, caller: &Caller, a: Nlm4LockArgs) -> Nlm4Res {
        let stat = self.nlm_lock_inner(caller, &a).unwrap_or_else(|st| st);
        Nlm4Res {
            cookie: a.cookie,
            stat,
        }
    }

    fn nlm_lock_inner(&self, caller: &Caller, a: &Nlm4LockArgs) -> Result<Nlm4Stat, Nlm4Stat> {
        let file = self.nlm_file(caller, &a.alock.fh)?;
        let stats = self.nlm.stats();
        let now = Instant::now();
        // New locks wait for the grace period's end; reclaims come only
        // during it (as the Linux lockd answers both).
        if self.nfs4.state.locks_in_grace(now) != a.reclaim {
            stats.grace_refusals.fetch_add(1, Ordering::Relaxed);
            return Err(Nlm4Stat::DeniedGracePeriod);
        }
        let owner = self.nlm_owner(caller, &a.alock)?;
        let (start, end) = range(a.alock.l_offset, a.alock.l_len);
        let ex = &self.exports[file.0];
        // The store's lock first: the handle still names the file, and the
        // store keeps it while the lock (or the wait) lasts.
        let mut fs = ex.store.write();
        if fs.resolve(&a.alock.fh).ok() != Some(file.1) {
            return Err(Nlm4Stat::StaleFh);
        }
        let mut t = self.nlm.shared.lock();
        match self
            .nfs4
            .state
            .nlm_lock(owner, file, a.exclusive, start, end)
        {
            Ok(()) => {
                // A waiter of this owner for this range is served.
                t.waiting.retain(|w| {
                    !(w.owner == owner && w.file == file && w.start == start && w.end == end)
                });
                fs.hold(file.1);
                stats.granted.fetch_add(1, Ordering::Relaxed);
                Ok(Nlm4Stat::Granted)
            }
            Err(_) if a.block => {
                let already = t.waiting.iter().any(|w| {
                    w.owner == owner && w.file == file && w.start == start && w.end == end
                });
                if !already {
                    let mine = t
                        .waiting
                        .iter()
                        .filter(|w| w.owner.host == owner.host)
                        .count();
                    if mine >= MAX_WAITERS {
                        stats.nolocks.fetch_add(1, Ordering::Relaxed);
                        return Err(Nlm4Stat::DeniedNolocks);
                    }
                    t.waiting.push(Waiter {
                        owner,
                        file,
                        write: a.exclusive,
                        start,
                        end,
                        args: Nlm4TestArgs {
                            cookie: a.cookie.clone(),
                            exclusive: a.exclusive,
                            alock: a.alock.clone(),
                        },
                    });
                    fs.hold(file.1);
                }
                stats.blocked.fetch_add(1, Ordering::Relaxed);
                Ok(Nlm4Stat::Blocked)
            }
            Err(_) => {
                stats.denied.fetch_add(1, Ordering::Relaxed);
                Ok(Nlm4Stat::Denied)
            }
        }
    }

    fn nlm_cancel(&self, caller: &Caller, a: Nlm4CancArgs) -> Nlm4Res {
        let stat = (|| {
            let (file, owner, start, end) = self.nlm_target(caller, &a.alock)?;
            self.nlm.shared.lock().waiting.retain(|w| {
                !(w.owner == owner
                    && w.file == file
                    && w.start == start
                    && w.end == end
                    && w.write == a.exclusive)
            });
            self.nlm.shared.unpin(file);
            Ok(Nlm4Stat::Granted)
        })();
        Nlm4Res {
            cookie: a.cookie,
            stat: stat.unwrap_or_else(|st| st),
        }
    }

    fn nlm_unlock(&self, caller: &Caller, a: Nlm4UnlockArgs) -> Nlm4Res {
        let stat = (|| {
            let (file, owner, start, end) = self.nlm_target(caller, &a.alock)?;
            self.nfs4.state.nlm_unlock(owner, file, start, end);
            self.nlm.shared.unpin(file);
            let _ = self.nlm.jobs.send(Job::Wake);
            Ok(Nlm4Stat::Granted)
        })();
        Nlm4Res {
            cookie: a.cookie,
            stat: stat.unwrap_or_else(|st| st),
        }
    }

    fn nlm_share(&self, caller: &Caller, a: Nlm4ShareArgs, share: bool) -> Nlm4ShareRes {
        let stat = (|| {
            let s = &a.share;
            let file = self.nlm_file(caller, &s.fh)?;
            let in_grace = self.nfs4.state.locks_in_grace(Instant::now());
            if share && in_grace != a.reclaim {
                return Err(Nlm4Stat::DeniedGracePeriod);
            }
            let host = self
                .nlm
                .host_id(caller, &s.caller_name)
                .ok_or(Nlm4Stat::DeniedNolocks)?;
            let ex = &self.exports[file.0];
            let mut fs = ex.store.write();
            if fs.resolve(&s.fh).ok() != Some(file.1) {
                return Err(Nlm4Stat::StaleFh);
            }
            let mut t = self.nlm.shared.lock();
            let mine = |r: &ShareRes| r.host == host && r.oh == s.oh.0;
            if !share {
                if let Some(v) = t.shares.get_mut(&file) {
                    v.retain(|r| !mine(r));
                    if v.is_empty() {
                        t.shares.remove(&file);
                    }
                }
                drop(t);
                drop(fs);
                self.nlm.shared.unpin(file);
                return Ok(Nlm4Stat::Granted);
            }
            let (deny, access) = (s.mode as u32, s.access as u32);
            let v = t.shares.entry(file).or_default();
            if v.iter()
                .any(|r| !mine(r) && (r.deny & access != 0 || deny & r.access != 0))
            {
                let empty = v.is_empty();
                if empty {
                    t.shares.remove(&file);
                }
                return Ok(Nlm4Stat::Denied);
            }
            v.retain(|r| !mine(r));
            v.push(ShareRes {
                host,
                oh: s.oh.0.clone(),
                deny,
                access,
            });
            fs.hold(file.1);
            Ok(Nlm4Stat::Granted)
        })();
        Nlm4ShareRes {
            cookie: a.cookie,
            stat: stat.unwrap_or_else(|st| st),
            sequence: 0,
        }
    }

    /// The lock manager.
    pub fn nlm(&self) -> &Nlm {
        &self.nlm
    }
}
