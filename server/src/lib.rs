//! The nfsrdmad server: an in-memory NFSv3 + MOUNT v3 store served over TCP
//! and RPC-over-RDMA.
#![forbid(unsafe_code)]

pub mod exporter;
pub mod exports;
pub mod rdma;
pub mod rpc_client;
pub mod rpcbind;
pub mod service;
pub mod state;
pub mod store;
pub mod tcp;
pub mod udp;
