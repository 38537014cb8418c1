//! NFSv4.1 state (RFC 8881): client records (EXCHANGE_ID), sessions with
//! their slot tables and reply caches (CREATE_SESSION, SEQUENCE), leases,
//! opens with their share reservations, byte-range locks, and the grace
//! period after a restart (RFC 8881 §8.4.2): the clients of the previous
//! instance reclaim their opens and locks, new ones wait.
//!
//! The byte-range lock table is shared with NFSv3's lock manager (NLM,
//! `service::nlm`): its owners' ranges sit beside the v4 ones, so a v3 lock
//! and a v4 lock on the same bytes conflict, and one grace period after a
//! restart holds back new locks of both.
//!
//! Everything here is behind one mutex held for a few map operations at a
//! time, never across a store operation.

use super::callback::{Back, BackConn, Path};
use crate::service::metrics::Transport;
use crate::service::plain_hash::IssuedMap;
use crate::store::Ino;
use bytes::Bytes;
use nfsrdma_xdr::nfs4::ops::{ChannelAttrs4, LockDenied};
use nfsrdma_xdr::nfs4::{
    share, Compound4Res, LockType4, Opaque4, SessionId4, StateOwner4, Stateid4, Status,
};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A file as the state tables name it: its export and inode.
pub type FileKey = (usize, Ino);

/// Limits of the fore channel this server grants.
#[derive(Debug, Clone, Copy)]
pub struct ChannelLimits {
    /// Largest request.
    pub max_request: u32,
    /// Largest reply.
    pub max_response: u32,
    /// Largest reply kept in a slot.
    pub max_cached: u32,
    /// Most operations per COMPOUND.
    pub max_ops: u32,
    /// Most slots.
    pub max_slots: u32,
}

/// What a slot holds after its last request.
#[derive(Debug, Clone)]
enum SlotReply {
    /// Nothing yet (seqid 0).
    Empty,
    /// A request is running.
    InProgress,
    /// The whole reply, to replay.
    Cached(Compound4Res),
    /// Only the fact that it ran (`sa_cachethis` was false).
    Uncached,
}

#[derive(Debug, Clone)]
struct Slot {
    seqid: u32,
    reply: SlotReply,
}

struct Session {
    client: u64,
    slots: Vec<Slot>,
    fore: ChannelAttrs4,
    /// The backchannel, when one was granted or bound.
    back: Option<Back>,
}

struct Client {
    owner: Bytes,
    verifier: [u8; 8],
    uid: Option<u32>,
    confirmed: bool,
    /// The last CREATE_SESSION sequence and its reply.
    cs_seq: u32,
    cs_reply: Option<nfsrdma_xdr::nfs4::ops::CreateSessionResOk>,
    renewed: Instant,
    reclaim_complete: bool,
    /// A client of the previous instance (its owner is in the grace
    /// period's list): it may reclaim until its RECLAIM_COMPLETE.
    may_reclaim: bool,
    /// Delegations of this client revoked and not yet freed.
    revoked: u32,
}

/// The kind of a stateid.
#[derive(Debug, Clone)]
enum Kind {
    Open {
        access: u32,
        deny: u32,
    },
    Lock {
        open: [u8; 12],
    },
    /// A delegation (RFC 8881 §10.2).
    Deleg(Deleg),
    /// A delegation revoked: its client learns it from DELEG_REVOKED and
    /// SEQ4_STATUS_RECALLABLE_STATE_REVOKED until it frees the stateid.
    Revoked,
}

/// A delegation's particulars.
#[derive(Debug, Clone)]
struct Deleg {
    write: bool,
    /// The session it was granted on: the recall goes on its backchannel
    /// (or on another of the client's, if that one is gone).
    session: SessionId4,
    /// The file's handle, for CB_RECALL.
    fh: Bytes,
    /// When the recall was first sent.
    recalled: Option<Instant>,
    /// Whether the last recall sent failed: the next conflicting call
    /// sends it again.
    resend: bool,
    /// Whether the session's backchannel was on an RDMA connection when
    /// it was granted: its recall, return or revocation is counted as
    /// over RDMA.
    over_rdma: bool,
    /// For a write delegation: what CB_GETATTR learned of the file.
    held: Option<HeldAttrs>,
}

/// What the holder of a write delegation says of its file's size and
/// change attribute when asked with CB_GETATTR (RFC 8881 §10.4.3).
#[derive(Debug, Clone)]
struct HeldAttrs {
    /// The change attribute and size the holder last gave (at first the
    /// file's when the delegation was granted): an answer that differs
    /// says the holder changed the file since.
    last: (u64, u64),
    /// Whether an answer said so (it stays so while the delegation lasts).
    modified: bool,
    /// The last answer said so, and no GETATTR has moved the file's
    /// change attribute for it yet.
    touch: bool,
    /// When it last answered.
    answered: Option<Instant>,
    /// A CB_GETATTR is out.
    asking: bool,
    /// The last CB_GETATTR failed: the delegation is recalled instead.
    failed: bool,
}

/// What another client's GETATTR of a file finds of a write delegation
/// of it ([`State4::held_attrs`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeldView {
    /// No write delegation of another client that is not being recalled.
    None,
    /// The holder answered lately.
    Answered {
        /// Whether it changed the file since the grant.
        modified: bool,
        /// The size it gave.
        size: u64,
        /// Whether it changed the file since its answer before: the
        /// file's change attribute is to move (once per change; this
        /// GETATTR moves it).
        touch: bool,
    },
    /// A CB_GETATTR is out and unanswered.
    Asking,
    /// Ask the holder (marked asking now).
    Ask {
        /// The session the delegation was granted on.
        session: SessionId4,
        /// The delegation.
        other: [u8; 12],
        /// The file's handle.
        fh: Bytes,
    },
    /// The holder did not answer its last CB_GETATTR: recall.
    Recall,
}

/// A delegation granted.
#[derive(Debug, Clone, Copy)]
pub struct Granted {
    /// The delegation.
    pub stateid: Stateid4,
    /// The state of the session's backchannel (`Down` also when it has
    /// none).
    pub path: Path,
    /// Whether that backchannel is on an RDMA connection.
    pub over_rdma: bool,
}

/// A delegation to recall: where and what.
#[derive(Debug, Clone)]
pub struct Recall {
    /// The session whose backchannel carries the recall.
    pub session: SessionId4,
    /// The delegation.
    pub stateid: Stateid4,
    /// The file's handle.
    pub fh: Bytes,
    /// Whether the delegation was granted over RDMA.
    pub over_rdma: bool,
}

/// What a conflicting access finds of other clients' delegations.
#[derive(Debug, Default)]
pub struct Conflict {
    /// Delegations whose recall is to be sent now (the first to find them).
    pub recall: Vec<Recall>,
    /// Whether any conflicting delegation is still out (recalled, not yet
    /// returned nor revoked): the access waits (NFS4ERR_DELAY,
    /// NFS3ERR_JUKEBOX).
    pub wait: bool,
    /// Delegations revoked now: their recall went unanswered for a lease.
    pub revoked: usize,
    /// Of those, the ones granted over RDMA.
    pub revoked_over_rdma: usize,
}

#[derive(Debug, Clone)]
struct StateEntry {
    client: u64,
    owner: Bytes,
    file: FileKey,
    seqid: u32,
    kind: Kind,
}

#[derive(Debug, Clone)]
struct Range {
    state: [u8; 12],
    client: u64,
    owner: Bytes,
    write: bool,
    start: u64,
    /// Exclusive; `u64::MAX` for "to the end".
    end: u64,
}

#[derive(Default)]
struct Tables {
    clients: IssuedMap<u64, Client>,
    sessions: IssuedMap<SessionId4, Session>,
    states: IssuedMap<[u8; 12], StateEntry>,
    /// Open and lock stateids by file.
    by_file: IssuedMap<FileKey, Vec<[u8; 12]>>,
    locks: IssuedMap<FileKey, Vec<Range>>,
    next: u64,
    last_sweep: Option<Instant>,
    grace: Option<Grace>,
    /// Files whose last open went (CLOSE, lease expiry, a client's
    /// destruction), for the store to release ([`State4::take_released`]).
    released: Vec<FileKey>,
    /// The lock manager's grace period after a restart (NLM clients
    /// reclaim): new v4 opens and locks wait for it too.
    nlm_grace: Option<Instant>,
    /// Delegations out (granted, not returned nor revoked): shared with
    /// [`State4::delegations`], read without the lock.
    delegs: std::sync::Arc<AtomicUsize>,
}

/// The grace period after a restart.
struct Grace {
    /// When it ends at the latest.
    until: Instant,
    /// Owners of the previous instance's clients that have not yet said
    /// RECLAIM_COMPLETE; the period ends early when none is left.
    waiting: HashSet<Bytes>,
}

