//! Positions in a database's transaction history.
//!
//! A primary numbers its transactions with a [`Sequence`] that restarts at
//! zero every time it opens, so a sequence alone cannot order history across
//! restarts. Each open therefore also starts a new [`Epoch`], and the pair
//! ([`Bookmark`]) is strictly increasing for the lifetime of the database.
//!
//! Bookmarks travel through places that only know strings or bytes (file
//! names, object-store keys, log lines, wire frames). Both encodings are
//! fixed-width and big-endian/zero-padded so that comparing the encoded forms
//! gives the same answer as comparing the bookmarks, which lets storage
//! backends list and range-scan history without decoding anything.

use std::fmt;
use std::str::FromStr;

/// Which run of a primary produced a transaction.
///
/// Bumped (and persisted) on every open of a primary; it is what keeps
/// bookmarks increasing after the sequence counter restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Epoch(pub u32);

impl Epoch {
    /// The epoch after this one, or `None` once the counter is exhausted:
    /// wrapping would make new history sort before old history.
    #[must_use]
    pub const fn next(self) -> Option<Epoch> {
        match self.0.checked_add(1) {
            Some(value) => Some(Epoch(value)),
            None => None,
        }
    }
}

/// Shown as the same 8 zero-padded lowercase hex digits used in the bookmark
/// text, so an epoch in a log line can be matched against bookmark strings.
impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

/// Position of a transaction within one epoch.
///
/// Sequence 0 is reserved for the state at the moment the epoch began (see
/// [`Bookmark::first_of`]); the first transaction of an epoch is sequence 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Sequence(pub u64);

impl Sequence {
    /// The sequence after this one, or `None` once the counter is exhausted:
    /// wrapping would make new history sort before old history.
    #[must_use]
    pub const fn next(self) -> Option<Sequence> {
        match self.0.checked_add(1) {
            Some(value) => Some(Sequence(value)),
            None => None,
        }
    }
}

/// Shown as the same 16 zero-padded lowercase hex digits used in the bookmark
/// text, so a sequence in a log line can be matched against bookmark strings.
impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A point in a database's history: "everything up to and including this
/// transaction".
///
/// Ordered by epoch first, then sequence, so any transaction from a later run
/// of the primary sorts after every transaction from an earlier run.
///
/// Text form: `{epoch:08x}-{sequence:016x}` (25 bytes, lowercase only). Byte
/// form: epoch then sequence, big-endian (12 bytes). Each bookmark has exactly
/// one spelling in each form, so encoded bookmarks can be compared and
/// deduplicated as plain strings or bytes.
// Field order is load-bearing: the derived `Ord` compares `epoch` first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bookmark {
    pub epoch: Epoch,
    pub sequence: Sequence,
}

/// Byte offset of the `-` in the text form; everything before it is the
/// epoch, everything after it the sequence.
const SEPARATOR_AT: usize = 8;

impl Bookmark {
    /// Before any transaction of any epoch: the natural starting point for a
    /// replica that has nothing yet, since it sorts before every real
    /// position.
    pub const ZERO: Bookmark = Bookmark::new(Epoch(0), Sequence(0));

    /// Length of the text form in bytes.
    pub const TEXT_LEN: usize = 25;

    /// Length of the byte form.
    pub const BYTE_LEN: usize = 12;

    #[must_use]
    pub const fn new(epoch: Epoch, sequence: Sequence) -> Bookmark {
        Bookmark { epoch, sequence }
    }

    /// The state of the database when `epoch` began, before any of that
    /// epoch's transactions. Lets a primary name its starting point (and a
    /// snapshot taken at open) without inventing a transaction for it.
    #[must_use]
    pub const fn first_of(epoch: Epoch) -> Bookmark {
        Bookmark::new(epoch, Sequence(0))
    }

    /// The bookmark of the next transaction in the same epoch.
    ///
    /// Returns `None` when the sequence is exhausted rather than wrapping or
    /// panicking; the caller must start a new epoch instead.
    #[must_use]
    pub const fn next(self) -> Option<Bookmark> {
        match self.sequence.next() {
            Some(sequence) => Some(Bookmark::new(self.epoch, sequence)),
            None => None,
        }
    }

    /// Big-endian so that comparing the bytes (e.g. as keys in an ordered
    /// store) agrees with comparing the bookmarks.
    #[must_use]
    pub const fn to_bytes(self) -> [u8; Bookmark::BYTE_LEN] {
        let [e0, e1, e2, e3] = self.epoch.0.to_be_bytes();
        let [s0, s1, s2, s3, s4, s5, s6, s7] = self.sequence.0.to_be_bytes();
        [e0, e1, e2, e3, s0, s1, s2, s3, s4, s5, s6, s7]
    }

