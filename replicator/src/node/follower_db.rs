//! One database of a [`FollowerHost`](super::follower_host::FollowerHost):
//! its [`Follower`] core and [`SegmentLog`], opened lazily, closed when
//! idle, and the per-database archiver handle [`FollowerDb`].
//!
//! ```text
//! <host dir>/db/<id:016x>/epoch   the promise (see `epoch_file`)
//! <host dir>/shared/              the host's shared log (see
//!                                 `shared_log`): the database's records,
//!                                 cuts and base, with every other's
//! <host dir>/db/<id:016x>/log/    (before the shared log, or with
//!                                 `per_database_logs`) a segment log of
//!                                 its own, its first segment small (64
//!                                 KiB by default), each next one twice
//!                                 the one before. Found when the database
//!                                 is opened on a shared-log host, it is
//!                                 imported into the shared log and
//!                                 removed (see `shared_log::migrate`).
//! ```
//!
//! (A host's "legacy" database keeps the single-database layout: `epoch`
//! and `log/` in the host's directory itself, on a segment log.)
//!
//! The actions of the core are carried out here exactly as a single
//! database follower does (`node::follower`), except syncs: a database
//! only asks for one (`sync_requested`), and the host makes every asking
//! database durable in one round (`follower_host`).

use super::follower::ReleaseError;
use super::follower_db_log::HostedLog;
use super::follower_host::{HostError, Shared};
use crate::bookmark::{Bookmark, Epoch};
use crate::chain::ChainHash;
use crate::epoch_file;
use crate::follower::{Follower, FollowerAction, FollowerEvent, LogEnd};
use crate::ids::DatabaseId;
use crate::net::Transport;
use crate::segments::{IoBackend, Recovery, Released, SegmentError, SegmentLog};
use crate::shared_log::SharedLog;
use crate::wire::Message;
use bytes::Bytes;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// An open database's mutable state, behind its lock.
pub(super) struct DbCore {
    pub(super) follower: Follower,
    pub(super) log: HostedLog,
    /// The core asked for a sync the host has not run yet.
    pub(super) sync_requested: bool,
    /// In the host's sync queue.
    pub(super) queued: bool,
    pub(super) next_peer: usize,
    /// A storage failure stops this database taking records: acking after
    /// one could claim durability it does not have. Closing the database
    /// (once idle) and reopening it recovers the log, as a restart would.
    pub(super) broken: Option<String>,
    /// A catch-up source to dial after the lock is released.
    pub(super) dial: Option<SocketAddr>,
    pub(super) catch_up_seen: Option<Instant>,
    /// Closed by the host: this state is stale, nothing may use it.
    pub(super) closed: bool,
}

/// An open database.
pub(super) struct Db {
    pub(super) id: DatabaseId,
    pub(super) dir: PathBuf,
    pub(super) core: Mutex<DbCore>,
    pub(super) recovery: Recovery,
}

/// What the host remembers of a closed database: what the archiver asks
/// for most, answered without reopening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DbSummary {
    pub confirmed: Bookmark,
    pub epoch: Epoch,
    pub log_start: Bookmark,
    pub durable: Bookmark,
    pub disk_bytes: u64,
}

/// How a host opens its databases' logs.
#[derive(Debug, Clone, Copy)]
pub(super) struct LogShape {
    pub(super) segment_bytes: u64,
    pub(super) first_segment_bytes: u64,
}

