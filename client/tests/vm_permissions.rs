//! Permission rules of SETATTR, REMOVE, RMDIR, RENAME and LINK, compared
//! call for call with the Linux kernel nfsd: the same calls, with the same
//! AUTH_SYS credentials, on the same trees, against both servers; every
//! answer (status, and for SETATTR the owner, group, mode and whether ctime
//! moved) must be the kernel nfsd's. Our server runs in-process over TCP;
//! the kernel nfsd is started with tests/vm/guest/knfsd-up (TCP 2049, MOUNT
//! through rpcbind), so this runs in the VM: `scripts/test-vm --
//! vm_permissions`.

mod common;

use common::{opts_at, TestServer, EXPORTS};
use nfsrdma_client::xdr::nfs3::*;
use nfsrdma_client::{Auth, AuthSys, Client, ClientError, ConnectOptions};
use std::fmt::Write as _;
use std::time::Duration;

/// The callers: the objects' owner (also in group 3000), a member of the
/// owner's group, someone else, and root.
const OWNER: u32 = 1000;
const GROUPMATE: u32 = 1002;
const OTHER: u32 = 1001;
const ROOT: u32 = 0;

fn cred(uid: u32) -> Auth {
    let (gid, gids) = match uid {
        OWNER => (1000, vec![1000, 3000]),
        GROUPMATE => (1002, vec![1002, 1000]),
        ROOT => (0, vec![]),
        u => (u, vec![u]),
    };
    Auth::Sys(AuthSys {
        uid,
        gid,
        gids,
        machine_name: "permissions-test".into(),
    })
}

fn who(uid: u32) -> &'static str {
    match uid {
        OWNER => "owner",
        GROUPMATE => "groupmate",
        OTHER => "other",
        _ => "root",
    }
}

/// One server, a client per caller, and the export's root handle.
struct Side {
    name: &'static str,
    clients: Vec<(u32, Client)>,
    root: NfsFh3,
}

impl Side {
    async fn connect(name: &'static str, base: ConnectOptions, server: &str) -> Side {
        let mut clients = Vec::new();
        for uid in [ROOT, OWNER, GROUPMATE, OTHER] {
            let o = ConnectOptions {
                auth: cred(uid),
                ..base.clone()
            };
            let c = Client::connect(&o, server, "/export")
                .await
                .unwrap_or_else(|e| panic!("connect to {name} as {}: {e}", who(uid)));
            clients.push((uid, c));
        }
        let root = clients[0].1.root().clone();
        Side {
            name,
            clients,
            root,
        }
    }

    fn as_(&self, uid: u32) -> &Client {
        &self.clients.iter().find(|(u, _)| *u == uid).unwrap().1
    }

    fn root_client(&self) -> &Client {
        self.as_(ROOT)
    }
}

fn outcome<T>(r: Result<T, ClientError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => match e.nfs_status() {
            Some(s) => format!("{s:?}"),
            None => panic!("not an NFS answer: {e}"),
        },
    }
}

#[derive(Clone, Copy, Debug)]
enum Kind {
    Reg,
    Dir,
    Symlink,
    Fifo,
    Chr,
}

const KINDS: [Kind; 5] = [Kind::Reg, Kind::Dir, Kind::Symlink, Kind::Fifo, Kind::Chr];

/// Makes `name` in `dir` as root with owner `uid`, group `gid` and `mode`,
/// all in the call that creates it. (A mode with set-id bits sent with an
/// owner loses them, as a change of owner clears them: see [`make_setid`].)
async fn make(
    side: &Side,
    dir: &NfsFh3,
    name: &str,
    kind: Kind,
    uid: u32,
    gid: u32,
    mode: u32,
) -> NfsFh3 {
    let c = side.root_client();
    let a = Sattr3 {
        uid: Some(uid),
        gid: Some(gid),
        mode: Some(mode),
        ..Sattr3::default()
    };
    let r = match kind {
        Kind::Reg => c.create(dir, name, CreateHow3::Guarded(a)).await,
        Kind::Dir => c.mkdir(dir, name, &a).await,
        Kind::Symlink => c.symlink(dir, name, "target", &a).await,
        Kind::Fifo => c.mknod(dir, name, MknodData3::Fifo(a)).await,
        Kind::Chr => {
            c.mknod(
                dir,
                name,
                MknodData3::Chr(DeviceData3 {
                    dev_attributes: a,
                    spec: SpecData3 {
                        specdata1: 1,
                        specdata2: 3,
                    },
                }),
            )
            .await
        }
    };
    match r {
        Ok(ok) => match ok.obj {
            Some(fh) => fh,
            None => c.lookup(dir, name).await.expect("lookup").object,
        },
        Err(e) => panic!("{}: make {name} ({kind:?}): {e}", side.name),
    }
}

