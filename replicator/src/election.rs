//! Winning an epoch, and choosing the log to adopt. Sans-IO: connections
//! and messages in, sends out; the caller asks [`Election::won`].
//!
//! A node that wants to lead claims an epoch with a leader handshake to
//! every follower. A follower promises it (persisting the promise first)
//! if the epoch is newer than any it promised, and answers with where its
//! log ends, its chain, the newest bookmark it knows confirmed and its
//! epoch history. A refusal names the follower's own epoch; the candidate
//! then claims the next one above it and starts counting again.
//!
//! With W promises for one epoch the election is won. The log to adopt is
//! the one that ends at the highest bookmark among them. Why that log holds
//! every confirmed record: a record confirmed in epoch e was durable on W
//! followers while each still held its promise of e (a follower acks only
//! to the leader it promised). Any W promisers of a newer epoch include one
//! of them, which promised only after holding the record, so its log ends
//! at or past it; the highest log among the promisers ends in an epoch at
//! least as new, and (by induction over the leaders in between, each of
//! which adopted such a log before appending) contains the record. W is a
//! majority of N, so any two sets of W intersect.

use crate::bookmark::{Bookmark, Epoch};
use crate::follower::LogEnd;
use crate::history::History;
use crate::ids::{DatabaseId, NodeId};
use crate::leader::PeerId;
use crate::wire::{Message, RefuseReason, Role};
use std::collections::BTreeMap;

/// What happened to the candidate's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ElectionEvent {
    /// The connection to follower `index` is up.
    Connected {
        peer: PeerId,
        index: usize,
    },
    Received {
        peer: PeerId,
        message: Message,
    },
    Disconnected {
        peer: PeerId,
    },
}

/// A send the candidate asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Send {
    pub peer: PeerId,
    pub message: Message,
}

/// One follower's promise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Promised {
    pub index: usize,
    pub end: LogEnd,
    /// The newest bookmark it knew confirmed.
    pub confirmed: Bookmark,
    pub history: History,
}

/// An election won.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Won {
    pub epoch: Epoch,
    /// The W (or more) promises, by follower index.
    pub promises: Vec<Promised>,
    /// The promise whose log is adopted: the highest end.
    pub adopted: Promised,
    /// The newest bookmark any promiser knew confirmed: every later
    /// history holds it.
    pub confirmed: Bookmark,
}

/// Why an election cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ElectionError {
    #[error("epochs are exhausted (a follower holds {0})")]
    EpochExhausted(Epoch),
}

/// A candidate's state.
#[derive(Debug)]
pub struct Election {
    database: DatabaseId,
    node: NodeId,
    epoch: Epoch,
    write_quorum: usize,
    connected: BTreeMap<PeerId, usize>,
    promises: BTreeMap<usize, Promised>,
    failed: Option<ElectionError>,
}

impl Election {
    /// A candidate `node` claiming at least `epoch`, needing `write_quorum`
    /// promises.
    pub fn new(database: DatabaseId, node: NodeId, epoch: Epoch, write_quorum: usize) -> Election {
        Election {
            database,
            node,
            epoch: epoch.max(Epoch(1)),
            write_quorum,
            connected: BTreeMap::new(),
            promises: BTreeMap::new(),
            failed: None,
        }
    }

