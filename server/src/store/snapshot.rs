//! Saving a store to a file and loading it back, for planned restarts
//! (`nfsrdmad --state FILE`): every inode with its generation, so that file
//! handles stay valid, the directory cookies, and the file data (holes stay
//! holes).
//!
//! Format (big-endian): the magic `NRDSNAP1`, the fsid and the handle
//! secret, then each inode slot in order. Written by this module only; a
//! file it did not write, or a damaged one, is refused with an error.

use super::*;
use std::io::{self, Read, Write};

const MAGIC: &[u8; 8] = b"NRDSNAP1";

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading failed.
    #[error("reading the snapshot: {0}")]
    Io(#[from] io::Error),
    /// The bytes are not a snapshot this version wrote.
    #[error("not a valid store snapshot: {0}")]
    Format(&'static str),
    /// The snapshot is of another file system.
    #[error("snapshot of fsid {found}, expected fsid {expected}")]
    Fsid {
        /// fsid in the snapshot.
        found: u64,
        /// fsid configured.
        expected: u64,
    },
    /// The store's capacity is too small for the snapshot's data.
    #[error("the snapshot's data does not fit the configured capacity")]
    Capacity,
}

struct W<'a, T: Write>(&'a mut T);

impl<T: Write> W<'_, T> {
    fn u8(&mut self, v: u8) -> io::Result<()> {
        self.0.write_all(&[v])
    }
    fn u32(&mut self, v: u32) -> io::Result<()> {
        self.0.write_all(&v.to_be_bytes())
    }
    fn u64(&mut self, v: u64) -> io::Result<()> {
        self.0.write_all(&v.to_be_bytes())
    }
    fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        self.u32(b.len() as u32)?;
        self.0.write_all(b)
    }
    fn time(&mut self, t: NfsTime3) -> io::Result<()> {
        self.u32(t.seconds)?;
        self.u32(t.nseconds)
    }
}

struct R<'a, T: Read>(&'a mut T);

impl<T: Read> R<'_, T> {
    fn u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.0.read_exact(&mut b)?;
        Ok(b[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.0.read_exact(&mut b)?;
        Ok(u32::from_be_bytes(b))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.0.read_exact(&mut b)?;
        Ok(u64::from_be_bytes(b))
    }
    fn bytes(&mut self, max: usize) -> Result<Bytes, SnapshotError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(SnapshotError::Format("oversized string"));
        }
        let mut v = vec![0u8; n];
        self.0.read_exact(&mut v)?;
        Ok(Bytes::from(v))
    }
    fn time(&mut self) -> io::Result<NfsTime3> {
        Ok(NfsTime3 {
            seconds: self.u32()?,
            nseconds: self.u32()?,
        })
    }
}

impl Fs {
    /// Writes the whole file system to `out`.
    pub fn snapshot(&self, out: &mut impl Write) -> io::Result<()> {
        let mut w = W(out);
        w.0.write_all(MAGIC)?;
        w.u64(self.config.fsid)?;
        w.u64(self.handle_key[0])?;
        w.u64(self.handle_key[1])?;
        w.u32(self.slots.len() as u32)?;
        for slot in &self.slots {
            w.u32(slot.generation)?;
            // A file kept only while open (unlinked) is not saved: its
            // opens end with this instance.
            let Some(i) = slot
                .inode
                .as_ref()
                .map(|i| i.read())
                .filter(|i| i.attr.nlink > 0)
            else {
                w.u8(0)?;
                continue;
            };
            w.u8(1)?;
            let a = &i.attr;
            for v in [a.kind as u32, a.mode, a.nlink, a.uid, a.gid] {
                w.u32(v)?;
            }
            w.u32(a.rdev.specdata1)?;
            w.u32(a.rdev.specdata2)?;
            w.time(a.atime)?;
            w.time(a.mtime)?;
            w.time(a.ctime)?;
            match &i.content {
                Content::File(f) => {
                    w.u8(0)?;
                    w.u64(f.size)?;
                    match f.create_verf {
                        Some(v) => {
                            w.u8(1)?;
                            w.0.write_all(&v)?;
                        }
                        None => w.u8(0)?,
                    }
                    w.u32(f.blocks.len() as u32)?;
                    for (idx, b) in &f.blocks {
                        w.u64(*idx)?;
                        w.bytes(&b.contents())?;
                    }
                }
                Content::Dir(d) => {
                    w.u8(1)?;
                    w.u32(d.parent.0)?;
                    w.u64(d.next_cookie)?;
                    w.u32(d.subdirs)?;
                    w.u32(d.entries.len() as u32)?;
                    for (cookie, (name, ino)) in &d.entries {
                        w.u64(*cookie)?;
                        w.bytes(name)?;
                        w.u32(ino.0)?;
                    }
                }
                Content::Symlink(t) => {
                    w.u8(2)?;
                    w.bytes(t)?;
                }
                Content::Node => w.u8(3)?,
            }
        }
        w.0.flush()
    }
}

impl Store {
    /// Writes the store to `out` (under the exclusive lock, as WRITEs
    /// change files under the shared one: a consistent image).
    pub fn snapshot(&self, out: &mut impl Write) -> io::Result<()> {
        self.write().snapshot(out)
    }

