//! COMPOUND4args and COMPOUND4res (RFC 8881 §16.2): the operation list and
//! each operation's arguments and results.

use super::ops::*;
use super::{Bitmap4, Component4, Fattr4, Fh4, Linktext4, SessionId4, Stateid4, Status, Utf8Str};
use crate::{BoundedVec, Decoder, Result, Xdr, XdrError, XdrSink};

/// Most operations a COMPOUND may carry before the decoder refuses it
/// outright (a session's `ca_maxoperations` is lower).
pub const MAX_OPS: u32 = 1024;

/// Operation numbers (`nfs_opnum4`).
#[allow(missing_docs)]
pub mod opnum {
    pub const ACCESS: u32 = 3;
    pub const CLOSE: u32 = 4;
    pub const COMMIT: u32 = 5;
    pub const CREATE: u32 = 6;
    pub const DELEGPURGE: u32 = 7;
    pub const DELEGRETURN: u32 = 8;
    pub const GETATTR: u32 = 9;
    pub const GETFH: u32 = 10;
    pub const LINK: u32 = 11;
    pub const LOCK: u32 = 12;
    pub const LOCKT: u32 = 13;
    pub const LOCKU: u32 = 14;
    pub const LOOKUP: u32 = 15;
    pub const LOOKUPP: u32 = 16;
    pub const NVERIFY: u32 = 17;
    pub const OPEN: u32 = 18;
    pub const OPENATTR: u32 = 19;
    pub const OPEN_CONFIRM: u32 = 20;
    pub const OPEN_DOWNGRADE: u32 = 21;
    pub const PUTFH: u32 = 22;
    pub const PUTPUBFH: u32 = 23;
    pub const PUTROOTFH: u32 = 24;
    pub const READ: u32 = 25;
    pub const READDIR: u32 = 26;
    pub const READLINK: u32 = 27;
    pub const REMOVE: u32 = 28;
    pub const RENAME: u32 = 29;
    pub const RENEW: u32 = 30;
    pub const RESTOREFH: u32 = 31;
    pub const SAVEFH: u32 = 32;
    pub const SECINFO: u32 = 33;
    pub const SETATTR: u32 = 34;
    pub const SETCLIENTID: u32 = 35;
    pub const SETCLIENTID_CONFIRM: u32 = 36;
    pub const VERIFY: u32 = 37;
    pub const WRITE: u32 = 38;
    pub const RELEASE_LOCKOWNER: u32 = 39;
    pub const BACKCHANNEL_CTL: u32 = 40;
    pub const BIND_CONN_TO_SESSION: u32 = 41;
    pub const EXCHANGE_ID: u32 = 42;
    pub const CREATE_SESSION: u32 = 43;
    pub const DESTROY_SESSION: u32 = 44;
    pub const FREE_STATEID: u32 = 45;
    pub const SECINFO_NO_NAME: u32 = 52;
    pub const SEQUENCE: u32 = 53;
    pub const TEST_STATEID: u32 = 55;
    pub const DESTROY_CLIENTID: u32 = 57;
    pub const RECLAIM_COMPLETE: u32 = 58;
    pub const ALLOCATE: u32 = 59;
    pub const COPY: u32 = 60;
    pub const DEALLOCATE: u32 = 62;
    pub const SEEK: u32 = 69;
    pub const CLONE: u32 = 71;
    /// The last operation number defined (NFSv4.2 with RFC 8276 xattrs).
    pub const LAST: u32 = 75;
    pub const ILLEGAL: u32 = 10044;

