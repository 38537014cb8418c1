//! `reg-mr`: a memory region registered for each call (`ibv_reg_mr`, remote
//! read and write access), its own rkey on the wire. The region is fenced
//! by deregistering it, which also hands its buffer over as the reply's
//! memory without a copy (`MemoryRegion::into_bytes`). The peer cannot
//! invalidate it: remote invalidation is never offered.

use super::{copy_out, copy_read_data, slices, Layout, Registered, Registrar, Setup};
use crate::transport::rdma::Counters;
use crate::RegStrategy;
use bytes::Bytes;
use nfsrdma_rpcrdma::requester::CallPlan;
use nfsrdma_transport::rdma::verbs::{
    Access, MemoryRegion, ProtectionDomain, QueuePair, SendWr, VerbsError,
};
use nfsrdma_xdr::rpcrdma::RdmaSegment;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// The strategy.
pub struct RegMr {
    pd: Arc<ProtectionDomain>,
    counters: Arc<Counters>,
}

impl RegMr {
    /// The strategy on `s`'s protection domain.
    pub fn new(s: &Setup<'_>) -> RegMr {
        RegMr {
            pd: s.pd.clone(),
            counters: s.counters.clone(),
        }
    }
}

/// A region of `total` bytes for one call, `access` as given, counted.
pub(super) fn per_rpc_region(
    pd: &Arc<ProtectionDomain>,
    total: usize,
    access: Access,
    counters: &Counters,
) -> Result<Arc<MemoryRegion>, String> {
    let mr = MemoryRegion::new(pd, total, access)
        .map_err(|e| format!("registering {total} bytes: {e}"))?;
    counters.mr_regs.fetch_add(1, Ordering::Relaxed);
    Ok(mr)
}

/// Hands `ranges` of a call's own region over: without a copy once it is
/// deregistered, by copy while something else still holds it.
pub(super) fn give_up(
    mem: Arc<MemoryRegion>,
    base: usize,
    ranges: &[(usize, usize)],
    counters: &Counters,
) -> Result<Vec<Bytes>, String> {
    if ranges.iter().all(|r| r.1 == 0) {
        return Ok(vec![Bytes::new(); ranges.len()]);
    }
    let len = mem.len().saturating_sub(base);
    match MemoryRegion::into_bytes(mem, base, len) {
        Ok(b) => slices(&b, ranges, counters),
        Err(Ok(mem)) => copy_out(&mem, base, ranges, counters),
        Err(Err(e)) => Err(format!("deregistering chunk memory: {e}")),
    }
}

impl Registrar for RegMr {
    fn strategy(&self) -> RegStrategy {
        RegStrategy::RegMr
    }

    fn remote_invalidation(&self) -> bool {
        false
    }

    fn register(&self, _slot: usize, plan: &CallPlan) -> Result<Registered, String> {
        let layout = Layout::of(plan);
        let total = layout.total();
        if total == 0 {
            return Ok(Registered::none());
        }
        let mem = per_rpc_region(&self.pd, total, Access::REMOTE, &self.counters)?;
        copy_read_data(plan, &mem, 0)?;
        let seg = |at: usize, len: usize| RdmaSegment {
            handle: mem.rkey(),
            length: len as u32,
            offset: mem.addr() + at as u64,
        };
        let mut reg = Registered::none();
        if plan.read.is_some() {
            reg.segments.read.push(seg(0, layout.read_len));
        }
        if plan.write_chunk.is_some() {
            reg.segments
                .write
                .push(seg(layout.write_at, layout.write_len));
        }
        if plan.reply_chunk.is_some() {
            reg.segments
                .reply
                .push(seg(layout.reply_at, layout.reply_len));
        }
        reg.layout = layout;
        reg.mem = Some(mem);
        Ok(reg)
    }

    fn post(
        &self,
        qp: &QueuePair,
        _slot: usize,
        _reg: &Registered,
        send: SendWr<'_>,
    ) -> Result<(), VerbsError> {
        qp.post_send(&[send])
    }

    fn finish(
        &self,
        _slot: usize,
        reg: Registered,
        ranges: &[(usize, usize)],
    ) -> Result<Vec<Bytes>, String> {
        match reg.mem {
            // Deregistered here: that fences it.
            Some(mem) => give_up(mem, reg.base, ranges, &self.counters),
            None => Ok(vec![Bytes::new(); ranges.len()]),
        }
    }

    fn release_windows(&self) {}
}

impl std::fmt::Debug for RegMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegMr").finish_non_exhaustive()
    }
}
