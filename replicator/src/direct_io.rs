//! Appends to a preallocated segment through `O_DIRECT`, in whole blocks.
//!
//! Both logs append records of any length at any offset, but a direct
//! write must start and end on a block boundary, from a block-aligned
//! buffer. So a run of appended bytes goes to the disk as the blocks that
//! hold it: from the start of the block holding its first byte to the end
//! of the block holding its last. The bytes of the first block before the
//! run are already in the file; the log keeps them in memory (the
//! [`Tail`]) and writes them again, unchanged. The bytes after the run, to
//! the end of its last block, are written as zeros: past the log's end, a
//! preallocated segment holds zeros there already, a reused one its
//! earlier life (and anything there is past the end, which recovery never
//! keeps).
//!
//! ```text
//!  file   ...| block k                | block k+1              |...
//!            |<- tail ->|<- run bytes ---------->|               |
//!            ^ k*BLOCK  ^ run offset             ^ run end
//!  write     [ tail     | run bytes              | zeros         ]
//!            at k*BLOCK, (tail + run) rounded up to whole blocks
//! ```
//!
//! Why: a buffered write through io_uring is handed to a kernel worker
//! thread (ext4 cannot write buffered without blocking), and its
//! `RWF_DSYNC` then writes the page cache back; a direct write is issued
//! from the submitting thread and lands on the disk once. Measured on this
//! machine's virtio disk (`cargo bench -p walrelay-benches --bench
//! floors`, 9,000-byte appends alternated call by call; papers/
//! performance.md, lever 38): p50 0.81-0.88x, the process's CPU per call
//! 0.38-0.43x and its context switches 0.37-0.48x those of the buffered
//! form.
//!
//! Crash safety is that of the page cache: writing a page back rewrites
//! the whole page, earlier bytes included, as this does. A block torn by a
//! crash holds old or new sectors, and for the tail's bytes both are the
//! same.
//!
//! Where the filesystem refuses `O_DIRECT` (tmpfs, some FUSE
//! filesystems), or `WALRELAY_NO_DIRECT_IO` is set (non-empty and not
//! `0`), [`open`] gives no direct descriptor and the log writes through
//! the page cache as before; so does a run whose padded end would pass
//! the segment's end (a segment sized for one odd-sized record).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// The block a direct write is aligned to, in memory and in the file: a
/// page, which is at least the logical block size of every disk Linux
/// takes direct I/O on.
pub(crate) const BLOCK: u64 = 4096;

fn forbidden() -> bool {
    std::env::var_os("WALRELAY_NO_DIRECT_IO").is_some_and(|v| !v.is_empty() && v != "0")
}

/// A direct (`O_DIRECT`) write descriptor for `path`; `None` where the
/// filesystem refuses direct I/O or it is switched off.
pub(crate) fn open(path: &Path) -> io::Result<Option<File>> {
    if forbidden() || !cfg!(target_os = "linux") {
        return Ok(None);
    }
    #[cfg(target_os = "linux")]
    let flags = libc::O_DIRECT;
    #[cfg(not(target_os = "linux"))]
    let flags = 0;
    match OpenOptions::new()
        .write(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            tracing::debug!(path = %path.display(), "no O_DIRECT here: appends go through the page cache");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// The start of the block holding `offset`.
pub(crate) fn block_start(offset: u64) -> u64 {
    offset - offset % BLOCK
}

/// A segment file as a log writes it: its page-cache descriptor (reads,
/// syncs, and writes where a direct one cannot be used) and, where the
/// filesystem takes it, a direct one.
#[derive(Debug)]
pub(crate) struct SegFile {
    pub(crate) file: File,
    pub(crate) direct: Option<File>,
}

impl SegFile {
    /// `file`, opened read-write at `path`, with a direct descriptor.
    /// With one, the segment's pages are dropped from the page cache
    /// (the zeros its preallocation left there): direct writes bypass
    /// them, and would otherwise invalidate them a few at a time.
    pub(crate) fn new(file: File, path: &Path) -> io::Result<SegFile> {
        let direct = open(path)?;
        if direct.is_some() {
            advise(&file, 0, 0, Advice::DontNeed);
        }
        Ok(SegFile { file, direct })
    }
}

/// What [`advise`] tells the kernel about a file's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Advice {
    /// It is read in the pieces asked for: no readahead.
    Random,
    /// Its pages are not wanted in the page cache.
    DontNeed,
}

/// Advice to the kernel about `len` bytes of `file` from `offset` (0:
/// to the end), `posix_fadvise`. Advice only: it changes no file content
/// and no result, so a refusal is not reported; elsewhere than Linux it
/// does nothing.
pub(crate) fn advise(file: &File, offset: u64, len: u64, advice: Advice) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len))
        else {
            return;
        };
        let advice = match advice {
            Advice::Random => libc::POSIX_FADV_RANDOM,
            Advice::DontNeed => libc::POSIX_FADV_DONTNEED,
        };
        // SAFETY: posix_fadvise reads only its integer arguments; the file
        // descriptor belongs to `file`, which is open for the whole call.
        let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, advice) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len, advice);
}

