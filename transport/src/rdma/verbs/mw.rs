//! Type-2 memory windows: the userspace form of per-RPC ("FRWR"-style)
//! registration.
//!
//! A window is allocated once per PD ([`MemoryWindow::new`]), then bound
//! to a sub-range of a [`MemoryRegion`] registered with
//! [`Access::mw_bind`](super::Access) by posting a
//! [`SendOp::BindMw`](super::SendOp::BindMw) work request on a queue pair of
//! the same PD. Every bind gives the window a new rkey: the upper 24 bits
//! (the window's index) stay, the low 8 bits (the "key") are incremented
//! ([`next_rkey`]). The window is invalidated by a local
//! [`SendOp::LocalInv`](super::SendOp::LocalInv) or by the peer's Send With
//! Invalidate; after that the old rkey is dead, and the window can be bound
//! again (with yet another rkey).
//!
//! # Soft-RoCE caveat: window bounds
//!
//! On rxe (Linux 6.1, seen in the test VM) an access through a window's
//! rkey is refused beyond the end of the underlying *region*, but accesses
//! outside the window that still lie inside the region were allowed, both
//! below the window's start and past its end (test
//! `window_bounds_outside_window_inside_region`). Do not rely on a
//! window to hide other parts of the same region from the peer on rxe:
//! bind windows over regions that hold nothing else the peer must not see,
//! or register per-RPC regions there.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use rdma_sys::{ibv_access_flags, ibv_alloc_mw, ibv_dealloc_mw, ibv_mw, ibv_mw_type};

use super::mr::{MemoryRegion, ProtectionDomain};
use super::{Result, VerbsError};

/// The rkey a window gets on its next bind: the low 8 bits incremented
/// (wrapping within those 8 bits), the upper 24 bits kept
/// (`ibv_inc_rkey` semantics).
pub fn next_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// Remote access granted through a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MwAccess {
    /// Peers may RDMA Write through the window.
    pub remote_write: bool,
    /// Peers may RDMA Read through the window.
    pub remote_read: bool,
}

impl MwAccess {
    /// Read and write.
    pub const READ_WRITE: Self = Self {
        remote_write: true,
        remote_read: true,
    };
    /// Write only (e.g. a Write chunk or Reply chunk target).
    pub const WRITE: Self = Self {
        remote_write: true,
        remote_read: false,
    };
    /// Read only (e.g. a Read chunk source).
    pub const READ: Self = Self {
        remote_write: false,
        remote_read: true,
    };

    pub(crate) fn bits(self) -> u32 {
        let mut b = 0;
        if self.remote_write {
            b |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if self.remote_read {
            b |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        b
    }
}

pub(crate) struct MwState {
    /// The rkey of the latest posted bind (or of the allocation).
    pub(crate) rkey: u32,
    /// Every region a bind of this window has targeted since it was
    /// allocated: held until the window is deallocated, so that the
    /// regions (and their buffers) outlive every binding, and so that a
    /// region no window holds is one no window can reach (whether or not
    /// an invalidation was seen; see [`MemoryRegion::lend`]).
    pub(crate) held: Vec<Arc<MemoryRegion>>,
}

/// A type-2 memory window (`ibv_alloc_mw(pd, IBV_MW_TYPE_2)`). Keeps its
/// PD, and every region it was bound to, alive until it is deallocated
/// (dropped): a window bound to one region after another holds them all,
/// so drop and allocate windows again after binding them to short-lived
/// regions.
pub struct MemoryWindow {
    mw: NonNull<ibv_mw>,
    pd: Arc<ProtectionDomain>,
    pub(crate) state: Mutex<MwState>,
}

// SAFETY: the window handle is owned by this value and only used through
// thread-safe verbs; mutable Rust-side state is behind a Mutex.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above.
unsafe impl Sync for MemoryWindow {}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow")
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .finish()
    }
}

impl MemoryWindow {
    /// Allocates a type-2 window on `pd`. Fails with an `EOPNOTSUPP` call
    /// error on devices without windows (e.g. siw); use per-RPC
    /// [`MemoryRegion`]s there.
    pub fn new(pd: &Arc<ProtectionDomain>) -> Result<Self> {
        // SAFETY: the PD is live (we keep an Arc to it).
        let mw = unsafe { ibv_alloc_mw(pd.as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = mw
            .and_then(NonNull::new)
            .ok_or_else(|| VerbsError::last_os("ibv_alloc_mw"))?;
        // SAFETY: freshly allocated, valid window.
        let rkey = unsafe { mw.as_ref().rkey };
        Ok(Self {
            mw,
            pd: pd.clone(),
            state: Mutex::new(MwState {
                rkey,
                held: Vec::new(),
            }),
        })
    }

    /// The rkey of the latest bind posted on this window (before any bind:
    /// the allocation's rkey, which grants nothing). A bind that is posted
    /// but not yet executed already shows here.
    pub fn rkey(&self) -> u32 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).rkey
    }

    /// The PD the window belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_mw {
        self.mw.as_ptr()
    }

    /// Records a posted bind's rkey in the provider's `ibv_mw` (type-2
    /// windows: the consumer keeps `ibv_mw.rkey` current; rxe passes it to
    /// the kernel as the window's present rkey on the next bind, and fails
    /// the bind if it is stale).
    pub(crate) fn set_provider_rkey(&self, rkey: u32) {
        let _g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the window is live; `rkey` is a plain field the provider
        // reads only while posting a bind of this window, which callers do
        // not do concurrently with the bookkeeping of that same window (the
        // state lock serialises our own writers).
        unsafe { (*self.mw.as_ptr()).rkey = rkey };
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once. Deallocating a bound
        // window invalidates it; the regions it was bound to (held in
        // `state`) are released only after this call.
        unsafe { ibv_dealloc_mw(self.mw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_rkey_bumps_only_the_key_byte() {
        assert_eq!(next_rkey(0x0000_1200), 0x0000_1201);
        assert_eq!(next_rkey(0x1234_56fe), 0x1234_56ff);
        assert_eq!(next_rkey(0x1234_56ff), 0x1234_5600);
        assert_eq!(next_rkey(u32::MAX), 0xffff_ff00);
        assert_eq!(next_rkey(0), 1);
        // 256 binds bring the key back, index never changes.
        let mut k = 0xabcd_ef07;
        for _ in 0..256 {
            let n = next_rkey(k);
            assert_ne!(n & 0xff, k & 0xff);
            assert_eq!(n & !0xff, 0xabcd_ef00);
            k = n;
        }
        assert_eq!(k, 0xabcd_ef07);
    }

    #[test]
    fn mw_access_bits() {
        assert_eq!(MwAccess::READ_WRITE.bits(), 2 | 4);
        assert_eq!(MwAccess::WRITE.bits(), 2);
        assert_eq!(MwAccess::READ.bits(), 4);
    }
}
