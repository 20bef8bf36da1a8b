//! The durability follower's protocol core. Sans-IO: events in (messages
//! received, storage done), actions out (append, sync, persist a promise,
//! cut the log, send). The real transport and a deterministic simulator
//! drive the same code.
//!
//! Rules:
//! - **Promises.** A leader's handshake claims an epoch. The follower
//!   promises it to that leader (persisted before it answers) only if the
//!   epoch is newer than its promise, or is the promised epoch from the
//!   same leader; anything else is refused as stale. So no two leaders can
//!   each win W followers in one epoch. Its answer is the promise: where
//!   its log ends, that record's chain and its epoch history. Only a
//!   leader's handshake raises the epoch: an append from a newer epoch is
//!   refused as `NotIntroduced`.
//! - **Order.** An append must follow the follower's log: its `previous`
//!   is the last record and its `prev_chain` that record's chain. A
//!   duplicate is ignored (and re-acked); anything else is refused as a
//!   gap, with an ack of where the follower stands (the leader then
//!   reconnects and resumes from the handshake position).
//! - **Truncation.** A leader that finds the follower's log off its own
//!   history sends that history; the follower cuts its log back to the
//!   newest bookmark both hold ([`History::common_with`]). Only the
//!   leader it promised to can make it cut.
//! - **Group sync.** At most one sync is in flight. Records appended while
//!   it runs are covered by the next one, issued when it completes: one
//!   fdatasync per group, however many records arrived.
//! - **Acks** carry the highest bookmark durable on this follower and its
//!   chain, and are sent only after a sync that covers it.
//! - **Catch-up** serves other nodes only records both confirmed and
//!   durable here; the leader it promised to may read its whole durable log
//!   (a new leader adopting it). A follower the leader sends away
//!   (`Behind`) fetches confirmed history from a peer, whatever its epoch,
//!   as long as it chains.

use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::epoch_file::Promise;
use crate::history::History;
use crate::ids::{DatabaseId, NodeId};
use crate::leader::PeerId;
use crate::record::Encoded;
use crate::wire::{Message, RefuseReason, Role};

/// What happened to the follower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerEvent {
    /// A message arrived on a connection.
    Received { peer: PeerId, message: Message },
    /// A connection ended.
    Disconnected { peer: PeerId },
    /// The connection asked for with [`FollowerAction::DialCatchUp`] is up.
    CatchUpConnected { peer: PeerId },
    /// The dial asked for with [`FollowerAction::DialCatchUp`] failed.
    CatchUpFailed,
    /// A sync issued by [`FollowerAction::Sync`] completed.
    Synced { upto: Bookmark },
    /// A cut asked for with [`FollowerAction::Truncate`] is done (and
    /// durable): the log now ends at `last`, whose chain is `chain`.
    Truncated { last: Bookmark, chain: ChainHash },
}

/// What the follower asks its IO to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerAction {
    /// Make the promise durable before anything else is done in its epoch.
    PersistPromise(Promise),
    /// Append the record to the log (not yet durable).
    Append(Encoded),
    /// Make everything appended up to `upto` durable, then report
    /// [`FollowerEvent::Synced`].
    Sync {
        upto: Bookmark,
    },
    /// Cut every record after `after` from the log, durably, then report
    /// [`FollowerEvent::Truncated`].
    Truncate {
        after: Bookmark,
    },
    /// Stream to `peer` a bounded batch of the records after `after` up to
    /// `upto`, then `CatchUpDone` naming the last one sent (the peer asks
    /// again from there).
    ServeCatchUp {
        peer: PeerId,
        after: Bookmark,
        upto: Bookmark,
    },
    Send {
        peer: PeerId,
        message: Message,
    },
    /// Drop this connection.
    Close {
        peer: PeerId,
    },
    /// Connect to a peer follower to catch up from; report
    /// [`FollowerEvent::CatchUpConnected`] or [`FollowerEvent::CatchUpFailed`].
    DialCatchUp,
}

/// Where the follower stands in fetching history from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CatchUp {
    Idle,
    Dialing,
    /// Streaming from `peer`; the last request asked from `from`.
    From {
        peer: PeerId,
        from: Bookmark,
    },
}

