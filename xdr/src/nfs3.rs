//! NFS version 3 (RFC 1813): every type, and the arguments and results of
//! all 22 procedures.
//!
//! Names follow the RFC with Rust casing (`fattr3` is [`Fattr3`],
//! `READ3args` is [`Read3Args`]). A procedure's result is an
//! [`NfsResult`]: the `resok` arm on NFS3_OK, the status and `resfail` arm
//! otherwise.

use crate::{Decoder, List, Payload, Result, Xdr, XdrError, XdrSink};

/// NFS program number.
pub const PROGRAM: u32 = 100003;
/// NFS protocol version.
pub const VERSION: u32 = 3;
/// Largest file handle (NFS3_FHSIZE).
pub const FHSIZE: u32 = 64;
/// Size of the cookie verifier.
pub const COOKIEVERFSIZE: usize = 8;
/// Size of the exclusive-create verifier.
pub const CREATEVERFSIZE: usize = 8;
/// Size of the write verifier.
pub const WRITEVERFSIZE: usize = 8;
/// Longest name or path the decoder accepts. Names longer than 255 bytes
/// still decode so that the server can answer NFS3ERR_NAMETOOLONG.
pub const MAXPATHLEN: u32 = 4096;
/// Largest READ/WRITE payload the decoder accepts.
pub const MAXDATA: u32 = 16 << 20;

/// ACCESS3 bits.
pub mod access {
    /// Read data or list a directory.
    pub const READ: u32 = 0x0001;
    /// Look up a name in a directory.
    pub const LOOKUP: u32 = 0x0002;
    /// Rewrite data or modify a directory entry.
    pub const MODIFY: u32 = 0x0004;
    /// Write past the end or add a directory entry.
    pub const EXTEND: u32 = 0x0008;
    /// Delete a directory entry.
    pub const DELETE: u32 = 0x0010;
    /// Execute a file (no meaning for directories).
    pub const EXECUTE: u32 = 0x0020;
}

/// FSINFO3 `properties` bits.
pub mod fsf {
    /// Hard links are supported.
    pub const LINK: u32 = 0x0001;
    /// Symbolic links are supported.
    pub const SYMLINK: u32 = 0x0002;
    /// PATHCONF is the same for every file.
    pub const HOMOGENEOUS: u32 = 0x0008;
    /// SETATTR can set times to client-supplied values.
    pub const CANSETTIME: u32 = 0x0010;
}

xdr_enum!(
    /// `nfsstat3`.
    pub enum NfsStat3("nfsstat3") {
        /// Success.
        Ok = 0,
        /// Not owner.
        Perm = 1,
        /// No such file or directory.
        Noent = 2,
        /// I/O error.
        Io = 5,
        /// No such device or address.
        Nxio = 6,
        /// Permission denied.
        Acces = 13,
        /// File exists.
        Exist = 17,
        /// Cross-device link.
        Xdev = 18,
        /// No such device.
        Nodev = 19,
        /// Not a directory.
        Notdir = 20,
        /// Is a directory.
        Isdir = 21,
        /// Invalid argument.
        Inval = 22,
        /// File too large.
        Fbig = 27,
        /// No space left on device.
        Nospc = 28,
        /// Read-only file system.
        Rofs = 30,
        /// Too many hard links.
        Mlink = 31,
        /// Name too long.
        Nametoolong = 63,
        /// Directory not empty.
        Notempty = 66,
        /// Quota exceeded.
        Dquot = 69,
        /// Stale file handle.
        Stale = 70,
        /// Too many levels of remote in path.
        Remote = 71,
        /// Illegal NFS file handle.
        Badhandle = 10001,
        /// SETATTR guard mismatch.
        NotSync = 10002,
        /// READDIR cookie is stale.
        BadCookie = 10003,
        /// Operation not supported.
        Notsupp = 10004,
        /// Buffer or request too small.
        Toosmall = 10005,
        /// Server fault.
        Serverfault = 10006,
        /// Object type not supported.
        Badtype = 10007,
        /// Try again later.
        Jukebox = 10008,
    }
);

xdr_enum!(
    /// `ftype3`.
    #[derive(Default)]
    pub enum Ftype3("ftype3") {
        /// Regular file.
        #[default]
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
        /// Named pipe.
        Fifo = 7,
    }
);

xdr_enum!(
    /// `stable_how`.
    #[derive(Default)]
    pub enum StableHow("stable_how") {
        /// The server may cache the data.
        #[default]
        Unstable = 0,
        /// Data is on stable storage, metadata may not be.
        DataSync = 1,
        /// Data and metadata are on stable storage.
        FileSync = 2,
    }
);

xdr_opaque!(
    /// `nfs_fh3`: an opaque file handle of at most 64 bytes.
    pub struct NfsFh3, max = FHSIZE, what = "nfs_fh3", payload = false
);

xdr_opaque!(
    /// `filename3`: one path component.
    pub struct Filename3, max = MAXPATHLEN, what = "filename3", payload = false
);

xdr_opaque!(
    /// `nfspath3`: a symbolic link's target (DDP-eligible).
    pub struct NfsPath3, max = MAXPATHLEN, what = "nfspath3", payload = true
);

