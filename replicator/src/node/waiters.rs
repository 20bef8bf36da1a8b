//! Threads (and callbacks) waiting for a position, woken only once it is
//! reached.
//!
//! A condition variable's `notify_all` on every confirmation wakes every
//! waiting session, and all but the few whose bookmark the confirmation
//! covers go back to sleep: with 16 sessions in flight that is most of a
//! commit's context switches. Here each waiter is filed under the
//! position it waits for, and an advance wakes exactly those at or below
//! it (and a stop wakes them all).
//!
//! The table lives inside the caller's own lock (the one that guards the
//! watermark), so a waiter registers and the watermark advances under one
//! lock and no wake-up is lost; threads are unparked after that lock is
//! released ([`Woken::wake`]). A thread may be unparked spuriously (a
//! stale token from an earlier wait); waiters re-check their condition
//! under the lock, so that costs a loop, never a wrong answer.
//!
//! A waiter may also be a callback ([`Waiters::register_call`]): code that
//! wakes someone else once the position is reached, such as a group
//! commit's members, who then need no wake-up of their own before it.
//! Callbacks run where threads are unparked, after the lock, and must be
//! quick.

use std::collections::BTreeMap;
use std::thread::Thread;
use std::time::Instant;

/// Waiting threads, ordered by the position each waits for.
#[derive(Debug)]
pub struct Waiters<P: Ord + Copy> {
    waiting: BTreeMap<(P, u64), Wake>,
    next_id: u64,
}

/// A callback a waiter leaves to be run once its position is reached.
pub type Call = Box<dyn FnOnce() + Send>;

/// How a waiter is woken.
enum Wake {
    Thread(Thread),
    Call(Call),
}

impl std::fmt::Debug for Wake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wake::Thread(t) => write!(f, "Thread({:?})", t.id()),
            Wake::Call(_) => write!(f, "Call"),
        }
    }
}

impl<P: Ord + Copy> Default for Waiters<P> {
    fn default() -> Self {
        Waiters {
            waiting: BTreeMap::new(),
            next_id: 0,
        }
    }
}

/// A registration, to be withdrawn with [`Waiters::withdraw`] once the
/// waiter stops waiting (woken or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket<P> {
    at: P,
    id: u64,
}

/// Waiters taken out of the table, to wake once the lock is released.
#[must_use = "the waiters must be woken"]
#[derive(Debug, Default)]
pub struct Woken(Vec<Wake>);

impl Woken {
    pub fn wake(self) {
        for w in self.0 {
            match w {
                Wake::Thread(t) => t.unpark(),
                Wake::Call(f) => f(),
            }
        }
    }
}

impl<P: Ord + Copy> Waiters<P> {
    /// Files the calling thread as waiting for `at`.
    pub fn register(&mut self, at: P) -> Ticket<P> {
        self.insert(at, Wake::Thread(std::thread::current()))
    }

    /// Files `call`, to be run once `at` is reached (or at [`Self::all`]).
    /// It stays filed until then: the caller bounds how many it leaves.
    pub fn register_call(&mut self, at: P, call: Call) {
        self.insert(at, Wake::Call(call));
    }

    fn insert(&mut self, at: P, wake: Wake) -> Ticket<P> {
        let id = self.next_id;
        self.next_id = self
            .next_id
            .checked_add(1)
            .expect("2^64 waits cannot happen");
        self.waiting.insert((at, id), wake);
        Ticket { at, id }
    }

    /// Forgets a registration (a no-op if it was already woken).
    pub fn withdraw(&mut self, ticket: Ticket<P>) {
        self.waiting.remove(&(ticket.at, ticket.id));
    }

    /// Takes every waiter for a position at or below `reached`.
    pub fn reached(&mut self, reached: P) -> Woken {
        let mut woken = Vec::new();
        while let Some(entry) = self.waiting.first_entry() {
            if entry.key().0 > reached {
                break;
            }
            woken.push(entry.remove());
        }
        Woken(woken)
    }

    /// Takes every waiter (a stop, a fence: each re-checks and leaves).
    pub fn all(&mut self) -> Woken {
        Woken(std::mem::take(&mut self.waiting).into_values().collect())
    }

    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// Parks the calling thread until it is unparked or `deadline` passes;
/// false once the deadline has passed. The caller re-checks its condition
/// either way.
pub fn park_until(deadline: Instant) -> bool {
    let now = Instant::now();
    if now >= deadline {
        return false;
    }
    std::thread::park_timeout(deadline - now);
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn an_advance_wakes_only_the_waiters_it_reaches() {
        let mut w = Waiters::default();
        let a = w.register(5u64);
        let b = w.register(7u64);
        let _c = w.register(9u64);
        assert_eq!(w.reached(4).0.len(), 0);
        assert_eq!(w.reached(7).0.len(), 2);
        assert_eq!(w.len(), 1);
        w.withdraw(a); // already woken: a no-op
        w.withdraw(b);
        assert_eq!(w.len(), 1);
        assert_eq!(w.all().0.len(), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn a_callback_runs_once_when_its_position_is_reached_and_not_before() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let runs = Arc::new(AtomicUsize::new(0));
        let mut w = Waiters::default();
        let r = Arc::clone(&runs);
        w.register_call(
            5u64,
            Box::new(move || {
                r.fetch_add(1, Ordering::SeqCst);
            }),
        );
        w.reached(4).wake();
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        w.reached(5).wake();
        w.reached(9).wake();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert!(w.is_empty());
    }

    #[test]
    fn two_waiters_for_one_position_are_both_kept_and_woken() {
        let mut w = Waiters::default();
        w.register(3u64);
        w.register(3u64);
        assert_eq!(w.len(), 2);
        assert_eq!(w.reached(3).0.len(), 2);
    }

    #[test]
    fn a_parked_thread_is_woken_by_the_advance_that_reaches_it() {
        let state = Arc::new(parking_lot::Mutex::new((0u64, Waiters::default())));
        let s = Arc::clone(&state);
        let waiter = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut g = s.lock();
            loop {
                if g.0 >= 3 {
                    return true;
                }
                let t = g.1.register(3);
                drop(g);
                let in_time = park_until(deadline);
                g = s.lock();
                g.1.withdraw(t);
                if !in_time {
                    return false;
                }
            }
        });
        for v in 1..=3 {
            std::thread::sleep(Duration::from_millis(5));
            let woken = {
                let mut g = state.lock();
                g.0 = v;
                g.1.reached(v)
            };
            woken.wake();
        }
        assert!(waiter.join().expect("waiter"));
    }
}
