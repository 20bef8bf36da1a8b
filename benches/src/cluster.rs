//! A replicated cluster in one process for the benchmarks: a primary, N
//! followers (W a majority) each with its own segment log on the same
//! disk, and one replica, over loopback TCP.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use walrelay_engine::ReplicaOptions;
use walrelay_engine::replication::{
    PrimaryConfig, ReplicaConfig, ReplicatedPrimary, ReplicatedReplica,
};
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower::{CATCH_UP_BATCH_BYTES, FollowerNode, FollowerNodeConfig};
use walrelay_replicator::{ClusterKey, DatabaseId};

/// A running cluster; the followers live as long as it does.
#[derive(Debug)]
pub struct BenchCluster {
    /// Shared so an uploader can run beside each (`walrelay_engine::archiving`).
    pub followers: Vec<Arc<FollowerNode>>,
    pub primary: ReplicatedPrimary,
    pub replica: ReplicatedReplica,
}

/// Whether the bench primary runs with group commit: yes unless
/// `WALRELAY_BENCH_GROUP_COMMIT=0` (for an A/B of the lever).
pub fn group_commit() -> bool {
    std::env::var("WALRELAY_BENCH_GROUP_COMMIT").map_or(true, |v| v != "0")
}

/// The bench primary's group commit delay: the default unless
/// `WALRELAY_BENCH_GROUP_DELAY_US` says otherwise (for an A/B).
pub fn group_commit_delay_us() -> u64 {
    std::env::var("WALRELAY_BENCH_GROUP_DELAY_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(walrelay_engine::Options::default().group_commit_delay_us)
}

/// The bench primary's eager followers: the default (W) unless
/// `WALRELAY_BENCH_EAGER=n` says otherwise (for an A/B of the fan-out;
/// `WALRELAY_BENCH_LAZY_US` sets the lazy flush interval).
pub fn eager_followers() -> Option<usize> {
    std::env::var("WALRELAY_BENCH_EAGER")
        .ok()
        .and_then(|v| v.parse().ok())
}

/// The bench followers' segment size: 64 MiB unless
/// `WALRELAY_BENCH_SEGMENT_BYTES` says otherwise (for an A/B of what a
/// spare segment's zero-fill costs the commits beside it: a segment
/// large enough is never rolled, nor its spare begun, in a short phase).
pub fn segment_bytes() -> u64 {
    std::env::var("WALRELAY_BENCH_SEGMENT_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64 << 20)
}

/// Starts `n` followers, a primary and a replica under `dir`, with
/// replication authenticated by `key` (None: open).
pub fn start(dir: &Path, n: usize, key: Option<ClusterKey>) -> BenchCluster {
    let followers: Vec<Arc<FollowerNode>> = (0..n)
        .map(|i| {
            FollowerNode::start(FollowerNodeConfig {
                database: DatabaseId(1),
                listen: "127.0.0.1:0".parse().expect("addr"),
                dir: dir.join(format!("follower-{i}")),
                peers: vec![],
                segment_bytes: segment_bytes(),
                backend: Backend::Auto,
                auth: key.clone(),
                catch_up_batch_bytes: CATCH_UP_BATCH_BYTES,
            })
            .map(Arc::new)
            .expect("follower")
        })
        .collect();
    let addrs: Vec<SocketAddr> = followers.iter().map(|f| f.addr()).collect();
    let mut config = PrimaryConfig::new(dir.join("primary.db"), addrs.clone(), key.clone());
    config.listen = Some("127.0.0.1:0".parse().expect("addr"));
    config.options.group_commit = group_commit();
    config.options.group_commit_delay_us = group_commit_delay_us();
    config.eager_followers = eager_followers();
    if let Some(us) = std::env::var("WALRELAY_BENCH_LAZY_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        config.lazy_flush_interval_us = us;
    }
    let primary = ReplicatedPrimary::start(config).expect("primary");
    let replica = ReplicatedReplica::start(ReplicaConfig {
        store: None,
        mux: None,
        database: DatabaseId(1),
        path: dir.join("replica.db"),
        leader: primary.replica_addr().expect("listening"),
        followers: addrs,
        backend: Backend::Auto,
        auth: key,
        options: ReplicaOptions {
            durable: false,
            ..ReplicaOptions::default()
        },
        delay_ms: 0,
    })
    .expect("replica");
    BenchCluster {
        followers,
        primary,
        replica,
    }
}
