//! `nfsrdmad --state FILE`: the stores saved at a planned stop and loaded at
//! the next start, so that a planned restart loses nothing (a killed daemon
//! still loses everything since its last planned stop: the store lives in
//! memory).
//!
//! The file holds, for each export, its path and its store's snapshot,
//! then the owners of the NFSv4 clients that may reclaim their opens and
//! locks in the next instance's grace period, then the status monitor's
//! state number and the NFSv3 lock clients to tell of the restart (a file
//! from before either section has none). It is written to a temporary file, synced, then
//! renamed over the old one, so a crash while saving leaves the previous
//! state intact.

use crate::service::nlm::Host;
use crate::service::nsm::Watcher;
use crate::service::Export;
use crate::store::{blocks::BlockSource, SnapshotError, Store};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"NRDSTATE";
/// Starts the section of NFSv4 clients.
const NFS4_CLIENTS: &[u8; 8] = b"NFS4CLNT";
/// Starts the status monitor's section.
const NSM_SECTION: &[u8; 8] = b"NSMHOSTS";
/// The longest `caller_name` kept (NLM's LM_MAXSTRLEN).
const MAX_NAME: usize = 1024;
/// The most client owners the section may hold, and the longest owner
/// (RFC 8881: `co_ownerid` is at most 1024 bytes).
const MAX_CLIENTS: u32 = 1 << 20;
const MAX_OWNER: usize = 1024;

/// Why the state could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading failed.
    #[error("reading {path}: {source}")]
    Io {
        /// The state file.
        path: String,
        /// The error.
        source: io::Error,
    },
    /// Not a state file.
    #[error("{0} is not an nfsrdmad state file")]
    Format(String),
    /// An export's snapshot is unusable.
    #[error("export {path} in the state file: {source}")]
    Export {
        /// The export.
        path: String,
        /// Why.
        source: SnapshotError,
    },
}

/// What a state file held.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The exports whose stores were loaded.
    pub exports: Vec<String>,
    /// Paths in the file that no export has any more.
    pub dropped: Vec<String>,
    /// Owners of the NFSv4 clients that may reclaim.
    pub nfs4_clients: Vec<bytes::Bytes>,
    /// The previous instance's NSM state number and the NFSv3 lock clients
    /// to tell of the restart (`None`: no such section).
    pub nsm: Option<NsmSaved>,
}

/// The status monitor's part of the state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NsmSaved {
    /// The state number of the instance that saved it.
    pub state: i32,
    /// Its clients holding NLM locks.
    pub watchers: Vec<Watcher>,
}

