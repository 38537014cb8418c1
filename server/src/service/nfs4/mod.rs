//! NFSv4.1 and NFSv4.2 (RFC 8881, RFC 7862) over the same stores as
//! NFSv3: the COMPOUND procedure and its rules (minor versions, the
//! SEQUENCE position, the current and saved filehandles, one result per
//! operation up to the first failure), with the session state in
//! [`state`], the attributes in [`attrs`], the exports' common root in
//! [`pseudo`] and the operations in `ops`.

pub mod attrs;
pub mod callback;
mod deleg;
mod ops;
pub mod pseudo;
pub mod state;
pub use deleg::{CB_GETATTR_FRESH, CB_GETATTR_WAIT};

use super::metrics::{CallClass, Procedure, SizeClass};
use super::{Begun, Caller, LongCall, LongKind, Reply, ReplyBody, Service};
use crate::store::Ino;
use nfsrdma_xdr::nfs4::ops::SequenceResOk;
use nfsrdma_xdr::nfs4::{
    opnum, ArgOp, Compound4Args, Compound4Res, OpsCut, ResOp, SessionId4, Stateid4, Status,
};
use nfsrdma_xdr::rpc::AcceptStat;
use nfsrdma_xdr::{Decoder, Xdr};
use pseudo::Pseudo;
use state::{ChannelLimits, SlotCheck, State4};
use std::time::{Duration, Instant};

/// Which NFSv4 minor versions are served, and the lease.
#[derive(Debug, Clone)]
pub struct Nfs4Config {
    /// Minor version 1.
    pub v41: bool,
    /// Minor version 2.
    pub v42: bool,
    /// The lease every client gets.
    pub lease: Duration,
    /// The grace period after a restart with state: how long the clients
    /// of the previous instance have to reclaim (`None`: one lease).
    pub grace: Option<Duration>,
    /// What tells this server apart from others on the same host (the
    /// daemon's address), in its server owner and scope: clients take
    /// servers with one owner for one server. The same after a restart,
    /// so that clients reclaim there.
    pub instance: String,
    /// Whether OPEN grants delegations.
    pub delegations: bool,
}

impl Default for Nfs4Config {
    fn default() -> Self {
        Nfs4Config {
            v41: true,
            v42: true,
            lease: Duration::from_secs(90),
            grace: None,
            instance: String::new(),
            delegations: true,
        }
    }
}

impl Nfs4Config {
    /// Whether any minor version is on.
    pub fn enabled(&self) -> bool {
        self.v41 || self.v42
    }

    /// The grace period's length.
    pub fn grace(&self) -> Duration {
        self.grace.unwrap_or(self.lease)
    }
}

/// How long a call to a client waits for its reply: a tenth of the lease,
/// at least a second (as the Linux nfsd).
fn callback_timeout(lease: Duration) -> Duration {
    (lease / 10).max(Duration::from_secs(1))
}

/// The NFSv4 side of the service.
pub struct Nfs4 {
    /// Clients, sessions, opens and locks (the locks shared with the NLM).
    pub state: std::sync::Arc<State4>,
    /// The server's calls to its clients on their backchannels.
    pub callbacks: callback::Callbacks,
    /// Delegation counters.
    pub delegs: std::sync::Arc<deleg::DelegStats>,
    pseudo: Pseudo,
    config: Nfs4Config,
    /// The server's owner and scope (EXCHANGE_ID).
    owner: bytes::Bytes,
}

impl Nfs4 {
    /// The v4 side over `exports` (their paths make the pseudo root).
    pub fn new(paths: &[&str], config: Nfs4Config) -> Nfs4 {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        let state = std::sync::Arc::new(State4::new(config.lease));
        Nfs4 {
            callbacks: callback::Callbacks::new(state.clone(), callback_timeout(config.lease)),
            delegs: std::sync::Arc::default(),
            state,
            pseudo: Pseudo::new(paths),
            owner: bytes::Bytes::from(match config.instance.as_str() {
                "" => format!("nfsrdmad@{host}"),
                i => format!("nfsrdmad@{host}/{i}"),
            }),
            config,
        }
    }

    /// The settings.
    pub fn config(&self) -> &Nfs4Config {
        &self.config
    }
}

/// What a filehandle names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fh {
    /// A directory of the pseudo root.
    Pseudo(u32),
    /// A file of export `.0`.
    File(usize, Ino),
}

