//! Every procedure through the full encode -> service -> decode path, with
//! error paths, access control and the duplicate request cache.

use super::*;
use crate::exports::Exports;
use bytes::BytesMut;
use nfsrdma_xdr::nfs3::*;
use nfsrdma_xdr::rpc::{AuthSysParms, MachineName, OpaqueAuth};
use nfsrdma_xdr::BoundedVec;

pub(super) struct T {
    pub(super) svc: Arc<Service>,
    xid: std::cell::Cell<u32>,
    peer: SocketAddr,
    cred: OpaqueAuth,
}

fn sys(uid: u32, gid: u32) -> OpaqueAuth {
    OpaqueAuth::auth_sys(&AuthSysParms {
        stamp: 1,
        machinename: MachineName::from("test"),
        uid,
        gid,
        gids: BoundedVec(vec![]),
    })
}

fn setup(exports_text: &str) -> T {
    setup_with(exports_text, ServiceConfig::default())
}

fn setup_with(exports_text: &str, config: ServiceConfig) -> T {
    let rules = Exports::parse(exports_text).unwrap();
    let exports = Service::exports_from_rules(&rules, &StoreConfig::default());
    T::on(Arc::new(Service::new(exports, config)))
}

impl T {
    /// A caller (root, from one address) of `svc`; callers on other
    /// threads each have one of their own (their xids apart).
    pub(super) fn on(svc: Arc<Service>) -> T {
        T {
            svc,
            xid: std::cell::Cell::new(1),
            peer: "127.0.0.1:700".parse().unwrap(),
            cred: sys(0, 0),
        }
    }

    /// Another caller of the same service, with xids of its own.
    pub(super) fn another(&self, first_xid: u32) -> T {
        let t = T::on(self.svc.clone());
        t.xid.set(first_xid);
        t
    }

    fn raw(&self, xid: u32, prog: u32, vers: u32, proc_: u32, args: &[u8]) -> Option<Bytes> {
        let mut b = BytesMut::new();
        let mut m = RpcMessage::call(xid, prog, vers, proc_, self.cred.clone());
        if let MessageBody::Call(c) = &mut m.body {
            c.rpcvers = 2;
        }
        m.encode(&mut b);
        b.extend_from_slice(args);
        let reply = self.svc.handle(&CallContext::from(self.peer), b.freeze())?;
        let mut out = BytesMut::new();
        reply.encode(&mut out);
        Some(out.freeze())
    }

    fn next_xid(&self) -> u32 {
        let x = self.xid.get();
        self.xid.set(x + 1);
        x
    }

    pub(super) fn nfs(&self, args: Nfs3Args) -> Nfs3Res {
        let mut a = BytesMut::new();
        args.encode(&mut a);
        let xid = self.next_xid();
        let reply = self
            .raw(xid, PROGRAM, VERSION, args.proc_() as u32, &a)
            .expect("a reply");
        let mut d = Decoder::new(reply);
        let h = RpcMessage::decode(&mut d).unwrap();
        assert_eq!(h.xid, xid);
        match h.as_reply() {
            Some(rpc::ReplyBody::Accepted(a)) => assert_eq!(a.stat, AcceptStat::Success),
            other => panic!("not accepted: {other:?}"),
        }
        let r = Nfs3Res::decode(args.proc_(), &mut d).unwrap();
        d.finish("reply").unwrap();
        r
    }

    pub(super) fn mount(&self, path: &str) -> NfsFh3 {
        let mut a = BytesMut::new();
        mnt::DirPath::new(path.as_bytes().to_vec()).encode(&mut a);
        let reply = self
            .raw(self.next_xid(), mnt::PROGRAM, 3, mnt::proc_::MNT, &a)
            .unwrap();
        let mut d = Decoder::new(reply);
        RpcMessage::decode(&mut d).unwrap();
        match mnt::MountRes3::decode(&mut d).unwrap() {
            mnt::MountRes3::Ok(ok) => {
                assert_eq!(ok.auth_flavors.0, vec![flavor::AUTH_SYS, flavor::AUTH_NONE]);
                NfsFh3(ok.fhandle.0)
            }
            mnt::MountRes3::Err(e) => panic!("mount {path}: {e:?}"),
        }
    }

