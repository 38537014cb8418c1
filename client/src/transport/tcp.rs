//! ONC RPC over TCP with record marking (RFC 5531 §11).
//!
//! One connection carries many calls. Each call takes a slot (at most
//! [`TcpOptions::max_in_flight`] calls are in flight), gets a fresh XID and
//! is encoded once into a list of buffers: WRITE data stays in the
//! caller's `Bytes` and goes out with `writev`. A reader task reassembles
//! reply records and hands each to the call waiting for its XID; replies
//! may come in any order, replies nobody waits for are logged and dropped.
//!
//! # Timeouts, reconnection, retransmission
//! - Each transmission waits [`TcpOptions::timeo`] (60 s by default, the
//!   Linux TCP default of `timeo=600` deciseconds). When it passes, the
//!   call is sent again on the current connection with the same XID.
//! - When the connection breaks (closed, reset, an unacceptable record),
//!   the next call to need it reconnects, and every call still waiting is
//!   sent again on the new connection with the SAME XID, so that the
//!   server's duplicate request cache answers a retransmitted
//!   non-idempotent call instead of running it twice.
//! - Reconnection with backoff, hard and soft mode, and the first
//!   connection failing at once: [`super::retry`], shared with the RDMA
//!   transport.

use super::retry::{Clock, Link, Redial};
use super::{parse_reply, CallFuture, RpcCall, Transport, TransportKind, TransportStats};
use crate::error::ClientError;
use bytes::{Buf, Bytes};
use nfsrdma_xdr::record::{marker, RecordReader, MAX_FRAGMENT};
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::{Decoder, IoVecSink, Xdr};
use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::time::Instant;
use tracing::Instrument;

/// Settings of a TCP transport.
#[derive(Debug, Clone)]
pub struct TcpOptions {
    /// How long one transmission waits for its reply before the call is
    /// sent again.
    pub timeo: Duration,
    /// Soft mode: retransmissions before giving up.
    pub retrans: u32,
    /// Soft mode: give up (with [`ClientError::TimedOut`]) after
    /// `timeo × (retrans + 1)`. Hard mode (false): retry forever.
    pub soft: bool,
    /// Calls in flight at once (the slot table).
    pub max_in_flight: usize,
    /// Largest reply record accepted; a larger one breaks the connection.
    pub max_record: usize,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
    /// Connect from a privileged source port (below 1024), as servers
    /// exporting with `secure` (the usual default) require. Needs root (or
    /// CAP_NET_BIND_SERVICE); when no such port can be bound, an ordinary
    /// port is used.
    pub resvport: bool,
}

impl Default for TcpOptions {
    fn default() -> Self {
        TcpOptions {
            timeo: Duration::from_secs(60),
            retrans: 2,
            soft: false,
            max_in_flight: 64,
            max_record: (16 << 20) + (64 << 10),
            connect_timeout: Duration::from_secs(30),
            resvport: false,
        }
    }
}

/// An RPC client endpoint over TCP. Dropping it closes the connection.
#[derive(Debug)]
pub struct TcpTransport {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    opts: TcpOptions,
    next_xid: AtomicU32,
    slots: Semaphore,
    pending: Mutex<HashMap<u32, oneshot::Sender<Bytes>>>,
    conn: Redial<Conn>,
    closed: watch::Sender<bool>,
    connects: AtomicU64,
    retransmits: AtomicU64,
    unmatched: AtomicU64,
}

/// One TCP connection: a queue to its writer task and its "broken" flag.
#[derive(Debug)]
struct Conn {
    id: u64,
    tx: mpsc::UnboundedSender<Vec<Bytes>>,
    dead: Arc<watch::Sender<bool>>,
}

impl Link for Conn {
    fn is_dead(&self) -> bool {
        *self.dead.borrow()
    }

    fn id(&self) -> u64 {
        self.id
    }
}

impl Conn {
    fn kill(&self) {
        self.dead.send_replace(true);
    }
}

/// Removes a call's XID from the pending table when the call ends in any
/// way (reply, error, or the caller dropping the future).
struct PendingGuard<'a> {
    shared: &'a Shared,
    xid: u32,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        self.shared.pending().remove(&self.xid);
    }
}

