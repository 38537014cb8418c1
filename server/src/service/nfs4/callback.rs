//! The backchannel (RFC 8881 §2.10.3.1, §18.34, §20): the connections a
//! session's client takes the server's calls on, the calls themselves
//! (CB_NULL to probe the path, CB_COMPOUND led by CB_SEQUENCE), and
//! whether the path works, which SEQUENCE reports in its status flags
//! (SEQ4_STATUS_CB_PATH_DOWN_SESSION, SEQ4_STATUS_CB_PATH_DOWN).
//!
//! A transport that can carry calls to its client gives each connection a
//! [`BackConn`]: a way to send an RPC call message on it, and the place its
//! reader hands the replies it reads (RPC messages of type REPLY). The
//! session keeps the connections bound to its backchannel ([`Back`]), and
//! one thread per server sends the calls and waits for their replies,
//! with a timeout, so that no caller of the fore channel ever waits.

use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::nfs4::cb::{self, CbArgOp, CbCompoundArgs, CbCompoundRes, CbSequenceArgs};
use nfsrdma_xdr::nfs4::ops::{CallbackSecParms, CreateSessionArgs};
use nfsrdma_xdr::nfs4::{seq_status, session_flags, SessionId4, Status, Utf8Str};
use nfsrdma_xdr::rpc::{AcceptStat, AuthBody, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{BoundedVec, Decoder, Xdr};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use super::state::State4;
use crate::service::metrics::Transport;

/// Most connections one session keeps bound to its backchannel: binding
/// one more forgets the oldest.
const MAX_BACK_CONNS: usize = 4;

/// One transport connection as the backchannel sees it.
pub struct BackConn {
    /// The transport the connection is on.
    transport: Transport,
    /// Hands one RPC message to the connection's writer; `false` once the
    /// connection is gone.
    send: Box<dyn Fn(Vec<Bytes>) -> bool + Send + Sync>,
    /// Calls sent on this connection that wait for their reply, by xid.
    waiting: Mutex<HashMap<u32, mpsc::SyncSender<Bytes>>>,
    open: AtomicBool,
    /// The one thread that sends the connection's messages, when it has
    /// one (an RDMA connection's pool thread).
    home: Option<std::thread::ThreadId>,
}

impl BackConn {
    /// A connection on `transport` whose writer takes a message (its
    /// parts) through `send`.
    pub fn new(
        transport: Transport,
        send: impl Fn(Vec<Bytes>) -> bool + Send + Sync + 'static,
    ) -> Arc<BackConn> {
        Self::served_by(transport, None, send)
    }

    /// [`BackConn::new`] for a connection whose messages only thread
    /// `home` sends: a call handed to it goes out once that thread is
    /// free, so that thread must not wait for its reply.
    pub fn served_by(
        transport: Transport,
        home: Option<std::thread::ThreadId>,
        send: impl Fn(Vec<Bytes>) -> bool + Send + Sync + 'static,
    ) -> Arc<BackConn> {
        Arc::new(BackConn {
            transport,
            send: Box::new(send),
            waiting: Mutex::new(HashMap::new()),
            open: AtomicBool::new(true),
            home,
        })
    }

    /// Whether the calling thread is the one that sends the connection's
    /// messages (its calls cannot go out while this thread waits).
    pub fn served_here(&self) -> bool {
        self.home == Some(std::thread::current().id())
    }

    /// The transport the connection is on.
    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Whether the connection is still there.
    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire)
    }

    /// The connection ended: calls waiting on it fail at once.
    pub fn close(&self) {
        self.open.store(false, Ordering::Release);
        locked(&self.waiting).clear();
    }

    /// A reply the connection's reader read: to the call that waits for it.
    /// `false` when none does (a late reply, or one to no call of ours).
    pub fn deliver(&self, msg: Bytes) -> bool {
        let Some(xid) = msg
            .get(..4)
            .map(|b| u32::from_be_bytes(b.try_into().expect("4 bytes")))
        else {
            return false;
        };
        let waiter = locked(&self.waiting).remove(&xid);
        match waiter {
            Some(w) => w.try_send(msg).is_ok(),
            None => false,
        }
    }

    /// Sends a call; its reply arrives on the receiver.
    fn call(&self, xid: u32, parts: Vec<Bytes>) -> Option<mpsc::Receiver<Bytes>> {
        if !self.is_open() {
            return None;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        locked(&self.waiting).insert(xid, tx);
        // A writer that panics leaves no waiter behind it either.
        match catch_unwind(AssertUnwindSafe(|| (self.send)(parts))) {
            Ok(true) => Some(rx),
            Ok(false) => {
                self.forget(xid);
                None
            }
            Err(panic) => {
                self.forget(xid);
                std::panic::resume_unwind(panic)
            }
        }
    }

    fn forget(&self, xid: u32) {
        locked(&self.waiting).remove(&xid);
    }
}

/// Whether a session's backchannel was found to work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// Not probed since a connection was bound to it.
    Unknown,
    /// The last call was answered.
    Up,
    /// The last call failed (no answer in time, the connection gone, an
    /// RPC error).
    Down,
}