/// As [`make`], then `mode` again on its own, so that set-id bits stay.
async fn make_setid(
    side: &Side,
    dir: &NfsFh3,
    name: &str,
    kind: Kind,
    uid: u32,
    gid: u32,
    mode: u32,
) -> NfsFh3 {
    let fh = make(side, dir, name, kind, uid, gid, mode).await;
    if !matches!(kind, Kind::Symlink) {
        side.root_client()
            .setattr(&fh, &set_mode(mode), None)
            .await
            .expect("chmod as root");
    }
    fh
}

/// A fresh directory for one case, world-writable, owned by root.
async fn case_dir(side: &Side, name: &str) -> NfsFh3 {
    let name = format!("{name}-{}", std::process::id());
    make(side, &side.root, &name, Kind::Dir, 0, 0, 0o777).await
}

fn set_uid(v: u32) -> Sattr3 {
    Sattr3 {
        uid: Some(v),
        ..Sattr3::default()
    }
}

fn set_gid(v: u32) -> Sattr3 {
    Sattr3 {
        gid: Some(v),
        ..Sattr3::default()
    }
}

fn set_mode(v: u32) -> Sattr3 {
    Sattr3 {
        mode: Some(v),
        ..Sattr3::default()
    }
}

/// The SETATTR cases: a name and the attributes sent (`uid: None` in a
/// case means "the caller's own uid").
fn setattr_cases(caller: u32) -> Vec<(&'static str, Sattr3)> {
    let t = NfsTime3 {
        seconds: 1_000_000_000,
        nseconds: 0,
    };
    vec![
        ("uid=same", set_uid(OWNER)),
        ("uid=caller", set_uid(caller)),
        ("uid=other", set_uid(OTHER)),
        ("gid=same", set_gid(1000)),
        ("gid=3000(owner's)", set_gid(3000)),
        ("gid=4000(nobody's)", set_gid(4000)),
        (
            "uid=same,gid=same",
            Sattr3 {
                uid: Some(OWNER),
                gid: Some(1000),
                ..Sattr3::default()
            },
        ),
        ("mode=0644", set_mode(0o644)),
        ("mode=02775", set_mode(0o2775)),
        (
            "mode=06775,uid=same",
            Sattr3 {
                mode: Some(0o6775),
                uid: Some(OWNER),
                ..Sattr3::default()
            },
        ),
        (
            "mode=02755,gid=4000",
            Sattr3 {
                mode: Some(0o2755),
                gid: Some(4000),
                ..Sattr3::default()
            },
        ),
        (
            "times=server",
            Sattr3 {
                atime: SetTime::ServerTime,
                mtime: SetTime::ServerTime,
                ..Sattr3::default()
            },
        ),
        (
            "mtime=server",
            Sattr3 {
                mtime: SetTime::ServerTime,
                ..Sattr3::default()
            },
        ),
        (
            "times=client",
            Sattr3 {
                atime: SetTime::ClientTime(t),
                mtime: SetTime::ClientTime(t),
                ..Sattr3::default()
            },
        ),
        (
            "size=0",
            Sattr3 {
                size: Some(0),
                ..Sattr3::default()
            },
        ),
        (
            "size=0,mtime=server",
            Sattr3 {
                size: Some(0),
                mtime: SetTime::ServerTime,
                ..Sattr3::default()
            },
        ),
        (
            "size=0,uid=same",
            Sattr3 {
                size: Some(0),
                uid: Some(OWNER),
                ..Sattr3::default()
            },
        ),
        ("nothing", Sattr3::default()),
    ]
}

/// Object modes for the SETATTR cases: set-id bits where the type takes
/// them, group-writable, not writable by others.
fn start_mode(kind: Kind) -> u32 {
    match kind {
        Kind::Reg => 0o6774,
        Kind::Dir => 0o2775,
        _ => 0o664,
    }
}

