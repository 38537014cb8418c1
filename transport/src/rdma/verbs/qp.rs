//! Reliable-connected queue pairs and posting work requests.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_sys::{
    bind_mw_t, ibv_mw_bind_info, ibv_post_recv, ibv_post_send, ibv_qp, ibv_recv_wr, ibv_send_flags,
    ibv_send_wr, ibv_sge, ibv_wr_opcode, rdma_destroy_qp, rdma_t,
};

use super::cm::CmIdInner;
use super::cq::CompletionQueue;
use super::mr::{MemoryRegion, ProtectionDomain, RemoteBuf, Sge};
use super::mw::{next_rkey, MemoryWindow, MwAccess};
use super::srq::SharedReceiveQueue;
use super::{check_range, Result, VerbsError};

/// How a queue pair meets receiver-not-ready, as the device holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RnrAttrs {
    /// `rnr_retry`: how often the QP's own Sends are retried after an RNR
    /// NAK (7: for ever).
    pub retry: u8,
    /// `min_rnr_timer`: the IB code of the wait the QP asks of a peer
    /// whose Send found no receive (0: 655.36 ms; 14: 1.28 ms).
    pub min_timer: u8,
}

/// Queue depths and limits of a queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send-queue work requests.
    pub max_send_wr: u32,
    /// Outstanding receive-queue work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline (copied at post time).
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 2,
            max_inline_data: 0,
        }
    }
}

/// Flags of a send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// Generate a completion (otherwise only errors complete).
    pub signaled: bool,
    /// Wait for earlier RDMA Reads on this QP before executing.
    pub fence: bool,
    /// Ask the peer's CQ to raise a solicited event.
    pub solicited: bool,
    /// Copy the data into the work request at post time (up to
    /// [`QpCaps::max_inline_data`] bytes).
    pub inline: bool,
}

impl SendFlags {
    /// Signaled, nothing else.
    pub const SIGNALED: Self = Self {
        signaled: true,
        fence: false,
        solicited: false,
        inline: false,
    };
    /// Unsignaled, nothing else.
    pub const UNSIGNALED: Self = Self {
        signaled: false,
        fence: false,
        solicited: false,
        inline: false,
    };

    fn bits(self) -> u32 {
        let mut b = 0;
        if self.signaled {
            b |= ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        if self.fence {
            b |= ibv_send_flags::IBV_SEND_FENCE.0;
        }
        if self.solicited {
            b |= ibv_send_flags::IBV_SEND_SOLICITED.0;
        }
        if self.inline {
            b |= ibv_send_flags::IBV_SEND_INLINE.0;
        }
        b
    }
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy)]
pub enum SendOp<'a> {
    /// Send the gathered bytes into the peer's next posted receive.
    Send {
        /// Local data.
        sges: &'a [Sge<'a>],
    },
    /// Send, and invalidate `invalidate_rkey` at the peer (a window or
    /// region the peer registered); the peer's receive completion reports
    /// that rkey.
    SendWithInv {
        /// Local data.
        sges: &'a [Sge<'a>],
        /// The peer's rkey to invalidate.
        invalidate_rkey: u32,
    },
    /// Write the gathered bytes into the peer's memory.
    RdmaWrite {
        /// Local source.
        sges: &'a [Sge<'a>],
        /// Peer target; the source length must not exceed `remote.len`.
        remote: RemoteBuf,
    },
    /// Read the peer's memory into the scattered local buffers.
    RdmaRead {
        /// Local target.
        sges: &'a [Sge<'a>],
        /// Peer source; the target length must not exceed `remote.len`.
        remote: RemoteBuf,
    },
    /// Invalidate a local rkey (of a window bound on this QP, or of a
    /// region).
    LocalInv {
        /// The rkey to invalidate.
        rkey: u32,
    },
    /// Bind a type-2 window to `offset..offset + len` of `mr`, giving it
    /// the rkey `next_rkey(mw.rkey())`; read it with
    /// [`MemoryWindow::rkey`] after posting. The window, the region and
    /// the QP must share one PD, and the region needs
    /// [`Access::mw_bind`](super::Access).
    BindMw {
        /// The window.
        mw: &'a MemoryWindow,
        /// The region to expose.
        mr: &'a Arc<MemoryRegion>,
        /// Start of the exposed range within the region.
        offset: usize,
        /// Length of the exposed range.
        len: usize,
        /// Rights granted to the peer.
        access: MwAccess,
    },
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp<'a>,
    /// Flags.
    pub flags: SendFlags,
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send lands.
    pub sges: &'a [Sge<'a>],
}

