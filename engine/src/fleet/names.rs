//! The fleet's identities: a database's D1 uuid, its account and its name.
//!
//! A database has two ids. Its [`DatabaseUuid`] is what clients see (D1's
//! `uuid`); its [`DatabaseId`](walrelay_replicator::DatabaseId) is the id
//! its replicated history carries (the "Durable Object id"). Both are fresh
//! for every creation attempt, so a failed attempt's leftovers can never be
//! mistaken for the database a later attempt created.

use std::fmt;
use std::str::FromStr;

/// A database's public id: a random (version 4) UUID, in its canonical
/// lowercase hyphenated text form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatabaseUuid(uuid::Uuid);

impl DatabaseUuid {
    /// A fresh, random id.
    pub fn random() -> DatabaseUuid {
        DatabaseUuid(uuid::Uuid::new_v4())
    }

    /// Whether `text` looks like a uuid rather than a name (names may not
    /// contain 36 characters in the 8-4-4-4-12 pattern of hex digits).
    pub fn looks_like(text: &str) -> bool {
        text.parse::<DatabaseUuid>().is_ok()
    }
}

impl fmt::Display for DatabaseUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0.hyphenated(), f)
    }
}

/// Why a string is not a database uuid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a database uuid (expected 8-4-4-4-12 lowercase hex digits)")]
pub struct UuidParseError(String);

/// Accepts only the canonical spelling, so one database has one key.
impl FromStr for DatabaseUuid {
    type Err = UuidParseError;
    fn from_str(text: &str) -> Result<DatabaseUuid, UuidParseError> {
        let shown = || UuidParseError(text.chars().take(64).collect());
        if text.len() != 36 {
            return Err(shown());
        }
        let u = uuid::Uuid::try_parse(text).map_err(|_| shown())?;
        if u.hyphenated().to_string() != text {
            return Err(shown());
        }
        Ok(DatabaseUuid(u))
    }
}

/// Why an account id or a database name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{what} must be 1 to {max} characters, got {len}")]
    Length {
        what: &'static str,
        max: usize,
        len: usize,
    },
    #[error("{what} may hold only {allowed}; found {found:?}")]
    Character {
        what: &'static str,
        allowed: &'static str,
        found: char,
    },
    #[error("a database name may not have the form of a uuid")]
    UuidShaped,
}

fn check(
    text: &str,
    what: &'static str,
    max: usize,
    allowed: &'static str,
    ok: impl Fn(char) -> bool,
) -> Result<(), NameError> {
    let len = text.chars().count();
    if len == 0 || len > max {
        return Err(NameError::Length { what, max, len });
    }
    if let Some(found) = text.chars().find(|c| !ok(*c)) {
        return Err(NameError::Character {
            what,
            allowed,
            found,
        });
    }
    Ok(())
}

/// An account: the owner of databases, the unit of limits. Text of 1 to 64
/// characters out of ASCII letters, digits, `-` and `_` (Cloudflare's
/// account ids are 32 hex digits, which fit).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AccountId(String);

impl AccountId {
    /// The account of requests that name none (`walrelay up`'s own).
    pub fn default_account() -> AccountId {
        AccountId("default".into())
    }
    pub fn new(text: &str) -> Result<AccountId, NameError> {
        check(
            text,
            "an account id",
            64,
            "ASCII letters, digits, '-' and '_'",
            |c| c.is_ascii_alphanumeric() || c == '-' || c == '_',
        )?;
        Ok(AccountId(text.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for AccountId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A database's name, unique among an account's live databases: D1's rule,
/// 1 to 64 characters of lowercase ASCII letters, digits, `-` and `_`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatabaseName(String);

impl DatabaseName {
    pub fn new(text: &str) -> Result<DatabaseName, NameError> {
        check(
            text,
            "a database name",
            64,
            "lowercase ASCII letters, digits, '-' and '_'",
            |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_',
        )?;
        if DatabaseUuid::looks_like(text) {
            return Err(NameError::UuidShaped);
        }
        Ok(DatabaseName(text.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DatabaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_has_one_spelling() {
        let u = DatabaseUuid::random();
        let text = u.to_string();
        assert_eq!(text.parse::<DatabaseUuid>(), Ok(u));
        assert!(text.to_uppercase().parse::<DatabaseUuid>().is_err());
        assert!(text.replace('-', "").parse::<DatabaseUuid>().is_err());
        assert!(format!("{{{text}}}").parse::<DatabaseUuid>().is_err());
    }

    #[test]
    fn names_follow_d1s_rules() {
        assert!(DatabaseName::new("my-db_2").is_ok());
        assert!(matches!(
            DatabaseName::new(""),
            Err(NameError::Length { .. })
        ));
        assert!(matches!(
            DatabaseName::new(&"a".repeat(65)),
            Err(NameError::Length { .. })
        ));
        assert!(matches!(
            DatabaseName::new("My"),
            Err(NameError::Character { found: 'M', .. })
        ));
        assert!(matches!(
            DatabaseName::new("a/b"),
            Err(NameError::Character { found: '/', .. })
        ));
        let u = DatabaseUuid::random().to_string();
        assert_eq!(DatabaseName::new(&u), Err(NameError::UuidShaped));
        assert!(AccountId::new("0123abcd_x-Y").is_ok());
        assert!(AccountId::new("a b").is_err());
    }
}
