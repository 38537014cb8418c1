//! The RPC-over-RDMA transport against our server (in-process) and against
//! the Linux kernel nfsd, in the Soft-RoCE VM (`scripts/test-vm -- vm_rdma`).
//! On a machine without an RDMA device these tests are ignored.

mod common;

use bytes::Bytes;
use common::rdma::{rdma_ip, RdmaServer};
use common::{checksum, pattern, root};
use nfsrdma_client::transport::TransportStats;
use nfsrdma_client::xdr::nfs3::*;
use nfsrdma_client::{
    Client, ClientError, ConnectOptions, PollMode, RdmaOptions, RegStrategy, TransportKind,
};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn rdma(reg: RegStrategy, remote_inv: bool, poll: PollMode) -> RdmaOptions {
    RdmaOptions {
        remote_inv,
        reg,
        poll,
        ..RdmaOptions::default()
    }
}

fn mode(m: u32) -> Sattr3 {
    Sattr3 {
        mode: Some(m),
        ..Sattr3::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_every_procedure() {
    let s = RdmaServer::start();
    let c = s
        .connect(rdma(RegStrategy::Mw, true, PollMode::Event))
        .await;
    assert_eq!(c.options().transport, TransportKind::Rdma);
    let root = c.root().clone();
    c.null().await.unwrap();
    assert_eq!(c.getattr(&root).await.unwrap().type_, Ftype3::Dir);
    c.fsinfo_of(&root).await.unwrap();
    c.fsstat(&root).await.unwrap();
    assert!(c.pathconf(&root).await.unwrap().name_max >= 255);
    c.access(&root, access::READ | access::LOOKUP)
        .await
        .unwrap();

    // CREATE, WRITE (inline and Read chunk), READ (Write chunk), COMMIT,
    // SETATTR.
    let fh = c
        .create(&root, "f", CreateHow3::Guarded(mode(0o644)))
        .await
        .unwrap()
        .obj
        .unwrap();
    let e = c
        .create(&root, "f", CreateHow3::Guarded(mode(0o644)))
        .await
        .unwrap_err();
    assert_eq!(e.nfs_status(), Some(NfsStat3::Exist));
    for len in [10usize, 3000, 5000, 70_000, 1 << 20] {
        let data = pattern(len as u64, len);
        let w = c
            .write(&fh, 0, data.clone(), StableHow::FileSync)
            .await
            .unwrap();
        assert_eq!(w.count as usize, len);
        let r = c.read(&fh, 0, len as u32).await.unwrap();
        assert_eq!(r.data.to_contiguous(), data, "{len} bytes");
    }
    c.commit(&fh, 0, 0).await.unwrap();
    let wcc = c
        .setattr(
            &fh,
            &Sattr3 {
                size: Some(100),
                ..Sattr3::default()
            },
            None,
        )
        .await
        .unwrap();
    assert_eq!(wcc.after.unwrap().size, 100);
    assert_eq!(c.lookup(&root, "f").await.unwrap().object, fh);

    // MKDIR, many entries, READDIR and READDIRPLUS (Reply chunk when big).
    let d = c
        .mkdir(&root, "d", &mode(0o755))
        .await
        .unwrap()
        .obj
        .unwrap();
    for i in 0..200 {
        c.create(
            &d,
            format!("entry-with-a-long-name-{i:04}"),
            CreateHow3::Unchecked(mode(0o600)),
        )
        .await
        .unwrap();
    }
    let all = c.readdir_all(&d).await.unwrap();
    assert_eq!(all.len(), 200);
    let big = c.readdir(&d, 0, [0; 8], 32 * 1024).await.unwrap();
    assert!(
        big.reply.entries.0.len() > 100,
        "{}",
        big.reply.entries.0.len()
    );
    let plus = c.readdirplus(&d, 0, [0; 8], 8192, 64 * 1024).await.unwrap();
    assert!(!plus.reply.entries.0.is_empty());

    // SYMLINK (a long path goes in a Read chunk), READLINK (Write chunk).
    for target in ["short/target".to_string(), "x/".repeat(1000)] {
        let name = format!("s{}", target.len());
        let sl = c
            .symlink(&root, &name, &target, &Sattr3::default())
            .await
            .unwrap()
            .obj
            .unwrap();
        assert_eq!(&c.readlink(&sl).await.unwrap().data[..], target.as_bytes());
    }
    let p = c
        .mknod(&root, "p", MknodData3::Fifo(mode(0o600)))
        .await
        .unwrap();
    assert_eq!(p.obj_attributes.unwrap().type_, Ftype3::Fifo);
    c.link(&fh, &root, "g").await.unwrap();
    c.rename(&root, "g", &root, "h").await.unwrap();
    c.remove(&root, "h").await.unwrap();
    c.remove(&root, "p").await.unwrap();
    for i in 0..200 {
        c.remove(&d, format!("entry-with-a-long-name-{i:04}"))
            .await
            .unwrap();
    }
    c.rmdir(&root, "d").await.unwrap();
    let e = c.lookup(&root, "d").await.unwrap_err();
    assert_eq!(e.nfs_status(), Some(NfsStat3::Noent));
    let e = c
        .getattr(&NfsFh3::new(Bytes::from_static(b"not a handle")))
        .await
        .unwrap_err();
    assert!(e.nfs_status().is_some(), "{e}");
    let st = c.transport_stats();
    println!("stats {st:?}");
    assert_eq!(st.connects, 1);
    assert!(st.window_binds > 0 && st.send_with_invalidate > 0, "{st:?}");
    c.unmount().await.unwrap();
}

/// Bytes written and read back per record size: 64 MiB at 64 KiB and
/// above, 4,096 records below (4 MiB at 1 KiB, 16 MiB at 4 KiB), so that
/// the small sizes fit the test's time under emulation;
/// `NFSRDMA_VM_IO_MB=64` makes every size move 64 MiB.
fn io_bytes(size: u32) -> usize {
    let mb = std::env::var("NFSRDMA_VM_IO_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    if mb > 0 {
        mb << 20
    } else {
        (size as usize * 4096).min(64 << 20)
    }
}

/// `len` bytes written and read back with `size` records.
async fn round_trip(c: &Client, name: &str, size: u32, len: usize) -> Duration {
    let t = Instant::now();
    let root = c.root().clone();
    let fh = c
        .create(&root, name, CreateHow3::Unchecked(mode(0o644)))
        .await
        .unwrap()
        .obj
        .unwrap();
    // The server may lower them (the kernel nfsd's limit is 256 KiB).
    assert!(c.rsize() <= size && c.wsize() <= size);
    let data = pattern(u64::from(size), len);
    let n = c.write_all(&fh, 0, data.clone()).await.unwrap();
    assert_eq!(n as usize, len);
    let back = c.read_all(&fh).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert_eq!(
        checksum(back.parts().iter().map(|p| &p[..])),
        checksum([&data[..]]),
        "{name}: data differs"
    );
    c.remove(&root, name).await.unwrap();
    t.elapsed()
}

async fn io_matrix(reg: RegStrategy) {
    let s = RdmaServer::start();
    let swi_before = s.stats().sends_with_inv.load(Ordering::Relaxed);
    for remote_inv in [true, false] {
        for size in [1024u32, 4096, 64 << 10, 1 << 20] {
            let mut o = s.opts(rdma(reg, remote_inv, PollMode::default()));
            o.rsize = Some(size);
            o.wsize = Some(size);
            let c = Client::connect(&o, &rdma_ip().to_string(), "/export")
                .await
                .expect("connect over RDMA");
            assert_eq!((c.rsize(), c.wsize()), (size, size));
            let len = io_bytes(size);
            let took = round_trip(&c, &format!("big-{size}-{remote_inv}"), size, len).await;
            let st: TransportStats = c.transport_stats();
            println!(
                "{reg:?} remote_inv={remote_inv} records={size}: {} MiB written and read back in {took:?}; {st:?}",
                len >> 20
            );
            assert_eq!(st.connects, 1, "{st:?}");
            assert_eq!(st.retransmits, 0, "{st:?}");
            if size <= 1024 {
                // 1 KiB WRITEs and READ replies fit the 4 KiB inline
                // threshold: no chunk, nothing registered.
                assert_eq!(
                    st.read_chunk_calls + st.write_chunk_calls + st.reply_chunk_calls,
                    0,
                    "{st:?}"
                );
                assert_eq!(
                    st.window_binds + st.mr_registrations + st.send_with_invalidate,
                    0,
                    "{st:?}"
                );
                c.shutdown();
                continue;
            }
            // Every READ offered a Write chunk (one more READ may find EOF).
            let reads = len / size as usize;
            assert!(
                (reads..=reads + 1).contains(&(st.write_chunk_calls as usize)),
                "{reads} READs: {st:?}"
            );
            // READ data: lent without a copy from per-RPC regions (which
            // deregistration fences), copied out of the persistent pool;
            // with windows, records of 16 KiB and more are lent in their
            // slot's area while spare areas last (read_all holds every
            // record until the end: the rest are copied), smaller ones
            // copied.
            let (lent, copied) = (st.reply_bytes_lent, st.reply_bytes_copied);
            match reg {
                RegStrategy::RegMr => assert!(lent >= len as u64 && copied == 0, "{st:?}"),
                RegStrategy::Persistent => assert!(copied >= len as u64 && lent == 0, "{st:?}"),
                RegStrategy::Mw if size >= 16 << 10 => {
                    assert!(lent >= u64::from(size), "{st:?}");
                    assert!(lent + copied >= len as u64, "{st:?}");
                    assert!(st.window_renewals > 0, "{st:?}");
                }
                RegStrategy::Mw => {
                    assert!(copied >= len as u64 && lent == 0, "{st:?}");
                    assert_eq!(st.window_renewals, 0, "{st:?}");
                }
            }
            match reg {
                RegStrategy::Mw => {
                    assert!(st.window_binds > 0, "{st:?}");
                    if remote_inv {
                        assert!(
                            st.send_with_invalidate > 0,
                            "no Send With Invalidate: {st:?}"
                        );
                    } else {
                        assert_eq!(st.send_with_invalidate, 0, "{st:?}");
                        assert!(st.local_invalidations >= st.window_binds, "{st:?}");
                    }
                    assert_eq!(
                        st.send_with_invalidate + st.local_invalidations,
                        st.window_binds,
                        "every window fenced once: {st:?}"
                    );
                }
                RegStrategy::RegMr => {
                    assert!(st.mr_registrations > 0, "{st:?}");
                    assert_eq!(st.window_binds + st.send_with_invalidate, 0, "{st:?}");
                }
                RegStrategy::Persistent => {
                    assert_eq!(
                        st.window_binds + st.send_with_invalidate + st.local_invalidations,
                        0,
                        "{st:?}"
                    );
                }
            }
            c.shutdown();
        }
    }
    let swi = s.stats().sends_with_inv.load(Ordering::Relaxed) - swi_before;
    println!("server: {swi} Sends With Invalidate");
    if reg != RegStrategy::Mw {
        assert_eq!(swi, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_io_matrix_memory_windows() {
    io_matrix(RegStrategy::Mw).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_io_matrix_region_per_rpc() {
    io_matrix(RegStrategy::RegMr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_io_matrix_persistent() {
    io_matrix(RegStrategy::Persistent).await;
}

/// `mw` lends READ data in the slot's chunk area: the caller's `Bytes`
/// must keep their contents while later calls reuse the slots, whether
/// they were lent or (spares used up) copied, and areas come back for
/// loans once dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_lent_reads_stay_intact_while_held() {
    const REC: usize = 64 << 10;
    const RECS: usize = 48;
    let s = RdmaServer::start();
    let c = s.connect(rdma(RegStrategy::Mw, true, PollMode::Busy)).await;
    let root = c.root().clone();
    let fh = c
        .create(&root, "lent", CreateHow3::Unchecked(mode(0o644)))
        .await
        .unwrap()
        .obj
        .unwrap();
    let first = pattern(1, REC * RECS);
    c.write_all(&fh, 0, first.clone()).await.unwrap();
    let before = c.transport_stats();
    // Hold every record: more than the connection has areas to lend.
    let mut held = Vec::new();
    for i in 0..RECS {
        let r = c.read(&fh, (i * REC) as u64, REC as u32).await.unwrap();
        held.push(r.data.to_contiguous());
    }
    let st = c.transport_stats().since(&before);
    println!("held {RECS} records: {st:?}");
    assert!(st.reply_bytes_lent >= REC as u64, "nothing lent: {st:?}");
    assert!(
        st.reply_bytes_copied >= REC as u64,
        "spares never ran out: {st:?}"
    );
    assert_eq!(
        (st.reply_bytes_lent + st.reply_bytes_copied) as usize,
        REC * RECS,
        "{st:?}"
    );
    // Other data through the same slots (and windows) while those are
    // held, read with concurrency so that every slot is used.
    let second = pattern(2, REC * RECS);
    c.write_all(&fh, 0, second.clone()).await.unwrap();
    let back = c.read_all(&fh).await.unwrap();
    assert_eq!(back.to_contiguous(), second);
    drop(back);
    for (i, h) in held.iter().enumerate() {
        assert_eq!(
            &h[..],
            &first[i * REC..(i + 1) * REC],
            "record {i} changed while held"
        );
    }
    // Dropped: the areas are spares again, and loans resume.
    drop(held);
    let before = c.transport_stats();
    for i in 0..8 {
        let r = c.read(&fh, (i * REC) as u64, REC as u32).await.unwrap();
        assert_eq!(r.data.to_contiguous(), second.slice(i * REC..(i + 1) * REC));
    }
    let st = c.transport_stats().since(&before);
    assert_eq!(st.reply_bytes_lent as usize, 8 * REC, "{st:?}");
    assert_eq!(st.reply_bytes_copied, 0, "{st:?}");
    c.remove(&root, "lent").await.unwrap();
}

/// Replies reach their callers in the receive buffer they landed in, a
/// spare buffer posted in its stead. Decoded results that are kept (file
/// handles) hold no buffer: the decoder copies what it slices. Replies
/// kept undecoded take the spares; once every spare is lent the rest are
/// copied out (the calls go on, the held replies stay intact), and
/// lending resumes when they are dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_replies_are_lent_in_their_receive_buffers() {
    use nfsrdma_client::transport::rdma::{RdmaTransport, RdmaTransportOptions, RECV_BUFFERS};
    use nfsrdma_client::transport::{ReplyExpect, RpcCall, Transport};
    use nfsrdma_client::xdr::rpc::OpaqueAuth;
    use nfsrdma_client::xdr::{Xdr, XdrSink};

    let s = RdmaServer::start();
    let opts = rdma(RegStrategy::Mw, true, PollMode::Busy);
    let c = s.connect(opts).await;
    let root = c.root().clone();
    for i in 0..8 {
        c.create(&root, format!("r{i}"), CreateHow3::Unchecked(mode(0o644)))
            .await
            .unwrap();
    }
    let before = c.transport_stats();
    let mut handles = Vec::new();
    for _ in 0..10 {
        for i in 0..8 {
            handles.push((i, c.lookup(&root, format!("r{i}")).await.unwrap().object));
        }
    }
    let st = c.transport_stats().since(&before);
    assert_eq!(st.receives_copied, 0, "handles kept buffers: {st:?}");
    assert_eq!(st.receives_lent, 80, "{st:?}");
    // The handles are whole and work.
    let ids: Vec<u64> = {
        let mut v = Vec::new();
        for i in 0..8 {
            v.push(c.lookup(&root, format!("r{i}")).await.unwrap().object);
        }
        let mut ids = Vec::new();
        for fh in &v {
            ids.push(c.getattr(fh).await.unwrap().fileid);
        }
        ids
    };
    for (i, fh) in &handles {
        assert_eq!(c.getattr(fh).await.unwrap().fileid, ids[*i]);
    }

    // Replies held undecoded, on a transport of their own.
    let t = RdmaTransport::connect(
        std::net::SocketAddr::new(rdma_ip(), s.rdma_port),
        RdmaTransportOptions {
            rdma: opts,
            timeo: Duration::from_secs(60),
            ..RdmaTransportOptions::default()
        },
    )
    .await
    .expect("RDMA transport");
    let cred = OpaqueAuth::none();
    let args = Getattr3Args {
        object: root.clone(),
    };
    let encode = |sink: &mut dyn XdrSink| args.encode(sink);
    let getattr = || {
        t.call(RpcCall {
            prog: PROGRAM,
            vers: 3,
            proc_: NfsProc3::Getattr as u32,
            name: "NFS GETATTR",
            cred: &cred,
            args: &encode,
            expect: ReplyExpect::small(1024),
        })
    };
    let root_id = c.getattr(&root).await.unwrap().fileid;
    let spares = RECV_BUFFERS as usize;
    let before = t.stats();
    let mut held = Vec::new();
    for _ in 0..spares + 8 {
        held.push(getattr().await.expect("GETATTR"));
    }
    let st = t.stats().since(&before);
    assert_eq!(
        (st.receives_lent, st.receives_copied),
        (spares as u64, 8),
        "{st:?}"
    );
    let lent = held.iter().filter(|d| d.reads_lent_input()).count();
    assert_eq!(lent, spares, "decoders over lent buffers");
    // Later replies go through the posted buffers while those are held.
    for _ in 0..20 {
        let mut d = getattr().await.unwrap();
        let r = Getattr3Res::decode(&mut d).unwrap();
        assert_eq!(r.into_result().unwrap().obj_attributes.fileid, root_id);
    }
    for mut d in held {
        let r = Getattr3Res::decode(&mut d).expect("a held reply decodes");
        assert_eq!(r.into_result().unwrap().obj_attributes.fileid, root_id);
    }
    let before = t.stats();
    for _ in 0..10 {
        drop(getattr().await.unwrap());
    }
    let st = t.stats().since(&before);
    assert_eq!((st.receives_lent, st.receives_copied), (10, 0), "{st:?}");
    for i in 0..8 {
        c.remove(&root, format!("r{i}")).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_poll_modes_and_concurrency() {
    let s = RdmaServer::start();
    for poll in [PollMode::Busy, PollMode::Event, PollMode::default()] {
        let c = s.connect(rdma(RegStrategy::Mw, true, poll)).await;
        let root = c.root().clone();
        // 32 concurrent 64 KiB writes and reads: more calls than credits.
        let fh = c
            .create(&root, "conc", CreateHow3::Unchecked(mode(0o644)))
            .await
            .unwrap()
            .obj
            .unwrap();
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..32u64 {
            let (c, fh) = (c.clone(), fh.clone());
            tasks.spawn(async move {
                let data = pattern(i, 65536);
                c.write(&fh, i * 65536, data.clone(), StableHow::Unstable)
                    .await
                    .unwrap();
                let r = c.read(&fh, i * 65536, 65536).await.unwrap();
                assert_eq!(r.data.to_contiguous(), data);
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        // A QD1 run: a waiting call finds its reply with nothing else in
        // flight.
        for i in 0..16u64 {
            c.write(&fh, 0, pattern(i, 4096), StableHow::FileSync)
                .await
                .unwrap();
        }
        c.remove(&root, "conc").await.unwrap();
        let st = c.transport_stats();
        println!("{poll:?}: {:?}: {st:?}", t0.elapsed());
        // Busy polling: the waiting calls poll the completion queue
        // themselves; in the other modes only the completion thread does.
        if poll == PollMode::Busy {
            assert!(st.completions_by_caller > 0, "{st:?}");
        } else {
            assert_eq!(st.completions_by_caller, 0, "{st:?}");
        }
        c.shutdown();
        let e = c.null().await.unwrap_err();
        assert!(matches!(e, ClientError::Shutdown), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_no_listener_is_a_clear_error() {
    let s = RdmaServer::start();
    let mut o = s.opts(RdmaOptions::default());
    o.port = Some(1);
    let t = Instant::now();
    let e = Client::connect(&o, &rdma_ip().to_string(), "/export")
        .await
        .unwrap_err();
    println!("{e}");
    assert!(matches!(e, ClientError::Rdma(_)), "{e:?}");
    assert!(t.elapsed() < Duration::from_secs(20));
}

/// The queue pair's local ACK timeout: Soft-RoCE's own unless the options
/// name one; out-of-range values are refused before connecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_ack_timeout_is_soft_roces_unless_set() {
    let s = RdmaServer::start();
    let c = s.connect(RdmaOptions::default()).await;
    assert_eq!(
        c.transport_stats().ack_timeout,
        nfsrdma_client::transport::rdma::SOFT_ROCE_ACK_TIMEOUT
    );
    c.null().await.expect("NULL");
    let c = s
        .connect(RdmaOptions {
            ack_timeout: Some(16),
            ..RdmaOptions::default()
        })
        .await;
    assert_eq!(c.transport_stats().ack_timeout, 16);
    c.null().await.expect("NULL");
    for bad in [0, 32] {
        let o = s.opts(RdmaOptions {
            ack_timeout: Some(bad),
            ..RdmaOptions::default()
        });
        let e = Client::connect(&o, &rdma_ip().to_string(), "/export")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, ClientError::InvalidArgument(m) if m.contains("outside 1..=31")),
            "{bad}: {e:?}"
        );
    }
}

/// The kernel nfsd over RDMA (started with tests/vm/guest/knfsd-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_kernel_nfsd() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vm/guest/knfsd-up");
    let out = std::process::Command::new(script)
        .arg("/export")
        .output()
        .expect("run knfsd-up");
    println!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "knfsd-up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ip = rdma_ip().to_string();
    for (reg, remote_inv) in [
        (RegStrategy::Mw, true),
        (RegStrategy::Mw, false),
        (RegStrategy::RegMr, false),
        (RegStrategy::Persistent, false),
    ] {
        let o = ConnectOptions {
            transport: TransportKind::Rdma,
            port: Some(20049),
            // MOUNT through the kernel's rpcbind (port 111) and rpc.mountd.
            auth: root(),
            timeo: Duration::from_secs(30),
            rsize: Some(1 << 20),
            wsize: Some(1 << 20),
            rdma: rdma(reg, remote_inv, PollMode::default()),
            ..ConnectOptions::default()
        };
        // Every record size, data checked (the kernel nfsd's rsize/wsize
        // go down to 1 KiB).
        for size in [1024u32, 4096, 64 << 10, 1 << 20] {
            let o = ConnectOptions {
                rsize: Some(size),
                wsize: Some(size),
                ..o.clone()
            };
            let c = Client::connect(&o, &ip, "/export")
                .await
                .expect("connect to knfsd over RDMA");
            let len = io_bytes(size);
            let took = round_trip(&c, &format!("k-{reg:?}-{remote_inv}-{size}"), size, len).await;
            let st = c.transport_stats();
            println!(
                "knfsd {reg:?} remote_inv={remote_inv} records={size}: {} MiB written and read back in {took:?}; {st:?}",
                len >> 20
            );
            assert_eq!(st.retransmits, 0, "{st:?}");
            if size > 1024 {
                // As against nfsrdmad (see io_matrix).
                let (lent, copied) = (st.reply_bytes_lent, st.reply_bytes_copied);
                match reg {
                    RegStrategy::RegMr => assert!(lent >= len as u64 && copied == 0, "{st:?}"),
                    RegStrategy::Mw if size >= 16 << 10 => {
                        assert!(lent > 0 && lent + copied >= len as u64, "{st:?}")
                    }
                    _ => assert!(copied >= len as u64 && lent == 0, "{st:?}"),
                }
            }
            c.shutdown();
        }
        let c = Client::connect(&o, &ip, "/export")
            .await
            .expect("connect to knfsd over RDMA");
        let root = c.root().clone();
        c.null().await.unwrap();
        let name = format!("k-{reg:?}-{remote_inv}");
        let fh = c
            .create(&root, &name, CreateHow3::Unchecked(mode(0o644)))
            .await
            .unwrap()
            .obj
            .unwrap();
        let data = pattern(7, 4 << 20);
        c.write_all(&fh, 0, data.clone()).await.unwrap();
        let back = c.read_all(&fh).await.unwrap();
        assert_eq!(
            checksum(back.parts().iter().map(|p| &p[..])),
            checksum([&data[..]])
        );
        // Small records too, and the other reply shapes.
        for len in [100usize, 4096, 65536] {
            let r = c.read(&fh, 1000, len as u32).await.unwrap();
            assert_eq!(r.data.to_contiguous(), data.slice(1000..1000 + len));
        }
        let d = c
            .mkdir(&root, format!("{name}.d"), &mode(0o755))
            .await
            .unwrap()
            .obj
            .unwrap();
        for i in 0..100 {
            c.create(
                &d,
                format!("entry-{i:03}-padding-padding"),
                CreateHow3::Unchecked(mode(0o600)),
            )
            .await
            .unwrap();
        }
        assert_eq!(c.readdir_all(&d).await.unwrap().len(), 100);
        let big = c.readdir(&d, 0, [0; 8], 32 * 1024).await.unwrap();
        assert!(big.reply.entries.0.len() >= 100);
        let target = "t/".repeat(600);
        let sl = c
            .symlink(&d, "link", &target, &Sattr3::default())
            .await
            .unwrap()
            .obj
            .unwrap();
        assert_eq!(&c.readlink(&sl).await.unwrap().data[..], target.as_bytes());
        let st = c.transport_stats();
        println!("knfsd {reg:?} remote_inv={remote_inv}: {st:?}");
        assert_eq!(st.retransmits, 0, "{st:?}");
        if reg == RegStrategy::Mw && remote_inv {
            assert!(st.send_with_invalidate > 0, "{st:?}");
        } else {
            assert_eq!(st.send_with_invalidate, 0, "{st:?}");
        }
        if reg == RegStrategy::Mw {
            assert_eq!(
                st.send_with_invalidate + st.local_invalidations,
                st.window_binds,
                "{st:?}"
            );
        }
        c.shutdown();
    }
}

/// Without an RDMA device (the host), connecting over RDMA fails at once
/// with an RDMA error that says why.
#[tokio::test]
async fn rdma_without_a_device_fails_clearly() {
    if std::path::Path::new("/dev/infiniband/rdma_cm").exists() {
        return; // a machine with RDMA: covered by the VM tests
    }
    let o = ConnectOptions {
        transport: TransportKind::Rdma,
        port: Some(20049),
        mount_port: Some(1),
        timeo: Duration::from_secs(5),
        ..ConnectOptions::default()
    };
    let e = Client::connect(&o, "127.0.0.1", "/export")
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::Rdma(_)), "{e:?}");
    println!("{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_reconnects_when_the_server_drops_the_connection() {
    let mut s = RdmaServer::start();
    let c = s
        .connect(rdma(RegStrategy::Mw, true, PollMode::Event))
        .await;
    let root = c.root().clone();
    let fh = c
        .create(&root, "r", CreateHow3::Unchecked(mode(0o644)))
        .await
        .unwrap()
        .obj
        .unwrap();
    let data = pattern(9, 1 << 20);
    c.write_all(&fh, 0, data.clone()).await.unwrap();
    s.restart_rdma();
    // The next calls find the connection gone and reconnect.
    let t = Instant::now();
    let back = c.read_all(&fh).await.unwrap();
    assert_eq!(back.to_contiguous(), data);
    let st = c.transport_stats();
    println!("after the restart ({:?}): {st:?}", t.elapsed());
    assert!(st.connects >= 2, "{st:?}");
    // Noticed from the connection manager's disconnect, not from a call
    // timing out (timeo is 30 s here).
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    c.remove(&root, "r").await.unwrap();
}

/// A null export over RDMA: WRITEs come by RDMA Read and are dropped,
/// READs go out by RDMA Write from the store's one registered block of
/// zeros, so no payload byte is copied on the server; the metrics
/// exposition counts both, beside the RDMA counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs an RDMA device: run with scripts/test-vm"]
async fn vm_rdma_null_export_reads_zeros_from_registered_memory() {
    const LEN: usize = 256 * 1024;
    let s = RdmaServer::start_with("/null *(rw,null,no_root_squash,insecure)\n");
    let c = s
        .connect_to("/null", rdma(RegStrategy::Mw, true, PollMode::Event))
        .await;
    let root = c.root().clone();
    let fh = c
        .create(&root, "f", CreateHow3::Guarded(mode(0o644)))
        .await
        .unwrap()
        .obj
        .unwrap();
    let w = c
        .write(&fh, 0, pattern(7, LEN), StableHow::FileSync)
        .await
        .unwrap();
    assert_eq!(w.count as usize, LEN);
    assert_eq!(c.getattr(&fh).await.unwrap().size, LEN as u64);
    for _ in 0..2 {
        let r = c.read(&fh, 0, LEN as u32).await.unwrap();
        assert_eq!(r.data.len(), LEN);
        assert!(r.data.bytes().all(|b| b == 0), "a null export kept data");
    }
    let st = s.stats();
    assert!(
        st.read_bytes.load(Ordering::Relaxed) >= LEN as u64,
        "the WRITE did not come by RDMA Read: {}",
        st.report()
    );
    assert!(
        st.write_bytes.load(Ordering::Relaxed) >= 2 * LEN as u64,
        "the READs did not go by RDMA Write: {}",
        st.report()
    );
    assert_eq!(
        st.payload_copies.load(Ordering::Relaxed),
        0,
        "zeros were copied: {}",
        st.report()
    );
    let text = nfsrdma_server::exporter::Sources {
        service: s.service.clone(),
        tcp: None,
        rdma: Some(st.clone()),
    }
    .render();
    for (series, want) in [
        (
            r#"nfsrdmad_null_read_bytes_total{export="/null"}"#,
            (2 * LEN) as f64,
        ),
        (
            r#"nfsrdmad_null_discarded_bytes_total{export="/null"}"#,
            LEN as f64,
        ),
        ("nfsrdmad_rdma_payload_copied_bytes_total", 0.0),
        ("nfsrdmad_rdma_connections_open", 1.0),
        (r#"nfsrdmad_nfs_calls_total{procedure="READ"}"#, 2.0),
        (
            r#"nfsrdmad_turnaround_seconds_count{transport="rdma",procedure="READ",size="256k"}"#,
            2.0,
        ),
        (
            r#"nfsrdmad_turnaround_seconds_count{transport="rdma",procedure="WRITE",size="256k"}"#,
            1.0,
        ),
    ] {
        let got = text.lines().find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        });
        assert_eq!(got, Some(want), "{series} in\n{text}");
    }
    let calls = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("nfsrdmad_rdma_calls_total ")?
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(0.0);
    assert!(calls >= 5.0, "{text}");
}
