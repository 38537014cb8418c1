//! A way to wake a thread that sleeps on a completion channel for
//! something other than a completion (work handed to it by another
//! thread): an eventfd, polled beside the channel's descriptor
//! ([`CompletionChannel::get_event_or_wake`](super::CompletionChannel::get_event_or_wake)).

use super::{Result, VerbsError};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An eventfd that any thread may signal. A wake-up is kept until the
/// sleeper takes it ([`Waker::take`]), so one that comes before the
/// sleeper sleeps is not lost: the sleep then ends at once.
#[derive(Debug)]
pub struct Waker {
    fd: File,
}

impl Waker {
    /// A new waker, not signalled.
    pub fn new() -> Result<Waker> {
        // SAFETY: eventfd takes no pointers; the flags are valid.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(VerbsError::last_os("eventfd"));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Waker { fd: File::from(fd) })
    }

    /// Signals the waker: the sleeper's wait ends (now, or at once when
    /// it next sleeps).
    pub fn wake(&self) {
        // Only a counter at its limit (2^64 - 2 wake-ups never taken)
        // refuses the write, and the waker is signalled then anyway.
        let _ = (&self.fd).write(&1u64.to_ne_bytes());
    }

    /// Takes the pending wake-ups: true if there were any.
    pub fn take(&self) -> bool {
        let mut b = [0u8; 8];
        matches!((&self.fd).read(&mut b), Ok(8))
    }

    /// The descriptor to poll for reading.
    pub(crate) fn fd(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn readable(w: &Waker) -> bool {
        super::super::wait_readable(w.fd(), Some(Duration::ZERO)).unwrap()
    }

    #[test]
    fn a_wake_up_is_kept_until_taken_once() {
        let w = Waker::new().unwrap();
        assert!(!readable(&w));
        assert!(!w.take());
        w.wake();
        w.wake();
        assert!(readable(&w), "a wake-up before the sleep ends it at once");
        assert!(w.take(), "the wake-ups are there");
        assert!(!readable(&w), "taken, both at once");
        assert!(!w.take());
    }

    #[test]
    fn a_sleeper_wakes_when_another_thread_signals() {
        let w = Arc::new(Waker::new().unwrap());
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            // Only the wake-up ends this wait before its (generous) limit.
            super::super::wait_readable(w2.fd(), Some(Duration::from_secs(30))).unwrap()
        });
        w.wake();
        assert!(t.join().unwrap(), "the wait ran out");
        assert!(w.take());
    }
}
