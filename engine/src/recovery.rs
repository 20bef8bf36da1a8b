//! How a replicated primary takes its place in the log before it writes:
//! it wins an epoch from W followers, adopts the log that ends highest
//! among them, and brings its own database file to exactly the end of
//! that log.
//!
//! The database file is brought there without SQLite: a record is a set of
//! whole page images plus the database size after it, so writing the
//! images at their offsets and setting the size is exactly what a
//! checkpoint of that transaction does. Two starting points:
//!
//! - **A clean stop** (the stop marker names bookmark M, and everything
//!   up to M is in the file and its WAL, synced). The WAL is checkpointed
//!   into the file, then the records after M are applied. Usually there
//!   are none: nobody wrote since this node stopped.
//! - **Anything else** (a crash, a lost file, a new node). The file may
//!   hold frames the quorum never confirmed, so it is not trusted: it is
//!   rebuilt, from cold storage's newest archived state when there is a
//!   store (followers keep only a bounded log), then from the adopted log
//!   after it.
//!
//! A clean stop whose followers no longer hold the log after it (they
//! released it to cold storage while this node was down) starts from cold
//! storage too. Cold storage holds only confirmed history, so its newest
//! state is a prefix of the adopted log.
//!
//! An incomplete transaction at the end of the adopted log (CONTINUED
//! chunks whose last chunk never arrived) is not adopted: no client was
//! acknowledged for it and no replica revealed it, and followers holding
//! it cut it when the new leader sends its history.

use crate::database::Database;
use crate::replication::PrimaryConfig;
use crate::stop_marker;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use walrelay_replicator::node::candidate::{Candidate, CandidateConfig, CandidateError};
use walrelay_replicator::{Bookmark, ChainHash, Encoded, Epoch, History, NodeId, RecordError};

/// Why a primary could not take its place in the log.
#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    #[error("winning an epoch from the followers: {0}")]
    Election(#[source] CandidateError),
    #[error("reading the adopted log: {0}")]
    Fetch(#[source] CandidateError),
    #[error(
        "this primary stopped cleanly at {local}, but the followers' log ends at {adopted}: they lost records it confirmed; refusing to start over them"
    )]
    FollowersBehind { local: Bookmark, adopted: Bookmark },
    #[error("rebuilding {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("a fetched record: {0}")]
    Record(#[from] RecordError),
    #[error("checkpointing {path} before rolling it forward: {source}")]
    Checkpoint {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("restoring from cold storage: {0}")]
    Restore(#[from] walrelay_archive::RestoreError),
    #[error(
        "the followers' log starts at {start}, after {from}, and there is no cold storage to start from"
    )]
    NoStore { from: Bookmark, start: Bookmark },
    #[error("stored epoch: {0}")]
    Meta(String),
    #[error("the epoch's first record was not confirmed: {0}")]
    Barrier(#[source] crate::QueryError),
}

/// What the primary starts from: the epoch it won and the log it adopted.
#[derive(Debug, Clone)]
pub struct Adopted {
    pub epoch: Epoch,
    pub node: NodeId,
    /// A confirmed transaction boundary, its chain, and the records after
    /// it that the new epoch confirms again (held in the leader's tail).
    pub start: Bookmark,
    pub start_chain: ChainHash,
    pub tail: Vec<Encoded>,
    /// The end of the adopted log: where the database file now is.
    pub end: Bookmark,
    pub end_chain: ChainHash,
    pub history: History,
    /// Records applied to the database file.
    pub applied: u64,
    /// Whether the file was rebuilt from the start of the log.
    pub rebuilt: bool,
}

fn io_at(path: &Path) -> impl Fn(std::io::Error) -> RecoveryError + '_ {
    move |source| RecoveryError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Wins an epoch and brings the database at `config.path` to the end of
