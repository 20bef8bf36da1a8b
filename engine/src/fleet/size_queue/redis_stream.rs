//! The size queue on an existing Redis broker: a stream and a consumer
//! group (Redis Streams, Kafka's model: an append-only log, consumers
//! that acknowledge).
//!
//! ```text
//! stream DEFAULT_STREAM, capped near MAX_QUEUE_ENTRIES (XADD MAXLEN ~)
//!   entry: uuid <text>  account <text>  size <decimal u64>
//! group CONSUMER_GROUP (made with the stream); this node reads as
//!   consumer CONSUMER
//! push:  one MULTI of XADDs
//! take:  XREADGROUP ... STREAMS <stream> 0   once after start (entries this
//!        consumer took and never acknowledged: a crash between take and
//!        ack), then XREADGROUP ... STREAMS <stream> >   (new ones)
//! ack:   XACK, then XDEL (acknowledged entries leave the stream)
//! ```
//!
//! Entries that do not parse are acknowledged and dropped (logged): a
//! foreign writer cannot wedge the consumers. How durable the stream is
//! is the broker's configuration (`appendonly yes` for a real one).

use super::{MAX_QUEUE_ENTRIES, SizeQueue, Taken};
use crate::fleet::limits::{LimitsError, SizeReport};
use parking_lot::Mutex;
use redis::streams::{StreamId, StreamReadReply};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The stream's name, unless told otherwise.
pub const DEFAULT_STREAM: &str = "walrelay:sizes";
/// The consumer group every control plane reads in.
pub const CONSUMER_GROUP: &str = "walrelay-catalog";
/// This node's consumer name (one control plane per catalog).
pub const CONSUMER: &str = "control-plane";
/// How long connecting and each command may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// See the module docs.
pub struct RedisSizeQueue {
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
    stream: String,
    /// This consumer's unacknowledged entries were taken again after start.
    recovered: AtomicBool,
}

impl std::fmt::Debug for RedisSizeQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSizeQueue")
            .field("stream", &self.stream)
            .finish()
    }
}

impl RedisSizeQueue {
    /// Connects to the broker at `url` and makes the stream and its group
    /// if they do not exist.
    pub fn open(url: &str, stream: &str) -> Result<RedisSizeQueue, LimitsError> {
        let q = RedisSizeQueue {
            client: redis::Client::open(url)?,
            conn: Mutex::new(None),
            stream: stream.to_string(),
            recovered: AtomicBool::new(false),
        };
        let made: Result<(), redis::RedisError> = q.with(|c| {
            redis::cmd("XGROUP")
                .arg("CREATE")
                .arg(&q.stream)
                .arg(CONSUMER_GROUP)
                .arg("0")
                .arg("MKSTREAM")
                .query(c)
        });
        match made {
            Ok(()) => {}
            Err(e) if e.code() == Some("BUSYGROUP") => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(url, stream, "the size queue is a Redis stream");
        Ok(q)
    }

    /// Runs `f` on the connection, connecting first if there is none; a
    /// failed command drops the connection (the next call reconnects).
    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> Result<T, redis::RedisError>,
    ) -> Result<T, redis::RedisError> {
        let mut guard = self.conn.lock();
        if guard.is_none() {
            let c = self.client.get_connection_with_timeout(TIMEOUT)?;
            c.set_read_timeout(Some(TIMEOUT))?;
            c.set_write_timeout(Some(TIMEOUT))?;
            *guard = Some(c);
        }
        let Some(conn) = guard.as_mut() else {
            unreachable!("connected above");
        };
        let out = f(conn);
        if let Err(e) = &out
            && (e.is_io_error() || e.is_connection_dropped() || e.is_timeout())
        {
            *guard = None;
        }
        out
    }

    fn read(&self, max: usize, from: &str) -> Result<Vec<StreamId>, redis::RedisError> {
        let reply: StreamReadReply = self.with(|c| {
            redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(CONSUMER_GROUP)
                .arg(CONSUMER)
                .arg("COUNT")
                .arg(max.max(1))
                .arg("STREAMS")
                .arg(&self.stream)
                .arg(from)
                .query(c)
        })?;
        Ok(reply.keys.into_iter().flat_map(|k| k.ids).collect())
    }
}

fn report(entry: &StreamId) -> Option<SizeReport> {
    let text = |field: &str| entry.get::<String>(field);
    Some(SizeReport {
        uuid: text("uuid")?,
        account: text("account")?,
        size_bytes: text("size")?.parse().ok()?,
    })
}

impl SizeQueue for RedisSizeQueue {
    fn push(&self, reports: &[SizeReport]) -> Result<usize, LimitsError> {
        if reports.is_empty() {
            return Ok(0);
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        for r in reports {
            pipe.cmd("XADD")
                .arg(&self.stream)
                .arg("MAXLEN")
                .arg("~")
                .arg(MAX_QUEUE_ENTRIES)
                .arg("*")
                .arg("uuid")
                .arg(&r.uuid)
                .arg("account")
                .arg(&r.account)
                .arg("size")
                .arg(r.size_bytes.to_string())
                .ignore();
        }
        self.with(|c| pipe.query::<()>(c))?;
        Ok(reports.len())
    }

    fn take(&self, max: usize) -> Result<Taken, LimitsError> {
        let mut entries = Vec::new();
        if !self.recovered.load(Ordering::Acquire) {
            entries = self.read(max, "0")?;
            if entries.is_empty() {
                self.recovered.store(true, Ordering::Release);
            } else {
                tracing::info!(
                    entries = entries.len(),
                    "taking again size reports taken before a restart and never acknowledged"
                );
            }
        }
        if entries.is_empty() {
            entries = self.read(max, ">")?;
        }
        let mut taken = Taken::default();
        for e in &entries {
            match report(e) {
                Some(r) => taken.reports.push(r),
                None => {
                    tracing::warn!(id = %e.id, "dropping a malformed size report from the broker")
                }
            }
            taken.ids.push(e.id.clone());
        }
        if taken.reports.is_empty() && !taken.ids.is_empty() {
            // Only malformed ones: acknowledged here, as nothing will.
            self.ack(&taken)?;
            taken.ids.clear();
        }
        Ok(taken)
    }

    fn ack(&self, taken: &Taken) -> Result<(), LimitsError> {
        if taken.ids.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("XACK")
            .arg(&self.stream)
            .arg(CONSUMER_GROUP)
            .arg(&taken.ids)
            .ignore();
        pipe.cmd("XDEL").arg(&self.stream).arg(&taken.ids).ignore();
        self.with(|c| pipe.query::<()>(c))?;
        Ok(())
    }

    fn len(&self) -> Result<u64, LimitsError> {
        Ok(self.with(|c| redis::cmd("XLEN").arg(&self.stream).query(c))?)
    }
}
