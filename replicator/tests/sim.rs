//! A seeded, deterministic simulation of one leader, N followers and a
//! replica, driven through the same sans-IO cores the real transport
//! drives. Connections are FIFO (like TCP) but deliveries across
//! connections interleave at random; followers crash (losing unsynced
//! appends and their connection) and restart; syncs complete late; the
//! replica's connection breaks, losing what was in flight, and reconnects.
//!
//! Checked after every step:
//! - the confirmed watermark never moves back and never passes the last
//!   record issued;
//! - every confirmed record is durable on at least W followers;
//! - the replica never reveals more than the leader confirmed, and what it
//!   reveals is exactly the leader's history.
//!
//! `WALRELAY_SEED=n` replays one seed; `WALRELAY_SOAK=1` runs many more.

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::VecDeque;
use walrelay_replicator::epoch_file::Promise;
use walrelay_replicator::follower::LogEnd;
use walrelay_replicator::{
    Bookmark, ChainHash, CloseReason, DatabaseId, Encoded, Epoch, Follower, FollowerAction,
    FollowerEvent, History, Leader, LeaderAction, LeaderConfig, LeaderEvent, Message, NodeId,
    PeerId, Record, Sequence, Source, Subscriber, SubscriberAction, SubscriberEvent,
};

/// What every follower promised the one leader.
const PROMISED: Promise = Promise {
    epoch: Epoch(1),
    leader: NodeId(1),
};

const DB: DatabaseId = DatabaseId(42);
const N: usize = 5;
const W: usize = 3;
const REPLICA_PEER: PeerId = PeerId(100);
/// How a follower core names the connection it catches up on (never one
/// of its leader connection generations).
const CATCH_UP_PEER: PeerId = PeerId(u64::MAX);

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

fn record(s: u64, prev_chain: ChainHash) -> Encoded {
    Record {
        bookmark: b(s),
        previous: b(s - 1),
        prev_chain,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![s as u8; 512]))],
    }
    .to_encoded()
    .expect("valid record")
}

/// A follower's storage under the crash model: appends are volatile until
/// a sync covers them.
struct SimFollower {
    core: Follower,
    log: Vec<Encoded>,
    durable_len: usize,
    up: bool,
    /// Syncs issued and not yet completed.
    pending_syncs: VecDeque<Bookmark>,
    /// Connection generation, so messages of a dead connection are dropped.
    conn: u64,
    /// The leader sent it away: catch up from a peer, then reconnect.
    behind: bool,
}

impl SimFollower {
    fn durable(&self) -> Bookmark {
        self.log[..self.durable_len]
            .last()
            .map_or(b(0), |r| r.bookmark)
    }

    /// A core restarted from the durable log.
    fn restarted(&self, promise: Promise) -> Follower {
        let held = &self.log[..self.durable_len];
        let end = held.last().map_or(
            LogEnd {
                last: b(0),
                chain: ChainHash::GENESIS,
            },
            |r| LogEnd {
                last: r.bookmark,
                chain: r.chain,
            },
        );
        let mut history = History::new();
        for r in held {
            history.record(r.bookmark);
        }
        Follower::new(DB, promise, end, history)
    }
}

/// A message in flight, by destination.
enum Wire {
    Follower(usize, u64, Message),
    Leader(PeerId, u64, Message),
    Replica(Message),
    /// The leader closed its connection to follower i (generation conn);
    /// whether to redial.
    Close(usize, u64, bool),
    /// The leader closed its connection to the replica.
    CloseReplica,
}

