//! Moving RPC messages between nfsrdma peers: TCP record marking and
//! RPC-over-RDMA version 1 (RFC 8166).
//!
//! `unsafe` is denied everywhere in this crate except inside the verbs
//! module (`rdma::verbs`), the one place that talks to libibverbs and
//! librdmacm.
#![deny(unsafe_code)]

pub mod rdma;
pub mod rpcrdma;
