//! What every transport does the same way, written once: one live
//! connection at a time, made again when it breaks (with backoff when it
//! keeps breaking), and each call's clock (how long a try waits for its
//! reply; when soft mode gives up).
//!
//! # Reconnection
//! The first connection is made by the transport's `connect`, which fails
//! at once when it cannot connect: a wrong address is reported, not
//! retried forever. When a connection breaks, the next call to need it
//! reconnects: when the broken connection had lived less than
//! [`SHORT_LIVED`], after waiting [`MIN_BACKOFF`], doubling up to
//! [`MAX_BACKOFF`] each time; failed attempts back off the same way.
//!
//! # Timeouts
//! Each try waits `timeo` for its reply. Hard (the default): a call
//! retries forever. Soft: a call fails with [`ClientError::TimedOut`] once
//! `timeo × (retrans + 1)` has passed since it was first sent, whatever
//! happened in between (timeouts, reconnections).

use crate::error::ClientError;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// First wait between reconnection attempts.
pub const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between reconnection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// A connection that breaks sooner than this after it was made delays the
/// next reconnection.
pub const SHORT_LIVED: Duration = Duration::from_secs(5);

/// A connection as [`Redial`] sees it.
pub trait Link: Send + Sync {
    /// Whether it broke.
    fn is_dead(&self) -> bool;
    /// Its number, for logs.
    fn id(&self) -> u64;
}

/// The current connection and what it takes to make the next one.
#[derive(Debug)]
pub struct Redial<C> {
    addr: SocketAddr,
    what: &'static str,
    conn: tokio::sync::Mutex<Option<Arc<C>>>,
    /// When the last connection was made, and the wait before the next
    /// reconnection if that one breaks soon.
    last: Mutex<(Instant, Duration)>,
}

impl<C: Link> Redial<C> {
    /// No connection yet to `addr` (`what` names the transport in logs).
    pub fn new(addr: SocketAddr, what: &'static str) -> Redial<C> {
        Redial {
            addr,
            what,
            conn: tokio::sync::Mutex::new(None),
            last: Mutex::new((Instant::now(), MIN_BACKOFF)),
        }
    }

