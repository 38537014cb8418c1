//! The attributes nfsrdmad reports over NFSv4 (every REQUIRED one and the
//! RECOMMENDED ones the Linux client asks for), encoded from the store's
//! attributes, and the settable ones turned into the store's `sattr3`.

use super::pseudo::Pseudo;
use crate::store::{Fs, Ino, SResult, LINK_MAX, MAX_FILE_SIZE, NAME_MAX};
use bytes::Bytes;
use nfsrdma_xdr::nfs3::{Fattr3, Ftype3, NfsTime3, Sattr3, SetTime};
use nfsrdma_xdr::nfs4::attr::{n, settable, AttrWriter, OpenArguments4, SetAttrs, SetTime4};
use nfsrdma_xdr::nfs4::{Bitmap4, Fattr4, Fh4, Fsid4, Ftype4, Specdata4, Status, Time4, Utf8Str};

/// `supported_attrs`.
pub fn supported(minor: u32) -> Bitmap4 {
    let mut b = Bitmap4::from_bits([
        n::SUPPORTED_ATTRS,
        n::TYPE,
        n::FH_EXPIRE_TYPE,
        n::CHANGE,
        n::SIZE,
        n::LINK_SUPPORT,
        n::SYMLINK_SUPPORT,
        n::NAMED_ATTR,
        n::FSID,
        n::UNIQUE_HANDLES,
        n::LEASE_TIME,
        n::RDATTR_ERROR,
        n::CANSETTIME,
        n::CASE_INSENSITIVE,
        n::CASE_PRESERVING,
        n::CHOWN_RESTRICTED,
        n::FILEHANDLE,
        n::FILEID,
        n::FILES_AVAIL,
        n::FILES_FREE,
        n::FILES_TOTAL,
        n::HOMOGENEOUS,
        n::MAXFILESIZE,
        n::MAXLINK,
        n::MAXNAME,
        n::MAXREAD,
        n::MAXWRITE,
        n::MODE,
        n::NO_TRUNC,
        n::NUMLINKS,
        n::OWNER,
        n::OWNER_GROUP,
        n::RAWDEV,
        n::SPACE_AVAIL,
        n::SPACE_FREE,
        n::SPACE_TOTAL,
        n::SPACE_USED,
        n::TIME_ACCESS,
        n::TIME_ACCESS_SET,
        n::TIME_DELTA,
        n::TIME_METADATA,
        n::TIME_MODIFY,
        n::TIME_MODIFY_SET,
        n::MOUNTED_ON_FILEID,
        n::SUPPATTR_EXCLCREAT,
    ]);
    if minor >= 2 {
        b.set(n::CHANGE_ATTR_TYPE);
        b.set(n::OPEN_ARGUMENTS);
    }
    b
}

/// `open_arguments` (RFC 9754): what OPEN accepts here. Share access
/// READ, WRITE, BOTH; every deny; the wants ANY_DELEG, NO_DELEG and
/// CANCEL (no delegation timestamps, no OPEN_XOR_DELEGATION, no signal or
/// push wants); the claims NULL, PREVIOUS, DELEGATE_CUR, FH and
/// DELEG_CUR_FH (a delegation is not reclaimed by name after a client's
/// restart); every create mode.
pub fn open_arguments() -> OpenArguments4 {
    OpenArguments4 {
        share_access: Bitmap4::from_bits([1, 2, 3]),
        share_deny: Bitmap4::from_bits([0, 1, 2, 3]),
        share_access_want: Bitmap4::from_bits([3, 4, 5]),
        open_claim: Bitmap4::from_bits([0, 1, 2, 4, 5]),
        createmode: Bitmap4::from_bits([0, 1, 2, 3]),
    }
}

/// What the attributes of one object are made from.
pub struct Source {
    /// The store's attributes (for a pseudo directory, made up).
    pub a: Fattr3,
    /// The change attribute.
    pub change: u64,
    /// The handle.
    pub fh: Bytes,
    /// NFSv4 fsid.
    pub fsid: Fsid4,
    /// `mounted_on_fileid`.
    pub mounted_on: u64,
    /// (total bytes, free bytes, total files, free files).
    pub fsstat: (u64, u64, u64, u64),
}

