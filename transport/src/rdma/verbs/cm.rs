//! The RDMA connection manager (librdmacm): event channels, CM ids,
//! address/route resolution, listen/connect/accept/reject/disconnect, and
//! private data both ways.
//!
//! Events are copied into a plain Rust [`CmEvent`] and acknowledged inside
//! [`EventChannel::get_event`], so no event can keep `rdma_destroy_id`
//! waiting. A connect request's new CM id becomes an owned [`CmId`] inside
//! the event ([`CmEvent::into_request`]); dropping it unaccepted destroys
//! the id, which rejects the connection.

use std::net::SocketAddr;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_sys::{
    ibv_qp_init_attr, ibv_qp_type, rdma_accept, rdma_ack_cm_event, rdma_bind_addr, rdma_cm_event,
    rdma_cm_event_type, rdma_cm_id, rdma_conn_param, rdma_connect, rdma_create_event_channel,
    rdma_create_id, rdma_create_qp, rdma_destroy_event_channel, rdma_destroy_id, rdma_disconnect,
    rdma_event_channel, rdma_get_cm_event, rdma_get_src_port, rdma_listen, rdma_migrate_id,
    rdma_port_space, rdma_reject, rdma_resolve_addr, rdma_resolve_route, rdma_set_option,
};

use super::cq::CompletionQueue;
use super::device::Context;
use super::mr::ProtectionDomain;
use super::qp::{QpCaps, QueuePair};
use super::srq::SharedReceiveQueue;
use super::{timeout_ms, wait_readable, Result, VerbsError};

/// Largest private data in a connect request (RDMA_PS_TCP over IB/RoCE CM).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Largest private data in an accept (RDMA_PS_TCP over IB/RoCE CM).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Largest private data in a reject.
const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// `rdma_set_option` level of the CM id's own options (`RDMA_OPTION_ID`,
/// rdma_cma.h).
const RDMA_OPTION_ID: i32 = 0;
/// The local ACK timeout option (`RDMA_OPTION_ID_ACK_TIMEOUT`, a `u8`).
const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
/// Largest local ACK timeout exponent (the QP attribute's 5 bits).
pub const MAX_ACK_TIMEOUT: u8 = 31;
/// `IBV_LINK_LAYER_INFINIBAND` (verbs.h).
const IBV_LINK_LAYER_INFINIBAND: u8 = 1;
/// The RTR attribute-mask bits the connection manager sets for RoCE
/// (21..=23), which an InfiniBand port refuses.
const ROCE_ONLY_ATTR_BITS: libc::c_int = 0x00e0_0000;

/// Connection manager event types (`rdma_cm_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    /// `rdma_resolve_addr` finished.
    AddrResolved,
    /// `rdma_resolve_addr` failed.
    AddrError,
    /// `rdma_resolve_route` finished.
    RouteResolved,
    /// `rdma_resolve_route` failed.
    RouteError,
    /// A peer wants to connect (listener side; carries a new CM id).
    ConnectRequest,
    /// Reply to a connect on an id without QP.
    ConnectResponse,
    /// Connecting failed.
    ConnectError,
    /// The peer is unreachable.
    Unreachable,
    /// The peer rejected the connection (or nobody listens).
    Rejected,
    /// The connection is up.
    Established,
    /// The connection went down.
    Disconnected,
    /// The device went away.
    DeviceRemoval,
    /// Multicast join finished.
    MulticastJoin,
    /// Multicast error.
    MulticastError,
    /// The local address changed.
    AddrChange,
    /// The QP left the time-wait state.
    TimewaitExit,
    /// Unknown event (raw value).
    Other(u32),
}

impl CmEventKind {
    /// Maps the raw event type.
    pub fn from_raw(v: u32) -> Self {
        use rdma_cm_event_type::*;
        match v {
            RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            RDMA_CM_EVENT_REJECTED => Self::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            RDMA_CM_EVENT_MULTICAST_JOIN => Self::MulticastJoin,
            RDMA_CM_EVENT_MULTICAST_ERROR => Self::MulticastError,
            RDMA_CM_EVENT_ADDR_CHANGE => Self::AddrChange,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            other => Self::Other(other),
        }
    }

    /// True for events whose `param.conn` (private data, depths) is valid.
    fn has_conn_param(self) -> bool {
        matches!(
            self,
            Self::ConnectRequest
                | Self::ConnectResponse
                | Self::Established
                | Self::Rejected
                | Self::Disconnected
        )
    }
}

