//! Opening a segment log: the recovery scan (cut a torn tail, quarantine
//! mid-log damage, finish an interrupted release, honour the poison
//! marker) and the cut it shares with `truncate_after`.

use super::{Entry, Io, IoBackend, Recovery, SegmentError, SegmentLog, io_at, release};
use crate::bookmark::Bookmark;
use crate::chain::ChainHash;
use crate::history::History;
use crate::prealloc;
use crate::record::Encoded;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;

impl SegmentLog {
    /// Opens (creating) the log in `dir`. `base` is the bookmark the log
    /// starts after (the first record's `previous`), unless a prefix was
    /// released: then the `released` marker says where it starts (and
    /// segments it names as released that a crash left behind are
    /// removed).
    pub fn open(
        dir: &Path,
        segment_bytes: u64,
        base: Bookmark,
    ) -> Result<(SegmentLog, Recovery), SegmentError> {
        Self::open_with(dir, segment_bytes, base, IoBackend::Auto)
    }

    /// `open` with a choice of I/O backend for `sync`.
    pub fn open_with(
        dir: &Path,
        segment_bytes: u64,
        base: Bookmark,
        backend: IoBackend,
    ) -> Result<(SegmentLog, Recovery), SegmentError> {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        let released = release::base::load(dir)?;
        let mut indexes: Vec<u64> = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io_at(dir))?.flatten() {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            if prealloc::is_tmp_name(&name) {
                // A segment being built when the process stopped (a roll,
                // or a spare prepared ahead): never renamed, never used.
                let path = e.path();
                std::fs::remove_file(&path).map_err(io_at(&path))?;
            } else if let Some(i) = name
                .strip_suffix(".seg")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                indexes.push(i);
            }
        }
        indexes.sort_unstable();
        let mut rec = Recovery::default();
        let first_index = released.as_ref().map_or(0, |m| m.first_kept);
        // A crash between the marker and the unlinks leaves released
        // segments behind: removed once the kept ones checked out.
        let kept = indexes.partition_point(|i| *i < first_index);
        let leftover = indexes[..kept].to_vec();
        let indexes = indexes.split_off(kept);
        let marked = released.is_some();
        let (base, base_chain, base_history) = match released {
            Some(m) => (m.start, Some(m.chain), m.history),
            None => (
                base,
                (base == Bookmark::ZERO).then_some(ChainHash::GENESIS),
                History::new(),
            ),
        };
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            segment_bytes,
            first_segment_bytes: segment_bytes,
            base,
            base_chain,
            base_history,
            first_index,
            sizes: BTreeMap::new(),
            entries: Vec::new(),
            current: None,
            tail: Default::default(),
            write_offset: 0,
            current_bytes: 0,
            pending: Vec::new(),
            rolled: Vec::new(),
            durable: base,
            io: Io::choose(backend),
            failed: false,
            spare: None,
            spares_used: 0,
            pool_for: None,
            recycled: 0,
        };
        let mut cut = false;
        for (n, &index) in indexes.iter().enumerate() {
            let path = Self::segment_path(dir, index);
            if cut || index != first_index + n as u64 {
                std::fs::remove_file(&path).map_err(io_at(&path))?;
                rec.segments_removed += 1;
                cut = true;
                continue;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(io_at(&path))?;
            let data = Bytes::from(std::fs::read(&path).map_err(io_at(&path))?);
            let mut at = 0usize;
            let mut last = log.last();
            let mut last_chain = log.last_chain();
            loop {
                let rest = data.slice(at..);
                let ok = match Encoded::decode(&rest) {
                    Ok((r, used))
                        if r.previous == last && last_chain.is_none_or(|c| c == r.prev_chain) =>
                    {
                        Some((r.bookmark, r.chain, used))
                    }
                    // A valid first record that does not follow the
                    // released base: the marker and the log disagree.
                    // (One at or before the start is a reused segment's
                    // earlier record: stale, below.)
                    Ok((r, _)) if marked && log.entries.is_empty() && r.bookmark > log.base => {
                        return Err(SegmentError::BaseMismatch {
                            path,
                            start: log.base,
                            bookmark: r.bookmark,
                            previous: r.previous,
                        });
                    }
                    _ => None,
                };
                let Some((bookmark, chain, used)) = ok else {
                    if let Some(len) = crate::record::legacy_record_len(&rest) {
                        return Err(SegmentError::LegacyRecord { path, len });
                    }
                    // Zero magic: the clean end. So is a segment that ends
                    // where the next one picks up (a reused segment holds
                    // its earlier life past the roll). Anything else: a
                    // torn or corrupt tail, cut here, or in a reused
                    // segment its earlier records (see `crate::recycle`).
                    let tail_is_zero = rest.iter().all(|&b| b == 0);
                    let rolled = || {
                        indexes.get(n + 1).is_some_and(|&i| {
                            i == index + 1
                                && first_follows(&Self::segment_path(dir, i), last, last_chain)
                        })
                    };
                    if !tail_is_zero && !rolled() {
                        // Valid records after the damage that are newer
                        // than the last good one, here or in later
                        // segments, mean it is not a torn tail: keep the
                        // bytes aside and say so, loudly. Older ones are a
                        // reused segment's stale records.
                        let here = records_after(&rest, last, true);
                        let after = here.newer
                            + indexes[n + 1..]
                                .iter()
                                .map(|i| {
                                    std::fs::read(Self::segment_path(dir, *i)).map_or(0, |d| {
                                        records_after(&Bytes::from(d), last, false).newer
                                    })
                                })
                                .sum::<usize>();
                        if after == 0 && here.stale > 0 {
                            // A reused segment's earlier records: past the
                            // end, never kept, overwritten as the log grows.
                            rec.stale_segments += 1;
                            break;
                        }
                        if after > 0 {
                            rec.mid_log_corruption = Some(last);
                            rec.records_after_corruption = after;
                            quarantine(dir, &format!("{index:016x}-{at}"), &rest)?;
                            for i in &indexes[n + 1..] {
                                let p = Self::segment_path(dir, *i);
                                quarantine(
                                    dir,
                                    &format!("{i:016x}"),
                                    &std::fs::read(&p).map_err(io_at(&p))?,
                                )?;
                            }
                            tracing::error!(
                                segment = index,
                                offset = at,
                                last_good = %last,
                                records_after = after,
                                "a damaged record in the middle of the log: the log ends before it and what followed is quarantined, to be fetched again from the leader and peers"
                            );
                        }

                        rec.cut_bytes += rest.len() as u64;
                        file.write_all_at(&vec![0u8; rest.len()], at as u64)
                            .map_err(io_at(&path))?;
                        file.sync_data().map_err(io_at(&path))?;
                        cut = true;
                    }
                    break;
                };
                log.entries.push(Entry {
                    bookmark,
                    chain,
                    segment: index,
                    offset: at as u64,
                    len: used as u64,
                });
                last = bookmark;
                last_chain = Some(chain);
                rec.records += 1;
                at += used;
            }
            log.set_current(index, file, at as u64, data.len() as u64)?;
            log.sizes.insert(index, data.len() as u64);
        }
        for index in leftover {
            let path = Self::segment_path(dir, index);
            std::fs::remove_file(&path).map_err(io_at(&path))?;
            rec.released_removed += 1;
        }
        crate::recycle::trim(dir, segment_bytes).map_err(io_at(dir))?;
        if let Some(good) = poison::load(dir)? {
            rec.cut_bytes += log.cut_after(good)?;
        }
        // What survived a process crash may still sit in the page cache
        // only: sync it before anything counts as durable (a follower acks
        // its position on every handshake).
        let mut synced = std::collections::BTreeSet::new();
        for e in &log.entries {
            if synced.insert(e.segment) {
                let path = Self::segment_path(dir, e.segment);
                File::open(&path)
                    .and_then(|f| f.sync_data())
                    .map_err(io_at(&path))?;
            }
        }
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_at(dir))?;
        poison::clear(dir)?;
        log.durable = log.last();
        Ok((log, rec))
    }

    /// Cuts every record after `keep` (zeroing their bytes, removing later
    /// segments); returns the bytes cut.
    pub(super) fn cut_after(&mut self, keep: Bookmark) -> Result<u64, SegmentError> {
        let first = self.entries.partition_point(|e| e.bookmark <= keep);
        let Some(from) = self.entries.get(first).copied() else {
            return Ok(0);
        };
        let mut cut = 0;
        let mut segments: Vec<u64> = self.entries[first..].iter().map(|e| e.segment).collect();
        segments.dedup();
        for &seg in &segments {
            let path = Self::segment_path(&self.dir, seg);
            if seg == from.segment {
                let end = self.entries[first..]
                    .iter()
                    .filter(|e| e.segment == seg)
                    .map(|e| e.offset + e.len)
                    .max()
                    .unwrap_or(from.offset);
                let len = (end - from.offset) as usize;
                let file = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(io_at(&path))?;
                file.write_all_at(&vec![0u8; len], from.offset)
                    .map_err(io_at(&path))?;
                file.sync_data().map_err(io_at(&path))?;
                cut += len as u64;
            } else {
                cut += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                std::fs::remove_file(&path).map_err(io_at(&path))?;
                self.sizes.remove(&seg);
            }
        }
        self.entries.truncate(first);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(Self::segment_path(&self.dir, from.segment))
            .map_err(io_at(&self.dir))?;
        let size = file.metadata().map_err(io_at(&self.dir))?.len();
        self.set_current(from.segment, file, from.offset, size)?;
        // Cut back into an earlier segment, the log next rolls to one
        // after it: a spare made for the old next index goes.
        let next = self.next_index();
        prealloc::keep_only_for(&mut self.spare, next);
        Ok(cut)
    }
}