    /// The epoch being claimed now.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn failed(&self) -> Option<ElectionError> {
        self.failed
    }

    /// Promises counted for the current epoch.
    pub fn promise_count(&self) -> usize {
        self.promises.len()
    }

    fn claim(&self, peer: PeerId) -> Send {
        Send {
            peer,
            message: Message::Handshake {
                database: self.database,
                epoch: self.epoch,
                role: Role::Leader,
                node: self.node,
                last_durable: Bookmark::ZERO,
                last_chain: crate::chain::ChainHash::GENESIS,
                confirmed: Bookmark::ZERO,
                history: History::new(),
            },
        }
    }

    /// Handles one event; returns the sends to make, in order.
    pub fn handle(&mut self, event: ElectionEvent) -> Vec<Send> {
        let mut out = Vec::new();
        match event {
            ElectionEvent::Connected { peer, index } => {
                self.connected.insert(peer, index);
                out.push(self.claim(peer));
            }
            ElectionEvent::Disconnected { peer } => {
                // A promise once made stays made (it is persisted).
                self.connected.remove(&peer);
            }
            ElectionEvent::Received { peer, message } => {
                let Some(&index) = self.connected.get(&peer) else {
                    return out;
                };
                match message {
                    Message::Handshake {
                        database,
                        epoch,
                        role: Role::Follower,
                        last_durable,
                        last_chain,
                        confirmed,
                        history,
                        ..
                    } if database == self.database && epoch == self.epoch => {
                        self.promises.insert(
                            index,
                            Promised {
                                index,
                                end: LogEnd {
                                    last: last_durable,
                                    chain: last_chain,
                                },
                                confirmed,
                                history,
                            },
                        );
                    }
                    Message::Refuse {
                        epoch,
                        reason: RefuseReason::StaleEpoch,
                    } if epoch >= self.epoch => match epoch.next() {
                        Some(next) => {
                            tracing::info!(
                                refused = self.epoch.0,
                                next = next.0,
                                "a follower holds a newer epoch: claiming the next"
                            );
                            self.epoch = next;
                            self.promises.clear();
                            let peers: Vec<PeerId> = self.connected.keys().copied().collect();
                            out.extend(peers.into_iter().map(|p| self.claim(p)));
                        }
                        None => self.failed = Some(ElectionError::EpochExhausted(epoch)),
                    },
                    _ => {}
                }
            }
        }
        out
    }

    /// The outcome, once W followers promised the current epoch.
    pub fn won(&self) -> Option<Won> {
        if self.promises.len() < self.write_quorum {
            return None;
        }
        let adopted = self
            .promises
            .values()
            .max_by(|a, b| a.end.last.cmp(&b.end.last).then(b.index.cmp(&a.index)))?
            .clone();
        let confirmed = self
            .promises
            .values()
            .map(|p| p.confirmed)
            .filter(|c| adopted.history.holds(*c) && *c <= adopted.end.last)
            .max()
            .unwrap_or(Bookmark::ZERO);
        Some(Won {
            epoch: self.epoch,
            promises: self.promises.values().cloned().collect(),
            adopted,
            confirmed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::Sequence;
    use crate::chain::ChainHash;

    const DB: DatabaseId = DatabaseId(3);

    fn b(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    fn promise(epoch: u32, last: Bookmark, runs: &[(u32, u64)]) -> Message {
        Message::Handshake {
            database: DB,
            epoch: Epoch(epoch),
            role: Role::Follower,
            node: NodeId::NONE,
            last_durable: last,
            last_chain: ChainHash::over(&[&last.to_bytes()]),
            confirmed: b(1, 1),
            history: History::from_runs(
                runs.iter()
                    .map(|(e, s)| (Epoch(*e), Sequence(*s)))
                    .collect(),
            )
            .expect("runs"),
        }
    }

    #[test]
    fn the_highest_log_among_w_promises_is_adopted() {
        let mut e = Election::new(DB, NodeId(9), Epoch(2), 2);
        for i in 0..3 {
            let sent = e.handle(ElectionEvent::Connected {
                peer: PeerId(i),
                index: i as usize,
            });
            assert!(matches!(
                &sent[0].message,
                Message::Handshake {
                    epoch: Epoch(2),
                    node: NodeId(9),
                    role: Role::Leader,
                    ..
                }
            ));
        }
        e.handle(ElectionEvent::Received {
            peer: PeerId(0),
            message: promise(2, b(1, 4), &[(1, 4)]),
        });
        assert!(e.won().is_none(), "one promise is not W");
        e.handle(ElectionEvent::Received {
            peer: PeerId(2),
            message: promise(2, b(1, 6), &[(1, 6)]),
        });
        let won = e.won().expect("won");
        assert_eq!(won.epoch, Epoch(2));
        assert_eq!(won.adopted.index, 2);
        assert_eq!(won.adopted.end.last, b(1, 6));
        assert_eq!(won.confirmed, b(1, 1));
    }

    #[test]
    fn a_refusal_from_a_newer_epoch_restarts_the_count_above_it() {
        let mut e = Election::new(DB, NodeId(9), Epoch(2), 2);
        for i in 0..2 {
            e.handle(ElectionEvent::Connected {
                peer: PeerId(i),
                index: i as usize,
            });
        }
        e.handle(ElectionEvent::Received {
            peer: PeerId(0),
            message: promise(2, b(1, 4), &[(1, 4)]),
        });
        let sent = e.handle(ElectionEvent::Received {
            peer: PeerId(1),
            message: Message::Refuse {
                epoch: Epoch(5),
                reason: RefuseReason::StaleEpoch,
            },
        });
        assert_eq!(e.epoch(), Epoch(6));
        assert_eq!(sent.len(), 2, "both followers are asked again");
        assert!(e.won().is_none(), "promises of epoch 2 do not count for 6");
        // A late promise of the old epoch is ignored.
        e.handle(ElectionEvent::Received {
            peer: PeerId(1),
            message: promise(2, b(1, 4), &[(1, 4)]),
        });
        assert!(e.won().is_none());
    }
}
