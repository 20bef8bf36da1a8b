//! The log record's format: round trips, both page forms, and every way
//! bad bytes are refused.

use super::*;
use crate::bookmark::{Epoch, Sequence};

#[test]
fn the_commit_time_round_trips_and_is_part_of_the_chain() {
    let r = |commit_us| Record {
        bookmark: Bookmark::new(Epoch(1), Sequence(1)),
        previous: Bookmark::ZERO,
        prev_chain: ChainHash::GENESIS,
        commit_us,
        page_size: 512,
        db_pages: 1,
        pages: vec![(1, Bytes::from(vec![7u8; 512]))],
    };
    let a = r(1_700_000_000_123_456).to_encoded().expect("encode");
    assert_eq!(a.commit_us(), 1_700_000_000_123_456);
    assert_eq!(a.record().expect("decode").commit_us, 1_700_000_000_123_456);
    assert!(a.chain_is_valid());
    let b = r(1_700_000_000_123_457).to_encoded().expect("encode");
    assert_ne!(a.chain, b.chain, "another time is another record");
}

fn record(pages: &[u32]) -> Record {
    Record {
        bookmark: Bookmark::new(Epoch(1), Sequence(2)),
        previous: Bookmark::new(Epoch(1), Sequence(1)),
        prev_chain: crate::chain::ChainHash::GENESIS,
        commit_us: 0,
        page_size: 512,
        db_pages: 10,
        pages: pages
            .iter()
            .map(|&n| (n, Bytes::from(vec![n as u8; 512])))
            .collect(),
    }
}

#[test]
fn records_round_trip_and_share_the_input_buffer() {
    let r = record(&[1, 3, 10]);
    let bytes = r.encode().expect("encode");
    assert_eq!(bytes.len() as u64, encoded_len(512, 3));
    let (back, used) = Record::decode(&bytes).expect("decode");
    assert_eq!(back, r);
    assert_eq!(used, bytes.len());
    let p = back.pages[0].1.as_ptr() as usize;
    let range = bytes.as_ptr() as usize..bytes.as_ptr() as usize + bytes.len();
    assert!(
        range.contains(&p),
        "page images are slices of the input, not copies"
    );
}

#[test]
fn any_flipped_bit_is_detected() {
    let bytes = record(&[1, 2]).encode().expect("encode");
    for i in 0..bytes.len() {
        let mut b = bytes.to_vec();
        b[i] ^= 0x01;
        assert!(
            Record::decode(&Bytes::from(b)).is_err(),
            "flip at byte {i} went unnoticed"
        );
    }
}

#[test]
fn truncated_records_are_refused_at_every_length() {
    let bytes = record(&[4]).encode().expect("encode");
    for len in 0..bytes.len() {
        assert!(matches!(
            Record::decode(&bytes.slice(..len)),
            Err(RecordError::Truncated { .. })
        ));
    }
}

#[test]
fn huge_stated_sizes_are_refused_before_allocating() {
    let mut b = record(&[1]).encode().expect("encode").to_vec();
    b[44..48].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        Record::peek_len(&b),
        Err(RecordError::TooManyPages(u32::MAX))
    );
    let mut b = record(&[1]).encode().expect("encode").to_vec();
    b[36..40].copy_from_slice(&1000u32.to_be_bytes());
    assert_eq!(Record::peek_len(&b), Err(RecordError::PageSize(1000)));
    let mut b = record(&[1]).encode().expect("encode").to_vec();
    b[8..12].copy_from_slice(&7u32.to_be_bytes());
    assert!(matches!(
        Record::peek_len(&b),
        Err(RecordError::LengthMismatch { .. })
    ));
}

#[test]
fn a_continued_chunk_keeps_its_flag_and_unknown_flags_are_refused() {
    let r = record(&[1, 2]);
    let chunk = r.to_encoded_chunk(true).expect("encode");
    assert!(chunk.continued());
    let (back, _) = Encoded::decode(&chunk.bytes).expect("decode");
    assert!(back.continued());
    assert_eq!(back.record().expect("pages"), r);
    assert!(!r.to_encoded().expect("encode").continued());
    let mut b = chunk.bytes.to_vec();
    b[6..8].copy_from_slice(&0x0004u16.to_be_bytes());
    assert_eq!(Record::peek_len(&b), Err(RecordError::UnknownFlags(4)));
}