    /// A store loaded from a snapshot. `config` gives the limits; its fsid
    /// must be the snapshot's.
    pub fn restore(
        config: StoreConfig,
        source: Box<dyn BlockSource>,
        input: &mut impl Read,
    ) -> Result<Store, SnapshotError> {
        let mut r = R(input);
        let mut magic = [0u8; 8];
        r.0.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(SnapshotError::Format("bad magic"));
        }
        let fsid = r.u64()?;
        if fsid != config.fsid {
            return Err(SnapshotError::Fsid {
                found: fsid,
                expected: config.fsid,
            });
        }
        let handle_key = [r.u64()?, r.u64()?];
        let nslots = r.u32()? as usize;
        if nslots == 0 || nslots as u64 > config.max_inodes.max(1) + (1 << 20) {
            return Err(SnapshotError::Format("slot count"));
        }
        let zeros = Zeros::from_source(&*source);
        let mut fs = Fs {
            config,
            slots: Vec::with_capacity(nslots),
            free: Vec::new(),
            inodes: 0,
            used_bytes: AtomicU64::new(0),
            source,
            handle_key,
            write_copied: AtomicU64::new(0),
            write_compacted: AtomicU64::new(0),
            write_adopted: AtomicU64::new(0),
            zeros,
            null_read: AtomicU64::new(0),
            null_discarded: AtomicU64::new(0),
            held: HashSet::new(),
        };
        for idx in 0..nslots {
            let generation = r.u32()?;
            let inode = match r.u8()? {
                0 => None,
                1 => Some(InodeLock::new(read_inode(&mut r, &mut fs, nslots)?)),
                _ => return Err(SnapshotError::Format("slot tag")),
            };
            if inode.is_some() {
                fs.inodes += 1;
            } else {
                fs.free.push(idx as u32);
            }
            fs.slots.push(Slot { generation, inode });
        }
        if !matches!(
            fs.slots[0].inode.as_mut().map(|i| &i.get_mut().content),
            Some(Content::Dir(_))
        ) {
            return Err(SnapshotError::Format("no root directory"));
        }
        fs.free.reverse();
        let fsid = fs.config.fsid;
        Ok(Store {
            fs: RwLock::new(fs),
            fsid,
        })
    }
}

fn read_inode<T: Read>(
    r: &mut R<'_, T>,
    fs: &mut Fs,
    nslots: usize,
) -> Result<Inode, SnapshotError> {
    let kind = Ftype3::from_u32(r.u32()?).ok_or(SnapshotError::Format("file type"))?;
    let (mode, nlink, uid, gid) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
    let rdev = SpecData3 {
        specdata1: r.u32()?,
        specdata2: r.u32()?,
    };
    let (atime, mtime, ctime) = (r.time()?, r.time()?, r.time()?);
    let attr = Attr {
        kind,
        mode,
        nlink,
        uid,
        gid,
        rdev,
        atime,
        mtime,
        ctime,
        change: super::time_change(ctime),
    };
    let ino = |v: u32| {
        if (v as usize) < nslots {
            Ok(Ino(v))
        } else {
            Err(SnapshotError::Format("inode number"))
        }
    };
    let content = match r.u8()? {
        0 => {
            let size = r.u64()?;
            let create_verf = match r.u8()? {
                0 => None,
                _ => {
                    let mut v = [0u8; 8];
                    r.0.read_exact(&mut v)?;
                    Some(v)
                }
            };
            let n = r.u32()?;
            let mut blocks = BTreeMap::new();
            let mut used = 0u64;
            for _ in 0..n {
                let idx = r.u64()?;
                let data = r.bytes(BLOCK_SIZE)?;
                if !data.len().is_power_of_two() || data.len() < blocks::MIN_BLOCK {
                    return Err(SnapshotError::Format("block size"));
                }
                if *fs.used_bytes.get_mut() + used + data.len() as u64 > fs.config.capacity_bytes {
                    return Err(SnapshotError::Capacity);
                }
                let mut b =
                    Block::new(fs.source.as_ref(), data.len()).ok_or(SnapshotError::Capacity)?;
                b.get_mut().expect("fresh block").copy_from_slice(&data);
                used += data.len() as u64;
                blocks.insert(idx, FileBlock::Whole(b));
            }
            *fs.used_bytes.get_mut() += used;
            Content::File(FileData {
                size,
                blocks,
                used,
                create_verf,
            })
        }
        1 => {
            let parent = ino(r.u32()?)?;
            let next_cookie = r.u64()?;
            let subdirs = r.u32()?;
            let n = r.u32()?;
            let mut d = Dir::new(parent);
            d.next_cookie = next_cookie;
            d.subdirs = subdirs;
            for _ in 0..n {
                let cookie = r.u64()?;
                let name = r.bytes(NAME_MAX)?;
                let child = ino(r.u32()?)?;
                if cookie >= next_cookie {
                    return Err(SnapshotError::Format("cookie"));
                }
                d.by_name.insert(name.clone(), cookie);
                d.entries.insert(cookie, (name, child));
            }
            Content::Dir(d)
        }
        2 => Content::Symlink(r.bytes(4096)?),
        3 => Content::Node,
        _ => return Err(SnapshotError::Format("content tag")),
    };
    Ok(Inode { attr, content })
}
