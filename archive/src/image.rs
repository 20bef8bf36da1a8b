//! A database image being built page by page: from snapshot parts and
//! then log records, applied in history order. Used by restores (into a
//! temporary file renamed into place when complete) and by the archiver
//! (its working copy of the database at the archived end, from which it
//! cuts snapshots).

use crate::error::RestoreError;
use crate::snapshot::Part;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use walrelay_replicator::{Encoded, Record};

/// Log pages gathered before they are written: the newest image of each
/// page, and the database's size along the way. Writing each page once, in
/// page order, is several times faster than writing every record's pages
/// as they come (hot pages such as page 1 are in nearly every record).
/// Holds slices of the decoded log objects: at most the log being applied.
#[derive(Debug, Default)]
pub struct Gathered {
    pages: BTreeMap<u32, Bytes>,
    /// The smallest size a transaction left the database at: pages of the
    /// image past it are gone, whatever later transactions grow back.
    min_pages: Option<u32>,
    /// The size after the last complete transaction.
    db_pages: Option<u32>,
}

impl Gathered {
    /// Takes one record's pages, checking its page size against
    /// `page_size`, the database's (the first record of a database of no
    /// pages, `base_pages` being its size before the log, sets it).
    pub(crate) fn take(
        &mut self,
        encoded: &Encoded,
        page_size: &mut u32,
        base_pages: u32,
    ) -> Result<(), RestoreError> {
        let r: Record = encoded.record().map_err(|source| RestoreError::Format {
            key: format!("record {}", encoded.bookmark),
            source: crate::error::FormatError::Record {
                what: "log object",
                source,
            },
        })?;
        if r.page_size != *page_size {
            if base_pages == 0 && self.pages.is_empty() {
                *page_size = r.page_size;
            } else {
                return Err(RestoreError::Format {
                    key: format!("record {}", r.bookmark),
                    source: crate::error::FormatError::Invalid {
                        what: "log object",
                        why: "a record's page size differs from the database's",
                    },
                });
            }
        }
        for (page_no, image) in r.pages {
            self.pages.insert(page_no, image);
        }
        if !encoded.continued() {
            self.db_pages = Some(r.db_pages);
            self.min_pages = Some(self.min_pages.map_or(r.db_pages, |m| m.min(r.db_pages)));
            // Pages past a shrink are gone (a later growth rewrites them).
            self.pages.split_off(&(r.db_pages + 1));
        }
        Ok(())
    }

    /// The database's size after the last complete transaction taken, if
    /// any.
    pub(crate) fn db_pages(&self) -> Option<u32> {
        self.db_pages
    }

    /// The smallest size a transaction taken left the database at.
    pub(crate) fn min_pages(&self) -> Option<u32> {
        self.min_pages
    }

    /// The newest image of each page from `first` through `last`, in page
    /// order.
    pub(crate) fn pages_in(&self, first: u32, last: u32) -> impl Iterator<Item = (u32, &Bytes)> {
        self.pages.range(first..=last).map(|(p, b)| (*p, b))
    }
}

/// The most one write asks of the kernel: a snapshot part is laid down,
/// and a run of gathered pages written, in writes of this size. One 16 MiB
/// write was several times slower on this kernel, and made the 4 KiB log
/// writes on top of it slower still (papers/lifecycle.md).
pub(crate) const WRITE_BYTES: usize = 64 << 10;

/// The most one read asks of the kernel: a part's pages are read back in
/// reads of this size, and so is an object of a store on the local
/// filesystem (`store`; its puts are written in [`WRITE_BYTES`]).
///
/// An image is built and read beside durability followers (the archiver's
/// snapshots) on a kernel that may not preempt its own code (the usual
/// server configuration, `PREEMPT_NONE`): a thread inside a read or a
/// write holds its CPU until the call returns, whatever its scheduling
/// class, and a commit's threads woken for that CPU wait. A 16 MiB read
/// from the page cache held a CPU for about a millisecond on the test
/// machine; a 256 KiB one for tens of microseconds (papers/performance.md,
/// lever 70).
pub(crate) const READ_BYTES: usize = 256 << 10;

