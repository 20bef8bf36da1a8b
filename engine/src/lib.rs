//! walrelay-engine: databases, sessions and policy; the `walrelay` binary.
//!
//! # Contract
//!
//! - [`Database::open`] opens a primary: one writer connection that
//!   serialises writes, a pool of reader connections, all through the
//!   capturing `walrelay` VFS. Every committed transaction gets the next
//!   [`Bookmark`] (epoch, sequence), strictly increasing across restarts
//!   (each open starts a new epoch), and goes to the configured
//!   [`TransactionSink`] in commit order.
//! - [`Database::session`] starts a D1-style session. Statements run through
//!   `session.prepare(sql).bind(params)` with `all`, `first`, `raw`, `run`;
//!   `session.batch` is atomic. SQLite decides read versus write
//!   (`sqlite3_stmt_readonly`); reads run on readers, writes on the writer.
//! - A session opened `with_access(Access::ReadOnly)` runs only what
//!   SQLite calls read-only; any other statement is refused with
//!   `QueryError::ReadOnlyAccess` before it runs (in a batch: the whole
//!   batch, changing nothing).
//! - Group commit (`Options::group_commit`, on by default): single
//!   INSERT, UPDATE, DELETE or REPLACE statements that queue while the
//!   writer is busy commit as one transaction, and share its bookmark;
//!   each one's outcome (its error, row id and change count) is what it
//!   would have been alone. Under load (`GROUP_DELAY_SIBLINGS` writes at
//!   the output gate) a group's leader waits `Options::
//!   group_commit_delay_us` for more to queue first.
//! - Every result carries [`Meta`], whose bookmark is at least the state
//!   the result reflects; a session's bookmark only grows.
//! - A bookmark beyond the latest issued is an error, never a wait.
//! - Errors are typed; a failed statement or batch changes nothing.
//! - If the sink refuses a transaction, the database stops serving reads
//!   and writes (`QueryError::CaptureFailed`): its local WAL now holds a
//!   transaction with no bookmark, which must never be observed. Reopening
//!   it is the recovery (a later issue rolls it back to the log).
//! - [`Replica`] is a read replica with the same sessions API: it applies
//!   page sets from a primary (`append`, invisible) and reveals each
//!   transaction atomically when it is confirmed (`confirm`); it refuses
//!   writes. [`pair`] wires an in-process primary to a fresh replica,
//!   confirming every commit at once.
//! - With an output gate ([`CommitGate`], set by
//!   [`replication::ReplicatedPrimary`]), every result — reads on the
//!   primary included — is released only once the state it reflects is
//!   confirmed by a quorum of followers; later writes commit meanwhile.
//! - [`replication`] binds a database to the replicator:
//!   `ReplicatedPrimary` (commits go to W of N followers, results wait at
//!   the gate) and `ReplicatedReplica` (a replica fed over the network),
//!   each authenticating its replication connections with a
//!   [`ClusterKey`] unless configured with `auth: None`.
//!   [`http`] is a node's D1-shaped HTTP face with bearer-token
//!   authentication, replica write forwarding and a session client;
//!   [`local_cluster`] runs a whole cluster in one
//!   process.
//! - Clients' SQL runs in a sandbox like D1's (refusals: [`Refusal`]):
//!   no ATTACH, only D1's pragmas, no raw pages or extensions, settings
//!   reset between requests, and SQLite enforcing [`Limits`]; a refusal or
//!   a limit is a typed [`QueryError`] and changes nothing.
//! - Every statement (or batch) is bounded by [`Limits`]: its run time
//!   (`QueryError::Timeout`, its effect rolled back), its result size
//!   (`QueryError::ResponseTooLarge`) and its wait for a connection
//!   (`QueryError::Busy`). A session given a [`CancelToken`]
//!   ([`Session::cancel_with`]) stops when it is cancelled;
//!   [`Database::stop_queries`] stops every query of a database.
//! - A write transaction larger than `Limits::max_transaction_bytes` is
//!   refused before it commits (`QueryError::TransactionTooLarge`); any
//!   smaller one replicates, as chunks when it is larger than a log record.
//! - The engine runs checkpoints (PASSIVE past a threshold, or on request);
//!   SQLite's automatic checkpoints are off.
//! - With cold storage (`walrelay_archive`): followers upload their
//!   confirmed log and snapshots ([`archiving`]) and release what the
//!   store covers, so their logs stay bounded; a primary that must rebuild
//!   and a replica with no database start from the store's newest state
//!   ([`replication::bootstrap`]); [`Database::restore_in_place`] makes a
//!   primary equal to an older version of itself as one new transaction
//!   (time travel, [`http::time_travel`]).
//!
//! ```
//! use walrelay_engine::{Constraint, Database, Options};
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("app.db");
//! let db = Database::open(&path, Options::default())?;
//! let session = db.session(Constraint::FirstUnconstrained)?;
//! session.prepare("CREATE TABLE orders(id INTEGER PRIMARY KEY, item TEXT)").run()?;
//! let r = session.prepare("INSERT INTO orders(item) VALUES (?1)").bind(["book"]).run()?;
//! assert_eq!(r.meta.changes, 1);
//!
//! // Later, anywhere: continue from that bookmark and see at least that state.
//! let s2 = db.session(Constraint::Bookmark(session.bookmark().expect("wrote")))?;
//! let rows = s2.prepare("SELECT * FROM orders").all()?;
//! assert_eq!(rows.results.len(), 1);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod archiving;
mod conn_handle;
mod database;
pub mod dump;
mod error;
mod execution;
pub mod fleet;
mod group_commit;
mod group_run;
mod group_write;
mod group_write_async;
pub mod host_archiving;
pub mod http;
pub mod limits;
pub mod local_cluster;
mod meta;
mod mmap_budget;
mod pool;
mod read_on_worker;
pub mod recovery;
mod replica;
pub mod replication;
mod restore_in_place;
mod sandbox;
mod session;
mod split;
mod statement;
pub mod stop_marker;
mod value;

pub use database::{
    CheckpointMode, CheckpointStats, CommitGate, Database, GROUP_DELAY_SIBLINGS, GateError,
    MAX_GROUP_COMMIT_DELAY_US, Options, ShipError, Synchronous, TransactionSink,
};
pub use error::{CheckpointError, OpenError, QueryError, SessionError};
pub use execution::CancelToken;
pub use group_write::GroupCommitStats;
pub use limits::{Limits, MIN_TRANSACTION_BYTES};
pub use replica::{Replica, ReplicaFeed, ReplicaOptions, pair};
pub use sandbox::Refusal;
pub use session::{Access, Constraint, Meta, QueryResult, RawResult, Session, Statement};
pub use value::{Row, Value};
pub use walrelay_replicator::{Bookmark, BookmarkParseError, ClusterKey, Epoch, Sequence};
pub use walrelay_vfs::{Appended, ApplyError, CaptureStats, CapturedTransaction, PageNo, PageSet};
