//! A rogue RPC-over-RDMA responder against the client's RDMA transport, in
//! the Soft-RoCE VM (`scripts/test-vm -- rogue_responder`).
//!
//! The responder is built directly on the verbs layer: it listens, accepts
//! the client's connection with an RFC 8797 message, and answers each call
//! the way the case says. The client is the library's RDMA transport,
//! making NULL calls that offer a Write chunk (so that each call registers
//! memory the responder can reach by rkey) or plain NULL calls. Each case
//! checks what the client must do:
//!
//! - memory of a completed call is fenced: an RDMA Write to its rkey fails
//!   at the responder (remote access error), for every registration mode
//!   that fences (memory windows invalidated locally or by Send With
//!   Invalidate, and a region per RPC), although the same Write succeeded
//!   while the call was outstanding;
//! - a reply with an XID no call has is dropped and counted; the call it
//!   did not answer still completes;
//! - a grant of zero credits is read as one: calls go one at a time and
//!   all complete;
//! - Send With Invalidate naming another call's rkey drops the connection
//!   (that call's memory is not taken as free); the client reconnects and
//!   both calls complete on the new connection;
//! - a reply whose header has another version, or an RDMA_ERROR, fails the
//!   call with an error that says so.
//!
//! Ignored on the host (no RDMA device).

mod common;

use bytes::{Bytes, BytesMut};
use common::rdma::rdma_ip;
use nfsrdma_client::transport::rdma::{RdmaTransport, RdmaTransportOptions};
use nfsrdma_client::transport::{ReplyExpect, RpcCall, Transport};
use nfsrdma_client::{ClientError, PollMode, RdmaOptions, RegStrategy};
use nfsrdma_transport::rdma::verbs::{
    Access, CmEvent, CmEventKind, CmId, CompletionError, CompletionQueue, ConnParam, EventChannel,
    MemoryRegion, ProtectionDomain, QpCaps, QueuePair, RemoteBuf, SendFlags, SendOp, VerbsError,
    WorkCompletion,
};
use nfsrdma_xdr::rpc::{AcceptStat, OpaqueAuth, RpcMessage};
use nfsrdma_xdr::rpcrdma::{
    ChunkLists, CmPrivate, RdmaBody, RdmaError, RdmaHeader, RdmaSegment, WriteChunk,
};
use nfsrdma_xdr::{Decoder, List, Xdr, XdrSink};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Upper bound for anything to happen (TCG is slow); never a pass/fail
/// criterion by itself except as "it never happened".
const T: Duration = Duration::from_secs(30);
/// Our inline threshold both ways, as the client's default.
const INLINE: usize = 4096;
/// Receive buffers (the client asks for 32 credits).
const RECV_SLOTS: usize = 40;
const SEND_SLOTS: usize = 16;
/// The Write chunk each "chunked" call offers, and our source buffer.
const CHUNK: u32 = 8192;
const WR_RECV: u64 = 1 << 32;
const WR_SEND: u64 = 2 << 32;
const WR_WRITE: u64 = 3 << 32;
const NFS_PROGRAM: u32 = 100_003;
/// Upper bound for the client's side of a case.
const CLIENT_LIMIT: Duration = Duration::from_secs(150);

fn in_vm() {
    // RUST_LOG=nfsrdma_client=debug shows what the client did.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    assert_eq!(
        std::env::var("NFSRDMA_VM").as_deref(),
        Ok("1"),
        "this test runs in the Soft-RoCE VM: scripts/test-vm"
    );
}

// ---- the rogue responder ---------------------------------------------------

/// A listening rogue responder.
struct Rogue {
    ch: Arc<EventChannel>,
    _listen: CmId,
    port: u16,
    /// Events a connection's poll took that were not its own (a new
    /// connection request arriving meanwhile), for `accept`.
    stash: Stash,
}

type Stash = Arc<std::sync::Mutex<VecDeque<CmEvent>>>;

/// A call as the rogue sees it.
#[derive(Debug)]
struct Call {
    xid: u32,
    /// Segments of the first Write chunk offered, if any.
    write: Vec<RdmaSegment>,
}

/// What the connection gave next.
#[derive(Debug)]
enum Next {
    Msg(Bytes),
    Dropped,
    Nothing,
}

