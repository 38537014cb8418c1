//! The client's error type.

use nfsrdma_xdr::mount::MountStat3;
use nfsrdma_xdr::nfs3::{Nfs3Res, NfsProc3, NfsStat3};
use nfsrdma_xdr::record::RecordError;
use nfsrdma_xdr::rpc::AuthStat;
use nfsrdma_xdr::XdrError;
use std::net::SocketAddr;
use std::time::Duration;

/// An NFS error result: the procedure and its whole decoded result, so that
/// the `resfail` body (weak cache consistency data, post-operation
/// attributes) stays available.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsFailure {
    /// The procedure that failed.
    pub proc_: NfsProc3,
    /// The decoded result (always an error arm).
    pub res: Box<Nfs3Res>,
}

/// Everything a client call can fail with. Bad input from the server is
/// always one of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server name did not resolve.
    #[error("cannot resolve server {host:?}: {source}")]
    Resolve {
        /// The name given.
        host: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// No connection could be made.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address tried.
        addr: SocketAddr,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A soft call got no reply in time (all retransmissions included).
    #[error("{what}: no reply from the server within {after:?} (soft mount)")]
    TimedOut {
        /// The call that timed out.
        what: String,
        /// How long the client waited.
        after: Duration,
    },
    /// The server sent a record the client cannot accept.
    #[error("bad record from the server: {0}")]
    Record(#[from] RecordError),
    /// A reply (header or results) did not decode.
    #[error("undecodable reply from the server: {0}")]
    Xdr(#[from] XdrError),
    /// The server broke the RPC protocol in another way.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// PROG_UNAVAIL: the program is not served there.
    #[error("RPC program {prog} is not available on the server")]
    ProgUnavail {
        /// Program number.
        prog: u32,
    },
    /// PROG_MISMATCH: the version is not served.
    #[error("RPC program {prog} version {vers} is not served (server has {low}..={high})")]
    ProgMismatch {
        /// Program number.
        prog: u32,
        /// Version asked for.
        vers: u32,
        /// Lowest version served.
        low: u32,
        /// Highest version served.
        high: u32,
    },
    /// PROC_UNAVAIL: no such procedure.
    #[error("RPC procedure {proc_} of program {prog} is not available")]
    ProcUnavail {
        /// Program number.
        prog: u32,
        /// Procedure number.
        proc_: u32,
    },
    /// GARBAGE_ARGS: the server could not decode the arguments.
    #[error("the server could not decode the arguments (GARBAGE_ARGS)")]
    GarbageArgs,
    /// SYSTEM_ERR on the server.
    #[error("the server reported a system error (SYSTEM_ERR)")]
    SystemErr,
    /// RPC_MISMATCH: the server does not speak RPC version 2.
    #[error("the server does not support RPC version 2 (supports {low}..={high})")]
    RpcMismatch {
        /// Lowest RPC version supported.
        low: u32,
        /// Highest RPC version supported.
        high: u32,
    },
    /// AUTH_ERROR: the credential was refused.
    #[error("authentication refused by the server: {0:?}")]
    AuthError(AuthStat),
    /// The server offers none of the flavors this client speaks.
    #[error("the server accepts none of AUTH_SYS and AUTH_NONE (offers {0:?})")]
    NoUsableAuth(Vec<u32>),
    /// The portmapper knows no port for the program.
    #[error("the portmapper at {addr} has no TCP port for program {prog} version {vers}")]
    NotRegistered {
        /// The portmapper asked.
        addr: SocketAddr,
        /// Program number.
        prog: u32,
        /// Program version.
        vers: u32,
    },
    /// MNT failed.
    #[error("mount of {path:?} refused: {}", mount_stat_text(*.status))]
    Mount {
        /// The path asked for.
        path: String,
        /// The MOUNT status.
        status: MountStat3,
    },
    /// An NFS call returned an error status.
    #[error("{}: {}", .0.proc_.name(), nfs_stat_text(*.1))]
    Nfs(NfsFailure, NfsStat3),
    /// The option or argument cannot be used.
    #[error("{0}")]
    InvalidArgument(String),
    /// The feature is not built yet.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The RPC-over-RDMA transport failed (no device, connection manager,
    /// registration, or the server broke the RPC-over-RDMA protocol).
    #[error("RPC-over-RDMA: {0}")]
    Rdma(String),
    /// The client was shut down while the call waited.
    #[error("the transport is shut down")]
    Shutdown,
    /// A local I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl ClientError {
    /// The NFS status of an [`ClientError::Nfs`] error.
    pub fn nfs_status(&self) -> Option<NfsStat3> {
        match self {
            ClientError::Nfs(_, s) => Some(*s),
            _ => None,
        }
    }

    /// The failed result of an [`ClientError::Nfs`] error (with its
    /// `resfail` body).
    pub fn nfs_failure(&self) -> Option<&NfsFailure> {
        match self {
            ClientError::Nfs(f, _) => Some(f),
            _ => None,
        }
    }

    pub(crate) fn nfs(res: Nfs3Res) -> ClientError {
        let status = res.status();
        ClientError::Nfs(
            NfsFailure {
                proc_: res.proc_(),
                res: Box::new(res),
            },
            status,
        )
    }
}

/// The errno-style text of an NFS status.
pub fn nfs_stat_text(s: NfsStat3) -> &'static str {
    use NfsStat3::*;
    match s {
        Ok => "success",
        Perm => "operation not permitted (NFS3ERR_PERM)",
        Noent => "no such file or directory (NFS3ERR_NOENT)",
        Io => "I/O error (NFS3ERR_IO)",
        Nxio => "no such device or address (NFS3ERR_NXIO)",
        Acces => "permission denied (NFS3ERR_ACCES)",
        Exist => "file exists (NFS3ERR_EXIST)",
        Xdev => "cross-device link (NFS3ERR_XDEV)",
        Nodev => "no such device (NFS3ERR_NODEV)",
        Notdir => "not a directory (NFS3ERR_NOTDIR)",
        Isdir => "is a directory (NFS3ERR_ISDIR)",
        Inval => "invalid argument (NFS3ERR_INVAL)",
        Fbig => "file too large (NFS3ERR_FBIG)",
        Nospc => "no space left on device (NFS3ERR_NOSPC)",
        Rofs => "read-only file system (NFS3ERR_ROFS)",
        Mlink => "too many links (NFS3ERR_MLINK)",
        Nametoolong => "file name too long (NFS3ERR_NAMETOOLONG)",
        Notempty => "directory not empty (NFS3ERR_NOTEMPTY)",
        Dquot => "quota exceeded (NFS3ERR_DQUOT)",
        Stale => "stale file handle (NFS3ERR_STALE)",
        Remote => "too many levels of remote in path (NFS3ERR_REMOTE)",
        Badhandle => "illegal file handle (NFS3ERR_BADHANDLE)",
        NotSync => "update synchronization mismatch (NFS3ERR_NOT_SYNC)",
        BadCookie => "stale directory cookie (NFS3ERR_BAD_COOKIE)",
        Notsupp => "operation not supported (NFS3ERR_NOTSUPP)",
        Toosmall => "buffer or request too small (NFS3ERR_TOOSMALL)",
        Serverfault => "server fault (NFS3ERR_SERVERFAULT)",
        Badtype => "type not supported by the server (NFS3ERR_BADTYPE)",
        Jukebox => "try again later (NFS3ERR_JUKEBOX)",
    }
}

fn mount_stat_text(s: MountStat3) -> &'static str {
    use MountStat3::*;
    match s {
        Ok => "success",
        Perm => "not owner (MNT3ERR_PERM)",
        Noent => "no such file or directory (MNT3ERR_NOENT)",
        Io => "I/O error (MNT3ERR_IO)",
        Acces => "permission denied (MNT3ERR_ACCES)",
        Notdir => "not a directory (MNT3ERR_NOTDIR)",
        Inval => "invalid argument (MNT3ERR_INVAL)",
        Nametoolong => "name too long (MNT3ERR_NAMETOOLONG)",
        Notsupp => "not supported (MNT3ERR_NOTSUPP)",
        Serverfault => "server fault (MNT3ERR_SERVERFAULT)",
    }
}