/// A session's backchannel as the state tables keep it.
pub struct Back {
    /// The client's callback program (CREATE_SESSION, BACKCHANNEL_CTL).
    pub program: u32,
    /// The credential calls carry.
    pub cred: OpaqueAuth,
    /// Connections bound to it, newest last.
    conns: Vec<Weak<BackConn>>,
    /// What the last call found.
    pub path: Path,
    /// Slot 0's sequence id: the server uses one slot.
    pub seq: u32,
    /// The minor version CB_COMPOUND carries: the session's (that of the
    /// COMPOUND that made it).
    pub minor: u32,
}

impl Back {
    /// The backchannel CREATE_SESSION asks for, if the server can grant
    /// it: the client wants it, the connection can carry calls, and one of
    /// the security flavours offered is one the server can send (AUTH_NONE
    /// or AUTH_SYS; not RPCSEC_GSS).
    pub fn granted(
        args: &CreateSessionArgs,
        minor: u32,
        conn: Option<&Arc<BackConn>>,
    ) -> Option<Back> {
        if args.flags & session_flags::CONN_BACK_CHAN == 0 {
            return None;
        }
        let conn = conn?;
        let cred = cred_for(&args.sec_parms.0)?;
        Some(Back {
            program: args.cb_program,
            cred,
            conns: vec![Arc::downgrade(conn)],
            path: Path::Unknown,
            seq: 0,
            minor,
        })
    }

    /// Binds one more connection (BIND_CONN_TO_SESSION): the path is
    /// probed again.
    pub fn bind(&mut self, conn: &Arc<BackConn>) {
        self.conns.retain(|c| {
            c.upgrade()
                .is_some_and(|c| c.is_open() && !Arc::ptr_eq(&c, conn))
        });
        if self.conns.len() >= MAX_BACK_CONNS {
            self.conns.remove(0);
        }
        self.conns.push(Arc::downgrade(conn));
        self.path = Path::Unknown;
    }

    /// The newest connection still open.
    pub fn conn(&self) -> Option<Arc<BackConn>> {
        self.conns
            .iter()
            .rev()
            .filter_map(Weak::upgrade)
            .find(|c| c.is_open())
    }

    /// SEQUENCE's status bits for the session: the path is down when the
    /// last call failed or no bound connection is left.
    pub fn status_flags(&self) -> u32 {
        if self.path == Path::Down || self.conn().is_none() {
            seq_status::CB_PATH_DOWN_SESSION | seq_status::CB_PATH_DOWN
        } else {
            0
        }
    }
}

/// The credential for the first security flavour offered that the server
/// can send.
fn cred_for(parms: &[CallbackSecParms]) -> Option<OpaqueAuth> {
    parms.iter().find_map(|p| match p {
        CallbackSecParms::None => Some(OpaqueAuth::none()),
        CallbackSecParms::Sys(s) => {
            let mut b = BytesMut::new();
            s.encode(&mut b);
            Some(OpaqueAuth {
                flavor: nfsrdma_xdr::rpc::flavor::AUTH_SYS,
                body: AuthBody(b.freeze()),
            })
        }
        CallbackSecParms::Gss(_) => None,
    })
}

/// Backchannel counters.
#[derive(Debug, Default)]
pub struct CbStats {
    /// Calls sent (CB_NULL and CB_COMPOUND).
    pub sent: AtomicU64,
    /// Calls answered with RPC success.
    pub answered: AtomicU64,
    /// Calls that failed: no connection, no answer in time, an RPC error.
    pub failed: AtomicU64,
    /// Of the calls sent, those on an RDMA connection (RFC 8167 backward
    /// calls); the rest went over TCP.
    pub rdma_sent: AtomicU64,
    /// Of those, answered with RPC success.
    pub rdma_answered: AtomicU64,
    /// Of those, failed.
    pub rdma_failed: AtomicU64,
    /// Panics while making a call or handing its result back (a bug of
    /// ours): each is logged, the call fails ([`CbError::Internal`]) and
    /// the session's later calls go on.
    pub panicked: AtomicU64,
}

/// What the callback thread is asked to do.
enum Job {
    /// CB_NULL on the session's backchannel; the path's state follows.
    Probe(SessionId4),
    /// A CB_COMPOUND (CB_SEQUENCE is put first); the result goes back.
    Compound {
        sid: SessionId4,
        ops: Vec<CbArgOp>,
        done: Box<dyn FnOnce(Result<CbCompoundRes, CbError>) + Send>,
    },
}

impl Job {
    fn session(&self) -> SessionId4 {
        match self {
            Job::Probe(sid) | Job::Compound { sid, .. } => *sid,
        }
    }
}

/// Most threads sending calls at once: each waits for one reply (a
/// session's backchannel has one slot, so its calls go one at a time).
const MAX_CALLERS: usize = 8;

/// The calls waiting to go, by session: a session is served by one
/// thread at a time, in order, so a client that does not answer holds up
/// its own calls only.
#[derive(Default)]
struct Queue {
    waiting: HashMap<SessionId4, std::collections::VecDeque<Job>>,
    /// Sessions with calls waiting and no thread on them, in turn.
    ready: std::collections::VecDeque<SessionId4>,
    /// Sessions a thread is serving.
    busy: std::collections::HashSet<SessionId4>,
    threads: usize,
    idle: usize,
    /// The server is going: idle threads end.
    closed: bool,
}

