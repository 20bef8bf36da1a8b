//! Which followers get each record at once: the leader's thrifty fan-out.
//!
//! A record is confirmed once W of the N followers hold it, so streaming it
//! to all N at once spends N - W deliveries, writes, flushes and acks on
//! the commit path that the confirmation never waits for (on a shared
//! machine they compete with the W it does wait for). With
//! [`FanOut::eager`] < N, each record goes at once to the `eager`
//! followers only; the others (*lazy*) get what they miss in batches:
//! every [`FanOut::lazy_flush_interval_us`], once
//! [`FanOut::lazy_batch_bytes`] wait for them, at once when an eager
//! follower stalls, before the tail drops a record one has not been sent,
//! and when the leader stops.
//!
//! Nothing about durability changes: an ack still means durable, a record
//! is still confirmed by W acks from any followers, and a lazy follower's
//! acks count as soon as they come. What changes is the tail of the
//! latency: a commit waits for the slowest eager follower, so one that
//! falls behind is swapped out. Every [`FanOut::stall_after_us`], an eager
//! follower that has not acknowledged what another eager follower had
//! acknowledged by the check before gives its place to the lazy follower
//! holding the most, which is sent everything first, and the other lazy
//! followers get their batch at once (their acks count too); one that goes
//! away is replaced at once. So a stalled follower delays a commit by at
//! most about two stall checks after its peers' acks (the one that sets
//! the mark after them, and the next), and a lost one not at all, while
//! the batches can be larger.
//!
//! The bar is the other eager followers' acks, not the clock: followers
//! that all sit one round trip away (another region) take longer than a
//! stall check to acknowledge anything, and measured against the commit
//! they would all look stalled at every check and be swapped to no end.
//! Measured against each other, only one that trails the rest by more
//! than a check is.
//!
//! Replicas are not followers: every record goes to each streaming replica
//! at once, as before.

use super::{Kind, Leader, LeaderAction, PeerId};
use crate::bookmark::Bookmark;
use crate::quorum::FollowerId;
use crate::wire::Message;

/// How records reach the followers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FanOut {
    /// Followers streamed every record as it commits: from W (the fewest
    /// that can confirm it) to N (all of them, no batching).
    pub eager: usize,
    /// The lazy followers are sent what they miss at least this often
    /// (the driver's clock, via [`super::LeaderEvent::Tick`]).
    pub lazy_flush_interval_us: u64,
    /// How long an eager follower may trail the other eager followers'
    /// acks before it is swapped out (at most the flush interval; the
    /// driver ticks this often while a batch waits).
    pub stall_after_us: u64,
    /// ... or as soon as this many bytes of records wait for them.
    pub lazy_batch_bytes: usize,
}

impl FanOut {
    /// How often the lazy followers get their batch unless configured.
    pub const DEFAULT_LAZY_FLUSH_INTERVAL_US: u64 = 10_000;

    /// Every follower streamed every record at once.
    pub fn all(followers: usize) -> FanOut {
        FanOut {
            eager: followers,
            lazy_flush_interval_us: 0,
            stall_after_us: 0,
            lazy_batch_bytes: 0,
        }
    }

    /// W followers streamed at once, the rest every 10 ms or 256 KiB; an
    /// eager follower stalled for 2 ms is swapped out.
    pub fn thrifty(write_quorum: usize) -> FanOut {
        FanOut {
            eager: write_quorum,
            lazy_flush_interval_us: FanOut::DEFAULT_LAZY_FLUSH_INTERVAL_US,
            stall_after_us: 2_000,
            lazy_batch_bytes: 256 << 10,
        }
    }

    /// How often the driver must tick while a batch waits.
    pub fn tick_us(&self) -> u64 {
        self.stall_after_us.min(self.lazy_flush_interval_us)
    }

    /// Whether some followers are lazy.
    pub fn batches(&self, followers: usize) -> bool {
        self.eager < followers
    }
}

impl Leader {
    /// Sends `peer` every tail record after what it was last sent.
    pub(super) fn send_pending(&mut self, peer: PeerId, out: &mut Vec<LeaderAction>) {
        let Some(p) = self.peers.get(&peer).copied() else {
            return;
        };
        if p.sent >= self.last {
            return;
        }
        // The tail never drops what a streaming peer was not sent
        // (`flush_before_trim`), so its records are all here.
        assert!(
            p.sent >= self.tail_start,
            "peer sent up to {} but the tail starts after {}",
            p.sent,
            self.tail_start
        );
        let from = self.tail.partition_point(|r| r.bookmark <= p.sent);
        for r in self.tail.range(from..) {
            Self::send(out, peer, Message::Append(r.clone()));
        }
        if let Some(p) = self.peers.get_mut(&peer) {
            p.sent = self.last;
        }
    }

    /// Sends the newest record (already in the tail) to every eager peer,
    /// and the lazy followers their batch once it is large enough.
    pub(super) fn fan_out(&mut self, bytes: usize, out: &mut Vec<LeaderAction>) {
        // Eager followers first: the commit waits for their acks, not for
        // a replica's apply (the committing session writes these sends in
        // this order, and each costs the loopback's delivery).
        let ids = self.streaming_ids();
        for followers in [true, false] {
            for &id in &ids {
                if self
                    .peers
                    .get(&id)
                    .is_some_and(|p| p.eager && matches!(p.kind, Kind::Follower(_)) == followers)
                {
                    self.send_pending(id, out);
                }
            }
        }
        if self.config.fan_out.batches(self.config.followers) {
            self.lazy_pending_bytes += bytes;
            if self.lazy_pending_bytes >= self.config.fan_out.lazy_batch_bytes {
                self.flush_lazy(out);
            }
        }
    }

