//! The leader's protocol core: the primary side of replication. Sans-IO:
//! events in (a transaction committed, a peer connected or spoke, time
//! passed), actions out (send, confirmed, close, fenced).
//!
//! Rules:
//! - **Fan-out.** Every committed record goes at once to every streaming
//!   replica and to [`FanOut::eager`] of the streaming followers, all
//!   sends sharing the record's bytes; the other followers get it in
//!   batches (the thrifty fan-out, [`fan_out`]; with `eager` = N, none).
//! - **Quorum.** The confirmed watermark is the highest bookmark that W of
//!   the N followers acknowledged as durable ([`QuorumTracker`]). Each
//!   advance is reported ([`LeaderAction::Confirmed`], the output gate) and
//!   sent at once to every streaming replica, which reveals on it.
//!   Followers learn the watermark from the heartbeats (every
//!   `heartbeat_interval_us`) and when they connect: they use it only to
//!   serve catch-up to others, to archive and to release, all of which may
//!   lag by a heartbeat, and a Confirm per record woke each of them for
//!   nothing (papers/performance.md, lever 43).
//! - **Tail.** The leader keeps the records a peer may still need: every
//!   unconfirmed record, and confirmed ones up to `tail_limit_bytes`. A
//!   peer that connects at a position inside the tail is streamed the rest;
//!   one behind the tail is told so ([`RefuseReason::Behind`]) and catches
//!   up from a follower; one whose position is not in this leader's history
//!   is refused as diverged.
//! - **Fencing.** A follower that has accepted a newer epoch ends this
//!   leader ([`LeaderAction::Fenced`]): it must stop writing.
//! - **An adopted tail.** A leader that recovered the log may start with
//!   records of an older epoch after its confirmed start (the tail it
//!   adopted, [`LeaderConfig::adopted`]). It streams them like its own, but
//!   the watermark moves only to bookmarks of its own epoch: the tail is
//!   confirmed when the first record of the new epoch after it is.
//! - **Content identity.** Positions are compared with their chains. A
//!   follower whose log leaves this leader's history (a bookmark it never
//!   issued, or one with another chain) is sent the leader's epoch history
//!   ([`Message::Truncate`]) so it cuts the diverged suffix, and is
//!   dropped until it reconnects.

use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::history::History;
use crate::ids::{DatabaseId, NodeId};
use crate::quorum::{FollowerId, QuorumError, QuorumTracker};
use crate::record::Encoded;
use crate::wire::{Message, RefuseReason, Role};
use std::collections::{BTreeMap, VecDeque};

#[path = "leader_fan_out.rs"]
pub mod fan_out;
pub use fan_out::FanOut;

/// A connection, as the transport names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u64);

/// How a leader is set up.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    pub database: DatabaseId,
    /// This leader's epoch: every record it issues carries it.
    pub epoch: Epoch,
    /// Who this leader is: the id followers promise the epoch to.
    pub node: NodeId,
    /// N: the durability followers.
    pub followers: usize,
    /// W: acknowledgements that make a record confirmed (a majority of N).
    pub write_quorum: usize,
    /// A confirmed position this leader's history holds, and its chain.
    pub start: Bookmark,
    pub start_chain: ChainHash,
    /// Records after `start` that a recovery adopted (older epochs, in
    /// order, chaining from `start`): streamed, and confirmed only by the
    /// first record of this epoch after them.
    pub adopted: Vec<Encoded>,
    /// The epoch history up to the end of `adopted` (or `start`).
    pub history: History,
    /// Confirmed records kept for lagging peers, in bytes.
    pub tail_limit_bytes: usize,
    /// How often streaming peers get a heartbeat carrying the watermark.
    pub heartbeat_interval_us: u64,
    /// Which followers get each record at once.
    pub fan_out: FanOut,
}

