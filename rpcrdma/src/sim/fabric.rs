//! A simulated reliable-connected link between two sides: registered
//! memory with R_keys, a send queue and a receive queue per side, and
//! completion queues, with the rules of an RC queue pair that the
//! protocol relies on.
//!
//! - Work on a send queue runs in the order posted and completes in that
//!   order; only signaled requests and failures report completions.
//! - A Send needs a receive posted at the peer: without one it is retried
//!   (receiver-not-ready) up to `rnr_retries` times, then fails. A Send
//!   longer than the receive buffer fails both sides.
//! - RDMA Read and Write name the peer's memory by R_key, address and
//!   length; a key that is unknown, invalidated, lacks the access, or a
//!   range outside what it covers fails the request and both queue pairs.
//! - Send With Invalidate invalidates the named key at the receiver, and
//!   the receive completion says which; a key the receiver cannot
//!   invalidate fails both sides.
//! - A queue pair in error flushes every outstanding request, signaled or
//!   not, and every posted receive; so does a disconnect.
//!
//! Every remote access is logged, so tests can ask whether a peer touched
//! memory after its owner was done with it.

use crate::conn::RemoteSeg;
use std::collections::{HashMap, VecDeque};

/// Which side of the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SideId {
    /// The side that connected (the forward requester).
    A = 0,
    /// The side that accepted (the forward responder).
    B = 1,
}

impl SideId {
    /// The other side.
    pub fn peer(self) -> SideId {
        match self {
            SideId::A => SideId::B,
            SideId::B => SideId::A,
        }
    }
}

/// Access a key grants to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RemoteAccess {
    /// RDMA Read.
    pub read: bool,
    /// RDMA Write.
    pub write: bool,
}

#[derive(Debug)]
struct Region {
    base: u64,
    bytes: Vec<u8>,
}

#[derive(Debug, Clone, Copy)]
struct Key {
    region: u32,
    /// Range of the region the key covers.
    offset: usize,
    len: usize,
    access: RemoteAccess,
    valid: bool,
    /// The peer may invalidate it (Send With Invalidate).
    remote_invalidate: bool,
}

/// One side's registered memory.
#[derive(Debug, Default)]
pub struct Memory {
    regions: HashMap<u32, Region>,
    keys: HashMap<u32, Key>,
    region_keys: HashMap<u32, u32>,
    next_region: u32,
    next_key: u32,
}

impl Memory {
    /// Registers `len` zeroed bytes; returns the region's handle (also a
    /// key with the access given, covering the whole region).
    pub fn register(&mut self, len: usize, access: RemoteAccess) -> u32 {
        self.next_region += 1;
        let r = self.next_region;
        self.regions.insert(
            r,
            Region {
                base: u64::from(r) << 32,
                bytes: vec![0; len],
            },
        );
        self.next_key += 1;
        let key = self.next_key << 8;
        self.keys.insert(
            key,
            Key {
                region: r,
                offset: 0,
                len,
                access,
                valid: true,
                remote_invalidate: false,
            },
        );
        self.region_keys.insert(r, key);
        r
    }

    /// The address of `offset` in region `r`.
    pub fn addr(&self, r: u32, offset: usize) -> u64 {
        self.regions.get(&r).map_or(0, |g| g.base + offset as u64)
    }

    /// The key that covers region `r` whole.
    pub fn region_key(&self, r: u32) -> u32 {
        self.region_keys.get(&r).copied().unwrap_or(0)
    }

    /// A new key over `offset..offset + len` of region `r` (a memory window
    /// bound there), which the peer may invalidate.
    pub fn bind(&mut self, r: u32, offset: usize, len: usize, access: RemoteAccess) -> u32 {
        self.next_key += 1;
        let key = self.next_key << 8 | 0x5a;
        self.keys.insert(
            key,
            Key {
                region: r,
                offset,
                len,
                access,
                valid: true,
                remote_invalidate: true,
            },
        );
        key
    }

    /// Invalidates `key`; false when it was not valid.
    pub fn invalidate(&mut self, key: u32) -> bool {
        match self.keys.get_mut(&key) {
            Some(k) if k.valid => {
                k.valid = false;
                true
            }
            _ => false,
        }
    }

    /// Whether `key` is valid.
    pub fn is_valid(&self, key: u32) -> bool {
        self.keys.get(&key).is_some_and(|k| k.valid)
    }

