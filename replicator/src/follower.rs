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
use crate::record::Encoded;
use crate::wire::{Message, RefuseReason, Role};

/// What happened to the follower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerEvent {
    Received(Message),
    /// A sync issued by [`FollowerAction::Sync`] completed.
    Synced {
        upto: Bookmark,
    },
    /// A record streamed by a peer follower during catch-up: confirmed
    /// history, so it is taken whatever its epoch, if it follows the log.
    CatchUpRecord(Encoded),
    /// The peer serving catch-up says it has sent everything confirmed.
    CatchUpDone {
        upto: Bookmark,
    },
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
    /// Stream the records after `after` up to `upto`, then `CatchUpDone`.
    ServeCatchUp {
        after: Bookmark,
        upto: Bookmark,
    },
    Send(Message),
    /// The leader no longer holds our position: fetch confirmed records
    /// after `from` from a peer follower.
    CatchUpFromPeer {
        from: Bookmark,
    },
    /// The catch-up stream broke the log's order: drop it (and try
    /// another peer later).
    AbandonCatchUp,
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

    fn refuse(&self, reason: RefuseReason) -> FollowerAction {
        FollowerAction::Send(Message::Refuse {
            epoch: self.epoch,
            reason,
        })
    }

    fn ack(&self) -> FollowerAction {
        FollowerAction::Send(Message::Ack {
            durable: self.durable,
        })
    }

    /// Raises the accepted epoch if `epoch` is newer; false if it is stale.
    fn accept_epoch(&mut self, epoch: Epoch, out: &mut Vec<FollowerAction>) -> bool {
        if epoch < self.epoch {
            out.push(self.refuse(RefuseReason::StaleEpoch));
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
            FollowerEvent::Received(Message::Handshake {
                database,
                epoch,
                role,
                ..
            }) => {
                if database != self.database {
                    out.push(self.refuse(RefuseReason::WrongDatabase));
                } else if role == Role::Leader && self.accept_epoch(epoch, &mut out) {
                    out.push(FollowerAction::Send(Message::Handshake {
                        database: self.database,
                        epoch: self.epoch,
                        role: Role::Follower,
                        last_durable: self.durable,
                    }));
                }
            }
            FollowerEvent::Received(Message::Append(record)) => {
                // Only a leader's handshake raises the epoch: an append from
                // a newer epoch that never introduced itself is refused, so
                // a stray message cannot fence every future leader.
                if record.bookmark.epoch > self.epoch {
                    out.push(self.refuse(RefuseReason::NotIntroduced));
                    return out;
                }
                if !self.accept_epoch(record.bookmark.epoch, &mut out) {
                    return out;
                }
                if record.bookmark <= self.last_appended {
                    out.push(self.ack()); // a duplicate: say where we stand
                } else if record.previous != self.last_appended {
                    out.push(self.refuse(RefuseReason::Gap));
                    out.push(self.ack());
                } else {
                    self.last_appended = record.bookmark;
                    out.push(FollowerAction::Append(record));
                    self.request_sync(&mut out);
                }
            }
            FollowerEvent::Synced { upto } => {
                self.sync_in_flight = false;
                if upto > self.durable {
                    self.durable = upto;
                    out.push(self.ack());
                }
                if self.sync_wanted {
                    self.sync_wanted = false;
                    self.request_sync(&mut out);
                }
            }
            FollowerEvent::Received(Message::Confirm { confirmed, .. })
            | FollowerEvent::Received(Message::Heartbeat { confirmed, .. }) => {
                self.confirmed = self.confirmed.max(confirmed);
            }
            FollowerEvent::CatchUpRecord(record) => {
                if record.bookmark <= self.last_appended {
                    // already held
                } else if record.previous != self.last_appended {
                    out.push(FollowerAction::AbandonCatchUp);
                } else {
                    self.last_appended = record.bookmark;
                    self.confirmed = self.confirmed.max(record.bookmark);
                    out.push(FollowerAction::Append(record));
                    self.request_sync(&mut out);
                }
            }
            FollowerEvent::CatchUpDone { upto } => {
                self.confirmed = self.confirmed.max(upto.min(self.last_appended));
            }
            FollowerEvent::Received(Message::Refuse {
                reason: RefuseReason::Behind,
                ..
            }) => out.push(FollowerAction::CatchUpFromPeer {
                from: self.last_appended,
            }),
            FollowerEvent::Received(Message::CatchUp { from }) => {
                // Serve only what is both confirmed and durable here.
                let upto = self.confirmed.min(self.durable);
                if from < upto {
                    out.push(FollowerAction::ServeCatchUp { after: from, upto });
                } else {
                    out.push(FollowerAction::Send(Message::CatchUpDone { upto }));
                }
            }
            FollowerEvent::Received(
                Message::Ack { .. } | Message::CatchUpDone { .. } | Message::Refuse { .. },
            ) => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::Sequence;
    use bytes::Bytes;

    const DB: DatabaseId = DatabaseId(7);

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

    fn append(f: &mut Follower, r: Encoded) -> Vec<FollowerAction> {
        f.handle(FollowerEvent::Received(Message::Append(r)))
    }

    #[test]
    fn records_are_acked_only_after_a_sync_covers_them_and_syncs_are_grouped() {
        let mut f = Follower::new(DB, Epoch(1), b(1, 0));
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
                FollowerAction::Send(Message::Ack { durable: b(1, 1) }),
                FollowerAction::Sync { upto: b(1, 3) },
            ],
            "one sync for the two that waited"
        );
        let a = f.handle(FollowerEvent::Synced { upto: b(1, 3) });
        assert_eq!(
            a,
            vec![FollowerAction::Send(Message::Ack { durable: b(1, 3) })]
        );
    }

    #[test]
    fn older_epochs_are_fenced_and_newer_ones_are_persisted_first() {
        let mut f = Follower::new(DB, Epoch(3), b(3, 5));
        let a = append(&mut f, rec(2, 6, b(2, 5)));
        assert_eq!(
            a,
            vec![FollowerAction::Send(Message::Refuse {
                epoch: Epoch(3),
                reason: RefuseReason::StaleEpoch
            })]
        );
        let a = f.handle(FollowerEvent::Received(Message::Handshake {
            database: DB,
            epoch: Epoch(4),
            role: Role::Leader,
            last_durable: b(3, 5),
        }));
        assert_eq!(a[0], FollowerAction::PersistEpoch(Epoch(4)));
        assert!(
            matches!(&a[1], FollowerAction::Send(Message::Handshake { epoch: Epoch(4), last_durable, .. }) if *last_durable == b(3, 5))
        );
        let a = f.handle(FollowerEvent::Received(Message::Handshake {
            database: DatabaseId(8),
            epoch: Epoch(9),
            role: Role::Leader,
            last_durable: b(0, 0),
        }));
        assert_eq!(
            a,
            vec![FollowerAction::Send(Message::Refuse {
                epoch: Epoch(4),
                reason: RefuseReason::WrongDatabase
            })]
        );
    }

    #[test]
    fn gaps_are_refused_with_the_followers_position_and_duplicates_reacked() {
        let mut f = Follower::new(DB, Epoch(1), b(1, 4));
        let a = append(&mut f, rec(1, 6, b(1, 5)));
        assert_eq!(
            a,
            vec![
                FollowerAction::Send(Message::Refuse {
                    epoch: Epoch(1),
                    reason: RefuseReason::Gap
                }),
                FollowerAction::Send(Message::Ack { durable: b(1, 4) }),
            ]
        );
        let a = append(&mut f, rec(1, 3, b(1, 2)));
        assert_eq!(
            a,
            vec![FollowerAction::Send(Message::Ack { durable: b(1, 4) })]
        );
    }

    #[test]
    fn an_append_from_an_epoch_no_handshake_introduced_changes_nothing() {
        let mut f = Follower::new(DB, Epoch(1), b(1, 0));
        let a = append(&mut f, rec(4_000_000_000, 1, b(4_000_000_000, 0)));
        assert_eq!(
            a,
            vec![FollowerAction::Send(Message::Refuse {
                epoch: Epoch(1),
                reason: RefuseReason::NotIntroduced
            })]
        );
        assert_eq!(f.epoch(), Epoch(1), "the epoch did not move");
    }

    #[test]
    fn catch_up_serves_only_confirmed_records() {
        let mut f = Follower::new(DB, Epoch(1), b(1, 9));
        f.handle(FollowerEvent::Received(Message::Confirm {
            confirmed: b(1, 7),
            confirmed_us: 0,
        }));
        let a = f.handle(FollowerEvent::Received(Message::CatchUp { from: b(1, 2) }));
        assert_eq!(
            a,
            vec![FollowerAction::ServeCatchUp {
                after: b(1, 2),
                upto: b(1, 7)
            }]
        );
        let a = f.handle(FollowerEvent::Received(Message::CatchUp { from: b(1, 7) }));
        assert_eq!(
            a,
            vec![FollowerAction::Send(Message::CatchUpDone { upto: b(1, 7) })]
        );
    }
}