/// Why a leader cannot be built or cannot take a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaderError {
    #[error(transparent)]
    Quorum(#[from] QuorumError),
    #[error("record {bookmark} does not follow {last} (its previous is {previous})")]
    OutOfOrder {
        bookmark: Bookmark,
        previous: Bookmark,
        last: Bookmark,
    },
    #[error("record {bookmark} is not in this leader's epoch {epoch}")]
    WrongEpoch { bookmark: Bookmark, epoch: Epoch },
    #[error("this leader was fenced by epoch {0}")]
    Fenced(Epoch),
    #[error("the adopted record {0} does not chain onto the one before it")]
    AdoptedOutOfOrder(Bookmark),
    #[error("{eager} eager followers: it takes between W ({write_quorum}) and N ({followers})")]
    FanOut {
        eager: usize,
        write_quorum: usize,
        followers: usize,
    },
}

/// What happened to the leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// The transport connected to follower number `index` (0..N).
    FollowerConnected {
        peer: PeerId,
        index: usize,
    },
    /// A replica connected to the leader.
    ReplicaConnected {
        peer: PeerId,
    },
    Disconnected {
        peer: PeerId,
    },
    Received {
        peer: PeerId,
        message: Message,
    },
    /// Time passed (microseconds on the driver's monotonic clock).
    Tick {
        now_us: u64,
    },
}

/// Why the leader drops a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// The peer must catch up from a follower before it can stream.
    Behind,
    /// The peer's log is not a prefix of this leader's history.
    Diverged,
    /// The peer serves another database or spoke out of turn.
    Protocol,
    /// The peer refused an append as a gap: reconnect, and resume from the
    /// position its handshake reports.
    Resync,
    /// A follower's log left this leader's history: it was sent the
    /// history to cut back to, and resumes on its next connection.
    Truncated,
    /// This leader stops ([`Leader::farewell`]).
    Stopping,
}

/// What the leader asks its IO to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderAction {
    /// Send a message. An `Append` shares the record's bytes: send it with
    /// [`crate::wire::encode_append`], not a copy.
    Send {
        peer: PeerId,
        message: Message,
    },
    /// Everything up to this bookmark is durable on W followers: results
    /// held for it may be released.
    Confirmed(Bookmark),
    Close {
        peer: PeerId,
        reason: CloseReason,
    },
    /// A follower holds a newer epoch: this leader must stop.
    Fenced(Epoch),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Follower(usize),
    Replica,
}

#[derive(Debug, Clone, Copy)]
struct Peer {
    kind: Kind,
    streaming: bool,
    /// The last record sent on this connection.
    sent: Bookmark,
    /// Sent every record as it commits (replicas always; followers up to
    /// [`FanOut::eager`] of them).
    eager: bool,
}

impl Peer {
    fn new(kind: Kind) -> Peer {
        Peer {
            kind,
            streaming: false,
            sent: Bookmark::ZERO,
            eager: false,
        }
    }
}

/// One leader's protocol state.
#[derive(Debug)]
pub struct Leader {
    config: LeaderConfig,
    quorum: QuorumTracker,
    last: Bookmark,
    last_chain: ChainHash,
    /// The whole history this leader knows, its own records included.
    history: History,
    /// Records after `tail_start`, in order.
    tail: VecDeque<Encoded>,
    tail_start: Bookmark,
    tail_start_chain: ChainHash,
    tail_bytes: usize,
    /// Ordered, so fan-out order is deterministic (the simulator replays).
    peers: BTreeMap<PeerId, Peer>,
    last_heartbeat_us: Option<u64>,
    fenced: Option<Epoch>,
    /// The driver's wall clock (µs since the Unix epoch), stamped on
    /// confirms so replicas can measure lag; never used for decisions.
    clock_us: u64,
    /// The watermark last reported as `Confirmed`.
    reported_confirmed: Bookmark,
    /// Bytes of the tail's records past the watermark (kept as it moves:
    /// the engine asks before every write).
    unconfirmed_bytes: usize,
    /// Bytes committed since the lazy followers were last flushed.
    lazy_pending_bytes: usize,
    /// When the lazy followers were last flushed (the driver's clock).
    last_lazy_flush_us: Option<u64>,
    /// When the eager followers were last checked for a stall, and the
    /// most any of them had acknowledged then (what each must hold by the
    /// next check).
    last_stall_check_us: Option<u64>,
    last_at_stall_check: Bookmark,
    /// Eager followers swapped out for falling behind, since the start.
    eager_swaps: u64,
}

