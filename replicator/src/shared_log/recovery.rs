//! Opening the shared log: every kept segment is scanned from its header
//! (each entry's CRC checked under the segment's salt; a record's own CRC
//! too), what a poison marker says was never known durable is cut, a torn
//! or damaged tail of a new (not reused) newest segment is cut (zeroed,
//! synced; damage in an older one is only skipped), and the per-database
//! indexes are rebuilt by replaying each database's entries in lsn order
//! (see "Order" in the parent module). What lies past the entries of a
//! reused segment is left as it is, and appends then go on in a new
//! segment (see "Segment ends at open" in the parent module).

use super::format::{self, Base, FrameError, Kind, Seal, Start};
use super::index::{DbIndex, Loc, RecEntry};
use super::{Active, Inner, SegInfo, SharedLog, SharedLogConfig, io_at, poison, segment_path};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::ids::DatabaseId;
use crate::record::Encoded;
use crate::recycle;
use crate::segments::{Io, SegmentError};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// What opening the shared log found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SharedRecovery {
    pub segments: usize,
    /// Entries that decoded.
    pub entries: usize,
    pub databases: usize,
    /// Records the indexes hold.
    pub records: usize,
    /// Bytes of a torn or damaged tail of the newest segment cut (zeroed).
    pub cut_bytes: u64,
    /// Bytes after damage in an older new (not reused) segment, and bytes
    /// of a segment whose header does not check: skipped (left on disk).
    pub damaged_bytes: u64,
    /// Entries found twice (an interrupted compaction): counted once.
    pub duplicates: usize,
    /// Records that did not chain onto their database's log (after
    /// damage or a cut): dropped, to be fetched again from peers.
    pub unchained: usize,
    /// Segments removed past a poison marker's position.
    pub segments_removed: usize,
    /// Segments holding nothing of this life (a header never written, or
    /// a reused segment's earlier one): read as empty. (A header that does
    /// not check counts as damage: `damaged_bytes`.)
    pub stale_segments: usize,
    /// Whether appends go on in a new segment: the newest one's end is
    /// not followed by zeros (reused), or it is not sealed with a salt.
    pub rolls_at_open: bool,
}

/// What an entry said, parsed while its segment was in memory.
enum What {
    Record {
        bookmark: Bookmark,
        previous: Bookmark,
        prev_chain: ChainHash,
        chain: ChainHash,
    },
    Cut(Bookmark),
    Base(Base, bool),
}

struct Scanned {
    db: DatabaseId,
    loc: Loc,
    what: What,
}

fn parse(kind: Kind, payload: Bytes) -> Result<What, FrameError> {
    Ok(match kind {
        Kind::Record => match Encoded::decode(&payload) {
            Ok((r, used)) if used == payload.len() => What::Record {
                bookmark: r.bookmark,
                previous: r.previous,
                prev_chain: r.prev_chain,
                chain: r.chain,
            },
            _ => {
                return Err(FrameError::Damaged(
                    "a record entry holding no whole record",
                ));
            }
        },
        Kind::Cut => What::Cut(format::decode_cut(&payload)?),
        Kind::Release => What::Base(format::decode_base(&payload)?, false),
        Kind::Reset => What::Base(format::decode_base(&payload)?, true),
        Kind::Segment => return Err(FrameError::Damaged("a segment header past offset 0")),
    })
}

/// What reading one segment found.
struct Read {
    start: Start,
    /// Where its valid entries end.
    at: usize,
    controls: u64,
}

impl Read {
    /// How its entries are sealed, and where they begin (None: it holds
    /// nothing of this life).
    fn seal(&self) -> Option<(Seal, usize)> {
        match self.start {
            Start::Salted(h) => Some((h.seal(), format::SEGMENT_HEADER_BYTES)),
            Start::Legacy => Some((Seal::Legacy, 0)),
            Start::Empty | Start::Earlier(_) | Start::Stale => None,
        }
    }

    /// Whether only zeros may follow its entries (a new segment, or one
    /// written before salts): anything else there is torn or damaged.
    fn zeros_expected(&self) -> bool {
        match self.start {
            Start::Legacy => true,
            Start::Salted(h) => !h.reused,
            Start::Empty | Start::Earlier(_) | Start::Stale => false,
        }
    }
}

/// Reads segment `index`'s entries from its start (see `format`).
fn read_segment(index: u64, data: &Bytes, out: &mut Vec<Scanned>) -> Read {
    let mut read = Read {
        start: format::segment_start(data, index),
        at: 0,
        controls: 0,
    };
    if let Some((seal, from)) = read.seal() {
        (read.at, read.controls) = scan(index, data, from, seal, out);
    }
    read
}