/// Connection parameters: sent with connect/accept, and as received from
/// the peer in events.
///
/// `initiator_depth` is how many RDMA Reads this side may have
/// outstanding towards the peer; `responder_resources` how many of the
/// peer's RDMA Reads this side can serve at once. 255 means "the device
/// maximum" when sending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data. Up to [`MAX_CONNECT_PRIVATE_DATA`] bytes for connect,
    /// [`MAX_ACCEPT_PRIVATE_DATA`] for accept. Received private data may be
    /// zero-padded by the transport (IB CM carries fixed-size fields), so
    /// compare prefixes.
    pub private_data: Vec<u8>,
    /// Outstanding RDMA Reads this side can serve.
    pub responder_resources: u8,
    /// Outstanding RDMA Reads this side may issue.
    pub initiator_depth: u8,
    /// Transport retries (0..=7).
    pub retry_count: u8,
    /// Receiver-not-ready retries (0..=7; 7 means retry forever).
    pub rnr_retry_count: u8,
    /// Hardware flow control.
    pub flow_control: bool,
    /// QP number (received side only; ignored when sending with a QP).
    pub qp_num: u32,
}

impl Default for ConnParam {
    fn default() -> Self {
        Self {
            private_data: Vec::new(),
            responder_resources: 16,
            initiator_depth: 16,
            retry_count: 7,
            rnr_retry_count: 7,
            flow_control: true,
            qp_num: 0,
        }
    }
}

impl ConnParam {
    /// Validates and converts for `rdma_connect` / `rdma_accept`. The
    /// returned struct points into `self.private_data`.
    fn to_raw(&self, max_private: usize) -> Result<rdma_conn_param> {
        if self.private_data.len() > max_private {
            return Err(VerbsError::InvalidArgument(format!(
                "{} bytes of private data, at most {max_private} allowed",
                self.private_data.len()
            )));
        }
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(VerbsError::InvalidArgument(
                "retry counts must be 0..=7".into(),
            ));
        }
        Ok(rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            // <= MAX_ACCEPT_PRIVATE_DATA < 256, checked above.
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: u8::from(self.flow_control),
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }

    fn from_raw(p: &rdma_conn_param) -> Self {
        let private_data = if p.private_data.is_null() || p.private_data_len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm guarantees `private_data_len` readable bytes
            // at `private_data` until the event is acknowledged, which
            // happens after this copy.
            unsafe {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len.into())
            }
            .to_vec()
        };
        Self {
            private_data,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            flow_control: p.flow_control != 0,
            qp_num: p.qp_num,
        }
    }
}

/// An event channel (`rdma_create_event_channel`): where CM events of the
/// ids created on it arrive.
pub struct EventChannel {
    ch: NonNull<rdma_event_channel>,
}

