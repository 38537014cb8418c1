//! A rogue RPC-over-RDMA requester against the server's RDMA responder, in
//! the Soft-RoCE VM.
//!
//! Each test starts the server in-process (an NFSv3 service plus
//! [`RdmaListener`] on `$NFSRDMA_RDMA_ADDR`, ephemeral port), connects a
//! well-behaved client, then a rogue peer built directly on the verbs
//! layer that sends one kind of bad input (named by the test) and checks
//! what comes back: an RDMA_ERROR with the expected code, nothing (a silent
//! discard, proven by a following NULL call on the same connection being
//! answered and by `RdmaStats.discarded`), or the connection being dropped
//! (a DISCONNECTED event, usually with failed or flushed completions). The
//! well-behaved client must be served before, during (after the bad input
//! was sent, before its outcome was observed) and after every case, and
//! the server's counters must move by exactly what the case implies.
//! `every_case_against_one_server` runs all cases in sequence against one
//! server and checks the totals.
//!
//! Ignored on the host (no RDMA device); `scripts/test-vm -- rogue` runs
//! them in the VM.

mod common;

use bytes::{Bytes, BytesMut};
use common::nfs4::{copy_whole, create_session, create_session_back, exchange_id};
use common::{assert_success, root_cred};
use nfsrdma_server::exports::Exports;
use nfsrdma_server::rdma::{RdmaConfig, RdmaDevice, RdmaListener, RdmaStats};
use nfsrdma_server::service::{CallContext, Reply, ReplyBody, Service, ServiceConfig};
use nfsrdma_server::store::{CreateMode, Cred, NewNode, StoreConfig};
use nfsrdma_transport::rdma::verbs::{
    Access, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, SendFlags, SendOp, VerbsError, WorkCompletion,
};
use nfsrdma_xdr::nfs3::{
    Data, Ftype3, Getattr3Args, Nfs3Res, NfsFh3, NfsProc3, NfsResult, Read3Args, Sattr3, StableHow,
    Write3Args,
};
use nfsrdma_xdr::nfs4::ops::SequenceArgs;
use nfsrdma_xdr::nfs4::{
    ArgOp, Compound4Args, Compound4Res, ResOp, Stateid4, Status, Utf8Str, PROC_COMPOUND,
};
use nfsrdma_xdr::rpc::RpcMessage;
use nfsrdma_xdr::rpcrdma::{
    ChunkLists, CmPrivate, PaddedBody, RdmaBody, RdmaError, RdmaHeader, RdmaSegment, ReadSegment,
    WriteChunk,
};
use nfsrdma_xdr::{Decoder, List, Payload, Xdr};
use std::collections::{HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Upper bound for anything to happen (TCG is slow); never a pass/fail
/// criterion by itself except as "it never happened".
const T: Duration = Duration::from_secs(30);
/// Credits the server grants.
const CREDITS: u32 = 8;
/// The server's inline threshold (both directions) and our receive size.
const INLINE: usize = 4096;
/// Our receive buffers.
const RECV_SLOTS: usize = 32;
/// Our send buffers, each large enough for the oversized Send of case 13.
const SEND_SLOTS: usize = 16;
const SEND_SIZE: usize = 8192;
/// Size of the file READ and WRITE use, and of our chunk memory.
const FILE_LEN: usize = 8192;
/// An R_key nothing was registered with (rxe keys are index << 8 | key,
/// with indices far below this).
const BOGUS_RKEY: u32 = 0xfeed_f00d;
const NFS_PROGRAM: u32 = 100_003;

const WR_RECV: u64 = 1 << 32;
const WR_SEND: u64 = 2 << 32;

fn rdma_ip() -> IpAddr {
    std::env::var("NFSRDMA_RDMA_ADDR")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| "10.99.0.1".parse().unwrap())
}

/// Polls `f` until it holds or `T` passed; returns whether it held.
fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + T;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---- the server ------------------------------------------------------------

/// The counters a case moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    connections: u64,
    err_vers: u64,
    err_chunk: u64,
    discarded: u64,
    errors: u64,
}

impl std::ops::Add for Counts {
    type Output = Counts;
    fn add(self, o: Counts) -> Counts {
        Counts {
            connections: self.connections + o.connections,
            err_vers: self.err_vers + o.err_vers,
            err_chunk: self.err_chunk + o.err_chunk,
            discarded: self.discarded + o.discarded,
            errors: self.errors + o.errors,
        }
    }
}

struct Server {
    _service: Arc<Service>,
    device: Arc<RdmaDevice>,
    listener: RdmaListener,
    stats: Arc<RdmaStats>,
    root: NfsFh3,
    file: NfsFh3,
    file_data: Vec<u8>,
}

/// The server's RDMA settings in these tests.
fn rdma_config() -> RdmaConfig {
    RdmaConfig {
        addr: SocketAddr::new(rdma_ip(), 0),
        credits: CREDITS,
        inline_size: INLINE as u32,
        // Room for case 21's 1 MiB Read chunk.
        max_io: 1 << 20,
        chunk_slots: 2,
        // Exactly `CREDITS` receives per connection, as the cases count
        // them: none more for NFSv4.1 backward calls' replies (with
        // those, calls beyond the credits land in them and end the
        // connection instead of waiting on receiver-not-ready).
        backward_calls: 0,
        ..RdmaConfig::default()
    }
}

impl Server {
    fn start() -> Server {
        Self::start_with(RdmaConfig::default().max_connections)
    }

    fn start_with(max_connections: usize) -> Server {
        Self::start_config(RdmaConfig {
            max_connections,
            ..rdma_config()
        })
    }

    fn start_config(cfg: RdmaConfig) -> Server {
        Self::start_arena(cfg, 256 << 20)
    }

    /// A server whose device's arena registers at most `arena_limit`
    /// bytes (64 MiB regions, each of one block size).
    fn start_arena(cfg: RdmaConfig, arena_limit: usize) -> Server {
        let rules = Exports::parse("/export *(rw,no_root_squash,insecure)\n").unwrap();
        // As the daemon does it: the store's blocks come from the device's
        // registered arena.
        let device = RdmaDevice::open(SocketAddr::new(rdma_ip(), 0), arena_limit)
            .expect("RDMA device (run with scripts/test-vm)");
        let ex = Service::exports_from_rules_with(&rules, &StoreConfig::default(), &|| {
            device.block_source()
        });
        let service = Arc::new(Service::new(ex, ServiceConfig::default()));
        let file_data: Vec<u8> = (0..FILE_LEN)
            .map(|i| (i as u8).wrapping_mul(29).wrapping_add(7))
            .collect();
        let (root, file) = {
            let mut fs = service.exports()[0].store.write();
            let dir = fs.root();
            let ino = fs
                .create(
                    dir,
                    b"rogue-data",
                    &Cred::root(),
                    NewNode::File,
                    CreateMode::Unchecked,
                    &Sattr3::default(),
                )
                .unwrap();
            fs.write(ino, &Cred::root(), 0, &Payload::from(file_data.clone()))
                .unwrap();
            (NfsFh3(fs.handle(dir)), NfsFh3(fs.handle(ino)))
        };
        let listener = RdmaListener::start(service.clone(), cfg, device.clone())
            .expect("RDMA listener (run with scripts/test-vm)");
        let stats = listener.stats();
        Server {
            _service: service,
            device,
            listener,
            stats,
            root,
            file,
            file_data,
        }
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::new(rdma_ip(), self.listener.port())
    }

    fn counts(&self) -> Counts {
        let g = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        let s = &self.stats;
        Counts {
            connections: g(&s.connections),
            err_vers: g(&s.err_vers),
            err_chunk: g(&s.err_chunk),
            discarded: g(&s.discarded),
            errors: g(&s.errors),
        }
    }

    fn open(&self) -> u64 {
        self.stats.open.load(Ordering::Relaxed)
    }
}

// ---- messages --------------------------------------------------------------

fn no_chunks() -> ChunkLists {
    ChunkLists {
        read_list: List(vec![]),
        write_list: List(vec![]),
        reply_chunk: None,
    }
}

fn header(xid: u32, vers: u32, body: RdmaBody) -> Vec<u8> {
    RdmaHeader {
        xid,
        vers,
        credit: CREDITS,
        body,
    }
    .to_bytes()
    .to_vec()
}

/// An RDMA_MSG with `lists` followed by `inline`.
fn rdma_msg(xid: u32, lists: ChunkLists, inline: &[u8]) -> Vec<u8> {
    let mut m = header(xid, 1, RdmaBody::Msg(lists));
    m.extend_from_slice(inline);
    m
}

/// Big-endian words.
fn words(w: &[u32]) -> Vec<u8> {
    w.iter().flat_map(|x| x.to_be_bytes()).collect()
}

/// An RPC call message (AUTH_SYS root) with encoded `args`.
fn rpc_call(xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    RpcMessage::call(xid, prog, vers, proc_, root_cred()).encode(&mut b);
    b.extend_from_slice(args);
    b.to_vec()
}

fn null_call(xid: u32) -> Vec<u8> {
    rpc_call(xid, NFS_PROGRAM, 3, 0, &[])
}

/// A WRITE call of `FILE_LEN` bytes at offset 0, reduced: the inline part
/// ends with the data's length word; returns it and the data's position.
fn reduced_write_call(xid: u32, file: &NfsFh3) -> (Vec<u8>, u32) {
    reduced_write_call_of(xid, file, FILE_LEN)
}

/// A FILE_SYNC WRITE of `len` bytes (a multiple of four) at offset 0,
/// reduced: the data left out for a Read chunk at the returned position.
fn reduced_write_call_of(xid: u32, file: &NfsFh3, len: usize) -> (Vec<u8>, u32) {
    reduced_write_call_at(xid, file, 0, len)
}

/// [`reduced_write_call_of`] at `offset`.
fn reduced_write_call_at(xid: u32, file: &NfsFh3, offset: u64, len: usize) -> (Vec<u8>, u32) {
    assert_eq!(len % 4, 0);
    let args = Write3Args {
        file: file.clone(),
        offset,
        count: len as u32,
        stable: StableHow::FileSync,
        data: Data::new(vec![0u8; len]),
    };
    let mut full = rpc_call(
        xid,
        NFS_PROGRAM,
        3,
        NfsProc3::Write as u32,
        &args.to_bytes(),
    );
    // A multiple of four: no XDR padding to take off.
    full.truncate(full.len() - len);
    let pos = full.len() as u32;
    (full, pos)
}

fn read_call(xid: u32, file: &NfsFh3) -> Vec<u8> {
    let args = Read3Args {
        file: file.clone(),
        offset: 0,
        count: FILE_LEN as u32,
    };
    rpc_call(xid, NFS_PROGRAM, 3, NfsProc3::Read as u32, &args.to_bytes())
}

