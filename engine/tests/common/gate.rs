//! An output gate a test controls: it records what commits, confirms only
//! what the test releases, refuses writes while closed and gives up when
//! told to ([`Gate`]).

use parking_lot::{Condvar, Mutex};
use std::time::Duration;
use walrelay_engine::{Bookmark, CapturedTransaction, CommitGate, GateError, TransactionSink};

/// A callback left with the gate until a bookmark is confirmed.
pub type Wake = Box<dyn FnOnce() + Send>;

/// Confirms only what the test releases; refuses writes while `closed`.
#[derive(Default)]
pub struct Gate {
    pub confirmed: Mutex<Option<Bookmark>>,
    pub changed: Condvar,
    pub committed: Mutex<Vec<Bookmark>>,
    pub closed: Mutex<bool>,
    pub give_up: Mutex<bool>,
    /// Callbacks left by `on_confirmed`, run by `release`.
    pub calls: Mutex<Vec<(Bookmark, Wake)>>,
    /// How often `poll_confirmed` was asked (the async write path).
    pub polls: std::sync::atomic::AtomicUsize,
}

impl Gate {
    pub fn release(&self, upto: Bookmark) {
        *self.confirmed.lock() = Some(upto);
        self.changed.notify_all();
        let due: Vec<_> = {
            let mut calls = self.calls.lock();
            let (due, later) = std::mem::take(&mut *calls)
                .into_iter()
                .partition(|(b, _)| *b <= upto);
            *calls = later;
            due
        };
        for (_, call) in due {
            call();
        }
    }
    pub fn committed(&self) -> Vec<Bookmark> {
        self.committed.lock().clone()
    }
}

impl TransactionSink for Gate {
    fn committed(
        &self,
        bookmark: Bookmark,
        _: &CapturedTransaction,
    ) -> Result<(), walrelay_engine::ShipError> {
        self.committed.lock().push(bookmark);
        Ok(())
    }
}

impl CommitGate for Gate {
    fn admit_write(&self) -> Result<(), GateError> {
        if *self.closed.lock() {
            return Err(GateError::Backlog {
                unconfirmed_bytes: 1,
                limit_bytes: 0,
                streaming: 0,
            });
        }
        Ok(())
    }
    fn wait_confirmed(&self, bookmark: Bookmark) -> Result<(), GateError> {
        let mut c = self.confirmed.lock();
        loop {
            if c.is_some_and(|c| c >= bookmark) {
                return Ok(());
            }
            if *self.give_up.lock() {
                return Err(GateError::Timeout {
                    waited_ms: 0,
                    quiet_ms: 0,
                    write_quorum: 3,
                    streaming: 0,
                });
            }
            self.changed.wait_for(&mut c, Duration::from_millis(5));
        }
    }
    fn on_confirmed(&self, bookmark: Bookmark, wake: Box<dyn FnOnce() + Send>) {
        let mut calls = self.calls.lock();
        if self.confirmed.lock().is_some_and(|c| c >= bookmark) {
            drop(calls);
            wake();
        } else {
            calls.push((bookmark, wake));
        }
    }
    fn try_admit_write(&self) -> Option<Result<(), GateError>> {
        Some(self.admit_write())
    }
    fn poll_confirmed(&self, bookmark: Bookmark) -> Option<Result<(), GateError>> {
        self.polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.confirmed
            .lock()
            .is_some_and(|c| c >= bookmark)
            .then_some(Ok(()))
    }
}
