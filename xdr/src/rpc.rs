//! ONC RPC version 2 messages (RFC 5531) and the AUTH_NONE / AUTH_SYS
//! credentials.
//!
//! An [`RpcMessage`] is the message header only: a call's arguments and a
//! successful reply's results follow it in the same stream and are decoded
//! by the program's own types.

use crate::{Decoder, Result, Xdr, XdrError, XdrSink};
use bytes::Bytes;

/// The only RPC protocol version (RFC 5531 §8).
pub const RPC_VERSION: u32 = 2;
/// Largest opaque_auth body (RFC 5531 §8.2).
pub const MAX_AUTH_BYTES: u32 = 400;
/// Largest AUTH_SYS machine name (RFC 5531 appendix A).
pub const MAX_MACHINE_NAME: u32 = 255;
/// Most supplementary groups in an AUTH_SYS credential.
pub const MAX_AUTH_SYS_GIDS: u32 = 16;

/// Authentication flavor numbers.
pub mod flavor {
    /// No authentication.
    pub const AUTH_NONE: u32 = 0;
    /// UNIX-style uid/gid credentials.
    pub const AUTH_SYS: u32 = 1;
    /// Short-hand verifier returned by some AUTH_SYS servers.
    pub const AUTH_SHORT: u32 = 2;
    /// Diffie-Hellman authentication.
    pub const AUTH_DH: u32 = 3;
    /// RPCSEC_GSS.
    pub const RPCSEC_GSS: u32 = 6;
}

xdr_opaque!(
    /// The body of an opaque_auth (at most 400 bytes).
    pub struct AuthBody, max = MAX_AUTH_BYTES, what = "opaque_auth body", payload = false
);

xdr_struct!(
    /// `opaque_auth`: a flavor and its opaque body.
    pub struct OpaqueAuth {
        /// The flavor ([`flavor`]); unknown flavors decode and are left to
        /// the receiver to refuse.
        pub flavor: u32,
        /// The flavor-specific body.
        pub body: AuthBody,
    }
);

impl OpaqueAuth {
    /// AUTH_NONE with an empty body.
    pub fn none() -> Self {
        OpaqueAuth::default()
    }

    /// AUTH_SYS carrying `parms`.
    pub fn auth_sys(parms: &AuthSysParms) -> Self {
        OpaqueAuth {
            flavor: flavor::AUTH_SYS,
            body: AuthBody(parms.to_bytes()),
        }
    }

    /// The AUTH_SYS parameters in the body; an error when the flavor is not
    /// AUTH_SYS or the body is malformed.
    pub fn as_auth_sys(&self) -> Result<AuthSysParms> {
        if self.flavor != flavor::AUTH_SYS {
            return Err(XdrError::BadValue {
                what: "auth flavor (expected AUTH_SYS)",
                value: self.flavor,
            });
        }
        AuthSysParms::from_bytes(self.body.0.clone())
    }
}

xdr_opaque!(
    /// An AUTH_SYS machine name (at most 255 bytes).
    pub struct MachineName, max = MAX_MACHINE_NAME, what = "authsys machinename", payload = false
);

xdr_struct!(
    /// `authsys_parms` (RFC 5531 appendix A).
    pub struct AuthSysParms {
        /// Arbitrary stamp chosen by the caller.
        pub stamp: u32,
        /// The caller's host name.
        pub machinename: MachineName,
        /// Effective user id.
        pub uid: u32,
        /// Effective group id.
        pub gid: u32,
        /// Supplementary groups, at most 16.
        pub gids: crate::BoundedVec<u32, MAX_AUTH_SYS_GIDS>,
    }
);

xdr_enum!(
    /// `auth_stat`: why authentication failed.
    pub enum AuthStat("auth_stat") {
        /// Success.
        Ok = 0,
        /// Bad credential (seal broken).
        BadCred = 1,
        /// Client must begin a new session.
        RejectedCred = 2,
        /// Bad verifier (seal broken).
        BadVerf = 3,
        /// Verifier expired or replayed.
        RejectedVerf = 4,
        /// Rejected for security reasons.
        TooWeak = 5,
        /// Bogus response verifier.
        InvalidResp = 6,
        /// Reason unknown.
        Failed = 7,
        /// Kerberos generic error.
        KerbGeneric = 8,
        /// Time of credential expired.
        TimeExpire = 9,
        /// Problem with ticket file.
        TktFile = 10,
        /// Can't decode authenticator.
        Decode = 11,
        /// Wrong net address in ticket.
        NetAddr = 12,
        /// RPCSEC_GSS: no credentials for user.
        RpcsecGssCredProblem = 13,
        /// RPCSEC_GSS: problem with context.
        RpcsecGssCtxProblem = 14,
    }
);

