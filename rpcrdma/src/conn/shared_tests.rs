//! A connection whose receives come from a shared receive queue
//! ([`Config::shared_receives`]): which buffers it holds, which it gives
//! back, and what it leaves the driver to return when it ends.

use super::call::tests::null_reply;
use super::{recv, Config, ConnError, Connection, Event, Role, Work};
use crate::requester::{plan_call, Registrations, ReplyExpect, RequesterConfig};
use bytes::Bytes;

/// An inline RDMA_MSG carrying an RPC NULL call with `xid`.
fn null_call(xid: u32) -> Bytes {
    let words = [
        xid, 1, 8, 0, 0, 0, 0, // RPC-over-RDMA header, no chunks
        xid, 0, 2, 100_003, 3, 0, 0, 0, 0, 0, // CALL NFSv3 NULL, AUTH_NONE
    ];
    Bytes::from(
        words
            .iter()
            .flat_map(|w| w.to_be_bytes())
            .collect::<Vec<u8>>(),
    )
}

fn shared(credits: u32) -> Connection<Bytes> {
    Connection::new(Config {
        credits,
        send_slots: credits,
        shared_receives: true,
        ..Config::default()
    })
}

fn calls(c: &mut Connection<Bytes>) -> Vec<super::CallId> {
    let mut ids = Vec::new();
    while let Some(ev) = c.poll_event() {
        if let Event::Call(id) = ev {
            ids.push(id);
        }
    }
    ids
}

