//! The manifest: what the store holds for one database, updated by
//! compare-and-swap. This module is the only place that reads or writes
//! it.
//!
//! Every version is its own object, `manifest/<sequence>` (see `names`),
//! created with a create-only put (`If-None-Match: *` on S3, a hard link on
//! the filesystem). Publishing version n+1 succeeds for exactly one writer;
//! the others find it taken, reload and try again. The current manifest is
//! the highest sequence. Old versions are deleted a few behind the newest.
//!
//! ```text
//! manifest (big-endian)
//!   0  magic          b"WRMANIF1"                               8
//!   8  version        u16 (1), flags u16 (0)                     4
//!  12  database       u64                                        8
//!  20  sequence       u64: this version's number                 8
//!  28  epoch          u32: the newest uploader epoch that wrote
//!                     it; an older uploader is fenced            4
//!  32  page_size      u32 (0 until the first snapshot)           4
//!  36  log_end        bookmark: every confirmed record up to it
//!                     is in log objects                         12
//!  48  log_end_chain  16
//!  64  log_end_us     u64: its commit time                       8
//!  72  since_snapshot u64: record bytes archived after the newest
//!                     snapshot (what schedules the next one,
//!                     whichever uploader writes it)              8
//!  80  retained_from  bookmark: history before it is no longer
//!                     restorable                                12
//!  92  runs           u16, snapshots u32                         6
//!  98  runs x         (epoch u32, last sequence u64): the epoch
//!                     history of the archived log               12 each
//!  ..  snapshots x    bookmark 12, chain 16, commit_us u64,
//!                     db_pages u32, generation u32, digest 32   76 each
//!                     (ascending by bookmark)
//!  ..  crc32          u32 over every byte before it              4
//! ```

use crate::codec::{Put, Reader};
use crate::error::{ArchiveError, FormatError, RestoreError, StoreError};
use crate::names;
use crate::snapshot::SnapshotId;
use crate::store::{Created, Store};
use bytes::Bytes;
use walrelay_replicator::history::MAX_RUNS;
use walrelay_replicator::{Bookmark, ChainHash, DatabaseId, Epoch, History, Sequence};

const MAGIC: &[u8; 8] = b"WRMANIF1";
const VERSION: u16 = 1;
const WHAT: &str = "manifest";
/// The most snapshots a manifest lists (30 days of one every 10 minutes
/// is 4,320).
pub const MAX_SNAPSHOTS: usize = 100_000;
/// Versions kept behind the newest (a reader that listed just before a
/// publish still finds the one it listed).
pub const VERSIONS_KEPT: u64 = 4;

/// A snapshot the manifest lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotEntry {
    pub bookmark: Bookmark,
    pub chain: ChainHash,
    pub commit_us: u64,
    pub db_pages: u32,
    /// The uploader's epoch: part of the snapshot's key.
    pub generation: Epoch,
    /// Over its parts' digests, in part order.
    pub digest: [u8; 32],
}

/// One version of a database's manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub database: DatabaseId,
    pub sequence: u64,
    pub epoch: Epoch,
    pub page_size: u32,
    pub log_end: Bookmark,
    pub log_end_chain: ChainHash,
    pub log_end_us: u64,
    /// Record bytes archived after the newest snapshot.
    pub since_snapshot_bytes: u64,
    pub retained_from: Bookmark,
    pub history: History,
    pub snapshots: Vec<SnapshotEntry>,
}

impl Manifest {
    /// The manifest of a database with nothing archived yet: its log
    /// starts at the beginning of history.
    pub fn empty(database: DatabaseId) -> Manifest {
        Manifest {
            database,
            sequence: 0,
            epoch: Epoch(0),
            page_size: 0,
            log_end: Bookmark::ZERO,
            log_end_chain: ChainHash::GENESIS,
            log_end_us: 0,
            since_snapshot_bytes: 0,
            retained_from: Bookmark::ZERO,
            history: History::new(),
            snapshots: Vec::new(),
        }
    }

    /// The snapshot's identity as its parts carry it.
    pub fn snapshot_id(&self, s: &SnapshotEntry) -> SnapshotId {
        SnapshotId {
            database: self.database,
            bookmark: s.bookmark,
            chain: s.chain,
            commit_us: s.commit_us,
            page_size: self.page_size,
            db_pages: s.db_pages,
        }
    }

    /// The newest snapshot at or before `at`.
    pub fn snapshot_before(&self, at: Bookmark) -> Option<&SnapshotEntry> {
        self.snapshots.iter().rev().find(|s| s.bookmark <= at)
    }