/// Scans one segment's entries from `from`: the entries, and where the
/// valid ones end.
fn scan(index: u64, data: &Bytes, from: usize, seal: Seal, out: &mut Vec<Scanned>) -> (usize, u64) {
    let limit = data.len();
    let mut at = from;
    let mut controls = 0u64;
    while at < limit {
        let frame = match format::decode(&data[at..limit], seal) {
            Ok(f) => f,
            Err(FrameError::End) => break,
            Err(FrameError::Damaged(why)) => {
                tracing::warn!(
                    segment = index,
                    offset = at,
                    why,
                    "shared log: a damaged entry ends the segment"
                );
                break;
            }
        };
        let payload = data.slice(at + format::HEADER_BYTES..at + frame.len - format::CRC_BYTES);
        let what = match parse(frame.kind, payload) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(segment = index, offset = at, error = %e, "shared log: a damaged entry ends the segment");
                break;
            }
        };
        if frame.kind != Kind::Record {
            controls += 1;
        }
        out.push(Scanned {
            db: frame.database,
            loc: Loc {
                segment: index,
                offset: at as u64,
                len: frame.len as u64,
                lsn: frame.lsn,
            },
            what,
        });
        at += frame.len;
    }
    (at, controls)
}

/// Replays every database's entries in lsn order into its index.
fn replay(mut scanned: Vec<Scanned>, rec: &mut SharedRecovery) -> HashMap<DatabaseId, DbIndex> {
    // A copy and its original (same database and lsn): the newest
    // position is kept.
    scanned.sort_by(|a, b| {
        (a.db, a.loc.lsn)
            .cmp(&(b.db, b.loc.lsn))
            .then((b.loc.segment, b.loc.offset).cmp(&(a.loc.segment, a.loc.offset)))
    });
    let before = scanned.len();
    scanned.dedup_by_key(|s| (s.db, s.loc.lsn));
    rec.duplicates = before - scanned.len();
    // Records are taken without a chain check while replaying: a dead
    // record whose predecessor (dead too) was deleted with its segment
    // still replays before the entry that killed it. Every record killed
    // has its killer on disk (a cut or base entry goes only with the
    // oldest segment, and everything it killed is in that segment or
    // older), so what is left at the end is exactly what was live, and
    // must chain from the base: checked then.
    let mut prevs: HashMap<(DatabaseId, u64), (Bookmark, ChainHash)> = HashMap::new();
    let mut dbs: HashMap<DatabaseId, DbIndex> = HashMap::new();
    for s in scanned {
        let idx = dbs.entry(s.db).or_default();
        match s.what {
            What::Record {
                bookmark,
                previous,
                prev_chain,
                chain,
            } => {
                if bookmark > idx.last() {
                    prevs.insert((s.db, s.loc.lsn), (previous, prev_chain));
                    idx.push(RecEntry {
                        bookmark,
                        chain,
                        loc: s.loc,
                    });
                } else {
                    rec.unchained += 1;
                    tracing::warn!(database = %s.db, record = %bookmark, last = %idx.last(), "shared log: a record out of order for its database is dropped");
                }
            }
            What::Cut(keep) => {
                let keep = keep.max(idx.base);
                idx.cut_after(keep);
            }
            What::Base(base, reset) => {
                idx.rebase(base, s.loc, reset);
            }
        }
    }
    for (id, idx) in dbs.iter_mut() {
        let mut last = idx.base;
        let mut last_chain = idx.base_chain;
        let mut keep = idx.entries.len();
        for (i, e) in idx.entries.iter().enumerate() {
            let follows = prevs
                .get(&(*id, e.loc.lsn))
                .is_some_and(|(p, pc)| *p == last && last_chain.is_none_or(|c| c == *pc));
            if !follows {
                keep = i;
                break;
            }
            last = e.bookmark;
            last_chain = Some(e.chain);
        }
        if keep < idx.entries.len() {
            let dropped = idx.entries.len() - keep;
            rec.unchained += dropped;
            tracing::warn!(database = %id, after = %last, records = dropped, "shared log: records that do not chain onto their database's log are dropped, to be fetched again from peers");
            idx.entries.truncate(keep);
        }
        idx.durable = idx.last();
    }
    dbs
}

/// One database as [`SharedLog::inspect`] finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inspected {
    pub database: DatabaseId,
    /// Where its log starts (its newest release or reset).
    pub start: Bookmark,
    pub last: Bookmark,
    pub records: usize,
    /// Bytes of the shared log it keeps live (records and base entry).
    pub live_bytes: u64,
}