/// One accepted connection.
struct Conn {
    ch: Arc<EventChannel>,
    stash: Stash,
    id: CmId,
    cq: Arc<CompletionQueue>,
    qp: Arc<QueuePair>,
    recv_mr: Arc<MemoryRegion>,
    send_mr: Arc<MemoryRegion>,
    /// Source of the rogue's RDMA Writes.
    src: Arc<MemoryRegion>,
    inbox: VecDeque<Bytes>,
    failed: Vec<WorkCompletion>,
    writes: Vec<WorkCompletion>,
    disconnected: bool,
    sends_out: usize,
    next_slot: usize,
}

impl Rogue {
    fn listen() -> Rogue {
        let ch = EventChannel::new().expect("event channel");
        let id = CmId::new(&ch).expect("cm id");
        id.bind_addr(SocketAddr::new(rdma_ip(), 0))
            .expect("bind (run with scripts/test-vm)");
        id.listen(4).expect("listen");
        let port = id.local_port();
        Rogue {
            ch,
            _listen: id,
            port,
            stash: Stash::default(),
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::new(rdma_ip(), self.port)
    }

    /// Waits for a connection request and accepts it (4 KiB inline both
    /// ways; a responder has no use for remote invalidation itself).
    fn accept(&self) -> Conn {
        let deadline = Instant::now() + T;
        let req = loop {
            let stashed = self.stash.lock().unwrap().pop_front();
            let ev = match stashed {
                Some(ev) => Ok(ev),
                None => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    assert!(!left.is_zero(), "no connection request");
                    self.ch.get_event(Some(left))
                }
            };
            match ev {
                Ok(ev) if ev.kind == CmEventKind::ConnectRequest => {
                    break ev.into_request().expect("request")
                }
                Ok(_) | Err(VerbsError::Timeout { .. }) => {}
                Err(e) => panic!("connection manager: {e}"),
            }
        };
        let theirs = CmPrivate::from_peer(Some(&req.param.private_data));
        assert_eq!(theirs.recv_size, INLINE as u32, "{theirs:?}");
        let ctx = req.id.context().expect("context");
        let pd = ProtectionDomain::new(&ctx).expect("pd");
        let cq = CompletionQueue::new(&ctx, 256, None).expect("cq");
        let qp = req
            .id
            .create_qp(
                &pd,
                &cq,
                &cq,
                QpCaps {
                    max_send_wr: 64,
                    max_recv_wr: RECV_SLOTS as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
            )
            .expect("qp");
        let recv_mr = MemoryRegion::new(&pd, RECV_SLOTS * INLINE, Access::LOCAL).expect("mr");
        let send_mr = MemoryRegion::new(&pd, SEND_SLOTS * INLINE, Access::LOCAL).expect("mr");
        let src = MemoryRegion::new(&pd, CHUNK as usize, Access::LOCAL).expect("mr");
        src.write_at(0, &[0x5a; CHUNK as usize]).unwrap();
        for slot in 0..RECV_SLOTS {
            let sge = recv_mr.sge(slot * INLINE, INLINE).unwrap();
            qp.post_recv_one(WR_RECV | slot as u64, &[sge])
                .expect("post recv");
        }
        let depth = req.param.initiator_depth.clamp(1, 4);
        req.id
            .accept(&ConnParam {
                private_data: CmPrivate {
                    remote_invalidation: false,
                    send_size: INLINE as u32,
                    recv_size: INLINE as u32,
                }
                .encode()
                .to_vec(),
                responder_resources: depth,
                initiator_depth: depth,
                ..ConnParam::default()
            })
            .expect("accept");
        let deadline = Instant::now() + T;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "connection never established");
            match self.ch.get_event(Some(left)) {
                Ok(ev) if ev.id != req.id.handle() => self.stash.lock().unwrap().push_back(ev),
                Ok(ev) if ev.kind == CmEventKind::Established => break,
                Ok(_) | Err(VerbsError::Timeout { .. }) => {}
                Err(e) => panic!("connection manager: {e}"),
            }
        }
        Conn {
            ch: self.ch.clone(),
            stash: self.stash.clone(),
            id: req.id,
            cq,
            qp,
            recv_mr,
            send_mr,
            src,
            inbox: VecDeque::new(),
            failed: Vec::new(),
            writes: Vec::new(),
            disconnected: false,
            sends_out: 0,
            next_slot: 0,
        }
    }
}

