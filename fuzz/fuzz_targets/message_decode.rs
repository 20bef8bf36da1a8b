//! Protocol message decoding never panics and never allocates for sizes it
//! has not checked; a stream of arbitrary bytes decodes message by message
//! until an error or an incomplete frame, and what decodes re-encodes to the
//! same bytes.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use walrelay_replicator::Message;

fuzz_target!(|data: &[u8]| {
    let buf = Bytes::copy_from_slice(data);
    let mut at = 0;
    while let Ok((msg, used)) = Message::decode(&buf.slice(at..)) {
        let again = msg.encode().expect("a decoded message encodes");
        assert_eq!(&again[..], &data[at..at + used]);
        at += used;
    }
});
