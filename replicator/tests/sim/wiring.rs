//! The simulation's wiring: connections between its nodes, messages
//! queued on them, and each core's actions carried out (sends, syncs,
//! confirmations, catch-up).

use super::*;

impl Sim {
    // ---- connections -------------------------------------------------

    pub(crate) fn new_conn_id(&mut self) -> u64 {
        self.next_conn += 1;
        self.next_conn
    }

    pub(crate) fn connect(&mut self, g_new: usize, index: usize) {
        let id = self.new_conn_id();
        self.conns.insert(
            id,
            Conn {
                leader: g_new,
                index,
            },
        );
        self.leaders[g_new].conn[index] = id;
        let a = self.leaders[g_new]
            .core
            .handle(LeaderEvent::FollowerConnected {
                peer: PeerId(id),
                index,
            });
        self.leader_actions(g_new, a);
    }

    /// The connection is gone for both ends (what was in flight is lost).
    pub(crate) fn disconnect(&mut self, id: u64, redial: bool) {
        let Some(c) = self.conns.remove(&id) else {
            return;
        };
        self.queues.remove(&(id, true));
        self.queues.remove(&(id, false));
        let a = self.followers[c.index]
            .core
            .handle(FollowerEvent::Disconnected { peer: PeerId(id) });
        self.follower_actions(c.index, a);
        if self.leaders[c.leader].conn[c.index] == id {
            self.leaders[c.leader].conn[c.index] = 0;
        }
        let a = self.leaders[c.leader]
            .core
            .handle(LeaderEvent::Disconnected { peer: PeerId(id) });
        self.leader_actions(c.leader, a);
        if redial && self.leaders[c.leader].alive && self.followers[c.index].up {
            self.connect(c.leader, c.index);
        }
    }

    pub(crate) fn push(&mut self, id: u64, to_follower: bool, w: Wire) {
        if self.conns.contains_key(&id) {
            self.queues
                .entry((id, to_follower))
                .or_default()
                .push_back(w);
        }
    }

    // ---- actions -------------------------------------------------------

    pub(crate) fn leader_actions(&mut self, g_new: usize, actions: Vec<LeaderAction>) {
        for a in actions {
            match a {
                LeaderAction::Send { peer, message } if peer == REPLICA_PEER => {
                    if self.replica_leader == Some(g_new) {
                        self.to_replica.push_back(Wire::Msg(message));
                    }
                }
                LeaderAction::Send { peer, message } => {
                    self.push(peer.0, true, Wire::Msg(message));
                }
                LeaderAction::Confirmed(c) => self.confirmed(g_new, c),
                LeaderAction::Close { peer, .. } if peer == REPLICA_PEER => {
                    if self.replica_leader == Some(g_new) {
                        self.to_replica.push_back(Wire::Close { redial: true });
                    }
                }
                LeaderAction::Close { peer, reason } => {
                    // Like a socket shutdown: what was sent still arrives.
                    // A follower sent away to catch up reconnects after.
                    let redial = reason != CloseReason::Behind;
                    self.push(peer.0, true, Wire::Close { redial });
                }
                LeaderAction::Fenced(_) => {
                    *self.stats.entry("fenced").or_default() += 1;
                    // It stops writing; the engine would stop serving.
                    self.leaders[g_new].alive = false;
                }
            }
        }
    }

    pub(crate) fn confirmed(&mut self, g_new: usize, c: Bookmark) {
        let l = &mut self.leaders[g_new];
        assert!(c > l.confirmed, "confirmed moved back");
        assert!(c <= l.core.last(), "confirmed past the last record");
        assert_eq!(c.epoch, l.epoch, "a leader confirms only in its epoch");
        l.confirmed = c;
        let holders = self.followers.iter().filter(|f| f.durable() >= c).count();
        assert!(holders >= W, "{c} confirmed but durable on {holders}");
        let newly: Vec<(Bookmark, ChainHash)> = l
            .history
            .iter()
            .filter(|r| r.bookmark <= c)
            .map(|r| (r.bookmark, r.chain))
            .collect();
        let epoch = l.epoch;
        // A leader that lost its epoch must never confirm what a newer
        // leader's history does not hold.
        for newer in &self.leaders[g_new + 1..] {
            if let Some((b, chain)) = newer_misses(&newer.history, &newly).first() {
                panic!(
                    "epoch {epoch} confirmed {b} ({chain}) that epoch {} dropped",
                    newer.epoch
                );
            }
        }
        for (b, chain) in newly {
            let before = self.acked.insert(b, chain);
            assert!(
                before.is_none_or(|x| x == chain),
                "{b} acknowledged twice with different content"
            );
        }
    }

