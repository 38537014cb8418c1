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
//!   [`PendingRead::post`] (RDMA Reads into blocks), whose blocks were
//!   given to the [`PendingRead`] by value and come back from it only when
//!   the completions of every read posted into them were handed back. No
//!   reference to a block can exist meanwhile. A `PendingRead` dropped
//!   with reads outstanding leaks its blocks (they never return to the
//!   free list), so the memory is never handed out while the device may
//!   still write it.
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

    /// The most bytes it registers.
    pub fn limit_bytes(&self) -> usize {
        self.limit_bytes
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
}

/// Arena blocks with RDMA Reads into them: the blocks are lent to the
/// device from [`PendingRead::new`] until every read posted into them has
/// completed ([`PendingRead::finish`]).
///
/// Reads go out in chains ([`PendingRead::post`], one `ibv_post_send`
/// each) of which only the last request is signaled: a send queue completes
/// its requests in order, so that one completion (successful, failed or
/// flushed) means that every request of its chain, and of every chain
/// before it, is done with the memory. A chain posted only in part (the
/// provider refused a request after taking earlier ones) has no completion
/// to wait for: its blocks come back only through
/// [`PendingRead::reclaim_all`], which destroys the queue pair.
pub struct PendingRead {
    blocks: Vec<ArenaBlock>,
    /// Signaled requests posted and not yet handed in: their `wr_id` and
    /// the number of requests their chain holds.
    signaled: Vec<(u64, usize)>,
    /// A chain was posted in part.
    broken: bool,
    qp_num: u32,
}

impl std::fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PendingRead({} blocks, {} chains in flight{})",
            self.blocks.len(),
            self.signaled.len(),
            if self.broken { ", broken" } else { "" }
        )
    }
}

impl PendingRead {
    /// Lends `blocks` to reads on `qp`.
    pub fn new(blocks: Vec<ArenaBlock>, qp: &QueuePair) -> PendingRead {
        PendingRead {
            blocks,
            signaled: Vec::new(),
            broken: false,
            qp_num: qp.qp_num(),
        }
    }

    /// The blocks' sizes, in order.
    pub fn block_lens(&self) -> impl Iterator<Item = usize> + '_ {
        self.blocks.iter().map(|b| b.len)
    }

    /// Posts one chain of RDMA Reads: per request, the index of the block
    /// and the offset in it to land at, and the peer's memory to read. The
    /// last request is signaled and carries `wr_id`, which must be unique
    /// among this queue pair's outstanding signaled requests; the others
    /// are unsignaled and carry `quiet_wr_id` (seen only in the completion
    /// of a failed or flushed request). Nothing is posted when a request
    /// lies outside its block or `wr_id` is in use here.
    pub fn post(
        &mut self,
        qp: &QueuePair,
        ops: &[(usize, usize, RemoteBuf)],
        wr_id: u64,
        quiet_wr_id: u64,
    ) -> Result<()> {
        if ops.is_empty() {
            return Ok(());
        }
        if qp.qp_num() != self.qp_num {
            return Err(VerbsError::InvalidArgument(
                "reads posted on another queue pair".into(),
            ));
        }
        if wr_id == quiet_wr_id || self.signaled.iter().any(|(w, _)| *w == wr_id) {
            return Err(VerbsError::InvalidArgument(format!(
                "read chain wr_id {wr_id:#x} is not unique"
            )));
        }
        let mut sges = Vec::with_capacity(ops.len());
        for &(bi, off, remote) in ops {
            let block = self.blocks.get(bi).ok_or_else(|| {
                VerbsError::InvalidArgument(format!(
                    "read into block {bi} of {}",
                    self.blocks.len()
                ))
            })?;
            match off.checked_add(remote.len as usize) {
                Some(end) if end <= block.len => {}
                _ => return Err(VerbsError::InvalidArgument("read outside the block".into())),
            }
            sges.push(Sge {
                addr: (block.region.addr() as usize + block.offset + off) as u64,
                length: remote.len,
                lkey: block.region.lkey(),
                _region: PhantomData::<&MemoryRegion>,
            });
        }
        let last = ops.len() - 1;
        let wrs: Vec<SendWr<'_>> = ops
            .iter()
            .zip(&sges)
            .enumerate()
            .map(|(i, (&(_, _, remote), sge))| SendWr {
                wr_id: if i == last { wr_id } else { quiet_wr_id },
                op: SendOp::RdmaRead {
                    sges: std::slice::from_ref(sge),
                    remote,
                },
                flags: if i == last {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::default()
                },
            })
            .collect();
        match qp.post_send_counted(&wrs) {
            Ok(()) => {
                self.signaled.push((wr_id, ops.len()));
                Ok(())
            }
            Err((posted, error)) => {
                if posted > 0 {
                    self.broken = true;
                }
                Err(error)
            }
        }
    }

    /// Hands in one completion of this queue pair's reads, whatever its
    /// status: when `wr_id` ends one of the chains, that chain is done and
    /// the number of requests it held is returned.
    pub fn complete(&mut self, wr_id: u64) -> Option<usize> {
        let i = self.signaled.iter().position(|(w, _)| *w == wr_id)?;
        Some(self.signaled.remove(i).1)
    }

    /// Whether reads are outstanding (or can never be waited for).
    pub fn in_flight(&self) -> bool {
        !self.signaled.is_empty() || self.broken
    }

    /// The blocks, once no read into them is outstanding.
    pub fn finish(mut self) -> std::result::Result<Vec<ArenaBlock>, PendingRead> {
        if self.in_flight() {
            return Err(self);
        }
        Ok(std::mem::take(&mut self.blocks))
    }

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
                    .flat_map(|mut r| std::mem::take(&mut r.blocks))
                    .collect())
            }
            Err(qp) => Err((reads, qp)),
        }
    }
}

impl Drop for PendingRead {
    fn drop(&mut self) {
        if self.in_flight() {
            // The device may still write into them: never reuse the memory.
            for b in std::mem::take(&mut self.blocks) {
                std::mem::forget(b);
            }
        }
    }
}
