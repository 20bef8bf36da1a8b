//! The follower core's tests: promises, order, group sync, cuts, catch-up.
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
    let leader =
        History::from_runs(vec![(Epoch(1), Sequence(2)), (Epoch(3), Sequence(1))]).expect("runs");
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
    // The connection names its database first (a host of many routes by it).
    assert!(matches!(
        &a[0],
        FollowerAction::Send { peer: SOURCE, message: Message::Handshake { database, role: Role::Follower, .. } }
            if *database == f.database()
    ));
    assert_eq!(a[1..], [send(SOURCE, Message::CatchUp { from: b(1, 0) })]);
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
    sent_to_catch_up(&mut f);
    let a = recv(&mut f, SOURCE, Message::Append(rec(1, 5, b(1, 4))));
    assert_eq!(a, vec![FollowerAction::Close { peer: SOURCE }]);
}

/// The leader sends the follower away (Behind) and the catch-up source
/// connects.
fn sent_to_catch_up(f: &mut Follower) {
    recv(
        f,
        LEADER,
        Message::Refuse {
            epoch: Epoch(2),
            reason: RefuseReason::Behind,
        },
    );
    f.handle(FollowerEvent::CatchUpConnected { peer: SOURCE });
}

// ---- retention: a released prefix, and starting over at a peer's start ----

/// The epoch-1 history up to sequence `s`.
fn runs_to(s: u64) -> History {
    History::from_runs(vec![(Epoch(1), Sequence(s))]).expect("runs")
}

/// Records (1,1)..=(1,n), chained, so `chain_at` knows each of them.
fn build_chain(n: u64) {
    for s in 1..=n {
        rec(1, s, b(1, s - 1));
    }
}

fn archived(start: Bookmark) -> Message {
    Message::Archived {
        start,
        chain: chain_at(start),
        history: runs_to(start.sequence.0),
    }
}

#[test]
fn catch_up_from_before_the_released_start_is_answered_archived_with_the_prefix_history() {
    build_chain(9);
    let mut f = led(1, b(1, 9));
    recv(
        &mut f,
        LEADER,
        Message::Confirm {
            confirmed: b(1, 9),
            confirmed_us: 0,
        },
    );
    // Only a durable start is taken.
    f.handle(FollowerEvent::Released {
        start: b(1, 12),
        chain: chain_at(b(1, 9)),
    });
    assert_eq!(f.start(), LogEnd::GENESIS);
    f.handle(FollowerEvent::Released {
        start: b(1, 5),
        chain: chain_at(b(1, 5)),
    });
    assert_eq!(f.start().last, b(1, 5));
    for (peer, from) in [(OTHER, b(1, 2)), (OTHER, Bookmark::ZERO), (LEADER, b(1, 4))] {
        let a = recv(&mut f, peer, Message::CatchUp { from });
        assert_eq!(
            a,
            vec![send(peer, archived(b(1, 5)))],
            "{peer:?} from {from}"
        );
    }
    // From the start on, records are served as before.
    let a = recv(&mut f, OTHER, Message::CatchUp { from: b(1, 5) });
    assert_eq!(
        a,
        vec![FollowerAction::ServeCatchUp {
            peer: OTHER,
            after: b(1, 5),
            upto: b(1, 9)
        }]
    );
    // A restarted follower knows its start (and that it is confirmed).
    let restarted = at(1, b(1, 9)).with_start(LogEnd {
        last: b(1, 5),
        chain: chain_at(b(1, 5)),
    });
    assert_eq!(restarted.confirmed(), b(1, 5));
    let mut restarted = restarted;
    let a = recv(&mut restarted, OTHER, Message::CatchUp { from: b(1, 1) });
    assert_eq!(a, vec![send(OTHER, archived(b(1, 5)))]);
}

