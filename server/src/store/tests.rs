//! Store semantics: names, links, rename rules, cookies, sparse data,
//! capacity, handles.

use super::*;
use blocks::{Block, HeapSource};

fn store() -> Store {
    Store::new(StoreConfig::default())
}

fn user(uid: u32) -> Cred {
    Cred {
        uid,
        gid: uid,
        gids: vec![],
    }
}

pub(super) fn mkfile(fs: &mut Fs, dir: Ino, name: &str) -> Ino {
    fs.create(
        dir,
        name.as_bytes(),
        &Cred::root(),
        NewNode::File,
        CreateMode::Guarded,
        &Sattr3::default(),
    )
    .unwrap()
}

fn mkdir(fs: &mut Fs, dir: Ino, name: &str) -> Ino {
    fs.create(
        dir,
        name.as_bytes(),
        &Cred::root(),
        NewNode::Dir,
        CreateMode::Guarded,
        &Sattr3::default(),
    )
    .unwrap()
}

fn names(fs: &Fs, dir: Ino) -> Vec<String> {
    let (e, eof) = fs.readdir(dir, &Cred::root(), 0, [0; 8], |_| true).unwrap();
    assert!(eof);
    e.iter()
        .map(|e| String::from_utf8(e.name.to_vec()).unwrap())
        .collect()
}

fn write(fs: &mut Fs, ino: Ino, off: u64, data: &[u8]) {
    fs.write(ino, &Cred::root(), off, &Payload::from(data.to_vec()))
        .unwrap();
}

pub(super) fn read(fs: &Fs, ino: Ino, off: u64, n: u32) -> (Vec<u8>, bool) {
    let (p, eof) = fs.read(ino, &Cred::root(), off, n).unwrap();
    (p.bytes().collect(), eof)
}

#[test]
fn create_lookup_and_names() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "a");
    assert_eq!(fs.lookup(root, b"a", &Cred::root()).unwrap(), f);
    assert_eq!(fs.lookup(root, b".", &Cred::root()).unwrap(), root);
    assert_eq!(fs.lookup(root, b"..", &Cred::root()).unwrap(), root);
    assert_eq!(fs.lookup(root, b"b", &Cred::root()), Err(NfsStat3::Noent));
    assert_eq!(fs.lookup(f, b"x", &Cred::root()), Err(NfsStat3::Notdir));
    let long = vec![b'x'; 256];
    assert_eq!(
        fs.create(
            root,
            &long,
            &Cred::root(),
            NewNode::File,
            CreateMode::Guarded,
            &Sattr3::default()
        ),
        Err(NfsStat3::Nametoolong)
    );
    assert_eq!(
        fs.create(
            root,
            b"a/b",
            &Cred::root(),
            NewNode::File,
            CreateMode::Guarded,
            &Sattr3::default()
        ),
        Err(NfsStat3::Acces)
    );
    assert_eq!(
        fs.create(
            root,
            b"a",
            &Cred::root(),
            NewNode::File,
            CreateMode::Guarded,
            &Sattr3::default()
        ),
        Err(NfsStat3::Exist)
    );
    // UNCHECKED on an existing file returns it.
    assert_eq!(
        fs.create(
            root,
            b"a",
            &Cred::root(),
            NewNode::File,
            CreateMode::Unchecked,
            &Sattr3::default()
        ),
        Ok(f)
    );
    assert_eq!(names(&fs, root), vec![".", "..", "a"]);
}

#[test]
fn exclusive_create_is_idempotent_per_verifier() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let c = |fs: &mut Fs, v| {
        fs.create(
            root,
            b"x",
            &Cred::root(),
            NewNode::File,
            CreateMode::Exclusive(v),
            &Sattr3::default(),
        )
    };
    let a = c(&mut fs, [1; 8]).unwrap();
    assert_eq!(c(&mut fs, [1; 8]), Ok(a), "a retransmission succeeds");
    assert_eq!(c(&mut fs, [2; 8]), Err(NfsStat3::Exist));
    // After SETATTR the verifier is gone: the same verifier now fails.
    fs.setattr(
        a,
        &Cred::root(),
        &Sattr3 {
            mode: Some(0o600),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(c(&mut fs, [1; 8]), Err(NfsStat3::Exist));
}

#[test]
fn link_counts() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    assert_eq!(fs.getattr(root).unwrap().nlink, 2);
    let d = mkdir(&mut fs, root, "d");
    assert_eq!(fs.getattr(root).unwrap().nlink, 3);
    assert_eq!(fs.getattr(d).unwrap().nlink, 2);
    let f = mkfile(&mut fs, root, "f");
    fs.link(f, d, b"g", &Cred::root()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    assert_eq!(fs.link(f, d, b"g", &Cred::root()), Err(NfsStat3::Exist));
    assert_eq!(fs.link(d, root, b"dd", &Cred::root()), Err(NfsStat3::Isdir));
    fs.remove(root, b"f", &Cred::root()).unwrap();
    assert_eq!(fs.getattr(f).unwrap().nlink, 1);
    assert_eq!(fs.lookup(d, b"g", &Cred::root()).unwrap(), f);
    let h = fs.handle(f);
    fs.remove(d, b"g", &Cred::root()).unwrap();
    assert_eq!(fs.resolve(&h), Err(NfsStat3::Stale));
    fs.rmdir(root, b"d", &Cred::root()).unwrap();
    assert_eq!(fs.getattr(root).unwrap().nlink, 2);
}

#[test]
fn remove_and_rmdir_rules() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let d = mkdir(&mut fs, root, "d");
    mkfile(&mut fs, d, "f");
    assert_eq!(fs.remove(root, b"d", &Cred::root()), Err(NfsStat3::Isdir));
    assert_eq!(fs.rmdir(root, b"d", &Cred::root()), Err(NfsStat3::Notempty));
    assert_eq!(fs.rmdir(d, b"f", &Cred::root()), Err(NfsStat3::Notdir));
    // "." and ".." are never removed (NFS3ERR_ACCES, as the Linux nfsd).
    for name in [&b"."[..], b".."] {
        assert_eq!(fs.rmdir(d, name, &Cred::root()), Err(NfsStat3::Acces));
        assert_eq!(fs.remove(d, name, &Cred::root()), Err(NfsStat3::Acces));
    }
    assert_eq!(
        fs.remove(root, b"nope", &Cred::root()),
        Err(NfsStat3::Noent)
    );
    fs.remove(d, b"f", &Cred::root()).unwrap();
    fs.rmdir(root, b"d", &Cred::root()).unwrap();
    assert_eq!(names(&fs, root), vec![".", ".."]);
}

#[test]
fn rename_posix_rules() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let r = Cred::root();
    let a = mkdir(&mut fs, root, "a");
    let b = mkdir(&mut fs, a, "b");
    let f = mkfile(&mut fs, root, "f");
    let g = mkfile(&mut fs, root, "g");
    let empty = mkdir(&mut fs, root, "empty");
    let full = mkdir(&mut fs, root, "full");
    mkfile(&mut fs, full, "x");

    // A directory never moves into its own subtree.
    assert_eq!(fs.rename(root, b"a", b, b"a2", &r), Err(NfsStat3::Inval));
    assert_eq!(fs.rename(root, b"a", a, b"self", &r), Err(NfsStat3::Inval));
    // File over file replaces it; the replaced inode is gone.
    let gh = fs.handle(g);
    fs.rename(root, b"f", root, b"g", &r).unwrap();
    assert_eq!(fs.lookup(root, b"g", &r).unwrap(), f);
    assert_eq!(fs.resolve(&gh), Err(NfsStat3::Stale));
    // File over directory, directory over file.
    assert_eq!(
        fs.rename(root, b"g", root, b"empty", &r),
        Err(NfsStat3::Isdir)
    );
    assert_eq!(
        fs.rename(root, b"empty", root, b"g", &r),
        Err(NfsStat3::Notdir)
    );
    // Directory over a non-empty directory is refused, over an empty one
    // replaces it.
    assert_eq!(
        fs.rename(root, b"a", root, b"full", &r),
        Err(NfsStat3::Notempty)
    );
    // "." and ".." are never renamed nor replaced.
    assert_eq!(fs.rename(a, b".", root, b"x", &r), Err(NfsStat3::Perm));
    assert_eq!(fs.rename(root, b"f", a, b"..", &r), Err(NfsStat3::Perm));
    let links_before = fs.getattr(root).unwrap().nlink;
    let empty_handle = fs.handle(empty);
    fs.rename(root, b"a", root, b"empty", &r).unwrap();
    assert_eq!(fs.resolve(&empty_handle), Err(NfsStat3::Stale));
    assert_eq!(fs.lookup(root, b"empty", &r).unwrap(), a);
    assert_eq!(fs.getattr(root).unwrap().nlink, links_before - 1);
    // Across directories: ".." follows, parent link counts move.
    fs.rename(a, b"b", full, b"b", &r).unwrap();
    assert_eq!(fs.lookup(b, b"..", &r).unwrap(), full);
    assert_eq!(fs.getattr(a).unwrap().nlink, 2);
    assert_eq!(fs.getattr(full).unwrap().nlink, 3);
    // Renaming a name onto another name of the same file does nothing.
    fs.link(f, root, b"f2", &r).unwrap();
    fs.rename(root, b"g", root, b"f2", &r).unwrap();
    assert!(fs.lookup(root, b"g", &r).is_ok());
    assert_eq!(
        fs.rename(root, b"nope", root, b"x", &r),
        Err(NfsStat3::Noent)
    );
}

