//! The tmpfs-like in-memory file system behind an export.
//!
//! [`Store`] wraps an [`Fs`] in a read-write lock, and each inode has a
//! read-write lock of its own (see `Slot`). The NFS service takes the
//! store's lock once per call: shared for calls that look, and for WRITE,
//! which then locks its file alone ([`Fs::write_wcc`] reads the attributes
//! before and after with it, so the weak-cache-consistency data stays
//! atomic with the operation); exclusive for calls that change names or
//! the inode table. READ data is returned as `Bytes` pointing into the
//! file's blocks (see [`blocks`]).
//!
//! Errors are NFSv3 status codes: the store speaks the protocol's language.

pub mod blocks;

use blocks::{block_size_for, Block, BlockSource, FileBlock, HeapSource, Zeros, BLOCK_SIZE, PAGE};
use bytes::Bytes;
use nfsrdma_xdr::nfs3::{
    access, Fattr3, Ftype3, NfsStat3, NfsTime3, Sattr3, SetTime, SpecData3, WccAttr,
};
use nfsrdma_xdr::Payload;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};

mod snapshot;
pub use snapshot::SnapshotError;

/// A fresh random secret (from the standard library's per-process random
/// hash keys and the clock).
fn random_key() -> [u64; 2] {
    let s = std::collections::hash_map::RandomState::new();
    let t = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let mut a = s.build_hasher();
    a.write_u64(t);
    let mut b = s.build_hasher();
    b.write_u64(!t);
    [a.finish(), b.finish()]
}
use parking_lot::{
    MappedRwLockReadGuard, RwLock as InodeLock, RwLockReadGuard as InodeRead,
    RwLockWriteGuard as InodeWrite,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// Result of a store operation.
pub type SResult<T> = Result<T, NfsStat3>;

/// Longest name component.
pub const NAME_MAX: usize = 255;
/// Most hard links to one file.
pub const LINK_MAX: u32 = 65_000;
/// Largest file size.
pub const MAX_FILE_SIZE: u64 = (1 << 50) - 1;
/// Length of a file handle.
pub const HANDLE_LEN: usize = 24;
const HANDLE_MAGIC: [u8; 4] = *b"nRd1";
/// Cookies 1 and 2 are "." and ".."; entries count from here.
const FIRST_ENTRY_COOKIE: u64 = 3;

/// A block as it should be kept: pages that keep more than twice the
/// memory of a whole block alive (landing blocks most of whose pages were
/// overwritten or cut off since) are gathered into one block, a copy
/// counted in `gathered`. Pages landed over one block never get there: a
/// buffer stays alive, whole, only while some page of it is left.
fn settle(b: FileBlock, source: &dyn BlockSource, gathered: &AtomicU64) -> SResult<FileBlock> {
    if b.pinned() <= 2 * BLOCK_SIZE {
        return Ok(b);
    }
    let mut whole = Block::new(source, BLOCK_SIZE).ok_or(NfsStat3::Nospc)?;
    let c = b.contents();
    whole.get_mut().expect("fresh block")[..c.len()].copy_from_slice(&c);
    gathered.fetch_add(c.len() as u64, Ordering::Relaxed);
    Ok(FileBlock::Whole(whole))
}

/// WRITE data being taken in, piece by piece.
struct Source<'a> {
    parts: &'a [Bytes],
    part: usize,
    off: usize,
}

impl Source<'_> {
    /// The current piece, when nothing of it was taken yet.
    fn whole_part(&self) -> Option<&Bytes> {
        (self.off == 0).then(|| self.parts.get(self.part)).flatten()
    }

    /// `n` bytes `ahead` of the current position, when they lie in one
    /// piece.
    fn peek_at(&self, mut ahead: usize, n: usize) -> Option<&[u8]> {
        let mut part = self.part;
        let mut off = self.off;
        loop {
            let p = self.parts.get(part)?;
            let left = p.len() - off;
            if ahead < left {
                return p.get(off + ahead..off + ahead + n);
            }
            ahead -= left;
            part += 1;
            off = 0;
        }
    }

    /// `n` bytes at the current position, when they lie in one piece.
    fn peek(&self, n: usize) -> Option<&[u8]> {
        self.peek_at(0, n)
    }

    /// Whether a whole page of `[at, end)` of a block (the data starting
    /// at `at`) lies in a page of a landing block.
    fn pages_from(&self, landing: &blocks::LandingBlocks, at: usize, end: usize) -> bool {
        let mut page = at.div_ceil(PAGE) * PAGE;
        while page + PAGE <= end {
            if self
                .peek_at(page - at, PAGE)
                .and_then(|d| landing.page_at(d))
                .is_some()
            {
                return true;
            }
            page += PAGE;
        }
        false
    }

    /// Moves `n` bytes on.
    fn skip(&mut self, mut n: usize) {
        while n > 0 {
            let left = self.parts[self.part].len() - self.off;
            let k = left.min(n);
            self.off += k;
            n -= k;
            if self.off == self.parts[self.part].len() {
                self.part += 1;
                self.off = 0;
            }
        }
    }

    /// Fills `dst` and moves on by its length.
    fn copy_to(&mut self, dst: &mut [u8]) {
        let mut at = 0;
        while at < dst.len() {
            let p = &self.parts[self.part];
            let n = (p.len() - self.off).min(dst.len() - at);
            dst[at..at + n].copy_from_slice(&p[self.off..self.off + n]);
            at += n;
            if n == 0 {
                // An empty piece.
                self.part += 1;
                self.off = 0;
            } else {
                self.skip(n);
            }
        }
    }
}

/// The caller's credentials, after squashing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cred {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub gids: Vec<u32>,
}

impl Cred {
    /// The superuser.
    pub fn root() -> Cred {
        Cred::default()
    }

    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.gids.contains(&gid)
    }
}

/// Store limits and identity.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// File system id reported in attributes and carried in handles.
    pub fsid: u64,
    /// Bytes of file data the store may hold.
    pub capacity_bytes: u64,
    /// Most inodes (files, directories, links, nodes).
    pub max_inodes: u64,
    /// Null export: reads return zeros, writes are discarded (sizes and
    /// times still change), no data memory is used.
    pub null: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            fsid: 1,
            capacity_bytes: 4 << 30,
            max_inodes: 1 << 20,
            null: false,
        }
    }
}

/// An inode number: a slot in the inode table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(u32);

impl Ino {
    /// The file id reported to clients.
    pub fn fileid(self) -> u64 {
        u64::from(self.0) + 1
    }

    /// Inode `n`, for tests of tables keyed by inode.
    #[cfg(test)]
    pub(crate) fn for_test(n: u32) -> Ino {
        Ino(n)
    }
}

#[derive(Debug, Clone)]
struct Attr {
    kind: Ftype3,
    mode: u32,
    nlink: u32,
    uid: u32,
    gid: u32,
    rdev: SpecData3,
    atime: NfsTime3,
    mtime: NfsTime3,
    ctime: NfsTime3,
    /// The change attribute: moves at every change of ctime, by one at
    /// least, and never below ctime in nanoseconds (so a restart from a
    /// snapshot, which keeps ctime, keeps it increasing).
    change: u64,
}

impl Attr {
    fn set_ctime(&mut self, t: NfsTime3) {
        self.ctime = t;
        self.change = (self.change + 1).max(time_change(t));
    }
}

/// A time as a change value: nanoseconds since the epoch.
fn time_change(t: NfsTime3) -> u64 {
    u64::from(t.seconds) * 1_000_000_000 + u64::from(t.nseconds)
}

#[derive(Debug, Default)]
struct FileData {
    size: u64,
    blocks: BTreeMap<u64, FileBlock>,
    /// Bytes of block memory held.
    used: u64,
    /// Verifier of an EXCLUSIVE create, until attributes are set.
    create_verf: Option<[u8; 8]>,
}

#[derive(Debug)]
struct Dir {
    parent: Ino,
    /// Entries by cookie; a cookie is never reused within a directory, so
    /// an old cookie stays meaningful while entries come and go.
    entries: BTreeMap<u64, (Bytes, Ino)>,
    by_name: HashMap<Bytes, u64>,
    next_cookie: u64,
    subdirs: u32,
}

#[derive(Debug)]
enum Content {
    File(FileData),
    Dir(Dir),
    Symlink(Bytes),
    Node,
}

#[derive(Debug)]
struct Inode {
    attr: Attr,
    content: Content,
}

/// An inode table entry. The inode has a lock of its own: calls that
/// change only a file's data and attributes (WRITE) hold the store's lock
/// shared and the file's exclusively, so that calls on different files run
/// at once; everything that changes the namespace or the table holds the
/// store's lock exclusively, and reaches inodes without locking them.
#[derive(Debug, Default)]
struct Slot {
    generation: u32,
    inode: Option<InodeLock<Inode>>,
}

/// What CREATE, MKDIR, SYMLINK and MKNOD make.
#[derive(Debug, Clone)]
pub enum NewNode {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link to the target.
    Symlink(Bytes),
    /// A device, socket or fifo.
    Special(Ftype3, SpecData3),
}

/// How CREATE treats an existing name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreateMode {
    /// Use (and truncate per the attributes) an existing regular file.
    Unchecked,
    /// Fail with NFS3ERR_EXIST.
    Guarded,
    /// Idempotent create keyed by this verifier.
    Exclusive([u8; 8]),
}

