//! A log's epoch history: for each epoch that has records in the log, the
//! last sequence it reached, oldest epoch first. It is how a follower finds
//! where its log leaves a new leader's history (the diverged suffix it must
//! cut), without either side shipping the log.
//!
//! Why the answer is right: within one epoch there is exactly one leader
//! (an epoch is won from W followers, each promising it to one leader
//! only), and it issues each sequence once, so a bookmark names one record
//! everywhere. Every record names its predecessor, so two logs holding the
//! same bookmark agree on everything before it. The newest bookmark both
//! histories hold is therefore where they part: for the newest epoch they
//! share, the lower of their two ends.

use crate::bookmark::{Bookmark, Epoch, Sequence};

/// Epoch runs kept and exchanged at most (older ones are forgotten; a log
/// whose divergence lies further back is cut to its start and refetched).
pub const MAX_RUNS: usize = 4096;

/// Per epoch present in a log, the last sequence it reached.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    runs: Vec<(Epoch, Sequence)>,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    /// A history from runs that must be strictly increasing in epoch, each
    /// with a nonzero sequence (None otherwise).
    pub fn from_runs(runs: Vec<(Epoch, Sequence)>) -> Option<History> {
        let ordered = runs.windows(2).all(|w| w[0].0 < w[1].0);
        let nonzero = runs.iter().all(|(_, s)| s.0 > 0);
        (ordered && nonzero && runs.len() <= MAX_RUNS).then_some(History { runs })
    }

    pub fn runs(&self) -> &[(Epoch, Sequence)] {
        &self.runs
    }

    /// The last bookmark of the history (ZERO when empty).
    pub fn last(&self) -> Bookmark {
        self.runs
            .last()
            .map_or(Bookmark::ZERO, |(e, s)| Bookmark::new(*e, *s))
    }

    /// Notes a record appended at `at` (after everything held).
    pub fn record(&mut self, at: Bookmark) {
        assert!(at > self.last(), "history only grows forward: {at}");
        match self.runs.last_mut() {
            Some((e, s)) if *e == at.epoch => *s = at.sequence,
            _ => {
                self.runs.push((at.epoch, at.sequence));
                if self.runs.len() > MAX_RUNS {
                    self.runs.remove(0);
                }
            }
        }
    }

    /// Forgets everything after `keep`.
    pub fn cut_after(&mut self, keep: Bookmark) {
        self.runs.retain(|(e, _)| *e <= keep.epoch);
        if let Some((e, s)) = self.runs.last_mut() {
            if *e == keep.epoch {
                *s = (*s).min(keep.sequence);
            }
        }
        self.runs.retain(|(_, s)| s.0 > 0);
    }

    /// Whether the history holds `at` (ZERO is everyone's start).
    pub fn holds(&self, at: Bookmark) -> bool {
        at == Bookmark::ZERO
            || self
                .runs
                .iter()
                .any(|(e, s)| *e == at.epoch && at.sequence.0 >= 1 && at.sequence <= *s)
    }

    /// The newest bookmark both this history and `other` hold: where a log
    /// with this history must be cut to follow `other`. None when they
    /// share no epoch at all.
    pub fn common_with(&self, other: &History) -> Option<Bookmark> {
        self.runs.iter().rev().find_map(|(e, mine)| {
            other
                .runs
                .iter()
                .find(|(oe, _)| oe == e)
                .map(|(_, theirs)| Bookmark::new(*e, (*mine).min(*theirs)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(runs: &[(u32, u64)]) -> History {
        History::from_runs(
            runs.iter()
                .map(|(e, s)| (Epoch(*e), Sequence(*s)))
                .collect(),
        )
        .expect("valid runs")
    }
    fn b(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    #[test]
    fn a_suffix_from_a_lost_epoch_is_cut_back_to_the_shared_epoch() {
        // Epoch 2 wrote two records only here; epoch 3 adopted (1,6).
        let follower = h(&[(1, 4), (2, 2)]);
        let leader = h(&[(1, 6), (3, 5)]);
        assert_eq!(follower.common_with(&leader), Some(b(1, 4)));
        let longer = h(&[(1, 8)]);
        assert_eq!(longer.common_with(&leader), Some(b(1, 6)));
    }

    #[test]
    fn a_lost_epoch_between_two_shared_ones_is_cut_even_below_a_newer_shared_epoch() {
        // The follower holds (2,1) which the leader's history never had,
        // then (5,1) from a leader that was never confirmed.
        let follower = h(&[(1, 4), (2, 1), (5, 1)]);
        let leader = h(&[(1, 6), (3, 2), (6, 1)]);
        assert_eq!(follower.common_with(&leader), Some(b(1, 4)));
    }

    #[test]
    fn histories_with_no_epoch_in_common_share_nothing() {
        assert_eq!(h(&[(2, 3)]).common_with(&h(&[(1, 3)])), None);
    }

    #[test]
    fn recording_and_cutting_keep_the_runs_exact() {
        let mut x = History::new();
        for at in [b(1, 1), b(1, 2), b(3, 1), b(3, 2), b(3, 3)] {
            x.record(at);
        }
        assert_eq!(x, h(&[(1, 2), (3, 3)]));
        assert!(x.holds(b(3, 2)) && !x.holds(b(2, 1)) && !x.holds(b(3, 4)));
        x.cut_after(b(3, 1));
        assert_eq!(x, h(&[(1, 2), (3, 1)]));
        x.cut_after(b(2, 9));
        assert_eq!(x, h(&[(1, 2)]));
        x.cut_after(Bookmark::ZERO);
        assert_eq!(x, History::new());
    }

    #[test]
    fn unordered_or_empty_runs_are_refused() {
        assert!(
            History::from_runs(vec![(Epoch(2), Sequence(1)), (Epoch(1), Sequence(1))]).is_none()
        );
        assert!(History::from_runs(vec![(Epoch(2), Sequence(0))]).is_none());
    }
}