/// Why a callback failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CbError {
    /// The session has no backchannel, or no connection bound to it.
    #[error("no backchannel connection")]
    NoPath,
    /// No reply within the timeout.
    #[error("no reply in {0:?}")]
    Timeout(Duration),
    /// The reply was not an RPC success, or did not decode.
    #[error("bad reply: {0}")]
    BadReply(String),
    /// CB_SEQUENCE failed.
    #[error("CB_SEQUENCE: {0}")]
    Sequence(Status),
    /// Making the call panicked (a bug of ours, logged as such).
    #[error("the call was not made: the server's code for it failed")]
    Internal,
}

/// The server's calls to its clients: threads that send them and wait
/// for their replies, started as calls come (at most [`MAX_CALLERS`]),
/// each serving one session at a time.
pub struct Callbacks {
    queue: Arc<(Mutex<Queue>, std::sync::Condvar)>,
    worker: Arc<Worker>,
    /// Sessions with a probe queued: one at a time each, so that a client
    /// binding connections in a loop queues no more.
    probing: Arc<Mutex<std::collections::HashSet<SessionId4>>>,
    stats: Arc<CbStats>,
}

impl Drop for Callbacks {
    fn drop(&mut self) {
        let (lock, wake) = &*self.queue;
        locked(lock).closed = true;
        wake.notify_all();
    }
}

impl Callbacks {
    /// Callbacks for the sessions of `state`, each waiting `timeout` for
    /// its reply.
    pub fn new(state: Arc<State4>, timeout: Duration) -> Callbacks {
        let probing: Arc<Mutex<std::collections::HashSet<SessionId4>>> = Arc::default();
        let stats: Arc<CbStats> = Arc::default();
        Callbacks {
            queue: Arc::default(),
            worker: Arc::new(Worker {
                probing: probing.clone(),
                state: state.clone(),
                stats: stats.clone(),
                timeout,
                xid: AtomicU32::new(rand_xid()),
            }),
            probing,
            stats,
        }
    }

    /// The counters.
    pub fn stats(&self) -> &CbStats {
        &self.stats
    }

    /// One line of the stop report (empty while no call was sent).
    pub fn report(&self) -> String {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let s = &self.stats;
        if v(&s.sent) == 0 && v(&s.failed) == 0 && v(&s.panicked) == 0 {
            return String::new();
        }
        // Panics only when there were any: the line stays as it was
        // otherwise.
        let panics = match v(&s.panicked) {
            0 => String::new(),
            n => format!("; panics {n}"),
        };
        format!(
            "nfs4 backchannel: calls sent {}, answered {}, failed {}; over RDMA sent {}, answered {}, failed {}{panics}\n",
            v(&s.sent),
            v(&s.answered),
            v(&s.failed),
            v(&s.rdma_sent),
            v(&s.rdma_answered),
            v(&s.rdma_failed),
        )
    }

    fn submit(&self, job: Job) {
        let (lock, wake) = &*self.queue;
        let mut q = locked(lock);
        let sid = job.session();
        q.waiting.entry(sid).or_default().push_back(job);
        if !q.busy.contains(&sid) && !q.ready.contains(&sid) {
            q.ready.push_back(sid);
        }
        if q.idle == 0 && q.threads < MAX_CALLERS {
            let (queue, worker) = (self.queue.clone(), self.worker.clone());
            let spawned = std::thread::Builder::new()
                .name("nfs4-callbacks".into())
                .spawn(move || worker.serve(&queue));
            match spawned {
                Ok(_) => q.threads += 1,
                Err(e) => tracing::error!(error = %e, "cannot start a callback thread"),
            }
        }
        wake.notify_one();
    }

    /// Probes the session's backchannel with CB_NULL (unless a probe of
    /// it is queued already).
    pub fn probe(&self, sid: SessionId4) {
        if locked(&self.probing).insert(sid) {
            self.submit(Job::Probe(sid));
        }
    }

    /// Sends `ops` after a CB_SEQUENCE on the session's backchannel;
    /// `done` gets the reply.
    pub fn compound(
        &self,
        sid: SessionId4,
        ops: Vec<CbArgOp>,
        done: impl FnOnce(Result<CbCompoundRes, CbError>) + Send + 'static,
    ) {
        self.submit(Job::Compound {
            sid,
            ops,
            done: Box::new(done),
        });
    }
}

/// The mutex's data, also after a panic elsewhere while it was held: what
/// it guards is a few maps and counters, each changed in one step.
fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn rand_xid() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(16))
        .unwrap_or(1)
}

/// What the callback threads share.
struct Worker {
    probing: Arc<Mutex<std::collections::HashSet<SessionId4>>>,
    state: Arc<State4>,
    stats: Arc<CbStats>,
    timeout: Duration,
    xid: AtomicU32,
}