    /// Operation names by number, from ACCESS (3) to LAST: RFC 8881 §16,
    /// RFC 7862 §15, RFC 8276 §8.
    const NAMES: [&str; (LAST - 2) as usize] = [
        "ACCESS",
        "CLOSE",
        "COMMIT",
        "CREATE",
        "DELEGPURGE",
        "DELEGRETURN",
        "GETATTR",
        "GETFH",
        "LINK",
        "LOCK",
        "LOCKT",
        "LOCKU",
        "LOOKUP",
        "LOOKUPP",
        "NVERIFY",
        "OPEN",
        "OPENATTR",
        "OPEN_CONFIRM",
        "OPEN_DOWNGRADE",
        "PUTFH",
        "PUTPUBFH",
        "PUTROOTFH",
        "READ",
        "READDIR",
        "READLINK",
        "REMOVE",
        "RENAME",
        "RENEW",
        "RESTOREFH",
        "SAVEFH",
        "SECINFO",
        "SETATTR",
        "SETCLIENTID",
        "SETCLIENTID_CONFIRM",
        "VERIFY",
        "WRITE",
        "RELEASE_LOCKOWNER",
        "BACKCHANNEL_CTL",
        "BIND_CONN_TO_SESSION",
        "EXCHANGE_ID",
        "CREATE_SESSION",
        "DESTROY_SESSION",
        "FREE_STATEID",
        "GET_DIR_DELEGATION",
        "GETDEVICEINFO",
        "GETDEVICELIST",
        "LAYOUTCOMMIT",
        "LAYOUTGET",
        "LAYOUTRETURN",
        "SECINFO_NO_NAME",
        "SEQUENCE",
        "SET_SSV",
        "TEST_STATEID",
        "WANT_DELEGATION",
        "DESTROY_CLIENTID",
        "RECLAIM_COMPLETE",
        "ALLOCATE",
        "COPY",
        "COPY_NOTIFY",
        "DEALLOCATE",
        "IO_ADVISE",
        "LAYOUTERROR",
        "LAYOUTSTATS",
        "OFFLOAD_CANCEL",
        "OFFLOAD_STATUS",
        "READ_PLUS",
        "SEEK",
        "WRITE_SAME",
        "CLONE",
        "GETXATTR",
        "SETXATTR",
        "LISTXATTRS",
        "REMOVEXATTR",
    ];

    /// The operation's name as the RFCs spell it; `ILLEGAL` for a number
    /// no operation has.
    pub fn name(op: u32) -> &'static str {
        match op {
            3..=LAST => NAMES[(op - 3) as usize],
            _ => "ILLEGAL",
        }
    }
}

/// One operation of a COMPOUND with its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
#[allow(missing_docs)]
pub enum ArgOp {
    Access(u32),
    Close(CloseArgs),
    Commit(CommitArgs),
    Create(CreateArgs),
    Delegreturn(Stateid4),
    Getattr(Bitmap4),
    Getfh,
    Link(Component4),
    Lock(LockArgs),
    Lockt(LocktArgs),
    Locku(LockuArgs),
    Lookup(Component4),
    Lookupp,
    Nverify(Fattr4),
    Open(OpenArgs),
    OpenDowngrade(OpenDowngradeArgs),
    Putfh(Fh4),
    Putpubfh,
    Putrootfh,
    Read(ReadArgs),
    Readdir(ReaddirArgs),
    Readlink,
    Remove(Component4),
    Rename(RenameArgs),
    Restorefh,
    Savefh,
    Secinfo(Component4),
    Setattr(SetattrArgs),
    Verify(Fattr4),
    Write(WriteArgs),
    BackchannelCtl(BackchannelCtlArgs),
    BindConnToSession(BindConnArgs),
    ExchangeId(ExchangeIdArgs),
    CreateSession(CreateSessionArgs),
    DestroySession(SessionId4),
    FreeStateid(Stateid4),
    /// `secinfo_style4`: 0 the current handle, 1 its parent.
    SecinfoNoName(u32),
    Sequence(SequenceArgs),
    TestStateid(BoundedVec<Stateid4, 1024>),
    DestroyClientid(u64),
    /// `rca_one_fs`.
    ReclaimComplete(bool),
    Allocate(SpaceArgs),
    Copy(CopyArgs),
    Deallocate(SpaceArgs),
    Seek(SeekArgs),
    Clone(CloneArgs),
    #[cfg_attr(feature = "arbitrary", proptest(skip))]
    /// A defined operation whose arguments are not modelled (the decoder
    /// stops there: the server answers NFS4ERR_NOTSUPP, which ends the
    /// COMPOUND). Encodes as the number alone.
    Unsupported(u32),
    #[cfg_attr(feature = "arbitrary", proptest(skip))]
    /// An undefined operation number (NFS4ERR_OP_ILLEGAL; the decoder stops
    /// there). Encodes as the number alone.
    Illegal(u32),
}

