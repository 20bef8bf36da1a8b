//! Group sync across logs: one sync round for many databases' logs.
//!
//! A follower hosting many databases collects every log touched in one
//! transport drain and makes them durable together: on io_uring every
//! staged write of every log and every touched segment's fdatasync go to
//! the kernel in one submission (each sync linked behind its own file's
//! writes, files in parallel); on the std backend the logs are synced one
//! after the other. Either way each log learns its own outcome.
//!
//! The logs a [`GroupSyncer`] serves are best opened with
//! [`IoBackend::Std`](super::IoBackend::Std): their own (rare) syncs, for
//! a cut or a reset, then need no ring of their own, so an open log costs
//! one descriptor (its current segment) and no ring.
//!
//! On io_uring one failed request fails the whole submission (the error is
//! not tied to a file): every log in it is then failed and poisoned, as
//! after its own failed sync, since what reached the disk is unknown.

use super::{Io, IoBackend, SegmentError, SegmentLog};
use crate::bookmark::Bookmark;

/// What one [`GroupSyncer::sync`] did.
#[derive(Debug)]
pub struct GroupSync {
    /// Per log, in the order given: the durable bookmark or the failure.
    pub results: Vec<Result<Bookmark, SegmentError>>,
    /// fdatasyncs issued (one per touched segment).
    pub fdatasyncs: usize,
    /// Submissions to the kernel that carried them (one on io_uring for
    /// any number of logs; one per log with staged records on std).
    pub submissions: usize,
}

/// Syncs many logs in one round (see the module doc). Owns the one ring
/// all of them share.
#[derive(Debug)]
pub struct GroupSyncer {
    io: Io,
}

impl GroupSyncer {
    /// io_uring where `backend` and the kernel allow it, else std.
    pub fn new(backend: IoBackend) -> GroupSyncer {
        GroupSyncer {
            io: Io::choose(backend),
        }
    }

    /// `"io_uring"` or `"std"`.
    pub fn io_backend(&self) -> &'static str {
        self.io.name()
    }

    /// Writes every log's staged records and makes them durable, in one
    /// submission where io_uring is used. A log that failed before is
    /// reported failed and not touched.
    pub fn sync(&mut self, logs: &mut [&mut SegmentLog]) -> GroupSync {
        let fdatasyncs = logs
            .iter()
            .filter(|l| !l.failed)
            .map(|l| l.staged_segments())
            .sum();
        match &self.io {
            Io::Std => {
                let mut submissions = 0;
                let results = logs
                    .iter_mut()
                    .map(|log| {
                        submissions += usize::from(log.has_staged());
                        log.sync()
                    })
                    .collect();
                GroupSync {
                    results,
                    fdatasyncs,
                    submissions,
                }
            }
            #[cfg(target_os = "linux")]
            Io::Uring(_) => {
                let uptos: Vec<Bookmark> = logs.iter().map(|l| l.last()).collect();
                let mut done: Vec<Option<Result<(), SegmentError>>> =
                    logs.iter().map(|_| None).collect();
                let outcome = {
                    let mut runs = Vec::new();
                    let mut staged_logs = Vec::new();
                    for (i, log) in logs.iter().enumerate() {
                        if log.failed {
                            done[i] = Some(Err(SegmentError::Failed));
                            continue;
                        }
                        match log.staged_runs() {
                            Ok(r) => {
                                runs.extend(r);
                                staged_logs.push(i);
                            }
                            Err(e) => done[i] = Some(Err(e)),
                        }
                    }
                    let outcome = if runs.is_empty() {
                        Ok(false)
                    } else {
                        self.io.write_runs(&runs).map(|()| true).map_err(|(_, e)| e)
                    };
                    (outcome, staged_logs)
                };
                let (outcome, staged_logs) = outcome;
                let submitted = matches!(outcome, Ok(true));
                let failure = outcome.err().map(|e| (e.kind(), e.to_string()));
                for i in staged_logs {
                    done[i] = Some(match &failure {
                        None => Ok(()),
                        Some((kind, why)) => Err(SegmentError::Io {
                            path: logs[i].dir.clone(),
                            source: std::io::Error::new(*kind, why.clone()),
                        }),
                    });
                }
                let results = logs
                    .iter_mut()
                    .zip(uptos)
                    .zip(done)
                    .map(|((log, upto), done)| match done {
                        Some(Err(SegmentError::Failed)) if log.failed => Err(SegmentError::Failed),
                        Some(d) => log.finish_sync(upto, d),
                        None => Err(SegmentError::Failed),
                    })
                    .collect();
                GroupSync {
                    results,
                    fdatasyncs,
                    submissions: usize::from(submitted),
                }
            }
        }
    }
}
