//! What opening a database checks about its files, and how their failures
//! are told apart: not SQLite, read-only, unreadable.

use crate::error::OpenError;
use crate::meta;
use std::path::Path;

const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

pub(super) fn path_string(p: &Path) -> String {
    p.display().to_string()
}

/// Checks the file header before SQLite touches the file: returns whether
/// the database is already in WAL mode (false for a file to be created).
pub(super) fn inspect(path: &Path) -> Result<bool, OpenError> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(OpenError::CantOpen {
                path: path_string(path),
                reason: e.to_string(),
            });
        }
    };
    let mut head = [0u8; 100];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => {
                return Err(OpenError::CantOpen {
                    path: path_string(path),
                    reason: e.to_string(),
                });
            }
        }
    }
    if n == 0 {
        return Ok(false); // empty file: SQLite treats it as a new database
    }
    if n < head.len() || &head[..16] != SQLITE_MAGIC {
        return Err(OpenError::NotADatabase {
            path: path_string(path),
        });
    }
    // Bytes 18 and 19 are the read and write format versions: 2 means WAL.
    Ok(head[18] == 2 && head[19] == 2)
}

pub(crate) fn map_open_error(path: &Path, e: rusqlite::Error) -> OpenError {
    let p = path_string(path);
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => OpenError::NotADatabase { path: p },
        Some(rusqlite::ErrorCode::ReadOnly) => OpenError::ReadOnly {
            path: p,
            reason: e.to_string(),
        },
        Some(rusqlite::ErrorCode::CannotOpen) => {
            if dir_is_read_only(path) {
                OpenError::ReadOnly {
                    path: p,
                    reason: e.to_string(),
                }
            } else {
                OpenError::CantOpen {
                    path: p,
                    reason: e.to_string(),
                }
            }
        }
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => OpenError::Corrupt {
            path: p,
            reason: e.to_string(),
        },
        _ => OpenError::Sqlite(e),
    }
}

/// Whether the directory holding `path` refuses new files: probed by
/// creating one, since permission bits lie to root.
fn dir_is_read_only(path: &Path) -> bool {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".walrelay-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            false
        }
        Err(e) => is_read_only_error(&e),
    }
}

/// EACCES, EPERM (an immutable directory) or EROFS.
fn is_read_only_error(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
        || e.kind() == std::io::ErrorKind::ReadOnlyFilesystem
        || e.raw_os_error() == Some(1)
}

pub(super) fn meta_error(path: &Path, e: meta::MetaError) -> OpenError {
    match e {
        meta::MetaError::Io(io) if is_read_only_error(&io) => OpenError::ReadOnly {
            path: path_string(path),
            reason: io.to_string(),
        },
        other => OpenError::Meta(other.to_string()),
    }
}

/// An attach that failed, told apart like a failed open: a lock file that
/// cannot be made in a read-only directory is a read-only database.
pub(crate) fn attach_error(path: &Path, e: walrelay_vfs::AttachError) -> OpenError {
    use walrelay_vfs::owner_lock::OwnerLockError;
    match e {
        walrelay_vfs::AttachError::Owner(OwnerLockError::Io { source, .. })
            if is_read_only_error(&source) =>
        {
            OpenError::ReadOnly {
                path: path_string(path),
                reason: source.to_string(),
            }
        }
        e => OpenError::Attach(e),
    }
}
