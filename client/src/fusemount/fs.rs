//! The FUSE file system over a [`Client`].
//!
//! - Inode numbers: an object's FUSE inode number is its NFS `fileid`
//!   (the root's fileid and 1 swap places, so that the root is
//!   FUSE_ROOT_ID), which keeps `st_ino` and `d_ino` stable and equal for
//!   hard links. The inode table maps each number the kernel holds a
//!   reference to (`nlookup`) to its file handle and cached attributes;
//!   `forget` drops the reference and the entry with the last one.
//! - Attribute cache: attributes are kept for a time that starts at
//!   acregmin/acdirmin, doubles each time a revalidation finds them
//!   unchanged and is capped at acregmax/acdirmax; the same time is handed
//!   to the kernel for its attribute and name (dentry) caches. `open`
//!   always revalidates (close-to-open) and keeps the kernel's page cache
//!   only when size, mtime and ctime are unchanged. READDIRPLUS results
//!   prime a name cache that the next LOOKUPs use. `noac` turns all of this
//!   off and makes writes FILE_SYNC.
//! - Requests: every FUSE request is handed to a task on the runtime and
//!   answered from there, so slow calls never hold up other requests.
//! - Writes: each FUSE write is split into wsize UNSTABLE WRITEs, all in
//!   flight at once; their data and write verifiers are kept per file until
//!   a COMMIT (on flush/close, fsync, truncation, or when 64 MiB are
//!   outstanding) succeeds; pieces whose verifier differs from COMMIT's
//!   (the server restarted) are written again with FILE_SYNC.
//! - Reads: split into rsize READs with up to `io_depth` in flight.

use super::errno::client_errno;
use super::options::{CacheTimes, MountOptions};
use crate::{Client, ClientError};
use anyhow::{Context, Result};
use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request,
    SessionACL, TimeOrNow,
};
use nfsrdma_xdr::nfs3::{
    CreateHow3, DeviceData3, DirOpResOk, Fattr3, Ftype3, MknodData3, NfsFh3, NfsTime3, Sattr3,
    SetTime, SpecData3, StableHow, WccData, WriteVerf3,
};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::runtime::Handle;
use tokio::task::JoinSet;

/// Outstanding unstable data that triggers a COMMIT.
const COMMIT_AFTER: usize = 64 << 20;
/// Names primed from READDIRPLUS kept at most.
const MAX_PRIMED: usize = 200_000;
/// How long RMDIR waits for the releases of files removed while open
/// (see `hidden_files_released`).
const RELEASE_WAIT: Duration = Duration::from_secs(2);

type Res<T> = std::result::Result<T, i32>;

fn err(e: ClientError) -> i32 {
    tracing::debug!("NFS call failed: {e}");
    client_errno(&e)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct Node {
    fh: NfsFh3,
    nlookup: u64,
    attr: Fattr3,
    fetched: Instant,
    ttl: Duration,
}

struct Primed {
    fh: NfsFh3,
    attr: Fattr3,
    at: Instant,
}

/// One unstable WRITE whose data the server may still lose.
struct Unstable {
    offset: u64,
    data: Bytes,
    verf: WriteVerf3,
}

#[derive(Default)]
struct Dirty {
    pending: Vec<Unstable>,
    bytes: usize,
}

struct Shared {
    client: Client,
    cache: CacheTimes,
    root_fileid: u64,
    /// Set on creates when the credential is root: the caller's ids.
    set_owner: bool,
    sync_writes: bool,
    nodes: Mutex<HashMap<u64, Node>>,
    primed: Mutex<HashMap<(u64, Vec<u8>), Primed>>,
    dirty: Mutex<HashMap<u64, Arc<tokio::sync::Mutex<Dirty>>>>,
    dirs: Mutex<HashMap<u64, DirSlot>>,
    next_fh: AtomicU64,
    verf_seq: AtomicU64,
    /// Open files: inode -> opens not yet released.
    open: Mutex<HashMap<u64, u32>>,
    /// Open files whose name was removed: renamed to a hidden name in
    /// their directory, removed at the last release.
    silly: Mutex<HashMap<u64, (NfsFh3, Bytes)>>,
}

/// An open directory's listing, read at offset 0.
type DirSlot = Arc<Mutex<Option<Arc<Vec<Listed>>>>>;

#[derive(Clone)]
struct Listed {
    ino: u64,
    kind: FileType,
    name: Bytes,
}

/// The FUSE file system.
pub struct NfsFs {
    s: Arc<Shared>,
    rt: Handle,
}

fn kind_of(t: Ftype3) -> FileType {
    match t {
        Ftype3::Reg => FileType::RegularFile,
        Ftype3::Dir => FileType::Directory,
        Ftype3::Blk => FileType::BlockDevice,
        Ftype3::Chr => FileType::CharDevice,
        Ftype3::Lnk => FileType::Symlink,
        Ftype3::Sock => FileType::Socket,
        Ftype3::Fifo => FileType::NamedPipe,
    }
}

fn systime(t: NfsTime3) -> SystemTime {
    UNIX_EPOCH + Duration::new(u64::from(t.seconds), t.nseconds.min(999_999_999))
}

fn nfstime(t: SystemTime) -> NfsTime3 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    NfsTime3 {
        seconds: d.as_secs().min(u64::from(u32::MAX)) as u32,
        nseconds: d.subsec_nanos(),
    }
}

