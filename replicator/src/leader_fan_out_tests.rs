//! The thrifty fan-out, through the leader core's events and actions.

use super::super::{LeaderConfig, LeaderError, LeaderEvent};
use super::*;
use crate::bookmark::{Epoch, Sequence};
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::{DatabaseId, NodeId};
use crate::record::{Encoded, Record};
use crate::wire::Role;

const FLUSH_US: u64 = 10_000;
const STALL_US: u64 = 2_000;

fn config(tail_limit_bytes: usize) -> LeaderConfig {
    LeaderConfig {
        database: DatabaseId(1),
        epoch: Epoch(3),
        node: NodeId(5),
        followers: 5,
        write_quorum: 3,
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        tail_limit_bytes,
        heartbeat_interval_us: 1_000_000,
        fan_out: FanOut {
            eager: 3,
            lazy_flush_interval_us: FLUSH_US,
            stall_after_us: STALL_US,
            lazy_batch_bytes: 1 << 20,
        },
    }
}

/// Epoch 3's records 1..=n, chained, one 512-byte page each.
fn records(n: u64) -> Vec<Encoded> {
    let mut out: Vec<Encoded> = Vec::new();
    for s in 1..=n {
        let (previous, prev_chain) = out
            .last()
            .map_or((Bookmark::ZERO, ChainHash::GENESIS), |r| {
                (r.bookmark, r.chain)
            });
        out.push(
            Record {
                bookmark: Bookmark::new(Epoch(3), Sequence(s)),
                previous,
                prev_chain,
                commit_us: 0,
                page_size: 512,
                db_pages: 1,
                pages: vec![(1, bytes::Bytes::from(vec![s as u8; 512]))],
            }
            .to_encoded()
            .expect("record"),
        );
    }
    out
}

fn handshake(role: Role) -> Message {
    Message::Handshake {
        database: DatabaseId(1),
        epoch: Epoch(3),
        role,
        last_durable: Bookmark::ZERO,
        node: NodeId(1),
        last_chain: ChainHash::GENESIS,
        confirmed: Bookmark::ZERO,
        history: History::new(),
    }
}

/// Connects followers 0..5 as peers 1..=5, each streaming from the start.
fn connect_followers(l: &mut Leader) {
    for index in 0..5 {
        let peer = PeerId(index as u64 + 1);
        l.handle(LeaderEvent::FollowerConnected { peer, index });
        l.handle(LeaderEvent::Received {
            peer,
            message: handshake(Role::Follower),
        });
    }
}

/// A leader with followers 0..5 (peers 1..=5) and a replica (peer 9)
/// streaming, the first lazy flush already behind it.
fn streaming(tail_limit_bytes: usize) -> Leader {
    let mut l = Leader::new(config(tail_limit_bytes)).expect("leader");
    connect_followers(&mut l);
    l.handle(LeaderEvent::ReplicaConnected { peer: PeerId(9) });
    l.handle(LeaderEvent::Received {
        peer: PeerId(9),
        message: handshake(Role::Replica),
    });
    l.handle(LeaderEvent::Tick { now_us: 0 });
    l
}

/// Who is sent which appends in `actions`, in order.
fn appends(actions: &[LeaderAction]) -> Vec<(u64, u64)> {
    actions
        .iter()
        .filter_map(|a| match a {
            LeaderAction::Send {
                peer,
                message: Message::Append(r),
            } => Some((peer.0, r.bookmark.sequence.0)),
            _ => None,
        })
        .collect()
}

fn ack(l: &mut Leader, peer: u64, r: &Encoded) -> Vec<LeaderAction> {
    l.handle(LeaderEvent::Received {
        peer: PeerId(peer),
        message: Message::Ack {
            durable: r.bookmark,
            chain: r.chain,
        },
    })
}

