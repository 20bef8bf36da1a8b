//! Physical floors: what the hardware costs for the work a commit cannot
//! avoid, measured in the same run as the benchmarks so their results can
//! be reported as ratios to it rather than as machine-specific absolutes.
//!
//! - [`durable_overwrite`]: one `pwrite` + `fdatasync` into a preallocated
//!   file; [`concurrent_durable_overwrite`]: the W-th of N at once on one
//!   disk, buffered + `fdatasync` or as the followers write (`O_DIRECT`,
//!   `RWF_DSYNC`).
//! - [`loopback_round_trip`]: one request/reply over loopback TCP.
//! - [`quorum_floor`]: one of each, the least a quorum commit can cost.
//! - [`read_files`] and [`write_synced`]: reading given files in full and
//!   writing a file of a given size durably, the floor of a restore (the
//!   objects it fetches in, the database out); [`evict`] drops a file from
//!   the page cache first, for a cold read.
//! - [`zero_filled`] and [`process_usage`]: a preallocated file to write
//!   into, and the process's CPU time and context switches, for the
//!   floors here and in [`crate::append`].

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

/// Bytes written (and synced) before measuring, so overwrites hit allocated
/// blocks and `fdatasync` has no allocation metadata to flush.
const PREALLOC_BYTES: usize = 64 << 20;

/// Untimed round trips first: connection setup, first-touch buffers and
/// thread wake-up paths would otherwise land in the tail.
const WARMUP_ROUND_TRIPS: usize = 16;

/// Reply size for [`loopback_round_trip`]: an ack carrying one position.
pub const REPLY_BYTES: usize = 8;

/// Bounds a blocked read so a dead peer fails the run instead of hanging CI.
const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A temporary file in `dir` (named, not O_TMPFILE, so it is an ordinary
/// file like the log's) of `len` bytes of real zeros (not `set_len`: a
/// sparse file would allocate on first write), synced with `sync_all`,
/// which also makes its size durable, so later fdatasyncs carry data only.
/// Removed when dropped.
pub fn zero_filled(dir: &Path, prefix: &str, len: usize) -> io::Result<tempfile::NamedTempFile> {
    let tmp = tempfile::Builder::new().prefix(prefix).tempfile_in(dir)?;
    let chunk = vec![0u8; (1 << 20).min(len)];
    let mut at = 0;
    while at < len {
        let n = chunk.len().min(len - at);
        tmp.as_file().write_all_at(&chunk[..n], at as u64)?;
        at += n;
    }
    tmp.as_file().sync_all()?;
    Ok(tmp)
}

/// Times `iterations` durable overwrites of `size_bytes` each.
///
/// A fresh file in `dir` is filled with zeros (at least 64 MiB) and synced
/// once; each iteration then `pwrite`s `size_bytes` at the next
/// `size_bytes`-aligned offset (wrapping at the end of the file) and calls
/// `fdatasync`. Returns the duration of each write + sync. The file is
/// removed on return.
pub fn durable_overwrite(
    dir: &Path,
    size_bytes: usize,
    iterations: usize,
) -> io::Result<Vec<Duration>> {
    durable_overwrite_in(dir, size_bytes, iterations, PREALLOC_BYTES)
}

fn durable_overwrite_in(
    dir: &Path,
    size_bytes: usize,
    iterations: usize,
    prealloc_bytes: usize,
) -> io::Result<Vec<Duration>> {
    if size_bytes == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "size_bytes must be > 0",
        ));
    }
    let file_len = prealloc_bytes.max(size_bytes);
    let tmp = zero_filled(dir, "floor-overwrite-", file_len)?;
    let file: &File = tmp.as_file();

    let mut buf = vec![0u8; size_bytes];
    let mut samples = Vec::with_capacity(iterations);
    for i in 0..iterations {
        // Differs per write so nothing can elide an unchanged block.
        buf.fill((i % 255 + 1) as u8);
        let offset = overwrite_offset(i, size_bytes, file_len);
        let start = Instant::now();
        file.write_all_at(&buf, offset)?;
        file.sync_data()?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// How a floor's thread makes its overwrite durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durably {
    /// A buffered `pwrite`, then `fdatasync`.
    Fdatasync,
    /// One `pwritev2(RWF_DSYNC)` of an aligned buffer on an `O_DIRECT`
    /// descriptor: the way walrelay's followers write (theirs go through
    /// io_uring; the kernel's path below it is the same).
    DirectDsync,
}