    /// Eager followers swapped out for falling behind since the start (a
    /// follower that keeps stalling shows here).
    pub fn eager_swaps(&self) -> u64 {
        self.eager_swaps
    }

    /// Whether records committed since the last lazy flush wait for it.
    pub fn lazy_pending(&self) -> bool {
        self.lazy_pending_bytes > 0
    }

    /// Sends every lazy follower what it misses.
    pub(super) fn flush_lazy(&mut self, out: &mut Vec<LeaderAction>) {
        for id in self.streaming_ids() {
            if self.peers.get(&id).is_some_and(|p| !p.eager) {
                self.send_pending(id, out);
            }
        }
        self.lazy_pending_bytes = 0;
    }

    /// Flushes the lazy followers if the tail is about to drop a record
    /// one of them was not sent.
    pub(super) fn flush_before_trim(&mut self, dropping: Bookmark, out: &mut Vec<LeaderAction>) {
        if self
            .peers
            .values()
            .any(|p| p.streaming && p.sent < dropping)
        {
            self.flush_lazy(out);
        }
    }

    /// Whether a follower that starts streaming now is eager: while fewer
    /// than [`FanOut::eager`] are.
    pub(super) fn eager_wanted(&self) -> bool {
        self.eager_followers().len() < self.config.fan_out.eager
    }

    fn eager_followers(&self) -> Vec<PeerId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.streaming && p.eager && matches!(p.kind, Kind::Follower(_)))
            .map(|(id, _)| *id)
            .collect()
    }

    /// What follower `id` holds durably, as its acks said (nothing for a
    /// peer that is not a follower, or has not acked yet).
    fn acknowledged(&self, id: PeerId) -> Bookmark {
        match self.peers.get(&id).map(|p| p.kind) {
            Some(Kind::Follower(i)) => self.quorum.durable(FollowerId(i)).unwrap_or(Bookmark::ZERO),
            _ => Bookmark::ZERO,
        }
    }

    /// The most any eager follower has acknowledged.
    fn eager_acknowledged(&self) -> Bookmark {
        self.eager_followers()
            .into_iter()
            .map(|id| self.acknowledged(id))
            .max()
            .unwrap_or(Bookmark::ZERO)
    }

    /// Lazy streaming followers, the one holding the most first.
    fn lazy_by_durable(&self) -> Vec<PeerId> {
        let mut lazy: Vec<(Bookmark, PeerId)> = self
            .peers
            .iter()
            .filter(|(_, p)| p.streaming && !p.eager && matches!(p.kind, Kind::Follower(_)))
            .map(|(id, _)| (self.acknowledged(*id), *id))
            .collect();
        lazy.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        lazy.into_iter().map(|(_, id)| id).collect()
    }

    /// Makes `peer` eager, sending it what it misses first.
    fn promote(&mut self, peer: PeerId, out: &mut Vec<LeaderAction>) {
        self.send_pending(peer, out);
        if let Some(p) = self.peers.get_mut(&peer) {
            p.eager = true;
        }
    }

    /// Tops the eager followers up to [`FanOut::eager`] from the lazy ones
    /// (after one went away).
    pub(super) fn rebalance(&mut self, out: &mut Vec<LeaderAction>) {
        let missing = self
            .config
            .fan_out
            .eager
            .saturating_sub(self.eager_followers().len());
        for id in self.lazy_by_durable().into_iter().take(missing) {
            tracing::debug!(peer = id.0, "a lazy follower becomes eager");
            self.promote(id, out);
        }
    }

    /// The periodic stall check and lazy flush (see the module's doc).
    pub(super) fn lazy_tick(&mut self, now_us: u64, out: &mut Vec<LeaderAction>) {
        let fan_out = self.config.fan_out;
        if !fan_out.batches(self.config.followers) {
            return;
        }
        let due =
            |last: Option<u64>, every: u64| last.is_none_or(|t| now_us.saturating_sub(t) >= every);
        let mut flush = due(self.last_lazy_flush_us, fan_out.lazy_flush_interval_us);
        if due(self.last_stall_check_us, fan_out.tick_us()) {
            // Eager followers that still miss what another eager one had
            // acknowledged by the check before swap places with the lazy
            // ones holding the most; the rest of the lazy followers get
            // their batch now.
            let mark = self.last_at_stall_check;
            let stalled: Vec<PeerId> = self
                .eager_followers()
                .into_iter()
                .filter(|&id| self.acknowledged(id) < mark)
                .collect();
            let candidates = self.lazy_by_durable();
            for (slow, quick) in stalled.iter().zip(candidates) {
                tracing::debug!(
                    slow = slow.0,
                    quick = quick.0,
                    "an eager follower fell behind: a lazy one takes its place"
                );
                self.promote(quick, out);
                if let Some(p) = self.peers.get_mut(slow) {
                    p.eager = false;
                }
                self.eager_swaps = self
                    .eager_swaps
                    .checked_add(1)
                    .expect("eager swaps fit in a u64");
            }
            flush |= !stalled.is_empty();
            self.last_stall_check_us = Some(now_us);
            self.last_at_stall_check = self.eager_acknowledged();
        }
        if flush {
            self.flush_lazy(out);
            self.last_lazy_flush_us = Some(now_us);
        }
    }
}

#[cfg(test)]
#[path = "leader_fan_out_tests.rs"]
mod tests;