/// A reliable-connected queue pair created on a CM id
/// (`rdma_create_qp`). Keeps its CM id, PD and CQs alive; Drop destroys
/// it (`rdma_destroy_qp`).
///
/// Posting is thread safe (`&self`). Work requests name local memory only
/// through [`Sge`]s of live regions; see the module docs of `verbs` for why
/// dropping a region with work requests outstanding is safe (those requests
/// fail).
pub struct QueuePair {
    qp: NonNull<ibv_qp>,
    caps: QpCaps,
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    /// The shared receive queue the QP takes its receives from, if any.
    srq: Option<Arc<SharedReceiveQueue>>,
    // Dropped after the QP is destroyed (field order does not matter: Drop
    // runs first).
    cm: Arc<CmIdInner>,
}

// SAFETY: posting work requests is thread safe in libibverbs providers;
// the QP handle is owned by this value.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qp_num", &self.qp_num())
            .field("caps", &self.caps)
            .finish()
    }
}

impl QueuePair {
    pub(crate) fn from_raw(
        qp: NonNull<ibv_qp>,
        caps: QpCaps,
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        srq: Option<Arc<SharedReceiveQueue>>,
        cm: Arc<CmIdInner>,
    ) -> Self {
        Self {
            qp,
            caps,
            pd,
            send_cq,
            recv_cq,
            srq,
            cm,
        }
    }

