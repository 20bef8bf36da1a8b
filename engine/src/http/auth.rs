//! API tokens: what a token is, what it grants, and how a request's
//! `Authorization: Bearer <token>` header is checked. The store that holds
//! the tokens' hashes is [`super::token_store`].
//!
//! ```text
//! token   wrt_<id>_<secret>
//!   id      16 lowercase hex digits  (8 random bytes; public, names the entry)
//!   secret  64 lowercase hex digits  (32 random bytes from the OS RNG)
//! ```
//!
//! A node keeps only SHA-256(secret bytes). A fast hash is the right one
//! here, unlike for passwords: the secret is 256 bits from the OS RNG, so
//! there is no dictionary to try and nothing a slow hash (bcrypt, argon2)
//! would protect; a leaked store still does not let anyone present a
//! token, and a fast hash keeps the check cheap on every request. The
//! comparison with the stored hash is constant-time.
//!
//! Missing or invalid credentials are 401; a valid token that does not
//! grant what was asked is 403 (both D1's code 10000).

use super::token_store::TokenStore;
use crate::session::Access;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// Every token starts with this.
pub const TOKEN_PREFIX: &str = "wrt_";
/// Random bytes in a token's id.
pub const ID_BYTES: usize = 8;
/// Random bytes in a token's secret.
pub const SECRET_BYTES: usize = 32;

/// A token's public identifier: it names the store entry and appears in
/// logs; it grants nothing without the secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TokenId([u8; ID_BYTES]);

impl fmt::Display for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex(&self.0))
    }
}

impl fmt::Debug for TokenId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenId({self})")
    }
}

impl FromStr for TokenId {
    type Err = TokenParseError;
    fn from_str(s: &str) -> Result<TokenId, TokenParseError> {
        unhex::<ID_BYTES>(s).map(TokenId).ok_or(TokenParseError::Id)
    }
}

/// SHA-256 of a token's secret: what the store keeps.
#[derive(Clone, Copy)]
pub struct SecretHash([u8; 32]);

impl SecretHash {
    fn of(secret: &[u8; SECRET_BYTES]) -> SecretHash {
        SecretHash(Sha256::digest(secret).into())
    }

    /// Whether `token`'s secret hashes to this, in constant time (the time
    /// taken does not depend on where the hashes differ).
    pub fn matches(&self, token: &ApiToken) -> bool {
        let other = SecretHash::of(&token.secret);
        let mut diff = 0u8;
        for (a, b) in self.0.iter().zip(other.0.iter()) {
            diff |= a ^ b;
        }
        std::hint::black_box(diff) == 0
    }

    /// Lowercase hex, as stored.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }

    pub fn from_hex(s: &str) -> Option<SecretHash> {
        unhex::<32>(s).map(SecretHash)
    }
}

impl fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretHash(..)")
    }
}

/// Why text is not a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenParseError {
    #[error("a token starts with \"wrt_\"")]
    Prefix,
    #[error("a token is wrt_<id>_<secret>")]
    Shape,
    #[error("a token's id is {} lowercase hex digits", ID_BYTES * 2)]
    Id,
    #[error("a token's secret is {} lowercase hex digits", SECRET_BYTES * 2)]
    Secret,
}

/// The OS random number generator failed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the OS random number generator failed: {0}")]
pub struct RandomError(String);

/// A whole token, secret included. Its `Debug` hides the secret; the
/// token text is only available through [`ApiToken::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct ApiToken {
    id: TokenId,
    secret: [u8; SECRET_BYTES],
}

impl ApiToken {
    /// A new token from the OS RNG.
    pub fn generate() -> Result<ApiToken, RandomError> {
        let mut id = [0u8; ID_BYTES];
        let mut secret = [0u8; SECRET_BYTES];
        getrandom::fill(&mut id).map_err(|e| RandomError(e.to_string()))?;
        getrandom::fill(&mut secret).map_err(|e| RandomError(e.to_string()))?;
        Ok(ApiToken {
            id: TokenId(id),
            secret,
        })
    }

    pub fn id(&self) -> TokenId {
        self.id
    }