/// READ and WRITE data (DDP-eligible): a [`Payload`], possibly in pieces
/// (a READ reply carries the store blocks it covers without copying them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Data(pub Payload);

impl Data {
    /// The largest length the decoder accepts.
    pub const MAX: u32 = MAXDATA;

    /// Wraps a payload.
    pub fn new(p: impl Into<Payload>) -> Self {
        Data(p.into())
    }
}

impl std::ops::Deref for Data {
    type Target = Payload;
    fn deref(&self) -> &Payload {
        &self.0
    }
}

impl<T: Into<Payload>> From<T> for Data {
    fn from(v: T) -> Self {
        Data(v.into())
    }
}

impl Xdr for Data {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        crate::encode_payload(s, &self.0);
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        d.payload("data", MAXDATA).map(Data)
    }
    fn encoded_len(&self) -> usize {
        4 + crate::roundup(self.0.len())
    }
}

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for Data {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        any::<Payload>().prop_map(Data).boxed()
    }
}

/// `cookieverf3`.
pub type CookieVerf3 = [u8; COOKIEVERFSIZE];
/// `createverf3`.
pub type CreateVerf3 = [u8; CREATEVERFSIZE];
/// `writeverf3`.
pub type WriteVerf3 = [u8; WRITEVERFSIZE];

xdr_struct!(
    /// `specdata3`: device numbers.
    #[derive(Copy)]
    pub struct SpecData3 {
        /// Major number.
        pub specdata1: u32,
        /// Minor number.
        pub specdata2: u32,
    }
);

xdr_struct!(
    /// `nfstime3`.
    #[derive(Copy, Hash, PartialOrd, Ord)]
    pub struct NfsTime3 {
        /// Seconds since the epoch.
        pub seconds: u32,
        /// Nanoseconds.
        pub nseconds: u32,
    }
);

xdr_struct!(
    /// `fattr3`: file attributes.
    pub struct Fattr3 {
        /// File type.
        pub type_: Ftype3,
        /// Protection mode bits.
        pub mode: u32,
        /// Hard link count.
        pub nlink: u32,
        /// Owner.
        pub uid: u32,
        /// Group.
        pub gid: u32,
        /// Size in bytes.
        pub size: u64,
        /// Bytes of storage used.
        pub used: u64,
        /// Device numbers (block and character devices).
        pub rdev: SpecData3,
        /// File system id.
        pub fsid: u64,
        /// File id (inode number).
        pub fileid: u64,
        /// Last access.
        pub atime: NfsTime3,
        /// Last data modification.
        pub mtime: NfsTime3,
        /// Last attribute change.
        pub ctime: NfsTime3,
    }
);

/// `post_op_attr`.
pub type PostOpAttr = Option<Fattr3>;

xdr_struct!(
    /// `wcc_attr`: the attributes a client uses to check its cache.
    #[derive(Copy)]
    pub struct WccAttr {
        /// Size.
        pub size: u64,
        /// Modification time.
        pub mtime: NfsTime3,
        /// Change time.
        pub ctime: NfsTime3,
    }
);

/// `pre_op_attr`.
pub type PreOpAttr = Option<WccAttr>;

xdr_struct!(
    /// `wcc_data`: weak cache consistency data.
    pub struct WccData {
        /// Attributes before the operation.
        pub before: PreOpAttr,
        /// Attributes after the operation.
        pub after: PostOpAttr,
    }
);

/// `post_op_fh3`.
pub type PostOpFh3 = Option<NfsFh3>;

/// `set_atime` / `set_mtime`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum SetTime {
    /// DONT_CHANGE.
    #[default]
    DontChange,
    /// SET_TO_SERVER_TIME.
    ServerTime,
    /// SET_TO_CLIENT_TIME.
    ClientTime(NfsTime3),
}

impl Xdr for SetTime {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            SetTime::DontChange => s.put_u32_be(0),
            SetTime::ServerTime => s.put_u32_be(1),
            SetTime::ClientTime(t) => {
                s.put_u32_be(2);
                t.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match d.u32("time_how")? {
            0 => SetTime::DontChange,
            1 => SetTime::ServerTime,
            2 => SetTime::ClientTime(NfsTime3::decode(d)?),
            value => {
                return Err(XdrError::BadValue {
                    what: "time_how",
                    value,
                })
            }
        })
    }
    fn encoded_len(&self) -> usize {
        match self {
            SetTime::ClientTime(_) => 12,
            _ => 4,
        }
    }
}

xdr_struct!(
    /// `sattr3`: attributes to set.
    pub struct Sattr3 {
        /// `set_mode3`.
        pub mode: Option<u32>,
        /// `set_uid3`.
        pub uid: Option<u32>,
        /// `set_gid3`.
        pub gid: Option<u32>,
        /// `set_size3`.
        pub size: Option<u64>,
        /// `set_atime`.
        pub atime: SetTime,
        /// `set_mtime`.
        pub mtime: SetTime,
    }
);

xdr_struct!(
    /// `diropargs3`: a directory and a name in it.
    pub struct DirOpArgs3 {
        /// The directory.
        pub dir: NfsFh3,
        /// The name.
        pub name: Filename3,
    }
);