/// The bytes of the block holding a log's end, before the end: what a
/// direct write of the next run rewrites first. Fewer than [`BLOCK`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tail(Vec<u8>);

impl Tail {
    /// The tail of `file` ending at `end`, read from the file.
    pub(crate) fn read(file: &File, end: u64) -> io::Result<Tail> {
        let mut bytes = vec![0u8; (end % BLOCK) as usize];
        file.read_exact_at(&mut bytes, block_start(end))?;
        Ok(Tail(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.0
    }

    /// The tail once `appended` is written after it (the log's end moves
    /// by its length).
    pub(crate) fn advance(&mut self, appended: &[u8]) {
        let keep = (self.0.len() + appended.len()) % BLOCK as usize;
        if keep <= appended.len() {
            self.0.clear();
            self.0.extend_from_slice(&appended[appended.len() - keep..]);
        } else {
            self.0.extend_from_slice(appended);
        }
        debug_assert_eq!(self.0.len(), keep);
    }
}

/// A block-aligned buffer of whole blocks: a run's tail, its bytes and
/// zeros to the end of its last block.
pub(crate) struct Padded {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for Padded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Padded({} bytes)", self.len)
    }
}

impl Padded {
    /// `tail`, then `parts` back to back, zero-padded to whole blocks.
    pub(crate) fn new(tail: &[u8], parts: &[&[u8]]) -> Padded {
        let used = tail.len() + parts.iter().map(|p| p.len()).sum::<usize>();
        let len = used.div_ceil(BLOCK as usize) * BLOCK as usize;
        // Over-allocated by a block, the aligned window taken inside: no
        // unsafe allocation needed. Only the bytes before the window and
        // the padding after the run are zeroed, not the whole buffer (it
        // was 5% of a follower ring's CPU with its `memset`, for a write
        // of a few pages per record).
        let mut raw: Vec<u8> = Vec::with_capacity(len + BLOCK as usize);
        let start = raw.as_ptr().align_offset(BLOCK as usize);
        assert!(start < BLOCK as usize, "a byte buffer can be aligned");
        raw.resize(start, 0);
        raw.extend_from_slice(tail);
        for p in parts {
            raw.extend_from_slice(p);
        }
        raw.resize(start + len, 0);
        // Filled within its capacity, so it never moved: still aligned.
        assert_eq!(raw[start..].as_ptr().align_offset(BLOCK as usize), 0);
        Padded { raw, start, len }
    }

