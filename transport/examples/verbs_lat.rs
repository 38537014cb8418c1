//! Ping-pong latency of the verbs layer, in the style of perftest's
//! `ib_send_lat` and `ib_write_lat`: both ends run in this process (two
//! threads, connected over rdma_cm to the device's own address), and the
//! reported latency is half the round-trip time.
//!
//! * `send`: the client Sends, the server's receive completes, the server
//!   Sends back (completion polling on both sides, like `ib_send_lat`).
//! * `write`: the client RDMA Writes into the server's buffer, the server
//!   spins on the buffer's last byte, then writes back (memory polling,
//!   like `ib_write_lat`).
//!
//! Needs an RDMA device; in the Soft-RoCE VM:
//!
//! ```text
//! cargo build --release -p nfsrdma-transport --example verbs_lat
//! tests/vm/run -- sh -c 'target/release/examples/verbs_lat;
//!     ib_send_lat -x 1 -a -n 1000 & sleep 1; ib_send_lat -x 1 -a -n 1000 10.99.0.1; wait;
//!     ib_write_lat -x 1 -a -n 1000 & sleep 1; ib_write_lat -x 1 -a -n 1000 10.99.0.1; wait'
//! ```
//!
//! perftest's `t_typical` is a median like the column printed here; compare
//! numbers only within one VM run (absolute times under emulation vary
//! between boots).
//!
//! Options: `--iters N` (default 1000), `--warmup N` (default 50),
//! `--max-size BYTES` (default 65536), `--test send|write|both`,
//! `--addr IP` (default `$NFSRDMA_RDMA_ADDR` or 10.99.0.1).

use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nfsrdma_transport::rdma::verbs::{
    Access, CmEventKind, CmId, CompletionQueue, ConnParam, EventChannel, MemoryRegion,
    ProtectionDomain, QpCaps, QueuePair, RemoteBuf, SendFlags, SendOp, VerbsError, WcOpcode,
};

const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
struct Opts {
    iters: usize,
    warmup: usize,
    max_size: usize,
    send: bool,
    write: bool,
    addr: IpAddr,
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Opts {
        iters: 1000,
        warmup: 50,
        max_size: 65536,
        send: true,
        write: true,
        addr: std::env::var("NFSRDMA_RDMA_ADDR")
            .ok()
            .and_then(|a| a.parse().ok())
            .unwrap_or(IpAddr::from([10, 99, 0, 1])),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--iters" => o.iters = val()?.parse().map_err(|e| format!("--iters: {e}"))?,
            "--warmup" => o.warmup = val()?.parse().map_err(|e| format!("--warmup: {e}"))?,
            "--max-size" => o.max_size = val()?.parse().map_err(|e| format!("--max-size: {e}"))?,
            "--addr" => o.addr = val()?.parse().map_err(|e| format!("--addr: {e}"))?,
            "--test" => match val()?.as_str() {
                "send" => (o.send, o.write) = (true, false),
                "write" => (o.send, o.write) = (false, true),
                "both" => (o.send, o.write) = (true, true),
                other => return Err(format!("--test {other}: expected send, write or both")),
            },
            "-h" | "--help" => {
                return Err(
                    "usage: verbs_lat [--iters N] [--warmup N] [--max-size BYTES] \
                            [--test send|write|both] [--addr IP]"
                        .into(),
                )
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.iters == 0 || o.max_size < 2 || o.max_size > 1 << 30 {
        return Err("--iters must be > 0 and --max-size within 2..=1 GiB".into());
    }
    Ok(o)
}

fn sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 2;
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}

/// One connected end with a buffer the peer may write.
struct End {
    id: CmId,
    cq: Arc<CompletionQueue>,
    qp: Arc<QueuePair>,
    send_buf: Arc<MemoryRegion>,
    recv_buf: Arc<MemoryRegion>,
}

fn caps() -> QpCaps {
    QpCaps {
        max_send_wr: 256,
        max_recv_wr: 256,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    }
}

fn make_end(id: CmId, max_size: usize) -> Result<End, VerbsError> {
    let ctx = id.context()?;
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::new(&ctx, 1024, None)?;
    let qp = id.create_qp(&pd, &cq, &cq, caps())?;
    let send_buf = MemoryRegion::new(&pd, max_size, Access::LOCAL)?;
    let recv_buf = MemoryRegion::new(&pd, max_size, Access::REMOTE)?;
    Ok(End {
        id,
        cq,
        qp,
        send_buf,
        recv_buf,
    })
}

impl End {
    /// Spins until a receive completes; send completions are checked and
    /// dropped on the way.
    fn wait_recv(&self) -> Result<u32, String> {
        let deadline = Instant::now() + TIMEOUT;
        loop {
            while let Some(wc) = self.cq.poll_one().map_err(|e| e.to_string())? {
                if let Err(e) = wc.status {
                    return Err(format!("completion {}: {e}", wc.wr_id));
                }
                if wc.opcode == WcOpcode::Recv {
                    return Ok(wc.byte_len);
                }
            }
            if Instant::now() > deadline {
                return Err("timed out waiting for a receive".into());
            }
            idle();
        }
    }

