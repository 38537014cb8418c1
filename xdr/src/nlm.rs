//! Network Lock Manager version 4 (the Open Group's XNFS specification,
//! chapter 10 "NLM version 4"; RFC 1813 appendix II): the byte-range and
//! share locks of NFSv3 clients.

use crate::{Decoder, Result, Xdr, XdrSink};

/// NLM program number.
pub const PROGRAM: u32 = 100021;
/// NLM protocol version 4, the one for NFSv3 (64-bit offsets).
pub const VERSION: u32 = 4;
/// Longest `caller_name` (LM_MAXSTRLEN).
pub const LM_MAXSTRLEN: u32 = 1024;
/// Longest name in FREE_ALL's `nlm4_notify` (LM_MAXNAMELEN).
pub const LM_MAXNAMELEN: u32 = 1025;
/// Longest `netobj` (MAXNETOBJ_SZ).
pub const MAXNETOBJ_SZ: u32 = 1024;

/// NLM procedure numbers.
pub mod proc_ {
    /// NULL.
    pub const NULL: u32 = 0;
    /// TEST: would this lock be granted? (nlm4_testargs -> nlm4_testres)
    pub const TEST: u32 = 1;
    /// LOCK (nlm4_lockargs -> nlm4_res).
    pub const LOCK: u32 = 2;
    /// CANCEL a blocked LOCK (nlm4_cancargs -> nlm4_res).
    pub const CANCEL: u32 = 3;
    /// UNLOCK (nlm4_unlockargs -> nlm4_res).
    pub const UNLOCK: u32 = 4;
    /// GRANTED: server to client, a blocked lock is now held
    /// (nlm4_testargs -> nlm4_res).
    pub const GRANTED: u32 = 5;
    /// TEST_MSG: TEST whose result comes back as a TEST_RES call.
    pub const TEST_MSG: u32 = 6;
    /// LOCK_MSG.
    pub const LOCK_MSG: u32 = 7;
    /// CANCEL_MSG.
    pub const CANCEL_MSG: u32 = 8;
    /// UNLOCK_MSG.
    pub const UNLOCK_MSG: u32 = 9;
    /// GRANTED_MSG.
    pub const GRANTED_MSG: u32 = 10;
    /// TEST_RES (nlm4_testres -> void).
    pub const TEST_RES: u32 = 11;
    /// LOCK_RES (nlm4_res -> void).
    pub const LOCK_RES: u32 = 12;
    /// CANCEL_RES (nlm4_res -> void).
    pub const CANCEL_RES: u32 = 13;
    /// UNLOCK_RES (nlm4_res -> void).
    pub const UNLOCK_RES: u32 = 14;
    /// GRANTED_RES (nlm4_res -> void).
    pub const GRANTED_RES: u32 = 15;
    /// SHARE: a DOS-style share reservation (nlm4_shareargs -> nlm4_shareres).
    pub const SHARE: u32 = 20;
    /// UNSHARE (nlm4_shareargs -> nlm4_shareres).
    pub const UNSHARE: u32 = 21;
    /// NM_LOCK: LOCK from a client that does not monitor (nlm4_lockargs -> nlm4_res).
    pub const NM_LOCK: u32 = 22;
    /// FREE_ALL: drop every lock of a host (nlm4_notify -> void).
    pub const FREE_ALL: u32 = 23;
}

xdr_opaque!(
    /// `netobj`: a cookie, file handle or owner handle (at most 1024 bytes).
    pub struct NetObj, max = MAXNETOBJ_SZ, what = "netobj", payload = false
);

xdr_opaque!(
    /// `caller_name`: the client's host name (at most 1024 bytes).
    pub struct CallerName, max = LM_MAXSTRLEN, what = "caller_name", payload = false
);

xdr_opaque!(
    /// FREE_ALL's host name (at most 1025 bytes).
    pub struct NotifyName, max = LM_MAXNAMELEN, what = "nlm4_notify name", payload = false
);