async fn setattr_matrix(side: &Side) -> Vec<String> {
    let mut rows = Vec::new();
    let top = case_dir(side, "setattr").await;
    let mut n = 0;
    for kind in KINDS {
        for caller in [OWNER, GROUPMATE, OTHER, ROOT] {
            for (what, attrs) in setattr_cases(caller) {
                n += 1;
                let name = format!("o{n}");
                let fh = make_setid(side, &top, &name, kind, OWNER, 1000, start_mode(kind)).await;
                let before = side.root_client().getattr(&fh).await.expect("getattr");
                // Let the clock move on, so that a ctime change shows.
                tokio::time::sleep(Duration::from_millis(15)).await;
                let r = side.as_(caller).setattr(&fh, &attrs, None).await;
                let after = side.root_client().getattr(&fh).await.expect("getattr");
                let mut row = format!("SETATTR {kind:?} by {} {what}: {}", who(caller), outcome(r));
                let _ = write!(
                    row,
                    "; now uid {} gid {} mode {:o} size {}, ctime {}",
                    after.uid,
                    after.gid,
                    after.mode & 0o7777,
                    if matches!(kind, Kind::Reg | Kind::Symlink) {
                        after.size
                    } else {
                        0
                    },
                    if after.ctime == before.ctime {
                        "kept"
                    } else {
                        "moved"
                    }
                );
                rows.push(row);
            }
        }
    }
    rows
}

/// The directory the names live in, for the namespace cases.
#[derive(Clone, Copy, Debug)]
enum Parent {
    /// 1777, owned by the owner (a user's own sticky directory).
    StickyOwnedByOwner,
    /// 1777, owned by root (/tmp).
    StickyRoot,
    /// 0777, owned by root.
    Open,
    /// 0755, owned by root: only root may change it.
    Closed,
    /// 0733, owned by root: writable and searchable, not readable.
    WriteSearchOnly,
    /// 0766, owned by root: writable, not searchable.
    NoSearch,
}

const PARENTS: [Parent; 6] = [
    Parent::StickyOwnedByOwner,
    Parent::StickyRoot,
    Parent::Open,
    Parent::Closed,
    Parent::WriteSearchOnly,
    Parent::NoSearch,
];

fn parent_attrs(p: Parent) -> (u32, u32) {
    match p {
        Parent::StickyOwnedByOwner => (OWNER, 0o1777),
        Parent::StickyRoot => (0, 0o1777),
        Parent::Open => (0, 0o777),
        Parent::Closed => (0, 0o755),
        Parent::WriteSearchOnly => (0, 0o733),
        Parent::NoSearch => (0, 0o766),
    }
}

#[derive(Clone, Copy, Debug)]
enum NsOp {
    Remove,
    Rmdir,
    RenameSameParent,
    RenameToOtherParent,
    RenameOverOthersEntry,
    RenameFromOtherParent,
    LinkIntoOtherParent,
    LinkIntoParent,
}

const NS_OPS: [NsOp; 8] = [
    NsOp::Remove,
    NsOp::Rmdir,
    NsOp::RenameSameParent,
    NsOp::RenameToOtherParent,
    NsOp::RenameOverOthersEntry,
    NsOp::RenameFromOtherParent,
    NsOp::LinkIntoOtherParent,
    NsOp::LinkIntoParent,
];

