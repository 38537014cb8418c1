//! A small NFSv3 service for the simulation: NULL, READ, WRITE and READDIR
//! over files kept in a map, enough to move data through every kind of
//! chunk (Read chunks for WRITE data, Write chunks for READ data, Reply
//! chunks for large READDIR replies, Position-Zero Read chunks for long
//! calls).

use nfsrdma_xdr::nfs3::{
    CookieVerf3, Data, DirList3, Entry3, Filename3, Nfs3Args, Nfs3Res, NfsProc3, NfsResult,
    NfsStat3, Read3ResOk, Readdir3ResOk, StableHow, WccData, Write3ResOk,
};
use nfsrdma_xdr::rpc::CallBody;
use nfsrdma_xdr::{Decoder, List, Payload};
use std::collections::HashMap;

/// The program the service answers (NFS).
pub const PROGRAM: u32 = nfsrdma_xdr::nfs3::PROGRAM;

/// What the service does with one call.
pub trait App {
    /// Runs a call; `None` means no reply (a call still in progress).
    fn call(&mut self, xid: u32, call: &CallBody, args: Decoder) -> Option<Nfs3Res>;
}

/// Files by handle; a READDIR of any handle lists `entries` names.
#[derive(Debug, Default)]
pub struct MiniNfs {
    /// File contents by file handle.
    pub files: HashMap<Vec<u8>, Vec<u8>>,
    /// Entries a READDIR lists.
    pub entries: u32,
    /// Calls run, by XID (a call must run once).
    pub runs: HashMap<u32, u32>,
}

impl App for MiniNfs {
    fn call(&mut self, xid: u32, call: &CallBody, mut args: Decoder) -> Option<Nfs3Res> {
        *self.runs.entry(xid).or_default() += 1;
        let proc_ = NfsProc3::from_u32(call.proc_)?;
        let a = Nfs3Args::decode(proc_, &mut args).ok()?;
        Some(match a {
            Nfs3Args::Null => Nfs3Res::Null,
            Nfs3Args::Write(w) => {
                let f = self.files.entry(w.file.as_bytes().to_vec()).or_default();
                let at = w.offset as usize;
                let data = w.data.0.to_contiguous();
                if f.len() < at + data.len() {
                    f.resize(at + data.len(), 0);
                }
                f[at..at + data.len()].copy_from_slice(&data);
                Nfs3Res::Write(NfsResult::Ok(Write3ResOk {
                    file_wcc: WccData::default(),
                    count: data.len() as u32,
                    committed: StableHow::FileSync,
                    verf: [7; 8],
                }))
            }
            Nfs3Args::Read(r) => {
                let f = self
                    .files
                    .get(r.file.as_bytes())
                    .cloned()
                    .unwrap_or_default();
                let start = (r.offset as usize).min(f.len());
                let end = (start + r.count as usize).min(f.len());
                Nfs3Res::Read(NfsResult::Ok(Read3ResOk {
                    file_attributes: None,
                    count: (end - start) as u32,
                    eof: end == f.len(),
                    data: Data(Payload::from(f[start..end].to_vec())),
                }))
            }
            Nfs3Args::Readdir(_) => Nfs3Res::Readdir(NfsResult::Ok(Readdir3ResOk {
                dir_attributes: None,
                cookieverf: CookieVerf3::default(),
                reply: DirList3 {
                    entries: List(
                        (0..self.entries)
                            .map(|i| Entry3 {
                                fileid: u64::from(i) + 1,
                                name: Filename3::new(format!("entry-{i:05}").into_bytes()),
                                cookie: u64::from(i) + 1,
                            })
                            .collect(),
                    ),
                    eof: true,
                },
            })),
            _ => Nfs3Res::Getattr(NfsResult::Err(NfsStat3::Notsupp, ())),
        })
    }
}
