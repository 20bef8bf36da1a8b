//! Group commit through io_uring: positional writes and an fdatasync of each
//! written file in one `io_uring_enter`, each sync linked behind its file's
//! writes so it runs only once they have all fully succeeded. A file with
//! one write to make durable (the common case: a group of records is one
//! contiguous writev) gets no separate fsync: its write carries
//! `RWF_DSYNC`, which makes that range durable before the write completes
//! (fdatasync's guarantee for the bytes written), one request instead of
//! two linked ones.
//!
//! `SyncRing::new` fails where io_uring is unavailable (old kernel, seccomp,
//! the `kernel.io_uring_disabled` sysctl); callers then fall back to
//! `pwrite` + `fdatasync`.
//!
//! Invariant that makes the `unsafe` sound: `write_and_sync` never returns
//! while the kernel still holds a request, so the buffers and descriptors
//! borrowed for the call outlive every request that points at them.

use io_uring::{IoUring, opcode, squeue, types};
use std::collections::VecDeque;
use std::fmt;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, BorrowedFd};

/// The kernel's `UIO_MAXIOV`: a writev of more iovecs fails with EINVAL.
const MAX_IOVECS: usize = 1024;
/// `IORING_ENTER_GETEVENTS` (the crate's own constant is private).
const ENTER_GETEVENTS: u32 = 1;

/// One io_uring instance for batched write + fdatasync. Not shared: calls
/// take `&mut self`, so one batch at a time owns the whole ring.
pub struct SyncRing {
    ring: IoUring,
    /// Set when a submission failed with SQEs still queued: entering the
    /// ring again would submit them after their buffers are gone.
    broken: bool,
}

impl fmt::Debug for SyncRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SyncRing")
            .field("sq_entries", &self.ring.params().sq_entries())
            .field("broken", &self.broken)
            .finish()
    }
}

enum Op<'a> {
    /// `iov[start..]` is what is left to write at `offset`.
    Write {
        offset: u64,
        end: u64,
        iov: Vec<IoSlice<'a>>,
        start: usize,
        /// `RWF_DSYNC`: durable when it completes (it replaced a sync).
        dsync: bool,
    },
    Sync,
}

/// The operations on one file, run in order (linked); files run in parallel.
struct Chain<'a> {
    fd: BorrowedFd<'a>,
    ops: VecDeque<Op<'a>>,
}

fn chain_of<'c, 'a>(chains: &'c mut Vec<Chain<'a>>, fd: BorrowedFd<'a>) -> &'c mut Chain<'a> {
    let at = match chains
        .iter()
        .position(|c| c.fd.as_raw_fd() == fd.as_raw_fd())
    {
        Some(at) => at,
        None => {
            chains.push(Chain {
                fd,
                ops: VecDeque::new(),
            });
            chains.len() - 1
        }
    };
    &mut chains[at]
}

fn build_chains<'a>(
    writes: &[(BorrowedFd<'a>, u64, &'a [u8])],
    sync_fds: &[BorrowedFd<'a>],
) -> Vec<Chain<'a>> {
    let mut chains = Vec::new();
    for &(fd, offset, buf) in writes {
        if buf.is_empty() {
            continue;
        }
        let ops = &mut chain_of(&mut chains, fd).ops;
        // Back-to-back buffers (a group of records) become one writev.
        if let Some(Op::Write { end, iov, .. }) = ops.back_mut() {
            if *end == offset && iov.len() < MAX_IOVECS {
                iov.push(IoSlice::new(buf));
                *end += buf.len() as u64;
                continue;
            }
        }
        ops.push_back(Op::Write {
            offset,
            end: offset + buf.len() as u64,
            iov: vec![IoSlice::new(buf)],
            start: 0,
            dsync: false,
        });
    }
    for &fd in sync_fds {
        let ops = &mut chain_of(&mut chains, fd).ops;
        match ops.make_contiguous() {
            // A file's one write carries its sync. With more writes the
            // sync stays, since RWF_DSYNC covers only its own write's range.
            // So does it for bytes written to the file before this call:
            // every caller (the segment logs, the shared log, the group
            // syncer) syncs a file in the call that writes it, and a failed
            // sync breaks the log, so nothing unsynced is left behind for a
            // later sync to pick up.
            [Op::Write { dsync, .. }] => *dsync = true,
            [.., Op::Sync] => {}
            _ => ops.push_back(Op::Sync),
        }
    }
    chains
}

fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock | io::ErrorKind::ResourceBusy
    )
}

impl SyncRing {
    /// A ring with room for `entries` requests per submission (rounded up
    /// to a power of two by the kernel). Fails where io_uring is unusable.
    pub fn new(entries: u32) -> io::Result<SyncRing> {
        let ring = IoUring::new(entries)?;
        // NODROP came in 5.5, after linked requests (5.3) and the writev and
        // fsync opcodes (5.1): a kernel with it has everything used here.
        if !ring.params().is_feature_nodrop() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "io_uring too old (no IORING_FEAT_NODROP)",
            ));
        }
        Ok(SyncRing {
            ring,
            broken: false,
        })
    }

    /// Requests per submission; larger batches take several.
    pub fn capacity(&self) -> usize {
        self.ring.params().sq_entries() as usize
    }

    /// Writes each `(fd, offset, bytes)` and then fdatasyncs each of
    /// `sync_fds`, a file's sync only after all of its writes (given in
    /// order) have fully succeeded. A sync covers this call's writes; a
    /// file with a single write here gets that write made durable by
    /// itself (`RWF_DSYNC`), so bytes written to it earlier and not synced
    /// then are not covered. Returns the first error; on error some
    /// writes may have happened and nothing is known to be durable.
    pub fn write_and_sync(
        &mut self,
        writes: &[(BorrowedFd<'_>, u64, &[u8])],
        sync_fds: &[BorrowedFd<'_>],
    ) -> io::Result<()> {
        if self.broken {
            return Err(io::Error::other(
                "io_uring ring unusable after a failed submission",
            ));
        }
        let mut chains = build_chains(writes, sync_fds);
        let capacity = self.capacity();
        loop {
            // One round: a prefix of each chain, as much as fits. A chain
            // cut by the ring size goes on next round, after this one has
            // completed, so its order holds across submissions.
            let mut sqes: Vec<squeue::Entry> = Vec::new();
            let mut taken = vec![0usize; chains.len()];
            for (chain, taken) in chains.iter().zip(taken.iter_mut()) {
                *taken = chain.ops.len().min(capacity - sqes.len());
                let fd = types::Fd(chain.fd.as_raw_fd());
                for (k, op) in chain.ops.iter().take(*taken).enumerate() {
                    let sqe = match op {
                        Op::Write {
                            offset,
                            iov,
                            start,
                            dsync,
                            ..
                        } => {
                            let rest = &iov[*start..];
                            let flags = if *dsync { libc::RWF_DSYNC } else { 0 };
                            // IoSlice is ABI-compatible with iovec on Unix.
                            // A short dsync write made what it wrote durable;
                            // its remainder goes again with the same flag.
                            opcode::Writev::new(fd, rest.as_ptr().cast(), rest.len() as u32)
                                .offset(*offset)
                                .rw_flags(flags)
                                .build()
                        }
                        Op::Sync => opcode::Fsync::new(fd)
                            .flags(types::FsyncFlags::DATASYNC)
                            .build(),
                    };
                    // A failed or short write cancels the rest of the chain.
                    let sqe = if k + 1 < *taken {
                        sqe.flags(squeue::Flags::IO_LINK)
                    } else {
                        sqe
                    };
                    sqes.push(sqe.user_data(sqes.len() as u64));
                }
            }
            if sqes.is_empty() {
                return Ok(());
            }
            let results = self.run(&sqes)?;
            let mut results = results.into_iter();
            let mut first_error = None;
            for (chain, taken) in chains.iter_mut().zip(taken) {
                let mut failed = false;
                for res in results.by_ref().take(taken) {
                    // After a short or failed op the rest were cancelled
                    // (or, if not, are harmless to repeat): stay put.
                    if failed {
                        continue;
                    }
                    let Some(op) = chain.ops.front_mut() else {
                        continue;
                    };
                    if res < 0 {
                        first_error.get_or_insert(io::Error::from_raw_os_error(-res));
                        failed = true;
                        continue;
                    }
                    match op {
                        Op::Sync => {}
                        Op::Write {
                            offset, iov, start, ..
                        } => {
                            let n = res as usize;
                            if n == 0 {
                                first_error.get_or_insert(io::ErrorKind::WriteZero.into());
                                failed = true;
                                continue;
                            }
                            let mut rest = &mut iov[*start..];
                            IoSlice::advance_slices(&mut rest, n);
                            let left = rest.len();
                            *start = iov.len() - left;
                            *offset += n as u64;
                            if left > 0 {
                                failed = true; // short: resubmit the remainder
                                continue;
                            }
                        }
                    }
                    chain.ops.pop_front();
                }
            }
            if let Some(e) = first_error {
                return Err(e);
            }
        }
    }

    /// Submits `sqes` (at most `capacity`, the ring idle) and returns each
    /// one's result, indexed by its user_data. Returns only once the kernel
    /// has completed every request it took.
    fn run(&mut self, sqes: &[squeue::Entry]) -> io::Result<Vec<i32>> {
        let n = sqes.len();
        // SAFETY: the entries point at iovec arrays and buffers borrowed by
        // `write_and_sync` for the whole call and not touched until it has
        // the results, and at descriptors it borrows too; this function
        // returns only after every request the kernel took has completed
        // (and a failed submission marks the ring broken so queued entries
        // are never entered), so nothing points at them after the call.
        unsafe { self.ring.submission().push_multiple(sqes) }
            .map_err(|_| io::Error::other("io_uring submission queue not empty"))?;
        let mut results = vec![None; n];
        let mut done = 0;
        while done < n {
            if let Err(e) = self.ring.submit_and_wait(n - done) {
                if !retryable(&e) {
                    self.broken = true;
                    let queued = self.ring.submission().len();
                    self.wait_for(&mut results, &mut done, n - queued);
                    return Err(e);
                }
            }
            self.reap(&mut results, &mut done);
        }
        Ok(results.into_iter().map(|r| r.unwrap_or(0)).collect())
    }

    fn reap(&mut self, results: &mut [Option<i32>], done: &mut usize) {
        for cqe in self.ring.completion() {
            if let Some(slot) = results.get_mut(cqe.user_data() as usize) {
                if slot.replace(cqe.result()).is_none() {
                    *done += 1;
                }
            }
        }
    }

    /// After a failed submission: waits, without submitting what is still
    /// queued, until the `taken` requests the kernel did take complete.
    fn wait_for(&mut self, results: &mut [Option<i32>], done: &mut usize, taken: usize) {
        self.reap(results, done);
        while *done < taken {
            let want = (taken - *done) as u32;
            // SAFETY: to_submit 0 only waits (queued entries stay unsent)
            // and no argument pointer is passed.
            let waited = unsafe {
                self.ring
                    .submitter()
                    .enter::<()>(0, want, ENTER_GETEVENTS, None)
            };
            if let Err(e) = waited {
                if !retryable(&e) {
                    // The kernel may still read the caller's buffers and we
                    // cannot wait for it: returning would be unsound.
                    std::process::abort();
                }
            }
            self.reap(results, done);
        }
    }
}

/// Whether this is CI's run (`CI=true`), where a test that cannot run
/// its subject fails instead of skipping.
#[cfg(test)]
pub(crate) fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// What needed io_uring, or None where io_uring is unavailable (the test
/// then does `skipping`); under CI=true that fails the test instead.
#[cfg(test)]
pub(crate) fn available_or_skip<T>(made: io::Result<T>, skipping: &str) -> Option<T> {
    match made {
        Ok(t) => Some(t),
        Err(e) if under_ci() => panic!("io_uring is unavailable under CI=true: {e}"),
        Err(e) => {
            eprintln!("io_uring unavailable ({e}): {skipping}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::{File, OpenOptions};
    use std::os::fd::AsFd;

    fn ring_or_skip(entries: u32) -> Option<SyncRing> {
        available_or_skip(SyncRing::new(entries), "skipped")
    }

    fn rw(path: &std::path::Path) -> File {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .expect("open")
    }

    #[test]
    fn batches_larger_than_the_ring_are_split_in_order() {
        let Some(mut ring) = ring_or_skip(4) else {
            return;
        };
        assert_eq!(ring.capacity(), 4);
        let dir = tempfile::tempdir().expect("tmp");
        let (a, b) = (rw(&dir.path().join("a")), rw(&dir.path().join("b")));
        let chunks: Vec<Vec<u8>> = (0..40u8).map(|i| vec![i; 100 + i as usize]).collect();
        let mut writes = Vec::new();
        let mut expect_a = Vec::new();
        let mut expect_b = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            if i % 3 == 0 {
                // Gaps, so these do not merge into one writev.
                let at = expect_b.len() as u64 + 7;
                expect_b.resize(at as usize, 0);
                writes.push((b.as_fd(), at, &c[..]));
                expect_b.extend_from_slice(c);
            } else {
                writes.push((a.as_fd(), expect_a.len() as u64, &c[..]));
                expect_a.extend_from_slice(c);
            }
        }
        // A later write over an earlier one: order within a file holds.
        writes.push((a.as_fd(), 0, b"over"));
        expect_a[..4].copy_from_slice(b"over");
        ring.write_and_sync(&writes, &[a.as_fd(), b.as_fd()])
            .expect("write and sync");
        assert_eq!(std::fs::read(dir.path().join("a")).expect("a"), expect_a);
        assert_eq!(std::fs::read(dir.path().join("b")).expect("b"), expect_b);
        // The ring is idle again and reusable.
        ring.write_and_sync(&[(a.as_fd(), 0, b"again")], &[a.as_fd()])
            .expect("again");
        assert_eq!(
            &std::fs::read(dir.path().join("a")).expect("a")[..5],
            b"again"
        );
    }

    #[test]
    fn a_files_single_write_carries_its_sync_and_several_writes_keep_it() {
        let dir = tempfile::tempdir().expect("tmp");
        let (a, b) = (rw(&dir.path().join("a")), rw(&dir.path().join("b")));
        // a: two contiguous buffers, one writev, then its sync;
        // b: two writes with a gap between them, then its sync.
        let writes = [
            (a.as_fd(), 0, &b"one"[..]),
            (a.as_fd(), 3, &b"two"[..]),
            (b.as_fd(), 0, &b"x"[..]),
            (b.as_fd(), 9, &b"y"[..]),
        ];
        let chains = build_chains(&writes, &[a.as_fd(), b.as_fd()]);
        let shape = |c: &Chain<'_>| -> Vec<&str> {
            c.ops
                .iter()
                .map(|op| match op {
                    Op::Write { dsync: true, .. } => "write+dsync",
                    Op::Write { dsync: false, .. } => "write",
                    Op::Sync => "sync",
                })
                .collect()
        };
        assert_eq!(shape(&chains[0]), ["write+dsync"]);
        assert_eq!(shape(&chains[1]), ["write", "write", "sync"]);
        // A file synced without a write keeps its sync.
        let chains = build_chains(&[], &[a.as_fd()]);
        assert_eq!(shape(&chains[0]), ["sync"]);
        if let Some(mut ring) = ring_or_skip(8) {
            ring.write_and_sync(&writes, &[a.as_fd(), b.as_fd()])
                .expect("write and sync");
            assert_eq!(std::fs::read(dir.path().join("a")).expect("a"), b"onetwo");
            assert_eq!(
                std::fs::read(dir.path().join("b")).expect("b"),
                b"x\0\0\0\0\0\0\0\0y"
            );
        }
    }

    #[test]
    fn more_contiguous_buffers_than_one_writev_takes() {
        let Some(mut ring) = ring_or_skip(2) else {
            return;
        };
        let dir = tempfile::tempdir().expect("tmp");
        let f = rw(&dir.path().join("f"));
        let bufs: Vec<[u8; 3]> = (0..3000u32)
            .map(|i| [i as u8, (i >> 8) as u8, 0xab])
            .collect();
        let writes: Vec<_> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| (f.as_fd(), 3 * i as u64, &b[..]))
            .collect();
        ring.write_and_sync(&writes, &[f.as_fd()]).expect("write");
        assert_eq!(
            std::fs::read(dir.path().join("f")).expect("f"),
            bufs.concat()
        );
    }

    #[test]
    fn the_first_error_is_returned_and_the_ring_stays_usable() {
        let Some(mut ring) = ring_or_skip(8) else {
            return;
        };
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("ro");
        std::fs::write(&path, b"x").expect("create");
        let ro = File::open(&path).expect("open read-only");
        let err = ring
            .write_and_sync(&[(ro.as_fd(), 0, b"nope")], &[ro.as_fd()])
            .expect_err("writing a read-only fd fails");
        assert_eq!(err.raw_os_error(), Some(9), "EBADF: {err}");
        let ok = rw(&dir.path().join("ok"));
        ring.write_and_sync(&[(ok.as_fd(), 0, b"fine")], &[ok.as_fd()])
            .expect("the ring still works");
    }
}
