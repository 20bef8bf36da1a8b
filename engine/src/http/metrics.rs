//! Per-node metrics in the Prometheus text format (version 0.0.4).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds (µs) of the confirm-lag histogram's buckets.
const LAG_BUCKETS_US: [u64; 12] = [
    25, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 50_000, 250_000, 1_000_000,
];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; LAG_BUCKETS_US.len()],
    count: u64,
    sum: u64,
}

/// What a node counts.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Queries answered, by (served_by_primary, served_by_region).
    served: Mutex<BTreeMap<(bool, String), u64>>,
    /// Requests this node forwarded to the primary, by reason.
    forwarded: Mutex<BTreeMap<&'static str, u64>>,
    /// Requests refused, by HTTP status.
    refused: Mutex<BTreeMap<u16, u64>>,
    confirm_lag: Mutex<Histogram>,
    /// Queries stopped because their client went away or the node stopped.
    cancelled: AtomicU64,
    /// Queries stopped at the query time limit.
    timed_out: AtomicU64,
    /// Reads answered on the async worker (on a primary, then held at
    /// the output gate by their task).
    reads_on_worker: AtomicU64,
    /// Reads tried on the async worker and declined there (over
    /// budget, no idle reader, remembered as long, an error): the
    /// blocking pool ran them.
    reads_on_worker_declined: AtomicU64,
}

/// A replica's position against its primary, read at scrape time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaLag {
    /// Transactions the replica has not revealed yet, of those the primary
    /// had confirmed when it last said.
    pub bookmarks: u64,
    /// The most recent confirm lag (quorum → visible here), µs.
    pub last_confirm_lag_us: u64,
}

impl Metrics {
    pub fn served(&self, by_primary: bool, region: &str) {
        *self
            .served
            .lock()
            .entry((by_primary, region.to_string()))
            .or_insert(0) += 1;
    }

