//! Background work that the commit path never waits for (archive uploads)
//! runs at a lower CPU priority than the commit path. Work a commit may
//! wait for, such as preparing the next log segment (a roll waits for it),
//! must not: a busy host would starve it and stall the commit path behind
//! it. The bursts of upload work are short but come on a timer, at the
//! same moment in every node of a host: at equal priority they delay
//! whatever commit is in flight by their whole length (on the 2-core
//! bench machine, the 1-connection HTTP p99). At nice
//! [`BACKGROUND_NICE`] the scheduler runs a waiting commit thread first,
//! and the background thread still gets about a tenth of a busy core, so
//! it never starves (an archive that stops uploading would let the
//! followers' logs grow).

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
}