xdr_struct!(
    /// `call_body`: everything of a call before the procedure's arguments.
    pub struct CallBody {
        /// Must be [`RPC_VERSION`]; others are answered with RPC_MISMATCH.
        pub rpcvers: u32,
        /// Program number.
        pub prog: u32,
        /// Program version.
        pub vers: u32,
        /// Procedure number.
        pub proc_: u32,
        /// Credential.
        pub cred: OpaqueAuth,
        /// Verifier.
        pub verf: OpaqueAuth,
    }
);

/// The `reply_data` of an accepted reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum AcceptStat {
    /// SUCCESS: the results follow the header.
    #[default]
    Success,
    /// PROG_UNAVAIL: the program is not exported here.
    ProgUnavail,
    /// PROG_MISMATCH with the lowest and highest versions supported.
    ProgMismatch {
        /// Lowest supported version.
        low: u32,
        /// Highest supported version.
        high: u32,
    },
    /// PROC_UNAVAIL: no such procedure.
    ProcUnavail,
    /// GARBAGE_ARGS: the arguments could not be decoded.
    GarbageArgs,
    /// SYSTEM_ERR: e.g. memory allocation failure.
    SystemErr,
}

impl Xdr for AcceptStat {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match *self {
            AcceptStat::Success => s.put_u32_be(0),
            AcceptStat::ProgUnavail => s.put_u32_be(1),
            AcceptStat::ProgMismatch { low, high } => {
                s.put_u32_be(2);
                s.put_u32_be(low);
                s.put_u32_be(high);
            }
            AcceptStat::ProcUnavail => s.put_u32_be(3),
            AcceptStat::GarbageArgs => s.put_u32_be(4),
            AcceptStat::SystemErr => s.put_u32_be(5),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match d.u32("accept_stat")? {
            0 => AcceptStat::Success,
            1 => AcceptStat::ProgUnavail,
            2 => AcceptStat::ProgMismatch {
                low: d.u32("mismatch low")?,
                high: d.u32("mismatch high")?,
            },
            3 => AcceptStat::ProcUnavail,
            4 => AcceptStat::GarbageArgs,
            5 => AcceptStat::SystemErr,
            value => {
                return Err(XdrError::BadValue {
                    what: "accept_stat",
                    value,
                })
            }
        })
    }
    fn encoded_len(&self) -> usize {
        match self {
            AcceptStat::ProgMismatch { .. } => 12,
            _ => 4,
        }
    }
}

xdr_struct!(
    /// `accepted_reply`.
    pub struct AcceptedReply {
        /// The server's verifier.
        pub verf: OpaqueAuth,
        /// Outcome.
        pub stat: AcceptStat,
    }
);

/// `rejected_reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum RejectedReply {
    /// RPC_MISMATCH: the RPC version is not supported.
    RpcMismatch {
        /// Lowest supported RPC version.
        low: u32,
        /// Highest supported RPC version.
        high: u32,
    },
    /// AUTH_ERROR with the reason.
    AuthError(AuthStat),
}

impl Xdr for RejectedReply {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match *self {
            RejectedReply::RpcMismatch { low, high } => {
                s.put_u32_be(0);
                s.put_u32_be(low);
                s.put_u32_be(high);
            }
            RejectedReply::AuthError(stat) => {
                s.put_u32_be(1);
                stat.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match d.u32("reject_stat")? {
            0 => RejectedReply::RpcMismatch {
                low: d.u32("mismatch low")?,
                high: d.u32("mismatch high")?,
            },
            1 => RejectedReply::AuthError(AuthStat::decode(d)?),
            value => {
                return Err(XdrError::BadValue {
                    what: "reject_stat",
                    value,
                })
            }
        })
    }
    fn encoded_len(&self) -> usize {
        match self {
            RejectedReply::RpcMismatch { .. } => 12,
            RejectedReply::AuthError(_) => 8,
        }
    }
}

/// `reply_body`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum ReplyBody {
    /// MSG_ACCEPTED.
    Accepted(AcceptedReply),
    /// MSG_DENIED.
    Denied(RejectedReply),
}

impl Xdr for ReplyBody {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            ReplyBody::Accepted(a) => {
                s.put_u32_be(0);
                a.encode(s);
            }
            ReplyBody::Denied(r) => {
                s.put_u32_be(1);
                r.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match d.u32("reply_stat")? {
            0 => ReplyBody::Accepted(AcceptedReply::decode(d)?),
            1 => ReplyBody::Denied(RejectedReply::decode(d)?),
            value => {
                return Err(XdrError::BadValue {
                    what: "reply_stat",
                    value,
                })
            }
        })
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            ReplyBody::Accepted(a) => a.encoded_len(),
            ReplyBody::Denied(r) => r.encoded_len(),
        }
    }
}

