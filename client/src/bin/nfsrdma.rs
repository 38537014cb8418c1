//! `nfsrdma`: command-line NFSv3 tools over TCP or RPC-over-RDMA.

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use nfsrdma_client::cli::{ConnArgs, RemotePath};
use nfsrdma_client::xdr::nfs3::{CreateHow3, Fattr3, Ftype3, NfsFh3, NfsStat3, Sattr3};
use nfsrdma_client::{Client, ClientError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// NFSv3 client tools: list, copy, show, create and remove files on an NFS
/// server, mount an export (FUSE) and measure latency (bench), over TCP or
/// RPC-over-RDMA.
#[derive(Debug, Parser)]
#[command(name = "nfsrdma", version)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    /// More log output on stderr (-v: info, -vv: debug, -vvv: trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// List a directory (or describe a file) like `ls -l`.
    Ls {
        /// List subdirectories recursively.
        #[arg(short = 'R', long)]
        recursive: bool,
        /// SERVER:/export[/PATH]
        target: RemotePath,
    },
    /// Copy a remote file to a local file.
    Get {
        /// SERVER:/export/PATH
        remote: RemotePath,
        /// Local file (or directory to put it in).
        local: PathBuf,
    },
    /// Copy a local file to the server.
    Put {
        /// Local file.
        local: PathBuf,
        /// SERVER:/export/PATH (or an existing directory to put it in).
        remote: RemotePath,
    },
    /// Write a remote file to standard output.
    Cat {
        /// SERVER:/export/PATH
        remote: RemotePath,
    },
    /// Show a remote file's attributes.
    Stat {
        /// SERVER:/export/PATH
        remote: RemotePath,
    },
    /// Create a remote directory.
    Mkdir {
        /// SERVER:/export/PATH
        remote: RemotePath,
    },
    /// Remove a remote file (or, with -r, a directory tree).
    Rm {
        /// Remove directories and their contents.
        #[arg(short = 'r', long)]
        recursive: bool,
        /// SERVER:/export/PATH
        remote: RemotePath,
    },
    /// Latency lab: QD1 write/rewrite/read/reread per record size, or a
    /// throughput run, for one or more variants of the connection options.
    Bench(Box<nfsrdma_client::bench::BenchArgs>),
    /// Mount an export on a local directory through FUSE.
    Mount(nfsrdma_client::fusemount::MountArgs),
    /// Unmount a directory mounted with `nfsrdma mount`.
    Umount(nfsrdma_client::fusemount::UmountArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("nfsrdma: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nfsrdma: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    if !matches!(cli.cmd, Cmd::Bench(_)) {
        cli.conn.check_single().map_err(anyhow::Error::msg)?;
    }
    let opts = cli.conn.to_options();
    match cli.cmd {
        Cmd::Bench(args) => nfsrdma_client::bench::main(&cli.conn, &args).await,
        Cmd::Mount(args) => nfsrdma_client::fusemount::mount_main(&cli.conn, args).await,
        Cmd::Umount(args) => nfsrdma_client::fusemount::umount_main(&args),
        Cmd::Ls { recursive, target } => {
            with_target(&opts, &target, |c, rest| {
                ls(c, rest, recursive, target.clone())
            })
            .await
        }
        Cmd::Get { remote, local } => {
            with_target(&opts, &remote, |c, rest| get(c, rest, local)).await
        }
        Cmd::Put { local, remote } => {
            // Open the local file first: a missing file is reported without
            // touching the server.
            let file = tokio::fs::File::open(&local)
                .await
                .with_context(|| format!("cannot read {}", local.display()))?;
            with_parent(&opts, &remote, |c, rest| put(c, rest, file, local)).await
        }
        Cmd::Cat { remote } => with_target(&opts, &remote, cat).await,
        Cmd::Stat { remote } => {
            with_target(&opts, &remote, |c, rest| stat(c, rest, remote.clone())).await
        }
        Cmd::Mkdir { remote } => with_parent(&opts, &remote, mkdir).await,
        Cmd::Rm { recursive, remote } => {
            with_parent(&opts, &remote, |c, rest| rm(c, rest, recursive)).await
        }
    }
}

/// Mounts the longest mountable prefix of `target`, runs `f` with the rest
/// of the path, then unmounts.
async fn with_target<F, Fut>(
    opts: &nfsrdma_client::ConnectOptions,
    target: &RemotePath,
    f: F,
) -> Result<()>
where
    F: FnOnce(Client, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    run_at(opts, target, &target.path, None, f).await
}

/// Like [`with_target`] for commands that act on a name in a directory
/// (create, remove): mounts from the parent, so that the last component is
/// always looked up (never mounted itself).
async fn with_parent<F, Fut>(
    opts: &nfsrdma_client::ConnectOptions,
    target: &RemotePath,
    f: F,
) -> Result<()>
where
    F: FnOnce(Client, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let Some((parent, name)) = target.split_last() else {
        bail!("{target}: needs a path below an export");
    };
    run_at(opts, target, &parent, Some(&name), f).await
}

async fn run_at<F, Fut>(
    opts: &nfsrdma_client::ConnectOptions,
    target: &RemotePath,
    mount_from: &str,
    name: Option<&str>,
    f: F,
) -> Result<()>
where
    F: FnOnce(Client, String) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let (client, mut rest) = Client::connect_path(opts, &target.server, mount_from)
        .await
        .with_context(|| target.to_string())?;
    if let Some(name) = name {
        if !rest.is_empty() {
            rest.push('/');
        }
        rest.push_str(name);
    }
    let result = f(client.clone(), rest)
        .await
        .with_context(|| target.to_string());
    if let Err(e) = client.unmount().await {
        tracing::info!(error = %e, "UMNT failed");
    }
    client.shutdown();
    result
}

