//! Registering with the local rpcbind (portmapper version 2, RFC 1833 §3)
//! so that clients find MOUNT and NFS by asking port 111.

use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::portmap::{self, Mapping};
use nfsrdma_xdr::record::{write_record, RecordReader};
use nfsrdma_xdr::rpc::{AcceptStat, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{Decoder, Xdr};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Why a portmapper call failed.
#[derive(Debug, thiserror::Error)]
pub enum RpcbindError {
    /// No portmapper answered.
    #[error("cannot reach rpcbind at {addr}: {source}")]
    Unreachable {
        /// Where it was looked for.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The portmapper answered something unusable.
    #[error("bad reply from rpcbind: {0}")]
    BadReply(String),
}

/// Makes one portmapper call over TCP and returns the decoded result.
fn call<T: Xdr>(addr: SocketAddr, proc_: u32, args: &impl Xdr) -> Result<T, RpcbindError> {
    let io = |source| RpcbindError::Unreachable { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(io)?;
    let xid = std::process::id() ^ 0x5eed_0000 ^ proc_;
    let mut msg = BytesMut::new();
    RpcMessage::call(
        xid,
        portmap::PROGRAM,
        portmap::VERSION,
        proc_,
        OpaqueAuth::none(),
    )
    .encode(&mut msg);
    args.encode(&mut msg);
    let mut rec = Vec::new();
    write_record(&mut rec, &msg);
    s.write_all(&rec).map_err(io)?;
    let mut r = RecordReader::new(1 << 20);
    let reply: Bytes = loop {
        if let Some(rec) = r
            .next_record()
            .map_err(|e| RpcbindError::BadReply(e.to_string()))?
        {
            break rec;
        }
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Err(RpcbindError::BadReply("connection closed".into()));
        }
        r.extend(&buf[..n]);
    };
    let mut d = Decoder::new(reply);
    let h = RpcMessage::decode(&mut d).map_err(|e| RpcbindError::BadReply(e.to_string()))?;
    match h.as_reply() {
        Some(ReplyBody::Accepted(a)) if a.stat == AcceptStat::Success && h.xid == xid => {}
        other => return Err(RpcbindError::BadReply(format!("{other:?}"))),
    }
    T::decode(&mut d).map_err(|e| RpcbindError::BadReply(e.to_string()))
}

/// SET: registers `port` for program `prog` version `vers` over TCP.
pub fn set(rpcbind: SocketAddr, prog: u32, vers: u32, port: u16) -> Result<bool, RpcbindError> {
    call(
        rpcbind,
        portmap::proc_::SET,
        &Mapping {
            prog,
            vers,
            prot: portmap::IPPROTO_TCP,
            port: port.into(),
        },
    )
}

/// UNSET: removes every registration of `prog` version `vers`.
pub fn unset(rpcbind: SocketAddr, prog: u32, vers: u32) -> Result<bool, RpcbindError> {
    call(
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
    call(
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
