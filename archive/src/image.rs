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

/// Bytes per write when a snapshot part is laid down.
const WRITE_BYTES: usize = 64 << 10;

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
        // In 64 KiB writes: one 16 MiB pwrite was several times slower on
        // this kernel, and made the 4 KiB log writes on top of it slower
        // still (papers/lifecycle.md).
        for (i, chunk) in part.pages.chunks(WRITE_BYTES).enumerate() {
            self.file
                .write_all_at(chunk, at + (i * WRITE_BYTES) as u64)
                .map_err(io(&self.path))?;
        }
        Ok(())
    }

    /// Takes one record's pages into `g` (nothing is written yet).
    pub fn gather(&mut self, g: &mut Gathered, encoded: &Encoded) -> Result<(), RestoreError> {
        let r = self.decode_for(encoded, g.pages.is_empty())?;
        for (page_no, image) in r.pages {
            g.pages.insert(page_no, image);
        }
        if !encoded.continued() {
            g.db_pages = Some(r.db_pages);
            g.min_pages = Some(g.min_pages.map_or(r.db_pages, |m| m.min(r.db_pages)));
            // Pages past a shrink are gone (a later growth rewrites them).
            g.pages.split_off(&(r.db_pages + 1));
        }
        Ok(())
    }

    /// Writes what `g` gathered: the image cut to the smallest size it went
    /// through, every page once in page order (runs of adjacent pages in
    /// one write of up to 1 MiB), then its final size.
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
                self.file
                    .write_all_at(&run, u64::from(run_start - 1) * ps)
                    .map_err(io(&self.path))?;
                run.clear();
            }
            if run.is_empty() {
                run_start = page_no;
            }
            run.extend_from_slice(&image);
            next = page_no + 1;
        }
        if !run.is_empty() {
            self.file
                .write_all_at(&run, u64::from(run_start - 1) * ps)
                .map_err(io(&self.path))?;
        }
        if let Some(n) = g.db_pages {
            self.set_pages(n)?;
        }
        Ok(())
    }

    /// Decodes a record, checking its page size against the image's (the
    /// first record of an empty image sets it).
    fn decode_for(&mut self, encoded: &Encoded, may_adopt: bool) -> Result<Record, RestoreError> {
        let r: Record = encoded.record().map_err(|source| RestoreError::Format {
            key: format!("record {}", encoded.bookmark),
            source: crate::error::FormatError::Record {
                what: "log object",
                source,
            },
        })?;
        if r.page_size != self.page_size {
            if self.db_pages == 0 && may_adopt {
                self.page_size = r.page_size;
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
        Ok(r)
    }

    fn set_pages(&mut self, db_pages: u32) -> Result<(), RestoreError> {
        self.file
            .set_len(u64::from(db_pages) * u64::from(self.page_size))
            .map_err(io(&self.path))?;
        self.db_pages = db_pages;
        Ok(())
    }

    /// `count` pages from page `first`.
    pub fn read_pages(&self, first: u32, count: u32) -> Result<Vec<u8>, RestoreError> {
        let mut buf = vec![0u8; count as usize * self.page_size as usize];
        self.file
            .read_exact_at(
                &mut buf,
                u64::from(first.max(1) - 1) * u64::from(self.page_size),
            )
            .map_err(io(&self.path))?;
        Ok(buf)
    }

    /// Makes the image durable.
    pub fn sync(&self) -> Result<(), RestoreError> {
        self.file.sync_all().map_err(io(&self.path))
    }
}