#[test]
fn every_chunk_of_the_largest_page_size_fits_a_record() {
    let pages = pages_per_chunk(65_536) as u32;
    assert!(encoded_len(65_536, pages) <= MAX_RECORD_BYTES);
    assert!(encoded_len(512, pages_per_chunk(512) as u32) <= MAX_RECORD_BYTES);
    assert!(pages_per_chunk(512) as u32 <= MAX_PAGES);
    assert_eq!(chunk_count(4096, 0), 1);
    assert_eq!(chunk_count(4096, 2048), 1);
    assert_eq!(chunk_count(4096, 2049), 2);
}

#[test]
fn invalid_records_are_refused_on_encode() {
    assert_eq!(record(&[2, 2]).encode(), Err(RecordError::PageOrder(2)));
    assert_eq!(record(&[0]).encode(), Err(RecordError::PageOrder(0)));
    assert!(matches!(
        record(&[11]).encode(),
        Err(RecordError::PageBeyondEnd { .. })
    ));
    let mut r = record(&[1]);
    r.previous = r.bookmark;
    assert!(matches!(r.encode(), Err(RecordError::BookmarkOrder { .. })));
}

/// Pages of `bytes` each: compressible when they repeat, not when random.
fn record_of(images: Vec<Vec<u8>>) -> Record {
    let n = images.len() as u32;
    Record {
        bookmark: Bookmark::new(Epoch(1), Sequence(2)),
        previous: Bookmark::new(Epoch(1), Sequence(1)),
        prev_chain: ChainHash::GENESIS,
        commit_us: 7,
        page_size: images.first().map_or(512, |i| i.len() as u32),
        db_pages: n + 5,
        pages: (1..=n)
            .zip(images)
            .map(|(no, image)| (no * 2 - 1, Bytes::from(image)))
            .collect(),
    }
}

