//! Typed errors, one enum per operation family.

use walrelay_replicator::{Bookmark, BookmarkParseError};

/// Why [`crate::Database::open`] failed. Nothing on disk was changed.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path} is not a SQLite database")]
    NotADatabase { path: String },
    #[error("{path} is not writable: {reason}")]
    ReadOnly { path: String, reason: String },
    #[error("cannot open {path}: {reason}")]
    CantOpen { path: String, reason: String },
    #[error("{path} has a WAL that walrelay cannot read: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("invalid options: {0}")]
    Options(String),
    #[error(transparent)]
    Attach(#[from] walrelay_vfs::AttachError),
    #[error(transparent)]
    Replica(#[from] walrelay_vfs::ReplicaOpenError),
    #[error("metadata file: {0}")]
    Meta(String),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Why a session could not be created or continued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    #[error("malformed bookmark: {0}")]
    MalformedBookmark(#[from] BookmarkParseError),
    #[error("bookmark {requested} is beyond the latest this database has issued ({latest})")]
    FutureBookmark {
        requested: Bookmark,
        latest: Bookmark,
    },
}

/// Why a statement or batch failed. A failed statement or batch changed
/// nothing (its transaction was rolled back), with one exception:
/// `NotConfirmed`, where the write committed locally and its outcome is
/// decided by whether followers return (an ambiguous commit).
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("SQL error: {message}")]
    Sql { message: String, code: Option<i32> },
    #[error("statement expects {expected} parameters, {given} given")]
    ParameterCount { expected: usize, given: usize },
    #[error("{0}")]
    NotSupported(String),
    #[error("statement {index} of the batch failed: {source}")]
    Batch {
        index: usize,
        #[source]
        source: Box<QueryError>,
    },
    #[error("the database stopped taking writes because capture failed: {0}")]
    CaptureFailed(#[from] walrelay_vfs::CaptureError),
    #[error("bookmark sequence exhausted for this epoch")]
    SequenceExhausted,
    #[error(
        "not confirmed: the state at bookmark {bookmark} is not yet durable on a quorum of followers ({reason}); a write may still become durable when followers return"
    )]
    NotConfirmed { bookmark: Bookmark, reason: String },
    #[error("write not started: {reason}")]
    WriteNotAdmitted { reason: String },
    #[error("this is a read replica: it runs only read-only statements")]
    ReadOnlyReplica,
    /// The session has read-only access and the statement writes.
    #[error("read-only access: the statement writes, and this session may only read")]
    ReadOnlyAccess,
    #[error(
        "the replica has not applied bookmark {requested} within {waited_ms} ms (it is at {visible})"
    )]
    ReplicaBehind {
        requested: Bookmark,
        visible: Bookmark,
        waited_ms: u64,
    },
}

pub(crate) const REFUSED_STATEMENT: &str = "transaction control (BEGIN, COMMIT, ROLLBACK, \
    SAVEPOINT outside a batch) and ATTACH are not supported; use batch() for atomic \
    multi-statement work";

impl QueryError {
    /// Classifies a SQLite error; the authorizer's refusals (at prepare or,
    /// for ATTACH, at run time) become `NotSupported`.
    pub(crate) fn sql(e: rusqlite::Error) -> QueryError {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::AuthorizationForStatementDenied) {
            return QueryError::NotSupported(REFUSED_STATEMENT.into());
        }
        let code = match &e {
            rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code),
            _ => None,
        };
        QueryError::Sql {
            message: e.to_string(),
            code,
        }
    }
}

/// Why a checkpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoint failed with SQLite code {code}")]
    Sqlite { code: i32 },
    #[error("checkpoint could not finish: readers or a writer are busy (SQLITE_BUSY)")]
    Busy,
}
