//! The completion engine: how a thread waits for completions, written once
//! for the server's connection threads and the client's completion
//! threads (and its callers that poll for themselves).
//!
//! A [`Poller`] polls one or more completion queues and, when they are
//! empty, spins or sleeps as its [`PollMode`] says, because the latency
//! that buys is one of the things users compare:
//!
//! * [`PollMode::Busy`] spins on `ibv_poll_cq`: lowest latency, one core
//!   at 100 %.
//! * [`PollMode::Event`] arms the CQs and sleeps on their completion
//!   channel whenever they are empty: no idle CPU, a wake-up per burst.
//! * [`PollMode::Adaptive`] spins for a bounded time after the last
//!   work, then arms and sleeps like `Event`.
//! * [`PollMode::Auto`] is `Adaptive` with a spin time that follows the
//!   traffic ([`SpinTuner`]): about as long as recent awaited completions
//!   took to come after the work before them, and not at all when they
//!   come further apart than its ceiling.
//!
//! Arming follows the usual race-free order: arm, poll again, and only
//! sleep if that second poll found nothing. A sleep lasts at most one wait
//! slice, so the thread that owns the poller can check a stop flag.
//!
//! The poller does no work itself: its owner hands each completion to its
//! connection core, tells it which completions were awaited
//! ([`Poller::awaited`]: a call's arrival, on a server) and when it last
//! did work ([`Poller::worked`]).

use std::str::FromStr;
use std::sync::Arc;
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

/// Counters of a poller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Completions polled.
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

/// Poller errors.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// No completion queue was given.
    #[error("a poller needs at least one CQ")]
    NoCqs,
    /// Event, adaptive or auto mode with a CQ that has no completion
    /// channel, or CQs on different channels.
    #[error("{0} mode needs every CQ created on one shared completion channel")]
    ChannelMismatch(PollMode),
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
}

/// The longest single sleep on the completion channel by default.
pub const WAIT_SLICE: Duration = Duration::from_millis(50);

/// Waits for completions on one or more CQs in a [`PollMode`].
pub struct Poller {
    cqs: Vec<Arc<CompletionQueue>>,
    channel: Option<Arc<CompletionChannel>>,
    mode: PollMode,
    tuner: Option<SpinTuner>,
    batch: usize,
    wait_slice: Duration,
    last_work: Instant,
    slept: bool,
    stats: EngineStats,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller")
            .field("mode", &self.mode)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Poller {
    /// A poller over `cqs` (every mode but busy needs them on one
    /// completion channel).
    pub fn new(cqs: Vec<Arc<CompletionQueue>>, mode: PollMode) -> Result<Poller, EngineError> {
        if cqs.is_empty() {
            return Err(EngineError::NoCqs);
        }
        let channel = match mode {
            PollMode::Busy => shared_channel(&cqs),
            mode => Some(shared_channel(&cqs).ok_or(EngineError::ChannelMismatch(mode))?),
        };
        Ok(Poller {
            cqs,
            channel,
            mode,
            tuner: match mode {
                PollMode::Auto { max } => Some(SpinTuner::new(max)),
                _ => None,
            },
            batch: 64,
            wait_slice: WAIT_SLICE,
            last_work: Instant::now(),
            slept: false,
            stats: EngineStats::default(),
        })
    }

    /// Sleeps last at most `slice` (default [`WAIT_SLICE`]).
    pub fn with_wait_slice(mut self, slice: Duration) -> Poller {
        self.wait_slice = slice;
        self
    }

    /// The mode.
    pub fn mode(&self) -> PollMode {
        self.mode
    }

    /// The counters.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    /// One poll round over every CQ, without waiting: each completion goes
    /// to `f` with the index of its CQ. Returns how many there were.
    pub fn poll_with(
        &mut self,
        mut f: impl FnMut(usize, WorkCompletion),
    ) -> Result<usize, VerbsError> {
        let mut total = 0;
        for (i, cq) in self.cqs.iter().enumerate() {
            total += cq.poll_with(self.batch, |wc| f(i, wc))?;
        }
        self.stats.polls += 1;
        self.stats.completions += total as u64;
        if total == 0 {
            self.stats.empty_polls += 1;
        }
        Ok(total)
    }

    /// One poll round into `out` (appended), without waiting.
    pub fn poll(&mut self, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError> {
        self.poll_with(|_, wc| out.push(wc))
    }

    /// Polls; when nothing is there, spins once or sleeps (for at most the
    /// wait slice) as the mode says, then returns. Completions go to `f`;
    /// returns how many there were (none when the wait ended empty).
    pub fn wait_with(
        &mut self,
        mut f: impl FnMut(usize, WorkCompletion),
    ) -> Result<usize, VerbsError> {
        let n = self.poll_with(&mut f)?;
        if n > 0 {
            return Ok(n);
        }
        // (The clock is read only where the mode needs it: under
        // emulation a clock read costs as much as a poll.)
        let sleep = match self.mode {
            PollMode::Busy => false,
            PollMode::Event => true,
            PollMode::Adaptive { spin } => self.last_work.elapsed() >= spin,
            PollMode::Auto { .. } => {
                self.last_work.elapsed()
                    >= self
                        .tuner
                        .as_ref()
                        .map_or(Duration::ZERO, SpinTuner::budget)
            }
        };
        if !sleep {
            std::hint::spin_loop();
            return Ok(0);
        }
        let Some(channel) = self.channel.as_ref() else {
            std::hint::spin_loop();
            return Ok(0);
        };
        let channel = channel.clone();
        for cq in &self.cqs {
            cq.req_notify(false)?;
        }
        self.stats.arms += 1;
        // Completions that came before arming.
        let n = self.poll_with(&mut f)?;
        if n > 0 {
            // The CQs stay armed; the event that may follow only costs a
            // harmless extra poll round.
            return Ok(n);
        }
        match channel.get_event(Some(self.wait_slice))? {
            Some(_) => self.stats.events += 1,
            None => self.stats.wait_timeouts += 1,
        }
        self.slept = true;
        Ok(0)
    }

    /// [`Poller::wait_with`] into `out` (appended).
    pub fn wait(&mut self, out: &mut Vec<WorkCompletion>) -> Result<usize, VerbsError> {
        self.wait_with(|_, wc| out.push(wc))
    }

    /// An awaited completion (the thing the owner waits for: on a server,
    /// the next call) was among those just polled: `auto` learns how long
    /// it took to come after the last work. Returns whether it was found
    /// polling (`true`) or after a sleep.
    pub fn awaited(&mut self) -> bool {
        if let Some(t) = self.tuner.as_mut() {
            t.observe(self.last_work.elapsed());
        }
        !self.slept
    }

    /// The owner did work now: spinning and the next gap count from here.
    /// Returns the time it read (when the completions just polled were
    /// seen).
    pub fn worked(&mut self) -> Instant {
        self.last_work = Instant::now();
        self.slept = false;
        self.last_work
    }
}

/// The one channel all CQs share, if they do.
fn shared_channel(cqs: &[Arc<CompletionQueue>]) -> Option<Arc<CompletionChannel>> {
    let first = cqs.first()?.channel()?.clone();
    cqs.iter()
        .all(|cq| cq.channel().is_some_and(|c| Arc::ptr_eq(c, &first)))
        .then_some(first)
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
    fn poller_needs_cqs() {
        let r = Poller::new(Vec::new(), PollMode::Busy);
        assert!(matches!(r, Err(EngineError::NoCqs)));
    }
}