#[test]
fn cookies_survive_changes() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    for i in 0..10 {
        mkfile(&mut fs, root, &format!("f{i}"));
    }
    let verf = fs.cookieverf(root);
    // Read ". .. f0 f1 f2" then stop.
    let mut n = 0;
    let (first, eof) = fs
        .readdir(root, &Cred::root(), 0, [0; 8], |_| {
            n += 1;
            n <= 5
        })
        .unwrap();
    assert!(!eof);
    assert_eq!(first.len(), 5);
    let cookie = first.last().unwrap().cookie;
    // Remove the entry the cookie points at and one before it, add new ones.
    fs.remove(root, b"f2", &Cred::root()).unwrap();
    fs.remove(root, b"f0", &Cred::root()).unwrap();
    mkfile(&mut fs, root, "new");
    let (rest, eof) = fs
        .readdir(root, &Cred::root(), cookie, verf, |_| true)
        .unwrap();
    assert!(eof);
    let got: Vec<_> = rest
        .iter()
        .map(|e| String::from_utf8(e.name.to_vec()).unwrap())
        .collect();
    assert_eq!(got, vec!["f3", "f4", "f5", "f6", "f7", "f8", "f9", "new"]);
    // A cookie never issued, or a verifier of another directory, is refused.
    assert_eq!(
        fs.readdir(root, &Cred::root(), 10_000, verf, |_| true)
            .err(),
        Some(NfsStat3::BadCookie)
    );
    assert_eq!(
        fs.readdir(root, &Cred::root(), cookie, [9; 8], |_| true)
            .err(),
        Some(NfsStat3::BadCookie)
    );
}

#[test]
fn sparse_files_read_zeros_and_use_no_memory_for_holes() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "sparse");
    write(&mut fs, f, 10 << 20, b"end");
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, (10 << 20) + 3);
    assert_eq!(
        a.used,
        blocks::BLOCK_SIZE as u64,
        "only the written block is held"
    );
    let (d, eof) = read(&fs, f, (10 << 20) - 5, 100);
    assert_eq!(d, b"\0\0\0\0\0end");
    assert!(eof);
    let (d, eof) = read(&fs, f, 12345, 1000);
    assert_eq!(d, vec![0u8; 1000]);
    assert!(!eof);
    let free_before = fs.fsstat().1;
    // Truncate down then up: the old bytes read as zeros, and the block
    // past the new end is given back.
    write(&mut fs, f, 0, b"hello world");
    fs.setattr(
        f,
        &Cred::root(),
        &Sattr3 {
            size: Some(5),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    fs.setattr(
        f,
        &Cred::root(),
        &Sattr3 {
            size: Some(11),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(read(&fs, f, 0, 100).0, b"hello\0\0\0\0\0\0");
    assert_eq!(fs.getattr(f).unwrap().used, blocks::BLOCK_SIZE as u64);
    assert_eq!(
        fs.fsstat().1,
        free_before,
        "block 0 taken, block 160 given back"
    );
}

#[test]
fn data_round_trips_across_blocks_and_small_blocks_grow() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, b"abc");
    assert_eq!(fs.getattr(f).unwrap().used, blocks::MIN_BLOCK as u64);
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    // Written in two pieces to exercise multi-part payloads.
    let p = Payload::from_parts([
        Bytes::copy_from_slice(&big[..1000]),
        Bytes::copy_from_slice(&big[1000..]),
    ]);
    fs.write(f, &Cred::root(), 100, &p).unwrap();
    let (d, eof) = read(&fs, f, 0, 400_000);
    assert!(eof);
    assert_eq!(&d[..3], b"abc");
    assert_eq!(&d[100..], &big[..]);
    // Every block of a file at least one block long is full size.
    assert_eq!(fs.getattr(f).unwrap().used, 5 * blocks::BLOCK_SIZE as u64);
}

#[test]
fn reads_share_block_memory_and_writes_do_not_change_them() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, &[1u8; 100_000]);
    let (p, _) = fs.read(f, &Cred::root(), 0, 4096).unwrap();
    assert_eq!(p.parts().len(), 1, "a read inside one block is one piece");
    let snapshot = p.to_contiguous();
    // A write to the same range while the reader holds the bytes copies
    // the block; the reader's bytes stay as they were.
    write(&mut fs, f, 0, &[2u8; 10]);
    assert_eq!(p.to_contiguous(), snapshot);
    assert!(p.bytes().all(|b| b == 1));
    assert_eq!(read(&fs, f, 0, 10).0, vec![2u8; 10]);
    // A read spanning two blocks is two pieces.
    let (p, _) = fs
        .read(f, &Cred::root(), blocks::BLOCK_SIZE as u64 - 10, 20)
        .unwrap();
    assert_eq!(p.parts().len(), 2);
}

#[test]
fn capacity_gives_nospc_and_leaves_file_untouched() {
    let s = Store::new(StoreConfig {
        capacity_bytes: 256 * 1024,
        max_inodes: 4,
        ..Default::default()
    });
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, &[7u8; 200_000]);
    let r = fs.write(
        f,
        &Cred::root(),
        200_000,
        &Payload::from(vec![1u8; 100_000]),
    );
    assert_eq!(r, Err(NfsStat3::Nospc));
    assert_eq!(fs.getattr(f).unwrap().size, 200_000);
    let (t, free, ti, fi) = fs.fsstat();
    assert_eq!(t, 256 * 1024);
    assert_eq!(free, 256 * 1024 - 4 * blocks::BLOCK_SIZE as u64);
    assert_eq!((ti, fi), (4, 2));
    // Inodes run out too (root + f + 2 more).
    mkfile(&mut fs, root, "g");
    mkfile(&mut fs, root, "h");
    assert_eq!(
        fs.create(
            root,
            b"i",
            &Cred::root(),
            NewNode::File,
            CreateMode::Guarded,
            &Sattr3::default()
        ),
        Err(NfsStat3::Nospc)
    );
    // Removing a file gives its memory back.
    fs.remove(root, b"f", &Cred::root()).unwrap();
    assert_eq!(fs.fsstat().1, 256 * 1024);
}

#[test]
fn handles_detect_forgery_truncation_and_reuse() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    let h = fs.handle(f);
    assert_eq!(h.len(), HANDLE_LEN);
    assert_eq!(fs.resolve(&h), Ok(f));
    assert_eq!(fs.resolve(&h[..10]), Err(NfsStat3::Badhandle));
    assert_eq!(fs.resolve(b""), Err(NfsStat3::Badhandle));
    let mut forged = h.to_vec();
    forged[15] ^= 1; // another fileid, check value no longer matches
    assert_eq!(fs.resolve(&forged), Err(NfsStat3::Badhandle));
    // The slot is reused with a new generation: the old handle is stale.
    fs.remove(root, b"f", &Cred::root()).unwrap();
    let g = mkfile(&mut fs, root, "g");
    assert_eq!(g, f, "slot reused");
    assert_eq!(fs.resolve(&h), Err(NfsStat3::Stale));
    assert_ne!(fs.handle(g), h);
    // A handle of another store (another fsid) is not ours.
    let other = Store::new(StoreConfig {
        fsid: 2,
        ..Default::default()
    });
    let oh = other.read().handle(other.read().root());
    assert_eq!(fs.resolve(&oh), Err(NfsStat3::Badhandle));
    assert_eq!(handle_fsid(&oh), Some(2));
}

