//! A durability follower's log on disk: records appended to segment files,
//! made durable in groups, scanned and cut back to the last valid record on
//! open.
//!
//! ```text
//! <dir>/<index:016x>.seg   index = 0, 1, 2, ...; each segment is set to
//!                           `segment_bytes` at creation and holds records
//!                           (see `record`) back to back from offset 0;
//!                           the rest is zero (a zero magic ends the scan)
//! ```
//!
//! Durability is explicit: `append` writes (page cache), `sync` makes
//! everything appended so far durable with one `fdatasync` per touched
//! segment and returns the newest durable bookmark — one sync covers every
//! record appended before it (group commit).
//!
//! Recovery (`open`) reads each segment in order and keeps records while
//! they decode (magic, bounds, CRC) and chain (`previous` = the bookmark
//! before). The first record that does not — a torn or corrupt tail — and
//! everything after it is cut: its bytes are zeroed so later scans stop
//! there too, and later segments are removed. Cut records are fetched again
//! from the leader or a peer.

use crate::bookmark::Bookmark;
use crate::record::{Record, RecordError};
use bytes::Bytes;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Why the segment log failed.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    #[error("segment I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("record does not follow the log: previous {previous}, log ends at {last}")]
    Discontinuous { previous: Bookmark, last: Bookmark },
    #[error("record of {len} bytes cannot fit a segment of {segment_bytes} bytes")]
    RecordTooLarge { len: u64, segment_bytes: u64 },
    #[error(transparent)]
    Record(#[from] RecordError),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    bookmark: Bookmark,
    segment: u64,
    offset: u64,
    len: u64,
}

/// What `open` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Recovery {
    pub records: usize,
    /// Bytes of a torn or corrupt tail that were cut.
    pub cut_bytes: u64,
    pub segments_removed: usize,
}

/// The log of one follower.
#[derive(Debug)]
pub struct SegmentLog {
    dir: PathBuf,
    segment_bytes: u64,
    base: Bookmark,
    entries: Vec<Entry>,
    current: Option<(u64, File)>,
    write_offset: u64,
    /// Segments written since the last sync.
    dirty: Vec<u64>,
    durable: Bookmark,
}