impl ArgOp {
    /// The operation number.
    pub fn num(&self) -> u32 {
        use opnum as N;
        match self {
            ArgOp::Access(_) => N::ACCESS,
            ArgOp::Close(_) => N::CLOSE,
            ArgOp::Commit(_) => N::COMMIT,
            ArgOp::Create(_) => N::CREATE,
            ArgOp::Delegreturn(_) => N::DELEGRETURN,
            ArgOp::Getattr(_) => N::GETATTR,
            ArgOp::Getfh => N::GETFH,
            ArgOp::Link(_) => N::LINK,
            ArgOp::Lock(_) => N::LOCK,
            ArgOp::Lockt(_) => N::LOCKT,
            ArgOp::Locku(_) => N::LOCKU,
            ArgOp::Lookup(_) => N::LOOKUP,
            ArgOp::Lookupp => N::LOOKUPP,
            ArgOp::Nverify(_) => N::NVERIFY,
            ArgOp::Open(_) => N::OPEN,
            ArgOp::OpenDowngrade(_) => N::OPEN_DOWNGRADE,
            ArgOp::Putfh(_) => N::PUTFH,
            ArgOp::Putpubfh => N::PUTPUBFH,
            ArgOp::Putrootfh => N::PUTROOTFH,
            ArgOp::Read(_) => N::READ,
            ArgOp::Readdir(_) => N::READDIR,
            ArgOp::Readlink => N::READLINK,
            ArgOp::Remove(_) => N::REMOVE,
            ArgOp::Rename(_) => N::RENAME,
            ArgOp::Restorefh => N::RESTOREFH,
            ArgOp::Savefh => N::SAVEFH,
            ArgOp::Secinfo(_) => N::SECINFO,
            ArgOp::Setattr(_) => N::SETATTR,
            ArgOp::Verify(_) => N::VERIFY,
            ArgOp::Write(_) => N::WRITE,
            ArgOp::BackchannelCtl(_) => N::BACKCHANNEL_CTL,
            ArgOp::BindConnToSession(_) => N::BIND_CONN_TO_SESSION,
            ArgOp::ExchangeId(_) => N::EXCHANGE_ID,
            ArgOp::CreateSession(_) => N::CREATE_SESSION,
            ArgOp::DestroySession(_) => N::DESTROY_SESSION,
            ArgOp::FreeStateid(_) => N::FREE_STATEID,
            ArgOp::SecinfoNoName(_) => N::SECINFO_NO_NAME,
            ArgOp::Sequence(_) => N::SEQUENCE,
            ArgOp::TestStateid(_) => N::TEST_STATEID,
            ArgOp::DestroyClientid(_) => N::DESTROY_CLIENTID,
            ArgOp::ReclaimComplete(_) => N::RECLAIM_COMPLETE,
            ArgOp::Allocate(_) => N::ALLOCATE,
            ArgOp::Copy(_) => N::COPY,
            ArgOp::Deallocate(_) => N::DEALLOCATE,
            ArgOp::Seek(_) => N::SEEK,
            ArgOp::Clone(_) => N::CLONE,
            ArgOp::Unsupported(n) | ArgOp::Illegal(n) => *n,
        }
    }

    /// Whether decoding stops after this operation.
    pub fn ends_decoding(&self) -> bool {
        matches!(self, ArgOp::Unsupported(_) | ArgOp::Illegal(_))
    }
}