impl TcpTransport {
    /// Connects to `addr`. Fails at once when the connection cannot be
    /// made; later reconnections follow the hard/soft policy.
    pub async fn connect(addr: SocketAddr, opts: TcpOptions) -> Result<TcpTransport, ClientError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(20))
            .unwrap_or(0)
            ^ std::process::id().rotate_left(8);
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            addr,
            slots: Semaphore::new(opts.max_in_flight.max(1)),
            opts,
            next_xid: AtomicU32::new(seed),
            pending: Mutex::new(HashMap::new()),
            conn: Redial::new(addr, "tcp"),
            closed,
            connects: AtomicU64::new(0),
            retransmits: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
        });
        let conn = Shared::open(&shared).await?;
        shared.conn.set(conn).await;
        Ok(TcpTransport { shared })
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The transport's counters.
    pub fn stats(&self) -> TransportStats {
        TransportStats {
            connects: self.shared.connects.load(Ordering::Relaxed),
            retransmits: self.shared.retransmits.load(Ordering::Relaxed),
            unmatched_replies: self.shared.unmatched.load(Ordering::Relaxed),
            ..TransportStats::default()
        }
    }

    async fn do_call(&self, call: RpcCall<'_>) -> Result<Decoder, ClientError> {
        let sh = &self.shared;
        let _slot = sh
            .slots
            .acquire()
            .await
            .map_err(|_| ClientError::Shutdown)?;
        if *sh.closed.borrow() {
            return Err(ClientError::Shutdown);
        }
        let (tx, mut rx) = oneshot::channel();
        let xid = sh.register(tx);
        let _guard = PendingGuard { shared: sh, xid };
        let span = tracing::debug_span!("rpc", xid, call = call.name);
        async move {
            let record = encode_record(xid, &call)?;
            let clock = Clock::start(call.name, sh.opts.timeo, sh.opts.retrans, sh.opts.soft);
            let mut closed = sh.closed.subscribe();
            let mut sends = 0u32;
            loop {
                let conn = sh
                    .connection(clock.deadline())
                    .await
                    .map_err(|e| clock.map_connect(e))?;
                if sends > 0 {
                    sh.retransmits.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(conn = conn.id, "retransmitting");
                }
                sends += 1;
                if conn.tx.send(record.clone()).is_err() {
                    conn.kill();
                }
                let mut dead = conn.dead.subscribe();
                let try_end = clock.try_end();
                tokio::select! {
                    biased;
                    r = &mut rx => {
                        return match r {
                            Ok(rec) => parse_reply(rec, call.prog, call.vers, call.proc_),
                            Err(_) => Err(ClientError::Shutdown),
                        };
                    }
                    _ = closed.wait_for(|c| *c) => return Err(ClientError::Shutdown),
                    _ = dead.wait_for(|d| *d) => {
                        tracing::debug!(conn = conn.id, "connection lost while waiting");
                    }
                    _ = tokio::time::sleep_until(try_end) => {
                        if clock.expired() {
                            tracing::debug!("soft timeout");
                            return Err(clock.timed_out());
                        }
                        tracing::debug!(conn = conn.id, "no reply in time");
                    }
                }
            }
        }
        .instrument(span)
        .await
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl Transport for TcpTransport {
    fn call<'a>(&'a self, call: RpcCall<'a>) -> CallFuture<'a> {
        Box::pin(self.do_call(call))
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn stats(&self) -> TransportStats {
        TcpTransport::stats(self)
    }

    fn shutdown(&self) {
        self.shared.close();
    }
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, HashMap<u32, oneshot::Sender<Bytes>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates an XID no call in flight uses and registers the waiter.
    fn register(&self, tx: oneshot::Sender<Bytes>) -> u32 {
        let mut p = self.pending();
        loop {
            let xid = self.next_xid.fetch_add(1, Ordering::Relaxed);
            if xid != 0 && !p.contains_key(&xid) {
                p.insert(xid, tx);
                return xid;
            }
        }
    }

    fn close(&self) {
        self.closed.send_replace(true);
        self.slots.close();
        if let Some(c) = self.conn.current() {
            c.kill();
        }
        self.pending().clear();
    }

    /// Hands a reply record to the call waiting for its XID.
    fn deliver(&self, rec: Bytes) {
        if rec.len() < 8 {
            self.unmatched.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                len = rec.len(),
                "record too short for an RPC reply; dropped"
            );
            return;
        }
        let xid = u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]);
        let waiter = self.pending().remove(&xid);
        match waiter {
            Some(tx) => {
                // The caller may have given up meanwhile; nothing to do then.
                let _ = tx.send(rec);
            }
            None => {
                self.unmatched.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(xid, "reply for an unknown XID dropped");
            }
        }
    }

    /// The current connection, reconnecting (with backoff) when it broke.
    async fn connection(
        self: &Arc<Self>,
        deadline: Option<Instant>,
    ) -> Result<Arc<Conn>, ClientError> {
        self.conn
            .connection(deadline, &self.closed, || Shared::open(self))
            .await
    }

    /// Opens a connection and starts its reader and writer tasks.
    async fn open(self: &Arc<Self>) -> Result<Arc<Conn>, ClientError> {
        let addr = self.addr;
        let stream =
            tokio::time::timeout(self.opts.connect_timeout, dial(addr, self.opts.resvport))
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
                .map_err(|source| ClientError::Connect { addr, source })?;
        let _ = stream.set_nodelay(true);
        let id = self.connects.fetch_add(1, Ordering::Relaxed) + 1;
        self.conn.made();
        let (rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let (dead, _) = watch::channel(false);
        let dead = Arc::new(dead);
        tokio::spawn(write_loop(wr, rx, dead.clone()));
        tokio::spawn(read_loop(
            self.clone(),
            rd,
            dead.clone(),
            self.closed.subscribe(),
        ));
        tracing::debug!(%addr, conn = id, "connected");
        Ok(Arc::new(Conn { id, tx, dead }))
    }
}

