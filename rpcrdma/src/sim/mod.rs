//! A simulated fabric with a requester and a responder on it, run on the
//! host in the order a test picks.
//!
//! - [`fabric`]: the link: registered memory with R_keys, send and receive
//!   queues with the ordering of an RC queue pair, receiver-not-ready,
//!   flushes, and a log of every remote access.
//! - [`endpoint`]: a [`crate::conn::Connection`] driven as the verbs
//!   drivers drive it, answering calls with an [`app::App`] and sending
//!   calls of its own.
//! - [`requester`]: a requester that registers per call, checks Send With
//!   Invalidate, invalidates the rest locally, and can misbehave.
//! - [`Pair`]: both, with `step(choice)` doing one of the things that can
//!   happen next (a side's send queue runs a request, a side takes a
//!   completion, a side acts on what it has), so that a test can run
//!   every interleaving a schedule of choices describes.

pub mod app;
pub mod endpoint;
pub mod fabric;
pub mod requester;
pub mod rogue;

use crate::conn::Config;
use fabric::{Fabric, SideId, Stepped};

/// What a side of a [`Pair`] can be asked to do.
pub trait Endpoint {
    /// Takes its next completion; false when there was none.
    fn complete_one(&mut self, f: &mut Fabric) -> bool;
    /// Acts on what it has (posts, runs calls); false when it did nothing.
    fn act(&mut self, f: &mut Fabric) -> bool;
}

impl Endpoint for requester::SimRequester {
    fn complete_one(&mut self, f: &mut Fabric) -> bool {
        requester::SimRequester::complete_one(self, f)
    }
    fn act(&mut self, f: &mut Fabric) -> bool {
        self.pump(f)
    }
}

impl<A: app::App> Endpoint for endpoint::SimEndpoint<A> {
    fn complete_one(&mut self, f: &mut Fabric) -> bool {
        endpoint::SimEndpoint::complete_one(self, f)
    }
    fn act(&mut self, f: &mut Fabric) -> bool {
        self.drive(f)
    }
}

/// A requester and a responder on one simulated link.
#[derive(Debug)]
pub struct Pair<C = requester::SimRequester, S = endpoint::SimEndpoint<app::MiniNfs>> {
    /// The link.
    pub fabric: Fabric,
    /// The side that connected (A): a scripted requester, or a
    /// connection core.
    pub client: C,
    /// The side that accepted (B): the responder connection core, or a
    /// scripted responder.
    pub server: S,
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

fn mini_nfs() -> app::MiniNfs {
    app::MiniNfs {
        entries: 300,
        ..Default::default()
    }
}

impl Pair<endpoint::SimEndpoint<app::MiniNfs>, rogue::RawPeer> {
    /// A requester connection core (side A, `client`) against a scripted
    /// responder that posts `receives` receives of `size` bytes.
    pub fn rogue_responder(client: Config, receives: u32, size: usize) -> Self {
        let mut fabric = Fabric::new(1_000_000);
        let s = rogue::RawPeer::new(&mut fabric, receives, size);
        let mut c = endpoint::SimEndpoint::new(SideId::A, client, mini_nfs());
        c.drive(&mut fabric);
        Pair {
            fabric,
            client: c,
            server: s,
            steps: 0,
        }
    }
}

impl Pair<endpoint::SimEndpoint<app::MiniNfs>> {
    /// Two connection cores: `client` (side A) and `server` (side B),
    /// each answering calls with a [`app::MiniNfs`].
    pub fn cores(server: Config, client: Config, rnr_retries: u32) -> Self {
        let mut fabric = Fabric::new(rnr_retries);
        let mut s = endpoint::SimEndpoint::new(SideId::B, server, mini_nfs());
        s.drive(&mut fabric);
        let mut c = endpoint::SimEndpoint::new(SideId::A, client, mini_nfs());
        c.drive(&mut fabric);
        Pair {
            fabric,
            client: c,
            server: s,
            steps: 0,
        }
    }
}

impl Pair {
    /// A pair: the responder with `cfg` and a [`app::MiniNfs`] listing
    /// `entries` names in a READDIR, the requester with `opts`, on a
    /// link with `rnr_retries`.
    pub fn new(cfg: Config, opts: requester::RequesterOptions, rnr_retries: u32) -> Pair {
        let mut fabric = Fabric::new(rnr_retries);
        let mut server = endpoint::SimEndpoint::new(SideId::B, cfg, mini_nfs());
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
}

impl<C: Endpoint, S: Endpoint> Pair<C, S> {
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
                Action::ClientActs => self.client.act(&mut self.fabric),
                Action::ServerActs => self.server.act(&mut self.fabric),
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
