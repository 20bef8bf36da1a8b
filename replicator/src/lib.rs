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
//! # Status
//!
//! Today the crate holds the identity and position types that every other
//! layer must agree on, and the log record format ([`record`]): one
//! transaction's pages with its bookmark, CRC-checked, every length bounded
//! before allocation; and the wire format of the replication protocol's
//! messages ([`wire`]). The sans-IO protocol cores come next.

pub mod bookmark;
pub mod epoch_file;
pub mod follower;
pub mod ids;
pub mod leader;
pub mod net;
pub mod node;
pub mod quorum;
pub mod record;
pub mod segments;
pub mod subscriber;
#[cfg(target_os = "linux")]
pub mod uring;
pub mod wire;

pub use bookmark::{Bookmark, BookmarkParseError, Epoch, Sequence};
pub use follower::{Follower, FollowerAction, FollowerEvent};
pub use ids::{DatabaseId, DatabaseIdParseError};
pub use leader::{
    CloseReason, Leader, LeaderAction, LeaderConfig, LeaderError, LeaderEvent, PeerId,
};
pub use quorum::{FollowerId, QuorumError, QuorumTracker};
pub use record::{Encoded, Record, RecordError};
pub use segments::{IoBackend, Recovery, SegmentError, SegmentLog};
pub use subscriber::{Source, Subscriber, SubscriberAction, SubscriberEvent};
pub use wire::{Message, RefuseReason, Role, WireError};