/// Encodes a call as one record: the marker, the RPC header and the
/// arguments, as a list of buffers. Payloads of 512 bytes or more (WRITE
/// data) are references to the caller's buffers, not copies.
pub fn encode_record(xid: u32, call: &RpcCall<'_>) -> Result<Vec<Bytes>, ClientError> {
    let mut sink = IoVecSink::new();
    RpcMessage::call(xid, call.prog, call.vers, call.proc_, call.cred.clone()).encode(&mut sink);
    (call.args)(&mut sink);
    let len = sink.len();
    if len > MAX_FRAGMENT as usize {
        return Err(ClientError::InvalidArgument(format!(
            "{}: a call of {len} bytes does not fit one record",
            call.name
        )));
    }
    let mut record = Vec::with_capacity(4);
    record.push(Bytes::copy_from_slice(&marker(len as u32, true)));
    record.extend(sink.into_parts());
    Ok(record)
}

/// The privileged source ports tried, as the Linux client's default range.
const RESVPORT_MIN: u16 = 665;
const RESVPORT_MAX: u16 = 1023;

/// Connects to `addr`, from a privileged port when `resvport` is set and
/// one can be bound.
async fn dial(addr: SocketAddr, resvport: bool) -> std::io::Result<TcpStream> {
    if resvport {
        let span = u32::from(RESVPORT_MAX - RESVPORT_MIN + 1);
        // Start somewhere different in each process, to collide less.
        let start = std::process::id() % span;
        for i in 0..span {
            let port = RESVPORT_MIN + ((start + i) % span) as u16;
            let sock = if addr.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            let _ = sock.set_reuseaddr(true);
            let local = SocketAddr::new(
                if addr.is_ipv4() {
                    std::net::Ipv4Addr::UNSPECIFIED.into()
                } else {
                    std::net::Ipv6Addr::UNSPECIFIED.into()
                },
                port,
            );
            match sock.bind(local) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => break,
                Err(_) => continue,
            }
            match sock.connect(addr).await {
                Ok(s) => return Ok(s),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::AddrInUse | std::io::ErrorKind::AddrNotAvailable
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
        tracing::debug!(%addr, "no privileged port available; using an ordinary one");
    }
    TcpStream::connect(addr).await
}

/// Reassembles reply records and delivers them until the connection breaks
/// or the transport closes.
async fn read_loop(
    shared: Arc<Shared>,
    mut rd: OwnedReadHalf,
    dead: Arc<watch::Sender<bool>>,
    mut closed: watch::Receiver<bool>,
) {
    let mut dead_rx = dead.subscribe();
    // The server is trusted to send what it claims: room for a whole reply
    // fragment is made at its marker, as before.
    let mut reader = RecordReader::new(shared.opts.max_record).with_reserve_ahead(usize::MAX);
    'conn: loop {
        loop {
            match reader.next_record() {
                Ok(Some(rec)) => shared.deliver(rec),
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(addr = %shared.addr, error = %e, "dropping the connection");
                    break 'conn;
                }
            }
        }
        let buf = reader.buffer_mut();
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 << 10);
        }
        tokio::select! {
            r = rd.read_buf(buf) => match r {
                Ok(0) => {
                    tracing::debug!(addr = %shared.addr, "connection closed by the server");
                    break;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(addr = %shared.addr, error = %e, "read failed");
                    break;
                }
            },
            _ = dead_rx.wait_for(|d| *d) => break,
            _ = closed.wait_for(|c| *c) => break,
        }
    }
    dead.send_replace(true);
}

