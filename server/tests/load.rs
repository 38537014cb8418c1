//! Load over TCP: 64 connections, each keeping 32 calls in flight (a mix of
//! 4 KiB WRITEs and READs of a file per connection, and GETATTRs) against
//! the nfsrdmad binary for `NFSRDMA_LOAD_SECS` seconds (default 60). Every
//! reply must be a success with the right data, no connection may starve,
//! and the daemon's memory must stay within the bound its design sets.

use bytes::{Bytes, BytesMut};
use nfsrdma_xdr::nfs3::*;
use nfsrdma_xdr::record::{marker, RecordReader};
use nfsrdma_xdr::rpc::{AcceptStat, AuthSysParms, OpaqueAuth, ReplyBody, RpcMessage};
use nfsrdma_xdr::{mount, BoundedVec, Decoder, Xdr};
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CONNS: usize = 64;
const DEPTH: usize = 32;
const FILE_BLOCKS: u64 = 256; // 1 MiB per connection

fn cred() -> OpaqueAuth {
    OpaqueAuth::auth_sys(&AuthSysParms {
        stamp: 0,
        machinename: "load".into(),
        uid: 0,
        gid: 0,
        gids: BoundedVec(vec![]),
    })
}

fn call(xid: u32, prog: u32, proc_: u32, args: &dyn Fn(&mut BytesMut)) -> Bytes {
    let mut b = BytesMut::new();
    b.extend_from_slice(&[0; 4]);
    RpcMessage::call(xid, prog, 3, proc_, cred()).encode(&mut b);
    args(&mut b);
    let len = b.len() - 4;
    b[..4].copy_from_slice(&marker(len as u32, true));
    b.freeze()
}

struct Conn {
    s: TcpStream,
    r: RecordReader,
    xid: u32,
}

impl Conn {
    async fn recv(&mut self) -> (u32, Decoder) {
        loop {
            if let Some(rec) = self.r.next_record().expect("record") {
                let mut d = Decoder::new(rec);
                let h = RpcMessage::decode(&mut d).expect("reply header");
                match h.as_reply() {
                    Some(ReplyBody::Accepted(a)) if a.stat == AcceptStat::Success => {}
                    other => panic!("call {} failed: {other:?}", h.xid),
                }
                return (h.xid, d);
            }
            let buf = self.r.buffer_mut();
            buf.reserve(64 * 1024);
            let n = self.s.read_buf(buf).await.expect("read");
            assert!(n > 0, "server closed a connection under load");
        }
    }

    async fn rpc(
        &mut self,
        prog: u32,
        proc_: u32,
        args: &(dyn Fn(&mut BytesMut) + Sync),
    ) -> Decoder {
        self.xid += 1;
        let c = call(self.xid, prog, proc_, args);
        self.s.write_all(&c).await.unwrap();
        let (x, d) = self.recv().await;
        assert_eq!(x, self.xid);
        d
    }
}

fn pattern(conn: usize, block: u64, gen: u32) -> u8 {
    (conn as u64 * 31 + block * 7 + u64::from(gen)) as u8
}