/// Whole, valid records found in a scan for the record magic past a
/// log's end: only for telling damage from a torn tail or stale records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct After {
    /// Records after the last good one: damage, not a torn tail.
    newer: usize,
    /// Records at or before it: a reused segment's earlier life.
    stale: usize,
}

/// What valid records start somewhere in `buf`, a log's bytes past its
/// last good record, `last`. With `past_end`, `buf` starts right at the
/// end, where the record that did not follow was: a newer one there is
/// not counted.
fn records_after(buf: &Bytes, last: Bookmark, past_end: bool) -> After {
    let mut found = After::default();
    let mut at = 0;
    while let Some(i) = buf[at..]
        .windows(crate::record::MAGIC.len())
        .position(|w| w == crate::record::MAGIC)
    {
        let start = at + i;
        match Encoded::decode(&buf.slice(start..)) {
            Ok((r, used)) => {
                if r.bookmark <= last {
                    found.stale += 1;
                } else if start > 0 || !past_end {
                    found.newer += 1;
                }
                at = start + used;
            }
            Err(_) => at = start + 1,
        }
    }
    found
}

/// Whether the first record of the segment at `path` follows `last` (with
/// chain `last_chain`, if known): the log went on there, so the segment
/// before ended cleanly whatever lies past its end. Reads a prefix, and
/// the whole file only for a first record longer than that.
fn first_follows(path: &Path, last: Bookmark, last_chain: Option<ChainHash>) -> bool {
    const PREFIX: u64 = 64 << 10;
    let follows = |bytes: Vec<u8>| match Encoded::decode(&Bytes::from(bytes)) {
        Ok((r, _)) => Some(r.previous == last && last_chain.is_none_or(|c| c == r.prev_chain)),
        Err(_) => None,
    };
    let Ok(file) = File::open(path) else {
        return false;
    };
    let mut prefix = Vec::new();
    if std::io::Read::read_to_end(&mut std::io::Read::take(&file, PREFIX), &mut prefix).is_err() {
        return false;
    }
    match follows(prefix) {
        Some(f) => f,
        None => std::fs::read(path).ok().and_then(follows).unwrap_or(false),
    }
}

