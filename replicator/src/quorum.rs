//! The confirmed watermark: the highest bookmark that at least W of N
//! durability followers hold on stable storage. Sans-IO: acks in, a new
//! watermark out.

use crate::bookmark::Bookmark;

/// A follower's index among the N.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FollowerId(pub usize);

/// Why a quorum configuration was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    #[error("write quorum {w} is not a majority of {n} followers")]
    NotMajority { w: usize, n: usize },
    #[error("write quorum {w} exceeds the {n} followers")]
    TooLarge { w: usize, n: usize },
    #[error("follower {0} does not exist")]
    UnknownFollower(usize),
}

/// Tracks each follower's durable bookmark and the confirmed watermark.
#[derive(Debug, Clone)]
pub struct QuorumTracker {
    w: usize,
    durable: Vec<Bookmark>,
    confirmed: Bookmark,
    /// The watermark moves only to bookmarks of this epoch or later: a
    /// new leader confirms an older epoch's records only by confirming one
    /// of its own after them (copies from an old epoch never count alone).
    from_epoch: crate::bookmark::Epoch,
}

impl QuorumTracker {
    /// `n` followers, confirmation at `w` of them; `w` must be a majority so
    /// that any two quorums intersect (a new leader recovering from any W
    /// followers sees every confirmed record).
    pub fn new(n: usize, w: usize, start: Bookmark) -> Result<QuorumTracker, QuorumError> {
        if w > n {
            return Err(QuorumError::TooLarge { w, n });
        }
        if 2 * w <= n {
            return Err(QuorumError::NotMajority { w, n });
        }
        Ok(QuorumTracker {
            w,
            durable: vec![start; n],
            confirmed: start,
            from_epoch: crate::bookmark::Epoch(0),
        })
    }

    /// Confirms only bookmarks of `epoch` or later (a leader's own epoch).
    pub fn confirming_from(mut self, epoch: crate::bookmark::Epoch) -> QuorumTracker {
        self.from_epoch = epoch;
        self
    }

    pub fn confirmed(&self) -> Bookmark {
        self.confirmed
    }

    pub fn durable(&self, f: FollowerId) -> Option<Bookmark> {
        self.durable.get(f.0).copied()
    }

    /// Sets follower `f`'s position to what it reported on (re)connecting,
    /// even if lower than before (a cut corrupt tail): only what a follower
    /// holds now may count towards confirming later records. The confirmed
    /// watermark never moves back.
    pub fn reset(
        &mut self,
        f: FollowerId,
        durable: Bookmark,
    ) -> Result<Option<Bookmark>, QuorumError> {
        *self.slot(f)? = durable;
        Ok(self.recompute())
    }

    fn slot(&mut self, f: FollowerId) -> Result<&mut Bookmark, QuorumError> {
        self.durable
            .get_mut(f.0)
            .ok_or(QuorumError::UnknownFollower(f.0))
    }

    /// Raises the watermark to the W-th highest durable bookmark (held by
    /// at least W followers); returns it if it moved.
    fn recompute(&mut self) -> Option<Bookmark> {
        let mut sorted = self.durable.clone();
        sorted.sort_unstable_by(|a, b| b.cmp(a));
        let candidate = sorted[self.w - 1];
        if candidate > self.confirmed && candidate.epoch >= self.from_epoch {
            self.confirmed = candidate;
            return Some(candidate);
        }
        None
    }

    /// Records that follower `f` holds everything up to `durable`. Returns
    /// the new confirmed watermark if it advanced. Acks never move a
    /// follower backwards (a stale or reordered ack changes nothing).
    pub fn ack(
        &mut self,
        f: FollowerId,
        durable: Bookmark,
    ) -> Result<Option<Bookmark>, QuorumError> {
        let slot = self.slot(f)?;
        if durable <= *slot {
            return Ok(None);
        }
        *slot = durable;
        Ok(self.recompute())
    }
}

#[cfg(test)]
mod epoch_tests {
    use super::*;
    use crate::bookmark::{Epoch, Sequence};

    #[test]
    fn copies_from_an_older_epoch_never_confirm_by_themselves() {
        let b = |e, s| Bookmark::new(Epoch(e), Sequence(s));
        let mut q = QuorumTracker::new(3, 2, b(1, 2))
            .expect("quorum")
            .confirming_from(Epoch(2));
        assert_eq!(q.ack(FollowerId(0), b(1, 5)).expect("ack"), None);
        assert_eq!(q.ack(FollowerId(1), b(1, 5)).expect("ack"), None);
        assert_eq!(q.confirmed(), b(1, 2), "the adopted tail waits");
        q.ack(FollowerId(0), b(2, 1)).expect("ack");
        assert_eq!(q.ack(FollowerId(1), b(2, 1)).expect("ack"), Some(b(2, 1)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::{Epoch, Sequence};

    fn b(s: u64) -> Bookmark {
        Bookmark::new(Epoch(1), Sequence(s))
    }

    #[test]
    fn only_a_majority_quorum_is_accepted() {
        assert!(QuorumTracker::new(5, 3, b(0)).is_ok());
        assert_eq!(
            QuorumTracker::new(5, 2, b(0)).err(),
            Some(QuorumError::NotMajority { w: 2, n: 5 })
        );
        assert_eq!(
            QuorumTracker::new(4, 2, b(0)).err(),
            Some(QuorumError::NotMajority { w: 2, n: 4 })
        );
        assert_eq!(
            QuorumTracker::new(3, 4, b(0)).err(),
            Some(QuorumError::TooLarge { w: 4, n: 3 })
        );
    }

    #[test]
    fn the_watermark_is_the_highest_bookmark_w_followers_hold() {
        let mut q = QuorumTracker::new(5, 3, b(0)).expect("3 of 5");
        assert_eq!(q.ack(FollowerId(0), b(5)), Ok(None));
        assert_eq!(q.ack(FollowerId(1), b(3)), Ok(None));
        assert_eq!(q.ack(FollowerId(2), b(4)), Ok(Some(b(3))));
        assert_eq!(q.ack(FollowerId(3), b(9)), Ok(Some(b(4))));
        assert_eq!(q.ack(FollowerId(1), b(5)), Ok(Some(b(5))));
        assert_eq!(q.confirmed(), b(5));
    }

    #[test]
    fn a_minority_never_confirms_and_stale_acks_change_nothing() {
        let mut q = QuorumTracker::new(5, 3, b(0)).expect("3 of 5");
        assert_eq!(q.ack(FollowerId(0), b(100)), Ok(None));
        assert_eq!(q.ack(FollowerId(1), b(100)), Ok(None));
        assert_eq!(q.confirmed(), b(0), "two of five confirm nothing");
        assert_eq!(
            q.ack(FollowerId(1), b(50)),
            Ok(None),
            "an older ack is ignored"
        );
        assert_eq!(q.durable(FollowerId(1)), Some(b(100)));
        assert_eq!(
            q.ack(FollowerId(7), b(1)),
            Err(QuorumError::UnknownFollower(7))
        );
    }

    #[test]
    fn the_watermark_never_decreases_under_random_acks() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut q = QuorumTracker::new(5, 3, b(0)).expect("3 of 5");
        let mut last = b(0);
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = (x % 5) as usize;
            let s = (x >> 8) % 1_000;
            q.ack(FollowerId(f), b(s)).expect("known follower");
            assert!(q.confirmed() >= last);
            let holders = (0..5)
                .filter(|&i| q.durable(FollowerId(i)) >= Some(q.confirmed()))
                .count();
            assert!(holders >= 3, "the watermark is held by a quorum");
            last = q.confirmed();
        }
    }
}
