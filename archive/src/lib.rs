//! Cold storage for walrelay: a database's confirmed log and snapshots in
//! an object store, and restores of any retained bookmark from them.
//!
//! The contract:
//! - Only confirmed records are archived ([`archiver`] reads them from a
//!   durability follower's log), as immutable, create-only objects named
//!   by bookmark range and the uploader's epoch ([`names`]). Any uploader
//!   writes identical bytes for an identical run.
//! - A manifest per database, updated by compare-and-swap, says how far
//!   the log is archived, which snapshots exist and where the retained
//!   history starts ([`manifest`]). Everything is per [`DatabaseId`].
//! - A restore ([`restore`]) rebuilds the database at any retained
//!   bookmark from the newest snapshot before it plus the log after it,
//!   verifying every object (digests, record CRCs, the record chain and
//!   the manifest's epoch history); it never returns a silently wrong
//!   database: a missing, corrupt or foreign object is a typed error.
//! - Each record carries its commit time, so a time names a bookmark
//!   ([`reader::Archive::bookmark_at_time`]).
//! - A snapshot costs the parts the log changed since the previous one:
//!   the others carry their compressed pages over unchanged, and every
//!   object is byte for byte what a whole build would write.
//!
//! Formats, one module each, with byte diagrams: [`log_object`],
//! [`snapshot`], [`manifest`].
//!
//! [`DatabaseId`]: walrelay_replicator::DatabaseId

pub mod archiver;
mod codec;
pub mod error;
pub mod fork;
pub mod image;
pub mod log_object;
pub mod manifest;
pub mod names;
pub mod reader;
pub mod restore;
pub mod snapshot;
pub mod store;
#[cfg(feature = "test-support")]
pub mod testing;

pub use archiver::{
    Archiver, ArchiverConfig, ArchiverStats, Flush, OffPath, RoundReport, Source, SourceError,
};
pub use error::{ArchiveError, FormatError, RestoreError, StoreError};
pub use fork::{ForkError, Forked, fork};
pub use manifest::{Manifest, SnapshotEntry};
pub use reader::{Archive, Plan};
pub use restore::{NoProgress, Progress, Restored, restore_to_file};
pub use store::Store;
