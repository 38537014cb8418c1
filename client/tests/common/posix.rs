//! The POSIX behaviour checks every NFS mount of this project's tests
//! must pass: create, write at offsets, append, rename over a file, hard
//! and symbolic links, chmod/chown/utimens, truncate down and up,
//! O_TRUNC, a sparse file, O_EXCL, directories (ENOTEMPTY, EEXIST,
//! ENOENT, ENOTDIR), a fifo and a character device, listing, statfs.
//! Written once, run through `nfsrdma mount` (client/tests/common/
//! mount_suite.rs) and through the Linux kernel client's NFSv4.1/4.2
//! mounts (server/tests/vm_kernel_nfs4.rs, which includes this file by
//! path). Std only, so that both crates' tests can include it.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

// Linux errno values the checks expect.
const ENOENT: i32 = 2;
const EEXIST: i32 = 17;
const ENOTDIR: i32 = 20;
const ENOTEMPTY: i32 = 39;

fn at(dir: &Path, rel: &str) -> PathBuf {
    dir.join(rel)
}

pub fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Runs `cmd`; panics with its output when it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run command");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs the checks in `dir`, an empty directory on the mount (the
/// listing check expects only what they create); leaves their files.
pub fn posix_checks(dir: &Path) {
    // Create, write, read back.
    fs::write(at(dir, "a.txt"), b"hello, world\n").unwrap();
    assert_eq!(fs::read(at(dir, "a.txt")).unwrap(), b"hello, world\n");
    assert_eq!(fs::metadata(at(dir, "a.txt")).unwrap().len(), 13);

    // Writes at offsets, overwrite in the middle, append.
    {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(at(dir, "a.txt"))
            .unwrap();
        f.seek(SeekFrom::Start(7)).unwrap();
        f.write_all(b"WORLD").unwrap();
        f.sync_all().unwrap();
    }
    {
        let mut f = OpenOptions::new()
            .append(true)
            .open(at(dir, "a.txt"))
            .unwrap();
        f.write_all(b"more\n").unwrap();
    }
    assert_eq!(fs::read(at(dir, "a.txt")).unwrap(), b"hello, WORLD\nmore\n");

    // Rename (also over an existing file), then the old name is gone.
    fs::write(at(dir, "b.txt"), b"b").unwrap();
    fs::rename(at(dir, "a.txt"), at(dir, "b.txt")).unwrap();
    assert_eq!(
        errno_of(&fs::metadata(at(dir, "a.txt")).unwrap_err()),
        ENOENT
    );
    assert_eq!(fs::read(at(dir, "b.txt")).unwrap(), b"hello, WORLD\nmore\n");

    // Hard link: same inode, two links.
    fs::hard_link(at(dir, "b.txt"), at(dir, "c.txt")).unwrap();
    let (b, c) = (
        fs::metadata(at(dir, "b.txt")).unwrap(),
        fs::metadata(at(dir, "c.txt")).unwrap(),
    );
    assert_eq!(b.ino(), c.ino());
    assert_eq!(c.nlink(), 2);
    fs::remove_file(at(dir, "c.txt")).unwrap();
    assert_eq!(fs::metadata(at(dir, "b.txt")).unwrap().nlink(), 1);

    // Symlink and readlink.
    std::os::unix::fs::symlink("b.txt", at(dir, "ln")).unwrap();
    assert_eq!(fs::read_link(at(dir, "ln")).unwrap(), Path::new("b.txt"));
    assert!(fs::symlink_metadata(at(dir, "ln"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(at(dir, "ln")).unwrap(), b"hello, WORLD\nmore\n");

    // chmod, chown, utimens.
    fs::set_permissions(at(dir, "b.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(
        fs::metadata(at(dir, "b.txt")).unwrap().mode() & 0o7777,
        0o640
    );
    std::os::unix::fs::chown(at(dir, "b.txt"), Some(1234), Some(5678)).unwrap();
    let md = fs::metadata(at(dir, "b.txt")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let when = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options()
        .write(true)
        .open(at(dir, "b.txt"))
        .unwrap()
        .set_modified(when)
        .unwrap();
    assert_eq!(
        fs::metadata(at(dir, "b.txt")).unwrap().mtime(),
        1_000_000_000
    );

    // Truncate down and up.
    let f = OpenOptions::new()
        .write(true)
        .open(at(dir, "b.txt"))
        .unwrap();
    f.set_len(5).unwrap();
    drop(f);
    assert_eq!(fs::read(at(dir, "b.txt")).unwrap(), b"hello");
    let f = OpenOptions::new()
        .write(true)
        .open(at(dir, "b.txt"))
        .unwrap();
    f.set_len(8).unwrap();
    drop(f);
    assert_eq!(fs::read(at(dir, "b.txt")).unwrap(), b"hello\0\0\0");
    // O_TRUNC.
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(at(dir, "b.txt"))
        .unwrap();
    assert_eq!(fs::metadata(at(dir, "b.txt")).unwrap().len(), 0);

    // Sparse file: a write far out, zeros before it.
    {
        let mut f = File::create(at(dir, "sparse")).unwrap();
        f.seek(SeekFrom::Start(10 << 20)).unwrap();
        f.write_all(b"end").unwrap();
    }
    let mut f = File::open(at(dir, "sparse")).unwrap();
    assert_eq!(f.metadata().unwrap().len(), (10 << 20) + 3);
    let mut buf = vec![1u8; 4096];
    f.seek(SeekFrom::Start(5 << 20)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    let mut tail = Vec::new();
    f.seek(SeekFrom::Start(10 << 20)).unwrap();
    f.read_to_end(&mut tail).unwrap();
    assert_eq!(tail, b"end");
    drop(f);

    // O_EXCL: the second exclusive create fails with EEXIST.
    let f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(at(dir, "excl"))
        .unwrap();
    drop(f);
    assert_eq!(fs::metadata(at(dir, "excl")).unwrap().mode() & 0o777, 0o600);
    let e = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(at(dir, "excl"))
        .unwrap_err();
    assert_eq!(errno_of(&e), EEXIST);

    // Directories.
    fs::create_dir(at(dir, "d")).unwrap();
    fs::write(at(dir, "d/x"), b"x").unwrap();
    assert_eq!(
        errno_of(&fs::remove_dir(at(dir, "d")).unwrap_err()),
        ENOTEMPTY
    );
    assert_eq!(errno_of(&fs::create_dir(at(dir, "d")).unwrap_err()), EEXIST);
    fs::rename(at(dir, "d"), at(dir, "e")).unwrap();
    assert_eq!(fs::read(at(dir, "e/x")).unwrap(), b"x");
    fs::remove_file(at(dir, "e/x")).unwrap();
    fs::remove_dir(at(dir, "e")).unwrap();
    assert_eq!(
        errno_of(&fs::remove_file(at(dir, "nope")).unwrap_err()),
        ENOENT
    );
    assert_eq!(
        errno_of(&fs::read_dir(at(dir, "b.txt")).unwrap_err()),
        ENOTDIR
    );

    // mknod: a FIFO.
    run(Command::new("mkfifo").arg(at(dir, "fifo")));
    assert!(fs::metadata(at(dir, "fifo")).unwrap().file_type().is_fifo());
    // mknod: a character device (1:3, like /dev/null); removed again.
    run(Command::new("mknod")
        .arg(at(dir, "chr"))
        .args(["c", "1", "3"]));
    let md = fs::metadata(at(dir, "chr")).unwrap();
    assert!(md.file_type().is_char_device());
    assert_eq!(md.rdev(), 0x103);
    fs::remove_file(at(dir, "chr")).unwrap();

    // Listing.
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b.txt", "excl", "fifo", "ln", "sparse"]);

    // statfs.
    let out = run(Command::new("stat").args(["-f", "-c", "%b %S"]).arg(dir));
    let blocks: u64 = out.split_whitespace().next().unwrap().parse().unwrap();
    assert!(blocks > 0, "statfs: {out}");
}