// SAFETY: librdmacm event channels are thread safe; the pointer is owned.
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Creates a channel. Fails with [`VerbsError::NoDevice`] on machines
    /// without RDMA.
    pub fn new() -> Result<Arc<Self>> {
        // SAFETY: no arguments; returns NULL with errno on failure.
        let ch = unsafe { rdma_create_event_channel() };
        let ch =
            NonNull::new(ch).ok_or_else(|| VerbsError::last_os("rdma_create_event_channel"))?;
        Ok(Arc::new(Self { ch }))
    }

    /// The channel's file descriptor (owned by the channel).
    pub fn fd(&self) -> i32 {
        // SAFETY: live channel.
        unsafe { self.ch.as_ref().fd }
    }

    /// Waits up to `timeout` (`None`: forever) for the next event of any id
    /// on this channel. The event is copied and acknowledged.
    pub fn get_event(self: &Arc<Self>, timeout: Option<Duration>) -> Result<CmEvent> {
        if let Some(t) = timeout {
            if !wait_readable(self.fd(), Some(t))? {
                return Err(VerbsError::Timeout {
                    after: t,
                    what: "a connection manager event",
                });
            }
        }
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: live channel and a valid out-pointer.
        let rc = unsafe { rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
        if rc != 0 || ev.is_null() {
            return Err(VerbsError::last_os("rdma_get_cm_event"));
        }
        // SAFETY: librdmacm returned a valid event, ours until acknowledged.
        let e = unsafe { &*ev };
        let kind = CmEventKind::from_raw(e.event);
        let param = if kind.has_conn_param() {
            // SAFETY: for RDMA_PS_TCP ids and these event types the `conn`
            // member of the union is the active one.
            Some(ConnParam::from_raw(unsafe { &e.param.conn }))
        } else {
            None
        };
        let new_id = match (kind, NonNull::new(e.id)) {
            (CmEventKind::ConnectRequest, Some(id)) => Some(CmId {
                inner: Arc::new(CmIdInner {
                    id,
                    channel: Mutex::new(self.clone()),
                    has_qp: AtomicBool::new(false),
                    qp_lock: Mutex::new(()),
                }),
            }),
            _ => None,
        };
        let out = CmEvent {
            kind,
            status: e.status,
            id: CmIdHandle(e.id as usize),
            listen_id: (!e.listen_id.is_null()).then_some(CmIdHandle(e.listen_id as usize)),
            param,
            new_id,
        };
        // SAFETY: acknowledging the event we got, once; nothing refers to
        // its memory afterwards (everything was copied).
        unsafe { rdma_ack_cm_event(ev) };
        Ok(out)
    }

    /// Waits for the next event and checks it is `expected`. A
    /// [`CmEventKind::Rejected`] becomes [`VerbsError::Rejected`] (with the
    /// peer's private data); any other mismatch is
    /// [`VerbsError::UnexpectedEvent`]. Meant for channels serving a single
    /// id (events of other ids would be mismatches).
    pub fn expect(
        self: &Arc<Self>,
        expected: CmEventKind,
        timeout: Option<Duration>,
    ) -> Result<CmEvent> {
        let ev = self.get_event(timeout)?;
        if ev.kind == expected {
            return Ok(ev);
        }
        if ev.kind == CmEventKind::Rejected {
            return Err(VerbsError::Rejected {
                status: ev.status,
                private_data: ev.private_data().to_vec(),
            });
        }
        Err(VerbsError::UnexpectedEvent {
            expected,
            got: ev.kind,
            status: ev.status,
        })
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; every id on the channel
        // holds an Arc to it, so none is left.
        unsafe { rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// Opaque identity of a CM id, for matching events to ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmIdHandle(usize);

/// A connection manager event, copied out of librdmacm and acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    /// Event type.
    pub kind: CmEventKind,
    /// Status: 0, a negative errno, or (for `Rejected`) the reject reason.
    pub status: i32,
    /// The id the event is for (for a connect request: the new id).
    pub id: CmIdHandle,
    /// For a connect request: the listening id.
    pub listen_id: Option<CmIdHandle>,
    /// Connection parameters from the peer (connect request, established,
    /// rejected, ...).
    pub param: Option<ConnParam>,
    new_id: Option<CmId>,
}

impl CmEvent {
    /// The peer's private data (empty if the event has none).
    pub fn private_data(&self) -> &[u8] {
        self.param.as_ref().map_or(&[], |p| &p.private_data)
    }

    /// For a connect request: the new id (to accept or reject) and the
    /// peer's parameters.
    pub fn into_request(self) -> Option<ConnectRequest> {
        let id = self.new_id?;
        Some(ConnectRequest {
            id,
            param: self.param.unwrap_or_default(),
        })
    }
}

/// An incoming connection: accept it with [`CmId::create_qp`] +
/// [`CmId::accept`], or [`CmId::reject`] it (dropping it also rejects).
#[derive(Debug)]
pub struct ConnectRequest {
    /// The new id for this connection.
    pub id: CmId,
    /// The peer's parameters, including its private data and its
    /// initiator depth / responder resources.
    pub param: ConnParam,
}

pub(crate) struct CmIdInner {
    id: NonNull<rdma_cm_id>,
    channel: Mutex<Arc<EventChannel>>,
    has_qp: AtomicBool,
    /// Held by every call that reads or sets the id's QP pointer
    /// (creating and destroying the QP, connecting, accepting,
    /// disconnecting): librdmacm does not guard it, and a disconnect that
    /// read it while another thread destroyed the QP would modify freed
    /// memory.
    qp_lock: Mutex<()>,
}

// SAFETY: the pointer is owned. librdmacm calls on an id may come from
// any thread; those that use the id's QP pointer are serialised by
// `qp_lock`, the others do not touch state another call changes.
unsafe impl Send for CmIdInner {}
// SAFETY: as above.
unsafe impl Sync for CmIdInner {}

impl CmIdInner {
    pub(crate) fn as_ptr(&self) -> *mut rdma_cm_id {
        self.id.as_ptr()
    }

    /// Holds off other calls that use the id's QP pointer (see
    /// `qp_lock`).
    pub(crate) fn lock_qp(&self) -> std::sync::MutexGuard<'_, ()> {
        self.qp_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn qp_destroyed(&self) {
        self.has_qp.store(false, Ordering::Release);
    }
}

impl Drop for CmIdInner {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; the QP (which holds an Arc
        // to us) is already gone; all events were acknowledged when read,
        // so this does not block forever.
        unsafe { rdma_destroy_id(self.id.as_ptr()) };
    }
}

/// A connection manager id (`rdma_create_id`, port space TCP: reliable
/// connected). Drop destroys it (and disconnects, if connected).
pub struct CmId {
    inner: Arc<CmIdInner>,
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("handle", &self.handle())
            .finish()
    }
}

/// A socket address in the C layout librdmacm takes.
enum RawSockAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawSockAddr {
    fn new(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(a) => Self::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => Self::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }

    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        match self {
            Self::V4(a) => (a as *mut libc::sockaddr_in).cast(),
            Self::V6(a) => (a as *mut libc::sockaddr_in6).cast(),
        }
    }
}

