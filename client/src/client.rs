//! [`Client`]: a mounted NFSv3 export.

use crate::auth::Auth;
use crate::error::ClientError;
use crate::mount::{getport, resolve, MountClient};
use crate::rpc::{call, Target};
use crate::transport::tcp::{TcpOptions, TcpTransport};
use crate::transport::{ReplyExpect, Transport, TransportKind, TransportStats};
use bytes::Bytes;
use nfsrdma_xdr::mount::{self, MountStat3};
use nfsrdma_xdr::nfs3::*;
use nfsrdma_xdr::portmap;
use nfsrdma_xdr::rpc::{flavor, OpaqueAuth};
use nfsrdma_xdr::{Payload, Xdr};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinSet;

/// Memory registration strategy of the RDMA transport (see
/// [`crate::transport::rdma`] for what each costs and protects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum RegStrategy {
    /// A type-2 memory window bound per RPC.
    #[default]
    Mw,
    /// A memory region registered per RPC.
    RegMr,
    /// Buffers registered once, for the connection's life, with their own
    /// rkey on the wire: fastest, least safe (the server may access every
    /// chunk buffer of the connection at any time).
    Persistent,
}

/// How the RDMA transport waits for completions: the completion engine's
/// mode, one type for the client and the server. `busy` makes a waiting
/// call spin on the completion queue on its own thread (no hand-off
/// between threads; one call at a time): lowest latency, a core while
/// anything is waited for. `event` sleeps on completion events;
/// `adaptive` (the default: 50 µs) and `auto` spin for a while after the
/// last completion, then sleep.
pub use nfsrdma_transport::rdma::engine::PollMode;

/// Settings that only the RDMA transport uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaOptions {
    /// Offer RFC 8797 remote invalidation.
    pub remote_inv: bool,
    /// How memory is registered.
    pub reg: RegStrategy,
    /// How completions are polled.
    pub poll: PollMode,
    /// Our inline threshold in bytes, both directions (1 KiB to 1 MiB;
    /// 4 KiB by default): the size of each receive buffer, advertised to
    /// the server in the RFC 8797 message. Calls are sent inline up to the
    /// smaller of this and the server's receive size; larger calls and
    /// replies travel in chunks.
    pub inline: u32,
    /// The largest READ or WRITE payload a slot of the pre-registered
    /// chunk pool holds (`mw` and `persistent`; 1 MiB by default): the pool
    /// takes 32 slots × (this + 64 KiB). A call whose chunks do not fit
    /// gets a region registered for it alone. [`Client::connect`] lowers it
    /// to the larger of `rsize` and `wsize` when both are given.
    pub max_io: u32,
    /// The queue pair's local ACK timeout, as IBTA's exponent: a request
    /// the server's adapter has not acknowledged is sent again after
    /// 4.096 µs × 2^this (1 to 31). `None` (the default): what the
    /// connection manager derives from the path (19, about 2.1 s, in the test VM),
    /// except on Soft-RoCE, where it is
    /// [`SOFT_ROCE_ACK_TIMEOUT`](crate::transport::rdma::SOFT_ROCE_ACK_TIMEOUT)
    /// (about 2.4 hours): `rdma_rxe` times out spuriously, and runs the
    /// window binds and invalidations queued behind the Send it sends
    /// again a second time, which fails and ends the connection.
    pub ack_timeout: Option<u8>,
}

impl Default for RdmaOptions {
    fn default() -> Self {
        RdmaOptions {
            remote_inv: true,
            reg: RegStrategy::default(),
            poll: PollMode::default(),
            inline: crate::transport::rdma::INLINE_SIZE,
            max_io: 1 << 20,
            ack_timeout: None,
        }
    }
}

