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
//!
//! Another client's GETATTR of the size or change attribute of a file
//! under a write delegation asks the holder with CB_GETATTR (RFC 8881
//! §10.4.3) instead ([`Service::held_size4`]).

use super::callback::Path;
use super::state::{Conflict, FileKey, Granted, HeldView};
use super::{Cx, Fh};
use crate::service::{Export, Service};
use crate::store::Cred;
use crate::store::Ino;
use nfsrdma_xdr::nfs3::NfsStat3;
use nfsrdma_xdr::nfs3::{Sattr3, SetTime};
use nfsrdma_xdr::nfs4::attr::{self, n};
use nfsrdma_xdr::nfs4::cb::{CbArgOp, CbGetattrArgs, CbRecallArgs, CbResOp};
use nfsrdma_xdr::nfs4::ops::{Nfsace4, OpenDelegation4, SpaceLimit4};
use nfsrdma_xdr::nfs4::{share, Bitmap4, Fh4, SessionId4, Stateid4, Status};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a GETATTR waits for its CB_GETATTR's answer before it is
/// answered NFS4ERR_DELAY (the thread serving it waits meanwhile).
pub const CB_GETATTR_WAIT: Duration = Duration::from_millis(100);

/// How long a holder's answer to CB_GETATTR serves other clients'
/// GETATTRs (a retry after NFS4ERR_DELAY among them).
pub const CB_GETATTR_FRESH: Duration = Duration::from_secs(1);

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
    /// connection (the rest: on TCP).
    pub granted_over_rdma: AtomicU64,
    /// Recalls of delegations granted over RDMA.
    pub recalled_over_rdma: AtomicU64,
    /// Delegations granted over RDMA and returned.
    pub returned_over_rdma: AtomicU64,
    /// Delegations granted over RDMA and revoked.
    pub revoked_over_rdma: AtomicU64,
    /// CB_GETATTRs sent (another client's GETATTR of a file under a
    /// write delegation).
    pub getattr_asked: AtomicU64,
    /// Of their answers, those that said the holder changed the file.
    pub getattr_changed: AtomicU64,
    /// Those that failed (the delegation is recalled then).
    pub getattr_failed: AtomicU64,
}

