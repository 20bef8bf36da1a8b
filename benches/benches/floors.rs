//! Physical floors, for reporting the other benches as ratios to them:
//!
//! - `overwrite_4k_fdatasync`: `pwrite` of 4 KiB into a preallocated file
//!   plus `fdatasync`.
//! - `loopback_rtt_4k_8b`: 4 KiB request, 8-byte reply over loopback TCP
//!   (`TCP_NODELAY`, blocking threads).
//! - `quorum_commit`: the two added, the least one quorum commit can cost.
//! - `append_9k_dsync_buffered` / `append_9k_dsync_direct`: a follower's
//!   append of a 9,000-byte record made durable by `RWF_DSYNC` on one
//!   io_uring write, through the page cache and with `O_DIRECT` in whole
//!   blocks, alternated call by call, with CPU and context switches per
//!   call (`walrelay_benches::append`).
//!
//! The file goes in a temporary directory, as the other benches' databases
//! do; set `WALRELAY_FLOOR_DIR` to measure another filesystem (a tmpfs
//! would make the sync free).
//!
//! Run: `cargo bench -p walrelay-benches --bench floors`
//! (`-- --test` for a 5-iteration smoke run).

use std::path::PathBuf;
use walrelay_benches::append::append_dsync;
use walrelay_benches::floor::{
    Percentiles, durable_overwrite, loopback_round_trip, percentiles, quorum_floor,
};

const WRITE_BYTES: usize = 4096;
const PAYLOAD_BYTES: usize = 4096;
/// About one group transaction's record at 16 sessions.
const APPEND_BYTES: usize = 9000;
const FULL_ITERATIONS: usize = 2_000;
const TEST_ITERATIONS: usize = 5;

fn report(name: &str, n: usize, p: &Percentiles) {
    println!(
        "floor {name:<24} n={n:<5} p50={:>9.1} us  p99={:>9.1} us  mean={:>9.1} us",
        p.p50_us, p.p99_us, p.mean_us
    );
}

fn main() {
    // cargo passes `--bench`, and CI `-- --test`; nothing else is accepted.
    let test_mode = std::env::args().skip(1).any(|a| a == "--test");
    let iterations = if test_mode {
        TEST_ITERATIONS
    } else {
        FULL_ITERATIONS
    };

    let tmp;
    let dir = match std::env::var_os("WALRELAY_FLOOR_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            tmp = tempfile::tempdir().expect("tempdir");
            tmp.path().to_path_buf()
        }
    };
    println!("floors: dir={} iterations={iterations}", dir.display());

    let mut disk = durable_overwrite(&dir, WRITE_BYTES, iterations).expect("durable_overwrite");
    let disk = percentiles(&mut disk);
    report("overwrite_4k_fdatasync", iterations, &disk);

    let mut net = loopback_round_trip(PAYLOAD_BYTES, iterations).expect("loopback_round_trip");
    let net = percentiles(&mut net);
    report("loopback_rtt_4k_8b", iterations, &net);

    report("quorum_commit", iterations, &quorum_floor(&disk, &net));

    let append = append_dsync(&dir, APPEND_BYTES, iterations).expect("append_dsync");
    let forms = [
        ("buffered", Some(append.buffered)),
        ("direct", append.direct),
    ];
    for (name, form) in forms {
        let Some(f) = form else {
            println!("floor append_9k_dsync_{name}: O_DIRECT refused by this filesystem");
            continue;
        };
        report(&format!("append_9k_dsync_{name}"), iterations, &f.latency);
        println!(
            "      {:<24} CPU {:>7.1} us per call, {:.2} context switches per call",
            "", f.cpu_us, f.switches
        );
    }
    if let Some(d) = append.direct {
        println!(
            "      direct / buffered: p50 {:.2}x, CPU {:.2}x, context switches {:.2}x",
            d.latency.p50_us / append.buffered.latency.p50_us,
            d.cpu_us / append.buffered.cpu_us.max(f64::MIN_POSITIVE),
            d.switches / append.buffered.switches.max(f64::MIN_POSITIVE)
        );
    }
}