/// How to reach and use a server.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// TCP or RDMA.
    pub transport: TransportKind,
    /// NFS port; `None`: 2049 for TCP, 20049 for RDMA (as mount.nfs does;
    /// the portmapper is not asked).
    pub port: Option<u16>,
    /// MOUNT port; `None`: ask the server's portmapper.
    pub mount_port: Option<u16>,
    /// The server's portmapper port (111).
    pub portmap_port: u16,
    /// The credential sent with every call.
    pub auth: Auth,
    /// How long one transmission waits for a reply (60 s).
    pub timeo: Duration,
    /// Soft mode: retransmissions before a call fails (2).
    pub retrans: u32,
    /// Soft mode: calls fail with [`ClientError::TimedOut`] after
    /// `timeo × (retrans + 1)`; hard mode (the default) retries forever.
    pub soft: bool,
    /// Calls in flight on the connection (64).
    pub max_in_flight: usize,
    /// READ size; `None`: the server's preferred size (FSINFO `rtpref`),
    /// never more than its `rtmax`.
    pub rsize: Option<u32>,
    /// WRITE size; `None`: the server's preferred size (FSINFO `wtpref`),
    /// never more than its `wtmax`.
    pub wsize: Option<u32>,
    /// READs or WRITEs that [`Client::read_all`] and [`Client::write_all`]
    /// keep in flight (16).
    pub io_depth: usize,
    /// Connect from a privileged source port (below 1024), which servers
    /// exporting with `secure` require; default: when running as root.
    pub resvport: bool,
    /// RDMA settings.
    pub rdma: RdmaOptions,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            transport: TransportKind::Tcp,
            port: None,
            mount_port: None,
            portmap_port: portmap::PORT,
            auth: Auth::default(),
            timeo: Duration::from_secs(60),
            retrans: 2,
            soft: false,
            max_in_flight: 64,
            rsize: None,
            wsize: None,
            io_depth: 16,
            resvport: crate::auth::effective_uid() == Some(0),
            rdma: RdmaOptions::default(),
        }
    }
}

impl ConnectOptions {
    fn tcp(&self) -> TcpOptions {
        TcpOptions {
            timeo: self.timeo,
            retrans: self.retrans,
            soft: self.soft,
            max_in_flight: self.max_in_flight.max(1),
            connect_timeout: self.timeo.min(Duration::from_secs(30)),
            resvport: self.resvport,
            ..TcpOptions::default()
        }
    }

    fn rdma_transport(&self) -> crate::transport::rdma::RdmaTransportOptions {
        let mut rdma = self.rdma;
        if let (Some(r), Some(w)) = (self.rsize, self.wsize) {
            rdma.max_io = rdma.max_io.min(r.max(w)).max(4096);
        }
        crate::transport::rdma::RdmaTransportOptions {
            rdma,
            timeo: self.timeo,
            retrans: self.retrans,
            soft: self.soft,
            connect_timeout: self.timeo.min(Duration::from_secs(30)),
        }
    }

    /// MOUNT and portmapper calls are always soft: a mount that cannot
    /// complete is reported.
    fn tcp_setup(&self) -> TcpOptions {
        TcpOptions {
            soft: true,
            timeo: self.timeo.min(Duration::from_secs(15)),
            max_in_flight: 4,
            max_record: 4 << 20,
            ..self.tcp()
        }
    }
}

/// One directory entry from [`Client::readdir_all`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The name (bytes, as the server sent it).
    pub name: Bytes,
    /// File id.
    pub fileid: u64,
    /// Cookie of the entry.
    pub cookie: u64,
    /// Attributes, when the server sent them.
    pub attr: Option<Fattr3>,
    /// Handle, when the server sent it.
    pub handle: Option<NfsFh3>,
}

impl DirEntry {
    /// The name as text (invalid UTF-8 replaced).
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(&self.name).into_owned()
    }
}

/// A mounted export. Cheap to clone; clones share one connection and may
/// be used from many tasks at once.
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    nfs: Arc<dyn Transport>,
    cred: OpaqueAuth,
    root: NfsFh3,
    export: String,
    mount_addr: SocketAddr,
    nfs_addr: SocketAddr,
    fsinfo: Fsinfo3ResOk,
    rsize: u32,
    wsize: u32,
    opts: ConnectOptions,
}

/// Result shortcut.
type Result<T> = std::result::Result<T, ClientError>;

fn check<T, F>(r: NfsResult<T, F>, wrap: fn(NfsResult<T, F>) -> Nfs3Res) -> Result<T> {
    match r {
        NfsResult::Ok(v) => Ok(v),
        NfsResult::Err(s, f) => Err(ClientError::nfs(wrap(NfsResult::Err(s, f)))),
    }
}

fn name3(name: impl AsRef<[u8]>) -> Filename3 {
    Filename3::new(Bytes::copy_from_slice(name.as_ref()))
}

fn diropargs(dir: &NfsFh3, name: impl AsRef<[u8]>) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: name3(name),
    }
}

/// Results of most procedures fit in this many bytes.
const SMALL: u32 = 1024;

/// The setup steps shared by [`Client::connect`] and
/// [`Client::connect_path`].
struct Setup {
    opts: ConnectOptions,
    mount_addr: SocketAddr,
    nfs_addr: SocketAddr,
    mounter: MountClient,
    /// The RDMA transport, already connected (RDMA only).
    rdma: Option<Arc<dyn Transport>>,
}

