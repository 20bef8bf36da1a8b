//! Reading a database's history out of the store: the manifest, which
//! log objects lead from a snapshot to a bookmark, and which bookmark a
//! time names.
//!
//! The log objects after a point are found by listing (their keys sort by
//! position), never by trusting one listing blindly: an object is used
//! only if its records are positions of the manifest's epoch history and
//! it chains onto the one before it. So an object left by a fenced or
//! diverged uploader is skipped when a right one exists and is a clear
//! error when none does; two uploaders' copies of the same run are
//! interchangeable (their bytes are identical).

use crate::error::RestoreError;
use crate::log_object::LogObject;
use crate::manifest::{self, Manifest, SnapshotEntry};
use crate::names::{self, LogName};
use crate::store::Store;
use std::collections::BTreeMap;
use walrelay_replicator::{Bookmark, ChainHash, DatabaseId};

/// One database's history in a store.
#[derive(Debug, Clone)]
pub struct Archive {
    store: Store,
    database: DatabaseId,
}

/// A restore's inputs: where it starts and the log objects after it.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: Bookmark,
    /// None: start from an empty database at the beginning of history.
    pub snapshot: Option<SnapshotEntry>,
    /// Log objects in order, the first starting at the snapshot's
    /// bookmark and the last reaching the target.
    pub logs: Vec<LogName>,
}

