//! Shared helpers of the client's integration tests: the server in-process
//! (on its own runtime thread), client options for it, a TCP proxy that can
//! cut connections, and fake servers.
#![allow(dead_code)]

pub mod rdma;

use bytes::{Bytes, BytesMut};
use nfsrdma_client::{Auth, AuthSys, Client, ConnectOptions};
use nfsrdma_server::exports::Exports;
use nfsrdma_server::service::{Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_server::tcp::{TcpConfig, TcpServer};
use nfsrdma_xdr::record::{marker, RecordReader};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A read-write and a read-only export.
pub const EXPORTS: &str =
    "/export *(rw,no_root_squash,insecure)\n/ro *(ro,no_root_squash,insecure)\n";

/// Our server, running on its own runtime in its own thread (so that it
/// works under any test runtime, and plain `#[test]`s can use it too).
pub struct TestServer {
    pub addr: SocketAddr,
    /// Its metrics endpoint (nfsrdmad's `--metrics`).
    pub metrics: SocketAddr,
    pub service: Arc<Service>,
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl TestServer {
    pub fn start(exports: &str) -> TestServer {
        let rules = Exports::parse(exports).expect("exports");
        let ex = Service::exports_from_rules(&rules, &StoreConfig::default());
        let service = Arc::new(Service::new(ex, ServiceConfig::default()));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let metrics_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        metrics_listener.set_nonblocking(true).expect("nonblocking");
        let metrics = metrics_listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::watch::channel(false);
        let svc = service.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = TcpListener::from_std(listener).expect("listener");
                let server = TcpServer::new(svc.clone(), TcpConfig::default());
                let sources = nfsrdma_server::exporter::Sources {
                    service: svc,
                    tcp: Some(server.stats()),
                    rdma: None,
                };
                let m = TcpListener::from_std(metrics_listener).expect("listener");
                tokio::spawn(nfsrdma_server::exporter::http::serve(
                    m,
                    sources,
                    rx.clone(),
                ));
                server.serve(l, rx).await;
            });
        });
        TestServer {
            addr,
            metrics,
            service,
            shutdown: tx,
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
    }
}

/// Root credentials, as an `insecure,no_root_squash` export expects.
pub fn root() -> Auth {
    Auth::Sys(AuthSys {
        uid: 0,
        gid: 0,
        gids: vec![],
        machine_name: "client-test".into(),
    })
}

/// Options reaching `addr` for both MOUNT and NFS (our server serves both
/// on one port; no rpcbind runs in tests).
pub fn opts_at(addr: SocketAddr) -> ConnectOptions {
    ConnectOptions {
        port: Some(addr.port()),
        mount_port: Some(addr.port()),
        auth: root(),
        ..ConnectOptions::default()
    }
}

pub async fn connect(s: &TestServer, export: &str) -> Client {
    Client::connect(&opts_at(s.addr), "127.0.0.1", export)
        .await
        .expect("connect")
}

/// Deterministic pseudo-random bytes (xorshift), different per seed.
pub fn pattern(seed: u64, len: usize) -> Bytes {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = BytesMut::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out.freeze()
}

/// FNV-1a over a sequence of pieces.
pub fn checksum<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for p in parts {
        for b in p {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x100_0000_01b3);
        }
    }
    h
}

/// A TCP proxy in front of `upstream`. While `cut_after` is above zero,
/// each connection is cut (both sides closed) when the server sends the
/// reply that would exceed that many forwarded replies; the reply itself
/// is lost. Each cut lowers the count of cuts left.
pub struct Proxy {
    pub addr: SocketAddr,
    pub cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr, cuts: usize, cut_after: usize) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let cuts = Arc::new(AtomicUsize::new(cuts));
        let c2 = cuts.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = l.accept().await {
                let cuts = c2.clone();
                tokio::spawn(async move {
                    let Ok(up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = up.set_nodelay(true);
                    let _ = down.set_nodelay(true);
                    let (mut dr, mut dw) = down.into_split();
                    let (mut ur, mut uw) = up.into_split();
                    let calls = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut dr, &mut uw).await;
                    });
                    // Replies, record by record, so that a cut falls
                    // between records.
                    let mut reader = RecordReader::new(64 << 20);
                    let mut forwarded = 0usize;
                    let mut buf = vec![0u8; 1 << 16];
                    'conn: loop {
                        let n = match ur.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        reader.extend(&buf[..n]);
                        while let Ok(Some(rec)) = reader.next_record() {
                            if forwarded >= cut_after
                                && cuts
                                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| {
                                        c.checked_sub(1)
                                    })
                                    .is_ok()
                            {
                                break 'conn;
                            }
                            let mut out = marker(rec.len() as u32, true).to_vec();
                            out.extend_from_slice(&rec);
                            if dw.write_all(&out).await.is_err() {
                                break 'conn;
                            }
                            forwarded += 1;
                        }
                    }
                    calls.abort();
                    let _ = dw.shutdown().await;
                });
            }
        });
        Proxy { addr, cuts, task }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a fake server does with each call record it receives.
pub type Script = Arc<dyn Fn(Bytes) -> Vec<u8> + Send + Sync>;

/// A fake server: accepts connections and answers each call record with
/// whatever `script` returns (raw bytes, record markers included; empty:
/// no answer). Connections are closed when `close_after_reply` is set.
pub struct FakeServer {
    pub addr: SocketAddr,
    pub accepted: Arc<AtomicUsize>,
    pub received: Arc<Mutex<Vec<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeServer {
    pub async fn start(script: Script, close_after_reply: bool) -> FakeServer {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let accepted = Arc::new(AtomicUsize::new(0));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (a2, r2) = (accepted.clone(), received.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                a2.fetch_add(1, Ordering::SeqCst);
                let script = script.clone();
                let received = r2.clone();
                tokio::spawn(async move {
                    let mut reader = RecordReader::new(64 << 20);
                    let mut buf = vec![0u8; 1 << 16];
                    loop {
                        let n = match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        reader.extend(&buf[..n]);
                        while let Ok(Some(rec)) = reader.next_record() {
                            received.lock().unwrap().push(rec.clone());
                            let out = script(rec);
                            if !out.is_empty() {
                                if s.write_all(&out).await.is_err() {
                                    return;
                                }
                                if close_after_reply {
                                    let _ = s.shutdown().await;
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        FakeServer {
            addr,
            accepted,
            received,
            task,
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The XID of a call record.
pub fn xid_of(rec: &[u8]) -> u32 {
    u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]])
}

/// A record: marker and body.
pub fn record(body: &[u8]) -> Vec<u8> {
    let mut out = marker(body.len() as u32, true).to_vec();
    out.extend_from_slice(body);
    out
}

/// Upper bound used when a test must not hang.
pub const NO_HANG: Duration = Duration::from_secs(60);