#[test]
fn permissions() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let alice = user(1000);
    let bob = user(1001);
    // Root makes a world-writable sticky directory.
    let tmp = mkdir(&mut fs, root, "tmp");
    fs.setattr(
        tmp,
        &Cred::root(),
        &Sattr3 {
            mode: Some(0o1777),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let create = |fs: &mut Fs, c: &Cred, name: &str, mode| {
        fs.create(
            tmp,
            name.as_bytes(),
            c,
            NewNode::File,
            CreateMode::Guarded,
            &Sattr3 {
                mode: Some(mode),
                ..Default::default()
            },
        )
    };
    let af = create(&mut fs, &alice, "a", 0o444).unwrap();
    assert_eq!(fs.getattr(af).unwrap().uid, 1000);
    // The owner writes a file its mode makes read-only (as after open()).
    fs.write(af, &alice, 0, &Payload::from("x")).unwrap();
    // Others cannot.
    assert_eq!(
        fs.write(af, &bob, 0, &Payload::from("x")),
        Err(NfsStat3::Acces)
    );
    // Sticky: bob cannot remove or rename alice's file (NFS3ERR_PERM, as
    // the Linux nfsd answers).
    assert_eq!(fs.remove(tmp, b"a", &bob), Err(NfsStat3::Perm));
    assert_eq!(fs.rename(tmp, b"a", tmp, b"b", &bob), Err(NfsStat3::Perm));
    // Bob cannot create in root (0755, owned by root).
    assert_eq!(
        fs.create(
            root,
            b"x",
            &bob,
            NewNode::File,
            CreateMode::Guarded,
            &Sattr3::default()
        ),
        Err(NfsStat3::Acces)
    );
    // chmod by a non-owner, chown by a non-root.
    assert_eq!(
        fs.setattr(
            af,
            &bob,
            &Sattr3 {
                mode: Some(0o777),
                ..Default::default()
            },
            None
        ),
        Err(NfsStat3::Perm)
    );
    assert_eq!(
        fs.setattr(
            af,
            &alice,
            &Sattr3 {
                uid: Some(0),
                ..Default::default()
            },
            None
        ),
        Err(NfsStat3::Perm)
    );
    // ACCESS reflects the mode bits; a read-only export withholds writes.
    let got = fs.access(af, &bob, 0x3f, false).unwrap();
    assert_eq!(got, access::READ);
    let got = fs.access(tmp, &bob, 0x3f, false).unwrap();
    assert_eq!(
        got,
        access::READ | access::LOOKUP | access::MODIFY | access::EXTEND | access::DELETE
    );
    let got = fs.access(tmp, &bob, 0x3f, true).unwrap();
    assert_eq!(got, access::READ | access::LOOKUP);
    // Root may not execute a file without any x bit.
    assert_eq!(
        fs.access(af, &Cred::root(), access::EXECUTE, false)
            .unwrap(),
        0
    );
    // The SETATTR guard.
    let ctime = fs.getattr(af).unwrap().ctime;
    let stale = NfsTime3 {
        seconds: ctime.seconds.wrapping_sub(1),
        ..ctime
    };
    assert_eq!(
        fs.setattr(
            af,
            &alice,
            &Sattr3 {
                mode: Some(0o600),
                ..Default::default()
            },
            Some(stale)
        ),
        Err(NfsStat3::NotSync)
    );
    fs.setattr(
        af,
        &alice,
        &Sattr3 {
            mode: Some(0o600),
            ..Default::default()
        },
        Some(ctime),
    )
    .unwrap();
}

#[test]
fn symlinks_and_nodes() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let l = fs
        .create(
            root,
            b"l",
            &Cred::root(),
            NewNode::Symlink(Bytes::from_static(b"/target/path")),
            CreateMode::Guarded,
            &Sattr3::default(),
        )
        .unwrap();
    assert_eq!(&fs.readlink(l).unwrap()[..], b"/target/path");
    assert_ne!(
        fs.readlink(l).unwrap().as_ptr(),
        b"/target/path".as_ptr(),
        "the target is the store's own copy, not a view of the call"
    );
    assert_eq!(fs.getattr(l).unwrap().type_, Ftype3::Lnk);
    assert_eq!(fs.readlink(root), Err(NfsStat3::Inval));
    let n = fs
        .create(
            root,
            b"null",
            &Cred::root(),
            NewNode::Special(
                Ftype3::Chr,
                SpecData3 {
                    specdata1: 1,
                    specdata2: 3,
                },
            ),
            CreateMode::Guarded,
            &Sattr3::default(),
        )
        .unwrap();
    let a = fs.getattr(n).unwrap();
    assert_eq!(
        (a.type_, a.rdev.specdata1, a.rdev.specdata2),
        (Ftype3::Chr, 1, 3)
    );
    assert_eq!(
        fs.read(n, &Cred::root(), 0, 10).err(),
        Some(NfsStat3::Inval)
    );
    assert_eq!(
        fs.read(root, &Cred::root(), 0, 10).err(),
        Some(NfsStat3::Isdir)
    );
}

#[test]
fn null_store_discards_data() {
    let s = Store::new(StoreConfig {
        null: true,
        ..Default::default()
    });
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, &[9u8; 100_000]);
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.used), (100_000, 0));
    assert_eq!(read(&fs, f, 0, 10).0, vec![0u8; 10]);
}

/// A block source that remembers where each block it gave lies.
#[derive(Clone, Default)]
struct Recording(std::sync::Arc<std::sync::Mutex<Vec<(usize, usize)>>>);

impl blocks::BlockSource for Recording {
    fn alloc(&self, size: usize) -> Option<Box<dyn blocks::BlockMemory>> {
        let m = HeapSource.alloc(size)?;
        let at = (*m).as_ref().as_ptr() as usize;
        self.0.lock().unwrap().push((at, size));
        Some(m)
    }
}

impl Recording {
    /// The index of the block `part` lies in.
    fn block_of(&self, part: &Bytes) -> Option<usize> {
        let p = part.as_ptr() as usize;
        self.0
            .lock()
            .unwrap()
            .iter()
            .position(|&(at, len)| p >= at && p + part.len() <= at + len)
    }
}

#[test]
fn null_store_answers_reads_from_one_block_of_its_source_and_counts() {
    use blocks::BLOCK_SIZE;
    let src = Recording::default();
    let s = Store::with_source(
        StoreConfig {
            null: true,
            ..Default::default()
        },
        Box::new(src.clone()),
    );
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, &[9u8; 3 * BLOCK_SIZE + 100]);
    assert_eq!(fs.null_stats(), (0, 3 * BLOCK_SIZE as u64 + 100));
    let (data, eof) = fs
        .read(f, &Cred::root(), 50, 3 * BLOCK_SIZE as u32)
        .unwrap();
    assert!(!eof);
    assert_eq!(data.len(), 3 * BLOCK_SIZE);
    assert!(data.bytes().all(|b| b == 0));
    // Every piece is a slice of the one block the source gave: the store's
    // zeros (registered memory over RDMA), not a copy.
    assert!(data.parts().len() >= 3, "{}", data.parts().len());
    for p in data.parts() {
        assert_eq!(src.block_of(p), Some(0), "a piece from elsewhere");
        assert!(fs.is_zero_block(p));
    }
    assert_eq!(src.0.lock().unwrap().len(), 1, "the writes took memory");
    assert_eq!(
        fs.null_stats(),
        (3 * BLOCK_SIZE as u64, 3 * BLOCK_SIZE as u64 + 100)
    );
}

#[test]
fn holes_are_read_from_the_stores_zero_block() {
    use blocks::BLOCK_SIZE;
    let src = Recording::default();
    let s = Store::with_source(StoreConfig::default(), Box::new(src.clone()));
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 2 * BLOCK_SIZE as u64, b"end");
    let (data, _) = fs.read(f, &Cred::root(), 10, BLOCK_SIZE as u32).unwrap();
    assert!(data.bytes().all(|b| b == 0));
    for p in data.parts() {
        assert_eq!(src.block_of(p), Some(0), "a hole's zeros from elsewhere");
    }
    // The data block is another one, and a normal store counts nothing
    // as null.
    let (tail, _) = fs.read(f, &Cred::root(), 2 * BLOCK_SIZE as u64, 3).unwrap();
    assert_eq!(tail.bytes().collect::<Vec<u8>>(), b"end");
    assert_eq!(src.block_of(&tail.parts()[0]), Some(1));
    assert!(!fs.is_zero_block(&tail.parts()[0]));
    assert_eq!(fs.null_stats(), (0, 0));
}

#[test]
fn whole_landing_blocks_are_taken_over_instead_of_copied() {
    use blocks::{LandingBlocks, BLOCK_SIZE};
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    let landing: Vec<Block> = (0..2u8)
        .map(|i| {
            let mut b = Block::new(&HeapSource, BLOCK_SIZE).unwrap();
            b.get_mut().unwrap().fill(i + 1);
            b
        })
        .collect();
    // A head of 4 KiB (not whole: copied), then two whole blocks.
    let head = Bytes::from(vec![9u8; 4096]);
    let p = Payload::from_parts([
        head,
        landing[0].slice(0..BLOCK_SIZE),
        landing[1].slice(0..BLOCK_SIZE),
    ])
    .with_attachment(std::sync::Arc::new(LandingBlocks(landing.clone())));
    fs.write(f, &Cred::root(), (BLOCK_SIZE - 4096) as u64, &p)
        .unwrap();
    assert_eq!(fs.write_stats(), (4096, 2 * BLOCK_SIZE as u64));
    // The file's blocks 1 and 2 are the landing blocks' memory.
    let (r, _) = fs.read(f, &Cred::root(), BLOCK_SIZE as u64, 16).unwrap();
    assert_eq!(r.parts()[0].as_ptr(), landing[0].as_slice().as_ptr());
    let (all, _) = fs.read(f, &Cred::root(), 0, 3 * BLOCK_SIZE as u32).unwrap();
    let all: Vec<u8> = all.bytes().collect();
    assert!(all[..BLOCK_SIZE - 4096].iter().all(|b| *b == 0));
    assert!(all[BLOCK_SIZE - 4096..BLOCK_SIZE].iter().all(|b| *b == 9));
    assert!(all[BLOCK_SIZE..2 * BLOCK_SIZE].iter().all(|b| *b == 1));
    assert!(all[2 * BLOCK_SIZE..].iter().all(|b| *b == 2));
    // Without the attachment the same data is copied.
    let p2 = Payload::from_parts([landing[0].slice(0..BLOCK_SIZE)]);
    fs.write(f, &Cred::root(), 0, &p2).unwrap();
    assert_eq!(fs.write_stats().0, 4096 + BLOCK_SIZE as u64);
    // A later write into a taken-over block, while nobody else holds it,
    // happens in place and does not change the landing data it came from
    // only because the landing handle above still shares it (copy on
    // write).
    write(&mut fs, f, BLOCK_SIZE as u64, b"x");
    assert_eq!(
        landing[0].as_slice()[0],
        1,
        "shared block was copied, not changed"
    );
}

/// `n` landing blocks of `size` bytes, block `i` filled with `fill + i`.
fn landing_blocks(n: usize, size: usize, fill: u8) -> Vec<Block> {
    (0..n)
        .map(|i| {
            let mut b = Block::new(&HeapSource, size).unwrap();
            b.get_mut().unwrap().fill(fill + i as u8);
            b
        })
        .collect()
}