/// A procedure result: `resok` on NFS3_OK, otherwise the status and
/// `resfail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NfsResult<T, F> {
    /// NFS3_OK and the `resok` arm.
    Ok(T),
    /// An error status (never [`NfsStat3::Ok`]) and the `resfail` arm.
    Err(NfsStat3, F),
}

impl<T, F> NfsResult<T, F> {
    /// The status on the wire.
    pub fn status(&self) -> NfsStat3 {
        match self {
            NfsResult::Ok(_) => NfsStat3::Ok,
            NfsResult::Err(s, _) => *s,
        }
    }

    /// Converts into a `std::result::Result`.
    pub fn into_result(self) -> std::result::Result<T, (NfsStat3, F)> {
        match self {
            NfsResult::Ok(v) => Ok(v),
            NfsResult::Err(s, f) => Err((s, f)),
        }
    }
}

impl<T: Xdr, F: Xdr> Xdr for NfsResult<T, F> {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            NfsResult::Ok(v) => {
                s.put_u32_be(0);
                v.encode(s);
            }
            NfsResult::Err(st, f) => {
                debug_assert!(*st != NfsStat3::Ok, "an error result needs an error status");
                st.encode(s);
                f.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match NfsStat3::decode(d)? {
            NfsStat3::Ok => Ok(NfsResult::Ok(T::decode(d)?)),
            st => Ok(NfsResult::Err(st, F::decode(d)?)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            NfsResult::Ok(v) => v.encoded_len(),
            NfsResult::Err(_, f) => f.encoded_len(),
        }
    }
}

#[cfg(feature = "arbitrary")]
impl<T, F> proptest::arbitrary::Arbitrary for NfsResult<T, F>
where
    T: proptest::arbitrary::Arbitrary + 'static,
    F: proptest::arbitrary::Arbitrary + 'static,
{
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            any::<T>().prop_map(NfsResult::Ok),
            (
                any::<NfsStat3>().prop_filter("error status", |s| *s != NfsStat3::Ok),
                any::<F>()
            )
                .prop_map(|(s, f)| NfsResult::Err(s, f)),
        ]
        .boxed()
    }
}

// ---- 1 GETATTR -------------------------------------------------------------

xdr_struct!(
    /// GETATTR3args.
    pub struct Getattr3Args {
        /// The object.
        pub object: NfsFh3,
    }
);
xdr_struct!(
    /// GETATTR3resok.
    pub struct Getattr3ResOk {
        /// Its attributes.
        pub obj_attributes: Fattr3,
    }
);
/// GETATTR3res.
pub type Getattr3Res = NfsResult<Getattr3ResOk, ()>;

// ---- 2 SETATTR -------------------------------------------------------------

xdr_struct!(
    /// SETATTR3args.
    pub struct Setattr3Args {
        /// The object.
        pub object: NfsFh3,
        /// What to set.
        pub new_attributes: Sattr3,
        /// `sattrguard3`: apply only when the object's ctime equals this.
        pub guard: Option<NfsTime3>,
    }
);
xdr_struct!(
    /// SETATTR3resok and SETATTR3resfail.
    pub struct Setattr3ResBody {
        /// Weak cache consistency data of the object.
        pub obj_wcc: WccData,
    }
);
/// SETATTR3res.
pub type Setattr3Res = NfsResult<Setattr3ResBody, Setattr3ResBody>;

// ---- 3 LOOKUP --------------------------------------------------------------

xdr_struct!(
    /// LOOKUP3args.
    pub struct Lookup3Args {
        /// Directory and name.
        pub what: DirOpArgs3,
    }
);
xdr_struct!(
    /// LOOKUP3resok.
    pub struct Lookup3ResOk {
        /// The handle found.
        pub object: NfsFh3,
        /// Its attributes.
        pub obj_attributes: PostOpAttr,
        /// The directory's attributes.
        pub dir_attributes: PostOpAttr,
    }
);
xdr_struct!(
    /// LOOKUP3resfail.
    pub struct Lookup3ResFail {
        /// The directory's attributes.
        pub dir_attributes: PostOpAttr,
    }
);
/// LOOKUP3res.
pub type Lookup3Res = NfsResult<Lookup3ResOk, Lookup3ResFail>;

// ---- 4 ACCESS --------------------------------------------------------------

xdr_struct!(
    /// ACCESS3args.
    pub struct Access3Args {
        /// The object.
        pub object: NfsFh3,
        /// Bits to check ([`access`]).
        pub access: u32,
    }
);
xdr_struct!(
    /// ACCESS3resok.
    pub struct Access3ResOk {
        /// The object's attributes.
        pub obj_attributes: PostOpAttr,
        /// Bits granted.
        pub access: u32,
    }
);
xdr_struct!(
    /// Result bodies that carry only the object's attributes (ACCESS3resfail,
    /// READLINK3resfail, READ3resfail, READDIR3resfail, READDIRPLUS3resfail,
    /// FSSTAT3resfail, FSINFO3resfail, PATHCONF3resfail).
    pub struct AttrOnly {
        /// The object's attributes.
        pub obj_attributes: PostOpAttr,
    }
);
/// ACCESS3res.
pub type Access3Res = NfsResult<Access3ResOk, AttrOnly>;

// ---- 5 READLINK ------------------------------------------------------------

