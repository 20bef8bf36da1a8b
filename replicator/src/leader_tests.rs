//! The leader core's own tests (the simulator in `tests/sim.rs` drives
//! it through whole clusters).

use super::*;
use crate::bookmark::Sequence;

fn leader() -> Leader {
    Leader::new(LeaderConfig {
        database: DatabaseId(1),
        epoch: Epoch(3),
        node: NodeId(5),
        followers: 3,
        write_quorum: 2,
        start: Bookmark::ZERO,
        start_chain: ChainHash::GENESIS,
        adopted: Vec::new(),
        history: History::new(),
        tail_limit_bytes: 1 << 20,
        heartbeat_interval_us: 1_000,
        fan_out: FanOut::all(3),
    })
    .expect("leader")
}

/// Epoch 3's first record, one page.
fn first_record() -> Encoded {
    crate::record::Record {
        bookmark: Bookmark::new(Epoch(3), Sequence(1)),
        previous: Bookmark::ZERO,
        prev_chain: ChainHash::GENESIS,
        commit_us: 0,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, bytes::Bytes::from(vec![0u8; 512]))],
    }
    .to_encoded()
    .expect("record")
}

fn handshake(role: Role, epoch: u32) -> Message {
    Message::Handshake {
        database: DatabaseId(1),
        epoch: Epoch(epoch),
        role,
        last_durable: Bookmark::ZERO,
        node: crate::ids::NodeId(1),
        last_chain: crate::chain::ChainHash::GENESIS,
        confirmed: Bookmark::ZERO,
        history: crate::history::History::new(),
    }
}

#[test]
fn a_replica_claiming_a_newer_epoch_is_refused_and_cannot_fence_the_leader() {
    let mut l = leader();
    l.handle(LeaderEvent::ReplicaConnected { peer: PeerId(9) });
    let a = l.handle(LeaderEvent::Received {
        peer: PeerId(9),
        message: handshake(Role::Replica, 999),
    });
    assert!(!a.iter().any(|x| matches!(x, LeaderAction::Fenced(_))));
    assert!(a.iter().any(|x| matches!(
        x,
        LeaderAction::Close {
            reason: CloseReason::Diverged,
            ..
        }
    )));
    assert!(
        l.committed(first_record()).is_ok(),
        "the leader still takes commits"
    );
}

#[test]
fn a_follower_with_a_newer_epoch_fences_the_leader() {
    let mut l = leader();
    l.handle(LeaderEvent::FollowerConnected {
        peer: PeerId(1),
        index: 0,
    });
    let a = l.handle(LeaderEvent::Received {
        peer: PeerId(1),
        message: handshake(Role::Follower, 4),
    });
    assert_eq!(a, vec![LeaderAction::Fenced(Epoch(4))]);
}

/// Who a leader sends `Confirm` in `actions`.
fn confirms_to(actions: &[LeaderAction]) -> Vec<(PeerId, Bookmark)> {
    actions
        .iter()
        .filter_map(|a| match a {
            LeaderAction::Send {
                peer,
                message: Message::Confirm { confirmed, .. },
            } => Some((*peer, *confirmed)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_confirmation_goes_to_replicas_at_once_and_to_followers_with_the_heartbeat() {
    let mut l = leader();
    for (peer, index) in [(PeerId(1), 0), (PeerId(2), 1)] {
        l.handle(LeaderEvent::FollowerConnected { peer, index });
        l.handle(LeaderEvent::Received {
            peer,
            message: handshake(Role::Follower, 3),
        });
    }
    l.handle(LeaderEvent::ReplicaConnected { peer: PeerId(9) });
    l.handle(LeaderEvent::Received {
        peer: PeerId(9),
        message: handshake(Role::Replica, 3),
    });
    let r = first_record();
    let (at, chain) = (r.bookmark, r.chain);
    let sent = l.committed(r).expect("committed");
    assert_eq!(sent.len(), 3, "the record goes to every streaming peer");
    let mut confirms = Vec::new();
    for peer in [PeerId(1), PeerId(2)] {
        confirms.extend(confirms_to(&l.handle(LeaderEvent::Received {
            peer,
            message: Message::Ack { durable: at, chain },
        })));
    }
    assert_eq!(l.confirmed(), at, "W = 2 of 3 acknowledged");
    assert_eq!(
        confirms,
        vec![(PeerId(9), at)],
        "only the replica is told now"
    );
    let beat = l.handle(LeaderEvent::Tick { now_us: 10_000 });
    let told: Vec<PeerId> = beat
        .iter()
        .filter_map(|a| match a {
            LeaderAction::Send {
                peer,
                message: Message::Heartbeat { confirmed, .. },
            } if *confirmed == at => Some(*peer),
            _ => None,
        })
        .collect();
    assert_eq!(told, vec![PeerId(1), PeerId(2), PeerId(9)]);
}
