//! The RPC service: decodes a call, checks its credentials and the export's
//! rules, runs the procedure and produces the reply. It knows nothing of
//! transports: a call arrives as one RPC message (`Bytes`, plus the
//! caller's address), and the reply leaves as a typed [`Reply`] that the
//! transport encodes with whatever sink it uses (a `writev` list on TCP,
//! chunks on RDMA).

pub mod drc;
pub(crate) mod fault;
pub mod metrics;
mod mount;
mod nfs;
pub mod nfs4;
pub mod nlm;
pub mod nsm;
mod plain_hash;

use crate::exports::{ExportEntry, ExportOptions};
use crate::store::{Cred, Store, StoreConfig};
use bytes::Bytes;
use drc::{Drc, DrcKey, DrcLookup};
use metrics::{CallClass, Metrics, Procedure, SizeClass};
use nfsrdma_xdr::nfs3::{self, NfsProc3};
use nfsrdma_xdr::rpc::{
    self, flavor, AcceptStat, AuthStat, CallBody, MessageBody, RejectedReply, RpcMessage,
};
use nfsrdma_xdr::{mount as mnt, Decoder, IoVecSink, Xdr, XdrSink};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One exported tree.
pub struct Export {
    /// The path clients mount.
    pub path: String,
    /// Who may mount it, with which options.
    pub rules: ExportEntry,
    /// The file system.
    pub store: Arc<Store>,
}

/// Server-wide settings of the service.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Largest READ and WRITE (FSINFO rtmax/wtmax).
    pub max_io: u32,
    /// Duplicate request cache entries.
    pub drc_entries: usize,
    /// NFSv3 on.
    pub v3: bool,
    /// NFSv4.1 and 4.2.
    pub nfs4: nfs4::Nfs4Config,
    /// The port of a client's rpcbind, where the lock manager asks for the
    /// client's lock manager and status monitor (111).
    pub client_rpcbind_port: u16,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        ServiceConfig {
            max_io: 1 << 20,
            drc_entries: 4096,
            v3: true,
            nfs4: nfs4::Nfs4Config::default(),
            client_rpcbind_port: nfsrdma_xdr::portmap::PORT,
        }
    }
}

/// Where a call came from.
#[derive(Clone)]
pub struct CallContext {
    /// The peer's address (the port matters only for the `secure` option).
    pub peer: SocketAddr,
    /// Our end of the connection, where the transport knows it (TCP): the
    /// lock manager calls a client back from the address the client knows.
    pub local: Option<SocketAddr>,
    /// The connection, where it can carry the server's calls to the client
    /// (an NFSv4.1 backchannel).
    pub back: Option<Arc<nfs4::callback::BackConn>>,
}

impl std::fmt::Debug for CallContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallContext")
            .field("peer", &self.peer)
            .field("local", &self.local)
            .field("back", &self.back.is_some())
            .finish()
    }
}

impl CallContext {
    /// A call from `peer` on a transport that carries no calls back.
    pub fn from(peer: SocketAddr) -> CallContext {
        CallContext {
            peer,
            local: None,
            back: None,
        }
    }
}

impl CallContext {
    fn ip(&self) -> IpAddr {
        match self.peer.ip() {
            IpAddr::V6(v6) => v6
                .to_ipv4_mapped()
                .map(IpAddr::V4)
                .unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        }
    }
}

/// The results part of a reply.
#[derive(Debug, Clone)]
pub enum ReplyBody {
    /// Nothing follows the header (errors, void results).
    Void,
    /// An NFSv3 result.
    Nfs(nfs3::Nfs3Res),
    /// MNT.
    Mnt(mnt::MountRes3),
    /// DUMP.
    Dump(mnt::MountList),
    /// EXPORT.
    Exports(mnt::Exports),
    /// An NFSv4 COMPOUND result.
    Nfs4(nfsrdma_xdr::nfs4::Compound4Res),
    /// A reply body already encoded (duplicate request cache hits).
    Raw(Bytes),
}

/// A reply: the RPC header and its results.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The RPC reply header.
    pub header: RpcMessage,
    /// The results.
    pub body: ReplyBody,
    /// What the transport records the call's turnaround under, once it
    /// has posted the reply: an NFS procedure that ran (not a reply from
    /// the duplicate request cache, not an error before it ran).
    pub class: Option<CallClass>,
}

