//! Completion channels, completion queues and work completions.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use rdma_sys::{
    ibv_ack_cq_events, ibv_comp_channel, ibv_cq, ibv_create_comp_channel, ibv_create_cq,
    ibv_destroy_comp_channel, ibv_destroy_cq, ibv_get_cq_event, ibv_poll_cq, ibv_req_notify_cq,
    ibv_wc, ibv_wc_opcode, ibv_wc_status,
};

use super::device::Context;
use super::{set_fd_nonblocking, wait_readable, wait_readable_or, Result, VerbsError, Waker};

/// `IBV_WC_WITH_INV`: the standard "receive completed a Send With
/// Invalidate" flag (1 << 3).
pub const WC_WITH_INV: u32 = 1 << 3;

/// The bit Soft-RoCE (rxe) sets instead of [`WC_WITH_INV`].
///
/// Provider quirk, seen on Linux 6.1's rxe with rdma-core 44: the kernel
/// driver reports its own `IB_WC_WITH_INVALIDATE` value (1 << 2) in
/// `wc_flags`, and the userspace rxe provider passes the flags through
/// unchanged. In the userspace numbering 1 << 2 is `IBV_WC_IP_CSUM_OK`, so
/// on other providers this bit means something else entirely; it is
/// honoured only when the CQ's [`WcFlagsQuirk`] is [`WcFlagsQuirk::Rxe`].
pub const RXE_WC_WITH_INVALIDATE: u32 = 1 << 2;

/// How a device marks receive completions of a Send With Invalidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcFlagsQuirk {
    /// Only `IBV_WC_WITH_INV` (1 << 3) means "invalidated".
    Standard,
    /// Soft-RoCE: `IBV_WC_WITH_INV` or [`RXE_WC_WITH_INVALIDATE`] (1 << 2).
    Rxe,
}

/// Decodes the invalidated rkey of a completion: `Some(rkey)` only for a
/// successful receive whose flags say "with invalidate" (standard flag, or
/// the rxe bit under [`WcFlagsQuirk::Rxe`]).
pub fn decode_invalidated_rkey(
    opcode: WcOpcode,
    success: bool,
    wc_flags: u32,
    union_value: u32,
    quirk: WcFlagsQuirk,
) -> Option<u32> {
    if !success || opcode != WcOpcode::Recv {
        return None;
    }
    let mask = match quirk {
        WcFlagsQuirk::Standard => WC_WITH_INV,
        WcFlagsQuirk::Rxe => WC_WITH_INV | RXE_WC_WITH_INVALIDATE,
    };
    (wc_flags & mask != 0).then_some(union_value)
}

/// The operation a completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// Send (also Send With Invalidate).
    Send,
    /// RDMA Write.
    RdmaWrite,
    /// RDMA Read.
    RdmaRead,
    /// Atomic compare and swap.
    CompSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// Memory window bind.
    BindMw,
    /// Local invalidate.
    LocalInv,
    /// Receive.
    Recv,
    /// Receive of an RDMA Write with immediate.
    RecvRdmaWithImm,
    /// Anything else (raw value).
    Other(u32),
}

impl WcOpcode {
    /// Maps the raw `ibv_wc_opcode`.
    pub fn from_raw(v: u32) -> Self {
        match v {
            ibv_wc_opcode::IBV_WC_SEND => Self::Send,
            ibv_wc_opcode::IBV_WC_RDMA_WRITE => Self::RdmaWrite,
            ibv_wc_opcode::IBV_WC_RDMA_READ => Self::RdmaRead,
            ibv_wc_opcode::IBV_WC_COMP_SWAP => Self::CompSwap,
            ibv_wc_opcode::IBV_WC_FETCH_ADD => Self::FetchAdd,
            ibv_wc_opcode::IBV_WC_BIND_MW => Self::BindMw,
            ibv_wc_opcode::IBV_WC_LOCAL_INV => Self::LocalInv,
            ibv_wc_opcode::IBV_WC_RECV => Self::Recv,
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => Self::RecvRdmaWithImm,
            other => Self::Other(other),
        }
    }
}