#[test]
fn a_record_goes_at_once_to_w_followers_and_every_replica_and_to_the_rest_at_the_next_flush() {
    let mut l = streaming(1 << 20);
    let rs = records(3);
    let mut sent = Vec::new();
    for r in &rs {
        sent.extend(appends(&l.committed(r.clone()).expect("commit")));
    }
    let at_once: Vec<u64> = sent
        .iter()
        .filter(|(_, s)| *s == 1)
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(at_once, vec![1, 2, 3, 9], "followers 0-2 and the replica");
    assert!(l.lazy_pending());
    // Each eager follower acknowledges: the records are confirmed with no
    // lazy follower holding them.
    for peer in 1..=3 {
        ack(&mut l, peer, &rs[2]);
    }
    assert_eq!(l.confirmed(), rs[2].bookmark);
    // A stall check finds none, and the batch waits for its interval.
    for now_us in [1_000, STALL_US, 2 * STALL_US] {
        assert!(appends(&l.handle(LeaderEvent::Tick { now_us })).is_empty());
    }
    let flush = appends(&l.handle(LeaderEvent::Tick { now_us: FLUSH_US }));
    assert_eq!(flush, vec![(4, 1), (4, 2), (4, 3), (5, 1), (5, 2), (5, 3)]);
    assert!(!l.lazy_pending());
}

#[test]
fn a_record_goes_to_the_eager_followers_before_a_replica_that_connected_first() {
    let mut l = Leader::new(config(1 << 20)).expect("leader");
    // The replica holds the lowest peer id (it connected first, or a
    // follower reconnected since).
    l.handle(LeaderEvent::ReplicaConnected { peer: PeerId(0) });
    l.handle(LeaderEvent::Received {
        peer: PeerId(0),
        message: handshake(Role::Replica),
    });
    connect_followers(&mut l);
    l.handle(LeaderEvent::Tick { now_us: 0 });
    let rs = records(1);
    let sent = appends(&l.committed(rs[0].clone()).expect("commit"));
    assert_eq!(sent, vec![(1, 1), (2, 1), (3, 1), (0, 1)]);
}

#[test]
fn an_eager_follower_that_goes_away_is_replaced_at_once_by_a_lazy_one_sent_what_it_missed() {
    let mut l = streaming(1 << 20);
    let rs = records(2);
    l.committed(rs[0].clone()).expect("commit");
    let out = l.handle(LeaderEvent::Disconnected { peer: PeerId(2) });
    // Follower 3 (peer 4) holds as much as peer 5 (nothing): the lower
    // peer id wins the tie.
    assert_eq!(appends(&out), vec![(4, 1)]);
    let next = appends(&l.committed(rs[1].clone()).expect("commit"));
    assert_eq!(next, vec![(1, 2), (3, 2), (4, 2), (9, 2)]);
}

#[test]
fn an_eager_follower_that_trails_the_other_eager_ones_past_a_stall_check_swaps_with_a_lazy_one() {
    let mut l = streaming(1 << 20);
    let rs = records(2);
    l.committed(rs[0].clone()).expect("commit");
    // No eager follower has acknowledged anything yet: nobody trails.
    let first = appends(&l.handle(LeaderEvent::Tick { now_us: STALL_US }));
    assert!(first.is_empty());
    ack(&mut l, 1, &rs[0]);
    ack(&mut l, 2, &rs[0]);
    l.committed(rs[1].clone()).expect("commit");
    // Peers 1 and 2 hold record 1 at this check: each eager follower
    // must hold it by the next one.
    let second = appends(&l.handle(LeaderEvent::Tick {
        now_us: 2 * STALL_US,
    }));
    assert!(second.is_empty());
    assert_eq!(l.eager_swaps(), 0);
    // Peer 3 never acknowledged record 1: peer 4 (lazy; the lower id of
    // two holding nothing) takes its place, sent what it missed; peer 5
    // gets its batch at once, long before the flush interval.
    let out = appends(&l.handle(LeaderEvent::Tick {
        now_us: 3 * STALL_US,
    }));
    assert_eq!(out, vec![(4, 1), (4, 2), (5, 1), (5, 2)]);
    assert_eq!(l.eager_swaps(), 1, "the swap is counted");
    let rs3 = records(3);
    let next = appends(&l.committed(rs3[2].clone()).expect("commit"));
    assert_eq!(
        next,
        vec![(1, 3), (2, 3), (4, 3), (9, 3)],
        "peer 3 is lazy now"
    );
}

