//! The leader's deferred sends: what its ticker hands out after releasing
//! the core's lock, kept in order on each connection.
//!
//! A lazy flush sends every lazy follower the records it misses (dozens
//! each, every flush interval), and a promoted follower everything it
//! misses. Encoding, sealing and writing those under the core's lock held
//! up the eager followers' acks and the next commit behind it: with three
//! eager followers most of the slowest commits had a flush in them
//! (papers/performance-log.md, session 33). So the ticker queues a tick's
//! appends here and sends them after the lock is released, a few at a time
//! ([`DRAIN_PIECE`]), yielding between pieces.
//!
//! A follower refuses a record that does not follow the last one it was
//! sent (a gap), so what goes out on one connection must keep the order
//! the core gave it. The rule that keeps it: **a send or a close for a
//! connection with anything queued is queued too**, whoever makes it
//! ([`Outbox::queue_if_held`]). Every push happens under the core's lock,
//! so the queue holds each connection's messages in the core's order; a
//! connection's entries count as pending until they are written, so a
//! direct send is made only once everything queued before it has gone out.
//!
//! Only the ticker drains, and it drains until the queue is empty before
//! its next tick. Another thread queues only behind pending entries, the
//! check and the push one step under the outbox's lock, so the ticker is
//! still draining and will find them: nothing waits in the queue with no
//! one to send it. The queue holds at most one tick's sends
//! and what other threads add behind them while they drain (sends that
//! the unconfirmed-bytes window bounds).

use crate::net::{ConnId, Transport};
use crate::wire::Message;
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Entries the ticker writes between yields: small enough that an ack or a
/// commit waiting for the CPU gets it within a few sends.
pub const DRAIN_PIECE: usize = 8;

/// What was deferred for a connection.
#[derive(Debug)]
pub(super) enum Deferred {
    Send(ConnId, Message),
    Close(ConnId),
}

impl Deferred {
    pub(super) fn conn(&self) -> ConnId {
        match self {
            Deferred::Send(c, _) | Deferred::Close(c) => *c,
        }
    }
}

/// Sends waiting for the ticker, in order per connection.
#[derive(Debug, Default)]
pub(super) struct Outbox {
    /// Entries queued or being written: zero lets a sender skip the lock.
    /// It only grows under the core's lock, so a zero read under it stays
    /// true until that lock is released.
    pending: AtomicUsize,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    queue: VecDeque<Deferred>,
    /// Entries queued or being written, per connection (none: absent).
    per_conn: HashMap<ConnId, usize>,
}

impl Outbox {
    /// Whether `conn` has anything queued or being written.
    #[cfg(test)]
    fn holds(&self, conn: ConnId) -> bool {
        self.pending.load(Ordering::Acquire) != 0 && self.inner.lock().per_conn.contains_key(&conn)
    }

    /// Queues `entry` if its connection has anything queued or being
    /// written, and hands it back otherwise, for the caller to carry out at
    /// once (called under the core's lock). The check and the push are one
    /// step under the outbox's lock: a drain that finishes the connection's
    /// entries in between would otherwise leave this one queued with no
    /// drain to write it.
    pub(super) fn queue_if_held(&self, entry: Deferred) -> Option<Deferred> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return Some(entry); // nothing queued, and only we could add
        }
        let mut inner = self.inner.lock();
        if !inner.per_conn.contains_key(&entry.conn()) {
            return Some(entry);
        }
        Self::push_locked(&mut inner, entry);
        self.pending.fetch_add(1, Ordering::AcqRel);
        None
    }

    /// Queues `entries` in order, whatever is held (called under the
    /// core's lock, by the ticker, which drains after).
    pub(super) fn push(&self, entries: impl IntoIterator<Item = Deferred>) {
        let mut inner = self.inner.lock();
        let mut added = 0;
        for e in entries {
            Self::push_locked(&mut inner, e);
            added += 1;
        }
        self.pending.fetch_add(added, Ordering::AcqRel);
    }

    fn push_locked(inner: &mut Inner, entry: Deferred) {
        *inner.per_conn.entry(entry.conn()).or_insert(0) += 1;
        inner.queue.push_back(entry);
    }

    /// Writes everything queued, [`DRAIN_PIECE`] entries at a time with a
    /// yield between pieces, until the queue is empty (the ticker, without
    /// the core's lock). Returns how many entries it wrote.
    pub(super) fn drain(&self, transport: &dyn Transport) -> usize {
        let mut written = 0;
        loop {
            let piece: Vec<Deferred> = {
                let mut inner = self.inner.lock();
                let n = inner.queue.len().min(DRAIN_PIECE);
                if n == 0 {
                    return written;
                }
                inner.queue.drain(..n).collect()
            };
            write(transport, &piece);
            let mut inner = self.inner.lock();
            for e in &piece {
                let conn = e.conn();
                let left = inner
                    .per_conn
                    .get_mut(&conn)
                    .expect("a queued entry's connection is counted");
                assert!(*left > 0, "connection {conn}'s pending count underflows");
                *left -= 1;
                if *left == 0 {
                    inner.per_conn.remove(&conn);
                }
            }
            let before = self.pending.fetch_sub(piece.len(), Ordering::AcqRel);
            assert!(
                before >= piece.len(),
                "the outbox's pending count underflows"
            );
            drop(inner);
            written += piece.len();
            std::thread::yield_now();
        }
    }

    /// Entries queued or being written.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.pending.load(Ordering::Acquire)
    }
}

/// Writes `piece` in order: sends in a row together, a close after them.
fn write(transport: &dyn Transport, piece: &[Deferred]) {
    let mut sends: Vec<(ConnId, &Message)> = Vec::new();
    for e in piece {
        match e {
            Deferred::Send(conn, message) => sends.push((*conn, message)),
            Deferred::Close(conn) => {
                if !sends.is_empty() {
                    transport.send_many(&sends);
                    sends.clear();
                }
                transport.close(*conn);
            }
        }
    }
    if !sends.is_empty() {
        transport.send_many(&sends);
    }
}

#[cfg(test)]
#[path = "outbox_tests.rs"]
mod tests;