/// Where a log ends: a bookmark and that record's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    pub last: Bookmark,
    pub chain: ChainHash,
}

impl LogEnd {
    pub const GENESIS: LogEnd = LogEnd {
        last: Bookmark::ZERO,
        chain: ChainHash::GENESIS,
    };
}

/// One follower's protocol state.
#[derive(Debug, Clone)]
pub struct Follower {
    database: DatabaseId,
    promise: Promise,
    appended: LogEnd,
    durable: LogEnd,
    /// The epoch history of the appended log.
    history: History,
    confirmed: Bookmark,
    /// The end the sync in flight covers.
    sync_in_flight: Option<LogEnd>,
    sync_wanted: bool,
    /// The connection whose leader handshake was accepted: the only one
    /// whose appends, confirms, heartbeats and cuts are taken.
    leader: Option<PeerId>,
    catch_up: CatchUp,
    /// A cut in progress: no appends are taken until it is reported.
    truncating: bool,
}

impl Follower {
    /// A follower whose persisted promise is `promise` and whose log (after
    /// recovery) ends at `end` with `history`, all of it durable.
    pub fn new(database: DatabaseId, promise: Promise, end: LogEnd, history: History) -> Follower {
        Follower {
            database,
            promise,
            appended: end,
            durable: end,
            history,
            confirmed: Bookmark::ZERO,
            sync_in_flight: None,
            sync_wanted: false,
            leader: None,
            catch_up: CatchUp::Idle,
            truncating: false,
        }
    }

    pub fn epoch(&self) -> Epoch {
        self.promise.epoch
    }
    pub fn promise(&self) -> Promise {
        self.promise
    }
    pub fn durable(&self) -> Bookmark {
        self.durable.last
    }
    pub fn last_appended(&self) -> Bookmark {
        self.appended.last
    }
    pub fn history(&self) -> &History {
        &self.history
    }
    /// The connection catch-up is streaming from, if any.
    pub fn catch_up_source(&self) -> Option<PeerId> {
        match self.catch_up {
            CatchUp::From { peer, .. } => Some(peer),
            _ => None,
        }
    }

    fn send(peer: PeerId, message: Message) -> FollowerAction {
        FollowerAction::Send { peer, message }
    }

    fn refuse(&self, peer: PeerId, reason: RefuseReason) -> FollowerAction {
        Self::send(
            peer,
            Message::Refuse {
                epoch: self.promise.epoch,
                reason,
            },
        )
    }

    fn ack(&self, peer: PeerId) -> FollowerAction {
        Self::send(
            peer,
            Message::Ack {
                durable: self.durable.last,
                chain: self.durable.chain,
            },
        )
    }

    /// Takes a leader's claim on `epoch`: true if promised (now or before)
    /// to `node`, false (and refused) otherwise.
    fn promise_to(
        &mut self,
        peer: PeerId,
        epoch: Epoch,
        node: NodeId,
        out: &mut Vec<FollowerAction>,
    ) -> bool {
        let same = epoch == self.promise.epoch && node == self.promise.leader;
        if epoch < self.promise.epoch || (epoch == self.promise.epoch && !same) {
            out.push(self.refuse(peer, RefuseReason::StaleEpoch));
            return false;
        }
        if !same {
            self.promise = Promise {
                epoch,
                leader: node,
            };
            out.push(FollowerAction::PersistPromise(self.promise));
        }
        true
    }

    fn request_sync(&mut self, out: &mut Vec<FollowerAction>) {
        if self.sync_in_flight.is_some() {
            self.sync_wanted = true;
        } else {
            self.sync_in_flight = Some(self.appended);
            out.push(FollowerAction::Sync {
                upto: self.appended.last,
            });
        }
    }

    /// Takes `record` after the log's end if it chains on; false if not.
    fn take(&mut self, record: Encoded, out: &mut Vec<FollowerAction>) -> bool {
        if record.previous != self.appended.last || record.prev_chain != self.appended.chain {
            return false;
        }
        self.appended = LogEnd {
            last: record.bookmark,
            chain: record.chain,
        };
        self.history.record(record.bookmark);
        out.push(FollowerAction::Append(record));
        self.request_sync(out);
        true
    }

