//! The nfsrdma client library: NFSv3 (RFC 1813) over TCP and over
//! RPC-over-RDMA (RFC 8166, RFC 8797), with the transport behind one trait.
//!
//! - [`Client`]: a mounted export. Cheap to clone and shared between tasks;
//!   typed async calls for all 22 NFSv3 procedures, plus
//!   [`Client::lookup_path`], [`Client::read_all`], [`Client::write_all`]
//!   and [`Client::readdir_all`].
//! - [`transport`]: the [`transport::Transport`] trait, the TCP transport
//!   (record marking, many calls in flight, reconnection and retransmission
//!   with the same XID) and the RPC-over-RDMA transport
//!   ([`transport::rdma`]: credits, memory windows / per-RPC regions /
//!   persistent registration, remote invalidation).
//! - [`mount`]: portmapper GETPORT and MOUNT v3 (MNT, UMNT, EXPORT).
//! - [`auth`]: AUTH_SYS credentials.
//! - [`bench`]: the `nfsrdma bench` latency lab (QD1 latency per record
//!   size, throughput runs, reports).
//! - [`cli`]: the connection options shared by the `nfsrdma` subcommands
//!   and the `SERVER:/export/path` target syntax.
//!
//! READ data comes back as [`nfsrdma_xdr::Payload`] pieces that point into
//! the receive buffer; WRITE data is sent by reference with `writev`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod auth;
pub mod bench;
pub mod cli;
mod client;
mod error;
pub mod fusemount;
pub mod mount;
pub mod rpc;
pub mod transport;

pub use auth::{Auth, AuthSys};
pub use client::{Client, ConnectOptions, DirEntry, PollMode, RdmaOptions, RegStrategy};
pub use error::{ClientError, NfsFailure};
pub use transport::{ReplyExpect, TransportKind};

pub use nfsrdma_xdr as xdr;