fn io_at(path: &Path) -> impl Fn(io::Error) -> SegmentError + '_ {
    move |source| SegmentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SegmentLog {
    fn segment_path(dir: &Path, index: u64) -> PathBuf {
        dir.join(format!("{index:016x}.seg"))
    }

    /// Opens (creating) the log in `dir`. `base` is the bookmark the log
    /// starts after (the first record's `previous`).
    pub fn open(
        dir: &Path,
        segment_bytes: u64,
        base: Bookmark,
    ) -> Result<(SegmentLog, Recovery), SegmentError> {
        std::fs::create_dir_all(dir).map_err(io_at(dir))?;
        let mut indexes: Vec<u64> = std::fs::read_dir(dir)
            .map_err(io_at(dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                u64::from_str_radix(name.strip_suffix(".seg")?, 16).ok()
            })
            .collect();
        indexes.sort_unstable();
        let mut log = SegmentLog {
            dir: dir.to_path_buf(),
            segment_bytes,
            base,
            entries: Vec::new(),
            current: None,
            write_offset: 0,
            dirty: Vec::new(),
            durable: base,
        };
        let mut rec = Recovery::default();
        let mut cut = false;
        for (n, &index) in indexes.iter().enumerate() {
            let path = Self::segment_path(dir, index);
            if cut || index != n as u64 {
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
            loop {
                let rest = data.slice(at..);
                let ok = match Record::decode(&rest) {
                    Ok((r, used)) if r.previous == last => Some((r.bookmark, used)),
                    _ => None,
                };
                let Some((bookmark, used)) = ok else {
                    // Zero magic: the clean end. Anything else: a torn or
                    // corrupt tail, cut here.
                    let tail_is_zero = rest.iter().all(|&b| b == 0);
                    if !tail_is_zero {
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
                    segment: index,
                    offset: at as u64,
                    len: used as u64,
                });
                last = bookmark;
                rec.records += 1;
                at += used;
            }
            log.current = Some((index, file));
            log.write_offset = at as u64;
        }
        log.durable = log.last();
        Ok((log, rec))
    }

    /// The newest record's bookmark (or the base).
    pub fn last(&self) -> Bookmark {
        self.entries.last().map_or(self.base, |e| e.bookmark)
    }

    /// The newest bookmark made durable by `sync`.
    pub fn durable(&self) -> Bookmark {
        self.durable
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn roll(&mut self) -> Result<(), SegmentError> {
        let index = self.current.as_ref().map_or(0, |(i, _)| i + 1);
        let path = Self::segment_path(&self.dir, index);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_at(&path))?;
        file.set_len(self.segment_bytes).map_err(io_at(&path))?;
        if let Ok(d) = File::open(&self.dir) {
            d.sync_all().map_err(io_at(&self.dir))?;
        }
        self.current = Some((index, file));
        self.write_offset = 0;
        Ok(())
    }

    /// Appends one encoded record (not yet durable). It must follow the
    /// log: its `previous` is the log's last bookmark.
    pub fn append(&mut self, record: &Bytes) -> Result<(), SegmentError> {
        let (r, used) = Record::decode(record)?;
        let len = used as u64;
        if r.previous != self.last() {
            return Err(SegmentError::Discontinuous {
                previous: r.previous,
                last: self.last(),
            });
        }
        if len > self.segment_bytes {
            return Err(SegmentError::RecordTooLarge {
                len,
                segment_bytes: self.segment_bytes,
            });
        }
        if self.current.is_none() || self.write_offset + len > self.segment_bytes {
            self.roll()?;
        }
        let (index, file) = self.current.as_ref().ok_or_else(|| SegmentError::Io {
            path: self.dir.clone(),
            source: io::Error::other("no current segment"),
        })?;
        let index = *index;
        file.write_all_at(&record[..used], self.write_offset)
            .map_err(io_at(&Self::segment_path(&self.dir, index)))?;
        self.entries.push(Entry {
            bookmark: r.bookmark,
            segment: index,
            offset: self.write_offset,
            len,
        });
        self.write_offset += len;
        if self.dirty.last() != Some(&index) {
            self.dirty.push(index);
        }
        Ok(())
    }

    /// Makes every appended record durable; returns the durable bookmark.
    pub fn sync(&mut self) -> Result<Bookmark, SegmentError> {
        let upto = self.last();
        for index in std::mem::take(&mut self.dirty) {
            let path = Self::segment_path(&self.dir, index);
            match &self.current {
                Some((i, f)) if *i == index => f.sync_data().map_err(io_at(&path))?,
                _ => File::open(&path)
                    .and_then(|f| f.sync_data())
                    .map_err(io_at(&path))?,
            }
        }
        self.durable = upto;
        Ok(upto)
    }

    /// The encoded records after `after`, in order (catch-up).
    pub fn read_after(&self, after: Bookmark) -> Result<Vec<Bytes>, SegmentError> {
        let start = self.entries.partition_point(|e| e.bookmark <= after);
        let mut out = Vec::with_capacity(self.entries.len() - start);
        for e in &self.entries[start..] {
            let path = Self::segment_path(&self.dir, e.segment);
            let file = File::open(&path).map_err(io_at(&path))?;
            let mut buf = vec![0u8; e.len as usize];
            file.read_exact_at(&mut buf, e.offset)
                .map_err(io_at(&path))?;
            out.push(Bytes::from(buf));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bookmark::{Epoch, Sequence};

    fn b(s: u64) -> Bookmark {
        Bookmark::new(Epoch(1), Sequence(s))
    }

    fn rec(s: u64) -> Bytes {
        Record {
            bookmark: b(s),
            previous: b(s - 1),
            page_size: 512,
            db_pages: 3,
            pages: vec![
                (1, Bytes::from(vec![s as u8; 512])),
                (3, Bytes::from(vec![1u8; 512])),
            ],
        }
        .encode()
        .expect("encode")
    }

    const SEG: u64 = 4 * 1024; // about three records a segment

    #[test]
    fn appended_records_survive_reopen_across_segments() {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = SegmentLog::open(dir.path(), SEG, b(0)).expect("open");
        for s in 1..=10 {
            log.append(&rec(s)).expect("append");
        }
        assert_eq!(log.sync().expect("sync"), b(10));
        drop(log);
        let (log, r) = SegmentLog::open(dir.path(), SEG, b(0)).expect("reopen");
        assert_eq!(r.records, 10);
        assert_eq!(log.last(), b(10));
        let after = log.read_after(b(6)).expect("catch up");
        assert_eq!(after.len(), 4);
        assert_eq!(after[0], rec(7));
    }

    #[test]
    fn a_torn_tail_is_cut_and_the_log_goes_on_from_before_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = SegmentLog::open(dir.path(), SEG, b(0)).expect("open");
        for s in 1..=5 {
            log.append(&rec(s)).expect("append");
        }
        log.sync().expect("sync");
        let last = log.entries.last().copied().expect("entry");
        drop(log);
        // Tear the last record: flip a byte in its pages.
        let path = SegmentLog::segment_path(dir.path(), last.segment);
        let f = OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open seg");
        f.write_all_at(&[0xee], last.offset + 100).expect("tear");
        let (mut log, r) = SegmentLog::open(dir.path(), SEG, b(0)).expect("reopen");
        assert_eq!(log.last(), b(4));
        assert!(r.cut_bytes > 0);
        log.append(&rec(5)).expect("append the refetched record");
        log.sync().expect("sync");
        let (log, r) = SegmentLog::open(dir.path(), SEG, b(0)).expect("reopen again");
        assert_eq!((log.last(), r.cut_bytes), (b(5), 0));
    }

    #[test]
    fn records_that_do_not_follow_the_log_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let (mut log, _) = SegmentLog::open(dir.path(), SEG, b(0)).expect("open");
        log.append(&rec(1)).expect("append");
        assert!(matches!(
            log.append(&rec(3)),
            Err(SegmentError::Discontinuous { .. })
        ));
        assert!(matches!(
            log.append(&Bytes::from_static(b"junk")),
            Err(SegmentError::Record(_))
        ));
    }
}