/// the adopted log (see the module docs).
pub fn adopt(config: &PrimaryConfig) -> Result<Adopted, RecoveryError> {
    let path = &config.path;
    let marker = stop_marker::load(path).map_err(|e| RecoveryError::Meta(e.to_string()))?;
    let stored = crate::meta::load(&crate::meta::sidecar_path(path))
        .map_err(|e| RecoveryError::Meta(e.to_string()))?
        .map_or(0, |m| m.epoch);
    let node = NodeId::random();
    let candidate = Candidate::elect(CandidateConfig {
        database: config.database,
        node,
        min_epoch: Epoch(stored.saturating_add(1)),
        followers: config.followers.clone(),
        write_quorum: config.write_quorum,
        backend: config.backend,
        auth: config.auth.clone(),
        timeout_ms: config.election_timeout_ms,
        mux: config.mux.clone(),
    })
    .map_err(RecoveryError::Election)?;
    let won = candidate.won().clone();
    let adopted_end = won.adopted.end;
    let local = match marker {
        Some(m) if m <= adopted_end.last && won.adopted.history.holds(m) => Some(m),
        Some(m) => {
            return Err(RecoveryError::FollowersBehind {
                local: m,
                adopted: adopted_end.last,
            });
        }
        None => None,
    };
    let rebuilt = local.is_none();
    if rebuilt && path.exists() {
        tracing::warn!(
            path = %path.display(),
            upto = %adopted_end.last,
            "no clean stop: rebuilding the database from cold storage and the followers' log"
        );
    }
    if rebuilt {
        remove_database(path)?;
    }
    let mut from = local.unwrap_or(Bookmark::ZERO);
    let mut from_chain = (from == Bookmark::ZERO).then_some(ChainHash::GENESIS);
    if rebuilt && let Some((at, chain)) = from_store(config, adopted_end.last)? {
        (from, from_chain) = (at, Some(chain));
    } else if !rebuilt && from < adopted_end.last {
        checkpoint_truncate(path)?;
    }
    let mut attempts = 0;
    let mut roll = loop {
        let mut roll = Roll::new(path, from, from_chain, won.confirmed)?;
        if from >= adopted_end.last {
            break roll;
        }
        let fetched = candidate.fetch(from, from_chain, adopted_end.last, &mut |r| {
            roll.take(r).map_err(|e| e.to_string())
        });
        match fetched {
            Ok(()) => break roll,
            // The followers released the log after `from` to cold storage
            // (while this node was down, or while it restored): start from
            // the store's newest state, again.
            Err(CandidateError::Archived { start, .. }) if attempts < 3 => {
                attempts += 1;
                drop(roll);
                remove_database(path)?;
                match from_store(config, adopted_end.last)? {
                    Some((at, chain)) if at >= start => (from, from_chain) = (at, Some(chain)),
                    _ => return Err(RecoveryError::NoStore { from, start }),
                }
            }
            Err(e) => return Err(RecoveryError::Fetch(e)),
        }
    };
    let (start, start_chain, tail, end) = roll.finish(adopted_end.chain)?;
    let mut history = won.adopted.history.clone();
    history.cut_after(end.0);
    tracing::info!(
        epoch = won.epoch.0,
        start = %start,
        end = %end.0,
        tail = tail.len(),
        rebuilt,
        "primary adopted the log"
    );
    Ok(Adopted {
        epoch: won.epoch,
        node,
        start,
        start_chain,
        tail,
        end: end.0,
        end_chain: end.1,
        history,
        applied: roll.applied,
        rebuilt,
    })
}

/// Removes the database, its WAL and its wal-index.
fn remove_database(path: &Path) -> Result<(), RecoveryError> {
    for p in walrelay_vfs::replica_files(path).into_iter().take(3) {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&p)(e)),
        }
    }
    Ok(())
}

