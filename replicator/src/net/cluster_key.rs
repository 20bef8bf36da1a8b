//! The cluster key: the one secret every replication process of a cluster
//! shares (see [`super::auth`] for what it is used for), and its file.
//!
//! ```text
//! key file (text, owner-only: mode 0600)
//!  0  64 lowercase hex digits: the 32 key bytes
//! 64  an optional "\n"; nothing else
//! ```
//!
//! A key file that group or others may read or write is refused: the key
//! is the whole of the replication ports' security.

use std::fmt;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// 32 secret bytes shared by a cluster. `Debug` never shows them.
#[derive(Clone)]
pub struct ClusterKey([u8; ClusterKey::BYTES]);

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Why a key could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("cluster key file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster key file {path} has mode {mode:o}: group or others may access it (chmod 600)")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("cluster key file {path} is not 64 hex digits")]
    Malformed { path: PathBuf },
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

impl ClusterKey {
    pub const BYTES: usize = 32;
    const HEX_DIGITS: usize = 2 * Self::BYTES;

    /// A fresh key from the operating system's random source.
    pub fn generate() -> Result<ClusterKey, KeyFileError> {
        let mut key = [0u8; Self::BYTES];
        random_bytes(&mut key)?;
        Ok(ClusterKey(key))
    }

    pub fn from_bytes(bytes: [u8; Self::BYTES]) -> ClusterKey {
        ClusterKey(bytes)
    }

    pub(crate) fn bytes(&self) -> &[u8; Self::BYTES] {
        &self.0
    }

    /// Reads a key file, refusing one group or others can access.
    /// A 32-byte secret for another purpose (`context` names it, e.g.
    /// "walrelay 2026 internal http"), derived with BLAKE3's key
    /// derivation: knowing it reveals nothing of the key or of any other
    /// context's secret.
    pub fn derive(&self, context: &str) -> [u8; 32] {
        blake3::derive_key(context, self.bytes())
    }

    pub fn load(path: &Path) -> Result<ClusterKey, KeyFileError> {
        let io = |source| KeyFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyFileError::Exposed {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = std::fs::read(path).map_err(io)?;
        parse_hex(&text).ok_or_else(|| KeyFileError::Malformed {
            path: path.to_path_buf(),
        })
    }

    /// Writes a fresh key to `path` (which must not exist) with mode 0600,
    /// synced, and returns it.
    pub fn create(path: &Path) -> Result<ClusterKey, KeyFileError> {
        let io = |source| KeyFileError::Io {
            path: path.to_path_buf(),
            source,
        };
        let key = ClusterKey::generate()?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        let mut text = key.to_hex();
        text.push('\n');
        file.write_all(text.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(key)
    }

    /// The key in `path`, created first if there is no such file.
    pub fn load_or_create(path: &Path) -> Result<ClusterKey, KeyFileError> {
        match ClusterKey::create(path) {
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                ClusterKey::load(path)
            }
            other => other,
        }
    }

    fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

fn parse_hex(text: &[u8]) -> Option<ClusterKey> {
    let digits = text.strip_suffix(b"\n").unwrap_or(text);
    if digits.len() != ClusterKey::HEX_DIGITS {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut key = [0u8; ClusterKey::BYTES];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        key[i] = nibble(pair[0])? << 4 | nibble(pair[1])?;
    }
    Some(ClusterKey(key))
}

/// Fills `buf` from the operating system's random source (keys, nonces).
pub(crate) fn random_bytes(buf: &mut [u8]) -> Result<(), KeyFileError> {
    use rand::TryRngCore;
    rand::rngs::OsRng
        .try_fill_bytes(buf)
        .map_err(|e| KeyFileError::Random(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_key_file_is_owner_only_and_loads_back_the_same_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cluster.key");
        let key = ClusterKey::create(&path).expect("create");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(ClusterKey::load(&path).expect("load").bytes(), key.bytes());
        let again = ClusterKey::load_or_create(&path).expect("load_or_create");
        assert_eq!(again.bytes(), key.bytes(), "an existing key is kept");
        assert!(matches!(
            ClusterKey::create(&path),
            Err(KeyFileError::Io { .. })
        ));
    }

    #[test]
    fn a_key_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cluster.key");
        ClusterKey::create(&path).expect("create");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(
            ClusterKey::load(&path),
            Err(KeyFileError::Exposed { mode: 0o644, .. })
        ));
    }

    #[test]
    fn malformed_key_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("cluster.key");
        for bad in [&b""[..], b"00", &[b'g'; 64], &[b'0'; 65], &[b'0'; 63]] {
            std::fs::write(&path, bad).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            assert!(
                matches!(ClusterKey::load(&path), Err(KeyFileError::Malformed { .. })),
                "{bad:?}"
            );
        }
        std::fs::write(&path, [b'A'; 64]).expect("write");
        assert_eq!(
            ClusterKey::load(&path).expect("upper case").bytes(),
            &[0xaa; 32]
        );
    }

    #[test]
    fn the_debug_form_does_not_show_the_key() {
        let key = ClusterKey::from_bytes([0xab; 32]);
        assert_eq!(format!("{key:?}"), "ClusterKey(..)");
    }
}
