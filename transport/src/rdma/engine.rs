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
//! * [`PollMode::Auto`] is `Adaptive` with a spin time that follows the
//!   traffic ([`SpinTuner`]): about as long as recent completions took to
//!   come, and not at all when they come further apart than its ceiling.
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
    /// Spin after the last completion for as long as recent gaps between
    /// completions suggest the next one will take (see [`SpinTuner`]), at
    /// most `max`, then arm and block.
    Auto {
        /// The longest spin; gaps longer than this are not waited for.
        max: Duration,
    },
}

/// The ceiling of `auto` without a number.
pub const AUTO_MAX_DEFAULT: Duration = Duration::from_micros(1000);

impl Default for PollMode {
    fn default() -> Self {
        Self::Adaptive {
            spin: Duration::from_micros(50),
        }
    }
}

/// Error parsing a [`PollMode`] setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "unknown poll mode {0:?}: expected busy, event, adaptive, adaptive:<microseconds>, auto or auto:<microseconds>"
)]
pub struct ParsePollModeError(String);

impl FromStr for PollMode {
    type Err = ParsePollModeError;

    /// `busy`, `event`, `adaptive` (50 µs spin), `adaptive:<µs>`, `auto`
    /// (at most [`AUTO_MAX_DEFAULT`]) or `auto:<µs>` (at most that).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParsePollModeError(s.to_string());
        let micros = |v: &str| {
            v.parse::<u64>()
                .map(Duration::from_micros)
                .map_err(|_| err())
        };
        match s {
            "busy" => Ok(Self::Busy),
            "event" => Ok(Self::Event),
            "adaptive" => Ok(Self::default()),
            "auto" => Ok(Self::Auto {
                max: AUTO_MAX_DEFAULT,
            }),
            _ => {
                if let Some(us) = s.strip_prefix("adaptive:") {
                    Ok(Self::Adaptive { spin: micros(us)? })
                } else if let Some(us) = s.strip_prefix("auto:") {
                    Ok(Self::Auto { max: micros(us)? })
                } else {
                    Err(err())
                }
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
            Self::Auto { max } => write!(f, "auto:{}", max.as_micros()),
        }
    }
}

/// Gaps a [`SpinTuner`] remembers.
pub const TUNER_WINDOW: usize = 16;

/// How long to spin before sleeping, learnt from the traffic: the time the
/// last [`TUNER_WINDOW`] awaited completions took to come after the work
/// before them ("gaps"). The budget is the gap three in four of them
/// stayed within, plus a quarter for margin, capped at `max`; when that
/// gap is itself longer than `max`, spinning would mostly be in vain and
/// the budget is zero (the thread sleeps at once, as in event mode).
///
/// Gaps are measured whether the thread spun or slept, so a budget of zero
/// grows again as soon as calls come closer together. It starts at `max`.
/// Pure bookkeeping: the caller measures and decides what counts as an
/// awaited completion (a server, the arrival of a call).
#[derive(Debug, Clone)]
pub struct SpinTuner {
    max: Duration,
    /// Recent gaps in microseconds (saturating), a ring.
    gaps: [u32; TUNER_WINDOW],
    len: usize,
    next: usize,
    budget: Duration,
}

impl SpinTuner {
    /// A tuner that never spins longer than `max`.
    pub fn new(max: Duration) -> Self {
        Self {
            max,
            gaps: [0; TUNER_WINDOW],
            len: 0,
            next: 0,
            budget: max,
        }
    }