impl Db {
    /// Opens (creating) the database in `dir`: its promise and its log,
    /// recovered (a torn tail cut). `confirmed` is what was known confirmed
    /// when it was last closed.
    /// With `shared`, the database's log is its share of the host's
    /// shared log (its own old segment log, if `dir` holds one, imported
    /// first); without, a segment log of its own in `dir/log`.
    pub(super) fn open(
        id: DatabaseId,
        dir: &Path,
        shape: LogShape,
        confirmed: Bookmark,
        shared: Option<&Arc<SharedLog>>,
    ) -> Result<Db, HostError> {
        let fail = |source: super::NodeError| HostError::Open { id, source };
        std::fs::create_dir_all(dir)
            .map_err(super::NodeError::io(format!("creating {}", dir.display())))
            .map_err(fail)?;
        let promise = epoch_file::load(dir).map_err(|e| fail(e.into()))?;
        let (log, recovery) = match shared {
            Some(shared) => {
                shared
                    .import(id, &dir.join("log"))
                    .map_err(|e| fail(e.into()))?;
                let log = shared.database(id);
                let recovery = Recovery {
                    records: log.len(),
                    ..Recovery::default()
                };
                (HostedLog::Shared(log), recovery)
            }
            None => {
                // Std: the host's group sync has the one ring; a log's own
                // syncs (a cut, a reset) are rare.
                let (mut log, recovery) = SegmentLog::open_with(
                    &dir.join("log"),
                    shape.segment_bytes,
                    Bookmark::ZERO,
                    IoBackend::Std,
                )
                .map_err(|e| fail(e.into()))?;
                log.grow_from(shape.first_segment_bytes);
                (HostedLog::Own(Box::new(log)), recovery)
            }
        };
        let end = LogEnd {
            last: log.last(),
            chain: log.last_chain().unwrap_or(ChainHash::GENESIS),
        };
        let start = LogEnd {
            last: log.start(),
            chain: log.chain_at(log.start()).unwrap_or(ChainHash::GENESIS),
        };
        let history = log.history();
        let follower = Follower::new(id, promise, end, history)
            .with_start(start)
            .with_confirmed(confirmed);
        Ok(Db {
            id,
            dir: dir.to_path_buf(),
            core: Mutex::new(DbCore {
                follower,
                log,
                sync_requested: false,
                queued: false,
                next_peer: 0,
                broken: None,
                dial: None,
                catch_up_seen: None,
                closed: false,
            }),
            recovery,
        })
    }

    pub(super) fn summary(core: &DbCore) -> DbSummary {
        DbSummary {
            confirmed: core.follower.confirmed(),
            epoch: core.follower.epoch(),
            log_start: core.log.start(),
            durable: core.follower.durable(),
            disk_bytes: core.log.disk_bytes(),
        }
    }

    /// Whether the database can be closed now without losing anything it
    /// promised: nothing staged or syncing, no catch-up under way (a
    /// broken one can always be closed: reopening recovers it).
    pub(super) fn closable(core: &DbCore) -> bool {
        core.broken.is_some()
            || (!core.sync_requested
                && !core.queued
                && !core.follower.sync_pending()
                && !core.follower.catching_up()
                && !core.log.has_staged()
                && core.follower.durable() == core.follower.last_appended())
    }