impl Worker {
    /// A callback thread: takes a session with calls waiting, makes its
    /// next call, and gives the session back.
    fn serve(&self, queue: &(Mutex<Queue>, std::sync::Condvar)) {
        let (lock, wake) = queue;
        let mut q = locked(lock);
        loop {
            let Some(sid) = q.ready.pop_front() else {
                if q.closed {
                    return;
                }
                q.idle += 1;
                q = wake.wait(q).unwrap_or_else(|p| p.into_inner());
                q.idle -= 1;
                continue;
            };
            let Some(job) = q.waiting.get_mut(&sid).and_then(|w| w.pop_front()) else {
                q.waiting.remove(&sid);
                continue;
            };
            q.busy.insert(sid);
            drop(q);
            self.run(job);
            q = locked(lock);
            q.busy.remove(&sid);
            if q.waiting.get(&sid).is_some_and(|w| !w.is_empty()) {
                q.ready.push_back(sid);
            } else {
                q.waiting.remove(&sid);
            }
        }
    }

    /// Makes one call. A panic in making it or in its `done` is caught
    /// here: the thread and the session's place in the queue must
    /// outlive a bug in one call, or the session's later calls (its
    /// recalls) would wait for ever. A CB_COMPOUND that panicked still
    /// hands `done` a result, [`CbError::Internal`], so its caller sees
    /// it failed.
    fn run(&self, job: Job) {
        match job {
            Job::Probe(sid) => {
                locked(&self.probing).remove(&sid);
                let r = self
                    .guarded("CB_NULL", || self.call(&sid, cb::PROC_NULL, None))
                    .unwrap_or(Err(CbError::Internal));
                let path = if r.is_ok() { Path::Up } else { Path::Down };
                if let Err(e) = &r {
                    tracing::info!(error = %e, "NFSv4 backchannel probe failed");
                }
                self.state.set_back_path(&sid, path);
            }
            Job::Compound { sid, ops, done } => {
                let r = self
                    .guarded("CB_COMPOUND", || self.compound(&sid, ops))
                    .unwrap_or(Err(CbError::Internal));
                self.guarded("a CB_COMPOUND's result", || done(r));
            }
        }
    }

    /// Runs `f`; a panic in it is logged and counted, and gives `None`.
    fn guarded<T>(&self, what: &str, f: impl FnOnce() -> T) -> Option<T> {
        match catch_unwind(AssertUnwindSafe(f)) {
            Ok(v) => Some(v),
            Err(payload) => {
                self.stats.panicked.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    call = what,
                    panic = crate::service::fault::message(payload.as_ref()),
                    "an NFSv4 callback panicked: the call failed, the backchannel goes on"
                );
                None
            }
        }
    }

    fn compound(&self, sid: &SessionId4, ops: Vec<CbArgOp>) -> Result<CbCompoundRes, CbError> {
        let (seq, minor) = self.state.next_back_seq(sid).ok_or(CbError::NoPath)?;
        let mut all = Vec::with_capacity(ops.len() + 1);
        all.push(CbArgOp::Sequence(CbSequenceArgs {
            sessionid: *sid,
            sequenceid: seq,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
            referring_call_lists: BoundedVec(vec![]),
        }));
        all.extend(ops);
        let args = CbCompoundArgs {
            tag: Utf8Str(Bytes::new()),
            minorversion: minor,
            callback_ident: 0,
            ops: all,
        };
        let mut b = BytesMut::new();
        args.encode(&mut b);
        let r = self
            .call(sid, cb::PROC_COMPOUND, Some(b.freeze()))
            .and_then(|mut d| {
                CbCompoundRes::decode(&mut d).map_err(|e| CbError::BadReply(e.to_string()))
            })
            .and_then(|res| match res.results.first() {
                // The reply must answer this call: the session, slot and
                // sequence id it was sent with.
                Some(cb::CbResOp::Sequence(Ok(ok)))
                    if ok.sessionid == *sid && ok.slotid == 0 && ok.sequenceid == seq =>
                {
                    self.state.back_seq_done(sid, seq);
                    Ok(res)
                }
                Some(cb::CbResOp::Sequence(Ok(ok))) => Err(CbError::BadReply(format!(
                    "CB_SEQUENCE answered slot {} sequence {} of another call (sent slot 0, \
                     sequence {seq})",
                    ok.slotid, ok.sequenceid
                ))),
                Some(cb::CbResOp::Sequence(Err(s))) => Err(CbError::Sequence(*s)),
                _ => Err(CbError::BadReply(format!(
                    "no CB_SEQUENCE result first (status {})",
                    res.status
                ))),
            });
        if let Err(e) = &r {
            tracing::info!(error = %e, "NFSv4 callback failed");
        }
        self.state
            .set_back_path(sid, if r.is_ok() { Path::Up } else { Path::Down });
        r
    }

    /// One call on the session's newest backchannel connection: the
    /// decoder at the reply's results.
    fn call(&self, sid: &SessionId4, proc_: u32, args: Option<Bytes>) -> Result<Decoder, CbError> {
        let Some((conn, program, cred)) = self.state.back_target(sid) else {
            self.stats.failed.fetch_add(1, Ordering::Relaxed);
            return Err(CbError::NoPath);
        };
        let rdma = conn.transport() == Transport::Rdma;
        let sent = |r: Result<Decoder, CbError>| {
            let s = &self.stats;
            let (all, over_rdma) = match &r {
                Ok(_) => (&s.answered, &s.rdma_answered),
                Err(_) => (&s.failed, &s.rdma_failed),
            };
            all.fetch_add(1, Ordering::Relaxed);
            if rdma {
                over_rdma.fetch_add(1, Ordering::Relaxed);
            }
            r
        };
        let xid = self.xid.fetch_add(1, Ordering::Relaxed);
        let mut h = BytesMut::new();
        RpcMessage::call(xid, program, cb::VERSION, proc_, cred).encode(&mut h);
        let mut parts = vec![h.freeze()];
        parts.extend(args);
        self.stats.sent.fetch_add(1, Ordering::Relaxed);
        if rdma {
            self.stats.rdma_sent.fetch_add(1, Ordering::Relaxed);
        }
        let Some(rx) = conn.call(xid, parts) else {
            return sent(Err(CbError::NoPath));
        };
        let reply = match rx.recv_timeout(self.timeout) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                conn.forget(xid);
                return sent(Err(CbError::Timeout(self.timeout)));
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return sent(Err(CbError::NoPath)),
        };
        let mut d = Decoder::new(reply);
        let h = match RpcMessage::decode(&mut d) {
            Ok(h) => h,
            Err(e) => return sent(Err(CbError::BadReply(e.to_string()))),
        };
        sent(match h.as_reply() {
            Some(ReplyBody::Accepted(a)) if a.stat == AcceptStat::Success => Ok(d),
            other => Err(CbError::BadReply(format!("{other:?}"))),
        })
    }
}

