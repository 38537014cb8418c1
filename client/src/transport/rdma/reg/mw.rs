//! `mw`: type-2 memory windows bound per call, the userspace form of FRWR.
//!
//! Each slot has a chunk area (a window-only region: MW-bind access only,
//! its own rkey grants nothing, no work request names it) and three
//! windows (Read chunk: remote read; Write chunk and Reply chunk: remote
//! write). Per call the windows it needs are bound over the used
//! sub-ranges by BIND_MW requests in the same chain as, and before, the
//! Send; each bind gives the window a new rkey (the low byte moves on), and
//! those rkeys are the call's fence list: the server's Send With
//! Invalidate settles one, LOCAL_INV the rest. A call whose chunks do not
//! fit the area gets a region of its own (also MW-bind only) under the
//! same windows. On Soft-RoCE a window's rkey also reaches the rest of its
//! region (see the verbs docs): with a region per slot, that is the slot's
//! own area, which holds nothing but this call's chunks.
//!
//! Reply data of [`LEND_MIN`] bytes or more is lent to the caller in the
//! slot's own area, without a copy: the slot takes a spare area, and the
//! windows ever bound to the old one are deallocated and allocated anew,
//! so nothing can reach the lent area until the caller drops the last
//! `Bytes` over it; it is a spare again then. [`SPARE_AREAS`] spares are
//! registered with the connection, more as loans need them, up to one per
//! slot; when none is left the reply is copied. A region of the call's own
//! is given up as the reply's memory once its windows are renewed.

use super::reg_mr::{give_up, per_rpc_region};
use super::{copy_out, copy_read_data, slices, Layout, Registered, Registrar, Setup};
use crate::transport::rdma::Counters;
use crate::RegStrategy;
use bytes::Bytes;
use nfsrdma_rpcrdma::conn::WrId;
use nfsrdma_rpcrdma::requester::CallPlan;
use nfsrdma_transport::rdma::verbs::{
    next_rkey, Access, MemoryRegion, MemoryWindow, MwAccess, ProtectionDomain, QueuePair,
    SendFlags, SendOp, SendWr, VerbsError,
};
use nfsrdma_xdr::rpcrdma::RdmaSegment;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Reply data (Write chunk and Reply chunk) of at least this many bytes is
/// lent to the caller in its slot's area; smaller replies are copied
/// (cheaper than the two window operations a loan costs).
pub const LEND_MIN: usize = 16 << 10;
/// Spare areas registered when the connection is made; more are
/// registered as loans need them, up to one per slot.
pub const SPARE_AREAS: usize = 2;

/// Windows of a slot, by use.
const W_READ: usize = 0;
const W_WRITE: usize = 1;
const W_REPLY: usize = 2;

/// What one slot binds windows over.
#[derive(Debug)]
struct SlotMem {
    /// Read chunk, Write chunk and Reply chunk windows (empty once the
    /// connection is torn down).
    windows: Vec<MemoryWindow>,
    /// The slot's chunk area: a window-only region.
    area: Arc<MemoryRegion>,
    /// Windows bound to `area` since they were allocated (a bit each).
    on_area: u8,
    /// Binds of the call in flight: window, offset, length, access.
    binds: Vec<(usize, usize, usize, MwAccess)>,
}

/// The strategy.
pub struct Mw {
    pd: Arc<ProtectionDomain>,
    area: usize,
    slots: Vec<Mutex<SlotMem>>,
    /// Areas not in use by a slot nor lent out.
    spares: Arc<Mutex<Vec<Arc<MemoryRegion>>>>,
    /// Areas registered beyond one per slot (spares and loans).
    spare_areas: AtomicU32,
    counters: Arc<Counters>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Mw {
    /// Windows and an area per slot, and a few spare areas.
    pub fn new(s: &Setup<'_>) -> Result<Mw, VerbsError> {
        let mut slots = Vec::with_capacity(s.slots);
        for _ in 0..s.slots {
            let windows = (0..3)
                .map(|_| MemoryWindow::new(s.pd))
                .collect::<Result<Vec<_>, _>>()?;
            slots.push(Mutex::new(SlotMem {
                windows,
                area: MemoryRegion::new_window_only(s.pd, s.area)?,
                on_area: 0,
                binds: Vec::new(),
            }));
        }
        let spares = (0..SPARE_AREAS)
            .map(|_| MemoryRegion::new_window_only(s.pd, s.area))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Mw {
            pd: s.pd.clone(),
            area: s.area,
            slots,
            spare_areas: AtomicU32::new(spares.len() as u32),
            spares: Arc::new(Mutex::new(spares)),
            counters: s.counters.clone(),
        })
    }

