//! The API token store: a JSON file of token hashes. This module is the
//! only place that reads or writes it.
//!
//! ```text
//! {
//!   "format": "walrelay-tokens",
//!   "version": 1,
//!   "tokens": [
//!     {"id": "3f9a0c1d2e4b5a69",             16 lowercase hex digits, unique
//!      "sha256": "<64 lowercase hex digits>", SHA-256 of the secret's 32 bytes
//!      "scope": "all" | {"database": "main"},
//!      "permission": "read" | "read_write",
//!      "created_at_unix_s": 1764500000},
//!     ...
//!   ]
//! }
//! ```
//!
//! The secret itself is never written: it is printed once, when minted.
//! Unknown fields, a duplicate id, a bad hash, more than [`MAX_TOKENS`]
//! entries or a file over [`MAX_STORE_BYTES`] make the whole file invalid.
//!
//! Writers ([`create`]) take an exclusive `flock` on `<file>.lock`, read
//! the store, and replace it with a new file (mode 0600) through rename,
//! so a reader sees the old store or the new one, never half of one.
//!
//! A node ([`TokenStore`]) loads the file at start (an invalid or missing
//! file is an error then) and checks at most once per
//! [`RELOAD_CHECK_MS`] whether it changed (mtime, size, inode); a changed
//! valid file replaces the tokens in memory, a changed invalid (or
//! vanished) one is reported once and the tokens loaded before stay.

use super::auth::{ApiToken, AuthError, Grant, Permission, Scope, SecretHash, TokenId};
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime};

const FORMAT: &str = "walrelay-tokens";
const VERSION: u32 = 1;
/// The most tokens one store holds.
pub const MAX_TOKENS: usize = 10_000;
/// The largest store file a node reads.
pub const MAX_STORE_BYTES: u64 = 4 << 20;
/// How often, at most, a node looks at the file for changes.
pub const RELOAD_CHECK_MS: u64 = 1_000;

/// Why a store could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("token store {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("token store {path} is larger than {MAX_STORE_BYTES} bytes")]
    TooLarge { path: String },
    #[error("token store {path} is not valid: {reason}")]
    Invalid { path: String, reason: String },
    #[error("token store {path} already holds {MAX_TOKENS} tokens")]
    Full { path: String },
    #[error(transparent)]
    Random(#[from] super::auth::RandomError),
}

/// One token as stored.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: TokenId,
    pub hash: SecretHash,
    pub scope: Scope,
    pub permission: Permission,
    pub created_at_unix_s: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileJson {
    format: String,
    version: u32,
    tokens: Vec<EntryJson>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryJson {
    id: String,
    sha256: String,
    scope: Scope,
    permission: Permission,
    created_at_unix_s: u64,
}

fn path_string(p: &Path) -> String {
    p.display().to_string()
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path_string(path);
    move |source| StoreError::Io { path, source }
}

/// Parses a store file's bytes.
fn decode(path: &Path, bytes: &[u8]) -> Result<Vec<Entry>, StoreError> {
    let invalid = |reason: String| StoreError::Invalid {
        path: path_string(path),
        reason,
    };
    let file: FileJson = serde_json::from_slice(bytes).map_err(|e| invalid(e.to_string()))?;
    if file.format != FORMAT {
        return Err(invalid(format!(
            "\"format\" is {:?}, not {FORMAT:?}",
            file.format
        )));
    }
    if file.version != VERSION {
        return Err(invalid(format!(
            "version {} (this build reads {VERSION})",
            file.version
        )));
    }
    if file.tokens.len() > MAX_TOKENS {
        return Err(invalid(format!("more than {MAX_TOKENS} tokens")));
    }
    let mut seen = std::collections::HashSet::new();
    file.tokens
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let id: TokenId = e
                .id
                .parse()
                .map_err(|_| invalid(format!("token {i}: id {:?} is not 16 hex digits", e.id)))?;
            if !seen.insert(id) {
                return Err(invalid(format!("token {i}: id {id} appears twice")));
            }
            let hash = SecretHash::from_hex(&e.sha256)
                .ok_or_else(|| invalid(format!("token {id}: sha256 is not 64 hex digits")))?;
            if matches!(&e.scope, Scope::Database(d) if d.is_empty()) {
                return Err(invalid(format!("token {id}: an empty database name")));
            }
            Ok(Entry {
                id,
                hash,
                scope: e.scope,
                permission: e.permission,
                created_at_unix_s: e.created_at_unix_s,
            })
        })
        .collect()
}

