//! Serving RPC over TCP with record marking.
//!
//! Each connection has a reader that reassembles records and starts one task
//! per call, and a writer that sends replies as they complete (out of order
//! when calls finish out of order), gathering whatever replies are ready
//! into one `writev`. Calls in flight are bounded per connection (the reader
//! stops reading when its connection is at the bound) and for the whole
//! server (the worker pool). A record larger than the maximum closes that
//! connection only.

use crate::service::metrics::Transport;
use crate::service::{CallContext, Service};
use bytes::{Buf, Bytes};
use nfsrdma_xdr::record::{marker, RecordReader};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};

/// TCP listener settings.
#[derive(Debug, Clone)]
pub struct TcpConfig {
    /// Largest record accepted; a bigger one closes the connection.
    pub max_record: usize,
    /// Calls executing at once across all connections.
    pub workers: usize,
    /// Calls in flight on one connection.
    pub per_connection: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            max_record: (1 << 20) + 64 * 1024,
            workers: 64,
            per_connection: 64,
        }
    }
}

/// Counters of the TCP listener.
#[derive(Debug, Default)]
pub struct TcpStats {
    /// Connections accepted.
    pub accepted: AtomicU64,
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed because a record was too large or malformed.
    pub refused_records: AtomicU64,
    /// Records received.
    pub records: AtomicU64,
}

/// A running TCP front end.
pub struct TcpServer {
    service: Arc<Service>,
    config: TcpConfig,
    workers: Arc<Semaphore>,
    stats: Arc<TcpStats>,
}

impl TcpServer {
    /// A front end for `service`.
    pub fn new(service: Arc<Service>, config: TcpConfig) -> TcpServer {
        TcpServer {
            workers: Arc::new(Semaphore::new(config.workers.max(1))),
            service,
            config,
            stats: Arc::new(TcpStats::default()),
        }
    }

    /// The listener's counters.
    pub fn stats(&self) -> Arc<TcpStats> {
        self.stats.clone()
    }

    /// Accepts connections until `shutdown` turns true, then waits for the
    /// calls in flight to finish.
    pub async fn serve(&self, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                r = listener.accept() => match r {
                    Ok((stream, peer)) => {
                        self.stats.accepted.fetch_add(1, Ordering::Relaxed);
                        let conn = Connection {
                            service: self.service.clone(),
                            config: self.config.clone(),
                            workers: self.workers.clone(),
                            stats: self.stats.clone(),
                            peer,
                        };
                        let sd = shutdown.clone();
                        conns.spawn(async move { conn.run(stream, sd).await });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = shutdown.changed() => break,
            }
        }
        // Each connection stops reading, sends the replies of its calls in
        // flight, and closes.
        while conns.join_next().await.is_some() {}
        let n = self.config.workers.max(1) as u32;
        let _all = self.workers.acquire_many(n).await;
    }
}

struct Connection {
    service: Arc<Service>,
    config: TcpConfig,
    workers: Arc<Semaphore>,
    stats: Arc<TcpStats>,
    peer: SocketAddr,
}

impl Connection {
    async fn run(self, stream: TcpStream, mut shutdown: watch::Receiver<bool>) {
        let _ = stream.set_nodelay(true);
        self.stats.open.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(peer = %self.peer, "connection open");
        let ctx = CallContext {
            peer: self.peer,
            local: stream.local_addr().ok(),
        };
        let (mut rd, wr) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel::<Vec<Bytes>>();
        let writer = tokio::spawn(write_replies(wr, rx));
        let per_conn = Arc::new(Semaphore::new(self.config.per_connection.max(1)));
        let mut reader = RecordReader::new(self.config.max_record);
        'conn: loop {
            // Hand out every complete record before reading more.
            loop {
                match reader.next_record() {
                    Ok(Some(rec)) => {
                        // The turnaround counts from here: waiting for a
                        // worker is the server's time too.
                        let arrived = Instant::now();
                        self.stats.records.fetch_add(1, Ordering::Relaxed);
                        let Ok(conn_permit) = per_conn.clone().acquire_owned().await else {
                            break 'conn;
                        };
                        let Ok(worker) = self.workers.clone().acquire_owned().await else {
                            break 'conn;
                        };
                        let service = self.service.clone();
                        let tx = tx.clone();
                        tokio::spawn(async move {
                            if let Some(reply) = service.handle(&ctx, rec) {
                                let mut parts = reply.to_parts();
                                let len: usize = parts.iter().map(Bytes::len).sum();
                                parts.insert(0, Bytes::copy_from_slice(&marker(len as u32, true)));
                                let _ = tx.send(parts);
                                if let Some(c) = reply.class {
                                    service.metrics().record_turnaround(
                                        Transport::Tcp,
                                        c,
                                        arrived.elapsed(),
                                    );
                                }
                            }
                            drop(worker);
                            drop(conn_permit);
                        });
                    }
                    Ok(None) => break,
                    Err(e) => {
                        self.stats.refused_records.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer = %self.peer, error = %e, "closing connection");
                        break 'conn;
                    }
                }
            }
            let buf = reader.buffer_mut();
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(64 * 1024);
            }
            tokio::select! {
                r = rd.read_buf(buf) => match r {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(peer = %self.peer, error = %e, "read failed");
                        break;
                    }
                },
                _ = shutdown.changed() => break,
            }
        }
        drop(tx);
        // The writer ends once every call of this connection has replied.
        let _ = writer.await;
        self.stats.open.fetch_sub(1, Ordering::Relaxed);
        tracing::debug!(peer = %self.peer, "connection closed");
    }
}

/// Sends replies in completion order, gathering ready ones into one write.
async fn write_replies(mut w: OwnedWriteHalf, mut rx: mpsc::UnboundedReceiver<Vec<Bytes>>) {
    while let Some(mut parts) = rx.recv().await {
        while parts.len() < 256 {
            match rx.try_recv() {
                Ok(more) => parts.extend(more),
                Err(_) => break,
            }
        }
        if let Err(e) = write_all_parts(&mut w, parts).await {
            tracing::debug!(error = %e, "write failed");
            // Keep draining so that callers do not block; the connection
            // is gone.
            while rx.recv().await.is_some() {}
            return;
        }
    }
    let _ = w.shutdown().await;
}

async fn write_all_parts(w: &mut OwnedWriteHalf, mut parts: Vec<Bytes>) -> std::io::Result<()> {
    let mut i = 0;
    while i < parts.len() {
        let slices: Vec<IoSlice<'_>> = parts[i..]
            .iter()
            .take(64)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let l = parts[i].len();
            if n >= l {
                n -= l;
                i += 1;
            } else {
                parts[i].advance(n);
                n = 0;
            }
        }
        while i < parts.len() && parts[i].is_empty() {
            i += 1;
        }
    }
    Ok(())
}
