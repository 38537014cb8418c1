//! `persistent`: one pool registered once for the connection's life with
//! remote read and write access, its own rkey on the wire; each slot has
//! an area of it. Fastest (no per-call work) and least safe: the server
//! can read and write every slot's area at any time, for the connection's
//! whole life, so nothing is fenced and replies are always copied out. A
//! call too large for a slot's area gets a region of its own, as with
//! `reg-mr`.

use super::reg_mr::{give_up, per_rpc_region};
use super::{copy_out, copy_read_data, Layout, Registered, Registrar, Setup};
use crate::transport::rdma::Counters;
use crate::RegStrategy;
use bytes::Bytes;
use nfsrdma_rpcrdma::requester::CallPlan;
use nfsrdma_transport::rdma::verbs::{
    Access, MemoryRegion, ProtectionDomain, QueuePair, SendWr, VerbsError,
};
use nfsrdma_xdr::rpcrdma::RdmaSegment;
use std::sync::Arc;

/// The strategy.
pub struct Persistent {
    pd: Arc<ProtectionDomain>,
    pool: Arc<MemoryRegion>,
    area: usize,
    counters: Arc<Counters>,
}

impl Persistent {
    /// Registers the pool: `s.slots` areas of `s.area` bytes.
    pub fn new(s: &Setup<'_>) -> Result<Persistent, VerbsError> {
        Ok(Persistent {
            pd: s.pd.clone(),
            pool: MemoryRegion::new(s.pd, s.slots * s.area, Access::REMOTE)?,
            area: s.area,
            counters: s.counters.clone(),
        })
    }
}

impl Registrar for Persistent {
    fn strategy(&self) -> RegStrategy {
        RegStrategy::Persistent
    }

    fn remote_invalidation(&self) -> bool {
        false
    }

    fn register(&self, slot: usize, plan: &CallPlan) -> Result<Registered, String> {
        let layout = Layout::of(plan);
        let total = layout.total();
        if total == 0 {
            return Ok(Registered::none());
        }
        let (mem, base) = if total <= self.area {
            (self.pool.clone(), slot * self.area)
        } else {
            (
                per_rpc_region(&self.pd, total, Access::REMOTE, &self.counters)?,
                0,
            )
        };
        copy_read_data(plan, &mem, base)?;
        let seg = |at: usize, len: usize| RdmaSegment {
            handle: mem.rkey(),
            length: len as u32,
            offset: mem.addr() + (base + at) as u64,
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
        reg.base = base;
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
            // The pool is never lent out: the server may write it at any
            // time.
            Some(mem) if Arc::ptr_eq(&mem, &self.pool) => {
                copy_out(&mem, reg.base, ranges, &self.counters)
            }
            Some(mem) => give_up(mem, reg.base, ranges, &self.counters),
            None => Ok(vec![Bytes::new(); ranges.len()]),
        }
    }

    fn release_windows(&self) {}
}

impl std::fmt::Debug for Persistent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persistent").finish_non_exhaustive()
    }
}