impl Conn {
    fn poll(&mut self) {
        let mut wcs = Vec::new();
        self.cq.poll(&mut wcs, 64).expect("poll cq");
        for wc in wcs {
            let kind = wc.wr_id & !0xffff_ffff;
            if kind == WR_SEND {
                self.sends_out -= 1;
            }
            if kind == WR_WRITE {
                self.writes.push(wc);
                continue;
            }
            if wc.status.is_err() {
                self.failed.push(wc);
                continue;
            }
            if kind == WR_RECV {
                let off = (wc.wr_id & 0xffff_ffff) as usize * INLINE;
                let msg = self.recv_mr.to_vec(off, wc.byte_len as usize).unwrap();
                let sge = self.recv_mr.sge(off, INLINE).unwrap();
                self.qp.post_recv_one(wc.wr_id, &[sge]).expect("repost");
                self.inbox.push_back(Bytes::from(msg));
            }
        }
        match self.ch.get_event(Some(Duration::ZERO)) {
            Ok(ev) if ev.id != self.id.handle() => self.stash.lock().unwrap().push_back(ev),
            Ok(ev) if ev.kind == CmEventKind::Disconnected => self.disconnected = true,
            Ok(_) | Err(VerbsError::Timeout { .. }) => {}
            Err(e) => panic!("connection manager: {e}"),
        }
    }

    fn dropped(&self) -> bool {
        self.disconnected || !self.failed.is_empty()
    }

