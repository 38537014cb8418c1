//! The completion engine: how a thread waits for completions, written once
//! for the server's pool threads and the client's completion
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

use super::verbs::{CompletionChannel, CompletionQueue, VerbsError, Waited, Waker, WorkCompletion};

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

/// The shortest spin of a [`SpinTuner`] that spins at all: gaps of a few
/// microseconds would otherwise round the budget down to nothing.
pub const TUNER_MIN_SPIN: Duration = Duration::from_micros(20);

/// How long to spin before sleeping, learnt from the traffic: the time the
/// awaited completions (a server's next call) took to come after the work
/// before them.
///
/// A gap is known exactly only when the thread was awake to see the
/// completion arrive. After a sleep, the time the thread saw it includes
/// the wake-up (which under emulation can be longer than the gap itself),
/// so all the tuner learns is that the gap was longer than the spin before
/// the sleep: it keeps such gaps as "beyond" that spin, never as a length.
///
/// The budget: the 75th percentile of the last [`TUNER_WINDOW`] gaps, plus
/// a quarter, at least [`TUNER_MIN_SPIN`] and at most the ceiling; none
/// when that percentile is beyond the ceiling (a slow or idle client costs
/// no spinning). When the percentile is only known to be beyond a shorter
/// spin than the ceiling, the tuner spins up to the ceiling next time to
/// find out. Gaps beyond a spin of nothing tell it nothing; when they are
/// all it has, it spins up to the ceiling once to look again, so a client
/// that speeds up after a slow spell is noticed within a window.
#[derive(Debug, Clone)]
pub struct SpinTuner {
    max: Duration,
    /// Recent gaps, a ring: microseconds (saturating) times two, plus one
    /// for a gap only known to be beyond that many microseconds (so that
    /// it sorts after an exact gap of the same length).
    gaps: [u64; TUNER_WINDOW],
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
    /// it, seen by a thread that was awake, and updates the budget.
    pub fn observe(&mut self, gap: Duration) {
        self.push(micros(gap) * 2);
    }

    /// Records that an awaited completion was found after a sleep that
    /// followed a spin of `spun`: its gap was longer than that.
    pub fn observe_beyond(&mut self, spun: Duration) {
        self.push(micros(spun) * 2 + 1);
    }

    fn push(&mut self, entry: u64) {
        self.gaps[self.next] = entry;
        self.next = (self.next + 1) % TUNER_WINDOW;
        self.len = (self.len + 1).min(TUNER_WINDOW);
        // "Beyond nothing" (entry 1) says nothing about the gap's length.
        let mut known = [0u64; TUNER_WINDOW];
        let mut n = 0;
        for &g in &self.gaps[..self.len] {
            if g != 1 {
                known[n] = g;
                n += 1;
            }
        }
        if n == 0 {
            self.budget = self.max;
            return;
        }
        let known = &mut known[..n];
        known.sort_unstable();
        // Nearest-rank 75th percentile.
        let q = known[(n * 3).div_ceil(4) - 1];
        let (us, beyond) = (q / 2, q % 2 == 1);
        let q = Duration::from_micros(us);
        self.budget = if q >= self.max && (beyond || q > self.max) {
            Duration::ZERO
        } else if beyond {
            // Longer than the spin that missed it, by how much unknown:
            // look once with the longest spin.
            self.max
        } else {
            (q + q / 4).max(TUNER_MIN_SPIN).min(self.max)
        };
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros())
        .unwrap_or(u64::MAX / 4)
        .min(u64::MAX / 4)
}