macro_rules! arg_codec {
    ($( $var:ident ( $ty:ty ) = $num:ident ),* ; $( $unit:ident = $unum:ident ),* ) => {
        impl Xdr for ArgOp {
            fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
                s.put_u32_be(self.num());
                match self {
                    $( ArgOp::$var(a) => a.encode(s), )*
                    $( ArgOp::$unit => {} )*
                    ArgOp::Unsupported(_) | ArgOp::Illegal(_) => {}
                }
            }
            fn decode(d: &mut Decoder) -> Result<Self> {
                let op = d.u32("nfs_opnum4")?;
                Ok(match op {
                    $( opnum::$num => ArgOp::$var(<$ty>::decode(d)?), )*
                    $( opnum::$unum => ArgOp::$unit, )*
                    3..=opnum::LAST => ArgOp::Unsupported(op),
                    _ => ArgOp::Illegal(op),
                })
            }
            fn encoded_len(&self) -> usize {
                4 + match self {
                    $( ArgOp::$var(a) => a.encoded_len(), )*
                    _ => 0,
                }
            }
        }
    };
}

arg_codec!(
    Access(u32) = ACCESS, Close(CloseArgs) = CLOSE, Commit(CommitArgs) = COMMIT,
    Create(CreateArgs) = CREATE, Delegreturn(Stateid4) = DELEGRETURN, Getattr(Bitmap4) = GETATTR, Link(Component4) = LINK,
    Lock(LockArgs) = LOCK, Lockt(LocktArgs) = LOCKT, Locku(LockuArgs) = LOCKU,
    Lookup(Component4) = LOOKUP, Nverify(Fattr4) = NVERIFY, Open(OpenArgs) = OPEN,
    OpenDowngrade(OpenDowngradeArgs) = OPEN_DOWNGRADE, Putfh(Fh4) = PUTFH,
    Read(ReadArgs) = READ, Readdir(ReaddirArgs) = READDIR, Remove(Component4) = REMOVE,
    Rename(RenameArgs) = RENAME, Secinfo(Component4) = SECINFO,
    Setattr(SetattrArgs) = SETATTR, Verify(Fattr4) = VERIFY, Write(WriteArgs) = WRITE,
    BackchannelCtl(BackchannelCtlArgs) = BACKCHANNEL_CTL,
    BindConnToSession(BindConnArgs) = BIND_CONN_TO_SESSION,
    ExchangeId(ExchangeIdArgs) = EXCHANGE_ID, CreateSession(CreateSessionArgs) = CREATE_SESSION,
    DestroySession(SessionId4) = DESTROY_SESSION, FreeStateid(Stateid4) = FREE_STATEID,
    SecinfoNoName(u32) = SECINFO_NO_NAME, Sequence(SequenceArgs) = SEQUENCE,
    TestStateid(BoundedVec<Stateid4, 1024>) = TEST_STATEID,
    DestroyClientid(u64) = DESTROY_CLIENTID, ReclaimComplete(bool) = RECLAIM_COMPLETE,
    Allocate(SpaceArgs) = ALLOCATE, Copy(CopyArgs) = COPY, Deallocate(SpaceArgs) = DEALLOCATE,
    Seek(SeekArgs) = SEEK, Clone(CloneArgs) = CLONE;
    Getfh = GETFH, Lookupp = LOOKUPP, Putpubfh = PUTPUBFH, Putrootfh = PUTROOTFH,
    Readlink = READLINK, Restorefh = RESTOREFH, Savefh = SAVEFH
);

