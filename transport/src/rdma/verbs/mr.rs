//! Protection domains, memory regions and the scatter/gather entries made
//! from them.

use std::alloc::{self, Layout};
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use rdma_sys::{
    ibv_access_flags, ibv_alloc_pd, ibv_dealloc_pd, ibv_dereg_mr, ibv_mr, ibv_pd, ibv_reg_mr,
};

use super::device::Context;
use super::{check_range, Result, VerbsError};

/// A protection domain (`ibv_alloc_pd`). Keeps its [`Context`] alive.
pub struct ProtectionDomain {
    pd: NonNull<ibv_pd>,
    ctx: Context,
    /// Regions registered on this PD with any remote access or MW binding.
    remote_regions: std::sync::atomic::AtomicUsize,
}

// SAFETY: PDs may be used from any thread; the pointer is owned by this
// value and freed only in Drop, after every child (which holds an Arc) is gone.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; the verbs that take a PD are thread safe.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on `ctx`.
    pub fn new(ctx: &Context) -> Result<Arc<Self>> {
        // SAFETY: the context is live (we hold a clone of it).
        let pd = unsafe { ibv_alloc_pd(ctx.as_ptr()) };
        let pd = NonNull::new(pd).ok_or_else(|| VerbsError::last_os("ibv_alloc_pd"))?;
        Ok(Arc::new(Self {
            pd,
            ctx: ctx.clone(),
            remote_regions: Default::default(),
        }))
    }

    /// How many regions have been registered on this PD with remote read,
    /// remote write or window-binding rights (a server that must never
    /// expose its memory checks that this stays 0).
    pub fn remote_access_regions(&self) -> usize {
        self.remote_regions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The device context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: allocated in `new`, freed once; children hold Arcs to us,
        // so none is alive. A failure (EBUSY) cannot be acted on here.
        unsafe { ibv_dealloc_pd(self.pd.as_ptr()) };
    }
}

/// Access rights of a memory region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Access {
    /// The local device may write (needed for receives, RDMA Read targets
    /// and for any remote write access).
    pub local_write: bool,
    /// Peers may RDMA Write into the region through its rkey.
    pub remote_write: bool,
    /// Peers may RDMA Read from the region through its rkey.
    pub remote_read: bool,
    /// Memory windows may be bound to the region (`IBV_ACCESS_MW_BIND`).
    pub mw_bind: bool,
}

impl Access {
    /// Local access only (sends, receives, RDMA Read targets, RDMA Write
    /// sources): no rkey is usable.
    pub const LOCAL: Self = Self {
        local_write: true,
        remote_write: false,
        remote_read: false,
        mw_bind: false,
    };
    /// Local write plus remote read and write through the region's rkey.
    pub const REMOTE: Self = Self {
        local_write: true,
        remote_write: true,
        remote_read: true,
        mw_bind: false,
    };
    /// Local access, no remote access through the region's own rkey, but
    /// memory windows may be bound (which then grant remote access to a
    /// sub-range).
    pub const MW_BIND: Self = Self {
        local_write: true,
        remote_write: false,
        remote_read: false,
        mw_bind: true,
    };

    /// The `ibv_access_flags` bit set.
    pub fn bits(self) -> u32 {
        let mut b = 0;
        if self.local_write {
            b |= ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        }
        if self.remote_write {
            b |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        if self.remote_read {
            b |= ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        }
        if self.mw_bind {
            b |= ibv_access_flags::IBV_ACCESS_MW_BIND.0;
        }
        b
    }
}

/// One scatter/gather entry: a byte range of a registered region.
///
/// Only [`MemoryRegion::sge`] makes these, and an `Sge` borrows its
/// region, so every `Sge` handed to a post names memory of a region that
/// is alive at post time (what happens if the region is dropped while the
/// request is outstanding is covered in the `verbs` module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sge<'a> {
    pub(crate) addr: u64,
    pub(crate) length: u32,
    pub(crate) lkey: u32,
    pub(crate) _region: PhantomData<&'a MemoryRegion>,
}

impl Sge<'_> {
    /// Virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }
    /// Length in bytes.
    pub fn len(&self) -> u32 {
        self.length
    }
    /// True for a zero-length entry.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }
    /// Local key of the region.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
}

