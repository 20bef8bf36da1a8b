//! A follower's append, both ways it can reach the disk: through the page
//! cache, and with `O_DIRECT` in whole blocks (the block holding the log's
//! end written again from memory, zeros after the record), each made
//! durable by `RWF_DSYNC` on one io_uring write, as the follower's
//! `SyncRing` does (papers/performance.md, levers 36 and 38).
//!
//! Two zero-filled 64 MiB files take records of `record_bytes` back to
//! back; the two forms alternate call by call, so both meet the machine in
//! the same state. Per call: its latency, the process's CPU time (its
//! io_uring worker threads included, the kernel's block and direct-I/O
//! completion workers not) and its context switches (every thread of the
//! process), from getrusage(2).

use crate::floor::{Percentiles, percentiles, process_usage, zero_filled};
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};
use walrelay_replicator::uring::SyncRing;

const FILE_BYTES: u64 = 64 << 20;
const BLOCK: usize = 4096;

/// One form's figures.
#[derive(Debug, Clone, Copy)]
pub struct AppendForm {
    pub latency: Percentiles,
    /// Mean CPU time of the process per call, µs.
    pub cpu_us: f64,
    /// Mean context switches of the process per call.
    pub switches: f64,
}

/// [`append_dsync`]'s result; `direct` is None where the filesystem
/// refuses `O_DIRECT`.
#[derive(Debug, Clone, Copy)]
pub struct AppendComparison {
    pub buffered: AppendForm,
    pub direct: Option<AppendForm>,
}

/// A block-aligned window of `len` bytes inside an owned buffer.
fn aligned(len: usize) -> (Vec<u8>, usize) {
    let raw = vec![0u8; len + BLOCK];
    let start = raw.as_ptr().align_offset(BLOCK);
    (raw, start)
}

#[derive(Default)]
struct Samples {
    latency: Vec<Duration>,
    cpu_us: u64,
    switches: u64,
}

impl Samples {
    fn form(mut self) -> AppendForm {
        let n = self.latency.len().max(1) as f64;
        AppendForm {
            latency: percentiles(&mut self.latency),
            cpu_us: self.cpu_us as f64 / n,
            switches: self.switches as f64 / n,
        }
    }
}

/// Appends `iterations` records of `record_bytes` in each form, alternating
/// call by call (see the module doc). Fails where io_uring is unavailable.
pub fn append_dsync(
    dir: &Path,
    record_bytes: usize,
    iterations: usize,
) -> io::Result<AppendComparison> {
    if record_bytes == 0 || record_bytes as u64 * 4 > FILE_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "record_bytes must be positive and well under the file",
        ));
    }
    let mut ring = SyncRing::new(8)?;
    let buffered = zero_filled(dir, "append-buffered-", FILE_BYTES as usize)?;
    let buffered = buffered.as_file();
    let direct_file = zero_filled(dir, "append-direct-", FILE_BYTES as usize)?;
    let direct = match OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(direct_file.path())
    {
        Ok(f) => Some(f),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
        Err(e) => return Err(e),
    };
    let record = vec![0xa5u8; record_bytes];
    let (mut buf, start) = aligned(record_bytes + 2 * BLOCK);
    let (mut b_end, mut d_end) = (0u64, 0u64);
    let (mut b, mut d) = (Samples::default(), Samples::default());
    let timed = |s: &mut Samples, f: &mut dyn FnMut() -> io::Result<()>| -> io::Result<()> {
        let (cpu0, sw0) = process_usage();
        let t = Instant::now();
        f()?;
        s.latency.push(t.elapsed());
        let (cpu1, sw1) = process_usage();
        s.cpu_us += cpu1.saturating_sub(cpu0);
        s.switches += sw1.saturating_sub(sw0);
        Ok(())
    };
    for _ in 0..iterations {
        if b_end + record_bytes as u64 + BLOCK as u64 > FILE_BYTES {
            (b_end, d_end) = (0, 0);
        }
        timed(&mut b, &mut || {
            ring.write_and_sync(
                &[(buffered.as_fd(), b_end, &record[..])],
                &[buffered.as_fd()],
            )
        })?;
        b_end += record_bytes as u64;
        let Some(direct) = &direct else { continue };
        // The tail (the end block's bytes before the end) is already at
        // the front of the window; the record goes after it, zeros after.
        let tail = (d_end % BLOCK as u64) as usize;
        let padded = (tail + record_bytes).div_ceil(BLOCK) * BLOCK;
        let window = &mut buf[start..start + padded];
        window[tail..tail + record_bytes].copy_from_slice(&record);
        window[tail + record_bytes..].fill(0);
        let at = d_end - tail as u64;
        timed(&mut d, &mut || {
            ring.write_and_sync(&[(direct.as_fd(), at, &*window)], &[direct.as_fd()])
        })?;
        d_end += record_bytes as u64;
        let new_tail = (d_end % BLOCK as u64) as usize;
        let from = tail + record_bytes - new_tail;
        buf.copy_within(start + from..start + from + new_tail, start);
    }
    Ok(AppendComparison {
        buffered: b.form(),
        direct: direct.map(|_| d.form()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_forms_take_one_sample_per_call() {
        let dir = tempfile::tempdir().expect("dir");
        let Ok(c) = append_dsync(dir.path(), 9000, 5) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "io_uring must work under CI"
            );
            return;
        };
        assert!(c.buffered.latency.p50_us > 0.0);
        if let Some(d) = c.direct {
            assert!(d.latency.p50_us > 0.0);
        }
    }
}