xdr_struct!(
    /// READLINK3args.
    pub struct Readlink3Args {
        /// The symbolic link.
        pub symlink: NfsFh3,
    }
);
xdr_struct!(
    /// READLINK3resok.
    pub struct Readlink3ResOk {
        /// The link's attributes.
        pub symlink_attributes: PostOpAttr,
        /// The link's target.
        pub data: NfsPath3,
    }
);
/// READLINK3res.
pub type Readlink3Res = NfsResult<Readlink3ResOk, AttrOnly>;

// ---- 6 READ ----------------------------------------------------------------

xdr_struct!(
    /// READ3args.
    pub struct Read3Args {
        /// The file.
        pub file: NfsFh3,
        /// Where to start.
        pub offset: u64,
        /// Bytes wanted.
        pub count: u32,
    }
);
xdr_struct!(
    /// READ3resok.
    pub struct Read3ResOk {
        /// The file's attributes.
        pub file_attributes: PostOpAttr,
        /// Bytes returned.
        pub count: u32,
        /// The read reached the end of the file.
        pub eof: bool,
        /// The data.
        pub data: Data,
    }
);
/// READ3res.
pub type Read3Res = NfsResult<Read3ResOk, AttrOnly>;

// ---- 7 WRITE ---------------------------------------------------------------

xdr_struct!(
    /// WRITE3args.
    pub struct Write3Args {
        /// The file.
        pub file: NfsFh3,
        /// Where to write.
        pub offset: u64,
        /// Bytes to write.
        pub count: u32,
        /// Stability asked for.
        pub stable: StableHow,
        /// The data.
        pub data: Data,
    }
);
xdr_struct!(
    /// WRITE3resok.
    pub struct Write3ResOk {
        /// The file's weak cache consistency data.
        pub file_wcc: WccData,
        /// Bytes written.
        pub count: u32,
        /// Stability reached.
        pub committed: StableHow,
        /// The server's write verifier.
        pub verf: WriteVerf3,
    }
);
xdr_struct!(
    /// WRITE3resfail and COMMIT3resfail.
    pub struct FileWcc {
        /// The file's weak cache consistency data.
        pub file_wcc: WccData,
    }
);
/// WRITE3res.
pub type Write3Res = NfsResult<Write3ResOk, FileWcc>;

// ---- 8 CREATE, 9 MKDIR, 10 SYMLINK, 11 MKNOD -------------------------------

/// `createhow3`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum CreateHow3 {
    /// UNCHECKED: create or truncate.
    Unchecked(Sattr3),
    /// GUARDED: fail with NFS3ERR_EXIST when the name exists.
    Guarded(Sattr3),
    /// EXCLUSIVE: idempotent create keyed by a verifier.
    Exclusive(CreateVerf3),
}

impl Default for CreateHow3 {
    fn default() -> Self {
        CreateHow3::Unchecked(Sattr3::default())
    }
}

impl Xdr for CreateHow3 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            CreateHow3::Unchecked(a) => {
                s.put_u32_be(0);
                a.encode(s);
            }
            CreateHow3::Guarded(a) => {
                s.put_u32_be(1);
                a.encode(s);
            }
            CreateHow3::Exclusive(v) => {
                s.put_u32_be(2);
                v.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match d.u32("createmode3")? {
            0 => CreateHow3::Unchecked(Sattr3::decode(d)?),
            1 => CreateHow3::Guarded(Sattr3::decode(d)?),
            2 => CreateHow3::Exclusive(d.array("createverf3")?),
            value => {
                return Err(XdrError::BadValue {
                    what: "createmode3",
                    value,
                })
            }
        })
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            CreateHow3::Unchecked(a) | CreateHow3::Guarded(a) => a.encoded_len(),
            CreateHow3::Exclusive(_) => CREATEVERFSIZE,
        }
    }
}

xdr_struct!(
    /// CREATE3args.
    pub struct Create3Args {
        /// Directory and name.
        pub where_: DirOpArgs3,
        /// How to create.
        pub how: CreateHow3,
    }
);
xdr_struct!(
    /// CREATE3resok, MKDIR3resok, SYMLINK3resok and MKNOD3resok.
    pub struct DirOpResOk {
        /// The new object's handle.
        pub obj: PostOpFh3,
        /// Its attributes.
        pub obj_attributes: PostOpAttr,
        /// The directory's weak cache consistency data.
        pub dir_wcc: WccData,
    }
);
xdr_struct!(
    /// Result bodies carrying the directory's weak cache consistency data
    /// (CREATE3resfail, MKDIR3resfail, SYMLINK3resfail, MKNOD3resfail,
    /// REMOVE3resok/resfail, RMDIR3resok/resfail).
    pub struct DirWcc {
        /// The directory's weak cache consistency data.
        pub dir_wcc: WccData,
    }
);
/// CREATE3res.
pub type Create3Res = NfsResult<DirOpResOk, DirWcc>;

xdr_struct!(
    /// MKDIR3args.
    pub struct Mkdir3Args {
        /// Directory and name.
        pub where_: DirOpArgs3,
        /// Initial attributes.
        pub attributes: Sattr3,
    }
);
/// MKDIR3res.
pub type Mkdir3Res = NfsResult<DirOpResOk, DirWcc>;

