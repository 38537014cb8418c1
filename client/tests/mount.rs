//! `nfsrdma mount` (FUSE) against our server over TCP, in-process: the POSIX
//! behaviour suite of `common/mount_suite.rs` (shared with the VM run over
//! RDMA, `tests/vm_mount.rs`), standard tools through the mount, and bad
//! input. Runs as root (mounting FUSE needs it here); /dev/fuse must exist.

mod common;
#[path = "common/mount_suite.rs"]
mod mount_suite;
#[path = "common/posix.rs"]
mod posix;

use common::{opts_at, EXPORTS};
use mount_suite::{self as suite, Server, Target};
use nfsrdma_client::xdr::nfs3::NfsProc3;
use nfsrdma_client::ConnectOptions;
use nfsrdma_server::exports::Exports;
use nfsrdma_server::service::{Export, Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Serves `service` on a new port from its own runtime thread.
fn serve(service: Arc<Service>) -> (SocketAddr, tokio::sync::watch::Sender<bool>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            nfsrdma_server::tcp::TcpServer::new(service, Default::default())
                .serve(l, rx)
                .await;
        });
    });
    (addr, tx)
}

/// A TCP forwarder whose upstream can be switched, or removed (the server
/// "dies"); either cuts the connections made so far. A connection accepted
/// while there is no upstream is closed at once.
struct Relay {
    addr: SocketAddr,
    upstream: Arc<Mutex<Option<SocketAddr>>>,
    conns: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl Relay {
    fn start(upstream: SocketAddr) -> Relay {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let l = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = l.local_addr().unwrap();
        let up = Arc::new(Mutex::new(Some(upstream)));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (up2, conns2) = (up.clone(), conns.clone());
        rt.spawn(async move {
            while let Ok((mut down, _)) = l.accept().await {
                let Some(target) = *up2.lock().unwrap() else {
                    drop(down);
                    continue;
                };
                let h = tokio::spawn(async move {
                    if let Ok(mut up) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                    }
                });
                conns2.lock().unwrap().push(h);
            }
        });
        Relay {
            addr,
            upstream: up,
            conns,
            rt: Some(rt),
        }
    }

    fn switch_to(&self, upstream: Option<SocketAddr>) {
        *self.upstream.lock().unwrap() = upstream;
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.switch_to(None);
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// Our server in-process over TCP on loopback (the read-write `/export`
/// and a read-only `/ro`), mounted directly or through a [`Relay`] (which
/// the restart and kill hooks need).
struct HostTarget {
    /// The stores, which a restarted instance serves again.
    exports: Vec<Export>,
    service: Arc<Service>,
    server_addr: SocketAddr,
    stops: Vec<tokio::sync::watch::Sender<bool>>,
    relay: Option<Relay>,
    /// Calls executed by the instances before the current one.
    past: [u64; 22],
}

impl HostTarget {
    /// The mount talks to the server directly.
    fn start() -> HostTarget {
        let rules = Exports::parse(EXPORTS).unwrap();
        let exports = Service::exports_from_rules(&rules, &StoreConfig::default());
        let service = Arc::new(Service::new(
            Self::same_stores(&exports),
            ServiceConfig::default(),
        ));
        let (server_addr, stop) = serve(service.clone());
        HostTarget {
            exports,
            service,
            server_addr,
            stops: vec![stop],
            relay: None,
            past: [0; 22],
        }
    }

    /// The mount talks to the server through a relay, so that the server
    /// can be restarted or killed under it.
    fn relayed() -> HostTarget {
        let mut t = Self::start();
        t.relay = Some(Relay::start(t.server_addr));
        t
    }

    fn same_stores(exports: &[Export]) -> Vec<Export> {
        exports
            .iter()
            .map(|e| Export {
                path: e.path.clone(),
                rules: e.rules.clone(),
                store: e.store.clone(),
            })
            .collect()
    }

    fn mount_addr(&self) -> SocketAddr {
        self.relay.as_ref().map_or(self.server_addr, |r| r.addr)
    }

    fn relay(&self) -> &Relay {
        self.relay
            .as_ref()
            .expect("restart and kill need HostTarget::relayed()")
    }
}

impl Target for HostTarget {
    fn server(&self) -> Server {
        Server::Ours
    }

    fn host(&self) -> String {
        "127.0.0.1".into()
    }

    fn conn_opts(&self) -> String {
        format!(
            "port={0},mountport={0},uid=0,gid=0",
            self.mount_addr().port()
        )
    }

    fn dead_conn_opts(&self) -> (String, String) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead = l.local_addr().unwrap();
        drop(l);
        (
            format!("port={0},mountport={0},uid=0,gid=0", dead.port()),
            dead.to_string(),
        )
    }

    fn other_client(&self) -> ConnectOptions {
        opts_at(self.server_addr)
    }

    fn calls(&mut self, proc: NfsProc3) -> u64 {
        self.past[proc as usize] + self.service.metrics().calls(proc)
    }

    fn restart_keeping_data(&mut self) {
        self.relay();
        // The write verifier comes from the start time.
        std::thread::sleep(Duration::from_millis(2));
        let next = Arc::new(Service::new(
            Self::same_stores(&self.exports),
            ServiceConfig::default(),
        ));
        assert_ne!(self.service.write_verf(), next.write_verf());
        for p in NfsProc3::ALL {
            self.past[p as usize] += self.service.metrics().calls(p);
        }
        let (addr, stop) = serve(next.clone());
        self.stops.push(stop);
        self.service = next;
        self.server_addr = addr;
        self.relay().switch_to(Some(addr));
    }

    fn kill(&mut self) {
        self.relay().switch_to(None);
    }
}

impl Drop for HostTarget {
    fn drop(&mut self) {
        self.relay.take();
        for s in &self.stops {
            let _ = s.send(true);
        }
    }
}

#[test]
fn posix_suite() {
    suite::posix_suite(&mut HostTarget::start());
}

#[test]
fn readdir_of_10000_entries() {
    suite::readdir_of_10000_entries(&mut HostTarget::start());
}

#[test]
fn large_file_copy_256mib() {
    suite::large_file_copy(&mut HostTarget::start(), 256);
}

#[test]
fn concurrent_writers_to_different_files() {
    suite::concurrent_writers_to_different_files(&mut HostTarget::start());
}

#[test]
fn close_to_open_sees_other_clients_changes() {
    suite::close_to_open_sees_other_clients_changes(&mut HostTarget::start());
}

#[test]
fn standard_tools_through_the_mount() {
    suite::standard_tools_through_the_mount(&mut HostTarget::start());
}

#[test]
fn daemon_mode_and_sigterm() {
    suite::daemon_mode_and_sigterm(&mut HostTarget::start());
}

#[test]
fn bad_input() {
    suite::bad_input(&mut HostTarget::start());
}

#[test]
fn server_dies_mid_copy_soft() {
    suite::server_dies_mid_copy_soft(&mut HostTarget::relayed());
}

#[test]
fn write_verifier_change_resends_uncommitted_data() {
    suite::write_verifier_change_resends_uncommitted_data(&mut HostTarget::relayed());
}

#[test]
fn open_file_survives_unlink_and_replace() {
    suite::open_file_survives_unlink_and_replace(&mut HostTarget::start());
}

#[test]
fn read_only_mount() {
    suite::read_only_mount(&mut HostTarget::start());
}

#[test]
fn noac_mount() {
    suite::noac_mount(&mut HostTarget::start());
}