fn settime(t: Option<TimeOrNow>) -> SetTime {
    match t {
        None => SetTime::DontChange,
        Some(TimeOrNow::Now) => SetTime::ServerTime,
        Some(TimeOrNow::SpecificTime(t)) => SetTime::ClientTime(nfstime(t)),
    }
}

/// Linux's 32-bit device number encoding (as FUSE carries it).
fn encode_dev(major: u32, minor: u32) -> u32 {
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

fn decode_dev(rdev: u32) -> (u32, u32) {
    (
        (rdev & 0xfff00) >> 8,
        (rdev & 0xff) | ((rdev >> 12) & 0xfff00),
    )
}

fn same_data(a: &Fattr3, b: &Fattr3) -> bool {
    a.size == b.size && a.mtime == b.mtime && a.ctime == b.ctime
}

impl Shared {
    fn ino_of(&self, fileid: u64) -> u64 {
        if fileid == self.root_fileid {
            1
        } else if fileid == 1 || fileid == 0 {
            // 1 is the root's; 0 is not a valid inode number.
            if self.root_fileid == 0 {
                u64::MAX
            } else {
                self.root_fileid
            }
        } else {
            fileid
        }
    }

    fn attr(&self, ino: u64, a: &Fattr3) -> FileAttr {
        FileAttr {
            ino: INodeNo(ino),
            size: a.size,
            blocks: a.used.div_ceil(512),
            atime: systime(a.atime),
            mtime: systime(a.mtime),
            ctime: systime(a.ctime),
            crtime: systime(a.ctime),
            kind: kind_of(a.type_),
            perm: (a.mode & 0o7777) as u16,
            nlink: a.nlink,
            uid: a.uid,
            gid: a.gid,
            rdev: encode_dev(a.rdev.specdata1, a.rdev.specdata2),
            blksize: self.client.wsize().max(4096),
            flags: 0,
        }
    }

    fn bounds(&self, t: Ftype3) -> (Duration, Duration) {
        if !self.cache.enabled {
            return (Duration::ZERO, Duration::ZERO);
        }
        if t == Ftype3::Dir {
            (self.cache.acdirmin, self.cache.acdirmax)
        } else {
            (self.cache.acregmin, self.cache.acregmax)
        }
    }

    /// Records `fh` and its attributes; `lookup`: the kernel now holds one
    /// more reference. Returns the inode number and the cache time.
    fn remember(&self, fh: NfsFh3, attr: Fattr3, lookup: bool) -> (u64, Duration) {
        let ino = self.ino_of(attr.fileid);
        let (min, max) = self.bounds(attr.type_);
        let mut nodes = lock(&self.nodes);
        let n = nodes.entry(ino).or_insert_with(|| Node {
            fh: fh.clone(),
            nlookup: 0,
            attr: attr.clone(),
            fetched: Instant::now(),
            ttl: min,
        });
        if n.fh != fh {
            // The number was reused for another object.
            n.fh = fh;
            n.ttl = min;
        } else if same_data(&n.attr, &attr) {
            n.ttl = (n.ttl * 2).clamp(min, max);
        } else {
            n.ttl = min;
        }
        n.attr = attr;
        n.fetched = Instant::now();
        if lookup {
            n.nlookup += 1;
        }
        (ino, n.ttl)
    }

    /// Stores attributes that came with a reply for a known inode.
    fn update(&self, ino: u64, attr: Option<&Fattr3>) {
        let Some(attr) = attr else {
            self.invalidate(ino);
            return;
        };
        let (min, max) = self.bounds(attr.type_);
        if let Some(n) = lock(&self.nodes).get_mut(&ino) {
            n.ttl = if same_data(&n.attr, attr) {
                n.ttl.clamp(min, max)
            } else {
                min
            };
            n.attr = attr.clone();
            n.fetched = Instant::now();
        }
    }

    fn update_wcc(&self, ino: u64, wcc: &WccData) {
        self.update(ino, wcc.after.as_ref());
    }

    fn invalidate(&self, ino: u64) {
        if let Some(n) = lock(&self.nodes).get_mut(&ino) {
            n.ttl = Duration::ZERO;
        }
    }

    fn fh(&self, ino: u64) -> Res<NfsFh3> {
        if ino == 1 {
            return Ok(self.client.root().clone());
        }
        lock(&self.nodes)
            .get(&ino)
            .map(|n| n.fh.clone())
            .ok_or(libc::ESTALE)
    }

    /// Cached attributes when still valid, else GETATTR.
    async fn getattr(&self, ino: u64, force: bool) -> Res<(Fattr3, Duration)> {
        if !force {
            if let Some(n) = lock(&self.nodes).get(&ino) {
                let age = n.fetched.elapsed();
                if age < n.ttl {
                    return Ok((n.attr.clone(), n.ttl - age));
                }
            }
        }
        let fh = self.fh(ino)?;
        let a = self.client.getattr(&fh).await.map_err(err)?;
        let (_, ttl) = self.remember(fh, a.clone(), false);
        Ok((a, ttl))
    }

    async fn lookup(&self, parent: u64, name: &[u8]) -> Res<(u64, Fattr3, Duration)> {
        if self.cache.enabled {
            let key = (parent, name.to_vec());
            let hit = lock(&self.primed).remove(&key);
            if let Some(p) = hit {
                if p.at.elapsed() < self.cache.acdirmin.min(self.cache.acregmin) {
                    let (ino, ttl) = self.remember(p.fh, p.attr.clone(), true);
                    return Ok((ino, p.attr, ttl));
                }
            }
        }
        let dir = self.fh(parent)?;
        let ok = self.client.lookup(&dir, name).await.map_err(err)?;
        self.update(parent, ok.dir_attributes.as_ref());
        let attr = match ok.obj_attributes {
            Some(a) => a,
            None => self.client.getattr(&ok.object).await.map_err(err)?,
        };
        let (ino, ttl) = self.remember(ok.object, attr.clone(), true);
        Ok((ino, attr, ttl))
    }

    fn forget(&self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        let mut nodes = lock(&self.nodes);
        if let Some(node) = nodes.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 && !lock(&self.dirty).contains_key(&ino) {
                nodes.remove(&ino);
            }
        }
    }

    /// The result of CREATE, MKDIR, SYMLINK, MKNOD as a new reference.
    async fn created(
        &self,
        parent: u64,
        dir: &NfsFh3,
        name: &[u8],
        ok: DirOpResOk,
    ) -> Res<(u64, Fattr3, Duration)> {
        self.update_wcc(parent, &ok.dir_wcc);
        lock(&self.primed).remove(&(parent, name.to_vec()));
        let fh = match ok.obj {
            Some(fh) => fh,
            None => self.client.lookup(dir, name).await.map_err(err)?.object,
        };
        let attr = match ok.obj_attributes {
            Some(a) => a,
            None => self.client.getattr(&fh).await.map_err(err)?,
        };
        let (ino, ttl) = self.remember(fh, attr.clone(), true);
        Ok((ino, attr, ttl))
    }

    fn opened(&self, ino: u64) {
        *lock(&self.open).entry(ino).or_insert(0) += 1;
    }

    /// A release: the last one removes a hidden name left by an unlink.
    async fn released(&self, ino: u64) {
        let last = {
            let mut open = lock(&self.open);
            match open.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    open.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let hidden = lock(&self.silly).get(&ino).cloned();
        if let Some((dir, name)) = hidden {
            if let Err(e) = self.client.remove(&dir, &name).await {
                tracing::warn!("removing {}: {e}", String::from_utf8_lossy(&name));
            }
            // Forgotten only once the name is gone: until then an RMDIR of
            // its directory that finds it not empty waits for it.
            lock(&self.silly).remove(&ino);
        }
    }

    /// After RMDIR of `name` in `dir` failed with NOTEMPTY: when the
    /// directory holds files that were removed while open here (renamed
    /// to hidden names, removed at their last release), waits up to
    /// [`RELEASE_WAIT`] for those releases and their removals; returns
    /// whether RMDIR is worth trying again (the directory is there and
    /// nothing of ours is pending in it any more: a hidden name may also
    /// have gone between the RMDIR and this check). FUSE sends a release
    /// after close() has returned, so `rm dir/f; rmdir dir` right after
    /// closing `f` would otherwise fail.
    async fn hidden_files_released(&self, dir: &NfsFh3, name: &[u8]) -> bool {
        let Ok(ok) = self.client.lookup(dir, name).await else {
            return false;
        };
        let child = ok.object;
        let pending = || lock(&self.silly).values().any(|(d, _)| *d == child);
        let until = tokio::time::Instant::now() + RELEASE_WAIT;
        while pending() {
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Before `name` in `dir` is removed or replaced: when it is a file
    /// open here, renames it to a hidden name instead (removed at its last
    /// release) so that the open file keeps working, as POSIX wants.
    /// Returns whether it did.
    async fn silly_rename(&self, parent: u64, dir: &NfsFh3, name: &[u8]) -> Res<bool> {
        if lock(&self.open).is_empty() {
            return Ok(false);
        }
        let Ok(ok) = self.client.lookup(dir, name).await else {
            return Ok(false);
        };
        let Some(attr) = ok.obj_attributes else {
            return Ok(false);
        };
        let ino = self.ino_of(attr.fileid);
        if attr.type_ == Ftype3::Dir || !lock(&self.open).contains_key(&ino) {
            return Ok(false);
        }
        if lock(&self.silly).contains_key(&ino) {
            // Already hidden once: this is another link; remove it.
            return Ok(false);
        }
        let n = self.verf_seq.fetch_add(1, Ordering::Relaxed);
        let hidden = Bytes::from(format!(".nfsrdma{:016x}{:04x}", attr.fileid, n & 0xffff));
        let r = self
            .client
            .rename(dir, name, dir, &hidden)
            .await
            .map_err(err)?;
        self.update_wcc(parent, &r.fromdir_wcc);
        // The last release may have come while renaming: it found no
        // hidden name to remove then, so remove it here. Recorded under
        // the open-files lock, which `released` takes to decide it was the
        // last, and recorded either way: until the hidden name is gone, an
        // RMDIR of the directory that finds it not empty waits for it.
        let still_open = {
            let open = lock(&self.open);
            lock(&self.silly).insert(ino, (dir.clone(), hidden.clone()));
            open.contains_key(&ino)
        };
        if !still_open {
            let r = self.client.remove(dir, &hidden).await;
            lock(&self.silly).remove(&ino);
            let wcc = r.map_err(err)?;
            self.update_wcc(parent, &wcc);
        }
        Ok(true)
    }

    fn owner(&self, req_uid: u32, req_gid: u32) -> (Option<u32>, Option<u32>) {
        if self.set_owner {
            (Some(req_uid), Some(req_gid))
        } else {
            (None, None)
        }
    }

    fn dirty_of(&self, ino: u64) -> Arc<tokio::sync::Mutex<Dirty>> {
        lock(&self.dirty).entry(ino).or_default().clone()
    }

    /// Writes `data` at `offset`: wsize pieces, all in flight at once.
    async fn write(&self, ino: u64, offset: u64, data: Bytes) -> Res<()> {
        let fh = self.fh(ino)?;
        let wsize = self.client.wsize() as usize;
        let stable = if self.sync_writes {
            StableHow::FileSync
        } else {
            StableHow::Unstable
        };
        let mut set = JoinSet::new();
        let mut at = 0usize;
        while at < data.len() || (data.is_empty() && at == 0) {
            let end = (at + wsize).min(data.len());
            let piece = data.slice(at..end);
            let c = self.client.clone();
            let fh = fh.clone();
            let off = offset + at as u64;
            set.spawn(async move {
                let r = write_fully(&c, &fh, off, piece.clone(), stable).await;
                r.map(|(how, verf, after)| (off, piece, how, verf, after))
            });
            if data.is_empty() {
                break;
            }
            at = end;
        }
        let mut done = Vec::new();
        let mut first_err = None;
        while let Some(j) = set.join_next().await {
            match j {
                Ok(Ok(v)) => done.push(v),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(ClientError::Protocol("write task failed".into()));
                }
            }
        }
        let mut newest: Option<Fattr3> = None;
        let mut unstable = Vec::new();
        for (off, piece, how, verf, after) in done {
            if let Some(a) = after {
                if newest.as_ref().is_none_or(|n| a.size >= n.size) {
                    newest = Some(a);
                }
            }
            if how != StableHow::FileSync {
                unstable.push(Unstable {
                    offset: off,
                    data: piece,
                    verf,
                });
            }
        }
        if !unstable.is_empty() {
            let d = self.dirty_of(ino);
            let mut g = d.lock().await;
            for u in unstable {
                g.bytes += u.data.len();
                g.pending.push(u);
            }
            let over = g.bytes > COMMIT_AFTER;
            drop(g);
            if over && first_err.is_none() {
                self.commit(ino).await?;
            }
        }
        if let Some(a) = newest {
            self.update(ino, Some(&a));
        }
        match first_err {
            Some(e) => Err(err(e)),
            None => Ok(()),
        }
    }

    /// COMMIT of everything written unstably to `ino`; pieces whose
    /// verifier changed are written again, FILE_SYNC.
    async fn commit(&self, ino: u64) -> Res<()> {
        let Some(d) = lock(&self.dirty).get(&ino).cloned() else {
            return Ok(());
        };
        let mut g = d.lock().await;
        if g.pending.is_empty() {
            return Ok(());
        }
        let fh = self.fh(ino)?;
        let pending = std::mem::take(&mut g.pending);
        g.bytes = 0;
        let verf = match self.client.commit(&fh, 0, 0).await {
            Ok(r) => {
                self.update_wcc(ino, &r.file_wcc);
                r.verf
            }
            Err(e) => {
                g.bytes = pending.iter().map(|u| u.data.len()).sum();
                g.pending = pending;
                return Err(err(e));
            }
        };
        let mut rest = pending.into_iter();
        while let Some(u) = rest.next() {
            if u.verf == verf {
                continue;
            }
            tracing::info!(
                offset = u.offset,
                len = u.data.len(),
                "write verifier changed (server restarted?); writing again"
            );
            if let Err(e) = write_fully(
                &self.client,
                &fh,
                u.offset,
                u.data.clone(),
                StableHow::FileSync,
            )
            .await
            {
                // Keep what is not yet safe for the next attempt.
                g.pending.push(u);
                g.pending.extend(rest);
                g.bytes = g.pending.iter().map(|u| u.data.len()).sum();
                return Err(err(e));
            }
        }
        let empty = g.pending.is_empty();
        drop(g);
        if empty {
            let mut map = lock(&self.dirty);
            if map.get(&ino).is_some_and(|x| Arc::ptr_eq(x, &d)) && Arc::strong_count(&d) <= 2 {
                map.remove(&ino);
            }
        }
        Ok(())
    }

    /// Commits every file (before unmounting).
    async fn commit_all(&self) {
        let inos: Vec<u64> = lock(&self.dirty).keys().copied().collect();
        for ino in inos {
            if let Err(e) = self.commit(ino).await {
                tracing::warn!(ino, errno = e, "COMMIT before unmount failed");
            }
        }
    }

    async fn listing(&self, ino: u64) -> Res<Vec<Listed>> {
        let dir = self.fh(ino)?;
        let entries = self.client.readdir_all(&dir).await.map_err(err)?;
        let mut out = Vec::with_capacity(entries.len() + 2);
        out.push(Listed {
            ino,
            kind: FileType::Directory,
            name: Bytes::from_static(b"."),
        });
        out.push(Listed {
            ino,
            kind: FileType::Directory,
            name: Bytes::from_static(b".."),
        });
        let now = Instant::now();
        let mut primed = lock(&self.primed);
        if primed.len() + entries.len() > MAX_PRIMED {
            primed.clear();
        }
        for e in entries {
            let kind = e
                .attr
                .as_ref()
                .map(|a| kind_of(a.type_))
                .unwrap_or(FileType::RegularFile);
            if let (true, Some(a), Some(h)) = (self.cache.enabled, &e.attr, &e.handle) {
                primed.insert(
                    (ino, e.name.to_vec()),
                    Primed {
                        fh: h.clone(),
                        attr: a.clone(),
                        at: now,
                    },
                );
            }
            out.push(Listed {
                ino: self.ino_of(e.fileid),
                kind,
                name: e.name,
            });
        }
        Ok(out)
    }
}

/// WRITE of all of `data` (continuing after short writes); the weakest
/// stability, the last verifier and the newest attributes.
async fn write_fully(
    c: &Client,
    fh: &NfsFh3,
    offset: u64,
    data: Bytes,
    stable: StableHow,
) -> std::result::Result<(StableHow, WriteVerf3, Option<Fattr3>), ClientError> {
    let mut done = 0usize;
    let mut weakest = StableHow::FileSync;
    loop {
        let r = c
            .write(fh, offset + done as u64, data.slice(done..), stable)
            .await?;
        if (r.committed as u32) < (weakest as u32) {
            weakest = r.committed;
        }
        done += r.count as usize;
        if done >= data.len() {
            return Ok((weakest, r.verf, r.file_wcc.after));
        }
        if r.count == 0 {
            return Err(ClientError::Protocol("WRITE made no progress".into()));
        }
    }
}

impl NfsFs {
    fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f(self.s.clone()));
    }

    fn exclusive_verf(&self) -> [u8; 8] {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let n = self.s.verf_seq.fetch_add(1, Ordering::Relaxed);
        (t ^ (u64::from(std::process::id()) << 40) ^ n.rotate_left(17)).to_be_bytes()
    }
}