impl DelegStats {
    /// One line of the stop report (empty while none was granted).
    pub fn report(&self) -> String {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        if v(&self.granted_read) + v(&self.granted_write) == 0 {
            return String::new();
        }
        format!(
            "nfs4 delegations: granted read {}, write {}, recalled {} (failed {}), returned {}, revoked {}; over RDMA granted {}, recalled {}, returned {}, revoked {}; CB_GETATTR {} (changed {}, failed {})\n",
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
            v(&self.getattr_asked),
            v(&self.getattr_changed),
            v(&self.getattr_failed),
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
        let Some(initial) = self.initial_attrs(file, write) else {
            return OpenDelegation4::None;
        };
        let Some(g) = self
            .nfs4
            .state
            .grant_delegation(client, &session, file, &fh, write, initial)
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
        let Some(initial) = self.initial_attrs(file, write) else {
            return OpenDelegation4::None;
        };
        let Some(g) = self
            .nfs4
            .state
            .reclaim_delegation(client, &session, file, &fh, write, initial)
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

    /// The file's change attribute and size, for a write delegation
    /// about to be granted (its CB_GETATTR compares with them); nothing
    /// is read for a read delegation.
    fn initial_attrs(&self, (idx, ino): FileKey, write: bool) -> Option<(u64, u64)> {
        if !write {
            return Some((0, 0));
        }
        let fs = self.exports.get(idx)?.store.read();
        let (a, change) = fs.getattr_change(ino).ok()?;
        Some((change, a.size))
    }

    /// For a GETATTR by `client` of `file` that asks for `want`: when
    /// another client holds a write delegation of it and `want` names the
    /// size or the change attribute, the holder is asked for them with
    /// CB_GETATTR (RFC 8881 §10.4.3) instead of the delegation being
    /// recalled. The GETATTR waits for the answer up to
    /// [`CB_GETATTR_WAIT`], then is answered NFS4ERR_DELAY, and the answer
    /// serves its retry (and other GETATTRs for [`CB_GETATTR_FRESH`]). When
    /// the holder says it changed the file since the grant, the size to
    /// report is the holder's (`Ok(Some(size))`), and each answer that
    /// differs from the one before has the file's modify time set to now
    /// (which moves its change attribute, once per change seen). A CB_GETATTR that fails (no answer
    /// within the callback timeout, an error) has the delegation recalled
    /// at the next GETATTR, as any other conflict.
    pub(super) fn held_size4(
        &self,
        client: Option<u64>,
        file: FileKey,
        want: &Bitmap4,
    ) -> Result<Option<u64>, Status> {
        if self.nfs4.state.delegations() == 0 || !(want.has(n::CHANGE) || want.has(n::SIZE)) {
            return Ok(None);
        }
        let mut asked = false;
        loop {
            let view = self
                .nfs4
                .state
                .held_attrs(client, file, Instant::now(), CB_GETATTR_FRESH);
            match view {
                HeldView::None | HeldView::Recall => {
                    return self.break_delegations4(client, file, false).map(|()| None)
                }
                HeldView::Answered {
                    modified: false, ..
                } => return Ok(None),
                HeldView::Answered {
                    modified: true,
                    size,
                    touch,
                } => {
                    if touch {
                        self.touch(file);
                    }
                    return Ok(Some(size));
                }
                HeldView::Asking => return Err(Status::DELAY),
                HeldView::Ask { .. } if asked => return Err(Status::DELAY),
                HeldView::Ask { session, other, fh } => {
                    asked = true;
                    self.ask_holder(session, other, fh);
                }
            }
        }
    }

    /// Sends CB_GETATTR for the size and change of the delegation
    /// `other`'s file, and waits up to [`CB_GETATTR_WAIT`] for the answer,
    /// which is recorded whenever it comes. It does not wait when this
    /// thread is the one that sends the holder's messages (an RDMA pool
    /// thread serving both clients' connections): the call goes out once
    /// this one is answered (NFS4ERR_DELAY), and its answer serves the
    /// retry.
    fn ask_holder(&self, session: SessionId4, other: [u8; 12], fh: bytes::Bytes) {
        let op = CbArgOp::Getattr(CbGetattrArgs {
            fh: Fh4(fh),
            attr_request: Bitmap4::from_bits([n::CHANGE, n::SIZE]),
        });
        let state = self.nfs4.state.clone();
        let stats = self.nfs4.delegs.clone();
        stats.getattr_asked.fetch_add(1, Ordering::Relaxed);
        let here = self
            .nfs4
            .state
            .back_target(&session)
            .is_some_and(|(c, ..)| c.served_here());
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.nfs4.callbacks.compound(session, vec![op], move |res| {
            let answer = match &res {
                Ok(r) => match r.results.get(1) {
                    Some(CbResOp::Getattr(Ok(f))) => match attr::change_and_size(f) {
                        Ok((Some(change), Some(size))) => Some((change, size)),
                        _ => None,
                    },
                    _ => None,
                },
                Err(_) => None,
            };
            if answer.is_none() {
                stats.getattr_failed.fetch_add(1, Ordering::Relaxed);
                tracing::info!(result = ?res, "CB_GETATTR failed: the delegation is recalled at the next conflicting call");
            }
            if state.held_answered(&other, answer, Instant::now()) {
                stats.getattr_changed.fetch_add(1, Ordering::Relaxed);
            }
            let _ = tx.send(());
        });
        if !here {
            let _ = rx.recv_timeout(CB_GETATTR_WAIT);
        }
    }

    /// Sets the file's modify time to now (its holder said it changed
    /// it): its change attribute moves, so other clients see it changed.
    fn touch(&self, (idx, ino): FileKey) {
        let Some(ex) = self.exports.get(idx) else {
            return;
        };
        let now = Sattr3 {
            mtime: SetTime::ServerTime,
            ..Sattr3::default()
        };
        if let Err(e) = ex.store.write().setattr(ino, &Cred::root(), &now, None) {
            tracing::debug!(error = ?e, "setting a delegated file's times failed");
        }
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