    /// Counts a query that failed for a reason worth its own counter.
    pub fn query_failed(&self, e: &crate::error::QueryError) {
        use crate::error::QueryError;
        let e = match e {
            QueryError::Batch { source, .. } => source,
            e => e,
        };
        match e {
            QueryError::Cancelled | QueryError::Stopping => {
                self.cancelled.fetch_add(1, Ordering::Relaxed);
            }
            QueryError::Timeout { .. } => {
                self.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// Counts a read tried on the async worker: answered there
    /// (`ran`) or declined to the blocking pool.
    pub fn read_on_worker(&self, ran: bool) {
        let n = if ran {
            &self.reads_on_worker
        } else {
            &self.reads_on_worker_declined
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    pub fn forwarded(&self, reason: &'static str) {
        *self.forwarded.lock().entry(reason).or_insert(0) += 1;
    }

    pub fn refused(&self, status: u16) {
        *self.refused.lock().entry(status).or_insert(0) += 1;
    }

    pub fn confirm_lags(&self, samples_us: &[u64]) {
        let mut h = self.confirm_lag.lock();
        for &s in samples_us {
            if let Some(i) = LAG_BUCKETS_US.iter().position(|&b| s <= b) {
                h.counts[i] += 1;
            }
            h.count += 1;
            h.sum += s;
        }
    }

    /// A primary's group commit counters, labelled as [`Metrics::render`]
    /// labels the node.
    pub fn render_group_commit(
        role: &str,
        region: &str,
        g: &crate::group_write::GroupCommitStats,
    ) -> String {
        let mut out = String::new();
        let node = node_labels(role, region);
        for (name, help, n) in [
            (
                "walrelay_group_commits_total",
                "Transactions that committed two or more writes (group commit).",
                g.groups,
            ),
            (
                "walrelay_group_commit_writes_total",
                "Writes committed in those transactions.",
                g.grouped_writes,
            ),
            (
                "walrelay_group_commit_reruns_total",
                "Writes of a group that ran again alone (a failure, or a group that could not commit).",
                g.rerun_alone,
            ),
            (
                "walrelay_group_commit_guarded_retries_total",
                "Groups whose writes ran again, each in a savepoint, after one failed without.",
                g.guarded_retries,
            ),
            (
                "walrelay_group_commit_led_alone_total",
                "Writes a group's leader committed by itself, nothing queued behind it.",
                g.led_alone,
            ),
        ] {
            counter(&mut out, name, help, &node, n);
        }
        let bounds = &crate::group_write::GROUP_SIZE_BOUNDS;
        // The buckets' total, so that `+Inf` and the count agree.
        histogram(
            &mut out,
            "walrelay_group_commit_size",
            "Writes per group commit (transactions of two or more writes).",
            &node,
            (bounds, &g.sizes[..bounds.len()]),
            g.sizes.iter().sum(),
            g.grouped_writes,
        );
        out
    }

    /// The text exposition. `role` and `region` label the node.
    pub fn render(&self, role: &str, region: &str, lag: Option<ReplicaLag>) -> String {
        let mut out = String::new();
        let node = node_labels(role, region);
        let _ = writeln!(
            out,
            "# HELP walrelay_queries_total Queries answered, by where they were served."
        );
        let _ = writeln!(out, "# TYPE walrelay_queries_total counter");
        for ((by_primary, served_region), n) in self.served.lock().iter() {
            let by = if *by_primary { "primary" } else { "replica" };
            let _ = writeln!(
                out,
                "walrelay_queries_total{{{node},served_by=\"{by}\",served_by_region=\"{}\"}} {n}",
                escape(served_region)
            );
        }
        let _ = writeln!(
            out,
            "# HELP walrelay_forwarded_total Requests a replica forwarded to the primary, by reason."
        );
        let _ = writeln!(out, "# TYPE walrelay_forwarded_total counter");
        for (reason, n) in self.forwarded.lock().iter() {
            let _ = writeln!(
                out,
                "walrelay_forwarded_total{{{node},reason=\"{reason}\"}} {n}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP walrelay_refused_total Requests refused, by HTTP status."
        );
        let _ = writeln!(out, "# TYPE walrelay_refused_total counter");
        for (status, n) in self.refused.lock().iter() {
            let _ = writeln!(
                out,
                "walrelay_refused_total{{{node},status=\"{status}\"}} {n}"
            );
        }
        for (name, help, n) in [
            (
                "walrelay_queries_cancelled_total",
                "Queries stopped because their client went away or the node stopped.",
                &self.cancelled,
            ),
            (
                "walrelay_queries_timed_out_total",
                "Queries stopped at the query time limit.",
                &self.timed_out,
            ),
            (
                "walrelay_reads_on_worker_total",
                "Reads answered on the async worker, without a thread hop.",
                &self.reads_on_worker,
            ),
            (
                "walrelay_reads_on_worker_declined_total",
                "Reads tried on the async worker and run by the blocking pool instead.",
                &self.reads_on_worker_declined,
            ),
        ] {
            counter(&mut out, name, help, &node, n.load(Ordering::Relaxed));
        }
        if let Some(lag) = lag {
            let _ = writeln!(
                out,
                "# HELP walrelay_replica_lag_bookmarks Transactions confirmed by the primary and not yet visible here."
            );
            let _ = writeln!(out, "# TYPE walrelay_replica_lag_bookmarks gauge");
            let _ = writeln!(
                out,
                "walrelay_replica_lag_bookmarks{{{node}}} {}",
                lag.bookmarks
            );
            let _ = writeln!(
                out,
                "# HELP walrelay_replica_lag_us The last confirm lag: primary quorum to visible here."
            );
            let _ = writeln!(out, "# TYPE walrelay_replica_lag_us gauge");
            let _ = writeln!(
                out,
                "walrelay_replica_lag_us{{{node}}} {}",
                lag.last_confirm_lag_us
            );
            let h = self.confirm_lag.lock();
            histogram(
                &mut out,
                "walrelay_confirm_lag_us",
                "Confirm lag: primary quorum to visible here.",
                &node,
                (&LAG_BUCKETS_US, &h.counts),
                h.count,
                h.sum,
            );
        }
        out
    }
}

/// Label values escape backslash, quote and newline.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The labels naming a node: its role and region.
fn node_labels(role: &str, region: &str) -> String {
    format!("role=\"{role}\",node_region=\"{}\"", escape(region))
}

/// One counter with its help and type lines.
fn counter(out: &mut String, name: &str, help: &str, node: &str, n: u64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name}{{{node}}} {n}");
}

/// A histogram in the text format: `buckets` are its bounds and the
/// count of observations in each (not cumulative), `count` every
/// observation (those past the last bound too), `sum` their total.
fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    node: &str,
    buckets: (&[u64], &[u64]),
    count: u64,
    sum: u64,
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, n) in buckets.0.iter().zip(buckets.1) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{{node},le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{node},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{node}}} {sum}");
    let _ = writeln!(out, "{name}_count{{{node}}} {count}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exposition_counts_by_label_and_the_histogram_is_cumulative() {
        let m = Metrics::default();
        m.served(true, "eu");
        m.served(false, "us");
        m.served(false, "us");
        m.forwarded("write");
        m.confirm_lags(&[10, 60, 60, 2_000_000]);
        m.read_on_worker(true);
        m.read_on_worker(true);
        m.read_on_worker(false);
        let text = m.render(
            "replica",
            "us\"x",
            Some(ReplicaLag {
                bookmarks: 3,
                last_confirm_lag_us: 60,
            }),
        );
        assert!(text.contains(
            "walrelay_queries_total{role=\"replica\",node_region=\"us\\\"x\",served_by=\"replica\",served_by_region=\"us\"} 2"
        ));
        assert!(text.contains("served_by=\"primary\",served_by_region=\"eu\"} 1"));
        assert!(text.contains(
            "walrelay_forwarded_total{role=\"replica\",node_region=\"us\\\"x\",reason=\"write\"} 1"
        ));
        assert!(text.contains(
            "walrelay_reads_on_worker_total{role=\"replica\",node_region=\"us\\\"x\"} 2"
        ));
        assert!(text.contains(
            "walrelay_reads_on_worker_declined_total{role=\"replica\",node_region=\"us\\\"x\"} 1"
        ));
        assert!(text.contains("le=\"25\"} 1"));
        assert!(text.contains("le=\"100\"} 3"));
        assert!(text.contains("le=\"+Inf\"} 4"));
        assert!(text.contains(
            "walrelay_replica_lag_bookmarks{role=\"replica\",node_region=\"us\\\"x\"} 3"
        ));
    }

    #[test]
    fn a_primary_reports_its_group_commit_counters_and_a_cumulative_histogram_of_group_sizes() {
        // Two groups, of 3 and 16 writes.
        let mut sizes = [0; crate::group_write::GROUP_SIZE_BOUNDS.len() + 1];
        sizes[crate::group_write::size_bucket(3)] += 1;
        sizes[crate::group_write::size_bucket(16)] += 1;
        let text = Metrics::render_group_commit(
            "primary",
            "eu",
            &crate::group_write::GroupCommitStats {
                groups: 2,
                grouped_writes: 19,
                sizes,
                rerun_alone: 1,
                led_alone: 7,
                at_gate: 3,
                guarded_retries: 2,
            },
        );
        let size = |le: &str| {
            format!(
                "walrelay_group_commit_size_bucket{{role=\"primary\",node_region=\"eu\",le=\"{le}\"}} "
            )
        };
        for (le, n) in [
            ("2", 0),
            ("3", 1),
            ("12", 1),
            ("16", 2),
            ("48", 2),
            ("+Inf", 2),
        ] {
            assert!(
                text.contains(&format!("{}{n}\n", size(le))),
                "le {le}: {text}"
            );
        }
        assert!(
            text.contains("walrelay_group_commit_size_sum{role=\"primary\",node_region=\"eu\"} 19")
        );
        assert!(
            text.contains(
                "walrelay_group_commit_size_count{role=\"primary\",node_region=\"eu\"} 2"
            )
        );
        assert!(
            text.contains("walrelay_group_commits_total{role=\"primary\",node_region=\"eu\"} 2")
        );
        assert!(text.contains(
            "walrelay_group_commit_writes_total{role=\"primary\",node_region=\"eu\"} 19"
        ));
        assert!(
            text.contains(
                "walrelay_group_commit_reruns_total{role=\"primary\",node_region=\"eu\"} 1"
            )
        );
        assert!(text.contains(
            "walrelay_group_commit_led_alone_total{role=\"primary\",node_region=\"eu\"} 7"
        ));
        assert!(text.contains(
            "walrelay_group_commit_guarded_retries_total{role=\"primary\",node_region=\"eu\"} 2"
        ));
    }
}