    /// How long to spin after the last work before sleeping.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// Records that an awaited completion came `gap` after the work before
    /// it, and updates the budget.
    pub fn observe(&mut self, gap: Duration) {
        self.gaps[self.next] = u32::try_from(gap.as_micros()).unwrap_or(u32::MAX);
        self.next = (self.next + 1) % TUNER_WINDOW;
        self.len = (self.len + 1).min(TUNER_WINDOW);
        let mut recent = self.gaps;
        let recent = &mut recent[..self.len];
        recent.sort_unstable();
        // Nearest-rank 75th percentile.
        let q = Duration::from_micros(u64::from(recent[(self.len * 3).div_ceil(4) - 1]));
        self.budget = if q > self.max {
            Duration::ZERO
        } else {
            (q + q / 4).min(self.max)
        };
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
        let mut tuner = match self.config.mode {
            PollMode::Auto { max } => Some(SpinTuner::new(max)),
            _ => None,
        };
        while !self.stop.load(Ordering::Acquire) {
            if self.poll_all()? > 0 {
                // Every completion is awaited alike here.
                if let (Some(t), Some(since)) = (tuner.as_mut(), idle_since) {
                    t.observe(since.elapsed());
                }
                idle_since = None;
                continue;
            }
            let since = *idle_since.get_or_insert_with(Instant::now);
            let sleep_now = match self.config.mode {
                PollMode::Busy => false,
                PollMode::Event => true,
                PollMode::Adaptive { spin } => since.elapsed() >= spin,
                PollMode::Auto { .. } => {
                    since.elapsed() >= tuner.as_ref().map_or(Duration::ZERO, SpinTuner::budget)
                }
            };
            if !sleep_now {
                std::hint::spin_loop();
                continue;
            }
            self.arm_and_wait()?;
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
        assert_eq!(
            "auto".parse::<PollMode>(),
            Ok(PollMode::Auto {
                max: AUTO_MAX_DEFAULT
            })
        );
        assert_eq!(
            "auto:300".parse::<PollMode>(),
            Ok(PollMode::Auto {
                max: Duration::from_micros(300)
            })
        );
        assert!("adaptive:x".parse::<PollMode>().is_err());
        assert!("auto:".parse::<PollMode>().is_err());
        assert!("auto:-1".parse::<PollMode>().is_err());
        assert!("spin".parse::<PollMode>().is_err());
        let auto = PollMode::Auto {
            max: Duration::from_micros(700),
        };
        for m in [PollMode::Busy, PollMode::Event, PollMode::default(), auto] {
            assert_eq!(m.to_string().parse::<PollMode>(), Ok(m));
        }
    }

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn tuner_spins_a_little_longer_than_steady_gaps() {
        let mut t = SpinTuner::new(us(1000));
        assert_eq!(t.budget(), us(1000), "starts at its ceiling");
        for _ in 0..TUNER_WINDOW {
            t.observe(us(400));
        }
        assert_eq!(t.budget(), us(500));
        // Fast hardware: tens of microseconds.
        for _ in 0..TUNER_WINDOW {
            t.observe(us(12));
        }
        assert_eq!(t.budget(), us(15));
    }

    #[test]
    fn tuner_covers_three_gaps_in_four_and_never_exceeds_its_ceiling() {
        let mut t = SpinTuner::new(us(1000));
        // 12 quick, 4 slow: the quick ones set the budget.
        for i in 0..TUNER_WINDOW as u64 {
            t.observe(if i % 4 == 3 { us(50_000) } else { us(100 + i) });
        }
        assert_eq!(t.budget(), us(114) + us(114) / 4);
        // Gaps just under the ceiling: the margin is cut at the ceiling.
        for _ in 0..TUNER_WINDOW {
            t.observe(us(950));
        }
        assert_eq!(t.budget(), us(1000));
    }

    #[test]
    fn tuner_stops_spinning_for_sparse_traffic_and_resumes() {
        let mut t = SpinTuner::new(us(1000));
        for _ in 0..TUNER_WINDOW {
            t.observe(us(300));
        }
        assert!(t.budget() > us(300));
        // Calls now come 5 ms apart: once most recent gaps are longer
        // than the ceiling, the thread does not spin at all.
        let mut observed = 0;
        while t.budget() > Duration::ZERO {
            t.observe(us(5000));
            observed += 1;
            assert!(observed <= TUNER_WINDOW, "never stopped spinning");
        }
        assert!(observed > TUNER_WINDOW / 4, "one slow gap is not a trend");
        // Back to quick calls: spinning resumes.
        let mut observed = 0;
        while t.budget() == Duration::ZERO {
            t.observe(us(200));
            observed += 1;
            assert!(observed <= TUNER_WINDOW, "never resumed");
        }
        assert_eq!(t.budget(), us(250));
    }

    #[test]
    fn engine_needs_cqs() {
        let r = CompletionEngine::start(EngineConfig::default(), Vec::new(), |_, _| {});
        assert!(matches!(r, Err(EngineError::NoCqs)));
    }
}