impl Reply {
    fn error(xid: u32, stat: AcceptStat) -> Reply {
        Reply {
            header: RpcMessage::accepted(xid, stat),
            body: ReplyBody::Void,
            class: None,
        }
    }

    fn success(xid: u32, body: ReplyBody) -> Reply {
        Reply {
            header: RpcMessage::accepted(xid, AcceptStat::Success),
            body,
            class: None,
        }
    }

    /// Encodes header and results.
    pub fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.header.encode(s);
        self.encode_body(s);
    }

    /// Encodes the results only.
    pub fn encode_body<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match &self.body {
            ReplyBody::Void => {}
            ReplyBody::Nfs(r) => r.encode(s),
            ReplyBody::Nfs4(r) => r.encode(s),
            ReplyBody::Mnt(r) => r.encode(s),
            ReplyBody::Dump(r) => r.encode(s),
            ReplyBody::Exports(r) => r.encode(s),
            ReplyBody::Raw(b) => s.put_raw(b),
        }
    }

    /// Encoded length.
    pub fn encoded_len(&self) -> usize {
        self.header.encoded_len()
            + match &self.body {
                ReplyBody::Void => 0,
                ReplyBody::Nfs(r) => r.encoded_len(),
                ReplyBody::Nfs4(r) => r.encoded_len(),
                ReplyBody::Mnt(r) => r.encoded_len(),
                ReplyBody::Dump(r) => r.encoded_len(),
                ReplyBody::Exports(r) => r.encoded_len(),
                ReplyBody::Raw(b) => b.len(),
            }
    }

    /// The reply as a list of buffers; READ data stays in the store's
    /// blocks.
    pub fn to_parts(&self) -> Vec<Bytes> {
        let mut s = IoVecSink::new();
        self.encode(&mut s);
        s.into_parts()
    }
}

/// How [`Service::begin_call`] left a call.
pub enum Begun {
    /// Run to the end: its reply, or `None` when none is sent (a
    /// retransmission of a call still in progress).
    Done(Option<Reply>),
    /// Decoded and checked; what is left may run long.
    Long(LongCall),
}

/// A call whose work takes time in proportion to the bytes it names
/// rather than a bounded amount: an NFSv4.2 COMPOUND with COPY, CLONE,
/// ALLOCATE or DEALLOCATE (a COPY moves up to 64 MiB). It owns everything
/// it needs (no receive buffer), so any thread can finish it
/// ([`Service::finish_call`]).
pub struct LongCall {
    ctx: CallContext,
    cred: Option<Cred>,
    xid: u32,
    kind: LongKind,
}

enum LongKind {
    Compound(nfs4::Decoded),
}

/// The caller as the procedure sees it.
pub(crate) struct Caller<'a> {
    pub ctx: &'a CallContext,
    /// Credential as sent (before squashing), `None` for AUTH_NONE.
    pub cred: Option<Cred>,
}

impl Caller<'_> {
    /// The credential under an export's options (squashing applied,
    /// AUTH_NONE as the anonymous user).
    pub fn cred_for(&self, o: &ExportOptions) -> Cred {
        match &self.cred {
            Some(c) => {
                let (uid, gid, gids) = o.squash(c.uid, c.gid, &c.gids);
                Cred { uid, gid, gids }
            }
            None => Cred {
                uid: o.anonuid,
                gid: o.anongid,
                gids: vec![],
            },
        }
    }
}

/// The NFSv3 and MOUNT v3 service.
pub struct Service {
    exports: Vec<Export>,
    config: ServiceConfig,
    write_verf: [u8; 8],
    drc: Drc,
    metrics: Metrics,
    mounts: Mutex<Vec<(String, String)>>,
    nfs4: nfs4::Nfs4,
    nlm: nlm::Nlm,
    nsm: nsm::Nsm,
}