/// Saves every export's store, the NFSv4 clients that may reclaim and the
/// status monitor's part to `path`.
pub fn save(
    path: &Path,
    exports: &[Export],
    nfs4_clients: &[bytes::Bytes],
    nsm: &NsmSaved,
) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let file = std::fs::File::create(&tmp)?;
    let mut w = BufWriter::new(file);
    w.write_all(MAGIC)?;
    w.write_all(&(exports.len() as u32).to_be_bytes())?;
    for e in exports {
        let mut snap = Vec::new();
        e.store.snapshot(&mut snap)?;
        w.write_all(&(e.path.len() as u32).to_be_bytes())?;
        w.write_all(e.path.as_bytes())?;
        w.write_all(&(snap.len() as u64).to_be_bytes())?;
        w.write_all(&snap)?;
    }
    write_clients(&mut w, nfs4_clients)?;
    write_nsm(&mut w, nsm)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Replaces the stores of `exports` named in the state file at `path` (a
/// missing file means a first start: nothing to load).
pub fn load(
    path: &Path,
    exports: &mut [Export],
    source: &dyn Fn() -> Box<dyn BlockSource>,
) -> Result<Loaded, StateError> {
    let io = |source| StateError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::default()),
        Err(e) => return Err(io(e)),
    };
    let mut r = BufReader::new(file);
    let mut magic = [0u8; 8];
    match r.read_exact(&mut magic) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            return Err(StateError::Format(path.display().to_string()))
        }
        Err(e) => return Err(io(e)),
    }
    if &magic != MAGIC {
        return Err(StateError::Format(path.display().to_string()));
    }
    let mut b4 = [0u8; 4];
    r.read_exact(&mut b4).map_err(io)?;
    let n = u32::from_be_bytes(b4);
    let mut snaps = HashMap::new();
    for _ in 0..n {
        r.read_exact(&mut b4).map_err(io)?;
        let len = u32::from_be_bytes(b4) as usize;
        if len > 4096 {
            return Err(StateError::Format(path.display().to_string()));
        }
        let mut p = vec![0u8; len];
        r.read_exact(&mut p).map_err(io)?;
        let name =
            String::from_utf8(p).map_err(|_| StateError::Format(path.display().to_string()))?;
        let mut b8 = [0u8; 8];
        r.read_exact(&mut b8).map_err(io)?;
        let slen = u64::from_be_bytes(b8);
        let mut snap = Vec::new();
        (&mut r).take(slen).read_to_end(&mut snap).map_err(io)?;
        if snap.len() as u64 != slen {
            return Err(StateError::Format(path.display().to_string()));
        }
        snaps.insert(name, snap);
    }
    let section_err = |e| match e {
        ClientsError::Io(e) => io(e),
        ClientsError::Format => StateError::Format(path.display().to_string()),
    };
    let (nfs4_clients, nsm) = read_sections(&mut r).map_err(section_err)?;
    let mut loaded = Vec::new();
    for e in exports.iter_mut() {
        if let Some(snap) = snaps.remove(&e.path) {
            let config = e.store.read().config().clone();
            let store = Store::restore(config, source(), &mut &snap[..]).map_err(|source| {
                StateError::Export {
                    path: e.path.clone(),
                    source,
                }
            })?;
            e.store = Arc::new(store);
            loaded.push(e.path.clone());
        }
    }
    let mut dropped: Vec<String> = snaps.into_keys().collect();
    dropped.sort();
    Ok(Loaded {
        exports: loaded,
        dropped,
        nfs4_clients,
        nsm,
    })
}

/// The NFSv4 clients' section (owners too long for it are left out: no
/// client can have sent one).
fn write_clients(w: &mut impl Write, owners: &[bytes::Bytes]) -> io::Result<()> {
    let owners: Vec<&bytes::Bytes> = owners
        .iter()
        .filter(|o| !o.is_empty() && o.len() <= MAX_OWNER)
        .take(MAX_CLIENTS as usize)
        .collect();
    w.write_all(NFS4_CLIENTS)?;
    w.write_all(&(owners.len() as u32).to_be_bytes())?;
    for o in owners {
        w.write_all(&(o.len() as u32).to_be_bytes())?;
        w.write_all(o)?;
    }
    Ok(())
}

#[derive(Debug)]
enum ClientsError {
    Io(io::Error),
    Format,
}

/// The NFSv4 clients' section, if the file has one.
fn read_clients(r: &mut impl Read) -> Result<Vec<bytes::Bytes>, ClientsError> {
    let eof = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => ClientsError::Format,
        _ => ClientsError::Io(e),
    };
    // Nothing at all after the stores: a file from before the section.
    let mut tag = [0u8; 8];
    loop {
        match r.read(&mut tag[..1]) {
            Ok(0) => return Ok(Vec::new()),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientsError::Io(e)),
        }
    }
    r.read_exact(&mut tag[1..]).map_err(eof)?;
    if &tag != NFS4_CLIENTS {
        return Err(ClientsError::Format);
    }
    let mut b4 = [0u8; 4];
    let mut u32_ = |r: &mut dyn Read| -> Result<u32, ClientsError> {
        r.read_exact(&mut b4).map_err(eof)?;
        Ok(u32::from_be_bytes(b4))
    };
    let n = u32_(r)?;
    if n > MAX_CLIENTS {
        return Err(ClientsError::Format);
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let len = u32_(r)? as usize;
        if len == 0 || len > MAX_OWNER {
            return Err(ClientsError::Format);
        }
        let mut o = vec![0u8; len];
        r.read_exact(&mut o).map_err(eof)?;
        out.push(bytes::Bytes::from(o));
    }
    Ok(out)
}

