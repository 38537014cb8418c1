//! The 22 NFSv3 procedures (RFC 1813 §3.3).

use super::{Caller, Export, Service};
use crate::exports::ExportOptions;
use crate::store::{handle_fsid, CreateMode, Cred, Fs, Ino, NewNode, SResult};
use nfsrdma_xdr::nfs3::*;

/// Bytes of a READDIR3resok without entries: status, post_op_attr with
/// attributes, verifier, end-of-list word, eof.
const READDIR_BASE: usize = 4 + 4 + 84 + 8 + 4 + 4;

/// A resolved handle: its export, the options that apply to the caller
/// there, and the caller's credential under them.
struct Target<'a> {
    ex: &'a Export,
    opts: ExportOptions,
    cred: Cred,
}

impl Service {
    fn export_of(&self, fh: &NfsFh3) -> SResult<&Export> {
        let fsid = handle_fsid(fh).ok_or(NfsStat3::Badhandle)?;
        self.exports
            .iter()
            .find(|e| e.store.fsid() as u32 == fsid)
            .ok_or(NfsStat3::Stale)
    }

    /// The export a handle belongs to, checked against the caller's
    /// address: a client the export does not list gets NFS3ERR_ACCES, a
    /// `secure` export refuses unprivileged source ports with NFS3ERR_PERM.
    fn target(&self, caller: &Caller, fh: &NfsFh3) -> SResult<Target<'_>> {
        let ex = self.export_of(fh)?;
        let opts = ex
            .rules
            .options_for(caller.ctx.ip(), None)
            .ok_or(NfsStat3::Acces)?
            .clone();
        if !opts.port_allowed(caller.ctx.peer.port()) {
            return Err(NfsStat3::Perm);
        }
        let cred = caller.cred_for(&opts);
        Ok(Target { ex, opts, cred })
    }

    fn writable(&self, t: &Target) -> SResult<()> {
        if t.opts.rw {
            Ok(())
        } else {
            Err(NfsStat3::Rofs)
        }
    }

    pub(super) fn nfs_dispatch(&self, c: &Caller, args: Nfs3Args) -> Nfs3Res {
        match args {
            Nfs3Args::Null => Nfs3Res::Null,
            Nfs3Args::Getattr(a) => Nfs3Res::Getattr(self.getattr(c, a)),
            Nfs3Args::Setattr(a) => Nfs3Res::Setattr(self.setattr(c, a)),
            Nfs3Args::Lookup(a) => Nfs3Res::Lookup(self.lookup(c, a)),
            Nfs3Args::Access(a) => Nfs3Res::Access(self.access(c, a)),
            Nfs3Args::Readlink(a) => Nfs3Res::Readlink(self.readlink(c, a)),
            Nfs3Args::Read(a) => Nfs3Res::Read(self.read(c, a)),
            Nfs3Args::Write(a) => Nfs3Res::Write(self.write(c, a)),
            Nfs3Args::Create(a) => {
                let (node, mode, attrs) = match a.how {
                    CreateHow3::Unchecked(s) => (NewNode::File, CreateMode::Unchecked, s),
                    CreateHow3::Guarded(s) => (NewNode::File, CreateMode::Guarded, s),
                    CreateHow3::Exclusive(v) => {
                        (NewNode::File, CreateMode::Exclusive(v), Sattr3::default())
                    }
                };
                Nfs3Res::Create(self.make(c, &a.where_, node, mode, &attrs))
            }
            Nfs3Args::Mkdir(a) => Nfs3Res::Mkdir(self.make(
                c,
                &a.where_,
                NewNode::Dir,
                CreateMode::Guarded,
                &a.attributes,
            )),
            Nfs3Args::Symlink(a) => Nfs3Res::Symlink(self.make(
                c,
                &a.where_,
                NewNode::Symlink(a.symlink.symlink_data.0.clone()),
                CreateMode::Guarded,
                &a.symlink.symlink_attributes,
            )),
            Nfs3Args::Mknod(a) => {
                let (node, attrs) = match a.what {
                    MknodData3::Chr(d) => (NewNode::Special(Ftype3::Chr, d.spec), d.dev_attributes),
                    MknodData3::Blk(d) => (NewNode::Special(Ftype3::Blk, d.spec), d.dev_attributes),
                    MknodData3::Sock(s) => {
                        (NewNode::Special(Ftype3::Sock, SpecData3::default()), s)
                    }
                    MknodData3::Fifo(s) => {
                        (NewNode::Special(Ftype3::Fifo, SpecData3::default()), s)
                    }
                    MknodData3::Other(_) => {
                        let wcc = self.dir_wcc_only(c, &a.where_.dir);
                        return Nfs3Res::Mknod(NfsResult::Err(NfsStat3::Badtype, wcc));
                    }
                };
                Nfs3Res::Mknod(self.make(c, &a.where_, node, CreateMode::Guarded, &attrs))
            }
            Nfs3Args::Remove(a) => Nfs3Res::Remove(self.unlink(c, a.object, false)),
            Nfs3Args::Rmdir(a) => Nfs3Res::Rmdir(self.unlink(c, a.object, true)),
            Nfs3Args::Rename(a) => Nfs3Res::Rename(self.rename(c, a)),
            Nfs3Args::Link(a) => Nfs3Res::Link(self.link(c, a)),
            Nfs3Args::Readdir(a) => Nfs3Res::Readdir(self.readdir(c, a)),
            Nfs3Args::Readdirplus(a) => Nfs3Res::Readdirplus(self.readdirplus(c, a)),
            Nfs3Args::Fsstat(a) => Nfs3Res::Fsstat(self.fsstat(c, a)),
            Nfs3Args::Fsinfo(a) => Nfs3Res::Fsinfo(self.fsinfo(c, a)),
            Nfs3Args::Pathconf(a) => Nfs3Res::Pathconf(self.pathconf(c, a)),
            Nfs3Args::Commit(a) => Nfs3Res::Commit(self.commit(c, a)),
        }
    }

    fn getattr(&self, c: &Caller, a: Getattr3Args) -> Getattr3Res {
        let r = self.target(c, &a.object).and_then(|t| {
            let fs = t.ex.store.read();
            let ino = fs.resolve(&a.object)?;
            fs.getattr(ino)
        });
        match r {
            Ok(obj_attributes) => NfsResult::Ok(Getattr3ResOk { obj_attributes }),
            Err(e) => NfsResult::Err(e, ()),
        }
    }

    fn setattr(&self, c: &Caller, a: Setattr3Args) -> Setattr3Res {
        let t = match self.target(c, &a.object) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, Default::default()),
        };
        let mut fs = t.ex.store.write();
        let ino = match fs.resolve(&a.object) {
            Ok(i) => i,
            Err(e) => return NfsResult::Err(e, Default::default()),
        };
        let before = fs.wcc_attr(ino);
        let r = self
            .writable(&t)
            .and_then(|_| self.break_delegations3(t.ex, ino, true))
            .and_then(|_| fs.setattr(ino, &t.cred, &a.new_attributes, a.guard));
        let body = Setattr3ResBody {
            obj_wcc: wcc(&fs, ino, before),
        };
        same_body(r, body)
    }

    fn lookup(&self, c: &Caller, a: Lookup3Args) -> Lookup3Res {
        let t = match self.target(c, &a.what.dir) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, Default::default()),
        };
        let fs = t.ex.store.read();
        let dir = match fs.resolve(&a.what.dir) {
            Ok(d) => d,
            Err(e) => return NfsResult::Err(e, Default::default()),
        };
        let dir_attributes = fs.getattr(dir).ok();
        match fs.lookup(dir, &a.what.name, &t.cred) {
            Ok(ino) => NfsResult::Ok(Lookup3ResOk {
                object: NfsFh3(fs.handle(ino)),
                obj_attributes: fs.getattr(ino).ok(),
                dir_attributes,
            }),
            Err(e) => NfsResult::Err(e, Lookup3ResFail { dir_attributes }),
        }
    }

    fn access(&self, c: &Caller, a: Access3Args) -> Access3Res {
        let r = self.target(c, &a.object).and_then(|t| {
            let fs = t.ex.store.read();
            let ino = fs.resolve(&a.object)?;
            let got = fs.access(ino, &t.cred, a.access, !t.opts.rw)?;
            Ok((got, fs.getattr(ino).ok()))
        });
        match r {
            Ok((access, obj_attributes)) => NfsResult::Ok(Access3ResOk {
                obj_attributes,
                access,
            }),
            Err(e) => NfsResult::Err(e, AttrOnly::default()),
        }
    }

    fn readlink(&self, c: &Caller, a: Readlink3Args) -> Readlink3Res {
        let r = self.target(c, &a.symlink).and_then(|t| {
            let fs = t.ex.store.read();
            let ino = fs.resolve(&a.symlink)?;
            let attrs = fs.getattr(ino).ok();
            match fs.readlink(ino) {
                Ok(target) => Ok(Ok((target, attrs))),
                Err(e) => Ok(Err((e, attrs))),
            }
        });
        match r {
            Ok(Ok((data, symlink_attributes))) => NfsResult::Ok(Readlink3ResOk {
                symlink_attributes,
                data: NfsPath3(data),
            }),
            Ok(Err((e, obj_attributes))) => NfsResult::Err(e, AttrOnly { obj_attributes }),
            Err(e) => NfsResult::Err(e, AttrOnly::default()),
        }
    }

    fn read(&self, c: &Caller, a: Read3Args) -> Read3Res {
        let t = match self.target(c, &a.file) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, AttrOnly::default()),
        };
        let fs = t.ex.store.read();
        let ino = match fs.resolve(&a.file) {
            Ok(i) => i,
            Err(e) => return NfsResult::Err(e, AttrOnly::default()),
        };
        // A write delegation elsewhere: the data here may be stale.
        if let Err(e) = self.break_delegations3(t.ex, ino, false) {
            return NfsResult::Err(
                e,
                AttrOnly {
                    obj_attributes: fs.getattr(ino).ok(),
                },
            );
        }
        let count = a.count.min(self.config.max_io);
        match fs.read(ino, &t.cred, a.offset, count) {
            Ok((data, eof)) => NfsResult::Ok(Read3ResOk {
                file_attributes: fs.getattr(ino).ok(),
                count: data.len() as u32,
                eof,
                data: Data(data),
            }),
            Err(e) => NfsResult::Err(
                e,
                AttrOnly {
                    obj_attributes: fs.getattr(ino).ok(),
                },
            ),
        }
    }

    fn write(&self, c: &Caller, a: Write3Args) -> Write3Res {
        let t = match self.target(c, &a.file) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, FileWcc::default()),
        };
        // The store's shared lock: the file alone is locked while it
        // changes, and its attributes before and after are read with it.
        let fs = t.ex.store.read();
        let ino = match fs.resolve(&a.file) {
            Ok(i) => i,
            Err(e) => return NfsResult::Err(e, FileWcc::default()),
        };
        let checked = self.writable(&t).and_then(|_| {
            if a.data.len() != a.count as usize || a.count > self.config.max_io {
                return Err(NfsStat3::Inval);
            }
            self.break_delegations3(t.ex, ino, true)
        });
        let (before, r, after) = match checked {
            Ok(()) => fs.write_wcc(ino, &t.cred, a.offset, &a.data),
            Err(e) => {
                let before = fs.wcc_attr(ino);
                (before, Err(e), fs.getattr(ino).ok())
            }
        };
        let file_wcc = WccData { before, after };
        match r {
            Ok(()) => NfsResult::Ok(Write3ResOk {
                file_wcc,
                count: a.count,
                // Data in memory is as stable as this server gets; an
                // UNSTABLE write is still reported as such so that clients
                // keep it until COMMIT (and resend it after a restart,
                // which changes the verifier).
                committed: if a.stable == StableHow::Unstable {
                    StableHow::Unstable
                } else {
                    StableHow::FileSync
                },
                verf: self.write_verf,
            }),
            Err(e) => NfsResult::Err(e, FileWcc { file_wcc }),
        }
    }

    /// The directory's wcc data when an operation fails before it starts.
    fn dir_wcc_only(&self, c: &Caller, dir: &NfsFh3) -> DirWcc {
        let attrs = self.target(c, dir).ok().and_then(|t| {
            let fs = t.ex.store.read();
            fs.resolve(dir).ok().and_then(|d| fs.getattr(d).ok())
        });
        DirWcc {
            dir_wcc: WccData {
                before: None,
                after: attrs,
            },
        }
    }

    fn make(
        &self,
        c: &Caller,
        w: &DirOpArgs3,
        node: NewNode,
        mode: CreateMode,
        attrs: &Sattr3,
    ) -> NfsResult<DirOpResOk, DirWcc> {
        let t = match self.target(c, &w.dir) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, DirWcc::default()),
        };
        let mut fs = t.ex.store.write();
        let dir = match fs.resolve(&w.dir) {
            Ok(d) => d,
            Err(e) => return NfsResult::Err(e, DirWcc::default()),
        };
        let before = fs.wcc_attr(dir);
        let r = self
            .writable(&t)
            .and_then(|_| fs.create(dir, &w.name, &t.cred, node, mode, attrs));
        let dir_wcc = wcc(&fs, dir, before);
        match r {
            Ok(ino) => NfsResult::Ok(DirOpResOk {
                obj: Some(NfsFh3(fs.handle(ino))),
                obj_attributes: fs.getattr(ino).ok(),
                dir_wcc,
            }),
            Err(e) => NfsResult::Err(e, DirWcc { dir_wcc }),
        }
    }

    fn unlink(&self, c: &Caller, o: DirOpArgs3, dir_too: bool) -> NfsResult<DirWcc, DirWcc> {
        let t = match self.target(c, &o.dir) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, DirWcc::default()),
        };
        let mut fs = t.ex.store.write();
        let dir = match fs.resolve(&o.dir) {
            Ok(d) => d,
            Err(e) => return NfsResult::Err(e, DirWcc::default()),
        };
        let before = fs.wcc_attr(dir);
        let r = self.writable(&t).and_then(|_| {
            if dir_too {
                fs.rmdir(dir, &o.name, &t.cred)
            } else {
                if let Ok(ino) = fs.lookup(dir, &o.name, &t.cred) {
                    self.break_delegations3(t.ex, ino, true)?;
                }
                fs.remove(dir, &o.name, &t.cred)
            }
        });
        let body = DirWcc {
            dir_wcc: wcc(&fs, dir, before),
        };
        same_body(r, body)
    }

    fn rename(&self, c: &Caller, a: Rename3Args) -> Rename3Res {
        let t = match self.target(c, &a.from.dir) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, Default::default()),
        };
        match self.export_of(&a.to.dir) {
            Ok(ex) if std::ptr::eq(ex, t.ex) => {}
            Ok(_) => return NfsResult::Err(NfsStat3::Xdev, Default::default()),
            Err(e) => return NfsResult::Err(e, Default::default()),
        }
        let mut fs = t.ex.store.write();
        let (from, to) = match (fs.resolve(&a.from.dir), fs.resolve(&a.to.dir)) {
            (Ok(f), Ok(t)) => (f, t),
            (Err(e), _) | (_, Err(e)) => return NfsResult::Err(e, Default::default()),
        };
        let (fb, tb) = (fs.wcc_attr(from), fs.wcc_attr(to));
        let r = self.writable(&t).and_then(|_| {
            // The file renamed and the one it would replace.
            for (dir, name) in [(from, &a.from.name), (to, &a.to.name)] {
                if let Ok(ino) = fs.lookup(dir, name, &t.cred) {
                    self.break_delegations3(t.ex, ino, true)?;
                }
            }
            fs.rename(from, &a.from.name, to, &a.to.name, &t.cred)
        });
        let body = Rename3ResBody {
            fromdir_wcc: wcc(&fs, from, fb),
            todir_wcc: wcc(&fs, to, tb),
        };
        same_body(r, body)
    }

    fn link(&self, c: &Caller, a: Link3Args) -> Link3Res {
        let t = match self.target(c, &a.file) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, Default::default()),
        };
        match self.export_of(&a.link.dir) {
            Ok(ex) if std::ptr::eq(ex, t.ex) => {}
            Ok(_) => return NfsResult::Err(NfsStat3::Xdev, Default::default()),
            Err(e) => return NfsResult::Err(e, Default::default()),
        }
        let mut fs = t.ex.store.write();
        let (file, dir) = match (fs.resolve(&a.file), fs.resolve(&a.link.dir)) {
            (Ok(f), Ok(d)) => (f, d),
            (Err(e), _) | (_, Err(e)) => return NfsResult::Err(e, Default::default()),
        };
        let before = fs.wcc_attr(dir);
        let r = self
            .writable(&t)
            .and_then(|_| self.break_delegations3(t.ex, file, true))
            .and_then(|_| fs.link(file, dir, &a.link.name, &t.cred));
        let body = Link3ResBody {
            file_attributes: fs.getattr(file).ok(),
            linkdir_wcc: wcc(&fs, dir, before),
        };
        same_body(r, body)
    }

    fn readdir(&self, c: &Caller, a: Readdir3Args) -> Readdir3Res {
        let t = match self.target(c, &a.dir) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, AttrOnly::default()),
        };
        let fs = t.ex.store.read();
        let dir = match fs.resolve(&a.dir) {
            Ok(d) => d,
            Err(e) => return NfsResult::Err(e, AttrOnly::default()),
        };
        // The reply stays within the largest transfer whatever the client
        // asks (RFC 1813 lets a server return less than `count`).
        let budget = a.count.min(self.config.max_io) as usize;
        let mut used = READDIR_BASE;
        let r = fs.readdir(dir, &t.cred, a.cookie, a.cookieverf, |e| {
            let n = 4 + 8 + 4 + nfsrdma_xdr::roundup(e.name.len()) + 8;
            if used + n > budget {
                return false;
            }
            used += n;
            true
        });
        let dir_attributes = fs.getattr(dir).ok();
        match r {
            Ok((entries, eof)) if entries.is_empty() && !eof => NfsResult::Err(
                NfsStat3::Toosmall,
                AttrOnly {
                    obj_attributes: dir_attributes,
                },
            ),
            Ok((entries, eof)) => NfsResult::Ok(Readdir3ResOk {
                dir_attributes,
                cookieverf: fs.cookieverf(dir),
                reply: DirList3 {
                    entries: nfsrdma_xdr::List(
                        entries
                            .into_iter()
                            .map(|e| Entry3 {
                                fileid: e.ino.fileid(),
                                name: Filename3(e.name),
                                cookie: e.cookie,
                            })
                            .collect(),
                    ),
                    eof,
                },
            }),
            Err(e) => NfsResult::Err(
                e,
                AttrOnly {
                    obj_attributes: dir_attributes,
                },
            ),
        }
    }

    fn readdirplus(&self, c: &Caller, a: Readdirplus3Args) -> Readdirplus3Res {
        let t = match self.target(c, &a.dir) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, AttrOnly::default()),
        };
        let fs = t.ex.store.read();
        let dir = match fs.resolve(&a.dir) {
            Ok(d) => d,
            Err(e) => return NfsResult::Err(e, AttrOnly::default()),
        };
        // maxcount bounds the whole reply; dircount bounds the directory
        // information alone (file ids, names, cookies).
        let max = a.maxcount.min(self.config.max_io) as usize;
        let dirmax = a.dircount as usize;
        let mut used = READDIR_BASE;
        let mut dirused = 0usize;
        let r = fs.readdir(dir, &t.cred, a.cookie, a.cookieverf, |e| {
            let name = nfsrdma_xdr::roundup(e.name.len());
            let d = 8 + 4 + name + 8;
            let n = 4 + d + 4 + 84 + 4 + 4 + crate::store::HANDLE_LEN;
            if used + n > max || (dirmax > 0 && dirused + d > dirmax && dirused > 0) {
                return false;
            }
            used += n;
            dirused += d;
            true
        });
        let dir_attributes = fs.getattr(dir).ok();
        match r {
            Ok((entries, eof)) if entries.is_empty() && !eof => NfsResult::Err(
                NfsStat3::Toosmall,
                AttrOnly {
                    obj_attributes: dir_attributes,
                },
            ),
            Ok((entries, eof)) => NfsResult::Ok(Readdirplus3ResOk {
                dir_attributes,
                cookieverf: fs.cookieverf(dir),
                reply: DirListPlus3 {
                    entries: nfsrdma_xdr::List(
                        entries
                            .into_iter()
                            .map(|e| EntryPlus3 {
                                fileid: e.ino.fileid(),
                                name: Filename3(e.name),
                                cookie: e.cookie,
                                name_attributes: fs.getattr(e.ino).ok(),
                                name_handle: Some(NfsFh3(fs.handle(e.ino))),
                            })
                            .collect(),
                    ),
                    eof,
                },
            }),
            Err(e) => NfsResult::Err(
                e,
                AttrOnly {
                    obj_attributes: dir_attributes,
                },
            ),
        }
    }

    fn with_root<T>(
        &self,
        c: &Caller,
        fh: &NfsFh3,
        f: impl FnOnce(&Fs, Ino) -> T,
    ) -> Result<(T, Option<Fattr3>), NfsStat3> {
        let t = self.target(c, fh)?;
        let fs = t.ex.store.read();
        let ino = fs.resolve(fh)?;
        Ok((f(&fs, ino), fs.getattr(ino).ok()))
    }

    fn fsstat(&self, c: &Caller, a: Fsstat3Args) -> Fsstat3Res {
        match self.with_root(c, &a.fsroot, |fs, _| fs.fsstat()) {
            Ok(((tb, fb, tf, ff), obj_attributes)) => NfsResult::Ok(Fsstat3ResOk {
                obj_attributes,
                tbytes: tb,
                fbytes: fb,
                abytes: fb,
                tfiles: tf,
                ffiles: ff,
                afiles: ff,
                invarsec: 0,
            }),
            Err(e) => NfsResult::Err(e, AttrOnly::default()),
        }
    }

    fn fsinfo(&self, c: &Caller, a: Fsinfo3Args) -> Fsinfo3Res {
        let max = self.config.max_io;
        match self.with_root(c, &a.fsroot, |_, _| ()) {
            Ok(((), obj_attributes)) => NfsResult::Ok(Fsinfo3ResOk {
                obj_attributes,
                rtmax: max,
                rtpref: max,
                rtmult: 4096,
                wtmax: max,
                wtpref: max,
                wtmult: 4096,
                dtpref: 64 * 1024,
                maxfilesize: crate::store::MAX_FILE_SIZE,
                time_delta: NfsTime3 {
                    seconds: 0,
                    nseconds: 1,
                },
                properties: fsf::LINK | fsf::SYMLINK | fsf::HOMOGENEOUS | fsf::CANSETTIME,
            }),
            Err(e) => NfsResult::Err(e, AttrOnly::default()),
        }
    }

    fn pathconf(&self, c: &Caller, a: Pathconf3Args) -> Pathconf3Res {
        match self.with_root(c, &a.fsroot, |_, _| ()) {
            Ok(((), obj_attributes)) => NfsResult::Ok(Pathconf3ResOk {
                obj_attributes,
                linkmax: crate::store::LINK_MAX,
                name_max: crate::store::NAME_MAX as u32,
                no_trunc: true,
                chown_restricted: true,
                case_insensitive: false,
                case_preserving: true,
            }),
            Err(e) => NfsResult::Err(e, AttrOnly::default()),
        }
    }

    fn commit(&self, c: &Caller, a: Commit3Args) -> Commit3Res {
        let t = match self.target(c, &a.file) {
            Ok(t) => t,
            Err(e) => return NfsResult::Err(e, FileWcc::default()),
        };
        let fs = t.ex.store.read();
        let ino = match fs.resolve(&a.file) {
            Ok(i) => i,
            Err(e) => return NfsResult::Err(e, FileWcc::default()),
        };
        let file_wcc = WccData {
            before: fs.wcc_attr(ino),
            after: fs.getattr(ino).ok(),
        };
        let r = match fs.getattr(ino) {
            Ok(a) if a.type_ == Ftype3::Dir => Err(NfsStat3::Isdir),
            Ok(a) if a.type_ != Ftype3::Reg => Err(NfsStat3::Inval),
            Ok(_) => self.writable(&t),
            Err(e) => Err(e),
        };
        match r {
            Ok(()) => NfsResult::Ok(Commit3ResOk {
                file_wcc,
                verf: self.write_verf,
            }),
            Err(e) => NfsResult::Err(e, FileWcc { file_wcc }),
        }
    }
}

/// The result of a procedure whose success and failure carry the same body.
fn same_body<T>(r: SResult<()>, body: T) -> NfsResult<T, T> {
    match r {
        Ok(()) => NfsResult::Ok(body),
        Err(e) => NfsResult::Err(e, body),
    }
}

/// Weak cache consistency data: the attributes taken before the operation
/// and the object's attributes now.
fn wcc(fs: &Fs, ino: Ino, before: Option<WccAttr>) -> WccData {
    WccData {
        before,
        after: fs.getattr(ino).ok(),
    }
}
