//! File data in fixed-size blocks.
//!
//! A file's data is a sparse map from block index to [`Block`]. Blocks are
//! `BLOCK_SIZE` bytes, except that a file smaller than one block keeps a
//! smaller block (a power of two from `MIN_BLOCK`), so that many small files
//! do not each pin 64 KiB.
//!
//! Readers get `Bytes` that point into the block's memory (no copy): the
//! block's buffer is shared through an `Arc`, and a writer that finds the
//! buffer still shared with an in-flight reader writes into a fresh copy
//! (copy on write), so a READ reply never changes under the transport.
//!
//! Block memory comes from a [`BlockSource`]. The default source takes it
//! from the heap; the RDMA transport supplies a source that carves blocks
//! out of large arenas registered once with the device (local access only),
//! so RDMA Reads and Writes move file data straight in and out of them.

use bytes::Bytes;
use std::sync::Arc;

/// Size of a full block.
pub const BLOCK_SIZE: usize = 64 * 1024;
/// Smallest block (the first block of a small file).
pub const MIN_BLOCK: usize = 4 * 1024;

/// Zeros for holes and for the unwritten tail of a small block.
static ZEROS: [u8; BLOCK_SIZE] = [0; BLOCK_SIZE];

/// `len` bytes of zeros (at most one block) without allocating.
pub fn zeros(len: usize) -> Bytes {
    Bytes::from_static(&ZEROS[..len])
}

/// Memory that backs one block.
pub trait BlockMemory: AsRef<[u8]> + AsMut<[u8]> + Send + Sync + 'static {}

impl BlockMemory for Box<[u8]> {}

/// Where block memory comes from.
pub trait BlockSource: Send + Sync + 'static {
    /// A zero-filled buffer of exactly `size` bytes (`size` is a power of
    /// two between [`MIN_BLOCK`] and [`BLOCK_SIZE`]), or `None` when the
    /// source is exhausted.
    fn alloc(&self, size: usize) -> Option<Box<dyn BlockMemory>>;
}

/// Heap-backed blocks.
#[derive(Debug, Default)]
pub struct HeapSource;

impl BlockSource for HeapSource {
    fn alloc(&self, size: usize) -> Option<Box<dyn BlockMemory>> {
        Some(Box::new(vec![0u8; size].into_boxed_slice()))
    }
}

/// One block of file data.
#[derive(Clone)]
pub struct Block {
    buf: Arc<Box<dyn BlockMemory>>,
}

/// Shares a block's buffer with a reader (the owner behind a `Bytes`).
struct Shared(Arc<Box<dyn BlockMemory>>);

impl AsRef<[u8]> for Shared {
    fn as_ref(&self) -> &[u8] {
        (*self.0).as_ref().as_ref()
    }
}

impl Block {
    /// A new zero-filled block of `size` bytes.
    pub fn new(source: &dyn BlockSource, size: usize) -> Option<Block> {
        let mem = source.alloc(size)?;
        debug_assert_eq!((*mem).as_ref().len(), size);
        Some(Block { buf: Arc::new(mem) })
    }

    /// A block over memory from elsewhere (a registered landing block).
    pub fn from_memory(mem: Box<dyn BlockMemory>) -> Block {
        Block { buf: Arc::new(mem) }
    }

    /// Bytes of memory the block holds.
    pub fn capacity(&self) -> usize {
        (**self.buf).as_ref().len()
    }

    /// The block's contents.
    pub fn as_slice(&self) -> &[u8] {
        (**self.buf).as_ref()
    }

    /// `range` of the block as `Bytes` sharing its memory. The range must
    /// lie within the capacity.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Bytes {
        Bytes::from_owner(Shared(self.buf.clone())).slice(range)
    }

    /// True while a reader still holds bytes of this block.
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.buf) > 1
    }

    /// Writable contents, or `None` while a reader shares the block.
    pub fn get_mut(&mut self) -> Option<&mut [u8]> {
        Arc::get_mut(&mut self.buf).map(|b| (**b).as_mut())
    }

    /// A private copy of the first `keep` bytes in a block of `size` bytes.
    pub fn copy_resized(
        &self,
        source: &dyn BlockSource,
        size: usize,
        keep: usize,
    ) -> Option<Block> {
        let mut b = Block::new(source, size)?;
        let keep = keep.min(size).min(self.capacity());
        b.get_mut().expect("fresh block is unique")[..keep]
            .copy_from_slice(&self.as_slice()[..keep]);
        Some(b)
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.capacity())
    }
}

/// Blocks an RDMA Read landed WRITE data in, attached to the data's
/// [`nfsrdma_xdr::Payload`] so that the store can take whole ones over
/// instead of copying them.
#[derive(Debug, Default)]
pub struct LandingBlocks(pub Vec<Block>);

impl LandingBlocks {
    /// The landing block that `part` is, whole (same memory, full
    /// [`BLOCK_SIZE`]).
    pub fn whole_block(&self, part: &Bytes) -> Option<&Block> {
        self.0.iter().find(|b| {
            b.capacity() == BLOCK_SIZE
                && part.len() == BLOCK_SIZE
                && b.as_slice().as_ptr() == part.as_ptr()
        })
    }
}

/// The block size a write needs: full blocks once the file reaches one
/// block, otherwise the smallest power of two that holds `end_in_block`.
pub fn block_size_for(file_size: u64, end_in_block: usize) -> usize {
    if file_size >= BLOCK_SIZE as u64 {
        BLOCK_SIZE
    } else {
        end_in_block
            .max(MIN_BLOCK)
            .next_power_of_two()
            .min(BLOCK_SIZE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_share_memory_and_writers_see_sharing() {
        let mut b = Block::new(&HeapSource, MIN_BLOCK).unwrap();
        b.get_mut().unwrap()[..3].copy_from_slice(b"abc");
        let r = b.slice(0..3);
        assert_eq!(&r[..], b"abc");
        assert_eq!(r.as_ptr(), b.as_slice().as_ptr());
        assert!(b.is_shared());
        assert!(b.get_mut().is_none());
        drop(r);
        assert!(!b.is_shared());
        assert!(b.get_mut().is_some());
    }

    #[test]
    fn sizes() {
        assert_eq!(block_size_for(10, 10), MIN_BLOCK);
        assert_eq!(block_size_for(5000, 5000), 8192);
        assert_eq!(block_size_for(40_000, 40_000), 65536);
        assert_eq!(block_size_for(1 << 20, 10), BLOCK_SIZE);
    }
}