/// A peer's memory as named on the wire: address, length, rkey (one RDMA
/// segment, "HLOO" in RPC-over-RDMA terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteBuf {
    /// Remote virtual address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    /// Remote key.
    pub rkey: u32,
}

/// Page-aligned, zero-initialised heap buffer owned by a memory region.
struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Buffer {
    fn new(len: usize) -> Result<Self> {
        if len == 0 {
            return Err(VerbsError::InvalidArgument(
                "memory region length must be > 0".into(),
            ));
        }
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = usize::try_from(page)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096);
        let size = len
            .checked_add(page - 1)
            .map(|s| s & !(page - 1))
            .ok_or_else(|| VerbsError::InvalidArgument(format!("length {len} too large")))?;
        let layout = Layout::from_size_align(size, page)
            .map_err(|e| VerbsError::InvalidArgument(format!("length {len}: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| VerbsError::Call {
            call: "alloc_zeroed",
            source: std::io::Error::from_raw_os_error(libc::ENOMEM),
        })?;
        Ok(Self { ptr, layout })
    }
}

/// A registered memory region that owns its page-aligned buffer
/// (`ibv_reg_mr`). Keeps its [`ProtectionDomain`] alive.
///
/// Drop deregisters first and frees the buffer only if deregistration
/// succeeded (otherwise the buffer is leaked), so the device never writes
/// into freed memory. CPU access is by copy (see the module docs), except
/// for a region given up ([`MemoryRegion::into_bytes`]) or lent
/// ([`MemoryRegion::lend`]) when nothing else can reach it.
pub struct MemoryRegion {
    mr: NonNull<ibv_mr>,
    buf: Buffer,
    len: usize,
    access: Access,
    /// Made by [`MemoryRegion::new_window_only`]: the device reaches it
    /// through memory windows only (no [`Sge`], no rkey of its own).
    window_only: bool,
    pd: Arc<ProtectionDomain>,
    /// Serialises CPU copies between Rust threads.
    cpu: Mutex<()>,
}

// SAFETY: the raw pointers are owned by this value; CPU access to the
// buffer is serialised by `cpu`; the MR handle is only read.
unsafe impl Send for MemoryRegion {}
// SAFETY: as above.
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("lkey", &format_args!("{:#x}", self.lkey()))
            .field("rkey", &format_args!("{:#x}", self.rkey()))
            .field("access", &self.access)
            .finish()
    }
}

impl MemoryRegion {
    /// Allocates a zeroed, page-aligned buffer of `len` bytes and registers
    /// it on `pd` with `access`.
    pub fn new(pd: &Arc<ProtectionDomain>, len: usize, access: Access) -> Result<Arc<Self>> {
        Self::register(pd, len, access, false)
    }

    /// A region the device reaches through memory windows only: registered
    /// with [`Access::MW_BIND`] (its own rkey grants nothing), and [`sge`]
    /// and [`remote`] refuse it, so no work request of ours reads or writes
    /// it directly. The CPU fills and reads it by copy, windows expose it
    /// to the peer, and when no window holds it any more it can be lent
    /// out without a copy ([`MemoryRegion::lend`]).
    ///
    /// [`sge`]: MemoryRegion::sge
    /// [`remote`]: MemoryRegion::remote
    pub fn new_window_only(pd: &Arc<ProtectionDomain>, len: usize) -> Result<Arc<Self>> {
        Self::register(pd, len, Access::MW_BIND, true)
    }