/// One READDIR entry.
#[derive(Debug, Clone)]
pub struct DirEntry {
    /// Name.
    pub name: Bytes,
    /// Cookie to continue after it.
    pub cookie: u64,
    /// The inode.
    pub ino: Ino,
}

/// The file system state. Obtain it through [`Store::read`] or
/// [`Store::write`].
pub struct Fs {
    config: StoreConfig,
    slots: Vec<Slot>,
    free: Vec<u32>,
    inodes: u64,
    /// Bytes of block memory held by files (changed by WRITEs to
    /// different files at once, so atomic; see [`Fs::reserve`]).
    used_bytes: AtomicU64,
    source: Box<dyn BlockSource>,
    /// Secret mixed into handle check values (kept in snapshots, so that
    /// handles survive a planned restart).
    handle_key: [u64; 2],
    /// WRITE bytes copied into file blocks.
    write_copied: AtomicU64,
    /// WRITE bytes whose landing blocks became file blocks (no copy).
    write_adopted: AtomicU64,
    /// Bytes of pages gathered into whole blocks (see `settle`).
    write_compacted: AtomicU64,
    /// Zeros for holes and a null export's data, from `source`.
    zeros: Zeros,
    /// A null export's READ bytes answered with zeros (READs run under
    /// the shared lock).
    null_read: AtomicU64,
    /// A null export's WRITE bytes discarded.
    null_discarded: AtomicU64,
    /// Files an NFSv4 client holds open: one unlinked meanwhile stays (with
    /// no links) until [`Fs::release`].
    held: HashSet<Ino>,
}

/// An in-memory file system shared by the service's workers.
pub struct Store {
    fs: RwLock<Fs>,
    fsid: u64,
}

impl Store {
    /// An empty store whose root directory is owned by root, mode 0755.
    pub fn new(config: StoreConfig) -> Store {
        Store::with_source(config, Box::new(HeapSource))
    }

    /// An empty store taking block memory from `source`.
    pub fn with_source(config: StoreConfig, source: Box<dyn BlockSource>) -> Store {
        let fsid = config.fsid;
        let zeros = Zeros::from_source(&*source);
        let mut fs = Fs {
            config,
            slots: Vec::new(),
            free: Vec::new(),
            inodes: 0,
            used_bytes: AtomicU64::new(0),
            source,
            handle_key: random_key(),
            write_copied: AtomicU64::new(0),
            write_adopted: AtomicU64::new(0),
            write_compacted: AtomicU64::new(0),
            zeros,
            null_read: AtomicU64::new(0),
            null_discarded: AtomicU64::new(0),
            held: HashSet::new(),
        };
        let now = now();
        let root = fs
            .alloc_inode(Inode {
                attr: Attr {
                    kind: Ftype3::Dir,
                    mode: 0o755,
                    nlink: 2,
                    uid: 0,
                    gid: 0,
                    rdev: SpecData3::default(),
                    atime: now,
                    mtime: now,
                    ctime: now,
                    change: time_change(now),
                },
                content: Content::Dir(Dir::new(Ino(0))),
            })
            .expect("an empty store has room for its root");
        debug_assert_eq!(root, Ino(0));
        Store {
            fs: RwLock::new(fs),
            fsid,
        }
    }

    /// The file system id.
    pub fn fsid(&self) -> u64 {
        self.fsid
    }

    /// Shared access.
    pub fn read(&self) -> RwLockReadGuard<'_, Fs> {
        self.fs.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Exclusive access.
    pub fn write(&self) -> RwLockWriteGuard<'_, Fs> {
        self.fs.write().unwrap_or_else(|p| p.into_inner())
    }
}

fn now() -> NfsTime3 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    NfsTime3 {
        seconds: d.as_secs() as u32,
        nseconds: d.subsec_nanos(),
    }
}

impl Dir {
    fn new(parent: Ino) -> Dir {
        Dir {
            parent,
            entries: BTreeMap::new(),
            by_name: HashMap::new(),
            next_cookie: FIRST_ENTRY_COOKIE,
            subdirs: 0,
        }
    }

    fn get(&self, name: &[u8]) -> Option<Ino> {
        self.by_name.get(name).map(|c| self.entries[c].1)
    }

    fn insert(&mut self, name: Bytes, ino: Ino) {
        let c = self.next_cookie;
        self.next_cookie += 1;
        self.by_name.insert(name.clone(), c);
        self.entries.insert(c, (name, ino));
    }

    fn remove(&mut self, name: &[u8]) -> Option<Ino> {
        let c = self.by_name.remove(name)?;
        self.entries.remove(&c).map(|(_, ino)| ino)
    }

    fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Checks a name for CREATE-like operations and LOOKUP.
pub fn check_name(name: &[u8]) -> SResult<()> {
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) {
        return Err(NfsStat3::Acces);
    }
    if name.len() > NAME_MAX {
        return Err(NfsStat3::Nametoolong);
    }
    Ok(())
}

fn is_dot(name: &[u8]) -> bool {
    name == b"." || name == b".."
}

impl Fs {
    /// The root directory.
    pub fn root(&self) -> Ino {
        Ino(0)
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    fn alloc_inode(&mut self, inode: Inode) -> SResult<Ino> {
        if self.inodes >= self.config.max_inodes {
            return Err(NfsStat3::Nospc);
        }
        self.inodes += 1;
        if let Some(i) = self.free.pop() {
            let slot = &mut self.slots[i as usize];
            slot.generation = slot.generation.wrapping_add(1);
            slot.inode = Some(InodeLock::new(inode));
            return Ok(Ino(i));
        }
        let i = u32::try_from(self.slots.len()).map_err(|_| NfsStat3::Nospc)?;
        self.slots.push(Slot {
            generation: 1,
            inode: Some(InodeLock::new(inode)),
        });
        Ok(Ino(i))
    }

    /// Keeps the file `ino` while it is open (NFSv4 OPEN): unlinked, it
    /// stays readable and writable through its handle, with no links,
    /// until [`Fs::release`]. Not saved in a snapshot once unlinked.
    pub fn hold(&mut self, ino: Ino) {
        self.held.insert(ino);
    }

    /// The last open of `ino` is gone: a file with no links left goes now.
    pub fn release(&mut self, ino: Ino) {
        if self.held.remove(&ino) && self.inode(ino).is_ok_and(|i| i.attr.nlink == 0) {
            self.free_inode(ino);
        }
    }

    fn free_inode(&mut self, ino: Ino) {
        self.held.remove(&ino);
        if let Some(inode) = self.slots[ino.0 as usize].inode.take() {
            if let Content::File(f) = inode.into_inner().content {
                self.used_bytes.fetch_sub(f.used, Ordering::Relaxed);
            }
            self.inodes -= 1;
            self.free.push(ino.0);
        }
    }

    fn lock(&self, ino: Ino) -> SResult<&InodeLock<Inode>> {
        self.slots
            .get(ino.0 as usize)
            .and_then(|s| s.inode.as_ref())
            .ok_or(NfsStat3::Stale)
    }

    /// The inode, shared. Under the store's shared lock a call never holds
    /// two guards of one file at once: a WRITE waiting for the file would
    /// hold up the second, and the call with it. (A directory, or any
    /// inode under the store's exclusive lock, has no one waiting.)
    fn inode(&self, ino: Ino) -> SResult<InodeRead<'_, Inode>> {
        Ok(self.lock(ino)?.read())
    }