/// WRITE data that landed in `blocks` (`len` bytes of each).
fn landed(blocks: &[Block], len: usize) -> Payload {
    Payload::from_parts(blocks.iter().map(|b| b.slice(0..len)))
        .with_attachment(std::sync::Arc::new(blocks::LandingBlocks(blocks.to_vec())))
}

#[test]
fn landed_pages_become_file_pages_without_a_copy() {
    use blocks::{BLOCK_SIZE, PAGE};
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    // 4 KiB records, each landed in a page-sized block of its own, written
    // out of order into a new file: every byte is taken over.
    let pages = landing_blocks(20, PAGE, 1);
    for i in [
        3usize, 0, 1, 2, 19, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
    ] {
        fs.write(
            f,
            &Cred::root(),
            (i * PAGE) as u64,
            &landed(&pages[i..=i], PAGE),
        )
        .unwrap();
    }
    assert_eq!(fs.write_stats(), (0, 20 * PAGE as u64));
    let a = fs.getattr(f).unwrap();
    assert_eq!((a.size, a.used), (20 * PAGE as u64, 20 * PAGE as u64));
    // Reads hand out the landing memory itself.
    let (r, eof) = fs.read(f, &Cred::root(), 0, 20 * PAGE as u32).unwrap();
    assert!(eof);
    assert_eq!(r.parts().len(), 20);
    for (i, part) in r.parts().iter().enumerate() {
        assert_eq!(part.as_ptr(), pages[i].as_slice().as_ptr());
        assert!(part.iter().all(|b| *b == 1 + i as u8));
    }
    drop(r);
    // A byte written into a page whose landing block is still held
    // elsewhere goes into a private copy of the page: the landing memory
    // (and any reader of it) never changes.
    write(&mut fs, f, (PAGE + 10) as u64, b"z");
    assert_eq!(fs.write_stats().0, 1);
    assert!(pages[1].as_slice().iter().all(|b| *b == 2));
    let (got, _) = read(&fs, f, PAGE as u64 + 9, 3);
    assert_eq!(got, vec![2, b'z', 2]);
    // Rewriting a page with newly landed data replaces it.
    let again = landing_blocks(1, PAGE, 100);
    fs.write(f, &Cred::root(), PAGE as u64, &landed(&again, PAGE))
        .unwrap();
    assert_eq!(fs.write_stats(), (1, 21 * PAGE as u64));
    assert_eq!(read(&fs, f, PAGE as u64 + 9, 3).0, vec![100; 3]);
    // Truncating into a page zeroes its tail in a copy, not in the landing
    // block; extending again reads zeros there.
    fs.setattr(
        f,
        &Cred::root(),
        &Sattr3 {
            size: Some((2 * PAGE + 100) as u64),
            ..Sattr3::default()
        },
        None,
    )
    .unwrap();
    assert!(pages[2].as_slice().iter().all(|b| *b == 3));
    write(&mut fs, f, (BLOCK_SIZE - 1) as u64, b"e");
    let (got, _) = read(&fs, f, 2 * PAGE as u64 + 98, 4);
    assert_eq!(got, vec![3, 3, 0, 0]);
    let a = fs.getattr(f).unwrap();
    assert_eq!(a.size, BLOCK_SIZE as u64);
    assert_eq!(a.used, 4 * PAGE as u64, "pages 0-2 and the last one");
}

#[test]
fn adjacent_pages_of_one_landing_block_read_as_one_piece() {
    use blocks::{BLOCK_SIZE, PAGE};
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    // 12 KiB landed in a 16 KiB block, written at 8 KiB: three pages of one
    // buffer, which keeps its 16 KiB alive.
    let b = landing_blocks(1, 16 * 1024, 7);
    fs.write(f, &Cred::root(), 2 * PAGE as u64, &landed(&b, 3 * PAGE))
        .unwrap();
    assert_eq!(fs.write_stats(), (0, 3 * PAGE as u64));
    assert_eq!(fs.getattr(f).unwrap().used, 16 * 1024);
    let (r, _) = fs.read(f, &Cred::root(), 0, 5 * PAGE as u32).unwrap();
    let lens: Vec<usize> = r.parts().iter().map(|p| p.len()).collect();
    assert_eq!(lens, vec![2 * PAGE, 3 * PAGE]);
    assert_eq!(r.parts()[1].as_ptr(), b[0].as_slice().as_ptr());
    // Sixteen pages in order of one 64 KiB landing block are one whole
    // block again.
    let whole = landing_blocks(1, BLOCK_SIZE, 30);
    let head = whole[0].slice(0..PAGE);
    let rest = whole[0].slice(PAGE..BLOCK_SIZE);
    let g = mkfile(&mut fs, root, "g");
    let p = Payload::from_parts([head, rest])
        .with_attachment(std::sync::Arc::new(blocks::LandingBlocks(whole.clone())));
    fs.write(g, &Cred::root(), 0, &p).unwrap();
    let (r, _) = fs.read(g, &Cred::root(), 0, BLOCK_SIZE as u32).unwrap();
    assert_eq!(r.parts().len(), 1);
    assert_eq!(fs.getattr(g).unwrap().used, BLOCK_SIZE as u64);
}

#[test]
fn landed_pages_over_a_whole_block_replace_its_pages() {
    use blocks::{BLOCK_SIZE, PAGE};
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, &vec![5u8; BLOCK_SIZE]);
    let copied = BLOCK_SIZE as u64;
    // A page landed over the file's own block: no copy; the block stays
    // alive for its other fifteen pages.
    let p = landing_blocks(16, PAGE, 100);
    fs.write(f, &Cred::root(), PAGE as u64, &landed(&p[1..2], PAGE))
        .unwrap();
    assert_eq!(fs.write_stats(), (copied, PAGE as u64));
    assert_eq!(fs.getattr(f).unwrap().used, (BLOCK_SIZE + PAGE) as u64);
    let (r, _) = fs.read(f, &Cred::root(), 0, BLOCK_SIZE as u32).unwrap();
    let lens: Vec<usize> = r.parts().iter().map(|p| p.len()).collect();
    assert_eq!(lens, vec![PAGE, PAGE, BLOCK_SIZE - 2 * PAGE]);
    drop(r);
    // Every page replaced: the old block is gone, nothing was gathered.
    for i in (0..16).filter(|i| *i != 1) {
        fs.write(
            f,
            &Cred::root(),
            (i * PAGE) as u64,
            &landed(&p[i..=i], PAGE),
        )
        .unwrap();
        assert!(fs.getattr(f).unwrap().used <= (2 * BLOCK_SIZE) as u64);
    }
    assert_eq!(fs.write_stats(), (copied, BLOCK_SIZE as u64));
    assert_eq!(fs.getattr(f).unwrap().used, BLOCK_SIZE as u64);
    assert_eq!(fs.compacted_bytes(), 0);
    let (all, _) = read(&fs, f, 0, BLOCK_SIZE as u32);
    for (i, page) in all.chunks(PAGE).enumerate() {
        assert!(page.iter().all(|b| *b == 100 + i as u8));
    }
}

#[test]
fn pages_that_pin_more_than_two_blocks_are_gathered_into_one() {
    use blocks::{BLOCK_SIZE, PAGE};
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    // A whole landed block, then 60 KiB landed in a second 64 KiB block
    // over all but its first page: 128 KiB alive for 64 KiB of data.
    let first = landing_blocks(1, BLOCK_SIZE, 1);
    fs.write(f, &Cred::root(), 0, &landed(&first, BLOCK_SIZE))
        .unwrap();
    let second = landing_blocks(1, BLOCK_SIZE, 2);
    fs.write(
        f,
        &Cred::root(),
        PAGE as u64,
        &landed(&second, BLOCK_SIZE - PAGE),
    )
    .unwrap();
    assert_eq!(fs.getattr(f).unwrap().used, 2 * BLOCK_SIZE as u64);
    assert_eq!(fs.compacted_bytes(), 0);
    // One more page would keep 132 KiB alive: the stretch is gathered.
    let small = landing_blocks(1, PAGE, 50);
    fs.write(f, &Cred::root(), (3 * PAGE) as u64, &landed(&small, PAGE))
        .unwrap();
    assert_eq!(fs.getattr(f).unwrap().used, BLOCK_SIZE as u64);
    assert_eq!(fs.compacted_bytes(), BLOCK_SIZE as u64);
    let (all, _) = read(&fs, f, 0, BLOCK_SIZE as u32);
    assert!(all[..PAGE].iter().all(|b| *b == 1));
    assert!(all[PAGE..3 * PAGE].iter().all(|b| *b == 2));
    assert!(all[3 * PAGE..4 * PAGE].iter().all(|b| *b == 50));
    assert!(all[4 * PAGE..].iter().all(|b| *b == 2));
    // Removing the file gives all of it back.
    fs.remove(root, b"f", &Cred::root()).unwrap();
    assert_eq!(fs.fsstat().1, fs.fsstat().0);
}

#[test]
fn snapshot_keeps_paged_file_data() {
    use blocks::PAGE;
    let s = store();
    {
        let mut fs = s.write();
        let root = fs.root();
        let f = mkfile(&mut fs, root, "f");
        let pages = landing_blocks(2, PAGE, 1);
        fs.write(f, &Cred::root(), 0, &landed(&pages[..1], PAGE))
            .unwrap();
        fs.write(
            f,
            &Cred::root(),
            5 * PAGE as u64,
            &landed(&pages[1..], PAGE),
        )
        .unwrap();
    }
    let mut buf = Vec::new();
    s.snapshot(&mut buf).unwrap();
    let t = Store::restore(StoreConfig::default(), Box::new(HeapSource), &mut &buf[..]).unwrap();
    let fs = t.read();
    let f = fs.lookup(fs.root(), b"f", &Cred::root()).unwrap();
    let (all, _) = read(&fs, f, 0, 6 * PAGE as u32);
    assert!(all[..PAGE].iter().all(|b| *b == 1));
    assert!(all[PAGE..5 * PAGE].iter().all(|b| *b == 0));
    assert!(all[5 * PAGE..].iter().all(|b| *b == 2));
}

