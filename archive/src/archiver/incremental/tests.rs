//! An incremental snapshot's parts against a full build's, object for
//! object: the full build lays the previous snapshot and the log down in
//! an image (`restore::build`'s path) and encodes every part from it.

use super::*;
use crate::image::Image;
use rand::{Rng, SeedableRng};
use walrelay_replicator::{Bookmark, ChainHash, DatabaseId, Encoded, Record, Sequence};

/// 64 KiB pages: 256 to a part, so a few hundred pages make several parts.
const PS: u32 = 65536;

/// Page `n` as version `v` wrote it (mostly zeros: quick to compress).
fn page(n: u32, v: u32) -> Bytes {
    let mut b = vec![0u8; PS as usize];
    b[..4].copy_from_slice(&n.to_be_bytes());
    b[4..8].copy_from_slice(&v.to_be_bytes());
    b[PS as usize - 1] = (n % 251) as u8;
    Bytes::from(b)
}

fn id(db_pages: u32, sequence: u64) -> SnapshotId {
    SnapshotId {
        database: DatabaseId(7),
        bookmark: Bookmark::new(Epoch(1), Sequence(sequence)),
        chain: ChainHash::from_bytes([sequence as u8; 16]),
        commit_us: sequence,
        page_size: PS,
        db_pages,
    }
}

/// The previous snapshot's parts, every page at version 0.
fn old_parts(old: &SnapshotId) -> Vec<Bytes> {
    (0..old.parts())
        .map(|p| {
            let (first, count) = old.part_pages(p);
            let pages: Vec<u8> = (first..first + count)
                .flat_map(|n| page(n, 0).to_vec())
                .collect();
            Bytes::from(snapshot::encode_part(old, p, &pages).expect("encode"))
        })
        .collect()
}

/// One transaction: the database's size after it, and the pages it wrote
/// (page, version).
type Tx = (u32, Vec<(u32, u32)>);

/// The records of `txs`, one each, after the previous snapshot's bookmark.
fn records(old: &SnapshotId, txs: &[Tx]) -> Vec<Encoded> {
    let (mut previous, mut chain) = (old.bookmark, old.chain);
    txs.iter()
        .enumerate()
        .map(|(i, (db_pages, pages))| {
            let bookmark =
                Bookmark::new(Epoch(1), Sequence(old.bookmark.sequence.0 + 1 + i as u64));
            let r = Record {
                bookmark,
                previous,
                prev_chain: chain,
                commit_us: bookmark.sequence.0,
                page_size: PS,
                db_pages: *db_pages,
                pages: pages.iter().map(|&(n, v)| (n, page(n, v))).collect(),
            };
            let e = r.to_encoded_chunk(false).expect("record");
            (previous, chain) = (bookmark, e.chain);
            e
        })
        .collect()
}

/// The new snapshot's parts as a full build encodes them.
fn full_build(old: &SnapshotId, olds: &[Bytes], log: &[Encoded], new: &SnapshotId) -> Vec<Vec<u8>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut image = Image::create(&dir.path().join("image"), PS, old.db_pages).expect("image");
    for (p, object) in olds.iter().enumerate() {
        let part = snapshot::decode_part(object, old, p as u32).expect("old part");
        image.write_part(&part).expect("write part");
    }
    let mut g = Gathered::default();
    for e in log {
        image.gather(&mut g, e).expect("gather");
    }
    image.write_gathered(g).expect("write log");
    assert_eq!(image.db_pages(), new.db_pages);
    (0..new.parts())
        .map(|p| {
            let (first, count) = new.part_pages(p);
            let pages = image.read_pages(first, count).expect("read");
            snapshot::encode_part(new, p, &pages).expect("encode")
        })
        .collect()
}

/// The new snapshot's parts made incrementally, and how many were carried.
fn incremental(
    old: &SnapshotId,
    olds: &[Bytes],
    log: &[Encoded],
) -> (SnapshotId, Vec<Vec<u8>>, u32) {
    let mut g = Gathered::default();
    let mut page_size = PS;
    for e in log {
        g.take(e, &mut page_size, old.db_pages).expect("take");
    }
    let new = SnapshotId {
        db_pages: g.db_pages().unwrap_or(old.db_pages),
        ..id(0, old.bookmark.sequence.0 + log.len() as u64)
    };
    let mut carried = 0;
    let parts = (0..new.parts())
        .map(|p| {
            let (bytes, how) = encode(old, olds.get(p as usize), &new, p, &g).expect("encode");
            carried += u32::from(how == Source::Carried);
            bytes
        })
        .collect();
    (new, parts, carried)
}