    /// Carries out the core's actions.
    pub(super) fn run(&self, host: &Shared, core: &mut DbCore, actions: Vec<FollowerAction>) {
        let transport: &dyn Transport = host.transport().as_ref();
        for action in actions {
            match action {
                FollowerAction::PersistPromise(p) => {
                    tracing::info!(
                        database = %self.id,
                        epoch = p.epoch.0,
                        leader = %p.leader,
                        "follower promises a new epoch to a leader"
                    );
                    if let Err(err) = epoch_file::store(&self.dir, p) {
                        tracing::error!(database = %self.id, epoch = p.epoch.0, %err, "follower could not persist its promise");
                        core.broken = Some(err.to_string());
                        return;
                    }
                }
                FollowerAction::Truncate { after } => match core.log.truncate_after(after) {
                    Ok(cut) => {
                        tracing::warn!(database = %self.id, after = %after, cut_bytes = cut, "follower cut a diverged suffix");
                        let more = core.follower.handle(FollowerEvent::Truncated {
                            last: core.log.last(),
                            chain: core.log.last_chain().unwrap_or(ChainHash::GENESIS),
                        });
                        self.run(host, core, more);
                    }
                    Err(err) => {
                        tracing::error!(database = %self.id, %err, "follower could not cut its log");
                        core.broken = Some(err.to_string());
                        return;
                    }
                },
                FollowerAction::ResetToArchived {
                    start,
                    chain,
                    history,
                } => {
                    // Safe for the reasons `node::follower` gives: `start`
                    // is confirmed history a peer released.
                    let from = core.log.last();
                    match core.log.reset_to(start, chain, history) {
                        Ok(bytes) => {
                            tracing::info!(
                                database = %self.id,
                                from = %from,
                                start = %start,
                                removed_bytes = bytes,
                                "follower starts its log over at a peer's archived start"
                            );
                            let more = core.follower.handle(FollowerEvent::Reset {
                                start: core.log.start(),
                                chain: core.log.last_chain().unwrap_or(chain),
                                history: core.log.history(),
                            });
                            self.run(host, core, more);
                        }
                        Err(err) => {
                            tracing::error!(database = %self.id, %err, "follower could not start its log over");
                            core.broken = Some(err.to_string());
                            return;
                        }
                    }
                }
                FollowerAction::Append(record) => {
                    if let Err(err) = core.log.append_encoded(&record) {
                        core.broken = Some(err.to_string());
                        return;
                    }
                }
                FollowerAction::Sync { .. } => core.sync_requested = true,
                FollowerAction::ServeCatchUp { peer, after, upto } => {
                    match core
                        .log
                        .read_batch(after, upto, host.config.catch_up_batch_bytes)
                    {
                        Ok(records) => {
                            let mut last = after;
                            for bytes in records {
                                match crate::record::Encoded::decode(&bytes) {
                                    Ok((e, _)) => {
                                        last = e.bookmark;
                                        transport.send(peer.0, &Message::Append(e));
                                    }
                                    Err(_) => break,
                                }
                            }
                            transport.send(peer.0, &Message::CatchUpDone { upto: last });
                        }
                        Err(_) => transport.close(peer.0),
                    }
                }
                FollowerAction::Send { peer, message } => {
                    if let Message::Ack { durable, .. } = &message {
                        // The durability invariant, checked in every build:
                        // an ack never claims more than a completed sync.
                        assert!(
                            *durable <= core.log.durable(),
                            "database {}: ack of {durable} past the log's durable {}",
                            self.id,
                            core.log.durable()
                        );
                    }
                    transport.send(peer.0, &message)
                }
                FollowerAction::Close { peer } => transport.close(peer.0),
                FollowerAction::DialCatchUp => {
                    let peers = &host.config.peers;
                    if peers.is_empty() {
                        let more = core.follower.handle(FollowerEvent::CatchUpFailed);
                        self.run(host, core, more);
                    } else {
                        let peer = peers[core.next_peer % peers.len()];
                        core.next_peer += 1;
                        core.catch_up_seen = Some(Instant::now());
                        core.dial = Some(peer);
                    }
                }
            }
        }
    }
}

/// One database of a host, for its archiver: the same calls a
/// single-database [`FollowerNode`](super::follower::FollowerNode) offers,
/// for this database only. Cheap to clone; holds no files open. Questions
/// about a closed database are answered from what the host kept when it
/// closed it where they can be (confirmed, epoch, start, disk bytes);
/// reading or releasing opens it again.
#[derive(Clone)]
pub struct FollowerDb {
    pub(super) host: Arc<Shared>,
    pub(super) id: DatabaseId,
}

impl std::fmt::Debug for FollowerDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FollowerDb").field("id", &self.id).finish()
    }
}

impl FollowerDb {
    pub fn id(&self) -> DatabaseId {
        self.id
    }

    fn peek<R>(
        &self,
        from_summary: impl Fn(&DbSummary) -> R,
        open: impl Fn(&DbCore) -> R,
    ) -> Result<R, HostError> {
        loop {
            let db = match self.host.peek(self.id)? {
                Ok(db) => db,
                Err(summary) => return Ok(from_summary(&summary)),
            };
            let core = db.core.lock();
            if !core.closed {
                return Ok(open(&core));
            }
        }
    }

    fn with<R>(&self, mut f: impl FnMut(&Db, &mut DbCore) -> R) -> Result<R, HostError> {
        loop {
            let db = self.host.open(self.id)?;
            let mut core = db.core.lock();
            if !core.closed {
                return Ok(f(&db, &mut core));
            }
        }
    }