    fn mount_err(&self, path: &str) -> mnt::MountStat3 {
        let mut a = BytesMut::new();
        mnt::DirPath::new(path.as_bytes().to_vec()).encode(&mut a);
        let reply = self
            .raw(self.next_xid(), mnt::PROGRAM, 3, mnt::proc_::MNT, &a)
            .unwrap();
        let mut d = Decoder::new(reply);
        RpcMessage::decode(&mut d).unwrap();
        match mnt::MountRes3::decode(&mut d).unwrap() {
            mnt::MountRes3::Ok(_) => panic!("mount {path} should fail"),
            mnt::MountRes3::Err(e) => e,
        }
    }

    pub(super) fn create(&self, dir: &NfsFh3, name: &str) -> NfsFh3 {
        match self.nfs(Nfs3Args::Create(Create3Args {
            where_: dop(dir, name),
            how: CreateHow3::Guarded(Sattr3::default()),
        })) {
            Nfs3Res::Create(NfsResult::Ok(ok)) => ok.obj.unwrap(),
            other => panic!("create {name}: {other:?}"),
        }
    }

    fn mkdir(&self, dir: &NfsFh3, name: &str) -> NfsFh3 {
        match self.nfs(Nfs3Args::Mkdir(Mkdir3Args {
            where_: dop(dir, name),
            attributes: Sattr3::default(),
        })) {
            Nfs3Res::Mkdir(NfsResult::Ok(ok)) => ok.obj.unwrap(),
            other => panic!("mkdir {name}: {other:?}"),
        }
    }
}

fn dop(dir: &NfsFh3, name: &str) -> DirOpArgs3 {
    DirOpArgs3 {
        dir: dir.clone(),
        name: Filename3::new(name.as_bytes().to_vec()),
    }
}

fn status(r: &Nfs3Res) -> NfsStat3 {
    r.status()
}

