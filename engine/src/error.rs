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
    #[error(
        "epoch {epoch} is the last one: bookmarks would repeat if the database opened again as a primary"
    )]
    EpochExhausted { epoch: u32 },
    #[error("epoch {epoch} is not newer than the stored epoch {stored}")]
    EpochNotNewer { epoch: u32, stored: u32 },
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
    /// A text of several statements binds its parameters to the last one
    /// (as D1 does); an earlier one took parameters.
    #[error(
        "only the last statement of a multi-statement query may take parameters (they bind to it); send the others separately or in a batch"
    )]
    ParametersNotLast,
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
    #[error(
        "the transaction changes more than {limit_bytes} bytes of pages; it was refused before it committed and changed nothing"
    )]
    TransactionTooLarge { limit_bytes: u64 },
    #[error("bookmark sequence exhausted for this epoch")]
    SequenceExhausted,
    #[error(
        "not confirmed: the state at bookmark {bookmark} is not yet durable on a quorum of followers ({reason}); a write may still become durable when followers return"
    )]
    NotConfirmed {
        bookmark: Bookmark,
        #[source]
        reason: crate::database::GateError,
    },
    #[error("write not started: {reason}")]
    WriteNotAdmitted {
        #[source]
        reason: crate::database::GateError,
    },
    #[error("not authorized: {0}")]
    NotAuthorized(crate::sandbox::Refusal),
    #[error("the SQL statement is longer than the limit (max_sql_bytes): {message}")]
    SqlTooLong { message: String },
    #[error("too many bound parameters (the limit is max_params): {message}")]
    TooManyParameters { message: String },
    #[error("a string, blob or row is larger than the limit (max_value_bytes): {message}")]
    ValueTooLarge { message: String },
    #[error("too many columns (the limit is max_columns): {message}")]
    TooManyColumns { message: String },
    #[error(
        "the database size limit was reached: the database may not grow past {max_bytes} bytes"
    )]
    DatabaseFull { max_bytes: u64 },
    /// The account is over its storage limit (D1's Free plan: 5 GB): a
    /// write that would grow the database is refused; one that frees
    /// space or rewrites pages in place is not.
    #[error(
        "the account is over its storage limit: writes that would grow the database are refused until it is under it again"
    )]
    StorageLimit,
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
    #[error(
        "the query ran longer than the limit of {limit_ms} ms and was stopped; nothing it did was kept"
    )]
    Timeout { limit_ms: u64 },
    #[error("the query was cancelled (its client went away)")]
    Cancelled,
    #[error("the database is stopping and runs no more queries")]
    Stopping,
    /// The write was queued for a group commit whose leader failed before
    /// answering: whether it committed is unknown (as with a lost
    /// connection; its bookmark, if any, was never released).
    #[error("the write's group commit ended without an answer; whether it committed is unknown")]
    WriteAbandoned,
    #[error("busy: waited {waited_ms} ms for {resource}; retry later")]
    Busy {
        resource: &'static str,
        waited_ms: u64,
    },
    #[error(
        "the result exceeds the response limit of {limit_bytes} bytes; nothing the statement did was kept"
    )]
    ResponseTooLarge { limit_bytes: u64 },
}

pub(crate) const REFUSED_STATEMENT: &str = "transaction control (BEGIN, COMMIT, ROLLBACK, \
    SAVEPOINT outside a batch) and ATTACH are not supported; use batch() for atomic \
    multi-statement work";

impl QueryError {
    /// Classifies a SQLite error: the sandbox's refusals (at prepare or, for
    /// VACUUM INTO, at run time) become `NotAuthorized` (transaction control
    /// stays `NotSupported`), and the limits SQLite enforces their own
    /// variants.
    pub(crate) fn sql(e: rusqlite::Error) -> QueryError {
        if e.sqlite_error_code() == Some(rusqlite::ErrorCode::AuthorizationForStatementDenied) {
            return match crate::sandbox::take_refusal() {
                None | Some(crate::sandbox::Refusal::TransactionControl) => {
                    QueryError::NotSupported(REFUSED_STATEMENT.into())
                }
                Some(r) => QueryError::NotAuthorized(r),
            };
        }
        let code = match &e {
            rusqlite::Error::SqliteFailure(f, _) => Some(f.extended_code),
            _ => None,
        };
        let message = e.to_string();
        match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::TooBig) if message.contains("statement too long") => {
                QueryError::SqlTooLong { message }
            }
            Some(rusqlite::ErrorCode::TooBig) => QueryError::ValueTooLarge { message },
            _ if message.contains("too many SQL variables")
                || message.contains("variable number must be between") =>
            {
                QueryError::TooManyParameters { message }
            }
            _ if message.contains("too many columns") => QueryError::TooManyColumns { message },
            _ => QueryError::Sql { message, code },
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