fn check_rc(rc: libc::c_int, call: &'static str) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(VerbsError::last_os(call))
    }
}

impl CmId {
    /// Creates an id on `channel` (port space TCP, i.e. RC QPs).
    pub fn new(channel: &Arc<EventChannel>) -> Result<Self> {
        let mut id: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: live channel, valid out-pointer, no context pointer.
        let rc = unsafe {
            rdma_create_id(
                channel.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        check_rc(rc, "rdma_create_id")?;
        let id = NonNull::new(id).ok_or_else(|| VerbsError::last_os("rdma_create_id"))?;
        Ok(Self {
            inner: Arc::new(CmIdInner {
                id,
                channel: Mutex::new(channel.clone()),
                has_qp: AtomicBool::new(false),
                qp_lock: Mutex::new(()),
            }),
        })
    }

    fn ptr(&self) -> *mut rdma_cm_id {
        self.inner.as_ptr()
    }

    /// Identity for matching events ([`CmEvent::id`]).
    pub fn handle(&self) -> CmIdHandle {
        CmIdHandle(self.ptr() as usize)
    }

    /// The channel this id's events arrive on.
    pub fn channel(&self) -> Arc<EventChannel> {
        self.inner
            .channel
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Moves the id's future events to `channel` (`rdma_migrate_id`), e.g.
    /// to give an accepted connection its own channel.
    pub fn migrate(&self, channel: &Arc<EventChannel>) -> Result<()> {
        let mut cur = self.inner.channel.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: live id and live target channel; events already read were
        // acknowledged, so the call does not wait forever.
        let rc = unsafe { rdma_migrate_id(self.ptr(), channel.ch.as_ptr()) };
        check_rc(rc, "rdma_migrate_id")?;
        *cur = channel.clone();
        Ok(())
    }

    /// Binds to a local address (port 0: any free port).
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut sa = RawSockAddr::new(addr);
        // SAFETY: live id; `sa` is a valid sockaddr of the right family,
        // read during the call only.
        let rc = unsafe { rdma_bind_addr(self.ptr(), sa.as_mut_ptr()) };
        check_rc(rc, "rdma_bind_addr")
    }

    /// Starts listening for connect requests (arriving as
    /// [`CmEventKind::ConnectRequest`] events on the channel).
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: live id.
        let rc = unsafe { rdma_listen(self.ptr(), backlog) };
        check_rc(rc, "rdma_listen")
    }

    /// The local port (after bind or resolution), host byte order.
    pub fn local_port(&self) -> u16 {
        // SAFETY: live id; reads the bound address.
        u16::from_be(unsafe { rdma_get_src_port(self.ptr()) })
    }

    /// The peer's address: for an id from a connect request, the
    /// connecting side; for a resolved id, the destination. `None` for an
    /// address family other than IPv4/IPv6 (or an unset address).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: live id. `route.addr.dst_addr` is a union the size of a
        // sockaddr_storage, filled by librdmacm for connect-request and
        // resolved ids (zero otherwise); only the bytes of the struct its
        // family names are read.
        unsafe {
            let sa: *const libc::sockaddr = rdma_sys::rdma_get_peer_addr(&*self.ptr());
            match i32::from((*sa).sa_family) {
                libc::AF_INET => {
                    let a = &*sa.cast::<libc::sockaddr_in>();
                    Some(SocketAddr::from((
                        a.sin_addr.s_addr.to_ne_bytes(),
                        u16::from_be(a.sin_port),
                    )))
                }
                libc::AF_INET6 => {
                    let a = &*sa.cast::<libc::sockaddr_in6>();
                    Some(SocketAddr::from((
                        a.sin6_addr.s6_addr,
                        u16::from_be(a.sin6_port),
                    )))
                }
                _ => None,
            }
        }
    }