/// Decodes a reply's transport header; returns it and what follows.
fn parse(buf: Bytes) -> (RdmaHeader, Bytes) {
    let mut d = Decoder::new(buf.clone());
    let h = RdmaHeader::decode(&mut d)
        .unwrap_or_else(|e| panic!("bad transport header from the server ({e}): {buf:02x?}"));
    assert!(
        h.credit >= 1 && h.credit <= CREDITS,
        "credit grant {} outside 1..={CREDITS}",
        h.credit
    );
    (h, d.into_rest())
}

fn assert_err_chunk(buf: Bytes, xid: u32) {
    let (h, rest) = parse(buf);
    assert_eq!(h.xid, xid, "RDMA_ERROR must carry the call's xid");
    assert_eq!(h.vers, 1);
    assert_eq!(h.body, RdmaBody::Error(RdmaError::Chunk), "{h:?}");
    assert!(rest.is_empty(), "bytes after RDMA_ERROR: {rest:02x?}");
}

// ---- the rogue requester ---------------------------------------------------

/// What the connection gave next.
#[derive(Debug)]
enum Next {
    /// A received message.
    Msg(Bytes),
    /// A completion failed or the peer disconnected.
    Dropped,
    /// Nothing within the wait.
    Nothing,
}

/// One requester connection on the verbs layer, sending whatever it is
/// told to.
struct Peer {
    ch: Arc<EventChannel>,
    id: CmId,
    cq: Arc<CompletionQueue>,
    qp: Arc<QueuePair>,
    recv_mr: Arc<MemoryRegion>,
    send_mr: Arc<MemoryRegion>,
    /// Chunk memory the server may read and write through its rkey.
    data: Arc<MemoryRegion>,
    inbox: VecDeque<Bytes>,
    failed: Vec<WorkCompletion>,
    disconnected: bool,
    sends_out: usize,
    next_slot: usize,
    next_xid: u32,
}

impl Peer {
    /// Connects with an RFC 8797 message (4 KiB both ways) after posting
    /// the receives.
    fn connect(srv: &Server) -> Peer {
        Self::try_connect(srv).expect("connect to the server")
    }

    /// [`Peer::connect`], or the connection manager's refusal.
    fn try_connect(srv: &Server) -> Result<Peer, VerbsError> {
        Self::connect_posting(srv, true)
    }

    /// Connects, posting receives for the replies or (`receives` false)
    /// none at all; either way asking the server to retry its Sends for
    /// ever after a receiver-not-ready NAK (the connect request's RNR
    /// retry count of 7).
    fn connect_posting(srv: &Server, receives: bool) -> Result<Peer, VerbsError> {
        let ch = EventChannel::new().expect("event channel");
        let id = CmId::new(&ch).expect("cm id");
        id.resolve(srv.addr(), T).expect("resolve");
        let ctx = id.context().expect("context");
        let pd = ProtectionDomain::new(&ctx).expect("pd");
        let cq = CompletionQueue::new(&ctx, 256, None).expect("cq");
        let qp = id
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
        let send_mr = MemoryRegion::new(&pd, SEND_SLOTS * SEND_SIZE, Access::LOCAL).expect("mr");
        let data = MemoryRegion::new(&pd, FILE_LEN, Access::REMOTE).expect("mr");
        for slot in (0..RECV_SLOTS).filter(|_| receives) {
            let sge = recv_mr.sge(slot * INLINE, INLINE).unwrap();
            qp.post_recv_one(WR_RECV | slot as u64, &[sge])
                .expect("post recv");
        }
        let ours = CmPrivate {
            remote_invalidation: false,
            send_size: INLINE as u32,
            recv_size: INLINE as u32,
        };
        let accepted = id.connect_and_wait(
            &ConnParam {
                private_data: ours.encode().to_vec(),
                initiator_depth: 4,
                responder_resources: 4,
                rnr_retry_count: 7,
                ..ConnParam::default()
            },
            T,
        )?;
        let theirs = CmPrivate::decode(&accepted.private_data).expect("server's RFC 8797 message");
        // The server takes our messages whole (its receive buffers are
        // INLINE bytes, or larger with a test's own settings).
        assert!(theirs.recv_size >= INLINE as u32, "{theirs:?}");
        Ok(Peer {
            ch,
            id,
            cq,
            qp,
            recv_mr,
            send_mr,
            data,
            inbox: VecDeque::new(),
            failed: Vec::new(),
            disconnected: false,
            sends_out: 0,
            next_slot: 0,
            next_xid: 0x5000_0000,
        })
    }

    fn xid(&mut self) -> u32 {
        self.next_xid += 1;
        self.next_xid
    }

    /// Takes in completions and connection manager events.
    fn poll(&mut self) {
        let mut wcs = Vec::new();
        self.cq.poll(&mut wcs, 64).expect("poll cq");
        for wc in wcs {
            if wc.wr_id & WR_SEND != 0 {
                self.sends_out -= 1;
            }
            if wc.status.is_err() {
                self.failed.push(wc);
                continue;
            }
            if wc.wr_id & WR_RECV != 0 {
                let off = (wc.wr_id & 0xffff_ffff) as usize * INLINE;
                let msg = self.recv_mr.to_vec(off, wc.byte_len as usize).unwrap();
                let sge = self.recv_mr.sge(off, INLINE).unwrap();
                self.qp.post_recv_one(wc.wr_id, &[sge]).expect("repost");
                self.inbox.push_back(Bytes::from(msg));
            }
        }
        match self.ch.get_event(Some(Duration::ZERO)) {
            Ok(ev) if ev.kind == CmEventKind::Disconnected => self.disconnected = true,
            Ok(_) | Err(VerbsError::Timeout { .. }) => {}
            Err(e) => panic!("connection manager: {e}"),
        }
    }

    fn dropped(&self) -> bool {
        self.disconnected || !self.failed.is_empty()
    }

    /// Posts one Send of `bytes`.
    fn send(&mut self, bytes: &[u8]) {
        assert!(
            self.try_send(bytes),
            "connection dropped: {:?}",
            self.failed
        );
    }

    /// Posts one Send of `bytes` once a send slot is free; false when the
    /// connection dropped first.
    fn try_send(&mut self, bytes: &[u8]) -> bool {
        assert!(bytes.len() <= SEND_SIZE);
        let deadline = Instant::now() + T;
        while self.sends_out >= SEND_SLOTS {
            self.poll();
            if self.dropped() {
                return false;
            }
            assert!(Instant::now() < deadline, "sends never completed");
        }
        // Sends complete in order: the oldest slot is free.
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % SEND_SLOTS;
        let off = slot * SEND_SIZE;
        self.send_mr.write_at(off, bytes).unwrap();
        let sge = self.send_mr.sge(off, bytes.len()).unwrap();
        self.qp
            .post_send_one(
                WR_SEND | slot as u64,
                SendOp::Send { sges: &[sge] },
                SendFlags::SIGNALED,
            )
            .expect("post send");
        self.sends_out += 1;
        true
    }

    /// The next message, or the connection dropping, waiting up to `wait`.
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
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The next message; panics when the connection drops or nothing comes.
    fn reply(&mut self) -> Bytes {
        match self.next_within(T) {
            Next::Msg(m) => m,
            Next::Dropped => panic!(
                "connection dropped (disconnected {}, failed completions {:?})",
                self.disconnected, self.failed
            ),
            Next::Nothing => panic!("no reply within {T:?}"),
        }
    }

