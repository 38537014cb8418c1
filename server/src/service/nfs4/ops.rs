//! The NFSv4.1 and NFSv4.2 operations over the stores and the pseudo root.

use super::attrs::{self, Limits, Source};
use super::pseudo::{Child, Pseudo};
use super::state::{Claim, OpenRequest};
use super::{Cx, Fh};
use crate::exports::ExportOptions;
use crate::service::{Export, Service};
use crate::store::{handle_fsid, CreateMode, Cred, Fs, Ino, NewNode};
use nfsrdma_xdr::nfs3::{Data, Ftype3, NfsStat3, Sattr3, SpecData3};
use nfsrdma_xdr::nfs4::ops::*;
use nfsrdma_xdr::nfs4::{
    access as acc, exchgid, opnum, share, ArgOp, Bitmap4, ChangeInfo4, Component4, Fattr4, Fh4,
    Linktext4, ResOp, StableHow4, Stateid4, Status,
};
use nfsrdma_xdr::{BoundedVec, List, Payload};
use std::time::Instant;

type R<T> = Result<T, Status>;

/// The most one COPY moves (the client sends another for the rest).
const COPY_MAX: u64 = 64 << 20;

/// The bytes of a CLONE done under one hold of the store's lock: 16 whole
/// 64 KiB blocks shared, or 1 MiB copied where the offsets differ in their
/// blocks.
const CLONE_PIECE: u64 = 1 << 20;

fn st(e: NfsStat3) -> Status {
    Status::from(e)
}

/// An export as the caller may use it.
struct Target<'a> {
    ex: &'a Export,
    idx: usize,
    opts: ExportOptions,
    cred: Cred,
}

impl Target<'_> {
    fn writable(&self) -> R<()> {
        if self.opts.rw {
            Ok(())
        } else {
            Err(Status::ROFS)
        }
    }
}

/// NFSv4 name rules (RFC 8881 §14.5): empty is INVAL, "." and ".." and
/// names with a slash or NUL are BADNAME, invalid UTF-8 is INVAL, longer
/// than NAME_MAX is NAMETOOLONG.
fn check_name(name: &[u8]) -> R<()> {
    if name.is_empty() {
        return Err(Status::INVAL);
    }
    if name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0) {
        return Err(Status::BADNAME);
    }
    if std::str::from_utf8(name).is_err() {
        return Err(Status::INVAL);
    }
    if name.len() > crate::store::NAME_MAX {
        return Err(Status::NAMETOOLONG);
    }
    Ok(())
}

fn cinfo(before: u64, after: u64) -> ChangeInfo4 {
    ChangeInfo4 {
        atomic: true,
        before,
        after,
    }
}

/// The error a non-directory gives where a directory is needed.
fn not_dir(fs: &Fs, ino: Ino) -> Status {
    match fs.getattr(ino).map(|a| a.type_) {
        Ok(Ftype3::Lnk) => Status::SYMLINK,
        Ok(_) => Status::NOTDIR,
        Err(e) => st(e),
    }
}

fn is_dir(fs: &Fs, ino: Ino) -> R<bool> {
    fs.getattr(ino).map(|a| a.type_ == Ftype3::Dir).map_err(st)
}

/// READ, WRITE and friends want a regular file.
fn need_file(fs: &Fs, ino: Ino) -> R<()> {
    match fs.getattr(ino).map_err(st)?.type_ {
        Ftype3::Reg => Ok(()),
        Ftype3::Dir => Err(Status::ISDIR),
        Ftype3::Lnk => Err(Status::SYMLINK),
        _ => Err(Status::INVAL),
    }
}

