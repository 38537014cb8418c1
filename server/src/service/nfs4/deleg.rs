//! Delegations (RFC 8881 §10.2, §10.4): when OPEN grants one, what
//! recalls one, DELEGRETURN, and what happens to one whose recall goes
//! unanswered (revoked a lease after the recall).
//!
//! A delegation is granted on an OPEN (CLAIM_NULL or CLAIM_FH) when the
//! session's backchannel answered its last call and no other client's
//! open or delegation stands against it (`State4::grant_delegation`):
//! read for an open for reading, write for an open for writing. The WANT
//! bits of the share access (RFC 8881 §18.16.3) can ask for none.
//!
//! Another client's OPEN that conflicts, its SETATTR, REMOVE, RENAME or
//! LINK of the file, and NFSv3's WRITE, SETATTR, REMOVE, RENAME, LINK (and
//! READ, against a write delegation) recall it with CB_RECALL and answer
//! NFS4ERR_DELAY or NFS3ERR_JUKEBOX until the delegation comes back; the
//! caller's retry then proceeds.

use super::callback::Path;
use super::state::{Conflict, FileKey, Granted};
use super::{Cx, Fh};
use crate::service::{Export, Service};
use crate::store::Ino;
use nfsrdma_xdr::nfs3::NfsStat3;
use nfsrdma_xdr::nfs4::cb::{CbArgOp, CbRecallArgs, CbResOp};
use nfsrdma_xdr::nfs4::ops::{Nfsace4, OpenDelegation4, SpaceLimit4};
use nfsrdma_xdr::nfs4::{share, Fh4, Stateid4, Status};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// `OPEN4_SHARE_ACCESS_WANT_*` (RFC 8881 §18.16.3): the bits of
/// `share_access` above the access.
mod want {
    pub const MASK: u32 = 0xff00;
    pub const READ_DELEG: u32 = 0x0100;
    pub const WRITE_DELEG: u32 = 0x0200;
    pub const NO_DELEG: u32 = 0x0400;
    pub const CANCEL: u32 = 0x0500;
}

/// `why_no_delegation4`: WND4_NOT_WANTED.
const WND4_NOT_WANTED: u32 = 0;

/// Delegation counters.
#[derive(Debug, Default)]
pub struct DelegStats {
    /// Read delegations granted.
    pub granted_read: AtomicU64,
    /// Write delegations granted.
    pub granted_write: AtomicU64,
    /// Recalls sent (CB_RECALL).
    pub recalled: AtomicU64,
    /// Recalls that failed (no backchannel, no answer, an error).
    pub recall_failed: AtomicU64,
    /// Delegations returned (DELEGRETURN).
    pub returned: AtomicU64,
    /// Delegations revoked (their recall unanswered for a lease).
    pub revoked: AtomicU64,
    /// Of those granted, those whose session's backchannel was on an RDMA
    /// connection (the rest: on TCP); and of the recalls, returns and
    /// revocations, those of delegations granted so.
    pub granted_over_rdma: AtomicU64,
    pub recalled_over_rdma: AtomicU64,
    pub returned_over_rdma: AtomicU64,
    pub revoked_over_rdma: AtomicU64,
}

impl DelegStats {
    /// One line of the stop report (empty while none was granted).
    pub fn report(&self) -> String {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        if v(&self.granted_read) + v(&self.granted_write) == 0 {
            return String::new();
        }
        format!(
            "nfs4 delegations: granted read {}, write {}, recalled {} (failed {}), returned {}, revoked {}; over RDMA granted {}, recalled {}, returned {}, revoked {}\n",
            v(&self.granted_read),
            v(&self.granted_write),
            v(&self.recalled),
            v(&self.recall_failed),
            v(&self.returned),
            v(&self.revoked),
            v(&self.granted_over_rdma),
            v(&self.recalled_over_rdma),
            v(&self.returned_over_rdma),
            v(&self.revoked_over_rdma),
        )
    }
}

/// `open_delegation_type4`: a read delegation.
const OPEN_DELEGATE_READ: u32 = 1;
/// `open_delegation_type4`: a write delegation.
const OPEN_DELEGATE_WRITE: u32 = 2;

impl Service {
    /// The delegation an OPEN of `file` with `share_access` gets.
    pub(super) fn offer_delegation(
        &self,
        cx: &Cx,
        file: FileKey,
        share_access: u32,
    ) -> OpenDelegation4 {
        let wants = share_access & want::MASK;
        if wants == want::NO_DELEG || wants == want::CANCEL {
            return OpenDelegation4::NoneExt(WND4_NOT_WANTED);
        }
        let (Some(client), Some(session)) = (cx.client, cx.session) else {
            return OpenDelegation4::None;
        };
        if !self.nfs4.config().delegations {
            return OpenDelegation4::None;
        }
        let write = match wants {
            want::READ_DELEG => false,
            want::WRITE_DELEG if share_access & share::ACCESS_WRITE == 0 => {
                return OpenDelegation4::None
            }
            _ => share_access & share::ACCESS_WRITE != 0,
        };
        let Ok(fh) = self.fh_bytes(Fh::File(file.0, file.1)) else {
            return OpenDelegation4::None;
        };
        let Some(g) = self
            .nfs4
            .state
            .grant_delegation(client, &session, file, &fh, write)
        else {
            return OpenDelegation4::None;
        };
        self.granted(g, write, false)
    }

