//! The RPC-over-RDMA version 1 protocol core (RFC 8166, with the NFS
//! binding of RFC 8267 and remote invalidation of RFC 8797), free of I/O:
//! no verbs, no clock, no threads. It builds, tests and fuzzes on any
//! machine; the verbs drivers in `nfsrdma-transport`, `nfsrdma-server` and
//! `nfsrdma-client` only carry out what it decides.
//!
//! Two layers:
//!
//! - **Planning**, pure functions over one message:
//!   - [`responder`]: classifies a received transport header (a call to
//!     assemble, a message to drop, or the RDMA_ERROR to answer), checks an
//!     assembled call's RPC header against it, and plans a reply
//!     ([`responder::ReplyPlan`]: RDMA Writes into the Write or Reply chunk,
//!     the inline part, the header with the lengths written, the R_key for
//!     Send With Invalidate).
//!   - [`requester`]: how a call travels (inline, a Read chunk for its
//!     DDP-eligible item, a Position-Zero Read chunk), which chunks its
//!     reply needs, its header once registered, and the reply header's
//!     meaning.
//!   - [`chunk`], [`reduce`]: filling Write chunks, and moving a
//!     DDP-eligible item out of the XDR stream.
//!   - [`negotiate`]: the RFC 8797 connection message: what we offer and
//!     the inline thresholds and remote invalidation that follow.
//! - **State**, one value per connection ([`conn::Connection`]): it takes
//!   events (a message received into a receive buffer, a work request
//!   completed or failed, the application's reply) and yields the work
//!   requests to post and the calls to run. It owns the receive buffers'
//!   lifetime, the credits, the send queue and its signalling, the RDMA
//!   Read depth, and every rule of RFC 8166 that spans more than one
//!   message.
//!
//! [`sim`] is a simulated fabric (RC ordering, registered memory that
//! enforces R_keys, offsets and invalidation, receiver-not-ready, flushes)
//! on which connection cores and scripted peers run on the host.
#![forbid(unsafe_code)]

pub mod chunk;
pub mod conn;
pub mod negotiate;
pub mod reduce;
pub mod requester;
pub mod responder;
pub mod sim;

#[cfg(test)]
mod flow_tests;
