//! Every NFSv3 procedure through the client against our server, with the
//! error paths: NOENT, EXIST, NOTEMPTY, STALE, NAMETOOLONG, ROFS, and
//! RPC-level refusals.

mod common;

use bytes::Bytes;
use common::*;
use nfsrdma_client::rpc::{call, Target};
use nfsrdma_client::transport::tcp::{TcpOptions, TcpTransport};
use nfsrdma_client::transport::ReplyExpect;
use nfsrdma_client::xdr::nfs3::*;
use nfsrdma_client::xdr::rpc::{flavor, AuthBody, AuthStat, OpaqueAuth};
use nfsrdma_client::{Auth, AuthSys, Client, ClientError};
use nfsrdma_xdr::mount::MountStat3;

fn mode(m: u32) -> Sattr3 {
    Sattr3 {
        mode: Some(m),
        ..Sattr3::default()
    }
}

fn status(e: &ClientError) -> Option<NfsStat3> {
    e.nfs_status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn null_fsinfo_fsstat_pathconf_getattr_access() {
    let s = TestServer::start(EXPORTS);
    let c = connect(&s, "/export").await;
    c.null().await.unwrap();
    let root = c.root().clone();
    let a = c.getattr(&root).await.unwrap();
    assert_eq!(a.type_, Ftype3::Dir);
    let info = c.fsinfo_of(&root).await.unwrap();
    assert!(info.rtmax >= c.rsize() && info.wtmax >= c.wsize());
    assert_eq!(c.fsinfo().rtmax, info.rtmax);
    let st = c.fsstat(&root).await.unwrap();
    assert!(st.tbytes >= st.fbytes);
    let pc = c.pathconf(&root).await.unwrap();
    assert!(pc.name_max >= 255);
    let acc = c
        .access(&root, access::READ | access::LOOKUP | access::MODIFY)
        .await
        .unwrap();
    assert_eq!(
        acc.access & (access::READ | access::LOOKUP),
        access::READ | access::LOOKUP
    );
    c.unmount().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_write_read_setattr_commit() {
    let s = TestServer::start(EXPORTS);
    let c = connect(&s, "/export").await;
    let root = c.root().clone();
    let made = c
        .create(&root, "f", CreateHow3::Guarded(mode(0o640)))
        .await
        .unwrap();
    let fh = made.obj.clone().expect("handle");
    assert_eq!(made.obj_attributes.as_ref().unwrap().mode & 0o777, 0o640);

    // GUARDED on an existing name: EXIST, with the directory's wcc data.
    let e = c
        .create(&root, "f", CreateHow3::Guarded(mode(0o640)))
        .await
        .unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Exist));
    let f = e.nfs_failure().unwrap();
    assert_eq!(f.proc_, NfsProc3::Create);
    match &*f.res {
        Nfs3Res::Create(NfsResult::Err(NfsStat3::Exist, body)) => {
            assert!(body.dir_wcc.after.is_some())
        }
        other => panic!("{other:?}"),
    }
    assert!(e.to_string().contains("NFS3ERR_EXIST"), "{e}");

    // EXCLUSIVE create with the same verifier twice is the same create.
    let x1 = c
        .create(&root, "x", CreateHow3::Exclusive(*b"verifier"))
        .await
        .unwrap();
    let x2 = c
        .create(&root, "x", CreateHow3::Exclusive(*b"verifier"))
        .await
        .unwrap();
    assert_eq!(x1.obj, x2.obj);

    let data = pattern(1, 10_000);
    let w = c
        .write(&fh, 0, data.clone(), StableHow::Unstable)
        .await
        .unwrap();
    assert_eq!(w.count, 10_000);
    let r = c.read(&fh, 0, 20_000).await.unwrap();
    assert!(r.eof);
    assert_eq!(r.data.to_contiguous(), data);
    let r = c.read(&fh, 9_000, 500).await.unwrap();
    assert!(!r.eof);
    assert_eq!(r.data.to_contiguous(), data.slice(9_000..9_500));
    let cm = c.commit(&fh, 0, 0).await.unwrap();
    assert_eq!(cm.verf, w.verf);

    // SETATTR: truncate, then a guard that does not match.
    let wcc = c
        .setattr(
            &fh,
            &Sattr3 {
                size: Some(100),
                ..Sattr3::default()
            },
            None,
        )
        .await
        .unwrap();
    let after = wcc.after.unwrap();
    assert_eq!(after.size, 100);
    let e = c
        .setattr(
            &fh,
            &mode(0o600),
            Some(NfsTime3 {
                seconds: 1,
                nseconds: 2,
            }),
        )
        .await
        .unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::NotSync));
    assert_eq!(c.getattr(&fh).await.unwrap().size, 100);

    // Reading or writing a directory.
    let e = c.read(&root, 0, 10).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Isdir));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directories_and_listing() {
    let s = TestServer::start(EXPORTS);
    let c = connect(&s, "/export").await;
    let root = c.root().clone();
    let d = c.mkdir(&root, "d", &mode(0o755)).await.unwrap();
    let dfh = d.obj.unwrap();
    let e = c.mkdir(&root, "d", &mode(0o755)).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Exist));

    for i in 0..300 {
        c.create(
            &dfh,
            format!("file-{i:03}"),
            CreateHow3::Guarded(mode(0o644)),
        )
        .await
        .unwrap();
    }
    let e = c.rmdir(&root, "d").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Notempty));

    // READDIRPLUS paging through readdir_all.
    let all = c.readdir_all(&dfh).await.unwrap();
    assert_eq!(all.len(), 300);
    let mut names: Vec<String> = all.iter().map(|e| e.name_lossy()).collect();
    names.sort();
    assert_eq!(names[0], "file-000");
    assert_eq!(names[299], "file-299");
    assert!(all.iter().all(|e| e.attr.is_some() && e.handle.is_some()));

    // Plain READDIR, paged by hand with a small count.
    let mut cookie = 0;
    let mut verf = [0u8; 8];
    let mut seen = 0;
    let mut pages = 0;
    loop {
        let r = c.readdir(&dfh, cookie, verf, 1024).await.unwrap();
        pages += 1;
        for e in &r.reply.entries.0 {
            if &e.name[..] != b"." && &e.name[..] != b".." {
                seen += 1;
            }
            cookie = e.cookie;
        }
        verf = r.cookieverf;
        if r.reply.eof {
            break;
        }
    }
    assert_eq!(seen, 300);
    assert!(pages > 1);

    // READDIRPLUS by hand.
    let r = c.readdirplus(&dfh, 0, [0; 8], 512, 4096).await.unwrap();
    assert!(!r.reply.entries.0.is_empty());

    for i in 0..300 {
        c.remove(&dfh, format!("file-{i:03}")).await.unwrap();
    }
    let wcc = c.rmdir(&root, "d").await.unwrap();
    assert!(wcc.after.is_some());
    let e = c.rmdir(&root, "d").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Noent));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_links_symlinks_mknod() {
    let s = TestServer::start(EXPORTS);
    let c = connect(&s, "/export").await;
    let root = c.root().clone();
    let f = c
        .create(&root, "a", CreateHow3::Unchecked(mode(0o644)))
        .await
        .unwrap()
        .obj
        .unwrap();

    // LOOKUP: found, missing, too long.
    let l = c.lookup(&root, "a").await.unwrap();
    assert_eq!(l.object, f);
    let e = c.lookup(&root, "missing").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Noent));
    match &*e.nfs_failure().unwrap().res {
        Nfs3Res::Lookup(NfsResult::Err(_, fail)) => assert!(fail.dir_attributes.is_some()),
        other => panic!("{other:?}"),
    }
    let long = "n".repeat(256);
    let e = c.lookup(&root, &long).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Nametoolong));
    let e = c
        .create(&root, &long, CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Nametoolong));

    // LINK.
    let lk = c.link(&f, &root, "b").await.unwrap();
    assert_eq!(lk.file_attributes.unwrap().nlink, 2);
    let e = c.link(&f, &root, "b").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Exist));

    // SYMLINK and READLINK.
    let sl = c
        .symlink(&root, "s", "a/target/path", &Sattr3::default())
        .await
        .unwrap()
        .obj
        .unwrap();
    let rl = c.readlink(&sl).await.unwrap();
    assert_eq!(&rl.data[..], b"a/target/path");
    let e = c.readlink(&f).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Inval));

    // MKNOD.
    let fifo = c
        .mknod(&root, "p", MknodData3::Fifo(mode(0o600)))
        .await
        .unwrap();
    assert_eq!(fifo.obj_attributes.unwrap().type_, Ftype3::Fifo);
    let e = c
        .mknod(&root, "r", MknodData3::Other(Ftype3::Reg))
        .await
        .unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Badtype));

    // RENAME.
    let rn = c.rename(&root, "a", &root, "c").await.unwrap();
    assert!(rn.todir_wcc.after.is_some());
    let e = c.rename(&root, "a", &root, "d").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Noent));

    // lookup_path through a directory.
    let d = c
        .mkdir(&root, "dir", &mode(0o755))
        .await
        .unwrap()
        .obj
        .unwrap();
    c.create(&d, "inner", CreateHow3::Unchecked(mode(0o600)))
        .await
        .unwrap();
    let (fh, a) = c.lookup_path("/dir/./inner").await.unwrap();
    assert_eq!(a.type_, Ftype3::Reg);
    assert_eq!(c.lookup(&d, "inner").await.unwrap().object, fh);
    let (rfh, _) = c.lookup_path("/").await.unwrap();
    assert_eq!(&rfh, c.root());
    let e = c.lookup_path("dir/nope/x").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Noent));
    let e = c.lookup_path("c/x").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Notdir));

    // REMOVE, then the old handle is STALE.
    c.remove(&root, "c").await.unwrap();
    c.remove(&root, "b").await.unwrap();
    let e = c.getattr(&f).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Stale));
    let e = c.remove(&root, "b").await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Noent));
    let e = c.remove(&root, "dir").await.unwrap_err();
    assert!(matches!(
        status(&e),
        Some(NfsStat3::Isdir) | Some(NfsStat3::Perm) | Some(NfsStat3::Notempty)
    ));
    // A handle the server never made.
    let e = c
        .getattr(&NfsFh3::new(Bytes::from_static(b"not a handle")))
        .await
        .unwrap_err();
    assert!(matches!(
        status(&e),
        Some(NfsStat3::Badhandle) | Some(NfsStat3::Stale)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_export_refuses_changes() {
    let s = TestServer::start(EXPORTS);
    let c = connect(&s, "/ro").await;
    let root = c.root().clone();
    let e = c
        .create(&root, "f", CreateHow3::Unchecked(Sattr3::default()))
        .await
        .unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Rofs));
    let e = c.mkdir(&root, "d", &Sattr3::default()).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Rofs));
    let e = c.setattr(&root, &mode(0o700), None).await.unwrap_err();
    assert_eq!(status(&e), Some(NfsStat3::Rofs));
    let e = c.remove(&root, "x").await.unwrap_err();
    assert!(matches!(
        status(&e),
        Some(NfsStat3::Rofs) | Some(NfsStat3::Noent)
    ));
    // Reading still works.
    assert!(c.readdir_all(&root).await.unwrap().is_empty());
    c.getattr(&root).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_errors_and_longest_prefix() {
    let s = TestServer::start(EXPORTS);
    let e = Client::connect(&opts_at(s.addr), "127.0.0.1", "/nope")
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Mount {
                status: MountStat3::Noent,
                ..
            }
        ),
        "{e}"
    );

    let c = connect(&s, "/export").await;
    let root = c.root().clone();
    let a = c
        .mkdir(&root, "a", &mode(0o755))
        .await
        .unwrap()
        .obj
        .unwrap();
    c.create(&a, "file", CreateHow3::Unchecked(mode(0o644)))
        .await
        .unwrap();

    // A directory inside the export mounts directly.
    let (c2, rest) = Client::connect_path(&opts_at(s.addr), "127.0.0.1", "/export/a")
        .await
        .unwrap();
    assert_eq!(c2.export(), "/export/a");
    assert_eq!(rest, "");
    assert_eq!(c2.root(), &a);
    // A file: its directory mounts, the name is left to look up.
    let (c3, rest) = Client::connect_path(&opts_at(s.addr), "127.0.0.1", "/export/a/file")
        .await
        .unwrap();
    assert_eq!((c3.export(), rest.as_str()), ("/export/a", "file"));
    // Missing components are left over too.
    let (_, rest) = Client::connect_path(&opts_at(s.addr), "127.0.0.1", "/export/x/y")
        .await
        .unwrap();
    assert_eq!(rest, "x/y");
    // Nothing mounts: the error names the whole path.
    let e = Client::connect_path(&opts_at(s.addr), "127.0.0.1", "/nope/deeper")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("/nope/deeper"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_sent() {
    let s = TestServer::start(EXPORTS);
    let mut o = opts_at(s.addr);
    o.auth = Auth::Sys(AuthSys {
        uid: 1234,
        gid: 567,
        gids: vec![1, 2, 3],
        machine_name: "somewhere".into(),
    });
    let root_client = connect(&s, "/export").await;
    root_client
        .setattr(root_client.root(), &mode(0o777), None)
        .await
        .unwrap();
    let c = Client::connect(&o, "127.0.0.1", "/export").await.unwrap();
    let made = c
        .create(c.root(), "mine", CreateHow3::Unchecked(mode(0o600)))
        .await
        .unwrap();
    let a = made.obj_attributes.unwrap();
    assert_eq!((a.uid, a.gid), (1234, 567));

    // AUTH_NONE is accepted by MOUNT and NFS here too.
    o.auth = Auth::None;
    let c = Client::connect(&o, "127.0.0.1", "/export").await.unwrap();
    c.getattr(c.root()).await.unwrap();
}

/// RPC-level refusals from our server, each its own error variant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpc_level_errors_are_typed() {
    let s = TestServer::start(EXPORTS);
    let t = TcpTransport::connect(s.addr, TcpOptions::default())
        .await
        .unwrap();
    let cred = root().to_opaque_auth();
    let tgt = |prog, vers, proc_| Target {
        prog,
        vers,
        proc_,
        name: "test",
    };
    let small = ReplyExpect::small(1024);
    let e = call::<_, ()>(&t, &cred, tgt(100_099, 1, 0), &(), small)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::ProgUnavail { prog: 100_099 }),
        "{e}"
    );
    let e = call::<_, ()>(&t, &cred, tgt(PROGRAM, 5, 0), &(), small)
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::ProgMismatch {
                low: 3,
                high: 4,
                ..
            }
        ),
        "{e}"
    );
    let e = call::<_, ()>(&t, &cred, tgt(PROGRAM, 3, 99), &(), small)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::ProcUnavail { proc_: 99, .. }),
        "{e}"
    );
    // GETATTR with a truncated handle.
    let e = call::<_, ()>(&t, &cred, tgt(PROGRAM, 3, 1), &7u32, small)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::GarbageArgs), "{e}");
    // A flavor the server does not take.
    let dh = OpaqueAuth {
        flavor: flavor::AUTH_DH,
        body: AuthBody::default(),
    };
    let e = call::<_, ()>(&t, &dh, tgt(PROGRAM, 3, 1), &7u32, small)
        .await
        .unwrap_err();
    assert!(
        matches!(e, ClientError::AuthError(AuthStat::TooWeak)),
        "{e}"
    );
    // The connection is still good.
    call::<_, ()>(&t, &cred, tgt(PROGRAM, 3, 0), &(), small)
        .await
        .unwrap();
}

/// A `secure` export (the default) needs a privileged source port: the
/// client uses one when running as root. Skipped for other users.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_export_with_a_reserved_port() {
    if nfsrdma_client::auth::effective_uid() != Some(0) {
        eprintln!("not root: skipped");
        return;
    }
    let s = TestServer::start("/sec *(rw,no_root_squash)\n");
    let mut o = opts_at(s.addr);
    assert!(o.resvport, "root defaults to a reserved port");
    let c = Client::connect(&o, "127.0.0.1", "/sec").await.unwrap();
    c.getattr(c.root()).await.unwrap();
    o.resvport = false;
    let e = Client::connect(&o, "127.0.0.1", "/sec").await.unwrap_err();
    assert!(
        matches!(
            e,
            ClientError::Mount {
                status: MountStat3::Perm,
                ..
            }
        ),
        "{e}"
    );
}
