//! A seeded, deterministic simulation of leaders, N followers and a
//! replica, driven through the same sans-IO cores the real runtimes drive.
//!
//! Faults: deliveries interleave at random across connections (each FIFO,
//! like TCP); syncs complete late or fail; followers crash and restart
//! (keeping a random part of what they had not synced: a power cut may
//! lose it or write it); links are cut one way for a while (asymmetric
//! partitions) and connections break; the replica's connection breaks; the
//! leader crashes, or is cut off and keeps running while another node wins
//! a newer epoch ([`walrelay_replicator::election`]), adopts the log and
//! leads. A new leader commits its epoch's first record at once, as the
//! engine does. Half the leaders stream each record to W followers only
//! and batch the rest (the thrifty fan-out); ticks move one monotonic
//! clock on by random steps.
//!
//! Checked after every step:
//! - every record any leader confirmed (an acknowledged write) is in every
//!   history a later leader adopts, and in the final one;
//! - no two leaders ever hold the same epoch;
//! - a confirmed watermark never moves back or past its leader's last
//!   record, and is durable on W followers when reported;
//! - the replica reveals only acknowledged records, in history order.
//!
//! Then a liveness phase heals every fault: the cluster must elect a
//! leader, confirm everything it holds and bring the replica up to it.
//!
//! `WALRELAY_SEED=n` replays one seed; `WALRELAY_SOAK=1` runs 10,000 seeds;
//! `WALRELAY_SIM_RANDOM=k` adds k seeds from the clock (printed).

#[path = "sim/wiring.rs"]
mod wiring;

use bytes::Bytes;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use walrelay_replicator::election::{Election, ElectionEvent};
use walrelay_replicator::epoch_file::Promise;
use walrelay_replicator::follower::LogEnd;
use walrelay_replicator::{
    Bookmark, ChainHash, CloseReason, DatabaseId, Encoded, Epoch, Follower, FollowerAction,
    FollowerEvent, History, Leader, LeaderAction, LeaderConfig, LeaderEvent, Message, NodeId,
    PeerId, Record, Sequence, Source, Subscriber, SubscriberAction, SubscriberEvent,
};

const DB: DatabaseId = DatabaseId(42);
const N: usize = 5;
const W: usize = 3;
/// How a follower core names the connection it catches up on.
const CATCH_UP_PEER: PeerId = PeerId(u64::MAX);
/// How the leader names the replica's connection.
const REPLICA_PEER: PeerId = PeerId(u64::MAX - 1);

/// A follower's storage: appends are volatile until a sync covers them.
struct SimFollower {
    core: Follower,
    promise: Promise,
    log: Vec<Encoded>,
    durable_len: usize,
    up: bool,
    /// Syncs issued and not yet completed.
    pending_syncs: VecDeque<Bookmark>,
    /// The leader sent it away: catch up from a peer, then reconnect.
    behind: bool,
}

impl SimFollower {
    fn new() -> SimFollower {
        let mut f = SimFollower {
            core: Follower::new(DB, Promise::NONE, LogEnd::GENESIS, History::new()),
            promise: Promise::NONE,
            log: Vec::new(),
            durable_len: 0,
            up: true,
            pending_syncs: VecDeque::new(),
            behind: false,
        };
        f.core = f.restarted();
        f
    }

    fn durable(&self) -> Bookmark {
        self.log[..self.durable_len]
            .last()
            .map_or(Bookmark::ZERO, |r| r.bookmark)
    }

    /// A core restarted from the log as storage holds it.
    fn restarted(&self) -> Follower {
        let held = &self.log[..self.durable_len];
        let end = held.last().map_or(LogEnd::GENESIS, |r| LogEnd {
            last: r.bookmark,
            chain: r.chain,
        });
        let mut history = History::new();
        for r in held {
            history.record(r.bookmark);
        }
        Follower::new(DB, self.promise, end, history)
    }
}

struct SimLeader {
    core: Leader,
    epoch: Epoch,
    alive: bool,
    /// Its connection to each follower (0: none).
    conn: [u64; N],
    /// Its whole history: the adopted log, then what it issued.
    history: Vec<Encoded>,
    confirmed: Bookmark,
}