xdr_struct!(
    /// `symlinkdata3`.
    pub struct SymlinkData3 {
        /// Initial attributes.
        pub symlink_attributes: Sattr3,
        /// The target.
        pub symlink_data: NfsPath3,
    }
);
xdr_struct!(
    /// SYMLINK3args.
    pub struct Symlink3Args {
        /// Directory and name.
        pub where_: DirOpArgs3,
        /// Attributes and target.
        pub symlink: SymlinkData3,
    }
);
/// SYMLINK3res.
pub type Symlink3Res = NfsResult<DirOpResOk, DirWcc>;

xdr_struct!(
    /// `devicedata3`.
    pub struct DeviceData3 {
        /// Initial attributes.
        pub dev_attributes: Sattr3,
        /// Device numbers.
        pub spec: SpecData3,
    }
);

/// `mknoddata3`: what MKNOD creates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MknodData3 {
    /// NF3CHR.
    Chr(DeviceData3),
    /// NF3BLK.
    Blk(DeviceData3),
    /// NF3SOCK.
    Sock(Sattr3),
    /// NF3FIFO.
    Fifo(Sattr3),
    /// Another type (REG, DIR, LNK): no body; the server answers
    /// NFS3ERR_BADTYPE.
    Other(Ftype3),
}

impl MknodData3 {
    /// The type requested.
    pub fn ftype(&self) -> Ftype3 {
        match self {
            MknodData3::Chr(_) => Ftype3::Chr,
            MknodData3::Blk(_) => Ftype3::Blk,
            MknodData3::Sock(_) => Ftype3::Sock,
            MknodData3::Fifo(_) => Ftype3::Fifo,
            MknodData3::Other(t) => *t,
        }
    }
}

impl Default for MknodData3 {
    fn default() -> Self {
        MknodData3::Fifo(Sattr3::default())
    }
}

impl Xdr for MknodData3 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        self.ftype().encode(s);
        match self {
            MknodData3::Chr(d) | MknodData3::Blk(d) => d.encode(s),
            MknodData3::Sock(a) | MknodData3::Fifo(a) => a.encode(s),
            MknodData3::Other(_) => {}
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        Ok(match Ftype3::decode(d)? {
            Ftype3::Chr => MknodData3::Chr(DeviceData3::decode(d)?),
            Ftype3::Blk => MknodData3::Blk(DeviceData3::decode(d)?),
            Ftype3::Sock => MknodData3::Sock(Sattr3::decode(d)?),
            Ftype3::Fifo => MknodData3::Fifo(Sattr3::decode(d)?),
            t => MknodData3::Other(t),
        })
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            MknodData3::Chr(d) | MknodData3::Blk(d) => d.encoded_len(),
            MknodData3::Sock(a) | MknodData3::Fifo(a) => a.encoded_len(),
            MknodData3::Other(_) => 0,
        }
    }
}

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for MknodData3 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            any::<DeviceData3>().prop_map(MknodData3::Chr),
            any::<DeviceData3>().prop_map(MknodData3::Blk),
            any::<Sattr3>().prop_map(MknodData3::Sock),
            any::<Sattr3>().prop_map(MknodData3::Fifo),
            prop_oneof![Just(Ftype3::Reg), Just(Ftype3::Dir), Just(Ftype3::Lnk)]
                .prop_map(MknodData3::Other),
        ]
        .boxed()
    }
}

xdr_struct!(
    /// MKNOD3args.
    pub struct Mknod3Args {
        /// Directory and name.
        pub where_: DirOpArgs3,
        /// What to create.
        pub what: MknodData3,
    }
);
/// MKNOD3res.
pub type Mknod3Res = NfsResult<DirOpResOk, DirWcc>;

// ---- 12 REMOVE, 13 RMDIR ---------------------------------------------------

xdr_struct!(
    /// REMOVE3args and RMDIR3args.
    pub struct Remove3Args {
        /// Directory and name.
        pub object: DirOpArgs3,
    }
);
/// REMOVE3res.
pub type Remove3Res = NfsResult<DirWcc, DirWcc>;
/// RMDIR3args.
pub type Rmdir3Args = Remove3Args;
/// RMDIR3res.
pub type Rmdir3Res = NfsResult<DirWcc, DirWcc>;

// ---- 14 RENAME -------------------------------------------------------------

xdr_struct!(
    /// RENAME3args.
    pub struct Rename3Args {
        /// Source directory and name.
        pub from: DirOpArgs3,
        /// Target directory and name.
        pub to: DirOpArgs3,
    }
);
xdr_struct!(
    /// RENAME3resok and RENAME3resfail.
    pub struct Rename3ResBody {
        /// Source directory.
        pub fromdir_wcc: WccData,
        /// Target directory.
        pub todir_wcc: WccData,
    }
);
/// RENAME3res.
pub type Rename3Res = NfsResult<Rename3ResBody, Rename3ResBody>;

// ---- 15 LINK ---------------------------------------------------------------

xdr_struct!(
    /// LINK3args.
    pub struct Link3Args {
        /// The existing file.
        pub file: NfsFh3,
        /// Directory and name of the new link.
        pub link: DirOpArgs3,
    }
);
xdr_struct!(
    /// LINK3resok and LINK3resfail.
    pub struct Link3ResBody {
        /// The file's attributes.
        pub file_attributes: PostOpAttr,
        /// The directory's weak cache consistency data.
        pub linkdir_wcc: WccData,
    }
);
/// LINK3res.
pub type Link3Res = NfsResult<Link3ResBody, Link3ResBody>;

