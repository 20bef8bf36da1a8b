//! The read replica's protocol core. Sans-IO: events in (a connection
//! opened or closed, a message arrived), actions out (apply, confirm,
//! discard, send, catch up elsewhere).
//!
//! A replica streams from the leader: records arrive before they are
//! confirmed and are applied invisibly; a confirm (or a heartbeat carrying
//! the watermark) reveals everything up to it. On every new leader
//! connection the unconfirmed tail is discarded first, because the leader
//! resends from the replica's confirmed position. When the leader no longer
//! holds that position ([`RefuseReason::Behind`]) the replica catches up
//! from a durability follower, which serves confirmed records only, and
//! then subscribes again. When the follower no longer holds it either (its
//! log starts later: the records were released to cold storage,
//! [`Message::Archived`]) the replica must be bootstrapped from cold
//! storage ([`SubscriberAction::Archived`]) before it can follow.

use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::ids::DatabaseId;
use crate::record::Encoded;
use crate::wire::{Message, RefuseReason, Role};

/// Which connection an event concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Leader,
    /// A durability follower serving catch-up.
    Follower,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriberEvent {
    Connected(Source),
    Disconnected(Source),
    Received(Source, Message),
}

/// What the replica asks its IO to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscriberAction {
    /// Drop every applied but unconfirmed record.
    DiscardUnconfirmed,
    /// Apply the record, invisibly.
    Apply(Encoded),
    /// Make everything up to the bookmark visible.
    Confirm(Bookmark),
    Send(Source, Message),
    /// Close this connection (and reconnect later).
    Close(Source),
    /// Connect to a follower and catch up; then reconnect to the leader.
    CatchUpFromFollower,
    /// The leader refused this replica for good (another database, a
    /// diverged history): an operator must look.
    Refused(RefuseReason),
    /// The follower's log starts at `start` (whose chain is `chain`),
    /// after this replica's confirmed position: the records in between are
    /// only in cold storage. The replica must be bootstrapped from there
    /// (to `start` or later) before it can follow again.
    Archived {
        start: Bookmark,
        chain: ChainHash,
    },
}

/// One replica's protocol state.
#[derive(Debug, Clone)]
pub struct Subscriber {
    database: DatabaseId,
    appended: Bookmark,
    confirmed: Bookmark,
    /// Where the current catch-up request started.
    catch_up_from: Bookmark,
}

impl Subscriber {
    /// A replica whose confirmed (visible) position is `confirmed`.
    pub fn new(database: DatabaseId, confirmed: Bookmark) -> Subscriber {
        Subscriber {
            database,
            appended: confirmed,
            confirmed,
            catch_up_from: confirmed,
        }
    }

    pub fn confirmed(&self) -> Bookmark {
        self.confirmed
    }
    pub fn appended(&self) -> Bookmark {
        self.appended
    }

    fn confirm(&mut self, upto: Bookmark, out: &mut Vec<SubscriberAction>) {
        // Only records this replica holds can become visible.
        let upto = upto.min(self.appended);
        if upto > self.confirmed {
            self.confirmed = upto;
            out.push(SubscriberAction::Confirm(upto));
        }
    }

    fn discard(&mut self, out: &mut Vec<SubscriberAction>) {
        if self.appended > self.confirmed {
            self.appended = self.confirmed;
            out.push(SubscriberAction::DiscardUnconfirmed);
        }
    }

    fn introduction(&self, role: Role) -> Message {
        Message::Handshake {
            database: self.database,
            epoch: self.confirmed.epoch,
            role,
            node: crate::ids::NodeId::NONE,
            last_durable: self.confirmed,
            // A replica keeps no chains: the leader places it by its
            // confirmed bookmark, which every later history holds.
            last_chain: crate::chain::ChainHash::GENESIS,
            confirmed: self.confirmed,
            history: crate::history::History::new(),
        }
    }