/// Server-wide values.
pub struct Limits {
    /// Largest READ and WRITE.
    pub max_io: u32,
    /// The lease in seconds.
    pub lease: u32,
    /// The COMPOUND's minor version.
    pub minor: u32,
}

fn time(t: NfsTime3) -> Time4 {
    Time4 {
        seconds: u64::from(t.seconds),
        nseconds: t.nseconds,
    }
}

fn ftype(t: Ftype3) -> Ftype4 {
    match t {
        Ftype3::Reg => Ftype4::Reg,
        Ftype3::Dir => Ftype4::Dir,
        Ftype3::Blk => Ftype4::Blk,
        Ftype3::Chr => Ftype4::Chr,
        Ftype3::Lnk => Ftype4::Lnk,
        Ftype3::Sock => Ftype4::Sock,
        Ftype3::Fifo => Ftype4::Fifo,
    }
}

fn num(v: u32) -> Utf8Str {
    Utf8Str(Bytes::from(v.to_string()))
}

/// The attributes `want` asks for that this server has, in order.
pub fn encode(want: &Bitmap4, s: &Source, l: &Limits) -> Fattr4 {
    let sup = supported(l.minor);
    let mut w = AttrWriter::new();
    let (tb, fb, tf, ff) = s.fsstat;
    for b in want.bits() {
        if !sup.has(b) {
            continue;
        }
        match b {
            n::SUPPORTED_ATTRS => w.put(b, &sup),
            n::TYPE => w.put(b, &ftype(s.a.type_)),
            // FH4_PERSISTENT: handles stay valid while the file exists.
            n::FH_EXPIRE_TYPE => w.put(b, &0u32),
            n::CHANGE => w.put(b, &s.change),
            n::SIZE => w.put(b, &s.a.size),
            n::LINK_SUPPORT | n::SYMLINK_SUPPORT | n::UNIQUE_HANDLES | n::CANSETTIME => {
                w.put(b, &true)
            }
            n::NAMED_ATTR | n::CASE_INSENSITIVE => w.put(b, &false),
            n::CASE_PRESERVING | n::CHOWN_RESTRICTED | n::HOMOGENEOUS | n::NO_TRUNC => {
                w.put(b, &true)
            }
            n::FSID => w.put(b, &s.fsid),
            n::LEASE_TIME => w.put(b, &l.lease),
            n::RDATTR_ERROR => w.put(b, &Status::OK),
            n::FILEHANDLE => w.put(b, &Fh4(s.fh.clone())),
            n::FILEID => w.put(b, &s.a.fileid),
            n::FILES_AVAIL | n::FILES_FREE => w.put(b, &ff),
            n::FILES_TOTAL => w.put(b, &tf),
            n::MAXFILESIZE => w.put(b, &MAX_FILE_SIZE),
            n::MAXLINK => w.put(b, &LINK_MAX),
            n::MAXNAME => w.put(b, &(NAME_MAX as u32)),
            n::MAXREAD | n::MAXWRITE => w.put(b, &u64::from(l.max_io)),
            n::MODE => w.put(b, &(s.a.mode & 0o7777)),
            n::NUMLINKS => w.put(b, &s.a.nlink),
            n::OWNER => w.put(b, &num(s.a.uid)),
            n::OWNER_GROUP => w.put(b, &num(s.a.gid)),
            n::RAWDEV => w.put(
                b,
                &Specdata4 {
                    specdata1: s.a.rdev.specdata1,
                    specdata2: s.a.rdev.specdata2,
                },
            ),
            n::SPACE_AVAIL | n::SPACE_FREE => w.put(b, &fb),
            n::SPACE_TOTAL => w.put(b, &tb),
            n::SPACE_USED => w.put(b, &s.a.used),
            n::TIME_ACCESS => w.put(b, &time(s.a.atime)),
            n::TIME_DELTA => w.put(
                b,
                &Time4 {
                    seconds: 0,
                    nseconds: 1,
                },
            ),
            n::TIME_METADATA => w.put(b, &time(s.a.ctime)),
            n::TIME_MODIFY => w.put(b, &time(s.a.mtime)),
            n::MOUNTED_ON_FILEID => w.put(b, &s.mounted_on),
            n::SUPPATTR_EXCLCREAT => w.put(b, &settable()),
            // NFS4_CHANGE_TYPE_IS_MONOTONIC_INCR.
            n::CHANGE_ATTR_TYPE => w.put(b, &1u32),
            n::OPEN_ARGUMENTS => w.put(b, &open_arguments()),
            // Write-only attributes are never reported.
            _ => {}
        }
    }
    w.finish()
}

