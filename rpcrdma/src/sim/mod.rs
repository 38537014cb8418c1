//! A simulated fabric with a requester and a responder on it, run on the
//! host in the order a test picks.
//!
//! - [`fabric`]: the link: registered memory with R_keys, send and receive
//!   queues with the ordering of an RC queue pair, receiver-not-ready,
//!   flushes, and a log of every remote access.
//! - [`responder`]: a [`crate::conn::Connection`] driven as the verbs
//!   driver drives it, with an [`app::App`] answering the calls.
//! - [`requester`]: a requester that registers per call, checks Send With
//!   Invalidate, invalidates the rest locally, and can misbehave.
//! - [`Pair`]: both, with `step(choice)` doing one of the things that can
//!   happen next (a side's send queue runs a request, a side takes a
//!   completion, a side acts on what it has), so that a test can run
//!   every interleaving a schedule of choices describes.

pub mod app;
pub mod fabric;
pub mod requester;
pub mod responder;

use crate::conn::Config;
use fabric::{Fabric, SideId, Stepped};

/// A requester and a responder on one simulated link.
#[derive(Debug)]
pub struct Pair {
    /// The link.
    pub fabric: Fabric,
    /// The requester (side A).
    pub client: requester::SimRequester,
    /// The responder (side B).
    pub server: responder::SimResponder<app::MiniNfs>,
    /// Steps taken.
    pub steps: u64,
}

/// One thing that can happen next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Run(SideId),
    Complete(SideId),
    ClientActs,
    ServerActs,
}

impl Pair {
    /// A pair: the responder with `cfg` and a [`app::MiniNfs`] listing
    /// `entries` names in a READDIR, the requester with `opts`, on a
    /// link with `rnr_retries`.
    pub fn new(cfg: Config, opts: requester::RequesterOptions, rnr_retries: u32) -> Pair {
        let mut fabric = Fabric::new(rnr_retries);
        let mut server = responder::SimResponder::new(
            cfg,
            app::MiniNfs {
                entries: 300,
                ..Default::default()
            },
        );
        // The responder's receives go up before the requester can send.
        server.drive(&mut fabric);
        let client = requester::SimRequester::new(opts, &mut fabric);
        Pair {
            fabric,
            client,
            server,
            steps: 0,
        }
    }

    fn actions(&self) -> Vec<Action> {
        let f = &self.fabric;
        let mut a = Vec::with_capacity(6);
        for s in [SideId::A, SideId::B] {
            if f.has_work(s) {
                a.push(Action::Run(s));
            }
            if f.has_completions(s) {
                a.push(Action::Complete(s));
            }
        }
        a.push(Action::ClientActs);
        a.push(Action::ServerActs);
        a
    }

    /// Does one thing, chosen by `choice` among those possible; false when
    /// nothing happened.
    pub fn step(&mut self, choice: u32) -> bool {
        let actions = self.actions();
        let n = actions.len();
        // Try the chosen one first, then the others in turn, so that a
        // choice that does nothing does not stall the run.
        for i in 0..n {
            let a = actions[(choice as usize + i) % n];
            let did = match a {
                Action::Run(s) => matches!(self.fabric.step(s), Stepped::Ran | Stepped::Failed),
                Action::Complete(SideId::A) => self.client.complete_one(&mut self.fabric),
                Action::Complete(SideId::B) => self.server.complete_one(&mut self.fabric),
                Action::ClientActs => self.client.pump(&mut self.fabric),
                Action::ServerActs => self.server.drive(&mut self.fabric),
            };
            if did {
                self.steps += 1;
                return true;
            }
        }
        // Only Sends waiting for receives are left: retry them, so that
        // their retries run out if no receive ever comes.
        for s in [SideId::A, SideId::B] {
            if self.fabric.has_work(s) && self.fabric.step(s) != Stepped::Idle {
                self.steps += 1;
                return true;
            }
        }
        false
    }

    /// Steps with `choices` (cycled) until nothing happens or `limit`
    /// steps were taken; returns whether it went quiet.
    pub fn drive(&mut self, choices: &[u32], limit: u64) -> bool {
        let mut i = 0usize;
        let start = self.steps;
        while self.steps - start < limit {
            let c = if choices.is_empty() {
                0
            } else {
                choices[i % choices.len()]
            };
            i += 1;
            if !self.step(c) {
                return true;
            }
        }
        false
    }
}