    fn drain_sends(&self) -> Result<(), String> {
        while let Some(wc) = self.cq.poll_one().map_err(|e| e.to_string())? {
            if let Err(e) = wc.status {
                return Err(format!("completion {}: {e}", wc.wr_id));
            }
        }
        Ok(())
    }

    fn post_recv(&self, size: usize) -> Result<(), String> {
        let sge = self.recv_buf.sge(0, size).map_err(|e| e.to_string())?;
        self.qp.post_recv_one(0, &[sge]).map_err(|e| e.to_string())
    }

    fn send(&self, size: usize) -> Result<(), String> {
        let sge = self.send_buf.sge(0, size).map_err(|e| e.to_string())?;
        self.qp
            .post_send_one(1, SendOp::Send { sges: &[sge] }, SendFlags::SIGNALED)
            .map_err(|e| e.to_string())
    }

    fn write(&self, size: usize, marker: u8, remote: RemoteBuf) -> Result<(), String> {
        self.send_buf
            .write_at(size - 1, &[marker])
            .map_err(|e| e.to_string())?;
        let sge = self.send_buf.sge(0, size).map_err(|e| e.to_string())?;
        self.qp
            .post_send_one(
                2,
                SendOp::RdmaWrite {
                    sges: &[sge],
                    remote,
                },
                SendFlags::SIGNALED,
            )
            .map_err(|e| e.to_string())
    }