/// Splits a relative path into its parent and last component.
fn split_rest(rest: &str) -> Option<(&str, &str)> {
    if rest.is_empty() {
        return None;
    }
    Some(rest.rsplit_once('/').unwrap_or(("", rest)))
}

fn basename(p: &Path) -> Result<String> {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| anyhow!("{} has no file name", p.display()))
}

fn mode_string(a: &Fattr3) -> String {
    let t = match a.type_ {
        Ftype3::Reg => '-',
        Ftype3::Dir => 'd',
        Ftype3::Blk => 'b',
        Ftype3::Chr => 'c',
        Ftype3::Lnk => 'l',
        Ftype3::Sock => 's',
        Ftype3::Fifo => 'p',
    };
    let m = a.mode;
    let bit = |mask: u32, c: char| if m & mask != 0 { c } else { '-' };
    let special = |x: bool, s: bool, lower: char, upper: char| match (x, s) {
        (true, true) => lower,
        (false, true) => upper,
        (true, false) => 'x',
        (false, false) => '-',
    };
    let mut s = String::with_capacity(10);
    s.push(t);
    s.push(bit(0o400, 'r'));
    s.push(bit(0o200, 'w'));
    s.push(special(m & 0o100 != 0, m & 0o4000 != 0, 's', 'S'));
    s.push(bit(0o040, 'r'));
    s.push(bit(0o020, 'w'));
    s.push(special(m & 0o010 != 0, m & 0o2000 != 0, 's', 'S'));
    s.push(bit(0o004, 'r'));
    s.push(bit(0o002, 'w'));
    s.push(special(m & 0o001 != 0, m & 0o1000 != 0, 't', 'T'));
    s
}

fn type_name(t: Ftype3) -> &'static str {
    match t {
        Ftype3::Reg => "regular file",
        Ftype3::Dir => "directory",
        Ftype3::Blk => "block device",
        Ftype3::Chr => "character device",
        Ftype3::Lnk => "symbolic link",
        Ftype3::Sock => "socket",
        Ftype3::Fifo => "fifo",
    }
}

async fn long_line(c: &Client, name: &str, fh: Option<&NfsFh3>, a: &Fattr3) -> String {
    let mut line = format!(
        "{} {:>3} {:>5} {:>5} {:>10} {}",
        mode_string(a),
        a.nlink,
        a.uid,
        a.gid,
        a.size,
        name
    );
    if a.type_ == Ftype3::Lnk {
        if let Some(fh) = fh {
            if let Ok(l) = c.readlink(fh).await {
                line.push_str(" -> ");
                line.push_str(&String::from_utf8_lossy(&l.data));
            }
        }
    }
    line
}

