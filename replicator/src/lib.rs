//! Replication of opaque transaction records for walrelay.
//!
//! # Contract
//!
//! The replicator ships, stores and confirms *transaction records*: byte
//! payloads it treats as opaque, each stamped with a [`Bookmark`] that says
//! where it sits in the history of one database ([`DatabaseId`]). It never
//! looks inside a record and never links SQLite; turning a committed SQLite
//! transaction into a record (and back) is the job of the VFS and engine
//! crates. Keeping that boundary means the log format and wire protocol can
//! be tested, fuzzed and reasoned about without a database in the loop, and a
//! SQLite upgrade can never change what the replicator accepts.
//!
//! # Layers
//!
//! - Formats, each owned by one module: the log record ([`record`]), the
//!   wire messages ([`wire`]), a follower's accepted epoch ([`epoch_file`]).
//! - Sans-IO protocol cores, events in and actions out: the [`leader`]
//!   (fan-out, W-of-N quorum through [`quorum`], confirms to replicas, a tail
//!   for lagging peers, fencing), the durability [`follower`] and the
//!   replica [`subscriber`]. A seeded simulator and the real runtimes drive
//!   the same cores.
//! - Storage: the follower's [`segments`] log (preallocated segments,
//!   each prepared ahead of need on a thread of its own, group
//!   fdatasync through io_uring where available, appends written in
//!   whole blocks with `O_DIRECT` where the filesystem takes it
//!   (`direct_io`), torn-tail recovery, and
//!   retention: a prefix archived in cold storage is released, the log
//!   then starts after it).
//! - Transports ([`net`]): io_uring on Linux, a portable std fallback,
//!   chosen at run time, behind one contract; with a [`ClusterKey`] every
//!   connection is mutually authenticated and every frame tagged
//!   ([`net::auth`]).
//! - Runtimes ([`node`]): a core on a transport and storage, one per role.
//!
//! # Guarantees
//!
//! - A record is confirmed only once W of N followers acknowledged it as
//!   durable, and W must be a majority.
//! - A follower acknowledges only what a completed sync covers, and a
//!   restarted follower counts as durable only what it has synced again.
//! - A replica reveals only confirmed records, in order, and exactly the
//!   leader's history.
//! - A log releases only confirmed, durable records (the archiver's, once
//!   cold storage holds them); a read from before a log's start is an
//!   error or an [`Archived`](wire::Message::Archived) answer, never a
//!   silent skip.
//! - Decoders check every size before allocating; bad input is a typed
//!   error or a closed connection, never a panic.

pub mod background;
pub mod bookmark;
pub mod chain;
mod direct_io;
pub mod election;
pub mod epoch_file;
pub mod follower;
pub mod history;
pub mod ids;
pub mod leader;
pub mod marker;
pub mod net;
pub mod node;
mod page_zstd;
mod prealloc;
pub mod quorum;
pub mod record;
mod recycle;
pub mod segments;
pub mod shared_log;
pub mod subscriber;
pub mod unlink;
#[cfg(target_os = "linux")]
pub mod uring;
pub mod wire;

pub use bookmark::{Bookmark, BookmarkParseError, Epoch, Sequence};
pub use chain::ChainHash;
pub use follower::{Follower, FollowerAction, FollowerEvent};
pub use history::History;
pub use ids::{DatabaseId, DatabaseIdParseError, NodeId};
pub use leader::{
    CloseReason, Leader, LeaderAction, LeaderConfig, LeaderError, LeaderEvent, PeerId,
};
pub use net::{ClusterKey, KeyFileError};
pub use quorum::{FollowerId, QuorumError, QuorumTracker};
pub use record::{Encoded, PageCompression, Record, RecordError};
pub use segments::{IoBackend, ReadPlan, Recovery, Released, SegmentError, SegmentLog};
pub use subscriber::{Source, Subscriber, SubscriberAction, SubscriberEvent};
pub use wire::{Message, RefuseReason, Role, WireError};
