//! Registering with the local rpcbind (portmapper version 2, RFC 1833 §3)
//! so that clients find MOUNT, NFS, the lock manager and the status
//! monitor by asking port 111.

use crate::rpc_client::{call, Target};
use nfsrdma_xdr::portmap::{self, Mapping};
use std::net::SocketAddr;

pub use crate::rpc_client::CallError as RpcbindError;

fn pmap<T: nfsrdma_xdr::Xdr>(
    rpcbind: SocketAddr,
    proc_: u32,
    m: &Mapping,
) -> Result<T, RpcbindError> {
    call(
        Target {
            addr: rpcbind,
            from: None,
            prog: portmap::PROGRAM,
            vers: portmap::VERSION,
            proc_,
        },
        m,
    )
}

/// SET: registers `port` for program `prog` version `vers` over TCP.
pub fn set(rpcbind: SocketAddr, prog: u32, vers: u32, port: u16) -> Result<bool, RpcbindError> {
    set_prot(rpcbind, prog, vers, portmap::IPPROTO_TCP, port)
}

/// SET for `prot` ([`portmap::IPPROTO_TCP`] or [`portmap::IPPROTO_UDP`]).
pub fn set_prot(
    rpcbind: SocketAddr,
    prog: u32,
    vers: u32,
    prot: u32,
    port: u16,
) -> Result<bool, RpcbindError> {
    pmap(
        rpcbind,
        portmap::proc_::SET,
        &Mapping {
            prog,
            vers,
            prot,
            port: port.into(),
        },
    )
}

/// UNSET: removes every registration of `prog` version `vers`.
pub fn unset(rpcbind: SocketAddr, prog: u32, vers: u32) -> Result<bool, RpcbindError> {
    pmap(
        rpcbind,
        portmap::proc_::UNSET,
        &Mapping {
            prog,
            vers,
            prot: portmap::IPPROTO_TCP,
            port: 0,
        },
    )
}

/// GETPORT: the TCP port of `prog` version `vers`, 0 when unregistered.
pub fn getport(rpcbind: SocketAddr, prog: u32, vers: u32) -> Result<u32, RpcbindError> {
    pmap(
        rpcbind,
        portmap::proc_::GETPORT,
        &Mapping {
            prog,
            vers,
            prot: portmap::IPPROTO_TCP,
            port: 0,
        },
    )
}