    /// The delegation a reclaiming OPEN (CLAIM_PREVIOUS) gets: the one the
    /// client held before the restart (`held`: OPEN_DELEGATE_READ or
    /// _WRITE), granted again (RFC 8881 §10.2.1, §18.16.3: the client's
    /// locks under it were never sent to the server, and are not
    /// reclaimed otherwise). The session's backchannel is usually still
    /// being probed then: it is granted all the same, with `recall` set
    /// when the path was found down, so that the client returns it at
    /// once (moving its opens and locks to the server first).
    pub(super) fn reclaim_delegation(&self, cx: &Cx, file: FileKey, held: u32) -> OpenDelegation4 {
        let write = match held {
            OPEN_DELEGATE_READ => false,
            OPEN_DELEGATE_WRITE => true,
            _ => return OpenDelegation4::None,
        };
        let (Some(client), Some(session)) = (cx.client, cx.session) else {
            return OpenDelegation4::None;
        };
        if !self.nfs4.config().delegations {
            return OpenDelegation4::None;
        }
        let Ok(fh) = self.fh_bytes(Fh::File(file.0, file.1)) else {
            return OpenDelegation4::None;
        };
        let Some(g) = self
            .nfs4
            .state
            .reclaim_delegation(client, &session, file, &fh, write)
        else {
            return OpenDelegation4::None;
        };
        self.granted(g, write, g.path == Path::Down)
    }

    /// A delegation granted, counted, as OPEN answers it (`recall`: to be
    /// returned at once).
    fn granted(&self, g: Granted, write: bool, recall: bool) -> OpenDelegation4 {
        let d = &self.nfs4.delegs;
        if write {
            d.granted_write.fetch_add(1, Ordering::Relaxed);
        } else {
            d.granted_read.fetch_add(1, Ordering::Relaxed);
        }
        if g.over_rdma {
            d.granted_over_rdma.fetch_add(1, Ordering::Relaxed);
        }
        let sid = g.stateid;
        // Nothing is said of permissions: the client asks ACCESS.
        let ace = Nfsace4::default();
        if write {
            OpenDelegation4::Write(sid, recall, SpaceLimit4::Size(u64::MAX), ace)
        } else {
            OpenDelegation4::Read(sid, recall, ace)
        }
    }

    /// Recalls the delegations of other clients than `client` that an
    /// access to `file` conflicts with (`write`: it changes the file, its
    /// attributes or its name). `Err(NFS4ERR_DELAY)` while one is out.
    pub(super) fn break_delegations4(
        &self,
        client: Option<u64>,
        file: FileKey,
        write: bool,
    ) -> Result<(), Status> {
        if self.nfs4.state.delegations() == 0 {
            return Ok(());
        }
        let c = self
            .nfs4
            .state
            .delegation_conflict(client, file, write, Instant::now());
        self.recall(&c);
        if c.wait {
            Err(Status::DELAY)
        } else {
            Ok(())
        }
    }

    /// [`Service::break_delegations4`] for an NFSv3 call on `ino` of `ex`:
    /// `Err(NFS3ERR_JUKEBOX)` while a delegation is out.
    pub(crate) fn break_delegations3(
        &self,
        ex: &Export,
        ino: Ino,
        write: bool,
    ) -> Result<(), NfsStat3> {
        if self.nfs4.state.delegations() == 0 {
            return Ok(());
        }
        let Some(idx) = self.exports.iter().position(|e| std::ptr::eq(e, ex)) else {
            return Ok(());
        };
        self.break_delegations4(None, (idx, ino), write)
            .map_err(|_| NfsStat3::Jukebox)
    }

    /// Sends the recalls a conflict found, and counts what it revoked.
    fn recall(&self, c: &Conflict) {
        let d = &self.nfs4.delegs;
        if c.revoked > 0 {
            d.revoked.fetch_add(c.revoked as u64, Ordering::Relaxed);
            d.revoked_over_rdma
                .fetch_add(c.revoked_over_rdma as u64, Ordering::Relaxed);
        }
        for r in &c.recall {
            d.recalled.fetch_add(1, Ordering::Relaxed);
            if r.over_rdma {
                d.recalled_over_rdma.fetch_add(1, Ordering::Relaxed);
            }
            let op = CbArgOp::Recall(CbRecallArgs {
                stateid: r.stateid,
                truncate: false,
                fh: Fh4(r.fh.clone()),
            });
            let stats = self.nfs4.delegs.clone();
            let state = self.nfs4.state.clone();
            let other = r.stateid.other;
            self.nfs4.callbacks.compound(r.session, vec![op], move |res| {
                let failed = match &res {
                    Ok(res) => !matches!(res.results.get(1), Some(CbResOp::Recall(s)) if s.is_ok()),
                    Err(_) => true,
                };
                if failed {
                    stats.recall_failed.fetch_add(1, Ordering::Relaxed);
                    state.recall_failed(&other);
                    tracing::info!(result = ?res, "CB_RECALL failed: sent again at the next conflicting call; the delegation is revoked a lease after the first recall unless returned");
                }
            });
        }
    }

    /// DELEGRETURN.
    pub(super) fn delegreturn4(&self, cx: &Cx, sid: &Stateid4) -> Result<(), Status> {
        let client = cx.client.ok_or(Status::OP_NOT_IN_SESSION)?;
        let Fh::File(idx, ino) = cx.cur()? else {
            return Err(Status::INVAL);
        };
        let over_rdma = self.nfs4.state.delegreturn(client, sid, (idx, ino))?;
        self.nfs4.delegs.returned.fetch_add(1, Ordering::Relaxed);
        if over_rdma {
            self.nfs4
                .delegs
                .returned_over_rdma
                .fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }
}