    /// Drops region `r` and every key over it.
    pub fn deregister(&mut self, r: u32) {
        self.regions.remove(&r);
        self.keys.retain(|_, k| k.region != r);
        self.region_keys.remove(&r);
    }

    /// Writes into region `r` (local access).
    pub fn write(&mut self, r: u32, offset: usize, data: &[u8]) -> bool {
        match self.regions.get_mut(&r) {
            Some(g)
                if offset
                    .checked_add(data.len())
                    .is_some_and(|e| e <= g.bytes.len()) =>
            {
                g.bytes[offset..offset + data.len()].copy_from_slice(data);
                true
            }
            _ => false,
        }
    }

    /// Reads from region `r` (local access).
    pub fn read(&self, r: u32, offset: usize, len: usize) -> Option<Vec<u8>> {
        let g = self.regions.get(&r)?;
        let end = offset.checked_add(len)?;
        g.bytes.get(offset..end).map(<[u8]>::to_vec)
    }

    /// Resolves a remote access: the region and offset, or why not.
    fn resolve(&self, seg: &RemoteSeg, write: bool) -> Result<(u32, usize), &'static str> {
        let k = self.keys.get(&seg.rkey).ok_or("unknown R_key")?;
        if !k.valid {
            return Err("invalidated R_key");
        }
        if (write && !k.access.write) || (!write && !k.access.read) {
            return Err("R_key without that access");
        }
        let g = self.regions.get(&k.region).ok_or("region gone")?;
        let start = g.base + k.offset as u64;
        let end = start + k.len as u64;
        let seg_end = seg
            .addr
            .checked_add(u64::from(seg.len))
            .ok_or("range overflows")?;
        if seg.addr < start || seg_end > end {
            return Err("range outside the R_key");
        }
        Ok((k.region, (seg.addr - g.base) as usize))
    }
}

/// A posted send-queue work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SimWr {
    /// A Send (With Invalidate of `invalidate`).
    Send {
        /// Id.
        wr: u64,
        /// Reports a completion.
        signaled: bool,
        /// The message.
        data: Vec<u8>,
        /// R_key to invalidate at the peer.
        invalidate: Option<u32>,
    },
    /// An RDMA Write.
    Write {
        /// Id.
        wr: u64,
        /// Reports a completion.
        signaled: bool,
        /// What to write.
        data: Vec<u8>,
        /// Where.
        remote: RemoteSeg,
    },
    /// An RDMA Read into local region `region` at `offset`.
    Read {
        /// Id.
        wr: u64,
        /// Reports a completion.
        signaled: bool,
        /// From where.
        remote: RemoteSeg,
        /// Local region.
        region: u32,
        /// Offset in it.
        offset: usize,
    },
    /// Invalidates one of our own keys.
    LocalInv {
        /// Id.
        wr: u64,
        /// Reports a completion.
        signaled: bool,
        /// The key.
        rkey: u32,
    },
}

impl SimWr {
    fn id(&self) -> u64 {
        match self {
            SimWr::Send { wr, .. }
            | SimWr::Write { wr, .. }
            | SimWr::Read { wr, .. }
            | SimWr::LocalInv { wr, .. } => *wr,
        }
    }

    fn signaled(&self) -> bool {
        match self {
            SimWr::Send { signaled, .. }
            | SimWr::Write { signaled, .. }
            | SimWr::Read { signaled, .. }
            | SimWr::LocalInv { signaled, .. } => *signaled,
        }
    }
}

/// How a work request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// It succeeded.
    Ok,
    /// The queue pair was in error before it ran.
    Flushed,
    /// It failed.
    Failed(&'static str),
}

/// A completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimCompletion {
    /// The work request's id.
    pub wr: u64,
    /// How it ended.
    pub status: Status,
    /// A receive's message.
    pub data: Vec<u8>,
    /// The key a Send With Invalidate invalidated (receives).
    pub invalidated: Option<u32>,
    /// A receive (as opposed to a send-queue request).
    pub recv: bool,
}

/// A logged remote access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AccessLog {
    /// The side whose memory was accessed.
    pub owner: SideId,
    /// The key used.
    pub rkey: u32,
    /// A write (else a read).
    pub write: bool,
    /// The fabric's step count when it happened.
    pub step: u64,
}