struct Sim {
    rng: SmallRng,
    leader: Leader,
    followers: Vec<SimFollower>,
    replica: Subscriber,
    replica_visible: Vec<Encoded>,
    replica_applied: Vec<Encoded>,
    /// One FIFO queue per connection direction.
    queues: Vec<VecDeque<Wire>>,
    issued: Vec<Encoded>,
    confirmed: Bookmark,
    /// The last message the replica got (for failure reports).
    replica_last: &'static str,
    replica_reconnect: bool,
    replica_behind: bool,
    /// Messages delivered to the leader, by sender and kind (reports).
    delivered: std::collections::BTreeMap<(String, &'static str), u64>,
}

// Queues 0..N: leader to follower i; N..2N: follower i to leader; 2N: to
// the replica; 2N+1: replica to leader.

impl Sim {
    fn new(seed: u64) -> Sim {
        let leader = Leader::new(LeaderConfig {
            database: DB,
            epoch: Epoch(1),
            node: NodeId(1),
            followers: N,
            write_quorum: W,
            start: b(0),
            start_chain: ChainHash::GENESIS,
            adopted: Vec::new(),
            history: History::new(),
            tail_limit_bytes: 1 << 20,
            heartbeat_interval_us: 1_000,
        })
        .expect("leader");
        let followers = (0..N)
            .map(|_| SimFollower {
                core: Follower::new(
                    DB,
                    PROMISED,
                    LogEnd {
                        last: b(0),
                        chain: ChainHash::GENESIS,
                    },
                    History::new(),
                ),
                log: Vec::new(),
                durable_len: 0,
                up: true,
                pending_syncs: VecDeque::new(),
                conn: 0,
                behind: false,
            })
            .collect();
        let mut sim = Sim {
            rng: SmallRng::seed_from_u64(seed),
            leader,
            followers,
            replica: Subscriber::new(DB, b(0)),
            replica_visible: Vec::new(),
            replica_applied: Vec::new(),
            queues: (0..2 * N + 2).map(|_| VecDeque::new()).collect(),
            issued: Vec::new(),
            confirmed: b(0),
            replica_last: "",
            replica_reconnect: false,
            replica_behind: false,
            delivered: Default::default(),
        };
        for i in 0..N {
            sim.connect_follower(i);
        }
        let a = sim
            .leader
            .handle(LeaderEvent::ReplicaConnected { peer: REPLICA_PEER });
        sim.leader_actions(a);
        let a = sim
            .replica
            .handle(SubscriberEvent::Connected(Source::Leader));
        sim.replica_actions(a);
        sim
    }

    fn peer(i: usize, conn: u64) -> PeerId {
        PeerId((i as u64) << 32 | conn)
    }

    fn connect_follower(&mut self, i: usize) {
        self.followers[i].conn += 1;
        let peer = Self::peer(i, self.followers[i].conn);
        let a = self
            .leader
            .handle(LeaderEvent::FollowerConnected { peer, index: i });
        self.leader_actions(a);
    }

    fn leader_actions(&mut self, actions: Vec<LeaderAction>) {
        for a in actions {
            match a {
                LeaderAction::Send { peer, message } if peer == REPLICA_PEER => {
                    self.queues[2 * N].push_back(Wire::Replica(message));
                }
                LeaderAction::Send { peer, message } => {
                    let i = (peer.0 >> 32) as usize;
                    let conn = peer.0 & 0xffff_ffff;
                    self.queues[i].push_back(Wire::Follower(i, conn, message));
                }
                LeaderAction::Confirmed(c) => {
                    assert!(c > self.confirmed, "confirmed moved back");
                    assert!(c <= self.leader.last());
                    self.confirmed = c;
                    // Every confirmed record is durable on W followers.
                    let holders = self.followers.iter().filter(|f| f.durable() >= c).count();
                    assert!(holders >= W, "{c} confirmed but durable on {holders}");
                    // The leader's running count of unconfirmed bytes.
                    let pending: usize = self
                        .issued
                        .iter()
                        .filter(|r| r.bookmark > c)
                        .map(|r| r.bytes.len())
                        .sum();
                    assert_eq!(self.leader.unconfirmed_bytes(), pending);
                }
                LeaderAction::Close { peer, .. } if peer == REPLICA_PEER => {
                    self.queues[2 * N].push_back(Wire::CloseReplica);
                }
                LeaderAction::Close { peer, reason } => {
                    // Like a socket shutdown: what was sent before still
                    // arrives, then the connection ends. The runtime redials
                    // a follower it closed, except one sent away to catch
                    // up (it reconnects after catching up).
                    let i = (peer.0 >> 32) as usize;
                    let conn = peer.0 & 0xffff_ffff;
                    let redial = reason != CloseReason::Behind;
                    self.queues[i].push_back(Wire::Close(i, conn, redial));
                }
                LeaderAction::Fenced(e) => panic!("fenced by {e} with one leader"),
            }
        }
    }