#[test]
fn eager_followers_one_long_round_trip_away_are_not_swapped_for_acking_after_many_stall_checks() {
    // Followers in another region: every ack comes 40 stall checks after
    // its commit, from all three eager followers alike.
    let mut l = streaming(1 << 20);
    let rs = records(20);
    let round_trip_checks = 40;
    let mut now_us = 0;
    for (i, r) in rs.iter().enumerate() {
        l.committed(r.clone()).expect("commit");
        for _ in 0..round_trip_checks {
            now_us += STALL_US;
            let out = appends(&l.handle(LeaderEvent::Tick { now_us }));
            assert!(
                out.iter().all(|&(peer, _)| peer == 4 || peer == 5),
                "only the lazy followers' batches go out, at record {}: {out:?}",
                i + 1
            );
        }
        for peer in 1..=3 {
            ack(&mut l, peer, r);
        }
    }
    assert_eq!(l.eager_swaps(), 0, "no eager follower trailed the others");
    let next = appends(&l.committed(records(21)[20].clone()).expect("commit"));
    assert_eq!(
        next,
        vec![(1, 21), (2, 21), (3, 21), (9, 21)],
        "the same three"
    );
}

#[test]
fn lazy_followers_get_their_batch_early_once_it_reaches_its_bytes() {
    let mut c = config(1 << 20);
    c.fan_out.lazy_batch_bytes = 1_000;
    let mut l = Leader::new(c).expect("leader");
    connect_followers(&mut l);
    let rs = records(2);
    let first = appends(&l.committed(rs[0].clone()).expect("commit"));
    assert_eq!(
        first,
        vec![(1, 1), (2, 1), (3, 1)],
        "one record is under 1,000 bytes"
    );
    let second = appends(&l.committed(rs[1].clone()).expect("commit"));
    assert_eq!(
        second,
        vec![(1, 2), (2, 2), (3, 2), (4, 1), (4, 2), (5, 1), (5, 2)]
    );
}

#[test]
fn the_tail_never_drops_a_record_a_lazy_follower_was_not_sent() {
    // A tail of one record's bytes: confirming record 2 drops record 1.
    let rs = records(2);
    let mut l = streaming(rs[0].bytes.len());
    for r in &rs {
        l.committed(r.clone()).expect("commit");
    }
    let mut out = Vec::new();
    for peer in 1..=3 {
        out.extend(ack(&mut l, peer, &rs[1]));
    }
    assert_eq!(l.confirmed(), rs[1].bookmark);
    let lazy: Vec<(u64, u64)> = appends(&out).into_iter().filter(|(p, _)| *p >= 4).collect();
    assert_eq!(lazy, vec![(4, 1), (4, 2), (5, 1), (5, 2)]);
}

#[test]
fn a_leader_that_stops_sends_its_lazy_followers_everything_first() {
    let mut l = streaming(1 << 20);
    for r in records(2) {
        l.committed(r).expect("commit");
    }
    let lazy: Vec<(u64, u64)> = appends(&l.farewell())
        .into_iter()
        .filter(|(p, _)| *p >= 4)
        .collect();
    assert_eq!(lazy, vec![(4, 1), (4, 2), (5, 1), (5, 2)]);
}

#[test]
fn fewer_eager_followers_than_w_or_more_than_n_are_refused() {
    for eager in [2, 6] {
        let mut c = config(1 << 20);
        c.fan_out.eager = eager;
        assert!(matches!(
            Leader::new(c),
            Err(LeaderError::FanOut { eager: e, .. }) if e == eager
        ));
    }
}

#[test]
fn with_every_follower_eager_nothing_waits_for_a_flush() {
    let mut c = config(1 << 20);
    c.fan_out = FanOut::all(5);
    let mut l = Leader::new(c).expect("leader");
    connect_followers(&mut l);
    let sent = appends(&l.committed(records(1)[0].clone()).expect("commit"));
    assert_eq!(sent.len(), 5);
    assert!(!l.lazy_pending());
}
