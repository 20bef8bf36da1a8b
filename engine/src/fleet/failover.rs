//! Failover of a dead node's databases: the control plane's failure
//! detector probes every host node (`ping`) and, once one has not answered
//! for `after_ms`, places each of its live databases on a node that does.
//!
//! # A move
//!
//! For each database the catalog places on the dead node (paged in uuid
//! order), on a live node (its location hint's first, else in turn):
//!
//! 1. `adopt`: the new node writes the database's record, active, and its
//!    routing entry (sent to every node). Nothing is copied: the data is
//!    the followers' log and cold storage's, and the first query there
//!    opens the database the way a crashed primary's restart does: it wins
//!    a newer epoch from the followers (fencing any copy still running on
//!    the old node) and rebuilds the file from cold storage and the log.
//! 2. The catalog row is updated to the new node. The catalog stays the
//!    source of truth: a move that failed between the two steps is done
//!    again on the next probe round (adopt is idempotent), and a node the
//!    catalog no longer places a database on learns it from the heartbeat.
//!
//! # The old node, back
//!
//! Its copies are stale but harmless: the first query that reopens one
//! wins an epoch only by fencing the new node's (epochs never go back, so
//! no acknowledged write is lost either way), and within one heartbeat the
//! control plane answers it that the database lives elsewhere, and it
//! forgets its copy ([`super::heartbeat`]). A hosted primary that finds
//! itself fenced closes and reopens ([`super::host::Host::acquire`]).
//!
//! Lateness: a dead node's databases are unavailable for `after_ms` plus
//! one probe interval plus their first open; `papers/fleet.md` measures it.

use super::control::{ControlPlane, HostNode};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How many rows one catalog read of a dead node's databases returns.
const PAGE: u64 = 500;

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct FailoverStats {
    /// Nodes declared dead (each counted once per outage).
    pub nodes_failed: AtomicU64,
    /// Databases placed on another node.
    pub databases_moved: AtomicU64,
    /// Moves that failed (retried on the next round).
    pub move_failures: AtomicU64,
}

/// The failure detector's memory: since when each node has not answered.
#[derive(Debug, Default)]
pub struct Detector {
    down_since: HashMap<String, Instant>,
    declared: HashMap<String, bool>,
}

impl Detector {
    /// One probe round: pings every host; fails over those down for
    /// `after`. Returns the databases moved.
    pub fn round(&mut self, cp: &ControlPlane, after: Duration) -> u64 {
        let now = Instant::now();
        for host in cp.hosts() {
            match host.api.ping() {
                Ok(()) => {
                    if self.down_since.remove(&host.url).is_some()
                        && self.declared.remove(&host.url).is_some()
                    {
                        tracing::warn!(node = %host.url, "a failed node answers again; its databases stay where they were moved");
                    }
                }
                Err(e) => {
                    let since = *self.down_since.entry(host.url.clone()).or_insert(now);
                    tracing::debug!(node = %host.url, error = %e, down_ms = since.elapsed().as_millis() as u64, "a node did not answer the probe");
                }
            }
        }
        let live: Vec<&HostNode> = cp
            .hosts()
            .iter()
            .filter(|h| !self.down_since.contains_key(&h.url))
            .collect();
        let mut moved = 0;
        for host in cp.hosts() {
            let Some(since) = self.down_since.get(&host.url) else {
                continue;
            };
            if since.elapsed() < after {
                continue;
            }
            if self.declared.insert(host.url.clone(), true).is_none() {
                cp.failover_stats()
                    .nodes_failed
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = %host.url, down_ms = since.elapsed().as_millis() as u64, "a node is declared dead: its databases move");
            }
            moved += move_all(cp, host, &live);
        }
        moved
    }
}

/// Places every live database of `dead` on a node of `live`.
fn move_all(cp: &ControlPlane, dead: &HostNode, live: &[&HostNode]) -> u64 {
    if live.is_empty() {
        tracing::error!(node = %dead.url, "no live node to move a dead node's databases to");
        return 0;
    }
    let stats = cp.failover_stats();
    let (mut moved, mut after, mut turn) = (0, None, 0usize);
    loop {
        let rows = match cp.catalog().on_node(&dead.url, after, PAGE) {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(node = %dead.url, error = %e, "failover could not read the catalog; retrying next round");
                return moved;
            }
        };
        let Some(last) = rows.last() else {
            break;
        };
        after = Some(last.uuid);
        for row in &rows {
            let near: Vec<&&HostNode> = live
                .iter()
                .filter(|h| !row.location.is_empty() && h.location == row.location)
                .collect();
            let target = match near.as_slice() {
                [] => live[turn % live.len()],
                some => some[turn % some.len()],
            };
            turn = turn.wrapping_add(1);
            let result = target
                .api
                .adopt(row.uuid, row.database_id, &row.account, &row.name)
                .map_err(|e| e.to_string())
                .and_then(|()| {
                    cp.catalog()
                        .set_node(row.uuid, &target.url)
                        .map_err(|e| e.to_string())
                });
            match result {
                Ok(true) => {
                    moved += 1;
                    stats.databases_moved.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(database = %row.database_id, uuid = %row.uuid, from = %dead.url, to = %target.url, "database failed over");
                }
                // Deleted meanwhile: nothing to move.
                Ok(false) => {}
                Err(e) => {
                    stats.move_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(database = %row.database_id, uuid = %row.uuid, to = %target.url, error = %e, "a failover move failed; retrying next round");
                }
            }
        }
        if (rows.len() as u64) < PAGE {
            break;
        }
    }
    moved
}

/// Runs probe rounds every `probe` until `stop` is set.
pub fn run(cp: Arc<ControlPlane>, probe: Duration, after: Duration, stop: Arc<AtomicBool>) {
    let mut detector = Detector::default();
    while !stop.load(Ordering::Relaxed) {
        detector.round(&cp, after);
        std::thread::sleep(probe);
    }
}