    fn follower_actions(&mut self, i: usize, actions: Vec<FollowerAction>) {
        for a in actions {
            let f = &mut self.followers[i];
            match a {
                FollowerAction::PersistPromise(_) => {}
                FollowerAction::Truncate { .. } => panic!("a cut with one leader"),
                FollowerAction::Append(r) => {
                    assert_eq!(
                        r.previous,
                        f.log.last().map_or(b(0), |l| l.bookmark),
                        "append out of order"
                    );
                    f.log.push(r);
                }
                FollowerAction::Sync { upto } => f.pending_syncs.push_back(upto),
                // To the leader, on the current connection; catch-up peers
                // are served synchronously (`reconnect_pending`).
                FollowerAction::Send { peer, message } if peer == PeerId(f.conn) => {
                    let leader_peer = Self::peer(i, f.conn);
                    self.queues[N + i].push_back(Wire::Leader(leader_peer, f.conn, message));
                }
                FollowerAction::Send { .. } | FollowerAction::ServeCatchUp { .. } => {}
                FollowerAction::Close { peer } if peer == PeerId(f.conn) => {
                    let old = Self::peer(i, f.conn);
                    f.conn += 1;
                    let a = self.leader.handle(LeaderEvent::Disconnected { peer: old });
                    self.leader_actions(a);
                }
                FollowerAction::Close { .. } => {}
                FollowerAction::DialCatchUp => f.behind = true,
            }
        }
    }

    fn replica_actions(&mut self, actions: Vec<SubscriberAction>) {
        for a in actions {
            match a {
                SubscriberAction::DiscardUnconfirmed => {
                    self.replica_applied.truncate(self.replica_visible.len());
                }
                SubscriberAction::Apply(r) => self.replica_applied.push(r),
                SubscriberAction::Confirm(c) => {
                    assert!(
                        c <= self.confirmed,
                        "replica revealed {c} past {}",
                        self.confirmed
                    );
                    let n = self.replica_applied.partition_point(|r| r.bookmark <= c);
                    self.replica_visible = self.replica_applied[..n].to_vec();
                    assert_eq!(
                        self.replica_visible[..],
                        self.issued[..n],
                        "replica history differs"
                    );
                }
                SubscriberAction::Send(Source::Leader, m) => {
                    self.queues[2 * N + 1].push_back(Wire::Leader(REPLICA_PEER, 0, m))
                }
                // Catch-up is served synchronously (`reconnect_pending`).
                SubscriberAction::Send(Source::Follower, _) => {}
                SubscriberAction::Close(Source::Leader) => {
                    self.drop_replica_connection();
                    self.replica_reconnect = true;
                }
                // The catch-up stream is served synchronously.
                SubscriberAction::Close(Source::Follower) => {}
                SubscriberAction::CatchUpFromFollower => self.replica_behind = true,
                SubscriberAction::Refused(_) => panic!(
                    "replica dropped: {a:?} after {} (replica at {}, leader confirmed {})",
                    self.replica_last,
                    self.replica.appended(),
                    self.confirmed
                ),
            }
        }
    }

    fn step(&mut self) {
        let choice = self.rng.random_range(0..100);
        self.step_with(choice);
    }

    fn step_with(&mut self, choice: u32) {
        self.step_inner(choice);
        self.reconnect_pending();
    }

