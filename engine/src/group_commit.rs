//! The queue of group commit: writers that arrive while the writer is busy
//! wait here, and the next writer to get it takes them all and runs them
//! in one transaction (one WAL commit, one log record, one replication
//! round for the whole group). What a group runs, and how one member's
//! failure stays its own, is [`crate::group_write`]'s; this module only
//! decides who leads and hands results back.
//!
//! # Contract
//!
//! - [`GroupQueue::submit`] either makes the caller the **leader**
//!   ([`Turn::Lead`]) or queues its job and waits. At most one leader
//!   exists at a time: the one between `submit` and [`Leader::take`].
//! - The leader gets the writer, then calls [`Leader::take`]: the jobs
//!   queued by then, oldest first, up to a number and a total weight (the
//!   caller's measure, such as bytes), each with a [`Ticket`] to complete.
//!   Taking ends its leadership: a writer arriving after it leads the next
//!   group (and waits for the writer while this group runs, collecting the
//!   jobs that queue meanwhile). Jobs left over past the maximum hand the
//!   leadership to the oldest of them, whose job comes back to it with
//!   the lead (a waiter that kept no copy of its job leads with that one).
//! - Before taking, a leader may [`Leader::gather`]: block until a number
//!   of jobs are queued or a deadline passes, whichever comes first (each
//!   job queued while it waits checks the count and wakes it).
//! - A queued job waits at most its `wait` to be taken; then it is removed
//!   and comes back ([`Turn::TimedOut`]) having never run. A taken job
//!   waits for its result without a deadline: its group is running, and
//!   each statement in it is bounded by its own time limit.
//! - A ticket dropped without a result (a leader that panicked) answers
//!   its waiter [`Turn::Abandoned`]; a leader dropped without taking
//!   hands the leadership on. No waiter waits forever.
//! - A result may be handed back quietly ([`Ticket::complete_quietly`]):
//!   stored, but its waiter is woken only by the returned [`Wakeup`]
//!   (which the caller runs when the result is worth reading, such as
//!   once it is confirmed), or by its own re-check every
//!   [`QUIET_RECHECK`], whichever comes first.
//! - A waiter may be a thread ([`GroupQueue::submit`]) or a task
//!   ([`GroupQueue::enter`], then [`Queued::poll_turn`] with its own
//!   deadline and [`Queued::withdraw`]): the queue treats both alike. A
//!   task's waiter dropped before its turn leaves the queue, or hands on
//!   a leadership it was given, so a client that goes away never stalls
//!   the writers behind it.

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// How often a taken job's waiter looks for a result handed back quietly
/// whose [`Wakeup`] has not come (it bounds the wait if it never does).
pub(crate) const QUIET_RECHECK: Duration = Duration::from_millis(20);

/// Writers queued for the next group, and whether a leader is collecting.
pub(crate) struct GroupQueue<J, R> {
    state: Arc<Mutex<QueueState<J, R>>>,
}

struct QueueState<J, R> {
    queue: VecDeque<Arc<Slot<J, R>>>,
    leading: bool,
    /// A leader waiting in [`Leader::gather`]: how many queued jobs it
    /// waits for, and its thread, unparked when they are there.
    gatherer: Option<(usize, std::thread::Thread)>,
}

/// One queued job's place: its state, and how to wake its waiter (a
/// thread on the condition variable, or a task by its waker).
struct Slot<J, R> {
    state: Mutex<SlotCell<J, R>>,
    changed: Condvar,
}

struct SlotCell<J, R> {
    state: SlotState<J, R>,
    /// The waker of an async waiter ([`Queued::poll_turn`]).
    waker: Option<Waker>,
}

enum SlotState<J, R> {
    Queued(J),
    Taken,
    /// Handed the lead, with its job back.
    Lead(J),
    Done(R),
    Abandoned,
    /// The waiter has read its outcome.
    Read,
}

impl<J, R> Slot<J, R> {
    /// Sets the state and wakes the waiter, however it waits.
    fn set(&self, state: SlotState<J, R>) {
        let waker = {
            let mut c = self.state.lock();
            c.state = state;
            c.waker.take()
        };
        self.wake(waker);
    }