/// Keeps `bytes` as `<dir>/quarantine/<name>` (synced) before the log
/// drops them.
fn quarantine(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), SegmentError> {
    let q = dir.join("quarantine");
    std::fs::create_dir_all(&q).map_err(io_at(&q))?;
    let path = q.join(name);
    let f = File::create(&path).map_err(io_at(&path))?;
    f.write_all_at(bytes, 0).map_err(io_at(&path))?;
    f.sync_all().map_err(io_at(&path))?;
    File::open(&q).and_then(|d| d.sync_all()).map_err(io_at(&q))
}

/// The poison marker, `<dir>/poisoned` (a [`crate::marker`]): written when
/// a sync fails, naming the last bookmark known durable; the next open cuts
/// the log back to it.
///
/// ```text
///  0  magic     b"WRPOISON"                  8
///  8  bookmark  epoch u32, sequence u64 BE  12
/// 20  crc32     u32 BE over bytes 0..20      4
/// ```
pub(super) mod poison {
    use super::{SegmentError, io_at};
    use crate::bookmark::Bookmark;
    use crate::marker::{self, MarkerError};
    use std::path::Path;

    const NAME: &str = "poisoned";
    const MAGIC: &[u8] = b"WRPOISON";

    fn err(dir: &Path, e: MarkerError) -> SegmentError {
        match e {
            MarkerError::Io { source, .. } => io_at(dir)(source),
            MarkerError::Corrupt { why, .. } => {
                io_at(dir)(std::io::Error::new(std::io::ErrorKind::InvalidData, why))
            }
        }
    }

    pub(in crate::segments) fn store(dir: &Path, good: Bookmark) -> Result<(), SegmentError> {
        marker::store(&dir.join(NAME), MAGIC, &good.to_bytes()).map_err(|e| err(dir, e))
    }

    /// The marker's bookmark; a damaged marker (which the atomic write
    /// makes unlikely) trusts nothing past the base.
    pub(super) fn load(dir: &Path) -> Result<Option<Bookmark>, SegmentError> {
        match marker::load(&dir.join(NAME), MAGIC, Bookmark::BYTE_LEN) {
            Ok(None) => Ok(None),
            Ok(Some(p)) => {
                let mut raw = [0u8; Bookmark::BYTE_LEN];
                raw.copy_from_slice(&p);
                Ok(Some(Bookmark::from_bytes(raw)))
            }
            Err(MarkerError::Corrupt { .. }) => Ok(Some(Bookmark::ZERO)),
            Err(e) => Err(err(dir, e)),
        }
    }

    pub(super) fn clear(dir: &Path) -> Result<(), SegmentError> {
        marker::remove(&dir.join(NAME)).map_err(|e| err(dir, e))
    }
}
