//! `nfsrdma mount`: an NFSv3 export mounted in user space through FUSE.
//!
//! - [`options`]: the `-o` options, in the spirit of mount.nfs(5).
//! - [`fs`]: the FUSE file system: inode table (FUSE inode numbers <->
//!   NFS file handles), attribute and name caches with close-to-open
//!   consistency, reads and writes split into rsize/wsize RPCs with several
//!   in flight, unstable writes kept until a COMMIT with the same write
//!   verifier succeeds.
//! - [`errno`]: nfsstat3 -> errno.
//!
//! Without `-f` the command re-executes itself in the foreground with its
//! standard streams detached, in a new session, and returns once the mount
//! shows in `/proc/self/mountinfo` (or with the child's error when the child
//! exits first). SIGTERM and SIGINT write back, unmount and exit.

pub mod errno;
pub mod fs;
pub mod options;

use crate::cli::{ConnArgs, RemotePath};
use crate::Client;
use anyhow::{bail, Context, Result};
use options::{MountOptions, OptionList};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Set in the environment of the re-executed foreground process.
const DAEMON_ENV: &str = "NFSRDMA_MOUNT_DAEMON";

/// `nfsrdma mount`.
#[derive(Debug, Clone, clap::Args)]
pub struct MountArgs {
    /// SERVER:/export to mount.
    pub source: RemotePath,
    /// Local directory to mount it on.
    pub mountpoint: PathBuf,
    /// Mount options, comma separated (may be repeated): proto=tcp|rdma,
    /// port=N, mountport=N, rsize=N, wsize=N, remote_inv=on|off,
    /// reg=mw|reg-mr|persistent, ac, noac, actimeo=S, acregmin=S,
    /// acregmax=S, acdirmin=S, acdirmax=S, ro, rw, uid=N, gid=N, soft, hard,
    /// timeo=DECISECONDS, retrans=N, threads=N.
    #[arg(short = 'o', value_name = "OPTIONS", value_parser = options::parse_list)]
    pub options: Vec<OptionList>,
    /// Stay in the foreground (otherwise detach once mounted).
    #[arg(short = 'f', long)]
    pub foreground: bool,
}

/// `nfsrdma umount`.
#[derive(Debug, Clone, clap::Args)]
pub struct UmountArgs {
    /// The mount point.
    pub mountpoint: PathBuf,
    /// Detach now and clean up when no longer busy (MNT_DETACH).
    #[arg(short = 'l', long)]
    pub lazy: bool,
}

/// Runs `nfsrdma mount`.
pub async fn mount_main(conn: &ConnArgs, args: MountArgs) -> Result<()> {
    let opts = MountOptions::from_args(conn, &args.options);
    check_fuse_device()?;
    let mountpoint = std::fs::canonicalize(&args.mountpoint)
        .with_context(|| format!("mount point {}", args.mountpoint.display()))?;
    if !mountpoint.is_dir() {
        bail!("mount point {} is not a directory", mountpoint.display());
    }
    let fsname = args.source.to_string();
    if !args.foreground && std::env::var_os(DAEMON_ENV).is_none() {
        return spawn_daemon(&mountpoint, &fsname, opts.conn.timeo);
    }
    if std::env::var_os(DAEMON_ENV).is_some() {
        // Leave the caller's session and process group: a terminal's
        // signals must not reach the daemon. Failure (already a session
        // leader) is harmless.
        let _ = nix::unistd::setsid();
    }
    let client = Client::connect(&opts.conn, &args.source.server, &args.source.path)
        .await
        .with_context(|| format!("cannot mount {fsname}"))?;
    tracing::info!(
        rsize = client.rsize(),
        wsize = client.wsize(),
        "mounted {fsname} on {}",
        mountpoint.display()
    );
    let result = fs::serve(client.clone(), &opts, &mountpoint, &fsname).await;
    if let Err(e) = client.unmount().await {
        tracing::warn!("UMNT of {fsname}: {e}");
    }
    client.shutdown();
    result
}

/// Runs `nfsrdma umount`.
pub fn umount_main(args: &UmountArgs) -> Result<()> {
    let path = std::fs::canonicalize(&args.mountpoint).unwrap_or_else(|_| args.mountpoint.clone());
    match find_mount(&path, None) {
        None => bail!("{} is not mounted", path.display()),
        Some(t) if !t.starts_with("fuse") => {
            bail!(
                "{} is a {t} mount, not an nfsrdma (FUSE) one",
                path.display()
            )
        }
        Some(_) => {}
    }
    let flags = if args.lazy {
        nix::mount::MntFlags::MNT_DETACH
    } else {
        nix::mount::MntFlags::empty()
    };
    nix::mount::umount2(&path, flags)
        .map_err(std::io::Error::from)
        .with_context(|| format!("cannot unmount {}", path.display()))?;
    Ok(())
}

fn check_fuse_device() -> Result<()> {
    if Path::new("/dev/fuse").exists() {
        return Ok(());
    }
    // Try loading the module once (works as root when it is available).
    let _ = std::process::Command::new("modprobe")
        .arg("fuse")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    if Path::new("/dev/fuse").exists() {
        return Ok(());
    }
    bail!(
        "/dev/fuse is missing: load the kernel module (`modprobe fuse`) or, in a \
         container, pass the device through (--device /dev/fuse)"
    )
}

/// Re-executes this command in the foreground, detached, and waits until
/// the mount appears (or the child fails).
fn spawn_daemon(mountpoint: &Path, fsname: &str, timeo: Duration) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let mut child = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("-f")
        .env(DAEMON_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot start the mount process")?;
    // Connection set-up is soft and bounded by the time-outs; wait a
    // little longer than that.
    let limit = timeo.max(Duration::from_secs(15)) * 4 + Duration::from_secs(30);
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let mut msg = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut msg);
            }
            let msg = msg.trim();
            let msg = msg.strip_prefix("nfsrdma: ").unwrap_or(msg);
            bail!("{} (mount process {status})", msg);
        }
        if find_mount(mountpoint, Some(fsname)).is_some() {
            return Ok(());
        }
        if start.elapsed() > limit {
            bail!(
                "{fsname} did not appear on {} within {limit:?} (mount process {} still running)",
                mountpoint.display(),
                child.id()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The mount at `mountpoint` in /proc/self/mountinfo (its file system type),
/// optionally only one whose source is `source`.
pub fn find_mount(mountpoint: &Path, source: Option<&str>) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = mountpoint.to_string_lossy();
    let mut found = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || fields.len() < sep + 3 {
            continue;
        }
        if unescape(fields[4]) != want {
            continue;
        }
        if let Some(src) = source {
            if unescape(fields[sep + 2]) != src {
                continue;
            }
        }
        // The last one listed is the one on top.
        found = Some(fields[sep + 1].to_string());
    }
    found
}

/// Undoes mountinfo's octal escapes (`\040` for a space ...).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
        assert_eq!(unescape(r"/x\"), r"/x\");
    }
}