impl Leader {
    pub fn new(mut config: LeaderConfig) -> Result<Leader, LeaderError> {
        let eager = config.fan_out.eager;
        if eager < config.write_quorum || eager > config.followers {
            return Err(LeaderError::FanOut {
                eager,
                write_quorum: config.write_quorum,
                followers: config.followers,
            });
        }
        let quorum = QuorumTracker::new(config.followers, config.write_quorum, config.start)?
            .confirming_from(config.epoch);
        let (mut last, mut last_chain) = (config.start, config.start_chain);
        for r in &config.adopted {
            if r.previous != last || r.prev_chain != last_chain || r.bookmark.epoch >= config.epoch
            {
                return Err(LeaderError::AdoptedOutOfOrder(r.bookmark));
            }
            (last, last_chain) = (r.bookmark, r.chain);
        }
        let tail: VecDeque<Encoded> = std::mem::take(&mut config.adopted).into();
        let tail_bytes: usize = tail.iter().map(|r| r.bytes.len()).sum();
        let mut history = config.history.clone();
        history.cut_after(last);
        Ok(Leader {
            last,
            last_chain,
            history,
            tail_start: config.start,
            tail_start_chain: config.start_chain,
            reported_confirmed: config.start,
            unconfirmed_bytes: tail_bytes,
            lazy_pending_bytes: 0,
            last_lazy_flush_us: None,
            last_stall_check_us: None,
            last_at_stall_check: Bookmark::ZERO,
            eager_swaps: 0,
            quorum,
            config,
            tail,
            tail_bytes,
            peers: BTreeMap::new(),
            last_heartbeat_us: None,
            fenced: None,
            clock_us: 0,
        })
    }

    /// Sets the wall clock stamped on the next confirms.
    pub fn set_clock_us(&mut self, now_us: u64) {
        self.clock_us = now_us;
    }

    /// The last record committed through this leader.
    pub fn last(&self) -> Bookmark {
        self.last
    }
    /// The chain of the last record.
    pub fn last_chain(&self) -> ChainHash {
        self.last_chain
    }
    pub fn confirmed(&self) -> Bookmark {
        self.quorum.confirmed()
    }
    /// Bytes of records committed but not yet confirmed (backpressure).
    pub fn unconfirmed_bytes(&self) -> usize {
        self.unconfirmed_bytes
    }
    /// Bytes of the records held for peers (every unconfirmed one and
    /// confirmed ones up to `tail_limit_bytes`): this leader's memory for them.
    pub fn tail_bytes(&self) -> usize {
        self.tail_bytes
    }
    /// The durable position each follower last reported (None: never).
    pub fn follower_durable(&self, index: usize) -> Option<Bookmark> {
        self.quorum.durable(FollowerId(index))
    }
    /// Followers currently streaming.
    pub fn streaming_followers(&self) -> usize {
        self.peers
            .values()
            .filter(|p| p.streaming && matches!(p.kind, Kind::Follower(_)))
            .count()
    }

    /// What a leader that stops still owes: its confirmed watermark to
    /// every streaming follower (they otherwise learn it only from the
    /// next heartbeat, which a stopped leader does not send), then a close
    /// of every connection, which lets what was sent go out first.
    pub fn farewell(&mut self) -> Vec<LeaderAction> {
        let mut out = Vec::new();
        self.flush_lazy(&mut out);
        let peers: Vec<(PeerId, Peer)> = self.peers.iter().map(|(id, p)| (*id, *p)).collect();
        for (id, p) in peers {
            if p.streaming && matches!(p.kind, Kind::Follower(_)) {
                let message = Message::Confirm {
                    confirmed: self.confirmed(),
                    confirmed_us: self.clock_us,
                };
                Self::send(&mut out, id, message);
            }
            self.close(id, CloseReason::Stopping, &mut out);
        }
        out
    }

    fn send(out: &mut Vec<LeaderAction>, peer: PeerId, message: Message) {
        out.push(LeaderAction::Send { peer, message });
    }