/// Whether OPEN and LOCK reclaim, or ask anew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// A new open or lock: refused with NFS4ERR_GRACE during the grace
    /// period.
    New,
    /// A reclaim (CLAIM_PREVIOUS, `reclaim` LOCK): allowed only during the
    /// grace period, from a client of the previous instance that has not
    /// said RECLAIM_COMPLETE.
    Reclaim,
}

/// The server's NFSv4.1 state.
pub struct State4 {
    t: Mutex<Tables>,
    /// The lease every client gets.
    pub lease: Duration,
    /// Differs at every start: the high half of client ids and the first
    /// word of every stateid's `other`.
    boot: u32,
    /// Set when `Tables::released` gains files, so that the COMPOUND path
    /// looks at the tables only then ([`State4::take_released`]).
    released_any: AtomicBool,
    /// When the tables were last swept, in nanoseconds after `epoch`
    /// (`NEVER`: not yet), so that a COMPOUND takes the lock for a sweep
    /// only once a second ([`State4::sweep`]).
    swept_at: AtomicU64,
    epoch: Instant,
    /// Delegations out (the same counter as `Tables::delegs`).
    delegs: std::sync::Arc<AtomicUsize>,
}

/// `State4::swept_at` before the first sweep.
const NEVER: u64 = u64::MAX;

/// How SEQUENCE's slot check came out.
pub enum SlotCheck {
    /// A new request: run it.
    New {
        /// Slots of the session, for the reply.
        slots: u32,
        /// The session's client.
        client: u64,
        /// The session's largest reply.
        max_response: u32,
        /// The session's largest cached reply.
        max_cached: u32,
        /// SEQ4_STATUS_* bits of the session's backchannel.
        status_flags: u32,
    },
    /// A retry of a request whose reply is cached: send it again.
    Replay(Compound4Res),
}

/// An open as OPEN asks for it.
pub struct OpenRequest<'a> {
    /// The client.
    pub client: u64,
    /// The open owner.
    pub owner: &'a [u8],
    /// The file.
    pub file: FileKey,
    /// OPEN4_SHARE_ACCESS_* bits.
    pub access: u32,
    /// OPEN4_SHARE_DENY_* bits.
    pub deny: u32,
}

/// A lock range asked for, to check for conflicts.
#[derive(Clone, Copy)]
struct Want<'a> {
    client: u64,
    owner: &'a [u8],
    write: bool,
    start: u64,
    end: u64,
}

fn end_of(offset: u64, length: u64) -> Result<u64, Status> {
    if length == 0 {
        return Err(Status::INVAL);
    }
    if length == u64::MAX {
        return Ok(u64::MAX);
    }
    offset.checked_add(length).ok_or(Status::INVAL)
}