    /// Spins until the peer's write put `marker` in the last byte.
    fn wait_marker(&self, size: usize, marker: u8) -> Result<(), String> {
        let deadline = Instant::now() + TIMEOUT;
        let mut b = [0u8];
        loop {
            self.recv_buf
                .read_at(size - 1, &mut b)
                .map_err(|e| e.to_string())?;
            if b[0] == marker {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err("timed out waiting for the peer's write".into());
            }
            self.drain_sends()?;
            idle();
        }
    }
}

/// Both ends spin in one process; on a machine with few CPUs they can land
/// on the same one, and then a pure spin only hands over at the scheduler
/// tick (milliseconds). Yielding lets the other end run at once.
fn idle() {
    std::thread::yield_now();
}

/// Non-zero marker for iteration `n` (never equal for consecutive `n`).
fn marker(n: usize) -> u8 {
    (n % 255) as u8 + 1
}

fn server(
    o: Opts,
    lch: Arc<EventChannel>,
    peer: mpsc::Sender<RemoteBuf>,
    mine: mpsc::Receiver<RemoteBuf>,
) -> Result<(), String> {
    let req = lch
        .expect(CmEventKind::ConnectRequest, Some(TIMEOUT))
        .map_err(|e| e.to_string())?
        .into_request()
        .ok_or("connect request without id")?;
    let end = make_end(req.id, o.max_size).map_err(|e| e.to_string())?;
    for _ in 0..128 {
        end.post_recv(o.max_size)?;
    }
    // Tell the client where to write, before accepting.
    peer.send(
        end.recv_buf
            .remote(0, o.max_size)
            .map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    end.id
        .accept(&ConnParam::default())
        .map_err(|e| e.to_string())?;
    lch.expect(CmEventKind::Established, Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    let client_buf = mine.recv().map_err(|e| e.to_string())?;
    let total = o.warmup + o.iters;
    let mut n = 0usize;
    for size in sizes(o.max_size) {
        if o.send {
            for _ in 0..total {
                end.wait_recv()?;
                end.post_recv(o.max_size)?;
                end.send(size)?;
            }
        }
        if o.write {
            for _ in 0..total {
                n += 1;
                end.wait_marker(size, marker(n))?;
                end.write(size, marker(n), client_buf)?;
            }
        }
    }
    end.drain_sends()?;
    Ok(())
}

struct Row {
    min: f64,
    median: f64,
    avg: f64,
    p99: f64,
}

fn summarize(mut rtts: Vec<Duration>) -> Row {
    rtts.sort();
    let half_us = |d: Duration| d.as_secs_f64() * 1e6 / 2.0;
    let n = rtts.len();
    Row {
        min: half_us(rtts[0]),
        median: half_us(rtts[n / 2]),
        avg: rtts.iter().map(|d| half_us(*d)).sum::<f64>() / n as f64,
        p99: half_us(rtts[(n * 99 / 100).min(n - 1)]),
    }
}

fn run() -> Result<(), String> {
    let o = parse_opts()?;
    let lch = EventChannel::new().map_err(|e| e.to_string())?;
    let listener = CmId::new(&lch).map_err(|e| e.to_string())?;
    listener
        .bind_addr(SocketAddr::new(o.addr, 0))
        .map_err(|e| e.to_string())?;
    listener.listen(1).map_err(|e| e.to_string())?;
    let port = listener.local_port();

    let (to_client, from_server) = mpsc::channel();
    let (to_server, from_client) = mpsc::channel();
    let so = o.clone();
    let srv = std::thread::spawn(move || server(so, lch, to_client, from_client));

    let cch = EventChannel::new().map_err(|e| e.to_string())?;
    let id = CmId::new(&cch).map_err(|e| e.to_string())?;
    id.resolve(SocketAddr::new(o.addr, port), TIMEOUT)
        .map_err(|e| e.to_string())?;
    let end = make_end(id, o.max_size).map_err(|e| e.to_string())?;
    for _ in 0..128 {
        end.post_recv(o.max_size)?;
    }
    end.id
        .connect(&ConnParam::default())
        .map_err(|e| e.to_string())?;
    let server_buf: RemoteBuf = from_server.recv().map_err(|e| e.to_string())?;
    cch.expect(CmEventKind::Established, Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    to_server
        .send(
            end.recv_buf
                .remote(0, o.max_size)
                .map_err(|e| e.to_string())?,
        )
        .map_err(|e| e.to_string())?;

    let device = end.qp.pd().context().name();
    println!(
        "verbs_lat: device {device}, {} iterations (+{} warm-up) per size, latency = RTT/2 in microseconds",
        o.iters, o.warmup
    );
    println!(
        "{:<6} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "test", "bytes", "iters", "t_min", "t_typical", "t_avg", "t_99%"
    );
    let total = o.warmup + o.iters;
    let mut n = 0usize;
    for size in sizes(o.max_size) {
        if o.send {
            let mut rtts = Vec::with_capacity(o.iters);
            for i in 0..total {
                let t0 = Instant::now();
                end.send(size)?;
                end.wait_recv()?;
                let rtt = t0.elapsed();
                end.post_recv(o.max_size)?;
                if i >= o.warmup {
                    rtts.push(rtt);
                }
            }
            let r = summarize(rtts);
            println!(
                "{:<6} {:>8} {:>10} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                "send", size, o.iters, r.min, r.median, r.avg, r.p99
            );
        }
        if o.write {
            let mut rtts = Vec::with_capacity(o.iters);
            for i in 0..total {
                n += 1;
                let t0 = Instant::now();
                end.write(size, marker(n), server_buf)?;
                end.wait_marker(size, marker(n))?;
                let rtt = t0.elapsed();
                if i >= o.warmup {
                    rtts.push(rtt);
                }
            }
            let r = summarize(rtts);
            println!(
                "{:<6} {:>8} {:>10} {:>10.2} {:>10.2} {:>10.2} {:>10.2}",
                "write", size, o.iters, r.min, r.median, r.avg, r.p99
            );
        }
    }
    end.drain_sends()?;
    srv.join()
        .map_err(|_| "server thread panicked".to_string())??;
    Ok(())
}

fn main() {
    if let Err(e) = run() {
        eprintln!("verbs_lat: {e}");
        std::process::exit(1);
    }
}