xdr_enum!(
    /// `nlm4_stats`.
    #[derive(Default)]
    pub enum Nlm4Stat("nlm4_stats") {
        /// The lock is held (or the call succeeded).
        #[default]
        Granted = 0,
        /// A conflicting lock is held.
        Denied = 1,
        /// The server cannot take locks now (no resources, or locking off).
        DeniedNolocks = 2,
        /// A blocking LOCK waits; a GRANTED call follows.
        Blocked = 3,
        /// The server is in its grace period: only reclaims are allowed.
        DeniedGracePeriod = 4,
        /// Granting would deadlock.
        Deadlck = 5,
        /// The file system is read-only.
        Rofs = 6,
        /// The file handle is stale.
        StaleFh = 7,
        /// The range is beyond what the server supports.
        Fbig = 8,
        /// Any other failure.
        Failed = 9,
    }
);

xdr_struct!(
    /// `nlm4_lock`: who locks which range of which file.
    pub struct Nlm4Lock {
        /// The client's host name.
        pub caller_name: CallerName,
        /// The NFSv3 file handle.
        pub fh: NetObj,
        /// The owner handle (opaque to the server).
        pub oh: NetObj,
        /// The owner's id on the client (the process id on Linux).
        pub svid: i32,
        /// First byte.
        pub l_offset: u64,
        /// Length; 0 means to the end of the file.
        pub l_len: u64,
    }
);

xdr_struct!(
    /// `nlm4_holder`: the lock that conflicts, in TEST's result.
    pub struct Nlm4Holder {
        /// A write (exclusive) lock.
        pub exclusive: bool,
        /// Its owner's id.
        pub svid: i32,
        /// Its owner handle.
        pub oh: NetObj,
        /// First byte.
        pub l_offset: u64,
        /// Length; 0 means to the end of the file.
        pub l_len: u64,
    }
);

xdr_struct!(
    /// `nlm4_lockargs` (LOCK, LOCK_MSG, NM_LOCK).
    pub struct Nlm4LockArgs {
        /// Echoed in the result.
        pub cookie: NetObj,
        /// Wait for the lock (answered BLOCKED, then a GRANTED call).
        pub block: bool,
        /// A write lock.
        pub exclusive: bool,
        /// The lock.
        pub alock: Nlm4Lock,
        /// A reclaim after the server restarted (allowed in its grace period).
        pub reclaim: bool,
        /// The client's NSM state number.
        pub state: i32,
    }
);

xdr_struct!(
    /// `nlm4_cancargs` (CANCEL, CANCEL_MSG).
    pub struct Nlm4CancArgs {
        /// Echoed in the result.
        pub cookie: NetObj,
        /// As in the LOCK being cancelled.
        pub block: bool,
        /// As in the LOCK being cancelled.
        pub exclusive: bool,
        /// The lock being cancelled.
        pub alock: Nlm4Lock,
    }
);

xdr_struct!(
    /// `nlm4_testargs` (TEST, TEST_MSG, GRANTED, GRANTED_MSG).
    pub struct Nlm4TestArgs {
        /// Echoed in the result.
        pub cookie: NetObj,
        /// A write lock.
        pub exclusive: bool,
        /// The lock.
        pub alock: Nlm4Lock,
    }
);

xdr_struct!(
    /// `nlm4_unlockargs` (UNLOCK, UNLOCK_MSG).
    pub struct Nlm4UnlockArgs {
        /// Echoed in the result.
        pub cookie: NetObj,
        /// The range to unlock.
        pub alock: Nlm4Lock,
    }
);

xdr_struct!(
    /// `nlm4_res`: the result of LOCK, CANCEL, UNLOCK, GRANTED and the
    /// argument of their `_RES` calls.
    pub struct Nlm4Res {
        /// The call's cookie.
        pub cookie: NetObj,
        /// The outcome.
        pub stat: Nlm4Stat,
    }
);