async fn namespace_matrix(side: &Side) -> Vec<String> {
    let mut rows = Vec::new();
    let top = case_dir(side, "names").await;
    let mut n = 0;
    for parent in PARENTS {
        for kind in [Kind::Reg, Kind::Dir, Kind::Symlink, Kind::Fifo] {
            for victim_owner in [OWNER, OTHER] {
                for caller in [OWNER, OTHER, ROOT] {
                    n += 1;
                    // top/N/p is the parent under test; for each operation
                    // it holds "vI" (the victim, mode 0755 or 0644) and
                    // "tI" (an entry of the same type owned by OTHER);
                    // top/N/o is an open directory (0777, root) with "xI".
                    let case = make(side, &top, &format!("{n}"), Kind::Dir, 0, 0, 0o777).await;
                    let (pu, pm) = parent_attrs(parent);
                    // Made open, closed to its mode once its entries are in.
                    let p = make(side, &case, "p", Kind::Dir, pu, pu, 0o777).await;
                    let o = make(side, &case, "o", Kind::Dir, 0, 0, 0o777).await;
                    let vmode = if matches!(kind, Kind::Dir) {
                        0o755
                    } else {
                        0o644
                    };
                    let mut objs = Vec::new();
                    for i in 0..NS_OPS.len() {
                        let v = make(
                            side,
                            &p,
                            &format!("v{i}"),
                            kind,
                            victim_owner,
                            victim_owner,
                            vmode,
                        )
                        .await;
                        make(side, &p, &format!("t{i}"), kind, OTHER, OTHER, vmode).await;
                        let x = make(
                            side,
                            &o,
                            &format!("x{i}"),
                            kind,
                            victim_owner,
                            victim_owner,
                            vmode,
                        )
                        .await;
                        objs.push((v, x));
                    }
                    side.root_client()
                        .setattr(&p, &set_mode(pm), None)
                        .await
                        .expect("chmod parent");
                    let c = side.as_(caller);
                    for (i, op) in NS_OPS.into_iter().enumerate() {
                        let (v, x) = &objs[i];
                        let (vi, ti, xi, new) = (
                            format!("v{i}"),
                            format!("t{i}"),
                            format!("x{i}"),
                            format!("new{i}"),
                        );
                        let r = match op {
                            NsOp::Remove => outcome(c.remove(&p, &vi).await),
                            NsOp::Rmdir => outcome(c.rmdir(&p, &vi).await),
                            NsOp::RenameSameParent => outcome(c.rename(&p, &vi, &p, &new).await),
                            NsOp::RenameToOtherParent => outcome(c.rename(&p, &vi, &o, &new).await),
                            NsOp::RenameOverOthersEntry => {
                                outcome(c.rename(&p, &vi, &p, &ti).await)
                            }
                            NsOp::RenameFromOtherParent => {
                                outcome(c.rename(&o, &xi, &p, &new).await)
                            }
                            NsOp::LinkIntoOtherParent => outcome(c.link(v, &o, &new).await),
                            NsOp::LinkIntoParent => outcome(c.link(x, &p, &new).await),
                        };
                        rows.push(format!(
                            "{op:?} of a {kind:?} owned by {} in {parent:?} by {}: {r}",
                            who(victim_owner),
                            who(caller)
                        ));
                    }
                }
            }
        }
    }
    rows
}

/// Special names and cases the matrices do not reach.
async fn edge_cases(side: &Side) -> Vec<String> {
    let c = side.as_(OWNER);
    let r = side.root_client();
    let d = case_dir(side, "edges").await;
    let sub = make(side, &d, "sub", Kind::Dir, OWNER, 1000, 0o755).await;
    make(side, &sub, "f", Kind::Reg, OWNER, 1000, 0o644).await;
    make(side, &d, "empty", Kind::Dir, OWNER, 1000, 0o755).await;
    make(side, &d, "file", Kind::Reg, OWNER, 1000, 0o644).await;
    let mut rows = Vec::new();
    let mut add = |what: &str, r: String| rows.push(format!("{what}: {r}"));
    add("REMOVE .", outcome(c.remove(&d, ".").await));
    add("REMOVE ..", outcome(c.remove(&d, "..").await));
    add("RMDIR .", outcome(c.rmdir(&d, ".").await));
    add("RMDIR ..", outcome(c.rmdir(&d, "..").await));
    add("RMDIR non-empty", outcome(c.rmdir(&d, "sub").await));
    add("RMDIR missing", outcome(c.rmdir(&d, "missing").await));
    add("REMOVE missing", outcome(c.remove(&d, "missing").await));
    add("RENAME . away", outcome(c.rename(&d, ".", &d, "x").await));
    add(
        "RENAME onto ..",
        outcome(c.rename(&d, "file", &d, "..").await),
    );
    add(
        "RENAME dir into itself",
        outcome(c.rename(&d, "sub", &sub, "x").await),
    );
    add(
        "RENAME dir onto non-empty dir",
        outcome(c.rename(&d, "empty", &d, "sub").await),
    );
    add(
        "RENAME dir onto file",
        outcome(c.rename(&d, "empty", &d, "file").await),
    );
    add(
        "RENAME file onto dir",
        outcome(c.rename(&d, "file", &d, "empty").await),
    );
    add(
        "RENAME missing",
        outcome(c.rename(&d, "missing", &d, "x").await),
    );
    add(
        "RENAME onto itself",
        outcome(c.rename(&d, "file", &d, "file").await),
    );
    let file = r.lookup(&d, "file").await.expect("lookup").object;
    add("LINK as .", outcome(c.link(&file, &d, ".").await));
    add(
        "LINK onto existing",
        outcome(c.link(&file, &d, "empty").await),
    );
    add("LINK of a directory", outcome(c.link(&sub, &d, "x").await));
    // A non-directory as the parent.
    add("REMOVE in a file", outcome(c.remove(&file, "x").await));
    add(
        "RENAME from a file",
        outcome(c.rename(&file, "x", &d, "y").await),
    );
    add(
        "RENAME into a file",
        outcome(c.rename(&d, "empty", &file, "y").await),
    );
    add("LINK into a file", outcome(c.link(&file, &file, "y").await));
    add(
        "SETATTR size on a dir",
        outcome(
            c.setattr(
                &sub,
                &Sattr3 {
                    size: Some(0),
                    ..Sattr3::default()
                },
                None,
            )
            .await,
        ),
    );
    // Set-group-ID without group execute (mandatory locking) survives a
    // change of owner; set-user-ID does not.
    let lock = make_setid(side, &d, "locking", Kind::Reg, OWNER, 1000, 0o6764).await;
    let r2 = c.setattr(&lock, &set_uid(OWNER), None).await;
    let m = r.getattr(&lock).await.expect("getattr").mode & 0o7777;
    rows.push(format!(
        "chown of a 6764 file to its owner: {}; mode now {m:o}",
        outcome(r2)
    ));
    rows
}