    /// Starts resolving `dst` (and binding to a device); completes with
    /// [`CmEventKind::AddrResolved`] or `AddrError`.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src = src.map(RawSockAddr::new);
        let mut dst = RawSockAddr::new(dst);
        let src_ptr = src
            .as_mut()
            .map_or(std::ptr::null_mut(), RawSockAddr::as_mut_ptr);
        // SAFETY: live id; the sockaddrs are valid for the call (librdmacm
        // copies them).
        let rc = unsafe {
            rdma_resolve_addr(
                self.ptr(),
                src_ptr,
                dst.as_mut_ptr(),
                timeout_ms(Some(timeout)),
            )
        };
        check_rc(rc, "rdma_resolve_addr")
    }

    /// Starts resolving the route; completes with
    /// [`CmEventKind::RouteResolved`] or `RouteError`.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        // SAFETY: live id.
        let rc = unsafe { rdma_resolve_route(self.ptr(), timeout_ms(Some(timeout))) };
        check_rc(rc, "rdma_resolve_route")
    }

    /// Resolves address and route, waiting for both events on this id's
    /// channel (which must serve only this id).
    pub fn resolve(&self, dst: SocketAddr, timeout: Duration) -> Result<()> {
        let ch = self.channel();
        self.resolve_addr(None, dst, timeout)?;
        ch.expect(
            CmEventKind::AddrResolved,
            Some(timeout + Duration::from_secs(1)),
        )?;
        self.resolve_route(timeout)?;
        ch.expect(
            CmEventKind::RouteResolved,
            Some(timeout + Duration::from_secs(1)),
        )?;
        Ok(())
    }

    /// The device context the id is bound to (after bind to a device
    /// address, resolution, or for a connect request's id).
    pub fn context(&self) -> Result<Context> {
        // SAFETY: live id; `verbs` is set by librdmacm once bound.
        let verbs = unsafe { (*self.ptr()).verbs };
        Context::from_cm_verbs(verbs)
    }

    /// Creates the id's RC queue pair (one per id).
    pub fn create_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Arc<QueuePair>> {
        self.create_qp_with(pd, send_cq, recv_cq, caps, None)
    }

    /// Creates the id's RC queue pair (one per id) taking its receives from
    /// `srq`: it has no receive queue of its own (`caps.max_recv_wr` and
    /// `max_recv_sge` are ignored), and [`QueuePair::post_recv`] on it is
    /// refused. `srq` must be on `pd`.
    pub fn create_qp_on_srq(
        &self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
        srq: &Arc<SharedReceiveQueue>,
    ) -> Result<Arc<QueuePair>> {
        if !Arc::ptr_eq(srq.pd(), pd) {
            return Err(VerbsError::InvalidArgument(
                "the shared receive queue must be on the queue pair's protection domain".into(),
            ));
        }
        self.create_qp_with(pd, send_cq, recv_cq, caps, Some(srq))
    }

    fn create_qp_with(
        &self,
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        caps: QpCaps,
        srq: Option<&Arc<SharedReceiveQueue>>,
    ) -> Result<Arc<QueuePair>> {
        let ctx = self.context()?;
        if !pd.context().same_as(&ctx)
            || !send_cq.context().same_as(&ctx)
            || !recv_cq.context().same_as(&ctx)
        {
            return Err(VerbsError::InvalidArgument(
                "PD and CQs must belong to the CM id's device".into(),
            ));
        }
        if self.inner.has_qp.swap(true, Ordering::AcqRel) {
            return Err(VerbsError::InvalidArgument("CM id already has a QP".into()));
        }
        // SAFETY: ibv_qp_init_attr is plain old data; zero is valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_send_sge = caps.max_send_sge;
        attr.cap.max_inline_data = caps.max_inline_data;
        match srq {
            Some(srq) => attr.srq = srq.as_ptr(),
            None => {
                attr.cap.max_recv_wr = caps.max_recv_wr;
                attr.cap.max_recv_sge = caps.max_recv_sge;
            }
        }
        let _qp = self.inner.lock_qp();
        // SAFETY: live id, PD, CQs and shared receive queue of the id's
        // device (checked above), kept alive by the QueuePair; `attr` is
        // valid for the call.
        let rc = unsafe { rdma_create_qp(self.ptr(), pd.as_ptr(), &mut attr) };
        if rc != 0 {
            self.inner.has_qp.store(false, Ordering::Release);
            return Err(VerbsError::last_os("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp succeeded, so `qp` is set.
        let qp = NonNull::new(unsafe { (*self.ptr()).qp })
            .ok_or_else(|| VerbsError::InvalidArgument("rdma_create_qp left no QP".into()))?;
        let granted = QpCaps {
            max_send_wr: attr.cap.max_send_wr,
            max_recv_wr: attr.cap.max_recv_wr,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            max_inline_data: attr.cap.max_inline_data,
        };
        Ok(Arc::new(QueuePair::from_raw(
            qp,
            granted,
            pd.clone(),
            send_cq.clone(),
            recv_cq.clone(),
            srq.cloned(),
            self.inner.clone(),
        )))
    }

    /// Sets the local ACK timeout of the id's queue pair: an unacknowledged
    /// request is sent again after 4.096 µs × 2^`exp` (IBTA's QP attribute
    /// `timeout`). Without it the connection manager derives the timeout
    /// from the path (19, about 2.1 s, over Soft-RoCE in the test VM). Call it before
    /// [`Self::connect`] or [`Self::accept`]; an error for `exp` above
    /// [`MAX_ACK_TIMEOUT`] or 0 (which means "never", and a peer that
    /// stops answering would then leave requests outstanding for ever).
    pub fn set_ack_timeout(&self, exp: u8) -> Result<()> {
        if exp == 0 || exp > MAX_ACK_TIMEOUT {
            return Err(VerbsError::InvalidArgument(format!(
                "ACK timeout exponent {exp} is outside 1..={MAX_ACK_TIMEOUT}"
            )));
        }
        let mut v = exp;
        // SAFETY: live id; the option is a u8 and `v` lives for the call
        // (librdmacm copies it to the kernel).
        let rc = unsafe {
            rdma_set_option(
                self.ptr(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut v as *mut u8).cast(),
                std::mem::size_of::<u8>(),
            )
        };
        check_rc(rc, "rdma_set_option(ACK_TIMEOUT)")
    }

    /// Starts connecting (after [`Self::resolve`] and [`Self::create_qp`]);
    /// completes with [`CmEventKind::Established`] (whose private data is
    /// the peer's accept data) or `Rejected` / `Unreachable` /
    /// `ConnectError`.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut raw = param.to_raw(MAX_CONNECT_PRIVATE_DATA)?;
        let _qp = self.inner.lock_qp();
        // SAFETY: live id; `raw` points into `param`, valid for the call
        // (librdmacm copies the private data).
        let rc = unsafe { rdma_connect(self.ptr(), &mut raw) };
        check_rc(rc, "rdma_connect")
    }

    /// Connects and waits for `Established` on this id's channel (which
    /// must serve only this id). Returns the peer's accept parameters.
    pub fn connect_and_wait(&self, param: &ConnParam, timeout: Duration) -> Result<ConnParam> {
        self.connect(param)?;
        let ev = self
            .channel()
            .expect(CmEventKind::Established, Some(timeout))?;
        Ok(ev.param.unwrap_or_default())
    }

    /// Accepts a connect request (create the QP first); the connection is
    /// up at the [`CmEventKind::Established`] event.
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut raw = param.to_raw(MAX_ACCEPT_PRIVATE_DATA)?;
        let _qp = self.inner.lock_qp();
        // SAFETY: live id; `raw` valid for the call.
        let rc = unsafe { rdma_accept(self.ptr(), &mut raw) };
        check_rc(rc, "rdma_accept")
    }

    /// Accepts a connect request like [`Self::accept`], except that this
    /// side's Sends are retried at most `send_rnr_retry` times (0..=6)
    /// after a receiver-not-ready NAK, whatever the peer asked for in its
    /// request (where it asked for fewer, its count is kept). With
    /// [`Self::accept`] the queue pair takes the count from the request,
    /// and 7 there means "retry for ever": a peer that posts no receives
    /// would then stall this side's Sends until it disconnects. The count
    /// can only be set on the way to RTS, so the queue pair is moved
    /// through INIT, RTR and RTS here, with the attributes the connection
    /// manager gives for each state, as `rdma_accept` would do it.
    ///
    /// `rnr_timer` (an IB RNR timer code, 1..=31; `None` keeps the
    /// connection manager's 0, 655.36 ms) is how long this side asks a
    /// peer whose Send found no receive to wait before it tries again;
    /// the peer's count of such retries is `param.rnr_retry_count`.
    ///
    /// `param.responder_resources` and `param.initiator_depth` must be
    /// explicit (not 255). Returns the RNR retry count the queue pair
    /// runs with.
    pub fn accept_bounding_rnr(
        &self,
        param: &ConnParam,
        send_rnr_retry: u8,
        rnr_timer: Option<u8>,
    ) -> Result<u8> {
        if send_rnr_retry > 6 {
            return Err(VerbsError::InvalidArgument(format!(
                "RNR retry count {send_rnr_retry} is not finite (0..=6)"
            )));
        }
        if let Some(t) = rnr_timer.filter(|t| !(1..=31).contains(t)) {
            return Err(VerbsError::InvalidArgument(format!(
                "RNR timer code {t} is outside 1..=31"
            )));
        }
        if param.responder_resources == u8::MAX || param.initiator_depth == u8::MAX {
            return Err(VerbsError::InvalidArgument(
                "responder resources and initiator depth must be explicit".into(),
            ));
        }
        let mut raw = param.to_raw(MAX_ACCEPT_PRIVATE_DATA)?;
        let id = self.ptr();
        // The QP cannot be destroyed (its owner may already be another
        // thread) until this returns.
        let _qp = self.inner.lock_qp();
        // SAFETY: live id; `qp` is set by `create_qp` and owned by the
        // QueuePair, which keeps this id alive and cannot destroy it while
        // `_qp` is held.
        let qp = unsafe { (*id).qp };
        if qp.is_null() {
            return Err(VerbsError::InvalidArgument(
                "create the queue pair before accepting".into(),
            ));
        }
        // SAFETY: live id, whose `verbs` is its device once a connect
        // request created it.
        let infiniband = unsafe {
            // The exported symbol fills a whole `ibv_port_attr` through
            // its compatibility pointer type.
            let mut port: rdma_sys::ibv_port_attr = std::mem::zeroed();
            rdma_sys::ibv_query_port(
                (*id).verbs,
                (*id).port_num,
                (&mut port as *mut rdma_sys::ibv_port_attr).cast(),
            ) == 0
                && port.link_layer == IBV_LINK_LAYER_INFINIBAND
        };
        let mut rnr_retry = send_rnr_retry;
        let states = [
            rdma_sys::ibv_qp_state::IBV_QPS_INIT,
            rdma_sys::ibv_qp_state::IBV_QPS_RTR,
            rdma_sys::ibv_qp_state::IBV_QPS_RTS,
        ];
        for state in states {
            // SAFETY: plain old data; zero is valid.
            let mut attr: rdma_sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
            attr.qp_state = state;
            let mut mask: libc::c_int = 0;
            // SAFETY: live id; both out-pointers valid for the call.
            let rc = unsafe { rdma_sys::rdma_init_qp_attr(id, &mut attr, &mut mask) };
            check_rc(rc, "rdma_init_qp_attr")?;
            match state {
                rdma_sys::ibv_qp_state::IBV_QPS_RTR => {
                    // The connection manager's RoCE-only bits are refused
                    // on an InfiniBand port (librdmacm masks them the same
                    // way).
                    if infiniband {
                        mask &= !ROCE_ONLY_ATTR_BITS;
                    }
                    attr.max_dest_rd_atomic = param.responder_resources;
                    if let Some(t) = rnr_timer {
                        attr.min_rnr_timer = t;
                        mask |= rdma_sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER.0 as libc::c_int;
                    }
                }
                rdma_sys::ibv_qp_state::IBV_QPS_RTS => {
                    attr.max_rd_atomic = param.initiator_depth;
                    rnr_retry = attr.rnr_retry.min(send_rnr_retry);
                    attr.rnr_retry = rnr_retry;
                    mask |= rdma_sys::ibv_qp_attr_mask::IBV_QP_RNR_RETRY.0 as libc::c_int;
                }
                _ => {}
            }
            // SAFETY: `qp` is live (see above); `attr` valid for the call.
            let rc = unsafe { rdma_sys::ibv_modify_qp(qp, &mut attr, mask) };
            if rc != 0 {
                return Err(VerbsError::errno("ibv_modify_qp", rc));
            }
        }
        // rdma_accept moves the id's own QP through RTR and RTS again,
        // which would undo the count: it is handed the QP by number with
        // the id's pointer cleared for the call (librdmacm's documented
        // path for a QP the caller transitions itself).
        // SAFETY: plain field reads of the live QP.
        raw.qp_num = unsafe { (*qp).qp_num };
        raw.srq = u8::from(unsafe { !(*qp).srq.is_null() });
        // SAFETY: live id; no other call that uses its QP pointer runs
        // meanwhile (`_qp`), and the pointer is put back before the lock
        // is let go. `raw` is valid for the call.
        let rc = unsafe {
            (*id).qp = std::ptr::null_mut();
            let rc = rdma_accept(id, &mut raw);
            (*id).qp = qp;
            rc
        };
        if rc != 0 {
            let err = VerbsError::last_os("rdma_accept");
            // As rdma_accept does for its own QP: receives posted so far
            // are flushed.
            // SAFETY: plain old data; `qp` live.
            unsafe {
                let mut attr: rdma_sys::ibv_qp_attr = std::mem::zeroed();
                attr.qp_state = rdma_sys::ibv_qp_state::IBV_QPS_ERR;
                rdma_sys::ibv_modify_qp(
                    qp,
                    &mut attr,
                    rdma_sys::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int,
                );
            }
            return Err(err);
        }
        Ok(rnr_retry)
    }

    /// Rejects a connect request with optional private data.
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            return Err(VerbsError::InvalidArgument(format!(
                "{} bytes of reject private data, at most {MAX_REJECT_PRIVATE_DATA}",
                private_data.len()
            )));
        }
        let ptr = if private_data.is_empty() {
            std::ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: live id; the data is valid for the call; length < 256.
        let rc = unsafe { rdma_reject(self.ptr(), ptr, private_data.len() as u8) };
        check_rc(rc, "rdma_reject")
    }

    /// Disconnects; both sides get [`CmEventKind::Disconnected`], and
    /// outstanding work requests are flushed.
    pub fn disconnect(&self) -> Result<()> {
        let _qp = self.inner.lock_qp();
        // SAFETY: live id.
        let rc = unsafe { rdma_disconnect(self.ptr()) };
        check_rc(rc, "rdma_disconnect")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kinds_map() {
        assert_eq!(CmEventKind::from_raw(0), CmEventKind::AddrResolved);
        assert_eq!(CmEventKind::from_raw(4), CmEventKind::ConnectRequest);
        assert_eq!(CmEventKind::from_raw(8), CmEventKind::Rejected);
        assert_eq!(CmEventKind::from_raw(9), CmEventKind::Established);
        assert_eq!(CmEventKind::from_raw(10), CmEventKind::Disconnected);
        assert_eq!(CmEventKind::from_raw(15), CmEventKind::TimewaitExit);
        assert_eq!(CmEventKind::from_raw(99), CmEventKind::Other(99));
    }

    #[test]
    fn conn_param_validation_and_round_trip() {
        let p = ConnParam {
            private_data: vec![1, 2, 3, 4, 5, 6, 7, 8],
            responder_resources: 3,
            initiator_depth: 5,
            ..ConnParam::default()
        };
        let raw = p.to_raw(MAX_CONNECT_PRIVATE_DATA).unwrap();
        assert_eq!(raw.private_data_len, 8);
        assert_eq!(raw.initiator_depth, 5);
        assert_eq!(raw.responder_resources, 3);
        let back = ConnParam::from_raw(&raw);
        assert_eq!(back.private_data, p.private_data);
        assert_eq!(back.initiator_depth, 5);

        let long = ConnParam {
            private_data: vec![0; MAX_CONNECT_PRIVATE_DATA + 1],
            ..ConnParam::default()
        };
        assert!(long.to_raw(MAX_CONNECT_PRIVATE_DATA).is_err());
        assert!(long.to_raw(MAX_ACCEPT_PRIVATE_DATA).is_ok());
        let bad_retry = ConnParam {
            retry_count: 8,
            ..ConnParam::default()
        };
        assert!(bad_retry.to_raw(MAX_CONNECT_PRIVATE_DATA).is_err());
        let empty = ConnParam::default()
            .to_raw(MAX_CONNECT_PRIVATE_DATA)
            .unwrap();
        assert!(empty.private_data.is_null());
        assert!(ConnParam::from_raw(&empty).private_data.is_empty());
    }

    #[test]
    fn sockaddr_layout() {
        let mut a = RawSockAddr::new("10.99.0.1:20049".parse().unwrap());
        match &a {
            RawSockAddr::V4(s) => {
                assert_eq!(s.sin_family, libc::AF_INET as libc::sa_family_t);
                assert_eq!(u16::from_be(s.sin_port), 20049);
                assert_eq!(s.sin_addr.s_addr.to_ne_bytes(), [10, 99, 0, 1]);
            }
            RawSockAddr::V6(_) => panic!("v4 expected"),
        }
        assert!(!a.as_mut_ptr().is_null());
        let b = RawSockAddr::new("[fe80::1%2]:7".parse().unwrap());
        match &b {
            RawSockAddr::V6(s) => {
                assert_eq!(u16::from_be(s.sin6_port), 7);
                assert_eq!(s.sin6_scope_id, 2);
                assert_eq!(s.sin6_addr.s6_addr[0], 0xfe);
            }
            RawSockAddr::V4(_) => panic!("v6 expected"),
        }
    }

    #[test]
    fn event_channel_without_device_is_typed() {
        match EventChannel::new() {
            Ok(_) => {
                // A machine with RDMA (the VM): the channel must work.
                assert!(std::path::Path::new("/dev/infiniband/rdma_cm").exists());
            }
            Err(e) => assert!(e.is_no_device(), "unexpected error: {e}"),
        }
    }
}
