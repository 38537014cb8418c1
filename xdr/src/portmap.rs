//! Portmapper version 2 (RFC 1833 §3), used to register with and query the
//! local rpcbind.

use crate::List;

/// Portmapper program number.
pub const PROGRAM: u32 = 100000;
/// Portmapper protocol version.
pub const VERSION: u32 = 2;
/// The well-known port.
pub const PORT: u16 = 111;
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u32 = 6;
/// `IPPROTO_UDP`.
pub const IPPROTO_UDP: u32 = 17;

/// Portmapper procedure numbers.
pub mod proc_ {
    /// NULL.
    pub const NULL: u32 = 0;
    /// SET: register a mapping (result: bool).
    pub const SET: u32 = 1;
    /// UNSET: remove mappings of a program and version (result: bool).
    pub const UNSET: u32 = 2;
    /// GETPORT: look up a port (result: u32 port, 0 when unregistered).
    pub const GETPORT: u32 = 3;
    /// DUMP: list every mapping.
    pub const DUMP: u32 = 4;
}

xdr_struct!(
    /// `mapping`: the argument of SET, UNSET and GETPORT.
    #[derive(Copy, Hash)]
    pub struct Mapping {
        /// Program number.
        pub prog: u32,
        /// Program version.
        pub vers: u32,
        /// [`IPPROTO_TCP`] or [`IPPROTO_UDP`].
        pub prot: u32,
        /// Port (ignored by GETPORT and UNSET).
        pub port: u32,
    }
);

/// `pmaplist`: the DUMP result.
pub type PmapList = List<Mapping>;