    /// The next message, or the connection dropping, within `wait`.
    fn next_within(&mut self, wait: Duration) -> Next {
        let deadline = Instant::now() + wait;
        loop {
            self.poll();
            if let Some(m) = self.inbox.pop_front() {
                return Next::Msg(m);
            }
            if self.dropped() {
                return Next::Dropped;
            }
            if Instant::now() >= deadline {
                return Next::Nothing;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The next call (the connection must stay up).
    fn call(&mut self) -> Call {
        match self.next_within(T) {
            Next::Msg(m) => parse_call(m),
            other => panic!("expected a call, got {other:?} ({:?})", self.failed),
        }
    }

    /// Waits until the connection drops; returns whether it did.
    fn wait_dropped(&mut self) -> bool {
        loop {
            match self.next_within(T) {
                Next::Dropped => return true,
                Next::Nothing => return false,
                Next::Msg(_) => {}
            }
        }
    }

    fn post_send(&mut self, bytes: &[u8], invalidate: Option<u32>) {
        assert!(bytes.len() <= INLINE);
        let deadline = Instant::now() + T;
        while self.sends_out >= SEND_SLOTS {
            self.poll();
            assert!(!self.dropped(), "connection dropped: {:?}", self.failed);
            assert!(Instant::now() < deadline, "sends never completed");
        }
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % SEND_SLOTS;
        let off = slot * INLINE;
        self.send_mr.write_at(off, bytes).unwrap();
        let sge = self.send_mr.sge(off, bytes.len()).unwrap();
        let sges = [sge];
        let op = match invalidate {
            Some(rkey) => SendOp::SendWithInv {
                sges: &sges,
                invalidate_rkey: rkey,
            },
            None => SendOp::Send { sges: &sges },
        };
        self.qp
            .post_send_one(WR_SEND | slot as u64, op, SendFlags::SIGNALED)
            .expect("post send");
        self.sends_out += 1;
    }

    /// An RDMA Write of `len` bytes to `seg`'s start; returns how it
    /// completed.
    fn write_to(&mut self, seg: &RdmaSegment, len: u32) -> Result<(), CompletionError> {
        let sge = self.src.sge(0, len as usize).unwrap();
        let before = self.writes.len();
        self.qp
            .post_send_one(
                WR_WRITE,
                SendOp::RdmaWrite {
                    sges: &[sge],
                    remote: RemoteBuf {
                        addr: seg.offset,
                        len,
                        rkey: seg.handle,
                    },
                },
                SendFlags::SIGNALED,
            )
            .expect("post RDMA Write");
        let deadline = Instant::now() + T;
        while self.writes.len() == before {
            self.poll();
            assert!(Instant::now() < deadline, "the RDMA Write never completed");
            std::thread::sleep(Duration::from_millis(1));
        }
        self.writes[before].status
    }

    /// Answers a NULL call: success, granting `credit`, echoing the Write
    /// chunk with nothing written.
    fn reply(&mut self, call: &Call, credit: u32, invalidate: Option<u32>) {
        self.post_send(&null_reply(call, call.xid, credit, 1), invalidate);
    }
}

fn parse_call(m: Bytes) -> Call {
    let mut d = Decoder::new(m.clone());
    let h = RdmaHeader::decode(&mut d)
        .unwrap_or_else(|e| panic!("bad call header from the client ({e}): {m:02x?}"));
    let lists = match h.body {
        RdmaBody::Msg(l) => l,
        other => panic!("expected RDMA_MSG, got {other:?}"),
    };
    let write = lists
        .write_list
        .0
        .first()
        .map(|w| w.segments.0.clone())
        .unwrap_or_default();
    let msg = RpcMessage::decode(&mut d).expect("RPC call");
    assert_eq!(msg.xid, h.xid, "transport and RPC XIDs differ");
    Call { xid: h.xid, write }
}

/// An RDMA_MSG reply (transport version `vers`) to a NULL call, with XID
/// `xid`, echoing the call's Write chunk with nothing written.
fn null_reply(call: &Call, xid: u32, credit: u32, vers: u32) -> Vec<u8> {
    let echo: Vec<WriteChunk> = if call.write.is_empty() {
        Vec::new()
    } else {
        vec![WriteChunk::new(
            call.write
                .iter()
                .map(|s| RdmaSegment { length: 0, ..*s })
                .collect(),
        )]
    };
    let mut b = BytesMut::new();
    RdmaHeader {
        xid,
        vers: 1,
        credit,
        body: RdmaBody::Msg(ChunkLists {
            read_list: List(vec![]),
            write_list: List(echo),
            reply_chunk: None,
        }),
    }
    .encode(&mut b);
    if vers != 1 {
        b[4..8].copy_from_slice(&vers.to_be_bytes());
    }
    RpcMessage::accepted(xid, AcceptStat::Success).encode(&mut b);
    b.to_vec()
}

fn rdma_error(xid: u32, credit: u32, error: RdmaError) -> Vec<u8> {
    RdmaHeader {
        xid,
        vers: 1,
        credit,
        body: RdmaBody::Error(error),
    }
    .to_bytes()
    .to_vec()
}

// ---- the client ------------------------------------------------------------

fn client_opts(reg: RegStrategy, remote_inv: bool) -> RdmaTransportOptions {
    RdmaTransportOptions {
        rdma: RdmaOptions {
            reg,
            remote_inv,
            poll: PollMode::default(),
            ..RdmaOptions::default()
        },
        timeo: Duration::from_secs(60),
        ..RdmaTransportOptions::default()
    }
}

/// A NULL call; with `chunk`, the reply may carry up to `CHUNK` bytes of
/// DDP data, so the call offers a Write chunk (registered memory).
async fn null(t: &RdmaTransport, chunk: bool) -> Result<(), ClientError> {
    let cred = OpaqueAuth::none();
    let encode = |_: &mut dyn XdrSink| {};
    let expect = if chunk {
        ReplyExpect::with_ddp(0, CHUNK)
    } else {
        ReplyExpect::small(0)
    };
    t.call(RpcCall {
        prog: NFS_PROGRAM,
        vers: 3,
        proc_: 0,
        name: "NFS NULL",
        cred: &cred,
        args: &encode,
        expect,
    })
    .await
    .map(|_| ())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Each side's end of a two-way signal between the rogue's thread and the
/// client's task. A side that ends drops its end, which wakes the other.
struct Link {
    tx: UnboundedSender<()>,
    rx: UnboundedReceiver<()>,
}

impl Link {
    fn pair() -> (Link, Link) {
        let (a_tx, a_rx) = unbounded_channel();
        let (b_tx, b_rx) = unbounded_channel();
        (Link { tx: a_tx, rx: b_rx }, Link { tx: b_tx, rx: a_rx })
    }

    fn signal(&self) {
        let _ = self.tx.send(());
    }

    /// The rogue's side: waits for the client's signal; false if the
    /// client ended without sending it.
    fn wait_blocking(&mut self) -> bool {
        self.rx.blocking_recv().is_some()
    }

    /// The client's side.
    async fn wait(&mut self) -> bool {
        self.rx.recv().await.is_some()
    }
}

/// Runs `rogue` on its own thread against a listener, and `client` with a
/// transport connected to it; returns both results.
fn run_case<R: Send + 'static, F: std::future::Future>(
    opts: RdmaTransportOptions,
    rogue: impl FnOnce(Rogue, Link) -> R + Send + 'static,
    client: impl FnOnce(Arc<RdmaTransport>, Link) -> F,
) -> (R, F::Output) {
    let l = Rogue::listen();
    let addr = l.addr();
    let (ours, theirs) = Link::pair();
    let h = std::thread::spawn(move || rogue(l, theirs));
    let rt = runtime();
    let c = rt.block_on(async move {
        let t = Arc::new(
            RdmaTransport::connect(addr, opts)
                .await
                .expect("connect to the rogue responder"),
        );
        // Bounded, so that a rogue that gave up (and panicked) cannot
        // leave the client waiting for ever: its panic is what the test
        // then reports.
        let out = tokio::time::timeout(CLIENT_LIMIT, client(t.clone(), ours)).await;
        t.shutdown();
        out.map_err(|_| t.stats())
    });
    // A reconnection the client started after the rogue broke the
    // connection must not hold the test.
    rt.shutdown_timeout(Duration::from_secs(5));
    // The rogue's own panic message is on stderr already; this says how
    // the client ended beside it.
    match (h.join(), c) {
        (Ok(r), Ok(c)) => (r, c),
        (Err(_), Ok(_)) => panic!("the rogue responder panicked"),
        (rogue, Err(stats)) => panic!(
            "the client did not finish in {CLIENT_LIMIT:?} (the rogue {}); \
             its transport's counters: {stats:?}",
            if rogue.is_ok() {
                "returned"
            } else {
                "panicked"
            }
        ),
    }
}

// ---- cases -----------------------------------------------------------------

/// The memory of a completed call is fenced: a Write to its rkey fails.
fn completed_calls_memory_is_fenced(reg: RegStrategy, remote_inv: bool) {
    in_vm();
    let (rogue, (result, stats)) = run_case(
        client_opts(reg, remote_inv),
        move |l, mut link| {
            let mut c = l.accept();
            let call = c.call();
            assert_eq!(call.write.len(), 1, "one Write chunk segment: {call:?}");
            let seg = call.write[0];
            assert!(seg.length >= CHUNK, "{seg:?}");
            // While the call is outstanding its memory is open to us.
            let during = c.write_to(&seg, 64);
            // Answer; with remote invalidation, invalidate its only rkey.
            c.reply(&call, 8, remote_inv.then_some(seg.handle));
            // The client says the call completed.
            assert!(link.wait_blocking(), "the call never completed");
            let after = c.write_to(&seg, 64);
            link.signal();
            (during, after)
        },
        |t, mut link| async move {
            let r = null(&t, true).await;
            link.signal();
            // Stay connected until the rogue has tried its Write.
            link.wait().await;
            (r, t.stats())
        },
    );
    let (during, after) = rogue;
    result.expect("the call");
    assert_eq!(
        during,
        Ok(()),
        "the Write chunk was not writable during the call"
    );
    assert_eq!(
        after,
        Err(CompletionError::RemoteAccess),
        "a completed call's memory is still writable ({reg:?}, remote_inv {remote_inv})"
    );
    match (reg, remote_inv) {
        (RegStrategy::Mw, true) => {
            assert_eq!(stats.send_with_invalidate, 1, "{stats:?}");
            assert_eq!(stats.local_invalidations, 0, "{stats:?}");
        }
        (RegStrategy::Mw, false) => {
            assert_eq!(stats.send_with_invalidate, 0, "{stats:?}");
            assert_eq!(stats.local_invalidations, 1, "{stats:?}");
        }
        _ => assert_eq!(stats.mr_registrations, 1, "{stats:?}"),
    }
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_write_after_completion_fails_mw_local_invalidation() {
    completed_calls_memory_is_fenced(RegStrategy::Mw, false);
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_write_after_completion_fails_mw_remote_invalidation() {
    completed_calls_memory_is_fenced(RegStrategy::Mw, true);
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_write_after_completion_fails_region_per_rpc() {
    completed_calls_memory_is_fenced(RegStrategy::RegMr, false);
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_reply_with_unknown_xid_is_dropped() {
    in_vm();
    let (kept, (r, stats)) = run_case(
        client_opts(RegStrategy::Mw, true),
        |l, mut link| {
            let mut c = l.accept();
            let call = c.call();
            // A reply to no call, then the right one.
            let stray = null_reply(&call, call.xid ^ 0x00ff_0000, 8, 1);
            c.post_send(&stray, None);
            c.reply(&call, 8, None);
            // When the call has completed the connection is still up.
            assert!(link.wait_blocking(), "the call never completed");
            c.poll();
            let kept = !c.dropped();
            link.signal();
            kept
        },
        |t, mut link| async move {
            let r = null(&t, false).await;
            link.signal();
            link.wait().await;
            (r, t.stats())
        },
    );
    assert!(kept, "the stray reply broke the connection");
    r.expect("the call survives a stray reply");
    assert_eq!(stats.unmatched_replies, 1, "{stats:?}");
    assert_eq!(stats.connects, 1, "{stats:?}");
    assert_eq!(stats.retransmits, 0, "{stats:?}");
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_zero_credits_mean_one_call_at_a_time() {
    in_vm();
    const CALLS: usize = 6;
    let (most, (results, stats)) = run_case(
        client_opts(RegStrategy::Mw, true),
        |l, mut link| {
            let mut c = l.accept();
            let mut most = 0;
            for _ in 0..CALLS {
                let call = c.call();
                // With no credit granted, no second call may arrive while
                // this one is unanswered.
                let mut outstanding = 1;
                if let Next::Msg(m) = c.next_within(Duration::from_millis(300)) {
                    c.inbox.push_front(m);
                    outstanding += 1;
                }
                most = most.max(outstanding);
                c.reply(&call, 0, None);
            }
            // Connected until the client has every reply (a connection
            // torn down at once may flush the last reply's Send).
            assert!(link.wait_blocking(), "the client never finished");
            most
        },
        |t, link| async move {
            let calls = (0..CALLS).map(|_| {
                let t = t.clone();
                tokio::spawn(async move { null(&t, false).await })
            });
            let mut out = Vec::new();
            for c in calls.collect::<Vec<_>>() {
                out.push(c.await.unwrap());
            }
            link.signal();
            (out, t.stats())
        },
    );
    for r in results {
        r.expect("a call under zero credits");
    }
    assert_eq!(most, 1, "more calls than the one credit in flight");
    assert_eq!(stats.connects, 1, "{stats:?}");
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_send_with_invalidate_of_another_calls_rkey_drops_the_connection() {
    in_vm();
    let (dropped, (results, stats)) = run_case(
        client_opts(RegStrategy::Mw, true),
        |l, mut link| {
            let mut c = l.accept();
            // A first call raises the client's credits.
            let warm = c.call();
            c.reply(&warm, 16, None);
            let a = c.call();
            let b = c.call();
            assert_eq!((a.write.len(), b.write.len()), (1, 1), "{a:?} {b:?}");
            assert_ne!(a.write[0].handle, b.write[0].handle);
            // Answer A, invalidating B's memory.
            c.reply(&a, 16, Some(b.write[0].handle));
            let dropped = c.wait_dropped();
            // The client comes back and sends both again; answer them.
            let mut c2 = l.accept();
            for _ in 0..2 {
                let call = c2.call();
                let rkey = call.write[0].handle;
                c2.reply(&call, 16, Some(rkey));
            }
            // Connected until the client has both replies (a connection
            // torn down at once may flush the replies' Sends, and the
            // client would then reconnect to nobody).
            assert!(link.wait_blocking(), "the client never finished");
            dropped
        },
        |t, link| async move {
            null(&t, false).await.expect("first call");
            let (a, b) = tokio::join!(null(&t, true), null(&t, true));
            link.signal();
            (vec![a, b], t.stats())
        },
    );
    assert!(dropped, "the client kept the connection");
    for r in results {
        r.expect("both calls complete on the new connection");
    }
    assert_eq!(stats.connects, 2, "{stats:?}");
    assert!(stats.retransmits >= 2, "{stats:?}");
    // Only the second connection's replies invalidated correctly.
    assert_eq!(stats.send_with_invalidate, 2, "{stats:?}");
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_reply_of_another_version_fails_the_call() {
    in_vm();
    let (dropped, r) = run_case(
        client_opts(RegStrategy::Mw, true),
        |l, _link| {
            let mut c = l.accept();
            let call = c.call();
            c.post_send(&null_reply(&call, call.xid, 8, 2), None);
            c.wait_dropped()
        },
        |t, _link| async move { null(&t, false).await },
    );
    let err = r.expect_err("a version-2 reply accepted");
    assert!(err.to_string().contains("bad reply header"), "{err}");
    assert!(dropped, "the client kept the connection");
}

#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn rogue_responder_rdma_error_fails_the_call_with_a_clear_error() {
    in_vm();
    let (_, r) = run_case(
        client_opts(RegStrategy::Mw, true),
        |l, mut link| {
            let mut c = l.accept();
            let call = c.call();
            c.post_send(
                &rdma_error(call.xid, 8, RdmaError::Vers { low: 1, high: 1 }),
                None,
            );
            // Stay up until the client has its answer.
            link.wait_blocking();
        },
        |t, link| async move {
            let r = null(&t, false).await;
            link.signal();
            r
        },
    );
    let err = r.expect_err("an RDMA_ERROR taken as a reply");
    assert!(err.to_string().contains("RDMA_ERROR"), "{err}");
}
