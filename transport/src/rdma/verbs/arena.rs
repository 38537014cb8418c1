//! Registered arenas: large memory regions registered once (local access
//! only) and carved into blocks that the rest of the program uses as plain
//! memory, so that file data can move between the store and the network
//! without being copied.
//!
//! # Why this is sound
//!
//! Unlike a [`MemoryRegion`], whose buffer is never exposed as a Rust
//! reference, an [`ArenaBlock`] is `AsRef<[u8]>` / `AsMut<[u8]>`. That is
//! sound because of how the device can reach arena memory:
//!
//! - Arena regions are registered with local access only: no peer can read
//!   or write them through an rkey.
//! - The device *writes* into arena memory only through
//!   [`ArenaBlock::read_remote`] (an RDMA Read into the block), which takes
//!   the block by value and keeps it inside a [`PendingRead`] until the
//!   completions of those work requests are handed back. No reference to
//!   the block can exist meanwhile. A `PendingRead` dropped before its
//!   completions leaks the block (it never returns to the free list), so
//!   the memory is never handed out while the device may still write it.
//! - The device *reads* arena memory through [`Arena::sge_for`] (an RDMA
//!   Write or Send source): concurrent CPU reads are harmless. A CPU write
//!   through `AsMut` needs `&mut ArenaBlock`; callers that post a block as a
//!   source keep a shared handle to it until the completion, so that the
//!   block's owner cannot get unique access (and, if it wants to write,
//!   copies instead). Were a caller to break that rule, the peer would
//!   receive torn data; no Rust memory is ever written by the device.
//! - Blocks keep their region alive (`Arc`), and a region is deregistered
//!   before its memory is freed (see [`MemoryRegion`]).

use super::mr::{Access, MemoryRegion, ProtectionDomain, RemoteBuf, Sge};
use super::qp::{QueuePair, SendFlags, SendOp, SendWr};
use super::{Result, VerbsError};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

/// Block sizes an arena hands out: 4 KiB .. 64 KiB, powers of two.
pub const ARENA_CLASSES: [usize; 5] = [4096, 8192, 16384, 32768, 65536];

/// A set of registered regions carved into blocks.
pub struct Arena {
    pd: Arc<ProtectionDomain>,
    region_bytes: usize,
    limit_bytes: usize,
    regions: Mutex<Vec<Arc<MemoryRegion>>>,
    /// Free blocks per class: (region index, offset).
    free: [Mutex<Vec<(u32, u32)>>; ARENA_CLASSES.len()],
    /// Bytes of each region not yet carved, per class region.
    carve: Mutex<Vec<(usize, usize)>>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("registered", &self.registered_bytes())
            .finish()
    }
}

fn class_of(size: usize) -> Option<usize> {
    ARENA_CLASSES.iter().position(|c| *c == size)
}

impl Arena {
    /// An arena on `pd` that registers `region_bytes` at a time, up to
    /// `limit_bytes` in all.
    pub fn new(pd: &Arc<ProtectionDomain>, region_bytes: usize, limit_bytes: usize) -> Arc<Arena> {
        let region_bytes = region_bytes.max(ARENA_CLASSES[ARENA_CLASSES.len() - 1]);
        Arc::new(Arena {
            pd: pd.clone(),
            region_bytes,
            limit_bytes,
            regions: Mutex::new(Vec::new()),
            free: Default::default(),
            carve: Mutex::new(Vec::new()),
        })
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Bytes registered so far.
    pub fn registered_bytes(&self) -> usize {
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|r| r.len())
            .sum()
    }

