//! The seams a database is plugged into: where its committed transactions
//! go (a [`TransactionSink`]) and what a write waits for before it is
//! answered (a [`CommitGate`]). The replicator implements both.

use walrelay_replicator::{Bookmark, Epoch};
use walrelay_vfs::CapturedTransaction;

/// Where each committed transaction goes once it has a bookmark: the seam the
/// replicator plugs into. Called in commit order while SQLite still holds
/// the WAL write lock; an error stops the database from taking writes.
pub trait TransactionSink: Send + Sync {
    /// How many consecutive log positions `txn` takes (a sink that ships a
    /// large transaction as several chunks takes one per chunk). The
    /// transaction's bookmark is the last of them.
    fn positions(&self, _txn: &CapturedTransaction) -> u64 {
        1
    }
    fn committed(&self, bookmark: Bookmark, txn: &CapturedTransaction) -> Result<(), ShipError>;
}

/// Why a [`TransactionSink`] did not take a committed transaction. The
/// transaction is in the local WAL either way; the database then takes no
/// further writes (`QueryError::CaptureFailed`).
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("replication is not started")]
    NotStarted,
    #[error("the transaction could not be built as log records: {0}")]
    Encode(#[from] walrelay_replicator::RecordError),
    #[error("the leader refused a record: {0}")]
    Leader(#[from] walrelay_replicator::LeaderError),
    #[error("a chunk of a large transaction was not confirmed: {0}")]
    Chunk(#[source] GateError),
    #[error("the issuer reserved {reserved} positions for {chunks} chunks")]
    Positions { reserved: u64, chunks: u64 },
    #[error("an in-process replica refused the transaction: {0}")]
    Replica(#[from] walrelay_vfs::ApplyError),
}

/// The output gate: holds every result until the state it reflects is
/// confirmed (durable on W followers). Writes go on committing behind it
/// (pipelining); only their results wait.
pub trait CommitGate: Send + Sync {
    /// Called before a write starts: waits, bounded, while too much is
    /// committed but unconfirmed; an error means the write must not run.
    fn admit_write(&self) -> Result<(), GateError>;
    /// Waits, bounded, until `bookmark` is confirmed.
    fn wait_confirmed(&self, bookmark: Bookmark) -> Result<(), GateError>;
    /// Runs `wake` once `bookmark` is confirmed, or once it cannot be
    /// (the gate failed for good); at once if that is already so. Quick
    /// code only: it runs where the confirmation arrives. What it wakes
    /// still calls [`Self::wait_confirmed`], which then does not sleep;
    /// `wake` is a hint that saves a wake-up, never the gate itself. The
    /// default runs it at once.
    fn on_confirmed(&self, bookmark: Bookmark, wake: Box<dyn FnOnce() + Send>) {
        let _ = bookmark;
        wake();
    }
    /// [`Self::admit_write`] without waiting: None when it would wait (the
    /// caller then calls it). The default always says so.
    fn try_admit_write(&self) -> Option<Result<(), GateError>> {
        None
    }
    /// [`Self::wait_confirmed`] without waiting: None while `bookmark` is
    /// not confirmed and still may be. The default always says so.
    fn poll_confirmed(&self, bookmark: Bookmark) -> Option<Result<(), GateError>> {
        let _ = bookmark;
        None
    }
}

/// Why the gate did not open. Typed, because what happens next depends on
/// it: a fenced primary must stop serving writes for good, a timeout may
/// pass when followers return, a backlog is a moment's congestion.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("replication is not started")]
    NotStarted,
    #[error("the primary is stopping")]
    Stopping,
    #[error(
        "{unconfirmed_bytes} bytes committed but unconfirmed (limit {limit_bytes}); {streaming} followers streaming"
    )]
    Backlog {
        unconfirmed_bytes: usize,
        limit_bytes: usize,
        streaming: usize,
    },
    #[error(
        "not confirmed after {waited_ms} ms, the last {quiet_ms} ms with no confirmation at all: fewer than {write_quorum} followers reachable ({streaming} streaming)"
    )]
    Timeout {
        waited_ms: u64,
        /// How long the confirmed point stood still before the wait gave up.
        quiet_ms: u64,
        write_quorum: usize,
        streaming: usize,
    },
    #[error("this primary was fenced by epoch {}", .0.0)]
    Fenced(Epoch),
}

impl From<walrelay_replicator::node::leader::ConfirmError> for GateError {
    fn from(e: walrelay_replicator::node::leader::ConfirmError) -> GateError {
        use walrelay_replicator::node::leader::ConfirmError;
        match e {
            ConfirmError::Timeout {
                waited_ms,
                quiet_ms,
                write_quorum,
                streaming,
                ..
            } => GateError::Timeout {
                waited_ms,
                quiet_ms,
                write_quorum,
                streaming,
            },
            ConfirmError::Fenced(epoch) => GateError::Fenced(epoch),
        }
    }
}
