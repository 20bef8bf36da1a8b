//! The durability follower's protocol core. Sans-IO: events in (messages
//! received, storage done), actions out (append, sync, persist a promise,
//! cut the log, send). The real transport and a deterministic simulator
//! drive the same code.
//!
//! Rules:
//! - **Promises.** A leader's handshake claims an epoch. The follower
//!   promises it to that leader (persisted before it answers) only if the
//!   epoch is newer than its promise, or is the promised epoch from the
//!   same leader; anything else is refused as stale. So no two leaders can
//!   each win W followers in one epoch. Its answer is the promise: where
//!   its log ends, that record's chain and its epoch history. Only a
//!   leader's handshake raises the epoch: an append from a newer epoch is
//!   refused as `NotIntroduced`.
//! - **Order.** An append must follow the follower's log: its `previous`
//!   is the last record and its `prev_chain` that record's chain. A
//!   duplicate is ignored (and re-acked); anything else is refused as a
//!   gap, with an ack of where the follower stands (the leader then
//!   reconnects and resumes from the handshake position).
//! - **Truncation.** A leader that finds the follower's log off its own
//!   history sends that history; the follower cuts its log back to the
//!   newest bookmark both hold ([`History::common_with`]). Only the
//!   leader it promised to can make it cut.
//! - **Group sync.** At most one sync is in flight. Records appended while
//!   it runs are covered by the next one, issued when it completes: one
//!   fdatasync per group, however many records arrived.
//! - **Acks** carry the highest bookmark durable on this follower and its
//!   chain, and are sent only after a sync that covers it.
//! - **Catch-up** serves other nodes only records both confirmed and
//!   durable here; the leader it promised to may read its whole durable log
//!   (a new leader adopting it). A follower the leader sends away
//!   (`Behind`) fetches confirmed history from a peer, whatever its epoch,
//!   as long as it chains.
//! - **Retention.** The archiver releases a confirmed prefix of the log
//!   once cold storage holds it ([`FollowerEvent::Released`]); the log then
//!   starts there. A catch-up from before the start is answered with
//!   [`Message::Archived`] (the start, its chain and the epoch history up
//!   to it) instead of records. A follower catching up that is told so,
//!   and whose log ends before that start, starts its log over there
//!   ([`FollowerAction::ResetToArchived`]) and goes on catching up from it.
//!   Why that is safe: a peer releases only records it knows confirmed,
//!   so everything up to its start is committed history: every later
//!   leader's history holds it, and the start's chain pins which history.
//!   This log ends before that start, so each record it drops either is in
//!   that history (its copies live on in the peers and in cold storage) or
//!   is not (a tail from an epoch that lost, never confirmed: a confirmed
//!   record at or before the start is in that history). No confirmed
//!   record is lost with it, and afterwards the log is again a prefix of
//!   committed history, with no unconfirmed tail at all. Its end only
//!   moves forward, so the election's argument still holds for the
//!   promises it gives: a promiser's log ends at or past every confirmed
//!   record it acknowledged (the ones before its start are read from cold
//!   storage by a new leader, see `CandidateError::Archived`).

use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::epoch_file::Promise;
use crate::history::History;
use crate::ids::{DatabaseId, NodeId};
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
    /// A cut asked for with [`FollowerAction::Truncate`] is done (and
    /// durable): the log now ends at `last`, whose chain is `chain`.
    Truncated { last: Bookmark, chain: ChainHash },
    /// The log's prefix up to `start` (a confirmed record whose chain is
    /// `chain`) was released to cold storage: catch-up from before it is
    /// answered with [`Message::Archived`].
    Released { start: Bookmark, chain: ChainHash },
    /// The reset asked for with [`FollowerAction::ResetToArchived`] is done
    /// (and durable): the log is empty and starts at `start`, whose chain
    /// is `chain`, with `history` up to it.
    Reset {
        start: Bookmark,
        chain: ChainHash,
        history: History,
    },
}

/// What the follower asks its IO to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FollowerAction {
    /// Make the promise durable before anything else is done in its epoch.
    PersistPromise(Promise),
    /// Append the record to the log (not yet durable).
    Append(Encoded),
    /// Make everything appended up to `upto` durable, then report
    /// [`FollowerEvent::Synced`].
    Sync {
        upto: Bookmark,
    },
    /// Cut every record after `after` from the log, durably, then report
    /// [`FollowerEvent::Truncated`].
    Truncate {
        after: Bookmark,
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
    /// Drop the whole log (it ends before `start`) and start it over,
    /// empty, at `start` (whose chain is `chain`, with `history` the epoch
    /// history up to it), durably; then report [`FollowerEvent::Reset`].
    /// Everything up to `start` is confirmed and in cold storage.
    ResetToArchived {
        start: Bookmark,
        chain: ChainHash,
        history: History,
    },
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

/// Where a log ends: a bookmark and that record's chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogEnd {
    pub last: Bookmark,
    pub chain: ChainHash,
}

