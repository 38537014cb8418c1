//! The nfsrdma client library: NFSv3 over TCP or RPC-over-RDMA.
#![forbid(unsafe_code)]