/// One operation's result.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
#[allow(missing_docs)]
pub enum ResOp {
    Access(Res<AccessResOk>),
    Close(Res<Stateid4>),
    Commit(Res<[u8; 8]>),
    Create(Res<CreateResOk>),
    Delegreturn(Res<()>),
    Getattr(Res<Fattr4>),
    Getfh(Res<Fh4>),
    Link(Res<super::ChangeInfo4>),
    Lock(LockRes<Stateid4>),
    Lockt(LockRes<()>),
    Locku(Res<Stateid4>),
    Lookup(Res<()>),
    Lookupp(Res<()>),
    Nverify(Res<()>),
    Open(Res<OpenResOk>),
    OpenDowngrade(Res<Stateid4>),
    Putfh(Res<()>),
    Putpubfh(Res<()>),
    Putrootfh(Res<()>),
    Read(Res<ReadResOk>),
    Readdir(Res<ReaddirResOk>),
    Readlink(Res<Linktext4>),
    Remove(Res<super::ChangeInfo4>),
    Rename(Res<RenameResOk>),
    Restorefh(Res<()>),
    Savefh(Res<()>),
    Secinfo(Res<SecInfoList>),
    Setattr(SetattrRes),
    Verify(Res<()>),
    Write(Res<WriteResOk>),
    BackchannelCtl(Res<()>),
    BindConnToSession(Res<BindConnResOk>),
    ExchangeId(Res<ExchangeIdResOk>),
    CreateSession(Res<CreateSessionResOk>),
    DestroySession(Res<()>),
    FreeStateid(Res<()>),
    SecinfoNoName(Res<SecInfoList>),
    Sequence(Res<SequenceResOk>),
    TestStateid(Res<BoundedVec<Status, 1024>>),
    DestroyClientid(Res<()>),
    ReclaimComplete(Res<()>),
    Allocate(Res<()>),
    Copy(Res<CopyResOk>),
    Deallocate(Res<()>),
    Seek(Res<SeekResOk>),
    Clone(Res<()>),
    #[cfg_attr(feature = "arbitrary", proptest(skip))]
    /// The result of any other operation: an error status alone (a
    /// decoder reading an unmodelled operation's success stops with an
    /// error, as it cannot know the body's length).
    Other(u32, Status),
}

impl ResOp {
    /// The result of operation `op` failing with `st` (which must not be
    /// NFS4ERR_DENIED): the status alone, or for SETATTR with an empty
    /// mask.
    pub fn error(op: u32, st: Status) -> ResOp {
        match op {
            opnum::SETATTR => ResOp::Setattr(SetattrRes {
                status: st,
                attrsset: Bitmap4::default(),
            }),
            opnum::LOCK => ResOp::Lock(LockRes::Err(st)),
            opnum::LOCKT => ResOp::Lockt(LockRes::Err(st)),
            _ => ResOp::Other(op, st),
        }
    }
}

macro_rules! res_codec {
    ($( $var:ident ( $ty:ty ) = $num:ident ),* $(,)?) => {
        impl ResOp {
            /// The operation number.
            pub fn num(&self) -> u32 {
                match self {
                    $( ResOp::$var(_) => opnum::$num, )*
                    ResOp::Setattr(_) => opnum::SETATTR,
                    ResOp::Lock(_) => opnum::LOCK,
                    ResOp::Lockt(_) => opnum::LOCKT,
                    ResOp::Other(n, _) => *n,
                }
            }

            /// The status.
            pub fn status(&self) -> Status {
                match self {
                    $( ResOp::$var(r) => r.as_ref().err().copied().unwrap_or(Status::OK), )*
                    ResOp::Setattr(r) => r.status,
                    ResOp::Lock(r) => r.status(),
                    ResOp::Lockt(r) => r.status(),
                    ResOp::Other(_, s) => *s,
                }
            }
        }

        impl Xdr for ResOp {
            fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
                s.put_u32_be(self.num());
                match self {
                    $( ResOp::$var(r) => r.encode(s), )*
                    ResOp::Setattr(r) => r.encode(s),
                    ResOp::Lock(r) => r.encode(s),
                    ResOp::Lockt(r) => r.encode(s),
                    ResOp::Other(_, st) => st.encode(s),
                }
            }
            fn decode(d: &mut Decoder) -> Result<Self> {
                let op = d.u32("nfs_opnum4")?;
                Ok(match op {
                    $( opnum::$num => ResOp::$var(<$ty>::decode(d)?), )*
                    opnum::SETATTR => ResOp::Setattr(SetattrRes::decode(d)?),
                    opnum::LOCK => ResOp::Lock(LockRes::decode(d)?),
                    opnum::LOCKT => ResOp::Lockt(LockRes::decode(d)?),
                    _ => {
                        let st = Status::decode(d)?;
                        if st.is_ok() {
                            return Err(XdrError::Invalid {
                                what: "nfs_resop4",
                                why: "success of an operation whose results are not modelled",
                            });
                        }
                        ResOp::Other(op, st)
                    }
                })
            }
            fn encoded_len(&self) -> usize {
                4 + match self {
                    $( ResOp::$var(r) => r.encoded_len(), )*
                    ResOp::Setattr(r) => r.encoded_len(),
                    ResOp::Lock(r) => r.encoded_len(),
                    ResOp::Lockt(r) => r.encoded_len(),
                    ResOp::Other(..) => 4,
                }
            }
        }
    };
}

