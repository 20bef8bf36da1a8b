//! The durability follower's protocol core. Sans-IO: events in (messages
//! received, storage done), actions out (append, sync, persist the epoch,
//! send). The real transport and a deterministic simulator drive the same
//! code.
//!
//! Rules:
//! - **Fencing.** A follower remembers the highest epoch it has accepted
//!   (persisted before it is acted on) and refuses handshakes and appends
//!   from any lower epoch. Only a leader's handshake raises the epoch: an
//!   append from a newer epoch is refused as `NotIntroduced`, so the
//!   epoch-raising branch of `accept_epoch` serves handshakes alone.
//! - **Order.** An append must follow the follower's log (`previous` = its
//!   last record); a duplicate is ignored (and re-acked); anything else is
//!   refused as a gap, with an ack of where the follower stands (the leader
//!   then reconnects and resumes from the handshake position).
//! - **Group sync.** At most one sync is in flight. Records appended while
//!   it runs are covered by the next one, issued when it completes: one
//!   fdatasync per group, however many records arrived.
//! - **Acks** carry the highest bookmark durable on this follower, and are
//!   sent only after a sync that covers it.
//! - **Catch-up** serves only records both confirmed and durable here. A
//!   follower the leader sends away (`Behind`) fetches confirmed history
//!   from a peer, whatever its epoch, as long as it chains.

use crate::bookmark::{Bookmark, Epoch};
use crate::ids::DatabaseId;
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
}

