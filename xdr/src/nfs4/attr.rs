//! File attributes (RFC 8881 §5): their numbers, a writer that lays values
//! out in the order a `fattr4` needs, and the settable attributes
//! (SETATTR, OPEN and CREATE) as a typed [`SetAttrs`].

use super::{AttrList4, Bitmap4, Fattr4, Status, Time4, Utf8Str};
use crate::{Decoder, Xdr};
use bytes::BytesMut;

/// Attribute numbers.
#[allow(missing_docs)]
pub mod n {
    pub const SUPPORTED_ATTRS: u32 = 0;
    pub const TYPE: u32 = 1;
    pub const FH_EXPIRE_TYPE: u32 = 2;
    pub const CHANGE: u32 = 3;
    pub const SIZE: u32 = 4;
    pub const LINK_SUPPORT: u32 = 5;
    pub const SYMLINK_SUPPORT: u32 = 6;
    pub const NAMED_ATTR: u32 = 7;
    pub const FSID: u32 = 8;
    pub const UNIQUE_HANDLES: u32 = 9;
    pub const LEASE_TIME: u32 = 10;
    pub const RDATTR_ERROR: u32 = 11;
    pub const ACL: u32 = 12;
    pub const ACLSUPPORT: u32 = 13;
    pub const CANSETTIME: u32 = 15;
    pub const CASE_INSENSITIVE: u32 = 16;
    pub const CASE_PRESERVING: u32 = 17;
    pub const CHOWN_RESTRICTED: u32 = 18;
    pub const FILEHANDLE: u32 = 19;
    pub const FILEID: u32 = 20;
    pub const FILES_AVAIL: u32 = 21;
    pub const FILES_FREE: u32 = 22;
    pub const FILES_TOTAL: u32 = 23;
    pub const HOMOGENEOUS: u32 = 26;
    pub const MAXFILESIZE: u32 = 27;
    pub const MAXLINK: u32 = 28;
    pub const MAXNAME: u32 = 29;
    pub const MAXREAD: u32 = 30;
    pub const MAXWRITE: u32 = 31;
    pub const MODE: u32 = 33;
    pub const NO_TRUNC: u32 = 34;
    pub const NUMLINKS: u32 = 35;
    pub const OWNER: u32 = 36;
    pub const OWNER_GROUP: u32 = 37;
    pub const RAWDEV: u32 = 41;
    pub const SPACE_AVAIL: u32 = 42;
    pub const SPACE_FREE: u32 = 43;
    pub const SPACE_TOTAL: u32 = 44;
    pub const SPACE_USED: u32 = 45;
    pub const TIME_ACCESS: u32 = 47;
    pub const TIME_ACCESS_SET: u32 = 48;
    pub const TIME_CREATE: u32 = 50;
    pub const TIME_DELTA: u32 = 51;
    pub const TIME_METADATA: u32 = 52;
    pub const TIME_MODIFY: u32 = 53;
    pub const TIME_MODIFY_SET: u32 = 54;
    pub const MOUNTED_ON_FILEID: u32 = 55;
    pub const SUPPATTR_EXCLCREAT: u32 = 75;
    pub const CLONE_BLKSIZE: u32 = 77;
    pub const CHANGE_ATTR_TYPE: u32 = 79;
    /// RFC 9754 (NFSv4.2): what OPEN accepts.
    pub const OPEN_ARGUMENTS: u32 = 86;
}

/// `open_arguments4` (RFC 9754 §4.1): the OPEN arguments a server
/// accepts, each a bitmap of the values of one argument (bit N: value N
/// of its `open_args_*4` enum).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OpenArguments4 {
    /// `open_args_share_access4` values.
    pub share_access: Bitmap4,
    /// `open_args_share_deny4` values.
    pub share_deny: Bitmap4,
    /// `open_args_share_access_want4` values.
    pub share_access_want: Bitmap4,
    /// `open_args_open_claim4` values.
    pub open_claim: Bitmap4,
    /// `open_args_createmode4` values.
    pub createmode: Bitmap4,
}

impl Xdr for OpenArguments4 {
    fn encode<S: crate::XdrSink + ?Sized>(&self, s: &mut S) {
        self.share_access.encode(s);
        self.share_deny.encode(s);
        self.share_access_want.encode(s);
        self.open_claim.encode(s);
        self.createmode.encode(s);
    }
    fn decode(d: &mut Decoder) -> crate::Result<Self> {
        Ok(OpenArguments4 {
            share_access: Bitmap4::decode(d)?,
            share_deny: Bitmap4::decode(d)?,
            share_access_want: Bitmap4::decode(d)?,
            open_claim: Bitmap4::decode(d)?,
            createmode: Bitmap4::decode(d)?,
        })
    }
    fn encoded_len(&self) -> usize {
        self.share_access.encoded_len()
            + self.share_deny.encoded_len()
            + self.share_access_want.encoded_len()
            + self.open_claim.encoded_len()
            + self.createmode.encoded_len()
    }
}

/// The `change` and `size` of an `fattr4` (a CB_GETATTR's answer): each
/// `None` when absent. Attributes after `size` are not read; one before
/// `change`, or values that do not decode, are an error.
pub fn change_and_size(f: &Fattr4) -> crate::Result<(Option<u64>, Option<u64>)> {
    let mut d = Decoder::new(f.attr_vals.0.clone());
    let (mut change, mut size) = (None, None);
    for b in f.attrmask.bits() {
        match b {
            n::CHANGE => change = Some(d.u64("change")?),
            n::SIZE => size = Some(d.u64("size")?),
            b if b > n::SIZE => break,
            _ => return Err(super::bad_arm("fattr4 of change and size", b)),
        }
    }
    Ok((change, size))
}