/// Why a work request failed (`ibv_wc_status` other than success).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CompletionError {
    /// Local length error (e.g. a receive buffer too small for the message).
    #[error("local length error")]
    LocalLength,
    /// Local QP operation error.
    #[error("local QP operation error")]
    LocalQpOperation,
    /// Local protection error (e.g. an lkey that is no longer valid).
    #[error("local protection error")]
    LocalProtection,
    /// The work request was flushed because the QP is in the error state.
    #[error("work request flushed")]
    Flushed,
    /// Memory window bind failed.
    #[error("memory window bind error")]
    MwBind,
    /// Bad response from the peer.
    #[error("bad response")]
    BadResponse,
    /// Local access error.
    #[error("local access error")]
    LocalAccess,
    /// The peer found the request invalid.
    #[error("remote invalid request")]
    RemoteInvalidRequest,
    /// The peer refused access (bad rkey, outside the range, no rights, or
    /// an invalidated window/region).
    #[error("remote access error")]
    RemoteAccess,
    /// The peer could not complete the operation.
    #[error("remote operation error")]
    RemoteOperation,
    /// Transport retries exhausted (peer unreachable or not answering).
    #[error("transport retry counter exceeded")]
    RetryExceeded,
    /// Receiver-not-ready retries exhausted (peer had no receive posted).
    #[error("RNR retry counter exceeded")]
    RnrRetryExceeded,
    /// Remote aborted.
    #[error("remote aborted")]
    RemoteAbort,
    /// Fatal device error.
    #[error("fatal error")]
    Fatal,
    /// Response timeout.
    #[error("response timeout")]
    ResponseTimeout,
    /// General error.
    #[error("general error")]
    General,
    /// Any other status (raw value).
    #[error("completion status {0}")]
    Other(u32),
}

impl CompletionError {
    /// Maps a raw status; `None` for success.
    pub fn from_status(status: u32) -> Option<Self> {
        use ibv_wc_status::*;
        Some(match status {
            IBV_WC_SUCCESS => return None,
            IBV_WC_LOC_LEN_ERR => Self::LocalLength,
            IBV_WC_LOC_QP_OP_ERR => Self::LocalQpOperation,
            IBV_WC_LOC_PROT_ERR => Self::LocalProtection,
            IBV_WC_WR_FLUSH_ERR => Self::Flushed,
            IBV_WC_MW_BIND_ERR => Self::MwBind,
            IBV_WC_BAD_RESP_ERR => Self::BadResponse,
            IBV_WC_LOC_ACCESS_ERR => Self::LocalAccess,
            IBV_WC_REM_INV_REQ_ERR => Self::RemoteInvalidRequest,
            IBV_WC_REM_ACCESS_ERR => Self::RemoteAccess,
            IBV_WC_REM_OP_ERR => Self::RemoteOperation,
            IBV_WC_RETRY_EXC_ERR => Self::RetryExceeded,
            IBV_WC_RNR_RETRY_EXC_ERR => Self::RnrRetryExceeded,
            IBV_WC_REM_ABORT_ERR => Self::RemoteAbort,
            IBV_WC_FATAL_ERR => Self::Fatal,
            IBV_WC_RESP_TIMEOUT_ERR => Self::ResponseTimeout,
            IBV_WC_GENERAL_ERR => Self::General,
            other => Self::Other(other),
        })
    }
}

/// One polled work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The caller's id from the work request.
    pub wr_id: u64,
    /// Success, or why it failed.
    pub status: Result<(), CompletionError>,
    /// The operation. Not meaningful for failed completions (the verbs
    /// specification leaves it undefined); use `wr_id` to identify those.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or transferred (RDMA Read).
    pub byte_len: u32,
    /// For a successful receive of a Send With Invalidate: the rkey the
    /// peer invalidated (see [`decode_invalidated_rkey`] for the rxe quirk).
    pub invalidated_rkey: Option<u32>,
    /// Local QP number.
    pub qp_num: u32,
    /// Raw `wc_flags`.
    pub wc_flags: u32,
    /// Vendor error syndrome (failed completions).
    pub vendor_err: u32,
}

impl WorkCompletion {
    fn from_raw(wc: &ibv_wc, quirk: WcFlagsQuirk) -> Self {
        let status = match CompletionError::from_status(wc.status) {
            None => Ok(()),
            Some(e) => Err(e),
        };
        let opcode = WcOpcode::from_raw(wc.opcode);
        // SAFETY: both union members are u32, so reading either is defined.
        let union_value = unsafe { wc.imm_data_invalidated_rkey_union.invalidated_rkey };
        Self {
            wr_id: wc.wr_id,
            status,
            opcode,
            byte_len: wc.byte_len,
            invalidated_rkey: decode_invalidated_rkey(
                opcode,
                status.is_ok(),
                wc.wc_flags,
                union_value,
                quirk,
            ),
            qp_num: wc.qp_num,
            wc_flags: wc.wc_flags,
            vendor_err: wc.vendor_err,
        }
    }

