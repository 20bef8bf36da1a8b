//! Released segments kept for reuse: the free pool of a segment log.
//!
//! A new segment is written with zeros over its whole size before the log
//! uses it (see [`crate::prealloc`] for why), about 1.3 bytes of zeros per
//! byte of log. Those zeros sit in the disk's write cache until the next
//! sync flushes them, and a commit's sync that flushes them waits for
//! them: a lone writer's p99 in process was 591-861 us with 64 MiB
//! segments and 350-391 us with segments so large that none was filled
//! while it ran (papers/performance-log.md, twenty-fourth session). Once a log
//! releases its archived prefix, its released segments are the right size
//! and already written: renamed into the pool instead of unlinked, the
//! next roll takes one and writes nothing but records, as PostgreSQL
//! recycles its WAL files.
//!
//! A reused segment holds records of its earlier life past the log's end.
//! They are never taken for the log's: every one of them is at or before
//! the log's start (they were released), so none follows the log's last
//! record, and recovery (`segments_recovery`) reads them as stale bytes,
//! neither a torn tail nor damage.
//!
//! A fleet host's shared log (`shared_log`) keeps a pool of the same kind
//! for the segments its retention deletes (dead, or compacted): there an
//! entry says nothing about which life of its segment it belongs to, so
//! each life is sealed with a salt of its own (`shared_log::format`).
//!
//! A pool file is named after the segment it was, `<index:016x>.seg.free`
//! (an index is never used twice, so names never collide), in the log's
//! directory. The pool holds at most [`MAX_FREE`] files, all of the log's
//! full segment size; a released segment beyond that, or of another size,
//! is unlinked as before. Files move in only by a release or a deletion
//! (after what freed them is durable) and out only by a roll (under the
//! log's lock), each by one rename followed by a sync of the directory; a
//! file a crash leaves under either name is found at the next open, in
//! the pool or as a segment holding no record of this life. Two releases
//! running at once may each find room for their files and hold the pool
//! over its bound until the next rolls take them or the next open trims
//! it.

use crate::prealloc::{self, Created, Spare};
use crate::segments::SegmentError;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

/// Released segments a log keeps for reuse, at most: a release usually
/// frees one segment for each roll, so two cover the next roll and one
/// more without letting a log's files grow by more than two segments.
pub(crate) const MAX_FREE: usize = 2;

const SUFFIX: &str = ".seg.free";

/// The pool name for the released segment `index` in `dir`.
pub(crate) fn free_path(dir: &Path, index: u64) -> PathBuf {
    dir.join(format!("{index:016x}{SUFFIX}"))
}

/// The segment index a pool file had, from its name.
pub(crate) fn index_of(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    u64::from_str_radix(name.strip_suffix(SUFFIX)?, 16).ok()
}

/// Whether `name` is a pool file's.
pub(crate) fn is_free_name(name: &str) -> bool {
    name.strip_suffix(SUFFIX)
        .is_some_and(|h| u64::from_str_radix(h, 16).is_ok())
}

