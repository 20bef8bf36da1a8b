//! The Linux scheduling policy a `walrelay` process runs its threads
//! under (`--cpu-scheduling`).
//!
//! Every write wakes several threads in several processes one after
//! another: the HTTP worker hands the write to its group's leader, the
//! leader sends the record to five followers and the replicas, each
//! follower's acknowledgement wakes the primary's ring, the confirmation
//! wakes the waiting requests. Under `SCHED_OTHER` a thread woken on a busy
//! CPU may preempt the thread that woke it, which then finishes its
//! sends, or its answers, only after a second context switch. Under
//! `SCHED_BATCH` the woken thread waits for the waker to block (or goes to
//! an idle CPU) instead: over HTTP at 16 connections, fewer context
//! switches, 6-11% more requests per second and no change to a lone
//! writer's latency (papers/performance.md, lever 59). Nothing else
//! changes: the policy's priority is the same, it is not real-time and
//! needs no privilege.
//!
//! The policy is set on the main thread before any other thread starts,
//! so every thread of the process inherits it; `up` hands the choice to
//! every process it starts.

/// How a process's threads are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuScheduling {
    /// `SCHED_BATCH`: a woken thread does not preempt the one that woke it.
    Batch,
    /// `SCHED_OTHER`, the kernel's default.
    Normal,
}

impl CpuScheduling {
    /// The flag's value, as `up` passes it on.
    pub fn name(self) -> &'static str {
        match self {
            CpuScheduling::Batch => "batch",
            CpuScheduling::Normal => "normal",
        }
    }

    fn policy(self) -> libc::c_int {
        match self {
            CpuScheduling::Batch => libc::SCHED_BATCH,
            CpuScheduling::Normal => libc::SCHED_OTHER,
        }
    }

    /// Sets the calling thread's policy (inherited by every thread it
    /// starts afterwards). A refusal (a seccomp filter, say) is logged
    /// and the process runs on under the policy it has.
    pub fn apply(self) {
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sched_setscheduler(2) reads the one `sched_param` passed
        // by reference, which lives for the call; pid 0 is the calling
        // thread. Both policies take priority 0.
        let rc = unsafe { libc::sched_setscheduler(0, self.policy(), &param) };
        if rc == 0 {
            tracing::debug!(policy = self.name(), "cpu scheduling set");
        } else {
            tracing::warn!(
                policy = self.name(),
                error = %std::io::Error::last_os_error(),
                "cpu scheduling could not be set; running under the inherited policy"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current_policy() -> libc::c_int {
        // SAFETY: sched_getscheduler(2) takes a pid (0: this thread) and
        // touches no memory.
        unsafe { libc::sched_getscheduler(0) }
    }

    #[test]
    fn each_choice_sets_its_policy_on_the_calling_thread_and_the_threads_it_starts() {
        // A thread of its own, so the test harness's threads keep theirs.
        std::thread::spawn(|| {
            for (choice, policy) in [
                (CpuScheduling::Batch, libc::SCHED_BATCH),
                (CpuScheduling::Normal, libc::SCHED_OTHER),
            ] {
                choice.apply();
                assert_eq!(current_policy(), policy, "{choice:?}");
                let started = std::thread::spawn(current_policy).join().expect("thread");
                assert_eq!(started, policy, "a thread started under {choice:?}");
            }
        })
        .join()
        .expect("test thread");
    }
}