#[test]
fn parts_the_log_left_alone_are_carried_and_every_part_equals_a_full_builds_object() {
    let old = id(600, 10);
    let olds = old_parts(&old);
    // An append-mostly database: the last part rewritten and grown.
    let log = records(
        &old,
        &[
            (601, vec![(1, 1), (599, 1), (600, 1), (601, 1)]),
            (610, (602..=610).map(|n| (n, 2)).collect()),
        ],
    );
    let (new, parts, carried) = incremental(&old, &olds, &log);
    assert_eq!(new.parts(), 3);
    assert_eq!(
        carried, 1,
        "part 1 is untouched; part 0 holds page 1, part 2 the end"
    );
    assert_eq!(parts, full_build(&old, &olds, &log, &new));
    assert_eq!(
        parts[1][88..parts[1].len() - 32],
        olds[1][88..olds[1].len() - 32],
        "the carried part's frame is the previous one's, byte for byte"
    );
}

#[test]
fn a_shrink_into_a_part_rebuilds_it_with_zeros_where_the_log_wrote_nothing_after() {
    let old = id(700, 20);
    let olds = old_parts(&old);
    // Cut into part 1, then grown back over it without rewriting every
    // page: what the log did not write after the cut reads as zeros, as in
    // a full build.
    let log = records(
        &old,
        &[(300, vec![(5, 1)]), (520, vec![(400, 2), (519, 2)])],
    );
    let (new, parts, carried) = incremental(&old, &olds, &log);
    assert_eq!(
        carried, 0,
        "part 0 holds page 5, part 1 the cut, part 2 is new"
    );
    assert_eq!(parts, full_build(&old, &olds, &log, &new));
    // A cut past the parts it leaves alone carries them.
    let log = records(&old, &[(515, vec![(515, 3)])]);
    let (new, parts, carried) = incremental(&old, &olds, &log);
    assert_eq!((new.parts(), carried), (3, 2));
    assert_eq!(parts, full_build(&old, &olds, &log, &new));
}

#[test]
fn random_histories_give_a_full_builds_objects_part_for_part() {
    let mut carried_in_all = 0;
    for seed in 0..12u64 {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let old = id(rng.random_range(1..=800), 30);
        let olds = old_parts(&old);
        let mut db = old.db_pages;
        let mut txs: Vec<Tx> = Vec::new();
        for v in 1..=rng.random_range(1..=4u32) {
            let before = db;
            db = match rng.random_range(0..4) {
                0 if db > 2 => db - rng.random_range(1..=db / 2),
                1 => db + rng.random_range(1..=300),
                _ => db,
            };
            let mut pages: Vec<u32> = (0..rng.random_range(0..6))
                .map(|_| {
                    if rng.random_bool(0.7) {
                        db - rng.random_range(0..db.min(20))
                    } else {
                        rng.random_range(1..=db)
                    }
                })
                .collect();
            // Growth writes the new pages, mostly (not always: a full
            // build zero-fills what it does not).
            if db > before && rng.random_bool(0.8) {
                pages.extend(before + 1..=db);
            }
            pages.sort_unstable();
            pages.dedup();
            txs.push((db, pages.into_iter().map(|n| (n, v)).collect()));
        }
        let log = records(&old, &txs);
        let (new, parts, carried) = incremental(&old, &olds, &log);
        assert_eq!(
            parts,
            full_build(&old, &olds, &log, &new),
            "seed {seed}: {} pages, then {txs:?}",
            old.db_pages
        );
        carried_in_all += carried;
    }
    assert!(carried_in_all > 0, "some histories left a part alone");
}

#[test]
fn a_damaged_previous_part_is_refused_not_carried() {
    let old = id(600, 40);
    let mut olds = old_parts(&old);
    let mut bad = olds[1].to_vec();
    bad[200] ^= 1;
    olds[1] = Bytes::from(bad);
    let log = records(&old, &[(600, vec![(600, 1)])]);
    let mut g = Gathered::default();
    let mut page_size = PS;
    g.take(&log[0], &mut page_size, old.db_pages).expect("take");
    let new = id(600, 41);
    assert!(matches!(
        encode(&old, olds.get(1), &new, 1, &g),
        Err(FormatError::Digest { .. })
    ));
    // A part of another snapshot is refused too.
    let other = id(600, 39);
    assert!(matches!(
        encode(&other, Some(&old_parts(&old)[0]), &new, 0, &g),
        Err(FormatError::Invalid { .. })
    ));
}