    pub fn handle(&mut self, event: SubscriberEvent) -> Vec<SubscriberAction> {
        let mut out = Vec::new();
        match event {
            SubscriberEvent::Connected(source) => {
                self.discard(&mut out);
                let message = match source {
                    Source::Leader => self.introduction(Role::Replica),
                    Source::Follower => {
                        self.catch_up_from = self.confirmed;
                        // Introduce the connection first: a follower
                        // serving many databases routes it by the database
                        // named here (one serving a single database ignores
                        // a replica's handshake).
                        out.push(SubscriberAction::Send(
                            source,
                            self.introduction(Role::Replica),
                        ));
                        Message::CatchUp {
                            from: self.confirmed,
                        }
                    }
                };
                out.push(SubscriberAction::Send(source, message));
            }
            SubscriberEvent::Disconnected(_) => self.discard(&mut out),
            SubscriberEvent::Received(source, Message::Append(record)) => {
                if record.bookmark <= self.appended {
                    // A resend of something already held.
                } else if record.previous != self.appended {
                    self.discard(&mut out);
                    out.push(SubscriberAction::Close(source));
                } else {
                    self.appended = record.bookmark;
                    out.push(SubscriberAction::Apply(record));
                }
            }
            SubscriberEvent::Received(
                Source::Leader,
                Message::Confirm { confirmed, .. } | Message::Heartbeat { confirmed, .. },
            ) => self.confirm(confirmed, &mut out),
            SubscriberEvent::Received(Source::Follower, Message::CatchUpDone { upto }) => {
                // A follower streams confirmed records only, one bounded
                // batch per request: ask again until a batch brings nothing.
                self.confirm(upto, &mut out);
                if upto > self.catch_up_from && self.confirmed > self.catch_up_from {
                    self.catch_up_from = self.confirmed;
                    out.push(SubscriberAction::Send(
                        Source::Follower,
                        Message::CatchUp {
                            from: self.confirmed,
                        },
                    ));
                } else {
                    out.push(SubscriberAction::Close(Source::Follower));
                }
            }
            SubscriberEvent::Received(Source::Follower, Message::Archived { start, chain, .. }) => {
                out.push(SubscriberAction::Close(Source::Follower));
                // Only a start past what this replica asked for means
                // anything; anything else is a confused peer.
                if start > self.catch_up_from {
                    out.push(SubscriberAction::Archived { start, chain });
                }
            }
            SubscriberEvent::Received(Source::Leader, Message::Refuse { reason, .. }) => {
                out.push(SubscriberAction::Close(Source::Leader));
                match reason {
                    RefuseReason::Behind => out.push(SubscriberAction::CatchUpFromFollower),
                    r => out.push(SubscriberAction::Refused(r)),
                }
            }
            SubscriberEvent::Received(source, _) => out.push(SubscriberAction::Close(source)),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::{Epoch, Sequence};
    use crate::record::Record;
    use bytes::Bytes;

    fn b(s: u64) -> Bookmark {
        Bookmark::new(Epoch(1), Sequence(s))
    }
    fn rec(s: u64) -> Encoded {
        Record {
            bookmark: b(s),
            previous: b(s - 1),
            prev_chain: crate::chain::ChainHash::GENESIS,
            commit_us: 0,
            page_size: 512,
            db_pages: 1,
            pages: vec![(1, Bytes::from(vec![s as u8; 512]))],
        }
        .to_encoded()
        .expect("valid")
    }
    fn recv(s: &mut Subscriber, m: Message) -> Vec<SubscriberAction> {
        s.handle(SubscriberEvent::Received(Source::Leader, m))
    }

    #[test]
    fn records_apply_before_confirm_and_reveal_only_up_to_what_is_held() {
        let mut s = Subscriber::new(DatabaseId(1), b(0));
        assert_eq!(
            recv(&mut s, Message::Append(rec(1))),
            vec![SubscriberAction::Apply(rec(1))]
        );
        assert_eq!(
            recv(&mut s, Message::Append(rec(2))),
            vec![SubscriberAction::Apply(rec(2))]
        );
        assert_eq!(
            recv(
                &mut s,
                Message::Confirm {
                    confirmed: b(1),
                    confirmed_us: 0
                }
            ),
            vec![SubscriberAction::Confirm(b(1))]
        );
        // A watermark past what arrived reveals only what is held.
        assert_eq!(
            recv(
                &mut s,
                Message::Confirm {
                    confirmed: b(9),
                    confirmed_us: 0
                }
            ),
            vec![SubscriberAction::Confirm(b(2))]
        );
        assert!(
            recv(
                &mut s,
                Message::Confirm {
                    confirmed: b(2),
                    confirmed_us: 0
                }
            )
            .is_empty()
        );
    }

    #[test]
    fn a_reconnect_discards_the_unconfirmed_tail_and_resubscribes_from_confirmed() {
        let mut s = Subscriber::new(DatabaseId(1), b(0));
        recv(&mut s, Message::Append(rec(1)));
        recv(
            &mut s,
            Message::Confirm {
                confirmed: b(1),
                confirmed_us: 0,
            },
        );
        recv(&mut s, Message::Append(rec(2)));
        let a = s.handle(SubscriberEvent::Connected(Source::Leader));
        assert_eq!(a[0], SubscriberAction::DiscardUnconfirmed);
        assert!(matches!(
            &a[1],
            SubscriberAction::Send(Source::Leader, Message::Handshake { last_durable, role: Role::Replica, .. })
                if *last_durable == b(1)
        ));
        assert_eq!(s.appended(), b(1));
    }

    #[test]
    fn a_gap_closes_the_stream_and_behind_sends_the_replica_to_a_follower_for_batches() {
        let mut s = Subscriber::new(DatabaseId(1), b(0));
        let a = recv(&mut s, Message::Append(rec(3)));
        assert_eq!(a, vec![SubscriberAction::Close(Source::Leader)]);
        let a = recv(
            &mut s,
            Message::Refuse {
                epoch: Epoch(1),
                reason: RefuseReason::Behind,
            },
        );
        assert_eq!(
            a,
            vec![
                SubscriberAction::Close(Source::Leader),
                SubscriberAction::CatchUpFromFollower
            ]
        );
        let a = s.handle(SubscriberEvent::Connected(Source::Follower));
        // The connection names its database first (a host of many routes
        // by it), then asks.
        assert!(matches!(
            &a[0],
            SubscriberAction::Send(
                Source::Follower,
                Message::Handshake {
                    role: Role::Replica,
                    ..
                }
            )
        ));
        assert_eq!(
            a[1..],
            [SubscriberAction::Send(
                Source::Follower,
                Message::CatchUp { from: b(0) }
            )]
        );
        s.handle(SubscriberEvent::Received(
            Source::Follower,
            Message::Append(rec(1)),
        ));
        s.handle(SubscriberEvent::Received(
            Source::Follower,
            Message::Append(rec(2)),
        ));
        let a = s.handle(SubscriberEvent::Received(
            Source::Follower,
            Message::CatchUpDone { upto: b(2) },
        ));
        // A batch that made progress: ask for the next one.
        assert_eq!(
            a,
            vec![
                SubscriberAction::Confirm(b(2)),
                SubscriberAction::Send(Source::Follower, Message::CatchUp { from: b(2) })
            ]
        );
        // A batch that brings nothing: caught up.
        let a = s.handle(SubscriberEvent::Received(
            Source::Follower,
            Message::CatchUpDone { upto: b(2) },
        ));
        assert_eq!(a, vec![SubscriberAction::Close(Source::Follower)]);
    }

    #[test]
    fn a_follower_whose_log_starts_past_the_replica_sends_it_to_cold_storage() {
        let mut s = Subscriber::new(DatabaseId(1), b(2));
        s.handle(SubscriberEvent::Connected(Source::Follower));
        let chain = ChainHash::over(&[b"nine"]);
        let history =
            crate::history::History::from_runs(vec![(Epoch(1), Sequence(9))]).expect("runs");
        let a = s.handle(SubscriberEvent::Received(
            Source::Follower,
            Message::Archived {
                start: b(9),
                chain,
                history: history.clone(),
            },
        ));
        assert_eq!(
            a,
            vec![
                SubscriberAction::Close(Source::Follower),
                SubscriberAction::Archived { start: b(9), chain }
            ]
        );
        assert_eq!(s.confirmed(), b(2), "nothing is revealed or skipped");
        // A start at or before what was asked for is no news: just close.
        let a = s.handle(SubscriberEvent::Received(
            Source::Follower,
            Message::Archived {
                start: b(2),
                chain,
                history,
            },
        ));
        assert_eq!(a, vec![SubscriberAction::Close(Source::Follower)]);
    }
}
