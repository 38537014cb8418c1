//! NFS version 4, minor versions 1 (RFC 8881, XDR in RFC 5662) and 2
//! (RFC 7862, XDR in RFC 7863): the COMPOUND procedure, the types its
//! operations need, and the attribute codecs.
//!
//! Names follow the RFCs with Rust casing (`stateid4` is [`Stateid4`],
//! `OPEN4args` is [`ops::OpenArgs`]). The arguments of a COMPOUND are an
//! [`ArgOp`] list, its results a [`ResOp`] list. READ and WRITE data are
//! [`crate::nfs3::Data`] payloads (DDP-eligible, RFC 8267 §5.4.1), as are
//! the link texts of CREATE and READLINK.

use crate::{Decoder, Result, Xdr, XdrError, XdrSink};

pub mod attr;
pub mod cb;
mod compound;
pub mod ops;

pub use compound::{opnum, ArgOp, Compound4Args, Compound4Res, OpsCut, ResOp, MAX_OPS};

/// NFS program number.
pub const PROGRAM: u32 = 100003;
/// NFS protocol version of NFSv4.x.
pub const VERSION: u32 = 4;
/// Procedure 0: NULL.
pub const PROC_NULL: u32 = 0;
/// Procedure 1: COMPOUND.
pub const PROC_COMPOUND: u32 = 1;
/// NFS4_FHSIZE.
pub const FHSIZE: u32 = 128;
/// NFS4_OPAQUE_LIMIT.
pub const OPAQUE_LIMIT: u32 = 1024;
/// Longest name, path or string the decoder accepts (longer names than a
/// server allows still decode, so that it can answer NFS4ERR_NAMETOOLONG).
pub const MAXSTRLEN: u32 = 4096;
/// NFS4_SESSIONID_SIZE.
pub const SESSIONID_SIZE: usize = 16;

/// ACCESS4 bits.
pub mod access {
    /// Read data or list a directory.
    pub const READ: u32 = 0x01;
    /// Look up a name in a directory.
    pub const LOOKUP: u32 = 0x02;
    /// Rewrite data or modify a directory entry.
    pub const MODIFY: u32 = 0x04;
    /// Write past the end or add a directory entry.
    pub const EXTEND: u32 = 0x08;
    /// Delete a directory entry.
    pub const DELETE: u32 = 0x10;
    /// Execute a file.
    pub const EXECUTE: u32 = 0x20;
}

/// OPEN4_SHARE_* bits.
pub mod share {
    /// Read access.
    pub const ACCESS_READ: u32 = 1;
    /// Write access.
    pub const ACCESS_WRITE: u32 = 2;
    /// Both.
    pub const ACCESS_BOTH: u32 = 3;
    /// The bits of `share_access` that name a delegation wish.
    pub const WANT_DELEG_MASK: u32 = 0xff00;
    /// The bits of `share_access` that are flags (RFC 8881 §18.16.3).
    pub const WANT_FLAGS_MASK: u32 = 0x0003_0000;
    /// Deny readers.
    pub const DENY_READ: u32 = 1;
    /// Deny writers.
    pub const DENY_WRITE: u32 = 2;
}

/// EXCHGID4_FLAG_* bits.
pub mod exchgid {
    /// The client supports referrals.
    pub const SUPP_MOVED_REFER: u32 = 0x1;
    /// The client supports migration.
    pub const SUPP_MOVED_MIGR: u32 = 0x2;
    /// Stateids are bound to the principal.
    pub const BIND_PRINC_STATEID: u32 = 0x100;
    /// Not a pNFS server.
    pub const USE_NON_PNFS: u32 = 0x1_0000;
    /// A pNFS metadata server.
    pub const USE_PNFS_MDS: u32 = 0x2_0000;
    /// A pNFS data server.
    pub const USE_PNFS_DS: u32 = 0x4_0000;
    /// The pNFS role bits.
    pub const MASK_PNFS: u32 = 0x7_0000;
    /// Update of a confirmed record requested.
    pub const UPD_CONFIRMED_REC_A: u32 = 0x4000_0000;
    /// The client record is confirmed.
    pub const CONFIRMED_R: u32 = 0x8000_0000;
}

