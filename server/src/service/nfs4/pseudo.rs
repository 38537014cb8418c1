//! The NFSv4 pseudo root (RFC 8881 §7.3): read-only directories that join
//! the exports' paths, so that PUTROOTFH and LOOKUP of each component lead
//! a client to every export. An export at `/` is the root itself.

use bytes::Bytes;

/// Where a name in a pseudo directory leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Child {
    /// Another pseudo directory.
    Dir(u32),
    /// An export's root.
    Export(usize),
}

#[derive(Debug)]
struct Node {
    parent: u32,
    children: Vec<(Bytes, Child)>,
}

/// The pseudo tree.
#[derive(Debug)]
pub struct Pseudo {
    nodes: Vec<Node>,
    /// An export at `/`.
    root_export: Option<usize>,
    /// The pseudo directory each export hangs from.
    parents: Vec<Option<u32>>,
}

/// The magic of a pseudo directory's handle.
const MAGIC: [u8; 4] = *b"nRp4";

/// Pseudo directories' file ids live above every store's (which count
/// from 1 within their own fsid; the pseudo root has fsid 0).
pub const FILEID_BASE: u64 = 1 << 40;

impl Pseudo {
    /// The tree joining `paths` (export `i` is `paths[i]`). A path that
    /// lies inside another export is not reachable through it (its
    /// parent's store knows nothing of it) and is left out.
    pub fn new(paths: &[&str]) -> Pseudo {
        let mut p = Pseudo {
            nodes: vec![Node {
                parent: 0,
                children: Vec::new(),
            }],
            root_export: None,
            parents: vec![None; paths.len()],
        };
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.sort_by_key(|&i| paths[i].matches('/').count());
        for i in order {
            let parts: Vec<&str> = paths[i].split('/').filter(|c| !c.is_empty()).collect();
            if parts.is_empty() {
                p.root_export.get_or_insert(i);
                continue;
            }
            if p.root_export.is_some() {
                continue;
            }
            let mut at = 0u32;
            let mut blocked = false;
            for (k, name) in parts.iter().enumerate() {
                let last = k + 1 == parts.len();
                let found = p.nodes[at as usize]
                    .children
                    .iter()
                    .find(|(n, _)| n.as_ref() == name.as_bytes())
                    .map(|(_, c)| *c);
                match (found, last) {
                    (Some(Child::Export(_)), _) => {
                        blocked = true;
                        break;
                    }
                    (Some(Child::Dir(d)), false) => at = d,
                    (Some(Child::Dir(_)), true) => {
                        // A directory already made for a deeper export:
                        // the export takes the name, hiding what was
                        // below it (unreachable, as above).
                        blocked = true;
                        break;
                    }
                    (None, false) => {
                        let id = p.nodes.len() as u32;
                        p.nodes.push(Node {
                            parent: at,
                            children: Vec::new(),
                        });
                        p.nodes[at as usize]
                            .children
                            .push((Bytes::copy_from_slice(name.as_bytes()), Child::Dir(id)));
                        at = id;
                    }
                    (None, true) => {
                        p.nodes[at as usize]
                            .children
                            .push((Bytes::copy_from_slice(name.as_bytes()), Child::Export(i)));
                        p.parents[i] = Some(at);
                    }
                }
            }
            if blocked {
                tracing::warn!(
                    export = paths[i],
                    "export inside another export: not reachable over NFSv4"
                );
            }
        }
        p
    }

    /// The export at `/`, if there is one.
    pub fn root_export(&self) -> Option<usize> {
        self.root_export
    }

    /// The entries of pseudo directory `id`.
    pub fn children(&self, id: u32) -> &[(Bytes, Child)] {
        self.nodes
            .get(id as usize)
            .map_or(&[][..], |n| &n.children[..])
    }

    /// `name` in pseudo directory `id`.
    pub fn lookup(&self, id: u32, name: &[u8]) -> Option<Child> {
        self.children(id)
            .iter()
            .find(|(n, _)| n.as_ref() == name)
            .map(|(_, c)| *c)
    }

    /// The parent of pseudo directory `id` (the root is its own).
    pub fn parent(&self, id: u32) -> u32 {
        self.nodes.get(id as usize).map_or(0, |n| n.parent)
    }

    /// The pseudo directory export `ex` hangs from.
    pub fn export_parent(&self, ex: usize) -> Option<u32> {
        self.parents.get(ex).copied().flatten()
    }

    /// The file id an export's root shows in its pseudo directory
    /// (`mounted_on_fileid`).
    pub fn mounted_on_fileid(ex: usize) -> u64 {
        FILEID_BASE + (1 << 20) + ex as u64
    }

    /// The file id of pseudo directory `id`.
    pub fn fileid(id: u32) -> u64 {
        FILEID_BASE + u64::from(id)
    }

    /// The handle of pseudo directory `id`.
    pub fn handle(id: u32) -> Bytes {
        let mut h = Vec::with_capacity(8);
        h.extend_from_slice(&MAGIC);
        h.extend_from_slice(&id.to_be_bytes());
        Bytes::from(h)
    }

    /// The pseudo directory a handle names: `None` when it is not a pseudo
    /// handle, `Some(None)` for one of a directory that does not exist.
    pub fn parse(&self, fh: &[u8]) -> Option<Option<u32>> {
        if fh.len() != 8 || fh[..4] != MAGIC {
            return None;
        }
        let id = u32::from_be_bytes(fh[4..8].try_into().expect("4 bytes"));
        Some(((id as usize) < self.nodes.len()).then_some(id))
    }

    /// Number of pseudo directories.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there is no pseudo directory (never: the root is one).
    pub fn is_empty(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_under_one_root() {
        let p = Pseudo::new(&["/export", "/srv/a", "/srv/b", "/export/inner"]);
        assert_eq!(p.lookup(0, b"export"), Some(Child::Export(0)));
        let Some(Child::Dir(srv)) = p.lookup(0, b"srv") else {
            panic!("srv is a pseudo directory");
        };
        assert_eq!(p.lookup(srv, b"a"), Some(Child::Export(1)));
        assert_eq!(p.lookup(srv, b"b"), Some(Child::Export(2)));
        assert_eq!(p.parent(srv), 0);
        assert_eq!(p.export_parent(1), Some(srv));
        // Inside another export: not reachable.
        assert_eq!(p.export_parent(3), None);
        assert_eq!(p.parse(&Pseudo::handle(srv)), Some(Some(srv)));
        assert_eq!(p.parse(&Pseudo::handle(99)), Some(None));
        assert_eq!(p.parse(b"nRd1xxxxxxxx"), None);
    }

    #[test]
    fn an_export_at_the_root_is_the_root() {
        let p = Pseudo::new(&["/", "/other"]);
        assert_eq!(p.root_export(), Some(0));
        assert_eq!(p.lookup(0, b"other"), None);
    }
}