// ---- 16 READDIR ------------------------------------------------------------

xdr_struct!(
    /// READDIR3args.
    pub struct Readdir3Args {
        /// The directory.
        pub dir: NfsFh3,
        /// Where to continue (0 to start).
        pub cookie: u64,
        /// The verifier returned with `cookie`.
        pub cookieverf: CookieVerf3,
        /// Most bytes of reply wanted.
        pub count: u32,
    }
);
xdr_struct!(
    /// `entry3`.
    pub struct Entry3 {
        /// File id.
        pub fileid: u64,
        /// Name.
        pub name: Filename3,
        /// Cookie to continue after this entry.
        pub cookie: u64,
    }
);
xdr_struct!(
    /// `dirlist3`.
    pub struct DirList3 {
        /// The entries.
        pub entries: List<Entry3>,
        /// No more entries follow.
        pub eof: bool,
    }
);
xdr_struct!(
    /// READDIR3resok.
    pub struct Readdir3ResOk {
        /// The directory's attributes.
        pub dir_attributes: PostOpAttr,
        /// Verifier for the cookies returned.
        pub cookieverf: CookieVerf3,
        /// The entries.
        pub reply: DirList3,
    }
);
/// READDIR3res.
pub type Readdir3Res = NfsResult<Readdir3ResOk, AttrOnly>;

// ---- 17 READDIRPLUS --------------------------------------------------------

xdr_struct!(
    /// READDIRPLUS3args.
    pub struct Readdirplus3Args {
        /// The directory.
        pub dir: NfsFh3,
        /// Where to continue (0 to start).
        pub cookie: u64,
        /// The verifier returned with `cookie`.
        pub cookieverf: CookieVerf3,
        /// Most bytes of directory information (names, ids, cookies) wanted.
        pub dircount: u32,
        /// Most bytes of reply wanted.
        pub maxcount: u32,
    }
);
xdr_struct!(
    /// `entryplus3`.
    pub struct EntryPlus3 {
        /// File id.
        pub fileid: u64,
        /// Name.
        pub name: Filename3,
        /// Cookie to continue after this entry.
        pub cookie: u64,
        /// Attributes.
        pub name_attributes: PostOpAttr,
        /// Handle.
        pub name_handle: PostOpFh3,
    }
);
xdr_struct!(
    /// `dirlistplus3`.
    pub struct DirListPlus3 {
        /// The entries.
        pub entries: List<EntryPlus3>,
        /// No more entries follow.
        pub eof: bool,
    }
);
xdr_struct!(
    /// READDIRPLUS3resok.
    pub struct Readdirplus3ResOk {
        /// The directory's attributes.
        pub dir_attributes: PostOpAttr,
        /// Verifier for the cookies returned.
        pub cookieverf: CookieVerf3,
        /// The entries.
        pub reply: DirListPlus3,
    }
);
/// READDIRPLUS3res.
pub type Readdirplus3Res = NfsResult<Readdirplus3ResOk, AttrOnly>;

// ---- 18 FSSTAT, 19 FSINFO, 20 PATHCONF -------------------------------------

xdr_struct!(
    /// FSSTAT3args, FSINFO3args and PATHCONF3args.
    pub struct FsRootArgs {
        /// Any handle in the file system.
        pub fsroot: NfsFh3,
    }
);
/// FSSTAT3args.
pub type Fsstat3Args = FsRootArgs;
/// FSINFO3args.
pub type Fsinfo3Args = FsRootArgs;
/// PATHCONF3args.
pub type Pathconf3Args = FsRootArgs;

xdr_struct!(
    /// FSSTAT3resok.
    pub struct Fsstat3ResOk {
        /// Attributes of the handle given.
        pub obj_attributes: PostOpAttr,
        /// Total bytes.
        pub tbytes: u64,
        /// Free bytes.
        pub fbytes: u64,
        /// Bytes free to the caller.
        pub abytes: u64,
        /// Total file slots.
        pub tfiles: u64,
        /// Free file slots.
        pub ffiles: u64,
        /// File slots free to the caller.
        pub afiles: u64,
        /// Seconds for which these values stay valid.
        pub invarsec: u32,
    }
);
/// FSSTAT3res.
pub type Fsstat3Res = NfsResult<Fsstat3ResOk, AttrOnly>;

xdr_struct!(
    /// FSINFO3resok.
    pub struct Fsinfo3ResOk {
        /// Attributes of the handle given.
        pub obj_attributes: PostOpAttr,
        /// Largest READ.
        pub rtmax: u32,
        /// Preferred READ size.
        pub rtpref: u32,
        /// Suggested READ multiple.
        pub rtmult: u32,
        /// Largest WRITE.
        pub wtmax: u32,
        /// Preferred WRITE size.
        pub wtpref: u32,
        /// Suggested WRITE multiple.
        pub wtmult: u32,
        /// Preferred READDIR size.
        pub dtpref: u32,
        /// Largest file size.
        pub maxfilesize: u64,
        /// Granularity of times.
        pub time_delta: NfsTime3,
        /// [`fsf`] bits.
        pub properties: u32,
    }
);
/// FSINFO3res.
pub type Fsinfo3Res = NfsResult<Fsinfo3ResOk, AttrOnly>;