    fn wake(&self, waker: Option<Waker>) {
        self.changed.notify_one();
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// What became of a submitted job.
pub(crate) enum Turn<J, R> {
    /// The caller leads: get the writer, then [`Leader::take`]. With the
    /// job it queued, when it queued one before the lead came to it.
    Lead(Leader<J, R>, Option<J>),
    /// A leader ran the job in its group.
    Done(R),
    /// Not taken within `wait`; the job never ran.
    TimedOut,
    /// Its leader went away without a result (it panicked); whether the
    /// job ran is unknown.
    Abandoned,
}

/// Where [`GroupQueue::enter`] put the caller.
pub(crate) enum Entered<J, R> {
    /// No one led: the caller does.
    Lead(Leader<J, R>),
    /// Its job is queued: wait for its turn.
    Queued(Queued<J, R>),
}

/// The right to take the queue; see the module contract. Owned, so a
/// task may hand it to the thread that runs the group.
pub(crate) struct Leader<J, R> {
    queue: Arc<Mutex<QueueState<J, R>>>,
    taken: bool,
}

/// A queued job, waited for by its submitter: blocking
/// ([`Queued::wait`]) or by polling ([`Queued::poll_turn`]). Dropped
/// before its turn is read, it leaves the queue if still in it, and a
/// leadership handed to it is handed on; a result stored for it is
/// dropped.
pub(crate) struct Queued<J, R> {
    queue: Arc<Mutex<QueueState<J, R>>>,
    slot: Arc<Slot<J, R>>,
    read: bool,
}

/// One taken job's way back to its waiter.
pub(crate) struct Ticket<J, R> {
    slot: Option<Arc<Slot<J, R>>>,
}

impl<J, R> Default for GroupQueue<J, R> {
    fn default() -> Self {
        GroupQueue {
            state: Arc::new(Mutex::new(QueueState {
                queue: VecDeque::new(),
                leading: false,
                gatherer: None,
            })),
        }
    }
}

impl<J, R> GroupQueue<J, R> {
    /// Leads if no one does, or queues the job `make` builds (only then is
    /// it built) and waits: at most `wait` to be taken, then for its
    /// result.
    pub(crate) fn submit(&self, make: impl FnOnce() -> J, wait: Duration) -> Turn<J, R> {
        match self.enter(make) {
            Entered::Lead(l) => Turn::Lead(l, None),
            Entered::Queued(q) => q.wait(wait),
        }
    }

    /// Leads if no one does, or queues the job `make` builds, without
    /// waiting: the caller waits on the [`Queued`] it gets.
    pub(crate) fn enter(&self, make: impl FnOnce() -> J) -> Entered<J, R> {
        let mut st = self.state.lock();
        if !st.leading {
            st.leading = true;
            return Entered::Lead(Leader {
                queue: Arc::clone(&self.state),
                taken: false,
            });
        }
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotCell {
                state: SlotState::Queued(make()),
                waker: None,
            }),
            changed: Condvar::new(),
        });
        st.queue.push_back(Arc::clone(&slot));
        if let Some((want, leader)) = &st.gatherer {
            if st.queue.len() >= *want {
                leader.unpark();
            }
        }
        Entered::Queued(Queued {
            queue: Arc::clone(&self.state),
            slot,
            read: false,
        })
    }

    /// Jobs queued now (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }

    /// Whether a leader is collecting now (for tests).
    #[cfg(test)]
    pub(crate) fn leading(&self) -> bool {
        self.state.lock().leading
    }
}

impl<J, R> Queued<J, R> {
    /// Blocks for the turn: at most `wait` to be taken (then
    /// [`Turn::TimedOut`]), then for its result.
    pub(crate) fn wait(mut self, wait: Duration) -> Turn<J, R> {
        let deadline = Instant::now() + wait;
        let mut s = self.slot.state.lock();
        loop {
            match &s.state {
                SlotState::Taken => {
                    let _ = self.slot.changed.wait_for(&mut s, QUIET_RECHECK);
                }
                SlotState::Queued(_) => {
                    // Taking does not wake the waiter, nor may a quiet
                    // result: look again at least every QUIET_RECHECK.
                    let _ = self
                        .slot
                        .changed
                        .wait_until(&mut s, deadline.min(Instant::now() + QUIET_RECHECK));
                    if Instant::now() >= deadline && matches!(s.state, SlotState::Queued(_)) {
                        // Lock order is queue, then slot: let go of the
                        // slot to take it out of the queue.
                        drop(s);
                        if self.withdraw() {
                            return Turn::TimedOut;
                        }
                        // Taken (or made leader) meanwhile: wait for that.
                        s = self.slot.state.lock();
                    }
                }
                SlotState::Done(_) | SlotState::Abandoned | SlotState::Lead(_) => break,
                SlotState::Read => unreachable!("a slot is read once, by its waiter"),
            }
        }
        let state = std::mem::replace(&mut s.state, SlotState::Read);
        drop(s);
        self.read(state)
    }