/// The body of an RPC message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum MessageBody {
    /// CALL.
    Call(CallBody),
    /// REPLY.
    Reply(ReplyBody),
}

/// `rpc_msg`: the header of every RPC call and reply.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub struct RpcMessage {
    /// Transaction id.
    pub xid: u32,
    /// Call or reply.
    pub body: MessageBody,
}

impl Xdr for RpcMessage {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(self.xid);
        match &self.body {
            MessageBody::Call(c) => {
                s.put_u32_be(0);
                c.encode(s);
            }
            MessageBody::Reply(r) => {
                s.put_u32_be(1);
                r.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let xid = d.u32("xid")?;
        let body = match d.u32("msg_type")? {
            0 => MessageBody::Call(CallBody::decode(d)?),
            1 => MessageBody::Reply(ReplyBody::decode(d)?),
            value => {
                return Err(XdrError::BadValue {
                    what: "msg_type",
                    value,
                })
            }
        };
        Ok(RpcMessage { xid, body })
    }
    fn encoded_len(&self) -> usize {
        8 + match &self.body {
            MessageBody::Call(c) => c.encoded_len(),
            MessageBody::Reply(r) => r.encoded_len(),
        }
    }
}

impl RpcMessage {
    /// A call header.
    pub fn call(xid: u32, prog: u32, vers: u32, proc_: u32, cred: OpaqueAuth) -> Self {
        RpcMessage {
            xid,
            body: MessageBody::Call(CallBody {
                rpcvers: RPC_VERSION,
                prog,
                vers,
                proc_,
                cred,
                verf: OpaqueAuth::none(),
            }),
        }
    }

    /// An accepted reply with an AUTH_NONE verifier.
    pub fn accepted(xid: u32, stat: AcceptStat) -> Self {
        RpcMessage {
            xid,
            body: MessageBody::Reply(ReplyBody::Accepted(AcceptedReply {
                verf: OpaqueAuth::none(),
                stat,
            })),
        }
    }

    /// A denied reply.
    pub fn denied(xid: u32, why: RejectedReply) -> Self {
        RpcMessage {
            xid,
            body: MessageBody::Reply(ReplyBody::Denied(why)),
        }
    }

    /// The call body, when this is a call.
    pub fn as_call(&self) -> Option<&CallBody> {
        match &self.body {
            MessageBody::Call(c) => Some(c),
            MessageBody::Reply(_) => None,
        }
    }

    /// The reply body, when this is a reply.
    pub fn as_reply(&self) -> Option<&ReplyBody> {
        match &self.body {
            MessageBody::Reply(r) => Some(r),
            MessageBody::Call(_) => None,
        }
    }
}

/// Splits a complete RPC message into its header and the bytes that follow
/// it (a call's arguments or a reply's results), without copying.
pub fn split_message(buf: Bytes) -> Result<(RpcMessage, Decoder)> {
    let mut d = Decoder::new(buf);
    let msg = RpcMessage::decode(&mut d)?;
    Ok((msg, d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BoundedVec;

    #[test]
    fn auth_sys_round_trips_through_opaque_auth() {
        let p = AuthSysParms {
            stamp: 7,
            machinename: "host".into(),
            uid: 1000,
            gid: 100,
            gids: BoundedVec(vec![4, 24, 27]),
        };
        let a = OpaqueAuth::auth_sys(&p);
        assert_eq!(a.flavor, flavor::AUTH_SYS);
        assert_eq!(a.as_auth_sys().unwrap(), p);
        assert!(OpaqueAuth::none().as_auth_sys().is_err());
    }

    #[test]
    fn seventeen_groups_are_refused() {
        let p = AuthSysParms {
            gids: BoundedVec((0..17).collect()),
            ..Default::default()
        };
        let e = AuthSysParms::from_bytes(p.to_bytes()).unwrap_err();
        assert!(matches!(
            e,
            XdrError::TooLong {
                len: 17,
                max: 16,
                ..
            }
        ));
    }

    #[test]
    fn machine_name_over_255_is_refused() {
        let p = AuthSysParms {
            machinename: MachineName::new(vec![b'a'; 256]),
            ..Default::default()
        };
        assert!(AuthSysParms::from_bytes(p.to_bytes()).is_err());
    }

    #[test]
    fn call_header_layout() {
        let m = RpcMessage::call(0x01020304, 100003, 3, 1, OpaqueAuth::none());
        let b = m.to_bytes();
        assert_eq!(
            &b[..],
            &[
                1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1, 0x86, 0xa3, 0, 0, 0, 3, 0, 0, 0, 1, 0, 0,
                0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(b.len(), m.encoded_len());
    }
}
