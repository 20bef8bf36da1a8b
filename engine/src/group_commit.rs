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
//!   leadership to the oldest of them.
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

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a taken job's waiter looks for a result handed back quietly
/// whose [`Wakeup`] has not come (it bounds the wait if it never does).
pub(crate) const QUIET_RECHECK: Duration = Duration::from_millis(20);

/// Writers queued for the next group, and whether a leader is collecting.
pub(crate) struct GroupQueue<J, R> {
    state: Mutex<QueueState<J, R>>,
}

struct QueueState<J, R> {
    queue: VecDeque<Arc<Slot<J, R>>>,
    leading: bool,
}

struct Slot<J, R> {
    state: Mutex<SlotState<J, R>>,
    changed: Condvar,
}

enum SlotState<J, R> {
    Queued(J),
    Taken,
    Lead,
    Done(R),
    Abandoned,
    /// The waiter has read its outcome.
    Read,
}

/// What became of a submitted job.
pub(crate) enum Turn<'q, J, R> {
    /// The caller leads: get the writer, then [`Leader::take`].
    Lead(Leader<'q, J, R>),
    /// A leader ran the job in its group.
    Done(R),
    /// Not taken within `wait`; the job never ran.
    TimedOut,
    /// Its leader went away without a result (it panicked); whether the
    /// job ran is unknown.
    Abandoned,
}

/// The right to take the queue; see the module contract.
pub(crate) struct Leader<'q, J, R> {
    queue: &'q GroupQueue<J, R>,
    taken: bool,
}

/// One taken job's way back to its waiter.
pub(crate) struct Ticket<J, R> {
    slot: Option<Arc<Slot<J, R>>>,
}

impl<J, R> Default for GroupQueue<J, R> {
    fn default() -> Self {
        GroupQueue {
            state: Mutex::new(QueueState {
                queue: VecDeque::new(),
                leading: false,
            }),
        }
    }
}

impl<J, R> GroupQueue<J, R> {
    /// Leads if no one does, or queues the job `make` builds (only then is
    /// it built) and waits: at most `wait` to be taken, then for its
    /// result.
    pub(crate) fn submit(&self, make: impl FnOnce() -> J, wait: Duration) -> Turn<'_, J, R> {
        let slot = {
            let mut st = self.state.lock();
            if !st.leading {
                st.leading = true;
                return Turn::Lead(Leader {
                    queue: self,
                    taken: false,
                });
            }
            let slot = Arc::new(Slot {
                state: Mutex::new(SlotState::Queued(make())),
                changed: Condvar::new(),
            });
            st.queue.push_back(Arc::clone(&slot));
            slot
        };
        let deadline = Instant::now() + wait;
        let mut s = slot.state.lock();
        loop {
            match &*s {
                SlotState::Taken => {
                    let _ = slot.changed.wait_for(&mut s, QUIET_RECHECK);
                }
                SlotState::Queued(_) => {
                    // Taking does not wake the waiter, nor may a quiet
                    // result: look again at least every QUIET_RECHECK.
                    let _ = slot
                        .changed
                        .wait_until(&mut s, deadline.min(Instant::now() + QUIET_RECHECK));
                    if Instant::now() >= deadline && matches!(*s, SlotState::Queued(_)) {
                        // Lock order is queue, then slot: let go of the
                        // slot to take it out of the queue.
                        drop(s);
                        let mut st = self.state.lock();
                        let before = st.queue.len();
                        st.queue.retain(|q| !Arc::ptr_eq(q, &slot));
                        if st.queue.len() < before {
                            return Turn::TimedOut;
                        }
                        // Taken (or made leader) meanwhile: wait for that.
                        drop(st);
                        s = slot.state.lock();
                    }
                }
                SlotState::Done(_) | SlotState::Abandoned | SlotState::Lead => break,
                SlotState::Read => unreachable!("a slot is read once, by its waiter"),
            }
        }
        match std::mem::replace(&mut *s, SlotState::Read) {
            SlotState::Done(r) => Turn::Done(r),
            SlotState::Abandoned => Turn::Abandoned,
            SlotState::Lead => Turn::Lead(Leader {
                queue: self,
                taken: false,
            }),
            _ => unreachable!("the loop ends only on an outcome"),
        }
    }

    /// Jobs queued now (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn queued(&self) -> usize {
        self.state.lock().queue.len()
    }
}

impl<J, R> Leader<'_, J, R> {
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
        let mut st = self.queue.state.lock();
        let mut jobs = Vec::new();
        let mut used = 0u64;
        while jobs.len() < max {
            let Some(slot) = st.queue.front() else {
                break;
            };
            let mut s = slot.state.lock();
            let SlotState::Queued(job) = &*s else {
                unreachable!("only queued slots are in the queue");
            };
            let w = weight(job);
            if used.saturating_add(w) > budget {
                break;
            }
            used += w;
            let SlotState::Queued(job) = std::mem::replace(&mut *s, SlotState::Taken) else {
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

impl<J, R> Drop for Leader<'_, J, R> {
    fn drop(&mut self) {
        if !self.taken {
            hand_on(&mut self.queue.state.lock());
        }
    }
}

/// Ends a leadership: the oldest queued job leads next, or no one does
/// until the next writer arrives.
fn hand_on<J, R>(st: &mut QueueState<J, R>) {
    match st.queue.pop_front() {
        None => st.leading = false,
        Some(next) => {
            let mut s = next.state.lock();
            // Its job stays with its waiter, who leads with it.
            *s = SlotState::Lead;
            next.changed.notify_one();
        }
    }
}

impl<J, R> Ticket<J, R> {
    /// Hands the job's result to its waiter.
    pub(crate) fn complete(mut self, r: R) {
        if let Some(slot) = self.slot.take() {
            *slot.state.lock() = SlotState::Done(r);
            slot.changed.notify_one();
        }
    }
}

/// Wakes the waiter of a result handed back quietly.
pub(crate) struct Wakeup<J, R> {
    slot: Arc<Slot<J, R>>,
}

impl<J, R> Wakeup<J, R> {
    pub(crate) fn wake(self) {
        self.slot.changed.notify_one();
    }
}

impl<J, R> Ticket<J, R> {
    /// Stores the job's result without waking its waiter: the returned
    /// [`Wakeup`] does (or the waiter's own re-check).
    pub(crate) fn complete_quietly(mut self, r: R) -> Wakeup<J, R> {
        let slot = self.slot.take().expect("a ticket completes once");
        *slot.state.lock() = SlotState::Done(r);
        Wakeup { slot }
    }
}

impl<J, R> Drop for Ticket<J, R> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            *slot.state.lock() = SlotState::Abandoned;
            slot.changed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    type Q = GroupQueue<u32, u32>;

    fn lead(q: &Q) -> Leader<'_, u32, u32> {
        match q.submit(
            || unreachable!("a leader's job is not queued"),
            Duration::ZERO,
        ) {
            Turn::Lead(l) => l,
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
                        Turn::Lead(l) => {
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
                        Turn::Lead(l) => {
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
            matches!(q2.submit(|| 2, Duration::from_secs(30)), Turn::Lead(_))
        });
        wait_queued(&q, 1);
        drop(l);
        assert!(next.join().unwrap());
    }
}