impl Setup {
    async fn new(opts: &ConnectOptions, server: &str) -> Result<Setup> {
        let ip = resolve(server).await?;
        let nfs_addr = SocketAddr::new(ip, opts.port.unwrap_or(opts.transport.default_nfs_port()));
        // RDMA connects first, so that a missing device or a server without
        // RPC-over-RDMA is reported before MOUNT (which always runs over
        // TCP).
        let rdma = if opts.transport == TransportKind::Rdma {
            Some(crate::transport::rdma::connect(nfs_addr, opts.rdma_transport()).await?)
        } else {
            None
        };
        let mount_port = match opts.mount_port {
            Some(p) => p,
            None => {
                getport(
                    SocketAddr::new(ip, opts.portmap_port),
                    mount::PROGRAM,
                    mount::VERSION,
                    opts.tcp_setup(),
                )
                .await?
            }
        };
        let mount_addr = SocketAddr::new(ip, mount_port);
        let mounter =
            MountClient::connect(mount_addr, opts.tcp_setup(), opts.auth.to_opaque_auth()).await?;
        Ok(Setup {
            opts: opts.clone(),
            mount_addr,
            nfs_addr,
            mounter,
            rdma,
        })
    }

    async fn finish(self, export: &str, ok: mount::MountRes3Ok) -> Result<Client> {
        let mut opts = self.opts;
        let flavors = ok.auth_flavors.0;
        let offered = |f| flavors.is_empty() || flavors.contains(&f);
        if !offered(opts.auth.flavor()) {
            if offered(flavor::AUTH_SYS) {
                opts.auth = Auth::default();
            } else if offered(flavor::AUTH_NONE) {
                opts.auth = Auth::None;
            } else {
                return Err(ClientError::NoUsableAuth(flavors));
            }
        }
        let t: Arc<dyn Transport> = match self.rdma {
            Some(t) => t,
            None => Arc::new(TcpTransport::connect(self.nfs_addr, opts.tcp()).await?),
        };
        let cred = opts.auth.to_opaque_auth();
        let root = NfsFh3(ok.fhandle.0);
        let fsinfo: Fsinfo3Res = call(
            &*t,
            &cred,
            nfs_target(NfsProc3::Fsinfo),
            &FsRootArgs {
                fsroot: root.clone(),
            },
            ReplyExpect::small(SMALL),
        )
        .await?;
        let fsinfo = check(fsinfo, Nfs3Res::Fsinfo)?;
        let pick = |want: Option<u32>, pref: u32, max: u32| {
            let max = if max == 0 { 1 << 20 } else { max };
            let pref = if pref == 0 { max } else { pref };
            want.unwrap_or(pref).clamp(512, max.max(512)).min(MAXDATA)
        };
        let rsize = pick(opts.rsize, fsinfo.rtpref, fsinfo.rtmax);
        let wsize = pick(opts.wsize, fsinfo.wtpref, fsinfo.wtmax);
        Ok(Client {
            inner: Arc::new(Inner {
                nfs: t,
                cred,
                root,
                export: export.to_string(),
                mount_addr: self.mount_addr,
                nfs_addr: self.nfs_addr,
                fsinfo,
                rsize,
                wsize,
                opts,
            }),
        })
    }
}

fn nfs_target(p: NfsProc3) -> Target {
    Target {
        prog: PROGRAM,
        vers: VERSION,
        proc_: p as u32,
        name: p.name(),
    }
}

fn normalize(path: &str) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

impl Client {
    /// Mounts `export` of `server` (a host name or address): finds the
    /// MOUNT port (from `opts.mount_port`, else the portmapper), calls MNT
    /// for the root handle, checks that the server accepts AUTH_SYS or
    /// AUTH_NONE (switching to the one it accepts), connects to NFS and
    /// reads FSINFO for the transfer sizes.
    pub async fn connect(opts: &ConnectOptions, server: &str, export: &str) -> Result<Client> {
        let setup = Setup::new(opts, server).await?;
        let ok = setup.mounter.mnt(export).await?;
        setup.finish(export, ok).await
    }