impl State4 {
    /// Empty state with leases of `lease`.
    pub fn new(lease: Duration) -> State4 {
        let boot = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() as u32 ^ d.subsec_nanos());
        // All ones marks the lock manager's owners ([`NlmOwner`]).
        let boot = if boot == u32::MAX { 1 } else { boot };
        let tables = Tables::default();
        State4 {
            delegs: tables.delegs.clone(),
            t: Mutex::new(tables),
            lease,
            boot,
            released_any: AtomicBool::new(false),
            swept_at: AtomicU64::new(NEVER),
            epoch: Instant::now(),
        }
    }

    /// Call after removing states: flags files whose last open went.
    fn note_released(&self, t: &Tables) {
        if !t.released.is_empty() {
            self.released_any.store(true, Ordering::Release);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tables> {
        self.t.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn new_other(&self, t: &mut Tables) -> [u8; 12] {
        t.next += 1;
        let mut o = [0u8; 12];
        o[..4].copy_from_slice(&self.boot.to_be_bytes());
        o[4..].copy_from_slice(&t.next.to_be_bytes());
        o
    }

    /// The server's instance, for EXCHANGE_ID's server owner.
    pub fn boot(&self) -> u32 {
        self.boot
    }

    // ---- the grace period ------------------------------------------------------

    /// Starts a grace period of `length` for the clients of the previous
    /// instance, named by their owners (from the state file). Without
    /// such clients, or with a zero length, there is none.
    pub fn start_grace(&self, owners: Vec<Bytes>, length: Duration, now: Instant) {
        let mut t = self.lock();
        t.grace = (!owners.is_empty() && !length.is_zero()).then(|| Grace {
            until: now + length,
            waiting: owners.into_iter().collect(),
        });
    }

    /// Whether the grace period is on at `now` (ending it if its time is up
    /// or every client it waited for has said RECLAIM_COMPLETE).
    pub fn in_grace(&self, now: Instant) -> bool {
        grace_on(&mut self.lock(), now)
    }

    /// Seconds left of the grace period and the clients it still waits
    /// for, if it is on.
    pub fn grace_left(&self, now: Instant) -> Option<(Duration, usize)> {
        let mut t = self.lock();
        grace_on(&mut t, now).then(|| {
            let g = t.grace.as_ref().expect("on");
            (g.until - now, g.waiting.len())
        })
    }

    /// NFS4ERR_GRACE for a new open or lock while the grace period is on
    /// (and for REMOVE and RENAME, which could take a name a reclaim
    /// needs) or before the client's RECLAIM_COMPLETE; for a reclaim, NFS4ERR_NO_GRACE outside it or once the
    /// client said RECLAIM_COMPLETE, NFS4ERR_RECLAIM_BAD from a client
    /// the previous instance did not know.
    pub fn check_claim(&self, client: u64, claim: Claim, now: Instant) -> Result<(), Status> {
        let mut t = self.lock();
        let on = grace_on(&mut t, now);
        match claim {
            Claim::New if on || nlm_grace_on(&mut t, now) => Err(Status::GRACE),
            // Until its RECLAIM_COMPLETE a client may only reclaim (RFC 8881
            // §18.51.3), as the Linux nfsd has it.
            Claim::New => match t.clients.get(&client) {
                Some(c) if !c.reclaim_complete => Err(Status::GRACE),
                _ => Ok(()),
            },
            Claim::Reclaim => {
                let c = t.clients.get(&client).ok_or(Status::STALE_CLIENTID)?;
                if !on || c.reclaim_complete {
                    Err(Status::NO_GRACE)
                } else if !c.may_reclaim {
                    Err(Status::RECLAIM_BAD)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The owners a restart must let reclaim: every confirmed client with
    /// opens or locks, and those the grace period still waits for (a
    /// restart during it keeps them).
    pub fn reclaimers(&self, now: Instant) -> Vec<Bytes> {
        let mut t = self.lock();
        let mut owners: HashSet<Bytes> = HashSet::new();
        if grace_on(&mut t, now) {
            owners.extend(t.grace.as_ref().expect("on").waiting.iter().cloned());
        }
        for (id, c) in &t.clients {
            if c.confirmed && t.states.values().any(|s| s.client == *id) {
                owners.insert(c.owner.clone());
            }
        }
        let mut v: Vec<Bytes> = owners.into_iter().collect();
        v.sort();
        v
    }

    /// Drops every client whose lease ran out, with its sessions, opens
    /// and locks (at most once a second; called at every COMPOUND). True
    /// when files lost their last open ([`State4::take_released`]).
    pub fn sweep(&self, now: Instant) -> bool {
        let at = now.saturating_duration_since(self.epoch).as_nanos() as u64;
        let last = self.swept_at.load(Ordering::Relaxed);
        if last != NEVER && at.saturating_sub(last) < 1_000_000_000 {
            return false;
        }
        self.swept_at.store(at, Ordering::Relaxed);
        let mut t = self.lock();
        if t.last_sweep
            .is_some_and(|l| now.duration_since(l) < Duration::from_secs(1))
        {
            return false;
        }
        t.last_sweep = Some(now);
        let expired: Vec<u64> = t
            .clients
            .iter()
            .filter(|(_, c)| now.duration_since(c.renewed) > self.lease)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            tracing::info!(
                clientid = format_args!("{id:#x}"),
                "NFSv4 lease expired: the client's state is dropped"
            );
            purge_client(&mut t, id);
        }
        self.note_released(&t);
        !t.released.is_empty()
    }

    // ---- EXCHANGE_ID and client records --------------------------------------

    /// EXCHANGE_ID (RFC 8881 §18.35.4, for SP4_NONE and SP4_MACH_CRED
    /// without enforcement): the client id and whether it is confirmed.
    pub fn exchange_id(
        &self,
        owner: &Opaque4,
        verifier: [u8; 8],
        uid: Option<u32>,
        update: bool,
    ) -> Result<(u64, u32, bool), Status> {
        let mut t = self.lock();
        let now = Instant::now();
        let existing: Vec<(u64, bool, [u8; 8], Option<u32>)> = t
            .clients
            .iter()
            .filter(|(_, c)| c.owner == owner.0)
            .map(|(id, c)| (*id, c.confirmed, c.verifier, c.uid))
            .collect();
        let confirmed = existing.iter().find(|e| e.1);
        if update {
            return match confirmed {
                None => Err(Status::NOENT),
                Some(&(_, _, v, _)) if v != verifier => Err(Status::NOT_SAME),
                Some(&(_, _, _, u)) if u != uid => Err(Status::PERM),
                Some(&(id, ..)) => {
                    let c = t.clients.get_mut(&id).expect("listed above");
                    c.renewed = now;
                    Ok((id, c.cs_seq.wrapping_add(1), true))
                }
            };
        }
        if let Some(&(id, _, v, u)) = confirmed {
            if u != uid && self.has_state(&t, id) {
                return Err(Status::CLID_INUSE);
            }
            if v == verifier && u == uid {
                let c = t.clients.get_mut(&id).expect("listed above");
                c.renewed = now;
                return Ok((id, c.cs_seq.wrapping_add(1), true));
            }
            // Another principal's record with no state is replaced at once
            // (RFC 8881 §18.35.4, case 3); a restarted client's (same
            // principal, new verifier) only when the new one is confirmed.
            if u != uid {
                purge_client(&mut t, id);
                self.note_released(&t);
            }
        }
        // A new client, a restarted one (new verifier: its old record goes
        // when the new one is confirmed) or a new principal: an
        // unconfirmed record replacing any earlier unconfirmed one.
        for (id, c, ..) in &existing {
            if !c {
                t.clients.remove(id);
            }
        }
        let may_reclaim = grace_on(&mut t, now)
            && t.grace
                .as_ref()
                .is_some_and(|g| g.waiting.contains(&owner.0));
        t.next += 1;
        let id = (u64::from(self.boot) << 32) | (t.next & 0xffff_ffff);
        t.clients.insert(
            id,
            Client {
                owner: owner.0.clone(),
                verifier,
                uid,
                confirmed: false,
                cs_seq: 0,
                cs_reply: None,
                renewed: now,
                reclaim_complete: false,
                may_reclaim,
                revoked: 0,
            },
        );
        Ok((id, 1, false))
    }

    fn has_state(&self, t: &Tables, client: u64) -> bool {
        t.sessions.values().any(|s| s.client == client)
            || t.states.values().any(|s| s.client == client)
    }

    /// CREATE_SESSION (RFC 8881 §18.36.4): a new session, or the reply
    /// to a retry of the last one.
    /// `uid`: the caller's, which must be the one that made an
    /// unconfirmed record (NFS4ERR_CLID_INUSE otherwise).
    /// `back`: the backchannel granted (the flag is set in the reply).
    pub fn create_session(
        &self,
        args: &nfsrdma_xdr::nfs4::ops::CreateSessionArgs,
        limits: ChannelLimits,
        uid: Option<u32>,
        back: Option<Back>,
    ) -> Result<nfsrdma_xdr::nfs4::ops::CreateSessionResOk, Status> {
        use nfsrdma_xdr::nfs4::ops::CreateSessionResOk;
        use nfsrdma_xdr::nfs4::session_flags;
        // Flags this version does not define (as the Linux nfsd).
        let known =
            session_flags::PERSIST | session_flags::CONN_BACK_CHAN | session_flags::CONN_RDMA;
        if args.flags & !known != 0 {
            return Err(Status::INVAL);
        }
        let mut t = self.lock();
        let Some(c) = t.clients.get(&args.clientid) else {
            return Err(Status::STALE_CLIENTID);
        };
        if !c.confirmed && c.uid != uid {
            return Err(Status::CLID_INUSE);
        }
        if args.sequence == c.cs_seq {
            return c.cs_reply.clone().ok_or(Status::SEQ_MISORDERED);
        }
        if args.sequence != c.cs_seq.wrapping_add(1) {
            return Err(Status::SEQ_MISORDERED);
        }
        // Neither channel can carry a request and its reply that small
        // (the backchannel's are the client's statement of what it can
        // take).
        for f in [&args.fore_chan_attrs, &args.back_chan_attrs] {
            if f.maxrequestsize < 64
                || f.maxresponsesize < 64
                || f.maxoperations == 0
                || f.maxrequests == 0
            {
                return Err(Status::TOOSMALL);
            }
        }
        let f = &args.fore_chan_attrs;
        let fore = ChannelAttrs4 {
            headerpadsize: 0,
            maxrequestsize: f.maxrequestsize.min(limits.max_request),
            maxresponsesize: f.maxresponsesize.min(limits.max_response),
            maxresponsesize_cached: f.maxresponsesize_cached.min(limits.max_cached),
            maxoperations: f.maxoperations.min(limits.max_ops),
            maxrequests: f.maxrequests.min(limits.max_slots),
            rdma_ird: Default::default(),
        };
        let owner = c.owner.clone();
        let was_confirmed = c.confirmed;
        // Confirming a restarted client's record ends its old one.
        if !was_confirmed {
            let old: Vec<u64> = t
                .clients
                .iter()
                .filter(|(id, o)| **id != args.clientid && o.confirmed && o.owner == owner)
                .map(|(id, _)| *id)
                .collect();
            for id in old {
                purge_client(&mut t, id);
            }
            self.note_released(&t);
        }
        t.next += 1;
        let mut sid = [0u8; 16];
        sid[..8].copy_from_slice(&args.clientid.to_be_bytes());
        sid[8..].copy_from_slice(&t.next.to_be_bytes());
        let res = CreateSessionResOk {
            sessionid: sid,
            sequence: args.sequence,
            // No persistent reply cache, no RDMA mode switch of the
            // connection.
            flags: if back.is_some() {
                session_flags::CONN_BACK_CHAN
            } else {
                0
            },
            fore_chan_attrs: fore.clone(),
            back_chan_attrs: args.back_chan_attrs.clone(),
        };
        t.sessions.insert(
            sid,
            Session {
                client: args.clientid,
                slots: vec![
                    Slot {
                        seqid: 0,
                        reply: SlotReply::Empty
                    };
                    fore.maxrequests as usize
                ],
                fore,
                back,
            },
        );
        let c = t.clients.get_mut(&args.clientid).expect("checked above");
        c.confirmed = true;
        c.cs_seq = args.sequence;
        c.cs_reply = Some(res.clone());
        c.renewed = Instant::now();
        Ok(res)
    }

    /// DESTROY_SESSION.
    pub fn destroy_session(&self, sid: &SessionId4) -> Result<(), Status> {
        let mut t = self.lock();
        t.sessions.remove(sid).map(|_| ()).ok_or(Status::BADSESSION)
    }

    /// DESTROY_CLIENTID: only a client with no sessions and no state.
    pub fn destroy_clientid(&self, id: u64) -> Result<(), Status> {
        let mut t = self.lock();
        if !t.clients.contains_key(&id) {
            return Err(Status::STALE_CLIENTID);
        }
        if self.has_state(&t, id) {
            return Err(Status::CLIENTID_BUSY);
        }
        t.clients.remove(&id);
        Ok(())
    }

    /// The session's client, if the session exists.
    pub fn session_client(&self, sid: &SessionId4) -> Option<u64> {
        self.lock().sessions.get(sid).map(|s| s.client)
    }

    // ---- the backchannel -----------------------------------------------------

    /// BIND_CONN_TO_SESSION for the backchannel: `conn` carries the
    /// session's callbacks from now on. `Ok(false)` when the session was
    /// not granted a backchannel at CREATE_SESSION (no program to call).
    pub fn bind_back(&self, sid: &SessionId4, conn: &Arc<BackConn>) -> Result<bool, Status> {
        let mut t = self.lock();
        let s = t.sessions.get_mut(sid).ok_or(Status::BADSESSION)?;
        match s.back.as_mut() {
            Some(b) => {
                b.bind(conn);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// BACKCHANNEL_CTL: the program and credential of the session's calls
    /// back (a session granted no backchannel has none to change).
    pub fn set_back_program(
        &self,
        sid: &SessionId4,
        program: u32,
        cred: nfsrdma_xdr::rpc::OpaqueAuth,
    ) {
        if let Some(b) = self
            .lock()
            .sessions
            .get_mut(sid)
            .and_then(|s| s.back.as_mut())
        {
            b.program = program;
            b.cred = cred;
        }
    }

    /// Changes the session's backchannel, if it has one.
    fn with_back(&self, sid: &SessionId4, f: impl FnOnce(&mut Back)) {
        if let Some(b) = self
            .lock()
            .sessions
            .get_mut(sid)
            .and_then(|s| s.back.as_mut())
        {
            f(b);
        }
    }

    /// What the last call on the session's backchannel found.
    pub fn set_back_path(&self, sid: &SessionId4, path: Path) {
        self.with_back(sid, |b| b.path = path);
    }

    /// The path's state, if the session has a backchannel.
    pub fn back_path(&self, sid: &SessionId4) -> Option<Path> {
        self.lock()
            .sessions
            .get(sid)
            .and_then(|s| s.back.as_ref())
            .map(|b| b.path)
    }

    /// The sequence id the backchannel's slot takes next, and the
    /// session's minor version. The slot moves on only once the client
    /// has taken a call in it ([`State4::back_seq_done`]): a call it never
    /// saw (no reply, or an error from CB_SEQUENCE) leaves the same id for
    /// the next.
    pub fn next_back_seq(&self, sid: &SessionId4) -> Option<(u32, u32)> {
        let t = self.lock();
        let b = t.sessions.get(sid)?.back.as_ref()?;
        Some((b.seq.wrapping_add(1), b.minor))
    }

    /// The client's CB_SEQUENCE took sequence id `seq` of the slot.
    pub fn back_seq_done(&self, sid: &SessionId4, seq: u32) {
        self.with_back(sid, |b| b.seq = seq);
    }

    /// Where a call on the session's backchannel goes: the connection, the
    /// callback program and the credential.
    pub fn back_target(
        &self,
        sid: &SessionId4,
    ) -> Option<(Arc<BackConn>, u32, nfsrdma_xdr::rpc::OpaqueAuth)> {
        let t = self.lock();
        let b = t.sessions.get(sid)?.back.as_ref()?;
        Some((b.conn()?, b.program, b.cred.clone()))
    }

    /// RECLAIM_COMPLETE (whole-client form).
    pub fn reclaim_complete(&self, client: u64) -> Result<(), Status> {
        let mut t = self.lock();
        let c = t.clients.get_mut(&client).ok_or(Status::STALE_CLIENTID)?;
        if c.reclaim_complete {
            return Err(Status::COMPLETE_ALREADY);
        }
        c.reclaim_complete = true;
        let owner = c.owner.clone();
        if let Some(g) = t.grace.as_mut() {
            if g.waiting.remove(&owner) && g.waiting.is_empty() {
                tracing::info!("NFSv4 grace period over: every client reclaimed");
            }
        }
        Ok(())
    }

    // ---- SEQUENCE and the slot table -----------------------------------------

    /// SEQUENCE's checks (RFC 8881 §2.10.6.1): the session, the slot, the
    /// sequence id; renews the lease.
    /// `now` renews the lease.
    pub fn sequence(
        &self,
        sid: &SessionId4,
        slot: u32,
        seqid: u32,
        ops: usize,
        request_len: usize,
        now: Instant,
    ) -> Result<SlotCheck, Status> {
        let mut t = self.lock();
        let Some(s) = t.sessions.get_mut(sid) else {
            return Err(Status::BADSESSION);
        };
        let nslots = s.slots.len() as u32;
        if ops > s.fore.maxoperations as usize {
            return Err(Status::TOO_MANY_OPS);
        }
        if request_len > s.fore.maxrequestsize as usize {
            return Err(Status::REQ_TOO_BIG);
        }
        let client = s.client;
        let (max_response, max_cached) = (s.fore.maxresponsesize, s.fore.maxresponsesize_cached);
        let status_flags = s.back.as_ref().map_or(0, Back::status_flags);
        let Some(sl) = s.slots.get_mut(slot as usize) else {
            return Err(Status::BADSLOT);
        };
        let out = if seqid == sl.seqid.wrapping_add(1) {
            sl.seqid = seqid;
            sl.reply = SlotReply::InProgress;
            SlotCheck::New {
                slots: nslots,
                client,
                max_response,
                max_cached,
                status_flags,
            }
        } else if seqid == sl.seqid {
            match &sl.reply {
                SlotReply::InProgress => return Err(Status::DELAY),
                SlotReply::Cached(r) => SlotCheck::Replay(r.clone()),
                SlotReply::Uncached => return Err(Status::RETRY_UNCACHED_REP),
                SlotReply::Empty => return Err(Status::SEQ_MISORDERED),
            }
        } else {
            return Err(Status::SEQ_MISORDERED);
        };
        let mut out = out;
        if let Some(c) = t.clients.get_mut(&client) {
            c.renewed = now;
            if c.revoked > 0 {
                if let SlotCheck::New { status_flags, .. } = &mut out {
                    *status_flags |= nfsrdma_xdr::nfs4::seq_status::RECALLABLE_STATE_REVOKED;
                }
            }
        }
        Ok(out)
    }

    /// Records a slot's reply when its request is done: the whole reply
    /// when the client asked for it and it fits the session's cache limit
    /// (the caller checked), the fact alone otherwise.
    pub fn slot_done(&self, sid: &SessionId4, slot: u32, reply: Option<Compound4Res>) {
        let mut t = self.lock();
        if let Some(sl) = t
            .sessions
            .get_mut(sid)
            .and_then(|s| s.slots.get_mut(slot as usize))
        {
            sl.reply = match reply {
                Some(r) => SlotReply::Cached(r),
                None => SlotReply::Uncached,
            };
        }
    }

    // ---- opens ---------------------------------------------------------------

    /// OPEN: checks the share reservations of other owners, then creates
    /// or upgrades the owner's open of the file.
    pub fn open(&self, r: &OpenRequest) -> Result<Stateid4, Status> {
        let mut t = self.lock();
        let mut mine = None;
        for other in t.by_file.get(&r.file).into_iter().flatten() {
            let e = &t.states[other];
            let Kind::Open { access, deny } = e.kind else {
                continue;
            };
            if e.client == r.client && e.owner.as_ref() == r.owner {
                mine = Some(*other);
                continue;
            }
            if access & r.deny != 0 || deny & r.access != 0 {
                return Err(Status::SHARE_DENIED);
            }
        }
        let other = match mine {
            Some(o) => {
                let e = t.states.get_mut(&o).expect("listed by file");
                if let Kind::Open { access, deny } = &mut e.kind {
                    *access |= r.access;
                    *deny |= r.deny;
                }
                e.seqid = e.seqid.wrapping_add(1).max(1);
                o
            }
            None => {
                let o = self.new_other(&mut t);
                t.states.insert(
                    o,
                    StateEntry {
                        client: r.client,
                        owner: Bytes::copy_from_slice(r.owner),
                        file: r.file,
                        seqid: 1,
                        kind: Kind::Open {
                            access: r.access,
                            deny: r.deny,
                        },
                    },
                );
                t.by_file.entry(r.file).or_default().push(o);
                o
            }
        };
        Ok(Stateid4 {
            seqid: t.states[&other].seqid,
            other,
        })
    }

    /// Finds a stateid of `client` for `file` (RFC 8881 §8.2.4 checks:
    /// BAD_STATEID for one this server never gave or one of another file,
    /// OLD_STATEID for an older seqid; seqid 0 means "the current one").
    fn check<'t>(
        &self,
        t: &'t Tables,
        client: Option<u64>,
        sid: &Stateid4,
        file: Option<FileKey>,
    ) -> Result<&'t StateEntry, Status> {
        if sid.other[..4] != self.boot.to_be_bytes() {
            return Err(if sid.other[..4] == [0; 4] {
                Status::BAD_STATEID
            } else {
                Status::STALE_STATEID
            });
        }
        let e = t.states.get(&sid.other).ok_or(Status::BAD_STATEID)?;
        if client.is_some_and(|c| c != e.client) || file.is_some_and(|f| f != e.file) {
            return Err(Status::BAD_STATEID);
        }
        if matches!(e.kind, Kind::Revoked) {
            return Err(Status::DELEG_REVOKED);
        }
        if sid.seqid != 0 && sid.seqid != e.seqid {
            return Err(if sid.seqid < e.seqid {
                Status::OLD_STATEID
            } else {
                Status::BAD_STATEID
            });
        }
        Ok(e)
    }

    /// CLOSE: the open goes, with its owner's locks on the file
    /// (NFS4ERR_LOCKS_HELD if any are left).
    pub fn close(&self, client: u64, sid: &Stateid4, file: FileKey) -> Result<Stateid4, Status> {
        let mut t = self.lock();
        let e = self.check(&t, Some(client), sid, Some(file))?;
        if !matches!(e.kind, Kind::Open { .. }) {
            return Err(Status::BAD_STATEID);
        }
        let held = t.locks.get(&file).is_some_and(|rs| {
            rs.iter().any(|r| {
                t.states
                    .get(&r.state)
                    .is_some_and(|l| matches!(l.kind, Kind::Lock { open } if open == sid.other))
            })
        });
        if held {
            return Err(Status::LOCKS_HELD);
        }
        // The open's lock stateids (with no locks left) go with it.
        let lock_states: Vec<[u8; 12]> = t
            .states
            .iter()
            .filter(|(_, s)| matches!(s.kind, Kind::Lock { open } if open == sid.other))
            .map(|(o, _)| *o)
            .collect();
        for o in lock_states.iter().chain([&sid.other]) {
            remove_state(&mut t, o);
        }
        self.note_released(&t);
        // The stateid CLOSE returns is meaningless (RFC 8881 §18.2.4): the
        // invalid special one, as the Linux nfsd sends.
        Ok(Stateid4::INVALID)
    }

    /// OPEN_DOWNGRADE: the access and deny must be subsets of the open's.
    pub fn downgrade(
        &self,
        client: u64,
        sid: &Stateid4,
        file: FileKey,
        access: u32,
        deny: u32,
    ) -> Result<Stateid4, Status> {
        let mut t = self.lock();
        self.check(&t, Some(client), sid, Some(file))?;
        let e = t.states.get_mut(&sid.other).expect("checked");
        let Kind::Open { access: a, deny: d } = &mut e.kind else {
            return Err(Status::BAD_STATEID);
        };
        if access & !*a != 0 || deny & !*d != 0 || access & share::ACCESS_BOTH == 0 {
            return Err(Status::INVAL);
        }
        *a = access;
        *d = deny;
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other: sid.other,
        })
    }

    /// Whether I/O of `write` kind with `sid` on `file` is allowed: a
    /// special stateid (anonymous I/O, checked against others' deny
    /// reservations), or an open or lock stateid of the file whose open
    /// has the access.
    pub fn check_io(
        &self,
        client: Option<u64>,
        sid: &Stateid4,
        file: FileKey,
        write: bool,
    ) -> Result<(), Status> {
        let t = self.lock();
        let want = if write {
            share::ACCESS_WRITE
        } else {
            share::ACCESS_READ
        };
        if sid.is_special() {
            if *sid != Stateid4::ANONYMOUS && *sid != Stateid4::BYPASS {
                return Err(Status::BAD_STATEID);
            }
            let denied =
                t.by_file.get(&file).into_iter().flatten().any(
                    |o| matches!(t.states[o].kind, Kind::Open { deny, .. } if deny & want != 0),
                );
            return if denied { Err(Status::LOCKED) } else { Ok(()) };
        }
        let e = self.check(&t, client, sid, Some(file))?;
        let open = match &e.kind {
            Kind::Open { .. } => e,
            Kind::Lock { open } => t.states.get(open).ok_or(Status::BAD_STATEID)?,
            // A read delegation reads, a write delegation reads and writes.
            Kind::Deleg(d) if d.write || !write => return Ok(()),
            Kind::Deleg(_) => return Err(Status::OPENMODE),
            Kind::Revoked => return Err(Status::DELEG_REVOKED),
        };
        match open.kind {
            Kind::Open { access, .. } if access & want != 0 => {}
            // Reading with a write-only open is allowed (RFC 8881 §9.1.2).
            Kind::Open { access, .. } if !write && access & share::ACCESS_WRITE != 0 => {}
            _ => return Err(Status::OPENMODE),
        }
        // Mandatory locks are not enforced: byte-range locks are advisory,
        // as on the Linux nfsd.
        Ok(())
    }

    // ---- delegations ------------------------------------------------------------

    /// Delegations out now (without the lock: a fast "none" for the paths
    /// that would otherwise look for conflicts on every call).
    pub fn delegations(&self) -> usize {
        self.delegs.load(Ordering::Relaxed)
    }

    /// A delegation of `file` for `client`, granted on `session`, if
    /// nothing stands against it: a write delegation only when no other
    /// client has the file open or delegated, a read one when none has it
    /// open for writing or holds a write delegation; none while a recall
    /// of the file's delegations is under way, none when the client holds
    /// one of the file already, and none unless the session's backchannel
    /// answered its last call (the recall must be able to reach it).
    /// `initial`: the file's change attribute and size now (for a write
    /// delegation's CB_GETATTR).
    pub fn grant_delegation(
        &self,
        client: u64,
        session: &SessionId4,
        file: FileKey,
        fh: &[u8],
        write: bool,
        initial: (u64, u64),
    ) -> Option<Granted> {
        self.delegate(client, session, file, fh, write, initial, false)
    }

    /// A delegation of `file` the client held before a restart, granted
    /// again at its reclaiming OPEN, with the state of the session's
    /// backchannel (`Down` also when it has none): whatever that state,
    /// as long as nothing else stands against it (in the grace period,
    /// only other reclaims can).
    pub fn reclaim_delegation(
        &self,
        client: u64,
        session: &SessionId4,
        file: FileKey,
        fh: &[u8],
        write: bool,
        initial: (u64, u64),
    ) -> Option<Granted> {
        self.delegate(client, session, file, fh, write, initial, true)
    }

    /// [`State4::grant_delegation`], and with `reclaim` whatever the
    /// backchannel's state: the delegation and that state.
    #[allow(clippy::too_many_arguments)]
    fn delegate(
        &self,
        client: u64,
        session: &SessionId4,
        file: FileKey,
        fh: &[u8],
        write: bool,
        initial: (u64, u64),
        reclaim: bool,
    ) -> Option<Granted> {
        let mut t = self.lock();
        let (path, over_rdma) = match t.sessions.get(session).and_then(|s| s.back.as_ref()) {
            Some(b) => match b.conn() {
                Some(c) => (b.path, c.transport() == Transport::Rdma),
                None => (Path::Down, false),
            },
            None => (Path::Down, false),
        };
        if path != Path::Up && !reclaim {
            return None;
        }
        let g = Deleg {
            write,
            session: *session,
            fh: Bytes::copy_from_slice(fh),
            recalled: None,
            resend: false,
            over_rdma,
            held: write.then_some(HeldAttrs {
                last: initial,
                modified: false,
                touch: false,
                answered: None,
                asking: false,
                failed: false,
            }),
        };
        let stateid = Self::insert_delegation(&mut t, self, client, file, g)?;
        Some(Granted {
            stateid,
            path,
            over_rdma,
        })
    }

    /// Records a delegation unless another client's state, or one of the
    /// client's own delegations of the file, stands against it.
    fn insert_delegation(
        t: &mut Tables,
        this: &State4,
        client: u64,
        file: FileKey,
        g: Deleg,
    ) -> Option<Stateid4> {
        let write = g.write;
        for o in t.by_file.get(&file).into_iter().flatten() {
            let e = &t.states[o];
            let blocks = match &e.kind {
                Kind::Deleg(d) => e.client == client || d.write || write || d.recalled.is_some(),
                Kind::Open { access, .. } if e.client != client => {
                    write || access & share::ACCESS_WRITE != 0
                }
                _ => false,
            };
            if blocks {
                return None;
            }
        }
        let other = this.new_other(t);
        t.states.insert(
            other,
            StateEntry {
                client,
                owner: Bytes::new(),
                file,
                seqid: 1,
                kind: Kind::Deleg(g),
            },
        );
        t.by_file.entry(file).or_default().push(other);
        t.delegs.fetch_add(1, Ordering::Relaxed);
        Some(Stateid4 { seqid: 1, other })
    }

    /// The delegations of clients other than `client` (`None`: a caller
    /// with no NFSv4 client, NFSv3) that an access to `file` conflicts
    /// with: any delegation for a write (or a change of the file's name or
    /// attributes), a write delegation for a read. Each is marked recalled
    /// the first time; one recalled more than a lease ago is revoked.
    pub fn delegation_conflict(
        &self,
        client: Option<u64>,
        file: FileKey,
        write: bool,
        now: Instant,
    ) -> Conflict {
        let mut out = Conflict::default();
        if self.delegations() == 0 {
            return out;
        }
        let mut t = self.lock();
        let Some(list) = t.by_file.get(&file).cloned() else {
            return out;
        };
        let mut revoke = Vec::new();
        for o in list {
            let e = t.states.get_mut(&o).expect("listed by file");
            let Kind::Deleg(d) = &mut e.kind else {
                continue;
            };
            if Some(e.client) == client || !(write || d.write) {
                continue;
            }
            if d.recalled
                .is_some_and(|at| now.saturating_duration_since(at) > self.lease)
            {
                revoke.push(o);
                continue;
            }
            if d.recalled.is_none() || d.resend {
                d.recalled = d.recalled.or(Some(now));
                d.resend = false;
                out.recall.push(Recall {
                    session: d.session,
                    stateid: Stateid4 {
                        seqid: e.seqid,
                        other: o,
                    },
                    fh: d.fh.clone(),
                    over_rdma: d.over_rdma,
                });
            }
            out.wait = true;
        }
        for o in revoke {
            if let Some(over_rdma) = self.revoke(&mut t, &o) {
                out.revoked += 1;
                out.revoked_over_rdma += usize::from(over_rdma);
            }
        }
        // The session the recall goes on: the one the delegation came
        // with, or another of the client's with a backchannel.
        for r in &mut out.recall {
            let has_back = |s: &Session| s.back.as_ref().is_some_and(|b| b.conn().is_some());
            if !t.sessions.get(&r.session).is_some_and(has_back) {
                let client = t.states[&r.stateid.other].client;
                if let Some((sid, _)) = t
                    .sessions
                    .iter()
                    .find(|(_, s)| s.client == client && has_back(s))
                {
                    r.session = *sid;
                }
            }
        }
        out
    }

    /// What a GETATTR of `file` by `client` (its size or change) finds of
    /// another client's write delegation of it: an answer of its holder
    /// given less than `fresh` before `now`, a CB_GETATTR out, or the
    /// holder to ask (the delegation is marked as asked, so one goes out
    /// at a time).
    pub fn held_attrs(
        &self,
        client: Option<u64>,
        file: FileKey,
        now: Instant,
        fresh: Duration,
    ) -> HeldView {
        if self.delegations() == 0 {
            return HeldView::None;
        }
        let mut t = self.lock();
        let Some(list) = t.by_file.get(&file).cloned() else {
            return HeldView::None;
        };
        for o in list {
            let e = t.states.get_mut(&o).expect("listed by file");
            let Kind::Deleg(d) = &mut e.kind else {
                continue;
            };
            if Some(e.client) == client || d.recalled.is_some() {
                continue;
            }
            let Some(h) = &mut d.held else {
                continue;
            };
            return if h.failed {
                HeldView::Recall
            } else if h
                .answered
                .is_some_and(|at| now.saturating_duration_since(at) < fresh)
            {
                HeldView::Answered {
                    modified: h.modified,
                    size: h.last.1,
                    touch: std::mem::take(&mut h.touch),
                }
            } else if h.asking {
                HeldView::Asking
            } else {
                h.asking = true;
                HeldView::Ask {
                    session: d.session,
                    other: o,
                    fh: d.fh.clone(),
                }
            };
        }
        HeldView::None
    }

    /// The answer to a CB_GETATTR of the delegation `other`: the change
    /// attribute and size its holder gave (`None`: the call failed, or
    /// the answer lacked them), at `now`: whether it says the holder
    /// changed the file since its answer before (or the grant).
    pub fn held_answered(
        &self,
        other: &[u8; 12],
        answer: Option<(u64, u64)>,
        now: Instant,
    ) -> bool {
        let mut t = self.lock();
        let Some(StateEntry {
            kind: Kind::Deleg(Deleg { held: Some(h), .. }),
            ..
        }) = t.states.get_mut(other)
        else {
            return false;
        };
        h.asking = false;
        match answer {
            Some((change, size)) => {
                let changed = (change, size) != h.last;
                if changed {
                    h.last = (change, size);
                    h.modified = true;
                    h.touch = true;
                }
                h.answered = Some(now);
                changed
            }
            None => {
                h.failed = true;
                false
            }
        }
    }

    /// A recall of the delegation `other` failed (no backchannel, no
    /// answer, an error): the next conflicting call sends it again. The
    /// lease after the first recall still runs.
    pub fn recall_failed(&self, other: &[u8; 12]) {
        if let Some(StateEntry {
            kind: Kind::Deleg(d),
            ..
        }) = self.lock().states.get_mut(other)
        {
            d.resend = true;
        }
    }

    /// Revokes a delegation: the stateid stays, as revoked, until its
    /// client frees it. Whether it was granted over RDMA (`None`: no such
    /// delegation).
    fn revoke(&self, t: &mut Tables, other: &[u8; 12]) -> Option<bool> {
        let e = t.states.get_mut(other)?;
        let Kind::Deleg(d) = &e.kind else {
            return None;
        };
        let over_rdma = d.over_rdma;
        e.kind = Kind::Revoked;
        let (client, file) = (e.client, e.file);
        t.delegs.fetch_sub(1, Ordering::Relaxed);
        if let Some(v) = t.by_file.get_mut(&file) {
            v.retain(|o| o != other);
            if v.is_empty() {
                t.by_file.remove(&file);
            }
        }
        if let Some(c) = t.clients.get_mut(&client) {
            c.revoked += 1;
        }
        tracing::info!(
            clientid = format_args!("{client:#x}"),
            "NFSv4 delegation revoked: its recall went unanswered for a lease"
        );
        Some(over_rdma)
    }

    /// DELEGRETURN: the delegation goes. Whether it was granted over RDMA.
    pub fn delegreturn(&self, client: u64, sid: &Stateid4, file: FileKey) -> Result<bool, Status> {
        let mut t = self.lock();
        let e = self.check(&t, Some(client), sid, Some(file))?;
        let Kind::Deleg(d) = &e.kind else {
            return Err(Status::BAD_STATEID);
        };
        let over_rdma = d.over_rdma;
        remove_state(&mut t, &sid.other);
        Ok(over_rdma)
    }

    /// Whether `sid` is a delegation of `client` for `file` (an OPEN that
    /// claims it: CLAIM_DELEGATE_CUR, CLAIM_DELEG_CUR_FH).
    pub fn holds_delegation(
        &self,
        client: u64,
        sid: &Stateid4,
        file: FileKey,
    ) -> Result<(), Status> {
        let t = self.lock();
        let e = self.check(&t, Some(client), sid, Some(file))?;
        match e.kind {
            Kind::Deleg(_) => Ok(()),
            _ => Err(Status::BAD_STATEID),
        }
    }

    // ---- byte-range locks ------------------------------------------------------

    fn conflict(&self, t: &Tables, file: FileKey, w: Want) -> Option<LockDenied> {
        t.locks.get(&file)?.iter().find_map(|r| {
            let overlaps = r.start < w.end && w.start < r.end;
            let same_owner = r.client == w.client && r.owner.as_ref() == w.owner;
            (overlaps && !same_owner && (w.write || r.write)).then(|| LockDenied {
                offset: r.start,
                length: if r.end == u64::MAX {
                    u64::MAX
                } else {
                    r.end - r.start
                },
                locktype: if r.write {
                    LockType4::Write
                } else {
                    LockType4::Read
                },
                owner: StateOwner4 {
                    clientid: r.client,
                    owner: Opaque4(r.owner.clone()),
                },
            })
        })
    }

    /// LOCK. `from_open` is `Some((open stateid, new lock owner))` for
    /// `open_to_lock_owner4`, `None` with `lock_sid` for an existing one.
    /// `Err(Ok(denied))` when another owner holds a conflicting lock.
    #[allow(clippy::too_many_arguments)]
    pub fn lock_range(
        &self,
        client: u64,
        file: FileKey,
        from_open: Option<(&Stateid4, &[u8])>,
        lock_sid: &Stateid4,
        locktype: LockType4,
        offset: u64,
        length: u64,
    ) -> Result<Stateid4, Result<LockDenied, Status>> {
        let end = end_of(offset, length).map_err(Err)?;
        let mut t = self.lock();
        let (other, owner) = match from_open {
            Some((open_sid, owner)) => {
                let e = self
                    .check(&t, Some(client), open_sid, Some(file))
                    .map_err(Err)?;
                if !matches!(e.kind, Kind::Open { .. }) {
                    return Err(Err(Status::BAD_STATEID));
                }
                // An owner that already has a lock stateid for this open
                // keeps it.
                let existing = t.states.iter().find(|(_, s)| {
                    s.client == client
                        && s.owner.as_ref() == owner
                        && matches!(s.kind, Kind::Lock { open } if open == open_sid.other)
                });
                match existing {
                    Some((o, _)) => (*o, Bytes::copy_from_slice(owner)),
                    None => {
                        let o = self.new_other(&mut t);
                        t.states.insert(
                            o,
                            StateEntry {
                                client,
                                owner: Bytes::copy_from_slice(owner),
                                file,
                                seqid: 0,
                                kind: Kind::Lock {
                                    open: open_sid.other,
                                },
                            },
                        );
                        t.by_file.entry(file).or_default().push(o);
                        (o, Bytes::copy_from_slice(owner))
                    }
                }
            }
            None => {
                let e = self
                    .check(&t, Some(client), lock_sid, Some(file))
                    .map_err(Err)?;
                if !matches!(e.kind, Kind::Lock { .. }) {
                    return Err(Err(Status::BAD_STATEID));
                }
                (lock_sid.other, e.owner.clone())
            }
        };
        let write = locktype.is_write();
        let want = Want {
            client,
            owner: &owner,
            write,
            start: offset,
            end,
        };
        if let Some(d) = self.conflict(&t, file, want) {
            return Err(Ok(d));
        }
        let ranges = t.locks.entry(file).or_default();
        set_range(ranges, other, client, &owner, Some(write), offset, end);
        let e = t.states.get_mut(&other).expect("made or checked above");
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other,
        })
    }

    /// LOCKT.
    pub fn test_lock(
        &self,
        client: u64,
        file: FileKey,
        owner: &[u8],
        locktype: LockType4,
        offset: u64,
        length: u64,
    ) -> Result<(), Result<LockDenied, Status>> {
        let end = end_of(offset, length).map_err(Err)?;
        let t = self.lock();
        let want = Want {
            client,
            owner,
            write: locktype.is_write(),
            start: offset,
            end,
        };
        match self.conflict(&t, file, want) {
            Some(d) => Err(Ok(d)),
            None => Ok(()),
        }
    }

    /// LOCKU.
    pub fn unlock(
        &self,
        client: u64,
        file: FileKey,
        sid: &Stateid4,
        offset: u64,
        length: u64,
    ) -> Result<Stateid4, Status> {
        let end = end_of(offset, length)?;
        let mut t = self.lock();
        let e = self.check(&t, Some(client), sid, Some(file))?;
        if !matches!(e.kind, Kind::Lock { .. }) {
            return Err(Status::BAD_STATEID);
        }
        let owner = e.owner.clone();
        if let Some(ranges) = t.locks.get_mut(&file) {
            set_range(ranges, sid.other, client, &owner, None, offset, end);
        }
        let e = t.states.get_mut(&sid.other).expect("checked");
        e.seqid = e.seqid.wrapping_add(1).max(1);
        Ok(Stateid4 {
            seqid: e.seqid,
            other: sid.other,
        })
    }

    /// FREE_STATEID: a lock stateid with no locks (an open stateid is
    /// freed by CLOSE: NFS4ERR_LOCKS_HELD for one with locks, else it goes).
    pub fn free_stateid(&self, client: u64, sid: &Stateid4) -> Result<(), Status> {
        let mut t = self.lock();
        // A revoked delegation: freeing it is how the client says it knows.
        if t.states
            .get(&sid.other)
            .is_some_and(|e| e.client == client && matches!(e.kind, Kind::Revoked))
        {
            t.states.remove(&sid.other);
            if let Some(c) = t.clients.get_mut(&client) {
                c.revoked = c.revoked.saturating_sub(1);
            }
            return Ok(());
        }
        let e = self.check(
            &t,
            Some(client),
            &Stateid4 {
                seqid: 0,
                other: sid.other,
            },
            None,
        )?;
        let file = e.file;
        match e.kind {
            Kind::Lock { .. } => {
                if t.locks
                    .get(&file)
                    .is_some_and(|rs| rs.iter().any(|r| r.state == sid.other))
                {
                    return Err(Status::LOCKS_HELD);
                }
            }
            Kind::Open { .. } => return Err(Status::LOCKS_HELD),
            // Returned with DELEGRETURN, not freed.
            Kind::Deleg(_) => return Err(Status::LOCKS_HELD),
            Kind::Revoked => unreachable!("revoked stateids are freed above"),
        }
        remove_state(&mut t, &sid.other);
        self.note_released(&t);
        Ok(())
    }

    /// TEST_STATEID: each stateid's status for `client`.
    pub fn test_stateid(&self, client: u64, sid: &Stateid4) -> Status {
        let t = self.lock();
        if sid.is_special() {
            return Status::BAD_STATEID;
        }
        match self.check(&t, Some(client), sid, None) {
            Ok(_) => Status::OK,
            Err(e) => e,
        }
    }

    /// Whether any client holds `file` open.
    pub fn is_open(&self, file: FileKey) -> bool {
        is_open(&self.lock(), file)
    }

    /// The files whose last open went since the last call (an atomic load
    /// when there are none).
    pub fn take_released(&self) -> Vec<FileKey> {
        if !self.released_any.load(Ordering::Acquire) {
            return Vec::new();
        }
        let mut t = self.lock();
        self.released_any.store(false, Ordering::Release);
        std::mem::take(&mut t.released)
    }

    /// Number of clients, sessions and stateids (for tests and reports).
    pub fn counts(&self) -> (usize, usize, usize) {
        let t = self.lock();
        (t.clients.len(), t.sessions.len(), t.states.len())
    }

    /// Makes a client's lease look `by` older (tests of expiry).
    #[doc(hidden)]
    pub fn age_client(&self, client: u64, by: Duration) {
        let mut t = self.lock();
        if let Some(c) = t.clients.get_mut(&client) {
            c.renewed -= by;
        }
        t.last_sweep = None;
        self.swept_at.store(NEVER, Ordering::Relaxed);
    }
}

/// A lock owner of NFSv3's lock manager: a client host (numbered by
/// `service::nlm`) and the owner id it sends (`svid`, the process on
/// Linux). Its ranges sit in the same table as the v4 owners'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NlmOwner {
    /// The host's number.
    pub host: u32,
    /// The owner on that host.
    pub svid: i32,
}

/// The high half of the client ids the lock manager's owners take in the
/// lock table (v4 client ids start with the instance's `boot`, never all
/// ones).
const NLM_CLIENTS: u64 = 0xffff_ffff_0000_0000;

/// The lock manager's host behind a lock table client id, if it is one.
fn nlm_host(client: u64) -> Option<u32> {
    (client & NLM_CLIENTS == NLM_CLIENTS).then_some(client as u32)
}

impl NlmOwner {
    fn client(self) -> u64 {
        NLM_CLIENTS | u64::from(self.host)
    }

    fn owner(self) -> Bytes {
        Bytes::copy_from_slice(&self.svid.to_be_bytes())
    }

    /// The key of its ranges: all ones, then host and svid (a v4 stateid's
    /// `other` starts with the instance's `boot`, which is never all ones).
    fn state(self) -> [u8; 12] {
        let mut o = [0xff; 12];
        o[4..8].copy_from_slice(&self.host.to_be_bytes());
        o[8..].copy_from_slice(&self.svid.to_be_bytes());
        o
    }

    /// The lock manager's owner a conflicting lock belongs to, if it is one
    /// of them (TEST reports its svid).
    pub fn of(denied: &LockDenied) -> Option<NlmOwner> {
        let c = denied.owner.clientid;
        let svid: [u8; 4] = denied.owner.owner.0.as_ref().try_into().ok()?;
        nlm_host(c).map(|host| NlmOwner {
            host,
            svid: i32::from_be_bytes(svid),
        })
    }
}

/// The lock manager's side of the table (NFSv3 NLM): ranges are
/// `[start, end)` with `end` `u64::MAX` for "to the end of the file".
impl State4 {
    fn nlm_want(o: NlmOwner, owner: &[u8], write: bool, start: u64, end: u64) -> Want<'_> {
        Want {
            client: o.client(),
            owner,
            write,
            start,
            end,
        }
    }

    /// Takes (or changes, POSIX-style: the new type replaces the old over
    /// the range) a lock of `o`, unless another owner's conflicts.
    pub fn nlm_lock(
        &self,
        o: NlmOwner,
        file: FileKey,
        write: bool,
        start: u64,
        end: u64,
    ) -> Result<(), LockDenied> {
        let owner = o.owner();
        let mut t = self.lock();
        if let Some(d) = self.conflict(&t, file, Self::nlm_want(o, &owner, write, start, end)) {
            return Err(d);
        }
        let ranges = t.locks.entry(file).or_default();
        set_range(
            ranges,
            o.state(),
            o.client(),
            &owner,
            Some(write),
            start,
            end,
        );
        Ok(())
    }

    /// The lock that would keep `o` from locking, if any.
    pub fn nlm_test(
        &self,
        o: NlmOwner,
        file: FileKey,
        write: bool,
        start: u64,
        end: u64,
    ) -> Option<LockDenied> {
        let owner = o.owner();
        let t = self.lock();
        self.conflict(&t, file, Self::nlm_want(o, &owner, write, start, end))
    }

    /// Releases `o`'s locks over `[start, end)` of `file`.
    pub fn nlm_unlock(&self, o: NlmOwner, file: FileKey, start: u64, end: u64) {
        let mut t = self.lock();
        if let Some(ranges) = t.locks.get_mut(&file) {
            set_range(ranges, o.state(), o.client(), &o.owner(), None, start, end);
            if ranges.is_empty() {
                t.locks.remove(&file);
            }
        }
    }

    /// Releases every lock of the hosts for which `gone` is true; the
    /// number of ranges released.
    pub fn nlm_release_hosts(&self, gone: impl Fn(u32) -> bool) -> usize {
        let mut t = self.lock();
        let mut n = 0;
        t.locks.retain(|_, rs| {
            let before = rs.len();
            rs.retain(|r| !nlm_host(r.client).is_some_and(&gone));
            n += before - rs.len();
            !rs.is_empty()
        });
        n
    }

    /// Whether any lock manager owner holds a lock on `file`.
    pub fn nlm_file_locked(&self, file: FileKey) -> bool {
        let t = self.lock();
        t.locks
            .get(&file)
            .is_some_and(|rs| rs.iter().any(|r| nlm_host(r.client).is_some()))
    }

    /// The files on which the hosts `of` picks hold locks.
    pub fn nlm_files_of(&self, of: impl Fn(u32) -> bool) -> Vec<FileKey> {
        let t = self.lock();
        t.locks
            .iter()
            .filter(|(_, rs)| rs.iter().any(|r| nlm_host(r.client).is_some_and(&of)))
            .map(|(f, _)| *f)
            .collect()
    }

    /// The hosts that hold lock manager locks now.
    pub fn nlm_hosts_holding(&self) -> HashSet<u32> {
        let t = self.lock();
        t.locks
            .values()
            .flatten()
            .filter_map(|r| nlm_host(r.client))
            .collect()
    }

    /// Starts the lock manager's grace period (until `until`): new NLM and
    /// NFSv4 locks and opens are refused until then, reclaims allowed.
    pub fn start_nlm_grace(&self, until: Instant) {
        self.lock().nlm_grace = Some(until);
    }

    /// Whether new locks must wait at `now`: either grace period is on.
    pub fn locks_in_grace(&self, now: Instant) -> bool {
        let mut t = self.lock();
        let v4 = grace_on(&mut t, now);
        nlm_grace_on(&mut t, now) || v4
    }
}