    pub(crate) fn follower_actions(&mut self, i: usize, actions: Vec<FollowerAction>) {
        for a in actions {
            let f = &mut self.followers[i];
            match a {
                FollowerAction::PersistPromise(p) => f.promise = p,
                FollowerAction::Append(r) => {
                    assert_eq!(
                        r.previous,
                        f.log.last().map_or(Bookmark::ZERO, |l| l.bookmark),
                        "append out of order"
                    );
                    f.log.push(r);
                }
                FollowerAction::Sync { upto } => f.pending_syncs.push_back(upto),
                FollowerAction::Truncate { after } => {
                    // The runtime syncs what it staged, then cuts durably.
                    f.pending_syncs.clear();
                    let keep = f.log.partition_point(|r| r.bookmark <= after);
                    assert!(
                        f.log[..keep].last().is_none_or(|r| r.bookmark == after)
                            || after == Bookmark::ZERO,
                        "cut at a bookmark the log holds"
                    );
                    f.log.truncate(keep);
                    f.durable_len = keep;
                    let end = f.log.last().map_or(LogEnd::GENESIS, |r| LogEnd {
                        last: r.bookmark,
                        chain: r.chain,
                    });
                    let more = f.core.handle(FollowerEvent::Truncated {
                        last: end.last,
                        chain: end.chain,
                    });
                    self.follower_actions(i, more);
                }
                FollowerAction::Send { peer, message } if self.conns.contains_key(&peer.0) => {
                    self.push(peer.0, false, Wire::Msg(message));
                }
                // Catch-up is served synchronously (`reconnect_pending`).
                FollowerAction::Send { .. } | FollowerAction::ServeCatchUp { .. } => {}
                FollowerAction::Close { peer } if self.conns.contains_key(&peer.0) => {
                    self.push(peer.0, false, Wire::Close { redial: true });
                }
                FollowerAction::Close { .. } => {}
                FollowerAction::DialCatchUp => f.behind = true,
                // The simulation releases nothing: no follower's log starts
                // after another's end.
                FollowerAction::ResetToArchived { start, .. } => {
                    panic!("follower {i} told to start over at {start}, but nothing was released")
                }
            }
        }
    }

    pub(crate) fn replica_actions(&mut self, actions: Vec<SubscriberAction>) {
        for a in actions {
            match a {
                SubscriberAction::DiscardUnconfirmed => {
                    self.replica_applied.truncate(self.replica_visible.len());
                }
                SubscriberAction::Apply(r) => self.replica_applied.push(r),
                SubscriberAction::Confirm(c) => {
                    let n = self.replica_applied.partition_point(|r| r.bookmark <= c);
                    self.replica_visible = self.replica_applied[..n].to_vec();
                    for r in &self.replica_visible {
                        assert_eq!(
                            self.acked.get(&r.bookmark),
                            Some(&r.chain),
                            "the replica revealed {} that was not acknowledged",
                            r.bookmark
                        );
                    }
                }
                SubscriberAction::Send(Source::Leader, m) => self.from_replica.push_back(m),
                SubscriberAction::Send(Source::Follower, _) => {}
                SubscriberAction::Close(Source::Leader) => {
                    self.drop_replica_connection();
                    self.replica_reconnect = true;
                }
                SubscriberAction::Close(Source::Follower) => {}
                SubscriberAction::CatchUpFromFollower => self.replica_behind = true,
                SubscriberAction::Archived { start, .. } => {
                    panic!("replica sent to cold storage at {start}, but nothing was released")
                }
                SubscriberAction::Refused(r) => panic!(
                    "replica refused ({r:?}) at {} (acked up to {:?})",
                    self.replica.confirmed(),
                    self.acked.keys().last()
                ),
            }
        }
    }

    pub(crate) fn drop_replica_connection(&mut self) {
        self.to_replica.clear();
        self.from_replica.clear();
        if let Some(g) = self.replica_leader.take() {
            let a = self.leaders[g]
                .core
                .handle(LeaderEvent::Disconnected { peer: REPLICA_PEER });
            self.leader_actions(g, a);
            let a = self
                .replica
                .handle(SubscriberEvent::Disconnected(Source::Leader));
            self.replica_actions(a);
        }
    }