fn encode(entries: &[Entry]) -> Vec<u8> {
    let file = FileJson {
        format: FORMAT.into(),
        version: VERSION,
        tokens: entries
            .iter()
            .map(|e| EntryJson {
                id: e.id.to_string(),
                sha256: e.hash.to_hex(),
                scope: e.scope.clone(),
                permission: e.permission,
                created_at_unix_s: e.created_at_unix_s,
            })
            .collect(),
    };
    let mut out = serde_json::to_vec_pretty(&file).unwrap_or_default();
    out.push(b'\n');
    out
}

/// What identifies one version of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_s: i64,
    mtime_ns: i64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_s: m.mtime(),
            mtime_ns: m.mtime_nsec(),
        }
    }
}

/// Reads and parses the store, and the stamp of what was read.
fn load(path: &Path) -> Result<(Vec<Entry>, Stamp), StoreError> {
    let f = File::open(path).map_err(io_error(path))?;
    let stamp = Stamp::of(&f.metadata().map_err(io_error(path))?);
    if stamp.len > MAX_STORE_BYTES {
        return Err(StoreError::TooLarge {
            path: path_string(path),
        });
    }
    let mut bytes = Vec::new();
    f.take(MAX_STORE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_error(path))?;
    if bytes.len() as u64 > MAX_STORE_BYTES {
        return Err(StoreError::TooLarge {
            path: path_string(path),
        });
    }
    Ok((decode(path, &bytes)?, stamp))
}

/// Every entry of the store at `path`.
pub fn read(path: &Path) -> Result<Vec<Entry>, StoreError> {
    load(path).map(|(entries, _)| entries)
}

/// Holds an exclusive `flock` on `<store>.lock` while alive.
struct WriteLock {
    _file: File,
}

impl WriteLock {
    fn take(store: &Path) -> Result<WriteLock, StoreError> {
        let mut name = store.as_os_str().to_owned();
        name.push(".lock");
        let lock_path = PathBuf::from(name);
        let f = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_error(&lock_path))?;
        // SAFETY: flock(2) on a descriptor this File owns for the call.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if rc != 0 {
            return Err(io_error(&lock_path)(std::io::Error::last_os_error()));
        }
        // Released when the descriptor closes (on drop).
        Ok(WriteLock { _file: f })
    }
}

/// Replaces the store with `entries`: a new file beside it (mode 0600),
/// synced, renamed over the old one, and the directory synced.
fn write(path: &Path, entries: &[Entry]) -> Result<(), StoreError> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = PathBuf::from(tmp_name);
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_error(&tmp))?;
    f.write_all(&encode(entries)).map_err(io_error(&tmp))?;
    f.sync_all().map_err(io_error(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_error(path))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error(dir))?;
    Ok(())
}