res_codec!(
    Access(Res<AccessResOk>) = ACCESS, Close(Res<Stateid4>) = CLOSE,
    Commit(Res<[u8; 8]>) = COMMIT, Create(Res<CreateResOk>) = CREATE,
    Delegreturn(Res<()>) = DELEGRETURN,
    Getattr(Res<Fattr4>) = GETATTR, Getfh(Res<Fh4>) = GETFH,
    Link(Res<super::ChangeInfo4>) = LINK, Locku(Res<Stateid4>) = LOCKU,
    Lookup(Res<()>) = LOOKUP, Lookupp(Res<()>) = LOOKUPP, Nverify(Res<()>) = NVERIFY,
    Open(Res<OpenResOk>) = OPEN, OpenDowngrade(Res<Stateid4>) = OPEN_DOWNGRADE,
    Putfh(Res<()>) = PUTFH, Putpubfh(Res<()>) = PUTPUBFH, Putrootfh(Res<()>) = PUTROOTFH,
    Read(Res<ReadResOk>) = READ, Readdir(Res<ReaddirResOk>) = READDIR,
    Readlink(Res<Linktext4>) = READLINK, Remove(Res<super::ChangeInfo4>) = REMOVE,
    Rename(Res<RenameResOk>) = RENAME, Restorefh(Res<()>) = RESTOREFH,
    Savefh(Res<()>) = SAVEFH, Secinfo(Res<SecInfoList>) = SECINFO,
    Verify(Res<()>) = VERIFY, Write(Res<WriteResOk>) = WRITE,
    BackchannelCtl(Res<()>) = BACKCHANNEL_CTL,
    BindConnToSession(Res<BindConnResOk>) = BIND_CONN_TO_SESSION,
    ExchangeId(Res<ExchangeIdResOk>) = EXCHANGE_ID,
    CreateSession(Res<CreateSessionResOk>) = CREATE_SESSION,
    DestroySession(Res<()>) = DESTROY_SESSION, FreeStateid(Res<()>) = FREE_STATEID,
    SecinfoNoName(Res<SecInfoList>) = SECINFO_NO_NAME, Sequence(Res<SequenceResOk>) = SEQUENCE,
    TestStateid(Res<BoundedVec<Status, 1024>>) = TEST_STATEID,
    DestroyClientid(Res<()>) = DESTROY_CLIENTID, ReclaimComplete(Res<()>) = RECLAIM_COMPLETE,
    Allocate(Res<()>) = ALLOCATE, Copy(Res<CopyResOk>) = COPY, Deallocate(Res<()>) = DEALLOCATE,
    Seek(Res<SeekResOk>) = SEEK, Clone(Res<()>) = CLONE,
);

