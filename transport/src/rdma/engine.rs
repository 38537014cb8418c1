//! Completion engine: one thread per connection group that polls one or
//! more completion queues and hands every completion to a handler.
//!
//! The polling mode is a setting ([`PollMode`]), because the latency it
//! buys is one of the things users compare:
//!
//! * [`PollMode::Busy`] spins on `ibv_poll_cq`: lowest latency, one core
//!   at 100 %.
//! * [`PollMode::Event`] arms the CQs and sleeps on their completion
//!   channel whenever they are empty: no idle CPU, a wake-up per burst.
//! * [`PollMode::Adaptive`] spins for a bounded time after the last
//!   completion, then arms and sleeps like `Event`.
//!
//! Arming follows the usual race-free order: arm, poll again, and only
//! sleep if that second poll found nothing. The thread checks its stop flag
//! at least every [`EngineConfig::wait_slice`], so [`CompletionEngine::shutdown`]
//! returns promptly in every mode.

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::verbs::{CompletionChannel, CompletionQueue, VerbsError, WorkCompletion};

/// How the engine thread waits for completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollMode {
    /// Spin on the CQs.
    Busy,
    /// Arm the CQs and block on their completion channel.
    Event,
    /// Spin up to `spin` after the last completion, then arm and block.
    Adaptive {
        /// How long to keep spinning on empty CQs before sleeping.
        spin: Duration,
    },
}

impl Default for PollMode {
    fn default() -> Self {
        Self::Adaptive {
            spin: Duration::from_micros(50),
        }
    }
}

/// Error parsing a [`PollMode`] setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown poll mode {0:?}: expected busy, event, adaptive or adaptive:<microseconds>")]
pub struct ParsePollModeError(String);

impl FromStr for PollMode {
    type Err = ParsePollModeError;

    /// `busy`, `event`, `adaptive` (50 µs spin) or `adaptive:<µs>`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParsePollModeError(s.to_string());
        match s {
            "busy" => Ok(Self::Busy),
            "event" => Ok(Self::Event),
            "adaptive" => Ok(Self::default()),
            _ => {
                let us = s.strip_prefix("adaptive:").ok_or_else(err)?;
                let us: u64 = us.parse().map_err(|_| err())?;
                Ok(Self::Adaptive {
                    spin: Duration::from_micros(us),
                })
            }
        }
    }
}

impl std::fmt::Display for PollMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Busy => f.write_str("busy"),
            Self::Event => f.write_str("event"),
            Self::Adaptive { spin } => write!(f, "adaptive:{}", spin.as_micros()),
        }
    }
}

/// Engine settings.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Polling mode.
    pub mode: PollMode,
    /// Completions fetched per poll call per CQ.
    pub batch: usize,
    /// Longest single sleep on the completion channel (bounds shutdown
    /// latency in event and adaptive modes).
    pub wait_slice: Duration,
    /// Thread name.
    pub thread_name: String,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            mode: PollMode::default(),
            batch: 32,
            wait_slice: Duration::from_millis(50),
            thread_name: "rdma-cq".into(),
        }
    }
}

/// Counters of an engine thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Completions delivered to the handler.
    pub completions: u64,
    /// Poll rounds over all CQs.
    pub polls: u64,
    /// Poll rounds that found nothing.
    pub empty_polls: u64,
    /// Times the CQs were armed before sleeping.
    pub arms: u64,
    /// Channel events received (wake-ups by the device).
    pub events: u64,
    /// Sleeps that ended by timeout instead of an event.
    pub wait_timeouts: u64,
}

#[derive(Default)]
struct SharedStats {
    completions: AtomicU64,
    polls: AtomicU64,
    empty_polls: AtomicU64,
    arms: AtomicU64,
    events: AtomicU64,
    wait_timeouts: AtomicU64,
}

impl SharedStats {
    fn snapshot(&self) -> EngineStats {
        EngineStats {
            completions: self.completions.load(Ordering::Relaxed),
            polls: self.polls.load(Ordering::Relaxed),
            empty_polls: self.empty_polls.load(Ordering::Relaxed),
            arms: self.arms.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            wait_timeouts: self.wait_timeouts.load(Ordering::Relaxed),
        }
    }
}

/// Engine errors.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No completion queue was given.
    #[error("completion engine needs at least one CQ")]
    NoCqs,
    /// Event or adaptive mode with a CQ that has no completion channel, or
    /// CQs on different channels.
    #[error("{0:?} mode needs every CQ created on one shared completion channel")]
    ChannelMismatch(PollMode),
    /// A verbs call failed in the engine thread.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The thread could not be started.
    #[error("spawning the completion thread: {0}")]
    Spawn(#[source] std::io::Error),
    /// The handler panicked.
    #[error("the completion handler panicked")]
    HandlerPanicked,
}

/// A running completion thread. Dropping it stops and joins the thread.
pub struct CompletionEngine {
    stop: Arc<AtomicBool>,
    stats: Arc<SharedStats>,
    thread: Option<JoinHandle<Result<(), EngineError>>>,
    mode: PollMode,
}

impl std::fmt::Debug for CompletionEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionEngine")
            .field("mode", &self.mode)
            .field("stats", &self.stats())
            .finish()
    }
}