#[test]
fn every_procedure_works() {
    let t = setup("/export *(rw,no_root_squash,insecure)");
    let root = t.mount("/export");
    assert_eq!(t.nfs(Nfs3Args::Null), Nfs3Res::Null);

    let f = t.create(&root, "file");
    let d = t.mkdir(&root, "dir");
    // GETATTR
    match t.nfs(Nfs3Args::Getattr(Getattr3Args { object: f.clone() })) {
        Nfs3Res::Getattr(NfsResult::Ok(a)) => assert_eq!(a.obj_attributes.type_, Ftype3::Reg),
        r => panic!("{r:?}"),
    }
    // WRITE (UNSTABLE) then COMMIT with the same verifier.
    let data = Bytes::from(vec![0x5a; 10_000]);
    let verf = match t.nfs(Nfs3Args::Write(Write3Args {
        file: f.clone(),
        offset: 0,
        count: data.len() as u32,
        stable: StableHow::Unstable,
        data: Data::new(data.clone()),
    })) {
        Nfs3Res::Write(NfsResult::Ok(w)) => {
            assert_eq!(w.count, 10_000);
            assert_eq!(w.committed, StableHow::Unstable);
            assert_eq!(w.file_wcc.before.unwrap().size, 0);
            assert_eq!(w.file_wcc.after.unwrap().size, 10_000);
            w.verf
        }
        r => panic!("{r:?}"),
    };
    match t.nfs(Nfs3Args::Commit(Commit3Args {
        file: f.clone(),
        offset: 0,
        count: 0,
    })) {
        Nfs3Res::Commit(NfsResult::Ok(c)) => assert_eq!(c.verf, verf),
        r => panic!("{r:?}"),
    }
    // READ
    match t.nfs(Nfs3Args::Read(Read3Args {
        file: f.clone(),
        offset: 9_000,
        count: 4096,
    })) {
        Nfs3Res::Read(NfsResult::Ok(r)) => {
            assert_eq!(r.count, 1000);
            assert!(r.eof);
            assert!(r.data.bytes().all(|b| b == 0x5a));
        }
        r => panic!("{r:?}"),
    }
    // SETATTR with a guard.
    let ctime = match t.nfs(Nfs3Args::Getattr(Getattr3Args { object: f.clone() })) {
        Nfs3Res::Getattr(NfsResult::Ok(a)) => a.obj_attributes.ctime,
        r => panic!("{r:?}"),
    };
    let r = t.nfs(Nfs3Args::Setattr(Setattr3Args {
        object: f.clone(),
        new_attributes: Sattr3 {
            mode: Some(0o600),
            size: Some(5),
            ..Default::default()
        },
        guard: Some(ctime),
    }));
    match r {
        Nfs3Res::Setattr(NfsResult::Ok(b)) => {
            let after = b.obj_wcc.after.unwrap();
            assert_eq!((after.mode, after.size), (0o600, 5));
        }
        r => panic!("{r:?}"),
    }
    let r = t.nfs(Nfs3Args::Setattr(Setattr3Args {
        object: f.clone(),
        new_attributes: Sattr3 {
            mode: Some(0o644),
            ..Default::default()
        },
        guard: Some(ctime),
    }));
    assert_eq!(status(&r), NfsStat3::NotSync);
    // LOOKUP, ACCESS
    match t.nfs(Nfs3Args::Lookup(Lookup3Args {
        what: dop(&root, "file"),
    })) {
        Nfs3Res::Lookup(NfsResult::Ok(l)) => assert_eq!(l.object, f),
        r => panic!("{r:?}"),
    }
    match t.nfs(Nfs3Args::Access(Access3Args {
        object: d.clone(),
        access: 0x3f,
    })) {
        Nfs3Res::Access(NfsResult::Ok(a)) => assert_eq!(a.access, 0x1f),
        r => panic!("{r:?}"),
    }
    // SYMLINK, READLINK
    let r = t.nfs(Nfs3Args::Symlink(Symlink3Args {
        where_: dop(&d, "link"),
        symlink: SymlinkData3 {
            symlink_attributes: Sattr3::default(),
            symlink_data: NfsPath3::from("../file"),
        },
    }));
    let l = match r {
        Nfs3Res::Symlink(NfsResult::Ok(ok)) => ok.obj.unwrap(),
        r => panic!("{r:?}"),
    };
    match t.nfs(Nfs3Args::Readlink(Readlink3Args { symlink: l })) {
        Nfs3Res::Readlink(NfsResult::Ok(r)) => assert_eq!(&r.data.0[..], b"../file"),
        r => panic!("{r:?}"),
    }
    // MKNOD (fifo) and a type MKNOD does not make.
    let r = t.nfs(Nfs3Args::Mknod(Mknod3Args {
        where_: dop(&d, "fifo"),
        what: MknodData3::Fifo(Sattr3::default()),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    let r = t.nfs(Nfs3Args::Mknod(Mknod3Args {
        where_: dop(&d, "reg"),
        what: MknodData3::Other(Ftype3::Reg),
    }));
    assert_eq!(status(&r), NfsStat3::Badtype);
    // LINK, RENAME, REMOVE, RMDIR
    let r = t.nfs(Nfs3Args::Link(Link3Args {
        file: f.clone(),
        link: dop(&d, "hard"),
    }));
    match r {
        Nfs3Res::Link(NfsResult::Ok(b)) => assert_eq!(b.file_attributes.unwrap().nlink, 2),
        r => panic!("{r:?}"),
    }
    let r = t.nfs(Nfs3Args::Rename(Rename3Args {
        from: dop(&d, "hard"),
        to: dop(&root, "hard2"),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    let r = t.nfs(Nfs3Args::Remove(Remove3Args {
        object: dop(&root, "hard2"),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    // READDIR and READDIRPLUS see the directory's entries.
    match t.nfs(Nfs3Args::Readdir(Readdir3Args {
        dir: d.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        count: 4096,
    })) {
        Nfs3Res::Readdir(NfsResult::Ok(r)) => {
            let names: Vec<_> = r.reply.entries.0.iter().map(|e| e.name.to_vec()).collect();
            assert_eq!(
                names,
                vec![
                    b".".to_vec(),
                    b"..".to_vec(),
                    b"link".to_vec(),
                    b"fifo".to_vec()
                ]
            );
            assert!(r.reply.eof);
        }
        r => panic!("{r:?}"),
    }
    match t.nfs(Nfs3Args::Readdirplus(Readdirplus3Args {
        dir: root.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        dircount: 4096,
        maxcount: 32768,
    })) {
        Nfs3Res::Readdirplus(NfsResult::Ok(r)) => {
            let e = r
                .reply
                .entries
                .0
                .iter()
                .find(|e| &e.name[..] == b"file")
                .unwrap();
            assert_eq!(e.name_handle.as_ref(), Some(&f));
            assert_eq!(e.name_attributes.as_ref().unwrap().size, 5);
        }
        r => panic!("{r:?}"),
    }
    // FSSTAT, FSINFO, PATHCONF
    match t.nfs(Nfs3Args::Fsstat(FsRootArgs {
        fsroot: root.clone(),
    })) {
        Nfs3Res::Fsstat(NfsResult::Ok(s)) => {
            assert_eq!(s.tbytes, StoreConfig::default().capacity_bytes);
            assert!(s.fbytes < s.tbytes);
        }
        r => panic!("{r:?}"),
    }
    match t.nfs(Nfs3Args::Fsinfo(FsRootArgs {
        fsroot: root.clone(),
    })) {
        Nfs3Res::Fsinfo(NfsResult::Ok(i)) => assert_eq!((i.rtmax, i.wtmax), (1 << 20, 1 << 20)),
        r => panic!("{r:?}"),
    }
    match t.nfs(Nfs3Args::Pathconf(FsRootArgs {
        fsroot: root.clone(),
    })) {
        Nfs3Res::Pathconf(NfsResult::Ok(p)) => assert_eq!(p.name_max, 255),
        r => panic!("{r:?}"),
    }
    let r = t.nfs(Nfs3Args::Remove(Remove3Args {
        object: dop(&d, "link"),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    let r = t.nfs(Nfs3Args::Remove(Remove3Args {
        object: dop(&d, "fifo"),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    let r = t.nfs(Nfs3Args::Rmdir(Remove3Args {
        object: dop(&root, "dir"),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    // Every procedure was counted.
    for p in NfsProc3::ALL.iter().skip(1) {
        assert!(t.svc.metrics().calls(*p) > 0, "{} not counted", p.name());
    }
}

#[test]
fn error_paths() {
    let t = setup("/a *(rw,no_root_squash,insecure)\n/b *(rw,no_root_squash,insecure)");
    let a = t.mount("/a");
    let b = t.mount("/b");
    let f = t.create(&a, "f");
    let d = t.mkdir(&a, "d");
    t.create(&d, "inner");
    // Stale handle: remove the file, then use its handle.
    let r = t.nfs(Nfs3Args::Remove(Remove3Args {
        object: dop(&a, "f"),
    }));
    assert_eq!(status(&r), NfsStat3::Ok);
    let r = t.nfs(Nfs3Args::Getattr(Getattr3Args { object: f.clone() }));
    assert_eq!(status(&r), NfsStat3::Stale);
    // A handle that is not ours.
    let r = t.nfs(Nfs3Args::Getattr(Getattr3Args {
        object: NfsFh3::from("garbage"),
    }));
    assert_eq!(status(&r), NfsStat3::Badhandle);
    // Not a directory.
    let g = t.create(&a, "g");
    let r = t.nfs(Nfs3Args::Lookup(Lookup3Args { what: dop(&g, "x") }));
    assert_eq!(status(&r), NfsStat3::Notdir);
    // Name too long (256 bytes).
    let long = "n".repeat(256);
    let r = t.nfs(Nfs3Args::Create(Create3Args {
        where_: dop(&a, &long),
        how: CreateHow3::Unchecked(Sattr3::default()),
    }));
    assert_eq!(status(&r), NfsStat3::Nametoolong);
    // Non-empty RMDIR.
    let r = t.nfs(Nfs3Args::Rmdir(Remove3Args {
        object: dop(&a, "d"),
    }));
    assert_eq!(status(&r), NfsStat3::Notempty);
    // Cross-export LINK and RENAME.
    let r = t.nfs(Nfs3Args::Link(Link3Args {
        file: g.clone(),
        link: dop(&b, "g"),
    }));
    assert_eq!(status(&r), NfsStat3::Xdev);
    let r = t.nfs(Nfs3Args::Rename(Rename3Args {
        from: dop(&a, "g"),
        to: dop(&b, "g"),
    }));
    assert_eq!(status(&r), NfsStat3::Xdev);
    // GUARDED create of an existing name; EXCLUSIVE with two verifiers.
    let r = t.nfs(Nfs3Args::Create(Create3Args {
        where_: dop(&a, "g"),
        how: CreateHow3::Guarded(Sattr3::default()),
    }));
    assert_eq!(status(&r), NfsStat3::Exist);
    let ex = |v| {
        t.nfs(Nfs3Args::Create(Create3Args {
            where_: dop(&a, "x"),
            how: CreateHow3::Exclusive(v),
        }))
    };
    assert_eq!(status(&ex([1; 8])), NfsStat3::Ok);
    assert_eq!(status(&ex([1; 8])), NfsStat3::Ok);
    assert_eq!(status(&ex([2; 8])), NfsStat3::Exist);
    // READ of a directory, WRITE whose count disagrees with its data.
    let r = t.nfs(Nfs3Args::Read(Read3Args {
        file: d.clone(),
        offset: 0,
        count: 10,
    }));
    assert_eq!(status(&r), NfsStat3::Isdir);
    let r = t.nfs(Nfs3Args::Write(Write3Args {
        file: g.clone(),
        offset: 0,
        count: 10,
        stable: StableHow::FileSync,
        data: Data::from("abc"),
    }));
    assert_eq!(status(&r), NfsStat3::Inval);
    // READDIR with a reply budget too small for one entry.
    let r = t.nfs(Nfs3Args::Readdir(Readdir3Args {
        dir: a.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        count: 50,
    }));
    assert_eq!(status(&r), NfsStat3::Toosmall);
}

#[test]
fn access_control() {
    let t = setup("/ro 127.0.0.1(ro,insecure)\n/rw 127.0.0.1(rw,insecure)\n/other 10.1.2.3(rw)");
    let ro = t.mount("/ro");
    let rw = t.mount("/rw");
    assert_eq!(t.mount_err("/other"), mnt::MountStat3::Acces);
    assert_eq!(t.mount_err("/missing"), mnt::MountStat3::Noent);
    // Read-only export: writes get NFS3ERR_ROFS, reads work.
    let r = t.nfs(Nfs3Args::Mkdir(Mkdir3Args {
        where_: dop(&ro, "x"),
        attributes: Sattr3::default(),
    }));
    assert_eq!(status(&r), NfsStat3::Rofs);
    let r = t.nfs(Nfs3Args::Getattr(Getattr3Args { object: ro.clone() }));
    assert_eq!(status(&r), NfsStat3::Ok);
    // root_squash (the default): root acts as nobody, who cannot write to
    // the root-owned 0755 export root.
    let r = t.nfs(Nfs3Args::Mkdir(Mkdir3Args {
        where_: dop(&rw, "x"),
        attributes: Sattr3::default(),
    }));
    assert_eq!(status(&r), NfsStat3::Acces);
    // A handle of an export this client may not use.
    let other_root = {
        let ex = t.svc.exports().iter().find(|e| e.path == "/other").unwrap();
        let fs = ex.store.read();
        NfsFh3(fs.handle(fs.root()))
    };
    let r = t.nfs(Nfs3Args::Getattr(Getattr3Args { object: other_root }));
    assert_eq!(status(&r), NfsStat3::Acces);
}

#[test]
fn secure_export_refuses_unprivileged_ports() {
    let mut t = setup("/s *(rw,secure)");
    t.peer = "127.0.0.1:40000".parse().unwrap();
    assert_eq!(t.mount_err("/s"), mnt::MountStat3::Perm);
    t.peer = "127.0.0.1:800".parse().unwrap();
    t.mount("/s");
}

#[test]
fn rpc_level_errors() {
    let mut t = setup("/e *(rw,no_root_squash,insecure)");
    let accept = |b: Bytes| {
        let mut d = Decoder::new(b);
        RpcMessage::decode(&mut d).unwrap()
    };
    let stat = |m: RpcMessage| match m.as_reply() {
        Some(rpc::ReplyBody::Accepted(a)) => Ok(a.stat),
        Some(rpc::ReplyBody::Denied(r)) => Err(*r),
        None => panic!(),
    };
    assert_eq!(
        stat(accept(t.raw(1, 100099, 1, 0, &[]).unwrap())),
        Ok(AcceptStat::ProgUnavail)
    );
    assert_eq!(
        stat(accept(t.raw(2, PROGRAM, 5, 0, &[]).unwrap())),
        Ok(AcceptStat::ProgMismatch { low: 3, high: 4 })
    );
    assert_eq!(
        stat(accept(t.raw(3, PROGRAM, 3, 22, &[]).unwrap())),
        Ok(AcceptStat::ProcUnavail)
    );
    assert_eq!(
        stat(accept(t.raw(4, PROGRAM, 3, 1, &[0, 0, 0]).unwrap())),
        Ok(AcceptStat::GarbageArgs)
    );
    // Arguments followed by garbage are garbage too.
    let mut a = BytesMut::new();
    Getattr3Args {
        object: NfsFh3::from("x"),
    }
    .encode(&mut a);
    a.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(
        stat(accept(t.raw(5, PROGRAM, 3, 1, &a).unwrap())),
        Ok(AcceptStat::GarbageArgs)
    );
    // AUTH_SYS with 17 groups: AUTH_ERROR / AUTH_BADCRED.
    let p = AuthSysParms {
        gids: BoundedVec((0..17).collect()),
        ..Default::default()
    };
    t.cred = OpaqueAuth {
        flavor: flavor::AUTH_SYS,
        body: rpc::AuthBody(p.to_bytes()),
    };
    assert_eq!(
        stat(accept(t.raw(6, PROGRAM, 3, 1, &a[..a.len() - 4]).unwrap())),
        Err(RejectedReply::AuthError(AuthStat::BadCred))
    );
    // An unknown flavor: AUTH_ERROR / AUTH_TOOWEAK.
    t.cred = OpaqueAuth {
        flavor: 390003,
        body: Default::default(),
    };
    assert_eq!(
        stat(accept(t.raw(7, PROGRAM, 3, 1, &[]).unwrap())),
        Err(RejectedReply::AuthError(AuthStat::TooWeak))
    );
    // RPC version 3: RPC_MISMATCH 2..2.
    let mut b = BytesMut::new();
    let mut m = RpcMessage::call(8, PROGRAM, 3, 0, OpaqueAuth::none());
    if let MessageBody::Call(c) = &mut m.body {
        c.rpcvers = 3;
    }
    m.encode(&mut b);
    let r = t
        .svc
        .handle(&CallContext::from(t.peer), b.freeze())
        .unwrap();
    assert!(matches!(
        r.header.as_reply(),
        Some(rpc::ReplyBody::Denied(RejectedReply::RpcMismatch {
            low: 2,
            high: 2
        }))
    ));
    // A reply sent to the server, or a truncated header: no answer.
    let reply = RpcMessage::accepted(9, AcceptStat::Success).to_bytes();
    assert!(t.svc.handle(&CallContext::from(t.peer), reply).is_none());
    assert!(t
        .svc
        .handle(
            &CallContext::from(t.peer),
            Bytes::from_static(&[0, 0, 0, 1, 0])
        )
        .is_none());
}

#[test]
fn retransmitted_non_idempotent_call_is_answered_from_the_cache() {
    let t = setup("/e *(rw,no_root_squash,insecure)");
    let root = t.mount("/e");
    let mut a = BytesMut::new();
    Nfs3Args::Mkdir(Mkdir3Args {
        where_: dop(&root, "d"),
        attributes: Sattr3::default(),
    })
    .encode(&mut a);
    let first = t.raw(77, PROGRAM, 3, NfsProc3::Mkdir as u32, &a).unwrap();
    // The same call again (same xid, same client address, another port).
    let mut t2 = t;
    t2.peer = "127.0.0.1:999".parse().unwrap();
    let again = t2.raw(77, PROGRAM, 3, NfsProc3::Mkdir as u32, &a).unwrap();
    assert_eq!(first, again, "the cached reply, not NFS3ERR_EXIST");
    assert_eq!(t2.svc.metrics().calls(NfsProc3::Mkdir), 1, "executed once");
    assert_eq!(t2.svc.metrics().drc_hits(), 1);
    // A new xid executes and fails.
    let third = t2.raw(78, PROGRAM, 3, NfsProc3::Mkdir as u32, &a).unwrap();
    let mut d = Decoder::new(third);
    RpcMessage::decode(&mut d).unwrap();
    assert_eq!(
        Nfs3Res::decode(NfsProc3::Mkdir, &mut d).unwrap().status(),
        NfsStat3::Exist
    );
}

#[test]
fn mount_protocol_lists() {
    let t = setup("/e 127.0.0.1(rw,insecure) 10.0.0.0/8(ro)");
    t.mount("/e");
    let reply = t.raw(50, mnt::PROGRAM, 3, mnt::proc_::DUMP, &[]).unwrap();
    let mut d = Decoder::new(reply);
    RpcMessage::decode(&mut d).unwrap();
    let l = mnt::MountList::decode(&mut d).unwrap();
    assert_eq!(l.0.len(), 1);
    assert_eq!(&l.0[0].ml_directory[..], b"/e");
    let reply = t.raw(51, mnt::PROGRAM, 3, mnt::proc_::EXPORT, &[]).unwrap();
    let mut d = Decoder::new(reply);
    RpcMessage::decode(&mut d).unwrap();
    let e = mnt::Exports::decode(&mut d).unwrap();
    let groups: Vec<_> = e.0[0]
        .ex_groups
        .0
        .iter()
        .map(|g| String::from_utf8(g.to_vec()).unwrap())
        .collect();
    assert_eq!(groups, vec!["127.0.0.1", "10.0.0.0/8"]);
    let mut a = BytesMut::new();
    mnt::DirPath::from("/e").encode(&mut a);
    t.raw(52, mnt::PROGRAM, 3, mnt::proc_::UMNT, &a).unwrap();
    let reply = t.raw(53, mnt::PROGRAM, 3, mnt::proc_::DUMP, &[]).unwrap();
    let mut d = Decoder::new(reply);
    RpcMessage::decode(&mut d).unwrap();
    assert!(mnt::MountList::decode(&mut d).unwrap().0.is_empty());
    // Mounting a subdirectory of an export.
    let t = setup("/e *(rw,no_root_squash,insecure)");
    let root = t.mount("/e");
    let sub = t.mkdir(&root, "sub");
    assert_eq!(t.mount("/e/sub"), sub);
    assert_eq!(t.mount_err("/e/nope"), mnt::MountStat3::Noent);
}

#[test]
fn directory_listings_stay_within_the_largest_transfer() {
    // A client may ask for any count: the reply stays within max_io (the
    // TCP front end charges a READDIR call that much before it runs).
    let t = setup_with(
        "/export *(rw,no_root_squash,insecure)\n",
        ServiceConfig {
            max_io: 4096,
            ..ServiceConfig::default()
        },
    );
    let root = t.mount("/export");
    for i in 0..200 {
        t.create(
            &root,
            &format!("a-rather-long-file-name-to-fill-the-listing-{i:04}"),
        );
    }
    let encoded = |args: Nfs3Args, proc_: u32| {
        let mut a = BytesMut::new();
        args.encode(&mut a);
        t.raw(t.next_xid(), 100003, 3, proc_, &a).expect("a reply")
    };
    let readdir = encoded(
        Nfs3Args::Readdir(Readdir3Args {
            dir: root.clone(),
            cookie: 0,
            cookieverf: [0; 8],
            count: 1 << 30,
        }),
        16,
    );
    let plus = encoded(
        Nfs3Args::Readdirplus(Readdirplus3Args {
            dir: root.clone(),
            cookie: 0,
            cookieverf: [0; 8],
            dircount: 1 << 30,
            maxcount: 1 << 30,
        }),
        17,
    );
    // The RPC reply header (24 bytes with AUTH_NONE) comes on top.
    for (name, r) in [("READDIR", &readdir), ("READDIRPLUS", &plus)] {
        assert!(r.len() <= 4096 + 24, "{name} reply of {} bytes", r.len());
        assert!(
            r.len() > 2048,
            "{name} reply of {} bytes: a listing was cut short",
            r.len()
        );
    }
    // Not the whole directory: 200 names of 48 bytes do not fit in 4 KiB.
    match t.nfs(Nfs3Args::Readdir(Readdir3Args {
        dir: root.clone(),
        cookie: 0,
        cookieverf: [0; 8],
        count: 1 << 30,
    })) {
        Nfs3Res::Readdir(NfsResult::Ok(r)) => {
            assert!(!r.reply.eof);
            assert!(r.reply.entries.0.len() < 200);
        }
        r => panic!("{r:?}"),
    }
}
