//! Memory registration: how a call's chunks become memory the server can
//! reach, and how that memory is given back. One strategy per file behind
//! one trait, as the Linux client keeps FRWR in `frwr_ops.c`:
//!
//! - [`mw`]: a type-2 memory window bound per chunk over the slot's own
//!   area (the userspace form of FRWR); fenced by the server's Send With
//!   Invalidate or our LOCAL_INV.
//! - [`reg_mr`]: a memory region registered per call (`ibv_reg_mr`),
//!   fenced by deregistering it.
//! - [`persistent`]: one pool registered for the connection's life, its
//!   own rkey on the wire; nothing to fence (and nothing protected).
//!
//! The protocol rules around registration (which keys a call exposes must
//! be invalid before its reply is handed over; a Send With Invalidate must
//! name one of them) are the connection core's
//! (`nfsrdma_rpcrdma::conn::call`); a strategy says which keys those are.
//!
//! Adding a strategy: a file here implementing [`Registrar`], and one line
//! in [`new`].

pub mod mw;
pub mod persistent;
pub mod reg_mr;

use super::Counters;
use crate::RegStrategy;
use bytes::Bytes;
use nfsrdma_rpcrdma::requester::{CallPlan, Registrations};
use nfsrdma_transport::rdma::verbs::{
    DeviceAttrs, MemoryRegion, ProtectionDomain, QueuePair, SendWr, VerbsError,
};
use std::sync::Arc;

/// Alignment of each chunk within a call's memory.
const ALIGN: usize = 64;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Where a call's chunks lie in its memory: the Read chunk data at 0, then
/// the Write chunk, then the Reply chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of Read chunk data.
    pub read_len: usize,
    /// Offset of the Write chunk.
    pub write_at: usize,
    /// Bytes of the Write chunk.
    pub write_len: usize,
    /// Offset of the Reply chunk.
    pub reply_at: usize,
    /// Bytes of the Reply chunk.
    pub reply_len: usize,
}

impl Layout {
    /// The layout of `plan`'s chunks.
    pub fn of(plan: &CallPlan) -> Layout {
        let read_len = plan.read.as_ref().map_or(0, |(_, p)| p.len());
        let write_len = plan.write_chunk.unwrap_or(0) as usize;
        let reply_len = plan.reply_chunk.unwrap_or(0) as usize;
        let write_at = align(read_len);
        let reply_at = align(write_at + write_len);
        Layout {
            read_len,
            write_at,
            write_len,
            reply_at,
            reply_len,
        }
    }

    /// Bytes the call's memory needs.
    pub fn total(&self) -> usize {
        if self.reply_len > 0 {
            self.reply_at + self.reply_len
        } else if self.write_len > 0 {
            self.write_at + self.write_len
        } else {
            self.read_len
        }
    }
}

/// One call's registration.
#[derive(Debug)]
pub struct Registered {
    /// The segments of each chunk, for the call's header.
    pub segments: Registrations,
    /// Every key the call exposes that must be invalidated (by the
    /// server's Send With Invalidate, or locally) before its memory is
    /// reused.
    pub fence: Vec<u32>,
    /// Requests the strategy posts before the call's Send, in its chain.
    pub pre: u32,
    /// Where the chunks lie.
    pub layout: Layout,
    /// The memory the chunks are in, when it is the call's own (a region
    /// registered for it) or the pool.
    pub mem: Option<Arc<MemoryRegion>>,
    /// Where the call's memory starts in `mem`.
    pub base: usize,
    /// `mw`: the slot's windows the call bound (a bit per window).
    pub bound: u8,
}

impl Registered {
    /// A call with no chunks.
    pub fn none() -> Registered {
        Registered {
            segments: Registrations::default(),
            fence: Vec::new(),
            pre: 0,
            layout: Layout {
                read_len: 0,
                write_at: 0,
                write_len: 0,
                reply_at: 0,
                reply_len: 0,
            },
            mem: None,
            base: 0,
            bound: 0,
        }
    }
}

/// A registration strategy.
pub trait Registrar: Send + Sync {
    /// Which one it is.
    fn strategy(&self) -> RegStrategy;

    /// Whether the server may invalidate what it registers (we offer to
    /// accept Send With Invalidate only then: a region registered per call
    /// or a pool cannot be invalidated by the peer).
    fn remote_invalidation(&self) -> bool;