    /// A zero-filled block of `size` bytes (one of [`ARENA_CLASSES`]), or
    /// `Ok(None)` when the arena reached its limit.
    pub fn alloc(self: &Arc<Self>, size: usize) -> Result<Option<ArenaBlock>> {
        let class = class_of(size).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("arena block size {size} is not a class size"))
        })?;
        let slot = self.free[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let (region_idx, offset) = match slot {
            Some(s) => s,
            None => match self.carve(class)? {
                Some(s) => s,
                None => return Ok(None),
            },
        };
        let region =
            self.regions.lock().unwrap_or_else(|p| p.into_inner())[region_idx as usize].clone();
        let ptr = region.buf_ptr();
        // SAFETY: `offset + size <= region.len()` by construction of the
        // free lists and the carving below.
        let ptr = unsafe { NonNull::new_unchecked(ptr.as_ptr().add(offset as usize)) };
        let mut b = ArenaBlock {
            arena: self.clone(),
            region,
            region_idx,
            offset: offset as usize,
            len: size,
            class,
            ptr,
        };
        b.as_mut().fill(0);
        Ok(Some(b))
    }

    /// Carves a new block of `class` from the current region of that class,
    /// registering a new region when needed.
    fn carve(&self, class: usize) -> Result<Option<(u32, u32)>> {
        let size = ARENA_CLASSES[class];
        let mut carve = self.carve.lock().unwrap_or_else(|p| p.into_inner());
        if carve.len() < ARENA_CLASSES.len() {
            carve.resize(ARENA_CLASSES.len(), (usize::MAX, 0));
        }
        let (ri, used) = carve[class];
        if ri != usize::MAX && used + size <= self.region_bytes {
            carve[class] = (ri, used + size);
            return Ok(Some((ri as u32, used as u32)));
        }
        if self.registered_bytes() + self.region_bytes > self.limit_bytes {
            return Ok(None);
        }
        let region = MemoryRegion::new(&self.pd, self.region_bytes, Access::LOCAL)?;
        let mut regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        let idx = regions.len();
        regions.push(region);
        carve[class] = (idx, size);
        Ok(Some((idx as u32, 0)))
    }

    /// A scatter/gather entry for `bytes` when they lie inside one of this
    /// arena's regions (a device read of them: an RDMA Write or Send
    /// source). `None` for memory the arena does not own.
    pub fn sge_for<'a>(&'a self, bytes: &'a [u8]) -> Option<Sge<'a>> {
        let start = bytes.as_ptr() as usize;
        let end = start.checked_add(bytes.len())?;
        let len = u32::try_from(bytes.len()).ok()?;
        let regions = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        regions.iter().find_map(|r| {
            let base = r.addr() as usize;
            (start >= base && end <= base + r.len()).then(|| Sge {
                addr: start as u64,
                length: len,
                lkey: r.lkey(),
                _region: PhantomData,
            })
        })
    }

    fn release(&self, class: usize, region_idx: u32, offset: usize) {
        self.free[class]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((region_idx, offset as u32));
    }
}

/// One block of arena memory, owned uniquely.
pub struct ArenaBlock {
    arena: Arc<Arena>,
    region: Arc<MemoryRegion>,
    region_idx: u32,
    offset: usize,
    len: usize,
    class: usize,
    ptr: NonNull<u8>,
}

// SAFETY: the block owns its range of the region exclusively; the region
// (and so the memory) lives as long as the block; see the module docs for
// device access.
unsafe impl Send for ArenaBlock {}
// SAFETY: as above; `&ArenaBlock` only gives shared reads.
unsafe impl Sync for ArenaBlock {}

impl std::fmt::Debug for ArenaBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ArenaBlock({} bytes at {:#x})",
            self.len,
            self.ptr.as_ptr() as usize
        )
    }
}

impl AsRef<[u8]> for ArenaBlock {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies in the live region and belongs to this
        // block alone; the device never writes it while a reference can
        // exist (module docs).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for ArenaBlock {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `as_ref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ArenaBlock {
    fn drop(&mut self) {
        self.arena.release(self.class, self.region_idx, self.offset);
    }
}