    /// Infallible because every 12-byte value is a valid bookmark; callers
    /// that read from untrusted sources only need to check the length.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; Bookmark::BYTE_LEN]) -> Bookmark {
        let [e0, e1, e2, e3, s0, s1, s2, s3, s4, s5, s6, s7] = bytes;
        Bookmark::new(
            Epoch(u32::from_be_bytes([e0, e1, e2, e3])),
            Sequence(u64::from_be_bytes([s0, s1, s2, s3, s4, s5, s6, s7])),
        )
    }
}

impl Bookmark {
    /// The text form's bytes (always ASCII), without a formatter: written
    /// on every HTTP answer twice (its header and its meta), where the
    /// formatting machinery's padding cost a measurable share of an empty
    /// request (papers/performance.md, lever 53).
    #[must_use]
    pub const fn to_text(self) -> [u8; Bookmark::TEXT_LEN] {
        let mut out = [0u8; Bookmark::TEXT_LEN];
        put_hex(&mut out, 0, SEPARATOR_AT, self.epoch.0 as u64);
        out[SEPARATOR_AT] = b'-';
        let digits = Bookmark::TEXT_LEN - SEPARATOR_AT - 1;
        put_hex(&mut out, SEPARATOR_AT + 1, digits, self.sequence.0);
        out
    }
}

/// Writes the low `digits` hex digits of `value`, most significant first,
/// lowercase, into `out` from `at`.
const fn put_hex(out: &mut [u8; Bookmark::TEXT_LEN], at: usize, digits: usize, value: u64) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut i = 0;
    while i < digits {
        out[at + i] = HEX[((value >> (4 * (digits - 1 - i))) & 0xf) as usize];
        i += 1;
    }
}

impl fmt::Display for Bookmark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = self.to_text();
        // `to_text` writes only ASCII hex digits and '-'.
        let text = std::str::from_utf8(&text).map_err(|_| fmt::Error)?;
        f.pad(text)
    }
}

/// Why a string is not the canonical text form of a bookmark.
///
/// Positions and lengths are in bytes, because the format is defined in bytes
/// and that is what a reader needs to locate the problem in a file name or
/// key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookmarkParseError {
    #[error("bookmark text must be {} bytes, got {len}", Bookmark::TEXT_LEN)]
    WrongLength { len: usize },
    #[error("bookmark text must have '-' at byte {SEPARATOR_AT}")]
    MissingSeparator,
    #[error("bookmark text has {found:?} at byte {position}, expected a lowercase hex digit")]
    InvalidHexDigit { position: usize, found: char },
}

/// Accepts only the exact output of `Display`: no uppercase, no sign, no
/// whitespace, no short forms. A single spelling per bookmark is what makes
/// string comparison and deduplication of stored keys trustworthy.
impl FromStr for Bookmark {
    type Err = BookmarkParseError;

    fn from_str(text: &str) -> Result<Bookmark, BookmarkParseError> {
        let bytes = text.as_bytes();
        if bytes.len() != Bookmark::TEXT_LEN {
            return Err(BookmarkParseError::WrongLength { len: bytes.len() });
        }
        // Checked as a byte: if a multibyte character straddles this offset
        // the byte is not `-`, and we never slice the string at a non-boundary.
        if bytes.get(SEPARATOR_AT) != Some(&b'-') {
            return Err(BookmarkParseError::MissingSeparator);
        }

        let mut epoch: u32 = 0;
        let mut sequence: u64 = 0;
        // `char_indices` rather than byte indexing so a non-ASCII character is
        // reported whole and at its true starting byte. Any such character is
        // rejected before it can shift later digits out of place, and with the
        // length fixed an all-ASCII string has exactly 8 + 16 digits, so the
        // shifts below cannot overflow.
        for (position, found) in text.char_indices() {
            if position == SEPARATOR_AT {
                continue;
            }
            let digit = lowercase_hex_value(found)
                .ok_or(BookmarkParseError::InvalidHexDigit { position, found })?;
            if position < SEPARATOR_AT {
                epoch = (epoch << 4) | digit;
            } else {
                sequence = (sequence << 4) | u64::from(digit);
            }
        }
        Ok(Bookmark::new(Epoch(epoch), Sequence(sequence)))
    }
}

