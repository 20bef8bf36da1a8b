//! The capture algorithm's tests: a WAL written the way SQLite writes it.

use super::*;
use std::cell::RefCell;

const PS: u32 = 512;

/// A WAL file in memory that the tests write through the capture, the
/// way SQLite would.
#[derive(Default)]
struct FakeWal {
    bytes: RefCell<Vec<u8>>,
}

impl WalReader for FakeWal {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let b = self.bytes.borrow();
        let s = offset as usize;
        if s + buf.len() > b.len() {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.copy_from_slice(&b[s..s + buf.len()]);
        Ok(())
    }
}

struct Writer {
    wal: FakeWal,
    cap: Capture,
    header: WalHeader,
    /// checksum after each frame, index 0 = header
    chain: Vec<Checksum>,
}

impl Writer {
    fn new(salt: [u32; 2]) -> Writer {
        let hb = WalHeader::encode(false, PS, 0, salt);
        let header = WalHeader::decode(&hb).expect("valid");
        let mut w = Writer {
            wal: FakeWal::default(),
            cap: Capture::default(),
            header,
            chain: vec![header.checksum],
        };
        w.cap.begin_hold();
        w.write(0, &hb);
        w
    }

    fn write(&mut self, off: u64, data: &[u8]) {
        {
            let mut b = self.wal.bytes.borrow_mut();
            let end = off as usize + data.len();
            if b.len() < end {
                b.resize(end, 0);
            }
            b[off as usize..end].copy_from_slice(data);
        }
        self.cap
            .record_write(off, data, &self.wal)
            .expect("write accepted");
    }

    /// Writes frame `frame` as SQLite does: header, then page.
    fn frame(&mut self, frame: u32, page_no: u32, fill: u8, commit: u32) {
        let page = vec![fill; PS as usize];
        let prev = self.chain[frame as usize - 1];
        let (h, ck) = FrameHeader::encode(&self.header, PageNo::new(page_no), commit, prev, &page);
        self.chain.truncate(frame as usize);
        self.chain.push(ck);
        let off = frame_offset(PS, FrameNo::new(frame));
        self.write(off, &h);
        self.write(off + FRAME_HEADER_BYTES as u64, &page);
    }

    fn end(&mut self) -> Option<CapturedTransaction> {
        self.cap
            .end_hold(&self.wal, None)
            .expect("capture succeeds")
    }
}

fn image(t: &CapturedTransaction) -> Vec<(u32, u8)> {
    t.pages
        .pages()
        .iter()
        .map(|(n, b)| (n.get(), b[0]))
        .collect()
}

#[test]
fn a_commit_captures_the_last_image_of_every_page() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 1, 0xa, 0);
    w.frame(2, 2, 0xb, 0);
    w.frame(3, 1, 0xc, 3);
    let t = w.end().expect("committed");
    assert_eq!(t.pages.db_size_pages(), 3);
    assert_eq!(image(&t), vec![(1, 0xc), (2, 0xb)]);
    assert_eq!(t.wal.first_frame, FrameNo::new(1));
    assert_eq!(t.wal.commit_frame, FrameNo::new(3));
}

#[test]
fn a_hold_without_a_commit_frame_captures_nothing() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 1, 1, 0);
    w.frame(2, 2, 2, 0);
    assert_eq!(w.end(), None);
}

#[test]
fn a_savepoint_rewind_keeps_only_frames_up_to_the_commit() {
    let mut w = Writer::new([1, 2]);
    for f in 1..=5 {
        w.frame(f, f, f as u8, 0);
    }
    // rewind to after frame 2, then commit at frame 3
    w.frame(3, 9, 0x99, 9);
    let t = w.end().expect("committed");
    assert_eq!(image(&t), vec![(1, 1), (2, 2), (9, 0x99)]);
}

#[test]
fn consecutive_holds_chain_without_reading_the_file() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 1, 1, 1);
    w.end().expect("first");
    w.cap.begin_hold();
    w.frame(2, 2, 2, 2);
    let t = w.end().expect("second");
    assert_eq!(t.wal.first_frame, FrameNo::new(2));
    assert_eq!(image(&t), vec![(2, 2)]);
}

#[test]
fn a_fresh_capture_seeds_the_chain_from_the_file() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 1, 1, 1);
    w.end().expect("first");
    // A new process: no cached header or chain.
    w.cap = Capture::default();
    w.cap.begin_hold();
    w.frame(2, 2, 2, 2);
    assert_eq!(image(&w.end().expect("second")), vec![(2, 2)]);
}

#[test]
fn a_wal_restart_starts_a_new_chain_at_frame_one() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 1, 1, 0);
    w.frame(2, 2, 2, 2);
    w.end().expect("first");
    let hb = WalHeader::encode(false, PS, 1, [3, 4]);
    w.header = WalHeader::decode(&hb).expect("valid");
    w.chain = vec![w.header.checksum];
    w.cap.begin_hold();
    w.write(0, &hb);
    w.frame(1, 2, 7, 2);
    let t = w.end().expect("after restart");
    assert_eq!(t.wal.salt, [3, 4]);
    assert_eq!(image(&t), vec![(2, 7)]);
}

#[test]
fn pages_beyond_the_committed_size_are_dropped() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 5, 5, 0);
    w.frame(2, 1, 1, 2);
    let t = w.end().expect("committed");
    assert_eq!(image(&t), vec![(1, 1)]);
}

#[test]
fn a_broken_checksum_poisons_the_capture() {
    let mut w = Writer::new([1, 2]);
    w.frame(1, 1, 1, 1);
    let page_off = frame_offset(PS, FrameNo::new(1)) + FRAME_HEADER_BYTES as u64;
    w.write(page_off + 10, &[0xff]);
    assert!(matches!(
        w.cap.end_hold(&w.wal, None),
        Err(CaptureError::Format(_))
    ));
    assert!(w.cap.poisoned().is_some());
    w.cap.begin_hold();
    assert!(w.cap.check_write().is_err());
}

#[test]
fn writes_outside_a_hold_are_refused() {
    let cap = Capture::default();
    assert_eq!(cap.check_write(), Err(CaptureError::WriteOutsideHold));
}

#[test]
fn commit_frame_headers_are_noticed_as_they_are_written() {
    let mut w = Writer::new([1, 2]);
    let page = vec![0u8; PS as usize];
    let (h, _) = FrameHeader::encode(&w.header, PageNo::new(1), 1, w.chain[0], &page);
    let off = frame_offset(PS, FrameNo::new(1));
    let note = w.cap.record_write(off, &h, &w.wal).expect("ok");
    assert!(note.commit_frame_header());
}
