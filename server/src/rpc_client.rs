//! One-shot RPC calls over TCP made by the server itself: registering with
//! the local rpcbind, asking a client's rpcbind where its lock manager and
//! status monitor listen, and the lock manager's calls to clients (NLM
//! GRANTED and the `_RES` answers, NSM SM_NOTIFY after a restart). Each
//! call opens a connection, sends one record, reads one reply and closes:
//! these calls are rare, and a client's services may move between them.

use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::record::{write_record, RecordReader};
use nfsrdma_xdr::rpc::{AcceptStat, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{portmap, Decoder, Xdr};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// How long a call may take to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a call waits for its reply.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest reply taken.
const MAX_REPLY: usize = 1 << 20;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No connection, or it broke.
    #[error("cannot reach {addr}: {source}")]
    Unreachable {
        /// Where the call went.
        addr: SocketAddr,
        /// The socket error.
        source: std::io::Error,
    },
    /// The peer answered something unusable, or refused the call.
    #[error("bad reply from {addr}: {why}")]
    BadReply {
        /// Where the call went.
        addr: SocketAddr,
        /// What was wrong.
        why: String,
    },
    /// The peer's rpcbind does not know the program.
    #[error("{addr} has no program {prog} version {vers} registered over TCP")]
    NotRegistered {
        /// The rpcbind asked.
        addr: SocketAddr,
        /// The program.
        prog: u32,
        /// Its version.
        vers: u32,
    },
}

/// The procedure called and where from.
#[derive(Debug, Clone, Copy)]
pub struct Target {
    /// Where to call.
    pub addr: SocketAddr,
    /// The local address to call from (`None`: the system picks it).
    pub from: Option<IpAddr>,
    /// Program.
    pub prog: u32,
    /// Version.
    pub vers: u32,
    /// Procedure.
    pub proc_: u32,
}

fn next_xid() -> u32 {
    static XID: AtomicU32 = AtomicU32::new(0);
    let seed = std::process::id().rotate_left(16) ^ 0x6e66_0000;
    seed.wrapping_add(XID.fetch_add(1, Ordering::Relaxed))
}

fn connect(addr: SocketAddr, from: Option<IpAddr>) -> std::io::Result<TcpStream> {
    let Some(from) = from else {
        return TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT);
    };
    let sock = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    sock.bind(&SocketAddr::new(from, 0).into())?;
    sock.connect_timeout(&addr.into(), CONNECT_TIMEOUT)?;
    Ok(sock.into())
}

/// Calls `t` with `args` (AUTH_NONE) and decodes its result.
pub fn call<T: Xdr>(t: Target, args: &impl Xdr) -> Result<T, CallError> {
    let addr = t.addr;
    let io = |source| CallError::Unreachable { addr, source };
    let bad = |why: String| CallError::BadReply { addr, why };
    let mut s = connect(addr, t.from).map_err(io)?;
    s.set_read_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
    s.set_write_timeout(Some(REPLY_TIMEOUT)).map_err(io)?;
    let xid = next_xid();
    let mut msg = BytesMut::new();
    RpcMessage::call(xid, t.prog, t.vers, t.proc_, OpaqueAuth::none()).encode(&mut msg);
    args.encode(&mut msg);
    let mut rec = Vec::new();
    write_record(&mut rec, &msg);
    s.write_all(&rec).map_err(io)?;
    let mut r = RecordReader::new(MAX_REPLY);
    let reply: Bytes = loop {
        if let Some(rec) = r.next_record().map_err(|e| bad(e.to_string()))? {
            break rec;
        }
        let mut buf = [0u8; 4096];
        let n = s.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Err(bad("connection closed before the reply".into()));
        }
        r.extend(&buf[..n]);
    };
    let mut d = Decoder::new(reply);
    let h = RpcMessage::decode(&mut d).map_err(|e| bad(e.to_string()))?;
    if h.xid != xid {
        return Err(bad(format!("reply xid {:#x}, call xid {xid:#x}", h.xid)));
    }
    match h.as_reply() {
        Some(ReplyBody::Accepted(a)) if a.stat == AcceptStat::Success => {}
        other => return Err(bad(format!("{other:?}"))),
    }
    T::decode(&mut d).map_err(|e| bad(e.to_string()))
}

/// Where `prog` version `vers` listens over TCP on `host`, asked of its
/// rpcbind (at `rpcbind_port`, normally 111), then calls it.
pub fn call_registered<T: Xdr>(
    host: IpAddr,
    rpcbind_port: u16,
    from: Option<IpAddr>,
    prog: u32,
    vers: u32,
    proc_: u32,
    args: &impl Xdr,
) -> Result<T, CallError> {
    let rpcbind = SocketAddr::new(host, rpcbind_port);
    let port: u32 = call(
        Target {
            addr: rpcbind,
            from,
            prog: portmap::PROGRAM,
            vers: portmap::VERSION,
            proc_: portmap::proc_::GETPORT,
        },
        &portmap::Mapping {
            prog,
            vers,
            prot: portmap::IPPROTO_TCP,
            port: 0,
        },
    )?;
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(CallError::NotRegistered {
            addr: rpcbind,
            prog,
            vers,
        })?;
    call(
        Target {
            addr: SocketAddr::new(host, port),
            from,
            prog,
            vers,
            proc_,
        },
        args,
    )
}