/// The sections after the stores: NFSv4 clients, then the status
/// monitor's; either may be absent (older files), nothing may follow.
fn read_sections(r: &mut impl Read) -> Result<SectionsRead, ClientsError> {
    let clients = read_clients(r)?;
    Ok((clients, read_nsm(r)?))
}

type SectionsRead = (Vec<bytes::Bytes>, Option<NsmSaved>);

/// Reads the first byte of an optional section's tag: `None` at the end of
/// the file.
fn first_byte(r: &mut impl Read) -> Result<Option<u8>, ClientsError> {
    let mut b = [0u8; 1];
    loop {
        match r.read(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ClientsError::Io(e)),
        }
    }
}

/// The status monitor's section: tag, state number, count, then per client
/// its address (as text), its name and our address as it knew it (empty
/// when unknown).
fn write_nsm(w: &mut impl Write, nsm: &NsmSaved) -> io::Result<()> {
    let watchers: Vec<&Watcher> = nsm
        .watchers
        .iter()
        .filter(|w| w.host.name.len() <= MAX_NAME)
        .take(MAX_CLIENTS as usize)
        .collect();
    w.write_all(NSM_SECTION)?;
    w.write_all(&nsm.state.to_be_bytes())?;
    w.write_all(&(watchers.len() as u32).to_be_bytes())?;
    for x in watchers {
        let ip = x.host.ip.to_string();
        let local = x.local.map(|a| a.to_string()).unwrap_or_default();
        for field in [ip.as_bytes(), &x.host.name[..], local.as_bytes()] {
            w.write_all(&(field.len() as u32).to_be_bytes())?;
            w.write_all(field)?;
        }
    }
    Ok(())
}