    /// The turn if it has come; otherwise `cx`'s waker is woken when it
    /// does (or when a quiet result's [`Wakeup`] runs). A result handed
    /// back quietly is ready to read: a caller that polls only when woken
    /// also polls every [`QUIET_RECHECK`], as [`Queued::wait`] looks.
    pub(crate) fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<Turn<J, R>> {
        let mut s = self.slot.state.lock();
        match &s.state {
            SlotState::Queued(_) | SlotState::Taken => {
                if !s.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    s.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            SlotState::Done(_) | SlotState::Abandoned | SlotState::Lead(_) => {
                let state = std::mem::replace(&mut s.state, SlotState::Read);
                drop(s);
                Poll::Ready(self.read(state))
            }
            SlotState::Read => unreachable!("a slot is read once, by its waiter"),
        }
    }

    /// Takes the job out of the queue if it is still there (true: it
    /// never ran and never will); false once it was taken or made leader.
    pub(crate) fn withdraw(&self) -> bool {
        let mut st = self.queue.lock();
        let before = st.queue.len();
        st.queue.retain(|q| !Arc::ptr_eq(q, &self.slot));
        st.queue.len() < before
    }

    fn read(&mut self, state: SlotState<J, R>) -> Turn<J, R> {
        self.read = true;
        match state {
            SlotState::Done(r) => Turn::Done(r),
            SlotState::Abandoned => Turn::Abandoned,
            SlotState::Lead(job) => Turn::Lead(
                Leader {
                    queue: Arc::clone(&self.queue),
                    taken: false,
                },
                Some(job),
            ),
            _ => unreachable!("only an outcome is read"),
        }
    }
}

impl<J, R> Drop for Queued<J, R> {
    fn drop(&mut self) {
        if self.read || self.withdraw() {
            return;
        }
        // Out of the queue, so its state changes no more but from Taken
        // to a result: a leadership handed to it is handed on.
        let led = {
            let mut s = self.slot.state.lock();
            let led = matches!(s.state, SlotState::Lead(_));
            if led {
                s.state = SlotState::Read;
            }
            led
        };
        if led {
            drop(Leader {
                queue: Arc::clone(&self.queue),
                taken: false,
            });
        }
    }
}

impl<J, R> Leader<J, R> {
    /// Whether no job is queued behind this leader (a moment's answer).
    pub(crate) fn alone(&self) -> bool {
        self.queue.lock().queue.is_empty()
    }

    /// Waits, blocking this thread, until at least `want` jobs are queued
    /// or `until` passes, whichever comes first; returns how many are
    /// queued then.
    pub(crate) fn gather(&self, want: usize, until: Instant) -> usize {
        loop {
            let mut st = self.queue.lock();
            let now = Instant::now();
            if st.queue.len() >= want || now >= until {
                st.gatherer = None;
                return st.queue.len();
            }
            st.gatherer = Some((want, std::thread::current()));
            drop(st);
            // An unpark between the unlock and here is kept for this
            // park; a stale one only costs a loop.
            std::thread::park_timeout(until - now);
        }
    }