    /// Whether `at` is a position of the archived history: the state
    /// after a transaction that committed (or the very beginning).
    pub fn holds(&self, at: Bookmark) -> bool {
        at == Bookmark::ZERO || self.history.holds(at)
    }

    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        if self.snapshots.len() > MAX_SNAPSHOTS {
            return Err(FormatError::TooLarge {
                what: WHAT,
                len: self.snapshots.len() as u64,
                max: MAX_SNAPSHOTS as u64,
            });
        }
        let runs = self.history.runs();
        let mut out = Vec::with_capacity(102 + runs.len() * 12 + self.snapshots.len() * 76);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_be_bytes());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&self.database.0.to_be_bytes());
        out.extend_from_slice(&self.sequence.to_be_bytes());
        out.extend_from_slice(&self.epoch.0.to_be_bytes());
        out.extend_from_slice(&self.page_size.to_be_bytes());
        out.bookmark(self.log_end);
        out.chain(self.log_end_chain);
        out.extend_from_slice(&self.log_end_us.to_be_bytes());
        out.extend_from_slice(&self.since_snapshot_bytes.to_be_bytes());
        out.bookmark(self.retained_from);
        out.extend_from_slice(&(runs.len() as u16).to_be_bytes());
        out.extend_from_slice(&(self.snapshots.len() as u32).to_be_bytes());
        for (e, s) in runs {
            out.extend_from_slice(&e.0.to_be_bytes());
            out.extend_from_slice(&s.0.to_be_bytes());
        }
        for s in &self.snapshots {
            out.bookmark(s.bookmark);
            out.chain(s.chain);
            out.extend_from_slice(&s.commit_us.to_be_bytes());
            out.extend_from_slice(&s.db_pages.to_be_bytes());
            out.extend_from_slice(&s.generation.0.to_be_bytes());
            out.extend_from_slice(&s.digest);
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        Ok(out)
    }

    pub fn decode(bytes: &[u8]) -> Result<Manifest, FormatError> {
        if bytes.len() < 4 {
            return Err(FormatError::Truncated {
                what: WHAT,
                need: 4,
                have: bytes.len() as u64,
            });
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if crc32fast::hash(body).to_be_bytes() != crc {
            return Err(FormatError::Digest { what: WHAT });
        }
        let mut r = Reader::new(body, WHAT);
        r.header(MAGIC, VERSION)?;
        let database = DatabaseId(r.u64()?);
        let sequence = r.u64()?;
        let epoch = Epoch(r.u32()?);
        let page_size = r.u32()?;
        let (log_end, log_end_chain, log_end_us) = (r.bookmark()?, r.chain()?, r.u64()?);
        let since_snapshot_bytes = r.u64()?;
        let retained_from = r.bookmark()?;
        let (nruns, nsnaps) = (r.u16()? as usize, r.u32()? as usize);
        // Sizes are checked against the bytes present before reserving.
        let need = nruns as u64 * 12 + nsnaps as u64 * 76;
        if nruns > MAX_RUNS || nsnaps > MAX_SNAPSHOTS || need != (body.len() - r.position()) as u64
        {
            return Err(invalid("counts do not match the bytes"));
        }
        let mut runs = Vec::with_capacity(nruns);
        for _ in 0..nruns {
            runs.push((Epoch(r.u32()?), Sequence(r.u64()?)));
        }
        let history = History::from_runs(runs).ok_or(invalid("history is not ordered"))?;
        let mut snapshots = Vec::with_capacity(nsnaps);
        for _ in 0..nsnaps {
            snapshots.push(SnapshotEntry {
                bookmark: r.bookmark()?,
                chain: r.chain()?,
                commit_us: r.u64()?,
                db_pages: r.u32()?,
                generation: Epoch(r.u32()?),
                digest: r.take(32)?.try_into().expect("32 bytes"),
            });
        }
        if !snapshots.windows(2).all(|w| w[0].bookmark < w[1].bookmark)
            || snapshots.last().is_some_and(|s| s.bookmark > log_end)
        {
            return Err(invalid("snapshots are not ordered within the log"));
        }
        Ok(Manifest {
            database,
            sequence,
            epoch,
            page_size,
            log_end,
            log_end_chain,
            log_end_us,
            since_snapshot_bytes,
            retained_from,
            history,
            snapshots,
        })
    }
}

fn invalid(why: &'static str) -> FormatError {
    FormatError::Invalid { what: WHAT, why }
}

/// The newest manifest of `database`, or None if nothing was ever
/// published.
pub fn load(store: &Store, database: DatabaseId) -> Result<Option<Manifest>, RestoreError> {
    // A version can be deleted between the listing and the get (it was
    // several behind by then): list again.
    for _ in 0..8 {
        let listed = store.list(&names::manifest_prefix(database), None)?;
        let Some((key, _)) = listed
            .iter()
            .filter_map(|l| names::parse_manifest_key(database, &l.key).map(|s| (&l.key, s)))
            .max_by_key(|(_, s)| *s)
        else {
            return Ok(None);
        };
        if let Some(bytes) = store.get(key)? {
            let m = Manifest::decode(&bytes).map_err(|source| RestoreError::Format {
                key: key.clone(),
                source,
            })?;
            if m.database != database
                || Some(m.sequence) != names::parse_manifest_key(database, key)
            {
                return Err(RestoreError::Format {
                    key: key.clone(),
                    source: invalid("the manifest names another database or version"),
                });
            }
            return Ok(Some(m));
        }
    }
    Err(RestoreError::Missing {
        key: names::manifest_prefix(database),
    })
}

