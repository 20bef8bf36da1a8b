//! Where every object of a database lives in the store: the one module
//! that builds or parses object keys.
//!
//! ```text
//! <database:016x>/manifest/<sequence:016x>             a manifest version
//! <database:016x>/log/<previous>_<last>_<first_us:016x>_<last_us:016x>_<generation:08x>
//!                                                      a log object: the
//!                                                      confirmed records
//!                                                      after <previous>
//!                                                      up to <last>
//! <database:016x>/snap/<bookmark>_<generation:08x>/<part:08x>
//!                                                      part of a snapshot
//! ```
//!
//! Bookmarks are in their fixed-width text form and every number is
//! zero-padded hex, so keys sort as the positions they name and a listing
//! from an offset is a range scan. `generation` is the uploader's epoch:
//! two uploaders never write the same key unless they are in the same
//! epoch, where the bytes they write are identical (see `log_object`).
//! Nothing is ever overwritten: every put is create-only.

use walrelay_replicator::{Bookmark, DatabaseId, Epoch};

/// The key prefix of everything a database keeps in the store.
pub fn database_prefix(database: DatabaseId) -> String {
    format!("{:016x}", database.0)
}

pub fn manifest_prefix(database: DatabaseId) -> String {
    format!("{}/manifest/", database_prefix(database))
}

pub fn manifest_key(database: DatabaseId, sequence: u64) -> String {
    format!("{}{sequence:016x}", manifest_prefix(database))
}

/// The manifest sequence a key names.
pub fn parse_manifest_key(database: DatabaseId, key: &str) -> Option<u64> {
    let rest = key.strip_prefix(&manifest_prefix(database))?;
    (rest.len() == 16)
        .then(|| u64::from_str_radix(rest, 16).ok())
        .flatten()
}

pub fn log_prefix(database: DatabaseId) -> String {
    format!("{}/log/", database_prefix(database))
}

/// What a log object's key says about it (its header says it again, and
/// the two must agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogName {
    pub previous: Bookmark,
    pub last: Bookmark,
    pub first_us: u64,
    pub last_us: u64,
    pub generation: Epoch,
}

pub fn log_key(database: DatabaseId, n: &LogName) -> String {
    format!(
        "{}{}_{}_{:016x}_{:016x}_{}",
        log_prefix(database),
        n.previous,
        n.last,
        n.first_us,
        n.last_us,
        n.generation
    )
}

/// The key from which a listing of log objects reaches every object that
/// starts at or after `previous`.
pub fn log_offset(database: DatabaseId, previous: Bookmark) -> String {
    // Keys sort by their first field; the offset is exclusive, so list
    // from just before `previous`'s spelling.
    format!("{}{}", log_prefix(database), previous)
}

pub fn parse_log_key(database: DatabaseId, key: &str) -> Option<LogName> {
    let rest = key.strip_prefix(&log_prefix(database))?;
    let mut it = rest.split('_');
    let previous = it.next()?.parse().ok()?;
    let last = it.next()?.parse().ok()?;
    let first_us = hex64(it.next()?)?;
    let last_us = hex64(it.next()?)?;
    let generation = Epoch(hex32(it.next()?)?);
    if it.next().is_some() {
        return None;
    }
    Some(LogName {
        previous,
        last,
        first_us,
        last_us,
        generation,
    })
}

pub fn snapshot_prefix(database: DatabaseId) -> String {
    format!("{}/snap/", database_prefix(database))
}

/// The folder of one snapshot's parts.
pub fn snapshot_dir(database: DatabaseId, bookmark: Bookmark, generation: Epoch) -> String {
    format!("{}{bookmark}_{generation}/", snapshot_prefix(database))
}

pub fn snapshot_part_key(
    database: DatabaseId,
    bookmark: Bookmark,
    generation: Epoch,
    part: u32,
) -> String {
    format!("{}{part:08x}", snapshot_dir(database, bookmark, generation))
}

/// The snapshot (bookmark, generation) a part's key belongs to.
pub fn parse_snapshot_key(database: DatabaseId, key: &str) -> Option<(Bookmark, Epoch, u32)> {
    let rest = key.strip_prefix(&snapshot_prefix(database))?;
    let (dir, part) = rest.split_once('/')?;
    let (bookmark, generation) = dir.split_once('_')?;
    Some((
        bookmark.parse().ok()?,
        Epoch(hex32(generation)?),
        (part.len() == 8).then(|| hex32(part)).flatten()?,
    ))
}

fn hex64(s: &str) -> Option<u64> {
    (s.len() == 16
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| u64::from_str_radix(s, 16).ok())
    .flatten()
}

fn hex32(s: &str) -> Option<u32> {
    (s.len() == 8
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
    .then(|| u32::from_str_radix(s, 16).ok())
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_replicator::Sequence;

    fn bm(e: u32, s: u64) -> Bookmark {
        Bookmark::new(Epoch(e), Sequence(s))
    }

    #[test]
    fn log_keys_round_trip_and_sort_by_position() {
        let db = DatabaseId(7);
        let a = LogName {
            previous: bm(1, 9),
            last: bm(1, 20),
            first_us: 5,
            last_us: 6,
            generation: Epoch(1),
        };
        let b = LogName {
            previous: bm(2, 0),
            last: bm(2, 3),
            ..a
        };
        assert_eq!(parse_log_key(db, &log_key(db, &a)), Some(a));
        assert!(log_key(db, &a) < log_key(db, &b));
        assert!(log_offset(db, a.previous) < log_key(db, &a));
        assert_eq!(parse_log_key(DatabaseId(8), &log_key(db, &a)), None);
    }

    #[test]
    fn snapshot_and_manifest_keys_round_trip() {
        let db = DatabaseId(7);
        let k = snapshot_part_key(db, bm(3, 4), Epoch(5), 2);
        assert_eq!(parse_snapshot_key(db, &k), Some((bm(3, 4), Epoch(5), 2)));
        assert_eq!(parse_manifest_key(db, &manifest_key(db, 42)), Some(42));
        assert_eq!(parse_manifest_key(db, "0000000000000007/manifest/x"), None);
    }
}