/// CREATE_SESSION4_FLAG_* bits.
pub mod session_flags {
    /// Persistent reply cache.
    pub const PERSIST: u32 = 1;
    /// The connection carries the backchannel too.
    pub const CONN_BACK_CHAN: u32 = 2;
    /// The connection is used in RDMA mode.
    pub const CONN_RDMA: u32 = 4;
}

/// SEQ4_STATUS_* bits.
pub mod seq_status {
    /// No backchannel path for the client.
    pub const CB_PATH_DOWN: u32 = 0x1;
    /// Every piece of the client's state was revoked on lease expiry.
    pub const EXPIRED_ALL_STATE_REVOKED: u32 = 0x8;
    /// Some of the client's state was revoked on lease expiry.
    pub const EXPIRED_SOME_STATE_REVOKED: u32 = 0x10;
    /// The server revoked some of the client's recallable state (a
    /// delegation whose recall went unanswered).
    pub const RECALLABLE_STATE_REVOKED: u32 = 0x40;
    /// The server restarted and the client should reclaim.
    pub const RESTART_RECLAIM_NEEDED: u32 = 0x100;
    /// No backchannel path for this session.
    pub const CB_PATH_DOWN_SESSION: u32 = 0x200;
}

/// `nfsstat4`. A newtype over the wire value: results may carry any code,
/// and a client must be able to read one it does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Status(pub u32);

/// Arbitrary statuses are errors other than NFS4ERR_DENIED (which LOCK
/// carries with a body), so that every generated result round-trips.
#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for Status {
    type Parameters = ();
    type Strategy = proptest::strategy::Map<std::ops::RangeInclusive<u32>, fn(u32) -> Status>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::strategy::Strategy;
        (10011u32..=10094).prop_map(Status)
    }
}

macro_rules! statuses {
    ($($name:ident = $v:expr),* $(,)?) => {
        impl Status {
            $(
                #[doc = concat!("NFS4ERR_", stringify!($name), " (or NFS4_OK).")]
                pub const $name: Status = Status($v);
            )*

            /// The code's name as the RFC spells it.
            pub fn name(self) -> &'static str {
                match self.0 {
                    0 => "NFS4_OK",
                    $( $v => concat!("NFS4ERR_", stringify!($name)), )*
                    _ => "NFS4ERR_(unknown)",
                }
            }
        }
    };
}

impl Status {
    /// NFS4_OK.
    pub const OK: Status = Status(0);

    /// Whether this is NFS4_OK.
    pub fn is_ok(self) -> bool {
        self.0 == 0
    }
}

