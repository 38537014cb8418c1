//! MOUNT protocol version 3 (RFC 1813 appendix I).

use crate::{BoundedVec, Decoder, List, Result, Xdr, XdrSink};

/// MOUNT program number.
pub const PROGRAM: u32 = 100005;
/// MOUNT protocol version.
pub const VERSION: u32 = 3;
/// Longest path name (MNTPATHLEN).
pub const MNTPATHLEN: u32 = 1024;
/// Longest name (MNTNAMLEN).
pub const MNTNAMLEN: u32 = 255;
/// Largest file handle (FHSIZE3).
pub const FHSIZE3: u32 = 64;
/// Most authentication flavors returned by MNT.
pub const MAX_AUTH_FLAVORS: u32 = 64;

/// MOUNT procedure numbers.
pub mod proc_ {
    /// NULL.
    pub const NULL: u32 = 0;
    /// MNT: look up an export and return its root handle.
    pub const MNT: u32 = 1;
    /// DUMP: list mounted clients.
    pub const DUMP: u32 = 2;
    /// UMNT: remove one mount entry.
    pub const UMNT: u32 = 3;
    /// UMNTALL: remove every mount entry of the caller.
    pub const UMNTALL: u32 = 4;
    /// EXPORT: list exports.
    pub const EXPORT: u32 = 5;
}

xdr_opaque!(
    /// `dirpath`: an export path (at most 1024 bytes).
    pub struct DirPath, max = MNTPATHLEN, what = "dirpath", payload = false
);

xdr_opaque!(
    /// `name`: a host or group name (at most 255 bytes).
    pub struct Name, max = MNTNAMLEN, what = "mount name", payload = false
);

xdr_opaque!(
    /// `fhandle3`: a file handle (at most 64 bytes).
    pub struct FHandle3, max = FHSIZE3, what = "fhandle3", payload = false
);

xdr_enum!(
    /// `mountstat3`.
    pub enum MountStat3("mountstat3") {
        /// Success.
        Ok = 0,
        /// Not owner.
        Perm = 1,
        /// No such file or directory.
        Noent = 2,
        /// I/O error.
        Io = 5,
        /// Permission denied.
        Acces = 13,
        /// Not a directory.
        Notdir = 20,
        /// Invalid argument.
        Inval = 22,
        /// Name too long.
        Nametoolong = 63,
        /// Operation not supported.
        Notsupp = 10004,
        /// Server fault.
        Serverfault = 10006,
    }
);

xdr_struct!(
    /// `mountres3_ok`.
    pub struct MountRes3Ok {
        /// Root handle of the export.
        pub fhandle: FHandle3,
        /// Authentication flavors the server accepts, most preferred first.
        pub auth_flavors: BoundedVec<u32, MAX_AUTH_FLAVORS>,
    }
);

/// `mountres3`: the MNT result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountRes3 {
    /// MNT3_OK.
    Ok(MountRes3Ok),
    /// Any other status (no body).
    Err(MountStat3),
}

impl Xdr for MountRes3 {
    fn encode<S: XdrSink + ?Sized>(&self, s: &mut S) {
        match self {
            MountRes3::Ok(ok) => {
                s.put_u32_be(0);
                ok.encode(s);
            }
            MountRes3::Err(st) => st.encode(s),
        }
    }
    fn decode(d: &mut Decoder) -> Result<Self> {
        match MountStat3::decode(d)? {
            MountStat3::Ok => Ok(MountRes3::Ok(MountRes3Ok::decode(d)?)),
            st => Ok(MountRes3::Err(st)),
        }
    }
    fn encoded_len(&self) -> usize {
        4 + match self {
            MountRes3::Ok(ok) => ok.encoded_len(),
            MountRes3::Err(_) => 0,
        }
    }
}

#[cfg(feature = "arbitrary")]
impl proptest::arbitrary::Arbitrary for MountRes3 {
    type Parameters = ();
    type Strategy = proptest::strategy::BoxedStrategy<Self>;
    fn arbitrary_with(_: ()) -> Self::Strategy {
        use proptest::prelude::*;
        prop_oneof![
            any::<MountRes3Ok>().prop_map(MountRes3::Ok),
            any::<MountStat3>()
                .prop_filter("error status", |s| *s != MountStat3::Ok)
                .prop_map(MountRes3::Err),
        ]
        .boxed()
    }
}

xdr_struct!(
    /// `mountbody`: one entry of the DUMP list.
    pub struct MountBody {
        /// Client host name.
        pub ml_hostname: Name,
        /// Path it mounted.
        pub ml_directory: DirPath,
    }
);

/// `mountlist`: the DUMP result.
pub type MountList = List<MountBody>;

xdr_struct!(
    /// `exportnode`: one entry of the EXPORT list.
    pub struct ExportNode {
        /// Exported path.
        pub ex_dir: DirPath,
        /// Clients (host names, netgroups or address patterns) allowed.
        pub ex_groups: List<Name>,
    }
);

/// `exports`: the EXPORT result.
pub type Exports = List<ExportNode>;