impl LogEnd {
    pub const GENESIS: LogEnd = LogEnd {
        last: Bookmark::ZERO,
        chain: ChainHash::GENESIS,
    };
}

/// One follower's protocol state.
#[derive(Debug, Clone)]
pub struct Follower {
    database: DatabaseId,
    promise: Promise,
    /// Where the log starts: records up to here were released.
    start: LogEnd,
    appended: LogEnd,
    durable: LogEnd,
    /// The epoch history of the appended log.
    history: History,
    confirmed: Bookmark,
    /// The end the sync in flight covers.
    sync_in_flight: Option<LogEnd>,
    sync_wanted: bool,
    /// The connection whose leader handshake was accepted: the only one
    /// whose appends, confirms, heartbeats and cuts are taken.
    leader: Option<PeerId>,
    catch_up: CatchUp,
    /// A cut in progress: no appends are taken until it is reported.
    truncating: bool,
}

impl Follower {
    /// A follower whose persisted promise is `promise` and whose log (after
    /// recovery) ends at `end` with `history`, all of it durable.
    pub fn new(database: DatabaseId, promise: Promise, end: LogEnd, history: History) -> Follower {
        Follower {
            database,
            promise,
            start: LogEnd::GENESIS,
            appended: end,
            durable: end,
            history,
            confirmed: Bookmark::ZERO,
            sync_in_flight: None,
            sync_wanted: false,
            leader: None,
            catch_up: CatchUp::Idle,
            truncating: false,
        }
    }

    /// The same follower for a log whose prefix up to `start` was
    /// released (confirmed records, archived): catch-up from before it is
    /// answered with [`Message::Archived`].
    pub fn with_start(mut self, start: LogEnd) -> Follower {
        self.start = start;
        self.confirmed = self.confirmed.max(start.last);
        self
    }

    pub fn epoch(&self) -> Epoch {
        self.promise.epoch
    }
    /// Where the log starts (the last released record).
    pub fn start(&self) -> LogEnd {
        self.start
    }
    /// The newest bookmark known confirmed and durable here.
    pub fn confirmed(&self) -> Bookmark {
        self.confirmed.min(self.durable.last)
    }
    pub fn promise(&self) -> Promise {
        self.promise
    }
    pub fn durable(&self) -> Bookmark {
        self.durable.last
    }
    pub fn last_appended(&self) -> Bookmark {
        self.appended.last
    }
    pub fn history(&self) -> &History {
        &self.history
    }
    /// The connection catch-up is streaming from, if any.
    pub fn catch_up_source(&self) -> Option<PeerId> {
        match self.catch_up {
            CatchUp::From { peer, .. } => Some(peer),
            _ => None,
        }
    }

    /// The handshake opening a catch-up connection: names the database,
    /// claims nothing (role follower).
    fn introduction(&self) -> Message {
        Message::Handshake {
            database: self.database,
            epoch: self.promise.epoch,
            role: Role::Follower,
            node: NodeId::NONE,
            last_durable: self.durable.last,
            last_chain: self.durable.chain,
            confirmed: self.confirmed.min(self.durable.last),
            history: History::new(),
        }
    }

    /// The same follower, knowing `confirmed` was confirmed (what it knew
    /// before its state was set aside, e.g. by a host closing an idle
    /// database); never past its durable end.
    pub fn with_confirmed(mut self, confirmed: Bookmark) -> Follower {
        self.confirmed = self.confirmed.max(confirmed.min(self.durable.last));
        self
    }

    pub fn database(&self) -> DatabaseId {
        self.database
    }

    /// Whether a sync is asked for or running: the log holds records not
    /// yet acknowledged as durable.
    pub fn sync_pending(&self) -> bool {
        self.sync_in_flight.is_some() || self.sync_wanted
    }

    /// Whether catch-up is dialing or streaming.
    pub fn catching_up(&self) -> bool {
        self.catch_up != CatchUp::Idle
    }

    fn send(peer: PeerId, message: Message) -> FollowerAction {
        FollowerAction::Send { peer, message }
    }