    fn register(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: Access,
        window_only: bool,
    ) -> Result<Arc<Self>> {
        if (access.remote_write || access.mw_bind) && !access.local_write {
            return Err(VerbsError::InvalidArgument(
                "remote write and MW bind access need local write access".into(),
            ));
        }
        let buf = Buffer::new(len)?;
        let access_bits = libc::c_int::try_from(access.bits())
            .map_err(|_| VerbsError::InvalidArgument("access flags".into()))?;
        // SAFETY: the PD is live; the buffer is valid for `len` bytes and is
        // not freed before the region is deregistered (see Drop).
        let mr = unsafe { ibv_reg_mr(pd.as_ptr(), buf.ptr.as_ptr().cast(), len, access_bits) };
        let Some(mr) = NonNull::new(mr) else {
            let err = VerbsError::last_os("ibv_reg_mr");
            // SAFETY: registration failed, so nothing refers to the buffer;
            // it was allocated with this layout.
            unsafe { alloc::dealloc(buf.ptr.as_ptr(), buf.layout) };
            return Err(err);
        };
        if access.remote_read || access.remote_write || access.mw_bind {
            pd.remote_regions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(Arc::new(Self {
            mr,
            buf,
            len,
            access,
            window_only,
            pd: pd.clone(),
            cpu: Mutex::new(()),
        }))
    }

    fn raw(&self) -> &ibv_mr {
        // SAFETY: the MR is live until Drop; libibverbs does not mutate the
        // public fields after registration.
        unsafe { self.mr.as_ref() }
    }

    /// The start of the region's buffer, for the arena module, which hands
    /// out references into it under its own rules.
    pub(super) fn buf_ptr(&self) -> NonNull<u8> {
        self.buf.ptr
    }

    pub(crate) fn as_ptr(&self) -> *mut ibv_mr {
        self.mr.as_ptr()
    }

    /// The protection domain the region belongs to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.raw().lkey
    }

    /// Remote key (meaningful only with remote access rights).
    pub fn rkey(&self) -> u32 {
        self.raw().rkey
    }

    /// Virtual address of the first byte (what peers use with the rkey).
    pub fn addr(&self) -> u64 {
        self.buf.ptr.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: regions have at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The access rights the region was registered with.
    pub fn access(&self) -> Access {
        self.access
    }

    /// Scatter/gather entry for `offset..offset + len`.
    pub fn sge(&self, offset: usize, len: usize) -> Result<Sge<'_>> {
        self.not_window_only("a scatter/gather entry")?;
        check_range(offset, len, self.len)?;
        let length = u32::try_from(len)
            .map_err(|_| VerbsError::InvalidArgument(format!("sge length {len} > u32")))?;
        Ok(Sge {
            addr: self.addr() + offset as u64,
            length,
            lkey: self.lkey(),
            _region: PhantomData,
        })
    }