/// The source of a file's attributes.
pub fn file_source(fs: &Fs, ino: Ino, fsid: u64) -> SResult<Source> {
    // One look at the inode: a WRITE (which takes only the store's shared
    // lock) cannot fall between the attributes and the change value.
    let (a, change) = fs.getattr_change(ino)?;
    Ok(Source {
        change,
        fh: fs.handle(ino),
        fsid: Fsid4 {
            major: fsid,
            minor: 0,
        },
        mounted_on: a.fileid,
        fsstat: fs.fsstat(),
        a,
    })
}

/// The source of a pseudo directory's attributes: mode 0555, owned by
/// root, on fsid 0, never changing.
pub fn pseudo_source(id: u32, entries: usize, boot: u32) -> Source {
    let t = NfsTime3 {
        seconds: boot,
        nseconds: 0,
    };
    Source {
        a: Fattr3 {
            type_: Ftype3::Dir,
            mode: 0o555,
            nlink: 2,
            uid: 0,
            gid: 0,
            size: 4096.max(entries as u64 * 32),
            used: 4096,
            rdev: Default::default(),
            fsid: 0,
            fileid: Pseudo::fileid(id),
            atime: t,
            mtime: t,
            ctime: t,
        },
        change: u64::from(boot),
        fh: Pseudo::handle(id),
        fsid: Fsid4 { major: 0, minor: 0 },
        mounted_on: Pseudo::fileid(id),
        fsstat: (0, 0, 0, 0),
    }
}

/// A numeric owner or group string (`1000`, or `1000@domain`); names are
/// NFS4ERR_BADOWNER (no id mapping: the Linux client sends numbers with
/// AUTH_SYS).
fn parse_id(s: &Utf8Str) -> Result<u32, Status> {
    let t = std::str::from_utf8(s).map_err(|_| Status::BADOWNER)?;
    let t = t.split('@').next().unwrap_or(t);
    t.parse::<u32>().map_err(|_| Status::BADOWNER)
}

fn settime(t: &Option<SetTime4>) -> SetTime {
    match t {
        None => SetTime::DontChange,
        Some(SetTime4::Server) => SetTime::ServerTime,
        Some(SetTime4::Client(t)) => SetTime::ClientTime(NfsTime3 {
            seconds: t.seconds.min(u64::from(u32::MAX)) as u32,
            nseconds: t.nseconds,
        }),
    }
}

/// The settable attributes of `f` as the store's `sattr3`, with the mask of
/// what they set.
pub fn to_sattr(f: &Fattr4, minor: u32) -> Result<(Sattr3, Bitmap4), Status> {
    let s = SetAttrs::from_fattr(f, &supported(minor))?;
    if let Some(SetTime4::Client(t)) = s.atime.as_ref().or(s.mtime.as_ref()) {
        if t.nseconds >= 1_000_000_000 {
            return Err(Status::INVAL);
        }
    }
    let sattr = Sattr3 {
        mode: s.mode.map(|m| m & 0o7777),
        uid: s.owner.as_ref().map(parse_id).transpose()?,
        gid: s.owner_group.as_ref().map(parse_id).transpose()?,
        size: s.size,
        atime: settime(&s.atime),
        mtime: settime(&s.mtime),
    };
    Ok((sattr, f.attrmask.clone()))
}