/// The status monitor's section, if the file has one; nothing may follow.
fn read_nsm(r: &mut impl Read) -> Result<Option<NsmSaved>, ClientsError> {
    let eof = |e: io::Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => ClientsError::Format,
        _ => ClientsError::Io(e),
    };
    let Some(b) = first_byte(r)? else {
        return Ok(None);
    };
    let mut tag = [b; 8];
    r.read_exact(&mut tag[1..]).map_err(eof)?;
    if &tag != NSM_SECTION {
        return Err(ClientsError::Format);
    }
    let mut b4 = [0u8; 4];
    let mut u32_ = |r: &mut dyn Read| -> Result<u32, ClientsError> {
        r.read_exact(&mut b4).map_err(eof)?;
        Ok(u32::from_be_bytes(b4))
    };
    let state = u32_(r)? as i32;
    let n = u32_(r)?;
    if n > MAX_CLIENTS {
        return Err(ClientsError::Format);
    }
    let mut watchers = Vec::new();
    for _ in 0..n {
        let mut field = |r: &mut dyn Read| -> Result<Vec<u8>, ClientsError> {
            let len = u32_(r)? as usize;
            if len > MAX_NAME {
                return Err(ClientsError::Format);
            }
            let mut v = vec![0u8; len];
            r.read_exact(&mut v).map_err(eof)?;
            Ok(v)
        };
        let addr = |v: Vec<u8>| -> Result<Option<std::net::IpAddr>, ClientsError> {
            if v.is_empty() {
                return Ok(None);
            }
            let s = String::from_utf8(v).map_err(|_| ClientsError::Format)?;
            s.parse().map(Some).map_err(|_| ClientsError::Format)
        };
        let ip = addr(field(r)?)?.ok_or(ClientsError::Format)?;
        let name = bytes::Bytes::from(field(r)?);
        let local = addr(field(r)?)?;
        watchers.push(Watcher {
            host: Host { ip, name },
            local,
        });
    }
    match first_byte(r)? {
        None => Ok(Some(NsmSaved { state, watchers })),
        Some(_) => Err(ClientsError::Format),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn section(owners: &[&[u8]]) -> Vec<u8> {
        let owners: Vec<Bytes> = owners.iter().map(|o| Bytes::copy_from_slice(o)).collect();
        let mut v = Vec::new();
        write_clients(&mut v, &owners).unwrap();
        v
    }

    #[test]
    fn the_clients_section_reads_back_and_may_be_absent() {
        let v = section(&[b"client a", b"Linux NFSv4.1 host/10.99.0.1"]);
        let got = read_clients(&mut &v[..]).unwrap();
        assert_eq!(
            got,
            vec![&b"client a"[..], &b"Linux NFSv4.1 host/10.99.0.1"[..]]
        );
        // A file written before the section existed ends after the stores.
        assert!(read_clients(&mut &[][..]).unwrap().is_empty());
        // An owner no client could have sent is not written.
        let long = vec![7u8; MAX_OWNER + 1];
        let v = section(&[b"", &long, b"ok"]);
        assert_eq!(read_clients(&mut &v[..]).unwrap(), vec![&b"ok"[..]]);
    }

    fn nsm_saved() -> NsmSaved {
        NsmSaved {
            state: 7,
            watchers: vec![
                Watcher {
                    host: Host {
                        ip: "10.97.0.2".parse().unwrap(),
                        name: Bytes::from_static(b"client-a"),
                    },
                    local: Some("10.99.0.1".parse().unwrap()),
                },
                Watcher {
                    host: Host {
                        ip: "fd00::2".parse().unwrap(),
                        name: Bytes::new(),
                    },
                    local: None,
                },
            ],
        }
    }

    #[test]
    fn the_status_monitor_section_reads_back_after_the_clients() {
        let mut v = section(&[b"client a"]);
        write_nsm(&mut v, &nsm_saved()).unwrap();
        let (clients, nsm) = read_sections(&mut &v[..]).unwrap();
        assert_eq!(clients, vec![&b"client a"[..]]);
        assert_eq!(nsm, Some(nsm_saved()));
        // A file from before the section: clients only, or nothing at all.
        let v = section(&[b"client a"]);
        assert_eq!(read_sections(&mut &v[..]).unwrap().1, None);
        assert_eq!(read_sections(&mut &[][..]).unwrap(), (vec![], None));
    }

    #[test]
    fn a_damaged_status_monitor_section_is_refused() {
        let mut good = section(&[]);
        let start = good.len();
        write_nsm(&mut good, &nsm_saved()).unwrap();
        for cut in start + 1..good.len() {
            assert!(
                matches!(read_sections(&mut &good[..cut]), Err(ClientsError::Format)),
                "cut at {cut}"
            );
        }
        let mut v = good.clone();
        v.push(1);
        assert!(matches!(
            read_sections(&mut &v[..]),
            Err(ClientsError::Format)
        ));
        // An address that is not one.
        let mut bad = nsm_saved();
        bad.watchers.truncate(1);
        let mut v = section(&[]);
        write_nsm(&mut v, &bad).unwrap();
        let at = v.len() - (4 + 9 + 4 + 8 + 4 + 9);
        v[at + 4] = b'x';
        assert!(matches!(
            read_sections(&mut &v[..]),
            Err(ClientsError::Format)
        ));
    }

    #[test]
    fn a_damaged_clients_section_is_refused() {
        let good = section(&[b"client a", b"client b"]);
        // Cut anywhere inside.
        for cut in 1..good.len() {
            assert!(
                matches!(read_clients(&mut &good[..cut]), Err(ClientsError::Format)),
                "cut at {cut}"
            );
        }
        // Trailing bytes, another tag, a count or a length out of bounds.
        let mut v = good.clone();
        v.push(0);
        assert!(matches!(
            read_sections(&mut &v[..]),
            Err(ClientsError::Format)
        ));
        let mut v = good.clone();
        v[0] = b'X';
        assert!(matches!(
            read_clients(&mut &v[..]),
            Err(ClientsError::Format)
        ));
        let mut v = good.clone();
        v[8..12].copy_from_slice(&(MAX_CLIENTS + 1).to_be_bytes());
        assert!(matches!(
            read_clients(&mut &v[..]),
            Err(ClientsError::Format)
        ));
        let mut v = good;
        v[12..16].copy_from_slice(&((MAX_OWNER + 1) as u32).to_be_bytes());
        assert!(matches!(
            read_clients(&mut &v[..]),
            Err(ClientsError::Format)
        ));
    }
}
