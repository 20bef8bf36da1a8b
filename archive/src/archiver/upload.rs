//! Step 2 of a round: confirmed records into log objects.

use super::{Archiver, Flush, Source, now_us, successor};
use crate::error::{ArchiveError, FormatError};
use crate::log_object::{LogObject, MAX_RAW_BYTES};
use crate::manifest::Manifest;
use crate::names;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use walrelay_replicator::{Bookmark, ChainHash, Encoded};

impl Archiver {
    /// Uploads what is due (all that is confirmed unless `flush` is
    /// [`Flush::No`]); returns how many objects it put. Ends early,
    /// between two objects, once the archiver is stopping (a normal round)
    /// or past a [`Flush::Stop`] deadline.
    pub(super) fn upload_log(
        &mut self,
        source: &dyn Source,
        m: &mut Manifest,
        flush: Flush,
    ) -> Result<u32, ArchiveError> {
        let force = flush != Flush::No;
        let mut uploaded = 0;
        // Where the next object starts: the archived end, or past objects
        // of a giant transaction put up but not yet published.
        let mut cursor: (Bookmark, ChainHash) = (m.log_end, m.log_end_chain);
        let mut pending: Vec<Bookmark> = Vec::new();
        let mut pending_bytes = 0u64;
        loop {
            let confirmed = source.confirmed();
            if confirmed <= cursor.0 {
                if pending.is_empty() {
                    self.stats.lag_bytes.store(0, Ordering::Relaxed);
                    self.stats.lag_ms.store(0, Ordering::Relaxed);
                }
                return Ok(uploaded);
            }
            if source.log_start() > cursor.0 {
                return Err(ArchiveError::LocalGap {
                    start: source.log_start(),
                    archived: cursor.0,
                });
            }
            // Objects of a giant transaction put up but not published are
            // harmless: the next round puts the same ones up again (the
            // store answers "existed") or the sweep removes them.
            if self.out_of_time(flush) {
                tracing::info!(database = %self.config.database, archived = %m.log_end, %confirmed, "log upload stopped: the uploader is stopping; the rest goes up later");
                return Ok(uploaded);
            }
            // Due: forced, inside a giant transaction already going up, or
            // the tail is old or large enough.
            if !force && pending.is_empty() && !self.tail_due(source, cursor.0)? {
                return Ok(uploaded);
            }
            let run = self.next_run(source, cursor.0)?;
            let Some(first) = run.records.first() else {
                return Ok(uploaded);
            };
            if first.prev_chain != cursor.1 {
                // The local log does not continue the archived history:
                // this follower's log diverged, or the store belongs to
                // another history. Never upload it.
                return Err(ArchiveError::Format(FormatError::Invalid {
                    what: "local log",
                    why: "it does not chain onto the archived history",
                }));
            }
            let obj = LogObject::new(self.config.database, run.records)?;
            let key = names::log_key(self.config.database, &obj.name(source.epoch()));
            let encoded = obj.encode()?;
            let n = encoded.len() as u64;
            self.archive.store().create(&key, Bytes::from(encoded))?;
            self.stats.objects_uploaded.fetch_add(1, Ordering::Relaxed);
            self.stats.bytes_uploaded.fetch_add(n, Ordering::Relaxed);
            uploaded += 1;
            pending.extend(obj.records.iter().map(|r| r.bookmark));
            pending_bytes += obj.raw_len();
            cursor = (obj.last, obj.last_chain);
            if obj.records.last().is_some_and(Encoded::continued) {
                // Inside a giant transaction: the manifest moves once its
                // last chunk is up.
                continue;
            }
            let mut next = successor(m, source.epoch());
            next.log_end = obj.last;
            next.log_end_chain = obj.last_chain;
            next.log_end_us = obj.last_us;
            for b in pending.drain(..) {
                next.history.record(b);
            }
            next.since_snapshot_bytes += pending_bytes;
            pending_bytes = 0;
            if self.publish(m, next)? {
                tracing::debug!(database = %self.config.database, archived = %m.log_end, "log archived");
            } else {
                // Another uploader published: go on from its end.
                cursor = (m.log_end, m.log_end_chain);
                pending.clear();
                if m.epoch > source.epoch() {
                    return Ok(uploaded);
                }
            }
        }
    }