fn random_image(len: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

/// A leaf page as SQLite leaves it: half cells of random bytes, half zeros.
fn half_full_page(seed: u64) -> Vec<u8> {
    let mut image = vec![0u8; 4096];
    image[2048..].copy_from_slice(&random_image(2048, seed));
    image
}

/// `bytes` with a new page section (`section`) after the header, its
/// length and CRC rewritten to match: what a hostile encoder could send.
fn resealed(bytes: &[u8], section: &[u8]) -> Bytes {
    let mut b = bytes[..HEADER_BYTES].to_vec();
    b.extend_from_slice(section);
    let total = (b.len() + CRC_BYTES) as u32;
    b[8..12].copy_from_slice(&total.to_be_bytes());
    let crc = crc32fast::hash(&b);
    b.extend_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

#[test]
fn a_compressible_record_travels_compressed_and_decodes_to_the_same_pages() {
    let r = record_of(vec![half_full_page(1), half_full_page(2), vec![9u8; 4096]]);
    let plain = r.encode().expect("plain");
    let e = r
        .to_encoded_with(true, PageCompression::Zstd)
        .expect("compressed");
    assert!(is_compressed(&e.bytes));
    assert!(
        e.bytes.len() < plain.len() * 3 / 4,
        "{} bytes compressed against {} plain",
        e.bytes.len(),
        plain.len()
    );
    assert!(e.continued(), "the other flag survives");
    assert!(e.chain_is_valid());
    assert_eq!(e.commit_us(), 7);
    let (light, used) = Encoded::decode(&e.bytes).expect("a follower's check");
    assert_eq!(used, e.bytes.len());
    assert_eq!(light, e);
    assert_eq!(light.record().expect("pages"), r);
    let (full, used) = Record::decode(&e.bytes).expect("a full decode");
    assert_eq!((full, used), (r.clone(), e.bytes.len()));
    assert_eq!(Record::peek_len(&e.bytes), Ok(e.bytes.len() as u64));
    let again = r.encode_with(true, PageCompression::Zstd).expect("again");
    assert_eq!(again, e.bytes, "encoding is deterministic");
}

#[test]
fn images_that_do_not_shrink_by_an_eighth_stay_plain() {
    let r = record_of(vec![random_image(4096, 3), random_image(4096, 4)]);
    let e = r
        .to_encoded_with(false, PageCompression::Zstd)
        .expect("encode");
    assert!(!is_compressed(&e.bytes));
    assert_eq!(e.bytes, r.encode().expect("plain"));
    let empty = record_of(vec![]);
    let e = empty
        .to_encoded_with(false, PageCompression::Zstd)
        .expect("encode");
    assert!(!is_compressed(&e.bytes), "no images, nothing to compress");
}

#[test]
fn any_flipped_bit_or_cut_of_a_compressed_record_is_detected() {
    let r = record_of(vec![half_full_page(5)]);
    let bytes = r.encode_with(false, PageCompression::Zstd).expect("encode");
    assert!(is_compressed(&bytes));
    for i in 0..bytes.len() {
        let mut b = bytes.to_vec();
        b[i] ^= 0x01;
        let b = Bytes::from(b);
        assert!(Record::decode(&b).is_err(), "flip at byte {i}");
        assert!(Encoded::decode(&b).is_err(), "flip at byte {i}");
    }
    for len in 0..bytes.len() {
        assert!(
            Encoded::decode(&bytes.slice(..len)).is_err(),
            "cut at {len}"
        );
    }
}

#[test]
fn a_compressed_length_at_or_above_the_plain_one_is_refused_before_allocating() {
    let r = record_of(vec![half_full_page(6)]);
    let bytes = r
        .encode_with(false, PageCompression::Zstd)
        .expect("encode")
        .to_vec();
    let implied = encoded_len(4096, 1);
    for stated in [implied, implied + 1, u64::from(u32::MAX), 0, 92] {
        let mut b = bytes.clone();
        b[8..12].copy_from_slice(&(stated as u32).to_be_bytes());
        assert_eq!(
            Record::peek_len(&b),
            Err(RecordError::CompressedLength { stated, implied }),
        );
    }
}

#[test]
fn a_frame_that_states_another_size_or_is_not_one_frame_is_refused_by_the_light_check() {
    let r = record_of(vec![half_full_page(7)]);
    let bytes = r.encode_with(false, PageCompression::Zstd).expect("encode");
    let page_nos = &bytes[HEADER_BYTES..HEADER_BYTES + 4];
    let frame = &bytes[HEADER_BYTES + 4..bytes.len() - CRC_BYTES];
    let refused = |section: Vec<u8>| {
        let b = resealed(&bytes, &section);
        assert_eq!(
            Encoded::decode(&b).map(|_| ()),
            Err(RecordError::Frame { content: 4096 })
        );
        assert!(Record::decode(&b).is_err());
    };
    // Content one byte short of the page, and one byte over.
    for len in [4095, 4097] {
        let other = zstd::bulk::compress(&half_full_page(7)[..].repeat(2)[..len], -1).unwrap();
        refused([page_nos, &other[..]].concat());
    }
    // A frame and trailing bytes; a second (empty) frame; not a frame.
    refused([page_nos, frame, &[0u8; 3][..]].concat());
    let empty = zstd::bulk::compress(&[], -1).unwrap();
    refused([page_nos, frame, &empty[..]].concat());
    refused([page_nos, &vec![0x5a; frame.len()][..]].concat());
}

#[test]
fn a_follower_accepts_whatever_a_replica_can_build_and_refuses_only_what_fails_to_decompress() {
    // A hostile leader seals damaged frames with a valid CRC: the light
    // check reads only the frame's headers, so it may let some through,
    // but then the full decode names the failure; never the other way.
    let r = record_of(vec![half_full_page(8), half_full_page(9)]);
    let bytes = r.encode_with(false, PageCompression::Zstd).expect("encode");
    let page_nos = &bytes[HEADER_BYTES..HEADER_BYTES + 8];
    let frame = bytes[HEADER_BYTES + 8..bytes.len() - CRC_BYTES].to_vec();
    for i in 0..frame.len() {
        for bit in [0x01u8, 0x80] {
            let mut f = frame.clone();
            f[i] ^= bit;
            let b = resealed(&bytes, &[page_nos, &f[..]].concat());
            match (Encoded::decode(&b), Record::decode(&b)) {
                (Ok(_), Ok(_)) | (Err(RecordError::Frame { .. }), Err(_)) => {}
                (Ok(_), Err(RecordError::Decompress { content: 8192 })) => {}
                other => panic!("byte {i} bit {bit:#x}: {other:?}"),
            }
        }
    }
}