fn segment_indexes(dir: &Path) -> Result<Vec<u64>, SegmentError> {
    let mut indexes: Vec<u64> = std::fs::read_dir(dir)
        .map_err(io_at(dir))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok()
        })
        .collect();
    indexes.sort_unstable();
    Ok(indexes)
}

impl SharedLog {
    /// What the shared log in `dir` holds per database, read without
    /// changing anything (a log another process is writing may show a
    /// torn tail: the scan stops there). For tools and tests.
    pub fn inspect(dir: &Path) -> Result<Vec<Inspected>, SegmentError> {
        let mut scanned = Vec::new();
        for index in segment_indexes(dir)? {
            let path = segment_path(dir, index);
            let data = match std::fs::read(&path) {
                Ok(d) => Bytes::from(d),
                // Deleted meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_at(&path)(e)),
            };
            read_segment(index, &data, &mut scanned);
        }
        let mut rec = SharedRecovery::default();
        let mut out: Vec<Inspected> = replay(scanned, &mut rec)
            .into_iter()
            .map(|(database, idx)| Inspected {
                database,
                start: idx.base,
                last: idx.last(),
                records: idx.entries.len(),
                live_bytes: idx.live_bytes(),
            })
            .collect();
        out.sort_by_key(|i| i.database);
        Ok(out)
    }