/// What a publish found.
#[derive(Debug, PartialEq, Eq)]
pub enum Published {
    Done,
    /// Another writer published this sequence first: reload and retry.
    Lost,
}

/// Publishes `next` as the version after the one it was built from (its
/// sequence + 1), create-only; then deletes versions more than
/// [`VERSIONS_KEPT`] behind.
///
/// A writer that slept through many publishes could find its slot free
/// again (deleted as an old version): after creating it, it checks that no
/// newer version exists, and if one does, takes its own back and reports
/// the race lost. So a stale writer never believes it published.
pub fn publish(store: &Store, next: &Manifest) -> Result<Published, ArchiveError> {
    let key = names::manifest_key(next.database, next.sequence);
    let bytes = next.encode()?;
    match store.create(&key, Bytes::from(bytes)) {
        Ok(Created::New) => {}
        Ok(Created::Existed) => return Ok(Published::Done),
        Err(StoreError::Conflict { .. }) => return Ok(Published::Lost),
        Err(e) => return Err(e.into()),
    }
    let versions: Vec<(String, u64)> = store
        .list(&names::manifest_prefix(next.database), None)?
        .into_iter()
        .filter_map(|l| names::parse_manifest_key(next.database, &l.key).map(|s| (l.key, s)))
        .collect();
    if versions.iter().any(|(_, s)| *s > next.sequence) {
        store.delete(&key)?;
        return Ok(Published::Lost);
    }
    for (k, s) in versions {
        if s + VERSIONS_KEPT < next.sequence {
            store.delete(&k)?;
        }
    }
    Ok(Published::Done)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        let mut m = Manifest::empty(DatabaseId(3));
        m.sequence = 9;
        m.epoch = Epoch(2);
        m.page_size = 4096;
        m.log_end = Bookmark::new(Epoch(2), Sequence(4));
        m.history.record(Bookmark::new(Epoch(1), Sequence(7)));
        m.history.record(Bookmark::new(Epoch(2), Sequence(4)));
        m.snapshots.push(SnapshotEntry {
            bookmark: Bookmark::new(Epoch(1), Sequence(7)),
            chain: ChainHash::from_bytes([1; 16]),
            commit_us: 5,
            db_pages: 10,
            generation: Epoch(1),
            digest: [9; 32],
        });
        m
    }

    #[test]
    fn a_manifest_round_trips_and_refuses_damage() {
        let m = sample();
        let bytes = m.encode().unwrap();
        assert_eq!(Manifest::decode(&bytes).unwrap(), m);
        for i in [0, 20, 40, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Manifest::decode(&bad).is_err(), "flip at {i}");
        }
        assert!(Manifest::decode(&bytes[..bytes.len() - 10]).is_err());
    }

    #[test]
    fn only_one_writer_publishes_a_sequence() {
        let store = Store::open("memory://").unwrap();
        let mut a = sample();
        a.sequence = 1;
        let mut b = a.clone();
        b.epoch = Epoch(3);
        assert_eq!(publish(&store, &a).unwrap(), Published::Done);
        assert_eq!(publish(&store, &b).unwrap(), Published::Lost);
        assert_eq!(load(&store, DatabaseId(3)).unwrap().unwrap(), a);
    }

    #[test]
    fn a_writer_that_slept_through_many_versions_cannot_publish_into_a_deleted_slot() {
        let store = Store::open("memory://").unwrap();
        let mut m = sample();
        for s in 1..=10 {
            m.sequence = s;
            publish(&store, &m).unwrap();
        }
        let mut stale = m.clone();
        stale.sequence = 2; // its slot was deleted as an old version
        stale.epoch = Epoch(7);
        assert_eq!(publish(&store, &stale).unwrap(), Published::Lost);
        assert_eq!(load(&store, m.database).unwrap().unwrap(), m);
        assert!(
            store
                .get(&names::manifest_key(m.database, 2))
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn old_versions_are_deleted_behind_the_newest() {
        let store = Store::open("memory://").unwrap();
        let mut m = sample();
        for s in 1..=10 {
            m.sequence = s;
            publish(&store, &m).unwrap();
        }
        let left = store
            .list(&names::manifest_prefix(m.database), None)
            .unwrap();
        assert_eq!(left.len() as u64, VERSIONS_KEPT + 1);
        assert_eq!(load(&store, m.database).unwrap().unwrap().sequence, 10);
    }
}