/// What [`Poller::awaited`] saw of an awaited completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Awaited {
    /// Found while polling (busy, or spinning after the last work), not
    /// after a sleep.
    pub polling: bool,
    /// How long after the last work it came, when found polling in a mode
    /// that reads the clock for it (`auto`).
    pub gap: Option<Duration>,
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
    /// Sleeps ended by the poller's waker ([`Poller::set_waker`]).
    pub wakes: u64,
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
    /// The spin that preceded the current sleep (`auto`).
    spun: Duration,
    waker: Option<Arc<Waker>>,
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
            spun: Duration::ZERO,
            waker: None,
            stats: EngineStats::default(),
        })
    }

    /// Sleeps last at most `slice` (default [`WAIT_SLICE`]).
    pub fn with_wait_slice(mut self, slice: Duration) -> Poller {
        self.wait_slice = slice;
        self
    }

    /// Changes the longest sleep from the next wait on.
    pub fn set_wait_slice(&mut self, slice: Duration) {
        self.wait_slice = slice;
    }

    /// A sleep ends also when `waker` is signalled (another thread has
    /// work for the owner): the wait then returns with no completions.
    /// Without one, only a completion or the wait slice ends a sleep.
    pub fn set_waker(&mut self, waker: Arc<Waker>) {
        self.waker = Some(waker);
    }

    /// Polls `cq` too from now on (a pool thread taking on a connection
    /// whose queue pair completes on a CQ it did not poll yet). Every mode
    /// but busy needs it on the poller's completion channel. Adding a CQ
    /// already polled does nothing.
    pub fn add_cq(&mut self, cq: Arc<CompletionQueue>) -> Result<(), EngineError> {
        if self.cqs.iter().any(|c| Arc::ptr_eq(c, &cq)) {
            return Ok(());
        }
        let same = match (&self.channel, cq.channel()) {
            (Some(ours), Some(its)) => Arc::ptr_eq(ours, its),
            (None, _) => matches!(self.mode, PollMode::Busy),
            (Some(_), None) => false,
        };
        if !same {
            return Err(EngineError::ChannelMismatch(self.mode));
        }
        self.cqs.push(cq);
        Ok(())
    }

    /// Stops polling `cq` (its last connection is gone). The last CQ
    /// stays: a poller polls at least one.
    pub fn remove_cq(&mut self, cq: &Arc<CompletionQueue>) -> bool {
        if self.cqs.len() <= 1 {
            return false;
        }
        let before = self.cqs.len();
        self.cqs.retain(|c| !Arc::ptr_eq(c, cq));
        before != self.cqs.len()
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
                let budget = self
                    .tuner
                    .as_ref()
                    .map_or(Duration::ZERO, SpinTuner::budget);
                let sleep = self.last_work.elapsed() >= budget;
                if sleep && !self.slept {
                    self.spun = budget;
                }
                sleep
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
        match &self.waker {
            Some(w) => match channel.get_event_or_wake(Some(self.wait_slice), w)? {
                Waited::Event(_) => self.stats.events += 1,
                Waited::Woken => self.stats.wakes += 1,
                Waited::TimedOut => self.stats.wait_timeouts += 1,
            },
            None => match channel.get_event(Some(self.wait_slice))? {
                Some(_) => self.stats.events += 1,
                None => self.stats.wait_timeouts += 1,
            },
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
    /// it took to come after the last work (or, after a sleep, that it took
    /// longer than the spin before the sleep). Says whether it was found
    /// polling or after a sleep, and the gap when it was measured.
    pub fn awaited(&mut self) -> Awaited {
        let polling = !self.slept;
        let mut gap = None;
        if let Some(t) = self.tuner.as_mut() {
            if polling {
                let g = self.last_work.elapsed();
                t.observe(g);
                gap = Some(g);
            } else {
                t.observe_beyond(self.spun);
            }
        }
        Awaited { polling, gap }
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

    /// What a poller tells its tuner of a call that comes `gap` after the
    /// last work: the gap if it spun that long, else only that it was
    /// beyond the spin. Returns whether the call was found spinning.
    fn call(t: &mut SpinTuner, gap: Duration) -> bool {
        let spin = t.budget();
        if gap < spin {
            t.observe(gap);
            true
        } else {
            t.observe_beyond(spin);
            false
        }
    }

    #[test]
    fn tuner_spins_a_little_longer_than_steady_gaps() {
        let mut t = SpinTuner::new(us(1000));
        assert_eq!(t.budget(), us(1000), "starts at its ceiling");
        for _ in 0..TUNER_WINDOW {
            assert!(call(&mut t, us(400)));
        }
        assert_eq!(t.budget(), us(500));
        // Fast hardware: tens of microseconds.
        for _ in 0..TUNER_WINDOW {
            call(&mut t, us(40));
        }
        assert_eq!(t.budget(), us(50));
        // A few microseconds: still a spin worth having.
        for _ in 0..TUNER_WINDOW {
            call(&mut t, us(3));
        }
        assert_eq!(t.budget(), TUNER_MIN_SPIN);
    }

    #[test]
    fn tuner_covers_three_gaps_in_four_and_never_exceeds_its_ceiling() {
        let mut t = SpinTuner::new(us(1000));
        // 12 quick, 4 slow: the quick ones set the budget.
        for i in 0..TUNER_WINDOW as u64 {
            call(&mut t, if i % 4 == 3 { us(50_000) } else { us(100 + i) });
        }
        assert_eq!(t.budget(), us(114) + us(114) / 4);
        // Gaps just under the ceiling: the margin is cut at the ceiling.
        for _ in 0..TUNER_WINDOW {
            call(&mut t, us(950));
        }
        assert_eq!(t.budget(), us(1000));
    }

    #[test]
    fn tuner_stops_spinning_for_sparse_traffic_and_resumes() {
        let mut t = SpinTuner::new(us(1000));
        for _ in 0..TUNER_WINDOW {
            call(&mut t, us(300));
        }
        assert!(t.budget() > us(300));
        // Calls now come 5 ms apart: once most recent gaps are longer
        // than the ceiling, the thread does not spin at all.
        let mut calls = 0;
        while t.budget() > Duration::ZERO {
            call(&mut t, us(5000));
            calls += 1;
            assert!(calls <= TUNER_WINDOW, "never stopped spinning");
        }
        assert!(calls > TUNER_WINDOW / 4, "one slow gap is not a trend");
        // Back to quick calls: while it does not spin it learns nothing
        // of their length (each found after a wake-up), yet it looks
        // again within a window and resumes.
        let mut missed = 0;
        while !call(&mut t, us(200)) {
            missed += 1;
            assert!(missed <= TUNER_WINDOW, "never resumed");
        }
        assert_eq!(t.budget(), us(250));
        assert!(call(&mut t, us(200)));
    }

    #[test]
    fn a_spell_of_slow_calls_does_not_keep_the_tuner_asleep() {
        // Gaps near the ceiling, as under emulation, where a wake-up can
        // take longer than the gap: a client's hiccup of five slow calls
        // stops the spinning, and the steady calls after it bring it back
        // within a window, found spinning from then on.
        let mut t = SpinTuner::new(us(1000));
        for _ in 0..TUNER_WINDOW {
            assert!(call(&mut t, us(800)));
        }
        for _ in 0..5 {
            call(&mut t, us(3000));
        }
        assert_eq!(t.budget(), Duration::ZERO);
        let missed = (0..4 * TUNER_WINDOW)
            .filter(|_| !call(&mut t, us(800)))
            .count();
        assert!(missed <= TUNER_WINDOW + 1, "{missed} calls missed");
        assert!((0..TUNER_WINDOW).all(|_| call(&mut t, us(800))));
    }

    #[test]
    fn sparse_traffic_costs_a_look_per_window_at_most() {
        // Every gap beyond the ceiling: after the first window the tuner
        // spins (up to its ceiling) about once per window to look again.
        let mut t = SpinTuner::new(us(1000));
        let mut spins = 0;
        for i in 0..10 * TUNER_WINDOW {
            if i >= TUNER_WINDOW && t.budget() > Duration::ZERO {
                spins += 1;
            }
            assert!(!call(&mut t, us(5000)));
        }
        assert!((1..=10).contains(&spins), "{spins} spins in 9 windows");
    }

    #[test]
    fn a_gap_missed_by_a_short_spin_makes_the_tuner_look_longer() {
        // Quick calls, then calls a little slower than the spin they set:
        // each is only known to be beyond that spin, so the tuner spins up
        // to its ceiling to learn how long they take, and settles there.
        let mut t = SpinTuner::new(us(1000));
        for _ in 0..TUNER_WINDOW {
            call(&mut t, us(100));
        }
        assert_eq!(t.budget(), us(125));
        let found = (0..2 * TUNER_WINDOW)
            .filter(|_| call(&mut t, us(600)))
            .count();
        assert!(found >= TUNER_WINDOW, "{found} of the 600 us calls found");
        assert_eq!(t.budget(), us(750));
    }

    #[test]
    fn poller_needs_cqs() {
        let r = Poller::new(Vec::new(), PollMode::Busy);
        assert!(matches!(r, Err(EngineError::NoCqs)));
    }
}
