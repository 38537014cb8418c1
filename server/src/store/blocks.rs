//! File data in fixed-size blocks.
//!
//! A file's data is a sparse map from block index to [`FileBlock`]: one
//! [`Block`] of `BLOCK_SIZE` bytes (a file smaller than one block keeps a
//! smaller block, a power of two from `MIN_BLOCK`, so that many small files
//! do not each pin 64 KiB), or [`PAGES`] pages of [`PAGE`] bytes each. Pages
//! are what WRITE data that landed by RDMA Read in blocks smaller than
//! `BLOCK_SIZE` (4 KiB records, say) becomes: each page is a view of the
//! landing block it arrived in, taken over without a copy.
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
use nfsrdma_xdr::Payload;
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

/// A store's zeros (for holes, unwritten tails and a null export's data):
/// slices of one block taken from the store's [`BlockSource`] when it is
/// made, so that over RDMA they are written from registered memory like
/// file data, with no copy; slices of a static block when the source had
/// none to give. The block belongs to no file and is never written.
#[derive(Clone, Debug)]
pub struct Zeros(Option<Block>);

impl Zeros {
    /// One block of zeros from `source`.
    pub fn from_source(source: &dyn BlockSource) -> Zeros {
        Zeros(Block::new(source, BLOCK_SIZE))
    }

    /// `len` bytes of zeros (at most one block).
    pub fn get(&self, len: usize) -> Bytes {
        match &self.0 {
            Some(b) => b.slice(0..len),
            None => zeros(len),
        }
    }

    /// True when `part` is a slice of this store's zero block.
    pub fn holds(&self, part: &Bytes) -> bool {
        self.0.as_ref().is_some_and(|b| {
            let start = b.start_addr();
            let p = part.as_ptr() as usize;
            p >= start && p + part.len() <= start + b.capacity()
        })
    }
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

/// One block of file data: a view of a buffer (all of it, or one page of
/// it when the buffer was a landing block whose pages became pages of a
/// file).
#[derive(Clone)]
pub struct Block {
    buf: Arc<Box<dyn BlockMemory>>,
    off: usize,
    len: usize,
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
        Some(Block::from_memory(mem))
    }

    /// A block over memory from elsewhere (a registered landing block).
    pub fn from_memory(mem: Box<dyn BlockMemory>) -> Block {
        let len = (*mem).as_ref().len();
        Block {
            buf: Arc::new(mem),
            off: 0,
            len,
        }
    }

    /// Bytes of data the block holds.
    pub fn capacity(&self) -> usize {
        self.len
    }

    /// Bytes of memory the block's buffer holds (more than its capacity
    /// when the block is a view of part of it).
    pub fn memory_size(&self) -> usize {
        (**self.buf).as_ref().len()
    }

    /// True when `other` is a view of the same buffer.
    pub fn same_memory(&self, other: &Block) -> bool {
        Arc::ptr_eq(&self.buf, &other.buf)
    }

    /// Where the view starts in its buffer.
    pub fn offset_in_memory(&self) -> usize {
        self.off
    }

    /// The block's contents.
    pub fn as_slice(&self) -> &[u8] {
        &(**self.buf).as_ref()[self.off..self.off + self.len]
    }

    /// `range` of the block as `Bytes` sharing its memory. The range must
    /// lie within the capacity.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Bytes {
        assert!(range.end <= self.len);
        Bytes::from_owner(Shared(self.buf.clone()))
            .slice(self.off + range.start..self.off + range.end)
    }

    /// A block that is `range` of this one, sharing its memory. Views of
    /// one buffer are never written in place (see [`Block::get_mut`]).
    pub fn view(&self, range: std::ops::Range<usize>) -> Block {
        assert!(range.start <= range.end && range.end <= self.len);
        Block {
            buf: self.buf.clone(),
            off: self.off + range.start,
            len: range.end - range.start,
        }
    }

    /// The whole buffer this block is a view of.
    pub fn whole_memory(&self) -> Block {
        Block {
            buf: self.buf.clone(),
            off: 0,
            len: self.memory_size(),
        }
    }

    /// True while a reader (or another view) still holds this block's
    /// buffer.
    pub fn is_shared(&self) -> bool {
        Arc::strong_count(&self.buf) > 1
    }

    /// Writable contents, or `None` while a reader or another view shares
    /// the buffer.
    pub fn get_mut(&mut self) -> Option<&mut [u8]> {
        let (off, len) = (self.off, self.len);
        Arc::get_mut(&mut self.buf).map(|b| &mut (**b).as_mut()[off..off + len])
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

    /// Address of the first byte (to find a piece of data in a block).
    fn start_addr(&self) -> usize {
        self.as_slice().as_ptr() as usize
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.capacity())
    }
}

/// Blocks an RDMA Read landed WRITE data in, attached to the data's
/// [`nfsrdma_xdr::Payload`] so that the store can take whole ones, or
/// whole pages of them, over instead of copying them.
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

    /// The page of a landing block that `data` (at least [`PAGE`] bytes)
    /// starts, when it starts one: a view of that page.
    pub fn page_at(&self, data: &[u8]) -> Option<Block> {
        if data.len() < PAGE {
            return None;
        }
        let at = data.as_ptr() as usize;
        self.0.iter().find_map(|b| {
            let start = b.start_addr();
            let off = at.checked_sub(start)?;
            (off.is_multiple_of(PAGE) && off + PAGE <= b.capacity())
                .then(|| b.view(off..off + PAGE))
        })
    }
}