statuses! {
    PERM = 1, NOENT = 2, IO = 5, NXIO = 6, ACCESS = 13, EXIST = 17, XDEV = 18,
    NOTDIR = 20, ISDIR = 21, INVAL = 22, FBIG = 27, NOSPC = 28, ROFS = 30,
    MLINK = 31, NAMETOOLONG = 63, NOTEMPTY = 66, DQUOT = 69, STALE = 70,
    BADHANDLE = 10001, BAD_COOKIE = 10003, NOTSUPP = 10004, TOOSMALL = 10005,
    SERVERFAULT = 10006, BADTYPE = 10007, DELAY = 10008, SAME = 10009,
    DENIED = 10010, EXPIRED = 10011, LOCKED = 10012, GRACE = 10013,
    FHEXPIRED = 10014, SHARE_DENIED = 10015, WRONGSEC = 10016,
    CLID_INUSE = 10017, RESOURCE = 10018, MOVED = 10019, NOFILEHANDLE = 10020,
    MINOR_VERS_MISMATCH = 10021, STALE_CLIENTID = 10022, STALE_STATEID = 10023,
    OLD_STATEID = 10024, BAD_STATEID = 10025, BAD_SEQID = 10026,
    NOT_SAME = 10027, LOCK_RANGE = 10028, SYMLINK = 10029, RESTOREFH = 10030,
    LEASE_MOVED = 10031, ATTRNOTSUPP = 10032, NO_GRACE = 10033,
    RECLAIM_BAD = 10034, RECLAIM_CONFLICT = 10035, BADXDR = 10036,
    LOCKS_HELD = 10037, OPENMODE = 10038, BADOWNER = 10039, BADCHAR = 10040,
    BADNAME = 10041, BAD_RANGE = 10042, LOCK_NOTSUPP = 10043,
    OP_ILLEGAL = 10044, DEADLOCK = 10045, FILE_OPEN = 10046,
    ADMIN_REVOKED = 10047, CB_PATH_DOWN = 10048, BADIOMODE = 10049,
    BADLAYOUT = 10050, BAD_SESSION_DIGEST = 10051, BADSESSION = 10052,
    BADSLOT = 10053, COMPLETE_ALREADY = 10054,
    CONN_NOT_BOUND_TO_SESSION = 10055, DELEG_ALREADY_WANTED = 10056,
    BACK_CHAN_BUSY = 10057, LAYOUTTRYLATER = 10058, LAYOUTUNAVAILABLE = 10059,
    NOMATCHING_LAYOUT = 10060, RECALLCONFLICT = 10061,
    UNKNOWN_LAYOUTTYPE = 10062, SEQ_MISORDERED = 10063, SEQUENCE_POS = 10064,
    REQ_TOO_BIG = 10065, REP_TOO_BIG = 10066, REP_TOO_BIG_TO_CACHE = 10067,
    RETRY_UNCACHED_REP = 10068, UNSAFE_COMPOUND = 10069, TOO_MANY_OPS = 10070,
    OP_NOT_IN_SESSION = 10071, HASH_ALG_UNSUPP = 10072, CLIENTID_BUSY = 10074,
    PNFS_IO_HOLE = 10075, SEQ_FALSE_RETRY = 10076, BAD_HIGH_SLOT = 10077,
    DEADSESSION = 10078, ENCR_ALG_UNSUPP = 10079, PNFS_NO_LAYOUT = 10080,
    NOT_ONLY_OP = 10081, WRONG_CRED = 10082, WRONG_TYPE = 10083,
    DIRDELEG_UNAVAIL = 10084, REJECT_DELEG = 10085, RETURNCONFLICT = 10086,
    DELEG_REVOKED = 10087, PARTNER_NOTSUPP = 10088, PARTNER_NO_AUTH = 10089,
    UNION_NOTSUPP = 10090, OFFLOAD_DENIED = 10091, WRONG_LFS = 10092,
    BADLABEL = 10093, OFFLOAD_NO_REQS = 10094,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl Xdr for Status {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(self.0);
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.u32("nfsstat4").map(Status)
    }
    fn encoded_len(&self) -> usize {
        4
    }
}

impl From<crate::nfs3::NfsStat3> for Status {
    /// The NFSv4 code of an NFSv3 status: the numbers are shared, except
    /// NFS3ERR_NOT_SYNC (a SETATTR guard), which NFSv4 calls NOT_SAME, and
    /// NFS3ERR_JUKEBOX, which is NFS4ERR_DELAY under the same number.
    fn from(s: crate::nfs3::NfsStat3) -> Status {
        match s {
            crate::nfs3::NfsStat3::NotSync => Status::NOT_SAME,
            other => Status(other as u32),
        }
    }
}