#[derive(Debug, Default)]
struct Side {
    memory: Memory,
    sq: VecDeque<SimWr>,
    rq: VecDeque<(u64, usize)>,
    cq: VecDeque<SimCompletion>,
    error: bool,
    rnr_tries: u32,
    /// Work requests that ran (for tests of ordering).
    ran: u64,
}

/// What one step of a send queue did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// Nothing to run.
    Idle,
    /// The head request ran.
    Ran,
    /// The head Send found no receive posted and will be retried.
    ReceiverNotReady,
    /// Something failed; both queue pairs are in error.
    Failed,
}

/// The link.
#[derive(Debug)]
pub struct Fabric {
    sides: [Side; 2],
    /// Receiver-not-ready retries before a Send fails.
    pub rnr_retries: u32,
    step: u64,
    log: Vec<AccessLog>,
}

impl Default for Fabric {
    fn default() -> Self {
        Fabric::new(7)
    }
}

impl Fabric {
    /// A link whose Sends are retried `rnr_retries` times while the peer
    /// has no receive posted.
    pub fn new(rnr_retries: u32) -> Fabric {
        Fabric {
            sides: [Side::default(), Side::default()],
            rnr_retries,
            step: 0,
            log: Vec::new(),
        }
    }

    fn side(&mut self, s: SideId) -> &mut Side {
        &mut self.sides[s as usize]
    }

    /// A side's memory.
    pub fn memory(&mut self, s: SideId) -> &mut Memory {
        &mut self.side(s).memory
    }

    /// A side's memory, to look at.
    pub fn memory_ref(&self, s: SideId) -> &Memory {
        &self.sides[s as usize].memory
    }

    /// Posts a receive of `len` bytes.
    pub fn post_recv(&mut self, s: SideId, wr: u64, len: usize) {
        let side = self.side(s);
        if side.error {
            side.cq.push_back(SimCompletion {
                wr,
                status: Status::Flushed,
                data: Vec::new(),
                invalidated: None,
                recv: true,
            });
        } else {
            side.rq.push_back((wr, len));
        }
    }

    /// Posts send-queue work.
    pub fn post_send(&mut self, s: SideId, wr: SimWr) {
        let side = self.side(s);
        if side.error {
            side.cq.push_back(SimCompletion {
                wr: wr.id(),
                status: Status::Flushed,
                data: Vec::new(),
                invalidated: None,
                recv: false,
            });
        } else {
            side.sq.push_back(wr);
        }
    }

    /// Takes a side's next completion.
    pub fn poll(&mut self, s: SideId) -> Option<SimCompletion> {
        self.side(s).cq.pop_front()
    }

    /// Whether a side has completions waiting.
    pub fn has_completions(&self, s: SideId) -> bool {
        !self.sides[s as usize].cq.is_empty()
    }

    /// Whether a side's send queue has work to run.
    pub fn has_work(&self, s: SideId) -> bool {
        !self.sides[s as usize].sq.is_empty()
    }

    /// Receives a side has posted.
    pub fn posted_receives(&self, s: SideId) -> usize {
        self.sides[s as usize].rq.len()
    }

    /// Whether the side's queue pair is in error.
    pub fn in_error(&self, s: SideId) -> bool {
        self.sides[s as usize].error
    }

    /// Every remote access so far.
    pub fn accesses(&self) -> &[AccessLog] {
        &self.log
    }

    /// The step count (one per request run).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Both queue pairs go to error (a disconnect).
    pub fn disconnect(&mut self) {
        self.fail_both();
    }

    fn fail_both(&mut self) {
        for s in [SideId::A, SideId::B] {
            let side = self.side(s);
            if side.error {
                continue;
            }
            side.error = true;
            while let Some(w) = side.sq.pop_front() {
                side.cq.push_back(SimCompletion {
                    wr: w.id(),
                    status: Status::Flushed,
                    data: Vec::new(),
                    invalidated: None,
                    recv: false,
                });
            }
            while let Some((wr, _)) = side.rq.pop_front() {
                side.cq.push_back(SimCompletion {
                    wr,
                    status: Status::Flushed,
                    data: Vec::new(),
                    invalidated: None,
                    recv: true,
                });
            }
        }
    }