impl Archive {
    pub fn new(store: Store, database: DatabaseId) -> Archive {
        Archive { store, database }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    pub fn database(&self) -> DatabaseId {
        self.database
    }

    /// The current manifest; [`RestoreError::NoManifest`] if none.
    pub fn manifest(&self) -> Result<Manifest, RestoreError> {
        manifest::load(&self.store, self.database)?.ok_or(RestoreError::NoManifest)
    }

    /// Checks that `target` can be restored from `m`.
    pub fn check_target(&self, m: &Manifest, target: Bookmark) -> Result<(), RestoreError> {
        if target > m.log_end {
            return Err(RestoreError::NotArchived {
                bookmark: target,
                archived: m.log_end,
            });
        }
        if target < m.retained_from {
            return Err(RestoreError::BeforeRetention {
                bookmark: target,
                start: m.retained_from,
            });
        }
        if !m.holds(target) {
            return Err(RestoreError::NotInHistory { bookmark: target });
        }
        Ok(())
    }

    /// What a restore to `target` reads.
    pub fn plan(&self, m: &Manifest, target: Bookmark) -> Result<Plan, RestoreError> {
        self.check_target(m, target)?;
        let snapshot = m.snapshot_before(target).copied();
        let start = match &snapshot {
            Some(s) => s.bookmark,
            None if m.retained_from == Bookmark::ZERO => Bookmark::ZERO,
            None => {
                return Err(RestoreError::BeforeRetention {
                    bookmark: target,
                    start: m.retained_from,
                });
            }
        };
        let logs = self.walk(m, start, target)?;
        Ok(Plan {
            target,
            snapshot,
            logs,
        })
    }

    /// The log objects, in order, that lead from `from` to at least
    /// `upto` (by name: keys and the manifest's history; their chains are
    /// checked when they are read).
    pub fn walk(
        &self,
        m: &Manifest,
        from: Bookmark,
        upto: Bookmark,
    ) -> Result<Vec<LogName>, RestoreError> {
        if from >= upto {
            return Ok(Vec::new());
        }
        let db = self.database;
        let listed = self.store.list(
            &names::log_prefix(db),
            Some(&before(&names::log_offset(db, from))),
        )?;
        let mut by_start: BTreeMap<Bookmark, Vec<LogName>> = BTreeMap::new();
        for l in listed {
            if let Some(n) = names::parse_log_key(db, &l.key) {
                by_start.entry(n.previous).or_default().push(n);
            }
        }
        // Uploaders may cut the same history at different points (a lost
        // race leaves its objects behind), so objects can overlap: find the
        // fewest objects that chain from `from` past `upto` (breadth first
        // over the points objects start and end at), using only runs of
        // the manifest's history.
        let usable = |n: &&LogName| n.last <= m.log_end && m.holds(n.last);
        let mut came_from: BTreeMap<Bookmark, LogName> = BTreeMap::new();
        let mut frontier = std::collections::VecDeque::from([from]);
        let mut reached = None;
        let mut skipped: Option<LogName> = None;
        while let Some(at) = frontier.pop_front() {
            if at >= upto {
                reached = Some(at);
                break;
            }
            let candidates = by_start.get(&at).map(Vec::as_slice).unwrap_or_default();
            if skipped.is_none() {
                skipped = candidates.iter().find(|n| !usable(n)).copied();
            }
            for n in candidates.iter().filter(usable) {
                if n.last > at && n.last != from && !came_from.contains_key(&n.last) {
                    came_from.insert(n.last, *n);
                    frontier.push_back(n.last);
                }
            }
        }
        let Some(mut at) = reached else {
            // Where the history stops: the furthest point reached.
            let stuck = came_from.keys().next_back().copied().unwrap_or(from);
            return Err(match skipped {
                Some(n) => RestoreError::Diverged {
                    key: names::log_key(db, &n),
                    generation: n.generation,
                },
                None => RestoreError::Gap { after: stuck },
            });
        };
        let mut out = Vec::new();
        while at != from {
            let n = came_from[&at];
            out.push(n);
            at = n.previous;
        }
        out.reverse();
        Ok(out)
    }

    /// Fetches and decodes log objects (in parallel), checking that they
    /// chain from `chain` at their start.
    pub fn read_logs(
        &self,
        names_: &[LogName],
        mut chain: ChainHash,
    ) -> Result<Vec<LogObject>, RestoreError> {
        let keys: Vec<String> = names_
            .iter()
            .map(|n| names::log_key(self.database, n))
            .collect();
        let got = self.store.get_many(&keys)?;
        let mut out = Vec::with_capacity(got.len());
        for ((key, name), bytes) in keys.into_iter().zip(names_).zip(got) {
            let bytes = bytes.ok_or_else(|| RestoreError::Missing { key: key.clone() })?;
            let obj = LogObject::decode(&bytes).map_err(|source| RestoreError::Format {
                key: key.clone(),
                source,
            })?;
            if obj.database != self.database || obj.name(name.generation) != *name {
                return Err(RestoreError::Format {
                    key,
                    source: crate::error::FormatError::Invalid {
                        what: "log object",
                        why: "its header does not match its key",
                    },
                });
            }
            if obj.prev_chain != chain {
                return Err(RestoreError::Diverged {
                    key,
                    generation: name.generation,
                });
            }
            chain = obj.last_chain;
            out.push(obj);
        }
        Ok(out)
    }

    /// The bookmark a time names: the last transaction, in history order,
    /// that committed at or before `timestamp_us` (commit times are the
    /// leader's wall clock when it committed; the scan stops at the first
    /// transaction after the time). A time before the retained history is
    /// [`RestoreError::TimeOutOfRange`]; a time after the archived log is
    /// its end.
    pub fn bookmark_at_time(
        &self,
        m: &Manifest,
        timestamp_us: u64,
    ) -> Result<Bookmark, RestoreError> {
        let snapshot = m.snapshots.first();
        let (start, start_us) = match snapshot {
            Some(s) if m.retained_from > Bookmark::ZERO => (s.bookmark, s.commit_us),
            _ => (Bookmark::ZERO, 0),
        };
        if timestamp_us < start_us {
            return Err(RestoreError::TimeOutOfRange {
                timestamp_us,
                first_us: start_us,
            });
        }
        if timestamp_us >= m.log_end_us {
            return Ok(m.log_end);
        }
        let logs = self.walk(m, start, m.log_end)?;
        let mut answer = start;
        for n in &logs {
            if n.last_us <= timestamp_us {
                answer = n.last;
                continue;
            }
            if n.first_us <= timestamp_us {
                // The time falls inside this object: read it.
                let key = names::log_key(self.database, n);
                let bytes = self
                    .store
                    .get(&key)?
                    .ok_or_else(|| RestoreError::Missing { key: key.clone() })?;
                let obj = LogObject::decode(&bytes)
                    .map_err(|source| RestoreError::Format { key, source })?;
                for r in obj
                    .records
                    .iter()
                    .take_while(|r| r.commit_us() <= timestamp_us)
                {
                    if !r.continued() {
                        answer = r.bookmark;
                    }
                }
            }
            break;
        }
        Ok(answer)
    }
}

/// The largest key that sorts before every key starting with `key`'s
/// spelling (a listing offset is exclusive).
fn before(key: &str) -> String {
    let mut s = key.to_string();
    if let Some(last) = s.pop() {
        s.push((last as u8 - 1) as char);
        s.push('~');
    }
    s
}
