//! RPC-over-RDMA version 1 (RFC 8166) with remote invalidation (RFC 8797):
//! the requester side.
//!
//! The protocol is the connection core's: how a call travels and which
//! chunks its reply needs (`nfsrdma_rpcrdma::requester`), and everything
//! that spans messages (`nfsrdma_rpcrdma::conn`: the credit limit, XID
//! matching, the check of a Send With Invalidate against the call's keys,
//! the local invalidation of the rest, the reply handed over only once all
//! are invalid and the call's Send completed). This driver carries it out
//! with the verbs layer, in files of one concern:
//!
//! - `mod.rs` (here): the transport, its settings and counters, and a
//!   call's tries (reconnection, timeouts and retransmission are
//!   [`super::retry`]'s, shared with TCP);
//! - [`conn`]: one connection: its verbs objects, the RFC 8797 exchange,
//!   starting a call, teardown;
//! - [`poll`]: waiting for completions: the completion thread and, in busy
//!   mode, the waiting caller polling for itself;
//! - [`reply`]: completions to the core, the core's work to the queue
//!   pair, replies to their callers;
//! - [`recv`]: the receive buffers, a reply lent in the one it landed in
//!   and a spare posted in its stead;
//! - [`reg`]: memory registration, one strategy per file (`mw`, `reg-mr`,
//!   `persistent`).
//!
//! # Connection
//! rdma_cm to the server (20049 by default), with our RFC 8797 message in
//! the connect request: our inline threshold both ways (4 KiB by default)
//! and the "Send With Invalidate accepted" flag when remote invalidation
//! is asked for and the registration strategy's memory can be invalidated
//! by the peer (memory windows; never a region per call or the pool).
//!
//! # Threads and buffers (per connection)
//! One protection domain, one completion queue, one RC queue pair, and one
//! completion thread; [`RECV_BUFFERS`] receive buffers (one per call slot,
//! posted before connecting) and as many spares, so that a reply reaches
//! its caller in the buffer it landed in (see [`recv`]); as many send
//! buffers as call slots. How
//! completions are waited for is the completion engine's `PollMode`:
//! `event` sleeps on the completion channel; `adaptive` and `auto` spin
//! for a while after the last completion, then sleep; `busy` makes a
//! waiting caller poll the completion queue itself on its own thread (one
//! caller at a time), so that a reply reaches its caller without a wake-up
//! of another thread, while the completion thread only backs the callers
//! up. One thread polls at a time and handles what it finds in queue
//! order.
//!
//! # Timeouts, reconnection, retransmission
//! As for TCP: when a connection breaks, the next call reconnects and
//! every waiting call is sent again with the SAME XID. A transmission that
//! gets no reply within `timeo` drops the connection (an RC connection
//! does not lose messages; as the Linux client does) and is retransmitted
//! on a new one. A dead connection's verbs objects are destroyed on a
//! thread of their own, windows first (see `conn::Teardown`), so that
//! reconnecting and resending never wait for them; destroying them fences
//! every registration the connection made.

pub mod conn;
pub mod poll;
pub mod recv;
pub mod reg;
pub mod reply;