    // ---- catch-up (served synchronously) ---------------------------

    /// Follower `j`'s answer to a catch-up request from `from`.
    pub(crate) fn serve_catch_up(
        &mut self,
        j: usize,
        from: Bookmark,
    ) -> Option<(Vec<Encoded>, Bookmark)> {
        if !self.followers[j].up {
            return None;
        }
        let actions = self.followers[j].core.handle(FollowerEvent::Received {
            peer: CATCH_UP_PEER,
            message: Message::CatchUp { from },
        });
        for a in actions {
            match a {
                FollowerAction::ServeCatchUp { after, upto, .. } => {
                    let f = &self.followers[j];
                    let records = f.log[..f.durable_len]
                        .iter()
                        .filter(|r| r.bookmark > after && r.bookmark <= upto)
                        .cloned()
                        .collect();
                    return Some((records, upto));
                }
                FollowerAction::Send {
                    message: Message::CatchUpDone { upto },
                    ..
                } => return Some((Vec::new(), upto)),
                _ => {}
            }
        }
        None
    }

    /// Follower `i` catches up from follower `j`, as its core asks.
    pub(crate) fn follower_catch_up(&mut self, i: usize, j: usize) -> bool {
        let mut actions = self.followers[i]
            .core
            .handle(FollowerEvent::CatchUpConnected {
                peer: CATCH_UP_PEER,
            });
        loop {
            let mut next = None;
            let mut rest = Vec::new();
            for a in actions {
                match a {
                    FollowerAction::Send {
                        peer: CATCH_UP_PEER,
                        message: Message::CatchUp { from },
                    } => next = Some(from),
                    other => rest.push(other),
                }
            }
            self.follower_actions(i, rest);
            let Some(from) = next else { return true };
            let Some((records, upto)) = self.serve_catch_up(j, from) else {
                let a = self.followers[i].core.handle(FollowerEvent::Disconnected {
                    peer: CATCH_UP_PEER,
                });
                self.follower_actions(i, a);
                return false;
            };
            let mut out = Vec::new();
            for r in records {
                out.extend(self.followers[i].core.handle(FollowerEvent::Received {
                    peer: CATCH_UP_PEER,
                    message: Message::Append(r),
                }));
            }
            out.extend(self.followers[i].core.handle(FollowerEvent::Received {
                peer: CATCH_UP_PEER,
                message: Message::CatchUpDone { upto },
            }));
            actions = out;
        }
    }

    /// Peers sent away catch up from a random live follower, then
    /// reconnect; the replica (re)subscribes to the newest leader.
    pub(crate) fn reconnect_pending(&mut self) {
        for i in 0..N {
            if !(self.followers[i].behind && self.followers[i].up) {
                continue;
            }
            let j = self.rng.random_range(0..N);
            if j == i || !self.follower_catch_up(i, j) {
                continue;
            }
            self.followers[i].behind = false;
            if let Some(g) = self.newest() {
                if self.leaders[g].conn[i] == 0 {
                    self.connect(g, i);
                }
            }
        }
        if self.replica_behind {
            let j = self.rng.random_range(0..N);
            let a = self
                .replica
                .handle(SubscriberEvent::Connected(Source::Follower));
            self.replica_actions(a);
            let from = self.replica.confirmed();
            if let Some((records, upto)) = self.serve_catch_up(j, from) {
                for r in records {
                    let a = self.replica.handle(SubscriberEvent::Received(
                        Source::Follower,
                        Message::Append(r),
                    ));
                    self.replica_actions(a);
                }
                let a = self.replica.handle(SubscriberEvent::Received(
                    Source::Follower,
                    Message::CatchUpDone { upto },
                ));
                self.replica_actions(a);
                self.replica_behind = false;
                self.replica_reconnect = true;
            }
            let a = self
                .replica
                .handle(SubscriberEvent::Disconnected(Source::Follower));
            self.replica_actions(a);
        }
        if self.replica_reconnect && !self.replica_behind {
            if let Some(g) = self.newest() {
                self.replica_reconnect = false;
                self.replica_leader = Some(g);
                let a = self.leaders[g]
                    .core
                    .handle(LeaderEvent::ReplicaConnected { peer: REPLICA_PEER });
                self.leader_actions(g, a);
                let a = self
                    .replica
                    .handle(SubscriberEvent::Connected(Source::Leader));
                self.replica_actions(a);
            }
        }
    }
}
