//! How RPC calls travel: the [`Transport`] trait and its implementations.
//!
//! A transport carries one RPC call and returns the decoder positioned at
//! the reply's results. It owns XIDs, the slot table (calls in flight),
//! reply matching, timeouts and retransmission, so that the typed layer
//! ([`crate::Client`]) is the same for every transport.
//!
//! - [`tcp`]: ONC RPC record marking over TCP.
//! - [`rdma`]: RPC-over-RDMA version 1 (RFC 8166, RFC 8797) on the
//!   connection core of `nfsrdma-rpcrdma` (`requester::plan_call` plans a
//!   call, `conn::Connection` keeps the connection's state), which is why a
//!   call is an encode closure over `&mut dyn XdrSink` (the planner encodes
//!   it twice: once to measure and to find the DDP-eligible item, once to
//!   send) and carries a [`ReplyExpect`] (which sizes the Write chunk for
//!   READ data and the Reply chunk for large replies). Its calls in flight
//!   are bounded by the credits, and a reply whose READ data arrived in a
//!   Write chunk is decoded with `Decoder::with_ddp_first`.
//! - [`retry`]: what both do alike: reconnection with backoff, and each
//!   call's clock (a try's timeout, soft mode's deadline).

pub mod rdma;
pub mod retry;
pub mod tcp;

use crate::error::ClientError;
use bytes::Bytes;
use nfsrdma_xdr::rpc::{AcceptStat, MessageBody, OpaqueAuth, RejectedReply, ReplyBody};
use nfsrdma_xdr::{Decoder, Xdr, XdrSink};
use std::fmt;
use std::future::Future;
use std::pin::Pin;

/// Which transport a client uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TransportKind {
    /// ONC RPC over TCP with record marking (port 2049 by default).
    #[default]
    Tcp,
    /// RPC-over-RDMA version 1 (port 20049 by default).
    Rdma,
}

impl TransportKind {
    /// The usual NFS port of this transport.
    pub fn default_nfs_port(self) -> u16 {
        match self {
            TransportKind::Tcp => 2049,
            TransportKind::Rdma => 20049,
        }
    }
}

/// What the caller knows of the reply before sending the call: the
/// protocol core's own type, which an RDMA transport uses to register
/// reply chunks. TCP ignores it.
pub use nfsrdma_rpcrdma::requester::ReplyExpect;

/// Writes a call's arguments (everything after the RPC header). Called
/// once by TCP, possibly more than once by other transports; it must write
/// the same bytes each time.
pub type EncodeArgs<'a> = &'a (dyn Fn(&mut dyn XdrSink) + Send + Sync);

/// One RPC call as the typed layer hands it to a transport.
#[derive(Clone, Copy)]
pub struct RpcCall<'a> {
    /// Program number.
    pub prog: u32,
    /// Program version.
    pub vers: u32,
    /// Procedure number.
    pub proc_: u32,
    /// A name for logs and errors ("NFS READ", "MOUNT MNT").
    pub name: &'static str,
    /// The credential.
    pub cred: &'a OpaqueAuth,
    /// The arguments.
    pub args: EncodeArgs<'a>,
    /// What the reply may hold.
    pub expect: ReplyExpect,
}

impl fmt::Debug for RpcCall<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcCall")
            .field("prog", &self.prog)
            .field("vers", &self.vers)
            .field("proc_", &self.proc_)
            .field("name", &self.name)
            .field("expect", &self.expect)
            .finish_non_exhaustive()
    }
}

/// The future a transport returns: the decoder positioned at the reply's
/// results (after an accepted, successful RPC reply header).
pub type CallFuture<'a> = Pin<Box<dyn Future<Output = Result<Decoder, ClientError>> + Send + 'a>>;

/// Carries RPC calls to one server endpoint.
pub trait Transport: Send + Sync + fmt::Debug {
    /// Sends `call` and waits for its reply. RPC-level refusals
    /// (PROG_UNAVAIL, GARBAGE_ARGS, AUTH_ERROR, ...) are errors; the
    /// program's own status (an NFS error) is in the results.
    fn call<'a>(&'a self, call: RpcCall<'a>) -> CallFuture<'a>;

    /// Which transport this is.
    fn kind(&self) -> TransportKind;

    /// The transport's counters.
    fn stats(&self) -> TransportStats;

    /// Closes the connection; calls waiting fail with
    /// [`ClientError::Shutdown`].
    fn shutdown(&self);
}