    /// Handles one event; returns the actions to carry out, in order.
    pub fn handle(&mut self, event: FollowerEvent) -> Vec<FollowerAction> {
        let mut out = Vec::new();
        match event {
            FollowerEvent::Received { peer, message } => {
                if self.catch_up_source() == Some(peer) {
                    self.on_catch_up_stream(peer, message, &mut out);
                } else {
                    self.received(peer, message, &mut out);
                }
            }
            FollowerEvent::Disconnected { peer } => {
                if self.leader == Some(peer) {
                    self.leader = None;
                }
                if self.catch_up_source() == Some(peer) {
                    self.catch_up = CatchUp::Idle;
                }
            }
            FollowerEvent::CatchUpConnected { peer } => {
                if self.catch_up == CatchUp::Dialing {
                    let from = self.appended.last;
                    self.catch_up = CatchUp::From { peer, from };
                    out.push(Self::send(peer, Message::CatchUp { from }));
                } else {
                    out.push(FollowerAction::Close { peer });
                }
            }
            FollowerEvent::CatchUpFailed => {
                if self.catch_up == CatchUp::Dialing {
                    self.catch_up = CatchUp::Idle;
                }
            }
            FollowerEvent::Synced { upto } => {
                let covered = self.sync_in_flight.take();
                if let Some(end) = covered.filter(|e| e.last == upto && upto > self.durable.last) {
                    self.durable = end;
                    if let Some(leader) = self.leader {
                        out.push(self.ack(leader));
                    }
                }
                if self.sync_wanted {
                    self.sync_wanted = false;
                    self.request_sync(&mut out);
                }
            }
            FollowerEvent::Truncated { last, chain } => {
                let end = LogEnd { last, chain };
                self.truncating = false;
                // The runtime synced before it cut: no sync is outstanding
                // for this log any more.
                self.sync_in_flight = None;
                self.sync_wanted = false;
                self.appended = end;
                self.durable = end;
                self.history.cut_after(last);
                self.confirmed = self.confirmed.min(last);
            }
        }
        out
    }