/// A page file: page `n` (1-based) at byte `(n - 1) * page_size`.
#[derive(Debug)]
pub struct Image {
    file: File,
    path: PathBuf,
    page_size: u32,
    db_pages: u32,
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> RestoreError + '_ {
    move |source| RestoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Image {
    /// Creates (or empties) the image at `path`.
    pub fn create(path: &Path, page_size: u32, db_pages: u32) -> Result<Image, RestoreError> {
        let image = Image::with(path, page_size, db_pages, true)?;
        image
            .file
            .set_len(u64::from(db_pages) * u64::from(page_size))
            .map_err(io(path))?;
        Ok(image)
    }

    /// Opens an existing image of `db_pages` pages.
    pub fn open(path: &Path, page_size: u32, db_pages: u32) -> Result<Image, RestoreError> {
        Image::with(path, page_size, db_pages, false)
    }

    fn with(
        path: &Path,
        page_size: u32,
        db_pages: u32,
        create: bool,
    ) -> Result<Image, RestoreError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(create)
            .open(path)
            .map_err(io(path))?;
        Ok(Image {
            file,
            path: path.to_path_buf(),
            page_size,
            db_pages,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn page_size(&self) -> u32 {
        self.page_size
    }

    pub fn db_pages(&self) -> u32 {
        self.db_pages
    }

    /// Writes a snapshot part's pages (parts may be written from several
    /// threads at once: they touch disjoint ranges).
    pub fn write_part(&self, part: &Part) -> Result<(), RestoreError> {
        let at = u64::from(part.first_page - 1) * u64::from(self.page_size);
        self.write_at(&part.pages, at)
    }

    /// Writes `bytes` at `at` in writes of at most [`WRITE_BYTES`].
    fn write_at(&self, bytes: &[u8], at: u64) -> Result<(), RestoreError> {
        for (i, chunk) in bytes.chunks(WRITE_BYTES).enumerate() {
            self.file
                .write_all_at(chunk, at + (i * WRITE_BYTES) as u64)
                .map_err(io(&self.path))?;
        }
        Ok(())
    }

    /// Takes one record's pages into `g` (nothing is written yet); the
    /// first record of an empty image may set its page size.
    pub fn gather(&mut self, g: &mut Gathered, encoded: &Encoded) -> Result<(), RestoreError> {
        g.take(encoded, &mut self.page_size, self.db_pages)
    }

    /// Writes what `g` gathered: the image cut to the smallest size it went
    /// through, every page once in page order (runs of adjacent pages of up
    /// to 1 MiB, each in writes of `WRITE_BYTES` (64 KiB)), then its final size.
    pub fn write_gathered(&mut self, g: Gathered) -> Result<(), RestoreError> {
        if let Some(min) = g.min_pages.filter(|m| *m < self.db_pages) {
            self.set_pages(min)?;
        }
        let ps = u64::from(self.page_size);
        let mut run: Vec<u8> = Vec::with_capacity(1 << 20);
        let mut run_start = 0u32;
        let mut next = 0u32;
        for (page_no, image) in g.pages {
            if !run.is_empty() && (page_no != next || run.len() + image.len() > 1 << 20) {
                self.write_at(&run, u64::from(run_start - 1) * ps)?;
                run.clear();
            }
            if run.is_empty() {
                run_start = page_no;
            }
            run.extend_from_slice(&image);
            next = page_no + 1;
        }
        if !run.is_empty() {
            self.write_at(&run, u64::from(run_start - 1) * ps)?;
        }
        if let Some(n) = g.db_pages {
            self.set_pages(n)?;
        }
        Ok(())
    }

    fn set_pages(&mut self, db_pages: u32) -> Result<(), RestoreError> {
        self.file
            .set_len(u64::from(db_pages) * u64::from(self.page_size))
            .map_err(io(&self.path))?;
        self.db_pages = db_pages;
        Ok(())
    }

    /// `count` pages from page `first`, in reads of at most
    /// `READ_BYTES` (256 KiB).
    pub fn read_pages(&self, first: u32, count: u32) -> Result<Vec<u8>, RestoreError> {
        let mut buf = vec![0u8; count as usize * self.page_size as usize];
        let at = u64::from(first.max(1) - 1) * u64::from(self.page_size);
        for (i, chunk) in buf.chunks_mut(READ_BYTES).enumerate() {
            self.file
                .read_exact_at(chunk, at + (i * READ_BYTES) as u64)
                .map_err(io(&self.path))?;
        }
        Ok(buf)
    }
}