    /// Takes the next committed record and fans it out.
    pub fn committed(&mut self, record: Encoded) -> Result<Vec<LeaderAction>, LeaderError> {
        if let Some(e) = self.fenced {
            return Err(LeaderError::Fenced(e));
        }
        if record.bookmark.epoch != self.config.epoch {
            return Err(LeaderError::WrongEpoch {
                bookmark: record.bookmark,
                epoch: self.config.epoch,
            });
        }
        if record.previous != self.last
            || record.bookmark <= self.last
            || record.prev_chain != self.last_chain
        {
            return Err(LeaderError::OutOfOrder {
                bookmark: record.bookmark,
                previous: record.previous,
                last: self.last,
            });
        }
        let mut out = Vec::new();
        let bytes = record.bytes.len();
        self.last = record.bookmark;
        self.last_chain = record.chain;
        self.history.record(record.bookmark);
        self.tail_bytes += bytes;
        self.unconfirmed_bytes += bytes;
        self.tail.push_back(record);
        self.fan_out(bytes, &mut out);
        Ok(out)
    }

    /// Handles one event; returns the actions to carry out, in order.
    pub fn handle(&mut self, event: LeaderEvent) -> Vec<LeaderAction> {
        let mut out = Vec::new();
        match event {
            LeaderEvent::FollowerConnected { peer, index } => {
                if index >= self.config.followers {
                    out.push(LeaderAction::Close {
                        peer,
                        reason: CloseReason::Protocol,
                    });
                    return out;
                }
                self.peers.insert(peer, Peer::new(Kind::Follower(index)));
                Self::send(
                    &mut out,
                    peer,
                    Message::Handshake {
                        database: self.config.database,
                        epoch: self.config.epoch,
                        role: Role::Leader,
                        node: self.config.node,
                        last_durable: self.last,
                        last_chain: self.last_chain,
                        confirmed: self.quorum.confirmed(),
                        history: History::new(),
                    },
                );
            }
            LeaderEvent::ReplicaConnected { peer } => {
                self.peers.insert(peer, Peer::new(Kind::Replica));
            }
            LeaderEvent::Disconnected { peer } => {
                self.forget(peer, &mut out);
            }
            LeaderEvent::Received { peer, message } => self.received(peer, message, &mut out),
            LeaderEvent::Tick { now_us } => {
                // Lazy followers first, so a heartbeat's watermark follows
                // the records it may cover.
                self.lazy_tick(now_us, &mut out);
                let due = self
                    .last_heartbeat_us
                    .is_none_or(|t| now_us.saturating_sub(t) >= self.config.heartbeat_interval_us);
                if due {
                    self.last_heartbeat_us = Some(now_us);
                    for id in self.streaming_ids() {
                        Self::send(
                            &mut out,
                            id,
                            Message::Heartbeat {
                                epoch: self.config.epoch,
                                confirmed: self.confirmed(),
                                sent_us: now_us,
                            },
                        );
                    }
                }
            }
        }
        out
    }