/// Mints a token into the store at `path` (created if absent) and returns
/// it: the only time its secret exists outside the caller.
pub fn create(path: &Path, scope: Scope, permission: Permission) -> Result<ApiToken, StoreError> {
    let _lock = WriteLock::take(path)?;
    let mut entries = match read(path) {
        Ok(e) => e,
        Err(StoreError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Vec::new()
        }
        Err(e) => return Err(e),
    };
    if entries.len() >= MAX_TOKENS {
        return Err(StoreError::Full {
            path: path_string(path),
        });
    }
    let token = loop {
        let t = ApiToken::generate()?;
        if entries.iter().all(|e| e.id != t.id()) {
            break t;
        }
    };
    entries.push(Entry {
        id: token.id(),
        hash: token.hash(),
        scope,
        permission,
        created_at_unix_s: SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    write(path, &entries)?;
    Ok(token)
}

/// Removes the token `id` from the store; whether it was there.
pub fn revoke(path: &Path, id: TokenId) -> Result<bool, StoreError> {
    let _lock = WriteLock::take(path)?;
    let mut entries = read(path)?;
    let before = entries.len();
    entries.retain(|e| e.id != id);
    if entries.len() == before {
        return Ok(false);
    }
    write(path, &entries)?;
    Ok(true)
}

#[derive(Debug)]
struct Loaded {
    tokens: HashMap<TokenId, Entry>,
    stamp: Stamp,
}

/// A node's view of a store file, reloaded when the file changes.
#[derive(Debug)]
pub struct TokenStore {
    path: PathBuf,
    loaded: RwLock<Loaded>,
    started: Instant,
    /// When the file was last looked at, ms since `started`.
    checked_ms: AtomicU64,
    /// The version of the file that last failed to load (reported once).
    failed: Mutex<Option<Stamp>>,
}

impl TokenStore {
    /// Loads the store at `path`: it must exist and be valid.
    pub fn open(path: impl Into<PathBuf>) -> Result<TokenStore, StoreError> {
        let path = path.into();
        let (entries, stamp) = load(&path)?;
        Ok(TokenStore {
            loaded: RwLock::new(Loaded {
                tokens: entries.into_iter().map(|e| (e.id, e)).collect(),
                stamp,
            }),
            path,
            started: Instant::now(),
            checked_ms: AtomicU64::new(0),
            failed: Mutex::new(None),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many tokens are loaded.
    pub fn len(&self) -> usize {
        self.loaded.read().tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What `token` grants, if it is in the store with this secret.
    pub fn verify(&self, token: &ApiToken) -> Result<Grant, AuthError> {
        self.maybe_reload();
        let loaded = self.loaded.read();
        let entry = loaded
            .tokens
            .get(&token.id())
            .ok_or(AuthError::Unknown(token.id()))?;
        if !entry.hash.matches(token) {
            return Err(AuthError::WrongSecret(token.id()));
        }
        Ok(Grant {
            scope: entry.scope.clone(),
            permission: entry.permission,
        })
    }

    /// Looks at the file if the last look was [`RELOAD_CHECK_MS`] ago or
    /// more (one caller looks; the others go on with what is loaded).
    fn maybe_reload(&self) {
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.checked_ms.load(Ordering::Relaxed);
        if now_ms < last.saturating_add(RELOAD_CHECK_MS)
            || self
                .checked_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        self.reload();
    }

    /// Reloads the file now if it changed since it was loaded; whether
    /// the tokens in memory were replaced.
    pub fn reload(&self) -> bool {
        let stamp = match std::fs::metadata(&self.path) {
            Ok(m) => Stamp::of(&m),
            Err(e) => {
                self.report(None, &io_error(&self.path)(e));
                return false;
            }
        };
        if stamp == self.loaded.read().stamp {
            return false;
        }
        match load(&self.path) {
            Ok((entries, stamp)) => {
                *self.loaded.write() = Loaded {
                    tokens: entries.into_iter().map(|e| (e.id, e)).collect(),
                    stamp,
                };
                *self.failed.lock() = None;
                true
            }
            Err(e) => {
                self.report(Some(stamp), &e);
                false
            }
        }
    }

    /// Says once per bad version of the file that it was not loaded.
    fn report(&self, stamp: Option<Stamp>, e: &StoreError) {
        let mut failed = self.failed.lock();
        let key = stamp.unwrap_or(Stamp {
            dev: 0,
            ino: 0,
            len: 0,
            mtime_s: 0,
            mtime_ns: 0,
        });
        if *failed != Some(key) {
            *failed = Some(key);
            eprintln!(
                "walrelay: {e}; keeping the {} tokens loaded before",
                self.len()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_path() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("tokens");
        (dir, path)
    }

    #[test]
    fn a_minted_token_is_stored_as_a_hash_and_verifies_with_its_grant() {
        let (_dir, path) = store_path();
        let t = create(&path, Scope::Database("main".into()), Permission::Read).expect("mint");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(
            !text.contains(&t.expose()[21..]),
            "the secret is not stored"
        );
        assert!(text.contains(&t.id().to_string()));
        assert!(text.contains(&t.hash().to_hex()));
        let mode = std::fs::metadata(&path).expect("meta").mode() & 0o777;
        assert_eq!(mode, 0o600);
        let store = TokenStore::open(&path).expect("open");
        assert_eq!(
            store.verify(&t).expect("valid"),
            Grant {
                scope: Scope::Database("main".into()),
                permission: Permission::Read
            }
        );
        let stranger = ApiToken::generate().expect("rng");
        assert_eq!(
            store.verify(&stranger),
            Err(AuthError::Unknown(stranger.id()))
        );
    }

    #[test]
    fn a_store_reloads_when_the_file_changes_and_keeps_its_tokens_when_the_new_file_is_bad() {
        let (_dir, path) = store_path();
        let first = create(&path, Scope::All, Permission::ReadWrite).expect("mint");
        let store = TokenStore::open(&path).expect("open");
        let second = create(&path, Scope::All, Permission::Read).expect("mint");
        assert!(store.reload(), "a new file is loaded");
        assert!(store.verify(&second).is_ok());
        std::fs::write(&path, b"{ not json").expect("write");
        assert!(!store.reload(), "a bad file is not loaded");
        assert!(store.verify(&first).is_ok() && store.verify(&second).is_ok());
        std::fs::remove_file(&path).expect("rm");
        assert!(!store.reload());
        assert!(
            store.verify(&first).is_ok(),
            "a vanished file keeps the tokens"
        );
        let third = create(&path, Scope::All, Permission::Read).expect("mint");
        assert!(store.reload());
        assert!(store.verify(&third).is_ok());
        assert!(
            store.verify(&first).is_err(),
            "the new store has only the new token"
        );
    }

    #[test]
    fn revoking_a_token_removes_it_from_the_store() {
        let (_dir, path) = store_path();
        let keep = create(&path, Scope::All, Permission::Read).expect("mint");
        let gone = create(&path, Scope::All, Permission::Read).expect("mint");
        let store = TokenStore::open(&path).expect("open");
        assert!(revoke(&path, gone.id()).expect("revoke"));
        assert!(!revoke(&path, gone.id()).expect("revoke again"));
        assert!(store.reload());
        assert!(store.verify(&keep).is_ok());
        assert_eq!(store.verify(&gone), Err(AuthError::Unknown(gone.id())));
    }

    #[test]
    fn invalid_store_files_are_refused_at_open() {
        let (_dir, path) = store_path();
        assert!(matches!(
            TokenStore::open(&path),
            Err(StoreError::Io { .. })
        ));
        let id = "0123456789abcdef";
        let hash = "00".repeat(32);
        let entry = |id: &str, hash: &str| {
            format!(
                r#"{{"id":"{id}","sha256":"{hash}","scope":"all","permission":"read","created_at_unix_s":1}}"#
            )
        };
        let file = |tokens: &str| {
            format!(r#"{{"format":"walrelay-tokens","version":1,"tokens":[{tokens}]}}"#)
        };
        let good = file(&entry(id, &hash));
        std::fs::write(&path, &good).expect("write");
        assert_eq!(TokenStore::open(&path).expect("valid").len(), 1);
        let bad = [
            ("not JSON", "{".to_string()),
            ("wrong format", good.replace("walrelay-tokens", "other")),
            (
                "future version",
                good.replace("\"version\":1", "\"version\":2"),
            ),
            (
                "unknown field",
                good.replace("\"created_at_unix_s\"", "\"x\":1,\"created_at_unix_s\""),
            ),
            ("short id", file(&entry("0123", &hash))),
            ("short hash", file(&entry(id, "00"))),
            ("bad scope", good.replace("\"all\"", "\"some\"")),
            ("bad permission", good.replace("\"read\"", "\"admin\"")),
            (
                "duplicate id",
                file(&format!("{},{}", entry(id, &hash), entry(id, &hash))),
            ),
            (
                "empty database",
                good.replace("\"all\"", "{\"database\":\"\"}"),
            ),
        ];
        for (what, text) in bad {
            std::fs::write(&path, &text).expect("write");
            match TokenStore::open(&path) {
                Err(StoreError::Invalid { .. }) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_store_is_bounded_in_tokens_and_bytes() {
        let (_dir, path) = store_path();
        let entries: Vec<Entry> = (0..MAX_TOKENS as u64)
            .map(|i| Entry {
                id: format!("{i:016x}").parse().expect("id"),
                hash: SecretHash::from_hex(&"11".repeat(32)).expect("hash"),
                scope: Scope::All,
                permission: Permission::Read,
                created_at_unix_s: i,
            })
            .collect();
        write(&path, &entries).expect("write");
        assert_eq!(
            TokenStore::open(&path).expect("a full store loads").len(),
            MAX_TOKENS
        );
        assert!(matches!(
            create(&path, Scope::All, Permission::Read),
            Err(StoreError::Full { .. })
        ));
        let f = File::options().append(true).open(&path).expect("open");
        f.set_len(MAX_STORE_BYTES + 1).expect("grow");
        assert!(matches!(
            TokenStore::open(&path),
            Err(StoreError::TooLarge { .. })
        ));
    }
}