    /// `len` zeros, rounded up to whole blocks.
    pub(crate) fn zeros(len: usize) -> Padded {
        Padded::new(&[], &[&vec![0u8; len]])
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

/// How one run of appended bytes (pieces back to back in one segment)
/// goes to the disk.
#[derive(Debug)]
pub(crate) enum RunWrite<'a> {
    /// Whole blocks through the direct descriptor, at a block start.
    Direct {
        file: &'a File,
        offset: u64,
        buf: Padded,
    },
    /// The pieces as they are, each at its offset, through the page cache.
    Buffered {
        file: &'a File,
        pieces: Vec<(u64, &'a [u8])>,
    },
}

impl<'a> RunWrite<'a> {
    /// The run `pieces` (each at its offset, back to back) of `seg`, a
    /// segment of `size` bytes whose content before the first piece in
    /// its block is `tail`: direct when `seg` has a direct descriptor and
    /// the padded run ends inside the segment, else buffered.
    pub(crate) fn plan(
        seg: &'a SegFile,
        size: u64,
        tail: &[u8],
        pieces: Vec<(u64, &'a [u8])>,
    ) -> RunWrite<'a> {
        let (Some(&(first, _)), Some(&(last, last_bytes))) = (pieces.first(), pieces.last()) else {
            return RunWrite::Buffered {
                file: &seg.file,
                pieces,
            };
        };
        assert_eq!(
            tail.len() as u64,
            first % BLOCK,
            "a run's tail is its block's bytes before it"
        );
        assert!(
            pieces
                .windows(2)
                .all(|w| w[0].0 + w[0].1.len() as u64 == w[1].0),
            "a run's pieces are back to back"
        );
        let padded_end = (last + last_bytes.len() as u64).div_ceil(BLOCK) * BLOCK;
        match &seg.direct {
            Some(file) if padded_end <= size => {
                let parts: Vec<&[u8]> = pieces.iter().map(|(_, b)| *b).collect();
                RunWrite::Direct {
                    file,
                    offset: block_start(first),
                    buf: Padded::new(tail, &parts),
                }
            }
            _ => RunWrite::Buffered {
                file: &seg.file,
                pieces,
            },
        }
    }

    /// The descriptor the run is written (and so synced) through.
    pub(crate) fn file(&self) -> &'a File {
        match self {
            RunWrite::Direct { file, .. } | RunWrite::Buffered { file, .. } => file,
        }
    }

    /// The writes: each offset and bytes, in order.
    pub(crate) fn writes(&self) -> Vec<(u64, &[u8])> {
        match self {
            RunWrite::Direct { offset, buf, .. } => vec![(*offset, buf.as_slice())],
            RunWrite::Buffered { pieces, .. } => pieces.clone(),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_bytes_of_the_ends_block() {
        let mut t = Tail::default();
        t.advance(&[1; 100]);
        assert_eq!(t.bytes(), &[1; 100][..]);
        t.advance(&[2; 4000]);
        assert_eq!(t.bytes().len(), 4100 - 4096);
        assert_eq!(t.bytes(), &[2; 4][..]);
        t.advance(&[3; 4092]);
        assert!(t.bytes().is_empty(), "the end sits on a block boundary");
        t.advance(&[4; 10_000]);
        assert_eq!(t.bytes(), &[4; 10_000 - 8192][..]);
    }

    #[test]
    fn a_padded_run_is_aligned_whole_blocks_of_tail_bytes_then_zeros() {
        let p = Padded::new(&[7; 10], &[&[9; 3000], &[9; 2000]]);
        let s = p.as_slice();
        assert_eq!(s.as_ptr() as usize % BLOCK as usize, 0);
        assert_eq!(s.len(), 8192);
        assert_eq!(&s[..10], &[7; 10][..]);
        assert_eq!(&s[10..5010], &[9; 5000][..]);
        assert!(s[5010..].iter().all(|&b| b == 0));
    }

    /// A segment file of `size` zeros in `dir`, open as a log opens it.
    fn zeroed_segment(dir: &Path, size: u64) -> (std::path::PathBuf, SegFile) {
        let path = dir.join("seg");
        std::fs::write(&path, vec![0u8; size as usize]).expect("write");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("open");
        let seg = SegFile::new(file, &path).expect("seg");
        (path, seg)
    }

    #[test]
    fn a_run_that_would_pad_past_the_segment_goes_through_the_page_cache() {
        let dir = tempfile::tempdir().expect("dir");
        let (_, seg) = zeroed_segment(dir.path(), 6000);
        let bytes = [5u8; 100];
        match RunWrite::plan(&seg, 6000, &[0; 904], vec![(5000, &bytes[..])]) {
            RunWrite::Buffered { pieces, .. } => assert_eq!(pieces, vec![(5000, &bytes[..])]),
            w => panic!("expected a buffered write, got {w:?}"),
        }
        if seg.direct.is_some() {
            match RunWrite::plan(&seg, 6000, &[0; 100], vec![(100, &bytes[..])]) {
                RunWrite::Direct { offset, buf, .. } => {
                    assert_eq!((offset, buf.as_slice().len()), (0, 4096))
                }
                w => panic!("expected a direct write, got {w:?}"),
            }
        }
    }

    #[test]
    fn direct_runs_rewrite_the_tail_and_leave_the_file_as_buffered_writes_would() {
        let dir = tempfile::tempdir().expect("dir");
        let size = 5 * BLOCK;
        let (path, seg) = zeroed_segment(dir.path(), size);
        if seg.direct.is_none() && crate::uring::under_ci() {
            panic!("CI's temporary directory must take O_DIRECT");
        }
        let mut expect = vec![0u8; size as usize];
        let (mut end, mut tail) = (0u64, Tail::default());
        for (i, len) in [1usize, 700, 4096, 3000, 5000, 1].into_iter().enumerate() {
            let bytes = vec![i as u8 + 1; len];
            let (a, b) = bytes.split_at(len / 2);
            let pieces = vec![(end, a), (end + a.len() as u64, b)];
            let w = RunWrite::plan(&seg, size, tail.bytes(), pieces);
            for (at, bytes) in w.writes() {
                w.file().write_all_at(bytes, at).expect("write");
            }
            expect[end as usize..end as usize + len].copy_from_slice(&bytes);
            end += len as u64;
            tail.advance(&bytes);
            assert_eq!(tail, Tail::read(&seg.file, end).expect("tail"));
        }
        seg.file.sync_data().expect("sync");
        assert_eq!(std::fs::read(&path).expect("read"), expect);
    }
}