impl Service {
    fn target4(&self, cx: &Cx, idx: usize) -> R<Target<'_>> {
        let ex = self.exports.get(idx).ok_or(Status::STALE)?;
        let opts = ex
            .rules
            .options_for(cx.caller.ctx.ip(), None)
            .ok_or(Status::ACCESS)?
            .clone();
        if !opts.port_allowed(cx.caller.ctx.peer.port()) {
            return Err(Status::PERM);
        }
        let cred = cx.caller.cred_for(&opts);
        Ok(Target {
            ex,
            idx,
            opts,
            cred,
        })
    }

    /// The current handle as a file of an export (a pseudo directory is
    /// `pseudo_err`).
    fn cur_file(&self, cx: &Cx, pseudo_err: Status) -> R<(Target<'_>, Ino)> {
        match cx.cur()? {
            Fh::Pseudo(_) => Err(pseudo_err),
            Fh::File(idx, ino) => Ok((self.target4(cx, idx)?, ino)),
        }
    }

    fn root_fh(&self) -> Fh {
        match self.nfs4.pseudo.root_export() {
            Some(ex) => Fh::File(ex, self.exports[ex].store.read().root()),
            None => Fh::Pseudo(0),
        }
    }

    fn parse_fh(&self, fh: &[u8]) -> R<Fh> {
        if let Some(p) = self.nfs4.pseudo.parse(fh) {
            return p.map(Fh::Pseudo).ok_or(Status::STALE);
        }
        let fsid = handle_fsid(fh).ok_or(Status::BADHANDLE)?;
        let idx = self
            .exports
            .iter()
            .position(|e| e.store.fsid() as u32 == fsid)
            .ok_or(Status::STALE)?;
        let ino = self.exports[idx].store.read().resolve(fh).map_err(st)?;
        Ok(Fh::File(idx, ino))
    }

    pub(super) fn fh_bytes(&self, fh: Fh) -> R<Fh4> {
        match fh {
            Fh::Pseudo(id) => Ok(Fh4(Pseudo::handle(id))),
            Fh::File(idx, ino) => {
                let fs = self.exports[idx].store.read();
                fs.getattr(ino).map_err(st)?;
                Ok(Fh4(fs.handle(ino)))
            }
        }
    }

    fn limits(&self, cx: &Cx) -> Limits {
        Limits {
            max_io: self.config.max_io,
            lease: self.nfs4.config.lease.as_secs() as u32,
            minor: cx.minor,
        }
    }

    /// The attribute source of `fh`.
    fn source(&self, fh: Fh) -> R<Source> {
        match fh {
            Fh::Pseudo(id) => Ok(attrs::pseudo_source(
                id,
                self.nfs4.pseudo.children(id).len(),
                self.nfs4.state.boot(),
            )),
            Fh::File(idx, ino) => {
                let ex = &self.exports[idx];
                let fs = ex.store.read();
                let mut s = attrs::file_source(&fs, ino, ex.store.fsid()).map_err(st)?;
                if ino == fs.root() && self.nfs4.pseudo.root_export() != Some(idx) {
                    s.mounted_on = Pseudo::mounted_on_fileid(idx);
                }
                Ok(s)
            }
        }
    }

    fn fattr(&self, cx: &Cx, fh: Fh, want: &Bitmap4) -> R<Fattr4> {
        Ok(attrs::encode(want, &self.source(fh)?, &self.limits(cx)))
    }

    /// Runs one operation; one that panics fails with NFS4ERR_SERVERFAULT
    /// (see `service::fault`).
    pub(super) fn nfs4_op_caught(&self, cx: &mut Cx, op: &ArgOp) -> ResOp {
        let peer = cx.caller.ctx.peer;
        crate::service::fault::catch(&self.metrics, peer, opnum::name(op.num()), || {
            self.nfs4_op(cx, op)
        })
        .unwrap_or_else(|| ResOp::error(op.num(), Status::SERVERFAULT))
    }

    /// Runs one operation.
    fn nfs4_op(&self, cx: &mut Cx, op: &ArgOp) -> ResOp {
        if cx.minor < 2 && op.num() >= opnum::ALLOCATE && op.num() <= opnum::LAST {
            return ResOp::error(op.num(), Status::OP_ILLEGAL);
        }
        match op {
            ArgOp::Putrootfh | ArgOp::Putpubfh => {
                cx.cur = Some(self.root_fh());
                cx.cur_sid = None;
                let r = Ok(());
                if matches!(op, ArgOp::Putrootfh) {
                    ResOp::Putrootfh(r)
                } else {
                    ResOp::Putpubfh(r)
                }
            }
            ArgOp::Putfh(fh) => ResOp::Putfh(self.parse_fh(fh).map(|f| {
                cx.cur = Some(f);
                cx.cur_sid = None;
            })),
            ArgOp::Getfh => ResOp::Getfh(cx.cur().and_then(|f| self.fh_bytes(f))),
            ArgOp::Savefh => ResOp::Savefh(cx.cur().map(|f| {
                cx.saved = Some(f);
                cx.saved_sid = cx.cur_sid;
            })),
            ArgOp::Restorefh => ResOp::Restorefh(match cx.saved {
                Some(f) => {
                    cx.cur = Some(f);
                    cx.cur_sid = cx.saved_sid;
                    Ok(())
                }
                None => Err(Status::RESTOREFH),
            }),
            ArgOp::Lookup(name) => ResOp::Lookup(self.lookup4(cx, name)),
            ArgOp::Lookupp => ResOp::Lookupp(self.lookupp4(cx)),
            ArgOp::Getattr(want) => ResOp::Getattr(cx.cur().and_then(|f| {
                // Another client's write delegation: its size and change
                // may be cached there (CB_GETATTR asks for them).
                let held = match f {
                    Fh::File(idx, ino) => self.held_size4(cx.client, (idx, ino), want)?,
                    Fh::Pseudo(_) => None,
                };
                let mut src = self.source(f)?;
                if let Some(size) = held {
                    src.a.size = size;
                }
                Ok(attrs::encode(want, &src, &self.limits(cx)))
            })),
            ArgOp::Access(want) => ResOp::Access(self.access4(cx, *want)),
            ArgOp::Verify(f) => ResOp::Verify(self.verify4(cx, f, true)),
            ArgOp::Nverify(f) => ResOp::Nverify(self.verify4(cx, f, false)),
            ArgOp::Setattr(a) => {
                let r = self.setattr4(cx, a);
                ResOp::Setattr(match r {
                    Ok(mask) => SetattrRes {
                        status: Status::OK,
                        attrsset: mask,
                    },
                    Err(e) => SetattrRes {
                        status: e,
                        attrsset: Bitmap4::default(),
                    },
                })
            }
            ArgOp::Readlink => ResOp::Readlink(self.readlink4(cx)),
            ArgOp::Read(a) => ResOp::Read(self.read4(cx, a)),
            ArgOp::Write(a) => ResOp::Write(self.write4(cx, a)),
            ArgOp::Commit(_) => ResOp::Commit(
                self.cur_file(cx, Status::ISDIR)
                    .and_then(|(t, ino)| need_file(&t.ex.store.read(), ino))
                    .map(|()| self.write_verf),
            ),
            ArgOp::Create(a) => ResOp::Create(self.create4(cx, a)),
            ArgOp::Remove(name) => ResOp::Remove(self.remove4(cx, name)),
            ArgOp::Rename(a) => ResOp::Rename(self.rename4(cx, a)),
            ArgOp::Link(name) => ResOp::Link(self.link4(cx, name)),
            ArgOp::Readdir(a) => ResOp::Readdir(self.readdir4(cx, a)),
            ArgOp::Secinfo(name) => ResOp::Secinfo(self.secinfo4(cx, Some(name))),
            ArgOp::SecinfoNoName(style) => ResOp::SecinfoNoName(match style {
                0 => self.secinfo4(cx, None),
                // SECINFO_STYLE4_PARENT: the parent's, as LOOKUPP finds it
                // (NFS4ERR_NOENT at the root).
                1 => self.lookupp4(cx).and_then(|()| self.secinfo4(cx, None)),
                _ => Err(Status::INVAL),
            }),
            ArgOp::Open(a) => ResOp::Open(self.open4(cx, a)),
            ArgOp::Delegreturn(sid) => {
                ResOp::Delegreturn(cx.sid(sid).and_then(|sid| self.delegreturn4(cx, &sid)))
            }
            ArgOp::Close(a) => ResOp::Close(self.close4(cx, a)),
            ArgOp::OpenDowngrade(a) => ResOp::OpenDowngrade(self.downgrade4(cx, a)),
            ArgOp::Lock(a) => ResOp::Lock(self.lock4(cx, a)),
            ArgOp::Lockt(a) => ResOp::Lockt(self.lockt4(cx, a)),
            ArgOp::Locku(a) => ResOp::Locku(self.locku4(cx, a)),
            ArgOp::FreeStateid(s) => ResOp::FreeStateid(match cx.client {
                Some(c) => cx.sid(s).and_then(|s| self.nfs4.state.free_stateid(c, &s)),
                None => Err(Status::OP_NOT_IN_SESSION),
            }),
            ArgOp::TestStateid(list) => ResOp::TestStateid(match cx.client {
                Some(c) => Ok(BoundedVec(
                    list.0
                        .iter()
                        .map(|s| self.nfs4.state.test_stateid(c, s))
                        .collect(),
                )),
                None => Err(Status::OP_NOT_IN_SESSION),
            }),
            ArgOp::ExchangeId(a) => ResOp::ExchangeId(self.exchange_id4(cx, a)),
            ArgOp::CreateSession(a) => ResOp::CreateSession(self.create_session4(cx, a)),
            ArgOp::DestroySession(sid) => {
                ResOp::DestroySession(self.nfs4.state.destroy_session(sid))
            }
            ArgOp::DestroyClientid(id) => {
                ResOp::DestroyClientid(self.nfs4.state.destroy_clientid(*id))
            }
            ArgOp::BindConnToSession(a) => ResOp::BindConnToSession(self.bind_conn4(cx, a)),
            ArgOp::BackchannelCtl(a) => ResOp::BackchannelCtl(self.backchannel_ctl4(cx, a)),
            ArgOp::ReclaimComplete(one_fs) => ResOp::ReclaimComplete(match (cx.client, one_fs) {
                (None, _) => Err(Status::OP_NOT_IN_SESSION),
                // Per file system: nothing to reclaim here either.
                (Some(_), true) => cx.cur().map(|_| ()),
                (Some(c), false) => self.nfs4.state.reclaim_complete(c),
            }),
            ArgOp::Sequence(_) => ResOp::error(opnum::SEQUENCE, Status::SEQUENCE_POS),
            ArgOp::Allocate(a) => ResOp::Allocate(self.allocate4(cx, a)),
            ArgOp::Deallocate(a) => ResOp::Deallocate(self.deallocate4(cx, a)),
            ArgOp::Seek(a) => ResOp::Seek(self.seek4(cx, a)),
            ArgOp::Copy(a) => ResOp::Copy(self.copy4(cx, a)),
            ArgOp::Clone(a) => ResOp::Clone(self.clone4(cx, a)),
            ArgOp::Unsupported(n) => ResOp::error(*n, Status::NOTSUPP),
            ArgOp::Illegal(_) => ResOp::error(opnum::ILLEGAL, Status::OP_ILLEGAL),
        }
    }

    // ---- names ----------------------------------------------------------------

    fn lookup4(&self, cx: &mut Cx, name: &Component4) -> R<()> {
        let cur = cx.cur()?;
        check_name(name)?;
        let next = match cur {
            Fh::Pseudo(id) => match self.nfs4.pseudo.lookup(id, name) {
                Some(Child::Dir(d)) => Fh::Pseudo(d),
                Some(Child::Export(ex)) => {
                    let t = self.target4(cx, ex)?;
                    Fh::File(ex, t.ex.store.read().root())
                }
                None => return Err(Status::NOENT),
            },
            Fh::File(idx, dir) => {
                let t = self.target4(cx, idx)?;
                let fs = t.ex.store.read();
                if !is_dir(&fs, dir)? {
                    return Err(not_dir(&fs, dir));
                }
                Fh::File(idx, fs.lookup(dir, name, &t.cred).map_err(st)?)
            }
        };
        cx.cur = Some(next);
        cx.cur_sid = None;
        Ok(())
    }

    fn lookupp4(&self, cx: &mut Cx) -> R<()> {
        let next = match cx.cur()? {
            Fh::Pseudo(0) => return Err(Status::NOENT),
            Fh::Pseudo(id) => Fh::Pseudo(self.nfs4.pseudo.parent(id)),
            Fh::File(idx, ino) => {
                let t = self.target4(cx, idx)?;
                let fs = t.ex.store.read();
                if !is_dir(&fs, ino)? {
                    return Err(not_dir(&fs, ino));
                }
                if ino == fs.root() {
                    match self.nfs4.pseudo.export_parent(idx) {
                        Some(p) => Fh::Pseudo(p),
                        None => return Err(Status::NOENT),
                    }
                } else {
                    Fh::File(idx, fs.lookup(ino, b"..", &t.cred).map_err(st)?)
                }
            }
        };
        cx.cur = Some(next);
        cx.cur_sid = None;
        Ok(())
    }

    fn access4(&self, cx: &Cx, want: u32) -> R<AccessResOk> {
        let all = acc::READ | acc::LOOKUP | acc::MODIFY | acc::EXTEND | acc::DELETE | acc::EXECUTE;
        let want = want & all;
        match cx.cur()? {
            Fh::Pseudo(_) => Ok(AccessResOk {
                supported: want,
                access: want & (acc::READ | acc::LOOKUP),
            }),
            Fh::File(idx, ino) => {
                let t = self.target4(cx, idx)?;
                let fs = t.ex.store.read();
                let got = fs.access(ino, &t.cred, want, !t.opts.rw).map_err(st)?;
                Ok(AccessResOk {
                    supported: want,
                    access: got,
                })
            }
        }
    }

    fn verify4(&self, cx: &Cx, f: &Fattr4, same_is_ok: bool) -> R<()> {
        let sup = attrs::supported(cx.minor);
        if f.attrmask.bits().any(|b| !sup.has(b)) {
            return Err(Status::ATTRNOTSUPP);
        }
        if f.attrmask.has(nfsrdma_xdr::nfs4::attr::n::RDATTR_ERROR) {
            return Err(Status::INVAL);
        }
        let mine = self.fattr(cx, cx.cur()?, &f.attrmask)?;
        let same = mine.attrmask == f.attrmask && mine.attr_vals == f.attr_vals;
        match (same, same_is_ok) {
            (true, true) | (false, false) => Ok(()),
            (false, true) => Err(Status::NOT_SAME),
            (true, false) => Err(Status::SAME),
        }
    }

    fn setattr4(&self, cx: &Cx, a: &SetattrArgs) -> R<Bitmap4> {
        let (t, ino) = self.cur_file(cx, Status::ROFS)?;
        let (sattr, mask) = attrs::to_sattr(&a.obj_attributes, cx.minor)?;
        t.writable()?;
        if sattr.size.is_some() {
            let sid = cx.sid(&a.stateid)?;
            self.nfs4
                .state
                .check_io(cx.client, &sid, (t.idx, ino), true)?;
        }
        let mut fs = t.ex.store.write();
        self.break_delegations4(cx.client, (t.idx, ino), true)?;
        fs.setattr(ino, &t.cred, &sattr, None).map_err(st)?;
        Ok(mask)
    }

    fn readlink4(&self, cx: &Cx) -> R<Linktext4> {
        let (t, ino) = self.cur_file(cx, Status::INVAL)?;
        let fs = t.ex.store.read();
        match fs.getattr(ino).map_err(st)?.type_ {
            Ftype3::Lnk => fs.readlink(ino).map(Linktext4).map_err(st),
            Ftype3::Dir => Err(Status::ISDIR),
            _ => Err(Status::INVAL),
        }
    }

    // ---- data -------------------------------------------------------------------

    fn read4(&self, cx: &Cx, a: &ReadArgs) -> R<ReadResOk> {
        let (t, ino) = self.cur_file(cx, Status::ISDIR)?;
        let sid = cx.sid(&a.stateid)?;
        let fs = t.ex.store.read();
        need_file(&fs, ino)?;
        self.nfs4
            .state
            .check_io(cx.client, &sid, (t.idx, ino), false)?;
        if sid.is_special() {
            // I/O outside any open: a write delegation of another client
            // may hold data this read would miss.
            self.break_delegations4(cx.client, (t.idx, ino), false)?;
        }
        let count = a.count.min(self.config.max_io);
        let (data, eof) = fs.read(ino, &t.cred, a.offset, count).map_err(st)?;
        Ok(ReadResOk {
            eof,
            data: Data(data),
        })
    }

    fn write4(&self, cx: &Cx, a: &WriteArgs) -> R<WriteResOk> {
        let (t, ino) = self.cur_file(cx, Status::ISDIR)?;
        let sid = cx.sid(&a.stateid)?;
        t.writable()?;
        if a.data.len() > self.config.max_io as usize {
            return Err(Status::INVAL);
        }
        // The store's shared lock: the file alone is locked while it changes.
        let fs = t.ex.store.read();
        need_file(&fs, ino)?;
        self.nfs4
            .state
            .check_io(cx.client, &sid, (t.idx, ino), true)?;
        if sid.is_special() {
            // A write outside any open conflicts with every other
            // client's delegation of the file.
            self.break_delegations4(cx.client, (t.idx, ino), true)?;
        }
        fs.write(ino, &t.cred, a.offset, &a.data).map_err(st)?;
        Ok(WriteResOk {
            count: a.data.len() as u32,
            committed: if a.stable == StableHow4::Unstable {
                StableHow4::Unstable
            } else {
                StableHow4::FileSync
            },
            writeverf: self.write_verf,
        })
    }

    // ---- making and removing names -----------------------------------------------

    /// The current handle as a directory of an export, for operations that
    /// change it (a pseudo directory is read-only).
    fn cur_dir(&self, cx: &Cx) -> R<(Target<'_>, Ino)> {
        let (t, dir) = self.cur_file(cx, Status::ROFS)?;
        {
            let fs = t.ex.store.read();
            if !is_dir(&fs, dir)? {
                return Err(not_dir(&fs, dir));
            }
        }
        Ok((t, dir))
    }

    fn create4(&self, cx: &mut Cx, a: &CreateArgs) -> R<CreateResOk> {
        let (t, dir) = self.cur_dir(cx)?;
        let node = match &a.objtype {
            CreateType4::Link(l) => NewNode::Symlink(l.0.clone()),
            CreateType4::Dir => NewNode::Dir,
            CreateType4::Blk(s) => NewNode::Special(Ftype3::Blk, spec(s)),
            CreateType4::Chr(s) => NewNode::Special(Ftype3::Chr, spec(s)),
            CreateType4::Sock => NewNode::Special(Ftype3::Sock, SpecData3::default()),
            CreateType4::Fifo => NewNode::Special(Ftype3::Fifo, SpecData3::default()),
            CreateType4::Other(_) => return Err(Status::BADTYPE),
        };
        if let CreateType4::Link(l) = &a.objtype {
            if l.is_empty() {
                return Err(Status::INVAL);
            }
        }
        check_name(&a.objname)?;
        let (sattr, mask) = attrs::to_sattr(&a.createattrs, cx.minor)?;
        if sattr.size.is_some() {
            return Err(Status::INVAL);
        }
        t.writable()?;
        let mut fs = t.ex.store.write();
        let before = fs.change(dir).map_err(st)?;
        let ino = fs
            .create(dir, &a.objname, &t.cred, node, CreateMode::Guarded, &sattr)
            .map_err(st)?;
        let after = fs.change(dir).map_err(st)?;
        cx.cur = Some(Fh::File(t.idx, ino));
        cx.cur_sid = None;
        Ok(CreateResOk {
            cinfo: cinfo(before, after),
            attrset: mask,
        })
    }

    /// REMOVE and RENAME wait out the grace period (NFS4ERR_GRACE), as
    /// on the Linux nfsd: they could take away a name whose file a client
    /// is still to reclaim.
    fn no_grace(&self) -> R<()> {
        if self.nfs4.state.in_grace(Instant::now()) {
            Err(Status::GRACE)
        } else {
            Ok(())
        }
    }

    fn remove4(&self, cx: &Cx, name: &Component4) -> R<ChangeInfo4> {
        let (t, dir) = self.cur_dir(cx)?;
        check_name(name)?;
        t.writable()?;
        self.no_grace()?;
        let mut fs = t.ex.store.write();
        let before = fs.change(dir).map_err(st)?;
        let target = fs.lookup(dir, name, &t.cred).map_err(st)?;
        self.break_delegations4(cx.client, (t.idx, target), true)?;
        if is_dir(&fs, target)? {
            fs.rmdir(dir, name, &t.cred).map_err(st)?;
        } else {
            fs.remove(dir, name, &t.cred).map_err(st)?;
        }
        Ok(cinfo(before, fs.change(dir).map_err(st)?))
    }

    fn two_dirs(&self, cx: &Cx) -> R<(Target<'_>, Ino, Ino)> {
        let saved = cx.saved.ok_or(Status::NOFILEHANDLE)?;
        let (t, to) = self.cur_dir(cx)?;
        let from = match saved {
            Fh::Pseudo(_) => return Err(Status::XDEV),
            Fh::File(idx, _) if idx != t.idx => return Err(Status::XDEV),
            Fh::File(_, ino) => ino,
        };
        Ok((t, from, to))
    }

    fn rename4(&self, cx: &Cx, a: &RenameArgs) -> R<RenameResOk> {
        let (t, from, to) = self.two_dirs(cx)?;
        {
            let fs = t.ex.store.read();
            if !is_dir(&fs, from)? {
                return Err(not_dir(&fs, from));
            }
        }
        check_name(&a.oldname)?;
        check_name(&a.newname)?;
        t.writable()?;
        self.no_grace()?;
        let mut fs = t.ex.store.write();
        let (fb, tb) = (fs.change(from).map_err(st)?, fs.change(to).map_err(st)?);
        // The file renamed and the one it would replace.
        for (dir, name) in [(from, &a.oldname), (to, &a.newname)] {
            if let Ok(ino) = fs.lookup(dir, name, &t.cred) {
                self.break_delegations4(cx.client, (t.idx, ino), true)?;
            }
        }
        fs.rename(from, &a.oldname, to, &a.newname, &t.cred)
            .map_err(st)?;
        Ok(RenameResOk {
            source_cinfo: cinfo(fb, fs.change(from).map_err(st)?),
            target_cinfo: cinfo(tb, fs.change(to).map_err(st)?),
        })
    }

    fn link4(&self, cx: &Cx, name: &Component4) -> R<ChangeInfo4> {
        let (t, file, dir) = self.two_dirs(cx)?;
        check_name(name)?;
        t.writable()?;
        let mut fs = t.ex.store.write();
        if is_dir(&fs, file)? {
            return Err(Status::ISDIR);
        }
        self.break_delegations4(cx.client, (t.idx, file), true)?;
        let before = fs.change(dir).map_err(st)?;
        fs.link(file, dir, name, &t.cred).map_err(st)?;
        Ok(cinfo(before, fs.change(dir).map_err(st)?))
    }

    // ---- directories ----------------------------------------------------------------

    fn readdir4(&self, cx: &Cx, a: &ReaddirArgs) -> R<ReaddirResOk> {
        // Cookies 1 and 2 are never handed out ("." and ".." are not
        // listed over NFSv4); a zero cookie with a verifier is invalid.
        if a.cookie == 1 || a.cookie == 2 || (a.cookie == 0 && a.cookieverf != [0; 8]) {
            return Err(Status::BAD_COOKIE);
        }
        let max = a.maxcount as usize;
        // status, verifier, list end, eof.
        let mut used = 4 + 8 + 4 + 4;
        let lim = self.limits(cx);
        let mut fits = |e: &Entry4| {
            let n = 4 + nfsrdma_xdr::Xdr::encoded_len(e);
            if used + n > max {
                return false;
            }
            used += n;
            true
        };
        let (entries, eof, verf) = match cx.cur()? {
            Fh::Pseudo(id) => {
                let mut out = Vec::new();
                let mut eof = true;
                for (i, (name, child)) in self.nfs4.pseudo.children(id).iter().enumerate() {
                    let cookie = 3 + i as u64;
                    if cookie <= a.cookie {
                        continue;
                    }
                    let fh = match child {
                        Child::Dir(d) => Fh::Pseudo(*d),
                        Child::Export(ex) => match self.target4(cx, *ex) {
                            Ok(t) => Fh::File(*ex, t.ex.store.read().root()),
                            // Exports this client may not use are not listed.
                            Err(_) => continue,
                        },
                    };
                    let Ok(src) = self.source(fh) else { continue };
                    let e = Entry4 {
                        cookie,
                        name: nfsrdma_xdr::nfs4::Utf8Str(name.clone()),
                        attrs: attrs::encode(&a.attr_request, &src, &lim),
                    };
                    if !fits(&e) {
                        eof = false;
                        break;
                    }
                    out.push(e);
                }
                (out, eof, [0u8; 8])
            }
            Fh::File(idx, dir) => {
                let t = self.target4(cx, idx)?;
                let ex = t.ex;
                let fs = ex.store.read();
                if !is_dir(&fs, dir)? {
                    return Err(Status::NOTDIR);
                }
                let mut out = Vec::new();
                let start = if a.cookie == 0 { 2 } else { a.cookie };
                let r = fs.readdir(dir, &t.cred, start, a.cookieverf, |de| {
                    let Ok(src) = attrs::file_source(&fs, de.ino, ex.store.fsid()) else {
                        return true;
                    };
                    let e = Entry4 {
                        cookie: de.cookie,
                        name: nfsrdma_xdr::nfs4::Utf8Str(de.name.clone()),
                        attrs: attrs::encode(&a.attr_request, &src, &lim),
                    };
                    if !fits(&e) {
                        return false;
                    }
                    out.push(e);
                    true
                });
                let (_, eof) = r.map_err(st)?;
                (out, eof, fs.cookieverf(dir))
            }
        };
        if entries.is_empty() && !eof {
            return Err(Status::TOOSMALL);
        }
        Ok(ReaddirResOk {
            cookieverf: verf,
            entries: List(entries),
            eof,
        })
    }

    fn secinfo4(&self, cx: &mut Cx, name: Option<&Component4>) -> R<SecInfoList> {
        let cur = cx.cur()?;
        if let Some(name) = name {
            check_name(name)?;
            // The name must exist (it is looked up as LOOKUP would).
            let saved = (cx.cur, cx.cur_sid);
            self.lookup4(cx, name)?;
            (cx.cur, cx.cur_sid) = saved;
        }
        if let Fh::File(idx, _) = cur {
            self.target4(cx, idx)?;
        }
        // SECINFO consumes the current filehandle (RFC 8881 §2.6.3.1.1.8).
        cx.cur = None;
        Ok(BoundedVec(vec![SecInfo4::Flavor(1), SecInfo4::Flavor(0)]))
    }

    // ---- client records ------------------------------------------------------------

    fn exchange_id4(&self, cx: &Cx, a: &ExchangeIdArgs) -> R<ExchangeIdResOk> {
        let allowed = exchgid::SUPP_MOVED_REFER
            | exchgid::SUPP_MOVED_MIGR
            | exchgid::BIND_PRINC_STATEID
            | exchgid::MASK_PNFS
            | exchgid::UPD_CONFIRMED_REC_A;
        if a.flags & !allowed != 0 {
            return Err(Status::INVAL);
        }
        let uid = cx.caller.cred.as_ref().map(|c| c.uid);
        let (clientid, sequenceid, confirmed) = self.nfs4.state.exchange_id(
            &a.clientowner.ownerid,
            a.clientowner.verifier,
            uid,
            a.flags & exchgid::UPD_CONFIRMED_REC_A != 0,
        )?;
        let owner = nfsrdma_xdr::nfs4::Opaque4(self.nfs4.owner.clone());
        Ok(ExchangeIdResOk {
            clientid,
            sequenceid,
            flags: exchgid::USE_NON_PNFS | if confirmed { exchgid::CONFIRMED_R } else { 0 },
            state_protect: match &a.state_protect {
                StateProtectA::None => StateProtectA::None,
                // Nothing is enforced: every operation is allowed with any
                // credential, as with SP4_NONE.
                StateProtectA::MachCred(_) => StateProtectA::MachCred(Default::default()),
            },
            server_owner: ServerOwner4 {
                minor_id: 0,
                major_id: owner.clone(),
            },
            server_scope: owner,
            server_impl_id: BoundedVec(vec![NfsImplId4 {
                domain: "nfsrdma".into(),
                name: nfsrdma_xdr::nfs4::Utf8Str(bytes::Bytes::from(format!(
                    "nfsrdmad {}",
                    env!("CARGO_PKG_VERSION")
                ))),
                date: Default::default(),
            }]),
        })
    }

    // ---- opens and locks -------------------------------------------------------------

    fn open4(&self, cx: &mut Cx, a: &OpenArgs) -> R<OpenResOk> {
        let client = cx.client.ok_or(Status::OP_NOT_IN_SESSION)?;
        let access = a.share_access & share::ACCESS_BOTH;
        if access == 0 || a.share_deny & !3 != 0 {
            return Err(Status::INVAL);
        }
        let (t, cur) = self.cur_file(cx, Status::ROFS)?;
        // `deleg`: the delegation whose holder opens under it (a recall
        // asks the client to make its local opens the server's first).
        let (name, dir, claim, deleg) = match &a.claim {
            OpenClaim4::Null(name) => (Some(name), cur, Some(Claim::New), None),
            OpenClaim4::Fh => (None, cur, Some(Claim::New), None),
            // The file itself is the current filehandle; a delegation the
            // client held is granted again below.
            OpenClaim4::Previous(_) => (None, cur, Some(Claim::Reclaim), None),
            OpenClaim4::DelegateCur(sid, name) => (Some(name), cur, None, Some(*sid)),
            OpenClaim4::DelegCurFh(sid) => (None, cur, None, Some(*sid)),
            _ => return Err(Status::NOTSUPP),
        };
        if let Some(claim) = claim {
            self.nfs4.state.check_claim(client, claim, Instant::now())?;
        }
        if deleg.is_some() && a.openhow.is_some() {
            return Err(Status::INVAL);
        }
        if a.openhow.is_some() && name.is_none() {
            return Err(Status::INVAL);
        }
        let mut attrset = Bitmap4::default();
        let mut created = false;
        let mut fs = t.ex.store.write();
        let before = fs.change(dir).map_err(st)?;
        let ino = match name {
            Some(name) => {
                if !is_dir(&fs, dir)? {
                    return Err(not_dir(&fs, dir));
                }
                check_name(name)?;
                let existing = match fs.lookup(dir, name, &t.cred) {
                    Ok(i) => Some(i),
                    Err(NfsStat3::Noent) => None,
                    Err(e) => return Err(st(e)),
                };
                if let Some(i) = existing {
                    let write = access & share::ACCESS_WRITE != 0 || a.openhow.is_some();
                    self.break_delegations4(Some(client), (t.idx, i), write)?;
                }
                match (&a.openhow, existing) {
                    (None, None) => return Err(Status::NOENT),
                    (None, Some(i)) => i,
                    (Some(how), _) => {
                        t.writable()?;
                        let (mode, fattr) = match how {
                            CreateHow4::Unchecked(f) => (CreateMode::Unchecked, Some(f)),
                            CreateHow4::Guarded(f) => (CreateMode::Guarded, Some(f)),
                            CreateHow4::Exclusive(v) => (CreateMode::Exclusive(*v), None),
                            CreateHow4::Exclusive41(v, f) => (CreateMode::Exclusive(*v), Some(f)),
                        };
                        let (sattr, mask) = match fattr {
                            Some(f) => attrs::to_sattr(f, cx.minor)?,
                            None => (Sattr3::default(), Bitmap4::default()),
                        };
                        if let Some(i) = existing {
                            if is_dir(&fs, i)? {
                                return Err(Status::ISDIR);
                            }
                        }
                        let exclusive = matches!(mode, CreateMode::Exclusive(_));
                        let ino = if exclusive {
                            let i = fs
                                .create(dir, name, &t.cred, NewNode::File, mode, &Sattr3::default())
                                .map_err(st)?;
                            if existing.is_none() && fattr.is_some() {
                                fs.setattr(i, &t.cred, &sattr, None).map_err(st)?;
                            }
                            i
                        } else {
                            fs.create(dir, name, &t.cred, NewNode::File, mode, &sattr)
                                .map_err(st)?
                        };
                        created = existing.is_none();
                        if created || !exclusive {
                            attrset = mask;
                        }
                        ino
                    }
                }
            }
            None => {
                let write = access & share::ACCESS_WRITE != 0;
                self.break_delegations4(Some(client), (t.idx, cur), write)?;
                cur
            }
        };
        if let Some(sid) = deleg {
            self.nfs4
                .state
                .holds_delegation(client, &sid, (t.idx, ino))?;
        }
        match fs.getattr(ino).map_err(st)?.type_ {
            Ftype3::Reg => {}
            Ftype3::Dir => return Err(Status::ISDIR),
            Ftype3::Lnk => return Err(Status::SYMLINK),
            _ => return Err(Status::INVAL),
        }
        if !created {
            let mut want = 0;
            if access & share::ACCESS_READ != 0 {
                want |= acc::READ;
            }
            if access & share::ACCESS_WRITE != 0 {
                want |= acc::MODIFY;
            }
            let got = fs.access(ino, &t.cred, want, !t.opts.rw).map_err(st)?;
            let owner_override = fs.getattr(ino).map_err(st)?.uid == t.cred.uid;
            if got != want && !(owner_override && t.opts.rw) {
                return Err(if access & share::ACCESS_WRITE != 0 && !t.opts.rw {
                    Status::ROFS
                } else {
                    Status::ACCESS
                });
            }
        }
        let after = fs.change(dir).map_err(st)?;
        // Under the store's lock (the order is store, then state), so that
        // a REMOVE cannot come between the open and the hold.
        let sid = self.nfs4.state.open(&OpenRequest {
            client,
            owner: &a.owner.owner,
            file: (t.idx, ino),
            access,
            deny: a.share_deny,
        })?;
        fs.hold(ino);
        drop(fs);
        let delegation = match (&a.claim, deleg) {
            (OpenClaim4::Previous(held), _) => self.reclaim_delegation(cx, (t.idx, ino), *held),
            (_, None) => self.offer_delegation(cx, (t.idx, ino), a.share_access),
            (_, Some(_)) => OpenDelegation4::None,
        };
        cx.cur = Some(Fh::File(t.idx, ino));
        cx.cur_sid = Some(sid);
        Ok(OpenResOk {
            stateid: sid,
            cinfo: cinfo(before, after),
            // OPEN4_RESULT_LOCKTYPE_POSIX, and
            // OPEN4_RESULT_PRESERVE_UNLINKED: a file removed while open
            // stays until its last CLOSE (so the client need not rename it
            // aside).
            rflags: 4 | 8,
            attrset,
            delegation,
        })
    }

    fn open_file(&self, cx: &Cx) -> R<(u64, (usize, Ino))> {
        let client = cx.client.ok_or(Status::OP_NOT_IN_SESSION)?;
        let (t, ino) = self.cur_file(cx, Status::ISDIR)?;
        need_file(&t.ex.store.read(), ino)?;
        Ok((client, (t.idx, ino)))
    }

    fn close4(&self, cx: &mut Cx, a: &CloseArgs) -> R<Stateid4> {
        let (client, file) = self.open_file(cx)?;
        let sid = cx.sid(&a.open_stateid)?;
        let r = self.nfs4.state.close(client, &sid, file)?;
        cx.cur_sid = Some(r);
        Ok(r)
    }

    fn downgrade4(&self, cx: &mut Cx, a: &OpenDowngradeArgs) -> R<Stateid4> {
        let (client, file) = self.open_file(cx)?;
        let sid = cx.sid(&a.open_stateid)?;
        let r = self.nfs4.state.downgrade(
            client,
            &sid,
            file,
            a.share_access & share::ACCESS_BOTH,
            a.share_deny,
        )?;
        cx.cur_sid = Some(r);
        Ok(r)
    }

    fn lock4(&self, cx: &mut Cx, a: &LockArgs) -> LockRes<Stateid4> {
        let (client, file) = match self.open_file(cx) {
            Ok(v) => v,
            Err(e) => return LockRes::Err(e),
        };
        let claim = if a.reclaim {
            Claim::Reclaim
        } else {
            Claim::New
        };
        if let Err(e) = self.nfs4.state.check_claim(client, claim, Instant::now()) {
            return LockRes::Err(e);
        }
        // The holder of a delegation may hold locks of its own locally.
        if let Err(e) = self.break_delegations4(Some(client), file, is_write(a.locktype)) {
            return LockRes::Err(e);
        }
        let r = match &a.locker {
            Locker4::New(o) => match cx.sid(&o.open_stateid) {
                Ok(open) => self.nfs4.state.lock_range(
                    client,
                    file,
                    Some((&open, &o.lock_owner.owner)),
                    &Stateid4::ANONYMOUS,
                    a.locktype,
                    a.offset,
                    a.length,
                ),
                Err(e) => Err(Err(e)),
            },
            Locker4::Existing(e) => match cx.sid(&e.lock_stateid) {
                Ok(sid) => self
                    .nfs4
                    .state
                    .lock_range(client, file, None, &sid, a.locktype, a.offset, a.length),
                Err(e) => Err(Err(e)),
            },
        };
        match r {
            Ok(sid) => {
                cx.cur_sid = Some(sid);
                LockRes::Ok(sid)
            }
            Err(Ok(d)) => LockRes::Denied(d),
            Err(Err(e)) => LockRes::Err(e),
        }
    }

    fn lockt4(&self, cx: &Cx, a: &LocktArgs) -> LockRes<()> {
        let (client, file) = match self.open_file(cx) {
            Ok(v) => v,
            Err(e) => return LockRes::Err(e),
        };
        if let Err(e) = self
            .nfs4
            .state
            .check_claim(client, Claim::New, Instant::now())
        {
            return LockRes::Err(e);
        }
        if let Err(e) = self.break_delegations4(Some(client), file, is_write(a.locktype)) {
            return LockRes::Err(e);
        }
        match self.nfs4.state.test_lock(
            client,
            file,
            &a.owner.owner,
            a.locktype,
            a.offset,
            a.length,
        ) {
            Ok(()) => LockRes::Ok(()),
            Err(Ok(d)) => LockRes::Denied(d),
            Err(Err(e)) => LockRes::Err(e),
        }
    }

    fn locku4(&self, cx: &mut Cx, a: &LockuArgs) -> R<Stateid4> {
        let (client, file) = self.open_file(cx)?;
        let sid = cx.sid(&a.lock_stateid)?;
        let r = self
            .nfs4
            .state
            .unlock(client, file, &sid, a.offset, a.length)?;
        cx.cur_sid = Some(r);
        Ok(r)
    }

    // ---- NFSv4.2 ----------------------------------------------------------------------

    fn space_target(&self, cx: &Cx, sid: &Stateid4, write: bool) -> R<(Target<'_>, Ino)> {
        let (t, ino) = self.cur_file(cx, Status::ISDIR)?;
        need_file(&t.ex.store.read(), ino)?;
        let sid = cx.sid(sid)?;
        self.nfs4
            .state
            .check_io(cx.client, &sid, (t.idx, ino), write)?;
        if write {
            t.writable()?;
        }
        Ok((t, ino))
    }

    /// ALLOCATE: the store reserves the range's missing blocks.
    fn allocate4(&self, cx: &Cx, a: &SpaceArgs) -> R<()> {
        let (t, ino) = self.space_target(cx, &a.stateid, true)?;
        let end = a.offset.checked_add(a.length).ok_or(Status::INVAL)?;
        if a.length == 0 {
            return Err(Status::INVAL);
        }
        if end > crate::store::MAX_FILE_SIZE {
            return Err(Status::FBIG);
        }
        // The store's lock shared: the file alone is locked.
        let fs = t.ex.store.read();
        fs.allocate(ino, &t.cred, a.offset, a.length).map_err(st)
    }

    /// DEALLOCATE: the range reads as zeros afterwards; the size stays.
    fn deallocate4(&self, cx: &Cx, a: &SpaceArgs) -> R<()> {
        let (t, ino) = self.space_target(cx, &a.stateid, true)?;
        let fs = t.ex.store.read();
        fs.deallocate(ino, &t.cred, a.offset, a.length).map_err(st)
    }

    /// SEEK (RFC 7862 §15.11): data and holes as the store keeps them, by
    /// 64 KiB block; no data at or past the offset is NFS4ERR_NXIO, as on
    /// the Linux nfsd.
    fn seek4(&self, cx: &Cx, a: &SeekArgs) -> R<SeekResOk> {
        let (t, ino) = self.space_target(cx, &a.stateid, false)?;
        let fs = t.ex.store.read();
        let data = match a.what {
            0 => true,
            1 => false,
            _ => return Err(Status::UNION_NOTSUPP),
        };
        let size = fs.getattr(ino).map_err(st)?.size;
        match fs.seek(ino, a.offset, data).map_err(st)? {
            Some(offset) => Ok(SeekResOk {
                eof: offset >= size,
                offset,
            }),
            None => Err(Status::NXIO),
        }
    }

    /// COPY's and CLONE's files: the destination (the current handle,
    /// open for writing), the source (the saved handle, in the same
    /// export, open for reading) and the source's size.
    fn copy_files(
        &self,
        cx: &Cx,
        src_stateid: &Stateid4,
        dst_stateid: &Stateid4,
    ) -> R<(Target<'_>, Ino, Ino, u64)> {
        let (t, dst) = self.space_target(cx, dst_stateid, true)?;
        let src = match cx.saved.ok_or(Status::NOFILEHANDLE)? {
            Fh::File(idx, ino) if idx == t.idx => ino,
            Fh::File(..) | Fh::Pseudo(_) => return Err(Status::XDEV),
        };
        let src_sid = cx.sid(src_stateid)?;
        self.nfs4
            .state
            .check_io(cx.client, &src_sid, (t.idx, src), false)?;
        let size = {
            let fs = t.ex.store.read();
            need_file(&fs, src)?;
            fs.getattr(src).map_err(st)?.size
        };
        Ok((t, dst, src, size))
    }

    /// COPY within one export, synchronously: the saved handle is the
    /// source, the current one the destination.
    fn copy4(&self, cx: &Cx, a: &CopyArgs) -> R<CopyResOk> {
        if !a.source_server.0.is_empty() {
            return Err(Status::NOTSUPP);
        }
        let (t, dst, src, size) = self.copy_files(cx, &a.src_stateid, &a.dst_stateid)?;
        if a.src_offset > size {
            return Err(Status::INVAL);
        }
        // A COPY moves at most COPY_MAX and takes the store's lock for one
        // piece at a time, so that other calls go on meanwhile; a shorter
        // count tells the client to send the rest (RFC 7862 §15.2.3).
        let end = if a.count == 0 {
            size
        } else {
            a.src_offset.saturating_add(a.count).min(size)
        }
        .min(a.src_offset.saturating_add(COPY_MAX));
        let mut done = 0u64;
        while a.src_offset + done < end {
            let n = (end - a.src_offset - done).min(u64::from(self.config.max_io)) as u32;
            let fs = t.ex.store.read();
            let (data, _) = fs.read(src, &t.cred, a.src_offset + done, n).map_err(st)?;
            let data = Payload::from_parts([data.to_contiguous()]);
            if data.is_empty() {
                // The source shrank meanwhile.
                break;
            }
            fs.write(dst, &t.cred, a.dst_offset + done, &data)
                .map_err(st)?;
            done += data.len() as u64;
        }
        Ok(CopyResOk {
            response: WriteResponse4 {
                callback_id: BoundedVec(vec![]),
                count: done,
                committed: StableHow4::FileSync,
                writeverf: self.write_verf,
            },
            consecutive: true,
            synchronous: true,
        })
    }
}

