use super::*;
use crate::bookmark::{Bookmark, Epoch};
use std::net::SocketAddr;
use std::sync::Arc;

/// A transport that records what it is asked to do, in order; each call
/// can take a while, so another thread gets to run during a drain.
#[derive(Default)]
struct Recorder {
    /// (connection, the heartbeat's `sent_us` or u64::MAX for a close).
    log: Mutex<Vec<(ConnId, u64)>>,
    /// Entries per `send_many` call.
    batches: Mutex<Vec<usize>>,
    slow_us: u64,
}

impl Transport for Recorder {
    fn listen(&self, addr: SocketAddr) -> std::io::Result<SocketAddr> {
        Ok(addr)
    }
    fn connect(&self, _addr: SocketAddr, _tag: u64) {}
    fn send(&self, conn: ConnId, message: &Message) {
        self.send_many(&[(conn, message)]);
    }
    fn send_many(&self, sends: &[(ConnId, &Message)]) {
        if self.slow_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(self.slow_us));
        }
        self.batches.lock().push(sends.len());
        let mut log = self.log.lock();
        for (conn, m) in sends {
            let Message::Heartbeat { sent_us, .. } = m else {
                panic!("only numbered heartbeats here")
            };
            log.push((*conn, *sent_us));
        }
    }
    fn close(&self, conn: ConnId) {
        self.log.lock().push((conn, u64::MAX));
    }
    fn backend(&self) -> &'static str {
        "recorder"
    }
    fn auth_refusals(&self) -> u64 {
        0
    }
    fn shutdown(&self) {}
}

/// A message numbered `n`.
fn m(n: u64) -> Message {
    Message::Heartbeat {
        epoch: Epoch(1),
        confirmed: Bookmark::ZERO,
        sent_us: n,
    }
}

fn on(log: &[(ConnId, u64)], conn: ConnId) -> Vec<u64> {
    log.iter()
        .filter(|(c, _)| *c == conn)
        .map(|e| e.1)
        .collect()
}

#[test]
fn a_connection_with_nothing_queued_is_not_held_and_one_with_entries_is_until_they_are_written() {
    let outbox = Outbox::default();
    let t = Recorder::default();
    assert!(!outbox.holds(1));
    outbox.push([Deferred::Send(1, m(1)), Deferred::Send(1, m(2))]);
    assert!(outbox.holds(1));
    assert!(!outbox.holds(2), "another connection is not held");
    assert_eq!(outbox.pending(), 2);
    assert_eq!(outbox.drain(&t), 2);
    assert!(!outbox.holds(1));
    assert_eq!(outbox.pending(), 0);
    assert_eq!(on(&t.log.lock(), 1), vec![1, 2]);
}

#[test]
fn a_drain_writes_every_entry_in_order_in_pieces_of_at_most_drain_piece() {
    let outbox = Outbox::default();
    let t = Recorder::default();
    let n = DRAIN_PIECE as u64 * 3 + 5;
    outbox.push((1..=n).map(|i| Deferred::Send(i % 3, m(i))));
    assert_eq!(outbox.drain(&t), n as usize);
    let log = t.log.lock();
    for conn in 0..3 {
        let got = on(&log, conn);
        let want: Vec<u64> = (1..=n).filter(|i| i % 3 == conn).collect();
        assert_eq!(got, want, "connection {conn}");
    }
    let batches = t.batches.lock();
    assert!(batches.iter().all(|b| *b <= DRAIN_PIECE), "{batches:?}");
    assert_eq!(batches.len(), 4);
}

#[test]
fn a_close_queued_behind_sends_is_written_after_them() {
    let outbox = Outbox::default();
    let t = Recorder::default();
    outbox.push([
        Deferred::Send(7, m(1)),
        Deferred::Close(7),
        Deferred::Send(8, m(2)),
    ]);
    outbox.drain(&t);
    assert_eq!(*t.log.lock(), vec![(7, 1), (7, u64::MAX), (8, 2)]);
}

/// The leader's rule, as its `run` applies it under the core's lock: a
/// message for a held connection is queued, any other is sent at once.
fn send_or_queue(outbox: &Outbox, t: &dyn Transport, conn: ConnId, n: u64) {
    if let Some(Deferred::Send(conn, message)) = outbox.queue_if_held(Deferred::Send(conn, m(n))) {
        t.send(conn, &message);
    }
}

#[test]
fn sends_made_while_the_ticker_drains_go_out_after_what_it_queued_on_the_same_connection() {
    let outbox = Arc::new(Outbox::default());
    let t = Arc::new(Recorder {
        slow_us: 200,
        ..Recorder::default()
    });
    let core = Arc::new(Mutex::new(()));
    let next = Arc::new(AtomicUsize::new(1));
    // The committer: numbers its messages from the shared counter under
    // the core's lock, as commits are ordered by it.
    let committer = {
        let (outbox, t, core, next) = (
            Arc::clone(&outbox),
            Arc::clone(&t),
            Arc::clone(&core),
            Arc::clone(&next),
        );
        std::thread::spawn(move || {
            for _ in 0..400 {
                let _core = core.lock();
                let n = next.fetch_add(1, Ordering::Relaxed) as u64;
                send_or_queue(&outbox, t.as_ref(), 1, n);
                send_or_queue(&outbox, t.as_ref(), 2, n);
            }
        })
    };
    // The ticker: queues a batch for connection 1 under the lock, then
    // drains without it.
    for _ in 0..20 {
        {
            let _core = core.lock();
            let entries: Vec<Deferred> = (0..30)
                .map(|_| Deferred::Send(1, m(next.fetch_add(1, Ordering::Relaxed) as u64)))
                .collect();
            outbox.push(entries);
        }
        outbox.drain(t.as_ref());
    }
    committer.join().expect("committer");
    outbox.drain(t.as_ref());
    assert_eq!(outbox.pending(), 0);
    let log = t.log.lock();
    for conn in [1, 2] {
        let got = on(&log, conn);
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "connection {conn} reordered: {got:?}"
        );
    }
    assert_eq!(on(&log, 1).len(), 400 + 20 * 30);
    assert_eq!(on(&log, 2).len(), 400);
}
