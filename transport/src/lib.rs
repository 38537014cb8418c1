//! Moving RPC messages between nfsrdma peers over RDMA: the safe verbs
//! layer and the completion engine. The RPC-over-RDMA protocol itself (what
//! a message means, and the state of a connection) is `nfsrdma-rpcrdma`,
//! which needs no device.
//!
//! `unsafe` is denied everywhere in this crate except inside the verbs
//! module (`rdma::verbs`), the one place that talks to libibverbs and
//! librdmacm.
#![deny(unsafe_code)]

pub mod rdma;
