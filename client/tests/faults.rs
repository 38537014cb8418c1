//! Reconnection with retransmission (and the server's duplicate request
//! cache), soft timeouts, and garbage from fake servers: always an error,
//! never a hang or a panic.

mod common;

use bytes::Bytes;
use common::*;
use nfsrdma_client::rpc::{call, Target};
use nfsrdma_client::transport::tcp::{TcpOptions, TcpTransport};
use nfsrdma_client::transport::{ReplyExpect, TransportKind};
use nfsrdma_client::xdr::nfs3::*;
use nfsrdma_client::xdr::portmap;
use nfsrdma_client::xdr::rpc::{AcceptStat, AuthStat, OpaqueAuth, RejectedReply, RpcMessage};
use nfsrdma_client::xdr::Xdr;
use nfsrdma_client::{Client, ClientError, ConnectOptions};
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// The proxy cuts the NFS connection three times while 64 writes and 16
/// MKDIRs are in flight, each time losing a reply the server already
/// sent. Every call still succeeds (reconnect, retransmit with the same
/// XID), the data is all there, no MKDIR ran twice, and the duplicate
/// request cache answered at least one retransmission.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_reconnect_and_retransmit() {
    let s = TestServer::start(EXPORTS);
    let proxy = Proxy::start(s.addr, 3, 10).await;
    let mut o = opts_at(s.addr);
    o.port = Some(proxy.addr.port());
    // A retransmission that reaches the server while the original is still
    // running is dropped by the server; the timer sends it once more.
    o.timeo = Duration::from_secs(2);
    let c = Client::connect(&o, "127.0.0.1", "/export").await.unwrap();
    let fh = c
        .create(c.root(), "f", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap()
        .obj
        .unwrap();
    let mkdirs_before = s.service.metrics().calls(NfsProc3::Mkdir);
    let mut set = JoinSet::new();
    for i in 0..64u64 {
        let (c, fh) = (c.clone(), fh.clone());
        set.spawn(async move {
            c.write(&fh, i * 4096, pattern(100 + i, 4096), StableHow::FileSync)
                .await
                .map(|w| w.count)
        });
    }
    for i in 0..16u64 {
        let c = c.clone();
        set.spawn(async move {
            c.mkdir(c.root(), format!("dir-{i}"), &Sattr3::default())
                .await
                .map(|_| 0)
        });
    }
    let done = tokio::time::timeout(NO_HANG, async {
        let mut n = 0;
        while let Some(r) = set.join_next().await {
            let r = r.unwrap();
            assert!(r.is_ok(), "{r:?}");
            n += 1;
        }
        n
    })
    .await
    .expect("calls completed");
    assert_eq!(done, 80);
    assert_eq!(proxy.cuts.load(Ordering::SeqCst), 0, "all cuts happened");
    let st = c.transport_stats();
    assert!(st.connects >= 4, "{st:?}");
    assert!(st.retransmits >= 1, "{st:?}");
    // No MKDIR ran twice (a second run would have failed with EXIST, and
    // the server counts executions, not cache answers).
    assert_eq!(
        s.service.metrics().calls(NfsProc3::Mkdir) - mkdirs_before,
        16
    );
    assert!(s.service.drc().hits() >= 1);
    // Every acknowledged write is there.
    for i in 0..64u64 {
        let r = c.read(&fh, i * 4096, 4096).await.unwrap();
        assert_eq!(r.data.to_contiguous(), pattern(100 + i, 4096), "block {i}");
    }
    let names: HashSet<String> = c
        .readdir_all(c.root())
        .await
        .unwrap()
        .iter()
        .map(|e| e.name_lossy())
        .collect();
    assert!((0..16).all(|i| names.contains(&format!("dir-{i}"))));
}

fn soft(timeo_ms: u64, retrans: u32) -> TcpOptions {
    TcpOptions {
        timeo: Duration::from_millis(timeo_ms),
        retrans,
        soft: true,
        ..TcpOptions::default()
    }
}

const NULL: Target = Target {
    prog: PROGRAM,
    vers: VERSION,
    proc_: 0,
    name: "NULL",
};

