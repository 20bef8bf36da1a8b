//! The archive's errors: one enum per operation family, over a shared
//! [`StoreError`] (the backend) and [`FormatError`] (an object's bytes).

use std::path::PathBuf;
use walrelay_replicator::{Bookmark, Epoch, RecordError};

/// Why an object's bytes are not what its format says. Decoding never
/// panics and checks every size before allocating.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{what}: needs {need} bytes, has {have}")]
    Truncated {
        what: &'static str,
        need: u64,
        have: u64,
    },
    #[error("{what}: wrong magic (not a walrelay {what})")]
    Magic { what: &'static str },
    #[error("{what}: unsupported version {version}")]
    Version { what: &'static str, version: u16 },
    #[error("{what}: digest mismatch (the object is corrupt)")]
    Digest { what: &'static str },
    #[error("{what}: {len} bytes exceeds the bound of {max}")]
    TooLarge {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{what}: zstd: {why}")]
    Compression { what: &'static str, why: String },
    #[error("{what}: {why}")]
    Invalid {
        what: &'static str,
        why: &'static str,
    },
    #[error("{what}: a record inside is invalid: {source}")]
    Record {
        what: &'static str,
        #[source]
        source: RecordError,
    },
}

/// Why the object store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("store URL {url:?}: {why}")]
    Url { url: String, why: String },
    #[error("store {op} {key}: {source}")]
    Backend {
        op: &'static str,
        key: String,
        #[source]
        source: object_store::Error,
    },
    #[error(
        "{key} already holds different bytes than the ones being put (two writers of one key disagree)"
    )]
    Conflict { key: String },
    #[error("starting the store's runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

/// Why a restore (or a lookup of history) failed. None of these leave a
/// partial file at the destination.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("object {key}: {source}")]
    Format {
        key: String,
        #[source]
        source: FormatError,
    },
    #[error("the store holds nothing for this database (no manifest)")]
    NoManifest,
    #[error("bookmark {bookmark} is not archived yet (archived up to {archived})")]
    NotArchived {
        bookmark: Bookmark,
        archived: Bookmark,
    },
    #[error("bookmark {bookmark} is older than what the store retains (from {start})")]
    BeforeRetention { bookmark: Bookmark, start: Bookmark },
    #[error(
        "bookmark {bookmark} is not in the database's history (its epoch ended earlier or never ran)"
    )]
    NotInHistory { bookmark: Bookmark },
    #[error("timestamp {timestamp_us} µs is outside the retained history ({first_us} .. now)")]
    TimeOutOfRange { timestamp_us: u64, first_us: u64 },
    #[error("object {key} is missing: the store lost an object the manifest needs")]
    Missing { key: String },
    #[error("no log object continues the history after {after}: the log in the store has a gap")]
    Gap { after: Bookmark },
    #[error(
        "object {key}, written in epoch {generation}, does not chain onto the history (a fenced or diverged writer's object)"
    )]
    Diverged { key: String, generation: Epoch },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the restore was abandoned: its caller is stopping")]
    Abandoned,
}

/// Why an upload round (the archiver) failed; the archiver retries later.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error("encoding an object: {0}")]
    Format(#[from] FormatError),
    #[error("reading the local log: {0}")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("the manifest is held by epoch {manifest}, newer than this uploader's {mine}: fenced")]
    Fenced { mine: Epoch, manifest: Epoch },
    #[error(
        "the local log starts at {start}, after what the store holds ({archived}): the gap cannot be archived"
    )]
    LocalGap { start: Bookmark, archived: Bookmark },
    #[error("the snapshot was abandoned: the uploader is stopping")]
    SnapshotAbandoned,
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}