    fn fail(&mut self, s: SideId, w: &SimWr, why: &'static str) -> Stepped {
        self.side(s).cq.push_back(SimCompletion {
            wr: w.id(),
            status: Status::Failed(why),
            data: Vec::new(),
            invalidated: None,
            recv: false,
        });
        self.fail_both();
        Stepped::Failed
    }

    fn complete(&mut self, s: SideId, w: &SimWr) {
        let side = self.side(s);
        side.ran += 1;
        if w.signaled() {
            side.cq.push_back(SimCompletion {
                wr: w.id(),
                status: Status::Ok,
                data: Vec::new(),
                invalidated: None,
                recv: false,
            });
        }
    }

    /// Runs the head of a side's send queue.
    pub fn step(&mut self, s: SideId) -> Stepped {
        if self.side(s).error {
            return Stepped::Idle;
        }
        let Some(w) = self.side(s).sq.pop_front() else {
            return Stepped::Idle;
        };
        self.step += 1;
        let peer = s.peer();
        match &w {
            SimWr::Send {
                data, invalidate, ..
            } => {
                let Some((rwr, rlen)) = self.side(peer).rq.pop_front() else {
                    let retries = self.rnr_retries;
                    let side = self.side(s);
                    side.rnr_tries += 1;
                    if side.rnr_tries > retries {
                        side.rnr_tries = 0;
                        return self.fail(s, &w, "receiver not ready: retries exceeded");
                    }
                    side.sq.push_front(w);
                    return Stepped::ReceiverNotReady;
                };
                self.side(s).rnr_tries = 0;
                if data.len() > rlen {
                    self.side(peer).cq.push_back(SimCompletion {
                        wr: rwr,
                        status: Status::Failed("local length error"),
                        data: Vec::new(),
                        invalidated: None,
                        recv: true,
                    });
                    return self.fail(
                        s,
                        &w,
                        "remote invalid request (message longer than the receive)",
                    );
                }
                if let Some(k) = invalidate {
                    let ok = {
                        let m = &mut self.side(peer).memory;
                        m.keys.get(k).is_some_and(|key| key.remote_invalidate) && m.invalidate(*k)
                    };
                    if !ok {
                        self.side(peer).cq.push_back(SimCompletion {
                            wr: rwr,
                            status: Status::Failed("Send With Invalidate of a key that cannot be"),
                            data: Vec::new(),
                            invalidated: None,
                            recv: true,
                        });
                        return self.fail(s, &w, "remote invalid request (invalidation)");
                    }
                }
                self.side(peer).cq.push_back(SimCompletion {
                    wr: rwr,
                    status: Status::Ok,
                    data: data.clone(),
                    invalidated: *invalidate,
                    recv: true,
                });
                self.complete(s, &w);
                Stepped::Ran
            }
            SimWr::Write { data, remote, .. } => {
                if data.len() != remote.len as usize {
                    return self.fail(s, &w, "local length error");
                }
                match self.side(peer).memory.resolve(remote, true) {
                    Ok((r, off)) => {
                        self.log.push(AccessLog {
                            owner: peer,
                            rkey: remote.rkey,
                            write: true,
                            step: self.step,
                        });
                        self.side(peer).memory.write(r, off, data);
                        self.complete(s, &w);
                        Stepped::Ran
                    }
                    Err(why) => self.fail(s, &w, why),
                }
            }
            SimWr::Read {
                remote,
                region,
                offset,
                ..
            } => {
                let got = self.side(peer).memory.resolve(remote, false);
                match got {
                    Ok((r, off)) => {
                        self.log.push(AccessLog {
                            owner: peer,
                            rkey: remote.rkey,
                            write: false,
                            step: self.step,
                        });
                        let data = self
                            .side(peer)
                            .memory
                            .read(r, off, remote.len as usize)
                            .unwrap_or_default();
                        if !self.side(s).memory.write(*region, *offset, &data) {
                            return self.fail(s, &w, "local protection error");
                        }
                        self.complete(s, &w);
                        Stepped::Ran
                    }
                    Err(why) => self.fail(s, &w, why),
                }
            }
            SimWr::LocalInv { rkey, .. } => {
                if self.side(s).memory.invalidate(*rkey) {
                    self.complete(s, &w);
                    Stepped::Ran
                } else {
                    self.fail(s, &w, "local invalidation of a key that is not valid")
                }
            }
        }
    }
}
