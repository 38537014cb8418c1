//! Our server with NFS over RPC-over-RDMA on the Soft-RoCE address (and
//! MOUNT and NFS over TCP on the same address), in-process, for the tests
//! that run in the VM.

use super::{root, EXPORTS};
use nfsrdma_client::{Client, ConnectOptions, RdmaOptions, TransportKind};
use nfsrdma_server::exports::Exports;
use nfsrdma_server::rdma::{RdmaConfig, RdmaDevice, RdmaListener, RdmaStats};
use nfsrdma_server::service::{Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_server::tcp::{TcpConfig, TcpServer};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// The guest's RDMA address (`NFSRDMA_RDMA_ADDR`, set by the VM harness).
pub fn rdma_ip() -> IpAddr {
    std::env::var("NFSRDMA_RDMA_ADDR")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| "10.99.0.1".parse().unwrap())
}

/// Sends warnings (of the client and of an in-process server: a dropped
/// connection says why) to the test's output, or what `RUST_LOG` asks for,
/// so that a failure shows its cause.
pub fn log_warnings() {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}

/// Our server: NFS over RDMA on the rxe address, MOUNT (and NFS) over TCP.
pub struct RdmaServer {
    /// MOUNT and NFS over TCP.
    pub tcp: SocketAddr,
    /// NFS over RDMA.
    pub rdma_port: u16,
    listener: Option<Arc<RdmaListener>>,
    shutdown: tokio::sync::watch::Sender<bool>,
    /// The service both transports feed.
    pub service: Arc<Service>,
    dev: Arc<RdmaDevice>,
}

impl RdmaServer {
    /// Starts both listeners on ephemeral ports of the RDMA address.
    pub fn start() -> RdmaServer {
        RdmaServer::start_with(EXPORTS)
    }

    /// [`RdmaServer::start`] with these exports.
    pub fn start_with(exports: &str) -> RdmaServer {
        log_warnings();
        let ip = rdma_ip();
        let dev = RdmaDevice::open(SocketAddr::new(ip, 0), 1 << 30).expect("RDMA device");
        let rules = Exports::parse(exports).expect("exports");
        let ex = Service::exports_from_rules_with(&rules, &StoreConfig::default(), &|| {
            dev.block_source()
        });
        let service = Arc::new(Service::new(ex, ServiceConfig::default()));
        let listener = RdmaListener::start(
            service.clone(),
            RdmaConfig {
                addr: SocketAddr::new(ip, 0),
                ..RdmaConfig::default()
            },
            dev.clone(),
        )
        .expect("RDMA listener");
        let svc = service.clone();
        let tcp = std::net::TcpListener::bind(SocketAddr::new(ip, 0)).expect("bind");
        tcp.set_nonblocking(true).expect("nonblocking");
        let addr = tcp.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::watch::channel(false);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(tcp).expect("listener");
                TcpServer::new(svc, TcpConfig::default()).serve(l, rx).await;
            });
        });
        RdmaServer {
            tcp: addr,
            rdma_port: listener.port(),
            listener: Some(Arc::new(listener)),
            shutdown: tx,
            service,
            dev,
        }
    }

    /// The RDMA listener (to disconnect its connections from elsewhere).
    pub fn listener(&self) -> Arc<RdmaListener> {
        self.listener.clone().expect("running")
    }

    /// Stops the RDMA listener (which disconnects every connection) and
    /// starts a new one on the same port, with the same files.
    pub fn restart_rdma(&mut self) {
        if let Some(l) = self.listener.take() {
            let mut l =
                Arc::try_unwrap(l).unwrap_or_else(|_| panic!("the RDMA listener is still shared"));
            l.stop();
        }
        let addr = SocketAddr::new(rdma_ip(), self.rdma_port);
        let mut tries = 0;
        let l = loop {
            match RdmaListener::start(
                self.service.clone(),
                RdmaConfig {
                    addr,
                    ..RdmaConfig::default()
                },
                self.dev.clone(),
            ) {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    println!("listener restart: {e}");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("restarting the RDMA listener: {e}"),
            }
        };
        self.listener = Some(Arc::new(l));
    }

    /// The RDMA listener's counters.
    pub fn stats(&self) -> Arc<RdmaStats> {
        self.listener().stats()
    }

    /// Client options for NFS over RDMA here, as root.
    pub fn opts(&self, rdma: RdmaOptions) -> ConnectOptions {
        ConnectOptions {
            transport: TransportKind::Rdma,
            port: Some(self.rdma_port),
            mount_port: Some(self.tcp.port()),
            auth: root(),
            // An upper bound only: a dropped connection is noticed from the
            // connection manager's event, not from a call timing out.
            timeo: Duration::from_secs(30),
            rdma,
            ..ConnectOptions::default()
        }
    }

    /// A client of `/export` over RDMA.
    pub async fn connect(&self, rdma: RdmaOptions) -> Client {
        self.connect_to("/export", rdma).await
    }

    /// A client of `export` over RDMA.
    pub async fn connect_to(&self, export: &str, rdma: RdmaOptions) -> Client {
        Client::connect(&self.opts(rdma), &rdma_ip().to_string(), export)
            .await
            .expect("connect over RDMA")
    }
}

impl Drop for RdmaServer {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(l) = self.listener.take() {
            if let Ok(mut l) = Arc::try_unwrap(l) {
                l.stop();
            }
        }
    }
}
