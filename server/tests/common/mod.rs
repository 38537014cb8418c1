//! Shared helpers of the server's integration tests: an in-process server
//! on a loopback port and a raw RPC-over-TCP client.
#![allow(dead_code)]

pub mod kernel;
pub mod nfs4;

use bytes::{Bytes, BytesMut};
use nfsrdma_server::exports::Exports;
use nfsrdma_server::service::{Export, Service, ServiceConfig};
use nfsrdma_server::store::StoreConfig;
use nfsrdma_server::tcp::{TcpConfig, TcpServer};
use nfsrdma_xdr::nfs3::{self, Nfs3Args, Nfs3Res, NfsFh3};
use nfsrdma_xdr::record::{marker, RecordReader};
use nfsrdma_xdr::rpc::{AcceptStat, AuthSysParms, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{mount, BoundedVec, Decoder, Xdr};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

pub struct TestServer {
    pub addr: SocketAddr,
    pub service: Arc<Service>,
    pub stats: Arc<nfsrdma_server::tcp::TcpStats>,
    shutdown: tokio::sync::watch::Sender<bool>,
    rt: Option<tokio::runtime::Runtime>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl TestServer {
    pub fn start(exports: &str, tcp: TcpConfig) -> TestServer {
        Self::with_config(exports, tcp, ServiceConfig::default())
    }

    pub fn with_config(exports: &str, tcp: TcpConfig, config: ServiceConfig) -> TestServer {
        let rules = Exports::parse(exports).unwrap();
        let ex = Service::exports_from_rules(&rules, &StoreConfig::default());
        Self::with_exports(ex, tcp, config)
    }

    /// A server of these exports (built by the test, e.g. with its own
    /// block memory).
    pub fn with_exports(ex: Vec<Export>, tcp: TcpConfig, config: ServiceConfig) -> TestServer {
        let service = Arc::new(Service::new(ex, config));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::watch::channel(false);
        let server = TcpServer::new(service.clone(), tcp);
        let stats = server.stats();
        let task = rt.spawn(async move { server.serve(listener, rx).await });
        TestServer {
            addr,
            service,
            stats,
            shutdown: tx,
            rt: Some(rt),
            task: Some(task),
        }
    }

    /// Stops accepting and waits for calls in flight.
    pub fn stop(&mut self) {
        let _ = self.shutdown.send(true);
        if let (Some(rt), Some(task)) = (self.rt.as_ref(), self.task.take()) {
            let _ = rt.block_on(task);
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_timeout(Duration::from_secs(2));
        }
    }
}

pub fn root_cred() -> OpaqueAuth {
    OpaqueAuth::auth_sys(&AuthSysParms {
        stamp: 0,
        machinename: "test".into(),
        uid: 0,
        gid: 0,
        gids: BoundedVec(vec![]),
    })
}

/// A blocking RPC client that speaks raw records.
pub struct RawClient {
    pub s: TcpStream,
    reader: RecordReader,
    pub cred: OpaqueAuth,
    next_xid: u32,
    /// Calls the server made on this connection (its backchannel), in the
    /// order they came.
    pub calls_in: Vec<Bytes>,
    /// How many of `calls_in` [`RawClient::next_call`] returned.
    calls_taken: usize,
    /// Whether calls from the server get a reply: CB_NULL is answered
    /// with success, CB_COMPOUND with `cb_reply`'s result.
    pub answer_calls: bool,
    /// The reply to a CB_COMPOUND (the arguments in): an encoded
    /// CB_COMPOUND4res.
    pub cb_reply: Option<CbReply>,
}

/// Makes the reply to a CB_COMPOUND from its arguments.
pub type CbReply = Box<dyn FnMut(&[u8]) -> Vec<u8> + Send>;

impl RawClient {
    pub fn connect(addr: SocketAddr) -> RawClient {
        let s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.set_nodelay(true).unwrap();
        RawClient {
            s,
            reader: RecordReader::new(64 << 20),
            cred: root_cred(),
            next_xid: 1000,
            calls_in: Vec::new(),
            calls_taken: 0,
            answer_calls: true,
            cb_reply: None,
        }
    }

    pub fn xid(&mut self) -> u32 {
        self.next_xid += 1;
        self.next_xid
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.s.write_all(bytes)
    }

    pub fn send_record(&mut self, rec: &[u8]) -> std::io::Result<()> {
        let mut b = marker(rec.len() as u32, true).to_vec();
        b.extend_from_slice(rec);
        self.s.write_all(&b)
    }

    pub fn call_bytes(&self, xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        RpcMessage::call(xid, prog, vers, proc_, self.cred.clone()).encode(&mut b);
        b.extend_from_slice(args);
        b.freeze()
    }

    /// The next record, `None` when the server closed the connection.
    pub fn recv(&mut self) -> Option<Bytes> {
        loop {
            match self.reader.next_record() {
                Ok(Some(r)) => return Some(r),
                Ok(None) => {}
                Err(e) => panic!("bad record from server: {e}"),
            }
            let mut buf = [0u8; 65536];
            match self.s.read(&mut buf) {
                Ok(0) => return None,
                Ok(n) => self.reader.extend(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next reply, taking the server's calls that come before it (kept
    /// in `calls_in`, answered if `answer_calls`).
    pub fn recv_reply(&mut self) -> Option<Bytes> {
        loop {
            let r = self.recv()?;
            if r.get(4..8) != Some(&[0, 0, 0, 0]) {
                return Some(r);
            }
            self.calls_in.push(r.clone());
            if self.answer_calls {
                self.answer(&r);
            }
        }
    }

    /// Answers a call of the server's.
    pub fn answer(&mut self, call: &Bytes) {
        let mut d = Decoder::new(call.clone());
        let h = RpcMessage::decode(&mut d).unwrap();
        let proc_ = h.as_call().expect("a call").proc_;
        let mut b = BytesMut::new();
        RpcMessage::accepted(h.xid, AcceptStat::Success).encode(&mut b);
        if proc_ == 1 {
            let args = d.into_rest();
            let f = self.cb_reply.as_mut().expect("a CB_COMPOUND answer");
            b.extend_from_slice(&f(&args));
        }
        self.send_record(&b).unwrap();
    }

    /// The server's next call not returned before (answered if
    /// `answer_calls`, perhaps already while waiting for a reply); `None`
    /// if none comes within `within`.
    pub fn next_call(&mut self, within: Duration) -> Option<Bytes> {
        self.s.set_read_timeout(Some(within)).unwrap();
        let got = loop {
            if let Some(c) = self.calls_in.get(self.calls_taken) {
                self.calls_taken += 1;
                break Some(c.clone());
            }
            match self.reader.next_record() {
                Ok(Some(r)) if r.get(4..8) == Some(&[0, 0, 0, 0]) => {
                    self.calls_in.push(r.clone());
                    if self.answer_calls {
                        self.answer(&r);
                    }
                }
                Ok(Some(r)) => panic!("a reply to no call: {} bytes", r.len()),
                Ok(None) => {
                    let mut buf = [0u8; 65536];
                    match self.s.read(&mut buf) {
                        Ok(0) => break None,
                        Ok(n) => self.reader.extend(&buf[..n]),
                        Err(e)
                            if matches!(
                                e.kind(),
                                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                            ) =>
                        {
                            break None
                        }
                        Err(e) => panic!("read: {e}"),
                    }
                }
                Err(e) => panic!("bad record from server: {e}"),
            }
        };
        self.s
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        got
    }

    /// Sends a call and returns the reply header and the decoder at its
    /// results.
    pub fn call(&mut self, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> (RpcMessage, Decoder) {
        let xid = self.xid();
        let c = self.call_bytes(xid, prog, vers, proc_, args);
        self.send_record(&c).unwrap();
        let r = self.recv_reply().expect("reply");
        let mut d = Decoder::new(r);
        let h = RpcMessage::decode(&mut d).unwrap();
        assert_eq!(h.xid, xid);
        (h, d)
    }

    pub fn nfs(&mut self, args: Nfs3Args) -> Nfs3Res {
        let mut a = BytesMut::new();
        args.encode(&mut a);
        let (h, mut d) = self.call(nfs3::PROGRAM, 3, args.proc_() as u32, &a);
        assert_success(&h);
        Nfs3Res::decode(args.proc_(), &mut d).unwrap()
    }

    pub fn mount(&mut self, path: &str) -> NfsFh3 {
        let mut a = BytesMut::new();
        mount::DirPath::new(path.as_bytes().to_vec()).encode(&mut a);
        let (h, mut d) = self.call(mount::PROGRAM, 3, mount::proc_::MNT, &a);
        assert_success(&h);
        match mount::MountRes3::decode(&mut d).unwrap() {
            mount::MountRes3::Ok(ok) => NfsFh3(ok.fhandle.0),
            mount::MountRes3::Err(e) => panic!("mount {path}: {e:?}"),
        }
    }

    /// CREATE (unchecked, no attributes set) of `name` in `dir`: its handle.
    pub fn create(&mut self, dir: &NfsFh3, name: &str) -> NfsFh3 {
        match self.nfs(Nfs3Args::Create(nfs3::Create3Args {
            where_: nfs3::DirOpArgs3 {
                dir: dir.clone(),
                name: nfs3::Filename3::new(name.as_bytes().to_vec()),
            },
            how: nfs3::CreateHow3::Unchecked(nfs3::Sattr3::default()),
        })) {
            Nfs3Res::Create(nfs3::NfsResult::Ok(ok)) => ok.obj.expect("a handle"),
            r => panic!("CREATE {name}: {r:?}"),
        }
    }
}

/// Asserts that the server's metrics exposition has each of `lines`.
pub fn assert_metrics(service: &Arc<Service>, lines: &[&str]) {
    let metrics = nfsrdma_server::exporter::Sources {
        service: service.clone(),
        tcp: None,
        rdma: None,
    }
    .render();
    for line in lines {
        assert!(metrics.lines().any(|l| l == *line), "{line} in\n{metrics}");
    }
}

pub fn accept_stat(h: &RpcMessage) -> Option<AcceptStat> {
    match h.as_reply() {
        Some(ReplyBody::Accepted(a)) => Some(a.stat),
        _ => None,
    }
}

pub fn assert_success(h: &RpcMessage) {
    assert_eq!(accept_stat(h), Some(AcceptStat::Success), "{h:?}");
}

/// nfsrdmad exporting /export on a free loopback port, with `args`.
pub fn nfsrdmad(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_nfsrdmad"));
    c.args([
        "--export",
        "/export",
        "--tcp",
        "127.0.0.1:0",
        "--no-rpcbind",
    ])
    .args(args);
    c
}

/// nfsrdmad with `args`, running: the child and the TCP address it printed.
pub fn serving(
    args: &[&str],
    stderr: std::process::Stdio,
) -> (std::process::Child, std::net::SocketAddr) {
    use std::io::BufRead;
    let mut child = nfsrdmad(args)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start nfsrdmad");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("read stdout");
    let addr = line
        .trim()
        .rsplit(' ')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (child, addr)
}

/// Stops nfsrdmad as an administrator would (SIGTERM: it saves its state).
pub fn stop_daemon(mut child: std::process::Child) {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok);
    let st = child.wait().expect("wait");
    assert!(st.success(), "nfsrdmad exited with {st}");
}