impl CompletionEngine {
    /// Starts a thread polling `cqs`; every completion goes to
    /// `handler(index of its CQ in cqs, completion)`. The handler runs on
    /// the engine thread and should be quick (e.g. push into a channel).
    pub fn start<H>(
        config: EngineConfig,
        cqs: Vec<Arc<CompletionQueue>>,
        handler: H,
    ) -> Result<Self, EngineError>
    where
        H: FnMut(usize, &WorkCompletion) + Send + 'static,
    {
        if cqs.is_empty() {
            return Err(EngineError::NoCqs);
        }
        let channel = match config.mode {
            PollMode::Busy => None,
            mode => Some(shared_channel(&cqs).ok_or(EngineError::ChannelMismatch(mode))?),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SharedStats::default());
        let mode = config.mode;
        let worker = Worker {
            config: config.clone(),
            cqs,
            channel,
            handler,
            stop: stop.clone(),
            stats: stats.clone(),
            buf: Vec::with_capacity(config.batch.max(1)),
        };
        let thread = std::thread::Builder::new()
            .name(config.thread_name)
            .spawn(move || worker.run())
            .map_err(EngineError::Spawn)?;
        Ok(Self {
            stop,
            stats,
            thread: Some(thread),
            mode,
        })
    }

    /// The engine's mode.
    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        self.stats.snapshot()
    }

    /// True while the thread runs (it stops on its own only after an error).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops the thread, waits for it, and returns the final counters (or
    /// the error that ended it early).
    pub fn shutdown(mut self) -> Result<EngineStats, EngineError> {
        self.stop_and_join()?;
        Ok(self.stats.snapshot())
    }

    fn stop_and_join(&mut self) -> Result<(), EngineError> {
        self.stop.store(true, Ordering::Release);
        match self.thread.take() {
            None => Ok(()),
            Some(t) => t.join().map_err(|_| EngineError::HandlerPanicked)?,
        }
    }
}

impl Drop for CompletionEngine {
    fn drop(&mut self) {
        let _ = self.stop_and_join();
    }
}

/// The one channel all CQs share, if they do.
fn shared_channel(cqs: &[Arc<CompletionQueue>]) -> Option<Arc<CompletionChannel>> {
    let first = cqs.first()?.channel()?.clone();
    cqs.iter()
        .all(|cq| cq.channel().is_some_and(|c| Arc::ptr_eq(c, &first)))
        .then_some(first)
}

struct Worker<H> {
    config: EngineConfig,
    cqs: Vec<Arc<CompletionQueue>>,
    channel: Option<Arc<CompletionChannel>>,
    handler: H,
    stop: Arc<AtomicBool>,
    stats: Arc<SharedStats>,
    buf: Vec<WorkCompletion>,
}

impl<H: FnMut(usize, &WorkCompletion)> Worker<H> {
    fn run(mut self) -> Result<(), EngineError> {
        let mut idle_since: Option<Instant> = None;
        while !self.stop.load(Ordering::Acquire) {
            if self.poll_all()? > 0 {
                idle_since = None;
                continue;
            }
            let sleep_now = match self.config.mode {
                PollMode::Busy => false,
                PollMode::Event => true,
                PollMode::Adaptive { spin } => {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    since.elapsed() >= spin
                }
            };
            if !sleep_now {
                std::hint::spin_loop();
                continue;
            }
            self.arm_and_wait()?;
            idle_since = None;
        }
        Ok(())
    }

    /// One poll round over every CQ; returns the number of completions.
    fn poll_all(&mut self) -> Result<usize, EngineError> {
        let mut total = 0;
        for (i, cq) in self.cqs.iter().enumerate() {
            self.buf.clear();
            let n = cq.poll(&mut self.buf, self.config.batch.max(1))?;
            // Counted before dispatch, so whoever sees a completion also
            // sees it counted.
            self.stats
                .completions
                .fetch_add(n as u64, Ordering::Relaxed);
            for wc in &self.buf {
                (self.handler)(i, wc);
            }
            total += n;
        }
        self.stats.polls.fetch_add(1, Ordering::Relaxed);
        if total == 0 {
            self.stats.empty_polls.fetch_add(1, Ordering::Relaxed);
        }
        Ok(total)
    }

    /// Arms every CQ, re-polls to close the arm/complete race, and sleeps
    /// on the channel for at most one wait slice if still nothing.
    fn arm_and_wait(&mut self) -> Result<(), EngineError> {
        let Some(channel) = self.channel.clone() else {
            return Ok(());
        };
        for cq in &self.cqs {
            cq.req_notify(false)?;
        }
        self.stats.arms.fetch_add(1, Ordering::Relaxed);
        if self.poll_all()? > 0 {
            // The CQs stay armed; the event that may follow only causes a
            // harmless extra poll round.
            return Ok(());
        }
        match channel.get_event(Some(self.config.wait_slice))? {
            Some(_) => self.stats.events.fetch_add(1, Ordering::Relaxed),
            None => self.stats.wait_timeouts.fetch_add(1, Ordering::Relaxed),
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_mode_setting_round_trips() {
        assert_eq!("busy".parse::<PollMode>(), Ok(PollMode::Busy));
        assert_eq!("event".parse::<PollMode>(), Ok(PollMode::Event));
        assert_eq!("adaptive".parse::<PollMode>(), Ok(PollMode::default()));
        assert_eq!(
            "adaptive:200".parse::<PollMode>(),
            Ok(PollMode::Adaptive {
                spin: Duration::from_micros(200)
            })
        );
        assert!("adaptive:x".parse::<PollMode>().is_err());
        assert!("spin".parse::<PollMode>().is_err());
        for m in [PollMode::Busy, PollMode::Event, PollMode::default()] {
            assert_eq!(m.to_string().parse::<PollMode>(), Ok(m));
        }
    }

    #[test]
    fn engine_needs_cqs() {
        let r = CompletionEngine::start(EngineConfig::default(), Vec::new(), |_, _| {});
        assert!(matches!(r, Err(EngineError::NoCqs)));
    }
}