async fn all_rows(side: &Side) -> Vec<String> {
    let mut rows = setattr_matrix(side).await;
    rows.extend(namespace_matrix(side).await);
    rows.extend(edge_cases(side).await);
    rows
}

/// The one place nfsrdmad answers as the kernel nfsd does but leaves the
/// file alone: the kernel nfsd carries out a size change before it checks
/// the owner and group it was sent with, so a SETATTR of both that it
/// refuses (NFS3ERR_PERM) has truncated the file and moved its ctime all
/// the same; nfsrdmad checks everything first and changes nothing.
fn intended_difference(theirs: &str, mine: &str) -> Option<&'static str> {
    let refused_with_size = theirs.starts_with("SETATTR Reg ")
        && theirs.contains(" size=0,uid=")
        && theirs.contains(": Perm;");
    let only_ctime = theirs.replace("ctime moved", "ctime kept") == mine;
    (refused_with_size && only_ctime).then_some("a refused SETATTR changes nothing")
}

fn knfsd_up() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/vm/guest/knfsd-up");
    let out = std::process::Command::new(script)
        .arg("/export")
        .output()
        .expect("run knfsd-up");
    assert!(
        out.status.success(),
        "knfsd-up: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the kernel nfsd: run with scripts/test-vm"]
async fn vm_permission_rules_match_the_kernel_nfsd() {
    knfsd_up();
    let ours = TestServer::start(EXPORTS);
    let knfsd = ConnectOptions {
        port: Some(2049),
        timeo: Duration::from_secs(30),
        ..ConnectOptions::default()
    };
    let k = Side::connect("kernel nfsd", knfsd, "127.0.0.1").await;
    let o = Side::connect("nfsrdmad", opts_at(ours.addr), "127.0.0.1").await;
    let theirs = all_rows(&k).await;
    let mine = all_rows(&o).await;
    assert_eq!(theirs.len(), mine.len());
    let mut diff = String::new();
    let mut same = 0;
    for (t, m) in theirs.iter().zip(&mine) {
        if t == m {
            same += 1;
        } else if let Some(why) = intended_difference(t, m) {
            println!("intended difference ({why}):\n  kernel nfsd: {t}\n  nfsrdmad:    {m}");
        } else {
            let _ = writeln!(diff, "  kernel nfsd: {t}\n  nfsrdmad:    {m}\n");
        }
    }
    println!(
        "{same} of {} calls answered as the kernel nfsd answers",
        theirs.len()
    );
    assert!(
        diff.is_empty(),
        "answers that differ from the kernel nfsd's:\n{diff}"
    );
}