async fn null_call(t: &TcpTransport) -> Result<(), ClientError> {
    call::<_, ()>(t, &OpaqueAuth::none(), NULL, &(), ReplyExpect::small(0)).await
}

/// A server that accepts and reads but never answers: a soft call fails
/// with TimedOut after timeo × (retrans + 1), having sent the call three
/// times with one XID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_mode_times_out_on_a_silent_server() {
    let fake = FakeServer::start(Arc::new(|_| Vec::new()), false).await;
    let t = TcpTransport::connect(fake.addr, soft(200, 2))
        .await
        .unwrap();
    let start = Instant::now();
    let e = tokio::time::timeout(NO_HANG, null_call(&t))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(20));
    // Three transmissions with one XID (the last may still be on its way).
    tokio::time::timeout(NO_HANG, async {
        while fake.received.lock().unwrap().len() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("three transmissions");
    let xids: HashSet<u32> = fake
        .received
        .lock()
        .unwrap()
        .iter()
        .map(|r| xid_of(r))
        .collect();
    assert_eq!(xids.len(), 1);

    // The whole mount fails the same way.
    let o = ConnectOptions {
        soft: true,
        timeo: Duration::from_millis(200),
        retrans: 1,
        ..opts_at(fake.addr)
    };
    let e = tokio::time::timeout(NO_HANG, Client::connect(&o, "127.0.0.1", "/export"))
        .await
        .expect("no hang")
        .unwrap_err();
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
}

/// Hard mode: a call whose first transmission is ignored is answered after
/// the timer resends it, with the same XID.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_mode_retransmits_after_timeo() {
    let seen: Arc<std::sync::Mutex<HashSet<u32>>> = Arc::default();
    let s2 = seen.clone();
    let fake = FakeServer::start(
        Arc::new(move |rec: Bytes| {
            let xid = xid_of(&rec);
            if s2.lock().unwrap().insert(xid) {
                return Vec::new();
            }
            record(&RpcMessage::accepted(xid, AcceptStat::Success).to_bytes())
        }),
        false,
    )
    .await;
    let t = TcpTransport::connect(
        fake.addr,
        TcpOptions {
            timeo: Duration::from_millis(100),
            ..TcpOptions::default()
        },
    )
    .await
    .unwrap();
    tokio::time::timeout(NO_HANG, null_call(&t))
        .await
        .expect("no hang")
        .unwrap();
    let rec = fake.received.lock().unwrap().clone();
    assert!(rec.len() >= 2);
    assert!(rec.iter().all(|r| xid_of(r) == xid_of(&rec[0])));
    assert!(rec.iter().all(|r| r == &rec[0]), "identical retransmission");
    assert!(t.stats().retransmits >= 1);
}

/// Runs one NULL call (soft, short timeo) against a fake server answering
/// with `script`, and returns the error.
async fn against(script: Script, close: bool) -> (ClientError, TcpTransport) {
    let fake = FakeServer::start(script, close).await;
    let t = TcpTransport::connect(fake.addr, soft(300, 1))
        .await
        .unwrap();
    let e = tokio::time::timeout(NO_HANG, null_call(&t))
        .await
        .expect("no hang")
        .expect_err("garbage must not succeed");
    (e, t)
}