async fn ls(c: Client, rest: String, recursive: bool, target: RemotePath) -> Result<()> {
    let (fh, attr) = c.lookup_path(&rest).await?;
    let mut out = std::io::stdout().lock();
    if attr.type_ != Ftype3::Dir {
        let name = rest.rsplit('/').next().unwrap_or(&rest).to_string();
        writeln!(out, "{}", long_line(&c, &name, Some(&fh), &attr).await)?;
        return Ok(());
    }
    // Directories to list, depth first, in name order.
    let mut stack = vec![(target.path.clone(), fh)];
    let mut first = true;
    while let Some((path, dir)) = stack.pop() {
        let mut entries = c.readdir_all(&dir).await?;
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        if recursive {
            if !first {
                writeln!(out)?;
            }
            writeln!(out, "{path}:")?;
        }
        first = false;
        let mut subdirs = Vec::new();
        for e in &entries {
            let name = e.name_lossy();
            let attr = match (&e.attr, &e.handle) {
                (Some(a), _) => a.clone(),
                (None, Some(h)) => c.getattr(h).await?,
                (None, None) => c
                    .lookup(&dir, &e.name)
                    .await?
                    .obj_attributes
                    .unwrap_or_default(),
            };
            writeln!(
                out,
                "{}",
                long_line(&c, &name, e.handle.as_ref(), &attr).await
            )?;
            if recursive && attr.type_ == Ftype3::Dir {
                let h = match &e.handle {
                    Some(h) => h.clone(),
                    None => c.lookup(&dir, &e.name).await?.object,
                };
                let child = if path == "/" {
                    format!("/{name}")
                } else {
                    format!("{path}/{name}")
                };
                subdirs.push((child, h));
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(())
}

async fn get(c: Client, rest: String, local: PathBuf) -> Result<()> {
    let (fh, attr) = c.lookup_path(&rest).await?;
    if attr.type_ != Ftype3::Reg {
        bail!("not a regular file ({})", type_name(attr.type_));
    }
    let local = if local.is_dir() {
        let name = split_rest(&rest)
            .map(|(_, n)| n.to_string())
            .ok_or_else(|| anyhow!("cannot name a local file after the export root"))?;
        local.join(name)
    } else {
        local
    };
    let mut f = tokio::fs::File::create(&local)
        .await
        .with_context(|| format!("cannot create {}", local.display()))?;
    read_to(&c, &fh, &mut f)
        .await
        .with_context(|| format!("cannot write {}", local.display()))?;
    Ok(())
}

/// Bytes moved per step by get, cat and put: enough for `io_depth` RPCs
/// in flight, without holding a whole large file in memory.
fn window(c: &Client, size: u32) -> u64 {
    u64::from(size) * c.options().io_depth.max(1) as u64
}

/// Copies a remote file to `out`, one window at a time.
async fn read_to<W: tokio::io::AsyncWrite + Unpin>(
    c: &Client,
    fh: &NfsFh3,
    out: &mut W,
) -> Result<()> {
    use tokio::io::AsyncWriteExt;
    let step = window(c, c.rsize());
    let mut offset = 0u64;
    loop {
        let (data, eof) = c.read_range(fh, offset, step).await?;
        for p in data.parts() {
            out.write_all(p).await?;
        }
        offset += data.len() as u64;
        if eof || data.is_empty() {
            break;
        }
    }
    out.flush().await?;
    Ok(())
}

async fn put(c: Client, rest: String, mut file: tokio::fs::File, local: PathBuf) -> Result<()> {
    // The target is an existing directory: put the file inside it.
    let (dir, name) = match c.lookup_path(&rest).await {
        Ok((fh, a)) if a.type_ == Ftype3::Dir => (fh, basename(&local)?),
        Ok(_) | Err(ClientError::Nfs(_, NfsStat3::Noent)) => {
            let (parent, name) =
                split_rest(&rest).ok_or_else(|| anyhow!("cannot write over the export root"))?;
            let (dir, a) = c.lookup_path(parent).await?;
            if a.type_ != Ftype3::Dir {
                bail!("{parent}: not a directory");
            }
            (dir, name.to_string())
        }
        Err(e) => return Err(e.into()),
    };
    let created = c
        .create(
            &dir,
            &name,
            CreateHow3::Unchecked(Sattr3 {
                mode: Some(0o644),
                size: Some(0),
                ..Sattr3::default()
            }),
        )
        .await?;
    let fh = match created.obj {
        Some(fh) => fh,
        None => c.lookup(&dir, &name).await?.object,
    };
    use tokio::io::AsyncReadExt;
    let step = window(&c, c.wsize()) as usize;
    let mut offset = 0u64;
    loop {
        let mut buf = bytes::BytesMut::with_capacity(step);
        while buf.len() < step {
            let n = file
                .read_buf(&mut buf)
                .await
                .with_context(|| format!("cannot read {}", local.display()))?;
            if n == 0 {
                break;
            }
        }
        if buf.is_empty() {
            break;
        }
        let n = buf.len() as u64;
        c.write_all(&fh, offset, buf.freeze()).await?;
        offset += n;
    }
    Ok(())
}

async fn cat(c: Client, rest: String) -> Result<()> {
    let (fh, attr) = c.lookup_path(&rest).await?;
    if attr.type_ == Ftype3::Dir {
        bail!("is a directory");
    }
    read_to(&c, &fh, &mut tokio::io::stdout()).await
}

async fn stat(c: Client, rest: String, target: RemotePath) -> Result<()> {
    let (_, a) = c.lookup_path(&rest).await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "  File: {target}")?;
    writeln!(out, "  Type: {}", type_name(a.type_))?;
    writeln!(out, "  Size: {}  Used: {}", a.size, a.used)?;
    writeln!(
        out,
        "  Mode: {:04o} ({})  Links: {}",
        a.mode & 0o7777,
        mode_string(&a),
        a.nlink
    )?;
    writeln!(out, "   Uid: {}  Gid: {}", a.uid, a.gid)?;
    writeln!(out, "  Fsid: {:#x}  Fileid: {}", a.fsid, a.fileid)?;
    if matches!(a.type_, Ftype3::Blk | Ftype3::Chr) {
        writeln!(out, "  Rdev: {},{}", a.rdev.specdata1, a.rdev.specdata2)?;
    }
    for (what, t) in [
        ("Access", a.atime),
        ("Modify", a.mtime),
        ("Change", a.ctime),
    ] {
        writeln!(out, "{what:>6}: {}.{:09}", t.seconds, t.nseconds)?;
    }
    Ok(())
}

async fn mkdir(c: Client, rest: String) -> Result<()> {
    let Some((parent, name)) = split_rest(&rest) else {
        bail!("needs a path below an export");
    };
    let (dir, _) = c.lookup_path(parent).await?;
    c.mkdir(
        &dir,
        name,
        &Sattr3 {
            mode: Some(0o755),
            ..Sattr3::default()
        },
    )
    .await?;
    Ok(())
}

async fn rm(c: Client, rest: String, recursive: bool) -> Result<()> {
    let Some((parent, name)) = split_rest(&rest) else {
        bail!("cannot remove an export root");
    };
    let (dir, _) = c.lookup_path(parent).await?;
    let found = c.lookup(&dir, name).await?;
    let attr = match found.obj_attributes {
        Some(a) => a,
        None => c.getattr(&found.object).await?,
    };
    if attr.type_ != Ftype3::Dir {
        c.remove(&dir, name).await?;
        return Ok(());
    }
    if !recursive {
        bail!("is a directory (use -r to remove it and its contents)");
    }
    remove_tree(&c, &found.object).await?;
    c.rmdir(&dir, name).await?;
    Ok(())
}

/// Empties a directory tree (iteratively, so a deep tree cannot exhaust the
/// stack).
async fn remove_tree(c: &Client, top: &NfsFh3) -> Result<()> {
    // Each directory is visited twice: first to remove its files and queue
    // its subdirectories, then (after them) to remove the emptied
    // subdirectories.
    let mut stack: Vec<(NfsFh3, bool)> = vec![(top.clone(), false)];
    while let Some((dir, emptied)) = stack.pop() {
        let entries = c.readdir_all(&dir).await?;
        if emptied {
            for e in entries {
                c.rmdir(&dir, &e.name).await?;
            }
            continue;
        }
        stack.push((dir.clone(), true));
        for e in entries {
            let is_dir = match &e.attr {
                Some(a) => a.type_ == Ftype3::Dir,
                None => {
                    c.lookup(&dir, &e.name)
                        .await?
                        .obj_attributes
                        .map(|a| a.type_)
                        == Some(Ftype3::Dir)
                }
            };
            if is_dir {
                let h = match e.handle {
                    Some(h) => h,
                    None => c.lookup(&dir, &e.name).await?.object,
                };
                stack.push((h, false));
            } else {
                c.remove(&dir, &e.name).await?;
            }
        }
    }
    Ok(())
}