xdr_struct!(
    /// PATHCONF3resok.
    pub struct Pathconf3ResOk {
        /// Attributes of the handle given.
        pub obj_attributes: PostOpAttr,
        /// Most hard links.
        pub linkmax: u32,
        /// Longest name.
        pub name_max: u32,
        /// Long names are refused, not truncated.
        pub no_trunc: bool,
        /// Only root may change owners.
        pub chown_restricted: bool,
        /// Names are case-insensitive.
        pub case_insensitive: bool,
        /// Names keep their case.
        pub case_preserving: bool,
    }
);
/// PATHCONF3res.
pub type Pathconf3Res = NfsResult<Pathconf3ResOk, AttrOnly>;

// ---- 21 COMMIT -------------------------------------------------------------

xdr_struct!(
    /// COMMIT3args.
    pub struct Commit3Args {
        /// The file.
        pub file: NfsFh3,
        /// Start of the range (0 with count 0: the whole file).
        pub offset: u64,
        /// Bytes in the range (0: to the end).
        pub count: u32,
    }
);
xdr_struct!(
    /// COMMIT3resok.
    pub struct Commit3ResOk {
        /// The file's weak cache consistency data.
        pub file_wcc: WccData,
        /// The server's write verifier.
        pub verf: WriteVerf3,
    }
);
/// COMMIT3res.
pub type Commit3Res = NfsResult<Commit3ResOk, FileWcc>;

// ---- Procedures ------------------------------------------------------------

xdr_enum!(
    /// NFSv3 procedure numbers.
    pub enum NfsProc3("nfs3 procedure") {
        /// NULL.
        Null = 0,
        /// GETATTR.
        Getattr = 1,
        /// SETATTR.
        Setattr = 2,
        /// LOOKUP.
        Lookup = 3,
        /// ACCESS.
        Access = 4,
        /// READLINK.
        Readlink = 5,
        /// READ.
        Read = 6,
        /// WRITE.
        Write = 7,
        /// CREATE.
        Create = 8,
        /// MKDIR.
        Mkdir = 9,
        /// SYMLINK.
        Symlink = 10,
        /// MKNOD.
        Mknod = 11,
        /// REMOVE.
        Remove = 12,
        /// RMDIR.
        Rmdir = 13,
        /// RENAME.
        Rename = 14,
        /// LINK.
        Link = 15,
        /// READDIR.
        Readdir = 16,
        /// READDIRPLUS.
        Readdirplus = 17,
        /// FSSTAT.
        Fsstat = 18,
        /// FSINFO.
        Fsinfo = 19,
        /// PATHCONF.
        Pathconf = 20,
        /// COMMIT.
        Commit = 21,
    }
);

impl NfsProc3 {
    /// Every procedure, in number order.
    pub const ALL: [NfsProc3; 22] = [
        NfsProc3::Null,
        NfsProc3::Getattr,
        NfsProc3::Setattr,
        NfsProc3::Lookup,
        NfsProc3::Access,
        NfsProc3::Readlink,
        NfsProc3::Read,
        NfsProc3::Write,
        NfsProc3::Create,
        NfsProc3::Mkdir,
        NfsProc3::Symlink,
        NfsProc3::Mknod,
        NfsProc3::Remove,
        NfsProc3::Rmdir,
        NfsProc3::Rename,
        NfsProc3::Link,
        NfsProc3::Readdir,
        NfsProc3::Readdirplus,
        NfsProc3::Fsstat,
        NfsProc3::Fsinfo,
        NfsProc3::Pathconf,
        NfsProc3::Commit,
    ];

    /// The procedure's name as RFC 1813 writes it.
    pub fn name(self) -> &'static str {
        match self {
            NfsProc3::Null => "NULL",
            NfsProc3::Getattr => "GETATTR",
            NfsProc3::Setattr => "SETATTR",
            NfsProc3::Lookup => "LOOKUP",
            NfsProc3::Access => "ACCESS",
            NfsProc3::Readlink => "READLINK",
            NfsProc3::Read => "READ",
            NfsProc3::Write => "WRITE",
            NfsProc3::Create => "CREATE",
            NfsProc3::Mkdir => "MKDIR",
            NfsProc3::Symlink => "SYMLINK",
            NfsProc3::Mknod => "MKNOD",
            NfsProc3::Remove => "REMOVE",
            NfsProc3::Rmdir => "RMDIR",
            NfsProc3::Rename => "RENAME",
            NfsProc3::Link => "LINK",
            NfsProc3::Readdir => "READDIR",
            NfsProc3::Readdirplus => "READDIRPLUS",
            NfsProc3::Fsstat => "FSSTAT",
            NfsProc3::Fsinfo => "FSINFO",
            NfsProc3::Pathconf => "PATHCONF",
            NfsProc3::Commit => "COMMIT",
        }
    }

    /// True for procedures whose repetition changes the outcome (the ones
    /// a duplicate request cache must answer from its cache).
    pub fn is_non_idempotent(self) -> bool {
        matches!(
            self,
            NfsProc3::Setattr
                | NfsProc3::Write
                | NfsProc3::Create
                | NfsProc3::Mkdir
                | NfsProc3::Symlink
                | NfsProc3::Mknod
                | NfsProc3::Remove
                | NfsProc3::Rmdir
                | NfsProc3::Rename
                | NfsProc3::Link
        )
    }
}

