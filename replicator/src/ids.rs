//! Identity of a replicated database.

use std::fmt;
use std::str::FromStr;

/// Names one database's history across every node that holds a copy.
///
/// Bookmarks are only comparable within one database; carrying the id next
/// to them is what stops a replica from applying another database's records
/// because the positions happen to line up. It is an opaque number rather
/// than a path or name so that renaming or moving the file does not fork its
/// identity.
///
/// Text form: exactly 16 lowercase hex digits, zero-padded, so ids sort as
/// strings in numeric order and each id has a single spelling (safe to use
/// in file names and object-store keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DatabaseId(pub u64);

impl DatabaseId {
    /// Length of the text form in bytes.
    pub const TEXT_LEN: usize = 16;
}

impl fmt::Display for DatabaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Names a node that may lead: the id a follower's promise of an epoch is
/// made to, so no other node can lead in that epoch. 0 means "none" (a
/// follower or replica saying who it is not).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

impl NodeId {
    pub const NONE: NodeId = NodeId(0);

    /// A fresh id for a node starting to lead: random, never 0.
    pub fn random() -> NodeId {
        loop {
            let id: u64 = rand::random();
            if id != 0 {
                return NodeId(id);
            }
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// Why a string is not the canonical text form of a database id.
///
/// Positions and lengths are in bytes, matching how the format is defined.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DatabaseIdParseError {
    #[error("database id must be {} bytes, got {len}", DatabaseId::TEXT_LEN)]
    WrongLength { len: usize },
    #[error("database id has {found:?} at byte {position}, expected a lowercase hex digit")]
    InvalidHexDigit { position: usize, found: char },
}

/// Accepts only the exact output of `Display`: a second spelling of the same
/// id (uppercase, sign, short form) would let two keys name one database.
impl FromStr for DatabaseId {
    type Err = DatabaseIdParseError;

    fn from_str(text: &str) -> Result<DatabaseId, DatabaseIdParseError> {
        let len = text.len();
        if len != DatabaseId::TEXT_LEN {
            return Err(DatabaseIdParseError::WrongLength { len });
        }
        let mut value: u64 = 0;
        // Any non-ASCII character is rejected before it can misalign later
        // digits, so an accepted string has exactly 16 digits and the shift
        // cannot overflow.
        for (position, found) in text.char_indices() {
            let digit = match found {
                '0'..='9' | 'a'..='f' => found.to_digit(16),
                _ => None,
            }
            .ok_or(DatabaseIdParseError::InvalidHexDigit { position, found })?;
            value = (value << 4) | u64::from(digit);
        }
        Ok(DatabaseId(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<DatabaseId, DatabaseIdParseError> {
        text.parse()
    }

    #[test]
    fn displays_as_sixteen_zero_padded_lowercase_hex_digits() {
        assert_eq!(DatabaseId(0).to_string(), "0000000000000000");
        assert_eq!(DatabaseId(0xabc).to_string(), "0000000000000abc");
        assert_eq!(DatabaseId(u64::MAX).to_string(), "ffffffffffffffff");
    }

    #[test]
    fn text_round_trips() {
        for id in [0, 1, 0xabc, 0x0123_4567_89ab_cdef, u64::MAX] {
            assert_eq!(parse(&DatabaseId(id).to_string()), Ok(DatabaseId(id)));
        }
    }

    #[test]
    fn string_order_equals_numeric_order() {
        let ids = [0, 1, 0xf, 0x10, 0xff, 0x1_0000_0000, u64::MAX - 1, u64::MAX];
        for a in ids {
            for b in ids {
                let (a, b) = (DatabaseId(a), DatabaseId(b));
                assert_eq!(a.cmp(&b), a.to_string().cmp(&b.to_string()));
            }
        }
    }

    #[test]
    fn rejects_wrong_length() {
        assert_eq!(parse(""), Err(DatabaseIdParseError::WrongLength { len: 0 }));
        assert_eq!(
            parse("abc"),
            Err(DatabaseIdParseError::WrongLength { len: 3 })
        );
        assert_eq!(
            parse("00000000000000000"),
            Err(DatabaseIdParseError::WrongLength { len: 17 })
        );
    }

    #[test]
    fn rejects_uppercase_sign_and_non_hex() {
        for (text, position, found) in [
            ("000000000000000A", 15, 'A'),
            ("+000000000000000", 0, '+'),
            ("0000000g00000000", 7, 'g'),
            ("00000000 0000000", 8, ' '),
        ] {
            assert_eq!(
                parse(text),
                Err(DatabaseIdParseError::InvalidHexDigit { position, found }),
                "{text:?}"
            );
        }
    }

    #[test]
    fn rejects_multibyte_utf8_of_the_right_byte_length_without_panicking() {
        let text = "0000000é0000000";
        assert_eq!(text.len(), DatabaseId::TEXT_LEN);
        assert_eq!(
            parse(text),
            Err(DatabaseIdParseError::InvalidHexDigit {
                position: 7,
                found: 'é'
            })
        );
    }
}