    /// Takes queued jobs, oldest first, while there are at most `max`
    /// and their `weight`s sum to at most `budget`, and ends this
    /// leadership (see the module contract). A job that does not fit
    /// stops the taking: it leads the next group, so order is kept.
    pub(crate) fn take(
        mut self,
        max: usize,
        budget: u64,
        weight: impl Fn(&J) -> u64,
    ) -> Vec<(Ticket<J, R>, J)> {
        let mut st = self.queue.lock();
        let mut jobs = Vec::new();
        let mut used = 0u64;
        while jobs.len() < max {
            let Some(slot) = st.queue.front() else {
                break;
            };
            let mut s = slot.state.lock();
            let SlotState::Queued(job) = &s.state else {
                unreachable!("only queued slots are in the queue");
            };
            let w = weight(job);
            if used.saturating_add(w) > budget {
                break;
            }
            used += w;
            let SlotState::Queued(job) = std::mem::replace(&mut s.state, SlotState::Taken) else {
                unreachable!("checked above");
            };
            drop(s);
            let slot = st.queue.pop_front().expect("the front was there");
            jobs.push((Ticket { slot: Some(slot) }, job));
        }
        hand_on(&mut st);
        self.taken = true;
        jobs
    }
}

impl<J, R> Drop for Leader<J, R> {
    fn drop(&mut self) {
        if !self.taken {
            hand_on(&mut self.queue.lock());
        }
    }
}

/// Ends a leadership: the oldest queued job leads next, or no one does
/// until the next writer arrives.
fn hand_on<J, R>(st: &mut QueueState<J, R>) {
    match st.queue.pop_front() {
        None => st.leading = false,
        // Its job goes back to its waiter, who leads with it.
        Some(next) => {
            let waker = {
                let mut c = next.state.lock();
                let SlotState::Queued(job) = std::mem::replace(&mut c.state, SlotState::Read)
                else {
                    unreachable!("only queued slots are in the queue");
                };
                c.state = SlotState::Lead(job);
                c.waker.take()
            };
            next.wake(waker);
        }
    }
}

impl<J, R> Ticket<J, R> {
    /// Hands the job's result to its waiter.
    pub(crate) fn complete(mut self, r: R) {
        if let Some(slot) = self.slot.take() {
            slot.set(SlotState::Done(r));
        }
    }

    /// Stores the job's result without waking its waiter: the returned
    /// [`Wakeup`] does (or the waiter's own re-check).
    pub(crate) fn complete_quietly(mut self, r: R) -> Wakeup<J, R> {
        let slot = self.slot.take().expect("a ticket completes once");
        slot.state.lock().state = SlotState::Done(r);
        Wakeup { slot }
    }
}

/// Wakes the waiter of a result handed back quietly.
pub(crate) struct Wakeup<J, R> {
    slot: Arc<Slot<J, R>>,
}

impl<J, R> Wakeup<J, R> {
    pub(crate) fn wake(self) {
        let waker = self.slot.state.lock().waker.take();
        self.slot.wake(waker);
    }
}

impl<J, R> Drop for Ticket<J, R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            slot.set(SlotState::Abandoned);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Q = GroupQueue<u32, u32>;

    fn lead(q: &Q) -> Leader<u32, u32> {
        match q.submit(
            || unreachable!("a leader's job is not queued"),
            Duration::ZERO,
        ) {
            Turn::Lead(l, _) => l,
            _ => panic!("expected to lead"),
        }
    }