xdr_opaque!(
    /// `nfs_fh4`.
    pub struct Fh4, max = FHSIZE, what = "nfs_fh4", payload = false
);
xdr_opaque!(
    /// `component4`, `utf8str_cs` and `utf8str_mixed`: names, tags, owner
    /// strings.
    pub struct Utf8Str, max = MAXSTRLEN, what = "utf8str", payload = false
);
xdr_opaque!(
    /// `linktext4` (DDP-eligible in CREATE and READLINK).
    pub struct Linktext4, max = MAXSTRLEN, what = "linktext4", payload = true
);
xdr_opaque!(
    /// `opaque<NFS4_OPAQUE_LIMIT>`: owners, server scope.
    pub struct Opaque4, max = OPAQUE_LIMIT, what = "opaque<NFS4_OPAQUE_LIMIT>", payload = false
);
xdr_opaque!(
    /// The attribute values of an `fattr4`.
    pub struct AttrList4, max = 1 << 20, what = "attrlist4", payload = false
);

/// `component4`.
pub type Component4 = Utf8Str;
/// `verifier4`.
pub type Verifier4 = [u8; 8];
/// `sessionid4`.
pub type SessionId4 = [u8; SESSIONID_SIZE];

/// `bitmap4`: attribute and operation masks. Words past the eighth are
/// refused (no attribute number is above 255).
#[derive(Debug, Clone, PartialEq, Eq, Default, Hash)]
pub struct Bitmap4(pub Vec<u32>);

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for Bitmap4 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Bitmap4>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::strategy::Strategy;
        proptest::collection::vec(proptest::num::u32::ANY, 0..=3)
            .prop_map(Bitmap4)
            .boxed()
    }
}

impl Bitmap4 {
    /// Words accepted on decode.
    pub const MAX_WORDS: u32 = 8;

    /// A mask with the given bits set.
    pub fn from_bits(bits: impl IntoIterator<Item = u32>) -> Bitmap4 {
        let mut b = Bitmap4::default();
        for n in bits {
            b.set(n);
        }
        b
    }

    /// Sets bit `n`.
    pub fn set(&mut self, n: u32) {
        let w = (n / 32) as usize;
        if self.0.len() <= w {
            self.0.resize(w + 1, 0);
        }
        self.0[w] |= 1 << (n % 32);
    }

    /// Whether bit `n` is set.
    pub fn has(&self, n: u32) -> bool {
        self.0
            .get((n / 32) as usize)
            .is_some_and(|w| w & (1 << (n % 32)) != 0)
    }

    /// The set bits, ascending.
    pub fn bits(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().enumerate().flat_map(|(i, w)| {
            (0..32)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| i as u32 * 32 + b)
        })
    }

    /// Whether no bit is set.
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|w| *w == 0)
    }

    /// The bits set in both.
    pub fn and(&self, other: &Bitmap4) -> Bitmap4 {
        let mut out: Vec<u32> = self.0.iter().zip(&other.0).map(|(a, b)| a & b).collect();
        while out.last() == Some(&0) {
            out.pop();
        }
        Bitmap4(out)
    }
}

impl Xdr for Bitmap4 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        s.put_u32_be(self.0.len() as u32);
        for w in &self.0 {
            s.put_u32_be(*w);
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let n = d.count("bitmap4", Self::MAX_WORDS, 4)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(d.u32("bitmap4 word")?);
        }
        Ok(Bitmap4(v))
    }
    fn encoded_len(&self) -> usize {
        4 + 4 * self.0.len()
    }
}

xdr_struct!(
    /// `stateid4`.
    #[derive(Copy, Hash)]
    pub struct Stateid4 {
        /// Sequence number of the state's changes.
        pub seqid: u32,
        /// The server's name for the state.
        pub other: [u8; 12],
    }
);