/// One connection's life: set up its file, then keep DEPTH calls in flight
/// until `end`, checking every reply. Returns the calls completed.
async fn drive(addr: SocketAddr, id: usize, end: Instant) -> u64 {
    let s = TcpStream::connect(addr).await.unwrap();
    s.set_nodelay(true).unwrap();
    let mut c = Conn {
        s,
        r: RecordReader::new(8 << 20),
        xid: (id as u32) << 20,
    };
    let mut d = c
        .rpc(mount::PROGRAM, mount::proc_::MNT, &|b| {
            mount::DirPath::from("/export").encode(b)
        })
        .await;
    let root = match mount::MountRes3::decode(&mut d).unwrap() {
        mount::MountRes3::Ok(ok) => NfsFh3(ok.fhandle.0),
        e => panic!("{e:?}"),
    };
    let name = format!("load-{id}");
    let mut d = c
        .rpc(PROGRAM, NfsProc3::Create as u32, &|b| {
            Create3Args {
                where_: DirOpArgs3 {
                    dir: root.clone(),
                    name: Filename3::new(name.clone().into_bytes()),
                },
                how: CreateHow3::Unchecked(Sattr3::default()),
            }
            .encode(b)
        })
        .await;
    let fh = match Create3Res::decode(&mut d).unwrap() {
        NfsResult::Ok(ok) => ok.obj.unwrap(),
        e => panic!("{e:?}"),
    };
    // What each block holds (generation of its last acknowledged write).
    let mut gens = vec![0u32; FILE_BLOCKS as usize];
    for blk in 0..FILE_BLOCKS {
        let mut d = c
            .rpc(PROGRAM, NfsProc3::Write as u32, &|b| {
                Write3Args {
                    file: fh.clone(),
                    offset: blk * 4096,
                    count: 4096,
                    stable: StableHow::FileSync,
                    data: Data::new(vec![pattern(id, blk, 0); 4096]),
                }
                .encode(b)
            })
            .await;
        assert_eq!(Write3Res::decode(&mut d).unwrap().status(), NfsStat3::Ok);
    }
    // In flight: xid -> (kind, block, generation written).
    let mut inflight: HashMap<u32, (u8, u64, u32)> = HashMap::new();
    let mut done = 0u64;
    let mut n = 0u64;
    // A block is written by at most one call at a time, and read only
    // while no write to it is in flight, so every READ has one right answer.
    let mut busy = vec![false; FILE_BLOCKS as usize];
    loop {
        while inflight.len() < DEPTH && Instant::now() < end {
            n += 1;
            let blk = (n * 2654435761 % FILE_BLOCKS) as usize;
            c.xid += 1;
            let kind = (n % 3) as u8;
            let msg = match kind {
                0 if !busy[blk] => {
                    busy[blk] = true;
                    let g = gens[blk] + 1;
                    inflight.insert(c.xid, (0, blk as u64, g));
                    call(c.xid, PROGRAM, NfsProc3::Write as u32, &|b| {
                        Write3Args {
                            file: fh.clone(),
                            offset: blk as u64 * 4096,
                            count: 4096,
                            stable: StableHow::Unstable,
                            data: Data::new(vec![pattern(id, blk as u64, g); 4096]),
                        }
                        .encode(b)
                    })
                }
                1 if !busy[blk] => {
                    busy[blk] = true;
                    inflight.insert(c.xid, (1, blk as u64, gens[blk]));
                    call(c.xid, PROGRAM, NfsProc3::Read as u32, &|b| {
                        Read3Args {
                            file: fh.clone(),
                            offset: blk as u64 * 4096,
                            count: 4096,
                        }
                        .encode(b)
                    })
                }
                _ => {
                    inflight.insert(c.xid, (2, 0, 0));
                    call(c.xid, PROGRAM, NfsProc3::Getattr as u32, &|b| {
                        Getattr3Args { object: fh.clone() }.encode(b)
                    })
                }
            };
            c.s.write_all(&msg).await.unwrap();
        }
        if inflight.is_empty() {
            break;
        }
        let (xid, mut d) = c.recv().await;
        let (kind, blk, g) = inflight.remove(&xid).expect("reply to a call in flight");
        match kind {
            0 => {
                assert_eq!(Write3Res::decode(&mut d).unwrap().status(), NfsStat3::Ok);
                gens[blk as usize] = g;
                busy[blk as usize] = false;
            }
            1 => {
                match Read3Res::decode(&mut d).unwrap() {
                    NfsResult::Ok(r) => {
                        let want = pattern(id, blk, g);
                        assert!(
                            r.data.len() == 4096 && r.data.bytes().all(|x| x == want),
                            "connection {id}: block {blk} read back wrong data"
                        );
                    }
                    e => panic!("{e:?}"),
                }
                busy[blk as usize] = false;
            }
            _ => assert_eq!(Getattr3Res::decode(&mut d).unwrap().status(), NfsStat3::Ok),
        }
        done += 1;
    }
    done
}

fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn sixty_four_connections_at_depth_32() {
    let secs: u64 = std::env::var("NFSRDMA_LOAD_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let mut child = Command::new(env!("CARGO_BIN_EXE_nfsrdmad"))
        .args([
            "--export",
            "/export",
            "--tcp",
            "127.0.0.1:0",
            "--no-rpcbind",
            "--no-rdma",
        ])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line.trim().rsplit(' ').next().unwrap().parse().unwrap();
    let rss_start = rss_kib(child.id());

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(secs);
    let pid = child.id();
    let (per_conn, peak) = rt.block_on(async move {
        let sampler = tokio::spawn(async move {
            let mut peak = 0;
            while Instant::now() < end {
                peak = peak.max(rss_kib(pid));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            peak
        });
        let tasks: Vec<_> = (0..CONNS)
            .map(|i| tokio::spawn(drive(addr, i, end)))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.expect("a connection's driver failed"));
        }
        (out, sampler.await.unwrap())
    });
    let _ = child.kill();
    let _ = child.wait();

    let total: u64 = per_conn.iter().sum();
    let min = *per_conn.iter().min().unwrap();
    let max = *per_conn.iter().max().unwrap();
    eprintln!(
        "load: {CONNS} connections x depth {DEPTH} for {secs}s: {total} calls, \
         per connection min {min} max {max}; server RSS start {rss_start} KiB, peak {peak} KiB"
    );
    // No connection starves.
    assert!(min > 0, "a connection made no progress");
    assert!(min * 20 >= max, "unfair service: min {min}, max {max}");
    // The bound from the design: the file data (64 files of 1 MiB in 64 KiB
    // blocks = 64 MiB), each connection's receive buffer growing to at most
    // its largest burst (DEPTH 4 KiB WRITEs ~ 130 KiB, plus 64 KiB of read
    // reserve) and its queued replies (DEPTH 4 KiB READ replies ~ 130 KiB),
    // and the empty daemon.
    let bound = rss_start + 64 * 1024 + CONNS as u64 * (130 + 64 + 130) + 16 * 1024;
    assert!(
        peak <= bound,
        "server RSS peaked at {peak} KiB, above the bound {bound} KiB"
    );
}