    fn refuse(&self, peer: PeerId, reason: RefuseReason) -> FollowerAction {
        Self::send(
            peer,
            Message::Refuse {
                epoch: self.promise.epoch,
                reason,
            },
        )
    }

    fn ack(&self, peer: PeerId) -> FollowerAction {
        Self::send(
            peer,
            Message::Ack {
                durable: self.durable.last,
                chain: self.durable.chain,
            },
        )
    }

    /// Takes a leader's claim on `epoch`: true if promised (now or before)
    /// to `node`, false (and refused) otherwise.
    fn promise_to(
        &mut self,
        peer: PeerId,
        epoch: Epoch,
        node: NodeId,
        out: &mut Vec<FollowerAction>,
    ) -> bool {
        let same = epoch == self.promise.epoch && node == self.promise.leader;
        if epoch < self.promise.epoch || (epoch == self.promise.epoch && !same) {
            out.push(self.refuse(peer, RefuseReason::StaleEpoch));
            return false;
        }
        if !same {
            self.promise = Promise {
                epoch,
                leader: node,
            };
            out.push(FollowerAction::PersistPromise(self.promise));
        }
        true
    }

    fn request_sync(&mut self, out: &mut Vec<FollowerAction>) {
        if self.sync_in_flight.is_some() {
            self.sync_wanted = true;
        } else {
            self.sync_in_flight = Some(self.appended);
            out.push(FollowerAction::Sync {
                upto: self.appended.last,
            });
        }
    }