/// Size of a page: the unit in which landing blocks become file data.
pub const PAGE: usize = 4096;
/// Pages in a full block.
pub const PAGES: usize = BLOCK_SIZE / PAGE;

/// The data of one [`BLOCK_SIZE`] stretch of a file.
#[derive(Clone, Debug)]
pub enum FileBlock {
    /// One block (smaller than [`BLOCK_SIZE`] for a small file).
    Whole(Block),
    /// Pages, each a [`PAGE`]-byte view of a buffer of its own or of a
    /// landing block several pages share (those are never written in
    /// place: a write to such a page makes it a private copy first).
    Pages(Box<[Option<Block>; PAGES]>),
}

impl FileBlock {
    /// Bytes of memory the block keeps alive: a buffer that several of its
    /// pages share counts once, whole.
    pub fn pinned(&self) -> usize {
        match self {
            FileBlock::Whole(b) => b.memory_size(),
            // Each buffer counts at its first page.
            FileBlock::Pages(pages) => pages
                .iter()
                .enumerate()
                .filter_map(|(i, p)| Some((i, p.as_ref()?)))
                .filter(|(i, p)| !pages[..*i].iter().flatten().any(|q| q.same_memory(p)))
                .map(|(_, p)| p.memory_size())
                .sum(),
        }
    }

    /// The block as pages (a whole block is cut into views of its buffer).
    pub fn into_pages(self) -> Box<[Option<Block>; PAGES]> {
        match self {
            FileBlock::Pages(p) => p,
            FileBlock::Whole(b) => {
                let mut pages: Box<[Option<Block>; PAGES]> = Box::default();
                for (i, page) in pages.iter_mut().enumerate() {
                    let at = i * PAGE;
                    if at < b.capacity() {
                        *page = Some(b.view(at..(at + PAGE).min(b.capacity())));
                    }
                }
                pages
            }
        }
    }

    /// Pages back to one block when they are, in order, the pages of one
    /// full-size buffer (no copy).
    pub fn from_pages(pages: Box<[Option<Block>; PAGES]>) -> FileBlock {
        if let Some(first) = &pages[0] {
            let whole = first.memory_size() == BLOCK_SIZE
                && pages.iter().enumerate().all(|(i, p)| {
                    p.as_ref().is_some_and(|p| {
                        p.same_memory(first)
                            && p.offset_in_memory() == i * PAGE
                            && p.capacity() == PAGE
                    })
                });
            if whole {
                return FileBlock::Whole(first.whole_memory());
            }
        }
        FileBlock::Pages(pages)
    }

    /// Appends `len` bytes from `at` in the block to `out` (zeros where
    /// nothing was written), as pieces sharing the block's memory.
    pub fn read_into(&self, at: usize, len: usize, zeros: &Zeros, out: &mut Payload) {
        match self {
            FileBlock::Whole(b) => {
                let from_block = len.min(b.capacity().saturating_sub(at));
                if from_block > 0 {
                    out.push(b.slice(at..at + from_block));
                }
                if from_block < len {
                    out.push(zeros.get(len - from_block));
                }
            }
            FileBlock::Pages(pages) => {
                // Runs of adjacent pages of one buffer go out as one piece.
                let mut run: Option<(Block, usize, usize)> = None;
                let mut zero_run = 0usize;
                let end = at + len;
                let mut pos = at;
                while pos < end {
                    let pi = pos / PAGE;
                    let in_page = pos % PAGE;
                    let n = (PAGE - in_page).min(end - pos);
                    match &pages[pi] {
                        Some(p) => {
                            if zero_run > 0 {
                                out.push(zeros.get(zero_run));
                                zero_run = 0;
                            }
                            let start = p.offset_in_memory() + in_page;
                            match &mut run {
                                Some((b, _, e)) if b.same_memory(p) && *e == start => *e += n,
                                _ => {
                                    if let Some((b, s, e)) = run.take() {
                                        out.push(b.whole_memory().slice(s..e));
                                    }
                                    run = Some((p.clone(), start, start + n));
                                }
                            }
                        }
                        None => {
                            if let Some((b, s, e)) = run.take() {
                                out.push(b.whole_memory().slice(s..e));
                            }
                            zero_run += n;
                        }
                    }
                    pos += n;
                }
                if let Some((b, s, e)) = run.take() {
                    out.push(b.whole_memory().slice(s..e));
                }
                if zero_run > 0 {
                    out.push(zeros.get(zero_run));
                }
            }
        }
    }

    /// The block's contents, up to its last written page (a power of two
    /// of at least [`MIN_BLOCK`] bytes, as a whole block would be).
    pub fn contents(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            FileBlock::Whole(b) => std::borrow::Cow::Borrowed(b.as_slice()),
            FileBlock::Pages(pages) => {
                let last = pages.iter().rposition(Option::is_some).unwrap_or(0);
                let size = ((last + 1) * PAGE).max(MIN_BLOCK).next_power_of_two();
                let mut v = vec![0u8; size];
                for (i, p) in pages.iter().enumerate() {
                    if let Some(p) = p {
                        v[i * PAGE..i * PAGE + p.capacity()].copy_from_slice(p.as_slice());
                    }
                }
                std::borrow::Cow::Owned(v)
            }
        }
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