    fn received(&mut self, peer: PeerId, message: Message, out: &mut Vec<FollowerAction>) {
        match message {
            Message::Handshake {
                database,
                epoch,
                role,
                node,
                ..
            } => {
                if database != self.database {
                    out.push(self.refuse(peer, RefuseReason::WrongDatabase));
                } else if role == Role::Leader && self.promise_to(peer, epoch, node, out) {
                    self.leader = Some(peer);
                    // What is appended but not yet synced was never checked
                    // against this leader's history (it resumes from the
                    // durable position it is told): drop it, or a
                    // diverged record could pass for one of its own.
                    if self.appended.last > self.durable.last && !self.truncating {
                        self.truncating = true;
                        out.push(FollowerAction::Truncate {
                            after: self.durable.last,
                        });
                    }
                    let mut history = self.history.clone();
                    history.cut_after(self.durable.last);
                    out.push(Self::send(
                        peer,
                        Message::Handshake {
                            database: self.database,
                            epoch: self.promise.epoch,
                            role: Role::Follower,
                            node: NodeId::NONE,
                            last_durable: self.durable.last,
                            last_chain: self.durable.chain,
                            confirmed: self.confirmed.min(self.durable.last),
                            history,
                        },
                    ));
                }
            }
            // Log traffic is taken only from the accepted leader.
            Message::Append(_)
            | Message::Confirm { .. }
            | Message::Heartbeat { .. }
            | Message::Truncate { .. }
                if self.leader != Some(peer) =>
            {
                out.push(FollowerAction::Close { peer });
            }
            Message::Truncate { history } => {
                // Cut back to where the log meets the leader's history; the
                // leader closes the connection and redials to resume.
                let keep = self
                    .history
                    .common_with(&history)
                    .unwrap_or(Bookmark::ZERO)
                    .min(self.appended.last);
                if keep < self.appended.last && !self.truncating {
                    self.truncating = true;
                    tracing::warn!(
                        from = %self.appended.last,
                        to = %keep,
                        "follower cuts a suffix that left the leader's history"
                    );
                    out.push(FollowerAction::Truncate { after: keep });
                }
            }
            Message::Append(record) => {
                // Only a leader's handshake raises the epoch: an append from
                // a newer epoch that never introduced itself is refused, so
                // a stray message cannot fence every future leader.
                if record.bookmark.epoch > self.promise.epoch {
                    out.push(self.refuse(peer, RefuseReason::NotIntroduced));
                    return;
                }
                // Older epochs are fine: a new leader streams the tail it
                // adopted. The guard above took this from the leader that
                // holds the current promise; the chain decides the rest.
                if self.truncating {
                    return; // the leader resends after the cut
                }
                if record.bookmark <= self.appended.last {
                    out.push(self.ack(peer)); // a duplicate: say where we stand
                } else if !self.take(record, out) {
                    out.push(self.refuse(peer, RefuseReason::Gap));
                    out.push(self.ack(peer));
                }
            }
            Message::Confirm { confirmed, .. } | Message::Heartbeat { confirmed, .. } => {
                self.confirmed = self.confirmed.max(confirmed.min(self.appended.last));
            }
            Message::Refuse {
                reason: RefuseReason::Behind,
                ..
            } if self.leader == Some(peer) || self.leader.is_none() => {
                if self.catch_up == CatchUp::Idle {
                    self.catch_up = CatchUp::Dialing;
                    out.push(FollowerAction::DialCatchUp);
                }
            }
            Message::CatchUp { from } => {
                // Serve others only what is both confirmed and durable here;
                // the leader this follower promised to may read all of it.
                let upto = if self.leader == Some(peer) {
                    self.durable.last
                } else {
                    self.confirmed.min(self.durable.last)
                };
                if from < upto {
                    out.push(FollowerAction::ServeCatchUp {
                        peer,
                        after: from,
                        upto,
                    });
                } else {
                    out.push(Self::send(peer, Message::CatchUpDone { upto }));
                }
            }
            Message::Ack { .. } | Message::CatchUpDone { .. } | Message::Refuse { .. } => {}
        }
    }

