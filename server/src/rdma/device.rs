//! The RDMA device the server uses: one protection domain shared by every
//! connection, and the arena the stores' file blocks come from (registered
//! once, local access only), so that READ data is RDMA-Written straight
//! from file blocks and WRITE data is RDMA-Read straight into registered
//! blocks.

use crate::store::blocks::{BlockMemory, BlockSource};
use nfsrdma_transport::rdma::verbs::{
    Arena, ArenaBlock, CmId, Context, DeviceList, EventChannel, ProtectionDomain, VerbsError,
};
use std::net::SocketAddr;
use std::sync::Arc;

/// The device, its protection domain and its arena.
pub struct RdmaDevice {
    pub(super) ctx: Context,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) arena: Arc<Arena>,
}

impl RdmaDevice {
    /// Opens the device that owns `addr` (the first device for a wildcard
    /// address) with an arena that may register up to `arena_limit` bytes,
    /// 64 MiB at a time.
    pub fn open(addr: SocketAddr, arena_limit: usize) -> Result<Arc<RdmaDevice>, VerbsError> {
        let ch = EventChannel::new()?;
        let id = CmId::new(&ch)?;
        id.bind_addr(SocketAddr::new(addr.ip(), 0))?;
        let ctx = match id.context() {
            Ok(c) => c,
            Err(_) => {
                let list = DeviceList::new()?;
                if list.is_empty() {
                    return Err(VerbsError::NoDevice {
                        detail: "no RDMA device found".into(),
                    });
                }
                list.open(0)?
            }
        };
        let pd = ProtectionDomain::new(&ctx)?;
        let arena = Arena::new(&pd, 64 << 20, arena_limit);
        Ok(Arc::new(RdmaDevice { ctx, pd, arena }))
    }

    /// A block source for a store, taking blocks from the device's arena.
    pub fn block_source(&self) -> Box<dyn BlockSource> {
        Box::new(ArenaSource(self.arena.clone()))
    }

    /// Regions registered on the server's PD with any remote access: the
    /// server never exposes its memory, so this is always 0.
    pub fn remote_access_regions(&self) -> usize {
        self.pd.remote_access_regions()
    }

    /// Bytes the arena has registered.
    pub fn arena_bytes(&self) -> usize {
        self.arena.registered_bytes()
    }

    /// The most bytes the arena registers: the stores' blocks, and every
    /// connection's landing and staging blocks.
    pub fn arena_limit(&self) -> usize {
        self.arena.limit_bytes()
    }
}

struct ArenaSource(Arc<Arena>);

impl BlockMemory for ArenaBlock {}

impl BlockSource for ArenaSource {
    fn alloc(&self, size: usize) -> Option<Box<dyn BlockMemory>> {
        match self.0.alloc(size) {
            Ok(b) => b.map(|b| Box::new(b) as Box<dyn BlockMemory>),
            Err(e) => {
                tracing::warn!(error = %e, "arena registration failed");
                None
            }
        }
    }
}
