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
//! Today the crate holds only the identity and position types that every
//! other layer must agree on. The log format and the replication protocol
//! will be added here later and will be expressed in terms of these types.

pub mod bookmark;
pub mod ids;

pub use bookmark::{Bookmark, BookmarkParseError, Epoch, Sequence};
pub use ids::{DatabaseId, DatabaseIdParseError};