impl ArenaBlock {
    /// Bytes in the block.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Posts RDMA Reads of `ops` (each: the block offset to land at and the
    /// peer's memory) into this block, all with `wr_id` and signaled. The
    /// block comes back from [`PendingRead::complete`] once every one of
    /// their completions was handed in. On failure the block is returned
    /// when no read was posted; when some were, it stays with them (the
    /// error's `pending`) until their completions arrive.
    pub fn read_remote(
        self,
        qp: &QueuePair,
        wr_id: u64,
        ops: &[(usize, RemoteBuf)],
    ) -> std::result::Result<PendingRead, Box<ReadPostError>> {
        for (off, remote) in ops {
            match off.checked_add(remote.len as usize) {
                Some(end) if end <= self.len => {}
                _ => {
                    return Err(Box::new(ReadPostError {
                        block: Some(self),
                        pending: None,
                        error: VerbsError::InvalidArgument("read outside the block".into()),
                    }))
                }
            }
        }
        let base = self.region.addr() as usize + self.offset;
        let lkey = self.region.lkey();
        let mut pending = PendingRead {
            block: Some(self),
            wr_id,
            left: 0,
            qp_num: qp.qp_num(),
        };
        for (off, remote) in ops {
            let sge = Sge {
                addr: (base + off) as u64,
                length: remote.len,
                lkey,
                _region: PhantomData::<&MemoryRegion>,
            };
            let wr = SendWr {
                wr_id,
                op: SendOp::RdmaRead {
                    sges: std::slice::from_ref(&sge),
                    remote: *remote,
                },
                flags: SendFlags::SIGNALED,
            };
            if let Err(error) = qp.post_send(std::slice::from_ref(&wr)) {
                if pending.left == 0 {
                    return Err(Box::new(ReadPostError {
                        block: pending.block.take(),
                        pending: None,
                        error,
                    }));
                }
                return Err(Box::new(ReadPostError {
                    block: None,
                    pending: Some(pending),
                    error,
                }));
            }
            pending.left += 1;
        }
        Ok(pending)
    }
}

/// A failure to post the reads of [`ArenaBlock::read_remote`].
#[derive(Debug)]
pub struct ReadPostError {
    /// The block, when nothing was posted.
    pub block: Option<ArenaBlock>,
    /// The reads that were posted, when some were.
    pub pending: Option<PendingRead>,
    /// Why posting failed.
    pub error: VerbsError,
}

/// A block with RDMA Reads outstanding into it.
pub struct PendingRead {
    block: Option<ArenaBlock>,
    wr_id: u64,
    left: usize,
    qp_num: u32,
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PendingRead(wr_id {:#x}, {} left)",
            self.wr_id, self.left
        )
    }
}

impl PendingRead {
    /// The work request id of its reads.
    pub fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// Hands in one completion of this read (matched by `wr_id`, whatever
    /// its status: a failed or flushed request no longer touches memory).
    /// Returns the block once all completions are in.
    pub fn complete(mut self, wr_id: u64) -> std::result::Result<ArenaBlock, PendingRead> {
        if wr_id != self.wr_id || self.left == 0 {
            return Err(self);
        }
        self.left -= 1;
        if self.left > 0 {
            return Err(self);
        }
        Ok(self.block.take().expect("present until completed"))
    }
}

impl PendingRead {
    /// Takes back the blocks of reads whose completions will never be
    /// handed in (a connection being torn down): `qp` must be the queue
    /// pair they were posted on and its last handle. It is destroyed first,
    /// so the device no longer writes into the blocks. When `qp` is not
    /// the last handle, or not their queue pair, everything is returned
    /// as it was.
    #[allow(clippy::type_complexity)]
    pub fn reclaim_all(
        reads: Vec<PendingRead>,
        qp: Arc<QueuePair>,
    ) -> std::result::Result<Vec<ArenaBlock>, (Vec<PendingRead>, Arc<QueuePair>)> {
        if reads.iter().any(|r| r.qp_num != qp.qp_num()) {
            return Err((reads, qp));
        }
        match Arc::try_unwrap(qp) {
            Ok(qp) => {
                // Destroying the QP ends all of its work requests.
                drop(qp);
                Ok(reads
                    .into_iter()
                    .filter_map(|mut r| r.block.take())
                    .collect())
            }
            Err(qp) => Err((reads, qp)),
        }
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            // The device may still write into it: never reuse the memory.
            std::mem::forget(b);
        }
    }
}