/// What the follower asks its IO to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerAction {
    /// Make the epoch durable before anything else is done in it.
    PersistEpoch(Epoch),
    /// Append the record to the log (not yet durable).
    Append(Encoded),
    /// Make everything appended up to `upto` durable, then report
    /// [`FollowerEvent::Synced`].
    Sync {
        upto: Bookmark,
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

/// One follower's protocol state.
#[derive(Debug, Clone)]
pub struct Follower {
    database: DatabaseId,
    epoch: Epoch,
    last_appended: Bookmark,
    durable: Bookmark,
    confirmed: Bookmark,
    sync_in_flight: bool,
    sync_wanted: bool,
    /// The connection whose leader handshake was accepted: the only one
    /// whose appends, confirms and heartbeats are taken.
    leader: Option<PeerId>,
    catch_up: CatchUp,
}

impl Follower {
    /// A follower whose persisted epoch is `epoch` and whose log (after
    /// recovery) ends at `last`, all of it durable.
    pub fn new(database: DatabaseId, epoch: Epoch, last: Bookmark) -> Follower {
        Follower {
            database,
            epoch,
            last_appended: last,
            durable: last,
            confirmed: Bookmark::ZERO,
            sync_in_flight: false,
            sync_wanted: false,
            leader: None,
            catch_up: CatchUp::Idle,
        }
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }
    pub fn durable(&self) -> Bookmark {
        self.durable
    }
    pub fn last_appended(&self) -> Bookmark {
        self.last_appended
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
                epoch: self.epoch,
                reason,
            },
        )
    }

    fn ack(&self, peer: PeerId) -> FollowerAction {
        Self::send(
            peer,
            Message::Ack {
                durable: self.durable,
            },
        )
    }

    /// Raises the accepted epoch if `epoch` is newer; false if it is stale.
    fn accept_epoch(&mut self, peer: PeerId, epoch: Epoch, out: &mut Vec<FollowerAction>) -> bool {
        if epoch < self.epoch {
            out.push(self.refuse(peer, RefuseReason::StaleEpoch));
            return false;
        }
        if epoch > self.epoch {
            self.epoch = epoch;
            out.push(FollowerAction::PersistEpoch(epoch));
        }
        true
    }

    fn request_sync(&mut self, out: &mut Vec<FollowerAction>) {
        if self.sync_in_flight {
            self.sync_wanted = true;
        } else {
            self.sync_in_flight = true;
            out.push(FollowerAction::Sync {
                upto: self.last_appended,
            });
        }
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
                    let from = self.last_appended;
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
                self.sync_in_flight = false;
                if upto > self.durable {
                    self.durable = upto;
                    if let Some(leader) = self.leader {
                        out.push(self.ack(leader));
                    }
                }
                if self.sync_wanted {
                    self.sync_wanted = false;
                    self.request_sync(&mut out);
                }
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
                ..
            } => {
                if database != self.database {
                    out.push(self.refuse(peer, RefuseReason::WrongDatabase));
                } else if role == Role::Leader && self.accept_epoch(peer, epoch, out) {
                    self.leader = Some(peer);
                    out.push(Self::send(
                        peer,
                        Message::Handshake {
                            database: self.database,
                            epoch: self.epoch,
                            role: Role::Follower,
                            last_durable: self.durable,
                        },
                    ));
                }
            }
            // Log traffic is taken only from the accepted leader.
            Message::Append(_) | Message::Confirm { .. } | Message::Heartbeat { .. }
                if self.leader != Some(peer) =>
            {
                out.push(FollowerAction::Close { peer });
            }
            Message::Append(record) => {
                // Only a leader's handshake raises the epoch: an append from
                // a newer epoch that never introduced itself is refused, so
                // a stray message cannot fence every future leader.
                if record.bookmark.epoch > self.epoch {
                    out.push(self.refuse(peer, RefuseReason::NotIntroduced));
                    return;
                }
                if !self.accept_epoch(peer, record.bookmark.epoch, out) {
                    return;
                }
                if record.bookmark <= self.last_appended {
                    out.push(self.ack(peer)); // a duplicate: say where we stand
                } else if record.previous != self.last_appended {
                    out.push(self.refuse(peer, RefuseReason::Gap));
                    out.push(self.ack(peer));
                } else {
                    self.last_appended = record.bookmark;
                    out.push(FollowerAction::Append(record));
                    self.request_sync(out);
                }
            }
            Message::Confirm { confirmed, .. } | Message::Heartbeat { confirmed, .. } => {
                self.confirmed = self.confirmed.max(confirmed);
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
                // Serve only what is both confirmed and durable here.
                let upto = self.confirmed.min(self.durable);
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
                if record.bookmark <= self.last_appended {
                    // already held
                } else if record.previous != self.last_appended {
                    self.catch_up = CatchUp::Idle;
                    out.push(FollowerAction::Close { peer });
                } else {
                    self.last_appended = record.bookmark;
                    self.confirmed = self.confirmed.max(record.bookmark);
                    out.push(FollowerAction::Append(record));
                    self.request_sync(out);
                }
            }
            Message::CatchUpDone { upto } => {
                self.confirmed = self.confirmed.max(upto.min(self.last_appended));
                if upto > from {
                    let next = self.last_appended.max(upto);
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
    use bytes::Bytes;

    const DB: DatabaseId = DatabaseId(7);
    const LEADER: PeerId = PeerId(1);
    const OTHER: PeerId = PeerId(2);
    const SOURCE: PeerId = PeerId(3);

    fn b(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    fn rec(e: u32, s: u64, prev: Bookmark) -> Encoded {
        crate::record::Record {
            bookmark: b(e, s),
            previous: prev,
            page_size: 512,
            db_pages: 1,
            pages: vec![(1, Bytes::from(vec![s as u8; 512]))],
        }
        .to_encoded()
        .expect("valid record")
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
        }
    }

    /// A follower at `last` whose leader (connection LEADER) is accepted.
    fn led(epoch: u32, last: Bookmark) -> Follower {
        let mut f = Follower::new(DB, Epoch(epoch), last);
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
                send(LEADER, Message::Ack { durable: b(1, 1) }),
                FollowerAction::Sync { upto: b(1, 3) },
            ],
            "one sync for the two that waited"
        );
        let a = f.handle(FollowerEvent::Synced { upto: b(1, 3) });
        assert_eq!(a, vec![send(LEADER, Message::Ack { durable: b(1, 3) })]);
    }

    #[test]
    fn older_epochs_are_fenced_and_newer_ones_are_persisted_first() {
        let mut f = led(3, b(3, 5));
        let a = append(&mut f, rec(2, 6, b(2, 5)));
        assert_eq!(
            a,
            vec![send(
                LEADER,
                Message::Refuse {
                    epoch: Epoch(3),
                    reason: RefuseReason::StaleEpoch
                }
            )]
        );
        let a = recv(&mut f, OTHER, handshake(4));
        assert_eq!(a[0], FollowerAction::PersistEpoch(Epoch(4)));
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
                send(LEADER, Message::Ack { durable: b(1, 4) }),
            ]
        );
        let a = append(&mut f, rec(1, 3, b(1, 2)));
        assert_eq!(a, vec![send(LEADER, Message::Ack { durable: b(1, 4) })]);
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