use super::retry::{Clock, Redial};
use super::{reply_results, CallFuture, RpcCall, Transport, TransportKind, TransportStats};
use crate::error::ClientError;
use crate::{PollMode, RdmaOptions};
use bytes::Bytes;
use conn::Conn;
use nfsrdma_xdr::{Decoder, Payload};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Receive buffers posted, credits asked for, and slots in the table.
pub const RECV_BUFFERS: u32 = 32;
/// Our default inline threshold, both directions (advertised in RFC 8797
/// form); [`RdmaOptions::inline`] overrides it.
pub const INLINE_SIZE: u32 = 4096;
/// The smallest inline threshold RFC 8166 §3.3.3 allows.
pub const MIN_INLINE: u32 = 1024;
/// The largest inline threshold we accept (one receive buffer per credit).
pub const MAX_INLINE: u32 = 1 << 20;
/// Chunk memory of one slot in the pre-registered pool by default: a 1 MiB
/// READ or WRITE payload plus room for the rest of the call or reply.
pub const AREA: usize = (1 << 20) + AREA_EXTRA;
/// The local ACK timeout on Soft-RoCE unless [`RdmaOptions::ack_timeout`]
/// says otherwise: the largest, 4.096 µs × 2^31 (about 2.4 hours), so that
/// the adapter in effect never sends a request again on its own. The
/// retransmission timer of `rdma_rxe` (Debian's 6.1 kernel) is armed by
/// a send only when it is not armed already, so it fires while later
/// requests are still on their way and their retry is spurious: a QP that
/// carries calls one at a time sees one every timeout period in which a
/// Send happens to be unacknowledged (with the connection manager's 2.1 s,
/// `scripts/test-vm -- vm_load` saw 1 or 2 per 60 s run, and the same at
/// 4.3 s). A retry runs again the window binds queued behind the Send it
/// repeats, and the second bind of a bound window fails and ends the
/// connection (docs/architecture.md, "Soft-RoCE and retries"). A packet
/// really lost is still recovered, by the call's `timeo`, which drops the
/// connection and sends the call again on a new one.
pub const SOFT_ROCE_ACK_TIMEOUT: u8 = 31;
/// Room in a slot's area beyond [`RdmaOptions::max_io`].
const AREA_EXTRA: usize = 64 << 10;

/// Settings of an RDMA transport.
#[derive(Debug, Clone)]
pub struct RdmaTransportOptions {
    /// Registration, remote invalidation and polling.
    pub rdma: RdmaOptions,
    /// How long one transmission waits for its reply before the connection
    /// is dropped and the call sent again on a new one.
    pub timeo: Duration,
    /// Soft mode: retransmissions before giving up.
    pub retrans: u32,
    /// Soft mode: give up after `timeo × (retrans + 1)`.
    pub soft: bool,
    /// How long one connection attempt may take.
    pub connect_timeout: Duration,
}

impl Default for RdmaTransportOptions {
    fn default() -> Self {
        RdmaTransportOptions {
            rdma: RdmaOptions::default(),
            timeo: Duration::from_secs(60),
            retrans: 2,
            soft: false,
            connect_timeout: Duration::from_secs(30),
        }
    }
}

/// Connects an RPC-over-RDMA transport to `addr`.
pub async fn connect(
    addr: SocketAddr,
    opts: RdmaTransportOptions,
) -> Result<Arc<dyn Transport>, ClientError> {
    Ok(Arc::new(RdmaTransport::connect(addr, opts).await?))
}

/// An RPC client endpoint over RPC-over-RDMA. Dropping it closes the
/// connection.
#[derive(Debug)]
pub struct RdmaTransport {
    shared: Arc<Shared>,
}

/// The transport's counters, over all its connections.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) connects: AtomicU64,
    pub(crate) retransmits: AtomicU64,
    pub(crate) unmatched: AtomicU64,
    pub(crate) send_with_inv: AtomicU64,
    pub(crate) local_invs: AtomicU64,
    pub(crate) binds: AtomicU64,
    pub(crate) window_renewals: AtomicU64,
    pub(crate) mr_regs: AtomicU64,
    pub(crate) read_chunks: AtomicU64,
    pub(crate) write_chunks: AtomicU64,
    pub(crate) reply_chunks: AtomicU64,
    pub(crate) timed_calls: AtomicU64,
    pub(crate) register_ns: AtomicU64,
    pub(crate) wire_ns: AtomicU64,
    pub(crate) invalidate_ns: AtomicU64,
    pub(crate) copy_out_ns: AtomicU64,
    pub(crate) bytes_copied: AtomicU64,
    pub(crate) bytes_lent: AtomicU64,
    pub(crate) by_caller: AtomicU64,
    pub(crate) receives_lent: AtomicU64,
    pub(crate) receives_copied: AtomicU64,
    pub(crate) ack_timeout: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    addr: SocketAddr,
    opts: RdmaTransportOptions,
    next_xid: AtomicU32,
    conn: Redial<Conn>,
    closed: watch::Sender<bool>,
    counters: Arc<Counters>,
    conn_ids: AtomicU64,
}