    /// What the store keeps of this token.
    pub fn hash(&self) -> SecretHash {
        SecretHash::of(&self.secret)
    }

    /// The token text, `wrt_<id>_<secret>`: the credential itself.
    pub fn expose(&self) -> String {
        format!("{TOKEN_PREFIX}{}_{}", self.id, hex(&self.secret))
    }

    /// The `Authorization` header value carrying this token.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", self.expose())
    }
}

impl FromStr for ApiToken {
    type Err = TokenParseError;
    fn from_str(s: &str) -> Result<ApiToken, TokenParseError> {
        let rest = s
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(TokenParseError::Prefix)?;
        let (id, secret) = rest.split_once('_').ok_or(TokenParseError::Shape)?;
        Ok(ApiToken {
            id: id.parse()?,
            secret: unhex::<SECRET_BYTES>(secret).ok_or(TokenParseError::Secret)?,
        })
    }
}

impl fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiToken({TOKEN_PREFIX}{}_..)", self.id)
    }
}

/// Which databases a token reaches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Scope {
    /// Every database, and `/metrics`.
    All,
    /// The database of this name only.
    Database(String),
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::All => f.write_str("all databases"),
            Scope::Database(d) => write!(f, "database {d:?}"),
        }
    }
}

/// What a token may do where it reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Permission {
    /// Statements SQLite calls read-only, and batches of them.
    Read,
    /// Anything.
    ReadWrite,
}

impl Permission {
    pub fn access(self) -> Access {
        match self {
            Permission::Read => Access::ReadOnly,
            Permission::ReadWrite => Access::ReadWrite,
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Permission::Read => "read-only",
            Permission::ReadWrite => "read-write",
        })
    }
}

/// What a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// `/v1/databases/{name}/query`.
    Database(&'a str),
    /// `/metrics`: node-wide, so it needs an all-databases token.
    Metrics,
    /// The control plane (`/v1/databases`, create, list, get, delete):
    /// an all-databases token; `write` (create, delete) needs read-write.
    ControlPlane { write: bool },
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("authentication required: send \"Authorization: Bearer <token>\"")]
    Missing,
    #[error("the Authorization header must be \"Bearer <token>\"")]
    NotBearer,
    #[error("malformed API token: {0}")]
    Malformed(TokenParseError),
    /// Unknown id and wrong secret say the same to the client, so an
    /// answer does not tell which ids exist.
    #[error("invalid API token")]
    Unknown(TokenId),
    #[error("invalid API token")]
    WrongSecret(TokenId),
    #[error("token {id} is not valid for database {database:?}")]
    WrongDatabase { id: TokenId, database: String },
    #[error(
        "token {id} does not reach /metrics or the control plane: that needs an all-databases token"
    )]
    NotAllDatabases { id: TokenId },
    #[error("token {id} is read-only: creating or deleting databases needs a read-write token")]
    ReadOnlyToken { id: TokenId },
}

impl AuthError {
    /// 401 for missing or invalid credentials, 403 for a valid token that
    /// does not grant what was asked.
    pub fn status(&self) -> u16 {
        match self {
            AuthError::Missing
            | AuthError::NotBearer
            | AuthError::Malformed(_)
            | AuthError::Unknown(_)
            | AuthError::WrongSecret(_) => 401,
            AuthError::WrongDatabase { .. }
            | AuthError::NotAllDatabases { .. }
            | AuthError::ReadOnlyToken { .. } => 403,
        }
    }
}

/// How a node authenticates HTTP requests.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Nobody is asked for anything: whoever reaches the port can read and
    /// write. Chosen explicitly (`--insecure`), never by default.
    Insecure,
    /// Bearer tokens checked against a store.
    Tokens(Arc<TokenStore>),
}