    /// Follower `j`'s answer to a catch-up request from `from`: the
    /// records it streams and the bookmark it says it caught up to.
    fn serve_catch_up(&mut self, j: usize, from: Bookmark) -> Option<(Vec<Encoded>, Bookmark)> {
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
                } => {
                    return Some((Vec::new(), upto));
                }
                _ => {}
            }
        }
        None
    }

    /// Follower `i` catches up from follower `j`, request by request, as
    /// its core asks; false if `j` could not serve.
    fn follower_catch_up(&mut self, i: usize, j: usize) -> bool {
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

    fn drop_replica_connection(&mut self) {
        self.queues[2 * N].clear();
        self.queues[2 * N + 1].clear();
        let a = self
            .leader
            .handle(LeaderEvent::Disconnected { peer: REPLICA_PEER });
        self.leader_actions(a);
        let a = self
            .replica
            .handle(SubscriberEvent::Disconnected(Source::Leader));
        self.replica_actions(a);
    }

    /// Peers sent away by the leader catch up from a random live follower
    /// (synchronously) and reconnect.
    fn reconnect_pending(&mut self) {
        for i in 0..N {
            if !(self.followers[i].behind && self.followers[i].up) {
                continue;
            }
            let j = self.rng.random_range(0..N);
            if j == i {
                continue;
            }
            if !self.follower_catch_up(i, j) {
                continue;
            }
            self.followers[i].behind = false;
            self.connect_follower(i);
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
            self.replica_reconnect = false;
            let a = self
                .leader
                .handle(LeaderEvent::ReplicaConnected { peer: REPLICA_PEER });
            self.leader_actions(a);
            let a = self
                .replica
                .handle(SubscriberEvent::Connected(Source::Leader));
            self.replica_actions(a);
        }
    }

    fn step_inner(&mut self, choice: u32) {
        match choice {
            0..25 => {
                let s = self.issued.len() as u64 + 1;
                let prev_chain = self.issued.last().map_or(ChainHash::GENESIS, |r| r.chain);
                let r = record(s, prev_chain);
                self.issued.push(r.clone());
                let a = self.leader.committed(r).expect("in order");
                self.leader_actions(a);
            }
            25..75 => {
                // Deliver the head of a random non-empty queue.
                let busy: Vec<usize> = (0..self.queues.len())
                    .filter(|&q| !self.queues[q].is_empty())
                    .collect();
                if busy.is_empty() {
                    return;
                }
                let q = busy[self.rng.random_range(0..busy.len())];
                match self.queues[q].pop_front().expect("non-empty") {
                    Wire::Follower(i, conn, m) => {
                        if self.followers[i].up && self.followers[i].conn == conn {
                            let a = self.followers[i].core.handle(FollowerEvent::Received {
                                peer: PeerId(conn),
                                message: m,
                            });
                            self.follower_actions(i, a);
                        }
                    }
                    Wire::Leader(peer, conn, m) => {
                        let live = peer == REPLICA_PEER || {
                            let i = (peer.0 >> 32) as usize;
                            self.followers[i].up && self.followers[i].conn == conn
                        };
                        if live {
                            let sender = if peer == REPLICA_PEER {
                                "replica".to_string()
                            } else {
                                format!("f{}", peer.0 >> 32)
                            };
                            *self.delivered.entry((sender, kind(&m))).or_insert(0) += 1;
                            let a = self
                                .leader
                                .handle(LeaderEvent::Received { peer, message: m });
                            self.leader_actions(a);
                        }
                    }
                    Wire::Close(i, conn, redial) => {
                        if self.followers[i].conn == conn {
                            self.followers[i].conn += 1;
                            let peer = Self::peer(i, conn);
                            let a = self.leader.handle(LeaderEvent::Disconnected { peer });
                            self.leader_actions(a);
                            if redial && self.followers[i].up {
                                self.connect_follower(i);
                            }
                        }
                    }
                    Wire::CloseReplica => {
                        self.drop_replica_connection();
                        self.replica_reconnect = true;
                    }
                    Wire::Replica(m) => {
                        self.replica_last = kind(&m);
                        let a = self
                            .replica
                            .handle(SubscriberEvent::Received(Source::Leader, m));
                        self.replica_actions(a);
                    }
                }
            }
            75..90 => {
                // A sync completes.
                let i = self.rng.random_range(0..N);
                let f = &mut self.followers[i];
                if let Some(upto) = f.pending_syncs.pop_front() {
                    let n = f.log.partition_point(|r| r.bookmark <= upto);
                    f.durable_len = f.durable_len.max(n);
                    let a = f.core.handle(FollowerEvent::Synced { upto });
                    self.follower_actions(i, a);
                }
            }
            90..94 => {
                // Crash a follower: unsynced appends are lost.
                let i = self.rng.random_range(0..N);
                if self.followers[i].up {
                    let old = Self::peer(i, self.followers[i].conn);
                    let f = &mut self.followers[i];
                    f.up = false;
                    f.log.truncate(f.durable_len);
                    f.pending_syncs.clear();
                    f.conn += 1;
                    let a = self.leader.handle(LeaderEvent::Disconnected { peer: old });
                    self.leader_actions(a);
                }
            }
            94..98 => {
                // Restart a crashed follower from its durable log.
                let i = self.rng.random_range(0..N);
                if !self.followers[i].up {
                    let f = &mut self.followers[i];
                    f.up = true;
                    f.core = f.restarted(PROMISED);
                    self.connect_follower(i);
                }
            }
            98 => {
                // The replica's connection breaks (in-flight messages both
                // ways are lost) and it reconnects.
                self.drop_replica_connection();
                assert_eq!(self.replica.appended(), self.replica.confirmed());
                self.replica_reconnect = true;
            }
            _ => {
                let a = self.leader.handle(LeaderEvent::Tick {
                    now_us: self.rng.random_range(0..1_000_000),
                });
                self.leader_actions(a);
            }
        }
    }

    /// Brings every follower back and lets everything settle.
    fn settle(&mut self) {
        for i in 0..N {
            if !self.followers[i].up {
                let f = &mut self.followers[i];
                f.up = true;
                f.core = f.restarted(PROMISED);
                self.connect_follower(i);
            }
        }
        for _ in 0..1_000_000 {
            let idle = self.queues.iter().all(|q| q.is_empty())
                && self.followers.iter().all(|f| f.pending_syncs.is_empty());
            if idle {
                return;
            }
            // Deliveries and syncs only: no new records, no crashes.
            let choice = self.rng.random_range(25..90);
            self.step_with(choice);
        }
        let state: Vec<String> = self
            .followers
            .iter()
            .map(|f| {
                format!(
                    "up={} behind={} durable={} appended={} pending_syncs={}",
                    f.up,
                    f.behind,
                    f.durable(),
                    f.core.last_appended(),
                    f.pending_syncs.len()
                )
            })
            .collect();
        let mut kinds = std::collections::BTreeMap::new();
        for q in &self.queues {
            for w in q.iter().take(100_000) {
                let k = match w {
                    Wire::Follower(i, _, m) => format!("to f{i} {}", kind(m)),
                    Wire::Leader(p, _, m) => format!("to leader from {} {}", p.0 >> 32, kind(m)),
                    Wire::Replica(m) => format!("to replica {}", kind(m)),
                    Wire::Close(i, _, _) => format!("close f{i}"),
                    Wire::CloseReplica => "close replica".into(),
                };
                *kinds.entry(k).or_insert(0) += 1;
            }
        }
        eprintln!("queued kinds: {kinds:#?}");
        eprintln!("delivered to the leader: {:#?}", self.delivered);
        panic!(
            "did not settle: leader last {} confirmed {}; replica {} behind={}; followers {state:#?}; queued {:?}",
            self.leader.last(),
            self.confirmed,
            self.replica.confirmed(),
            self.replica_behind,
            self.queues.iter().map(|q| q.len()).collect::<Vec<_>>()
        );
    }
}