/// Times `iterations` rounds of `files` concurrent durable overwrites on one
/// disk: each round, every thread overwrites `size_bytes` of its own
/// preallocated file and makes it durable `how`; the round's time is when
/// the `quorum`-th of them finished. This is the storage floor of a quorum
/// whose followers share one disk (a one-machine cluster), where the
/// flushes queue behind each other. With [`Durably::DirectDsync`],
/// `size_bytes` must be a multiple of 4096. [`ConcurrentOverwrite`] keeps
/// the files and threads to time rounds in several blocks.
pub fn concurrent_durable_overwrite(
    dir: &Path,
    size_bytes: usize,
    files: usize,
    quorum: usize,
    iterations: usize,
    how: Durably,
) -> io::Result<Vec<Duration>> {
    ConcurrentOverwrite::new(dir, size_bytes, files, quorum, how)?.rounds(iterations)
}

/// The files and threads of [`concurrent_durable_overwrite`], kept between
/// blocks of rounds, so that a bench can time its floor in blocks that
/// alternate with what it measures against it (both then see the same
/// moments of the disk) without preparing the files again for each block.
/// Dropping it stops and joins the threads and removes the files.
#[derive(Debug)]
pub struct ConcurrentOverwrite {
    quorum: usize,
    start_round: std::sync::Arc<std::sync::Barrier>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    done_rx: std::sync::mpsc::Receiver<io::Result<Instant>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl ConcurrentOverwrite {
    /// Prepares `files` preallocated files in `dir` and one idle thread
    /// each; nothing is timed yet.
    pub fn new(
        dir: &Path,
        size_bytes: usize,
        files: usize,
        quorum: usize,
        how: Durably,
    ) -> io::Result<ConcurrentOverwrite> {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Barrier, mpsc};
        if size_bytes == 0 || files == 0 || quorum == 0 || quorum > files {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "need size_bytes > 0 and 0 < quorum <= files",
            ));
        }
        if how == Durably::DirectDsync && !size_bytes.is_multiple_of(DIRECT_ALIGN) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an O_DIRECT overwrite needs a multiple of 4096 bytes",
            ));
        }
        let file_len = PREALLOC_BYTES.max(size_bytes);
        let mut writers = Vec::with_capacity(files);
        for _ in 0..files {
            let tmp = zero_filled(dir, "floor-concurrent-", file_len)?;
            let writer = Overwriter::open(&tmp, size_bytes, how)?;
            writers.push((tmp, writer));
        }
        let start_round = Arc::new(Barrier::new(files + 1));
        let stop = Arc::new(AtomicBool::new(false));
        let (done_tx, done_rx) = mpsc::channel::<io::Result<Instant>>();
        let threads = writers
            .into_iter()
            .map(|(tmp, mut writer)| {
                let (start_round, stop, done_tx) =
                    (Arc::clone(&start_round), Arc::clone(&stop), done_tx.clone());
                thread::spawn(move || {
                    let _keep = tmp;
                    for i in 0.. {
                        start_round.wait();
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        let offset = overwrite_offset(i, size_bytes, file_len);
                        let r = writer
                            .overwrite((i % 255 + 1) as u8, offset)
                            .map(|()| Instant::now());
                        if done_tx.send(r).is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        Ok(ConcurrentOverwrite {
            quorum,
            start_round,
            stop,
            done_rx,
            threads,
        })
    }

    /// Times `iterations` more rounds (each file's offsets go on where the
    /// previous block left them).
    pub fn rounds(&mut self, iterations: usize) -> io::Result<Vec<Duration>> {
        let files = self.threads.len();
        let mut samples = Vec::with_capacity(iterations);
        let mut finished = Vec::with_capacity(files);
        for _ in 0..iterations {
            self.start_round.wait();
            let started = Instant::now();
            finished.clear();
            for _ in 0..files {
                let at = self
                    .done_rx
                    .recv()
                    .map_err(|_| io::Error::other("a floor thread died"))??;
                finished.push(at);
            }
            finished.sort_unstable();
            samples.push(finished[self.quorum - 1].saturating_duration_since(started));
        }
        Ok(samples)
    }
}

impl Drop for ConcurrentOverwrite {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        // Every thread waits at the barrier unless one died (`rounds`
        // returned its error); then the others could never pass it, so
        // they are left behind rather than joined.
        if self.threads.iter().any(|t| t.is_finished()) {
            return;
        }
        self.start_round.wait();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// `O_DIRECT`'s alignment of offsets, lengths and buffers on this disk.
const DIRECT_ALIGN: usize = 4096;

/// One floor thread's file and buffer ([`concurrent_durable_overwrite`]).
struct Overwriter {
    file: File,
    how: Durably,
    /// `size_bytes` plus room to align its start.
    buf: Vec<u8>,
    size_bytes: usize,
}

impl Overwriter {
    fn open(
        tmp: &tempfile::NamedTempFile,
        size_bytes: usize,
        how: Durably,
    ) -> io::Result<Overwriter> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = match how {
            Durably::Fdatasync => tmp.as_file().try_clone()?,
            Durably::DirectDsync => std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(tmp.path())?,
        };
        Ok(Overwriter {
            file,
            how,
            buf: vec![0u8; size_bytes + DIRECT_ALIGN],
            size_bytes,
        })
    }

    /// Fills the buffer's aligned `size_bytes` with `fill` and writes them
    /// durably at `offset`.
    fn overwrite(&mut self, fill: u8, offset: u64) -> io::Result<()> {
        let skip = self.buf.as_ptr().align_offset(DIRECT_ALIGN);
        let buf = &mut self.buf[skip..skip + self.size_bytes];
        buf.fill(fill);
        match self.how {
            Durably::Fdatasync => {
                self.file.write_all_at(buf, offset)?;
                self.file.sync_data()
            }
            Durably::DirectDsync => {
                use std::os::fd::AsRawFd;
                let iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
                // SAFETY: `iov` describes `buf`, a live slice of this
                // Overwriter's own buffer, aligned for O_DIRECT, that
                // outlives the call; the descriptor is this Overwriter's
                // open file.
                let n = unsafe {
                    libc::pwritev2(self.file.as_raw_fd(), &iov, 1, offset, libc::RWF_DSYNC)
                };
                match usize::try_from(n) {
                    Ok(n) if n == buf.len() => Ok(()),
                    Ok(n) => Err(io::Error::other(format!("short O_DIRECT write: {n} bytes"))),
                    Err(_) => Err(io::Error::last_os_error()),
                }
            }
        }
    }
}

/// Offset of the `i`th overwrite: consecutive aligned slots, wrapping.
fn overwrite_offset(i: usize, size_bytes: usize, file_len: usize) -> u64 {
    let slots = file_len / size_bytes;
    ((i % slots) * size_bytes) as u64
}

/// Times `iterations` loopback TCP round trips: the client sends
/// `payload_bytes`, a server thread reads exactly that many and replies with
/// [`REPLY_BYTES`] bytes. Both ends are blocking sockets with `TCP_NODELAY`;
/// a few untimed round trips run first.
pub fn loopback_round_trip(payload_bytes: usize, iterations: usize) -> io::Result<Vec<Duration>> {
    let rounds = WARMUP_ROUND_TRIPS + iterations;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = listener.local_addr()?;
    let server = thread::Builder::new()
        .name("floor-rtt-server".into())
        .spawn(move || -> io::Result<()> {
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            stream.set_read_timeout(Some(IO_TIMEOUT))?;
            let mut request = vec![0u8; payload_bytes];
            let reply = [0xa5u8; REPLY_BYTES];
            // Exactly `rounds`, so end of stream is never ambiguous.
            for _ in 0..rounds {
                stream.read_exact(&mut request)?;
                stream.write_all(&reply)?;
            }
            Ok(())
        })?;

    let client = run_client(addr, payload_bytes, iterations);
    if client.is_err() {
        // If the client never connected, the server is still in accept():
        // a throwaway connection (closed at once) ends it.
        let _ = TcpStream::connect(addr);
    }
    // The client's stream is closed by now, so a server still reading fails
    // fast; report the client's error first, it is the cause.
    let served = server
        .join()
        .map_err(|_| io::Error::other("loopback server thread panicked"))?;
    let samples = client?;
    served?;
    Ok(samples)
}

fn run_client(
    addr: SocketAddr,
    payload_bytes: usize,
    iterations: usize,
) -> io::Result<Vec<Duration>> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    let request = vec![0x5au8; payload_bytes];
    let mut reply = [0u8; REPLY_BYTES];
    for _ in 0..WARMUP_ROUND_TRIPS {
        stream.write_all(&request)?;
        stream.read_exact(&mut reply)?;
    }
    let mut samples = Vec::with_capacity(iterations);
    for _ in 0..iterations {
        let start = Instant::now();
        stream.write_all(&request)?;
        stream.read_exact(&mut reply)?;
        samples.push(start.elapsed());
    }
    Ok(samples)
}

/// Drops `path`'s pages from the page cache: `fdatasync` (only clean
/// pages can be dropped), then `posix_fadvise(POSIX_FADV_DONTNEED)` over
/// the whole file. Only this file is affected, unlike
/// `/proc/sys/vm/drop_caches`. (On a virtual machine the host may still
/// cache the disk's blocks.)
pub fn evict(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    f.sync_data()?;
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open for the duration of the call;
    // posix_fadvise only advises the kernel and touches no memory of ours.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Reads every file in `paths` in full, one after another, in 1 MiB
/// reads; returns the time and the bytes read.
pub fn read_files(paths: &[std::path::PathBuf]) -> io::Result<(Duration, u64)> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    let start = Instant::now();
    for p in paths {
        let mut f = File::open(p)?;
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            total += n as u64;
        }
    }
    Ok((start.elapsed(), total))
}

/// Writes `bytes` (not zeros) to a new file at `path` in 1 MiB writes and
/// `fsync`s it; returns the time. The file is left in place.
pub fn write_synced(path: &Path, bytes: u64) -> io::Result<Duration> {
    let chunk: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let start = Instant::now();
    let mut f = File::create(path)?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(start.elapsed())
}

/// The median of `samples` (the lower middle one of an even count).
///
/// # Panics
///
/// If `samples` is empty.
pub fn median(samples: &[Duration]) -> Duration {
    assert!(!samples.is_empty(), "median of no samples");
    let mut s = samples.to_vec();
    s.sort_unstable();
    s[(s.len() - 1) / 2]
}

/// Latency summary in microseconds. Percentiles are nearest-rank on the
/// sorted samples (index `round((n - 1) * p)`), as in the other benches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
}

