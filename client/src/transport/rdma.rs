//! RPC-over-RDMA version 1 (RFC 8166): the place for the RDMA transport.
//!
//! Not built yet. It will implement [`super::Transport`] on top of the
//! sans-IO requester core (`nfsrdma_transport::rpcrdma::requester`) and the
//! verbs layer:
//! - `call`: take a credit (the slot table of this transport), allocate the
//!   XID, `plan_call(xid, cfg, expect, &encode)` with the call's encode
//!   closure (header then [`super::RpcCall::args`]) and its
//!   [`super::ReplyExpect`]; register the Read chunk data and the Write or
//!   Reply chunk memory as the plan says (memory window, per-call MR or
//!   persistent registration: [`crate::RegStrategy`]); post the Send; wait
//!   for the matching reply, invalidate (locally, or check the remote
//!   invalidation of RFC 8797), and hand back a `Decoder` (with
//!   `Decoder::with_ddp_first` when READ data or a READLINK path came in the
//!   Write chunk).
//! - Timeouts and reconnection follow the TCP transport's rules: the same
//!   XID is retransmitted on the new connection.

use super::Transport;
use crate::error::ClientError;
use crate::RdmaOptions;
use std::net::SocketAddr;
use std::sync::Arc;

/// Connects an RPC-over-RDMA transport. Always fails for now.
pub async fn connect(
    _addr: SocketAddr,
    _opts: &RdmaOptions,
) -> Result<Arc<dyn Transport>, ClientError> {
    Err(ClientError::Unsupported(
        "RPC-over-RDMA transport not built yet",
    ))
}