    /// Takes `record` after the log's end if it chains on; false if not.
    fn take(&mut self, record: Encoded, out: &mut Vec<FollowerAction>) -> bool {
        if record.previous != self.appended.last || record.prev_chain != self.appended.chain {
            return false;
        }
        self.appended = LogEnd {
            last: record.bookmark,
            chain: record.chain,
        };
        self.history.record(record.bookmark);
        out.push(FollowerAction::Append(record));
        self.request_sync(out);
        true
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
                    let from = self.appended.last;
                    self.catch_up = CatchUp::From { peer, from };
                    // Introduce the connection first: a peer serving many
                    // databases routes it by the database named here (one
                    // serving a single one ignores a follower's handshake).
                    out.push(Self::send(peer, self.introduction()));
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
                let covered = self.sync_in_flight.take();
                if let Some(end) = covered.filter(|e| e.last == upto && upto > self.durable.last) {
                    self.durable = end;
                    if let Some(leader) = self.leader {
                        out.push(self.ack(leader));
                    }
                }
                if self.sync_wanted {
                    self.sync_wanted = false;
                    self.request_sync(&mut out);
                }
            }
            FollowerEvent::Truncated { last, chain } => {
                let end = LogEnd { last, chain };
                self.truncating = false;
                // The runtime synced before it cut: no sync is outstanding
                // for this log any more.
                self.sync_in_flight = None;
                self.sync_wanted = false;
                self.appended = end;
                self.durable = end;
                self.history.cut_after(last);
                self.confirmed = self.confirmed.min(last);
            }
            FollowerEvent::Released { start, chain } => {
                if start > self.start.last && start <= self.durable.last {
                    self.start = LogEnd { last: start, chain };
                    self.confirmed = self.confirmed.max(start);
                }
            }
            FollowerEvent::Reset {
                start,
                chain,
                history,
            } => {
                let end = LogEnd { last: start, chain };
                self.truncating = false;
                self.sync_in_flight = None;
                self.sync_wanted = false;
                self.start = end;
                self.appended = end;
                self.durable = end;
                self.history = history;
                // The peer released only what it knew confirmed.
                self.confirmed = self.confirmed.max(start);
                if let CatchUp::From { peer, .. } = self.catch_up {
                    self.catch_up = CatchUp::From { peer, from: start };
                    out.push(Self::send(peer, Message::CatchUp { from: start }));
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
                node,
                ..
            } => {
                if database != self.database {
                    out.push(self.refuse(peer, RefuseReason::WrongDatabase));
                } else if role == Role::Leader && self.promise_to(peer, epoch, node, out) {
                    self.leader = Some(peer);
                    // What is appended but not yet synced was never checked
                    // against this leader's history (it resumes from the
                    // durable position it is told): drop it, or a
                    // diverged record could pass for one of its own.
                    if self.appended.last > self.durable.last && !self.truncating {
                        self.truncating = true;
                        out.push(FollowerAction::Truncate {
                            after: self.durable.last,
                        });
                    }
                    let mut history = self.history.clone();
                    history.cut_after(self.durable.last);
                    out.push(Self::send(
                        peer,
                        Message::Handshake {
                            database: self.database,
                            epoch: self.promise.epoch,
                            role: Role::Follower,
                            node: NodeId::NONE,
                            last_durable: self.durable.last,
                            last_chain: self.durable.chain,
                            confirmed: self.confirmed.min(self.durable.last),
                            history,
                        },
                    ));
                }
            }
            // Log traffic is taken only from the accepted leader.
            Message::Append(_)
            | Message::Confirm { .. }
            | Message::Heartbeat { .. }
            | Message::Truncate { .. }
                if self.leader != Some(peer) =>
            {
                out.push(FollowerAction::Close { peer });
            }
            Message::Truncate { history } => {
                // Cut back to where the log meets the leader's history; the
                // leader closes the connection and redials to resume.
                let keep = self
                    .history
                    .common_with(&history)
                    .unwrap_or(Bookmark::ZERO)
                    .min(self.appended.last);
                // The released prefix is confirmed history: never cut.
                let keep = keep.max(self.start.last);
                if keep < self.appended.last && !self.truncating {
                    self.truncating = true;
                    tracing::warn!(
                        from = %self.appended.last,
                        to = %keep,
                        "follower cuts a suffix that left the leader's history"
                    );
                    out.push(FollowerAction::Truncate { after: keep });
                }
            }
            Message::Append(record) => {
                // Only a leader's handshake raises the epoch: an append from
                // a newer epoch that never introduced itself is refused, so
                // a stray message cannot fence every future leader.
                if record.bookmark.epoch > self.promise.epoch {
                    out.push(self.refuse(peer, RefuseReason::NotIntroduced));
                    return;
                }
                // Older epochs are fine: a new leader streams the tail it
                // adopted. The guard above took this from the leader that
                // holds the current promise; the chain decides the rest.
                if self.truncating {
                    return; // the leader resends after the cut
                }
                if record.bookmark <= self.appended.last {
                    out.push(self.ack(peer)); // a duplicate: say where we stand
                } else if !self.take(record, out) {
                    out.push(self.refuse(peer, RefuseReason::Gap));
                    out.push(self.ack(peer));
                }
            }
            Message::Confirm { confirmed, .. } | Message::Heartbeat { confirmed, .. } => {
                self.confirmed = self.confirmed.max(confirmed.min(self.appended.last));
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
            Message::CatchUp { from } if from < self.start.last => {
                // Released: the requester fetches that part from cold
                // storage, or starts its log over at our start.
                let mut history = self.history.clone();
                history.cut_after(self.start.last);
                out.push(Self::send(
                    peer,
                    Message::Archived {
                        start: self.start.last,
                        chain: self.start.chain,
                        history,
                    },
                ));
            }
            Message::CatchUp { from } => {
                // Serve others only what is both confirmed and durable here;
                // the leader this follower promised to may read all of it.
                let upto = if self.leader == Some(peer) {
                    self.durable.last
                } else {
                    self.confirmed.min(self.durable.last)
                };
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
            // Channel frames never reach a core: the transport's mux
            // takes them apart.
            Message::Ack { .. }
            | Message::CatchUpDone { .. }
            | Message::Refuse { .. }
            | Message::Archived { .. }
            | Message::Mux(_) => {}
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
                let at = record.bookmark;
                if at <= self.appended.last {
                    // already held
                } else if self.truncating || !self.take(record, out) {
                    self.catch_up = CatchUp::Idle;
                    out.push(FollowerAction::Close { peer });
                } else {
                    self.confirmed = self.confirmed.max(at);
                }
            }
            Message::Archived {
                start,
                chain,
                history,
            } => {
                // The peer's log starts after ours ends: start over at its
                // start (see the module's "Retention"). Anything else is a
                // confused peer: drop it.
                if self.truncating || start <= self.appended.last || history.last() != start {
                    self.catch_up = CatchUp::Idle;
                    out.push(FollowerAction::Close { peer });
                } else {
                    self.truncating = true;
                    out.push(FollowerAction::ResetToArchived {
                        start,
                        chain,
                        history,
                    });
                }
            }
            Message::CatchUpDone { upto } => {
                self.confirmed = self.confirmed.max(upto.min(self.appended.last));
                if upto > from {
                    let next = self.appended.last.max(upto);
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
#[path = "follower_tests.rs"]
mod tests;