fn nlm_grace_on(t: &mut Tables, now: Instant) -> bool {
    match t.nlm_grace {
        Some(until) if now < until => true,
        Some(_) => {
            tracing::info!("NLM grace period over");
            t.nlm_grace = None;
            false
        }
        None => false,
    }
}

/// Sets (`Some(write)`) or clears (`None`) `[start, end)` for one lock
/// stateid, splitting and merging its ranges as POSIX locks do.
fn set_range(
    ranges: &mut Vec<Range>,
    state: [u8; 12],
    client: u64,
    owner: &Bytes,
    write: Option<bool>,
    start: u64,
    end: u64,
) {
    let mut out = Vec::with_capacity(ranges.len() + 2);
    for r in ranges.drain(..) {
        if r.state != state || r.end <= start || end <= r.start {
            out.push(r);
            continue;
        }
        if r.start < start {
            out.push(Range {
                end: start,
                ..r.clone()
            });
        }
        if end < r.end {
            out.push(Range { start: end, ..r });
        }
    }
    if let Some(write) = write {
        out.push(Range {
            state,
            client,
            owner: owner.clone(),
            write,
            start,
            end,
        });
    }
    *ranges = out;
}

fn remove_state(t: &mut Tables, other: &[u8; 12]) {
    if let Some(e) = t.states.remove(other) {
        if matches!(e.kind, Kind::Deleg(_)) {
            t.delegs.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(v) = t.by_file.get_mut(&e.file) {
            v.retain(|o| o != other);
            if v.is_empty() {
                t.by_file.remove(&e.file);
            }
        }
        if matches!(e.kind, Kind::Open { .. }) && !is_open(t, e.file) {
            t.released.push(e.file);
        }
        if let Some(rs) = t.locks.get_mut(&e.file) {
            rs.retain(|r| &r.state != other);
            if rs.is_empty() {
                t.locks.remove(&e.file);
            }
        }
    }
}

fn is_open(t: &Tables, file: FileKey) -> bool {
    t.by_file.get(&file).is_some_and(|v| {
        v.iter()
            .any(|o| matches!(t.states[o].kind, Kind::Open { .. }))
    })
}

fn grace_on(t: &mut Tables, now: Instant) -> bool {
    match &t.grace {
        Some(g) if now < g.until && !g.waiting.is_empty() => true,
        Some(g) => {
            if !g.waiting.is_empty() {
                tracing::info!(
                    unreclaimed = g.waiting.len(),
                    "NFSv4 grace period over: clients that did not reclaim lost their state"
                );
            }
            t.grace = None;
            false
        }
        None => false,
    }
}

fn purge_client(t: &mut Tables, id: u64) {
    t.clients.remove(&id);
    t.sessions.retain(|_, s| s.client != id);
    let mine: Vec<[u8; 12]> = t
        .states
        .iter()
        .filter(|(_, s)| s.client == id)
        .map(|(o, _)| *o)
        .collect();
    for o in mine {
        remove_state(t, &o);
    }
}

/// For tests: a new client `owner` of `state` with one session whose
/// backchannel is on `conn` (its path not yet probed).
#[cfg(test)]
pub(crate) fn session_with_back(
    state: &State4,
    owner: &'static [u8],
    conn: &Arc<BackConn>,
) -> (u64, SessionId4) {
    use nfsrdma_xdr::nfs4::ops::{CallbackSecParms, CreateSessionArgs};
    use nfsrdma_xdr::BoundedVec;
    let (id, seq, _) = state
        .exchange_id(&Opaque4(Bytes::from_static(owner)), [1; 8], None, false)
        .unwrap();
    let attrs = ChannelAttrs4 {
        headerpadsize: 0,
        maxrequestsize: 4096,
        maxresponsesize: 4096,
        maxresponsesize_cached: 0,
        maxoperations: 8,
        maxrequests: 4,
        rdma_ird: BoundedVec(vec![]),
    };
    let args = CreateSessionArgs {
        clientid: id,
        sequence: seq,
        flags: nfsrdma_xdr::nfs4::session_flags::CONN_BACK_CHAN,
        fore_chan_attrs: attrs.clone(),
        back_chan_attrs: attrs,
        cb_program: 0x4000_0001,
        sec_parms: BoundedVec(vec![CallbackSecParms::None]),
    };
    let back = Back::granted(&args, 1, Some(conn));
    assert!(back.is_some());
    let limits = ChannelLimits {
        max_request: 4096,
        max_response: 4096,
        max_cached: 0,
        max_ops: 8,
        max_slots: 4,
    };
    let sid = state
        .create_session(&args, limits, None, back)
        .unwrap()
        .sessionid;
    (id, sid)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client whose lease ran out goes at the first COMPOUND once a
    /// second has passed since the last sweep, and not before (the check
    /// that skips the lock must not skip a due sweep).
    #[test]
    fn a_lapsed_lease_goes_at_the_first_sweep_a_second_after_the_last() {
        // The lease starts within `exchange_id`, a moment after `t0`: the
        // times below hold while that moment is under 0.3 s.
        let s = State4::new(Duration::from_secs(5));
        let t0 = Instant::now();
        let owner = Opaque4(Bytes::from_static(b"client"));
        let (id, _, _) = s.exchange_id(&owner, [1; 8], None, false).unwrap();
        s.sweep(t0 + Duration::from_millis(4500));
        assert_eq!(s.counts().0, 1, "swept within its lease");
        // The lease (5 s) has run out 5.3 s on, but the last sweep was
        // 0.8 s before: not swept yet.
        s.sweep(t0 + Duration::from_millis(5300));
        assert_eq!(s.counts().0, 1, "swept twice within a second");
        s.sweep(t0 + Duration::from_millis(5900));
        assert_eq!(s.counts().0, 0, "client {id:#x} outlived its lease");
    }

    /// A client of `s` with a session whose backchannel, on a connection
    /// of `transport`, answered its probe; the connection is returned
    /// (the session holds it weakly).
    fn client_on(
        s: &State4,
        owner: &'static [u8],
        transport: Transport,
    ) -> (u64, SessionId4, Arc<BackConn>) {
        let conn = BackConn::new(transport, |_| true);
        let (id, sid) = session_with_back(s, owner, &conn);
        s.set_back_path(&sid, Path::Up);
        (id, sid, conn)
    }

    /// Each delegation knows the transport its session's backchannel was
    /// on when it was granted, and its recall, return and revocation say
    /// it: what the per-transport counters count.
    #[test]
    fn a_delegation_carries_the_transport_it_was_granted_over_to_its_recall_return_and_revocation()
    {
        let s = State4::new(Duration::from_secs(5));
        let (rdma, rdma_sid, _c1) = client_on(&s, b"over rdma", Transport::Rdma);
        let (tcp, tcp_sid, _c2) = client_on(&s, b"over tcp", Transport::Tcp);
        let file = (0, Ino::for_test(7));
        let r = s
            .grant_delegation(rdma, &rdma_sid, file, b"fh", false, (0, 0))
            .unwrap();
        let t = s
            .grant_delegation(tcp, &tcp_sid, file, b"fh", false, (0, 0))
            .unwrap();
        assert!(r.over_rdma && !t.over_rdma, "{r:?} {t:?}");
        let t0 = Instant::now();
        let c = s.delegation_conflict(None, file, true, t0);
        let mut recalls: Vec<_> = c
            .recall
            .iter()
            .map(|x| (x.stateid.other, x.over_rdma))
            .collect();
        recalls.sort();
        let mut want = vec![(r.stateid.other, true), (t.stateid.other, false)];
        want.sort();
        assert_eq!(recalls, want);
        assert_eq!(s.delegreturn(tcp, &t.stateid, file), Ok(false));
        // The one over RDMA is not returned: revoked a lease on.
        let c = s.delegation_conflict(None, file, true, t0 + Duration::from_secs(6));
        assert_eq!((c.revoked, c.revoked_over_rdma), (1, 1), "{c:?}");
        // Returned, a delegation granted over RDMA says so.
        let file2 = (0, Ino::for_test(8));
        let r2 = s
            .grant_delegation(rdma, &rdma_sid, file2, b"fh2", true, (0, 0))
            .unwrap();
        assert_eq!(s.delegreturn(rdma, &r2.stateid, file2), Ok(true));
    }
}