    /// The shared receive queue the QP takes its receives from, if it was
    /// created on one.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live until Drop; qp_num never changes.
        unsafe { self.qp.as_ref().qp_num }
    }

    /// The local ACK timeout exponent the QP runs with (its `timeout`
    /// attribute: 4.096 µs × 2^value; 0 means it never times out).
    pub fn ack_timeout(&self) -> Result<u8> {
        // SAFETY: both attribute structs are plain old data; zero is valid.
        let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: rdma_sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is live until Drop; both out-pointers are valid
        // for the call.
        let rc = unsafe {
            rdma_sys::ibv_query_qp(
                self.qp.as_ptr(),
                &mut attr,
                rdma_sys::ibv_qp_attr_mask::IBV_QP_TIMEOUT.0 as i32,
                &mut init,
            )
        };
        if rc != 0 {
            return Err(VerbsError::errno("ibv_query_qp", rc));
        }
        Ok(attr.timeout)
    }

    /// How the QP meets receiver-not-ready (see [`RnrAttrs`]).
    pub fn rnr_attrs(&self) -> Result<RnrAttrs> {
        // SAFETY: both attribute structs are plain old data; zero is valid.
        let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: rdma_sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = rdma_sys::ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0
            | rdma_sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0;
        // SAFETY: the QP is live until Drop; both out-pointers are valid
        // for the call.
        let rc =
            unsafe { rdma_sys::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask as i32, &mut init) };
        if rc != 0 {
            return Err(VerbsError::errno("ibv_query_qp", rc));
        }
        Ok(RnrAttrs {
            retry: attr.rnr_retry,
            min_timer: attr.min_rnr_timer,
        })
    }

    /// The capabilities the device granted (may exceed what was asked).
    pub fn caps(&self) -> QpCaps {
        self.caps
    }

    /// The protection domain.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The send completion queue.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    /// The receive completion queue.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    /// Posts a chain of send-queue work requests (one `ibv_post_send`).
    ///
    /// On failure no request from the failing one on was posted; the ones
    /// before it were.
    pub fn post_send(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        self.post_send_counted(wrs).map_err(|(_, e)| e)
    }

    /// [`QueuePair::post_send`], telling on failure how many of the
    /// requests (the first ones) were posted.
    pub(crate) fn post_send_counted(
        &self,
        wrs: &[SendWr<'_>],
    ) -> std::result::Result<(), (usize, VerbsError)> {
        if wrs.is_empty() {
            return Ok(());
        }
        self.post_send_checked(wrs).map_err(|e| (0, e))?;
        self.post_send_raw(wrs)
    }

    /// Validates a chain before anything of it is posted.
    fn post_send_checked(&self, wrs: &[SendWr<'_>]) -> Result<()> {
        // Validate everything before touching any window state.
        for wr in wrs {
            match wr.op {
                SendOp::Send { sges } | SendOp::SendWithInv { sges, .. } => {
                    let total = check_sges(sges, self.caps.max_send_sge, "send")?;
                    if wr.flags.inline && total > u64::from(self.caps.max_inline_data) {
                        return Err(VerbsError::InvalidArgument(format!(
                            "inline send of {total} bytes, QP allows {}",
                            self.caps.max_inline_data
                        )));
                    }
                }
                SendOp::RdmaWrite { sges, remote } | SendOp::RdmaRead { sges, remote } => {
                    let total = check_sges(sges, self.caps.max_send_sge, "rdma")?;
                    if total > u64::from(remote.len) {
                        return Err(VerbsError::InvalidArgument(format!(
                            "RDMA of {total} bytes into a remote segment of {}",
                            remote.len
                        )));
                    }
                }
                SendOp::LocalInv { .. } => {}
                SendOp::BindMw {
                    mw,
                    mr,
                    offset,
                    len,
                    ..
                } => {
                    if !Arc::ptr_eq(mw.pd(), &self.pd) || !Arc::ptr_eq(mr.pd(), &self.pd) {
                        return Err(VerbsError::InvalidArgument(
                            "window, region and QP must share one protection domain".into(),
                        ));
                    }
                    if !mr.access().mw_bind {
                        return Err(VerbsError::InvalidArgument(
                            "region was not registered with MW bind access".into(),
                        ));
                    }
                    if len == 0 {
                        return Err(VerbsError::InvalidArgument(
                            "cannot bind a zero-length window".into(),
                        ));
                    }
                    check_range(offset, len, mr.len())?;
                }
            }
        }
        Ok(())
    }

    fn post_send_raw(&self, wrs: &[SendWr<'_>]) -> std::result::Result<(), (usize, VerbsError)> {
        let sge_count = wrs
            .iter()
            .map(|wr| match wr.op {
                SendOp::Send { sges }
                | SendOp::SendWithInv { sges, .. }
                | SendOp::RdmaWrite { sges, .. }
                | SendOp::RdmaRead { sges, .. } => sges.len(),
                _ => 0,
            })
            .sum();
        // Flat SGE storage: reserved up front so pointers into it stay valid.
        let mut sge_store: Vec<ibv_sge> = Vec::with_capacity(sge_count);
        let mut raw: Vec<ibv_send_wr> = Vec::with_capacity(wrs.len());
        // For windows bound by this chain: (index, window, previous rkey,
        // whether the region was new to the window), to restore if the
        // request is not posted.
        let mut binds: Vec<PendingBind<'_>> = Vec::new();

        // Per request: where its SGEs start in `sge_store` (None: no SGEs).
        let mut sge_starts: Vec<Option<usize>> = Vec::with_capacity(wrs.len());

        for (i, wr) in wrs.iter().enumerate() {
            // SAFETY: ibv_send_wr consists of integers, raw pointers and
            // unions of those; all-zero (null pointers) is a valid value.
            let mut w: ibv_send_wr = unsafe { std::mem::zeroed() };
            w.wr_id = wr.wr_id;
            w.send_flags = wr.flags.bits();
            let sges: &[Sge<'_>] = match wr.op {
                SendOp::Send { sges } => {
                    w.opcode = ibv_wr_opcode::IBV_WR_SEND;
                    sges
                }
                SendOp::SendWithInv {
                    sges,
                    invalidate_rkey,
                } => {
                    w.opcode = ibv_wr_opcode::IBV_WR_SEND_WITH_INV;
                    w.imm_data_invalidated_rkey_union.invalidated_rkey = invalidate_rkey;
                    sges
                }
                SendOp::RdmaWrite { sges, remote } => {
                    w.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                    w.wr.rdma = rdma_t {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    };
                    sges
                }
                SendOp::RdmaRead { sges, remote } => {
                    w.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
                    w.wr.rdma = rdma_t {
                        remote_addr: remote.addr,
                        rkey: remote.rkey,
                    };
                    sges
                }
                SendOp::LocalInv { rkey } => {
                    w.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
                    w.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
                    &[]
                }
                SendOp::BindMw {
                    mw,
                    mr,
                    offset,
                    len,
                    access,
                } => {
                    let mut st = mw.state.lock().unwrap_or_else(|p| p.into_inner());
                    let new_rkey = next_rkey(st.rkey);
                    let newly_held = !st.held.iter().any(|h| Arc::ptr_eq(h, mr));
                    if newly_held {
                        st.held.push(mr.clone());
                    }
                    binds.push(PendingBind {
                        index: i,
                        mw,
                        old_rkey: st.rkey,
                        new_rkey,
                        newly_held,
                    });
                    st.rkey = new_rkey;
                    drop(st);
                    w.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
                    w.bind_mw_tso_union.bind_mw = bind_mw_t {
                        mw: mw.as_ptr(),
                        rkey: new_rkey,
                        bind_info: ibv_mw_bind_info {
                            mr: mr.as_ptr(),
                            addr: mr.addr() + offset as u64,
                            length: len as u64,
                            mw_access_flags: access.bits(),
                        },
                    };
                    &[]
                }
            };
            sge_starts.push((!sges.is_empty()).then_some(sge_store.len()));
            sge_store.extend(sges.iter().map(raw_sge));
            // At most max_send_sge (a u32), checked above.
            w.num_sge = sges.len() as i32;
            raw.push(w);
        }
        let base = raw.as_mut_ptr();
        // SAFETY: `raw` and `sge_store` are fully built and not touched
        // through references any more; every index is in bounds.
        unsafe { link_chain(base, raw.len(), sge_store.as_mut_ptr(), &sge_starts) };
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: live QP; the chain, its SGE arrays, and every window and
        // region it names stay alive for the duration of the call (the
        // provider copies work requests into its queue before returning).
        // Regions and windows are additionally kept alive afterwards by the
        // windows' state (binds) or fail safely if dropped (see module docs).
        let rc = unsafe { ibv_post_send(self.qp.as_ptr(), base, &mut bad) };
        let failed_at = if rc == 0 {
            wrs.len()
        } else if bad.is_null() {
            0
        } else {
            // Both pointers are into `raw`.
            (bad as usize - base as usize) / std::mem::size_of::<ibv_send_wr>()
        };
        // Posted binds, in chain order (a window bound twice in one chain
        // ends with the later rkey): the provider reads the window's
        // current rkey from `ibv_mw.rkey` on the next bind (rxe checks it
        // against the kernel's), so keep it in step.
        for b in binds.iter().filter(|b| b.index < failed_at) {
            b.mw.set_provider_rkey(b.new_rkey);
        }
        // Binds that were not posted: undo our bookkeeping, newest first.
        for b in binds.into_iter().rev().filter(|b| b.index >= failed_at) {
            let mut st = b.mw.state.lock().unwrap_or_else(|p| p.into_inner());
            st.rkey = b.old_rkey;
            if b.newly_held {
                // The latest one pushed, as undoing goes newest first.
                st.held.pop();
            }
        }
        if rc != 0 {
            return Err((failed_at, VerbsError::errno("ibv_post_send", rc)));
        }
        Ok(())
    }

    /// Posts one send-queue work request.
    pub fn post_send_one(&self, wr_id: u64, op: SendOp<'_>, flags: SendFlags) -> Result<()> {
        self.post_send(&[SendWr { wr_id, op, flags }])
    }

    /// Posts receive work requests (one `ibv_post_recv`).
    pub fn post_recv(&self, wrs: &[RecvWr<'_>]) -> Result<()> {
        if let Some(srq) = &self.srq {
            return Err(VerbsError::InvalidArgument(format!(
                "queue pair {} takes its receives from a shared receive queue \
                 (post them there: {srq:?})",
                self.qp_num()
            )));
        }
        let qp = self.qp.as_ptr();
        post_recv_chain(wrs, self.caps.max_recv_sge, "ibv_post_recv", |wr, bad| {
            // SAFETY: live QP; the chain and its SGE arrays outlive the
            // call (post_recv_chain's contract).
            unsafe { ibv_post_recv(qp, wr, bad) }
        })
    }

    /// Posts one receive.
    pub fn post_recv_one(&self, wr_id: u64, sges: &[Sge<'_>]) -> Result<()> {
        self.post_recv(&[RecvWr { wr_id, sges }])
    }
}

/// A window bind in a chain being posted.
struct PendingBind<'a> {
    index: usize,
    mw: &'a MemoryWindow,
    old_rkey: u32,
    new_rkey: u32,
    /// The bind added its region to the window's held regions.
    newly_held: bool,
}

fn raw_sge(s: &Sge<'_>) -> ibv_sge {
    ibv_sge {
        addr: s.addr,
        length: s.length,
        lkey: s.lkey,
    }
}

/// The bytes `sges` cover; an error when there are more than `max` of
/// them (the queue's limit for `what`).
fn check_sges(sges: &[Sge<'_>], max: u32, what: &str) -> Result<u64> {
    if sges.len() > max as usize {
        return Err(VerbsError::InvalidArgument(format!(
            "{what}: {} scatter/gather entries, the queue allows {max}",
            sges.len()
        )));
    }
    Ok(sges.iter().map(|s| u64::from(s.length)).sum())
}

/// Builds `wrs` into one chain of `ibv_recv_wr` (with their scatter/gather
/// arrays) and hands its head to `post`, which posts it and returns the
/// verbs call's result: 0 or an errno. At most `max_sge` entries per
/// request.
pub(crate) fn post_recv_chain(
    wrs: &[RecvWr<'_>],
    max_sge: u32,
    call: &'static str,
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> i32,
) -> Result<()> {
    if wrs.is_empty() {
        return Ok(());
    }
    let mut sge_count = 0;
    for wr in wrs {
        check_sges(wr.sges, max_sge, "receive")?;
        sge_count += wr.sges.len();
    }
    let mut sge_store: Vec<ibv_sge> = Vec::with_capacity(sge_count);
    let mut raw: Vec<ibv_recv_wr> = Vec::with_capacity(wrs.len());
    let mut sge_starts: Vec<Option<usize>> = Vec::with_capacity(wrs.len());
    for wr in wrs {
        sge_starts.push((!wr.sges.is_empty()).then_some(sge_store.len()));
        sge_store.extend(wr.sges.iter().map(raw_sge));
        raw.push(ibv_recv_wr {
            wr_id: wr.wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            // At most max_sge (a u32), checked above.
            num_sge: wr.sges.len() as i32,
        });
    }
    let base = raw.as_mut_ptr();
    // SAFETY: both vectors are fully built; indices are in bounds.
    unsafe { link_chain(base, raw.len(), sge_store.as_mut_ptr(), &sge_starts) };
    let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
    // `raw` and `sge_store` live until the end of this function, past the
    // call.
    let rc = post(base, &mut bad);
    if rc != 0 {
        return Err(VerbsError::errno(call, rc));
    }
    Ok(())
}

/// Work requests that can be chained and point at SGE arrays.
trait ChainedWr: Sized {
    fn set_links(&mut self, next: *mut Self, sg_list: Option<*mut ibv_sge>);
}

impl ChainedWr for ibv_send_wr {
    fn set_links(&mut self, next: *mut Self, sg_list: Option<*mut ibv_sge>) {
        self.next = next;
        if let Some(p) = sg_list {
            self.sg_list = p;
        }
    }
}

impl ChainedWr for ibv_recv_wr {
    fn set_links(&mut self, next: *mut Self, sg_list: Option<*mut ibv_sge>) {
        self.next = next;
        if let Some(p) = sg_list {
            self.sg_list = p;
        }
    }
}

/// Links `n` work requests at `base` into a chain and points each at its
/// SGEs in `sges`.
///
/// # Safety
/// `base` must point to `n` initialised requests and `sges` to an array
/// containing every index in `starts`; `starts.len() == n`; no reference
/// to either array may be alive.
unsafe fn link_chain<W: ChainedWr>(
    base: *mut W,
    n: usize,
    sges: *mut ibv_sge,
    starts: &[Option<usize>],
) {
    for (i, start) in starts.iter().enumerate().take(n) {
        let next = if i + 1 < n {
            // SAFETY: i + 1 < n, inside the array (caller's contract).
            unsafe { base.add(i + 1) }
        } else {
            std::ptr::null_mut()
        };
        // SAFETY: `start` indexes the SGE array (caller's contract).
        let sg = start.map(|s| unsafe { sges.add(s) });
        // SAFETY: i < n, an initialised element, not otherwise borrowed.
        unsafe { (*base.add(i)).set_links(next, sg) };
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // Not while another thread disconnects, connects or accepts on the
        // id: those read the id's QP pointer.
        let _qp = self.cm.lock_qp();
        // SAFETY: the CM id is alive (we hold an Arc to it) and owns exactly
        // this QP (create_qp refuses a second one). Destroyed once.
        unsafe { rdma_destroy_qp(self.cm.as_ptr()) };
        self.cm.qp_destroyed();
    }
}