fn kind(m: &Message) -> &'static str {
    match m {
        Message::Handshake { .. } => "handshake",
        Message::Append(_) => "append",
        Message::Ack { .. } => "ack",
        Message::Confirm { .. } => "confirm",
        Message::CatchUp { .. } => "catch-up",
        Message::CatchUpDone { .. } => "catch-up-done",
        Message::Heartbeat { .. } => "heartbeat",
        Message::Refuse { .. } => "refuse",
        Message::Truncate { .. } => "truncate",
    }
}

fn run(seed: u64, steps: usize) {
    let mut sim = Sim::new(seed);
    for _ in 0..steps {
        sim.step();
    }
    sim.settle();
    let issued = sim.issued.len() as u64;
    assert_eq!(
        sim.confirmed,
        b(issued),
        "seed {seed}: all confirmed after settling"
    );
    assert_eq!(
        sim.replica.confirmed(),
        b(issued),
        "seed {seed}: replica caught up"
    );
}

#[test]
fn quorum_commit_survives_follower_crashes_and_the_replica_mirrors_confirmed_history() {
    let soak = std::env::var("WALRELAY_SOAK").is_ok();
    let seeds: Vec<u64> = match std::env::var("WALRELAY_SEED") {
        Ok(s) => vec![s.parse().expect("WALRELAY_SEED is a number")],
        Err(_) => (0..if soak { 2_000 } else { 100 }).collect(),
    };
    for seed in seeds {
        eprintln!("sim seed {seed}");
        run(seed, if soak { 20_000 } else { 3_000 });
    }
}