/// Restores cold storage's newest state into the (removed) database file;
/// returns where it stands, or None without a store or history in it.
fn from_store(
    config: &PrimaryConfig,
    adopted: Bookmark,
) -> Result<Option<(Bookmark, ChainHash)>, RecoveryError> {
    let Some(store) = &config.store else {
        return Ok(None);
    };
    let archive = walrelay_archive::Archive::new(store.clone(), config.database);
    let m = match archive.manifest() {
        Ok(m) => m,
        Err(walrelay_archive::RestoreError::NoManifest) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if m.log_end == Bookmark::ZERO {
        return Ok(None);
    }
    // Cold storage holds confirmed history only: never past the adopted
    // log's end.
    assert!(
        m.log_end <= adopted,
        "cold storage ends at {} after the adopted log's {adopted}: it holds history the quorum does not",
        m.log_end
    );
    let r = walrelay_archive::restore_to_file(
        &archive,
        &m,
        m.log_end,
        &config.path,
        &walrelay_archive::NoProgress,
    )?;
    tracing::info!(at = %r.bookmark, pages = r.db_pages, "database restored from cold storage");
    Ok(Some((r.bookmark, r.chain)))
}

/// Copies the WAL into the database file and empties it, with the plain
/// unix VFS (no capture yet: the walrelay VFS attaches after this).
fn checkpoint_truncate(path: &Path) -> Result<(), RecoveryError> {
    let err = |source| RecoveryError::Checkpoint {
        path: path.to_path_buf(),
        source,
    };
    let c = rusqlite::Connection::open(path).map_err(err)?;
    c.busy_timeout(Duration::from_secs(5)).map_err(err)?;
    c.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(err)?;
    c.close().map_err(|(_, e)| err(e))?;
    Ok(())
}

/// The database file rolled forward record by record, and the tail the
/// new leader keeps.
struct Roll {
    path: PathBuf,
    file: Option<File>,
    /// Chunks of the transaction being read (applied when it completes).
    txn: Vec<Encoded>,
    /// The last complete transaction known confirmed, and its chain.
    start: (Bookmark, Option<ChainHash>),
    /// Complete transactions after `start`.
    tail: Vec<Encoded>,
    confirmed: Bookmark,
    applied: u64,
}

impl Roll {
    fn new(
        path: &Path,
        from: Bookmark,
        from_chain: Option<ChainHash>,
        confirmed: Bookmark,
    ) -> Result<Roll, RecoveryError> {
        Ok(Roll {
            path: path.to_path_buf(),
            file: None,
            txn: Vec::new(),
            start: (from, from_chain),
            tail: Vec::new(),
            confirmed,
            applied: 0,
        })
    }

    fn file(&mut self) -> Result<&File, RecoveryError> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&self.path)
                .map_err(io_at(&self.path))?;
            self.file = Some(f);
        }
        Ok(self.file.as_ref().expect("just opened"))
    }

    fn take(&mut self, r: Encoded) -> Result<(), RecoveryError> {
        // The start's chain, when not known, is the first record's
        // predecessor's.
        if self.start.1.is_none() {
            self.start.1 = Some(r.prev_chain);
        }
        let complete = !r.continued();
        self.txn.push(r);
        if complete {
            let txn = std::mem::take(&mut self.txn);
            self.apply(&txn)?;
            let last = txn.last().expect("a transaction has a chunk");
            if last.bookmark <= self.confirmed {
                self.start = (last.bookmark, Some(last.chain));
                self.tail.clear();
            } else {
                self.tail.extend(txn);
            }
        }
        Ok(())
    }

    /// Writes a whole transaction's page images and sets the file's size.
    fn apply(&mut self, txn: &[Encoded]) -> Result<(), RecoveryError> {
        let path = self.path.clone();
        let mut size = 0u64;
        for chunk in txn {
            let r = chunk.record()?;
            let page_size = u64::from(r.page_size);
            let file = self.file()?;
            for (no, image) in &r.pages {
                file.write_all_at(image, u64::from(no - 1) * page_size)
                    .map_err(io_at(&path))?;
            }
            size = u64::from(r.db_pages) * page_size;
            self.applied += 1;
        }
        self.file()?.set_len(size).map_err(io_at(&path))?;
        Ok(())
    }

    /// Makes the file durable; returns the start, its chain, the tail and
    /// the end with its chain. `end_chain` is the adopted log's last chain
    /// (the start's too when nothing was read).
    #[allow(clippy::type_complexity)]
    fn finish(
        &mut self,
        end_chain: ChainHash,
    ) -> Result<(Bookmark, ChainHash, Vec<Encoded>, (Bookmark, ChainHash)), RecoveryError> {
        if !self.txn.is_empty() {
            tracing::warn!(
                chunks = self.txn.len(),
                first = %self.txn[0].bookmark,
                "the adopted log ends inside a transaction: its chunks are not adopted"
            );
            self.txn.clear();
        }
        if let Some(f) = &self.file {
            f.sync_all().map_err(io_at(&self.path))?;
        }
        if let Some(dir) = self.path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(io_at(dir))?;
        }
        let start_chain = self.start.1.unwrap_or(end_chain);
        let end = match self.tail.last() {
            Some(r) => (r.bookmark, r.chain),
            None => (self.start.0, start_chain),
        };
        Ok((
            self.start.0,
            start_chain,
            std::mem::take(&mut self.tail),
            end,
        ))
    }
}

