//! Background work that the commit path never waits for (archive uploads)
//! runs at a lower CPU priority than the commit path. Work a commit may
//! wait for, such as preparing the next log segment (a roll waits for it),
//! must not: a busy host would starve it and stall the commit path behind
//! it.
//!
//! Two levels:
//! - [`lower_this_thread`]: nice [`BACKGROUND_NICE`]. The thread still
//!   gets about a tenth of a busy core, so it never starves (an archive
//!   that stops uploading would let the followers' logs grow). But a nice
//!   value only shares the CPU out over time: a thread the commit path
//!   wakes does not take the CPU from a running background thread, least
//!   of all under `SCHED_BATCH` (`--cpu-scheduling batch`, the default),
//!   where a woken thread never preempts. An upload round's CPU (its
//!   records checked, compressed, a snapshot built) came as 1-4 ms
//!   stretches on one of the bench machine's two cores, and a lone
//!   writer's commits waited behind them: 3-11 ms, in clusters at every
//!   upload (papers/performance.md, lever 67).
//! - [`run_idle`]: the work runs on a thread of its own under
//!   `SCHED_IDLE`, which any other thread's wake-up preempts at once, and
//!   which runs only on CPU time no one else wants (a weight of 3 against
//!   a nice-0 thread's 1,024). For work that can fall behind without
//!   harm; its caller checks that it keeps up and does the work itself,
//!   at the lowered priority, when it does not (an unprivileged thread
//!   cannot leave `SCHED_IDLE` once in it, hence a thread per call).

/// The nice value background threads run at (0 is the default, 19 the
/// lowest priority).
pub const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's CPU priority to [`BACKGROUND_NICE`].
/// Best effort: a failure (a sandbox refusing setpriority) is logged and
/// the thread runs at its normal priority.
pub fn lower_this_thread() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes no arguments and cannot fail.
        let tid = unsafe { libc::gettid() };
        // SAFETY: setpriority reads only its integer arguments; on Linux
        // PRIO_PROCESS with a thread id sets that one thread's nice value.
        let r =
            unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, BACKGROUND_NICE) };
        if r != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "could not lower a background thread's priority"
            );
        }
    }
}

/// Runs `work` on a thread of its own under `SCHED_IDLE` (see the module
/// docs), and returns what it returns. Threads it starts are idle too
/// (the kernel's `SCHED_RESET_ON_FORK` resets only real-time policies): a
/// store's helper threads started by an upload stay idle while they live,
/// and serve only that store's calls, all of them background work on a
/// follower. Best effort: if the policy is refused the work runs at the
/// spawning thread's priority, and if no thread can be started it runs on
/// the caller's.
pub fn run_idle<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    let mut work = Some(work);
    let ran = std::thread::scope(|s| {
        let spawned = std::thread::Builder::new()
            .name("walrelay-idle".into())
            .spawn_scoped(s, || {
                idle_this_thread();
                (work.take().expect("taken once"))()
            });
        spawned.ok().map(|t| t.join())
    });
    match ran {
        Some(Ok(out)) => out,
        // The work panicked on its thread: the same panic here.
        Some(Err(panic)) => std::panic::resume_unwind(panic),
        None => (work.take().expect("not taken: the thread never started"))(),
    }
}

/// Puts the calling thread under `SCHED_IDLE`.
fn idle_this_thread() {
    #[cfg(target_os = "linux")]
    {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler(2) reads the one `sched_param` passed
        // by reference, which lives for the call; pid 0 is the calling
        // thread, and SCHED_IDLE takes priority 0.
        let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
        if r != 0 {
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "could not put a background thread under SCHED_IDLE"
            );
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn a_background_thread_runs_at_the_background_nice_value_and_others_do_not() {
        let before = std::thread::spawn(|| {
            // SAFETY: as above; getpriority reads only its arguments.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        })
        .join()
        .unwrap();
        let after = std::thread::spawn(|| {
            lower_this_thread();
            // SAFETY: as above.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
        })
        .join()
        .unwrap();
        assert_eq!(after, BACKGROUND_NICE.max(before));
        // The spawning thread is untouched.
        // SAFETY: as above.
        let mine = unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
        assert_eq!(mine, before);
    }

    fn policy() -> libc::c_int {
        // SAFETY: sched_getscheduler reads only its argument (0: the
        // calling thread).
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn idle_work_runs_under_sched_idle_as_do_the_threads_it_starts_and_the_caller_is_untouched() {
        let caller = policy();
        let (inside, child) = run_idle(|| {
            let child = std::thread::spawn(policy).join().unwrap();
            (policy(), child)
        });
        assert_eq!(inside, libc::SCHED_IDLE);
        assert_eq!(child, libc::SCHED_IDLE);
        assert_eq!(policy(), caller, "the caller is untouched");
    }

    #[test]
    fn idle_work_hands_back_its_result_and_its_panic() {
        let mut borrowed = vec![1];
        assert_eq!(
            run_idle(|| {
                borrowed.push(2);
                borrowed.len()
            }),
            2
        );
        let r = std::panic::catch_unwind(|| run_idle(|| panic!("inside")));
        assert!(r.is_err());
    }
}