/// Builds the `attr_vals` of an `fattr4`: values must be pushed in
/// ascending attribute order, each with its number, and the mask records
/// which were pushed.
#[derive(Debug, Default)]
pub struct AttrWriter {
    mask: Bitmap4,
    vals: BytesMut,
    last: Option<u32>,
}

impl AttrWriter {
    /// An empty writer.
    pub fn new() -> AttrWriter {
        AttrWriter::default()
    }

    /// Appends attribute `num` with value `v`.
    ///
    /// # Panics
    /// When `num` is not above the previous attribute's number: the order
    /// is the encoder's duty, and a wrong order would be a wrong reply.
    pub fn put<T: Xdr>(&mut self, num: u32, v: &T) {
        assert!(
            self.last.is_none_or(|l| l < num),
            "attributes written out of order: {num} after {:?}",
            self.last
        );
        self.last = Some(num);
        self.mask.set(num);
        v.encode(&mut self.vals);
    }

    /// The `fattr4`.
    pub fn finish(self) -> Fattr4 {
        Fattr4 {
            attrmask: self.mask,
            attr_vals: AttrList4(self.vals.freeze()),
        }
    }
}

/// `settime4`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub enum SetTime4 {
    /// SET_TO_SERVER_TIME4.
    Server,
    /// SET_TO_CLIENT_TIME4.
    Client(Time4),
}

impl Xdr for SetTime4 {
    fn encode<S: crate::XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            SetTime4::Server => s.put_u32_be(0),
            SetTime4::Client(t) => {
                s.put_u32_be(1);
                t.encode(s);
            }
        }
    }
    fn decode(d: &mut Decoder) -> crate::Result<Self> {
        match super::disc(d, "time_how4")? {
            0 => Ok(SetTime4::Server),
            1 => Ok(SetTime4::Client(Time4::decode(d)?)),
            v => Err(super::bad_arm("time_how4", v)),
        }
    }
    fn encoded_len(&self) -> usize {
        match self {
            SetTime4::Server => 4,
            SetTime4::Client(_) => 16,
        }
    }
}

/// The attributes a client may set: size, mode, owner, owner_group and
/// the two times. Any other attribute in a SETATTR, OPEN or CREATE mask
/// is NFS4ERR_ATTRNOTSUPP (one the server does not support at all) or
/// NFS4ERR_INVAL (a read-only one), decided by [`SetAttrs::from_fattr`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[cfg_attr(feature = "arbitrary", derive(proptest_derive::Arbitrary))]
pub struct SetAttrs {
    /// `size`.
    pub size: Option<u64>,
    /// `mode` (the low 12 bits).
    pub mode: Option<u32>,
    /// `owner`.
    pub owner: Option<Utf8Str>,
    /// `owner_group`.
    pub owner_group: Option<Utf8Str>,
    /// `time_access_set`.
    pub atime: Option<SetTime4>,
    /// `time_modify_set`.
    pub mtime: Option<SetTime4>,
}

/// The attributes [`SetAttrs`] carries, as a mask.
pub fn settable() -> Bitmap4 {
    Bitmap4::from_bits([
        n::SIZE,
        n::MODE,
        n::OWNER,
        n::OWNER_GROUP,
        n::TIME_ACCESS_SET,
        n::TIME_MODIFY_SET,
    ])
}

impl SetAttrs {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == SetAttrs::default()
    }

    /// Reads the settable attributes of an `fattr4`. `supported` is the
    /// server's `supported_attrs`: a bit outside it is ATTRNOTSUPP, a
    /// supported one that cannot be set INVAL, values that do not decode
    /// (or bytes left over) BADXDR.
    pub fn from_fattr(f: &Fattr4, supported: &Bitmap4) -> Result<SetAttrs, Status> {
        let can_set = settable();
        for b in f.attrmask.bits() {
            if !supported.has(b) {
                return Err(Status::ATTRNOTSUPP);
            }
            if !can_set.has(b) {
                return Err(Status::INVAL);
            }
        }
        let mut d = Decoder::new(f.attr_vals.0.clone());
        let mut s = SetAttrs::default();
        let bad = |_| Status::BADXDR;
        for b in f.attrmask.bits() {
            match b {
                n::SIZE => s.size = Some(d.u64("size").map_err(bad)?),
                n::MODE => s.mode = Some(d.u32("mode").map_err(bad)?),
                n::OWNER => s.owner = Some(Utf8Str::decode(&mut d).map_err(bad)?),
                n::OWNER_GROUP => s.owner_group = Some(Utf8Str::decode(&mut d).map_err(bad)?),
                n::TIME_ACCESS_SET => s.atime = Some(SetTime4::decode(&mut d).map_err(bad)?),
                n::TIME_MODIFY_SET => s.mtime = Some(SetTime4::decode(&mut d).map_err(bad)?),
                _ => unreachable!("only settable bits pass the check above"),
            }
        }
        d.finish("fattr4 values").map_err(bad)?;
        Ok(s)
    }

    /// The `fattr4` that sets these.
    pub fn to_fattr(&self) -> Fattr4 {
        let mut w = AttrWriter::new();
        if let Some(v) = &self.size {
            w.put(n::SIZE, v);
        }
        if let Some(v) = &self.mode {
            w.put(n::MODE, v);
        }
        if let Some(v) = &self.owner {
            w.put(n::OWNER, v);
        }
        if let Some(v) = &self.owner_group {
            w.put(n::OWNER_GROUP, v);
        }
        if let Some(v) = &self.atime {
            w.put(n::TIME_ACCESS_SET, v);
        }
        if let Some(v) = &self.mtime {
            w.put(n::TIME_MODIFY_SET, v);
        }
        w.finish()
    }

    /// The mask of what is set.
    pub fn mask(&self) -> Bitmap4 {
        self.to_fattr().attrmask
    }
}