/// The pool's files in `dir` with their sizes, oldest segment first.
pub(crate) fn list(dir: &Path) -> io::Result<Vec<(PathBuf, u64)>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)?.flatten() {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        if is_free_name(&name) {
            match e.metadata() {
                Ok(m) => out.push((e.path(), m.len())),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => return Err(err),
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Whether the pool in `dir` holds a file of at least `size` bytes.
/// Whether the pool holds a file for the roll to segment `index` (of
/// `size` bytes), looked at once per index: `seen` keeps the last answer,
/// so a log calling this after every append lists its directory once per
/// roll.
pub(crate) fn serves(seen: &mut Option<(u64, bool)>, dir: &Path, index: u64, size: u64) -> bool {
    match *seen {
        Some((i, pooled)) if i == index => pooled,
        _ => {
            let pooled = has(dir, size);
            *seen = Some((index, pooled));
            pooled
        }
    }
}

pub(crate) fn has(dir: &Path, size: u64) -> bool {
    list(dir).is_ok_and(|files| files.iter().any(|(_, len)| *len >= size))
}

/// Moves a pool file of at least `size` bytes (the smallest such) to
/// `path` and syncs the directory: the file, open for reading and
/// writing, and its size. `Ok(None)` if the pool has none.
pub(crate) fn take(dir: &Path, path: &Path, size: u64) -> io::Result<Option<(File, u64)>> {
    let Some((free, len)) = list(dir)?
        .into_iter()
        .filter(|(_, len)| *len >= size)
        .min_by_key(|(_, len)| *len)
    else {
        return Ok(None);
    };
    std::fs::rename(&free, path)?;
    File::open(dir)?.sync_all()?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)?;
    Ok(Some((file, len)))
}

/// Segment `index` of at least `size` bytes at `path`, for a roll: the
/// spare prepared ahead when it is built and fits (the pool then keeps its
/// file for a later roll), else a released segment from the pool (already
/// written: nothing to write; a spare still being filled is dropped), else
/// zeros written inline ([`prealloc::create_segment`]). Whether it was
/// reused from the pool.
pub(crate) fn reuse_or_create(
    dir: &Path,
    path: &Path,
    index: u64,
    size: u64,
    spare: Option<Spare>,
) -> Result<(Created, bool), SegmentError> {
    let spare_ready = spare
        .as_ref()
        .is_some_and(|s| s.is_for(index, size) && s.is_done());
    let pooled = if spare_ready {
        None
    } else {
        take(dir, path, size).unwrap_or_else(|e| {
            tracing::warn!(segment = index, error = %e, "a released segment could not be reused: the roll writes a new one");
            None
        })
    };
    match pooled {
        Some((file, size)) => {
            drop(spare);
            tracing::debug!(segment = index, size, "reusing a released segment");
            let created = Created {
                file,
                size,
                from_spare: false,
            };
            Ok((created, true))
        }
        None => Ok((
            prealloc::create_segment(dir, path, index, size, spare)?,
            false,
        )),
    }
}

/// Keeps at most [`MAX_FREE`] pool files of exactly `size` bytes in `dir`
/// and removes the rest (an open after the segment size changed, or after
/// a crash mid-release). The number kept.
pub(crate) fn trim(dir: &Path, size: u64) -> io::Result<usize> {
    let mut kept = 0;
    for (path, len) in list(dir)?.into_iter().rev() {
        if len == size && kept < MAX_FREE {
            kept += 1;
        } else {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &Path, len: u64) {
        std::fs::File::create(path)
            .and_then(|f| f.set_len(len))
            .expect("file");
    }

    #[test]
    fn a_take_moves_the_smallest_pool_file_that_is_large_enough_into_place() {
        let dir = tempfile::tempdir().expect("dir");
        file(&free_path(dir.path(), 1), 8192);
        file(&free_path(dir.path(), 2), 4096);
        let to = dir.path().join("0000000000000009.seg");
        let (_, len) = take(dir.path(), &to, 4096).expect("io").expect("one fits");
        assert_eq!(len, 4096);
        assert!(to.exists() && !free_path(dir.path(), 2).exists());
        assert!(
            take(dir.path(), &to, 16384).expect("io").is_none(),
            "none is large enough"
        );
        assert!(has(dir.path(), 8192) && !has(dir.path(), 8193));
    }

    #[test]
    fn a_trim_keeps_the_newest_files_of_the_segment_size_up_to_the_bound() {
        let dir = tempfile::tempdir().expect("dir");
        for i in 1..=4 {
            file(&free_path(dir.path(), i), 4096);
        }
        file(&free_path(dir.path(), 5), 100);
        std::fs::write(dir.path().join("0000000000000006.seg"), b"x").expect("segment");
        assert_eq!(trim(dir.path(), 4096).expect("trim"), MAX_FREE);
        let left: Vec<PathBuf> = list(dir.path())
            .expect("list")
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            left,
            vec![free_path(dir.path(), 3), free_path(dir.path(), 4)]
        );
        assert!(
            dir.path().join("0000000000000006.seg").exists(),
            "segments are not the pool's"
        );
        assert!(!is_free_name("0000000000000006.seg") && !is_free_name("x.seg.free"));
    }
}