impl Service {
    /// A service over `exports`. The write verifier is new at every start.
    pub fn new(exports: Vec<Export>, config: ServiceConfig) -> Service {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let seed = t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 40);
        let paths: Vec<&str> = exports.iter().map(|e| e.path.as_str()).collect();
        let nfs4 = nfs4::Nfs4::new(&paths, config.nfs4.clone());
        let stores = exports.iter().map(|e| e.store.clone()).collect();
        let nlm = nlm::Nlm::new(nfs4.state.clone(), stores, config.client_rpcbind_port);
        Service {
            exports,
            nfs4,
            nlm,
            nsm: nsm::Nsm::default(),
            drc: Drc::new(config.drc_entries),
            config,
            write_verf: seed.to_be_bytes(),
            metrics: Metrics::new(),
            mounts: Mutex::new(Vec::new()),
        }
    }

    /// Builds exports from parsed rules, one store per export, fsids 1, 2, ...
    /// (or the `fsid=` option).
    pub fn exports_from_rules(rules: &crate::exports::Exports, base: &StoreConfig) -> Vec<Export> {
        Self::exports_from_rules_with(rules, base, &|| Box::new(crate::store::blocks::HeapSource))
    }

    /// As [`Service::exports_from_rules`], with block memory from `source`
    /// (the RDMA transport passes its registered arena).
    pub fn exports_from_rules_with(
        rules: &crate::exports::Exports,
        base: &StoreConfig,
        source: &dyn Fn() -> Box<dyn crate::store::blocks::BlockSource>,
    ) -> Vec<Export> {
        rules
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let first = e.clients.first().map(|c| &c.options);
                let fsid = first.and_then(|o| o.fsid).map_or(i as u64 + 1, u64::from);
                let null = e.clients.iter().any(|c| c.options.null);
                Export {
                    path: e.path.clone(),
                    rules: e.clone(),
                    store: Arc::new(Store::with_source(
                        StoreConfig {
                            fsid,
                            null,
                            ..base.clone()
                        },
                        source(),
                    )),
                }
            })
            .collect()
    }

    /// The exports.
    pub fn exports(&self) -> &[Export] {
        &self.exports
    }

    /// Per-procedure counters and latencies.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// WRITE data bytes over all exports: (copied into file blocks, taken
    /// over from registered landing blocks without a copy).
    pub fn write_stats(&self) -> (u64, u64) {
        self.exports.iter().fold((0, 0), |(c, a), e| {
            let (c2, a2) = e.store.read().write_stats();
            (c + c2, a + a2)
        })
    }

    /// The per-procedure report followed by the store's data-path line.
    pub fn report(&self) -> String {
        let (copied, adopted) = self.write_stats();
        let compacted: u64 = self
            .exports
            .iter()
            .map(|e| e.store.read().compacted_bytes())
            .sum();
        let mut out = format!(
            "{}store: WRITE bytes copied {copied}, taken over without a copy {adopted}, \
             file bytes gathered from pages into blocks {compacted}\n",
            self.metrics.report()
        );
        out.push_str(&self.nlm.report());
        out.push_str(&self.nfs4().callbacks.report());
        out.push_str(&self.nfs4().delegs.report());
        for e in self.exports.iter().filter(|e| e.store.read().config().null) {
            let (zeros, discarded) = e.store.read().null_stats();
            out.push_str(&format!(
                "null export {}: READ bytes answered with zeros {zeros}, WRITE bytes discarded {discarded}\n",
                e.path
            ));
        }
        out
    }

    /// The duplicate request cache.
    pub fn drc(&self) -> &Drc {
        &self.drc
    }

    /// The write verifier of this server instance.
    pub fn write_verf(&self) -> [u8; 8] {
        self.write_verf
    }

    /// Handles one RPC message. `None` means no reply is sent: the message
    /// was not a call, its header could not be decoded, or it is a
    /// retransmission of a call still in progress.
    pub fn handle(&self, ctx: &CallContext, msg: Bytes) -> Option<Reply> {
        let mut d = Decoder::new(msg);
        let header = match RpcMessage::decode(&mut d) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!(peer = %ctx.peer, error = %e, "undecodable RPC header dropped");
                return None;
            }
        };
        let call = match header.body {
            MessageBody::Call(c) => c,
            MessageBody::Reply(_) => {
                tracing::debug!(peer = %ctx.peer, "RPC reply received by the server; dropped");
                return None;
            }
        };
        self.handle_call(ctx, header.xid, &call, d)
    }

    /// Handles a decoded call header whose arguments are in `args`, to
    /// the end.
    pub fn handle_call(
        &self,
        ctx: &CallContext,
        xid: u32,
        call: &CallBody,
        args: Decoder,
    ) -> Option<Reply> {
        match self.begin_call(ctx, xid, call, args) {
            Begun::Done(reply) => reply,
            Begun::Long(c) => Some(self.finish_call(c)),
        }
    }

    /// Begins a call: runs it to the end, unless what is left of it may
    /// run long (see [`LongCall`]); a transport whose thread serves other
    /// peers meanwhile runs that elsewhere ([`Service::finish_call`]).
    pub fn begin_call(&self, ctx: &CallContext, xid: u32, call: &CallBody, args: Decoder) -> Begun {
        fault::catch(&self.metrics, ctx.peer, "RPC call", || {
            self.begin_call_unguarded(ctx, xid, call, args)
        })
        .unwrap_or_else(|| Begun::Done(Some(Reply::error(xid, AcceptStat::SystemErr))))
    }

    fn begin_call_unguarded(
        &self,
        ctx: &CallContext,
        xid: u32,
        call: &CallBody,
        args: Decoder,
    ) -> Begun {
        if call.rpcvers != rpc::RPC_VERSION {
            return Begun::Done(Some(Reply {
                header: RpcMessage::denied(xid, RejectedReply::RpcMismatch { low: 2, high: 2 }),
                body: ReplyBody::Void,
                class: None,
            }));
        }
        let cred = match call.cred.flavor {
            flavor::AUTH_NONE => None,
            flavor::AUTH_SYS => match call.cred.as_auth_sys() {
                Ok(p) => Some(Cred {
                    uid: p.uid,
                    gid: p.gid,
                    gids: p.gids.0,
                }),
                Err(e) => {
                    tracing::debug!(peer = %ctx.peer, error = %e, "bad AUTH_SYS credential");
                    return Begun::Done(Some(auth_error(xid, AuthStat::BadCred)));
                }
            },
            _ if call.proc_ == 0 => None,
            _ => return Begun::Done(Some(auth_error(xid, AuthStat::TooWeak))),
        };
        let caller = Caller { ctx, cred };
        let v4 = self.config.nfs4.enabled();
        Begun::Done(match (call.prog, call.vers) {
            (nfs3::PROGRAM, nfs3::VERSION) if self.config.v3 => {
                self.nfs_call(&caller, xid, call.proc_, args)
            }
            (nfs3::PROGRAM, nfsrdma_xdr::nfs4::VERSION) if v4 => {
                return self.nfs4_call(&caller, xid, call.proc_, args)
            }
            (nfs3::PROGRAM, _) => Some(Reply::error(
                xid,
                AcceptStat::ProgMismatch {
                    low: if self.config.v3 { 3 } else { 4 },
                    high: if v4 { 4 } else { 3 },
                },
            )),
            (mnt::PROGRAM, mnt::VERSION) => Some(self.mount_call(&caller, xid, call.proc_, args)),
            (mnt::PROGRAM, _) => Some(Reply::error(
                xid,
                AcceptStat::ProgMismatch { low: 3, high: 3 },
            )),
            (nfsrdma_xdr::nlm::PROGRAM, v) => {
                Some(self.nlm_call(&caller, xid, v, call.proc_, args))
            }
            (nfsrdma_xdr::nsm::PROGRAM, v) => {
                Some(self.nsm_call(&caller, xid, v, call.proc_, args))
            }
            _ => Some(Reply::error(xid, AcceptStat::ProgUnavail)),
        })
    }

    /// Runs the rest of a call [`Service::begin_call`] left.
    pub fn finish_call(&self, c: LongCall) -> Reply {
        let (peer, xid) = (c.ctx.peer, c.xid);
        fault::catch(&self.metrics, peer, "RPC call", || {
            let caller = Caller {
                ctx: &c.ctx,
                cred: c.cred,
            };
            match c.kind {
                LongKind::Compound(a) => self.finish_compound(&caller, c.xid, a),
            }
        })
        .unwrap_or_else(|| Reply::error(xid, AcceptStat::SystemErr))
    }

    fn nfs_call(&self, caller: &Caller, xid: u32, proc_: u32, mut args: Decoder) -> Option<Reply> {
        let Some(p) = NfsProc3::from_u32(proc_) else {
            return Some(Reply::error(xid, AcceptStat::ProcUnavail));
        };
        // Non-idempotent calls go through the duplicate request cache,
        // keyed by client address (no port, RFC 8267 §4.2), xid, procedure
        // and a checksum of the arguments.
        let drc_key = p
            .is_non_idempotent()
            .then(|| DrcKey::new(caller.ctx.ip(), xid, proc_, args.clone().into_rest()));
        if let Some(k) = &drc_key {
            match self.drc.begin(k) {
                DrcLookup::New => {}
                DrcLookup::InProgress => {
                    self.metrics.drc_in_progress();
                    return None;
                }
                DrcLookup::Done(body) => {
                    self.metrics.drc_hit();
                    return Some(Reply::success(xid, ReplyBody::Raw(body)));
                }
            }
        }
        let decoded = nfs3::Nfs3Args::decode(p, &mut args);
        let decoded = match decoded.and_then(|a| args.finish("NFSv3 arguments").map(|_| a)) {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(peer = %caller.ctx.peer, proc = p.name(), error = %e, "GARBAGE_ARGS");
                if let Some(k) = &drc_key {
                    self.drc.abandon(k);
                }
                self.metrics.garbage();
                return Some(Reply::error(xid, AcceptStat::GarbageArgs));
            }
        };
        let size = match &decoded {
            nfs3::Nfs3Args::Read(a) => SizeClass::of(a.count),
            nfs3::Nfs3Args::Write(a) => SizeClass::of(a.count),
            _ => SizeClass::Any,
        };
        let start = Instant::now();
        let res = fault::catch(&self.metrics, caller.ctx.peer, p.name(), || {
            self.nfs_dispatch(caller, decoded)
        })
        .unwrap_or_else(|| nfs3::Nfs3Res::failed(p, nfs3::NfsStat3::Serverfault));
        self.metrics.record(p, res.status(), start.elapsed());
        let mut reply = Reply::success(xid, ReplyBody::Nfs(res));
        reply.class = Some(CallClass {
            proc_: Procedure::V3(p),
            size,
        });
        if let Some(k) = drc_key {
            // Sized first: grown from nothing, the buffer was reallocated
            // four or five times for a WRITE's ~150 bytes.
            let mut body = bytes::BytesMut::with_capacity(reply.encoded_len());
            reply.encode_body(&mut body);
            let body = body.freeze();
            self.drc.complete(&k, body.clone());
            // Sent as cached: encoded once. (No non-idempotent procedure
            // has a DDP-eligible result that a transport would look for.)
            reply.body = ReplyBody::Raw(body);
        }
        Some(reply)
    }

    fn mount_call(&self, caller: &Caller, xid: u32, proc_: u32, mut args: Decoder) -> Reply {
        let body = match proc_ {
            mnt::proc_::NULL => Ok(ReplyBody::Void),
            mnt::proc_::MNT => {
                mnt::DirPath::decode(&mut args).map(|p| ReplyBody::Mnt(self.mnt(caller, &p)))
            }
            mnt::proc_::DUMP => Ok(ReplyBody::Dump(self.dump())),
            mnt::proc_::UMNT => mnt::DirPath::decode(&mut args).map(|p| {
                self.umnt(caller, &p);
                ReplyBody::Void
            }),
            mnt::proc_::UMNTALL => {
                self.umntall(caller);
                Ok(ReplyBody::Void)
            }
            mnt::proc_::EXPORT => Ok(ReplyBody::Exports(self.export_list())),
            _ => return Reply::error(xid, AcceptStat::ProcUnavail),
        };
        match body.and_then(|b| args.finish("MOUNT arguments").map(|_| b)) {
            Ok(b) => Reply::success(xid, b),
            Err(e) => {
                tracing::debug!(peer = %caller.ctx.peer, error = %e, "MOUNT GARBAGE_ARGS");
                Reply::error(xid, AcceptStat::GarbageArgs)
            }
        }
    }

    /// The settings.
    pub fn config(&self) -> &ServiceConfig {
        &self.config
    }

    /// The NFSv4 side: its state and settings.
    pub fn nfs4(&self) -> &nfs4::Nfs4 {
        &self.nfs4
    }

    /// FSINFO's largest transfer.
    pub fn max_io(&self) -> u32 {
        self.config.max_io
    }
}

fn auth_error(xid: u32, why: AuthStat) -> Reply {
    Reply {
        header: RpcMessage::denied(xid, RejectedReply::AuthError(why)),
        body: ReplyBody::Void,
        class: None,
    }
}

#[cfg(test)]
mod long_tests;
#[cfg(test)]
mod parallel_tests;
#[cfg(test)]
mod tests;