    /// Registers `plan`'s chunks for the call in `slot`: copies the Read
    /// chunk data in and says where each chunk is and what to fence.
    fn register(&self, slot: usize, plan: &CallPlan) -> Result<Registered, String>;

    /// Posts `send` (the call's Send) after the call's own requests
    /// (window binds), in one chain.
    fn post(
        &self,
        qp: &QueuePair,
        slot: usize,
        reg: &Registered,
        send: SendWr<'_>,
    ) -> Result<(), VerbsError>;

    /// Every key of the call is invalid: hands over the bytes at `ranges`
    /// (offset and length in the call's memory: the Reply chunk, the Write
    /// chunk) without a copy where it can, and lets the registration go.
    fn finish(
        &self,
        slot: usize,
        reg: Registered,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<Bytes>, String>;

    /// Deallocates what must go before the queue pair is destroyed (bound
    /// windows hold a reference to it).
    fn release_windows(&self);
}

impl RegStrategy {
    /// The strategy's name in flags and mount options.
    pub fn name(self) -> &'static str {
        match self {
            RegStrategy::Mw => "mw",
            RegStrategy::RegMr => "reg-mr",
            RegStrategy::Persistent => "persistent",
        }
    }

    /// The strategy of that name.
    pub fn from_name(name: &str) -> Option<RegStrategy> {
        [RegStrategy::Mw, RegStrategy::RegMr, RegStrategy::Persistent]
            .into_iter()
            .find(|r| r.name() == name)
    }
}

/// Everything a strategy is made with.
pub struct Setup<'a> {
    /// The protection domain.
    pub pd: &'a Arc<ProtectionDomain>,
    /// The device's limits.
    pub attrs: &'a DeviceAttrs,
    /// Slots (calls in flight at most).
    pub slots: usize,
    /// Bytes of one slot's chunk area.
    pub area: usize,
    /// The transport's counters.
    pub counters: &'a Arc<Counters>,
}

/// The strategy `want`, or `reg-mr` when the device cannot do it.
pub fn new(want: RegStrategy, s: &Setup<'_>) -> Result<Box<dyn Registrar>, VerbsError> {
    let fallback = |why: &str| {
        tracing::warn!("{why}; registering a memory region per RPC instead");
        Box::new(reg_mr::RegMr::new(s)) as Box<dyn Registrar>
    };
    Ok(match want {
        RegStrategy::Mw if !s.attrs.supports_type2_windows() => {
            fallback("no type-2 memory windows")
        }
        RegStrategy::Mw => match mw::Mw::new(s) {
            Ok(m) => Box::new(m),
            Err(e) => fallback(&format!("memory windows unavailable ({e})")),
        },
        RegStrategy::RegMr => Box::new(reg_mr::RegMr::new(s)),
        RegStrategy::Persistent => Box::new(persistent::Persistent::new(s)?),
    })
}

/// Copies the Read chunk data of `plan` into `mem` at `base`.
fn copy_read_data(plan: &CallPlan, mem: &MemoryRegion, base: usize) -> Result<(), String> {
    if let Some((_, data)) = &plan.read {
        let mut at = base;
        for p in data.parts() {
            mem.write_at(at, p)
                .map_err(|e| format!("copying call data: {e}"))?;
            at += p.len();
        }
    }
    Ok(())
}

/// Copies `ranges` of `mem` (from `base`) out, counting the bytes.
fn copy_out(
    mem: &MemoryRegion,
    base: usize,
    ranges: &[(usize, usize)],
    counters: &Counters,
) -> Result<Vec<Bytes>, String> {
    ranges
        .iter()
        .map(|&(at, n)| {
            counters
                .bytes_copied
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            mem.to_vec(base + at, n)
                .map(Bytes::from)
                .map_err(|e| format!("chunk memory: {e}"))
        })
        .collect()
}

/// Slices `ranges` out of lent memory, counting the bytes.
fn slices(b: &Bytes, ranges: &[(usize, usize)], counters: &Counters) -> Result<Vec<Bytes>, String> {
    ranges
        .iter()
        .map(|&(at, n)| {
            if at.checked_add(n).is_none_or(|end| end > b.len()) {
                return Err(format!("reply data {at}+{n} outside the chunk memory"));
            }
            counters
                .bytes_lent
                .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(b.slice(at..at + n))
        })
        .collect()
}
