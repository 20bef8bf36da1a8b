//! Reader connections: a pool that opens connections lazily up to its
//! maximum, lends them out with a bounded wait, and a classifier
//! connection used only to prepare statements when no reader is idle.
//!
//! Every pooled connection carries the [`Watch`] its progress handler
//! checks (see [`crate::execution`]).

use crate::database::Conn;
use crate::error::QueryError;
use crate::execution::Watch;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// A configured connection and the watch its progress handler checks.
pub(crate) struct Pooled {
    pub(crate) conn: Conn,
    pub(crate) watch: Arc<Watch>,
}

impl Pooled {
    /// Installs a progress handler on `conn` that stops what runs on it at
    /// its deadline, on cancellation, or once `stopping` is set.
    pub(crate) fn new(mut conn: Conn, stopping: &Arc<AtomicBool>) -> rusqlite::Result<Pooled> {
        let watch = Watch::new(Arc::clone(stopping));
        watch.install(&mut conn.conn)?;
        Ok(Pooled { conn, watch })
    }
}

/// Opens one more reader connection (configured, not yet pooled).
pub(crate) type Opener = Box<dyn Fn() -> rusqlite::Result<Conn> + Send + Sync>;

struct State {
    idle: Vec<Pooled>,
    /// Connections open, idle or lent out.
    open: usize,
}

/// Reader connections, opened on demand up to `max`.
pub(crate) struct ReaderPool {
    state: Mutex<State>,
    available: Condvar,
    max: usize,
    opener: Opener,
    stopping: Arc<AtomicBool>,
}

/// A reader lent out; it goes back to the pool when dropped. Whoever
/// holds it must leave it outside any transaction.
pub(crate) struct Lease<'p> {
    pool: &'p ReaderPool,
    conn: Option<Pooled>,
}

impl std::ops::Deref for Lease<'_> {
    type Target = Pooled;
    fn deref(&self) -> &Pooled {
        self.conn
            .as_ref()
            .expect("a lease holds its connection until dropped")
    }
}

impl Lease<'_> {
    /// Closes the reader instead of returning it (it is in a state no
    /// other request may meet); the pool may open another in its place.
    pub(crate) fn discard(mut self) {
        if let Some(c) = self.conn.take() {
            drop(c);
            self.pool.state.lock().open -= 1;
            self.pool.available.notify_one();
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            // The sandbox: settings a client changed end with its request.
            let _ = crate::sandbox::reset_if_dirty(&c.conn);
            self.pool.state.lock().idle.push(c);
            self.pool.available.notify_one();
        }
    }
}

impl ReaderPool {
    /// A pool holding `first` (opened eagerly, so a database that cannot
    /// be read fails at open), growing to `max` with `opener`.
    pub(crate) fn new(
        first: Pooled,
        max: usize,
        opener: Opener,
        stopping: Arc<AtomicBool>,
    ) -> ReaderPool {
        ReaderPool {
            state: Mutex::new(State {
                idle: vec![first],
                open: 1,
            }),
            available: Condvar::new(),
            max: max.max(1),
            opener,
            stopping,
        }
    }

    fn lease(&self, c: Pooled) -> Lease<'_> {
        Lease {
            pool: self,
            conn: Some(c),
        }
    }

    /// An idle reader, never a newly opened one (opening reads the file
    /// and the schema); `None` when none is idle.
    pub(crate) fn try_take_idle(&self) -> Option<Lease<'_>> {
        let c = self.state.lock().idle.pop()?;
        Some(self.lease(c))
    }

    /// An idle reader, or a newly opened one while fewer than the maximum
    /// are open; `None` when every reader is busy.
    pub(crate) fn try_take(&self) -> Result<Option<Lease<'_>>, QueryError> {
        let mut s = self.state.lock();
        if let Some(c) = s.idle.pop() {
            return Ok(Some(self.lease(c)));
        }
        if s.open >= self.max {
            return Ok(None);
        }
        s.open += 1;
        drop(s);
        match (self.opener)().and_then(|c| Pooled::new(c, &self.stopping)) {
            Ok(c) => Ok(Some(self.lease(c))),
            Err(e) => {
                self.state.lock().open -= 1;
                self.available.notify_one();
                Err(QueryError::sql(e))
            }
        }
    }

    /// A reader, waiting at most `wait` for one to come free.
    pub(crate) fn take(&self, wait: Duration) -> Result<Lease<'_>, QueryError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(c) = self.try_take()? {
                return Ok(c);
            }
            let mut s = self.state.lock();
            while s.idle.is_empty() && s.open >= self.max {
                if self.available.wait_until(&mut s, deadline).timed_out()
                    && s.idle.is_empty()
                    && s.open >= self.max
                {
                    return Err(QueryError::Busy {
                        resource: "a reader connection",
                        waited_ms: wait.as_millis() as u64,
                    });
                }
            }
        }
    }

    /// Connections lent out now, and open in all.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let s = self.state.lock();
        (s.open - s.idle.len(), s.open)
    }
}