    /// Waits until the server disconnects us; no message may arrive before.
    /// Returns the failed completions seen.
    fn expect_dropped(&mut self) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + T;
        while !self.disconnected {
            self.poll();
            if let Some(m) = self.inbox.pop_front() {
                panic!("expected the connection to be dropped, got a message {m:02x?}");
            }
            assert!(
                Instant::now() < deadline,
                "the server did not disconnect within {T:?} (failed completions {:?})",
                self.failed
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        self.failed.clone()
    }

    /// An RPC reply's header for `xid`, checked for RDMA_MSG with empty
    /// lists and MSG_ACCEPTED/SUCCESS; returns the decoder at the results.
    fn rpc_reply(&mut self, xid: u32) -> Decoder {
        let (h, rest) = parse(self.reply());
        assert_eq!(h.xid, xid);
        assert_eq!(h.body, RdmaBody::Msg(no_chunks()), "{h:?}");
        let mut d = Decoder::new(rest);
        let m = RpcMessage::decode(&mut d).expect("RPC reply");
        assert_eq!(m.xid, xid);
        assert_success(&m);
        d
    }

    /// An NFS NULL call inline; must be answered.
    fn null(&mut self) {
        let xid = self.xid();
        self.send(&rdma_msg(xid, no_chunks(), &null_call(xid)));
        let d = self.rpc_reply(xid);
        assert_eq!(d.remaining(), 0);
    }

    /// GETATTR of the export's root inline; must be a directory.
    fn getattr_root(&mut self, srv: &Server) {
        let xid = self.xid();
        let args = Getattr3Args {
            object: srv.root.clone(),
        }
        .to_bytes();
        let call = rpc_call(xid, NFS_PROGRAM, 3, NfsProc3::Getattr as u32, &args);
        self.send(&rdma_msg(xid, no_chunks(), &call));
        let mut d = self.rpc_reply(xid);
        match Nfs3Res::decode(NfsProc3::Getattr, &mut d).expect("GETATTR result") {
            Nfs3Res::Getattr(NfsResult::Ok(ok)) => {
                assert_eq!(ok.obj_attributes.type_, Ftype3::Dir)
            }
            other => panic!("GETATTR of the root: {other:?}"),
        }
    }

    /// The size of a file, by GETATTR inline.
    fn file_size(&mut self, fh: &NfsFh3) -> u64 {
        let xid = self.xid();
        let args = Getattr3Args { object: fh.clone() }.to_bytes();
        let call = rpc_call(xid, NFS_PROGRAM, 3, NfsProc3::Getattr as u32, &args);
        self.send(&rdma_msg(xid, no_chunks(), &call));
        let mut d = self.rpc_reply(xid);
        match Nfs3Res::decode(NfsProc3::Getattr, &mut d).expect("GETATTR result") {
            Nfs3Res::Getattr(NfsResult::Ok(ok)) => ok.obj_attributes.size,
            other => panic!("GETATTR: {other:?}"),
        }
    }

    /// Sends one crafted message and expects ERR_CHUNK for `xid`, then a
    /// NULL call on the same connection to work.
    fn expect_err_chunk(&mut self, msg: &[u8], xid: u32, good: &mut Peer, srv: &Server) {
        self.send(msg);
        check_good(good, srv);
        assert_err_chunk(self.reply(), xid);
        self.null();
    }

    /// Sends one crafted message that must be dropped silently: the NULL
    /// call after it is the next thing answered.
    fn expect_silence(&mut self, msg: &[u8], good: &mut Peer, srv: &Server) {
        self.send(msg);
        check_good(good, srv);
        self.null();
    }

    /// READ of the test file with a Write chunk at `rkey`/`addr`.
    fn send_read(&mut self, file: &NfsFh3, rkey: u32, addr: u64) -> u32 {
        let xid = self.xid();
        let lists = ChunkLists {
            write_list: List(vec![WriteChunk::new(vec![RdmaSegment {
                handle: rkey,
                length: FILE_LEN as u32,
                offset: addr,
            }])]),
            ..no_chunks()
        };
        self.send(&rdma_msg(xid, lists, &read_call(xid, file)));
        xid
    }

    /// The reply to WRITE `xid`: success, all `FILE_LEN` bytes written.
    fn expect_write_of_the_file(&mut self, xid: u32) {
        let mut d = self.rpc_reply(xid);
        match Nfs3Res::decode(NfsProc3::Write, &mut d).expect("WRITE result") {
            Nfs3Res::Write(NfsResult::Ok(ok)) => assert_eq!(ok.count, FILE_LEN as u32),
            other => panic!("WRITE: {other:?}"),
        }
    }

    /// WRITE of `FILE_LEN` bytes at offset 0 with its data in a Read chunk
    /// at `rkey`/`addr`.
    fn send_write(&mut self, file: &NfsFh3, rkey: u32, addr: u64) -> u32 {
        let xid = self.xid();
        let (inline, position) = reduced_write_call(xid, file);
        let lists = ChunkLists {
            read_list: List(vec![ReadSegment {
                position,
                target: RdmaSegment {
                    handle: rkey,
                    length: FILE_LEN as u32,
                    offset: addr,
                },
            }]),
            ..no_chunks()
        };
        self.send(&rdma_msg(xid, lists, &inline));
        xid
    }
}

/// What failed on our side, in a line.
fn summary(failed: &[WorkCompletion]) -> String {
    let (sends, recvs): (Vec<_>, Vec<_>) = failed.iter().partition(|wc| wc.wr_id & WR_SEND != 0);
    let statuses = |v: &[&WorkCompletion]| {
        let mut s: Vec<String> = v.iter().map(|wc| format!("{:?}", wc.status)).collect();
        s.dedup();
        s.join(", ")
    };
    format!(
        "our failed sends: {} ({}), failed receives: {} ({})",
        sends.len(),
        statuses(&sends),
        recvs.len(),
        statuses(&recvs)
    )
}

/// The well-behaved client's round: NULL and GETATTR of the root.
fn check_good(good: &mut Peer, srv: &Server) {
    good.null();
    good.getattr_root(srv);
}

/// The rogue connection has just sent a call the server cannot carry out
/// (its RDMA operation fails): the good client is served meanwhile, the
/// server drops the rogue connection, and the case counts one error.
fn expect_dropped_case(p: &mut Peer, good: &mut Peer, srv: &Server, case: u32) -> Counts {
    check_good(good, srv);
    let failed = p.expect_dropped();
    println!("case {case}: disconnected; {}", summary(&failed));
    Counts {
        errors: 1,
        ..ONE_CONN
    }
}

// ---- the cases ---------------------------------------------------------------
//
// Each case uses its own rogue connection, checks what it observes, drops
// the connection and returns the counters it moved.

type Case = fn(&Server, &mut Peer) -> Counts;

const ONE_CONN: Counts = Counts {
    connections: 1,
    err_vers: 0,
    err_chunk: 0,
    discarded: 0,
    errors: 0,
};

/// 1: rdma_vers 2 -> ERR_VERS 1..1 with the call's xid.
fn case_wrong_rdma_vers(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let mut m = header(xid, 2, RdmaBody::Msg(no_chunks()));
    m.extend_from_slice(&null_call(xid));
    p.send(&m);
    check_good(good, srv);
    let (h, rest) = parse(p.reply());
    assert_eq!(h.xid, xid);
    assert_eq!(h.vers, 1);
    assert_eq!(
        h.body,
        RdmaBody::Error(RdmaError::Vers { low: 1, high: 1 }),
        "{h:?}"
    );
    assert!(rest.is_empty());
    // The connection stays usable.
    p.null();
    Counts {
        err_vers: 1,
        ..ONE_CONN
    }
}

/// 2: rdma_proc 7 -> ERR_CHUNK.
fn case_unknown_proc(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    p.expect_err_chunk(&words(&[xid, 1, CREDITS, 7, 0, 0, 0]), xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 3: RDMA_MSGP -> ERR_CHUNK.
fn case_rdma_msgp(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let mut m = header(
        xid,
        1,
        RdmaBody::Msgp(PaddedBody {
            align: 4,
            thresh: 0,
            chunks: no_chunks(),
        }),
    );
    m.extend_from_slice(&null_call(xid));
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 4: RDMA_NOMSG without a Position-Zero Read chunk (alone, and with the
/// call inline after it) -> ERR_CHUNK twice.
fn case_rdma_nomsg_without_chunks(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let m = header(xid, 1, RdmaBody::Nomsg(no_chunks()));
    assert_eq!(m.len(), 28);
    p.expect_err_chunk(&m, xid, good, srv);
    let xid = p.xid();
    let mut m = header(xid, 1, RdmaBody::Nomsg(no_chunks()));
    m.extend_from_slice(&null_call(xid));
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 2,
        ..ONE_CONN
    }
}

/// 5: a 20-byte header (version 1, shorter than 28) and an 8-byte one
/// (shorter than the fixed 16) -> dropped silently, connection works.
fn case_short_headers(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    p.expect_silence(&words(&[xid, 1, CREDITS, 0, 0]), good, srv);
    let xid = p.xid();
    p.expect_silence(&words(&[xid, 1]), good, srv);
    Counts {
        discarded: 2,
        ..ONE_CONN
    }
}

/// A Read list segment at `position` naming our chunk memory.
fn read_seg(p: &Peer, position: u32, length: u32) -> ReadSegment {
    let r = p.data.remote(0, p.data.len()).unwrap();
    ReadSegment {
        position,
        target: RdmaSegment {
            handle: r.rkey,
            length,
            offset: r.addr,
        },
    }
}

/// 6: a Read chunk at position 6 -> ERR_CHUNK.
fn case_misaligned_read_chunk_position(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let lists = ChunkLists {
        read_list: List(vec![read_seg(&p, 6, 4)]),
        ..no_chunks()
    };
    let m = rdma_msg(xid, lists, &null_call(xid));
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 7: a Read chunk positioned 8 bytes past the end of the inline call
/// (aligned) -> ERR_CHUNK.
fn case_read_chunk_position_past_end(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let (inline, pos) = reduced_write_call(xid, &srv.file);
    let lists = ChunkLists {
        read_list: List(vec![read_seg(&p, pos + 8, FILE_LEN as u32)]),
        ..no_chunks()
    };
    let m = rdma_msg(xid, lists, &inline);
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 8: four segments of 0xffffffff bytes at the WRITE data's position:
/// 16 GiB, far past the largest call -> ERR_CHUNK (and no RDMA Read).
fn case_oversized_read_list(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let (inline, pos) = reduced_write_call(xid, &srv.file);
    let lists = ChunkLists {
        read_list: List((0..4).map(|_| read_seg(&p, pos, u32::MAX)).collect()),
        ..no_chunks()
    };
    let m = rdma_msg(xid, lists, &inline);
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 9: a Write list entry with zero segments -> ERR_CHUNK.
fn case_empty_write_chunk(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let lists = ChunkLists {
        write_list: List(vec![WriteChunk::new(vec![])]),
        ..no_chunks()
    };
    let m = rdma_msg(xid, lists, &read_call(xid, &srv.file));
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 10: a valid READ whose Write chunk names an rkey never registered: the
/// server's RDMA Write fails and it drops that connection. The same READ
/// with our real rkey first shows the call itself is fine.
fn case_unregistered_write_chunk_rkey(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let r = p.data.remote(0, FILE_LEN).unwrap();
    p.data.fill(0, FILE_LEN, 0).unwrap();
    let xid = p.send_read(&srv.file, r.rkey, r.addr);
    let (h, rest) = parse(p.reply());
    assert_eq!(h.xid, xid);
    let Some(lists) = h.body.chunks() else {
        panic!("READ reply: {h:?}");
    };
    assert!(matches!(h.body, RdmaBody::Msg(_)), "{h:?}");
    assert_eq!(lists.write_list.0.len(), 1, "{h:?}");
    assert_eq!(lists.write_list.0[0].total_len(), FILE_LEN as u64, "{h:?}");
    let placed = p.data.to_vec(0, FILE_LEN).unwrap();
    assert!(
        placed == srv.file_data,
        "READ data placed by RDMA Write differs"
    );
    // The reduced reply decodes with the placed data at the end.
    let pos = rest.len();
    let mut d = Decoder::with_ddp(rest, pos, Payload::from(placed));
    let m = RpcMessage::decode(&mut d).unwrap();
    assert_success(&m);
    match Nfs3Res::decode(NfsProc3::Read, &mut d).expect("READ result") {
        Nfs3Res::Read(NfsResult::Ok(ok)) => {
            assert_eq!(ok.count, FILE_LEN as u32);
            assert_eq!(ok.data.0.len(), FILE_LEN);
        }
        other => panic!("READ: {other:?}"),
    }

    p.send_read(&srv.file, BOGUS_RKEY, r.addr);
    expect_dropped_case(&mut p, good, srv, 10)
}

/// 11: a WRITE whose Read chunk names a bogus rkey: the server's RDMA Read
/// fails and it drops that connection. The same WRITE with our real rkey
/// first shows the call itself is fine.
fn case_bogus_read_chunk_rkey(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let r = p.data.remote(0, FILE_LEN).unwrap();
    // Writes the file's own contents: the file stays as it was.
    p.data.write_at(0, &srv.file_data).unwrap();
    let xid = p.send_write(&srv.file, r.rkey, r.addr);
    p.expect_write_of_the_file(xid);

    p.send_write(&srv.file, BOGUS_RKEY, r.addr);
    expect_dropped_case(&mut p, good, srv, 11)
}

/// 12: credits + 4 NULL calls back to back, on a connection with no
/// receives for backward calls (`rdma_config`). The documented policy
/// (nfsrdma_rpcrdma::conn::credits): the server holds each call's receive
/// buffer until its reply is posted, so it never holds more than its
/// credits; the extra Sends find no receive and wait in our queue on
/// receiver-not-ready retries (`RNR_RETRY`, as the server's accept sets
/// them), and each is answered once a buffer is posted again. Every call
/// is answered exactly once, the connection stays, and the server's peak
/// of receives held is within the credits (and was counted: at least the
/// call in hand).
fn case_more_calls_than_credits(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let n = CREDITS as usize + 4;
    let mut xids = HashSet::new();
    for _ in 0..n {
        let xid = p.xid();
        xids.insert(xid);
        p.send(&rdma_msg(xid, no_chunks(), &null_call(xid)));
    }
    check_good(good, srv);
    for answered in 0..n {
        match p.next_within(T) {
            Next::Msg(m) => {
                let (h, rest) = parse(m);
                assert!(
                    xids.remove(&h.xid),
                    "reply to an unknown or repeated xid {h:?}"
                );
                assert_eq!(h.body, RdmaBody::Msg(no_chunks()), "{h:?}");
                let mut d = Decoder::new(rest);
                let m = RpcMessage::decode(&mut d).unwrap();
                assert_eq!(m.xid, h.xid);
                assert_success(&m);
            }
            other => panic!("after {answered} of {n} replies: {other:?}"),
        }
    }
    let peak = srv.stats.receives_held_peak.load(Ordering::Relaxed);
    assert!(
        (1..=u64::from(CREDITS)).contains(&peak),
        "the server held {peak} messages on one connection, credits {CREDITS}"
    );
    p.null();
    ONE_CONN
}

/// 13: an 8 KiB Send into the server's 4 KiB receive buffers: the
/// server's receive fails and it drops the connection.
fn case_oversized_inline_send(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    p.null();
    let xid = p.xid();
    let mut m = rdma_msg(xid, no_chunks(), &null_call(xid));
    m.resize(2 * INLINE, 0);
    p.send(&m);
    expect_dropped_case(&mut p, good, srv, 13)
}

/// 14: RDMA_ERROR sent by a requester (ERR_VERS, 28 bytes; ERR_CHUNK
/// padded to 28 bytes) -> dropped silently.
fn case_requester_rdma_error(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let m = header(xid, 1, RdmaBody::Error(RdmaError::Vers { low: 1, high: 1 }));
    assert_eq!(m.len(), 28);
    p.expect_silence(&m, good, srv);
    let xid = p.xid();
    let mut m = header(xid, 1, RdmaBody::Error(RdmaError::Chunk));
    m.resize(28, 0);
    p.expect_silence(&m, good, srv);
    Counts {
        discarded: 2,
        ..ONE_CONN
    }
}

/// 15: RDMA_DONE (padded to 28 bytes, and bare 16 bytes) -> dropped
/// silently.
fn case_rdma_done(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let mut m = header(xid, 1, RdmaBody::Done);
    m.resize(28, 0);
    p.expect_silence(&m, good, srv);
    let xid = p.xid();
    let m = header(xid, 1, RdmaBody::Done);
    assert_eq!(m.len(), 16);
    p.expect_silence(&m, good, srv);
    Counts {
        discarded: 2,
        ..ONE_CONN
    }
}

/// 16: connect, send nothing, disconnect: the server's connection goes
/// away (`open` back where it was) without an error.
fn case_idle_peer(srv: &Server, good: &mut Peer) -> Counts {
    let before = srv.open();
    let mut p = Peer::connect(srv);
    assert!(
        wait_until(|| srv.open() == before + 1),
        "the server never counted the connection open"
    );
    check_good(good, srv);
    p.id.disconnect().expect("disconnect");
    let deadline = Instant::now() + T;
    while !p.disconnected {
        p.poll();
        assert!(Instant::now() < deadline, "no DISCONNECTED event");
    }
    assert!(
        wait_until(|| srv.open() == before),
        "open stayed at {} (was {before})",
        srv.open()
    );
    ONE_CONN
}

/// 17: an RPC header whose XID differs from rdma_xid -> ERR_CHUNK with
/// rdma_xid.
fn case_rpc_xid_mismatch(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let m = rdma_msg(xid, no_chunks(), &null_call(xid ^ 0x00ff_0000));
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 18: a Read list whose segments go back in position (the WRITE data's
/// position, then four bytes before it) -> ERR_CHUNK.
fn case_read_chunks_out_of_order(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let (inline, pos) = reduced_write_call(xid, &srv.file);
    let lists = ChunkLists {
        read_list: List(vec![
            read_seg(&p, pos, (FILE_LEN / 2) as u32),
            read_seg(&p, pos - 4, (FILE_LEN / 2) as u32),
        ]),
        ..no_chunks()
    };
    let m = rdma_msg(xid, lists, &inline);
    p.expect_err_chunk(&m, xid, good, srv);
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 19: a Write chunk that claims 10,000 segments in a 4 KiB message (200
/// of them present, then the message ends) -> ERR_CHUNK, no RDMA Write.
fn case_write_chunk_of_10000_segments(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let xid = p.xid();
    let r = p.data.remote(0, FILE_LEN).unwrap();
    // xid, vers, credits, RDMA_MSG, no Read list, a Write list entry of
    // 10,000 segments.
    let mut w = vec![xid, 1, CREDITS, 0, 0, 1, 10_000];
    for i in 0..200u64 {
        let at = r.addr + i * 16;
        w.extend([r.rkey, 16, (at >> 32) as u32, at as u32]);
    }
    let m = words(&w);
    assert!(m.len() <= INLINE, "{} bytes", m.len());
    p.data.fill(0, FILE_LEN, 0).unwrap();
    p.expect_err_chunk(&m, xid, good, srv);
    assert!(
        p.data.to_vec(0, FILE_LEN).unwrap().iter().all(|b| *b == 0),
        "the server wrote into the segments of a call it refused"
    );
    Counts {
        err_chunk: 1,
        ..ONE_CONN
    }
}

/// 20: a READ whose Write chunk has our real rkey but an offset just past
/// the registered memory: the server's RDMA Write fails and it drops that
/// connection.
fn case_write_chunk_outside_the_registration(srv: &Server, good: &mut Peer) -> Counts {
    let mut p = Peer::connect(srv);
    let r = p.data.remote(0, FILE_LEN).unwrap();
    p.send_read(&srv.file, r.rkey, r.addr + FILE_LEN as u64);
    expect_dropped_case(&mut p, good, srv, 20)
}

/// 21: a 1 MiB WRITE whose Read chunk the server starts to read, and the
/// peer disconnects and destroys its queue pair as soon as its Send is
/// acknowledged: the server gives the connection up (its RDMA Read fails
/// or is flushed), stays up, and the WRITE is not executed in part: the
/// file keeps its size, or (should the read have won the race) takes the
/// whole WRITE.
fn case_disconnect_during_rdma_read(srv: &Server, good: &mut Peer) -> Counts {
    const BIG: usize = 1 << 20;
    let open = srv.open();
    let before = srv.counts();
    let size_before = good.file_size(&srv.file);
    let mut p = Peer::connect(srv);
    // The server has handed the connection to a pool thread (which counts it open):
    // whatever it does with the connection happens after this.
    assert!(
        wait_until(|| srv.open() == open + 1),
        "the server never counted the connection open"
    );
    let big = MemoryRegion::new(p.data.pd(), BIG, Access::REMOTE).expect("mr");
    // The file's own bytes first, so that later cases see them either way.
    big.write_at(0, &srv.file_data).unwrap();
    let r = big.remote(0, BIG).unwrap();
    let xid = p.xid();
    let (inline, position) = reduced_write_call_of(xid, &srv.file, BIG);
    let lists = ChunkLists {
        read_list: List(vec![ReadSegment {
            position,
            target: RdmaSegment {
                handle: r.rkey,
                length: BIG as u32,
                offset: r.addr,
            },
        }]),
        ..no_chunks()
    };
    p.send(&rdma_msg(xid, lists, &inline));
    let deadline = Instant::now() + T;
    while p.sends_out > 0 {
        p.poll();
        assert!(!p.dropped(), "dropped before the call went out");
        assert!(Instant::now() < deadline, "the call's Send never completed");
    }
    p.id.disconnect().expect("disconnect");
    drop(p);
    drop(big);
    check_good(good, srv);
    assert!(
        wait_until(|| srv.open() == open),
        "the server kept the connection: open {} (was {open})",
        srv.open()
    );
    let size_after = good.file_size(&srv.file);
    assert!(
        size_after == size_before || size_after == BIG as u64,
        "file size {size_after}: neither the old {size_before} nor the whole WRITE"
    );
    let errors = srv.counts().errors - before.errors;
    println!(
        "case 21: connection released ({errors} counted as an error); file size {size_after} \
         ({})",
        if size_after == size_before {
            "WRITE not executed"
        } else {
            "the read completed first: WRITE executed whole"
        }
    );
    assert!(errors <= 1);
    Counts { errors, ..ONE_CONN }
}

/// 22: a WRITE whose Read chunk is 32 segments of 256 bytes, read from
/// our memory in reverse order, where we serve 4 RDMA Reads at a time (the
/// responder resources we offered): the server must post them as room
/// comes back, not wait for room that never comes, and land every piece
/// where its segment says. The file reads back as written; the file's own
/// bytes are then written back for the cases after this one.
fn case_read_chunk_of_more_segments_than_the_read_depth(srv: &Server, good: &mut Peer) -> Counts {
    const SEG: usize = 256;
    let mut p = Peer::connect(srv);
    // XIDs no other case uses: the server's duplicate request cache would
    // answer a WRITE that reuses an earlier one's XID (and its inline
    // part) from the cache, as a retransmission, without running it.
    p.next_xid = 0x6600_0000;
    let written: Vec<u8> = (0..FILE_LEN).map(|i| (i / SEG) as u8 ^ 0xa5).collect();
    let r = p.data.remote(0, FILE_LEN).unwrap();
    let n = FILE_LEN / SEG;
    // Segment i of the chunk sits at slot n-1-i of our memory.
    for i in 0..n {
        let slot = n - 1 - i;
        p.data
            .write_at(slot * SEG, &written[i * SEG..(i + 1) * SEG])
            .unwrap();
    }
    let xid = p.xid();
    let (inline, position) = reduced_write_call(xid, &srv.file);
    let lists = ChunkLists {
        read_list: List(
            (0..n)
                .map(|i| ReadSegment {
                    position,
                    target: RdmaSegment {
                        handle: r.rkey,
                        length: SEG as u32,
                        offset: r.addr + ((n - 1 - i) * SEG) as u64,
                    },
                })
                .collect(),
        ),
        ..no_chunks()
    };
    p.send(&rdma_msg(xid, lists, &inline));
    check_good(good, srv);
    p.expect_write_of_the_file(xid);
    // Read it back into zeroed memory.
    p.data.write_at(0, &vec![0u8; FILE_LEN]).unwrap();
    let xid = p.send_read(&srv.file, r.rkey, r.addr);
    let (h, rest) = parse(p.reply());
    assert_eq!(h.xid, xid);
    // The Write chunk comes back with the length written.
    let RdmaBody::Msg(lists) = &h.body else {
        panic!("READ reply {h:?}")
    };
    assert_eq!(lists.write_list.0.len(), 1, "{h:?}");
    assert_eq!(lists.write_list.0[0].segments.0[0].length, FILE_LEN as u32);
    let m = RpcMessage::decode(&mut Decoder::new(rest)).expect("RPC reply");
    assert_success(&m);
    assert!(
        p.data.to_vec(0, FILE_LEN).unwrap() == written,
        "the file does not read back as the 32 segments wrote it"
    );
    p.data.write_at(0, &srv.file_data).unwrap();
    let xid = p.send_write(&srv.file, r.rkey, r.addr);
    p.expect_write_of_the_file(xid);
    ONE_CONN
}

/// The test process's memory and CPU around a rogue case (the server runs
/// in it), checked once the rogue has gone: its RSS grew by at most one
/// connection's buffers (`memory_per_connection`, the figure nfsrdmad
/// prints at start) and 32 MiB for the allocator, and over the 2 s after
/// a 1 s pause it used at most 300 ms of CPU (idle but for the good
/// client's connection). Returns the figures for the case's report.
struct Footprint {
    rss: u64,
}

impl Footprint {
    fn before() -> Footprint {
        Footprint {
            rss: proc_kib("/proc/self/status", "VmRSS:") * 1024,
        }
    }

    fn check_after(self, srv: &Server, open_before: u64, name: &str) -> String {
        assert!(
            wait_until(|| srv.open() == open_before),
            "{name}: open {} (was {open_before})",
            srv.open()
        );
        let rss = proc_kib("/proc/self/status", "VmRSS:") * 1024;
        let per_conn = rdma_config().memory_per_connection() as u64;
        let grew = rss.saturating_sub(self.rss);
        std::thread::sleep(Duration::from_secs(1));
        let cpu0 = cpu_time();
        std::thread::sleep(Duration::from_secs(2));
        let cpu = cpu_time() - cpu0;
        let report = format!(
            "RSS {} -> {} KiB (+{} KiB; one connection's buffers {} KiB), CPU over 2 s after it left {cpu:?}",
            self.rss >> 10,
            rss >> 10,
            grew >> 10,
            per_conn >> 10
        );
        assert!(
            grew <= per_conn + (32 << 20),
            "{name}: the process grew by {grew} B: {report}"
        );
        assert!(
            cpu <= Duration::from_millis(300),
            "{name}: not back to idle: {report}"
        );
        report
    }
}

/// 23: a requester that posts no receives and keeps sending (a call per
/// credit), having asked for endless receiver-not-ready retries: the
/// server's replies find no receive, its retries are bounded whatever the
/// requester asked for (`RNR_RETRY`), and the connection is closed and
/// counted within seconds; the well-behaved client is answered meanwhile.
fn case_requester_that_posts_no_receives(srv: &Server, good: &mut Peer) -> Counts {
    let counted = || srv.stats.peer_not_receiving.load(Ordering::Relaxed);
    let before = counted();
    let open_before = srv.open();
    let footprint = Footprint::before();
    let mut p = Peer::connect_posting(srv, false).expect("connect without receives");
    let start = Instant::now();
    for _ in 0..CREDITS {
        let xid = p.xid();
        p.send(&rdma_msg(xid, no_chunks(), &null_call(xid)));
    }
    // The replies are stuck in the server's retries now.
    let good_start = Instant::now();
    check_good(good, srv);
    let good_took = good_start.elapsed();
    let failed = p.expect_dropped();
    let took = start.elapsed();
    println!(
        "requester_that_posts_no_receives: dropped {took:?} after its first call \
         (the good client's NULL + GETATTR meanwhile: {good_took:?}); {}",
        summary(&failed)
    );
    assert!(
        wait_until(|| counted() == before + 1),
        "not counted as a peer that posts no receives: {}",
        srv.stats.report()
    );
    drop(p);
    let report = footprint.check_after(srv, open_before, "requester_that_posts_no_receives");
    println!("requester_that_posts_no_receives: {report}");
    Counts {
        errors: 1,
        ..ONE_CONN
    }
}

/// 24: NULL calls sent for 10 s (10,000 at most) as fast as the
/// requester's send queue takes them, never waiting for a reply or a
/// credit (the replies are taken as they come and their receives posted
/// again). The server holds at most its credits' worth of calls whatever
/// arrives; a Send beyond them meets receiver-not-ready NAKs, and the
/// requester waits out the server's RNR timer (655 ms, the connection
/// manager's default) before each retry: that is what paces it, not
/// anything queued at the server. Such a Send gets in on a retry once a
/// receive is posted again, or, when the requester's retries
/// (`RNR_RETRY`) run out, fails on its side, and it then disconnects.
/// Either way every reply is for a call that was sent, each once, and the
/// good client is answered meanwhile.
fn case_calls_beyond_the_credits(srv: &Server, good: &mut Peer) -> Counts {
    const N: usize = 10_000;
    const FOR: Duration = Duration::from_secs(10);
    let before = srv.counts();
    let open_before = srv.open();
    let footprint = Footprint::before();
    let mut p = Peer::connect(srv);
    // Receive buffers of the connection's own: a Send beyond the credits
    // is retried as often as the accept says (RNR_RETRY), 655 ms apart.
    assert_eq!(
        p.qp.rnr_attrs().expect("query the QP").retry,
        nfsrdma_server::rdma::listener::RNR_RETRY
    );
    let start = Instant::now();
    let mut xids = HashSet::new();
    let mut answered = 0usize;
    let mut sent = 0usize;
    let take = |p: &mut Peer, xids: &mut HashSet<u32>, answered: &mut usize| {
        while let Some(m) = p.inbox.pop_front() {
            let (h, _) = parse(m);
            assert!(
                xids.remove(&h.xid),
                "reply to an unknown or repeated xid {h:?}"
            );
            *answered += 1;
        }
    };
    let mut next_good = Instant::now() + Duration::from_secs(2);
    while sent < N && start.elapsed() < FOR {
        let xid = p.xid();
        xids.insert(xid);
        if !p.try_send(&rdma_msg(xid, no_chunks(), &null_call(xid))) {
            xids.remove(&xid);
            break;
        }
        sent += 1;
        take(&mut p, &mut xids, &mut answered);
        if Instant::now() >= next_good {
            check_good(good, srv);
            next_good = Instant::now() + Duration::from_secs(2);
        }
    }
    let sending = start.elapsed();
    // What is still on its way.
    while !p.dropped() && answered < sent {
        match p.next_within(T) {
            Next::Msg(m) => p.inbox.push_front(m),
            Next::Dropped => break,
            Next::Nothing => panic!("{} of {sent} calls never answered", sent - answered),
        }
        take(&mut p, &mut xids, &mut answered);
    }
    let dropped = p.dropped();
    let peak = srv.stats.receives_held_peak.load(Ordering::Relaxed);
    println!(
        "calls_beyond_the_credits: {sent} sent in {sending:?}, {answered} answered, \
         connection {}; receives held at most {peak}; {}",
        if dropped { "dropped" } else { "up" },
        summary(&p.failed)
    );
    assert!(
        peak <= u64::from(CREDITS),
        "the server held {peak} messages on one connection, credits {CREDITS}"
    );
    if dropped {
        // Only the requester's own Sends may have failed: its receiver-not-
        // ready retries ran out.
        assert!(
            p.failed.iter().all(|wc| wc.wr_id & WR_SEND != 0
                || matches!(
                    wc.status,
                    Err(nfsrdma_transport::rdma::verbs::CompletionError::Flushed)
                )),
            "{}",
            summary(&p.failed)
        );
        let _ = p.id.disconnect();
    } else {
        assert!(sent > 0);
        p.null();
    }
    if !dropped {
        let _ = p.id.disconnect();
    }
    drop(p);
    // The server's side of a connection the requester dropped ends as a
    // close or as an error, depending on what its thread saw first.
    let report = footprint.check_after(srv, open_before, "calls_beyond_the_credits");
    println!("calls_beyond_the_credits: {report}");
    let errors = srv.counts().errors - before.errors;
    Counts { errors, ..ONE_CONN }
}

const CASES: &[(&str, Case)] = &[
    ("wrong_rdma_vers", case_wrong_rdma_vers),
    ("unknown_proc", case_unknown_proc),
    ("rdma_msgp", case_rdma_msgp),
    ("rdma_nomsg_without_chunks", case_rdma_nomsg_without_chunks),
    ("short_headers", case_short_headers),
    (
        "misaligned_read_chunk_position",
        case_misaligned_read_chunk_position,
    ),
    (
        "read_chunk_position_past_end",
        case_read_chunk_position_past_end,
    ),
    ("oversized_read_list", case_oversized_read_list),
    ("empty_write_chunk", case_empty_write_chunk),
    (
        "unregistered_write_chunk_rkey",
        case_unregistered_write_chunk_rkey,
    ),
    ("bogus_read_chunk_rkey", case_bogus_read_chunk_rkey),
    ("more_calls_than_credits", case_more_calls_than_credits),
    ("oversized_inline_send", case_oversized_inline_send),
    ("requester_rdma_error", case_requester_rdma_error),
    ("rdma_done", case_rdma_done),
    ("idle_peer", case_idle_peer),
    ("rpc_xid_mismatch", case_rpc_xid_mismatch),
    ("read_chunks_out_of_order", case_read_chunks_out_of_order),
    (
        "write_chunk_of_10000_segments",
        case_write_chunk_of_10000_segments,
    ),
    (
        "write_chunk_outside_the_registration",
        case_write_chunk_outside_the_registration,
    ),
    (
        "disconnect_during_rdma_read",
        case_disconnect_during_rdma_read,
    ),
    (
        "read_chunk_of_more_segments_than_the_read_depth",
        case_read_chunk_of_more_segments_than_the_read_depth,
    ),
    (
        "requester_that_posts_no_receives",
        case_requester_that_posts_no_receives,
    ),
    ("calls_beyond_the_credits", case_calls_beyond_the_credits),
];

/// Runs one case with the well-behaved client checked before, during (by
/// the case) and after, then waits until the server has let go of the
/// rogue connection and checks the counters moved by exactly what the case
/// says. Returns what it moved.
fn run_case(srv: &Server, good: &mut Peer, name: &str, case: Case) -> Counts {
    check_good(good, srv);
    let before = srv.counts();
    let open = srv.open();
    let moved = case(srv, good);
    check_good(good, srv);
    let want = before + moved;
    let settled = wait_until(|| srv.open() == open && srv.counts() == want);
    assert_eq!(
        srv.open(),
        open,
        "{name}: the rogue connection was not cleaned up"
    );
    assert_eq!(srv.counts(), want, "{name}: counters (before {before:?})");
    assert!(settled);
    check_good(good, srv);
    println!("{name}: ok, moved {moved:?}");
    moved
}

fn single(name: &str) {
    let case = CASES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no case {name}"))
        .1;
    let srv = Server::start();
    let mut good = Peer::connect(&srv);
    let moved = run_case(&srv, &mut good, name, case);
    assert_eq!(srv.counts(), moved + ONE_CONN, "{}", srv.stats.report());
}

/// One test per case, in a module named `rogue` so that
/// `scripts/test-vm -- rogue` selects them.
macro_rules! case_tests {
    ($($name:ident),* $(,)?) => {
        mod rogue {
            $(
                #[test]
                #[ignore = "needs an RDMA device: run with scripts/test-vm"]
                fn $name() {
                    super::single(stringify!($name));
                }
            )*

            /// Every case in turn against one server and one well-behaved
            /// connection; the totals must be the sum of the cases.
            #[test]
            #[ignore = "needs an RDMA device: run with scripts/test-vm"]
            fn every_case_against_one_server() {
                super::every_case_against_one_server();
            }
        }
    };
}

case_tests!(
    wrong_rdma_vers,
    unknown_proc,
    rdma_msgp,
    rdma_nomsg_without_chunks,
    short_headers,
    misaligned_read_chunk_position,
    read_chunk_position_past_end,
    oversized_read_list,
    empty_write_chunk,
    unregistered_write_chunk_rkey,
    bogus_read_chunk_rkey,
    more_calls_than_credits,
    oversized_inline_send,
    requester_rdma_error,
    rdma_done,
    idle_peer,
    rpc_xid_mismatch,
    read_chunks_out_of_order,
    write_chunk_of_10000_segments,
    write_chunk_outside_the_registration,
    disconnect_during_rdma_read,
    read_chunk_of_more_segments_than_the_read_depth,
    requester_that_posts_no_receives,
    calls_beyond_the_credits,
);

fn every_case_against_one_server() {
    let srv = Server::start();
    let mut good = Peer::connect(&srv);
    let mut total = ONE_CONN;
    for (name, case) in CASES {
        total = total + run_case(&srv, &mut good, name, *case);
    }
    assert_eq!(srv.counts(), total, "{}", srv.stats.report());
    // The fixed cases: 24 rogue connections, ERR_VERS once, ERR_CHUNK
    // eleven times, six silent discards (plus any case 12 chose), five
    // connections ended by errors (plus one if case 12 was dropped, and
    // one if case 21's disconnect counted as one, and one if case 24's
    // requester ran out of retries).
    assert_eq!(total.connections, 1 + CASES.len() as u64);
    assert_eq!(total.err_vers, 1);
    assert_eq!(total.err_chunk, 11);
    assert!(total.discarded >= 6);
    assert!((5..=8).contains(&total.errors));
    // The server never registered memory a peer could reach.
    assert!(
        srv.device.arena_bytes() > 0,
        "the store's arena is registered"
    );
    assert_eq!(srv.device.remote_access_regions(), 0);
    println!("{}", srv.stats.report());
}

/// `max_connections` open: a further connect request is rejected by the
/// connection manager (no queue pair or buffers set up for it), counted,
/// and the connections already open keep being served; once one closes, a
/// new one is accepted.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn connections_beyond_the_cap_are_rejected_and_counted() {
    let srv = Server::start_with(2);
    let mut good = Peer::connect(&srv);
    let mut second = Peer::connect(&srv);
    assert!(wait_until(|| srv.open() == 2), "open {}", srv.open());
    for _ in 0..3 {
        match Peer::try_connect(&srv) {
            Ok(_) => panic!("a third connection was accepted with a cap of 2"),
            Err(e @ VerbsError::Rejected { .. }) => println!("third connection: {e}"),
            Err(e) => panic!("a third connection failed other than by a rejection: {e}"),
        }
    }
    let refused = || srv.stats.refused_connections.load(Ordering::Relaxed);
    assert_eq!(refused(), 3, "{}", srv.stats.report());
    assert_eq!(srv.counts().connections, 2, "{}", srv.stats.report());
    check_good(&mut good, &srv);
    check_good(&mut second, &srv);
    second.id.disconnect().expect("disconnect");
    let deadline = Instant::now() + T;
    while !second.disconnected {
        second.poll();
        assert!(Instant::now() < deadline, "no DISCONNECTED event");
    }
    assert!(wait_until(|| srv.open() == 1), "open {}", srv.open());
    let mut third = Peer::connect(&srv);
    check_good(&mut third, &srv);
    check_good(&mut good, &srv);
    assert_eq!(refused(), 3);
    assert_eq!(srv.counts().connections, 3, "{}", srv.stats.report());
}

/// A `/proc/self/status` or `/proc/meminfo` figure in KiB.
fn proc_kib(file: &str, key: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {file}"))
}

/// This process's threads now.
fn threads() -> usize {
    proc_kib("/proc/self/status", "Threads:") as usize
}

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

/// CPU time this process has used (user + system), from `/proc/self/stat`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command name (which may hold spaces) start at
    // the state; utime and stime are the 12th and 13th after it.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|v| v.parse().expect("clock ticks"))
        .collect();
    // Clock ticks of USER_HZ, 100 per second on Linux.
    Duration::from_millis((f[0] + f[1]) * 10)
}

/// A peer that connects and then never sends: one CM id and a minimal
/// queue pair, sharing its protection domain and completion queue with
/// the others.
struct Idle {
    id: CmId,
    _qp: Arc<QueuePair>,
}

/// 1,000 connect requests that never send a byte, each held open, against
/// the cap the daemon derives when `--max-connections` is not given (half
/// of `MemTotal` over `memory_per_connection`): the connections beyond it
/// are rejected and counted, the server's memory grows by no more than the
/// cap's worth of connection buffers, a well-behaved client is answered
/// throughout, the server serves them all on its pool threads (the
/// process's thread count does not grow with the connections) which wake
/// about once a second each, and once the peers leave every connection is
/// released and the process goes back to idle.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_thousand_connects_that_never_send() {
    const N: usize = 1000;
    let mem_total = proc_kib("/proc/meminfo", "MemTotal:") * 1024;
    // Receive and send buffers of 64 KiB (1 MiB a connection), so that
    // the connections' buffers are most of what they take and the cap is
    // below N in the 2 GiB test VM.
    let cfg = RdmaConfig {
        inline_size: 64 << 10,
        threads: 2,
        ..rdma_config()
    };
    let cap = cfg.default_max_connections(mem_total);
    let per_conn = cfg.memory_per_connection() as u64;
    assert!(
        cap < N,
        "the cap ({cap}) should be below {N} in the test VM (MemTotal {mem_total} B)"
    );
    let srv = Server::start_config(RdmaConfig {
        max_connections: cap,
        ..cfg
    });
    let mut good = Peer::connect(&srv);
    check_good(&mut good, &srv);
    let rss_before = proc_kib("/proc/self/status", "VmRSS:") * 1024;
    // The server's threads are up (its connection manager and pool).
    let threads_before = threads();

    let ch = EventChannel::new().expect("event channel");
    let first = CmId::new(&ch).expect("cm id");
    first.resolve(srv.addr(), T).expect("resolve");
    let ctx = first.context().expect("context");
    let pd = ProtectionDomain::new(&ctx).expect("pd");
    let cq = CompletionQueue::new(&ctx, 64, None).expect("cq");
    let caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let param = ConnParam {
        private_data: CmPrivate {
            remote_invalidation: false,
            send_size: INLINE as u32,
            recv_size: INLINE as u32,
        }
        .encode()
        .to_vec(),
        initiator_depth: 1,
        responder_resources: 1,
        ..ConnParam::default()
    };
    let started = Instant::now();
    let mut held = Vec::new();
    let mut rejected = 0usize;
    let mut id = Some(first);
    for i in 0..N {
        let this = match id.take() {
            Some(first) => first,
            None => {
                let next = CmId::new(&ch).expect("cm id");
                next.resolve(srv.addr(), T).expect("resolve");
                next
            }
        };
        let qp = this.create_qp(&pd, &cq, &cq, caps).expect("qp");
        match this.connect_and_wait(&param, T) {
            Ok(_) => held.push(Idle { id: this, _qp: qp }),
            Err(VerbsError::Rejected { .. }) => rejected += 1,
            Err(e) => panic!("connect {i}: failed other than by a rejection: {e}"),
        }
        assert!(
            srv.open() <= cap as u64 + 1,
            "open {} with a cap of {cap}",
            srv.open()
        );
        if i % 250 == 249 {
            check_good(&mut good, &srv);
        }
    }
    let connect_time = started.elapsed();
    // The good client is one of the `cap` connections.
    assert_eq!(held.len(), cap - 1, "{}", srv.stats.report());
    assert_eq!(rejected, N - held.len());
    assert!(
        wait_until(|| srv.open() == cap as u64),
        "open {}",
        srv.open()
    );
    let refused = srv.stats.refused_connections.load(Ordering::Relaxed);
    assert_eq!(refused, rejected as u64, "{}", srv.stats.report());
    let good_start = Instant::now();
    check_good(&mut good, &srv);
    let good_took = good_start.elapsed();
    let rss_full = proc_kib("/proc/self/status", "VmRSS:") * 1024;
    let grew = rss_full.saturating_sub(rss_before);
    // The server's connection buffers for the cap, plus what the test's
    // own idle peers hold (queue pairs of one entry each), with room to
    // spare for the allocator.
    let budget = cap as u64 * per_conn;
    let cpu_held = cpu_time();
    let wakeups_held = srv.stats.idle_wakeups.load(Ordering::Relaxed);
    let held_for = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    let wakeups = srv.stats.idle_wakeups.load(Ordering::Relaxed) - wakeups_held;
    let held_for = held_for.elapsed();
    let cpu_while_held = cpu_time() - cpu_held;
    let threads_held = threads();
    let pool_threads = thread_names()
        .iter()
        .filter(|n| n.starts_with("rdma-pool-"))
        .count();
    println!(
        "a_thousand_connects_that_never_send: MemTotal {} MiB, cap {cap} \
         ({} KiB per connection), {} held, {rejected} rejected in {connect_time:?}; \
         RSS {} -> {} MiB (+{} MiB; the cap's buffers: {} MiB); \
         CPU over 3 s with them held: {cpu_while_held:?}, idle wake-ups {wakeups}; \
         threads {threads_before} before them, {threads_held} with them; \
         good client's NULL + GETATTR: {good_took:?}",
        mem_total >> 20,
        per_conn >> 10,
        held.len(),
        rss_before >> 20,
        rss_full >> 20,
        grew >> 20,
        budget >> 20,
    );
    assert!(
        grew <= budget + budget / 4 + (64 << 20),
        "RSS grew by {grew} B with {cap} connections of {per_conn} B each"
    );
    // The connections are served by the pool's threads: the process has
    // no thread more than before them (the test's own peers have none).
    assert!(
        threads_held <= threads_before,
        "{threads_held} threads with {cap} connections, {threads_before} before them"
    );
    assert_eq!(pool_threads, 2, "pool threads: {pool_threads}");
    // A pool thread with only idle connections sleeps until a completion
    // comes, waking to no purpose about once a second (`worker::IDLE_WAIT`):
    // connections that send nothing cost next to no CPU while they are
    // held, and no more wake-ups than a single one would.
    let per_thread_limit = held_for.as_secs_f64().ceil() as u64 + 1;
    assert!(
        wakeups <= 2 * per_thread_limit,
        "{wakeups} idle wake-ups in {held_for:?} from 2 pool threads: more than \
         {per_thread_limit} each"
    );
    for p in &held {
        p.id.disconnect().expect("disconnect");
    }
    drop(held);
    assert!(
        wait_until(|| srv.open() == 1),
        "open {} after the peers left",
        srv.open()
    );
    check_good(&mut good, &srv);
    std::thread::sleep(Duration::from_secs(1));
    let cpu_left = cpu_time();
    std::thread::sleep(Duration::from_secs(3));
    let cpu_after = cpu_time() - cpu_left;
    let rss_after = proc_kib("/proc/self/status", "VmRSS:") * 1024;
    println!(
        "a_thousand_connects_that_never_send: after they left: open {}, RSS {} MiB, \
         CPU over 3 s: {cpu_after:?}; {}",
        srv.open(),
        rss_after >> 20,
        srv.stats.report()
    );
    // Idle: no thread left spinning for a connection that is gone.
    assert!(
        cpu_after < Duration::from_millis(900),
        "the process used {cpu_after:?} of CPU in 3 s after the peers left"
    );
}

// ---- a long call on a shared pool thread -------------------------------------

/// One NFSv4 COMPOUND run in the server's process (as if over another
/// transport), for the state the RDMA peers then use.
fn compound_in_process(srv: &Server, xid: u32, ops: Vec<ArgOp>) -> Compound4Res {
    let mut args = BytesMut::new();
    Compound4Args {
        tag: Utf8Str(Bytes::new()),
        minorversion: 2,
        ops,
    }
    .encode(&mut args);
    let call = rpc_call(xid, NFS_PROGRAM, 4, PROC_COMPOUND, &args);
    let ctx = CallContext::from(SocketAddr::new(rdma_ip(), 700));
    match srv._service.handle(&ctx, Bytes::from(call)) {
        Some(Reply {
            body: ReplyBody::Nfs4(r),
            ..
        }) => r,
        _ => panic!("COMPOUND {xid}: no NFSv4 reply"),
    }
}

/// A file of `len` bytes of a pattern in the export, made in the store;
/// its handle and bytes.
fn make_file(srv: &Server, name: &str, len: usize) -> (NfsFh3, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
    let mut fs = srv._service.exports()[0].store.write();
    let dir = fs.root();
    let ino = fs
        .create(
            dir,
            name.as_bytes(),
            &Cred::root(),
            NewNode::File,
            CreateMode::Unchecked,
            &Sattr3::default(),
        )
        .unwrap();
    fs.write(ino, &Cred::root(), 0, &Payload::from(data.clone()))
        .unwrap();
    (NfsFh3(fs.handle(ino)), data)
}

/// A COPY of 64 MiB (the most one COPY moves) runs off the pool thread:
/// with one pool thread, so that every connection is on it, a peer's calls
/// sent after the COPY are answered while the COPY still runs, and the
/// COPY's reply comes after them, with every byte copied. Shown by the
/// order of the replies, not by time.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_long_copy_leaves_the_other_connections_of_its_pool_thread_served() {
    const LEN: usize = 64 << 20;
    let srv = Server::start_config(RdmaConfig {
        threads: 1,
        ..rdma_config()
    });
    let (_, src) = make_file(&srv, "copy-src", LEN);
    make_file(&srv, "copy-dst", 0);
    // A client record and session (any connection may use it: no state
    // protection).
    let r = compound_in_process(&srv, 1, vec![exchange_id("long-copy", 1)]);
    let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
        panic!("{r:?}")
    };
    let r = compound_in_process(&srv, 2, vec![create_session(e.clientid, e.sequenceid)]);
    let ResOp::CreateSession(Ok(s)) = &r.results[0] else {
        panic!("{r:?}")
    };
    let sid = s.sessionid;
    let seq = |n: u32| {
        ArgOp::Sequence(SequenceArgs {
            sessionid: sid,
            sequenceid: n,
            slotid: 0,
            highest_slotid: 0,
            cachethis: false,
        })
    };
    let r = compound_in_process(&srv, 3, vec![seq(1), ArgOp::ReclaimComplete(false)]);
    assert_eq!(r.status, Status::OK, "{r:?}");
    let fh = |xid: u32, n: u32, name: &'static str| {
        let r = compound_in_process(
            &srv,
            xid,
            vec![
                seq(n),
                ArgOp::Putrootfh,
                ArgOp::Lookup("export".into()),
                ArgOp::Lookup(name.into()),
                ArgOp::Getfh,
            ],
        );
        match r.results.last() {
            Some(ResOp::Getfh(Ok(f))) => f.clone(),
            _ => panic!("{name}: {r:?}"),
        }
    };
    let (sfh, dfh) = (fh(4, 2, "copy-src"), fh(5, 3, "copy-dst"));

    let mut a = Peer::connect(&srv);
    let mut b = Peer::connect(&srv);
    check_good(&mut b, &srv);
    // Anonymous stateids: no open is needed for a COPY between files.
    let anon = Stateid4 {
        seqid: 0,
        other: [0; 12],
    };
    let mut args = BytesMut::new();
    Compound4Args {
        tag: Utf8Str(Bytes::new()),
        minorversion: 2,
        ops: vec![
            seq(4),
            ArgOp::Putfh(sfh),
            ArgOp::Savefh,
            ArgOp::Putfh(dfh),
            copy_whole(anon, anon),
        ],
    }
    .encode(&mut args);
    let xid = a.xid();
    a.send(&rdma_msg(
        xid,
        no_chunks(),
        &rpc_call(xid, NFS_PROGRAM, 4, PROC_COMPOUND, &args),
    ));
    // Delivered: an RC Send completes once the server's side has it.
    let deadline = Instant::now() + T;
    while a.sends_out > 0 {
        a.poll();
        assert!(Instant::now() < deadline, "the COPY's Send never completed");
    }
    // The other connection's calls, sent once the COPY was delivered:
    // each answered while the COPY has not been.
    for _ in 0..3 {
        check_good(&mut b, &srv);
        assert!(
            matches!(a.next_within(Duration::ZERO), Next::Nothing),
            "the COPY was answered before calls of another connection sent after it"
        );
    }
    assert_eq!(srv.stats.long_calls.load(Ordering::Relaxed), 1);
    let mut d = a.rpc_reply(xid);
    let r = Compound4Res::decode(&mut d).expect("COMPOUND reply");
    assert_eq!(r.status, Status::OK, "{r:?}");
    let Some(ResOp::Copy(Ok(c))) = r.results.last() else {
        panic!("{r:?}")
    };
    assert_eq!(c.response.count, LEN as u64);
    let copied = {
        let fs = srv._service.exports()[0].store.read();
        let ino = fs.lookup(fs.root(), b"copy-dst", &Cred::root()).unwrap();
        let (data, _) = fs.read(ino, &Cred::root(), 0, LEN as u32).unwrap();
        data.to_contiguous()
    };
    assert!(copied[..] == src[..], "the copy differs from its source");
    check_good(&mut a, &srv);
}

// ---- calls that find the arena exhausted ------------------------------------

/// Sends a FILE_SYNC WRITE of `data` (1 MiB) at `offset` of `file`, its
/// data in a Read chunk from `mr`; returns the xid.
fn send_big_write(p: &mut Peer, file: &NfsFh3, offset: u64, mr: &MemoryRegion, data: &[u8]) -> u32 {
    mr.write_at(0, data).unwrap();
    let r = mr.remote(0, data.len()).unwrap();
    let xid = p.xid();
    let (inline, position) = reduced_write_call_at(xid, file, offset, data.len());
    let lists = ChunkLists {
        read_list: List(vec![ReadSegment {
            position,
            target: RdmaSegment {
                handle: r.rkey,
                length: data.len() as u32,
                offset: r.addr,
            },
        }]),
        ..no_chunks()
    };
    p.send(&rdma_msg(xid, lists, &inline));
    xid
}

/// The reply to a WRITE: NFS3_OK.
fn expect_write_ok(p: &mut Peer, xid: u32) {
    let mut d = p.rpc_reply(xid);
    match Nfs3Res::decode(NfsProc3::Write, &mut d).expect("WRITE result") {
        Nfs3Res::Write(NfsResult::Ok(_)) => {}
        other => panic!("WRITE: {other:?}"),
    }
}

/// A WRITE whose Read chunk finds the device's arena exhausted waits for
/// memory instead of being refused: two 1 MiB WRITEs of one file sent
/// together with room in the arena for one landing, and the second lands
/// once the first has replaced the file's blocks (counted as a wait, no
/// refusal, the file holding the second's bytes). A WRITE for which no
/// memory ever comes is refused with ERR_CHUNK once it has waited
/// `ARENA_WAIT`, while another connection is served meanwhile.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_write_that_finds_the_arena_full_waits_for_memory_then_is_refused_if_none_comes() {
    const BIG: usize = 1 << 20;
    // Two 64 MiB regions: one for the small blocks of the file every
    // server here starts with, one of 64 KiB blocks (1,024).
    let srv = Server::start_arena(rdma_config(), 128 << 20);
    // The store's block of zeros, 62 MiB - 64 KiB and 1 MiB of the 64 KiB
    // blocks taken: room for one landing (16 blocks).
    make_file(&srv, "arena-ballast", (62 << 20) - (64 << 10));
    let (target, _) = make_file(&srv, "arena-target", BIG);
    let (fresh, _) = make_file(&srv, "arena-fresh", 0);
    let mut good = Peer::connect(&srv);
    let mut p = Peer::connect(&srv);
    let a = MemoryRegion::new(p.data.pd(), BIG, Access::REMOTE).expect("mr");
    let b = MemoryRegion::new(p.data.pd(), BIG, Access::REMOTE).expect("mr");
    let first: Vec<u8> = (0..BIG).map(|i| (i % 241) as u8).collect();
    let second: Vec<u8> = (0..BIG).map(|i| (i % 239) as u8 ^ 0x5a).collect();
    let x1 = send_big_write(&mut p, &target, 0, &a, &first);
    let x2 = send_big_write(&mut p, &target, 0, &b, &second);
    expect_write_ok(&mut p, x1);
    expect_write_ok(&mut p, x2);
    let waits = srv.stats.arena_waits.load(Ordering::Relaxed);
    assert!(waits >= 1, "no call waited: the arena was not exhausted");
    assert_eq!(srv.stats.arena_exhausted.load(Ordering::Relaxed), 0);
    {
        let fs = srv._service.exports()[0].store.read();
        let ino = fs
            .lookup(fs.root(), b"arena-target", &Cred::root())
            .unwrap();
        let (data, _) = fs.read(ino, &Cred::root(), 0, BIG as u32).unwrap();
        assert!(
            data.to_contiguous()[..] == second[..],
            "the file does not hold the second WRITE"
        );
    }
    // A new file's blocks take the room for good: the next WRITE of new
    // blocks never gets any.
    let x3 = send_big_write(&mut p, &fresh, 0, &a, &first);
    expect_write_ok(&mut p, x3);
    let waits = srv.stats.arena_waits.load(Ordering::Relaxed);
    // At 1 MiB in the same file: new blocks again.
    let xid = send_big_write(&mut p, &fresh, BIG as u64, &b, &second);
    assert!(
        wait_until(|| srv.stats.arena_waits.load(Ordering::Relaxed) > waits),
        "the WRITE did not wait for memory"
    );
    // Waiting, it holds up nobody else.
    check_good(&mut good, &srv);
    assert_err_chunk(p.reply(), xid);
    assert_eq!(srv.stats.arena_exhausted.load(Ordering::Relaxed), 1);
    check_good(&mut p, &srv);
    check_good(&mut good, &srv);
}

/// Sends `CREDITS` NULLs back to back on each peer, then takes every
/// reply: each call answered once.
fn nulls_at_full_credit(peers: &mut [&mut Peer]) {
    let mut sent: Vec<HashSet<u32>> = Vec::new();
    for p in peers.iter_mut() {
        let mut xids = HashSet::new();
        for _ in 0..CREDITS {
            let xid = p.xid();
            xids.insert(xid);
            p.send(&rdma_msg(xid, no_chunks(), &null_call(xid)));
        }
        sent.push(xids);
    }
    for (p, xids) in peers.iter_mut().zip(sent.iter_mut()) {
        while !xids.is_empty() {
            let (h, _) = parse(p.reply());
            assert!(
                xids.remove(&h.xid),
                "reply to an unknown or repeated xid {h:?}"
            );
        }
    }
}

/// With shared receive queues (`--rdma-srq`): two connections on the one
/// pool thread receive from its queue of 2 x `CREDITS` buffers, each
/// sending its credits' worth of calls back to back, three times: every
/// call is answered, and the buffers go back to the queue as the calls are
/// done with. Then a requester that posts no receives sends calls until
/// it has more than its credits at the server (the server's replies to it
/// wait on receiver-not-ready, so its calls keep their credits): that
/// connection ends, the server having held no more of its calls than its
/// credits, and every buffer it took goes back to the queue (all of them
/// posted again), the two others served as before.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn connections_on_a_shared_receive_queue_share_its_buffers_and_get_back_those_of_one_that_ends() {
    let n = 2 * CREDITS;
    let srv = Server::start_config(RdmaConfig {
        srq_buffers: n,
        threads: 1,
        ..rdma_config()
    });
    assert!(
        srv.listener.shared_receives(),
        "the device has shared receive queues"
    );
    let s = srv.stats.clone();
    let posted = || s.shared_receives_posted.load(Ordering::Relaxed);
    assert_eq!(
        s.shared_receive_buffers.load(Ordering::Relaxed),
        u64::from(n)
    );
    assert_eq!(posted(), u64::from(n), "every buffer posted at start");
    let mut a = Peer::connect(&srv);
    let mut b = Peer::connect(&srv);
    // On a shared queue a requester within its credits may find it empty:
    // its Sends are retried for ever (7), not 3 times.
    assert_eq!(a.qp.rnr_attrs().expect("query the QP").retry, 7);
    for _ in 0..3 {
        nulls_at_full_credit(&mut [&mut a, &mut b]);
    }
    let taken = s.shared_receives_taken_peak.load(Ordering::Relaxed);
    assert!(
        (1..=u64::from(n)).contains(&taken),
        "taken at most {taken} of {n}"
    );
    assert!(
        wait_until(|| posted() == u64::from(n)),
        "posted {} of {n} once the calls were answered",
        posted()
    );
    let errors = s.errors.load(Ordering::Relaxed);
    let mut r = Peer::connect_posting(&srv, false).expect("connect");
    // CREDITS calls whose replies take the server's send slots, CREDITS
    // more that wait for a slot with their credits, and one beyond.
    let mut sent = 0;
    while sent < 2 * CREDITS + 1 {
        let xid = r.xid();
        if !r.try_send(&rdma_msg(xid, no_chunks(), &null_call(xid))) {
            break;
        }
        sent += 1;
    }
    let deadline = Instant::now() + T;
    while !r.dropped() {
        r.poll();
        assert!(
            Instant::now() < deadline,
            "the connection beyond its credits stayed"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        wait_until(|| s.errors.load(Ordering::Relaxed) == errors + 1),
        "{}",
        s.report()
    );
    assert!(
        wait_until(|| posted() == u64::from(n)),
        "posted {} of {n} after the connection ended: {}",
        posted(),
        s.report()
    );
    drop(r);
    // Its credits bounded the calls the server held for it, whatever it
    // took from the queue.
    let held = s.receives_held_peak.load(Ordering::Relaxed);
    assert!(
        held <= u64::from(CREDITS),
        "the server held {held} calls of one connection, credits {CREDITS}"
    );
    for _ in 0..3 {
        nulls_at_full_credit(&mut [&mut a, &mut b]);
    }
    assert!(wait_until(|| posted() == u64::from(n)));
    println!(
        "shared receive queue: {sent} calls sent beyond; {}",
        s.report()
    );
}

/// The credit grant in the reply to a NULL sent now.
fn grant_seen(p: &mut Peer) -> u32 {
    let xid = p.xid();
    p.send(&rdma_msg(xid, no_chunks(), &null_call(xid)));
    let (h, _) = parse(p.reply());
    assert_eq!(h.xid, xid);
    h.credit
}

/// With shared receive queues, each connection on a pool thread is
/// granted its share of the thread's buffers (at most its credits, at
/// least one), granted again as connections come and go: 12 buffers give
/// one connection its 8 credits, two 6 each, three 4 each, and two again
/// 6 once the third has gone. A requester that sends its full credits
/// before it has seen a lower grant is served all the same.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn a_shared_receive_queue_grants_each_connection_its_share_of_the_buffers() {
    let srv = Server::start_config(RdmaConfig {
        srq_buffers: 12,
        threads: 1,
        ..rdma_config()
    });
    assert!(srv.listener.shared_receives());
    let open = |n: u64| wait_until(|| srv.stats.open.load(Ordering::Relaxed) == n);
    let mut a = Peer::connect(&srv);
    assert_eq!(
        grant_seen(&mut a),
        CREDITS,
        "one connection: all its credits"
    );
    let mut b = Peer::connect(&srv);
    assert_eq!(grant_seen(&mut b), 6);
    assert_eq!(grant_seen(&mut a), 6);
    let mut c = Peer::connect(&srv);
    assert_eq!(grant_seen(&mut c), 4);
    assert_eq!(grant_seen(&mut a), 4);
    // Calls sent under the earlier grant, up to the credits, are served.
    nulls_at_full_credit(&mut [&mut a, &mut b]);
    drop(c);
    assert!(open(2), "{}", srv.stats.report());
    assert_eq!(
        grant_seen(&mut a),
        6,
        "the third's share back to the others"
    );
    assert_eq!(grant_seen(&mut b), 6);
    check_good(&mut a, &srv);
}

/// The replies to backward calls (RFC 8167) land in the shared receive
/// queue too: once a connection has carried one, its backward call slots
/// are kept out of the buffers shared. 12 buffers, 2 backward call slots
/// per connection: two connections 6 credits each; once the first is its
/// session's backchannel (CREATE_SESSION with CONN_BACK_CHAN, then the
/// server's CB_NULL probe on it) (12 - 2) / 2 = 5 each, with a third
/// (12 - 2) / 3 = 3 each, and 12 / 2 = 6 again once the backchannel's
/// connection has gone.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn shared_receive_queue_grants_leave_room_for_the_replies_to_backward_calls() {
    let srv = Server::start_config(RdmaConfig {
        srq_buffers: 12,
        threads: 1,
        backward_calls: 2,
        ..rdma_config()
    });
    assert!(srv.listener.shared_receives());
    let open = |n: u64| wait_until(|| srv.stats.open.load(Ordering::Relaxed) == n);
    let mut a = Peer::connect(&srv);
    let mut b = Peer::connect(&srv);
    assert_eq!(grant_seen(&mut a), 6);
    assert_eq!(grant_seen(&mut b), 6, "no backchannel yet: halves");
    let r = compound_in_process(&srv, 1, vec![exchange_id("srq-backchannel", 1)]);
    let ResOp::ExchangeId(Ok(e)) = &r.results[0] else {
        panic!("{r:?}")
    };
    let mut args = BytesMut::new();
    Compound4Args {
        tag: Utf8Str(Bytes::new()),
        minorversion: 1,
        ops: vec![create_session_back(e.clientid, e.sequenceid)],
    }
    .encode(&mut args);
    let xid = a.xid();
    let call = rpc_call(xid, NFS_PROGRAM, 4, PROC_COMPOUND, &args);
    a.send(&rdma_msg(xid, no_chunks(), &call));
    assert!(
        wait_until(|| srv.stats.backward_calls.load(Ordering::Relaxed) >= 1),
        "no backward call on the session's backchannel: {}",
        srv.stats.report()
    );
    assert_eq!(grant_seen(&mut b), 5, "2 of 12 kept for a's backward calls");
    let mut c = Peer::connect(&srv);
    assert_eq!(grant_seen(&mut c), 3);
    assert_eq!(grant_seen(&mut b), 3);
    drop(a);
    assert!(open(2), "{}", srv.stats.report());
    assert_eq!(grant_seen(&mut b), 6, "no backchannel left: halves");
    assert_eq!(grant_seen(&mut c), 6);
    check_good(&mut b, &srv);
}

/// More shared receive buffers than the device's shared receive queues
/// (or half its largest CQ) take: the listener does not start, and says
/// why.
#[test]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
fn more_shared_receive_buffers_than_the_device_takes_are_refused_at_start() {
    let rules = Exports::parse("/export *(rw)\n").unwrap();
    let device = RdmaDevice::open(SocketAddr::new(rdma_ip(), 0), 64 << 20)
        .expect("RDMA device (run with scripts/test-vm)");
    let ex = Service::exports_from_rules_with(&rules, &StoreConfig::default(), &|| {
        device.block_source()
    });
    let service = Arc::new(Service::new(ex, ServiceConfig::default()));
    let cfg = RdmaConfig {
        srq_buffers: 65_536,
        ..rdma_config()
    };
    let err = match RdmaListener::start(service, cfg, device) {
        Ok(_) => panic!("a listener with 65,536 shared receive buffers per thread started"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("--rdma-srq 65536: this device takes at most"),
        "{err}"
    );
}