impl Stateid4 {
    /// The anonymous stateid (all zeros).
    pub const ANONYMOUS: Stateid4 = Stateid4 {
        seqid: 0,
        other: [0; 12],
    };
    /// The READ bypass stateid (all ones).
    pub const BYPASS: Stateid4 = Stateid4 {
        seqid: u32::MAX,
        other: [0xff; 12],
    };
    /// The current stateid (RFC 8881 §16.2.3.1.2).
    pub const CURRENT: Stateid4 = Stateid4 {
        seqid: 1,
        other: [0; 12],
    };
    /// The invalid stateid.
    pub const INVALID: Stateid4 = Stateid4 {
        seqid: u32::MAX,
        other: [0; 12],
    };

    /// Whether this is one of the special stateids (RFC 8881 §8.2.3).
    pub fn is_special(&self) -> bool {
        self.other == [0; 12] || self.other == [0xff; 12]
    }
}

xdr_struct!(
    /// `nfstime4`.
    pub struct Time4 {
        /// Seconds since the epoch.
        pub seconds: u64,
        /// Nanoseconds.
        pub nseconds: u32,
    }
);

xdr_struct!(
    /// `fsid4`.
    pub struct Fsid4 {
        /// Major.
        pub major: u64,
        /// Minor.
        pub minor: u64,
    }
);

xdr_struct!(
    /// `specdata4`.
    pub struct Specdata4 {
        /// Major device number.
        pub specdata1: u32,
        /// Minor device number.
        pub specdata2: u32,
    }
);

xdr_struct!(
    /// `change_info4`.
    pub struct ChangeInfo4 {
        /// Whether before and after were taken atomically with the change.
        pub atomic: bool,
        /// The directory's change attribute before.
        pub before: u64,
        /// And after.
        pub after: u64,
    }
);

xdr_struct!(
    /// `fattr4`: a mask and the values of the attributes it names, in
    /// ascending order (see [`attr`]).
    pub struct Fattr4 {
        /// Which attributes follow.
        pub attrmask: Bitmap4,
        /// Their values.
        pub attr_vals: AttrList4,
    }
);

xdr_struct!(
    /// `state_owner4` (open and lock owners).
    pub struct StateOwner4 {
        /// The client.
        pub clientid: u64,
        /// The owner's name within it.
        pub owner: Opaque4,
    }
);

xdr_enum!(
    /// `nfs_ftype4`.
    pub enum Ftype4("nfs_ftype4") {
        /// Regular file.
        Reg = 1,
        /// Directory.
        Dir = 2,
        /// Block device.
        Blk = 3,
        /// Character device.
        Chr = 4,
        /// Symbolic link.
        Lnk = 5,
        /// Socket.
        Sock = 6,
        /// Fifo.
        Fifo = 7,
        /// Named attribute directory.
        Attrdir = 8,
        /// Named attribute.
        Namedattr = 9,
    }
);

xdr_enum!(
    /// `stable_how4`.
    #[derive(Default)]
    pub enum StableHow4("stable_how4") {
        /// Not yet on stable storage.
        #[default]
        Unstable = 0,
        /// Data on stable storage.
        DataSync = 1,
        /// Data and metadata on stable storage.
        FileSync = 2,
    }
);

xdr_enum!(
    /// `nfs_lock_type4`.
    #[derive(Default)]
    pub enum LockType4("nfs_lock_type4") {
        /// Shared.
        #[default]
        Read = 1,
        /// Exclusive.
        Write = 2,
        /// Shared, blocking.
        ReadW = 3,
        /// Exclusive, blocking.
        WriteW = 4,
    }
);

impl LockType4 {
    /// Whether the lock is exclusive.
    pub fn is_write(self) -> bool {
        matches!(self, LockType4::Write | LockType4::WriteW)
    }
}

/// Decodes a discriminated union's arm selector.
pub(crate) fn disc(d: &mut Decoder, what: &'static str) -> Result<u32> {
    d.u32(what)
}

/// A value no arm of a union accepts.
pub(crate) fn bad_arm(what: &'static str, value: u32) -> XdrError {
    XdrError::BadValue { what, value }
}

#[cfg(test)]
mod tests;