    fn streaming_ids(&self) -> Vec<PeerId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.streaming)
            .map(|(id, _)| *id)
            .collect()
    }

    fn streaming_replica_ids(&self) -> Vec<PeerId> {
        self.peers
            .iter()
            .filter(|(_, p)| p.streaming && matches!(p.kind, Kind::Replica))
            .map(|(id, _)| *id)
            .collect()
    }

    /// Where `position` stands against this leader's history: the tail
    /// index to stream from. `chain` (None: not known, a replica's
    /// confirmed position) must match where the tail can tell.
    fn locate(&self, position: Bookmark, chain: Option<ChainHash>) -> Result<usize, CloseReason> {
        let matches = |c: ChainHash| chain.is_none_or(|x| x == c);
        if position == self.tail_start {
            return if matches(self.tail_start_chain) {
                Ok(0)
            } else {
                Err(CloseReason::Diverged)
            };
        }
        if position < self.tail_start {
            return if self.history.holds(position) {
                Err(CloseReason::Behind)
            } else {
                Err(CloseReason::Diverged)
            };
        }
        match self.tail.binary_search_by(|r| r.bookmark.cmp(&position)) {
            Ok(i) if matches(self.tail[i].chain) => Ok(i + 1),
            _ => Err(CloseReason::Diverged),
        }
    }

    /// The chain this leader holds at `position`, where its tail knows it.
    fn chain_at(&self, position: Bookmark) -> Option<ChainHash> {
        if position == self.tail_start {
            return Some(self.tail_start_chain);
        }
        self.tail
            .binary_search_by(|r| r.bookmark.cmp(&position))
            .ok()
            .map(|i| self.tail[i].chain)
    }

    /// Sends a follower whose log left this history the history to cut
    /// back to, and drops it until it reconnects.
    fn truncate_and_close(&mut self, peer: PeerId, out: &mut Vec<LeaderAction>) {
        Self::send(
            out,
            peer,
            Message::Truncate {
                history: self.history.clone(),
            },
        );
        self.close(peer, CloseReason::Truncated, out);
    }

    fn stream_from(&self, peer: PeerId, from: usize, out: &mut Vec<LeaderAction>) {
        for r in self.tail.iter().skip(from) {
            Self::send(out, peer, Message::Append(r.clone()));
        }
    }

    /// Forgets `peer`; an eager follower's place goes to a lazy one.
    fn forget(&mut self, peer: PeerId, out: &mut Vec<LeaderAction>) {
        let was_eager_follower = self
            .peers
            .remove(&peer)
            .is_some_and(|p| p.streaming && p.eager && matches!(p.kind, Kind::Follower(_)));
        if was_eager_follower {
            self.rebalance(out);
        }
    }

    /// Refuses `peer` with the reason and forgets it.
    fn refuse_and_close(&mut self, peer: PeerId, reason: CloseReason, out: &mut Vec<LeaderAction>) {
        let refuse = match reason {
            CloseReason::Behind => RefuseReason::Behind,
            CloseReason::Diverged => RefuseReason::Diverged,
            CloseReason::Protocol
            | CloseReason::Resync
            | CloseReason::Truncated
            | CloseReason::Stopping => RefuseReason::WrongDatabase,
        };
        Self::send(
            out,
            peer,
            Message::Refuse {
                epoch: self.config.epoch,
                reason: refuse,
            },
        );
        self.close(peer, reason, out);
    }

    /// Closes `peer` and forgets it.
    fn close(&mut self, peer: PeerId, reason: CloseReason, out: &mut Vec<LeaderAction>) {
        out.push(LeaderAction::Close { peer, reason });
        self.forget(peer, out);
    }

    fn received(&mut self, peer: PeerId, message: Message, out: &mut Vec<LeaderAction>) {
        let Some(state) = self.peers.get(&peer).copied() else {
            return; // a message racing its connection's close
        };
        match (state.kind, message) {
            (
                kind,
                Message::Handshake {
                    database,
                    epoch,
                    role,
                    last_durable,
                    last_chain,
                    ..
                },
            ) => {
                let role_ok = matches!(
                    (kind, role),
                    (Kind::Follower(_), Role::Follower) | (Kind::Replica, Role::Replica)
                );
                if database != self.config.database || !role_ok || state.streaming {
                    self.refuse_and_close(peer, CloseReason::Protocol, out);
                    return;
                }
                if epoch > self.config.epoch {
                    // Only a durability follower's accepted epoch fences a
                    // leader; a replica (or anything on the replica port)
                    // claiming a newer epoch is simply not of this history.
                    if let Kind::Follower(_) = kind {
                        self.fence(epoch, out);
                    } else {
                        self.refuse_and_close(peer, CloseReason::Diverged, out);
                    }
                    return;
                }
                let chain = matches!(kind, Kind::Follower(_)).then_some(last_chain);
                let from = match self.locate(last_durable, chain) {
                    Ok(from) => from,
                    Err(CloseReason::Diverged) if chain.is_some() => {
                        tracing::warn!(
                            at = %last_durable,
                            "a follower's log left this leader's history: it cuts back"
                        );
                        self.truncate_and_close(peer, out);
                        return;
                    }
                    Err(reason) => {
                        self.refuse_and_close(peer, reason, out);
                        return;
                    }
                };
                if let Kind::Follower(index) = kind {
                    // Only what it holds now counts (it may be less than
                    // before, after a cut tail).
                    let _ = self.quorum.reset(FollowerId(index), last_durable);
                    self.after_quorum_change(out);
                }
                let eager = matches!(kind, Kind::Replica) || self.eager_wanted();
                let last = self.last;
                if let Some(p) = self.peers.get_mut(&peer) {
                    p.streaming = true;
                    p.sent = last;
                    p.eager = eager;
                }
                self.stream_from(peer, from, out);
                Self::send(
                    out,
                    peer,
                    Message::Confirm {
                        confirmed: self.confirmed(),
                        confirmed_us: self.clock_us,
                    },
                );
            }
            (Kind::Follower(index), Message::Ack { durable, chain }) => {
                if durable > self.last {
                    self.refuse_and_close(peer, CloseReason::Diverged, out);
                    return;
                }
                // Content, not only position: an ack of another record at
                // the same bookmark, or of one this history never held,
                // never counts.
                let foreign = match self.chain_at(durable) {
                    Some(c) => c != chain,
                    None => !self.history.holds(durable),
                };
                if foreign {
                    self.truncate_and_close(peer, out);
                    return;
                }
                self.ack(index, durable, out);
            }
            (kind, Message::Refuse { epoch, reason }) => match reason {
                RefuseReason::StaleEpoch
                    if epoch > self.config.epoch && matches!(kind, Kind::Follower(_)) =>
                {
                    self.fence(epoch, out)
                }
                RefuseReason::Gap => {
                    // Resending on this connection would race the appends
                    // still in flight (each would refuse again and ask for
                    // another resend). A fresh connection resumes cleanly
                    // from the position its handshake reports.
                    self.close(peer, CloseReason::Resync, out);
                }
                _ => {
                    self.close(peer, CloseReason::Protocol, out);
                }
            },
            // Heartbeats from peers only prove liveness; nothing else is
            // theirs to send.
            (_, Message::Heartbeat { .. }) => {}
            _ => {
                self.close(peer, CloseReason::Protocol, out);
            }
        }
    }

    fn fence(&mut self, epoch: Epoch, out: &mut Vec<LeaderAction>) {
        if self.fenced.is_none() {
            self.fenced = Some(epoch);
            out.push(LeaderAction::Fenced(epoch));
        }
    }

    fn ack(&mut self, index: usize, durable: Bookmark, out: &mut Vec<LeaderAction>) {
        if self.quorum.ack(FollowerId(index), durable).is_ok() {
            self.after_quorum_change(out);
        }
    }

    /// Reports a confirmed watermark that moved, and tells the replicas.
    fn after_quorum_change(&mut self, out: &mut Vec<LeaderAction>) {
        let before = self.reported_confirmed;
        let after = self.confirmed();
        self.reported_confirmed = after;
        if after > before {
            // Records in (before, after] left the unconfirmed count; the
            // tail still holds them (trimming only follows this).
            let from = self.tail.partition_point(|r| r.bookmark <= before);
            let to = self.tail.partition_point(|r| r.bookmark <= after);
            let freed: usize = self.tail.range(from..to).map(|r| r.bytes.len()).sum();
            self.unconfirmed_bytes = self.unconfirmed_bytes.saturating_sub(freed);
            // The invariant the output gate rests on: never confirm what
            // this leader has not issued.
            assert!(
                after <= self.last,
                "confirmed {after} beyond last {}",
                self.last
            );
            out.push(LeaderAction::Confirmed(after));
            for id in self.streaming_replica_ids() {
                Self::send(
                    out,
                    id,
                    Message::Confirm {
                        confirmed: after,
                        confirmed_us: self.clock_us,
                    },
                );
            }
            self.trim(out);
        }
    }

    fn trim(&mut self, out: &mut Vec<LeaderAction>) {
        let confirmed = self.confirmed();
        while self.tail_bytes > self.config.tail_limit_bytes {
            let Some(dropping) = self
                .tail
                .front()
                .map(|r| r.bookmark)
                .filter(|b| *b <= confirmed)
            else {
                break;
            };
            self.flush_before_trim(dropping, out);
            let r = self.tail.pop_front().expect("the front was just read");
            self.tail_bytes -= r.bytes.len();
            self.tail_start = r.bookmark;
            self.tail_start_chain = r.chain;
        }
    }
}

#[cfg(test)]
#[path = "leader_tests.rs"]
mod tests;