/// Counters of a transport (for tests and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportStats {
    /// Connections made (the first one included).
    pub connects: u64,
    /// Calls sent again (after a timeout or on a new connection).
    pub retransmits: u64,
    /// Reply records dropped because no call waited for their XID, or too
    /// short to carry one.
    pub unmatched_replies: u64,
    /// RDMA: replies that arrived by Send With Invalidate (the server
    /// invalidated one of the call's memory windows, RFC 8797).
    pub send_with_invalidate: u64,
    /// RDMA: LOCAL_INV work requests posted to fence memory windows.
    pub local_invalidations: u64,
    /// RDMA: memory window binds posted (the `mw` strategy).
    pub window_binds: u64,
    /// RDMA: memory windows deallocated and allocated anew (`mw`: after a
    /// slot's area was lent out with a reply, or a per-RPC region was
    /// bound, so that no window holds that memory any more).
    pub window_renewals: u64,
    /// RDMA: memory regions registered for one RPC (the `reg-mr` strategy,
    /// and chunks too large for a pool slot).
    pub mr_registrations: u64,
    /// RDMA: calls whose data travelled in a Read chunk (WRITE data,
    /// SYMLINK paths, or the whole call when it exceeds the inline
    /// threshold).
    pub read_chunk_calls: u64,
    /// RDMA: calls that offered a Write chunk for their reply's data.
    pub write_chunk_calls: u64,
    /// RDMA: calls that offered a Reply chunk (a reply that may exceed our
    /// inline threshold).
    pub reply_chunk_calls: u64,
    /// RDMA: calls completed with their step times below (each one
    /// answered and fenced on one connection).
    pub timed_calls: u64,
    /// RDMA: total time from taking a slot to posting the Send: marshalling,
    /// copying into the send buffer and chunk memory, registering (binds
    /// are posted with the Send; `reg-mr` registers here), in ns.
    pub register_ns: u64,
    /// RDMA: total time from posting the Send to handling the reply's
    /// receive completion, in ns.
    pub send_to_reply_ns: u64,
    /// RDMA: total time from the reply to the last local invalidation's
    /// completion (0 per call when remote invalidation fenced everything),
    /// in ns.
    pub invalidate_ns: u64,
    /// RDMA: total time spent copying replies out of registered memory,
    /// in ns.
    pub copy_out_ns: u64,
    /// RDMA: bytes of READ data and Reply chunks copied out of registered
    /// memory (the `mw` and `persistent` pools).
    pub reply_bytes_copied: u64,
    /// RDMA: bytes of READ data and Reply chunks handed to the caller
    /// without a copy (a per-RPC region, deregistered, becomes the reply's
    /// memory).
    pub reply_bytes_lent: u64,
    /// RDMA: work completions handled by a waiting caller on its own
    /// thread (`busy` polling) rather than by the completion thread.
    pub completions_by_caller: u64,
    /// RDMA: reply messages handed to their callers in the receive buffer
    /// they landed in (a spare buffer posted in its stead).
    pub receives_lent: u64,
    /// RDMA: reply messages copied out of their receive buffer because
    /// every spare buffer was lent at the time (replies held undecoded).
    pub receives_copied: u64,
    /// RDMA: the local ACK timeout exponent (4.096 µs × 2^this) of the
    /// newest connection's queue pair, as the device reports it; 0 for
    /// TCP. A setting, not a count: [`Self::since`] keeps it and
    /// [`Self::plus`] takes the larger.
    pub ack_timeout: u8,
}

impl TransportStats {
    /// The counts of `self` minus those of an earlier snapshot.
    pub fn since(&self, earlier: &TransportStats) -> TransportStats {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        TransportStats {
            connects: d(self.connects, earlier.connects),
            retransmits: d(self.retransmits, earlier.retransmits),
            unmatched_replies: d(self.unmatched_replies, earlier.unmatched_replies),
            send_with_invalidate: d(self.send_with_invalidate, earlier.send_with_invalidate),
            local_invalidations: d(self.local_invalidations, earlier.local_invalidations),
            window_binds: d(self.window_binds, earlier.window_binds),
            window_renewals: d(self.window_renewals, earlier.window_renewals),
            mr_registrations: d(self.mr_registrations, earlier.mr_registrations),
            read_chunk_calls: d(self.read_chunk_calls, earlier.read_chunk_calls),
            write_chunk_calls: d(self.write_chunk_calls, earlier.write_chunk_calls),
            reply_chunk_calls: d(self.reply_chunk_calls, earlier.reply_chunk_calls),
            timed_calls: d(self.timed_calls, earlier.timed_calls),
            register_ns: d(self.register_ns, earlier.register_ns),
            send_to_reply_ns: d(self.send_to_reply_ns, earlier.send_to_reply_ns),
            invalidate_ns: d(self.invalidate_ns, earlier.invalidate_ns),
            copy_out_ns: d(self.copy_out_ns, earlier.copy_out_ns),
            reply_bytes_copied: d(self.reply_bytes_copied, earlier.reply_bytes_copied),
            reply_bytes_lent: d(self.reply_bytes_lent, earlier.reply_bytes_lent),
            completions_by_caller: d(self.completions_by_caller, earlier.completions_by_caller),
            receives_lent: d(self.receives_lent, earlier.receives_lent),
            receives_copied: d(self.receives_copied, earlier.receives_copied),
            ack_timeout: self.ack_timeout,
        }
    }

