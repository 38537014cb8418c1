//! MOUNT v3 (RFC 1813 appendix I).

use super::{Caller, Service};
use crate::store::Cred;
use nfsrdma_xdr::mount::{
    DirPath, ExportNode, Exports, FHandle3, MountBody, MountList, MountRes3, MountRes3Ok,
    MountStat3, Name,
};
use nfsrdma_xdr::nfs3::NfsStat3;
use nfsrdma_xdr::rpc::flavor;
use nfsrdma_xdr::{BoundedVec, List};

impl Service {
    /// MNT: the root handle of an export, or of a directory inside one.
    pub(super) fn mnt(&self, c: &Caller, path: &DirPath) -> MountRes3 {
        let Ok(path) = std::str::from_utf8(path.as_bytes()) else {
            return MountRes3::Err(MountStat3::Noent);
        };
        let path = normalize(path);
        // The longest export path that is the mount path or a parent of it.
        let Some(ex) = self
            .exports
            .iter()
            .filter(|e| {
                path == e.path
                    || e.path == "/"
                    || path
                        .strip_prefix(e.path.as_str())
                        .is_some_and(|rest| rest.starts_with('/'))
            })
            .max_by_key(|e| e.path.len())
        else {
            return MountRes3::Err(MountStat3::Noent);
        };
        let Some(opts) = ex.rules.options_for(c.ctx.ip(), None) else {
            tracing::info!(peer = %c.ctx.peer, path = %path, "mount refused: client not in the export's list");
            return MountRes3::Err(MountStat3::Acces);
        };
        if !opts.port_allowed(c.ctx.peer.port()) {
            return MountRes3::Err(MountStat3::Perm);
        }
        let cred: Cred = c.cred_for(opts);
        let fs = ex.store.read();
        let mut ino = fs.root();
        let rest = if ex.path == "/" {
            path.as_str()
        } else {
            &path[ex.path.len()..]
        };
        for comp in rest.split('/').filter(|s| !s.is_empty()) {
            ino = match fs.lookup(ino, comp.as_bytes(), &cred) {
                Ok(i) => i,
                Err(e) => return MountRes3::Err(mount_stat(e)),
            };
        }
        if fs.getattr(ino).map(|a| a.type_) != Ok(nfsrdma_xdr::nfs3::Ftype3::Dir) {
            return MountRes3::Err(MountStat3::Notdir);
        }
        let handle = fs.handle(ino);
        drop(fs);
        let host = c.ctx.ip().to_string();
        if let Ok(mut m) = self.mounts.lock() {
            if !m.iter().any(|(h, p)| *h == host && *p == path) {
                m.push((host, path.clone()));
            }
        }
        tracing::info!(peer = %c.ctx.peer, path = %path, "mounted");
        MountRes3::Ok(MountRes3Ok {
            fhandle: FHandle3(handle),
            auth_flavors: BoundedVec(vec![flavor::AUTH_SYS, flavor::AUTH_NONE]),
        })
    }

    pub(super) fn dump(&self) -> MountList {
        let m = self.mounts.lock().map(|m| m.clone()).unwrap_or_default();
        List(
            m.into_iter()
                .map(|(h, p)| MountBody {
                    ml_hostname: Name::new(h.into_bytes()),
                    ml_directory: DirPath::new(p.into_bytes()),
                })
                .collect(),
        )
    }

    pub(super) fn umnt(&self, c: &Caller, path: &DirPath) {
        let host = c.ctx.ip().to_string();
        let path = normalize(&String::from_utf8_lossy(path.as_bytes()));
        if let Ok(mut m) = self.mounts.lock() {
            m.retain(|(h, p)| !(*h == host && *p == path));
        }
    }

    pub(super) fn umntall(&self, c: &Caller) {
        let host = c.ctx.ip().to_string();
        if let Ok(mut m) = self.mounts.lock() {
            m.retain(|(h, _)| *h != host);
        }
    }

    pub(super) fn export_list(&self) -> Exports {
        List(
            self.exports
                .iter()
                .map(|e| ExportNode {
                    ex_dir: DirPath::new(e.path.clone().into_bytes()),
                    ex_groups: List(
                        e.rules
                            .clients
                            .iter()
                            .map(|r| Name::new(r.matcher.to_string().into_bytes()))
                            .collect(),
                    ),
                })
                .collect(),
        )
    }
}

fn normalize(p: &str) -> String {
    let parts: Vec<&str> = p
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    format!("/{}", parts.join("/"))
}

fn mount_stat(e: NfsStat3) -> MountStat3 {
    match e {
        NfsStat3::Noent => MountStat3::Noent,
        NfsStat3::Acces => MountStat3::Acces,
        NfsStat3::Notdir => MountStat3::Notdir,
        NfsStat3::Nametoolong => MountStat3::Nametoolong,
        NfsStat3::Perm => MountStat3::Perm,
        _ => MountStat3::Serverfault,
    }
}