/// The state of one COMPOUND as its operations run.
pub(crate) struct Cx<'a> {
    pub caller: &'a Caller<'a>,
    pub minor: u32,
    pub cur: Option<Fh>,
    pub saved: Option<Fh>,
    pub cur_sid: Option<Stateid4>,
    pub saved_sid: Option<Stateid4>,
    /// The session's client (after SEQUENCE).
    pub client: Option<u64>,
    /// The session (after SEQUENCE).
    pub session: Option<nfsrdma_xdr::nfs4::SessionId4>,
}

impl Cx<'_> {
    pub fn cur(&self) -> Result<Fh, Status> {
        self.cur.ok_or(Status::NOFILEHANDLE)
    }

    /// A stateid argument with the current stateid substituted.
    pub fn sid(&self, s: &Stateid4) -> Result<Stateid4, Status> {
        if *s == Stateid4::CURRENT {
            self.cur_sid.ok_or(Status::BAD_STATEID)
        } else {
            Ok(*s)
        }
    }
}

/// Operations that may come without SEQUENCE first (RFC 8881 §2.6.3.1.1).
fn sessionless(op: &ArgOp) -> bool {
    matches!(
        op,
        ArgOp::ExchangeId(_)
            | ArgOp::CreateSession(_)
            | ArgOp::DestroySession(_)
            | ArgOp::BindConnToSession(_)
            | ArgOp::DestroyClientid(_)
    )
}

impl Service {
    /// The NFSv4 program: NULL and COMPOUND.
    pub(super) fn nfs4_call(
        &self,
        caller: &Caller,
        xid: u32,
        proc_: u32,
        mut args: Decoder,
    ) -> Begun {
        Begun::Done(Some(match proc_ {
            nfsrdma_xdr::nfs4::PROC_NULL => match args.finish("NULL arguments") {
                Ok(()) => Reply::success(xid, ReplyBody::Void),
                Err(_) => Reply::error(xid, AcceptStat::GarbageArgs),
            },
            nfsrdma_xdr::nfs4::PROC_COMPOUND => {
                let len = args.remaining();
                match Compound4Args::decode_lenient(&mut args) {
                    Ok((a, cut)) => {
                        let d = Decoded { a, cut, len };
                        if d.a.ops.iter().any(runs_long) {
                            return Begun::Long(LongCall {
                                ctx: caller.ctx.clone(),
                                cred: caller.cred.clone(),
                                xid,
                                kind: LongKind::Compound(d),
                            });
                        }
                        self.finish_compound(caller, xid, d)
                    }
                    Err(e) => {
                        tracing::debug!(peer = %caller.ctx.peer, error = %e, "COMPOUND GARBAGE_ARGS");
                        self.metrics.garbage();
                        Reply::error(xid, AcceptStat::GarbageArgs)
                    }
                }
            }
            _ => Reply::error(xid, AcceptStat::ProcUnavail),
        }))
    }

    /// Runs a decoded COMPOUND and records it.
    pub(super) fn finish_compound(&self, caller: &Caller, xid: u32, d: Decoded) -> Reply {
        let class = compound_class(&d.a);
        let res = self.compound(caller, d.a, d.cut, d.len);
        self.metrics.record_compound(
            res.results.iter().map(|r| (r.num(), r.status())),
            res.status,
        );
        let mut reply = Reply::success(xid, ReplyBody::Nfs4(res));
        reply.class = Some(class);
        reply
    }