    /// Scatter/gather entry covering the whole region.
    pub fn sge_all(&self) -> Result<Sge<'_>> {
        self.sge(0, self.len)
    }

    /// How a peer names `offset..offset + len` through the region's rkey.
    pub fn remote(&self, offset: usize, len: usize) -> Result<RemoteBuf> {
        self.not_window_only("its own rkey")?;
        check_range(offset, len, self.len)?;
        Ok(RemoteBuf {
            addr: self.addr() + offset as u64,
            len: u32::try_from(len)
                .map_err(|_| VerbsError::InvalidArgument(format!("length {len} > u32")))?,
            rkey: self.rkey(),
        })
    }

    /// Whether the region was made by [`MemoryRegion::new_window_only`].
    pub fn is_window_only(&self) -> bool {
        self.window_only
    }

    fn not_window_only(&self, what: &str) -> Result<()> {
        if self.window_only {
            return Err(VerbsError::InvalidArgument(format!(
                "a window-only region has no {what}: bind a memory window to it"
            )));
        }
        Ok(())
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        check_range(offset, data.len(), self.len)?;
        let _g = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the range was checked against the buffer; `data` is a
        // separate Rust allocation so the ranges cannot overlap; CPU writers
        // are serialised by `cpu`. The device may touch the same bytes
        // concurrently (like another process on shared memory); we only use
        // raw pointers, never references, into the buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.buf.ptr.as_ptr().add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// Fills `offset..offset + len` with `byte`.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<()> {
        check_range(offset, len, self.len)?;
        let _g = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: range checked; see `write_at`.
        unsafe { std::ptr::write_bytes(self.buf.ptr.as_ptr().add(offset), byte, len) };
        Ok(())
    }

    /// Copies bytes at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        check_range(offset, out.len(), self.len)?;
        let _g = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: range checked; `out` is a distinct Rust allocation; see
        // `write_at` for the device side.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.buf.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copies `offset..offset + len` into a new vector (one pass over the
    /// bytes: the vector is not zeroed first).
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        check_range(offset, len, self.len)?;
        let mut v = Vec::with_capacity(len);
        let _g = self.cpu.lock().unwrap_or_else(|p| p.into_inner());
        // SAFETY: the range was checked against the buffer and `v` has room
        // for `len` bytes; the two allocations are distinct. After the copy
        // the first `len` bytes of `v` are initialised, so `set_len` is
        // sound. See `write_at` for the device side.
        unsafe {
            std::ptr::copy_nonoverlapping(self.buf.ptr.as_ptr().add(offset), v.as_mut_ptr(), len);
            v.set_len(len);
        }
        Ok(v)
    }

    /// Deregisters the region and hands its buffer over as [`Bytes`]
    /// (`offset..offset + len` of it), without copying.
    ///
    /// Only a region no one else holds can be given up this way: with
    /// other references (a memory window bound to it holds one) the region
    /// comes back in `Err(Ok(region))`. Deregistration is the proof that
    /// the device is done with the memory: a region with a window still
    /// bound to it cannot be deregistered, and once `ibv_dereg_mr`
    /// succeeded no peer and no work request can reach the buffer. When it
    /// fails the buffer is leaked (see `Drop`) and the error is returned in
    /// `Err(Err(_))`.
    pub fn into_bytes(
        this: Arc<Self>,
        offset: usize,
        len: usize,
    ) -> std::result::Result<Bytes, std::result::Result<Arc<Self>, VerbsError>> {
        if let Err(e) = check_range(offset, len, this.len) {
            return Err(Err(e));
        }
        let region = Arc::try_unwrap(this).map_err(Ok)?;
        // Take the buffer out without running `Drop` (which would
        // deregister again and free it).
        let region = std::mem::ManuallyDrop::new(region);
        // SAFETY: `region` is never used or dropped again after these
        // reads, so each field is moved out exactly once.
        let (mr, buf, pd) = unsafe {
            (
                region.mr,
                std::ptr::read(&region.buf),
                std::ptr::read(&region.pd),
            )
        };
        // SAFETY: the region was registered in `new` and is deregistered
        // once, here; nothing else holds it (the Arc was unique).
        let rc = unsafe { ibv_dereg_mr(mr.as_ptr()) };
        drop(pd);
        if rc != 0 {
            // The device may still reach the buffer: leak it (`Buffer`
            // has no `Drop`; the memory is simply never freed).
            let _ = buf;
            return Err(Err(VerbsError::Call {
                call: "ibv_dereg_mr",
                source: std::io::Error::from_raw_os_error(rc),
            }));
        }
        Ok(Bytes::from_owner(Unregistered {
            buf,
            len: offset + len,
        })
        .slice(offset..))
    }
}

impl MemoryRegion {
    /// Lends `offset..offset + len` of a window-only region out as
    /// [`Bytes`] without copying and without deregistering it; when the
    /// last `Bytes` over the loan is dropped, the region is passed to
    /// `give_back` (to go back to a pool, say).
    ///
    /// The region comes back in `Err` unchanged unless it was made by
    /// [`MemoryRegion::new_window_only`], the range lies within it, and
    /// this is its only reference (no other `Arc`, no `Weak`). Those
    /// conditions are what make the loan sound, i.e. why nothing writes the
    /// buffer while shared references to it exist:
    /// - the region's own rkey grants no remote access, and no work
    ///   request of ours can name it (it has no [`Sge`]);
    /// - a memory window holds every region it was ever bound to until it
    ///   is deallocated, so a region no one else holds is one that no live
    ///   window was ever bound to (windows that were are deallocated, which
    ///   invalidates them);
    /// - CPU writes ([`MemoryRegion::write_at`], [`MemoryRegion::fill`])
    ///   and new binds need a reference to the region, and the only one is
    ///   inside the loan until `give_back` gets it.
    pub fn lend<F>(
        mut this: Arc<Self>,
        offset: usize,
        len: usize,
        give_back: F,
    ) -> std::result::Result<Bytes, Arc<Self>>
    where
        F: FnOnce(Arc<Self>) + Send + 'static,
    {
        if !this.window_only || check_range(offset, len, this.len).is_err() {
            return Err(this);
        }
        if Arc::get_mut(&mut this).is_none() {
            return Err(this);
        }
        Ok(Bytes::from_owner(Lent {
            region: Some(this),
            give_back: Some(give_back),
            offset,
            len,
        }))
    }
}

