use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::record::Record;
use crate::wire::{MAX_FRAME_BYTES, WireError};

fn b(s: u64) -> Bookmark {
    Bookmark::new(Epoch(1), Sequence(s))
}

fn append(len: usize) -> Message {
    Message::Append(
        Record {
            bookmark: b(2),
            previous: b(1),
            prev_chain: ChainHash::GENESIS,
            commit_us: 0,
            page_size: len as u32,
            db_pages: 2,
            pages: vec![(2, Bytes::from(vec![9u8; len]))],
        }
        .to_encoded()
        .expect("record"),
    )
}

fn frame(op: MuxOp) -> MuxFrame {
    MuxFrame {
        channel: ChannelId(7),
        database: DatabaseId(0xabc),
        op,
    }
}

#[test]
fn every_channel_op_round_trips_through_the_wire() {
    let ack = Message::Ack {
        durable: b(3),
        chain: ChainHash::GENESIS,
    };
    for op in [
        MuxOp::Open,
        MuxOp::Close(CloseReason::WrongDatabase),
        MuxOp::Credit(12345),
        MuxOp::Data(Box::new(ack)),
        MuxOp::Data(Box::new(append(512))),
    ] {
        let m = Message::Mux(frame(op));
        let bytes = m.encode().expect("encode");
        let (back, used) = Message::decode(&bytes).expect("decode");
        assert_eq!(back, m);
        assert_eq!(used, bytes.len());
    }
}

#[test]
fn an_append_inside_a_channel_frame_shares_the_record_bytes() {
    let m = append(4096);
    let Message::Append(rec) = &m else {
        unreachable!("an append")
    };
    let (head, body) = encode_parts(&frame(MuxOp::Data(Box::new(m.clone())))).expect("parts");
    assert_eq!(body.as_ptr(), rec.bytes.as_ptr(), "no copy of the record");
    assert_eq!(
        head.len(),
        FRAME_HEADER_BYTES + HEADER_BYTES + FRAME_HEADER_BYTES
    );
    assert_eq!(
        charge(&m),
        rec.bytes.len() as u64 + FRAME_HEADER_BYTES as u64
    );
}

#[test]
fn malformed_channel_frames_are_typed_errors_never_panics() {
    let good = Message::Mux(frame(MuxOp::Credit(1)))
        .encode()
        .expect("encode");
    // Every truncation of the body, with the length fixed up, is an error.
    for cut in FRAME_HEADER_BYTES..good.len() {
        let mut bad = good[..cut].to_vec();
        let len = (cut - 4) as u32;
        bad[..4].copy_from_slice(&len.to_be_bytes());
        assert!(Message::decode(&Bytes::from(bad)).is_err(), "cut {cut}");
    }
    let mut bad = good.to_vec();
    bad[6] = 99;
    assert_eq!(
        Message::decode(&Bytes::from(bad)),
        Err(WireError::Mux(MuxWireError::UnknownOp(99)))
    );
    let mut bad = Message::Mux(frame(MuxOp::Close(CloseReason::Closed)))
        .encode()
        .expect("encode")
        .to_vec();
    let last = bad.len() - 1;
    bad[last] = 200;
    assert_eq!(
        Message::decode(&Bytes::from(bad)),
        Err(WireError::Mux(MuxWireError::UnknownReason(200)))
    );
    // Nested channel frames are refused, when encoding and decoding.
    let nested = frame(MuxOp::Data(Box::new(Message::Mux(frame(MuxOp::Open)))));
    assert!(encode_parts(&nested).is_err());
    let inner = Message::Mux(frame(MuxOp::Open)).encode().expect("encode");
    let outer = Message::Mux(frame(MuxOp::Data(Box::new(Message::CatchUp {
        from: b(1),
    }))))
    .encode()
    .expect("encode");
    let mut spliced = outer[..FRAME_HEADER_BYTES + HEADER_BYTES].to_vec();
    spliced.extend_from_slice(&inner);
    let len = (spliced.len() - 4) as u32;
    spliced[..4].copy_from_slice(&len.to_be_bytes());
    assert_eq!(
        Message::decode(&Bytes::from(spliced)),
        Err(WireError::Mux(MuxWireError::Nested))
    );
}

#[test]
fn an_inner_frame_claiming_more_than_its_channel_frame_holds_is_refused() {
    let outer = Message::Mux(frame(MuxOp::Data(Box::new(Message::CatchUp {
        from: b(1),
    }))))
    .encode()
    .expect("encode");
    let mut bad = outer.to_vec();
    // The inner length claims a huge frame; the outer one is small.
    let at = FRAME_HEADER_BYTES + HEADER_BYTES;
    bad[at..at + 4].copy_from_slice(&(u32::MAX - 8).to_be_bytes());
    assert!(matches!(
        Message::decode(&Bytes::from(bad)),
        Err(WireError::Mux(MuxWireError::Inner(_)))
    ));
    // An outer frame past the limit is refused before anything else.
    let mut bad = outer.to_vec();
    bad[..4].copy_from_slice(&(MAX_FRAME_BYTES as u32).to_be_bytes());
    assert!(matches!(
        Message::decode(&Bytes::from(bad)),
        Err(WireError::TooLarge(_))
    ));
}