// ---- the operations that set up the backchannel ---------------------------

use super::Cx;
use crate::service::Service;
use nfsrdma_xdr::nfs4::ops::{BackchannelCtlArgs, BindConnArgs, BindConnResOk, CreateSessionResOk};

/// `channel_dir_from_client4` and `channel_dir_from_server4` values.
mod dir {
    pub const FORE: u32 = 1;
    pub const BACK: u32 = 2;
    pub const FORE_OR_BOTH: u32 = 3;
    pub const BACK_OR_BOTH: u32 = 7;
    pub const BOTH: u32 = 3;
}

impl Service {
    /// CREATE_SESSION: the session, with a backchannel on this connection
    /// when the client asks for one and the transport can carry it; the
    /// path is then probed with CB_NULL.
    pub(super) fn create_session4(
        &self,
        cx: &Cx,
        a: &CreateSessionArgs,
    ) -> Result<CreateSessionResOk, Status> {
        let back = Back::granted(a, cx.minor, cx.caller.ctx.back.as_ref());
        let res = self.nfs4.state.create_session(
            a,
            self.channel_limits(),
            cx.caller.cred.as_ref().map(|c| c.uid),
            back,
        )?;
        if res.flags & session_flags::CONN_BACK_CHAN != 0
            && self.nfs4.state.back_path(&res.sessionid) == Some(Path::Unknown)
        {
            self.nfs4.callbacks.probe(res.sessionid);
        }
        Ok(res)
    }

    /// BACKCHANNEL_CTL (RFC 8881 §18.33): the session's callback program
    /// and credential from now on.
    pub(super) fn backchannel_ctl4(&self, cx: &Cx, a: &BackchannelCtlArgs) -> Result<(), Status> {
        let sid = cx.session.ok_or(Status::OP_NOT_IN_SESSION)?;
        let cred = cred_for(&a.sec_parms.0).ok_or(Status::ENCR_ALG_UNSUPP)?;
        self.nfs4.state.set_back_program(&sid, a.cb_program, cred);
        Ok(())
    }

