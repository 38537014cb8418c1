//! Finding and mounting an export: portmapper GETPORT (RFC 1833) and MOUNT
//! v3 (RFC 1813 appendix I), both over TCP.

use crate::error::ClientError;
use crate::rpc::{call, Target};
use crate::transport::tcp::{TcpOptions, TcpTransport};
use crate::transport::ReplyExpect;
use nfsrdma_xdr::mount::{self, DirPath, Exports, MountRes3, MountRes3Ok};
use nfsrdma_xdr::portmap::{self, Mapping};
use nfsrdma_xdr::rpc::OpaqueAuth;
use std::net::{IpAddr, SocketAddr};

/// Resolves a host name or address literal (`[::1]` accepted) to an IP
/// address, preferring IPv4.
pub async fn resolve(host: &str) -> Result<IpAddr, ClientError> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(ip);
    }
    let err = |source| ClientError::Resolve {
        host: host.to_string(),
        source,
    };
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((bare, 0))
        .await
        .map_err(err)?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|a| a.ip())
        .ok_or_else(|| err(std::io::ErrorKind::NotFound.into()))
}

/// Asks the portmapper at `pmap` for the TCP port of `prog`/`vers`.
pub async fn getport(
    pmap: SocketAddr,
    prog: u32,
    vers: u32,
    opts: TcpOptions,
) -> Result<u16, ClientError> {
    let t = TcpTransport::connect(pmap, opts).await?;
    let args = Mapping {
        prog,
        vers,
        prot: portmap::IPPROTO_TCP,
        port: 0,
    };
    let target = Target {
        prog: portmap::PROGRAM,
        vers: portmap::VERSION,
        proc_: portmap::proc_::GETPORT,
        name: "PORTMAP GETPORT",
    };
    let port: u32 = call(
        &t,
        &OpaqueAuth::none(),
        target,
        &args,
        ReplyExpect::small(8),
    )
    .await?;
    match u16::try_from(port) {
        Ok(0) => Err(ClientError::NotRegistered {
            addr: pmap,
            prog,
            vers,
        }),
        Ok(p) => Ok(p),
        Err(_) => Err(ClientError::Protocol(format!(
            "portmapper returned port {port}, out of range"
        ))),
    }
}

/// A connection to a MOUNT v3 server.
#[derive(Debug)]
pub struct MountClient {
    t: TcpTransport,
    cred: OpaqueAuth,
}

fn target(proc_: u32, name: &'static str) -> Target {
    Target {
        prog: mount::PROGRAM,
        vers: mount::VERSION,
        proc_,
        name,
    }
}

impl MountClient {
    /// Connects to the MOUNT server at `addr`, sending `cred` with each
    /// call.
    pub async fn connect(
        addr: SocketAddr,
        opts: TcpOptions,
        cred: OpaqueAuth,
    ) -> Result<MountClient, ClientError> {
        Ok(MountClient {
            t: TcpTransport::connect(addr, opts).await?,
            cred,
        })
    }

    /// NULL: checks that the server answers.
    pub async fn null(&self) -> Result<(), ClientError> {
        call(
            &self.t,
            &self.cred,
            target(mount::proc_::NULL, "MOUNT NULL"),
            &(),
            ReplyExpect::small(0),
        )
        .await
    }

    /// MNT: the root handle of `path` and the flavors the server accepts.
    pub async fn mnt(&self, path: &str) -> Result<MountRes3Ok, ClientError> {
        let res: MountRes3 = call(
            &self.t,
            &self.cred,
            target(mount::proc_::MNT, "MOUNT MNT"),
            &DirPath::new(path.as_bytes().to_vec()),
            ReplyExpect::small(4 + 68 + 4 + 4 * 64),
        )
        .await?;
        match res {
            MountRes3::Ok(ok) => Ok(ok),
            MountRes3::Err(status) => Err(ClientError::Mount {
                path: path.to_string(),
                status,
            }),
        }
    }

    /// UMNT: removes the server's record of this mount.
    pub async fn umnt(&self, path: &str) -> Result<(), ClientError> {
        call(
            &self.t,
            &self.cred,
            target(mount::proc_::UMNT, "MOUNT UMNT"),
            &DirPath::new(path.as_bytes().to_vec()),
            ReplyExpect::small(0),
        )
        .await
    }

    /// EXPORT: the export list.
    pub async fn exports(&self) -> Result<Exports, ClientError> {
        call(
            &self.t,
            &self.cred,
            target(mount::proc_::EXPORT, "MOUNT EXPORT"),
            &(),
            ReplyExpect::small(1 << 20),
        )
        .await
    }
}