impl Auth {
    /// Checks a request's `Authorization` header (raw bytes, as received)
    /// for `target`; the access its statements run with.
    pub fn check(&self, header: Option<&[u8]>, target: Target<'_>) -> Result<Access, AuthError> {
        let store = match self {
            Auth::Insecure => return Ok(Access::ReadWrite),
            Auth::Tokens(store) => store,
        };
        let header = header.ok_or(AuthError::Missing)?;
        let text = std::str::from_utf8(header).map_err(|_| AuthError::NotBearer)?;
        let token: ApiToken = bearer(text)
            .ok_or(AuthError::NotBearer)?
            .parse()
            .map_err(AuthError::Malformed)?;
        let grant = store.verify(&token)?;
        match (target, &grant.scope) {
            (Target::Database(_), Scope::All) => Ok(grant.permission.access()),
            (Target::Database(want), Scope::Database(have)) if want == have => {
                Ok(grant.permission.access())
            }
            (Target::Database(want), Scope::Database(_)) => Err(AuthError::WrongDatabase {
                id: token.id,
                database: want.to_string(),
            }),
            // Either permission: the exposition is read-only.
            (Target::Metrics, Scope::All) => Ok(Access::ReadOnly),
            (Target::Metrics, Scope::Database(_)) => {
                Err(AuthError::NotAllDatabases { id: token.id })
            }
            (Target::ControlPlane { .. }, Scope::Database(_)) => {
                Err(AuthError::NotAllDatabases { id: token.id })
            }
            (Target::ControlPlane { write: true }, Scope::All)
                if grant.permission.access() == Access::ReadOnly =>
            {
                Err(AuthError::ReadOnlyToken { id: token.id })
            }
            (Target::ControlPlane { .. }, Scope::All) => Ok(grant.permission.access()),
        }
    }
}

/// What a valid token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub scope: Scope,
    pub permission: Permission,
}

/// The credentials of `Bearer <credentials>` (the scheme is
/// case-insensitive, RFC 9110 section 11.1).
fn bearer(header: &str) -> Option<&str> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let credentials = rest.trim_start();
    (!credentials.is_empty()).then_some(credentials)
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// Exactly `2 * N` lowercase hex digits.
fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = s.as_bytes();
    if bytes.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        out[i] = (digit(pair[0])? << 4) | digit(pair[1])?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_round_trips_through_its_text_and_hides_its_secret_in_debug() {
        let t = ApiToken::generate().expect("rng");
        let text = t.expose();
        assert_eq!(text.len(), 4 + 16 + 1 + 64);
        assert!(text.starts_with("wrt_"));
        let back: ApiToken = text.parse().expect("parses");
        assert_eq!(back, t);
        assert!(t.hash().matches(&back));
        let debug = format!("{t:?}");
        assert!(!debug.contains(&text[21..]), "{debug}");
        assert_ne!(ApiToken::generate().expect("rng"), t, "tokens differ");
    }

    #[test]
    fn a_token_with_another_secret_does_not_match_the_hash() {
        let t = ApiToken::generate().expect("rng");
        let mut other = t.clone();
        other.secret[31] ^= 1;
        assert!(!t.hash().matches(&other));
    }

    #[test]
    fn malformed_tokens_are_typed_errors() {
        let id = "0123456789abcdef";
        let secret = "ab".repeat(32);
        let ok = format!("wrt_{id}_{secret}");
        assert!(ok.parse::<ApiToken>().is_ok());
        let cases = [
            (format!("xyz_{id}_{secret}"), TokenParseError::Prefix),
            (format!("wrt_{id}{secret}"), TokenParseError::Shape),
            (format!("wrt_0123_{secret}"), TokenParseError::Id),
            (
                format!("wrt_0123456789ABCDEF_{secret}"),
                TokenParseError::Id,
            ),
            (
                format!("wrt_{id}_{}", &secret[2..]),
                TokenParseError::Secret,
            ),
            (format!("wrt_{id}_{secret}_"), TokenParseError::Secret),
            (
                format!("wrt_{id}_{}zz", &secret[2..]),
                TokenParseError::Secret,
            ),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<ApiToken>(), Err(want), "{text}");
        }
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_needs_credentials() {
        assert_eq!(bearer("Bearer abc"), Some("abc"));
        assert_eq!(bearer("bearer   abc "), Some("abc"));
        assert_eq!(bearer("Basic abc"), None);
        assert_eq!(bearer("Bearer"), None);
        assert_eq!(bearer("Bearer  "), None);
    }
}