#[test]
fn snapshot_restores_tree_data_handles_and_cookies() {
    let s = store();
    let (f, d, l, sparse, handles, verf, cookie_after_a) = {
        let mut fs = s.write();
        let root = fs.root();
        let d = mkdir(&mut fs, root, "dir");
        let f = mkfile(&mut fs, d, "file");
        write(&mut fs, f, 0, b"hello snapshot");
        fs.link(f, root, b"hard", &Cred::root()).unwrap();
        let l = fs
            .create(
                root,
                b"link",
                &Cred::root(),
                NewNode::Symlink(Bytes::from_static(b"dir/file")),
                CreateMode::Guarded,
                &Sattr3::default(),
            )
            .unwrap();
        let sparse = mkfile(&mut fs, root, "sparse");
        write(&mut fs, sparse, 5 << 20, b"tail");
        // A removed file leaves a free slot with a bumped generation.
        let gone = mkfile(&mut fs, root, "gone");
        let gone_h = fs.handle(gone);
        fs.remove(root, b"gone", &Cred::root()).unwrap();
        let mut n = 0;
        let (e, _) = fs
            .readdir(root, &Cred::root(), 0, [0; 8], |_| {
                n += 1;
                n <= 3
            })
            .unwrap();
        let handles = vec![
            fs.handle(root),
            fs.handle(d),
            fs.handle(f),
            fs.handle(l),
            gone_h,
        ];
        (
            f,
            d,
            l,
            sparse,
            handles,
            fs.cookieverf(root),
            e.last().unwrap().cookie,
        )
    };
    let mut buf = Vec::new();
    s.snapshot(&mut buf).unwrap();
    let r = Store::restore(StoreConfig::default(), Box::new(HeapSource), &mut &buf[..]).unwrap();
    let fs = r.read();
    // Handles resolve to the same inodes; the removed one is still stale.
    assert_eq!(fs.resolve(&handles[1]), Ok(d));
    assert_eq!(fs.resolve(&handles[2]), Ok(f));
    assert_eq!(fs.resolve(&handles[3]), Ok(l));
    assert_eq!(fs.resolve(&handles[4]), Err(NfsStat3::Stale));
    assert_eq!(read(&fs, f, 0, 100).0, b"hello snapshot");
    assert_eq!(fs.getattr(f).unwrap().nlink, 2);
    assert_eq!(&fs.readlink(l).unwrap()[..], b"dir/file");
    let a = fs.getattr(sparse).unwrap();
    assert_eq!((a.size, a.used), ((5 << 20) + 4, blocks::BLOCK_SIZE as u64));
    assert_eq!(read(&fs, sparse, (5 << 20) - 2, 10).0, b"\0\0tail");
    // A cookie from before the restart continues the listing.
    let root = fs.root();
    let (rest, eof) = fs
        .readdir(root, &Cred::root(), cookie_after_a, verf, |_| true)
        .unwrap();
    assert!(eof);
    assert!(!rest.is_empty());
    assert_eq!(fs.fsstat(), s.read().fsstat());
    // Garbage and another fsid are refused.
    assert!(Store::restore(
        StoreConfig::default(),
        Box::new(HeapSource),
        &mut &b"nonsense"[..]
    )
    .is_err());
    let other = StoreConfig {
        fsid: 9,
        ..Default::default()
    };
    assert!(matches!(
        Store::restore(other, Box::new(HeapSource), &mut &buf[..]),
        Err(SnapshotError::Fsid {
            found: 1,
            expected: 9
        })
    ));
    let mut cut = buf.clone();
    cut.truncate(buf.len() / 2);
    assert!(Store::restore(StoreConfig::default(), Box::new(HeapSource), &mut &cut[..]).is_err());
}

/// WRITE data as the RDMA transport lands it: a head up to the next
/// 64 KiB boundary of the file, then 64 KiB pieces, each in a block of its
/// own (a power of two of at least 4 KiB).
pub(super) fn land_like_rdma(offset: u64, data: &[u8]) -> Payload {
    use blocks::BLOCK_SIZE;
    let skew = (offset % BLOCK_SIZE as u64) as usize;
    let mut n = data.len().min(BLOCK_SIZE - skew);
    let mut at = 0;
    let mut blocks = Vec::new();
    let mut parts = Vec::new();
    while at < data.len() {
        let size = n.max(4096).next_power_of_two().min(BLOCK_SIZE);
        let mut b = Block::new(&HeapSource, size).unwrap();
        b.get_mut().unwrap()[..n].copy_from_slice(&data[at..at + n]);
        parts.push(b.slice(0..n));
        blocks.push(b);
        at += n;
        n = (data.len() - at).min(BLOCK_SIZE);
    }
    Payload::from_parts(parts).with_attachment(std::sync::Arc::new(blocks::LandingBlocks(blocks)))
}

#[derive(Debug, Clone)]
pub(super) enum DataOp {
    Write { off: u64, len: usize, landed: bool },
    Truncate(u64),
    Read { off: u64, len: u32, hold: bool },
}