    /// The sum of two sets of counts.
    pub fn plus(&self, o: &TransportStats) -> TransportStats {
        TransportStats {
            connects: self.connects + o.connects,
            retransmits: self.retransmits + o.retransmits,
            unmatched_replies: self.unmatched_replies + o.unmatched_replies,
            send_with_invalidate: self.send_with_invalidate + o.send_with_invalidate,
            local_invalidations: self.local_invalidations + o.local_invalidations,
            window_binds: self.window_binds + o.window_binds,
            window_renewals: self.window_renewals + o.window_renewals,
            mr_registrations: self.mr_registrations + o.mr_registrations,
            read_chunk_calls: self.read_chunk_calls + o.read_chunk_calls,
            write_chunk_calls: self.write_chunk_calls + o.write_chunk_calls,
            reply_chunk_calls: self.reply_chunk_calls + o.reply_chunk_calls,
            timed_calls: self.timed_calls + o.timed_calls,
            register_ns: self.register_ns + o.register_ns,
            send_to_reply_ns: self.send_to_reply_ns + o.send_to_reply_ns,
            invalidate_ns: self.invalidate_ns + o.invalidate_ns,
            copy_out_ns: self.copy_out_ns + o.copy_out_ns,
            reply_bytes_copied: self.reply_bytes_copied + o.reply_bytes_copied,
            reply_bytes_lent: self.reply_bytes_lent + o.reply_bytes_lent,
            completions_by_caller: self.completions_by_caller + o.completions_by_caller,
            receives_lent: self.receives_lent + o.receives_lent,
            receives_copied: self.receives_copied + o.receives_copied,
            ack_timeout: self.ack_timeout.max(o.ack_timeout),
        }
    }

    /// Mean time per timed call of each step, in µs, by step name; `None`
    /// when no call was timed (TCP, or nothing ran).
    pub fn step_means_us(&self) -> Option<Vec<(String, f64)>> {
        if self.timed_calls == 0 {
            return None;
        }
        let n = self.timed_calls as f64;
        Some(
            [
                ("register", self.register_ns),
                ("send_to_reply", self.send_to_reply_ns),
                ("invalidate", self.invalidate_ns),
                ("copy_out", self.copy_out_ns),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v as f64 / n / 1000.0))
            .collect(),
        )
    }
}

/// Checks a complete reply message whose XID has been matched: returns the
/// decoder at the results of an accepted, successful reply, and maps every
/// other outcome to its error.
pub fn parse_reply(
    record: Bytes,
    prog: u32,
    vers: u32,
    proc_: u32,
) -> Result<Decoder, ClientError> {
    reply_results(Decoder::new(record), prog, vers, proc_)
}

/// As [`parse_reply`], on a decoder at the start of the reply message (one
/// that may carry direct-placed data, as an RDMA transport builds it).
pub fn reply_results(
    mut d: Decoder,
    prog: u32,
    vers: u32,
    proc_: u32,
) -> Result<Decoder, ClientError> {
    let msg = nfsrdma_xdr::rpc::RpcMessage::decode(&mut d)?;
    let reply = match msg.body {
        MessageBody::Reply(r) => r,
        MessageBody::Call(_) => {
            return Err(ClientError::Protocol(
                "the server sent a call where a reply was expected".into(),
            ))
        }
    };
    match reply {
        ReplyBody::Accepted(a) => match a.stat {
            AcceptStat::Success => Ok(d),
            AcceptStat::ProgUnavail => Err(ClientError::ProgUnavail { prog }),
            AcceptStat::ProgMismatch { low, high } => Err(ClientError::ProgMismatch {
                prog,
                vers,
                low,
                high,
            }),
            AcceptStat::ProcUnavail => Err(ClientError::ProcUnavail { prog, proc_ }),
            AcceptStat::GarbageArgs => Err(ClientError::GarbageArgs),
            AcceptStat::SystemErr => Err(ClientError::SystemErr),
        },
        ReplyBody::Denied(RejectedReply::RpcMismatch { low, high }) => {
            Err(ClientError::RpcMismatch { low, high })
        }
        ReplyBody::Denied(RejectedReply::AuthError(s)) => Err(ClientError::AuthError(s)),
    }
}