/// A window-only region lent out by [`MemoryRegion::lend`].
struct Lent<F: FnOnce(Arc<MemoryRegion>)> {
    /// Always `Some` until dropped.
    region: Option<Arc<MemoryRegion>>,
    give_back: Option<F>,
    offset: usize,
    len: usize,
}

impl<F: FnOnce(Arc<MemoryRegion>)> AsRef<[u8]> for Lent<F> {
    fn as_ref(&self) -> &[u8] {
        let Some(region) = self.region.as_ref() else {
            return &[];
        };
        // SAFETY: `offset..offset + len` was checked against the region's
        // length in `lend`, and the allocation is at least that long; the
        // buffer was zero-initialised at allocation, so every byte is
        // initialised. Nothing writes it while the loan exists (see
        // `MemoryRegion::lend`): no rkey, work request, window or CPU
        // writer can reach it, as the loan holds its only reference.
        unsafe { std::slice::from_raw_parts(region.buf.ptr.as_ptr().add(self.offset), self.len) }
    }
}

impl<F: FnOnce(Arc<MemoryRegion>)> Drop for Lent<F> {
    fn drop(&mut self) {
        if let (Some(region), Some(give_back)) = (self.region.take(), self.give_back.take()) {
            give_back(region);
        }
    }
}

/// A region's buffer after deregistration: plain memory, owned, never
/// written again; freed when the last `Bytes` over it is dropped.
struct Unregistered {
    buf: Buffer,
    len: usize,
}

// SAFETY: the buffer is owned exclusively and only read after
// construction; no device can reach it (deregistered).
unsafe impl Send for Unregistered {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for Unregistered {}

impl AsRef<[u8]> for Unregistered {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` is within the allocation (checked against the
        // region's length in `into_bytes`, and the allocation is at least
        // that long); the memory was zero-initialised at allocation, so
        // every byte is initialised; after deregistration nothing writes
        // it (no rkey or lkey reaches it, and we hand out only shared
        // references).
        unsafe { std::slice::from_raw_parts(self.buf.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Unregistered {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout in `Buffer::new`; the region
        // was deregistered, so the device no longer accesses it.
        unsafe { alloc::dealloc(self.buf.ptr.as_ptr(), self.buf.layout) };
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: registered in `new`, deregistered once. Memory windows
        // bound to the region hold an Arc to it, so none is bound through
        // our handles any more.
        let rc = unsafe { ibv_dereg_mr(self.mr.as_ptr()) };
        if rc == 0 {
            // SAFETY: the device no longer accesses the buffer once
            // ibv_dereg_mr succeeded; allocated with this layout.
            unsafe { alloc::dealloc(self.buf.ptr.as_ptr(), self.buf.layout) };
        }
        // On failure the buffer is leaked on purpose: it may still be
        // registered, and freeing it could let the device write into
        // memory reused by Rust.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_bits_match_libibverbs() {
        assert_eq!(Access::LOCAL.bits(), 1);
        assert_eq!(Access::REMOTE.bits(), 1 | 2 | 4);
        assert_eq!(Access::MW_BIND.bits(), 1 | 16);
        assert_eq!(Access::default().bits(), 0);
    }

    #[test]
    fn buffers_are_page_aligned_and_zeroed() {
        let b = Buffer::new(10).unwrap();
        assert_eq!(b.ptr.as_ptr() as usize % 4096, 0);
        assert!(b.layout.size() >= 10);
        let mut out = [1u8; 10];
        // SAFETY: buffer valid for 10 bytes; freed right after with its layout.
        unsafe {
            std::ptr::copy_nonoverlapping(b.ptr.as_ptr(), out.as_mut_ptr(), 10);
            alloc::dealloc(b.ptr.as_ptr(), b.layout);
        }
        assert_eq!(out, [0u8; 10]);
        assert!(Buffer::new(0).is_err());
        assert!(Buffer::new(usize::MAX).is_err());
    }
}
