//! Segment files a log no longer needs, unlinked after the caller has
//! dropped its locks.
//!
//! Unlinking a large segment and syncing its directory takes milliseconds
//! on a busy disk (3-35 ms each on the test machine while five followers
//! released together). A follower that did it under its database's lock,
//! or the shared log's, stalled every append behind it, and with every
//! follower releasing at once, commits stalled for tens of milliseconds.
//! So a release takes segments out of the log's index under the lock and
//! hands back an [`Unlink`] for the caller to run without it.
//!
//! Safe at any moment: everything that made the files unneeded (a
//! release marker, a base entry) is durable before they are handed over;
//! nothing reads a segment that left the index (a read plan on it fails
//! as on any deleted segment); no new segment takes a handed-over index;
//! and a file that outlives a crash is found unneeded again at the next
//! open.
//!
//! A segment log's released segments may instead be renamed into its pool
//! of segments for reuse ([`crate::recycle`]), while the pool has room:
//! the same move as an unlink for everything that reads by segment name.

use crate::recycle;
use crate::segments::SegmentError;
use std::fs::File;
use std::io;
use std::path::PathBuf;

/// Files to unlink, then their directory to sync ([`Unlink::run`]).
#[derive(Debug, Default)]
#[must_use = "the files are unlinked only by `run`"]
pub struct Unlink {
    dir: PathBuf,
    /// Each file, and the pool name it may be recycled under instead.
    files: Vec<(PathBuf, Option<PathBuf>)>,
}

impl Unlink {
    /// `files`, all in `dir`, each with the pool name it is renamed to
    /// instead while the pool holds fewer than [`recycle::MAX_FREE`]
    /// (None: always unlinked).
    pub(crate) fn recycling(dir: PathBuf, files: Vec<(PathBuf, Option<PathBuf>)>) -> Unlink {
        Unlink { dir, files }
    }

    /// Nothing to unlink.
    pub fn none() -> Unlink {
        Unlink::default()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// Files to unlink.
    pub fn len(&self) -> usize {
        self.files.len()
    }

    /// Unlinks the files (one already gone is fine), or renames those
    /// that may be recycled into the pool while it has room, and syncs
    /// their directory. On an error the rest are still tried; what is left
    /// is found unneeded and removed by the next open.
    pub fn run(self) -> Result<(), SegmentError> {
        if self.files.is_empty() {
            return Ok(());
        }
        let mut room = if self.files.iter().any(|(_, to)| to.is_some()) {
            // Unknown (unreadable directory): no room, every file goes.
            recycle::MAX_FREE
                .saturating_sub(recycle::list(&self.dir).map_or(usize::MAX, |l| l.len()))
        } else {
            0
        };
        let mut first_error = None;
        for (path, to) in self.files {
            if let Some(to) = to.filter(|_| room > 0) {
                match std::fs::rename(&path, &to) {
                    Ok(()) => {
                        room -= 1;
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(_) => {} // unlinked instead
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    first_error.get_or_insert(SegmentError::Io { path, source });
                }
            }
        }
        let synced = File::open(&self.dir).and_then(|d| d.sync_all());
        if let Some(e) = first_error {
            return Err(e);
        }
        synced.map_err(|source| SegmentError::Io {
            path: self.dir,
            source,
        })
    }

    /// [`Unlink::run`], an error logged (nothing is lost by one: the next
    /// open removes what is left).
    pub fn run_logged(self) {
        if let Err(err) = self.run() {
            tracing::error!(%err, "a released segment was not unlinked; the next open removes it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_unlinks_every_file_and_tolerates_one_already_gone() {
        let dir = tempfile::tempdir().expect("dir");
        let a = dir.path().join("a.seg");
        let b = dir.path().join("b.seg");
        std::fs::write(&a, b"a").expect("write");
        let files = vec![(a.clone(), None), (b.clone(), None)];
        let unlink = Unlink::recycling(dir.path().to_path_buf(), files);
        assert_eq!(unlink.len(), 2);
        unlink.run().expect("b was never there: fine");
        assert!(!a.exists());
        Unlink::none().run().expect("nothing to do");
    }

    #[test]
    fn run_recycles_into_the_pool_while_it_has_room_and_unlinks_the_rest() {
        let dir = tempfile::tempdir().expect("dir");
        let seg = |i: u64| dir.path().join(format!("{i:016x}.seg"));
        for i in 1..=4 {
            std::fs::write(seg(i), b"old").expect("write");
        }
        let files = (1..=4)
            .map(|i| (seg(i), (i != 2).then(|| recycle::free_path(dir.path(), i))))
            .collect();
        Unlink::recycling(dir.path().to_path_buf(), files)
            .run()
            .expect("run");
        assert!((1..=4).all(|i| !seg(i).exists()), "every segment left");
        assert!(recycle::free_path(dir.path(), 1).exists(), "recycled");
        assert!(!recycle::free_path(dir.path(), 2).exists(), "not eligible");
        assert!(recycle::free_path(dir.path(), 3).exists(), "recycled");
        assert!(
            !recycle::free_path(dir.path(), 4).exists(),
            "the pool was full: unlinked"
        );
    }
}