#[test]
fn told_archived_while_catching_up_it_starts_its_log_over_at_the_peers_start_and_goes_on() {
    build_chain(7);
    let mut f = led(2, b(1, 2));
    recv(
        &mut f,
        LEADER,
        Message::Refuse {
            epoch: Epoch(2),
            reason: RefuseReason::Behind,
        },
    );
    let a = f.handle(FollowerEvent::CatchUpConnected { peer: SOURCE });
    // The connection names its database first (a host of many routes by it).
    assert!(matches!(
        &a[0],
        FollowerAction::Send { peer: SOURCE, message: Message::Handshake { database, role: Role::Follower, .. } }
            if *database == f.database()
    ));
    assert_eq!(a[1..], [send(SOURCE, Message::CatchUp { from: b(1, 2) })]);
    let a = recv(&mut f, SOURCE, archived(b(1, 5)));
    assert_eq!(
        a,
        vec![FollowerAction::ResetToArchived {
            start: b(1, 5),
            chain: chain_at(b(1, 5)),
            history: runs_to(5),
        }]
    );
    let a = f.handle(FollowerEvent::Reset {
        start: b(1, 5),
        chain: chain_at(b(1, 5)),
        history: runs_to(5),
    });
    assert_eq!(a, vec![send(SOURCE, Message::CatchUp { from: b(1, 5) })]);
    assert_eq!(
        (
            f.start().last,
            f.last_appended(),
            f.durable(),
            f.confirmed()
        ),
        (b(1, 5), b(1, 5), b(1, 5), b(1, 5))
    );
    assert_eq!(f.history(), &runs_to(5));
    // The peer's records after its start chain onto the new log.
    let a = recv(&mut f, SOURCE, Message::Append(rec(1, 6, b(1, 5))));
    assert!(matches!(
        a[..],
        [FollowerAction::Append(_), FollowerAction::Sync { upto }] if upto == b(1, 6)
    ));
    let a = recv(&mut f, SOURCE, Message::CatchUpDone { upto: b(1, 6) });
    assert_eq!(a, vec![send(SOURCE, Message::CatchUp { from: b(1, 6) })]);
}

#[test]
fn an_archived_answer_that_would_move_the_log_back_or_lacks_its_history_drops_the_peer() {
    build_chain(7);
    let bad = [
        archived(b(1, 4)), // the log already reaches it
        Message::Archived {
            start: b(1, 6),
            chain: chain_at(b(1, 6)),
            history: runs_to(5), // not its history
        },
    ];
    for message in bad {
        let mut f = led(2, b(1, 4));
        sent_to_catch_up(&mut f);
        let a = recv(&mut f, SOURCE, message);
        assert_eq!(a, vec![FollowerAction::Close { peer: SOURCE }]);
        assert_eq!((f.last_appended(), f.catch_up_source()), (b(1, 4), None));
    }
    // A second answer while the log already starts over is not acted on.
    let mut f = led(2, b(1, 2));
    sent_to_catch_up(&mut f);
    assert!(matches!(
        recv(&mut f, SOURCE, archived(b(1, 5)))[..],
        [FollowerAction::ResetToArchived { .. }]
    ));
    assert_eq!(
        recv(&mut f, SOURCE, archived(b(1, 6))),
        vec![FollowerAction::Close { peer: SOURCE }]
    );
    // Not from a catch-up source: nothing happens.
    let mut f = led(1, b(1, 2));
    assert!(recv(&mut f, LEADER, archived(b(1, 5))).is_empty());
    assert!(recv(&mut f, OTHER, archived(b(1, 5))).is_empty());
    assert_eq!(f.last_appended(), b(1, 2));
}

#[test]
fn a_leaders_truncate_never_cuts_below_the_released_start() {
    build_chain(6);
    let mut f = at(1, b(1, 6)).with_start(LogEnd {
        last: b(1, 4),
        chain: chain_at(b(1, 4)),
    });
    recv(&mut f, LEADER, handshake(1));
    let a = recv(
        &mut f,
        LEADER,
        Message::Truncate {
            history: runs_to(2),
        },
    );
    assert_eq!(a, vec![FollowerAction::Truncate { after: b(1, 4) }]);
}
