//! The status monitor (NSM version 1, XNFS chapter 11), program 100024, as
//! far as an NFSv3 server needs it:
//!
//! - A state number, odd while the server runs, kept with `--state` and
//!   raised by two at each restart (SM_STAT answers it).
//! - SM_NOTIFY from a client that restarted: its locks, shares and waiting
//!   locks go (matched by the address it calls from, as the Linux lockd
//!   matches by default; the name it gives is logged).
//! - After a restart with `--state`: SM_NOTIFY to every client that held
//!   NLM locks when the previous instance stopped, from the address it
//!   used, naming this server by that address (so its status monitor finds
//!   the server it watches), with the new state number; the clients then
//!   reclaim their locks within the grace period.
//! - Monitoring on behalf of another lock manager (SM_MON) is not offered:
//!   nfsrdmad's lock manager watches its clients itself. SM_MON answers
//!   `stat_fail`; SM_UNMON, SM_UNMON_ALL answer the state; SM_SIMU_CRASH
//!   is accepted and does nothing.

use super::nlm::Host;
use super::{Caller, Reply, ReplyBody, Service};
use crate::rpc_client::call_registered;
use bytes::BytesMut;
use nfsrdma_xdr::nsm::{self, proc_, *};
use nfsrdma_xdr::rpc::AcceptStat;
use nfsrdma_xdr::{Decoder, Xdr};
use std::net::IpAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// A client to tell about a restart: who, and the address of ours it used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watcher {
    /// The client.
    pub host: Host,
    /// Our address as it knew it.
    pub local: Option<IpAddr>,
}

/// The status monitor's state number.
#[derive(Debug)]
pub struct Nsm {
    state: AtomicI32,
}

impl Default for Nsm {
    fn default() -> Self {
        Nsm::new(1)
    }
}

impl Nsm {
    /// A monitor with state number `state`.
    pub fn new(state: i32) -> Nsm {
        Nsm {
            state: AtomicI32::new(state),
        }
    }

    /// The state number of the instance after one whose number was `prev`:
    /// the next odd number after it.
    pub fn next_state(prev: i32) -> i32 {
        let n = prev.wrapping_add(if prev % 2 == 0 { 1 } else { 2 });
        if n <= 0 {
            1
        } else {
            n
        }
    }

    /// The state number now.
    pub fn state(&self) -> i32 {
        self.state.load(Ordering::Relaxed)
    }

    /// Sets the state number (at start, from the state file).
    pub fn set_state(&self, s: i32) {
        self.state.store(s, Ordering::Relaxed);
    }
}

/// Tells each of `watchers` that this server restarted with state number
/// `state` (finding their status monitors through their rpcbind at
/// `rpcbind_port`), retrying every `retry` until `until` (a client may come back
/// later than the server). Runs on its own thread.
pub fn notify_restart(
    watchers: Vec<Watcher>,
    state: i32,
    rpcbind_port: u16,
    retry: Duration,
    until: Instant,
) {
    let spawned = std::thread::Builder::new()
        .name("nsm-notify".into())
        .spawn(move || {
            let mut left = watchers;
            loop {
                left.retain(|w| {
                    let name = w
                        .local
                        .map_or_else(|| "nfsrdmad".to_string(), |a| a.to_string());
                    let r = call_registered::<()>(
                        w.host.ip,
                        rpcbind_port,
                        w.local,
                        nsm::PROGRAM,
                        nsm::VERSION,
                        proc_::NOTIFY,
                        &StatChge {
                            mon_name: SmName::new(name.clone().into_bytes()),
                            state,
                        },
                    );
                    match r {
                        Ok(()) => {
                            tracing::info!(client = %w.host.ip, as_ = %name, state,
                                "NSM: told the client of the restart (SM_NOTIFY)");
                            false
                        }
                        Err(e) => {
                            tracing::debug!(client = %w.host.ip, error = %e, "NSM SM_NOTIFY failed; retrying");
                            true
                        }
                    }
                });
                if left.is_empty() || Instant::now() + retry > until {
                    for w in &left {
                        tracing::warn!(client = %w.host.ip,
                            "NSM: could not tell the client of the restart; its locks are lost");
                    }
                    return;
                }
                std::thread::sleep(retry);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the NSM notifier");
    }
}

impl Service {
    /// An NSM call.
    pub(super) fn nsm_call(
        &self,
        caller: &Caller,
        xid: u32,
        vers: u32,
        proc_: u32,
        mut args: Decoder,
    ) -> Reply {
        if vers != nsm::VERSION {
            return Reply::error(xid, AcceptStat::ProgMismatch { low: 1, high: 1 });
        }
        let state = self.nsm.state();
        let mut out = BytesMut::new();
        let decoded = match proc_ {
            proc_::NULL | proc_::SIMU_CRASH => Ok(()),
            proc_::STAT => SmName::decode(&mut args).map(|_| {
                SmStatRes {
                    res_stat: SmRes::Succ,
                    state,
                }
                .encode(&mut out)
            }),
            proc_::MON => Mon::decode(&mut args).map(|m| {
                tracing::debug!(peer = %caller.ctx.peer, host = %String::from_utf8_lossy(&m.mon_id.mon_name),
                    "NSM SM_MON refused: nfsrdmad monitors only its own lock clients");
                SmStatRes {
                    res_stat: SmRes::Fail,
                    state,
                }
                .encode(&mut out)
            }),
            proc_::UNMON => MonId::decode(&mut args).map(|_| SmStat { state }.encode(&mut out)),
            proc_::UNMON_ALL => MyId::decode(&mut args).map(|_| SmStat { state }.encode(&mut out)),
            proc_::NOTIFY => StatChge::decode(&mut args).map(|c| {
                let ip = caller.ctx.ip();
                let n = self.nlm.forget_hosts(|h| h.ip == ip);
                tracing::info!(client = %ip, name = %String::from_utf8_lossy(&c.mon_name), state = c.state,
                    released = n, "NSM: a client restarted (SM_NOTIFY); its locks are released");
            }),
            _ => return Reply::error(xid, AcceptStat::ProcUnavail),
        };
        match decoded.and_then(|()| args.finish("NSM arguments")) {
            Ok(()) => Reply::success(xid, ReplyBody::Raw(out.freeze())),
            Err(e) => {
                tracing::debug!(peer = %caller.ctx.peer, proc = proc_, error = %e, "NSM GARBAGE_ARGS");
                self.metrics.garbage();
                Reply::error(xid, AcceptStat::GarbageArgs)
            }
        }
    }

    /// The status monitor.
    pub fn nsm(&self) -> &Nsm {
        &self.nsm
    }

    /// The clients to tell if this instance stops now and a new one starts
    /// from its state: those holding NLM locks.
    pub fn nsm_watchers(&self) -> Vec<Watcher> {
        self.nlm.watchers()
    }
}
