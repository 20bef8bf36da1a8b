//! Runtimes that put the sans-IO cores on a transport and storage: one per
//! role. They hold no protocol logic of their own: every decision is the
//! core's; a runtime only routes events in and carries actions out.
//!
//! - [`follower::FollowerNode`]: a durability follower (segment log,
//!   group fdatasync, catch-up serving and fetching).
//! - [`follower_host::FollowerHost`]: one follower process serving many
//!   databases (one listener, a core and log per database opened lazily
//!   and closed when idle, one sync round for every database that has
//!   records waiting).
//! - [`leader::LeaderNode`]: the primary's side (fan-out, quorum, the
//!   confirm watch the engine's output gate waits on).
//! - `outbox`: the leader ticker's sends, written after it releases the
//!   core's lock, in order on each connection.
//! - [`replica::ReplicaNode`]: a read replica's subscriber, driving an
//!   [`replica::Applier`].
//! - [`waiters::Waiters`]: threads waiting for a position, each woken only
//!   by the advance that reaches it.

pub mod candidate;
pub mod follower;
pub mod follower_db;
mod follower_db_log;
pub mod follower_host;
pub mod leader;
mod outbox;
pub mod replica;
pub mod waiters;

use crate::leader::LeaderError;
use crate::net::{self, Backend, ClusterKey, NetHandler, Transport};
use std::sync::{Arc, OnceLock};

/// Opens a transport delivering to `handler` (authenticating every
/// connection with `key`, if given) and publishes it in `slot` before
/// returning, so it is there before any connection (listening comes after)
/// can reach the handler.
fn open_transport(
    backend: Backend,
    handler: Arc<dyn NetHandler>,
    key: Option<ClusterKey>,
    slot: &OnceLock<Arc<dyn Transport>>,
) -> Result<Arc<dyn Transport>, NodeError> {
    let transport =
        net::open(backend, handler, key).map_err(NodeError::io("opening the transport"))?;
    let _ = slot.set(Arc::clone(&transport));
    Ok(transport)
}

/// A catch-up source silent this long is dropped (and another peer tried
/// later): a frozen peer must not wedge a replica or a follower.
pub const CATCH_UP_IDLE: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// Sockets, threads, directories: `what` was being done.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the follower's promise file: {0}")]
    Promise(#[from] crate::epoch_file::EpochFileError),
    #[error("the follower's log: {0}")]
    Log(#[from] crate::segments::SegmentError),
    #[error(transparent)]
    Leader(LeaderError),
}

impl NodeError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NodeError {
        let what = what.into();
        move |source| NodeError::Io { what, source }
    }
}