    /// True if the work request succeeded.
    pub fn is_ok(&self) -> bool {
        self.status.is_ok()
    }
}

/// Opaque identity of a completion queue, as returned by
/// [`CompletionChannel::get_event`] and [`CompletionQueue::id`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CqId(usize);

/// How a wait on a completion channel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// A CQ's event (acknowledged; the CQ must be armed again).
    Event(CqId),
    /// The waker was signalled (and its wake-up taken).
    Woken,
    /// Neither came in time.
    TimedOut,
}

/// A completion channel (`ibv_create_comp_channel`): the file descriptor
/// armed CQs signal.
pub struct CompletionChannel {
    ch: NonNull<ibv_comp_channel>,
    ctx: Context,
}

// SAFETY: the channel is owned by this value; reading events from it is
// thread safe in libibverbs.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// Creates a channel on `ctx`.
    pub fn new(ctx: &Context) -> Result<Arc<Self>> {
        // SAFETY: the context is live.
        let ch = unsafe { ibv_create_comp_channel(ctx.as_ptr()) };
        let ch = NonNull::new(ch).ok_or_else(|| VerbsError::last_os("ibv_create_comp_channel"))?;
        Ok(Arc::new(Self {
            ch,
            ctx: ctx.clone(),
        }))
    }

    /// The channel's file descriptor (for an external poller). Owned by
    /// the channel: do not close it.
    pub fn fd(&self) -> i32 {
        // SAFETY: the channel is live.
        unsafe { self.ch.as_ref().fd }
    }

    /// Switches the fd between blocking and non-blocking mode. In
    /// non-blocking mode [`Self::get_event`] with `None` timeout returns
    /// `Ok(None)` at once when no event is pending.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        set_fd_nonblocking(self.fd(), nonblocking)
    }

    /// Waits up to `timeout` (`None`: forever, or not at all in
    /// non-blocking mode) for a CQ event. Returns the CQ that fired, or
    /// `None` on timeout. The event is acknowledged before returning, and
    /// the CQ must be re-armed with [`CompletionQueue::req_notify`] to fire
    /// again.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<CqId>> {
        if timeout.is_some() && !wait_readable(self.fd(), timeout)? {
            return Ok(None);
        }
        self.read_event()
    }

    /// [`Self::get_event`], but a signal of `waker` ends the wait too: the
    /// wake-up is then taken, and `Ok(Woken)` returned (any CQ event is
    /// left for the next call).
    pub fn get_event_or_wake(&self, timeout: Option<Duration>, waker: &Waker) -> Result<Waited> {
        let r = wait_readable_or(self.fd(), waker.fd(), timeout)?;
        if r.second {
            waker.take();
            return Ok(Waited::Woken);
        }
        if !r.first {
            return Ok(Waited::TimedOut);
        }
        Ok(match self.read_event()? {
            Some(cq) => Waited::Event(cq),
            None => Waited::TimedOut,
        })
    }

    fn read_event(&self) -> Result<Option<CqId>> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: live channel and valid out-pointers.
        let rc = unsafe { ibv_get_cq_event(self.ch.as_ptr(), &mut cq, &mut cq_ctx) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(VerbsError::Call {
                    call: "ibv_get_cq_event",
                    source: err,
                }),
            };
        }
        // SAFETY: `cq` is the CQ the event belongs to. It cannot have been
        // destroyed yet: ibv_destroy_cq waits until all of its events are
        // acknowledged, which is what this call does. We do not touch `cq`
        // afterwards.
        unsafe { ibv_ack_cq_events(cq, 1) };
        Ok(Some(CqId(cq as usize)))
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; CQs using the channel
        // hold an Arc to it, so none is left.
        unsafe { ibv_destroy_comp_channel(self.ch.as_ptr()) };
    }
}

/// A completion queue (`ibv_create_cq`).
pub struct CompletionQueue {
    cq: NonNull<ibv_cq>,
    ctx: Context,
    channel: Option<Arc<CompletionChannel>>,
    quirk: WcFlagsQuirk,
    capacity: u32,
}