    /// The newest bookmark known confirmed and durable here.
    pub fn confirmed(&self) -> Result<Bookmark, HostError> {
        self.peek(|s| s.confirmed, |c| c.follower.confirmed())
    }
    /// The confirmed position if the host knows it without opening the
    /// database: None for one not opened since the host started (nothing
    /// is known confirmed there until a leader says so, and asking
    /// [`FollowerDb::confirmed`] would open it).
    pub fn known_confirmed(&self) -> Result<Option<Bookmark>, HostError> {
        // A core closed meanwhile still holds what its summary says.
        Ok(self.host.peek_known(self.id)?.map(|k| match k {
            Ok(db) => db.core.lock().follower.confirmed(),
            Err(s) => s.confirmed,
        }))
    }
    /// The epoch promised for this database.
    pub fn epoch(&self) -> Result<Epoch, HostError> {
        self.peek(|s| s.epoch, |c| c.follower.epoch())
    }
    /// Where the log starts (the last released record).
    pub fn log_start(&self) -> Result<Bookmark, HostError> {
        self.peek(|s| s.log_start, |c| c.log.start())
    }
    /// The newest bookmark durable here.
    pub fn durable(&self) -> Result<Bookmark, HostError> {
        self.peek(|s| s.durable, |c| c.follower.durable())
    }
    /// Bytes of the log's segment files on disk.
    pub fn disk_bytes(&self) -> Result<u64, HostError> {
        self.peek(|s| s.disk_bytes, |c| c.log.disk_bytes())
    }
    /// Why this database stopped taking records, if it did.
    pub fn broken(&self) -> Result<Option<String>, HostError> {
        self.peek(|_| None, |c| c.broken.clone())
    }

    /// Bytes of the records after `after` up to `upto`, at most to the
    /// confirmed position, from the log's index (no I/O).
    pub fn confirmed_bytes_between(&self, after: Bookmark, upto: Bookmark) -> Result<u64, DbError> {
        Ok(self.with(|_, core| {
            let upto = upto.min(core.follower.confirmed());
            core.log.bytes_between(after, upto)
        })??)
    }

    /// The encoded records after `after` up to the confirmed position,
    /// about `max_bytes` of them, read without holding the database's lock
    /// (sound for the reasons `node::follower` gives).
    /// A plan that went stale meanwhile (its segment released, or
    /// compacted in the shared log) is made again, a few times.
    pub fn read_confirmed(&self, after: Bookmark, max_bytes: usize) -> Result<Vec<Bytes>, DbError> {
        let mut tries = 0;
        loop {
            let plan = self.with(|_, core| {
                let upto = core.follower.confirmed();
                core.log.plan_batch(after, upto, max_bytes)
            })??;
            match plan.read_checked() {
                Err(SegmentError::Moved { .. }) if tries < 3 => {}
                Err(SegmentError::Io { source, .. })
                    if tries < 3 && source.kind() == std::io::ErrorKind::NotFound => {}
                done => return Ok(done?),
            }
            tries += 1;
        }
    }

    /// A bookmark to release through keeping at least `keep_bytes` of the
    /// newest records, never past the confirmed position.
    pub fn release_point(&self, keep_bytes: u64) -> Result<Bookmark, HostError> {
        self.with(|_, core| {
            let start = core.log.start();
            core.log
                .release_point(keep_bytes)
                .min(core.follower.confirmed())
                .max(start)
        })
    }

    /// Releases the log's whole segments up to `upto` (in cold storage
    /// now). Refused for anything past the confirmed position.
    pub fn release_through(&self, upto: Bookmark) -> Result<Released, DbError> {
        let host = Arc::clone(&self.host);
        let (released, unlink) = self
            .with(|db, core| {
                if let Some(why) = &core.broken {
                    return Err(ReleaseError::Broken(why.clone()));
                }
                let confirmed = core.follower.confirmed();
                if upto > confirmed {
                    return Err(ReleaseError::NotConfirmed { upto, confirmed });
                }
                let before = core.log.start();
                let (released, unlink) = core.log.release_deferred(upto)?;
                if released.start != before {
                    let chain = core
                        .log
                        .chain_at(released.start)
                        .unwrap_or(ChainHash::GENESIS);
                    let actions = core.follower.handle(FollowerEvent::Released {
                        start: released.start,
                        chain,
                    });
                    db.run(&host, core, actions);
                }
                Ok((released, unlink))
            })?
            .map_err(DbError::from)?;
        // Without the database's lock: its appends do not wait for the
        // unlinks (see `crate::unlink`).
        unlink.run_logged();
        Ok(released)
    }
}

/// Why a read or release through a [`FollowerDb`] failed.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Log(#[from] SegmentError),
    #[error(transparent)]
    Release(#[from] ReleaseError),
}
