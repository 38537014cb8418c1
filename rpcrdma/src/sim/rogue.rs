//! A responder that answers however a test tells it to, for exercising a
//! requester: it keeps receives posted, records every message it gets,
//! sends any bytes (with Send With Invalidate of any key), and can RDMA
//! Write into any of the peer's keys.

use super::fabric::{Fabric, SideId, SimCompletion, SimWr, Status};
use crate::conn::RemoteSeg;
use bytes::Bytes;

/// The scripted responder (side B).
#[derive(Debug)]
pub struct RawPeer {
    side: SideId,
    size: usize,
    next: u64,
    /// Messages received, in order.
    pub received: Vec<Bytes>,
    /// Failures of our own requests (a Write the peer's memory refused).
    pub failures: Vec<&'static str>,
    /// Writes that succeeded.
    pub writes_done: u64,
    /// Whether the link went down.
    pub broken: bool,
}

const TAG_RECV: u64 = 1 << 40;
const TAG_SEND: u64 = 2 << 40;
const TAG_WRITE: u64 = 3 << 40;

impl RawPeer {
    /// A peer on side B that posts `receives` receives of `size` bytes.
    pub fn new(f: &mut Fabric, receives: u32, size: usize) -> RawPeer {
        for i in 0..receives {
            f.post_recv(SideId::B, TAG_RECV | u64::from(i), size);
        }
        RawPeer {
            side: SideId::B,
            size,
            next: 0,
            received: Vec::new(),
            failures: Vec::new(),
            writes_done: 0,
            broken: false,
        }
    }

    /// Sends `data`, invalidating `invalidate` at the peer when set.
    pub fn send(&mut self, f: &mut Fabric, data: Vec<u8>, invalidate: Option<u32>) {
        self.next += 1;
        f.post_send(
            self.side,
            SimWr::Send {
                wr: TAG_SEND | self.next,
                signaled: true,
                data,
                invalidate,
            },
        );
    }

    /// RDMA Writes `data` to the peer's memory.
    pub fn write(&mut self, f: &mut Fabric, data: Vec<u8>, remote: RemoteSeg) {
        self.next += 1;
        f.post_send(
            self.side,
            SimWr::Write {
                wr: TAG_WRITE | self.next,
                signaled: true,
                data,
                remote,
            },
        );
    }

    fn completion(&mut self, f: &mut Fabric, c: SimCompletion) {
        match c.status {
            Status::Ok if c.recv => {
                self.received.push(Bytes::from(c.data));
                f.post_recv(self.side, c.wr, self.size);
            }
            Status::Ok => {
                if c.wr & TAG_WRITE == TAG_WRITE {
                    self.writes_done += 1;
                }
            }
            Status::Flushed => self.broken = true,
            Status::Failed(why) => {
                self.failures.push(why);
                self.broken = true;
            }
        }
    }
}

impl super::Endpoint for RawPeer {
    fn complete_one(&mut self, f: &mut Fabric) -> bool {
        let Some(c) = f.poll(self.side) else {
            return false;
        };
        self.completion(f, c);
        true
    }

    fn act(&mut self, _f: &mut Fabric) -> bool {
        false
    }
}