/// A message in flight on one connection.
enum Wire {
    Msg(Message),
    /// The sender closed the connection after what it sent before.
    Close {
        redial: bool,
    },
}

/// A connection between leader `g` and follower `index`.
#[derive(Clone, Copy)]
struct Conn {
    leader: usize,
    index: usize,
}

struct Sim {
    rng: SmallRng,
    leaders: Vec<SimLeader>,
    followers: Vec<SimFollower>,
    conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    /// Queues per (connection, towards the follower?).
    queues: BTreeMap<(u64, bool), VecDeque<Wire>>,
    /// Links cut one way: (follower index, towards the follower?).
    cut: BTreeSet<(usize, bool)>,
    replica: Subscriber,
    /// The leader the replica streams from, and its queues.
    replica_leader: Option<usize>,
    to_replica: VecDeque<Wire>,
    from_replica: VecDeque<Message>,
    replica_visible: Vec<Encoded>,
    replica_applied: Vec<Encoded>,
    replica_behind: bool,
    replica_reconnect: bool,
    /// Every record any leader confirmed: bookmark to chain.
    acked: BTreeMap<Bookmark, ChainHash>,
    epochs: BTreeSet<Epoch>,
    elections: usize,
    /// The leaders' monotonic clock (µs): each tick moves it on by a
    /// random step, so heartbeats and lazy flushes fall due as in time.
    clock_us: u64,
    /// Counters for the verbose report.
    stats: BTreeMap<&'static str, u64>,
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut sim = Sim {
            rng: SmallRng::seed_from_u64(seed),
            leaders: Vec::new(),
            followers: (0..N).map(|_| SimFollower::new()).collect(),
            conns: BTreeMap::new(),
            next_conn: 1,
            queues: BTreeMap::new(),
            cut: BTreeSet::new(),
            replica: Subscriber::new(DB, Bookmark::ZERO),
            replica_leader: None,
            to_replica: VecDeque::new(),
            from_replica: VecDeque::new(),
            replica_visible: Vec::new(),
            replica_applied: Vec::new(),
            replica_behind: false,
            replica_reconnect: true,
            acked: BTreeMap::new(),
            epochs: BTreeSet::new(),
            elections: 0,
            clock_us: 0,
            stats: BTreeMap::new(),
        };
        assert!(sim.elect(), "all followers are up at the start");
        sim
    }

    fn newest(&self) -> Option<usize> {
        let g = self.leaders.len().checked_sub(1)?;
        self.leaders[g].alive.then_some(g)
    }

    // ---- elections -------------------------------------------------

    /// A new node wins an epoch from the followers it can reach, adopts
    /// the highest log, and starts leading with its epoch's first record.
    fn elect(&mut self) -> bool {
        let g_new = self.leaders.len();
        let node = NodeId(g_new as u64 + 1);
        let min = self.epochs.last().map_or(Epoch(1), |e| Epoch(e.0 + 1));
        // Start low sometimes: refusals must push the claim up.
        let start = if self.rng.random_bool(0.3) {
            Epoch(1)
        } else {
            min
        };
        let mut election = Election::new(DB, node, start, W);
        let mut order: Vec<usize> = (0..N).collect();
        for i in (1..N).rev() {
            order.swap(i, self.rng.random_range(0..=i));
        }
        let reachable: Vec<usize> = order
            .into_iter()
            .filter(|&i| {
                self.followers[i].up
                    && !self.cut.contains(&(i, true))
                    && !self.cut.contains(&(i, false))
            })
            .collect();
        let mut peers = BTreeMap::new();
        for &i in &reachable {
            let peer = self.new_conn_id();
            peers.insert(peer, i);
        }
        let mut sends: VecDeque<_> = VecDeque::new();
        for (&peer, &i) in &peers {
            sends.extend(election.handle(ElectionEvent::Connected {
                peer: PeerId(peer),
                index: i,
            }));
        }
        let mut rounds = 0;
        while let Some(send) = sends.pop_front() {
            rounds += 1;
            assert!(rounds < 10_000, "election does not converge");
            let i = peers[&send.peer.0];
            let actions = self.followers[i].core.handle(FollowerEvent::Received {
                peer: send.peer,
                message: send.message,
            });
            for a in actions {
                match a {
                    FollowerAction::Send { peer, message } if peer == send.peer => {
                        sends.extend(election.handle(ElectionEvent::Received {
                            peer: send.peer,
                            message,
                        }));
                    }
                    // Promises, and the cut of an unsynced tail.
                    other => self.follower_actions(i, vec![other]),
                }
            }
        }
        let won = election.won();
        // The candidate's connections end either way.
        for (&peer, &i) in &peers {
            let a = self.followers[i]
                .core
                .handle(FollowerEvent::Disconnected { peer: PeerId(peer) });
            self.follower_actions(i, a);
        }
        let Some(won) = won else {
            *self.stats.entry("failed elections").or_default() += 1;
            return false;
        };
        self.elections += 1;
        assert!(
            self.epochs.insert(won.epoch),
            "epoch {} won twice",
            won.epoch
        );
        // Read the adopted log (the durable records of its holder).
        let holder = &self.followers[won.adopted.index];
        let log: Vec<Encoded> = holder.log[..holder.durable_len].to_vec();
        assert_eq!(
            log.last().map_or(Bookmark::ZERO, |r| r.bookmark),
            won.adopted.end.last,
            "the promise reported the durable end"
        );
        // Safety: every acknowledged record is in the adopted history.
        for (b, chain) in &self.acked {
            assert!(
                log.iter().any(|r| r.bookmark == *b && r.chain == *chain),
                "acknowledged {b} lost by the election of epoch {}",
                won.epoch
            );
        }
        let start = won.confirmed;
        let cut = log.partition_point(|r| r.bookmark <= start);
        let start_chain = if cut == 0 {
            ChainHash::GENESIS
        } else {
            log[cut - 1].chain
        };
        let mut history = won.adopted.history.clone();
        history.cut_after(won.adopted.end.last);
        // Half the leaders stream to W followers and batch the others.
        let fan_out = if self.rng.random_bool(0.5) {
            walrelay_replicator::leader::FanOut {
                eager: W,
                lazy_flush_interval_us: 50_000,
                stall_after_us: 20_000,
                lazy_batch_bytes: 8 << 10,
            }
        } else {
            walrelay_replicator::leader::FanOut::all(N)
        };
        let mut core = Leader::new(LeaderConfig {
            database: DB,
            epoch: won.epoch,
            node,
            followers: N,
            write_quorum: W,
            start,
            start_chain,
            adopted: log[cut..].to_vec(),
            history,
            tail_limit_bytes: 48 << 10,
            heartbeat_interval_us: 1_000,
            fan_out,
        })
        .expect("leader");
        let (last, last_chain) = (core.last(), core.last_chain());
        let barrier = record(won.epoch, 1, last, last_chain);
        let first = core
            .committed(barrier.clone())
            .expect("the epoch's first record");
        assert!(first.is_empty(), "nobody streams yet");
        let mut leader = SimLeader {
            core,
            epoch: won.epoch,
            alive: true,
            conn: [0; N],
            history: log,
            confirmed: start,
        };
        leader.history.push(barrier);
        self.leaders.push(leader);
        for i in 0..N {
            if self.followers[i].up {
                self.connect(g_new, i);
            }
        }
        // The replica follows the newest leader.
        self.drop_replica_connection();
        self.replica_reconnect = true;
        true
    }

    // ---- steps -------------------------------------------------------

    fn step(&mut self) {
        let choice = self.rng.random_range(0..1000);
        self.step_with(choice);
    }

    fn step_with(&mut self, choice: u32) {
        self.step_inner(choice);
        self.reconnect_pending();
    }

    fn commit(&mut self) {
        // Usually the newest leader writes; a cut-off old one keeps trying.
        let alive: Vec<usize> = (0..self.leaders.len())
            .filter(|&g| self.leaders[g].alive)
            .collect();
        if alive.is_empty() {
            *self.stats.entry("commits without a leader").or_default() += 1;
            return;
        }
        let g = if self.rng.random_bool(0.8) {
            *alive.last().expect("non-empty")
        } else {
            alive[self.rng.random_range(0..alive.len())]
        };
        let l = &self.leaders[g];
        let (last, chain) = (l.core.last(), l.core.last_chain());
        let r = record(l.epoch, last.sequence.0 + 1, last, chain);
        let r = if last.epoch == l.epoch {
            r
        } else {
            record(l.epoch, 1, last, chain)
        };
        match self.leaders[g].core.committed(r.clone()) {
            Ok(a) => {
                *self.stats.entry("commits").or_default() += 1;
                self.leaders[g].history.push(r);
                self.leader_actions(g, a);
            }
            Err(_) => self.leaders[g].alive = false, // fenced
        }
    }

    fn deliver(&mut self, choice: u32) {
        // A queue at random; a cut link holds its messages.
        let mut busy: Vec<(u64, bool)> = self
            .queues
            .iter()
            .filter(|(k, q)| {
                !q.is_empty() && {
                    let c = self.conns[&k.0];
                    !self.cut.contains(&(c.index, k.1))
                }
            })
            .map(|(k, _)| *k)
            .collect();
        let replica_busy = !self.to_replica.is_empty() || !self.from_replica.is_empty();
        if busy.is_empty() && !replica_busy {
            return;
        }
        if replica_busy && (busy.is_empty() || choice % 7 == 0) {
            if let Some(w) = self.to_replica.pop_front() {
                match w {
                    Wire::Msg(m) => {
                        let a = self
                            .replica
                            .handle(SubscriberEvent::Received(Source::Leader, m));
                        self.replica_actions(a);
                    }
                    Wire::Close { .. } => {
                        self.drop_replica_connection();
                        self.replica_reconnect = true;
                    }
                }
            } else if let Some(m) = self.from_replica.pop_front() {
                if let Some(g) = self.replica_leader {
                    let a = self.leaders[g].core.handle(LeaderEvent::Received {
                        peer: REPLICA_PEER,
                        message: m,
                    });
                    self.leader_actions(g, a);
                }
            }
            return;
        }
        busy.sort();
        let key = busy[self.rng.random_range(0..busy.len())];
        let w = self
            .queues
            .get_mut(&key)
            .and_then(|q| q.pop_front())
            .expect("non-empty");
        let (id, to_follower) = key;
        let c = self.conns[&id];
        match w {
            Wire::Close { redial } => self.disconnect(id, redial),
            Wire::Msg(m) if to_follower => {
                if self.followers[c.index].up {
                    let a = self.followers[c.index]
                        .core
                        .handle(FollowerEvent::Received {
                            peer: PeerId(id),
                            message: m,
                        });
                    self.follower_actions(c.index, a);
                }
            }
            Wire::Msg(m) => {
                let a = self.leaders[c.leader].core.handle(LeaderEvent::Received {
                    peer: PeerId(id),
                    message: m,
                });
                self.leader_actions(c.leader, a);
            }
        }
    }

    fn crash_follower(&mut self, i: usize) {
        if !self.followers[i].up {
            return;
        }
        let ids: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.index == i)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.disconnect(id, false);
        }
        let keep_extra = {
            let f = &self.followers[i];
            let unsynced = f.log.len() - f.durable_len;
            self.rng.random_range(0..=unsynced)
        };
        let f = &mut self.followers[i];
        f.up = false;
        f.behind = false;
        // A power cut keeps a prefix of what was not synced (the rest is
        // lost or torn, and recovery cuts it); what survives counts as
        // durable after the restart (the log syncs it at open).
        f.durable_len += keep_extra;
        f.log.truncate(f.durable_len);
        f.pending_syncs.clear();
    }

    fn restart_follower(&mut self, i: usize) {
        if self.followers[i].up {
            return;
        }
        let f = &mut self.followers[i];
        f.up = true;
        f.core = f.restarted();
        if let Some(g) = self.newest() {
            self.connect(g, i);
        }
    }

    fn step_inner(&mut self, choice: u32) {
        match choice {
            0..250 => self.commit(),
            250..750 => self.deliver(choice),
            750..900 => {
                // A sync completes, or (rarely) fails: the follower stops
                // (a failed fsync poisons its log until it reopens).
                let i = self.rng.random_range(0..N);
                if self.rng.random_bool(0.01) {
                    self.crash_follower(i);
                    return;
                }
                let f = &mut self.followers[i];
                if let Some(upto) = f.pending_syncs.pop_front() {
                    let n = f.log.partition_point(|r| r.bookmark <= upto);
                    f.durable_len = f.durable_len.max(n);
                    let a = f.core.handle(FollowerEvent::Synced { upto });
                    self.follower_actions(i, a);
                }
            }
            900..910 => {
                let i = self.rng.random_range(0..N);
                self.crash_follower(i);
            }
            910..960 => {
                let i = self.rng.random_range(0..N);
                self.restart_follower(i);
            }
            960..970 => {
                // Cut one direction of one follower's links, or heal one.
                // At most two links are cut at once.
                let link = (self.rng.random_range(0..N), self.rng.random_bool(0.5));
                if !self.cut.remove(&link) && self.cut.len() < 2 {
                    self.cut.insert(link);
                }
            }
            970..975 => {
                // A connection breaks; what was in flight is lost.
                let ids: Vec<u64> = self.conns.keys().copied().collect();
                if !ids.is_empty() {
                    let id = ids[self.rng.random_range(0..ids.len())];
                    self.disconnect(id, true);
                }
            }
            975..980 => {
                self.drop_replica_connection();
                self.replica_reconnect = true;
            }
            980..983 => {
                // The leader crashes: its connections end.
                if let Some(g) = self.newest() {
                    self.kill_leader(g);
                }
            }
            983..986 => {
                // Another node wins a newer epoch; an old leader that is
                // still alive keeps running until a follower fences it.
                self.elect();
            }
            986..995 => {
                if self.newest().is_none() {
                    self.elect();
                }
            }
            _ => {
                for g in 0..self.leaders.len() {
                    if self.leaders[g].alive {
                        self.clock_us += self.rng.random_range(0..20_000);
                        let now_us = self.clock_us;
                        let a = self.leaders[g].core.handle(LeaderEvent::Tick { now_us });
                        self.leader_actions(g, a);
                    }
                }
            }
        }
    }

    fn kill_leader(&mut self, g: usize) {
        self.leaders[g].alive = false;
        let ids: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.leader == g)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.disconnect(id, false);
        }
        if self.replica_leader == Some(g) {
            self.drop_replica_connection();
            self.replica_reconnect = true;
        }
    }

    /// Heals every fault, then lets the cluster make progress.
    fn settle(&mut self, seed: u64) {
        self.cut.clear();
        for i in 0..N {
            self.restart_follower(i);
        }
        for g in 0..self.leaders.len() {
            if self.leaders[g].alive && Some(g) != self.newest() {
                self.kill_leader(g);
            }
        }
        // A failed election may have raised some promises past the leader
        // (it is fenced when it meets them): healed, one more election
        // must win at the highest epoch, and nothing fences it after.
        let mut healing_elections = 0;
        for _ in 0..2_000_000 {
            if self.newest().is_none() {
                healing_elections += 1;
                assert!(
                    healing_elections <= 2,
                    "seed {seed}: leaders keep failing once everything healed"
                );
                assert!(
                    self.elect(),
                    "seed {seed}: no leader once everything healed"
                );
            }
            // A thrifty leader's lazy followers still miss its last batch
            // until a tick flushes it; a replica sent to catch up is not
            // done either.
            let lazy_pending = self
                .newest()
                .is_some_and(|g| self.leaders[g].core.lazy_pending());
            let idle = self.queues.values().all(|q| q.is_empty())
                && self.to_replica.is_empty()
                && self.from_replica.is_empty()
                && self.followers.iter().all(|f| f.pending_syncs.is_empty())
                && !lazy_pending
                && !self.replica_behind;
            if idle {
                break;
            }
            // Deliveries, syncs and ticks only.
            let choice = match self.rng.random_range(0..10) {
                0..6 => 250 + self.rng.random_range(0..500),
                6..9 => 750 + self.rng.random_range(0..150),
                _ => 999,
            };
            if (750..900).contains(&choice) {
                // No failed syncs while healing.
                let i = self.rng.random_range(0..N);
                let f = &mut self.followers[i];
                if let Some(upto) = f.pending_syncs.pop_front() {
                    let n = f.log.partition_point(|r| r.bookmark <= upto);
                    f.durable_len = f.durable_len.max(n);
                    let a = f.core.handle(FollowerEvent::Synced { upto });
                    self.follower_actions(i, a);
                }
                self.reconnect_pending();
            } else {
                self.step_with(choice);
            }
            // A follower whose leader connection is gone gets redialed.
            if let Some(g) = self.newest() {
                for i in 0..N {
                    if self.leaders[g].conn[i] == 0 && !self.followers[i].behind {
                        self.connect(g, i);
                    }
                }
            }
        }
        let g = self
            .newest()
            .unwrap_or_else(|| panic!("seed {seed}: the leader died while healing"));
        let l = &self.leaders[g];
        assert_eq!(
            l.confirmed,
            l.core.last(),
            "seed {seed}: the leader confirms everything once healed"
        );
        for (b, chain) in &self.acked {
            assert!(
                l.history
                    .iter()
                    .any(|r| r.bookmark == *b && r.chain == *chain),
                "seed {seed}: acknowledged {b} is not in the final history"
            );
        }
        assert_eq!(
            self.replica.confirmed(),
            l.confirmed,
            "seed {seed}: the replica caught up"
        );
    }
}

