//! Bookkeeping for records a leader holds back for the commit behind them
//! ([`super::leader::LeaderNode::commit_deferred`]), and for the one
//! waiter that makes sure they never wait long.
//!
//! A commit made while another writer is queued leaves its record in the
//! transport: the queued writer's commit sends both in one write per peer.
//! Two things bound that:
//! - at most [`MAX_DEFERRED`] commits in a row are held; the next one is
//!   sent at once (a saturated primary, where a writer is always queued,
//!   still sends every few commits);
//! - one waiting session per *episode* (from the first held record to the
//!   flush that sends it) is the flusher: it parks no longer than
//!   [`FLUSH_AFTER`] past the episode's start and flushes if nothing else
//!   did, and flushes on leaving if records are still held. Every other
//!   waiter parks until its own confirmation, so no herd wakes on a timer.
//!
//! Liveness rests on the engine's contract: a session that commits a
//! deferred record then waits for it (the output gate), and so either
//! becomes the episode's flusher or finds one.

use std::time::{Duration, Instant};

/// How long a held record may wait for the commit behind it.
pub const FLUSH_AFTER: Duration = Duration::from_micros(200);
/// Commits held in a row at most.
pub const MAX_DEFERRED: usize = 8;

/// The held records' episode, kept under the leader's watch lock.
#[derive(Debug, Default)]
pub(crate) struct Deferral {
    /// When the oldest held record was held (None: nothing is held).
    since: Option<Instant>,
    held: usize,
    /// Counts episodes, so a flusher of an ended one knows it.
    episode: u64,
    /// The episode whose flusher is parked (or about to be).
    flusher_of: Option<u64>,
}

/// What a waiter does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Held records are stale: flush them now.
    Flush,
    /// Park until this instant at most (or the waiter's own deadline).
    ParkUntil(Option<Instant>),
}

impl Deferral {
    /// A record was just held back; false once [`MAX_DEFERRED`] are: the
    /// caller then sends at once (which also ends the episode).
    pub(crate) fn hold(&mut self, now: Instant) -> bool {
        if self.held >= MAX_DEFERRED {
            return false;
        }
        if self.since.is_none() {
            self.since = Some(now);
            self.episode = self.episode.checked_add(1).expect("episode count");
        }
        self.held += 1;
        true
    }

    /// Everything held was sent (a flush, or a commit sent at once).
    pub(crate) fn sent(&mut self) {
        self.since = None;
        self.held = 0;
        self.flusher_of = None;
    }

    /// For a waiter about to park; `mine` is the episode it is the
    /// flusher of, if any (kept by the waiter across its loop).
    pub(crate) fn next(&mut self, now: Instant, mine: &mut Option<u64>) -> Next {
        let Some(since) = self.since else {
            *mine = None;
            return Next::ParkUntil(None);
        };
        let stale_at = since + FLUSH_AFTER;
        if now >= stale_at {
            return Next::Flush;
        }
        if *mine == Some(self.episode) {
            return Next::ParkUntil(Some(stale_at));
        }
        *mine = None;
        if self.flusher_of == Some(self.episode) {
            return Next::ParkUntil(None); // another waiter has it
        }
        self.flusher_of = Some(self.episode);
        *mine = Some(self.episode);
        Next::ParkUntil(Some(stale_at))
    }

    /// A waiter stops waiting; true if it must flush on its way out (it was
    /// this episode's flusher and records are still held).
    pub(crate) fn leave(&mut self, mine: Option<u64>) -> bool {
        if mine.is_some() && mine == self.flusher_of && mine == Some(self.episode) {
            self.flusher_of = None;
            return self.since.is_some();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_waiter_of_an_episode_is_its_flusher_and_the_rest_park_untimed() {
        let mut d = Deferral::default();
        let t0 = Instant::now();
        assert!(d.hold(t0));
        let (mut a, mut b) = (None, None);
        assert_eq!(d.next(t0, &mut a), Next::ParkUntil(Some(t0 + FLUSH_AFTER)));
        assert_eq!(d.next(t0, &mut b), Next::ParkUntil(None));
        assert_eq!(d.next(t0, &mut a), Next::ParkUntil(Some(t0 + FLUSH_AFTER)));
        assert_eq!(d.next(t0 + FLUSH_AFTER, &mut b), Next::Flush);
    }

    #[test]
    fn a_flusher_leaving_with_records_held_flushes_and_another_can_take_over() {
        let mut d = Deferral::default();
        let t0 = Instant::now();
        d.hold(t0);
        let (mut a, mut b) = (None, None);
        d.next(t0, &mut a);
        assert!(!d.leave(b), "not the flusher");
        assert!(d.leave(a), "the flusher leaves records held");
        assert_eq!(d.next(t0, &mut b), Next::ParkUntil(Some(t0 + FLUSH_AFTER)));
        d.sent();
        assert!(!d.leave(b), "nothing held any more");
    }

    #[test]
    fn a_flusher_of_an_ended_episode_is_not_the_next_ones() {
        let mut d = Deferral::default();
        let t0 = Instant::now();
        d.hold(t0);
        let (mut a, mut b) = (None, None);
        d.next(t0, &mut a);
        d.sent();
        assert_eq!(d.next(t0, &mut a), Next::ParkUntil(None));
        assert_eq!(a, None);
        let t1 = t0 + Duration::from_micros(10);
        d.hold(t1);
        assert_eq!(d.next(t1, &mut b), Next::ParkUntil(Some(t1 + FLUSH_AFTER)));
        assert!(!d.leave(a));
    }

    #[test]
    fn at_most_max_deferred_commits_are_held_in_a_row() {
        let mut d = Deferral::default();
        let t0 = Instant::now();
        for _ in 0..MAX_DEFERRED {
            assert!(d.hold(t0));
        }
        assert!(!d.hold(t0));
        d.sent();
        assert!(d.hold(t0));
        assert!(d.since.is_some());
    }
}