/// Why a call could not be sent.
pub(crate) enum NotSent {
    /// The connection is gone: send on a new one.
    Lost,
    /// The call cannot be sent at all.
    Fatal(ClientError),
}

/// What a waiting call is handed.
pub(crate) enum Outcome {
    /// The reply.
    Reply {
        /// The RPC reply message.
        message: Bytes,
        /// The data placed in the Write chunk.
        ddp: Option<Payload>,
        /// `message` is lent in its receive buffer: it is decoded with a
        /// lent-input decoder, so that nothing decoded keeps the buffer.
        lent: bool,
    },
    /// The connection went away before the reply: send again.
    Lost,
    /// The call failed for good.
    Fatal(ClientError),
}

fn rdma_err(what: &str, e: impl std::fmt::Display) -> ClientError {
    ClientError::Rdma(format!("{what}: {e}"))
}

/// Why a connection is closed when its transport is shut down (the one
/// reason that is not a fault).
const SHUT_DOWN: &str = "transport shut down";

impl RdmaTransport {
    /// Connects to `addr`. Fails at once when the connection cannot be
    /// made; later reconnections follow the hard/soft policy.
    pub async fn connect(
        addr: SocketAddr,
        opts: RdmaTransportOptions,
    ) -> Result<RdmaTransport, ClientError> {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() ^ (d.as_secs() as u32).rotate_left(20))
            .unwrap_or(0)
            ^ std::process::id().rotate_left(12);
        let (closed, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            addr,
            opts,
            next_xid: AtomicU32::new(seed),
            conn: Redial::new(addr, "rdma"),
            closed,
            counters: Arc::new(Counters::default()),
            conn_ids: AtomicU64::new(0),
        });
        let conn = shared.open().await?;
        shared.conn.set(conn).await;
        Ok(RdmaTransport { shared })
    }

    /// The server's address.
    pub fn peer(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The transport's counters.
    pub fn stats(&self) -> TransportStats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        TransportStats {
            connects: g(&c.connects),
            retransmits: g(&c.retransmits),
            unmatched_replies: g(&c.unmatched),
            send_with_invalidate: g(&c.send_with_inv),
            local_invalidations: g(&c.local_invs),
            window_binds: g(&c.binds),
            window_renewals: g(&c.window_renewals),
            mr_registrations: g(&c.mr_regs),
            read_chunk_calls: g(&c.read_chunks),
            write_chunk_calls: g(&c.write_chunks),
            reply_chunk_calls: g(&c.reply_chunks),
            timed_calls: g(&c.timed_calls),
            register_ns: g(&c.register_ns),
            send_to_reply_ns: g(&c.wire_ns),
            invalidate_ns: g(&c.invalidate_ns),
            copy_out_ns: g(&c.copy_out_ns),
            reply_bytes_copied: g(&c.bytes_copied),
            reply_bytes_lent: g(&c.bytes_lent),
            completions_by_caller: g(&c.by_caller),
            receives_lent: g(&c.receives_lent),
            receives_copied: g(&c.receives_copied),
            ack_timeout: g(&c.ack_timeout) as u8,
        }
    }

    async fn do_call(&self, call: RpcCall<'_>) -> Result<Decoder, ClientError> {
        let sh = &self.shared;
        if *sh.closed.borrow() {
            return Err(ClientError::Shutdown);
        }
        let xid = loop {
            let x = sh.next_xid.fetch_add(1, Ordering::Relaxed);
            if x != 0 {
                break x;
            }
        };
        let clock = Clock::start(call.name, sh.opts.timeo, sh.opts.retrans, sh.opts.soft);
        let mut closed = sh.closed.subscribe();
        let mut sends = 0u32;
        loop {
            let conn = sh
                .conn
                .connection(clock.deadline(), &sh.closed, || sh.open())
                .await
                .map_err(|e| clock.map_connect(e))?;
            let try_end = clock.try_end();
            let rx = tokio::select! {
                biased;
                _ = closed.wait_for(|c| *c) => return Err(ClientError::Shutdown),
                r = conn.start_call(xid, &call) => r,
                _ = tokio::time::sleep_until(try_end) => {
                    if clock.expired() {
                        return Err(clock.timed_out());
                    }
                    continue;
                }
            };
            let mut rx = match rx {
                Ok(rx) => rx,
                Err(NotSent::Lost) => continue,
                Err(NotSent::Fatal(e)) => return Err(e),
            };
            if sends > 0 {
                sh.counters.retransmits.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(xid, conn = conn.id, "retransmitted");
            }
            sends += 1;
            let busy = conn.poll == PollMode::Busy;
            let outcome = async {
                if busy {
                    conn.wait_busy(&mut rx).await
                } else {
                    (&mut rx).await.ok()
                }
            };
            tokio::select! {
                biased;
                r = outcome => match r {
                    Some(Outcome::Reply { message, ddp, lent }) => {
                        let mut d = nfsrdma_rpcrdma::requester::reply_decoder(message, ddp);
                        if lent {
                            d = d.lent();
                        }
                        return reply_results(d, call.prog, call.vers, call.proc_);
                    }
                    Some(Outcome::Fatal(e)) => return Err(e),
                    Some(Outcome::Lost) | None => {
                        tracing::debug!(xid, conn = conn.id, "connection lost while waiting");
                    }
                },
                _ = closed.wait_for(|c| *c) => return Err(ClientError::Shutdown),
                _ = tokio::time::sleep_until(try_end) => {
                    // Drop the connection: tearing it down fences this
                    // call's registrations (and every other one).
                    conn.kill("no reply in time");
                    if clock.expired() {
                        return Err(clock.timed_out());
                    }
                    tracing::warn!(xid, conn = conn.id, call = call.name, "no reply in {:?}; reconnecting", clock.timeo());
                }
            }
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        self.shared.close();
    }
}