    fn compound(
        &self,
        caller: &Caller,
        a: Compound4Args,
        cut: Option<OpsCut>,
        request_len: usize,
    ) -> Compound4Res {
        let v4 = &self.nfs4;
        let mut res = Compound4Res {
            status: Status::OK,
            tag: a.tag.clone(),
            // One result per operation (their number is bounded by the
            // decoder), and one for arguments that did not decode.
            results: Vec::with_capacity(a.ops.len() + 1),
        };
        let minor_ok = match a.minorversion {
            1 => v4.config.v41,
            2 => v4.config.v42,
            _ => false,
        };
        if !minor_ok {
            res.status = Status::MINOR_VERS_MISMATCH;
            return res;
        }
        if let Some(OpsCut::TooMany(_)) = cut {
            res.status = Status::TOO_MANY_OPS;
            return res;
        }
        let now = Instant::now();
        if v4.state.sweep(now) {
            self.release_closed();
        }
        let mut cx = Cx {
            caller,
            minor: a.minorversion,
            cur: None,
            saved: None,
            cur_sid: None,
            saved_sid: None,
            client: None,
            session: None,
        };
        let mut held: Option<SlotHeld> = None;
        let n = a.ops.len() + usize::from(matches!(cut, Some(OpsCut::Garbage { .. })));
        for (i, op) in a.ops.iter().enumerate() {
            let r = if i == 0 {
                match op {
                    ArgOp::Sequence(s) => {
                        match v4.state.sequence(
                            &s.sessionid,
                            s.slotid,
                            s.sequenceid,
                            n,
                            request_len,
                            now,
                        ) {
                            Ok(SlotCheck::Replay(cached)) => return cached,
                            Ok(SlotCheck::New {
                                slots,
                                client,
                                max_response,
                                max_cached,
                                status_flags,
                            }) => {
                                cx.client = Some(client);
                                cx.session = Some(s.sessionid);
                                held = Some(SlotHeld {
                                    state: &v4.state,
                                    sid: s.sessionid,
                                    slot: s.slotid,
                                    cachethis: s.cachethis,
                                    max_response,
                                    max_cached,
                                    recorded: false,
                                });
                                ResOp::Sequence(Ok(SequenceResOk {
                                    sessionid: s.sessionid,
                                    sequenceid: s.sequenceid,
                                    slotid: s.slotid,
                                    highest_slotid: slots - 1,
                                    target_highest_slotid: slots - 1,
                                    // Only a session that has a backchannel
                                    // can find it down: the Linux client
                                    // answers SEQ4_STATUS_CB_PATH_DOWN with a
                                    // BIND_CONN_TO_SESSION, which a session
                                    // without one (over RDMA) would send
                                    // after most READs and WRITEs
                                    // (docs/benchmarks.md).
                                    status_flags,
                                }))
                            }
                            Err(e) => ResOp::Sequence(Err(e)),
                        }
                    }
                    op if sessionless(op) && n > 1 => ResOp::error(op.num(), Status::NOT_ONLY_OP),
                    op if sessionless(op) => self.nfs4_op_caught(&mut cx, op),
                    ArgOp::Illegal(_) => ResOp::error(opnum::ILLEGAL, Status::OP_ILLEGAL),
                    op => ResOp::error(op.num(), Status::OP_NOT_IN_SESSION),
                }
            } else {
                match op {
                    ArgOp::Sequence(_) => ResOp::error(opnum::SEQUENCE, Status::SEQUENCE_POS),
                    ArgOp::BindConnToSession(_) => {
                        ResOp::error(opnum::BIND_CONN_TO_SESSION, Status::NOT_ONLY_OP)
                    }
                    op => self.nfs4_op_caught(&mut cx, op),
                }
            };
            let st = r.status();
            if !st.is_ok() {
                tracing::debug!(peer = %caller.ctx.peer, op = r.num(), status = %st, "NFSv4 operation failed");
            }
            res.results.push(r);
            if !st.is_ok() {
                res.status = st;
                break;
            }
        }
        if res.status.is_ok() {
            if let Some(OpsCut::Garbage { op, error, .. }) = &cut {
                tracing::debug!(peer = %caller.ctx.peer, op, error = %error, "NFSv4 operation arguments do not decode");
                res.results.push(ResOp::error(*op, Status::BADXDR));
                res.status = Status::BADXDR;
            }
        }
        self.release_closed();
        if let Some(h) = held {
            h.record(&mut res);
        }
        res
    }

    /// Tells the stores which files lost their last open (by CLOSE, by
    /// lease expiry or with their client), so that those unlinked while
    /// open go now.
    fn release_closed(&self) {
        for (idx, ino) in self.nfs4.state.take_released() {
            if let Some(ex) = self.exports.get(idx) {
                let mut fs = ex.store.write();
                // Opened again meanwhile, or locked over NFSv3: kept (under
                // the store's lock, no OPEN or NLM LOCK can come between the
                // check and the release).
                if !self.nfs4.state.is_open((idx, ino)) && !self.nlm.uses((idx, ino)) {
                    fs.release(ino);
                }
            }
        }
    }

    /// The fore channel limits this server grants.
    pub(crate) fn channel_limits(&self) -> ChannelLimits {
        ChannelLimits {
            max_request: self.config.max_io + 16 * 1024,
            max_response: self.config.max_io + 16 * 1024,
            max_cached: 16 * 1024,
            max_ops: 64,
            max_slots: 64,
        }
    }
}

/// What a COMPOUND's turnaround is recorded under: its main operation
/// and, when that is READ or WRITE, the size of the first READ or WRITE.
/// A COMPOUND's arguments as decoded, with how many bytes they took.
pub struct Decoded {
    a: Compound4Args,
    cut: Option<OpsCut>,
    len: usize,
}