pub(super) fn data_op() -> impl proptest::strategy::Strategy<Value = DataOp> {
    use proptest::prelude::*;
    // Offsets and lengths mostly in whole pages, as clients send them.
    let off = prop_oneof![
        3 => (0u64..64).prop_map(|p| p * 4096),
        1 => 0u64..(256 << 10),
    ];
    let len = prop_oneof![
        3 => (1usize..40).prop_map(|p| p * 4096),
        1 => 1usize..(150 << 10),
    ];
    prop_oneof![
        6 => (off.clone(), len, any::<bool>())
            .prop_map(|(off, len, landed)| DataOp::Write { off, len, landed }),
        1 => (0u64..(300 << 10)).prop_map(DataOp::Truncate),
        3 => (off, 1u32..(200 << 10), any::<bool>())
            .prop_map(|(off, len, hold)| DataOp::Read { off, len, hold }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Any mix of landed and copied writes, truncations and reads (some of
    /// them held on to, as a reply being sent is) reads back as a plain
    /// byte array would, held reads never change, and removing the file
    /// gives back all its memory.
    #[test]
    fn file_data_behaves_as_a_byte_array(ops in proptest::collection::vec(data_op(), 1..40)) {
        let s = store();
        let mut fs = s.write();
        let root = fs.root();
        let f = mkfile(&mut fs, root, "f");
        let mut model: Vec<u8> = Vec::new();
        let mut held: Vec<(Payload, Vec<u8>)> = Vec::new();
        let mut fill = 0u8;
        for op in ops {
            match op {
                DataOp::Write { off, len, landed } => {
                    fill = fill.wrapping_add(1).max(1);
                    let data: Vec<u8> = (0..len).map(|i| fill ^ (i / 4096) as u8).collect();
                    let p = if landed {
                        land_like_rdma(off, &data)
                    } else {
                        Payload::from(data.clone())
                    };
                    fs.write(f, &Cred::root(), off, &p).unwrap();
                    let end = off as usize + len;
                    if model.len() < end {
                        model.resize(end, 0);
                    }
                    model[off as usize..end].copy_from_slice(&data);
                }
                DataOp::Truncate(size) => {
                    let sa = Sattr3 { size: Some(size), ..Sattr3::default() };
                    fs.setattr(f, &Cred::root(), &sa, None).unwrap();
                    model.resize(size as usize, 0);
                }
                DataOp::Read { off, len, hold } => {
                    let (r, eof) = fs.read(f, &Cred::root(), off, len).unwrap();
                    let start = (off as usize).min(model.len());
                    let end = (off as usize + len as usize).min(model.len());
                    let want = model[start..end].to_vec();
                    proptest::prop_assert_eq!(r.bytes().collect::<Vec<u8>>(), want.clone());
                    proptest::prop_assert_eq!(eof, end == model.len());
                    if hold {
                        held.push((r, want));
                    }
                }
            }
            let a = fs.getattr(f).unwrap();
            proptest::prop_assert_eq!(a.size, model.len() as u64);
            // Never more than two blocks of memory per 64 KiB stretch.
            proptest::prop_assert!(a.used <= (model.len() as u64).div_ceil(65536) * 65536 * 2);
        }
        for (r, want) in &held {
            proptest::prop_assert_eq!(&r.bytes().collect::<Vec<u8>>(), want);
        }
        let (all, _) = read(&fs, f, 0, model.len() as u32 + 1);
        proptest::prop_assert!(all == model, "final contents differ");
        fs.remove(root, b"f", &Cred::root()).unwrap();
        let (total, free, _, _) = fs.fsstat();
        proptest::prop_assert_eq!(total, free);
    }
}

fn sattr() -> Sattr3 {
    Sattr3::default()
}

fn mode_of(fs: &Fs, ino: Ino) -> u32 {
    fs.getattr(ino).unwrap().mode & 0o7777
}

/// SETATTR answers as the Linux nfsd's (client/tests/vm_permissions.rs
/// compares the two call for call in the VM).
#[test]
fn setattr_rules_follow_the_linux_nfsd() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let r = Cred::root();
    let owner = Cred {
        uid: 1000,
        gid: 1000,
        gids: vec![1000, 3000],
    };
    let groupmate = Cred {
        uid: 1002,
        gid: 1002,
        gids: vec![1000],
    };
    let other = user(1001);
    let file = |fs: &mut Fs, name: &str, mode: u32| {
        let f = mkfile(fs, root, name);
        let a = Sattr3 {
            uid: Some(1000),
            gid: Some(1000),
            ..sattr()
        };
        fs.setattr(f, &r, &a, None).unwrap();
        let m = Sattr3 {
            mode: Some(mode),
            ..sattr()
        };
        fs.setattr(f, &r, &m, None).unwrap();
        f
    };
    let uid = |v| Sattr3 {
        uid: Some(v),
        ..sattr()
    };
    let gid = |v| Sattr3 {
        gid: Some(v),
        ..sattr()
    };

    // Only root gives a file away, also to the caller itself; the owner
    // may name itself, and that clears set-user-ID and (with group
    // execute) set-group-ID, and moves ctime.
    let f = file(&mut fs, "f", 0o6774);
    assert_eq!(fs.setattr(f, &other, &uid(1001), None), Err(NfsStat3::Perm));
    assert_eq!(fs.setattr(f, &other, &uid(1000), None), Err(NfsStat3::Perm));
    assert_eq!(fs.setattr(f, &owner, &uid(1001), None), Err(NfsStat3::Perm));
    let before = fs.getattr(f).unwrap().ctime;
    std::thread::sleep(std::time::Duration::from_millis(2));
    fs.setattr(f, &owner, &uid(1000), None).unwrap();
    assert_eq!(mode_of(&fs, f), 0o774);
    assert_ne!(fs.getattr(f).unwrap().ctime, before);
    // Root's change of owner clears them too.
    let f = file(&mut fs, "f2", 0o6774);
    fs.setattr(f, &r, &uid(1001), None).unwrap();
    assert_eq!(mode_of(&fs, f), 0o774);
    // Set-group-ID without group execute marks mandatory locking: kept.
    let f = file(&mut fs, "f3", 0o6764);
    fs.setattr(f, &owner, &uid(1000), None).unwrap();
    assert_eq!(mode_of(&fs, f), 0o2764);
    // A directory keeps its set-group-ID bit (it passes the group on).
    let d = mkdir(&mut fs, root, "d");
    fs.setattr(
        d,
        &r,
        &Sattr3 {
            mode: Some(0o2775),
            ..sattr()
        },
        None,
    )
    .unwrap();
    fs.setattr(d, &r, &uid(1000), None).unwrap();
    assert_eq!(mode_of(&fs, d), 0o2775);

    // The group: the owner to a group it is in, or to the file's own.
    let f = file(&mut fs, "g", 0o664);
    fs.setattr(f, &owner, &gid(3000), None).unwrap();
    assert_eq!(fs.getattr(f).unwrap().gid, 3000);
    fs.setattr(f, &owner, &gid(3000), None).unwrap();
    assert_eq!(fs.setattr(f, &owner, &gid(4000), None), Err(NfsStat3::Perm));
    assert_eq!(fs.setattr(f, &other, &gid(3000), None), Err(NfsStat3::Perm));
    fs.setattr(f, &r, &gid(4000), None).unwrap();

    // A mode from the owner outside the file's group loses set-group-ID.
    let f = file(&mut fs, "m", 0o664);
    fs.setattr(f, &r, &gid(4000), None).unwrap();
    fs.setattr(
        f,
        &owner,
        &Sattr3 {
            mode: Some(0o2775),
            ..sattr()
        },
        None,
    )
    .unwrap();
    assert_eq!(mode_of(&fs, f), 0o775);
    assert_eq!(
        fs.setattr(
            f,
            &groupmate,
            &Sattr3 {
                mode: Some(0o600),
                ..sattr()
            },
            None
        ),
        Err(NfsStat3::Perm)
    );
    // A mode with a new owner loses set-user-ID, and set-group-ID with
    // group execute.
    let f = file(&mut fs, "mu", 0o664);
    let a = Sattr3 {
        mode: Some(0o6775),
        uid: Some(1000),
        ..sattr()
    };
    fs.setattr(f, &owner, &a, None).unwrap();
    assert_eq!(mode_of(&fs, f), 0o775);

    // Times: from the server's clock with write permission (or as the
    // owner), from the client only as the owner.
    let f = file(&mut fs, "t", 0o664);
    let server = Sattr3 {
        mtime: SetTime::ServerTime,
        ..sattr()
    };
    let client = Sattr3 {
        mtime: SetTime::ClientTime(NfsTime3 {
            seconds: 1,
            nseconds: 0,
        }),
        ..sattr()
    };
    fs.setattr(f, &groupmate, &server, None).unwrap();
    assert_eq!(fs.setattr(f, &other, &server, None), Err(NfsStat3::Acces));
    assert_eq!(
        fs.setattr(f, &groupmate, &client, None),
        Err(NfsStat3::Perm)
    );
    fs.setattr(f, &owner, &client, None).unwrap();

    // A size wants write permission before anything else is looked at.
    let f = file(&mut fs, "s", 0o644);
    let size_and_owner = Sattr3 {
        size: Some(0),
        uid: Some(1000),
        ..sattr()
    };
    assert_eq!(
        fs.setattr(f, &other, &size_and_owner, None),
        Err(NfsStat3::Acces)
    );
    assert_eq!(
        fs.setattr(f, &groupmate, &size_and_owner, None),
        Err(NfsStat3::Acces)
    );
    fs.setattr(f, &owner, &size_and_owner, None).unwrap();

    // A symbolic link's mode is 0777, whatever its creator asks for, and
    // is not changed, by anyone: no error.
    let l = fs
        .create(
            root,
            b"l",
            &r,
            NewNode::Symlink(Bytes::from_static(b"t")),
            CreateMode::Guarded,
            &Sattr3 {
                mode: Some(0o600),
                ..sattr()
            },
        )
        .unwrap();
    assert_eq!(mode_of(&fs, l), 0o777);
    fs.setattr(
        l,
        &other,
        &Sattr3 {
            mode: Some(0o600),
            ..sattr()
        },
        None,
    )
    .unwrap();
    assert_eq!(mode_of(&fs, l), 0o777);

    // Nothing to set changes nothing, not even ctime.
    let f = file(&mut fs, "n", 0o644);
    let before = fs.getattr(f).unwrap().ctime;
    std::thread::sleep(std::time::Duration::from_millis(2));
    fs.setattr(f, &other, &sattr(), None).unwrap();
    assert_eq!(fs.getattr(f).unwrap().ctime, before);
}

/// Moving a directory to another parent rewrites its "..": the caller must
/// be able to write it (NFS3ERR_ACCES), on top of the sticky rule; within
/// one parent it need not.
#[test]
fn moving_a_directory_to_another_parent_wants_write_permission_on_it() {
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let r = Cred::root();
    let alice = user(1000);
    let bob = user(1001);
    let sticky = mkdir(&mut fs, root, "sticky");
    let a = Sattr3 {
        uid: Some(1001),
        mode: Some(0o1777),
        ..Sattr3::default()
    };
    fs.setattr(sticky, &r, &a, None).unwrap();
    let other = mkdir(&mut fs, root, "open");
    fs.setattr(
        other,
        &r,
        &Sattr3 {
            mode: Some(0o777),
            ..Sattr3::default()
        },
        None,
    )
    .unwrap();
    // Alice's directory, 0755, in bob's sticky directory.
    let d = fs
        .create(
            sticky,
            b"d",
            &alice,
            NewNode::Dir,
            CreateMode::Guarded,
            &Sattr3::default(),
        )
        .unwrap();
    assert_eq!(mode_of(&fs, d), 0o755);
    assert_eq!(
        fs.rename(sticky, b"d", other, b"d", &bob),
        Err(NfsStat3::Acces)
    );
    fs.rename(sticky, b"d", sticky, b"e", &bob).unwrap();
    fs.rename(sticky, b"e", other, b"d", &alice).unwrap();
    assert_eq!(fs.lookup(d, b"..", &r).unwrap(), other);
    // A target directory that contains the source: not empty.
    let inner = mkdir(&mut fs, d, "inner");
    mkfile(&mut fs, inner, "f");
    assert_eq!(
        fs.rename(inner, b"f", other, b"d", &r),
        Err(NfsStat3::Notempty)
    );
}

#[test]
fn deallocate_frees_whole_blocks_zeroes_the_ends_and_seek_finds_data_and_holes() {
    const B: u64 = blocks::BLOCK_SIZE as u64;
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    // Four blocks of data, then a hole, then a fifth block at 6 B.
    let body: Vec<u8> = (0..4 * B).map(|i| (i % 251) as u8 + 1).collect();
    write(&mut fs, f, 0, &body);
    write(&mut fs, f, 6 * B, &[9u8; 100]);
    let size = 6 * B + 100;
    let used = fs.fsstat().0 - fs.fsstat().1;
    assert_eq!(fs.seek(f, 0, true).unwrap(), Some(0));
    assert_eq!(fs.seek(f, 0, false).unwrap(), Some(4 * B));
    assert_eq!(fs.seek(f, 4 * B + 5, true).unwrap(), Some(6 * B));
    assert_eq!(fs.seek(f, 4 * B + 5, false).unwrap(), Some(4 * B + 5));
    assert_eq!(
        fs.seek(f, 6 * B + 1, false).unwrap(),
        Some(size),
        "the end is a hole"
    );
    assert_eq!(fs.seek(f, size, true).unwrap(), None);
    // Punch from the middle of block 0 to the middle of block 3: blocks 1
    // and 2 go, the ends are zeroed, the size stays.
    let (from, to) = (B / 2, 3 * B + 100);
    fs.deallocate(f, &Cred::root(), from, to - from).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, size);
    let (got, _) = read(&fs, f, 0, (4 * B) as u32);
    for (i, b) in got.iter().enumerate() {
        let i = i as u64;
        let want = if (from..to).contains(&i) {
            0
        } else {
            body[i as usize]
        };
        assert_eq!(*b, want, "byte {i}");
    }
    let used_after = fs.fsstat().0 - fs.fsstat().1;
    assert_eq!(used - used_after, 2 * B, "two blocks' memory freed");
    assert_eq!(fs.seek(f, 0, false).unwrap(), Some(B));
    assert_eq!(fs.seek(f, B, true).unwrap(), Some(3 * B));
    // Within one block: zeroed, nothing freed.
    fs.deallocate(f, &Cred::root(), 3 * B + 200, 50).unwrap();
    let (got, _) = read(&fs, f, 3 * B + 150, 150);
    assert_eq!(
        &got[..50],
        &body[(3 * B + 150) as usize..(3 * B + 200) as usize]
    );
    assert!(got[50..100].iter().all(|b| *b == 0));
    assert_eq!(
        &got[100..],
        &body[(3 * B + 250) as usize..(3 * B + 300) as usize]
    );
    assert_eq!(fs.fsstat().0 - fs.fsstat().1, used_after);
    // Past the end, or in a hole: nothing is allocated.
    fs.deallocate(f, &Cred::root(), 4 * B + 10, 100 * B)
        .unwrap();
    assert_eq!(fs.fsstat().0 - fs.fsstat().1, used_after);
    assert_eq!(fs.getattr(f).unwrap().size, size);
    // Someone without write permission may not.
    fs.setattr(
        f,
        &Cred::root(),
        &Sattr3 {
            mode: Some(0o644),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    assert_eq!(fs.deallocate(f, &user(1000), 0, B), Err(NfsStat3::Acces));
    assert_eq!(
        fs.deallocate(root, &Cred::root(), 0, B),
        Err(NfsStat3::Isdir)
    );
}

#[test]
fn allocate_reserves_the_blocks_of_a_range_or_nothing() {
    const B: u64 = blocks::BLOCK_SIZE as u64;
    let s = Store::new(StoreConfig {
        capacity_bytes: 8 * B,
        max_inodes: 4,
        ..Default::default()
    });
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    write(&mut fs, f, 0, &[5u8; 100]);
    let free = |fs: &Fs| fs.fsstat().1;
    let before = free(&fs);
    // Blocks 2 to 4 of a file that holds only block 0: three blocks'
    // memory, the size grows, data stays, the range reads zeros.
    fs.allocate(f, &Cred::root(), 2 * B + 7, 3 * B - 7).unwrap();
    assert_eq!(before - free(&fs), 3 * B);
    assert_eq!(fs.getattr(f).unwrap().size, 5 * B);
    let (got, _) = read(&fs, f, 0, (5 * B) as u32);
    assert_eq!(&got[..100], &[5u8; 100][..]);
    assert!(got[100..].iter().all(|b| *b == 0));
    assert_eq!(fs.seek(f, 2 * B, false).unwrap(), Some(5 * B));
    assert_eq!(fs.seek(f, B, true).unwrap(), Some(2 * B));
    // Again: nothing more to hold. More than is free: NOSPC, untouched.
    fs.allocate(f, &Cred::root(), 2 * B, 3 * B).unwrap();
    assert_eq!(before - free(&fs), 3 * B);
    let left = free(&fs);
    assert_eq!(
        fs.allocate(f, &Cred::root(), 5 * B, 100 * B),
        Err(NfsStat3::Nospc)
    );
    assert_eq!(free(&fs), left);
    assert_eq!(fs.getattr(f).unwrap().size, 5 * B);
    assert_eq!(
        fs.allocate(f, &Cred::root(), u64::MAX - 5, 10),
        Err(NfsStat3::Fbig)
    );
}

#[test]
fn clone_shares_whole_blocks_copies_the_rest_and_writes_stay_apart() {
    const B: u64 = blocks::BLOCK_SIZE as u64;
    let s = store();
    let mut fs = s.write();
    let root = fs.root();
    let a = mkfile(&mut fs, root, "a");
    let b = mkfile(&mut fs, root, "b");
    // a: blocks 0-2 of data, a hole at block 3, block 4 partly.
    let mut model_a: Vec<u8> = (0..5 * B).map(|i| (i % 253) as u8 + 1).collect();
    model_a[(3 * B) as usize..(4 * B) as usize].fill(0);
    model_a.truncate((4 * B + 300) as usize);
    write(&mut fs, a, 0, &model_a[..(3 * B) as usize]);
    write(&mut fs, a, 4 * B, &model_a[(4 * B) as usize..]);
    // b: data everywhere the clone lands, and past it.
    let mut model_b = vec![0xeeu8; (7 * B) as usize];
    write(&mut fs, b, 0, &model_b);
    let (copied, _) = fs.write_stats();
    let free = fs.fsstat().1;

    // Blocks 0-3 of a (the hole too) to block 1 of b: aligned, whole
    // blocks: shared, nothing copied; b's block 4 becomes a hole.
    fs.clone_range(a, b, &Cred::root(), 0, B, 4 * B).unwrap();
    model_b[B as usize..(5 * B) as usize].copy_from_slice(&model_a[..(4 * B) as usize]);
    assert_eq!(fs.write_stats().0, copied, "whole blocks are not copied");
    assert_eq!(
        fs.seek(b, 4 * B, true).unwrap(),
        Some(5 * B),
        "the hole came along"
    );
    // b gave up one block's memory (the hole) and counts three shared ones
    // again as it held them before: its space used is unchanged but one block.
    assert_eq!(fs.fsstat().1, free + B);
    assert_eq!(read(&fs, b, 0, (7 * B) as u32).0, model_b);
    assert_eq!(fs.getattr(b).unwrap().size, 7 * B);

    // Writes to either file after the clone stay in that file.
    write(&mut fs, a, 10, b"only in a");
    model_a[10..19].copy_from_slice(b"only in a");
    write(&mut fs, b, B + 2 * B + 5, b"only in b");
    model_b[(3 * B + 5) as usize..(3 * B + 14) as usize].copy_from_slice(b"only in b");
    assert_eq!(read(&fs, a, 0, (5 * B) as u32).0, model_a);
    assert_eq!(read(&fs, b, 0, (7 * B) as u32).0, model_b);

    // Unaligned: copied; to the source's end, past b's end: b grows.
    let (from, to, n) = (1000, 6 * B + 17, model_a.len() as u64 - 1000);
    fs.clone_range(a, b, &Cred::root(), from, to, n).unwrap();
    model_b.resize((to + n) as usize, 0);
    model_b[to as usize..].copy_from_slice(&model_a[from as usize..]);
    assert_eq!(fs.getattr(b).unwrap().size, to + n);
    assert_eq!(read(&fs, b, 0, (12 * B) as u32).0, model_b);

    // Within one file, to a place that does not overlap.
    fs.clone_range(a, a, &Cred::root(), B, 2 * B, B / 2)
        .unwrap();
    let piece = model_a[B as usize..(B + B / 2) as usize].to_vec();
    model_a[(2 * B) as usize..(2 * B + B / 2) as usize].copy_from_slice(&piece);
    assert_eq!(read(&fs, a, 0, (5 * B) as u32).0, model_a);

    // Past the source's end: INVAL, nothing changed.
    assert_eq!(
        fs.clone_range(a, b, &Cred::root(), 4 * B, 0, 301),
        Err(NfsStat3::Inval)
    );
    assert_eq!(read(&fs, b, 0, (12 * B) as u32).0, model_b);
    // A directory is neither source nor destination.
    assert_eq!(
        fs.clone_range(root, b, &Cred::root(), 0, 0, 1),
        Err(NfsStat3::Isdir)
    );
    assert_eq!(
        fs.clone_range(a, root, &Cred::root(), 0, 0, 1),
        Err(NfsStat3::Isdir)
    );
}

#[test]
fn clone_of_shared_blocks_counts_against_the_capacity() {
    const B: u64 = blocks::BLOCK_SIZE as u64;
    let s = Store::new(StoreConfig {
        capacity_bytes: 4 * B,
        max_inodes: 4,
        ..Default::default()
    });
    let mut fs = s.write();
    let root = fs.root();
    let a = mkfile(&mut fs, root, "a");
    let b = mkfile(&mut fs, root, "b");
    write(&mut fs, a, 0, &vec![3u8; (3 * B) as usize]);
    // One more block fits, three do not: NOSPC.
    fs.clone_range(a, b, &Cred::root(), 0, 0, B).unwrap();
    assert_eq!(
        fs.clone_range(a, b, &Cred::root(), B, B, 2 * B),
        Err(NfsStat3::Nospc)
    );
}

#[test]
fn a_held_file_outlives_its_last_unlink_until_released() {
    let s = store();
    let (a, b, c);
    {
        let mut fs = s.write();
        let root = fs.root();
        a = mkfile(&mut fs, root, "a");
        b = mkfile(&mut fs, root, "b");
        c = mkfile(&mut fs, root, "c");
        write(&mut fs, a, 0, b"open and removed");
        write(&mut fs, b, 0, b"open and renamed over");
        fs.hold(a);
        fs.hold(b);
        fs.remove(root, b"a", &Cred::root()).unwrap();
        fs.rename(root, b"c", root, b"b", &Cred::root()).unwrap();
        // Both still read and write through their handles, with no links.
        assert_eq!(read(&fs, a, 0, 100).0, b"open and removed");
        write(&mut fs, b, 0, b"OPEN");
        assert_eq!(read(&fs, b, 0, 100).0, b"OPEN and renamed over");
        assert_eq!(fs.getattr(a).unwrap().nlink, 0);
        assert_eq!(fs.lookup(root, b"a", &Cred::root()), Err(NfsStat3::Noent));
        assert_eq!(fs.lookup(root, b"b", &Cred::root()).unwrap(), c);
    }
    // A snapshot leaves them out (their opens end with the instance).
    let mut buf = Vec::new();
    s.snapshot(&mut buf).unwrap();
    let t = Store::restore(StoreConfig::default(), Box::new(HeapSource), &mut &buf[..]).unwrap();
    assert_eq!(t.read().getattr(a).err(), Some(NfsStat3::Stale));
    assert!(t.read().getattr(c).is_ok());
    let mut fs = s.write();
    let files = fs.fsstat().3;
    fs.release(a);
    assert_eq!(fs.getattr(a).err(), Some(NfsStat3::Stale));
    assert_eq!(fs.fsstat().3, files + 1, "its inode is free again");
    // Released while linked: nothing happens; a later unlink frees it.
    fs.release(c);
    let root = fs.root();
    fs.remove(root, b"b", &Cred::root()).unwrap();
    assert_eq!(fs.getattr(c).err(), Some(NfsStat3::Stale));
    assert!(fs.getattr(b).is_ok(), "b is still held");
}

/// On a full store, RDMA-landed data is taken over when that adds nothing
/// (a whole block replaced by its landing block) and copied when taking
/// its pages over could pin more than the store may hold: a WRITE that
/// fits as a copy is never refused, and the store never holds more than
/// its capacity.
#[test]
fn landed_writes_on_a_full_store_are_taken_over_or_copied_never_refused() {
    use blocks::BLOCK_SIZE;
    let s = Store::new(StoreConfig {
        capacity_bytes: BLOCK_SIZE as u64,
        ..Default::default()
    });
    let f = {
        let mut fs = s.write();
        let root = fs.root();
        mkfile(&mut fs, root, "f")
    };
    // As the service writes: under the store's shared lock.
    let fs = s.read();
    let mut model = vec![1u8; BLOCK_SIZE];
    fs.write(f, &Cred::root(), 0, &Payload::from(model.clone()))
        .unwrap();
    assert_eq!(fs.fsstat().1, 0, "full");
    // Two pages in the middle, landed: taking them over would keep their
    // 8 KiB landing block alive beside the file's block.
    let (copied, adopted) = fs.write_stats();
    let pages = vec![2u8; 8192];
    fs.write(f, &Cred::root(), 4096, &land_like_rdma(4096, &pages))
        .unwrap();
    model[4096..12288].copy_from_slice(&pages);
    assert_eq!(
        fs.write_stats(),
        (copied + 8192, adopted),
        "copied, not taken over"
    );
    // The whole block, landed: its landing block replaces the file's.
    let whole = vec![3u8; BLOCK_SIZE];
    fs.write(f, &Cred::root(), 0, &land_like_rdma(0, &whole))
        .unwrap();
    model.copy_from_slice(&whole);
    assert_eq!(
        fs.write_stats(),
        (copied + 8192, adopted + BLOCK_SIZE as u64),
        "taken over"
    );
    assert_eq!(read(&fs, f, 0, BLOCK_SIZE as u32 + 1).0, model);
    assert_eq!(fs.getattr(f).unwrap().used, BLOCK_SIZE as u64);
    assert_eq!(fs.fsstat().1, 0);
    // Past the end a copy does not fit either.
    assert_eq!(
        fs.write(
            f,
            &Cred::root(),
            BLOCK_SIZE as u64,
            &land_like_rdma(BLOCK_SIZE as u64, &pages)
        ),
        Err(NfsStat3::Nospc)
    );
}

/// A truncate inside a page whose memory the block's other pages share
/// copies the part kept, which holds one more page: on a full store it is
/// refused (NFS3ERR_NOSPC, nothing changed), with room it goes through,
/// and the store never counts more than its capacity.
#[test]
fn a_truncate_that_must_copy_a_shared_page_reserves_it_first() {
    use blocks::PAGE;
    for room in [0, PAGE as u64] {
        let s = store();
        let mut fs = s.write();
        let root = fs.root();
        let f = mkfile(&mut fs, root, "f");
        // One landing buffer of two pages, taken over at the file's
        // second page: its second and third pages view it, counted once.
        let buf = landing_blocks(1, 2 * PAGE, 7);
        fs.write(f, &Cred::root(), PAGE as u64, &landed(&buf, 2 * PAGE))
            .unwrap();
        drop(buf);
        assert_eq!(fs.getattr(f).unwrap().used, 2 * PAGE as u64);
        // The store full but for `room`.
        fs.config.capacity_bytes = 2 * PAGE as u64 + room;
        let mut model = vec![0u8; PAGE];
        model.extend(vec![7u8; 2 * PAGE]);
        assert_eq!(read(&fs, f, 0, 4 * PAGE as u32).0, model);
        // Cut inside the third page: the second still views the buffer,
        // so the third's kept part is copied into a page of its own.
        let size = (2 * PAGE + 100) as u64;
        let r = fs.truncate(f, size);
        let counted = fs.used_bytes.load(Ordering::Relaxed);
        assert!(
            counted <= fs.config.capacity_bytes,
            "{counted} counted, room {room}"
        );
        if room == 0 {
            assert_eq!(r, Err(NfsStat3::Nospc));
            assert_eq!(fs.getattr(f).unwrap().size, 3 * PAGE as u64);
            assert_eq!(read(&fs, f, 0, 4 * PAGE as u32).0, model);
        } else {
            assert_eq!(r, Ok(()));
            assert_eq!(counted, 3 * PAGE as u64);
            // Extended again: zeros after the cut.
            fs.truncate(f, 3 * PAGE as u64).unwrap();
            model[2 * PAGE + 100..].fill(0);
            assert_eq!(read(&fs, f, 0, 4 * PAGE as u32).0, model);
        }
        // Cut to nothing: nothing held, nothing counted.
        fs.truncate(f, 0).unwrap();
        assert_eq!(fs.getattr(f).unwrap().used, 0);
        assert_eq!(fs.used_bytes.load(Ordering::Relaxed), 0);
    }
}

/// A block source that gives nothing while `failing` is set: an arena
/// with no memory left, whatever the store's capacity says.
#[derive(Clone, Default)]
struct Failing(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl blocks::BlockSource for Failing {
    fn alloc(&self, size: usize) -> Option<Box<dyn blocks::BlockMemory>> {
        if self.0.load(Ordering::SeqCst) {
            return None;
        }
        HeapSource.alloc(size)
    }
}

/// A truncate inside a shared page whose copy finds no block memory
/// (the arena exhausted, the store's capacity not reached) fails with
/// NFS3ERR_NOSPC and leaves the file as it was: its size, the page, and
/// the blocks past the new end, which a truncate drops first.
#[test]
fn a_truncate_that_finds_no_memory_for_its_copy_keeps_the_whole_file() {
    use blocks::PAGE;
    let src = Failing::default();
    let s = Store::with_source(StoreConfig::default(), Box::new(src.clone()));
    let mut fs = s.write();
    let root = fs.root();
    let f = mkfile(&mut fs, root, "f");
    // Pages 1 to 3 of block 0 view one landing buffer; block 1 is data
    // of its own.
    let buf = landing_blocks(1, 3 * PAGE, 7);
    fs.write(f, &Cred::root(), PAGE as u64, &landed(&buf, 3 * PAGE))
        .unwrap();
    drop(buf);
    write(&mut fs, f, BLOCK_SIZE as u64, &[5u8; 1000]);
    let mut model = vec![0u8; PAGE];
    model.extend(vec![7u8; 3 * PAGE]);
    model.resize(BLOCK_SIZE, 0);
    model.extend(vec![5u8; 1000]);
    let len = model.len() as u32;
    let before = fs.getattr(f).unwrap();
    let counted = fs.used_bytes.load(Ordering::Relaxed);
    assert_eq!(read(&fs, f, 0, len).0, model);

    src.0.store(true, Ordering::SeqCst);
    assert_eq!(
        fs.truncate(f, (2 * PAGE + 100) as u64),
        Err(NfsStat3::Nospc)
    );
    let after = fs.getattr(f).unwrap();
    assert_eq!((after.size, after.used), (before.size, before.used));
    assert_eq!(fs.used_bytes.load(Ordering::Relaxed), counted);
    assert_eq!(read(&fs, f, 0, len).0, model);

    // With memory again the same truncate goes through.
    src.0.store(false, Ordering::SeqCst);
    fs.truncate(f, (2 * PAGE + 100) as u64).unwrap();
    fs.truncate(f, u64::from(len)).unwrap();
    model[2 * PAGE + 100..].fill(0);
    assert_eq!(read(&fs, f, 0, len).0, model);
}
