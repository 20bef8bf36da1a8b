//! Page sets: what one committed transaction did to the database file.

use bytes::Bytes;
use std::fmt;

/// A 1-based database page number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PageNo(u32);

impl PageNo {
    pub const fn new(n: u32) -> PageNo {
        PageNo(n)
    }
    pub const fn get(self) -> u32 {
        self.0
    }
    /// Byte offset of this page in the database file.
    pub fn file_offset(self, page_size: u32) -> u64 {
        (u64::from(self.0).saturating_sub(1)) * u64::from(page_size)
    }
}

impl fmt::Display for PageNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A 1-based frame number in one generation (salt pair) of a WAL file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FrameNo(u32);

impl FrameNo {
    pub const fn new(n: u32) -> FrameNo {
        FrameNo(n)
    }
    pub const fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for FrameNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Where a captured transaction sits in the primary's local WAL. Purely
/// informational outside the VFS (the engine uses it to size checkpoints); a
/// page set is position-independent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalPosition {
    pub salt: [u32; 2],
    pub first_frame: FrameNo,
    pub commit_frame: FrameNo,
}

/// One committed transaction: the final image of every page it wrote, and the
/// database size after commit. Applying the pages and then truncating the
/// file to `db_size_pages` turns the database as it was before the
/// transaction into the database as it was after it.
///
/// Page images share one reference-counted buffer (copied once out of
/// SQLite's write calls); cloning a page set or a page copies no page bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageSet {
    page_size: u32,
    db_size_pages: u32,
    /// Sorted by page number, no duplicates, every page `<= db_size_pages`,
    /// every image exactly `page_size` bytes.
    pages: Vec<(PageNo, Bytes)>,
}

/// A page set that breaks the invariants above.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PageSetError {
    #[error("page size {0} is not a power of two in 512..=65536")]
    PageSize(u32),
    #[error("pages are not strictly increasing at page {0}")]
    Order(PageNo),
    #[error("page {page} is beyond the database size of {db_size_pages} pages")]
    BeyondEnd { page: PageNo, db_size_pages: u32 },
    #[error("page {page} image is {len} bytes, expected {page_size}")]
    ImageSize {
        page: PageNo,
        len: usize,
        page_size: u32,
    },
    #[error("page number 0 is invalid")]
    PageZero,
}

impl PageSet {
    /// Builds a page set, checking every invariant.
    pub fn new(
        page_size: u32,
        db_size_pages: u32,
        pages: Vec<(PageNo, Bytes)>,
    ) -> Result<PageSet, PageSetError> {
        if !(512..=65536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(PageSetError::PageSize(page_size));
        }
        let mut prev = 0u32;
        for (no, image) in &pages {
            if no.get() == 0 {
                return Err(PageSetError::PageZero);
            }
            if no.get() <= prev {
                return Err(PageSetError::Order(*no));
            }
            if no.get() > db_size_pages {
                return Err(PageSetError::BeyondEnd {
                    page: *no,
                    db_size_pages,
                });
            }
            if image.len() != page_size as usize {
                return Err(PageSetError::ImageSize {
                    page: *no,
                    len: image.len(),
                    page_size,
                });
            }
            prev = no.get();
        }
        Ok(PageSet {
            page_size,
            db_size_pages,
            pages,
        })
    }

    pub fn page_size(&self) -> u32 {
        self.page_size
    }
    pub fn db_size_pages(&self) -> u32 {
        self.db_size_pages
    }
    pub fn pages(&self) -> &[(PageNo, Bytes)] {
        &self.pages
    }
    pub fn len(&self) -> usize {
        self.pages.len()
    }
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }
    /// Total bytes of page images.
    pub fn payload_bytes(&self) -> usize {
        self.pages.len() * self.page_size as usize
    }
}

/// A transaction the VFS captured, as handed to the [`crate::CaptureSink`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapturedTransaction {
    pub pages: PageSet,
    pub wal: WalPosition,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(byte: u8) -> Bytes {
        Bytes::from(vec![byte; 512])
    }

    #[test]
    fn page_set_accepts_sorted_pages_within_the_database() {
        let ps = PageSet::new(
            512,
            3,
            vec![(PageNo::new(1), page(1)), (PageNo::new(3), page(3))],
        )
        .expect("valid");
        assert_eq!(ps.len(), 2);
        assert_eq!(ps.payload_bytes(), 1024);
    }

    #[test]
    fn page_set_rejects_each_broken_invariant() {
        let p = |n| PageNo::new(n);
        assert_eq!(
            PageSet::new(1000, 1, vec![]),
            Err(PageSetError::PageSize(1000))
        );
        assert_eq!(
            PageSet::new(512, 3, vec![(p(2), page(0)), (p(2), page(0))]),
            Err(PageSetError::Order(p(2)))
        );
        assert!(matches!(
            PageSet::new(512, 1, vec![(p(2), page(0))]),
            Err(PageSetError::BeyondEnd { .. })
        ));
        assert!(matches!(
            PageSet::new(512, 1, vec![(p(1), Bytes::from_static(b"x"))]),
            Err(PageSetError::ImageSize { .. })
        ));
        assert_eq!(
            PageSet::new(512, 1, vec![(p(0), page(0))]),
            Err(PageSetError::PageZero)
        );
    }
}