fn reply_entry(s: &Shared, reply: ReplyEntry, r: Res<(u64, Fattr3, Duration)>) {
    match r {
        Ok((ino, a, ttl)) => reply.entry(&ttl, &s.attr(ino, &a), Generation(0)),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Res<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(Errno::from_i32(e)),
    }
}

fn name_bytes(name: &OsStr) -> Bytes {
    Bytes::copy_from_slice(name.as_bytes())
}

impl Filesystem for NfsFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        use fuser::InitFlags;
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        for f in [
            InitFlags::FUSE_ASYNC_READ,
            InitFlags::FUSE_BIG_WRITES,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_AUTO_INVAL_DATA,
            InitFlags::FUSE_MAX_PAGES,
        ] {
            let _ = config.add_capabilities(f);
        }
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let name = name_bytes(name);
        self.spawn(move |s| async move {
            let r = s.lookup(parent.0, &name).await;
            reply_entry(&s, reply, r);
        });
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.s.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        // The kernel asks only when its copy (kept as long as ours) has
        // expired or was invalidated (unlink, write ...): ask the server.
        self.spawn(move |s| async move {
            match s.getattr(ino.0, true).await {
                Ok((a, ttl)) => reply.attr(&ttl, &s.attr(ino.0, &a)),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let sattr = Sattr3 {
            mode: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: settime(atime),
            mtime: settime(mtime),
        };
        self.spawn(move |s| async move {
            let r: Res<(Fattr3, Duration)> = async {
                if size.is_some() {
                    // Uncommitted data must not outlive a truncation.
                    s.commit(ino.0).await?;
                }
                let fh = s.fh(ino.0)?;
                let wcc = s.client.setattr(&fh, &sattr, None).await.map_err(err)?;
                let a = match wcc.after {
                    Some(a) => a,
                    None => s.client.getattr(&fh).await.map_err(err)?,
                };
                let (_, ttl) = s.remember(fh, a.clone(), false);
                Ok((a, ttl))
            }
            .await;
            match r {
                Ok((a, ttl)) => reply.attr(&ttl, &s.attr(ino.0, &a)),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        self.spawn(move |s| async move {
            let r = async {
                let fh = s.fh(ino.0)?;
                s.client.readlink(&fh).await.map_err(err)
            }
            .await;
            match r {
                Ok(ok) => reply.data(ok.data.as_bytes()),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(name);
        let (uid, gid) = self.s.owner(req.uid(), req.gid());
        self.spawn(move |s| async move {
            let r = async {
                let dir = s.fh(parent.0)?;
                let attrs = Sattr3 {
                    mode: Some(mode & !umask & 0o7777),
                    uid,
                    gid,
                    ..Sattr3::default()
                };
                let (major, minor) = decode_dev(rdev);
                let spec = SpecData3 {
                    specdata1: major,
                    specdata2: minor,
                };
                let ok = match mode & libc::S_IFMT {
                    libc::S_IFREG | 0 => {
                        s.client
                            .create(&dir, &name, CreateHow3::Guarded(attrs))
                            .await
                    }
                    libc::S_IFCHR => {
                        s.client
                            .mknod(
                                &dir,
                                &name,
                                MknodData3::Chr(DeviceData3 {
                                    dev_attributes: attrs,
                                    spec,
                                }),
                            )
                            .await
                    }
                    libc::S_IFBLK => {
                        s.client
                            .mknod(
                                &dir,
                                &name,
                                MknodData3::Blk(DeviceData3 {
                                    dev_attributes: attrs,
                                    spec,
                                }),
                            )
                            .await
                    }
                    libc::S_IFIFO => s.client.mknod(&dir, &name, MknodData3::Fifo(attrs)).await,
                    libc::S_IFSOCK => s.client.mknod(&dir, &name, MknodData3::Sock(attrs)).await,
                    _ => return Err(libc::EINVAL),
                }
                .map_err(err)?;
                s.created(parent.0, &dir, &name, ok).await
            }
            .await;
            reply_entry(&s, reply, r);
        });
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(name);
        let (uid, gid) = self.s.owner(req.uid(), req.gid());
        self.spawn(move |s| async move {
            let r = async {
                let dir = s.fh(parent.0)?;
                let attrs = Sattr3 {
                    mode: Some(mode & !umask & 0o7777),
                    uid,
                    gid,
                    ..Sattr3::default()
                };
                let ok = s.client.mkdir(&dir, &name, &attrs).await.map_err(err)?;
                s.created(parent.0, &dir, &name, ok).await
            }
            .await;
            reply_entry(&s, reply, r);
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        self.spawn(move |s| async move {
            let r = async {
                let dir = s.fh(parent.0)?;
                lock(&s.primed).remove(&(parent.0, name.to_vec()));
                if s.silly_rename(parent.0, &dir, &name).await? {
                    return Ok(());
                }
                let wcc = s.client.remove(&dir, &name).await.map_err(err)?;
                s.update_wcc(parent.0, &wcc);
                Ok(())
            }
            .await;
            reply_empty(reply, r);
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let name = name_bytes(name);
        self.spawn(move |s| async move {
            let r = async {
                let dir = s.fh(parent.0)?;
                lock(&s.primed).remove(&(parent.0, name.to_vec()));
                let wcc = match s.client.rmdir(&dir, &name).await {
                    Err(ClientError::Nfs(_, nfsrdma_xdr::nfs3::NfsStat3::Notempty))
                        if s.hidden_files_released(&dir, &name).await =>
                    {
                        s.client.rmdir(&dir, &name).await
                    }
                    r => r,
                }
                .map_err(err)?;
                s.update_wcc(parent.0, &wcc);
                Ok(())
            }
            .await;
            reply_empty(reply, r);
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(link_name);
        let target = Bytes::copy_from_slice(target.as_os_str().as_bytes());
        let (uid, gid) = self.s.owner(req.uid(), req.gid());
        self.spawn(move |s| async move {
            let r = async {
                let dir = s.fh(parent.0)?;
                let attrs = Sattr3 {
                    mode: Some(0o777),
                    uid,
                    gid,
                    ..Sattr3::default()
                };
                let ok = s
                    .client
                    .symlink(&dir, &name, &target, &attrs)
                    .await
                    .map_err(err)?;
                s.created(parent.0, &dir, &name, ok).await
            }
            .await;
            reply_entry(&s, reply, r);
        });
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let name = name_bytes(name);
        let newname = name_bytes(newname);
        self.spawn(move |s| async move {
            let r = async {
                if flags.contains(RenameFlags::RENAME_EXCHANGE)
                    || flags.contains(RenameFlags::RENAME_WHITEOUT)
                {
                    return Err(libc::EINVAL);
                }
                let from = s.fh(parent.0)?;
                let to = s.fh(newparent.0)?;
                if flags.contains(RenameFlags::RENAME_NOREPLACE) {
                    // NFSv3 has no such rename; check first (not atomic).
                    match s.client.lookup(&to, &newname).await {
                        Ok(_) => return Err(libc::EEXIST),
                        Err(ClientError::Nfs(_, nfsrdma_xdr::nfs3::NfsStat3::Noent)) => {}
                        Err(e) => return Err(err(e)),
                    }
                }
                {
                    let mut p = lock(&s.primed);
                    p.remove(&(parent.0, name.to_vec()));
                    p.remove(&(newparent.0, newname.to_vec()));
                }
                s.silly_rename(newparent.0, &to, &newname).await?;
                let r = s
                    .client
                    .rename(&from, &name, &to, &newname)
                    .await
                    .map_err(err)?;
                s.update_wcc(parent.0, &r.fromdir_wcc);
                s.update_wcc(newparent.0, &r.todir_wcc);
                Ok(())
            }
            .await;
            reply_empty(reply, r);
        });
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let name = name_bytes(newname);
        self.spawn(move |s| async move {
            let r = async {
                let fh = s.fh(ino.0)?;
                let dir = s.fh(newparent.0)?;
                let ok = s.client.link(&fh, &dir, &name).await.map_err(err)?;
                s.update_wcc(newparent.0, &ok.linkdir_wcc);
                let attr = match ok.file_attributes {
                    Some(a) => a,
                    None => s.client.getattr(&fh).await.map_err(err)?,
                };
                let (ino, ttl) = s.remember(fh, attr.clone(), true);
                Ok((ino, attr, ttl))
            }
            .await;
            reply_entry(&s, reply, r);
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.s.next_fh.fetch_add(1, Ordering::Relaxed);
        self.spawn(move |s| async move {
            // Close-to-open: always revalidate; keep the kernel's cached
            // pages only when the file did not change.
            let before = lock(&s.nodes).get(&ino.0).map(|n| n.attr.clone());
            match s.getattr(ino.0, true).await {
                Ok((a, _)) => {
                    let keep = s.cache.enabled && before.is_some_and(|b| same_data(&b, &a));
                    let flags = if keep {
                        FopenFlags::FOPEN_KEEP_CACHE
                    } else {
                        FopenFlags::empty()
                    };
                    s.opened(ino.0);
                    reply.opened(FileHandle(fh), flags);
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(move |s| async move {
            let r = async {
                let fh = s.fh(ino.0)?;
                let (data, _eof) = s
                    .client
                    .read_range(&fh, offset, u64::from(size))
                    .await
                    .map_err(err)?;
                Ok(data)
            }
            .await;
            match r {
                Ok(d) if d.parts().len() == 1 => reply.data(&d.parts()[0]),
                Ok(d) => reply.data(&d.to_contiguous()),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let data = Bytes::copy_from_slice(data);
        self.spawn(move |s| async move {
            let n = data.len() as u32;
            match s.write(ino.0, offset, data).await {
                Ok(()) => reply.written(n),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |s| async move {
            let r = s.commit(ino.0).await;
            reply_empty(reply, r);
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |s| async move {
            let r = s.commit(ino.0).await;
            s.released(ino.0).await;
            reply_empty(reply, r);
        });
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |s| async move {
            let r = s.commit(ino.0).await;
            reply_empty(reply, r);
        });
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.s.next_fh.fetch_add(1, Ordering::Relaxed);
        lock(&self.s.dirs).insert(fh, Arc::new(Mutex::new(None)));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let slot = lock(&self.s.dirs).get(&fh.0).cloned();
        self.spawn(move |s| async move {
            let Some(slot) = slot else {
                reply.error(Errno::EBADF);
                return;
            };
            let cached = lock(&slot).clone();
            let list = match cached {
                Some(l) if offset != 0 => l,
                _ => match s.listing(ino.0).await {
                    Ok(l) => {
                        let l = Arc::new(l);
                        *lock(&slot) = Some(l.clone());
                        l
                    }
                    Err(e) => {
                        reply.error(Errno::from_i32(e));
                        return;
                    }
                },
            };
            for (i, e) in list.iter().enumerate().skip(offset as usize) {
                if reply.add(
                    INodeNo(e.ino),
                    i as u64 + 1,
                    e.kind,
                    OsStr::from_bytes(&e.name),
                ) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        lock(&self.s.dirs).remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Directory operations are synchronous in NFSv3.
        reply.ok();
    }

    fn statfs(&self, _req: &Request, ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(move |s| async move {
            let r = async {
                let fh = s.fh(ino.0).unwrap_or_else(|_| s.client.root().clone());
                s.client.fsstat(&fh).await.map_err(err)
            }
            .await;
            match r {
                Ok(st) => {
                    let bs = 4096u64;
                    reply.statfs(
                        st.tbytes / bs,
                        st.fbytes / bs,
                        st.abytes / bs,
                        st.tfiles,
                        st.ffiles,
                        bs as u32,
                        255,
                        bs as u32,
                    )
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // The kernel checks permissions (default_permissions).
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let name = name_bytes(name);
        let (uid, gid) = self.s.owner(req.uid(), req.gid());
        let fh = self.s.next_fh.fetch_add(1, Ordering::Relaxed);
        let verf = self.exclusive_verf();
        self.spawn(move |s| async move {
            let r = async {
                let dir = s.fh(parent.0)?;
                let attrs = Sattr3 {
                    mode: Some(mode & !umask & 0o7777),
                    uid,
                    gid,
                    ..Sattr3::default()
                };
                if flags & libc::O_EXCL != 0 {
                    let ok = s
                        .client
                        .create(&dir, &name, CreateHow3::Exclusive(verf))
                        .await
                        .map_err(err)?;
                    let (ino, _, _) = s.created(parent.0, &dir, &name, ok).await?;
                    // EXCLUSIVE keeps the verifier in the times: set the
                    // real attributes now.
                    let fh = s.fh(ino)?;
                    let set = Sattr3 {
                        atime: SetTime::ServerTime,
                        mtime: SetTime::ServerTime,
                        ..attrs
                    };
                    let wcc = s.client.setattr(&fh, &set, None).await.map_err(err)?;
                    let a = match wcc.after {
                        Some(a) => a,
                        None => s.client.getattr(&fh).await.map_err(err)?,
                    };
                    let (ino, ttl) = s.remember(fh, a.clone(), false);
                    Ok((ino, a, ttl))
                } else {
                    let ok = s
                        .client
                        .create(&dir, &name, CreateHow3::Unchecked(attrs))
                        .await
                        .map_err(err)?;
                    s.created(parent.0, &dir, &name, ok).await
                }
            }
            .await;
            match r {
                Ok((ino, a, ttl)) => {
                    s.opened(ino);
                    reply.created(
                        &ttl,
                        &s.attr(ino, &a),
                        Generation(0),
                        FileHandle(fh),
                        FopenFlags::empty(),
                    )
                }
                Err(e) => reply.error(Errno::from_i32(e)),
            }
        });
    }
}

/// Mounts `client` on `mountpoint` and serves until unmounted (by
/// `umount`, or by SIGTERM/SIGINT, which write back and unmount).
pub async fn serve(
    client: Client,
    opts: &MountOptions,
    mountpoint: &Path,
    fsname: &str,
) -> Result<()> {
    let root_attr = client
        .getattr(client.root())
        .await
        .context("GETATTR of the export root")?;
    let set_owner = matches!(&client.options().auth, crate::Auth::Sys(a) if a.uid == 0);
    let shared = Arc::new(Shared {
        root_fileid: root_attr.fileid,
        client,
        cache: opts.cache,
        set_owner,
        sync_writes: !opts.cache.enabled,
        nodes: Mutex::new(HashMap::new()),
        primed: Mutex::new(HashMap::new()),
        dirty: Mutex::new(HashMap::new()),
        dirs: Mutex::new(HashMap::new()),
        next_fh: AtomicU64::new(1),
        verf_seq: AtomicU64::new(0),
        open: Mutex::new(HashMap::new()),
        silly: Mutex::new(HashMap::new()),
    });
    let fs = NfsFs {
        s: shared.clone(),
        rt: Handle::current(),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        MountOption::FSName(fsname.to_string()),
        MountOption::Subtype("nfsrdma".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        if opts.ro {
            MountOption::RO
        } else {
            MountOption::RW
        },
    ];
    config.acl = SessionACL::All;
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = true;
    let mp = mountpoint.to_path_buf();
    let mut session = tokio::task::spawn_blocking(move || fuser::Session::new(fs, &mp, &config))
        .await
        .context("mount task failed")?
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    if std::env::var_os(super::DAEMON_ENV).is_some() {
        // Mounted: the waiting parent goes away and its pipe with it.
        if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
            let _ = nix::unistd::dup2_stderr(&null);
        }
    }
    let mut unmounter = session.unmount_callable();
    let (tx, mut done) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fuse-session".into())
        .spawn(move || {
            let _ = tx.send(session.run());
        })
        .context("cannot start the FUSE session thread")?;
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("SIGHUP handler")?;
    let finished = tokio::select! {
        r = &mut done => Some(r),
        _ = term.recv() => None,
        _ = int.recv() => None,
        _ = hup.recv() => None,
    };
    let result = match finished {
        Some(r) => {
            // Unmounted from outside.
            shared.commit_all().await;
            match r {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(anyhow::Error::from(e).context("FUSE session failed")),
                Err(_) => Err(anyhow::anyhow!("FUSE session thread failed")),
            }
        }
        None => {
            tracing::info!(
                "signal: writing back and unmounting {}",
                mountpoint.display()
            );
            shared.commit_all().await;
            let mp = mountpoint.to_path_buf();
            let r = tokio::task::spawn_blocking(move || unmounter.unmount()).await;
            if !matches!(r, Ok(Ok(()))) {
                tracing::warn!("{} is busy; detaching it", mp.display());
                let _ = nix::mount::umount2(&mp, nix::mount::MntFlags::MNT_DETACH);
            }
            match tokio::time::timeout(Duration::from_secs(10), done).await {
                Ok(Ok(Ok(()))) | Err(_) => Ok(()),
                Ok(Ok(Err(e))) => Err(anyhow::Error::from(e).context("FUSE session failed")),
                Ok(Err(_)) => Err(anyhow::anyhow!("FUSE session thread failed")),
            }
        }
    };
    shared.commit_all().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_numbers_round_trip() {
        for (ma, mi) in [(0, 0), (1, 3), (8, 1), (4095, 255), (259, 70000)] {
            assert_eq!(decode_dev(encode_dev(ma, mi)), (ma, mi & 0xfffff));
        }
        // /dev/null: 1:3 encodes as 0x103.
        assert_eq!(encode_dev(1, 3), 0x103);
    }

    #[test]
    fn times_convert() {
        let t = NfsTime3 {
            seconds: 1_700_000_000,
            nseconds: 123,
        };
        assert_eq!(nfstime(systime(t)), t);
    }
}