fn reposts(c: &mut Connection<Bytes>) -> Vec<u32> {
    let mut out = Vec::new();
    while let Some(w) = c.poll_work() {
        if let Work::Recv { buffer, wr } = w {
            assert_eq!(wr, recv::wr_id(buffer));
            out.push(buffer);
        }
    }
    out
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

#[test]
fn shared_buffers_are_held_by_their_calls_and_given_back_when_done() {
    let mut c = shared(2);
    assert_eq!(
        reposts(&mut c),
        Vec::<u32>::new(),
        "nothing posted at start"
    );
    // Any buffer of the pool may complete on the connection.
    c.received(recv::wr_id(1000), null_call(1), None);
    c.received(recv::wr_id(7), null_call(2), None);
    let ids = calls(&mut c);
    assert_eq!(ids.len(), 2);
    assert_eq!(c.held_receives(), 2);
    assert_eq!(sorted(c.held_buffers()), vec![7, 1000]);
    c.no_reply(ids[0]);
    assert_eq!(
        reposts(&mut c),
        vec![1000],
        "the first call's buffer goes back"
    );
    assert_eq!(c.held_buffers(), vec![7]);
    // The same buffer again, posted anew, is a new message.
    c.received(recv::wr_id(1000), null_call(3), None);
    assert_eq!(calls(&mut c).len(), 1);
    assert!(!c.is_closed());
    // A buffer completing while its message still holds it is the
    // driver's fault.
    c.received(recv::wr_id(7), null_call(4), None);
    assert!(matches!(
        c.poll_event(),
        Some(Event::Closed(ConnError::Driver(_)))
    ));
}

#[test]
fn a_call_beyond_the_grant_ends_the_connection_and_every_buffer_it_held_is_left_to_return() {
    let mut c = shared(2);
    c.received(recv::wr_id(3), null_call(1), None);
    c.received(recv::wr_id(4), null_call(2), None);
    let ids = calls(&mut c);
    // Buffer 3's call is done with, but the driver has not taken the
    // work that posts it again when the connection ends.
    c.no_reply(ids[0]);
    c.received(recv::wr_id(5), null_call(3), None);
    assert_eq!(calls(&mut c).len(), 1, "within the grant again");
    // A third call with two in use: beyond the grant of 2.
    c.received(recv::wr_id(6), null_call(4), None);
    let ended = std::iter::from_fn(|| c.poll_event())
        .any(|ev| matches!(ev, Event::Closed(ConnError::Protocol(ref m)) if m.contains("credits")));
    assert!(ended, "a call beyond the grant ends the connection");
    assert_eq!(
        reposts(&mut c),
        Vec::<u32>::new(),
        "nothing to post once ended"
    );
    // A receive that completes after the end is held too: the driver
    // returns it with the rest.
    c.received(recv::wr_id(9), null_call(5), None);
    assert_eq!(sorted(c.held_buffers()), vec![3, 4, 5, 6, 9]);
}

#[test]
fn a_connection_with_its_own_buffers_posts_them_all_at_start() {
    let mut c: Connection<Bytes> = Connection::new(Config {
        credits: 3,
        send_slots: 3,
        ..Config::default()
    });
    assert_eq!(reposts(&mut c), vec![0, 1, 2]);
    assert_eq!(c.held_buffers(), Vec::<u32>::new());
    c.close_now();
    assert_eq!(c.held_buffers(), Vec::<u32>::new());
}

#[test]
fn a_reply_to_a_backward_call_in_a_shared_buffer_is_matched_and_its_buffer_given_back_at_once() {
    // The responder side of RFC 8167: forward calls and one backward call
    // slot, every receive from the shared queue.
    let mut c: Connection<Bytes> = Connection::new(Config {
        credits: 2,
        calls: 1,
        call_reserve: 0,
        send_slots: 3,
        role: Role::Responder,
        shared_receives: true,
        ..Config::default()
    });
    assert_eq!(c.config().calls, 1, "a backward call slot kept");
    assert_eq!(
        reposts(&mut c),
        Vec::<u32>::new(),
        "nothing posted at start"
    );
    // A forward call holds its shared buffer while it is served.
    c.received(recv::wr_id(40), null_call(1), None);
    let forward = calls(&mut c);
    assert_eq!(forward.len(), 1);
    // A backward NULL goes out.
    let slot = c.reserve_call().expect("a backward call slot");
    let plan = plan_call(
        0x77,
        &RequesterConfig::default(),
        ReplyExpect::small(0),
        &|s: &mut dyn nfsrdma_xdr::XdrSink| s.put_raw(&[0; 40]),
    );
    let message = vec![plan.header(1, &Registrations::default())];
    c.start_call(slot, plan, message, Vec::new(), 0);
    let send = std::iter::from_fn(|| c.poll_work())
        .find_map(|w| match w {
            Work::Send(chain) => Some(chain[0].wr),
            _ => None,
        })
        .expect("the backward call's Send");
    c.completed(send);
    // Its reply arrives in another buffer of the pool: it answers the
    // call, and the buffer goes back at once while the forward call
    // still holds its own.
    c.received(recv::wr_id(41), null_reply(0x77), None);
    assert!(!c.is_closed(), "{:?}", c.poll_event());
    assert_eq!(reposts(&mut c), vec![41], "the reply's buffer goes back");
    assert_eq!(c.held_buffers(), vec![40]);
    let replied = std::iter::from_fn(|| c.poll_event()).any(|e| e == Event::Reply { slot });
    assert!(replied, "the backward call's reply handed over");
    assert!(c.take_reply(slot).is_some());
    c.finish_call(slot);
    assert_eq!(c.reserve_call(), Some(slot), "the slot is free again");
    c.no_reply(forward[0]);
    assert_eq!(reposts(&mut c), vec![40]);
    assert_eq!(c.held_receives(), 0);
    assert_eq!(c.stats().unmatched_replies, 0);
}

#[test]
fn replies_carry_the_grant_in_force_and_a_call_sent_under_a_higher_one_is_served() {
    let mut c = shared(4);
    // The credit field of the reply header (RFC 8166 §4.2.1: xid, vers,
    // credit, proc).
    let grant_in_reply = |c: &Connection<Bytes>, id| {
        let plan = c
            .plan_reply(id, |_| {})
            .expect("a call held")
            .expect("a plan");
        u32::from_be_bytes(plan.header[8..12].try_into().unwrap())
    };
    c.received(recv::wr_id(1), null_call(1), None);
    let first = calls(&mut c);
    assert_eq!(grant_in_reply(&c, first[0]), 4, "all the credits at first");
    assert_eq!(c.set_grant(2), 2);
    assert_eq!(c.grant(), 2);
    assert_eq!(
        grant_in_reply(&c, first[0]),
        2,
        "a reply built now carries the lower grant"
    );
    // The requester sent these before it saw the lower grant: within
    // the credits, they are served.
    for xid in 2..=4 {
        c.received(recv::wr_id(xid), null_call(xid), None);
    }
    assert_eq!(calls(&mut c).len(), 3);
    assert!(!c.is_closed());
    // A fifth at once is beyond the credits.
    c.received(recv::wr_id(5), null_call(5), None);
    assert!(
        c.is_closed(),
        "a call beyond the credits still ends the connection"
    );
    assert_eq!(c.set_grant(0), 1, "never zero");
}