    /// BIND_CONN_TO_SESSION (RFC 8881 §18.34): the fore channel always;
    /// the backchannel too when asked for, if the connection can carry it
    /// and the session has one (a callback program from CREATE_SESSION).
    pub(super) fn bind_conn4(&self, cx: &Cx, a: &BindConnArgs) -> Result<BindConnResOk, Status> {
        let ctx = cx.caller.ctx;
        let wants_back = matches!(a.dir, dir::BACK | dir::FORE_OR_BOTH | dir::BACK_OR_BOTH);
        let bound_back = match (&ctx.back, wants_back) {
            (Some(conn), true) => self.nfs4.state.bind_back(&a.sessid, conn)?,
            _ => {
                self.nfs4
                    .state
                    .session_client(&a.sessid)
                    .ok_or(Status::BADSESSION)?;
                false
            }
        };
        let dir = match (a.dir, bound_back) {
            (dir::FORE, _) | (dir::FORE_OR_BOTH, false) => dir::FORE,
            (dir::FORE_OR_BOTH | dir::BACK_OR_BOTH, true) => dir::BOTH,
            (dir::BACK, true) => dir::BACK,
            _ => return Err(Status::INVAL),
        };
        if bound_back {
            self.nfs4.callbacks.probe(a.sessid);
        }
        Ok(BindConnResOk {
            sessid: a.sessid,
            dir,
            use_conn_in_rdma_mode: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfsrdma_xdr::nfs4::cb::{CbRecallArgs, CbResOp, CbSequenceResOk};
    use nfsrdma_xdr::nfs4::{Fh4, Stateid4};
    use nfsrdma_xdr::rpc::split_message;

    /// What the client in these tests does with a CB_COMPOUND: its
    /// arguments in, the CB_COMPOUND4res out, or no answer.
    type Answer = dyn Fn(&CbCompoundArgs) -> Option<CbCompoundRes> + Send + Sync;

    /// A session with a backchannel on a connection whose client answers
    /// with `answer` (on another thread, as a reader would).
    fn session(answer: Arc<Answer>) -> (Arc<State4>, SessionId4, Arc<BackConn>) {
        let state = Arc::new(State4::new(Duration::from_secs(90)));
        let (sid, conn) = session_of(&state, b"c", answer);
        (state, sid, conn)
    }

    /// A session of client `owner` in `state`, as [`session`] makes one.
    fn session_of(
        state: &Arc<State4>,
        owner: &'static [u8],
        answer: Arc<Answer>,
    ) -> (SessionId4, Arc<BackConn>) {
        let conn_slot: Arc<Mutex<Weak<BackConn>>> = Arc::default();
        let slot = conn_slot.clone();
        let conn = BackConn::new(Transport::Tcp, move |parts: Vec<Bytes>| {
            let msg: Vec<u8> = parts.concat();
            let (h, d) = split_message(Bytes::from(msg)).unwrap();
            // CB_NULL (no arguments) goes unanswered here.
            let Ok(args) = CbCompoundArgs::decode(&mut d.clone()) else {
                return true;
            };
            let Some(res) = answer(&args) else {
                return true;
            };
            let mut b = BytesMut::new();
            RpcMessage::accepted(h.xid, AcceptStat::Success).encode(&mut b);
            res.encode(&mut b);
            let conn = slot.lock().unwrap().upgrade().unwrap();
            std::thread::spawn(move || assert!(conn.deliver(b.freeze())));
            true
        });
        *conn_slot.lock().unwrap() = Arc::downgrade(&conn);
        let (_, sid) = crate::service::nfs4::state::session_with_back(state, owner, &conn);
        (sid, conn)
    }

    fn recall() -> CbArgOp {
        CbArgOp::Recall(CbRecallArgs {
            stateid: Stateid4 {
                seqid: 1,
                other: [3; 12],
            },
            truncate: false,
            fh: Fh4(Bytes::from_static(b"fh")),
        })
    }

    /// Runs one CB_COMPOUND and waits for its outcome.
    fn run(cb: &Callbacks, sid: SessionId4) -> Result<CbCompoundRes, CbError> {
        let (tx, rx) = mpsc::channel();
        cb.compound(sid, vec![recall()], move |r| tx.send(r).unwrap());
        rx.recv_timeout(Duration::from_secs(20)).unwrap()
    }

    #[test]
    fn cb_compound_leads_with_cb_sequence_on_slot_zero_and_counts_up_its_sequence() {
        let seen: Arc<Mutex<Vec<(u32, u32, SessionId4)>>> = Arc::default();
        let log = seen.clone();
        let (state, sid, _conn) = session(Arc::new(move |a: &CbCompoundArgs| {
            let CbArgOp::Sequence(s) = &a.ops[0] else {
                panic!("{a:?}")
            };
            assert!(matches!(a.ops[1], CbArgOp::Recall(_)));
            log.lock()
                .unwrap()
                .push((s.sequenceid, s.slotid, s.sessionid));
            Some(CbCompoundRes {
                status: Status::OK,
                tag: a.tag.clone(),
                results: vec![
                    CbResOp::Sequence(Ok(CbSequenceResOk {
                        sessionid: s.sessionid,
                        sequenceid: s.sequenceid,
                        slotid: 0,
                        highest_slotid: 0,
                        target_highest_slotid: 0,
                    })),
                    CbResOp::Recall(Status::OK),
                ],
            })
        }));
        let cb = Callbacks::new(state.clone(), Duration::from_secs(5));
        for _ in 0..2 {
            let r = run(&cb, sid).unwrap();
            assert_eq!(r.results[1], CbResOp::Recall(Status::OK));
        }
        assert_eq!(*seen.lock().unwrap(), vec![(1, 0, sid), (2, 0, sid)]);
        assert_eq!(state.back_path(&sid), Some(Path::Up));
        assert_eq!(cb.stats().answered.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_cb_sequence_error_or_no_answer_fails_the_callback() {
        let (state, sid, _conn) = session(Arc::new(|a: &CbCompoundArgs| {
            Some(CbCompoundRes {
                status: Status::BADSESSION,
                tag: a.tag.clone(),
                results: vec![CbResOp::Sequence(Err(Status::BADSESSION))],
            })
        }));
        let cb = Callbacks::new(state, Duration::from_secs(5));
        assert_eq!(
            run(&cb, sid).unwrap_err(),
            CbError::Sequence(Status::BADSESSION)
        );

        let (state, sid, _conn) = session(Arc::new(|_: &CbCompoundArgs| None));
        let cb = Callbacks::new(state.clone(), Duration::from_millis(200));
        assert_eq!(
            run(&cb, sid).unwrap_err(),
            CbError::Timeout(Duration::from_millis(200))
        );
        assert_eq!(state.back_path(&sid), Some(Path::Down));
        assert_eq!(
            state
                .sequence(&sid, 0, 1, 1, 100, std::time::Instant::now())
                .map(|c| match c {
                    crate::service::nfs4::state::SlotCheck::New { status_flags, .. } =>
                        status_flags,
                    _ => panic!("a new request"),
                }),
            Ok(seq_status::CB_PATH_DOWN_SESSION | seq_status::CB_PATH_DOWN)
        );
        assert_eq!(cb.stats().failed.load(Ordering::Relaxed), 1);
    }

    /// A CB_COMPOUND4res whose CB_SEQUENCE answers `slot` and `seq`.
    fn answered(a: &CbCompoundArgs, sid: SessionId4, slot: u32, seq: u32) -> CbCompoundRes {
        CbCompoundRes {
            status: Status::OK,
            tag: a.tag.clone(),
            results: vec![
                CbResOp::Sequence(Ok(CbSequenceResOk {
                    sessionid: sid,
                    sequenceid: seq,
                    slotid: slot,
                    highest_slotid: 0,
                    target_highest_slotid: 0,
                })),
                CbResOp::Recall(Status::OK),
            ],
        }
    }

    #[test]
    fn a_reply_for_another_slot_sequence_or_session_fails_the_callback() {
        // The client answers calls 1 to 3 for the wrong slot, sequence id
        // and session, then the fourth as it should.
        let n = Arc::new(AtomicU32::new(0));
        let seqs: Arc<Mutex<Vec<u32>>> = Arc::default();
        let (k, log) = (n.clone(), seqs.clone());
        let (state, sid, _conn) = session(Arc::new(move |a: &CbCompoundArgs| {
            let CbArgOp::Sequence(s) = &a.ops[0] else {
                panic!("{a:?}")
            };
            log.lock().unwrap().push(s.sequenceid);
            Some(match k.fetch_add(1, Ordering::Relaxed) {
                0 => answered(a, s.sessionid, 3, s.sequenceid),
                1 => answered(a, s.sessionid, 0, s.sequenceid + 7),
                2 => answered(a, [9; 16], 0, s.sequenceid),
                _ => answered(a, s.sessionid, 0, s.sequenceid),
            })
        }));
        let cb = Callbacks::new(state.clone(), Duration::from_secs(5));
        for _ in 0..3 {
            assert!(matches!(run(&cb, sid), Err(CbError::BadReply(_))));
            assert_eq!(state.back_path(&sid), Some(Path::Down));
        }
        assert!(run(&cb, sid).is_ok());
        assert_eq!(state.back_path(&sid), Some(Path::Up));
        // None of the bad answers took the slot's sequence id.
        assert_eq!(*seqs.lock().unwrap(), vec![1, 1, 1, 1]);
    }

    #[test]
    fn a_call_with_no_answer_leaves_its_sequence_id_to_the_next() {
        let n = Arc::new(AtomicU32::new(0));
        let seqs: Arc<Mutex<Vec<u32>>> = Arc::default();
        let (k, log) = (n.clone(), seqs.clone());
        let (state, sid, _conn) = session(Arc::new(move |a: &CbCompoundArgs| {
            let CbArgOp::Sequence(s) = &a.ops[0] else {
                panic!("{a:?}")
            };
            log.lock().unwrap().push(s.sequenceid);
            // The second call is lost; the others are answered.
            (k.fetch_add(1, Ordering::Relaxed) != 1)
                .then(|| answered(a, s.sessionid, 0, s.sequenceid))
        }));
        let cb = Callbacks::new(state.clone(), Duration::from_millis(300));
        assert!(run(&cb, sid).is_ok());
        assert!(matches!(run(&cb, sid), Err(CbError::Timeout(_))));
        assert!(run(&cb, sid).is_ok());
        assert!(run(&cb, sid).is_ok());
        assert_eq!(*seqs.lock().unwrap(), vec![1, 2, 2, 3]);
    }

    #[test]
    fn a_client_that_does_not_answer_holds_up_its_own_calls_only() {
        let state = Arc::new(State4::new(Duration::from_secs(90)));
        // The silent client notes how many of its calls were out as each
        // came.
        let out = Arc::new(AtomicU32::new(0));
        let seen: Arc<Mutex<Vec<u32>>> = Arc::default();
        let (o, log) = (out.clone(), seen.clone());
        let (silent, _c1) = session_of(
            &state,
            b"silent",
            Arc::new(move |_: &CbCompoundArgs| {
                log.lock().unwrap().push(o.fetch_add(1, Ordering::SeqCst));
                None
            }),
        );
        let (other, _c2) = session_of(
            &state,
            b"answers",
            Arc::new(|a: &CbCompoundArgs| {
                let CbArgOp::Sequence(s) = &a.ops[0] else {
                    panic!("{a:?}")
                };
                Some(answered(a, s.sessionid, 0, s.sequenceid))
            }),
        );
        let cb = Callbacks::new(state.clone(), Duration::from_secs(4));
        let (tx1, rx1) = mpsc::channel();
        let (tx2, rx2) = mpsc::channel();
        for _ in 0..2 {
            let (tx, o) = (tx1.clone(), out.clone());
            cb.compound(silent, vec![recall()], move |r| {
                o.fetch_sub(1, Ordering::SeqCst);
                tx.send(r).unwrap()
            });
        }
        cb.compound(other, vec![recall()], move |r| tx2.send(r).unwrap());
        // The other client's call is answered while the silent one's first
        // call still waits for its reply.
        assert!(rx2.recv_timeout(Duration::from_secs(20)).unwrap().is_ok());
        assert_eq!(rx1.try_recv().err(), Some(mpsc::TryRecvError::Empty));
        // The silent client's calls go one at a time (its backchannel has
        // one slot), each timing out.
        for _ in 0..2 {
            assert!(matches!(
                rx1.recv_timeout(Duration::from_secs(20)).unwrap(),
                Err(CbError::Timeout(_))
            ));
        }
        assert_eq!(*seen.lock().unwrap(), vec![0, 0]);
        assert_eq!(cb.stats().failed.load(Ordering::Relaxed), 2);
        assert_eq!(cb.stats().answered.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn probes_of_one_session_queue_one_at_a_time() {
        // A client that never answers, and binds (so asks for probes) a
        // hundred times: at most the one running and one queued are sent.
        let (state, sid, _conn) = session(Arc::new(|_: &CbCompoundArgs| None));
        let cb = Callbacks::new(state.clone(), Duration::from_millis(50));
        for _ in 0..100 {
            cb.probe(sid);
        }
        std::thread::sleep(Duration::from_millis(600));
        let sent = cb.stats().sent.load(Ordering::Relaxed);
        assert!((1..=2).contains(&sent), "{sent} probes sent");
        assert_eq!(state.back_path(&sid), Some(Path::Down));
    }

    /// A connection whose messages one thread sends says so on that
    /// thread only; one without such a thread, nowhere.
    #[test]
    fn a_connection_served_by_one_thread_is_served_here_on_that_thread_only() {
        let here =
            BackConn::served_by(Transport::Rdma, Some(std::thread::current().id()), |_| true);
        let anywhere = BackConn::new(Transport::Tcp, |_| true);
        assert!(here.served_here() && !anywhere.served_here());
        let (h, a) = (here.clone(), anywhere.clone());
        let elsewhere = std::thread::spawn(move || (h.served_here(), a.served_here()))
            .join()
            .unwrap();
        assert_eq!(elsewhere, (false, false));
    }

    #[test]
    fn a_callback_on_a_closed_connection_fails_at_once() {
        let (state, sid, conn) = session(Arc::new(|_: &CbCompoundArgs| None));
        conn.close();
        let cb = Callbacks::new(state.clone(), Duration::from_secs(60));
        assert_eq!(run(&cb, sid).unwrap_err(), CbError::NoPath);
        assert_eq!(state.back_path(&sid), Some(Path::Down));
    }

    /// A client that answers every CB_COMPOUND as it should.
    fn answers_ok() -> Arc<Answer> {
        Arc::new(|a: &CbCompoundArgs| {
            let CbArgOp::Sequence(s) = &a.ops[0] else {
                panic!("{a:?}")
            };
            Some(answered(a, s.sessionid, 0, s.sequenceid))
        })
    }

    #[test]
    fn a_result_handler_that_panics_is_counted_and_the_sessions_next_call_goes_out() {
        let (state, sid, _conn) = session(answers_ok());
        let cb = Callbacks::new(state, Duration::from_secs(5));
        cb.compound(sid, vec![recall()], |_| {
            panic!("a bug in a recall's result handler")
        });
        // Queued behind the one that panicked, on the same session: it
        // runs only if that one gave the session back.
        let r = run(&cb, sid).unwrap();
        assert_eq!(r.results[1], CbResOp::Recall(Status::OK));
        let s = cb.stats();
        assert_eq!(s.panicked.load(Ordering::Relaxed), 1);
        assert_eq!(s.answered.load(Ordering::Relaxed), 2);
        assert!(cb.report().ends_with("; panics 1\n"), "{}", cb.report());
    }

    #[test]
    fn a_call_that_panics_as_it_is_sent_fails_with_internal_and_the_session_goes_on() {
        // The connection's writer panics on the first call (a bug below
        // the callback thread), then works.
        let first = Arc::new(AtomicBool::new(true));
        let ok = answers_ok();
        let f = first.clone();
        let (state, sid, conn) = session(Arc::new(move |a: &CbCompoundArgs| {
            if f.swap(false, Ordering::SeqCst) {
                panic!("a bug in the connection's writer");
            }
            ok(a)
        }));
        let cb = Callbacks::new(state, Duration::from_secs(5));
        assert_eq!(run(&cb, sid).unwrap_err(), CbError::Internal);
        assert!(locked(&conn.waiting).is_empty(), "a waiter left behind");
        let r = run(&cb, sid).unwrap();
        assert_eq!(r.results[1], CbResOp::Recall(Status::OK));
        assert_eq!(cb.stats().panicked.load(Ordering::Relaxed), 1);
        assert!(!first.load(Ordering::SeqCst));
    }
}