    /// Whether a log upload should end before its next object.
    fn out_of_time(&self, flush: Flush) -> bool {
        match flush {
            Flush::Stop { deadline } => std::time::Instant::now() >= deadline,
            Flush::No | Flush::Log | Flush::All => self.stopping(),
        }
    }

    /// Whether the unarchived tail after `after` is due for upload (old
    /// enough or large enough), also setting the lag gauges. A round that
    /// is not due reads nothing from disk: the tail's size comes from the
    /// log's index ([`Source::confirmed_bytes_between`], for the records
    /// confirmed since the last round, the index being walked under the
    /// follower's lock) and its age from its first record, read once per
    /// archived end. A follower writes its
    /// log with `O_DIRECT`, so any record read here is a disk read, and
    /// with every follower's uploader on the same timer, reading the new
    /// records each round came as bursts of reads on the followers' disks
    /// that delayed the quorum's writes (papers/performance.md, lever 56).
    fn tail_due(&mut self, source: &dyn Source, after: Bookmark) -> Result<bool, ArchiveError> {
        let max_bytes = self.config.max_lag_bytes * self.patience();
        let mut tail = match self.tail {
            Some(t) if t.from == after => t,
            _ => match read_records(source, after, 1)?.first() {
                Some(e) => TailStart {
                    from: after,
                    first_commit_us: e.commit_us(),
                    counted_to: after,
                    bytes: 0,
                },
                None => {
                    self.stats.lag_bytes.store(0, Ordering::Relaxed);
                    self.stats.lag_ms.store(0, Ordering::Relaxed);
                    return Ok(false);
                }
            },
        };
        let confirmed = source.confirmed();
        if confirmed > tail.counted_to {
            tail.bytes += source
                .confirmed_bytes_between(tail.counted_to, confirmed)
                .map_err(ArchiveError::Source)?;
            tail.counted_to = confirmed;
        }
        self.tail = Some(tail);
        let age_ms = now_us().saturating_sub(tail.first_commit_us) / 1000;
        self.stats.lag_bytes.store(tail.bytes, Ordering::Relaxed);
        self.stats.lag_ms.store(age_ms, Ordering::Relaxed);
        Ok(age_ms >= self.config.max_lag_ms * self.patience() || tail.bytes >= max_bytes)
    }

    /// The next object's records after `after`: about `object_bytes`,
    /// cut at the last transaction end (or whole, if one transaction
    /// alone fills it).
    fn next_run(&self, source: &dyn Source, after: Bookmark) -> Result<Run, ArchiveError> {
        let target = self.config.object_bytes.max(1);
        let mut run = Run::default();
        let mut at = after;
        while run.bytes < target {
            let want = target - run.bytes;
            let got = read_records(source, at, want)?;
            if got.is_empty() {
                break;
            }
            for e in got {
                run.bytes += e.bytes.len() as u64;
                at = e.bookmark;
                run.records.push(e);
            }
            if run.bytes + target > MAX_RAW_BYTES {
                break;
            }
        }
        let keep = match run.records.iter().rposition(|e| !e.continued()) {
            Some(i) => i + 1,
            None if run.bytes >= target => run.records.len(),
            None => 0,
        };
        run.records.truncate(keep);
        run.bytes = run.records.iter().map(|e| e.bytes.len() as u64).sum();
        Ok(run)
    }
}

#[derive(Default)]
struct Run {
    records: Vec<Encoded>,
    bytes: u64,
}

/// Confirmed records after `after`, about `want` bytes, decoded.
fn read_records(
    source: &dyn Source,
    after: Bookmark,
    want: u64,
) -> Result<Vec<Encoded>, ArchiveError> {
    let got = source
        .read_confirmed(after, want as usize)
        .map_err(ArchiveError::Source)?;
    got.iter()
        .map(|b| {
            Encoded::decode(b).map(|(e, _)| e).map_err(|source| {
                FormatError::Record {
                    what: "local log",
                    source,
                }
                .into()
            })
        })
        .collect()
}

/// The unarchived tail as earlier rounds sized it: the archived end it
/// follows, its first record's commit time, and the bytes of its records
/// up to `counted_to`.
#[derive(Debug, Clone, Copy)]
pub(super) struct TailStart {
    from: Bookmark,
    first_commit_us: u64,
    counted_to: Bookmark,
    bytes: u64,
}