    /// Opens (creating) the shared log in `dir`, recovering it.
    pub fn open(
        dir: &Path,
        config: SharedLogConfig,
    ) -> Result<(Arc<SharedLog>, SharedRecovery), SegmentError> {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        let mut indexes = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io_at(dir))?.flatten() {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            if crate::prealloc::is_tmp_name(&name) {
                // A roll or a spare a crash interrupted: never renamed,
                // never used.
                let _ = std::fs::remove_file(e.path());
            } else if let Some(i) = name
                .strip_suffix(".seg")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                indexes.push(i);
            }
        }
        indexes.sort_unstable();
        let poisoned = poison::load(dir)?;
        let mut rec = SharedRecovery::default();
        let mut segments = BTreeMap::new();
        let mut scanned = Vec::new();
        let mut end = None;
        let mut durable_pos = (0, 0);
        let newest = match poisoned {
            Some((seg, _)) => indexes.iter().copied().filter(|i| *i <= seg).max(),
            None => indexes.last().copied(),
        };
        for index in indexes {
            let path = segment_path(dir, index);
            if poisoned.is_some_and(|(seg, _)| index > seg) {
                std::fs::remove_file(&path).map_err(io_at(&path))?;
                rec.segments_removed += 1;
                continue;
            }
            let mut data = std::fs::read(&path).map_err(io_at(&path))?;
            if let Some((_, off)) = poisoned.filter(|(seg, _)| *seg == index) {
                // Never known durable, whatever the segment: zeroed, or a
                // later scan would find what the failed sync wrote.
                let off = (off as usize).min(data.len());
                if let Some(last) = data[off..].iter().rposition(|b| *b != 0) {
                    let n = last + 1;
                    cut(
                        &path,
                        index,
                        off,
                        n,
                        &mut rec,
                        "what a failed sync may have written",
                    )?;
                    data[off..off + n].fill(0);
                }
            }
            let data = Bytes::from(data);
            let read = read_segment(index, &data, &mut scanned);
            let at = read.at;
            let is_newest = Some(index) == newest;
            let past = data[at..].iter().rposition(|b| *b != 0);
            match read.start {
                Start::Empty => rec.stale_segments += 1,
                Start::Earlier(earlier) => {
                    rec.stale_segments += 1;
                    tracing::info!(
                        segment = index,
                        earlier,
                        "shared log: a reused segment whose new header never reached the disk holds nothing of this life"
                    );
                }
                Start::Stale => {
                    // Nothing was read from it (`at` is 0): all it holds.
                    let held = past.map_or(0, |l| l + 1);
                    rec.damaged_bytes += held as u64;
                    tracing::error!(
                        segment = index,
                        bytes = held,
                        "shared log: a segment whose header does not check is skipped; the records it held are fetched again from peers"
                    );
                }
                Start::Legacy | Start::Salted(_) => {}
            }
            match past.filter(|_| read.zeros_expected()) {
                Some(last) if !is_newest => {
                    // Not the segment appends go to: left as it is (nothing
                    // is written there again) and skipped at every open.
                    // Nothing after the damage is searched for: a frame
                    // found inside another's payload could be forged by
                    // page data.
                    rec.damaged_bytes += (last + 1) as u64;
                    tracing::error!(
                        segment = index,
                        offset = at,
                        "shared log: damaged entries in an older segment are skipped; the records after them are fetched again from peers"
                    );
                }
                Some(last) => cut(
                    &path,
                    index,
                    at,
                    last + 1,
                    &mut rec,
                    "a torn or damaged tail",
                )?,
                None => {}
            }
            segments.insert(
                index,
                SegInfo {
                    controls: read.controls,
                    ..SegInfo::new(data.len() as u64, read.seal().map(|(s, _)| s))
                },
            );
            if is_newest {
                durable_pos = (index, at as u64);
                let zeros_past = past.is_none() || read.zeros_expected();
                end = match read.start {
                    Start::Salted(h) if zeros_past => {
                        Some((index, at as u64, data.len() as u64, h.salt))
                    }
                    _ => {
                        rec.rolls_at_open = true;
                        tracing::info!(
                            segment = index,
                            offset = at,
                            start = ?read.start,
                            "shared log: the newest segment is not appended to again; appends go on in a new segment"
                        );
                        None
                    }
                };
            }
        }
        rec.segments = segments.len();
        rec.entries = scanned.len();
        let next_lsn = scanned
            .iter()
            .map(|s| s.loc.lsn)
            .max()
            .map_or(0, |l| l.checked_add(1).expect("shared log lsn overflow"));
        let dbs = replay(scanned, &mut rec);
        for idx in dbs.values() {
            for loc in idx.entries.iter().map(|e| e.loc).chain(idx.base_entry) {
                let s = segments
                    .get_mut(&loc.segment)
                    .expect("a replayed entry's segment was scanned");
                s.live += loc.len;
            }
        }
        rec.databases = dbs.len();
        rec.records = dbs.values().map(|i| i.entries.len()).sum();
        // What survived a process crash may sit in the page cache only:
        // synced before anything counts as durable.
        for &index in segments.keys() {
            let path = segment_path(dir, index);
            File::open(&path)
                .and_then(|f| f.sync_data())
                .map_err(io_at(&path))?;
        }
        super::sync_dir(dir)?;
        poison::clear(dir)?;
        // The pool: trimmed to its bound and the segment size; no new
        // segment takes the index a pool file had (a reuse whose header
        // never landed must show an index that is not its own).
        recycle::trim(dir, config.segment_bytes).map_err(io_at(dir))?;
        let index_floor = match recycle::list(dir)
            .map_err(io_at(dir))?
            .iter()
            .filter_map(|(p, _)| recycle::index_of(p))
            .max()
        {
            None => 0,
            Some(i) => i.checked_add(1).ok_or_else(|| {
                io_at(dir)(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "a pool file's index leaves no index for a new segment",
                ))
            })?,
        };
        let active = match end {
            Some((index, write_offset, size, salt)) => {
                let path = segment_path(dir, index);
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&path)
                    .map_err(io_at(&path))?;
                Some(Active::open(index, &path, file, write_offset, size, salt)?)
            }
            None => None,
        };
        tracing::info!(
            segments = rec.segments,
            databases = rec.databases,
            records = rec.records,
            cut_bytes = rec.cut_bytes,
            duplicates = rec.duplicates,
            unchained = rec.unchained,
            stale_segments = rec.stale_segments,
            "shared log recovered"
        );
        let inner = Inner {
            dir: dir.to_path_buf(),
            config,
            segments,
            active,
            rolled: Vec::new(),
            staged: Vec::new(),
            touched: BTreeSet::new(),
            dbs,
            next_lsn,
            io: Io::choose(config.backend),
            failed: false,
            durable_pos,
            over_bound_warned: false,
            stats: Default::default(),
            spare: None,
            doomed: Vec::new(),
            pool_for: None,
            index_floor,
        };
        Ok((
            Arc::new(SharedLog {
                dir: dir.to_path_buf(),
                inner: Mutex::new(inner),
            }),
            rec,
        ))
    }
}

/// Cuts `n` bytes at `at` from segment `index` at `path` (`what` they
/// are): zeroed and synced, counted in `rec`.
fn cut(
    path: &Path,
    index: u64,
    at: usize,
    n: usize,
    rec: &mut SharedRecovery,
    what: &'static str,
) -> Result<(), SegmentError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_at(path))?;
    file.write_all_at(&vec![0u8; n], at as u64)
        .map_err(io_at(path))?;
    file.sync_data().map_err(io_at(path))?;
    rec.cut_bytes += n as u64;
    tracing::warn!(
        segment = index,
        offset = at,
        bytes = n,
        what,
        "shared log cut bytes"
    );
    Ok(())
}