/// COMPOUND4args.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub struct Compound4Args {
    /// Echoed in the reply.
    pub tag: Utf8Str,
    /// 1 or 2 here.
    pub minorversion: u32,
    /// The operations.
    pub ops: Vec<ArgOp>,
}

/// How decoding a COMPOUND's operations ended early.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OpsCut {
    /// The operation count is above [`MAX_OPS`]: none was decoded.
    TooMany(u32),
    /// The arguments of operation number `op` (at index `at`) do not
    /// decode: NFS4ERR_BADXDR for it.
    Garbage {
        /// Its index.
        at: usize,
        /// Its number.
        op: u32,
        /// Why.
        error: XdrError,
    },
}

impl Compound4Args {
    /// Decodes the tag and minor version, then as many operations as
    /// decode: a server runs those and answers for the cut (`OpsCut`), as
    /// RFC 8881 §16.2.3 has it (a COMPOUND stops at its first failure).
    /// An error is returned only when the tag or minor version is
    /// missing.
    pub fn decode_lenient(d: &mut Decoder) -> Result<(Compound4Args, Option<OpsCut>)> {
        let tag = Utf8Str::decode(d)?;
        let minorversion = d.u32("minorversion")?;
        let n = d.u32("argarray count")?;
        let mut args = Compound4Args {
            tag,
            minorversion,
            ops: Vec::new(),
        };
        if n > MAX_OPS {
            return Ok((args, Some(OpsCut::TooMany(n))));
        }
        // Room for the operations there can be: each takes 4 bytes at least.
        args.ops.reserve_exact((n as usize).min(d.remaining() / 4));
        for at in 0..n as usize {
            let start_op = d.clone().u32("nfs_opnum4").unwrap_or(0);
            match ArgOp::decode(d) {
                Ok(op) => {
                    let stop = op.ends_decoding();
                    args.ops.push(op);
                    if stop {
                        return Ok((args, None));
                    }
                }
                Err(error) => {
                    return Ok((
                        args,
                        Some(OpsCut::Garbage {
                            at,
                            op: start_op,
                            error,
                        }),
                    ))
                }
            }
        }
        Ok((args, None))
    }
}

impl Xdr for Compound4Args {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.tag.encode(s);
        s.put_u32_be(self.minorversion);
        s.put_u32_be(self.ops.len() as u32);
        for op in &self.ops {
            op.encode(s);
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match Compound4Args::decode_lenient(d)? {
            (a, None) => Ok(a),
            (_, Some(OpsCut::TooMany(n))) => Err(XdrError::TooLong {
                what: "argarray",
                len: n.into(),
                max: MAX_OPS.into(),
            }),
            (_, Some(OpsCut::Garbage { error, .. })) => Err(error),
        }
    }
    fn encoded_len(&self) -> usize {
        self.tag.encoded_len() + 8 + self.ops.iter().map(Xdr::encoded_len).sum::<usize>()
    }
}

/// COMPOUND4res.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub struct Compound4Res {
    /// The status of the last operation run.
    pub status: Status,
    /// The call's tag.
    pub tag: Utf8Str,
    /// One result per operation run.
    pub results: Vec<ResOp>,
}

impl Xdr for Compound4Res {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.status.encode(s);
        self.tag.encode(s);
        s.put_u32_be(self.results.len() as u32);
        for r in &self.results {
            r.encode(s);
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        let status = Status::decode(d)?;
        let tag = Utf8Str::decode(d)?;
        let n = d.count("resarray", MAX_OPS, 8)?;
        let mut results = Vec::with_capacity(n);
        for _ in 0..n {
            results.push(ResOp::decode(d)?);
        }
        Ok(Compound4Res {
            status,
            tag,
            results,
        })
    }
    fn encoded_len(&self) -> usize {
        4 + self.tag.encoded_len() + 4 + self.results.iter().map(Xdr::encoded_len).sum::<usize>()
    }
}