impl Percentiles {
    /// `self` as a multiple of `floor` (p50 to p50, p99 to p99, mean to
    /// mean): how far a measurement is above the physical floor.
    pub fn ratio_to(&self, floor: &Percentiles) -> Percentiles {
        Percentiles {
            p50_us: self.p50_us / floor.p50_us,
            p99_us: self.p99_us / floor.p99_us,
            mean_us: self.mean_us / floor.mean_us,
        }
    }
}

/// Sorts `samples` in place and summarises them.
///
/// # Panics
///
/// If `samples` is empty.
pub fn percentiles(samples: &mut [Duration]) -> Percentiles {
    assert!(!samples.is_empty(), "percentiles of no samples");
    samples.sort_unstable();
    let at = |p: f64| {
        let i = ((samples.len() - 1) as f64 * p).round() as usize;
        micros(samples[i])
    };
    let total: f64 = samples.iter().copied().map(micros).sum();
    Percentiles {
        p50_us: at(0.50),
        p99_us: at(0.99),
        mean_us: total / samples.len() as f64,
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Floor for one quorum commit: one durable overwrite plus one round trip.
///
/// Percentiles are added (p50 + p50, p99 + p99); the mean sum is exact, the
/// percentile sums approximate the percentiles of the sum, which would need
/// the joint distribution.
pub fn quorum_floor(overwrite: &Percentiles, round_trip: &Percentiles) -> Percentiles {
    Percentiles {
        p50_us: overwrite.p50_us + round_trip.p50_us,
        p99_us: overwrite.p99_us + round_trip.p99_us,
        mean_us: overwrite.mean_us + round_trip.mean_us,
    }
}

/// CPU time (user + system) this process has used so far, in µs, from
/// getrusage(2): what every node of an in-process cluster spent.
pub fn process_cpu_us() -> u64 {
    process_usage().0
}

/// This process's CPU time so far (µs) and its context switches
/// (voluntary and not, every thread's), from getrusage(2); zeros if it
/// fails.
pub fn process_usage() -> (u64, u64) {
    let mut u = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one rusage into the zeroed buffer we own;
    // RUSAGE_SELF is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, u.as_mut_ptr()) };
    if rc != 0 {
        return (0, 0);
    }
    // SAFETY: getrusage succeeded, so it initialised the struct (and it
    // was zeroed before).
    let u = unsafe { u.assume_init() };
    let us = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    (
        us(u.ru_utime) + us(u.ru_stime),
        (u.ru_nvcsw + u.ru_nivcsw) as u64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_ordered(p: &Percentiles) {
        assert!(p.p50_us > 0.0, "{p:?}");
        assert!(p.p50_us <= p.p99_us, "{p:?}");
    }

    #[test]
    fn durable_overwrite_returns_one_sample_per_iteration() {
        let dir = tempfile::tempdir().unwrap();
        let mut samples = durable_overwrite(dir.path(), 4096, 5).unwrap();
        assert_eq!(samples.len(), 5);
        assert_ordered(&percentiles(&mut samples));
        // The file is gone afterwards.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn durable_overwrite_wraps_within_the_file() {
        let dir = tempfile::tempdir().unwrap();
        // 3 slots, 7 writes: wraps twice.
        let samples = durable_overwrite_in(dir.path(), 4096, 7, 3 * 4096).unwrap();
        assert_eq!(samples.len(), 7);
        let offsets: Vec<u64> = (0..7)
            .map(|i| overwrite_offset(i, 4096, 3 * 4096))
            .collect();
        assert_eq!(offsets, [0, 4096, 8192, 0, 4096, 8192, 0]);
        // A write larger than the preallocation still gets one slot.
        assert_eq!(overwrite_offset(3, 100, 100), 0);
        assert_eq!(
            durable_overwrite_in(dir.path(), 8192, 2, 4096)
                .unwrap()
                .len(),
            2
        );
    }

    #[test]
    fn durable_overwrite_rejects_empty_writes() {
        let dir = tempfile::tempdir().unwrap();
        let err = durable_overwrite(dir.path(), 0, 1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn concurrent_overwrites_time_each_round_both_ways_and_refuse_what_cannot_be_written() {
        let dir = tempfile::tempdir().unwrap();
        for how in [Durably::Fdatasync, Durably::DirectDsync] {
            let samples = concurrent_durable_overwrite(dir.path(), 8192, 3, 2, 4, how).unwrap();
            assert_eq!(samples.len(), 4, "{how:?}");
        }
        // An O_DIRECT write must be whole blocks: refused before any file.
        let e = concurrent_durable_overwrite(dir.path(), 1000, 3, 2, 1, Durably::DirectDsync)
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(
            concurrent_durable_overwrite(dir.path(), 4096, 2, 3, 1, Durably::Fdatasync).is_err(),
            "a quorum larger than the files"
        );
    }

    #[test]
    fn a_concurrent_floor_times_blocks_of_rounds_and_stops_its_threads_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut floor =
            ConcurrentOverwrite::new(dir.path(), 4096, 3, 2, Durably::Fdatasync).unwrap();
        assert_eq!(floor.rounds(3).unwrap().len(), 3);
        assert_eq!(floor.rounds(0).unwrap().len(), 0);
        assert_eq!(floor.rounds(2).unwrap().len(), 2);
        drop(floor);
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "its files are removed with it"
        );
    }

    #[test]
    fn loopback_round_trip_returns_one_sample_per_iteration() {
        let mut samples = loopback_round_trip(4096, 5).unwrap();
        assert_eq!(samples.len(), 5);
        assert_ordered(&percentiles(&mut samples));
        // An empty request still gets its reply.
        assert_eq!(loopback_round_trip(0, 3).unwrap().len(), 3);
        assert!(loopback_round_trip(4096, 0).unwrap().is_empty());
    }

    #[test]
    fn percentiles_are_nearest_rank_on_sorted_samples() {
        // 1..=100 us, reversed so sorting matters.
        let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
        let p = percentiles(&mut samples);
        // round(99 * 0.5) = 50 -> 51 us; round(99 * 0.99) = 98 -> 99 us.
        assert_eq!(p.p50_us, 51.0);
        assert_eq!(p.p99_us, 99.0);
        assert!((p.mean_us - 50.5).abs() < 1e-9);
        assert!(samples.is_sorted());

        let one = percentiles(&mut [Duration::from_micros(7)]);
        assert_eq!((one.p50_us, one.p99_us, one.mean_us), (7.0, 7.0, 7.0));
    }

    #[test]
    #[should_panic(expected = "no samples")]
    fn percentiles_of_nothing_panics() {
        percentiles(&mut []);
    }

    #[test]
    fn a_written_file_reads_back_its_size_cold() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w");
        write_synced(&p, (3 << 20) + 5).unwrap();
        evict(&p).unwrap();
        let (_, n) = read_files(&[p.clone(), p]).unwrap();
        assert_eq!(n, 2 * ((3 << 20) + 5));
        let ms = |m| Duration::from_millis(m);
        assert_eq!(median(&[ms(3), ms(1), ms(2)]), ms(2));
        assert_eq!(median(&[ms(4), ms(1), ms(2), ms(3)]), ms(2));
    }

    #[test]
    fn quorum_floor_adds_the_parts() {
        let disk = Percentiles {
            p50_us: 100.0,
            p99_us: 400.0,
            mean_us: 150.0,
        };
        let net = Percentiles {
            p50_us: 20.0,
            p99_us: 60.0,
            mean_us: 25.0,
        };
        let floor = quorum_floor(&disk, &net);
        assert_eq!(
            floor,
            Percentiles {
                p50_us: 120.0,
                p99_us: 460.0,
                mean_us: 175.0
            }
        );
        assert_ordered(&floor);
        let r = Percentiles {
            p50_us: 240.0,
            p99_us: 460.0,
            mean_us: 350.0,
        }
        .ratio_to(&floor);
        assert_eq!((r.p50_us, r.p99_us, r.mean_us), (2.0, 1.0, 2.0));
    }
}