    fn wait_queued(q: &Q, n: usize) {
        let t = Instant::now();
        while q.queued() < n {
            assert!(t.elapsed() < Duration::from_secs(10), "jobs never queued");
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_first_writer_leads_and_builds_no_job() {
        let q = Q::default();
        let l = lead(&q);
        assert!(l.take(8, u64::MAX, |_| 1).is_empty());
        // Leadership ended with the take: the next writer leads too.
        drop(lead(&q));
    }

    #[test]
    fn writers_queued_behind_a_leader_are_taken_oldest_first_and_get_their_results() {
        let q = Arc::new(Q::default());
        let l = lead(&q);
        let waiters: Vec<_> = (0..3u32)
            .map(|i| {
                let q2 = Arc::clone(&q);
                wait_queued(&q, i as usize);
                let h =
                    std::thread::spawn(move || match q2.submit(|| i, Duration::from_secs(30)) {
                        Turn::Done(r) => r,
                        _ => panic!("expected a result"),
                    });
                wait_queued(&q, i as usize + 1);
                h
            })
            .collect();
        let jobs = l.take(8, u64::MAX, |_| 1);
        assert_eq!(jobs.iter().map(|(_, j)| *j).collect::<Vec<_>>(), [0, 1, 2]);
        for (t, j) in jobs {
            t.complete(j * 10);
        }
        let got: Vec<u32> = waiters.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(got, [0, 10, 20]);
    }

    #[test]
    fn a_gathering_leader_stops_waiting_once_the_writes_it_waits_for_are_queued() {
        let q = Arc::new(Q::default());
        let l = lead(&q);
        // Nothing comes: it waits out its deadline.
        let t = Instant::now();
        assert_eq!(l.gather(1, t + Duration::from_millis(30)), 0);
        assert!(t.elapsed() >= Duration::from_millis(30));
        // Two writes arrive after it starts waiting, well within an hour.
        let writers: Vec<_> = (0..2u32)
            .map(|i| {
                let q2 = Arc::clone(&q);
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    q2.submit(|| i, Duration::from_secs(30))
                })
            })
            .collect();
        let t = Instant::now();
        assert_eq!(l.gather(2, t + Duration::from_secs(3600)), 2);
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "woken by the arrivals"
        );
        for (ticket, j) in l.take(8, u64::MAX, |_| 1) {
            ticket.complete(j);
        }
        for w in writers {
            assert!(matches!(w.join().expect("writer"), Turn::Done(_)));
        }
    }

    #[test]
    fn a_result_handed_back_quietly_is_read_at_its_wakeup_or_at_the_recheck() {
        let q = Arc::new(Q::default());
        for wake in [true, false] {
            let l = lead(&q);
            let q2 = Arc::clone(&q);
            let waiter = std::thread::spawn(move || {
                let t = Instant::now();
                match q2.submit(|| 7, Duration::from_secs(30)) {
                    Turn::Done(r) => (r, t.elapsed()),
                    _ => panic!("expected a result"),
                }
            });
            wait_queued(&q, 1);
            let mut jobs = l.take(8, u64::MAX, |_| 1);
            let (t, j) = jobs.pop().expect("one job");
            let wakeup = t.complete_quietly(j + 1);
            if wake {
                wakeup.wake();
            }
            let (r, waited) = waiter.join().unwrap();
            assert_eq!(r, 8);
            assert!(
                waited < Duration::from_secs(10),
                "a quiet result is found without its wakeup too"
            );
        }
    }

    #[test]
    fn jobs_past_the_maximum_hand_the_leadership_to_the_oldest_left() {
        let q = Arc::new(Q::default());
        let l = lead(&q);
        let led = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = (0..3u32)
            .map(|i| {
                let (q2, led) = (Arc::clone(&q), Arc::clone(&led));
                let h = std::thread::spawn(move || {
                    match q2.submit(|| i, Duration::from_secs(30)) {
                        Turn::Lead(l, _) => {
                            led.fetch_add(1, Ordering::SeqCst);
                            // Leads with its own job; nothing else queued.
                            assert!(l.take(8, u64::MAX, |_| 1).is_empty());
                        }
                        Turn::Done(_) => {}
                        _ => panic!("unexpected turn"),
                    }
                });
                wait_queued(&q, i as usize + 1);
                h
            })
            .collect();
        let jobs = l.take(2, u64::MAX, |_| 1);
        assert_eq!(jobs.len(), 2);
        for (t, j) in jobs {
            t.complete(j);
        }
        for h in waiters {
            h.join().unwrap();
        }
        assert_eq!(led.load(Ordering::SeqCst), 1, "the third job led");
        assert_eq!(q.queued(), 0);
    }

    #[test]
    fn a_job_over_the_weight_budget_is_left_to_lead_the_next_group() {
        let q = Arc::new(Q::default());
        let l = lead(&q);
        let led = Arc::new(AtomicUsize::new(0));
        let waiters: Vec<_> = [3u32, 4, 5]
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let (q2, led) = (Arc::clone(&q), Arc::clone(&led));
                let h =
                    std::thread::spawn(move || match q2.submit(|| w, Duration::from_secs(30)) {
                        Turn::Lead(l, _) => {
                            led.fetch_add(1, Ordering::SeqCst);
                            assert!(l.take(8, 10, |&w| u64::from(w)).is_empty());
                        }
                        Turn::Done(_) => {}
                        _ => panic!("unexpected turn"),
                    });
                wait_queued(&q, i + 1);
                h
            })
            .collect();
        // 3 + 4 fit in 10; 5 more would not.
        let jobs = l.take(8, 10, |&w| u64::from(w));
        assert_eq!(jobs.iter().map(|(_, j)| *j).collect::<Vec<_>>(), [3, 4]);
        for (t, j) in jobs {
            t.complete(j);
        }
        for h in waiters {
            h.join().unwrap();
        }
        assert_eq!(led.load(Ordering::SeqCst), 1, "the job of weight 5 led");
    }

    #[test]
    fn a_job_not_taken_within_its_wait_times_out_and_leaves_the_queue() {
        let q = Q::default();
        let l = lead(&q);
        assert!(matches!(
            q.submit(|| 1, Duration::from_millis(20)),
            Turn::TimedOut
        ));
        assert_eq!(q.queued(), 0);
        assert!(l.take(8, u64::MAX, |_| 1).is_empty());
    }

    #[test]
    fn a_dropped_ticket_answers_abandoned_and_a_dropped_leader_hands_on() {
        let q = Arc::new(Q::default());
        let l = lead(&q);
        let q2 = Arc::clone(&q);
        let abandoned = std::thread::spawn(move || {
            matches!(q2.submit(|| 1, Duration::from_secs(30)), Turn::Abandoned)
        });
        wait_queued(&q, 1);
        drop(l.take(8, u64::MAX, |_| 1)); // tickets dropped without results
        assert!(abandoned.join().unwrap());

        // A leader that never takes: the queued writer leads next.
        let l = lead(&q);
        let q2 = Arc::clone(&q);
        let next = std::thread::spawn(move || {
            matches!(q2.submit(|| 2, Duration::from_secs(30)), Turn::Lead(..))
        });
        wait_queued(&q, 1);
        drop(l);
        assert!(next.join().unwrap());
    }

    /// Counts its wake-ups.
    struct CountingWaker(AtomicUsize);

    impl std::task::Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn queued(q: &Q, job: u32) -> Queued<u32, u32> {
        match q.enter(|| job) {
            Entered::Queued(w) => w,
            Entered::Lead(_) => panic!("expected to queue"),
        }
    }

    #[test]
    fn a_polling_waiter_is_woken_by_its_result_and_by_a_quiet_results_wakeup() {
        let q = Q::default();
        for quiet in [false, true] {
            let l = lead(&q);
            let mut w = queued(&q, 3);
            let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
            let waker = std::task::Waker::from(Arc::clone(&counter));
            let mut cx = Context::from_waker(&waker);
            assert!(w.poll_turn(&mut cx).is_pending(), "queued");
            let (t, j) = l.take(8, u64::MAX, |_| 1).pop().expect("one job");
            assert!(w.poll_turn(&mut cx).is_pending(), "taken");
            assert_eq!(counter.0.load(Ordering::SeqCst), 0, "taking wakes no one");
            if quiet {
                let wakeup = t.complete_quietly(j * 2);
                assert_eq!(counter.0.load(Ordering::SeqCst), 0);
                wakeup.wake();
            } else {
                t.complete(j * 2);
            }
            assert_eq!(counter.0.load(Ordering::SeqCst), 1);
            assert!(matches!(w.poll_turn(&mut cx), Poll::Ready(Turn::Done(6))));
        }
    }

    #[test]
    fn a_waiter_dropped_while_queued_leaves_the_queue_and_one_handed_the_lead_hands_it_on() {
        let q = Arc::new(Q::default());
        let l = lead(&q);
        drop(queued(&q, 1));
        assert_eq!(q.queued(), 0, "left the queue");
        // Two queue; a leader that takes none hands the lead to the first,
        // which is dropped: the second leads.
        let first = queued(&q, 2);
        let q2 = Arc::clone(&q);
        let second = std::thread::spawn(move || {
            matches!(q2.submit(|| 3, Duration::from_secs(30)), Turn::Lead(..))
        });
        wait_queued(&q, 2);
        assert!(l.take(0, u64::MAX, |_| 1).is_empty());
        drop(first);
        assert!(second.join().unwrap(), "the lead was handed on");
        assert!(!q.leading(), "and ended");
    }

    #[test]
    fn a_polling_waiter_withdraws_only_while_still_queued() {
        let q = Q::default();
        let l = lead(&q);
        let w = queued(&q, 1);
        let w2 = queued(&q, 2);
        assert!(w.withdraw(), "still queued");
        let jobs = l.take(8, u64::MAX, |_| 1);
        assert_eq!(jobs.len(), 1);
        assert!(!w2.withdraw(), "taken: its result is coming");
        drop(jobs);
        drop((w, w2));
    }

    #[test]
    fn a_queued_job_handed_the_lead_comes_back_with_it() {
        let q = Q::default();
        let l = lead(&q);
        let mut w = queued(&q, 7);
        assert!(l.take(0, u64::MAX, |_| 1).is_empty());
        let waker = std::task::Waker::noop();
        match w.poll_turn(&mut Context::from_waker(waker)) {
            Poll::Ready(Turn::Lead(next, job)) => {
                assert_eq!(job, Some(7));
                drop(next);
            }
            _ => panic!("expected the lead"),
        }
        assert!(!q.leading(), "the lead ended with its leader");
    }
}