/// `nlm4_testrply`: TEST's outcome, with the conflicting lock when DENIED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Nlm4TestReply {
    /// NLM4_DENIED and who holds the conflicting lock.
    Denied(Nlm4Holder),
    /// Any other status (no body). [`Nlm4Stat::Denied`] here is encoded
    /// without a holder, which a decoder reads back as [`Self::Denied`]:
    /// do not build it.
    Other(Nlm4Stat),
}

impl Xdr for Nlm4TestReply {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            Nlm4TestReply::Denied(h) => {
                Nlm4Stat::Denied.encode(s);
                h.encode(s);
            }
            Nlm4TestReply::Other(st) => st.encode(s),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match Nlm4Stat::decode(d)? {
            Nlm4Stat::Denied => Ok(Nlm4TestReply::Denied(Nlm4Holder::decode(d)?)),
            st => Ok(Nlm4TestReply::Other(st)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            Nlm4TestReply::Denied(h) => h.encoded_len(),
            Nlm4TestReply::Other(_) => 0,
        }
    }
}

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for Nlm4TestReply {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            any::<Nlm4Holder>().prop_map(Nlm4TestReply::Denied),
            any::<Nlm4Stat>()
                .prop_filter("not DENIED", |s| *s != Nlm4Stat::Denied)
                .prop_map(Nlm4TestReply::Other),
        ]
        .boxed()
    }
}

xdr_struct!(
    /// `nlm4_testres`: TEST's result and TEST_RES's argument.
    pub struct Nlm4TestRes {
        /// The call's cookie.
        pub cookie: NetObj,
        /// The outcome.
        pub stat: Nlm4TestReply,
    }
);

xdr_enum!(
    /// `fsh4_mode`: what a share reservation denies to others.
    #[derive(Default)]
    pub enum Fsh4Mode("fsh4_mode") {
        /// Deny nothing.
        #[default]
        DenyNone = 0,
        /// Deny reading.
        DenyRead = 1,
        /// Deny writing.
        DenyWrite = 2,
        /// Deny both.
        DenyReadWrite = 3,
    }
);

xdr_enum!(
    /// `fsh4_access`: what a share reservation's holder does.
    #[derive(Default)]
    pub enum Fsh4Access("fsh4_access") {
        /// Neither.
        #[default]
        None = 0,
        /// Reads.
        Read = 1,
        /// Writes.
        Write = 2,
        /// Both.
        ReadWrite = 3,
    }
);

xdr_struct!(
    /// `nlm4_share`.
    pub struct Nlm4Share {
        /// The client's host name.
        pub caller_name: CallerName,
        /// The NFSv3 file handle.
        pub fh: NetObj,
        /// The owner handle.
        pub oh: NetObj,
        /// Denied to others.
        pub mode: Fsh4Mode,
        /// Used by the holder.
        pub access: Fsh4Access,
    }
);

xdr_struct!(
    /// `nlm4_shareargs` (SHARE, UNSHARE).
    pub struct Nlm4ShareArgs {
        /// Echoed in the result.
        pub cookie: NetObj,
        /// The reservation.
        pub share: Nlm4Share,
        /// A reclaim after the server restarted.
        pub reclaim: bool,
    }
);

xdr_struct!(
    /// `nlm4_shareres`.
    pub struct Nlm4ShareRes {
        /// The call's cookie.
        pub cookie: NetObj,
        /// The outcome.
        pub stat: Nlm4Stat,
        /// Unused (0).
        pub sequence: i32,
    }
);

xdr_struct!(
    /// `nlm4_notify`: FREE_ALL's argument.
    pub struct Nlm4Notify {
        /// The host whose locks go.
        pub name: NotifyName,
        /// Its NSM state number: one XDR word, as XNFS's `nlm_notify` has
        /// it and the Linux lock manager decodes it. (Some `.x` files make
        /// it a hyper; such an 8-byte state is left as 4 trailing bytes.)
        pub state: i32,
    }
);

impl Default for Nlm4TestReply {
    fn default() -> Self {
        Nlm4TestReply::Other(Nlm4Stat::Granted)
    }
}
