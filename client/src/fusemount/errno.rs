//! NFSv3 status and client errors as errno values for FUSE replies.

use crate::error::ClientError;
use nfsrdma_xdr::nfs3::NfsStat3;

/// The errno a local file system call returns for an NFSv3 status.
///
/// The kernel's NFS client maps a few statuses to kernel-internal codes
/// (EBADHANDLE, ENOTSYNC, EBADCOOKIE, EJUKEBOX ...) that user space never
/// sees as such; here every status maps to an errno user space knows.
pub fn nfsstat_errno(s: NfsStat3) -> i32 {
    use NfsStat3::*;
    match s {
        // A success status is never an error; EIO if one arrives here.
        Ok => libc::EIO,
        Perm => libc::EPERM,
        Noent => libc::ENOENT,
        Io => libc::EIO,
        Nxio => libc::ENXIO,
        Acces => libc::EACCES,
        Exist => libc::EEXIST,
        Xdev => libc::EXDEV,
        Nodev => libc::ENODEV,
        Notdir => libc::ENOTDIR,
        Isdir => libc::EISDIR,
        Inval => libc::EINVAL,
        Fbig => libc::EFBIG,
        Nospc => libc::ENOSPC,
        Rofs => libc::EROFS,
        Mlink => libc::EMLINK,
        Nametoolong => libc::ENAMETOOLONG,
        Notempty => libc::ENOTEMPTY,
        Dquot => libc::EDQUOT,
        Stale => libc::ESTALE,
        Remote => libc::EREMOTE,
        Badhandle => libc::ESTALE,
        NotSync => libc::EIO,
        BadCookie => libc::ESTALE,
        Notsupp => libc::EOPNOTSUPP,
        Toosmall => libc::EINVAL,
        Serverfault => libc::EREMOTEIO,
        Badtype => libc::EINVAL,
        Jukebox => libc::EAGAIN,
    }
}

/// The errno for any client error: the NFS status's when the server
/// answered, EIO for transport failures and soft time-outs.
pub fn client_errno(e: &ClientError) -> i32 {
    match e {
        ClientError::Nfs(_, s) => nfsstat_errno(*s),
        ClientError::InvalidArgument(_) => libc::EINVAL,
        ClientError::AuthError(_) | ClientError::NoUsableAuth(_) => libc::EACCES,
        ClientError::Unsupported(_) | ClientError::ProcUnavail { .. } => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_has_its_errno() {
        use NfsStat3::*;
        let table: &[(NfsStat3, i32)] = &[
            (Ok, libc::EIO),
            (Perm, libc::EPERM),
            (Noent, libc::ENOENT),
            (Io, libc::EIO),
            (Nxio, libc::ENXIO),
            (Acces, libc::EACCES),
            (Exist, libc::EEXIST),
            (Xdev, libc::EXDEV),
            (Nodev, libc::ENODEV),
            (Notdir, libc::ENOTDIR),
            (Isdir, libc::EISDIR),
            (Inval, libc::EINVAL),
            (Fbig, libc::EFBIG),
            (Nospc, libc::ENOSPC),
            (Rofs, libc::EROFS),
            (Mlink, libc::EMLINK),
            (Nametoolong, libc::ENAMETOOLONG),
            (Notempty, libc::ENOTEMPTY),
            (Dquot, libc::EDQUOT),
            (Stale, libc::ESTALE),
            (Remote, libc::EREMOTE),
            (Badhandle, libc::ESTALE),
            (NotSync, libc::EIO),
            (BadCookie, libc::ESTALE),
            (Notsupp, libc::EOPNOTSUPP),
            (Toosmall, libc::EINVAL),
            (Serverfault, libc::EREMOTEIO),
            (Badtype, libc::EINVAL),
            (Jukebox, libc::EAGAIN),
        ];
        assert_eq!(table.len(), 29, "every nfsstat3 value is listed");
        for (s, e) in table {
            assert_eq!(nfsstat_errno(*s), *e, "{s:?}");
        }
        // The first 20 codes are the errno values themselves on Linux.
        for s in [
            Perm, Noent, Io, Nxio, Acces, Exist, Xdev, Nodev, Notdir, Isdir, Inval,
        ] {
            assert_eq!(nfsstat_errno(s), s as i32, "{s:?}");
        }
    }

    #[test]
    fn transport_failures_are_eio() {
        let e = ClientError::TimedOut {
            what: "READ".into(),
            after: std::time::Duration::from_secs(1),
        };
        assert_eq!(client_errno(&e), libc::EIO);
        assert_eq!(client_errno(&ClientError::Shutdown), libc::EIO);
        assert_eq!(
            client_errno(&ClientError::InvalidArgument("x".into())),
            libc::EINVAL
        );
    }
}