/// Whether an operation's work grows with the byte range it names (see
/// [`LongCall`]).
fn runs_long(op: &ArgOp) -> bool {
    matches!(
        op,
        ArgOp::Copy(_) | ArgOp::Clone(_) | ArgOp::Allocate(_) | ArgOp::Deallocate(_)
    )
}

fn compound_class(a: &Compound4Args) -> CallClass {
    let proc_ = Procedure::of_compound(a.ops.iter().map(ArgOp::num));
    let size = match proc_ {
        Procedure::V4(opnum::READ | opnum::WRITE) => a
            .ops
            .iter()
            .find_map(|op| match op {
                ArgOp::Read(r) => Some(SizeClass::of(r.count)),
                ArgOp::Write(w) => Some(SizeClass::of(w.data.0.len() as u32)),
                _ => None,
            })
            .unwrap_or(SizeClass::Any),
        _ => SizeClass::Any,
    };
    CallClass { proc_, size }
}

/// Ends a reply with `st` in place of its last operation's result.
fn replace_last(res: &mut Compound4Res, st: Status) {
    if let Some(last) = res.results.pop() {
        res.results.push(ResOp::error(last.num(), st));
    }
    res.status = st;
}

/// The slot a COMPOUND's SEQUENCE began, with what its reply must fit:
/// the session's largest reply and largest cached reply, and whether the
/// client asked for it to be kept (`cachethis`). The COMPOUND's end
/// records its reply ([`SlotHeld::record`]). A COMPOUND that ends without
/// (a panic unwinding it, answered with SYSTEM_ERR by `service::fault`)
/// leaves the slot saying its reply was not kept: the retry gets
/// NFS4ERR_RETRY_UNCACHED_REP rather than NFS4ERR_DELAY for ever.
struct SlotHeld<'a> {
    state: &'a State4,
    sid: SessionId4,
    slot: u32,
    cachethis: bool,
    max_response: u32,
    max_cached: u32,
    recorded: bool,
}

impl SlotHeld<'_> {
    /// The COMPOUND's reply `res`, its last result replaced when it is
    /// larger than the session allows (NFS4ERR_REP_TOO_BIG, or
    /// NFS4ERR_REP_TOO_BIG_TO_CACHE for one to keep), recorded in the
    /// slot, with a copy to replay when the client asked for one.
    fn record(mut self, res: &mut Compound4Res) {
        if res.encoded_len() > self.max_response as usize {
            replace_last(res, Status::REP_TOO_BIG);
        }
        let cache = if self.cachethis {
            if res.encoded_len() > self.max_cached as usize {
                replace_last(res, Status::REP_TOO_BIG_TO_CACHE);
            }
            Some(res.clone())
        } else {
            None
        };
        self.recorded = true;
        self.state.slot_done(&self.sid, self.slot, cache);
    }
}

impl Drop for SlotHeld<'_> {
    fn drop(&mut self) {
        if !self.recorded {
            self.state.slot_done(&self.sid, self.slot, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::callback::BackConn;
    use super::state::{session_with_back, SlotCheck, State4};
    use super::*;

    /// A COMPOUND unwound by a panic after its SEQUENCE: the slot's retry
    /// is told the reply was not kept, and the slot's next request runs.
    #[test]
    fn a_slot_left_by_an_unwinding_compound_answers_its_retry_as_not_cached() {
        let s = State4::new(Duration::from_secs(5));
        let conn = BackConn::new(crate::service::metrics::Transport::Tcp, |_| true);
        let (_, sid) = session_with_back(&s, b"unwound", &conn);
        let now = Instant::now();
        assert!(matches!(
            s.sequence(&sid, 0, 1, 2, 100, now),
            Ok(SlotCheck::New { .. })
        ));
        let unwound = std::panic::catch_unwind(|| {
            let _held = SlotHeld {
                state: &s,
                sid,
                slot: 0,
                cachethis: true,
                max_response: 1 << 20,
                max_cached: 1 << 20,
                recorded: false,
            };
            panic!("a bug in an operation");
        });
        assert!(unwound.is_err());
        assert_eq!(
            s.sequence(&sid, 0, 1, 2, 100, now).err(),
            Some(Status::RETRY_UNCACHED_REP)
        );
        assert!(matches!(
            s.sequence(&sid, 0, 2, 2, 100, now),
            Ok(SlotCheck::New { .. })
        ));
    }
}