/// The (bookmark, chain) pairs of `confirmed` that `history` lacks.
fn newer_misses(
    history: &[Encoded],
    confirmed: &[(Bookmark, ChainHash)],
) -> Vec<(Bookmark, ChainHash)> {
    confirmed
        .iter()
        .filter(|(b, c)| !history.iter().any(|r| r.bookmark == *b && r.chain == *c))
        .copied()
        .collect()
}

fn record(epoch: Epoch, seq: u64, previous: Bookmark, prev_chain: ChainHash) -> Encoded {
    Record {
        bookmark: Bookmark::new(epoch, Sequence(seq)),
        previous,
        prev_chain,
        commit_us: 0,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![seq as u8; 512]))],
    }
    .to_encoded()
    .expect("valid record")
}

fn run(seed: u64, steps: usize) -> usize {
    let mut sim = Sim::new(seed);
    for _ in 0..steps {
        sim.step();
    }
    sim.settle(seed);
    if std::env::var("WALRELAY_SIM_VERBOSE").is_ok() {
        let l = sim.leaders.last().expect("a leader");
        eprintln!(
            "seed {seed}: {} elections, {} acknowledged, final epoch {} last {} {:?}",
            sim.elections,
            sim.acked.len(),
            l.epoch,
            l.core.last(),
            sim.stats
        );
    }
    sim.elections
}

fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("WALRELAY_SEED") {
        return vec![s.parse().expect("WALRELAY_SEED is a number")];
    }
    let soak = std::env::var("WALRELAY_SOAK").is_ok();
    let mut seeds: Vec<u64> = (0..if soak { 10_000 } else { 200 }).collect();
    let random: u64 = std::env::var("WALRELAY_SIM_RANDOM")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    for k in 0..random {
        let s = clock.wrapping_add(k.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | (1 << 63);
        eprintln!("sim random seed {s} (replay: WALRELAY_SEED={s})");
        seeds.push(s);
    }
    seeds
}

#[test]
fn acknowledged_writes_survive_leader_crashes_partitions_and_storage_faults() {
    let steps = if std::env::var("WALRELAY_SOAK").is_ok() {
        6_000
    } else {
        3_000
    };
    let mut elections = 0;
    for seed in seeds() {
        match std::panic::catch_unwind(|| run(seed, steps)) {
            Ok(n) => elections += n,
            Err(e) => {
                eprintln!("sim seed {seed} failed (replay: WALRELAY_SEED={seed})");
                std::panic::resume_unwind(e);
            }
        }
    }
    assert!(elections > 0, "the runs changed leaders");
    eprintln!("elections: {elections}");
}