// SAFETY: the CQ is owned by this value; polling and arming are thread
// safe in libibverbs providers.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

/// How many completions one `ibv_poll_cq` call fetches at most.
const POLL_BATCH: usize = 32;

impl CompletionQueue {
    /// Creates a CQ with room for at least `entries` completions,
    /// optionally attached to `channel` (for event mode).
    pub fn new(
        ctx: &Context,
        entries: u32,
        channel: Option<&Arc<CompletionChannel>>,
    ) -> Result<Arc<Self>> {
        if let Some(ch) = channel {
            if !ch.ctx.same_as(ctx) {
                return Err(VerbsError::InvalidArgument(
                    "completion channel belongs to another device".into(),
                ));
            }
        }
        let cqe = libc::c_int::try_from(entries.max(1))
            .map_err(|_| VerbsError::InvalidArgument(format!("{entries} CQ entries")))?;
        let ch_ptr = channel.map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        // SAFETY: live context; the channel (if any) is live and kept alive
        // by the Arc we store.
        let cq = unsafe { ibv_create_cq(ctx.as_ptr(), cqe, std::ptr::null_mut(), ch_ptr, 0) };
        let cq = NonNull::new(cq).ok_or_else(|| VerbsError::last_os("ibv_create_cq"))?;
        // SAFETY: freshly created CQ.
        let capacity = u32::try_from(unsafe { cq.as_ref().cqe }).unwrap_or(entries);
        Ok(Arc::new(Self {
            cq,
            ctx: ctx.clone(),
            channel: channel.cloned(),
            quirk: ctx.wc_flags_quirk(),
            capacity,
        }))
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_cq {
        self.cq.as_ptr()
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Identity for matching [`CompletionChannel::get_event`] results.
    pub fn id(&self) -> CqId {
        CqId(self.cq.as_ptr() as usize)
    }

    /// The completion channel, if the CQ was created with one.
    pub fn channel(&self) -> Option<&Arc<CompletionChannel>> {
        self.channel.as_ref()
    }

    /// Actual number of entries.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// How receive completions are decoded on this device.
    pub fn wc_flags_quirk(&self) -> WcFlagsQuirk {
        self.quirk
    }

    /// Polls up to `max` completions, appending them to `out`. Returns how
    /// many were appended (0: the queue is empty).
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        self.poll_with(max, |wc| out.push(wc))
    }

    /// Polls up to `max` completions, handing each to `f`. Returns how many
    /// there were.
    pub fn poll_with(&self, max: usize, mut f: impl FnMut(WorkCompletion)) -> Result<usize> {
        let mut total = 0;
        while total < max {
            let want = (max - total).min(POLL_BATCH);
            let mut wcs = MaybeUninit::<[ibv_wc; POLL_BATCH]>::uninit();
            let base = wcs.as_mut_ptr().cast::<ibv_wc>();
            // SAFETY: live CQ; `base` has room for POLL_BATCH >= `want`
            // entries (`want` fits in an i32); the provider writes the
            // first `n` of them.
            let n = unsafe { ibv_poll_cq(self.cq.as_ptr(), want as i32, base) };
            if n < 0 {
                return Err(VerbsError::errno("ibv_poll_cq", -n));
            }
            let n = (n as usize).min(want);
            for i in 0..n {
                // SAFETY: entry `i < n` was initialised by ibv_poll_cq.
                let wc = unsafe { &*base.add(i) };
                f(WorkCompletion::from_raw(wc, self.quirk));
            }
            total += n;
            if n < want {
                break;
            }
        }
        Ok(total)
    }

    /// Polls one completion, if any.
    pub fn poll_one(&self) -> Result<Option<WorkCompletion>> {
        let mut one = None;
        self.poll_with(1, |wc| one = Some(wc))?;
        Ok(one)
    }

    /// Arms the CQ: the next completion (only solicited ones if
    /// `solicited_only`) makes its channel report an event. Poll after
    /// arming to catch completions that arrived before it.
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel.is_none() {
            return Err(VerbsError::InvalidArgument(
                "CQ has no completion channel".into(),
            ));
        }
        // SAFETY: live CQ.
        let rc = unsafe { ibv_req_notify_cq(self.cq.as_ptr(), i32::from(solicited_only)) };
        if rc != 0 {
            return Err(VerbsError::errno("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once. QPs using the CQ hold an
        // Arc to it, so none is left; channel events are acknowledged as
        // soon as they are read, so destroy does not wait forever.
        unsafe { ibv_destroy_cq(self.cq.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalidate_flag_decoding() {
        use WcFlagsQuirk::*;
        let recv = WcOpcode::Recv;
        // Standard flag on any device.
        assert_eq!(
            decode_invalidated_rkey(recv, true, 1 << 3, 7, Standard),
            Some(7)
        );
        assert_eq!(decode_invalidated_rkey(recv, true, 1 << 3, 7, Rxe), Some(7));
        // rxe reports 0x5 (GRH | 1 << 2).
        assert_eq!(
            decode_invalidated_rkey(recv, true, 0x5, 0x1234, Rxe),
            Some(0x1234)
        );
        // On other devices 1 << 2 is IP_CSUM_OK, not an invalidation.
        assert_eq!(
            decode_invalidated_rkey(recv, true, 0x5, 0x1234, Standard),
            None
        );
        // Only successful receives carry an invalidated rkey.
        assert_eq!(
            decode_invalidated_rkey(recv, false, 1 << 3, 7, Standard),
            None
        );
        assert_eq!(
            decode_invalidated_rkey(WcOpcode::Send, true, 1 << 3, 7, Standard),
            None
        );
        // No flag: nothing, whatever the union holds.
        assert_eq!(decode_invalidated_rkey(recv, true, 0x1, 7, Rxe), None);
        // Immediate data (1 << 1) is not an invalidation.
        assert_eq!(decode_invalidated_rkey(recv, true, 1 << 1, 7, Rxe), None);
    }

    #[test]
    fn status_mapping() {
        assert_eq!(CompletionError::from_status(0), None);
        assert_eq!(
            CompletionError::from_status(10),
            Some(CompletionError::RemoteAccess)
        );
        assert_eq!(
            CompletionError::from_status(12),
            Some(CompletionError::RetryExceeded)
        );
        assert_eq!(
            CompletionError::from_status(13),
            Some(CompletionError::RnrRetryExceeded)
        );
        assert_eq!(
            CompletionError::from_status(5),
            Some(CompletionError::Flushed)
        );
        assert_eq!(
            CompletionError::from_status(4),
            Some(CompletionError::LocalProtection)
        );
        assert_eq!(
            CompletionError::from_status(999),
            Some(CompletionError::Other(999))
        );
    }

    #[test]
    fn opcode_mapping() {
        assert_eq!(WcOpcode::from_raw(0), WcOpcode::Send);
        assert_eq!(WcOpcode::from_raw(1), WcOpcode::RdmaWrite);
        assert_eq!(WcOpcode::from_raw(2), WcOpcode::RdmaRead);
        assert_eq!(WcOpcode::from_raw(5), WcOpcode::BindMw);
        assert_eq!(WcOpcode::from_raw(6), WcOpcode::LocalInv);
        assert_eq!(WcOpcode::from_raw(128), WcOpcode::Recv);
        assert_eq!(WcOpcode::from_raw(77), WcOpcode::Other(77));
    }

    #[test]
    fn raw_completion_conversion() {
        // SAFETY: ibv_wc is plain old data; all-zero is valid.
        let mut wc: ibv_wc = unsafe { std::mem::zeroed() };
        wc.wr_id = 42;
        wc.status = ibv_wc_status::IBV_WC_SUCCESS;
        wc.opcode = ibv_wc_opcode::IBV_WC_RECV;
        wc.byte_len = 100;
        wc.wc_flags = 0x5;
        wc.imm_data_invalidated_rkey_union.invalidated_rkey = 0xabcd_0102;
        let c = WorkCompletion::from_raw(&wc, WcFlagsQuirk::Rxe);
        assert_eq!(c.wr_id, 42);
        assert!(c.is_ok());
        assert_eq!(c.opcode, WcOpcode::Recv);
        assert_eq!(c.byte_len, 100);
        assert_eq!(c.invalidated_rkey, Some(0xabcd_0102));
        wc.status = ibv_wc_status::IBV_WC_REM_ACCESS_ERR;
        let c = WorkCompletion::from_raw(&wc, WcFlagsQuirk::Rxe);
        assert_eq!(c.status, Err(CompletionError::RemoteAccess));
        assert_eq!(c.invalidated_rkey, None);
    }
}