    fn slot(&self, slot: usize) -> Result<MutexGuard<'_, SlotMem>, String> {
        self.slots
            .get(slot)
            .map(lock)
            .ok_or_else(|| format!("slot {slot} has no windows"))
    }

    /// Replaces the slot's windows in `mask` with newly allocated ones (the
    /// old ones are deallocated, which also lets go of every region they
    /// were bound to).
    fn renew(&self, sm: &mut SlotMem, mask: u8) -> Result<(), String> {
        for (w, window) in sm.windows.iter_mut().enumerate() {
            if mask & (1 << w) != 0 {
                *window = MemoryWindow::new(&self.pd)
                    .map_err(|e| format!("allocating a memory window: {e}"))?;
                self.counters
                    .window_renewals
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    /// A spare area, registering one if fewer than one per slot exist;
    /// `None` when none can be had (the reply is then copied).
    fn take_spare(&self) -> Option<Arc<MemoryRegion>> {
        if let Some(a) = lock(&self.spares).pop() {
            return Some(a);
        }
        let made = self.spare_areas.load(Ordering::Relaxed);
        if made as usize >= self.slots.len() {
            return None;
        }
        match MemoryRegion::new_window_only(&self.pd, self.area) {
            Ok(a) => {
                self.spare_areas.store(made + 1, Ordering::Relaxed);
                Some(a)
            }
            Err(e) => {
                // No more: copying still works.
                self.spare_areas.store(u32::MAX, Ordering::Relaxed);
                tracing::warn!(error = %e, "registering a spare chunk area failed; replies are copied from now on");
                None
            }
        }
    }
}

impl Registrar for Mw {
    fn strategy(&self) -> RegStrategy {
        RegStrategy::Mw
    }

    fn remote_invalidation(&self) -> bool {
        true
    }

    fn register(&self, slot: usize, plan: &CallPlan) -> Result<Registered, String> {
        let layout = Layout::of(plan);
        let total = layout.total();
        if total == 0 {
            return Ok(Registered::none());
        }
        let mut sm = self.slot(slot)?;
        let mem = if total <= self.area {
            sm.area.clone()
        } else {
            per_rpc_region(&self.pd, total, Access::MW_BIND, &self.counters)?
        };
        copy_read_data(plan, &mem, 0)?;
        let mut reg = Registered::none();
        let mut binds = Vec::new();
        let mut seg = |at: usize, len: usize, w: usize, access: MwAccess| {
            let rkey = next_rkey(sm.windows[w].rkey());
            binds.push((w, at, len, access));
            reg.fence.push(rkey);
            RdmaSegment {
                handle: rkey,
                length: len as u32,
                offset: mem.addr() + at as u64,
            }
        };
        let mut segments = nfsrdma_rpcrdma::requester::Registrations::default();
        if plan.read.is_some() {
            segments
                .read
                .push(seg(0, layout.read_len, W_READ, MwAccess::READ));
        }
        if plan.write_chunk.is_some() {
            segments.write.push(seg(
                layout.write_at,
                layout.write_len,
                W_WRITE,
                MwAccess::WRITE,
            ));
        }
        if plan.reply_chunk.is_some() {
            segments.reply.push(seg(
                layout.reply_at,
                layout.reply_len,
                W_REPLY,
                MwAccess::WRITE,
            ));
        }
        reg.segments = segments;
        reg.bound = binds.iter().fold(0u8, |m, (w, ..)| m | 1 << w);
        reg.pre = binds.len() as u32;
        sm.binds = binds;
        reg.layout = layout;
        reg.mem = Some(mem);
        Ok(reg)
    }

    fn post(
        &self,
        qp: &QueuePair,
        slot: usize,
        reg: &Registered,
        send: SendWr<'_>,
    ) -> Result<(), VerbsError> {
        let Some(mem) = reg.mem.as_ref() else {
            return qp.post_send(&[send]);
        };
        let mut sm = self.slot(slot).map_err(VerbsError::InvalidArgument)?;
        let mut wrs = Vec::with_capacity(sm.binds.len() + 1);
        for &(w, offset, len, access) in &sm.binds {
            wrs.push(SendWr {
                wr_id: WrId::driver(slot as u64).0,
                op: SendOp::BindMw {
                    mw: &sm.windows[w],
                    mr: mem,
                    offset,
                    len,
                    access,
                },
                flags: SendFlags::UNSIGNALED,
            });
        }
        wrs.push(send);
        qp.post_send(&wrs)?;
        self.counters
            .binds
            .fetch_add(sm.binds.len() as u64, Ordering::Relaxed);
        drop(wrs);
        if Arc::ptr_eq(&sm.area, mem) {
            sm.on_area |= reg.bound;
        }
        sm.binds.clear();
        Ok(())
    }

    fn finish(
        &self,
        slot: usize,
        mut reg: Registered,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<Bytes>, String> {
        let Some(mem) = reg.mem.take() else {
            return Ok(vec![Bytes::new(); ranges.len()]);
        };
        let data: usize = ranges.iter().map(|r| r.1).sum();
        let mut sm = self.slot(slot)?;
        if !Arc::ptr_eq(&sm.area, &mem) {
            // A region of the call's own: the windows bound over it hold
            // it until they are deallocated; new ones take their place, so
            // that it can be given up as the reply's memory.
            self.renew(&mut sm, reg.bound)?;
            drop(sm);
            return give_up(mem, 0, ranges, &self.counters);
        }
        if data >= LEND_MIN {
            if let Some(spare) = self.take_spare() {
                let mask = std::mem::take(&mut sm.on_area);
                let old = std::mem::replace(&mut sm.area, spare);
                self.renew(&mut sm, mask)?;
                drop(sm);
                drop(mem);
                let spares = self.spares.clone();
                let len = old.len();
                return match MemoryRegion::lend(old, 0, len, move |r| lock(&spares).push(r)) {
                    Ok(b) => slices(&b, ranges, &self.counters),
                    // Held elsewhere after all: copy from it, and let it go.
                    Err(old) => {
                        tracing::warn!(slot, "chunk area not lendable; copying");
                        copy_out(&old, 0, ranges, &self.counters)
                    }
                };
            }
        }
        copy_out(&mem, 0, ranges, &self.counters)
    }

    fn release_windows(&self) {
        for s in &self.slots {
            lock(s).windows.clear();
        }
    }
}

impl std::fmt::Debug for Mw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mw").finish_non_exhaustive()
    }
}