    /// A message on the connection catch-up streams from: confirmed
    /// history, taken whatever its epoch as long as it chains, one batch
    /// per request until a batch brings nothing.
    fn on_catch_up_stream(
        &mut self,
        peer: PeerId,
        message: Message,
        out: &mut Vec<FollowerAction>,
    ) {
        let CatchUp::From { from, .. } = self.catch_up else {
            return;
        };
        match message {
            Message::Append(record) => {
                let at = record.bookmark;
                if at <= self.appended.last {
                    // already held
                } else if self.truncating || !self.take(record, out) {
                    self.catch_up = CatchUp::Idle;
                    out.push(FollowerAction::Close { peer });
                } else {
                    self.confirmed = self.confirmed.max(at);
                }
            }
            Message::CatchUpDone { upto } => {
                self.confirmed = self.confirmed.max(upto.min(self.appended.last));
                if upto > from {
                    let next = self.appended.last.max(upto);
                    self.catch_up = CatchUp::From { peer, from: next };
                    out.push(Self::send(peer, Message::CatchUp { from: next }));
                } else {
                    self.catch_up = CatchUp::Idle;
                    out.push(FollowerAction::Close { peer });
                }
            }
            _ => {
                self.catch_up = CatchUp::Idle;
                out.push(FollowerAction::Close { peer });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::Sequence;
    use crate::chain::ChainHash;
    use crate::record::testing::{chain_at, chained};
    use bytes::Bytes;

    const DB: DatabaseId = DatabaseId(7);
    const LEADER: PeerId = PeerId(1);
    const OTHER: PeerId = PeerId(2);
    const SOURCE: PeerId = PeerId(3);

    fn b(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    fn rec(e: u32, s: u64, prev: Bookmark) -> Encoded {
        chained(
            crate::record::Record {
                bookmark: b(e, s),
                previous: prev,
                prev_chain: crate::chain::ChainHash::GENESIS,
                commit_us: 0,
                page_size: 512,
                db_pages: 1,
                pages: vec![(1, Bytes::from(vec![s as u8; 512]))],
            },
            false,
        )
    }

    fn recv(f: &mut Follower, peer: PeerId, message: Message) -> Vec<FollowerAction> {
        f.handle(FollowerEvent::Received { peer, message })
    }

    fn send(peer: PeerId, message: Message) -> FollowerAction {
        FollowerAction::Send { peer, message }
    }

    fn handshake(epoch: u32) -> Message {
        Message::Handshake {
            database: DB,
            epoch: Epoch(epoch),
            role: Role::Leader,
            last_durable: Bookmark::ZERO,
            node: crate::ids::NodeId(1),
            last_chain: crate::chain::ChainHash::GENESIS,
            confirmed: Bookmark::ZERO,
            history: crate::history::History::new(),
        }
    }

    fn promised(epoch: u32) -> Promise {
        Promise {
            epoch: Epoch(epoch),
            leader: NodeId(1),
        }
    }

    /// A follower whose log ends at `last` (one epoch run).
    fn at(epoch: u32, last: Bookmark) -> Follower {
        let mut history = History::new();
        if last.sequence.0 > 0 {
            history.record(last);
        }
        let end = LogEnd {
            last,
            chain: chain_at(last),
        };
        Follower::new(DB, promised(epoch), end, history)
    }

    /// A follower at `last` whose leader (connection LEADER) is accepted.
    fn led(epoch: u32, last: Bookmark) -> Follower {
        let mut f = at(epoch, last);
        recv(&mut f, LEADER, handshake(epoch));
        f
    }

    fn append(f: &mut Follower, r: Encoded) -> Vec<FollowerAction> {
        recv(f, LEADER, Message::Append(r))
    }

    #[test]
    fn records_are_acked_only_after_a_sync_covers_them_and_syncs_are_grouped() {
        let mut f = led(1, b(1, 0));
        let a = append(&mut f, rec(1, 1, b(1, 0)));
        assert!(
            matches!(a[..], [FollowerAction::Append(_), FollowerAction::Sync { upto }] if upto == b(1, 1))
        );
        // Two more arrive while the sync runs: no new sync yet, no ack.
        assert!(matches!(
            append(&mut f, rec(1, 2, b(1, 1)))[..],
            [FollowerAction::Append(_)]
        ));
        assert!(matches!(
            append(&mut f, rec(1, 3, b(1, 2)))[..],
            [FollowerAction::Append(_)]
        ));
        let a = f.handle(FollowerEvent::Synced { upto: b(1, 1) });
        assert_eq!(
            a,
            vec![
                send(
                    LEADER,
                    Message::Ack {
                        durable: b(1, 1),
                        chain: chain_at(b(1, 1))
                    }
                ),
                FollowerAction::Sync { upto: b(1, 3) },
            ],
            "one sync for the two that waited"
        );
        let a = f.handle(FollowerEvent::Synced { upto: b(1, 3) });
        assert_eq!(
            a,
            vec![send(
                LEADER,
                Message::Ack {
                    durable: b(1, 3),
                    chain: chain_at(b(1, 3))
                }
            )]
        );
    }

    #[test]
    fn older_epochs_are_fenced_and_newer_ones_are_persisted_first() {
        let mut f = led(3, b(3, 5));
        // A claim on an older epoch, or on the promised epoch by another
        // leader, is refused.
        for (epoch, node) in [(2, 1), (3, 2)] {
            let mut claim = handshake(epoch);
            if let Message::Handshake { node: n, .. } = &mut claim {
                *n = NodeId(node);
            }
            let a = recv(&mut f, OTHER, claim);
            assert_eq!(
                a,
                vec![send(
                    OTHER,
                    Message::Refuse {
                        epoch: Epoch(3),
                        reason: RefuseReason::StaleEpoch
                    }
                )],
                "epoch {epoch} from leader {node}"
            );
        }
        let a = recv(&mut f, OTHER, handshake(4));
        assert_eq!(a[0], FollowerAction::PersistPromise(promised(4)));
        assert!(
            matches!(&a[1], FollowerAction::Send { peer: OTHER, message: Message::Handshake { epoch: Epoch(4), last_durable, .. } } if *last_durable == b(3, 5))
        );
        let a = recv(
            &mut f,
            OTHER,
            Message::Handshake {
                database: DatabaseId(8),
                epoch: Epoch(9),
                role: Role::Leader,
                last_durable: b(0, 0),
                node: crate::ids::NodeId(1),
                last_chain: crate::chain::ChainHash::GENESIS,
                confirmed: Bookmark::ZERO,
                history: crate::history::History::new(),
            },
        );
        assert_eq!(
            a,
            vec![send(
                OTHER,
                Message::Refuse {
                    epoch: Epoch(4),
                    reason: RefuseReason::WrongDatabase
                }
            )]
        );
    }

    #[test]
    fn the_leader_streams_an_adopted_tail_from_an_older_epoch_that_must_chain() {
        let mut f = led(3, b(1, 4));
        let a = append(&mut f, rec(1, 5, b(1, 4)));
        assert!(matches!(
            a[..],
            [FollowerAction::Append(_), FollowerAction::Sync { .. }]
        ));
        // Same position, another history: a gap, never taken.
        let mut stranger = rec(1, 6, b(1, 5));
        stranger.prev_chain = ChainHash::over(&[b"elsewhere"]);
        let a = append(&mut f, stranger);
        assert!(matches!(
            &a[0],
            FollowerAction::Send {
                message: Message::Refuse {
                    reason: RefuseReason::Gap,
                    ..
                },
                ..
            }
        ));
        assert_eq!(f.last_appended(), b(1, 5));
    }

    #[test]
    fn a_truncate_from_the_leader_cuts_the_suffix_that_left_its_history() {
        let mut f = led(3, b(1, 0));
        for s in 1..=3 {
            append(&mut f, rec(1, s, b(1, s - 1)));
        }
        append(&mut f, rec(2, 1, b(1, 3)));
        let leader = History::from_runs(vec![(Epoch(1), Sequence(2)), (Epoch(3), Sequence(1))])
            .expect("runs");
        // Nobody else can make it cut.
        let a = recv(
            &mut f,
            OTHER,
            Message::Truncate {
                history: leader.clone(),
            },
        );
        assert_eq!(a, vec![FollowerAction::Close { peer: OTHER }]);
        let a = recv(&mut f, LEADER, Message::Truncate { history: leader });
        assert_eq!(a, vec![FollowerAction::Truncate { after: b(1, 2) }]);
        // Appends wait for the cut.
        assert!(append(&mut f, rec(3, 1, b(1, 2))).is_empty());
        f.handle(FollowerEvent::Truncated {
            last: b(1, 2),
            chain: chain_at(b(1, 2)),
        });
        assert_eq!((f.last_appended(), f.durable()), (b(1, 2), b(1, 2)));
        assert_eq!(f.history().runs(), &[(Epoch(1), Sequence(2))]);
    }

    #[test]
    fn a_new_leader_connection_cuts_what_was_appended_but_never_synced() {
        let mut f = led(1, b(1, 0));
        append(&mut f, rec(1, 1, b(1, 0)));
        f.handle(FollowerEvent::Synced { upto: b(1, 1) });
        append(&mut f, rec(1, 2, b(1, 1))); // not synced yet
        let a = recv(&mut f, OTHER, handshake(2));
        assert_eq!(a[0], FollowerAction::PersistPromise(promised(2)));
        assert_eq!(a[1], FollowerAction::Truncate { after: b(1, 1) });
        assert!(matches!(
            &a[2],
            FollowerAction::Send { message: Message::Handshake { last_durable, .. }, .. } if *last_durable == b(1, 1)
        ));
    }

    #[test]
    fn gaps_are_refused_with_the_followers_position_and_duplicates_reacked() {
        let mut f = led(1, b(1, 4));
        let a = append(&mut f, rec(1, 6, b(1, 5)));
        assert_eq!(
            a,
            vec![
                send(
                    LEADER,
                    Message::Refuse {
                        epoch: Epoch(1),
                        reason: RefuseReason::Gap
                    }
                ),
                send(
                    LEADER,
                    Message::Ack {
                        durable: b(1, 4),
                        chain: chain_at(b(1, 4))
                    }
                ),
            ]
        );
        let a = append(&mut f, rec(1, 3, b(1, 2)));
        assert_eq!(
            a,
            vec![send(
                LEADER,
                Message::Ack {
                    durable: b(1, 4),
                    chain: chain_at(b(1, 4))
                }
            )]
        );
    }

    #[test]
    fn log_traffic_is_taken_only_from_the_accepted_leader() {
        let mut f = led(1, b(1, 0));
        let a = recv(&mut f, OTHER, Message::Append(rec(1, 1, b(1, 0))));
        assert_eq!(a, vec![FollowerAction::Close { peer: OTHER }]);
        assert_eq!(f.last_appended(), b(1, 0));
        // A new leader connection takes over; the old one is no longer heard.
        recv(&mut f, OTHER, handshake(2));
        let a = recv(&mut f, LEADER, Message::Append(rec(2, 1, b(1, 0))));
        assert_eq!(a, vec![FollowerAction::Close { peer: LEADER }]);
    }

    #[test]
    fn an_append_from_an_epoch_no_handshake_introduced_changes_nothing() {
        let mut f = led(1, b(1, 0));
        let a = append(&mut f, rec(4_000_000_000, 1, b(4_000_000_000, 0)));
        assert_eq!(
            a,
            vec![send(
                LEADER,
                Message::Refuse {
                    epoch: Epoch(1),
                    reason: RefuseReason::NotIntroduced
                }
            )]
        );
        assert_eq!(f.epoch(), Epoch(1), "the epoch did not move");
    }

    #[test]
    fn catch_up_serves_only_confirmed_records() {
        let mut f = led(1, b(1, 9));
        recv(
            &mut f,
            LEADER,
            Message::Confirm {
                confirmed: b(1, 7),
                confirmed_us: 0,
            },
        );
        let a = recv(&mut f, OTHER, Message::CatchUp { from: b(1, 2) });
        assert_eq!(
            a,
            vec![FollowerAction::ServeCatchUp {
                peer: OTHER,
                after: b(1, 2),
                upto: b(1, 7)
            }]
        );
        let a = recv(&mut f, OTHER, Message::CatchUp { from: b(1, 7) });
        assert_eq!(a, vec![send(OTHER, Message::CatchUpDone { upto: b(1, 7) })]);
    }

    #[test]
    fn sent_away_as_behind_it_fetches_confirmed_history_in_batches_then_stops() {
        let mut f = led(2, b(1, 0));
        let a = recv(
            &mut f,
            LEADER,
            Message::Refuse {
                epoch: Epoch(2),
                reason: RefuseReason::Behind,
            },
        );
        assert_eq!(a, vec![FollowerAction::DialCatchUp]);
        let a = f.handle(FollowerEvent::CatchUpConnected { peer: SOURCE });
        assert_eq!(a, vec![send(SOURCE, Message::CatchUp { from: b(1, 0) })]);
        // History from an older epoch is taken as long as it chains.
        let a = recv(&mut f, SOURCE, Message::Append(rec(1, 1, b(1, 0))));
        assert!(matches!(
            a[..],
            [FollowerAction::Append(_), FollowerAction::Sync { .. }]
        ));
        let a = recv(&mut f, SOURCE, Message::CatchUpDone { upto: b(1, 1) });
        assert_eq!(a, vec![send(SOURCE, Message::CatchUp { from: b(1, 1) })]);
        let a = recv(&mut f, SOURCE, Message::CatchUpDone { upto: b(1, 1) });
        assert_eq!(a, vec![FollowerAction::Close { peer: SOURCE }]);
        assert_eq!(f.catch_up_source(), None);
        // A stream that breaks the chain is dropped.
        recv(
            &mut f,
            LEADER,
            Message::Refuse {
                epoch: Epoch(2),
                reason: RefuseReason::Behind,
            },
        );
        f.handle(FollowerEvent::CatchUpConnected { peer: SOURCE });
        let a = recv(&mut f, SOURCE, Message::Append(rec(1, 5, b(1, 4))));
        assert_eq!(a, vec![FollowerAction::Close { peer: SOURCE }]);
    }
}