fn reply_with(xid: u32, stat: AcceptStat, body: &[u8]) -> Vec<u8> {
    let mut b = RpcMessage::accepted(xid, stat).to_bytes().to_vec();
    b.extend_from_slice(body);
    record(&b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_replies_are_errors() {
    // Random bytes.
    let (e, _) = against(
        Arc::new(|rec: Bytes| pattern(u64::from(xid_of(&rec)), 200).to_vec()),
        false,
    )
    .await;
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");

    // A well-formed reply for an XID nobody asked for.
    let (e, t) = against(
        Arc::new(|rec: Bytes| reply_with(xid_of(&rec) ^ 0x5555, AcceptStat::Success, &[])),
        false,
    )
    .await;
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
    assert!(t.stats().unmatched_replies >= 1);

    // A truncated record, then the connection closes.
    let (e, t) = against(
        Arc::new(|rec: Bytes| {
            let mut v = nfsrdma_client::xdr::record::marker(100, true).to_vec();
            v.extend_from_slice(&rec[..4]);
            v
        }),
        true,
    )
    .await;
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
    assert!(t.stats().connects >= 2, "{:?}", t.stats());

    // A record far larger than the client accepts.
    let (e, _) = against(Arc::new(|_| vec![0xff, 0xff, 0xff, 0xff, 1, 2, 3]), false).await;
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");

    // Records too short for a reply header.
    let (e, _) = against(Arc::new(|_| record(&[1, 2, 3])), false).await;
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");

    // The right XID with an undecodable header.
    let (e, _) = against(
        Arc::new(|rec: Bytes| {
            let mut v = rec[..4].to_vec();
            v.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 7]);
            record(&v)
        }),
        false,
    )
    .await;
    assert!(matches!(e, ClientError::Xdr(_)), "{e}");

    // A call instead of a reply.
    let (e, _) = against(
        Arc::new(|rec: Bytes| {
            record(&RpcMessage::call(xid_of(&rec), 1, 1, 1, OpaqueAuth::none()).to_bytes())
        }),
        false,
    )
    .await;
    assert!(matches!(e, ClientError::Protocol(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_refusals_map_to_variants() {
    let cases: Vec<(RpcMessageKind, Expect)> = vec![
        (RpcMessageKind::Accept(AcceptStat::SystemErr), |e| {
            matches!(e, ClientError::SystemErr)
        }),
        (RpcMessageKind::Accept(AcceptStat::GarbageArgs), |e| {
            matches!(e, ClientError::GarbageArgs)
        }),
        (RpcMessageKind::Accept(AcceptStat::ProgUnavail), |e| {
            matches!(e, ClientError::ProgUnavail { .. })
        }),
        (
            RpcMessageKind::Deny(RejectedReply::RpcMismatch { low: 3, high: 4 }),
            |e| matches!(e, ClientError::RpcMismatch { low: 3, high: 4 }),
        ),
        (
            RpcMessageKind::Deny(RejectedReply::AuthError(AuthStat::RejectedCred)),
            |e| matches!(e, ClientError::AuthError(AuthStat::RejectedCred)),
        ),
    ];
    for (kind, ok) in cases {
        let (e, _) = against(
            Arc::new(move |rec: Bytes| {
                let xid = xid_of(&rec);
                let m = match kind {
                    RpcMessageKind::Accept(s) => RpcMessage::accepted(xid, s),
                    RpcMessageKind::Deny(r) => RpcMessage::denied(xid, r),
                };
                record(&m.to_bytes())
            }),
            false,
        )
        .await;
        assert!(ok(&e), "{kind:?}: {e}");
    }
    // A result that does not decode as the procedure's result.
    let fake = FakeServer::start(
        Arc::new(|rec: Bytes| reply_with(xid_of(&rec), AcceptStat::Success, &[0, 0, 0x30, 0x39])),
        false,
    )
    .await;
    let t = TcpTransport::connect(fake.addr, soft(300, 1))
        .await
        .unwrap();
    let args = Getattr3Args {
        object: NfsFh3::new(Bytes::from_static(b"fh")),
    };
    let target = Target {
        proc_: 1,
        name: "GETATTR",
        ..NULL
    };
    let e = call::<_, Getattr3Res>(
        &t,
        &OpaqueAuth::none(),
        target,
        &args,
        ReplyExpect::small(200),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, ClientError::Xdr(_)), "{e}");
}

type Expect = fn(&ClientError) -> bool;

#[derive(Debug, Clone, Copy)]
enum RpcMessageKind {
    Accept(AcceptStat),
    Deny(RejectedReply),
}

/// The MOUNT port comes from the portmapper when not given.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portmapper_is_asked_for_the_mount_port() {
    let s = TestServer::start(EXPORTS);
    let port = u32::from(s.addr.port());
    let asked = Arc::new(AtomicUsize::new(0));
    let a2 = asked.clone();
    let pmap = FakeServer::start(
        Arc::new(move |rec: Bytes| {
            a2.fetch_add(1, Ordering::SeqCst);
            let (msg, mut d) = nfsrdma_client::xdr::rpc::split_message(rec).unwrap();
            let call = msg.as_call().unwrap();
            assert_eq!((call.prog, call.vers, call.proc_), (100_000, 2, 3));
            let m = portmap::Mapping::decode(&mut d).unwrap();
            let answer = if m.prog == 100_005 && m.vers == 3 && m.prot == 6 {
                port
            } else {
                0
            };
            reply_with(msg.xid, AcceptStat::Success, &answer.to_be_bytes())
        }),
        false,
    )
    .await;
    let o = ConnectOptions {
        mount_port: None,
        portmap_port: pmap.addr.port(),
        ..opts_at(s.addr)
    };
    let c = Client::connect(&o, "127.0.0.1", "/export").await.unwrap();
    c.null().await.unwrap();
    assert_eq!(asked.load(Ordering::SeqCst), 1);

    // Not registered.
    let none = FakeServer::start(
        Arc::new(|rec: Bytes| reply_with(xid_of(&rec), AcceptStat::Success, &[0, 0, 0, 0])),
        false,
    )
    .await;
    let o = ConnectOptions {
        mount_port: None,
        portmap_port: none.addr.port(),
        ..opts_at(s.addr)
    };
    let e = Client::connect(&o, "127.0.0.1", "/export")
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::NotRegistered { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_servers_and_rdma_are_reported() {
    // Nothing listens on this port.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = l.local_addr().unwrap();
    drop(l);
    let e = Client::connect(&opts_at(dead), "127.0.0.1", "/export")
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Connect { .. }), "{e}");
    let e = Client::connect(&opts_at(dead), "no-such-host.invalid", "/export")
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Resolve { .. }), "{e}");
    let o = ConnectOptions {
        transport: TransportKind::Rdma,
        ..opts_at(dead)
    };
    let e = Client::connect(&o, "127.0.0.1", "/export")
        .await
        .unwrap_err();
    // No RDMA device here (or, in the VM, no RDMA listener on 127.0.0.1):
    // an RDMA error at connection time.
    assert!(matches!(e, ClientError::Rdma(_)), "{e}");
    assert!(e.to_string().starts_with("RPC-over-RDMA: "), "{e}");
}