impl Service {
    /// CLONE within one export (RFC 7862 §15.13): the saved handle is the
    /// source, the current one the destination; the store shares whole
    /// blocks and copies the rest, so any offsets and lengths are taken
    /// (`clone_blksize` is not reported).
    fn clone4(&self, cx: &Cx, a: &CloneArgs) -> R<()> {
        let (t, dst, src, size) = self.copy_files(cx, &a.src_stateid, &a.dst_stateid)?;
        let count = if a.count == 0 {
            size.checked_sub(a.src_offset).ok_or(Status::INVAL)?
        } else {
            a.count
        };
        let overlap = |x: u64, y: u64| x < y.saturating_add(count) && y < x.saturating_add(count);
        if src == dst && count > 0 && overlap(a.src_offset, a.dst_offset) {
            return Err(Status::INVAL);
        }
        // The store's lock is taken (shared; the files alone are locked,
        // a block at a time) for one piece at a time, so that namespace
        // changes go on meanwhile (a piece keeps the offsets' place in
        // their blocks, so whole blocks are still shared).
        let mut done = 0;
        loop {
            let n = (count - done).min(CLONE_PIECE);
            t.ex.store
                .read()
                .clone_range(
                    src,
                    dst,
                    &t.cred,
                    a.src_offset + done,
                    a.dst_offset + done,
                    n,
                )
                .map_err(st)?;
            done += n;
            if done == count {
                return Ok(());
            }
        }
    }
}

fn spec(s: &nfsrdma_xdr::nfs4::Specdata4) -> SpecData3 {
    SpecData3 {
        specdata1: s.specdata1,
        specdata2: s.specdata2,
    }
}

/// Whether a lock type is a write lock (blocking or not).
fn is_write(t: nfsrdma_xdr::nfs4::LockType4) -> bool {
    use nfsrdma_xdr::nfs4::LockType4 as L;
    matches!(t, L::Write | L::WriteW)
}
