//! `nfsrdmad --state FILE`: the stores saved at a planned stop and loaded at
//! the next start, so that a planned restart loses nothing (a killed daemon
//! still loses everything since its last planned stop: the store lives in
//! memory).
//!
//! The file holds, for each export, its path and its store's snapshot. It
//! is written to a temporary file, synced, then renamed over the old one,
//! so a crash while saving leaves the previous state intact.

use crate::service::Export;
use crate::store::{blocks::BlockSource, SnapshotError, Store};
use std::collections::HashMap;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8; 8] = b"NRDSTATE";

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

/// Saves every export's store to `path`.
pub fn save(path: &Path, exports: &[Export]) -> io::Result<()> {
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
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Replaces the stores of `exports` named in the state file at `path` (a
/// missing file means a first start: nothing to load). Returns the paths
/// loaded and the paths in the file that no export has any more.
pub fn load(
    path: &Path,
    exports: &mut [Export],
    source: &dyn Fn() -> Box<dyn BlockSource>,
) -> Result<(Vec<String>, Vec<String>), StateError> {
    let io = |source| StateError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((vec![], vec![])),
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
    Ok((loaded, dropped))
}