/// Sends queued records, gathering what is ready into one `writev`.
async fn write_loop(
    mut wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Vec<Bytes>>,
    dead: Arc<watch::Sender<bool>>,
) {
    let mut dead_rx = dead.subscribe();
    loop {
        let mut parts = tokio::select! {
            m = rx.recv() => match m {
                Some(p) => p,
                None => break,
            },
            _ = dead_rx.wait_for(|d| *d) => break,
        };
        while parts.len() < 256 {
            match rx.try_recv() {
                Ok(more) => parts.extend(more),
                Err(_) => break,
            }
        }
        let failed = tokio::select! {
            r = write_parts(&mut wr, parts) => r.err(),
            _ = dead_rx.wait_for(|d| *d) => break,
        };
        if let Some(e) = failed {
            tracing::debug!(error = %e, "write failed");
            break;
        }
    }
    dead.send_replace(true);
}

async fn write_parts(w: &mut OwnedWriteHalf, mut parts: Vec<Bytes>) -> std::io::Result<()> {
    let mut first = 0;
    while first < parts.len() {
        let slices: Vec<IoSlice<'_>> = parts[first..]
            .iter()
            .take(64)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && first < parts.len() {
            let here = parts[first].len();
            if n >= here {
                n -= here;
                first += 1;
            } else {
                parts[first].advance(n);
                n = 0;
            }
        }
        while first < parts.len() && parts[first].is_empty() {
            first += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::ReplyExpect;
    use nfsrdma_xdr::nfs3::{Data, NfsFh3, StableHow, Write3Args};
    use nfsrdma_xdr::rpc::OpaqueAuth;
    use nfsrdma_xdr::XdrSink;

    #[test]
    fn write_data_is_sent_by_reference() {
        let data = Bytes::from(vec![0xabu8; 65536]);
        let args = Write3Args {
            file: NfsFh3::new(Bytes::from_static(b"handle")),
            offset: 0,
            count: 65536,
            stable: StableHow::Unstable,
            data: Data::new(data.clone()),
        };
        let encode = |s: &mut dyn XdrSink| args.encode(s);
        let cred = OpaqueAuth::none();
        let call = RpcCall {
            prog: 100003,
            vers: 3,
            proc_: 7,
            name: "WRITE",
            cred: &cred,
            args: &encode,
            expect: ReplyExpect::small(200),
        };
        let parts = encode_record(42, &call).unwrap();
        assert!(parts
            .iter()
            .any(|p| p.as_ptr() == data.as_ptr() && p.len() == 65536));
        let total: usize = parts.iter().map(Bytes::len).sum();
        let flat: Vec<u8> = parts.iter().flat_map(|p| p.iter().copied()).collect();
        let mut r = RecordReader::new(1 << 20);
        r.extend(&flat);
        let rec = r.next_record().unwrap().unwrap();
        assert_eq!(rec.len() + 4, total);
        let (msg, mut d) = nfsrdma_xdr::rpc::split_message(rec).unwrap();
        assert_eq!(msg.xid, 42);
        assert_eq!(Write3Args::decode(&mut d).unwrap(), args);
    }
}