    /// Mounts the longest leading part of `path` that the server lets this
    /// client mount (MNT on the whole path, then on each parent in turn)
    /// and returns the client with the rest of the path, relative to the
    /// mounted directory (no leading `/`, empty when the whole path was
    /// mounted). When nothing mounts, the error is the one for the whole
    /// path.
    pub async fn connect_path(
        opts: &ConnectOptions,
        server: &str,
        path: &str,
    ) -> Result<(Client, String)> {
        let setup = Setup::new(opts, server).await?;
        let full = normalize(path);
        let comps: Vec<&str> = full.split('/').filter(|s| !s.is_empty()).collect();
        let mut first_err = None;
        for keep in (0..=comps.len()).rev() {
            let export = format!("/{}", comps[..keep].join("/"));
            match setup.mounter.mnt(&export).await {
                Ok(ok) => {
                    let rest = comps[keep..].join("/");
                    let client = setup.finish(&export, ok).await?;
                    return Ok((client, rest));
                }
                Err(e @ ClientError::Mount { .. }) => {
                    if let ClientError::Mount {
                        status: MountStat3::Perm,
                        ..
                    } = e
                    {
                        // A refusal because of our source port: parents
                        // will say the same.
                        return Err(e);
                    }
                    first_err.get_or_insert(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(first_err.unwrap_or_else(|| ClientError::InvalidArgument("empty path".into())))
    }

    /// UMNT: tells the server this client no longer uses the export. The
    /// client keeps working (NFSv3 does not depend on MOUNT state).
    pub async fn unmount(&self) -> Result<()> {
        let m = MountClient::connect(
            self.inner.mount_addr,
            self.inner.opts.tcp_setup(),
            self.inner.cred.clone(),
        )
        .await?;
        m.umnt(&self.inner.export).await
    }

    /// The export's root handle.
    pub fn root(&self) -> &NfsFh3 {
        &self.inner.root
    }

    /// The mounted path.
    pub fn export(&self) -> &str {
        &self.inner.export
    }

    /// The NFS server's address.
    pub fn nfs_addr(&self) -> SocketAddr {
        self.inner.nfs_addr
    }

    /// The READ size in use.
    pub fn rsize(&self) -> u32 {
        self.inner.rsize
    }

    /// The WRITE size in use.
    pub fn wsize(&self) -> u32 {
        self.inner.wsize
    }

    /// FSINFO of the export root, as read at mount time.
    pub fn fsinfo(&self) -> &Fsinfo3ResOk {
        &self.inner.fsinfo
    }

    /// The options this client was made with (after the credential
    /// negotiation).
    pub fn options(&self) -> &ConnectOptions {
        &self.inner.opts
    }

    /// The transport's counters.
    pub fn transport_stats(&self) -> TransportStats {
        self.inner.nfs.stats()
    }

    /// Closes the connection; calls in flight fail with
    /// [`ClientError::Shutdown`].
    pub fn shutdown(&self) {
        self.inner.nfs.shutdown();
    }

    async fn nfs<A: Xdr + Sync, R: Xdr>(
        &self,
        p: NfsProc3,
        args: &A,
        expect: ReplyExpect,
    ) -> Result<R> {
        call(
            &*self.inner.nfs,
            &self.inner.cred,
            nfs_target(p),
            args,
            expect,
        )
        .await
    }

    // ---- the 22 procedures ----------------------------------------------

    /// NULL.
    pub async fn null(&self) -> Result<()> {
        self.nfs(NfsProc3::Null, &(), ReplyExpect::small(0)).await
    }

    /// GETATTR: the object's attributes.
    pub async fn getattr(&self, fh: &NfsFh3) -> Result<Fattr3> {
        let args = Getattr3Args { object: fh.clone() };
        let r: Getattr3Res = self
            .nfs(NfsProc3::Getattr, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Getattr).map(|ok| ok.obj_attributes)
    }

    /// SETATTR, optionally guarded by the object's ctime.
    pub async fn setattr(
        &self,
        fh: &NfsFh3,
        attrs: &Sattr3,
        guard: Option<NfsTime3>,
    ) -> Result<WccData> {
        let args = Setattr3Args {
            object: fh.clone(),
            new_attributes: attrs.clone(),
            guard,
        };
        let r: Setattr3Res = self
            .nfs(NfsProc3::Setattr, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Setattr).map(|b| b.obj_wcc)
    }

    /// LOOKUP of `name` in `dir`.
    pub async fn lookup(&self, dir: &NfsFh3, name: impl AsRef<[u8]>) -> Result<Lookup3ResOk> {
        let args = Lookup3Args {
            what: diropargs(dir, name),
        };
        let r: Lookup3Res = self
            .nfs(NfsProc3::Lookup, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Lookup)
    }

    /// ACCESS: which of the `access` bits ([`access`]) are granted.
    pub async fn access(&self, fh: &NfsFh3, bits: u32) -> Result<Access3ResOk> {
        let args = Access3Args {
            object: fh.clone(),
            access: bits,
        };
        let r: Access3Res = self
            .nfs(NfsProc3::Access, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Access)
    }

    /// READLINK: a symbolic link's target.
    pub async fn readlink(&self, fh: &NfsFh3) -> Result<Readlink3ResOk> {
        let args = Readlink3Args {
            symlink: fh.clone(),
        };
        let r: Readlink3Res = self
            .nfs(
                NfsProc3::Readlink,
                &args,
                ReplyExpect::with_ddp(SMALL, MAXPATHLEN),
            )
            .await?;
        check(r, Nfs3Res::Readlink)
    }

    /// READ of up to `count` bytes at `offset`. The data points into the
    /// receive buffer (no copy).
    pub async fn read(&self, fh: &NfsFh3, offset: u64, count: u32) -> Result<Read3ResOk> {
        let args = Read3Args {
            file: fh.clone(),
            offset,
            count,
        };
        let r: Read3Res = self
            .nfs(NfsProc3::Read, &args, ReplyExpect::with_ddp(SMALL, count))
            .await?;
        let ok = check(r, Nfs3Res::Read)?;
        if ok.data.len() > count as usize || ok.count as usize != ok.data.len() {
            return Err(ClientError::Protocol(format!(
                "READ of {count} bytes answered with count {} and {} bytes of data",
                ok.count,
                ok.data.len()
            )));
        }
        Ok(ok)
    }

    /// WRITE of `data` at `offset`; the data is sent by reference.
    pub async fn write(
        &self,
        fh: &NfsFh3,
        offset: u64,
        data: impl Into<Payload>,
        stable: StableHow,
    ) -> Result<Write3ResOk> {
        let data: Payload = data.into();
        if data.len() > MAXDATA as usize {
            return Err(ClientError::InvalidArgument(format!(
                "WRITE of {} bytes exceeds the protocol maximum",
                data.len()
            )));
        }
        let args = Write3Args {
            file: fh.clone(),
            offset,
            count: data.len() as u32,
            stable,
            data: Data(data),
        };
        let r: Write3Res = self
            .nfs(NfsProc3::Write, &args, ReplyExpect::small(SMALL))
            .await?;
        let ok = check(r, Nfs3Res::Write)?;
        if ok.count > args.count {
            return Err(ClientError::Protocol(format!(
                "WRITE of {} bytes answered with count {}",
                args.count, ok.count
            )));
        }
        Ok(ok)
    }

    /// CREATE of a regular file.
    pub async fn create(
        &self,
        dir: &NfsFh3,
        name: impl AsRef<[u8]>,
        how: CreateHow3,
    ) -> Result<DirOpResOk> {
        let args = Create3Args {
            where_: diropargs(dir, name),
            how,
        };
        let r: Create3Res = self
            .nfs(NfsProc3::Create, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Create)
    }

    /// MKDIR.
    pub async fn mkdir(
        &self,
        dir: &NfsFh3,
        name: impl AsRef<[u8]>,
        attrs: &Sattr3,
    ) -> Result<DirOpResOk> {
        let args = Mkdir3Args {
            where_: diropargs(dir, name),
            attributes: attrs.clone(),
        };
        let r: Mkdir3Res = self
            .nfs(NfsProc3::Mkdir, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Mkdir)
    }

    /// SYMLINK `name` in `dir` pointing to `target`.
    pub async fn symlink(
        &self,
        dir: &NfsFh3,
        name: impl AsRef<[u8]>,
        target: impl AsRef<[u8]>,
        attrs: &Sattr3,
    ) -> Result<DirOpResOk> {
        let args = Symlink3Args {
            where_: diropargs(dir, name),
            symlink: SymlinkData3 {
                symlink_attributes: attrs.clone(),
                symlink_data: NfsPath3::new(Bytes::copy_from_slice(target.as_ref())),
            },
        };
        let r: Symlink3Res = self
            .nfs(NfsProc3::Symlink, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Symlink)
    }

    /// MKNOD of a device, socket or FIFO.
    pub async fn mknod(
        &self,
        dir: &NfsFh3,
        name: impl AsRef<[u8]>,
        what: MknodData3,
    ) -> Result<DirOpResOk> {
        let args = Mknod3Args {
            where_: diropargs(dir, name),
            what,
        };
        let r: Mknod3Res = self
            .nfs(NfsProc3::Mknod, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Mknod)
    }

    /// REMOVE of a non-directory.
    pub async fn remove(&self, dir: &NfsFh3, name: impl AsRef<[u8]>) -> Result<WccData> {
        let args = Remove3Args {
            object: diropargs(dir, name),
        };
        let r: Remove3Res = self
            .nfs(NfsProc3::Remove, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Remove).map(|b| b.dir_wcc)
    }

    /// RMDIR of an empty directory.
    pub async fn rmdir(&self, dir: &NfsFh3, name: impl AsRef<[u8]>) -> Result<WccData> {
        let args = Rmdir3Args {
            object: diropargs(dir, name),
        };
        let r: Rmdir3Res = self
            .nfs(NfsProc3::Rmdir, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Rmdir).map(|b| b.dir_wcc)
    }

    /// RENAME.
    pub async fn rename(
        &self,
        from_dir: &NfsFh3,
        from_name: impl AsRef<[u8]>,
        to_dir: &NfsFh3,
        to_name: impl AsRef<[u8]>,
    ) -> Result<Rename3ResBody> {
        let args = Rename3Args {
            from: diropargs(from_dir, from_name),
            to: diropargs(to_dir, to_name),
        };
        let r: Rename3Res = self
            .nfs(NfsProc3::Rename, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Rename)
    }

    /// LINK: a new name `name` in `dir` for `file`.
    pub async fn link(
        &self,
        file: &NfsFh3,
        dir: &NfsFh3,
        name: impl AsRef<[u8]>,
    ) -> Result<Link3ResBody> {
        let args = Link3Args {
            file: file.clone(),
            link: diropargs(dir, name),
        };
        let r: Link3Res = self
            .nfs(NfsProc3::Link, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Link)
    }

    /// READDIR: entries after `cookie` in at most `count` bytes of reply.
    pub async fn readdir(
        &self,
        dir: &NfsFh3,
        cookie: u64,
        cookieverf: CookieVerf3,
        count: u32,
    ) -> Result<Readdir3ResOk> {
        let args = Readdir3Args {
            dir: dir.clone(),
            cookie,
            cookieverf,
            count,
        };
        let r: Readdir3Res = self
            .nfs(NfsProc3::Readdir, &args, ReplyExpect::small(count + SMALL))
            .await?;
        check(r, Nfs3Res::Readdir)
    }

    /// READDIRPLUS: entries with attributes and handles after `cookie`.
    pub async fn readdirplus(
        &self,
        dir: &NfsFh3,
        cookie: u64,
        cookieverf: CookieVerf3,
        dircount: u32,
        maxcount: u32,
    ) -> Result<Readdirplus3ResOk> {
        let args = Readdirplus3Args {
            dir: dir.clone(),
            cookie,
            cookieverf,
            dircount,
            maxcount,
        };
        let r: Readdirplus3Res = self
            .nfs(
                NfsProc3::Readdirplus,
                &args,
                ReplyExpect::small(maxcount + SMALL),
            )
            .await?;
        check(r, Nfs3Res::Readdirplus)
    }

    /// FSSTAT.
    pub async fn fsstat(&self, fh: &NfsFh3) -> Result<Fsstat3ResOk> {
        let args = FsRootArgs { fsroot: fh.clone() };
        let r: Fsstat3Res = self
            .nfs(NfsProc3::Fsstat, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Fsstat)
    }

    /// FSINFO.
    pub async fn fsinfo_of(&self, fh: &NfsFh3) -> Result<Fsinfo3ResOk> {
        let args = FsRootArgs { fsroot: fh.clone() };
        let r: Fsinfo3Res = self
            .nfs(NfsProc3::Fsinfo, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Fsinfo)
    }

    /// PATHCONF.
    pub async fn pathconf(&self, fh: &NfsFh3) -> Result<Pathconf3ResOk> {
        let args = FsRootArgs { fsroot: fh.clone() };
        let r: Pathconf3Res = self
            .nfs(NfsProc3::Pathconf, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Pathconf)
    }

    /// COMMIT of `count` bytes at `offset` (0 and 0: the whole file).
    pub async fn commit(&self, fh: &NfsFh3, offset: u64, count: u32) -> Result<Commit3ResOk> {
        let args = Commit3Args {
            file: fh.clone(),
            offset,
            count,
        };
        let r: Commit3Res = self
            .nfs(NfsProc3::Commit, &args, ReplyExpect::small(SMALL))
            .await?;
        check(r, Nfs3Res::Commit)
    }

    // ---- conveniences -----------------------------------------------------

    /// Looks up a `/`-separated path relative to the export root (a leading
    /// `/`, empty components and `.` are ignored) and returns its handle
    /// and attributes.
    pub async fn lookup_path(&self, path: &str) -> Result<(NfsFh3, Fattr3)> {
        let mut fh = self.inner.root.clone();
        let mut attr = None;
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            let ok = self.lookup(&fh, comp).await?;
            fh = ok.object;
            attr = ok.obj_attributes;
        }
        let attr = match attr {
            Some(a) => a,
            None => self.getattr(&fh).await?,
        };
        Ok((fh, attr))
    }

    /// Reads the whole file: READs of [`Client::rsize`] bytes, up to
    /// `io_depth` in flight, until end of file. The result's pieces point
    /// into the receive buffers.
    pub async fn read_all(&self, fh: &NfsFh3) -> Result<Payload> {
        let size = self.getattr(fh).await?.size;
        let (mut out, mut eof) = self.read_range(fh, 0, size).await?;
        // The file may have grown since GETATTR.
        let mut offset = out.len() as u64;
        while !eof {
            let r = self.read(fh, offset, self.rsize()).await?;
            if r.data.is_empty() && !r.eof {
                return Err(ClientError::Protocol(
                    "READ returned no data before end of file".into(),
                ));
            }
            offset += r.data.len() as u64;
            for p in r.data.parts() {
                out.push(p.clone());
            }
            eof = r.eof;
        }
        Ok(out)
    }

    /// Reads `len` bytes at `offset` with READs of [`Client::rsize`] bytes,
    /// up to `io_depth` in flight. Returns the data (shorter when the file
    /// ends first) and whether end of file was reached.
    pub async fn read_range(&self, fh: &NfsFh3, offset: u64, len: u64) -> Result<(Payload, bool)> {
        let rsize = u64::from(self.rsize());
        let Some(end) = offset.checked_add(len) else {
            return Err(ClientError::InvalidArgument(format!(
                "a read of {len} bytes at {offset} passes the largest offset"
            )));
        };
        let chunks: Vec<(u64, u32)> = (0..len.div_ceil(rsize))
            .map(|i| {
                let at = offset + i * rsize;
                (at, (end - at).min(rsize) as u32)
            })
            .collect();
        let results = self
            .parallel(chunks.len(), |c, i| {
                let fh = fh.clone();
                let (at, n) = chunks[i];
                async move { c.read(&fh, at, n).await }
            })
            .await?;
        let mut out = Payload::new();
        let mut eof = len == 0;
        for (i, r) in results.into_iter().enumerate() {
            let (at, n) = chunks[i];
            for p in r.data.parts() {
                out.push(p.clone());
            }
            let mut got = r.data.len() as u64;
            eof = r.eof;
            // A short READ that is not at end of file: read the rest of
            // this chunk before going on.
            while !eof && got < u64::from(n) {
                let more = self.read(fh, at + got, n - got as u32).await?;
                if more.data.is_empty() && !more.eof {
                    return Err(ClientError::Protocol(
                        "READ returned no data before end of file".into(),
                    ));
                }
                got += more.data.len() as u64;
                for p in more.data.parts() {
                    out.push(p.clone());
                }
                eof = more.eof;
            }
            if eof {
                break;
            }
        }
        Ok((out, eof))
    }

    /// Writes `data` at `offset`: UNSTABLE WRITEs of [`Client::wsize`]
    /// bytes, up to `io_depth` in flight, then COMMIT; chunks whose write
    /// verifier differs from COMMIT's (the server restarted) are written
    /// again with FILE_SYNC. The data is sent by reference, never copied.
    /// Returns the bytes written.
    pub async fn write_all(
        &self,
        fh: &NfsFh3,
        offset: u64,
        data: impl Into<Payload>,
    ) -> Result<u64> {
        let data: Payload = data.into();
        if offset.checked_add(data.len() as u64).is_none() {
            return Err(ClientError::InvalidArgument(format!(
                "a write of {} bytes at {offset} passes the largest offset",
                data.len()
            )));
        }
        let wsize = self.wsize() as usize;
        let chunks: Vec<(usize, usize)> = (0..data.len().div_ceil(wsize))
            .map(|i| (i * wsize, ((i + 1) * wsize).min(data.len())))
            .collect();
        let results = self
            .parallel(chunks.len(), |c, i| {
                let fh = fh.clone();
                let (from, to) = chunks[i];
                let piece = data.slice(from..to);
                async move {
                    c.write_fully(&fh, offset + from as u64, piece, StableHow::Unstable)
                        .await
                }
            })
            .await?;
        if results.iter().all(|(how, _)| *how == StableHow::FileSync) {
            return Ok(data.len() as u64);
        }
        let commit = self.commit(fh, offset, 0).await?;
        for (i, (how, verf)) in results.iter().enumerate() {
            if *how != StableHow::FileSync && *verf != commit.verf {
                let (from, to) = chunks[i];
                tracing::info!(
                    offset = offset + from as u64,
                    "write verifier changed; writing again"
                );
                self.write_fully(
                    fh,
                    offset + from as u64,
                    data.slice(from..to),
                    StableHow::FileSync,
                )
                .await?;
            }
        }
        Ok(data.len() as u64)
    }

    /// Writes all of `data` at `offset` (continuing after short writes);
    /// returns the weakest stability reached and the last verifier.
    async fn write_fully(
        &self,
        fh: &NfsFh3,
        offset: u64,
        data: Payload,
        stable: StableHow,
    ) -> Result<(StableHow, WriteVerf3)> {
        let mut done = 0usize;
        let mut weakest = StableHow::FileSync;
        loop {
            let r = self
                .write(
                    fh,
                    offset + done as u64,
                    data.slice(done..data.len()),
                    stable,
                )
                .await?;
            if (r.committed as u32) < (weakest as u32) {
                weakest = r.committed;
            }
            done += r.count as usize;
            if done >= data.len() {
                return Ok((weakest, r.verf));
            }
            if r.count == 0 {
                return Err(ClientError::Protocol(
                    "WRITE made no progress (count 0)".into(),
                ));
            }
        }
    }

    /// Runs `n` jobs with up to `io_depth` in flight; results in job order.
    async fn parallel<T, F, Fut>(&self, n: usize, job: F) -> Result<Vec<T>>
    where
        T: Send + 'static,
        F: Fn(Client, usize) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + Send + 'static,
    {
        let depth = self.inner.opts.io_depth.max(1);
        let mut out: Vec<Option<T>> = (0..n).map(|_| None).collect();
        let mut set = JoinSet::new();
        let mut next = 0;
        while next < n || !set.is_empty() {
            while next < n && set.len() < depth {
                let fut = job(self.clone(), next);
                let i = next;
                set.spawn(async move { (i, fut.await) });
                next += 1;
            }
            match set.join_next().await {
                Some(Ok((i, Ok(v)))) => out[i] = Some(v),
                Some(Ok((_, Err(e)))) => return Err(e),
                Some(Err(e)) => return Err(ClientError::Protocol(format!("I/O task failed: {e}"))),
                None => break,
            }
        }
        out.into_iter()
            .map(|v| v.ok_or_else(|| ClientError::Protocol("I/O task lost".into())))
            .collect()
    }

    /// Lists a directory with READDIRPLUS, following cookies (and the
    /// cookie verifier) until end of directory. `.` and `..` are left out.
    pub async fn readdir_all(&self, dir: &NfsFh3) -> Result<Vec<DirEntry>> {
        let maxcount = self.rsize().clamp(4096, 64 << 10);
        let dircount = maxcount / 4;
        let mut cookie = 0u64;
        let mut verf = [0u8; COOKIEVERFSIZE];
        let mut out = Vec::new();
        loop {
            let asked = cookie;
            let r = self
                .readdirplus(dir, cookie, verf, dircount, maxcount)
                .await?;
            let n = r.reply.entries.0.len();
            for e in r.reply.entries.0 {
                cookie = e.cookie;
                if &e.name[..] == b"." || &e.name[..] == b".." {
                    continue;
                }
                out.push(DirEntry {
                    name: e.name.0,
                    fileid: e.fileid,
                    cookie: e.cookie,
                    attr: e.name_attributes,
                    handle: e.name_handle,
                });
            }
            verf = r.cookieverf;
            if r.reply.eof {
                return Ok(out);
            }
            if n == 0 || cookie == asked {
                return Err(ClientError::Protocol(
                    "READDIRPLUS made no progress before end of directory".into(),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared_between_tasks<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn client_is_cheap_to_share() {
        shared_between_tasks::<Client>();
    }

    #[test]
    fn paths_normalise() {
        assert_eq!(normalize("//a/./b//"), "/a/b");
        assert_eq!(normalize(""), "/");
    }
}