    /// The inode, exclusively, under the store's shared lock: only for
    /// changes to a file's data and attributes (see [`Slot`]).
    fn inode_write(&self, ino: Ino) -> SResult<InodeWrite<'_, Inode>> {
        Ok(self.lock(ino)?.write())
    }

    /// The inode, under the store's exclusive lock (no locking needed).
    fn inode_mut(&mut self, ino: Ino) -> SResult<&mut Inode> {
        self.slots
            .get_mut(ino.0 as usize)
            .and_then(|s| s.inode.as_mut())
            .map(InodeLock::get_mut)
            .ok_or(NfsStat3::Stale)
    }

    fn dir(&self, ino: Ino) -> SResult<MappedRwLockReadGuard<'_, Dir>> {
        InodeRead::try_map(self.inode(ino)?, |i| match &i.content {
            Content::Dir(d) => Some(d),
            _ => None,
        })
        .map_err(|_| NfsStat3::Notdir)
    }

    fn dir_mut(&mut self, ino: Ino) -> SResult<&mut Dir> {
        match &mut self.inode_mut(ino)?.content {
            Content::Dir(d) => Ok(d),
            _ => Err(NfsStat3::Notdir),
        }
    }

    // ---- handles -----------------------------------------------------------

    fn handle_check(&self, fileid: u64, generation: u32) -> u32 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        h.write_u64(self.handle_key[0]);
        h.write_u64(self.handle_key[1]);
        h.write_u64(self.config.fsid);
        h.write_u64(fileid);
        h.write_u32(generation);
        h.finish() as u32
    }

    /// The file handle of `ino`.
    pub fn handle(&self, ino: Ino) -> Bytes {
        let generation = self.slots[ino.0 as usize].generation;
        let mut h = Vec::with_capacity(HANDLE_LEN);
        h.extend_from_slice(&HANDLE_MAGIC);
        h.extend_from_slice(&(self.config.fsid as u32).to_be_bytes());
        h.extend_from_slice(&ino.fileid().to_be_bytes());
        h.extend_from_slice(&generation.to_be_bytes());
        h.extend_from_slice(&self.handle_check(ino.fileid(), generation).to_be_bytes());
        Bytes::from(h)
    }

    /// The inode a handle names: NFS3ERR_BADHANDLE for anything that is not
    /// a handle of this store (wrong length, magic, fsid or check value),
    /// NFS3ERR_STALE for a handle of a removed file.
    pub fn resolve(&self, fh: &[u8]) -> SResult<Ino> {
        let (fsid, fileid, generation, check) = parse_handle(fh)?;
        if fsid != self.config.fsid as u32 || check != self.handle_check(fileid, generation) {
            return Err(NfsStat3::Badhandle);
        }
        let slot = fileid
            .checked_sub(1)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or(NfsStat3::Badhandle)?;
        match self.slots.get(slot as usize) {
            Some(s) if s.generation == generation && s.inode.is_some() => Ok(Ino(slot)),
            Some(_) => Err(NfsStat3::Stale),
            None => Err(NfsStat3::Badhandle),
        }
    }

    // ---- attributes --------------------------------------------------------

    /// The attributes of `ino`.
    pub fn getattr(&self, ino: Ino) -> SResult<Fattr3> {
        Ok(self.fattr(ino, &*self.inode(ino)?))
    }

    /// The attributes of `ino`, whose inode the caller holds.
    fn fattr(&self, ino: Ino, i: &Inode) -> Fattr3 {
        let a = &i.attr;
        let (size, used) = match &i.content {
            Content::File(f) => (f.size, f.used),
            Content::Dir(d) => {
                let s = 4096u64.max(((d.entries.len() as u64) * 32).next_multiple_of(4096));
                (s, s)
            }
            Content::Symlink(t) => (t.len() as u64, 0),
            Content::Node => (0, 0),
        };
        Fattr3 {
            type_: a.kind,
            mode: a.mode,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            size,
            used,
            rdev: a.rdev,
            fsid: self.config.fsid,
            fileid: ino.fileid(),
            atime: a.atime,
            mtime: a.mtime,
            ctime: a.ctime,
        }
    }

    /// The change attribute of `ino` (NFSv4 `change`).
    pub fn change(&self, ino: Ino) -> SResult<u64> {
        Ok(self.inode(ino)?.attr.change)
    }

    /// The attributes of `ino` and its change attribute, read together.
    pub fn getattr_change(&self, ino: Ino) -> SResult<(Fattr3, u64)> {
        let i = self.inode(ino)?;
        Ok((self.fattr(ino, &i), i.attr.change))
    }

    /// The attributes a client checks its cache with.
    pub fn wcc_attr(&self, ino: Ino) -> Option<WccAttr> {
        self.getattr(ino).ok().as_ref().map(wcc_of)
    }

    /// Whether `cred` may do `want` (rwx bits: 4, 2, 1) on `ino`.
    fn may(&self, ino: Ino, cred: &Cred, want: u32) -> SResult<bool> {
        let a = &self.inode(ino)?.attr;
        Ok(mode_allows(a, cred, want))
    }

    fn require(&self, ino: Ino, cred: &Cred, want: u32) -> SResult<()> {
        if self.may(ino, cred, want)? {
            Ok(())
        } else {
            Err(NfsStat3::Acces)
        }
    }

    /// ACCESS: which of `want` ([`access`] bits) `cred` has on `ino`.
    /// A read-only export passes `read_only`, which withholds the bits that
    /// change things.
    pub fn access(&self, ino: Ino, cred: &Cred, want: u32, read_only: bool) -> SResult<u32> {
        let i = self.inode(ino)?;
        let is_dir = i.attr.kind == Ftype3::Dir;
        let r = mode_allows(&i.attr, cred, 4);
        let w = mode_allows(&i.attr, cred, 2) && !read_only;
        let x = mode_allows(&i.attr, cred, 1);
        let mut got = 0;
        if r {
            got |= access::READ;
        }
        if w {
            got |= access::MODIFY | access::EXTEND;
            if is_dir {
                got |= access::DELETE;
            }
        }
        if x {
            got |= if is_dir {
                access::LOOKUP
            } else {
                access::EXECUTE
            };
        }
        Ok(got & want)
    }

    /// SETATTR, with the ctime guard. The rules, and the order in which they
    /// are checked, are those of the Linux nfsd over a local file system:
    ///
    /// 1. A size wants a regular file (NFS3ERR_ISDIR, NFS3ERR_INVAL). A size,
    ///    or times set to the server's clock with no time from the client,
    ///    want write permission, which the owner has whatever the mode
    ///    (NFS3ERR_ACCES).
    /// 2. A mode sent for a symbolic link is ignored.
    /// 3. The guard (NFS3ERR_NOT_SYNC).
    /// 4. Only root gives a file away; the owner may "change" the owner to
    ///    itself. Only root, or the owner to a group it is in (or the
    ///    group the file has), changes the group. Only the owner or root
    ///    changes the mode or sets times from the client (NFS3ERR_PERM):
    ///    also when nothing would change.
    /// 5. A new mode loses set-group-ID when the caller is not root and not
    ///    in the file's group. A new owner or group (even the same one) on a
    ///    non-directory clears set-user-ID, and set-group-ID where the group
    ///    may execute (set-group-ID without it marks mandatory locking).
    /// 6. Anything set moves ctime; a call that sets nothing changes nothing.
    pub fn setattr(
        &mut self,
        ino: Ino,
        cred: &Cred,
        s: &Sattr3,
        guard: Option<NfsTime3>,
    ) -> SResult<()> {
        const SUID: u32 = 0o4000;
        const SGID: u32 = 0o2000;
        const GROUP_EXEC: u32 = 0o010;
        let attr = self.inode(ino)?.attr.clone();
        let root = cred.uid == 0;
        let owner = cred.uid == attr.uid;
        let client_time = [&s.atime, &s.mtime]
            .iter()
            .any(|t| matches!(t, SetTime::ClientTime(_)));
        let server_time = [&s.atime, &s.mtime]
            .iter()
            .any(|t| matches!(t, SetTime::ServerTime));
        if s.size.is_some() {
            match attr.kind {
                Ftype3::Reg => {}
                Ftype3::Dir => return Err(NfsStat3::Isdir),
                _ => return Err(NfsStat3::Inval),
            }
        }
        let wants_write = s.size.is_some() || (server_time && !client_time);
        if wants_write && !owner && !mode_allows(&attr, cred, 2) {
            return Err(NfsStat3::Acces);
        }
        let mode = s.mode.filter(|_| attr.kind != Ftype3::Lnk);
        if let Some(g) = guard {
            if g != attr.ctime {
                return Err(NfsStat3::NotSync);
            }
        }
        if let Some(uid) = s.uid {
            let may = root || (owner && uid == attr.uid);
            if !may {
                return Err(NfsStat3::Perm);
            }
        }
        if let Some(gid) = s.gid {
            let may = root || (owner && (gid == attr.gid || cred.in_group(gid)));
            if !may {
                return Err(NfsStat3::Perm);
            }
        }
        if (mode.is_some() || client_time) && !owner && !root {
            return Err(NfsStat3::Perm);
        }
        let chown = s.uid.is_some() || s.gid.is_some();
        if !chown && mode.is_none() && s.size.is_none() && !client_time && !server_time {
            return Ok(());
        }
        if let Some(size) = s.size {
            self.truncate(ino, size)?;
        }
        let t = now();
        let i = self.inode_mut(ino)?;
        let a = &mut i.attr;
        let gid = s.gid.unwrap_or(a.gid);
        if let Some(m) = mode {
            let mut m = m & 0o7777;
            if !root && !cred.in_group(gid) {
                m &= !SGID;
            }
            a.mode = m;
        }
        if chown && a.kind != Ftype3::Dir {
            a.mode &= !SUID;
            if a.mode & GROUP_EXEC != 0 {
                a.mode &= !SGID;
            }
        }
        if let Some(u) = s.uid {
            a.uid = u;
        }
        a.gid = gid;
        match s.atime {
            SetTime::DontChange => {}
            SetTime::ServerTime => a.atime = t,
            SetTime::ClientTime(v) => a.atime = v,
        }
        match s.mtime {
            SetTime::DontChange => {}
            SetTime::ServerTime => a.mtime = t,
            SetTime::ClientTime(v) => a.mtime = v,
        }
        a.set_ctime(t);
        if let Content::File(f) = &mut i.content {
            f.create_verf = None;
        }
        Ok(())
    }

    // ---- names -------------------------------------------------------------

    /// LOOKUP `name` in `dir`.
    pub fn lookup(&self, dir: Ino, name: &[u8], cred: &Cred) -> SResult<Ino> {
        let d = self.dir(dir)?;
        self.require(dir, cred, 1)?;
        match name {
            b"." => Ok(dir),
            b".." => Ok(d.parent),
            _ => {
                check_name(name)?;
                d.get(name).ok_or(NfsStat3::Noent)
            }
        }
    }

    /// READLINK.
    pub fn readlink(&self, ino: Ino) -> SResult<Bytes> {
        match &self.inode(ino)?.content {
            Content::Symlink(t) => Ok(t.clone()),
            _ => Err(NfsStat3::Inval),
        }
    }

    fn check_dir_write(&self, dir: Ino, cred: &Cred) -> SResult<()> {
        drop(self.dir(dir)?);
        self.require(dir, cred, 3)
    }

    /// CREATE, MKDIR, SYMLINK, MKNOD: makes `name` in `dir`.
    pub fn create(
        &mut self,
        dir: Ino,
        name: &[u8],
        cred: &Cred,
        node: NewNode,
        mode: CreateMode,
        attrs: &Sattr3,
    ) -> SResult<Ino> {
        self.check_dir_write(dir, cred)?;
        if is_dot(name) {
            return Err(NfsStat3::Exist);
        }
        check_name(name)?;
        let existing = self.dir(dir)?.get(name);
        if let Some(existing) = existing {
            return self.create_existing(existing, cred, &node, mode, attrs);
        }
        let t = now();
        let dir_attr = self.inode(dir)?.attr.clone();
        // A directory with the set-group-id bit passes its group on.
        let (gid, sgid) = if dir_attr.mode & 0o2000 != 0 {
            (dir_attr.gid, true)
        } else {
            (cred.gid, false)
        };
        let (kind, content, default_mode) = match &node {
            NewNode::File => (
                Ftype3::Reg,
                Content::File(FileData {
                    create_verf: match mode {
                        CreateMode::Exclusive(v) => Some(v),
                        _ => None,
                    },
                    ..Default::default()
                }),
                0o644,
            ),
            NewNode::Dir => (Ftype3::Dir, Content::Dir(Dir::new(dir)), 0o755),
            // A copy: the target arrived in a receive buffer or a landing
            // block, which must not be kept alive for the life of the link.
            NewNode::Symlink(target) => (
                Ftype3::Lnk,
                Content::Symlink(Bytes::copy_from_slice(target)),
                0o777,
            ),
            NewNode::Special(k, _) => (*k, Content::Node, 0o644),
        };
        // A symbolic link's mode is always 0777 (a mode asked for is ignored).
        let asked = attrs.mode.filter(|_| kind != Ftype3::Lnk);
        let mut m = asked.unwrap_or(default_mode) & 0o7777;
        if kind == Ftype3::Dir && sgid {
            m |= 0o2000;
        }
        let inode = Inode {
            attr: Attr {
                kind,
                mode: m,
                nlink: if kind == Ftype3::Dir { 2 } else { 1 },
                uid: if cred.uid == 0 {
                    attrs.uid.unwrap_or(0)
                } else {
                    cred.uid
                },
                gid: attrs.gid.filter(|_| cred.uid == 0).unwrap_or(gid),
                rdev: match node {
                    NewNode::Special(_, r) => r,
                    _ => SpecData3::default(),
                },
                atime: t,
                mtime: t,
                ctime: t,
                change: time_change(t),
            },
            content,
        };
        let ino = self.alloc_inode(inode)?;
        let name = Bytes::copy_from_slice(name);
        let d = self.dir_mut(dir)?;
        d.insert(name, ino);
        if kind == Ftype3::Dir {
            d.subdirs += 1;
        }
        let dattr = &mut self.inode_mut(dir)?.attr;
        if kind == Ftype3::Dir {
            dattr.nlink += 1;
        }
        dattr.mtime = t;
        dattr.set_ctime(t);
        // Size and times asked for at creation (not for EXCLUSIVE, whose
        // attributes come with a later SETATTR).
        if matches!(node, NewNode::File) && !matches!(mode, CreateMode::Exclusive(_)) {
            if let Some(size) = attrs.size.filter(|s| *s > 0) {
                self.truncate(ino, size)?;
            }
        }
        if !matches!(mode, CreateMode::Exclusive(_)) {
            let a = &mut self.inode_mut(ino)?.attr;
            if let SetTime::ClientTime(v) = attrs.atime {
                a.atime = v;
            }
            if let SetTime::ClientTime(v) = attrs.mtime {
                a.mtime = v;
            }
        }
        Ok(ino)
    }

    fn create_existing(
        &mut self,
        existing: Ino,
        cred: &Cred,
        node: &NewNode,
        mode: CreateMode,
        attrs: &Sattr3,
    ) -> SResult<Ino> {
        match (node, mode) {
            (NewNode::File, CreateMode::Exclusive(v)) => match &self.inode(existing)?.content {
                Content::File(f) if f.create_verf == Some(v) => Ok(existing),
                _ => Err(NfsStat3::Exist),
            },
            (NewNode::File, CreateMode::Unchecked) => {
                if self.inode(existing)?.attr.kind != Ftype3::Reg {
                    return Err(NfsStat3::Exist);
                }
                if let Some(size) = attrs.size {
                    self.setattr(
                        existing,
                        cred,
                        &Sattr3 {
                            size: Some(size),
                            ..Default::default()
                        },
                        None,
                    )?;
                }
                Ok(existing)
            }
            _ => Err(NfsStat3::Exist),
        }
    }

    /// The sticky-directory rule: in a directory with the sticky bit, only
    /// the owner of an entry, the owner of the directory or root may remove
    /// or rename it (NFS3ERR_PERM, as the Linux nfsd answers).
    fn sticky_check(&self, dir: Ino, victim: Ino, cred: &Cred) -> SResult<()> {
        let d = &self.inode(dir)?.attr;
        if d.mode & 0o1000 == 0 || cred.uid == 0 || cred.uid == d.uid {
            return Ok(());
        }
        if self.inode(victim)?.attr.uid == cred.uid {
            Ok(())
        } else {
            Err(NfsStat3::Perm)
        }
    }

    fn drop_link(&mut self, ino: Ino) -> SResult<()> {
        let t = now();
        let i = self.inode_mut(ino)?;
        i.attr.nlink = i.attr.nlink.saturating_sub(1);
        i.attr.set_ctime(t);
        let dead = i.attr.nlink == 0 || (i.attr.kind == Ftype3::Dir && i.attr.nlink <= 1);
        if dead && !self.held.contains(&ino) {
            self.free_inode(ino);
        }
        Ok(())
    }

    fn touch_dir(&mut self, dir: Ino) -> SResult<()> {
        let t = now();
        let a = &mut self.inode_mut(dir)?.attr;
        a.mtime = t;
        a.set_ctime(t);
        Ok(())
    }

    /// REMOVE a non-directory. In the Linux nfsd's order: "." and ".."
    /// (NFS3ERR_ACCES), write and search permission on `dir`, the name,
    /// the sticky rule, then the type.
    pub fn remove(&mut self, dir: Ino, name: &[u8], cred: &Cred) -> SResult<()> {
        if is_dot(name) {
            return Err(NfsStat3::Acces);
        }
        self.check_dir_write(dir, cred)?;
        check_name(name)?;
        let victim = self.dir(dir)?.get(name).ok_or(NfsStat3::Noent)?;
        self.sticky_check(dir, victim, cred)?;
        if self.inode(victim)?.attr.kind == Ftype3::Dir {
            return Err(NfsStat3::Isdir);
        }
        self.dir_mut(dir)?.remove(name);
        self.touch_dir(dir)?;
        self.drop_link(victim)
    }

    /// RMDIR an empty directory, in the order of [`Fs::remove`]; then the
    /// type and emptiness.
    pub fn rmdir(&mut self, dir: Ino, name: &[u8], cred: &Cred) -> SResult<()> {
        if is_dot(name) {
            return Err(NfsStat3::Acces);
        }
        self.check_dir_write(dir, cred)?;
        check_name(name)?;
        let victim = self.dir(dir)?.get(name).ok_or(NfsStat3::Noent)?;
        self.sticky_check(dir, victim, cred)?;
        match &self.inode(victim)?.content {
            Content::Dir(d) if d.is_empty() => {}
            Content::Dir(_) => return Err(NfsStat3::Notempty),
            _ => return Err(NfsStat3::Notdir),
        }
        let d = self.dir_mut(dir)?;
        d.remove(name);
        d.subdirs -= 1;
        self.inode_mut(dir)?.attr.nlink -= 1;
        self.touch_dir(dir)?;
        self.free_inode(victim);
        Ok(())
    }

    fn is_ancestor(&self, maybe_ancestor: Ino, mut ino: Ino) -> SResult<bool> {
        loop {
            if ino == maybe_ancestor {
                return Ok(true);
            }
            let parent = self.dir(ino)?.parent;
            if parent == ino {
                return Ok(false);
            }
            ino = parent;
        }
    }

    /// RENAME with POSIX rules: a file replaces a file, a directory replaces
    /// an empty directory, a directory never moves into its own subtree.
    /// Checked in the Linux nfsd's order: write and search permission on
    /// both directories (NFS3ERR_ACCES); "." or ".." (NFS3ERR_PERM); the
    /// source; a source that contains the target directory
    /// (NFS3ERR_INVAL) or a target that contains the source
    /// (NFS3ERR_NOTEMPTY); two names of one file (nothing happens); the
    /// sticky rule for the source, then for the target, and the types; a
    /// directory that moves to another parent must be writable itself,
    /// since its ".." changes (NFS3ERR_ACCES); a non-empty target
    /// directory (NFS3ERR_NOTEMPTY).
    pub fn rename(
        &mut self,
        from_dir: Ino,
        from: &[u8],
        to_dir: Ino,
        to: &[u8],
        cred: &Cred,
    ) -> SResult<()> {
        self.check_dir_write(from_dir, cred)?;
        self.check_dir_write(to_dir, cred)?;
        if is_dot(from) || is_dot(to) {
            return Err(NfsStat3::Perm);
        }
        check_name(from)?;
        check_name(to)?;
        let src = self.dir(from_dir)?.get(from).ok_or(NfsStat3::Noent)?;
        let src_is_dir = self.inode(src)?.attr.kind == Ftype3::Dir;
        if src_is_dir && self.is_ancestor(src, to_dir)? {
            return Err(NfsStat3::Inval);
        }
        let target = self.dir(to_dir)?.get(to);
        if let Some(t) = target {
            if self.inode(t)?.attr.kind == Ftype3::Dir && self.is_ancestor(t, from_dir)? {
                return Err(NfsStat3::Notempty);
            }
        }
        if target == Some(src) {
            return Ok(());
        }
        self.sticky_check(from_dir, src, cred)?;
        if let Some(t) = target {
            self.sticky_check(to_dir, t, cred)?;
            let t_is_dir = self.inode(t)?.attr.kind == Ftype3::Dir;
            match (src_is_dir, t_is_dir) {
                (true, false) => return Err(NfsStat3::Notdir),
                (false, true) => return Err(NfsStat3::Isdir),
                _ => {}
            }
        }
        if src_is_dir && from_dir != to_dir {
            self.require(src, cred, 2)?;
        }
        if let Some(t) = target {
            let t_is_dir = self.inode(t)?.attr.kind == Ftype3::Dir;
            if t_is_dir && !self.dir(t)?.is_empty() {
                return Err(NfsStat3::Notempty);
            }
            self.dir_mut(to_dir)?.remove(to);
            if t_is_dir {
                self.dir_mut(to_dir)?.subdirs -= 1;
                self.inode_mut(to_dir)?.attr.nlink -= 1;
                self.free_inode(t);
            } else {
                self.drop_link(t)?;
            }
        }
        self.dir_mut(from_dir)?.remove(from);
        self.dir_mut(to_dir)?
            .insert(Bytes::copy_from_slice(to), src);
        if src_is_dir && from_dir != to_dir {
            self.dir_mut(from_dir)?.subdirs -= 1;
            self.inode_mut(from_dir)?.attr.nlink -= 1;
            self.dir_mut(to_dir)?.subdirs += 1;
            self.inode_mut(to_dir)?.attr.nlink += 1;
            self.dir_mut(src)?.parent = to_dir;
        }
        self.touch_dir(from_dir)?;
        self.touch_dir(to_dir)?;
        self.inode_mut(src)?.attr.set_ctime(now());
        Ok(())
    }

    /// LINK: a new name for a non-directory.
    pub fn link(&mut self, file: Ino, dir: Ino, name: &[u8], cred: &Cred) -> SResult<()> {
        self.check_dir_write(dir, cred)?;
        if is_dot(name) {
            return Err(NfsStat3::Exist);
        }
        check_name(name)?;
        let a = self.inode(file)?.attr.clone();
        if a.kind == Ftype3::Dir {
            return Err(NfsStat3::Isdir);
        }
        if a.nlink >= LINK_MAX {
            return Err(NfsStat3::Mlink);
        }
        if self.dir(dir)?.get(name).is_some() {
            return Err(NfsStat3::Exist);
        }
        self.dir_mut(dir)?
            .insert(Bytes::copy_from_slice(name), file);
        self.touch_dir(dir)?;
        let a = &mut self.inode_mut(file)?.attr;
        a.nlink += 1;
        a.set_ctime(now());
        Ok(())
    }

    // ---- directories -------------------------------------------------------

    /// The cookie verifier of a directory: it changes only when the
    /// directory is replaced (a new inode generation).
    pub fn cookieverf(&self, dir: Ino) -> [u8; 8] {
        let g = self.slots.get(dir.0 as usize).map_or(0, |s| s.generation);
        ((u64::from(g) << 32) | u64::from(dir.0)).to_be_bytes()
    }

    /// Directory entries after `cookie`, "." and ".." first. `fits` is
    /// asked about each entry in turn and stops the listing when it returns
    /// false. Returns the entries and whether the end was reached.
    /// NFS3ERR_BAD_COOKIE for a cookie this directory never issued or a
    /// verifier from another incarnation of it.
    pub fn readdir(
        &self,
        dir: Ino,
        cred: &Cred,
        cookie: u64,
        verf: [u8; 8],
        mut fits: impl FnMut(&DirEntry) -> bool,
    ) -> SResult<(Vec<DirEntry>, bool)> {
        let d = self.dir(dir)?;
        self.require(dir, cred, 4)?;
        if cookie != 0 {
            if verf != [0; 8] && verf != self.cookieverf(dir) {
                return Err(NfsStat3::BadCookie);
            }
            if cookie >= d.next_cookie {
                return Err(NfsStat3::BadCookie);
            }
        }
        let mut out = Vec::new();
        let dots = [(1u64, &b"."[..], dir), (2, &b".."[..], d.parent)];
        for (c, name, ino) in dots {
            if cookie < c {
                let e = DirEntry {
                    name: Bytes::from_static(name),
                    cookie: c,
                    ino,
                };
                if !fits(&e) {
                    return Ok((out, false));
                }
                out.push(e);
            }
        }
        let start = cookie.max(FIRST_ENTRY_COOKIE - 1) + 1;
        for (c, (name, ino)) in d.entries.range(start..) {
            let e = DirEntry {
                name: name.clone(),
                cookie: *c,
                ino: *ino,
            };
            if !fits(&e) {
                return Ok((out, false));
            }
            out.push(e);
        }
        Ok((out, true))
    }

    // ---- data --------------------------------------------------------------

    /// READ up to `count` bytes at `offset`: the data as pieces of the
    /// file's blocks (holes are zeros), and whether the end was reached.
    pub fn read(&self, ino: Ino, cred: &Cred, offset: u64, count: u32) -> SResult<(Payload, bool)> {
        let i = self.inode(ino)?;
        let f = match &i.content {
            Content::File(f) => f,
            Content::Dir(_) => return Err(NfsStat3::Isdir),
            _ => return Err(NfsStat3::Inval),
        };
        if !may_use(&i.attr, cred, 4) {
            return Err(NfsStat3::Acces);
        }
        if offset >= f.size {
            return Ok((Payload::new(), true));
        }
        let end = f.size.min(offset.saturating_add(u64::from(count)));
        let mut out = Payload::new();
        let mut pos = offset;
        while pos < end {
            let bi = pos / BLOCK_SIZE as u64;
            let in_block = (pos % BLOCK_SIZE as u64) as usize;
            let take = ((end - pos) as usize).min(BLOCK_SIZE - in_block);
            match f.blocks.get(&bi) {
                Some(b) if !self.config.null => b.read_into(in_block, take, &self.zeros, &mut out),
                _ => out.push(self.zeros.get(take)),
            }
            pos += take as u64;
        }
        if self.config.null {
            self.null_read.fetch_add(end - offset, Ordering::Relaxed);
        }
        Ok((out, end >= f.size))
    }

    /// WRITE `data` at `offset`. The owner may write a file whose mode
    /// forbids it (as an open file keeps its access). Needs only the
    /// store's shared lock: the file alone is locked while it changes.
    pub fn write(&self, ino: Ino, cred: &Cred, offset: u64, data: &Payload) -> SResult<()> {
        self.write_wcc(ino, cred, offset, data).1
    }

    /// [`Fs::write`], with the file's attributes just before it and just
    /// after it, read with the file locked so that no other change falls
    /// between them (NFSv3 weak cache consistency).
    pub fn write_wcc(
        &self,
        ino: Ino,
        cred: &Cred,
        offset: u64,
        data: &Payload,
    ) -> (Option<WccAttr>, SResult<()>, Option<Fattr3>) {
        let kind = match self.inode(ino) {
            Ok(i) => i.attr.kind,
            Err(e) => return (None, Err(e), None),
        };
        if kind != Ftype3::Reg {
            // Not locked exclusively: a directory's lock is only ever
            // shared while the store's lock is (see `inode`).
            let attrs = self.getattr(ino).ok();
            let e = if kind == Ftype3::Dir {
                NfsStat3::Isdir
            } else {
                NfsStat3::Inval
            };
            return (attrs.as_ref().map(wcc_of), Err(e), attrs);
        }
        let mut i = match self.inode_write(ino) {
            Ok(i) => i,
            Err(e) => return (None, Err(e), None),
        };
        let before = wcc_of(&self.fattr(ino, &i));
        let r = self.write_locked(&mut i, cred, offset, data);
        (Some(before), r, Some(self.fattr(ino, &i)))
    }

    fn write_locked(&self, i: &mut Inode, cred: &Cred, offset: u64, data: &Payload) -> SResult<()> {
        if !may_use(&i.attr, cred, 2) {
            return Err(NfsStat3::Acces);
        }
        let len = data.len() as u64;
        let end = offset.checked_add(len).ok_or(NfsStat3::Fbig)?;
        if end > MAX_FILE_SIZE {
            return Err(NfsStat3::Fbig);
        }
        let t = now();
        let Content::File(f) = &mut i.content else {
            return Err(NfsStat3::Inval);
        };
        if self.config.null {
            self.null_discarded.fetch_add(len, Ordering::Relaxed);
        } else if len > 0 {
            self.write_blocks(f, offset, data)?;
        }
        f.size = f.size.max(end);
        i.attr.mtime = t;
        i.attr.set_ctime(t);
        // A write by someone other than root clears set-id bits.
        if cred.uid != 0 {
            i.attr.mode &= !0o6000;
        }
        Ok(())
    }

    /// Takes `bytes` of the store's capacity for a change about to be
    /// made: NFS3ERR_NOSPC when they are not there. WRITEs to different
    /// files reserve at once; each gives back what it did not use.
    fn reserve(&self, bytes: u64) -> SResult<()> {
        let capacity = self.config.capacity_bytes;
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                u.checked_add(bytes).filter(|n| *n <= capacity)
            })
            .map(|_| ())
            .map_err(|_| NfsStat3::Nospc)
    }

    /// Writes `data` at `offset` into the blocks of the file `ino` (its
    /// size and times are the caller's).
    fn write_file_blocks(&self, ino: Ino, offset: u64, data: &Payload) -> SResult<()> {
        let mut i = self.inode_write(ino)?;
        let Content::File(f) = &mut i.content else {
            return Err(NfsStat3::Inval);
        };
        self.write_blocks(f, offset, data)
    }

    fn write_blocks(&self, f: &mut FileData, offset: u64, data: &Payload) -> SResult<()> {
        let landing = data
            .attachment()
            .and_then(|a| a.downcast_ref::<blocks::LandingBlocks>());
        // Taking landed pages over may pin more memory than copying them
        // would: when the store cannot set that much aside, the data is
        // copied instead, so that a WRITE is refused only when a copy would
        // not fit either.
        if let Some(l) = landing {
            let grow = self.most_needed(f, offset, data, Some(l));
            if self.reserve(grow).is_ok() {
                return self.fill_reserved(f, offset, data, Some(l), grow);
            }
        }
        let grow = self.most_needed(f, offset, data, None);
        self.reserve(grow)?;
        self.fill_reserved(f, offset, data, None, grow)
    }

    /// The most block memory writing `data` at `offset` can add to the
    /// file, worked out before anything changes (so that NFS3ERR_NOSPC
    /// leaves the file untouched), block by block as `fill_blocks` will
    /// write it: a whole landing block taken over, one block; landed pages
    /// taken over, up to two blocks (a page keeps all of its landing block
    /// alive; `settle` gathers a block that pins more); pages copied,
    /// a page each; a whole block copied, its size.
    fn most_needed(
        &self,
        f: &FileData,
        offset: u64,
        data: &Payload,
        landing: Option<&blocks::LandingBlocks>,
    ) -> u64 {
        let end = offset + data.len() as u64;
        let new_size = f.size.max(end);
        let first = offset / BLOCK_SIZE as u64;
        let last = (end - 1) / BLOCK_SIZE as u64;
        let mut src = Source {
            parts: data.parts(),
            part: 0,
            off: 0,
        };
        let mut grow = 0u64;
        for bi in first..=last {
            let block_start = bi * BLOCK_SIZE as u64;
            let in_block = (offset.max(block_start) - block_start) as usize;
            let end_in_block = ((end - block_start) as usize).min(BLOCK_SIZE);
            let want = block_size_for(new_size, end_in_block);
            let old = f.blocks.get(&bi);
            let have = old.map_or(0, FileBlock::pinned);
            let adopted = landing.is_some_and(|l| {
                in_block == 0
                    && end_in_block == BLOCK_SIZE
                    && want == BLOCK_SIZE
                    && src.whole_part().and_then(|p| l.whole_block(p)).is_some()
            });
            grow += if adopted {
                BLOCK_SIZE.saturating_sub(have)
            } else if landing.is_some_and(|l| src.pages_from(l, in_block, end_in_block)) {
                (2 * BLOCK_SIZE).saturating_sub(have)
            } else if matches!(old, Some(FileBlock::Pages(_))) {
                (end_in_block.div_ceil(PAGE) - in_block / PAGE) * PAGE
            } else {
                want.saturating_sub(have)
            } as u64;
            src.skip(end_in_block - in_block);
        }
        grow
    }

    /// `fill_blocks` with `grow` bytes reserved: what the blocks came to
    /// hold, less what they held, is at most that; the rest goes back.
    fn fill_reserved(
        &self,
        f: &mut FileData,
        offset: u64,
        data: &Payload,
        landing: Option<&blocks::LandingBlocks>,
        grow: u64,
    ) -> SResult<()> {
        let mut net = 0u64;
        let r = self.fill_blocks(f, offset, data, landing, &mut net);
        self.used_bytes
            .fetch_add(net.wrapping_sub(grow), Ordering::Relaxed);
        r
    }

    /// The copying (or adopting, from `landing`) part of `write_blocks`;
    /// `net` counts the change in memory held (modulo 2^64: it may
    /// shrink).
    fn fill_blocks(
        &self,
        f: &mut FileData,
        offset: u64,
        data: &Payload,
        landing: Option<&blocks::LandingBlocks>,
        net: &mut u64,
    ) -> SResult<()> {
        let end = offset + data.len() as u64;
        let new_size = f.size.max(end);
        let first = offset / BLOCK_SIZE as u64;
        let last = (end - 1) / BLOCK_SIZE as u64;
        let mut src = Source {
            parts: data.parts(),
            part: 0,
            off: 0,
        };
        let source = self.source.as_ref();
        let mut pos = offset;
        for bi in first..=last {
            let block_start = bi * BLOCK_SIZE as u64;
            let in_block = (pos - block_start) as usize;
            let end_in_block = ((end - block_start) as usize).min(BLOCK_SIZE);
            let want = block_size_for(new_size, end_in_block);
            let old = f.blocks.remove(&bi);
            let old_pinned = old.as_ref().map_or(0, FileBlock::pinned) as u64;
            let new = if let Some(b) = landing.and_then(|l| {
                // A whole block of data that arrived in a registered block
                // of its own (an RDMA Read landed it there): that block
                // becomes the file's.
                (in_block == 0 && end_in_block == BLOCK_SIZE && want == BLOCK_SIZE)
                    .then(|| src.whole_part().and_then(|p| l.whole_block(p)))
                    .flatten()
            }) {
                src.skip(BLOCK_SIZE);
                self.write_adopted
                    .fetch_add(BLOCK_SIZE as u64, Ordering::Relaxed);
                FileBlock::Whole(b.clone())
            } else if matches!(old, Some(FileBlock::Pages(_)))
                || landing.is_some_and(|l| src.pages_from(l, in_block, end_in_block))
            {
                // Whole pages that landed in pages of landing blocks become
                // the file's pages; the rest is written page by page.
                let mut pages = old.map_or_else(Box::default, FileBlock::into_pages);
                let mut at = in_block;
                while at < end_in_block {
                    let pi = at / PAGE;
                    let page_end = ((pi + 1) * PAGE).min(end_in_block);
                    let whole_page = at == pi * PAGE && page_end == (pi + 1) * PAGE;
                    if let Some(p) = landing
                        .filter(|_| whole_page)
                        .and_then(|l| src.peek(PAGE).and_then(|d| l.page_at(d)))
                    {
                        pages[pi] = Some(p);
                        src.skip(PAGE);
                        self.write_adopted.fetch_add(PAGE as u64, Ordering::Relaxed);
                    } else {
                        let mut page = match pages[pi].take() {
                            Some(p) if !p.is_shared() => p,
                            Some(p) => p.copy_resized(source, PAGE, PAGE).ok_or(NfsStat3::Nospc)?,
                            None => Block::new(source, PAGE).ok_or(NfsStat3::Nospc)?,
                        };
                        let dst = page.get_mut().expect("page is unique here");
                        let n = page_end - at;
                        src.copy_to(&mut dst[at % PAGE..at % PAGE + n]);
                        self.write_copied.fetch_add(n as u64, Ordering::Relaxed);
                        pages[pi] = Some(page);
                    }
                    at = page_end;
                }
                settle(FileBlock::from_pages(pages), source, &self.write_compacted)?
            } else {
                let mut block = match old {
                    None => Block::new(source, want).ok_or(NfsStat3::Nospc)?,
                    Some(FileBlock::Whole(b)) if b.capacity() < want || b.is_shared() => {
                        // Grow a small block, or copy one a reader still holds.
                        let size = want.max(b.capacity());
                        b.copy_resized(source, size, b.capacity())
                            .ok_or(NfsStat3::Nospc)?
                    }
                    Some(FileBlock::Whole(b)) => b,
                    Some(FileBlock::Pages(_)) => unreachable!("paged blocks are written above"),
                };
                let dst = block.get_mut().expect("block is unique here");
                src.copy_to(&mut dst[in_block..end_in_block]);
                self.write_copied
                    .fetch_add((end_in_block - in_block) as u64, Ordering::Relaxed);
                FileBlock::Whole(block)
            };
            let new_pinned = new.pinned() as u64;
            f.used = f.used + new_pinned - old_pinned;
            *net = net.wrapping_add(new_pinned).wrapping_sub(old_pinned);
            pos = block_start + end_in_block as u64;
            f.blocks.insert(bi, new);
        }
        debug_assert_eq!(pos, end);
        Ok(())
    }

    fn truncate(&mut self, ino: Ino, size: u64) -> SResult<()> {
        if size > MAX_FILE_SIZE {
            return Err(NfsStat3::Fbig);
        }
        let null = self.config.null;
        let mut guard = self.inode_write(ino)?;
        let i = &mut *guard;
        let Content::File(f) = &mut i.content else {
            return Err(NfsStat3::Inval);
        };
        if size < f.size && !null {
            let keep_blocks = size.div_ceil(BLOCK_SIZE as u64);
            let tail = (size % BLOCK_SIZE as u64) as usize;
            // The last kept block's tail is zeroed, so that a later
            // extension reads zeros there; where that memory is shared
            // the part kept is copied first. A whole block's copy counts
            // as the block did; a page's copy counts one page more when
            // the block's pages before it keep its buffer (counted once
            // for them all) alive: reserved before anything changes.
            let last = keep_blocks.checked_sub(1).and_then(|k| f.blocks.get(&k));
            let copy = match last {
                Some(FileBlock::Pages(pages)) if !tail.is_multiple_of(PAGE) => {
                    let at = tail.div_ceil(PAGE) - 1;
                    match &pages[at] {
                        Some(p) if p.is_shared() => {
                            let kept = pages[..at].iter().flatten().any(|q| q.same_memory(p));
                            if kept {
                                PAGE as u64
                            } else {
                                0
                            }
                        }
                        _ => 0,
                    }
                }
                _ => 0,
            };
            self.reserve(copy)?;
            let before = f.used;
            let cut_off = f.blocks.split_off(&keep_blocks);
            let zeroed = if tail > 0 {
                Self::zero_tail(
                    f,
                    keep_blocks - 1,
                    tail,
                    self.source.as_ref(),
                    &self.write_compacted,
                )
            } else {
                Ok(())
            };
            if zeroed.is_err() {
                // The file stays as it was, its data past the new end
                // with it.
                f.blocks.extend(cut_off);
            }
            f.used = f.blocks.values().map(|b| b.pinned() as u64).sum();
            self.used_bytes.fetch_add(
                f.used.wrapping_sub(before).wrapping_sub(copy),
                Ordering::Relaxed,
            );
            zeroed?;
        }
        f.size = size;
        let t = now();
        i.attr.mtime = t;
        i.attr.set_ctime(t);
        Ok(())
    }

    /// Zeroes block `k` of `f` from `tail` on (copying what is kept
    /// where the memory is shared), then gathers the block into a whole
    /// one if its pages keep more than two blocks' memory alive (kept
    /// as it is when no memory is there for that). NFS3ERR_NOSPC when no
    /// memory is there for the copy: the block is left as it was.
    fn zero_tail(
        f: &mut FileData,
        k: u64,
        tail: usize,
        source: &dyn BlockSource,
        gathered: &AtomicU64,
    ) -> SResult<()> {
        match f.blocks.get_mut(&k) {
            Some(FileBlock::Whole(b)) if tail < b.capacity() => {
                if b.is_shared() {
                    *b = b
                        .copy_resized(source, b.capacity(), tail)
                        .ok_or(NfsStat3::Nospc)?;
                } else {
                    b.get_mut().expect("unique")[tail..].fill(0);
                }
            }
            Some(FileBlock::Pages(pages)) => {
                let cut = tail.div_ceil(PAGE);
                // Taken out first: a page they share memory with may need
                // no copy without them.
                let dropped: Vec<Option<Block>> =
                    pages[cut..].iter_mut().map(Option::take).collect();
                if !tail.is_multiple_of(PAGE) {
                    if let Some(p) = &mut pages[cut - 1] {
                        let keep = tail % PAGE;
                        if p.is_shared() {
                            let Some(copy) = p.copy_resized(source, PAGE, keep) else {
                                for (slot, d) in pages[cut..].iter_mut().zip(dropped) {
                                    *slot = d;
                                }
                                return Err(NfsStat3::Nospc);
                            };
                            *p = copy;
                        }
                        p.get_mut().expect("unique")[keep..].fill(0);
                    }
                }
            }
            _ => {}
        }
        if let Some(b) = f.blocks.get_mut(&k) {
            if b.pinned() > 2 * BLOCK_SIZE {
                if let Ok(whole) = settle(b.clone(), source, gathered) {
                    *b = whole;
                }
            }
        }
        Ok(())
    }

    /// The file `ino`, if it is one and `cred` may write it.
    fn file_to_write(&self, ino: Ino, cred: &Cred) -> SResult<MappedRwLockReadGuard<'_, FileData>> {
        InodeRead::try_map(self.inode(ino)?, |i| match &i.content {
            Content::File(f) if may_use(&i.attr, cred, 2) => Some(f),
            _ => None,
        })
        .map_err(|i| match i.content {
            Content::File(_) => NfsStat3::Acces,
            Content::Dir(_) => NfsStat3::Isdir,
            _ => NfsStat3::Inval,
        })
    }

    /// The file `ino` locked for a change by `cred`: NFS3ERR_ISDIR for a
    /// directory, NFS3ERR_INVAL for anything else that is not a file,
    /// NFS3ERR_ACCES when `cred` may not write it. Under the store's
    /// shared lock (a directory is never locked exclusively then, so the
    /// kind is checked first).
    fn file_locked(&self, ino: Ino, cred: &Cred) -> SResult<InodeWrite<'_, Inode>> {
        match self.inode(ino)?.attr.kind {
            Ftype3::Reg => {}
            Ftype3::Dir => return Err(NfsStat3::Isdir),
            _ => return Err(NfsStat3::Inval),
        }
        let i = self.inode_write(ino)?;
        if !may_use(&i.attr, cred, 2) {
            return Err(NfsStat3::Acces);
        }
        Ok(i)
    }

    /// Writes each `(offset, data)` of `pieces` (in different blocks) into
    /// `f`, the memory they may take set aside for all of them first:
    /// NFS3ERR_NOSPC leaves the file untouched.
    fn fill_all(&self, f: &mut FileData, pieces: Vec<(u64, Payload)>) -> SResult<()> {
        let grows: Vec<u64> = pieces
            .iter()
            .map(|(at, data)| self.most_needed(f, *at, data, None))
            .collect();
        let mut left: u64 = grows.iter().sum();
        self.reserve(left)?;
        for ((at, data), grow) in pieces.iter().zip(grows) {
            left -= grow;
            if let Err(e) = self.fill_reserved(f, *at, data, None, grow) {
                // What was set aside for the pieces not written.
                self.used_bytes.fetch_sub(left, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Frees `[offset, offset + length)` of a file (NFSv4.2 DEALLOCATE,
    /// `fallocate` hole punching): blocks wholly inside go (their memory
    /// with them), the parts of blocks at the range's ends are zeroed; the
    /// size stays. The range past the end of the file is ignored. The file
    /// is locked throughout: a READ sees all of it or none.
    pub fn deallocate(&self, ino: Ino, cred: &Cred, offset: u64, length: u64) -> SResult<()> {
        let mut i = self.file_locked(ino, cred)?;
        let Inode { attr, content, .. } = &mut *i;
        let Content::File(f) = content else {
            return Err(NfsStat3::Inval);
        };
        let end = offset.saturating_add(length).min(f.size);
        if offset < end && !self.config.null {
            let blk = BLOCK_SIZE as u64;
            let (first_whole, end_whole) = (offset.div_ceil(blk), end / blk);
            // Zero the pieces of partly covered blocks that hold data
            // (which may take memory: a block shared with another file, or
            // landed pages, is copied first), all of it set aside before
            // anything changes.
            let mut ends = Vec::new();
            if first_whole > end_whole {
                ends.push((offset, end));
            } else {
                ends.push((offset, first_whole * blk));
                ends.push((end_whole * blk, end));
            }
            let pieces: Vec<(u64, Payload)> = ends
                .into_iter()
                .filter(|&(from, to)| from < to && f.blocks.contains_key(&(from / blk)))
                .map(|(from, to)| {
                    let zeros = Payload::from_parts([self.zeros.get((to - from) as usize)]);
                    (from, zeros)
                })
                .collect();
            self.fill_all(f, pieces)?;
            if first_whole < end_whole {
                let dropped: Vec<u64> = f
                    .blocks
                    .range(first_whole..end_whole)
                    .map(|(k, _)| *k)
                    .collect();
                for k in dropped {
                    if let Some(b) = f.blocks.remove(&k) {
                        let freed = b.pinned() as u64;
                        f.used -= freed;
                        self.used_bytes.fetch_sub(freed, Ordering::Relaxed);
                    }
                }
            }
        }
        let t = now();
        attr.mtime = t;
        attr.set_ctime(t);
        Ok(())
    }

    /// Reserves memory for `[offset, offset + length)` of a file (NFSv4.2
    /// ALLOCATE, `fallocate`): every block of the range the file does not
    /// hold gets one, of zeros, so that later WRITEs there cannot fail for
    /// want of space; the file grows to the range's end if it is shorter.
    /// NFS3ERR_NOSPC, with the file untouched, when the store cannot hold
    /// them all. The file is locked throughout.
    pub fn allocate(&self, ino: Ino, cred: &Cred, offset: u64, length: u64) -> SResult<()> {
        let end = offset.checked_add(length).ok_or(NfsStat3::Fbig)?;
        if end > MAX_FILE_SIZE {
            return Err(NfsStat3::Fbig);
        }
        let mut i = self.file_locked(ino, cred)?;
        let Inode { attr, content, .. } = &mut *i;
        let Content::File(f) = content else {
            return Err(NfsStat3::Inval);
        };
        if length > 0 && !self.config.null {
            let blk = BLOCK_SIZE as u64;
            let (first, last) = (offset / blk, (end - 1) / blk);
            // Each missing block's zeros.
            let missing: Vec<(u64, Payload)> = (first..=last)
                .filter(|k| !f.blocks.contains_key(k))
                .map(|k| {
                    let from = (k * blk).max(offset);
                    let to = ((k + 1) * blk).min(end);
                    (
                        from,
                        Payload::from_parts([self.zeros.get((to - from) as usize)]),
                    )
                })
                .collect();
            self.fill_all(f, missing)?;
        }
        let t = now();
        if f.size < end {
            f.size = end;
            attr.mtime = t;
        }
        attr.set_ctime(t);
        Ok(())
    }

    /// Clones `[src_off, src_off + count)` of the file `src` to `dst_off`
    /// in the file `dst` (NFSv4.2 CLONE): `dst` then reads the source's
    /// bytes there and grows to the range's end if it is shorter. Each
    /// 64 KiB block that the range covers whole at the same place in a
    /// block of both files is shared between them, not copied (a later
    /// write to either file copies it first; each file counts it in its
    /// space used), and a hole in the source becomes a hole; the rest is
    /// copied. NFS3ERR_INVAL when the range reaches past the end of the
    /// source; NFS3ERR_NOSPC when the capacity runs out (the blocks before
    /// are cloned by then). The caller checks that ranges within one file
    /// do not overlap.
    pub fn clone_range(
        &self,
        src: Ino,
        dst: Ino,
        cred: &Cred,
        src_off: u64,
        dst_off: u64,
        count: u64,
    ) -> SResult<()> {
        let end = dst_off.checked_add(count).ok_or(NfsStat3::Fbig)?;
        if end > MAX_FILE_SIZE {
            return Err(NfsStat3::Fbig);
        }
        drop(self.file_to_write(dst, cred)?);
        let src_size = self.file_to_read(src)?.size;
        if src_off.checked_add(count).is_none_or(|e| e > src_size) {
            return Err(NfsStat3::Inval);
        }
        let blk = BLOCK_SIZE as u64;
        let mut done = 0;
        while done < count && !self.config.null {
            let (s, d, left) = (src_off + done, dst_off + done, count - done);
            if s % blk == 0
                && d % blk == 0
                && left >= blk
                && self.share_block(src, s / blk, dst, d / blk)?
            {
                done += blk;
                continue;
            }
            // Up to the end of the destination's block.
            let n = left.min(blk - d % blk) as u32;
            // The read's slices of the source's blocks are written as they
            // are (a block they share with the destination is copied on
            // write, not changed under them).
            let (data, _) = self.read(src, cred, s, n)?;
            self.write_file_blocks(dst, d, &data)?;
            done += u64::from(n);
        }
        let t = now();
        let mut i = self.inode_write(dst)?;
        if let Content::File(f) = &mut i.content {
            f.size = f.size.max(end);
        }
        i.attr.mtime = t;
        i.attr.set_ctime(t);
        Ok(())
    }

    /// The file `ino`, if it is one.
    fn file_to_read(&self, ino: Ino) -> SResult<MappedRwLockReadGuard<'_, FileData>> {
        InodeRead::try_map(self.inode(ino)?, |i| match &i.content {
            Content::File(f) => Some(f),
            _ => None,
        })
        .map_err(|i| match i.content {
            Content::Dir(_) => NfsStat3::Isdir,
            _ => NfsStat3::Inval,
        })
    }

    /// Block `dk` of `dst` becomes block `sk` of `src`, shared (or a hole
    /// where `src` has one). False, with nothing changed, for a block
    /// smaller than `BLOCK_SIZE` (a small file's), which is copied instead.
    /// The source's block is taken with the source locked, then put in
    /// with the destination locked (never both at once, so two CLONEs
    /// the other way round cannot wait on each other); a WRITE to either
    /// file later copies the shared block first.
    fn share_block(&self, src: Ino, sk: u64, dst: Ino, dk: u64) -> SResult<bool> {
        let block = self.file_to_read(src)?.blocks.get(&sk).cloned();
        if matches!(&block, Some(FileBlock::Whole(b)) if b.capacity() < BLOCK_SIZE) {
            return Ok(false);
        }
        let add = block.as_ref().map_or(0, FileBlock::pinned) as u64;
        let capacity = self.config.capacity_bytes;
        let mut i = self.inode_write(dst)?;
        let Content::File(f) = &mut i.content else {
            return Err(NfsStat3::Inval);
        };
        let old = f.blocks.get(&dk).map_or(0, FileBlock::pinned) as u64;
        // The block it replaces is given back in the same step, so a full
        // store may still swap one block for another of the same size.
        self.used_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |u| {
                (u + add <= capacity.saturating_add(old)).then(|| u + add - old)
            })
            .map_err(|_| NfsStat3::Nospc)?;
        match block {
            Some(b) => f.blocks.insert(dk, b),
            None => f.blocks.remove(&dk),
        };
        f.used = f.used + add - old;
        Ok(true)
    }

    /// Where the next data (`data`) or hole (`!data`) at or after
    /// `offset` starts (NFSv4.2 SEEK, `lseek` SEEK_DATA and SEEK_HOLE), by
    /// 64 KiB block: a block the file holds memory for is data, one it
    /// does not is a hole, and the end of the file is a hole. `None`: no
    /// data at or after `offset`, or `offset` is at or past the end.
    pub fn seek(&self, ino: Ino, offset: u64, data: bool) -> SResult<Option<u64>> {
        let i = self.inode(ino)?;
        let Content::File(f) = &i.content else {
            return Err(match i.content {
                Content::Dir(_) => NfsStat3::Isdir,
                _ => NfsStat3::Inval,
            });
        };
        if offset >= f.size {
            return Ok(None);
        }
        let blk = BLOCK_SIZE as u64;
        let at = offset / blk;
        // A null export holds no blocks and reads zeros everywhere: data.
        let held = |k: u64| self.config.null || f.blocks.contains_key(&k);
        Ok(if data {
            if held(at) {
                Some(offset)
            } else {
                f.blocks
                    .range(at..)
                    .next()
                    .map(|(k, _)| k * blk)
                    .filter(|o| *o < f.size)
            }
        } else if !held(at) {
            Some(offset)
        } else {
            let mut k = at;
            while held(k) && k * blk < f.size {
                k += 1;
            }
            Some((k * blk).clamp(offset, f.size))
        })
    }

    // ---- file system -------------------------------------------------------

    /// WRITE data bytes (copied into file blocks, taken over without a
    /// copy) since the store was created.
    pub fn write_stats(&self) -> (u64, u64) {
        (
            self.write_copied.load(Ordering::Relaxed),
            self.write_adopted.load(Ordering::Relaxed),
        )
    }

    /// A null export's bytes since the store was created: (READ bytes
    /// answered with zeros, WRITE bytes discarded); zeros for any other.
    pub fn null_stats(&self) -> (u64, u64) {
        (
            self.null_read.load(Ordering::Relaxed),
            self.null_discarded.load(Ordering::Relaxed),
        )
    }

    /// True when `part` (of a READ's data) is a slice of the store's one
    /// block of zeros.
    pub fn is_zero_block(&self, part: &Bytes) -> bool {
        self.zeros.holds(part)
    }

    /// Bytes of file pages gathered into whole blocks since the store was
    /// created: pages that kept more than twice a whole block's memory
    /// alive (see `settle`).
    pub fn compacted_bytes(&self) -> u64 {
        self.write_compacted.load(Ordering::Relaxed)
    }

    /// (total bytes, free bytes, total inodes, free inodes).
    pub fn fsstat(&self) -> (u64, u64, u64, u64) {
        (
            self.config.capacity_bytes,
            self.config
                .capacity_bytes
                .saturating_sub(self.used_bytes.load(Ordering::Relaxed)),
            self.config.max_inodes,
            self.config.max_inodes.saturating_sub(self.inodes),
        )
    }
}

/// The attributes of `a` a client checks its cache with.
fn wcc_of(a: &Fattr3) -> WccAttr {
    WccAttr {
        size: a.size,
        mtime: a.mtime,
        ctime: a.ctime,
    }
}

fn parse_handle(fh: &[u8]) -> SResult<(u32, u64, u32, u32)> {
    if fh.len() != HANDLE_LEN || fh[..4] != HANDLE_MAGIC {
        return Err(NfsStat3::Badhandle);
    }
    let u32_at = |i: usize| u32::from_be_bytes(fh[i..i + 4].try_into().expect("4 bytes"));
    let fileid = u64::from_be_bytes(fh[8..16].try_into().expect("8 bytes"));
    Ok((u32_at(4), fileid, u32_at(16), u32_at(20)))
}

/// The fsid a handle claims, to route it to its export; `None` when it is
/// not one of ours.
pub fn handle_fsid(fh: &[u8]) -> Option<u32> {
    parse_handle(fh).ok().map(|(fsid, ..)| fsid)
}

/// Whether `c` may read (4) or write (2) a file's data: its owner may,
/// whatever the mode (as an open file keeps its access).
fn may_use(a: &Attr, c: &Cred, want: u32) -> bool {
    c.uid == a.uid || mode_allows(a, c, want)
}

fn mode_allows(a: &Attr, c: &Cred, want: u32) -> bool {
    if c.uid == 0 {
        // Root reads and writes anything; it executes only what has an x
        // bit somewhere (directories are always searchable).
        if want & 1 != 0 && a.kind != Ftype3::Dir && a.mode & 0o111 == 0 {
            return false;
        }
        return true;
    }
    let bits = if c.uid == a.uid {
        (a.mode >> 6) & 7
    } else if c.in_group(a.gid) {
        (a.mode >> 3) & 7
    } else {
        a.mode & 7
    };
    bits & want == want
}

#[cfg(test)]
mod concurrent_tests;
#[cfg(test)]
mod tests;