    /// A connection was just made.
    pub fn made(&self) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).0 = Instant::now();
    }

    /// Makes `c` the current connection.
    pub async fn set(&self, c: Arc<C>) {
        *self.conn.lock().await = Some(c);
    }

    /// The current connection, if nobody is making one right now.
    pub fn current(&self) -> Option<Arc<C>> {
        self.conn.try_lock().ok().and_then(|c| c.clone())
    }

    /// Takes the current connection away, if nobody is making one.
    pub fn take(&self) -> Option<Arc<C>> {
        self.conn.try_lock().ok().and_then(|mut c| c.take())
    }

    /// The current connection, reconnecting with `open` (and backoff) when
    /// it broke; gives up at `deadline`, or when `closed` turns true.
    pub async fn connection<F, Fut>(
        &self,
        deadline: Option<Instant>,
        closed: &watch::Sender<bool>,
        open: F,
    ) -> Result<Arc<C>, ClientError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Arc<C>, ClientError>>,
    {
        let work = async {
            let mut slot = self.conn.lock().await;
            if let Some(c) = slot.as_ref().filter(|c| !c.is_dead()) {
                return Ok(c.clone());
            }
            let mut backoff = {
                let mut r = self.last.lock().unwrap_or_else(|e| e.into_inner());
                if r.0.elapsed() < SHORT_LIVED {
                    let d = r.1;
                    r.1 = (r.1 * 2).min(MAX_BACKOFF);
                    d
                } else {
                    r.1 = MIN_BACKOFF;
                    Duration::ZERO
                }
            };
            if !backoff.is_zero() {
                tracing::debug!(addr = %self.addr, transport = self.what, "connection was short-lived; reconnecting in {backoff:?}");
                tokio::time::sleep(backoff).await;
            }
            loop {
                if *closed.borrow() {
                    return Err(ClientError::Shutdown);
                }
                match open().await {
                    Ok(c) => {
                        tracing::info!(addr = %self.addr, transport = self.what, conn = c.id(), "reconnected");
                        *slot = Some(c.clone());
                        return Ok(c);
                    }
                    Err(e) => {
                        backoff = (backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                        tracing::warn!(addr = %self.addr, transport = self.what, error = %e, "reconnect failed; retrying in {backoff:?}");
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout_at(d, work).await.unwrap_or_else(|_| {
                Err(ClientError::TimedOut {
                    what: "connect".into(),
                    after: Duration::ZERO,
                })
            }),
            None => work.await,
        }
    }
}

/// One call's clock.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    name: &'static str,
    started: Instant,
    timeo: Duration,
    deadline: Option<Instant>,
}

impl Clock {
    /// A call named `name` starting now: each try waits `timeo`; in soft
    /// mode the call gives up after `timeo × (retrans + 1)`.
    pub fn start(name: &'static str, timeo: Duration, retrans: u32, soft: bool) -> Clock {
        let started = Instant::now();
        let timeo = timeo.max(Duration::from_millis(1));
        Clock {
            name,
            started,
            timeo,
            deadline: soft.then(|| started + timeo.saturating_mul(retrans.saturating_add(1))),
        }
    }

    /// When soft mode gives up (`None`: hard).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The try's wait for its reply.
    pub fn timeo(&self) -> Duration {
        self.timeo
    }

    /// When a try that starts now ends.
    pub fn try_end(&self) -> Instant {
        let end = Instant::now() + self.timeo;
        self.deadline.map_or(end, |d| end.min(d))
    }

    /// Whether soft mode's time is up.
    pub fn expired(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    /// The error of a call whose time is up.
    pub fn timed_out(&self) -> ClientError {
        ClientError::TimedOut {
            what: self.name.to_string(),
            after: self.started.elapsed(),
        }
    }

    /// A connection that could not be had in time is this call's timeout.
    pub fn map_connect(&self, e: ClientError) -> ClientError {
        match e {
            ClientError::TimedOut { .. } => self.timed_out(),
            e => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn soft_calls_give_up_after_timeo_times_retrans_plus_one() {
        let c = Clock::start("NFS NULL", Duration::from_secs(2), 2, true);
        assert!(!c.expired());
        let end = c.try_end();
        assert_eq!(end - Instant::now(), Duration::from_secs(2));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!c.expired());
        assert_eq!(
            c.try_end(),
            c.deadline().unwrap(),
            "the last try ends at the deadline"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(c.expired());
        assert!(matches!(c.timed_out(), ClientError::TimedOut { .. }));
        let hard = Clock::start("NFS NULL", Duration::from_secs(2), 2, false);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(!hard.expired());
        assert!(hard.deadline().is_none());
    }

    #[derive(Debug)]
    struct Fake {
        id: u64,
        dead: std::sync::atomic::AtomicBool,
    }

    impl Link for Fake {
        fn is_dead(&self) -> bool {
            self.dead.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn id(&self) -> u64 {
            self.id
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_keeps_breaking_is_made_again_with_backoff() {
        let r: Redial<Fake> = Redial::new(([127, 0, 0, 1], 1).into(), "test");
        let (closed, _) = watch::channel(false);
        let made = std::sync::atomic::AtomicU64::new(0);
        let open = || async {
            let id = made.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            r.made();
            Ok(Arc::new(Fake {
                id,
                dead: false.into(),
            }))
        };
        let mut waits = Vec::new();
        for _ in 0..4 {
            let t0 = Instant::now();
            let c = r.connection(None, &closed, open).await.unwrap();
            waits.push(t0.elapsed());
            // The same one while it lives.
            assert_eq!(r.connection(None, &closed, open).await.unwrap().id, c.id);
            c.dead.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        // The first broke "soon" after its make as well: 100 ms, then
        // doubling.
        assert_eq!(
            waits,
            [100, 200, 400, 800].map(Duration::from_millis).to_vec()
        );
        closed.send_replace(true);
        r.take();
        assert!(matches!(
            r.connection(None, &closed, open).await,
            Err(ClientError::Shutdown)
        ));
    }
}
