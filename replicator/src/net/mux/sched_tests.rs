use super::*;
use crate::bookmark::{Bookmark, Epoch, Sequence};
use crate::chain::ChainHash;
use crate::record::Record;
use bytes::Bytes;

const A: ChannelId = ChannelId(1);
const B: ChannelId = ChannelId(2);

fn append(len: usize) -> Message {
    let b = |s| Bookmark::new(Epoch(1), Sequence(s));
    Message::Append(
        Record {
            bookmark: b(2),
            previous: b(1),
            prev_chain: ChainHash::GENESIS,
            commit_us: 0,
            page_size: 4096,
            db_pages: (len / 4096 + 2) as u32,
            pages: (0..len / 4096)
                .map(|i| (i as u32 + 2, Bytes::from(vec![1u8; 4096])))
                .collect(),
        }
        .to_encoded()
        .expect("record"),
    )
}

fn small() -> Message {
    Message::CatchUp {
        from: Bookmark::new(Epoch(1), Sequence(1)),
    }
}

fn limits() -> Limits {
    Limits {
        channel_window: 256 << 10,
        connection_window: 384 << 10,
        max_channel_queued: 8 << 20,
        max_connection_queued: 12 << 20,
        ..Limits::default()
    }
}

fn channel_of(out: &Out) -> ChannelId {
    match out {
        Out::Data { channel, .. } | Out::Close { channel, .. } => *channel,
    }
}

#[test]
fn a_flooding_channel_cannot_delay_another_channels_small_frame_past_one_turn() {
    let mut s = Sched::new(limits());
    s.open(A, DatabaseId(1));
    s.open(B, DatabaseId(2));
    for _ in 0..100 {
        s.enqueue(A, append(64 << 10)).expect("queued");
    }
    // A sends until its window is used up.
    let mut sent_a = 0u64;
    while let Some(out) = s.next_out() {
        assert_eq!(channel_of(&out), A);
        sent_a += 1;
    }
    assert!(sent_a <= 5, "A is held by its window: {sent_a} frames");
    // B's small commit arrives: it goes at once, A's backlog
    // notwithstanding (A has no credit; B has its own window).
    s.enqueue(B, small()).expect("queued");
    let out = s.next_out().expect("B may send");
    assert_eq!(channel_of(&out), B);
    // With credit back to both, turns alternate: B never waits for more
    // than one of A's frames.
    for _ in 0..10 {
        s.enqueue(B, small()).expect("queued");
    }
    s.credit(A, 256 << 10);
    let order: Vec<ChannelId> = std::iter::from_fn(|| s.next_out().map(|o| channel_of(&o)))
        .take(8)
        .collect();
    for pair in order.windows(2) {
        assert!(
            !(pair[0] == A && pair[1] == A),
            "A went twice in a row while B waited: {order:?}"
        );
    }
}

#[test]
fn the_connection_window_bounds_every_channel_together_and_credit_reopens_it() {
    let mut s = Sched::new(limits());
    s.open(A, DatabaseId(1));
    s.open(B, DatabaseId(2));
    for _ in 0..10 {
        s.enqueue(A, append(60 << 10)).expect("queued");
        s.enqueue(B, append(60 << 10)).expect("queued");
    }
    let mut bytes = 0i64;
    while let Some(Out::Data { message, .. }) = s.next_out() {
        bytes += charge(&message) as i64;
    }
    assert!(bytes <= (384 << 10) + (61 << 10), "sent {bytes}");
    assert!(s.connection_credit() < 61 << 10);
    // Credit to A returns connection credit too.
    assert!(s.credit(A, 128 << 10));
    assert!(s.next_out().is_some());
    // Credit for a channel that is gone is ignored.
    assert!(!s.credit(ChannelId(99), 1 << 20));
}

#[test]
fn a_frame_larger_than_the_window_goes_when_nothing_is_outstanding() {
    let mut s = Sched::new(limits());
    s.open(A, DatabaseId(1));
    s.enqueue(A, append(1 << 20)).expect("queued");
    assert!(matches!(s.next_out(), Some(Out::Data { .. })));
    s.enqueue(A, small()).expect("queued");
    assert!(s.next_out().is_none(), "A's window is overdrawn");
    s.credit(A, (1 << 20) + 64);
    assert!(s.next_out().is_some());
}

#[test]
fn queues_are_bounded_per_channel_and_per_connection_with_typed_refusals() {
    let mut s = Sched::new(Limits {
        channel_window: 1 << 10,
        connection_window: 1 << 10,
        max_channel_queued: 300 << 10,
        max_connection_queued: 500 << 10,
        ..Limits::default()
    });
    s.open(A, DatabaseId(1));
    s.open(B, DatabaseId(2));
    for _ in 0..2 {
        s.enqueue(A, append(128 << 10))
            .expect("under the channel bound");
    }
    let e = s
        .enqueue(A, append(128 << 10))
        .expect_err("over the channel bound");
    assert!(
        matches!(e, MuxError::ChannelQueueFull { channel: A, .. }),
        "{e}"
    );
    s.enqueue(B, append(128 << 10)).expect("B's first");
    // Over the connection's bound: the refusal names A, which holds the
    // most, not B, whose small share is not the problem.
    let e = s
        .enqueue(B, append(128 << 10))
        .expect_err("over the connection bound");
    assert!(
        matches!(e, MuxError::ConnectionQueueFull { channel: A, .. }),
        "{e}"
    );
    // Removing it frees its queued bytes.
    s.remove(A);
    s.enqueue(B, append(128 << 10)).expect("room again");
}

#[test]
fn close_waits_for_the_queue_then_emits_the_close() {
    let mut s = Sched::new(limits());
    s.open(A, DatabaseId(1));
    s.enqueue(A, small()).expect("queued");
    s.enqueue(A, small()).expect("queued");
    assert_eq!(s.close(A), None, "closes after its queue");
    s.enqueue(A, small()).expect("dropped silently");
    assert!(matches!(s.next_out(), Some(Out::Data { .. })));
    assert!(matches!(s.next_out(), Some(Out::Data { .. })));
    assert_eq!(
        s.next_out(),
        Some(Out::Close {
            channel: A,
            database: DatabaseId(1)
        })
    );
    assert!(s.is_empty());
    s.open(B, DatabaseId(2));
    assert_eq!(s.close(B), Some(DatabaseId(2)), "nothing queued: at once");
}

#[test]
fn the_receiver_refuses_a_peer_past_its_window_and_returns_what_was_handed() {
    let mut s = Sched::new(limits());
    s.open(A, DatabaseId(1));
    s.received(A, 200 << 10).expect("within the window");
    let e = s.received(A, 100 << 10).expect_err("past the window");
    assert!(
        matches!(e, MuxError::CreditExceeded { channel: A, .. }),
        "{e}"
    );
    s.handed(A, 200 << 10);
    assert_eq!(s.take_credit(A), Some(200 << 10));
    assert_eq!(s.take_credit(A), None);
    s.received(A, 100 << 10).expect("credit was returned");
    assert!(matches!(
        s.received(ChannelId(5), 1),
        Err(MuxError::UnknownChannel { .. })
    ));
}