/// Turns a stopped replica's database at `path` into a primary's that
/// stopped cleanly at the replica's watermark: the replica opens (which
/// cuts everything past its persisted watermark), copies every confirmed
/// frame into the database file, and closes; its WAL, wal-index and
/// watermark file are removed and a stop marker names the watermark. The
/// next [`adopt`] rolls it forward to the end of the followers' log.
/// Unconfirmed frames the replica held are dropped: the log decides.
pub fn promote_replica(path: &Path) -> Result<Bookmark, RecoveryError> {
    let replica = crate::Replica::open(path, crate::ReplicaOptions::default())
        .map_err(|e| RecoveryError::Meta(format!("opening the replica: {e}")))?;
    let at = replica.confirmed();
    let mut copied = false;
    for _ in 0..100 {
        let stats = replica
            .database()
            .checkpoint(crate::CheckpointMode::Passive)
            .map_err(|e| RecoveryError::Meta(format!("checkpointing the replica: {e}")))?;
        if stats.backfilled_frames >= stats.wal_frames {
            copied = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    if !copied {
        return Err(RecoveryError::Meta(
            "the replica's WAL could not be copied into its database file".into(),
        ));
    }
    drop(replica);
    for p in walrelay_vfs::replica_files(path).into_iter().skip(1) {
        match std::fs::remove_file(&p) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&p)(e)),
        }
    }
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_at(path))?;
    stop_marker::store(path, at).map_err(|e| RecoveryError::Meta(e.to_string()))?;
    tracing::info!(path = %path.display(), at = %at, "replica promoted: its database stands at its watermark");
    Ok(at)
}

/// Commits the new epoch's first record (a write of page 1 that changes
/// nothing a reader can see) and waits until it is confirmed: with it, the
/// adopted tail is confirmed too, and the primary serves nothing before.
pub fn commit_barrier(
    db: &Database,
    leader: &walrelay_replicator::node::leader::LeaderNode,
    timeout: Duration,
) -> Result<Bookmark, RecoveryError> {
    let Some(p) = db.primary() else {
        return Ok(db.latest_bookmark());
    };
    {
        let w = p.writer.lock();
        let run = || -> rusqlite::Result<()> {
            let v: i64 = crate::sandbox::as_engine(&w.conn, |c| {
                c.query_row("PRAGMA user_version", [], |r| r.get(0))
            })?;
            w.conn.engine_exec(&format!("PRAGMA user_version = {v}"))
        };
        run().map_err(|e| RecoveryError::Barrier(crate::QueryError::sql(e)))?;
    }
    db.check_capture().map_err(RecoveryError::Barrier)?;
    let at = db.latest_bookmark();
    // Bounded by the start's own timeout, not a result's: followers that
    // just restarted may take longer than a write may wait.
    leader.wait_confirmed(at, timeout).map_err(|e| {
        RecoveryError::Barrier(crate::QueryError::NotConfirmed {
            bookmark: at,
            reason: e.into(),
        })
    })?;
    Ok(at)
}