impl Transport for RdmaTransport {
    fn call<'a>(&'a self, call: RpcCall<'a>) -> CallFuture<'a> {
        Box::pin(self.do_call(call))
    }

    fn kind(&self) -> TransportKind {
        TransportKind::Rdma
    }

    fn stats(&self) -> TransportStats {
        RdmaTransport::stats(self)
    }

    fn shutdown(&self) {
        self.shared.close();
    }
}

impl Shared {
    fn close(&self) {
        self.closed.send_replace(true);
        if let Some(c) = self.conn.take() {
            c.kill(SHUT_DOWN);
        }
    }

    /// Opens a connection (blocking verbs work on a blocking thread) and
    /// starts its threads.
    async fn open(&self) -> Result<Arc<Conn>, ClientError> {
        let addr = self.addr;
        let rdma = self.opts.rdma;
        let timeout = self.opts.connect_timeout;
        let id = self.conn_ids.fetch_add(1, Ordering::Relaxed) + 1;
        let counters = self.counters.clone();
        let conn =
            tokio::task::spawn_blocking(move || Conn::open(addr, rdma, timeout, id, counters))
                .await
                .map_err(|e| ClientError::Rdma(format!("connecting to {addr}: {e}")))??;
        if *self.closed.borrow() {
            // Shut down while connecting: `close` could not reach it.
            conn.kill(SHUT_DOWN);
            return Err(ClientError::Shutdown);
        }
        self.counters.connects.fetch_add(1, Ordering::Relaxed);
        self.conn.made();
        conn.start_threads()?;
        Ok(conn)
    }
}
