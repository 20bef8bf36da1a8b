//! Heartbeats: every open database (and every one not yet confirmed) asks
//! the control plane what it is, every interval plus a per-database
//! jitter, and corrects itself.
//!
//! - Told it is deleted (or never checkpointed: an orphan), it marks itself
//!   deleted and removes its routing entry; from then on it refuses every
//!   query, even one a stale route still sends.
//! - Told it is active, it activates itself if it was only initialised and
//!   rewrites its routing entry if the entry is missing or stale.
//! - Told it lives on another node (it failed over while this node was
//!   away, [`super::failover`]), it forgets its copy.
//! - It learns whether its account is over its storage limit.
//!
//! Closed databases do not heartbeat: the load follows active databases.

use super::Fleet;
use super::control::{Heartbeat, Verdict};
use super::host::Lifecycle;
use super::routes::Route;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use walrelay_replicator::DatabaseId;

/// A database's jitter: a fixed fraction of the interval derived from its
/// id, so that databases opened together do not beat together.
fn jitter(id: DatabaseId, interval_ms: u64, jitter_ms: u64) -> Duration {
    let spread = id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) % jitter_ms.max(1);
    Duration::from_millis(interval_ms + spread)
}

/// Beats every due database once; returns how many beat.
pub fn beat_due(fleet: &Fleet, due: &mut HashMap<DatabaseId, Instant>) -> usize {
    let Some(host) = fleet.host.as_ref() else {
        return 0;
    };
    let now = Instant::now();
    let mut ids = host.open_ids();
    ids.extend(host.unconfirmed_ids());
    ids.sort_unstable();
    ids.dedup();
    due.retain(|id, _| ids.contains(id));
    let mut beats = 0;
    for id in ids {
        let next = due.entry(id).or_insert_with(|| {
            // First sight: beat soon, within the jitter window.
            now + jitter(id, 0, fleet.config.heartbeat_jitter_ms)
        });
        if *next > now {
            continue;
        }
        *next = now
            + jitter(
                id,
                fleet.config.heartbeat_ms,
                fleet.config.heartbeat_jitter_ms,
            );
        beats += 1;
        if let Err(e) = beat_one(fleet, id) {
            tracing::warn!(database = %id, error = %e, "heartbeat failed");
        }
    }
    beats
}

/// Why one heartbeat did not complete.
#[derive(Debug, thiserror::Error)]
pub enum BeatError {
    #[error(transparent)]
    Host(#[from] super::host::HostError),
    #[error(transparent)]
    Control(#[from] super::control::ControlError),
    #[error(transparent)]
    Route(#[from] super::routes::RouteError),
}

/// One database's heartbeat and the corrections it makes.
pub fn beat_one(fleet: &Fleet, id: DatabaseId) -> Result<(), BeatError> {
    let host = fleet.host.as_ref().expect("only hosts beat");
    let Some(state) = host.state(id)? else {
        return Ok(());
    };
    if state.lifecycle == Lifecycle::Deleted {
        return Ok(());
    }
    fleet.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
    let answer = fleet.heartbeat(&Heartbeat {
        uuid: state.uuid.clone(),
        database_id: id.0,
        node: fleet.config.self_url.clone(),
    })?;
    let Some(uuid) = state.uuid() else {
        return Ok(());
    };
    match answer.verdict {
        Verdict::Deleted
            if state.lifecycle == Lifecycle::Initialised
                && super::catalog::now_ms() - state.created_at_ms
                    < fleet.config.orphan_grace_ms as i64 =>
        {
            // Its creation may still be writing the catalog row: only an
            // initialised database older than any creation attempt is an
            // orphan.
        }
        Verdict::Deleted => {
            tracing::warn!(database = %id, %uuid, "heartbeat: the catalog does not know this database as live; marking it deleted");
            host.delete(id)?;
            fleet.routes.unpublish(uuid, id)?;
        }
        Verdict::Active if answer.node != fleet.config.self_url => {
            // Failed over while this node was away: another node hosts
            // it now and writes its routing entry; this copy goes.
            tracing::warn!(database = %id, %uuid, node = %answer.node, "heartbeat: the database lives on another node now; forgetting this copy");
            host.forget(id)?;
            if fleet
                .routes
                .get(uuid)
                .is_some_and(|r| r.node == fleet.config.self_url)
            {
                fleet.routes.remove(uuid, id)?;
            }
        }
        Verdict::Active => {
            if state.lifecycle == Lifecycle::Initialised {
                tracing::info!(database = %id, %uuid, "heartbeat: activating");
                host.activate(id)?;
            }
            let want = Route {
                uuid: state.uuid.clone(),
                database_id: id.0,
                account: state.account.clone(),
                name: state.name.clone(),
                node: answer.node.clone(),
                written_at_ms: super::catalog::now_ms(),
            };
            let stale = match fleet.routes.get(uuid) {
                None => true,
                Some(r) => {
                    r.database_id != want.database_id
                        || r.node != want.node
                        || r.name != want.name
                        || r.account != want.account
                }
            };
            if stale {
                tracing::info!(database = %id, %uuid, "heartbeat: rewriting a missing or stale routing entry");
                fleet.stats.routes_repaired.fetch_add(1, Ordering::Relaxed);
            }
            // Sent to every node again: their copies are repaired too.
            fleet.routes.publish(want)?;
            fleet.set_storage_over(id, answer.storage_over);
        }
    }
    Ok(())
}

/// Runs heartbeats and idle closing until `stop` is set.
pub fn run(fleet: Arc<Fleet>, stop: Arc<std::sync::atomic::AtomicBool>) {
    let mut due = HashMap::new();
    let tick = Duration::from_millis(fleet.config.tick_ms.max(1));
    while !stop.load(Ordering::Relaxed) {
        beat_due(&fleet, &mut due);
        fleet.send_routes();
        fleet.send_report();
        if let Some(host) = &fleet.host {
            host.close_idle();
        }
        fleet.close_idle_replicas();
        std::thread::sleep(tick);
    }
}