/// Generates the per-procedure argument and result enums.
macro_rules! nfs3_procs {
    ($( $var:ident => $args:ty, $res:ty; )*) => {
        /// The arguments of any NFSv3 call, by procedure.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
        pub enum Nfs3Args {
            /// NULL (no arguments).
            Null,
            $(
                #[doc = concat!(stringify!($var), " arguments.")]
                $var($args),
            )*
        }

        impl Nfs3Args {
            /// The procedure these arguments belong to.
            pub fn proc_(&self) -> NfsProc3 {
                match self {
                    Nfs3Args::Null => NfsProc3::Null,
                    $( Nfs3Args::$var(_) => NfsProc3::$var, )*
                }
            }

            /// Decodes the arguments of procedure `p`.
            pub fn decode(p: NfsProc3, d: &mut Decoder) -> Result<Self> {
                Ok(match p {
                    NfsProc3::Null => Nfs3Args::Null,
                    $( NfsProc3::$var => Nfs3Args::$var(<$args>::decode(d)?), )*
                })
            }

            /// Appends the encoded arguments.
            pub fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
                match self {
                    Nfs3Args::Null => {}
                    $( Nfs3Args::$var(a) => a.encode(s), )*
                }
            }

            /// Bytes [`Nfs3Args::encode`] writes.
            pub fn encoded_len(&self) -> usize {
                match self {
                    Nfs3Args::Null => 0,
                    $( Nfs3Args::$var(a) => a.encoded_len(), )*
                }
            }
        }

        /// The result of any NFSv3 call, by procedure.
        #[derive(Debug, Clone, PartialEq, Eq)]
        #[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
        pub enum Nfs3Res {
            /// NULL (no result).
            Null,
            $(
                #[doc = concat!(stringify!($var), " result.")]
                $var($res),
            )*
        }

        impl Nfs3Res {
            /// The procedure this result belongs to.
            pub fn proc_(&self) -> NfsProc3 {
                match self {
                    Nfs3Res::Null => NfsProc3::Null,
                    $( Nfs3Res::$var(_) => NfsProc3::$var, )*
                }
            }

            /// Procedure `p` failed with `status` (not [`NfsStat3::Ok`]),
            /// with nothing in its `resfail` arm (no attributes, no wcc
            /// data). NULL has no status: its result is returned.
            pub fn failed(p: NfsProc3, status: NfsStat3) -> Self {
                match p {
                    NfsProc3::Null => Nfs3Res::Null,
                    $( NfsProc3::$var => Nfs3Res::$var(NfsResult::Err(status, Default::default())), )*
                }
            }

            /// Decodes the result of procedure `p`.
            pub fn decode(p: NfsProc3, d: &mut Decoder) -> Result<Self> {
                Ok(match p {
                    NfsProc3::Null => Nfs3Res::Null,
                    $( NfsProc3::$var => Nfs3Res::$var(<$res>::decode(d)?), )*
                })
            }

            /// Appends the encoded result.
            pub fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
                match self {
                    Nfs3Res::Null => {}
                    $( Nfs3Res::$var(r) => r.encode(s), )*
                }
            }

            /// Bytes [`Nfs3Res::encode`] writes.
            pub fn encoded_len(&self) -> usize {
                match self {
                    Nfs3Res::Null => 0,
                    $( Nfs3Res::$var(r) => r.encoded_len(), )*
                }
            }

            /// The NFS status (NFS3_OK for NULL).
            pub fn status(&self) -> NfsStat3 {
                match self {
                    Nfs3Res::Null => NfsStat3::Ok,
                    $( Nfs3Res::$var(r) => r.status(), )*
                }
            }
        }
    };
}

nfs3_procs! {
    Getattr => Getattr3Args, Getattr3Res;
    Setattr => Setattr3Args, Setattr3Res;
    Lookup => Lookup3Args, Lookup3Res;
    Access => Access3Args, Access3Res;
    Readlink => Readlink3Args, Readlink3Res;
    Read => Read3Args, Read3Res;
    Write => Write3Args, Write3Res;
    Create => Create3Args, Create3Res;
    Mkdir => Mkdir3Args, Mkdir3Res;
    Symlink => Symlink3Args, Symlink3Res;
    Mknod => Mknod3Args, Mknod3Res;
    Remove => Remove3Args, Remove3Res;
    Rmdir => Rmdir3Args, Rmdir3Res;
    Rename => Rename3Args, Rename3Res;
    Link => Link3Args, Link3Res;
    Readdir => Readdir3Args, Readdir3Res;
    Readdirplus => Readdirplus3Args, Readdirplus3Res;
    Fsstat => Fsstat3Args, Fsstat3Res;
    Fsinfo => Fsinfo3Args, Fsinfo3Res;
    Pathconf => Pathconf3Args, Pathconf3Res;
    Commit => Commit3Args, Commit3Res;
}