/// Shutting the transport down ends a hard call that would wait forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_waiting_calls() {
    let fake = FakeServer::start(Arc::new(|_| Vec::new()), false).await;
    let t = Arc::new(
        TcpTransport::connect(fake.addr, TcpOptions::default())
            .await
            .unwrap(),
    );
    let t2 = t.clone();
    let waiting = tokio::spawn(async move { null_call(&t2).await });
    tokio::time::timeout(NO_HANG, async {
        while fake.received.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    nfsrdma_client::transport::Transport::shutdown(&*t);
    let e = tokio::time::timeout(NO_HANG, waiting)
        .await
        .expect("no hang")
        .unwrap()
        .unwrap_err();
    assert!(matches!(e, ClientError::Shutdown), "{e}");
    assert!(matches!(null_call(&t).await, Err(ClientError::Shutdown)));
}

/// Soft mode with the server gone: reconnection fails until the call's
/// time is up, then TimedOut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soft_mode_gives_up_when_the_server_is_gone() {
    let s = TestServer::start(EXPORTS);
    let o = ConnectOptions {
        soft: true,
        timeo: Duration::from_millis(300),
        retrans: 1,
        ..opts_at(s.addr)
    };
    let c = Client::connect(&o, "127.0.0.1", "/export").await.unwrap();
    c.null().await.unwrap();
    drop(s);
    let e = tokio::time::timeout(NO_HANG, async {
        // The server closes the connection as it stops; calls fail once
        // no new connection can be made.
        loop {
            match c.getattr(c.root()).await {
                Ok(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => return e,
            }
        }
    })
    .await
    .expect("no hang");
    assert!(matches!(e, ClientError::TimedOut { .. }), "{e}");
}