/// `char::to_digit(16)` also accepts `A`-`F`, which would give bookmarks a
/// second spelling.
fn lowercase_hex_value(c: char) -> Option<u32> {
    match c {
        '0'..='9' | 'a'..='f' => c.to_digit(16),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    const VALID: &str = "0000000a-00000000000000ff";

    fn bm(epoch: u32, sequence: u64) -> Bookmark {
        Bookmark::new(Epoch(epoch), Sequence(sequence))
    }

    fn parse(text: &str) -> Result<Bookmark, BookmarkParseError> {
        text.parse()
    }

    /// Values spread over every magnitude (not just large ones, which uniform
    /// sampling would almost always produce), with shared epochs common
    /// enough that the sequence comparison is exercised too.
    fn random_pair(rng: &mut SmallRng) -> (Bookmark, Bookmark) {
        fn epoch(rng: &mut SmallRng) -> u32 {
            let bits = rng.random_range(0..=32u32);
            rng.random::<u32>().checked_shr(32 - bits).unwrap_or(0)
        }
        fn sequence(rng: &mut SmallRng) -> u64 {
            let bits = rng.random_range(0..=64u32);
            rng.random::<u64>().checked_shr(64 - bits).unwrap_or(0)
        }
        let a = bm(epoch(rng), sequence(rng));
        let b_epoch = if rng.random_bool(0.5) {
            a.epoch.0
        } else {
            epoch(rng)
        };
        let b = bm(b_epoch, sequence(rng));
        (a, b)
    }

    #[test]
    fn text_form_is_fixed_width_lowercase_hex_with_dash() {
        assert_eq!(bm(10, 255).to_string(), VALID);
        assert_eq!(Bookmark::ZERO.to_string(), "00000000-0000000000000000");
        assert_eq!(
            bm(u32::MAX, u64::MAX).to_string(),
            "ffffffff-ffffffffffffffff"
        );
        assert_eq!(bm(0xdead_beef, 1).to_string().len(), Bookmark::TEXT_LEN);
    }

    #[test]
    fn text_round_trips_for_edge_values() {
        for b in [
            Bookmark::ZERO,
            bm(0, 1),
            bm(1, 0),
            bm(u32::MAX, 0),
            bm(0, u64::MAX),
            bm(u32::MAX, u64::MAX),
            bm(0x0123_4567, 0x89ab_cdef_0123_4567),
        ] {
            assert_eq!(parse(&b.to_string()), Ok(b));
        }
    }

    #[test]
    fn bytes_round_trip_and_are_big_endian_epoch_then_sequence() {
        let b = bm(0x0102_0304, 0x0506_0708_090a_0b0c);
        assert_eq!(b.to_bytes(), [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        assert_eq!(Bookmark::from_bytes(b.to_bytes()), b);
        assert_eq!(Bookmark::ZERO.to_bytes(), [0; Bookmark::BYTE_LEN]);
    }

    #[test]
    fn text_form_is_the_padded_hex_of_epoch_and_sequence_for_random_values() {
        let mut rng = SmallRng::seed_from_u64(0x626f_6f6b_6d61_726b);
        for _ in 0..20_000 {
            let (a, _) = random_pair(&mut rng);
            let reference = format!("{:08x}-{:016x}", a.epoch.0, a.sequence.0);
            assert_eq!(a.to_string(), reference);
            assert_eq!(&a.to_text()[..], reference.as_bytes());
        }
        // Display honours width and alignment, as a padded string does.
        assert_eq!(format!("{:>27}", bm(1, 2)), format!("  {}", bm(1, 2)));
    }

    #[test]
    fn string_and_byte_order_equal_numeric_order_for_random_pairs() {
        let mut rng = SmallRng::seed_from_u64(0x5741_4c52_454c_4159);
        for _ in 0..20_000 {
            let (a, b) = random_pair(&mut rng);
            let (text_a, text_b) = (a.to_string(), b.to_string());
            assert_eq!(a.cmp(&b), text_a.cmp(&text_b), "{a} vs {b}");
            assert_eq!(a.cmp(&b), a.to_bytes().cmp(&b.to_bytes()), "{a} vs {b}");
            assert_eq!(parse(&text_a), Ok(a));
            assert_eq!(Bookmark::from_bytes(a.to_bytes()), a);
        }
    }

    #[test]
    fn later_epoch_sorts_after_any_sequence_of_earlier_epoch() {
        assert!(bm(1, u64::MAX) < bm(2, 0));
        assert!(bm(2, 0) < bm(2, 1));
        assert!(Bookmark::ZERO <= bm(0, 0));
        assert!(Bookmark::ZERO < bm(0, 1));
    }

    #[test]
    fn first_of_epoch_is_sequence_zero_and_zero_is_first_of_epoch_zero() {
        assert_eq!(Bookmark::first_of(Epoch(7)), bm(7, 0));
        assert_eq!(Bookmark::first_of(Epoch(0)), Bookmark::ZERO);
        assert_eq!(Bookmark::default(), Bookmark::ZERO);
    }

    #[test]
    fn next_advances_sequence_within_the_same_epoch() {
        assert_eq!(Bookmark::first_of(Epoch(3)).next(), Some(bm(3, 1)));
        assert_eq!(bm(3, 41).next(), Some(bm(3, 42)));
    }

    #[test]
    fn next_returns_none_instead_of_wrapping_when_sequence_is_exhausted() {
        assert_eq!(bm(3, u64::MAX).next(), None);
        assert_eq!(Sequence(u64::MAX).next(), None);
        assert_eq!(Epoch(u32::MAX).next(), None);
        assert_eq!(Epoch(4).next(), Some(Epoch(5)));
    }

    #[test]
    fn epoch_and_sequence_display_as_their_bookmark_components() {
        let b = bm(0xab, 0xcd);
        assert_eq!(format!("{}-{}", b.epoch, b.sequence), b.to_string());
    }

    #[test]
    fn rejects_empty_string() {
        assert_eq!(parse(""), Err(BookmarkParseError::WrongLength { len: 0 }));
    }

    #[test]
    fn rejects_too_long_and_too_short() {
        let long = format!("{VALID}0");
        assert_eq!(
            parse(&long),
            Err(BookmarkParseError::WrongLength { len: 26 })
        );
        assert_eq!(
            parse(&VALID[..24]),
            Err(BookmarkParseError::WrongLength { len: 24 })
        );
        // A short form that a lenient parser might accept.
        assert_eq!(
            parse("a-ff"),
            Err(BookmarkParseError::WrongLength { len: 4 })
        );
    }

    #[test]
    fn rejects_missing_or_misplaced_dash() {
        assert_eq!(
            parse("0000000a000000000000000ff"),
            Err(BookmarkParseError::MissingSeparator)
        );
        assert_eq!(
            parse("0000000a_00000000000000ff"),
            Err(BookmarkParseError::MissingSeparator)
        );
        assert_eq!(
            parse("00000000a-0000000000000ff"),
            Err(BookmarkParseError::MissingSeparator)
        );
        // Dash at 8 but a second dash elsewhere.
        assert_eq!(
            parse("0000000a-0000000-0000000f"),
            Err(BookmarkParseError::InvalidHexDigit {
                position: 16,
                found: '-'
            })
        );
    }

    #[test]
    fn rejects_uppercase_hex_so_each_bookmark_has_one_spelling() {
        assert_eq!(
            parse("0000000A-00000000000000ff"),
            Err(BookmarkParseError::InvalidHexDigit {
                position: 7,
                found: 'A'
            })
        );
        assert_eq!(
            parse("0000000a-00000000000000fF"),
            Err(BookmarkParseError::InvalidHexDigit {
                position: 24,
                found: 'F'
            })
        );
    }

    #[test]
    fn rejects_non_hex_characters() {
        for (text, position, found) in [
            ("0000000g-00000000000000ff", 7, 'g'),
            ("0000000a-0000000000000 ff", 22, ' '),
            (" 000000a-00000000000000ff", 0, ' '),
            // Accepted by `u32::from_str_radix`, so worth pinning down.
            ("+000000a-00000000000000ff", 0, '+'),
            ("0000000a-+0000000000000ff", 9, '+'),
            ("0x00000a-00000000000000ff", 1, 'x'),
        ] {
            assert_eq!(
                parse(text),
                Err(BookmarkParseError::InvalidHexDigit { position, found }),
                "{text:?}"
            );
        }
    }

    #[test]
    fn rejects_multibyte_utf8_of_the_right_byte_length_without_panicking() {
        for (text, position, found) in [
            // Two-byte 'é' in the sequence.
            ("0000000a-00000000000é0ff", 20, 'é'),
            // Three-byte '€' in the epoch.
            ("0€000a-00000000000000ff", 1, '€'),
            // Four-byte emoji at the very end.
            ("0000000a-000000000000🦀", 21, '🦀'),
            // Multibyte characters only.
            ("éééé-éééééé🦀", 0, 'é'),
        ] {
            assert_eq!(text.len(), Bookmark::TEXT_LEN, "{text:?}");
            assert_eq!(
                parse(text),
                Err(BookmarkParseError::InvalidHexDigit { position, found }),
                "{text:?}"
            );
        }
        // A multibyte character straddling the separator's byte offset.
        let straddle = "0000000é00000000000000ff";
        assert_eq!(straddle.len(), Bookmark::TEXT_LEN);
        assert_eq!(parse(straddle), Err(BookmarkParseError::MissingSeparator));
    }

    #[test]
    fn parse_error_messages_name_the_problem() {
        assert_eq!(
            BookmarkParseError::WrongLength { len: 3 }.to_string(),
            "bookmark text must be 25 bytes, got 3"
        );
        assert_eq!(
            BookmarkParseError::InvalidHexDigit {
                position: 2,
                found: 'G'
            }
            .to_string(),
            "bookmark text has 'G' at byte 2, expected a lowercase hex digit"
        );
    }
}
