//! Bookmark parsing never panics, and whatever parses prints back to the
//! same text (one spelling per bookmark).
#![no_main]

use libfuzzer_sys::fuzz_target;
use walrelay_replicator::Bookmark;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(b) = text.parse::<Bookmark>() {
        assert_eq!(b.to_string(), text);
    }
});
