//! The session consistency checker, shared: a recorded history of
//! requests and answers (reads summarise the state they saw, writes append
//! one row each) and [`check`], which judges it. `consistency.rs` drives it
//! through a local cluster with lagging replicas; `failover.rs` through
//! `walrelay up` while the primary is killed again and again.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use walrelay_engine::Bookmark;
use walrelay_engine::Value;
use walrelay_engine::http::api::{Body, Statement};
use walrelay_engine::http::client::{ClientSession, NodeInfo, Reply};

// ---------------------------------------------------------------------------
// The recorded history

/// Where a request was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Primary,
    /// A replica, by region.
    Replica(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Read,
    /// The session's `n`-th write.
    Write {
        n: i64,
    },
}

/// A read's summary of the state it saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct State {
    /// The highest id (0: empty).
    pub hi: i64,
    pub count: i64,
    /// The reading session's highest `n` (0: none).
    pub mine: i64,
    /// The sum of every row's [`row_hash`].
    pub digest: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// A write's row id (meta.last_row_id).
    Written {
        id: i64,
    },
    State(State),
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub served_by_primary: bool,
    pub served_by_region: String,
    /// meta.bookmark.
    pub bookmark: String,
    /// The session's bookmark in the response header.
    pub header: Option<String>,
    pub seen: Seen,
}

/// One request of one session, with its answer.
#[derive(Debug, Clone)]
pub struct Event {
    pub session: usize,
    /// Its place among the session's requests.
    pub step: usize,
    /// What the request carried in x-d1-bookmark.
    pub sent: String,
    pub to: Node,
    pub op: Op,
    pub answer: Result<Answer, String>,
}

pub const CREATE: &str = "CREATE TABLE log(id INTEGER PRIMARY KEY AUTOINCREMENT, session INTEGER NOT NULL, n INTEGER NOT NULL)";
pub const INDEX: &str = "CREATE INDEX log_session ON log(session, n)";
pub const WRITE: &str = "INSERT INTO log(session, n) VALUES (?1, ?2)";
/// Must compute [`row_hash`] exactly (integers only, no overflow).
pub const READ: &str = "SELECT max(id) AS hi, count(*) AS c, \
     (SELECT max(n) FROM log WHERE session = ?1) AS mine, \
     sum((id * 2654435761 + session * 40503 + n * 97) % 1000000007) AS digest \
     FROM log";

/// A row's contribution to a read's digest: order-independent, but a row
/// missing, duplicated or altered changes the sum.
pub fn row_hash(id: i64, session: i64, n: i64) -> i64 {
    (id * 2_654_435_761 + session * 40_503 + n * 97) % 1_000_000_007
}

// ---------------------------------------------------------------------------
// The checker

/// Which guarantee an answer broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Rule {
    /// A read missed a write of its own session.
    ReadYourWrites,
    /// A read missed something an earlier read of its session saw.
    MonotonicReads,
    /// A write was ordered before something its session had already seen.
    WritesFollowReads,
    /// Ids and bookmarks disagree on the order of writes (a later id has
    /// an earlier bookmark; writes committed in one transaction share
    /// one), or an id repeats.
    WriteOrder,
    /// An answer's bookmark is older than the request's.
    BookmarkRegressed,
    /// A read missed a write that the bookmark it carried covers.
    BookmarkCoverage,
    /// A read saw a write newer than the bookmark it reported.
    BookmarkUnderstated,
    /// A read's state is not a prefix of the order of writes.
    NotAPrefix,
    /// Served somewhere it must not be (a write on a replica, a
    /// first-primary query off the primary, another replica's region).
    Routing,
    /// An answer the checker cannot read.
    Malformed,
}

#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: Rule,
    pub session: usize,
    pub step: usize,
    pub detail: String,
}

/// What the checker found, with counts that show what was exercised.
#[derive(Debug, Default)]
pub struct Report {
    pub violations: Vec<Violation>,
    /// Requests that failed (the test expects none).
    pub errors: Vec<String>,
    pub sessions: usize,
    pub reads: usize,
    /// Reads sent to a replica and served by it.
    pub replica_reads: usize,
    /// Reads sent to the primary.
    pub primary_reads: usize,
    /// Reads sent to a replica with a bookmark it had not reached in time,
    /// so the primary served them.
    pub lag_fallbacks: usize,
    /// first-primary queries a replica handed to the primary.
    pub first_primary_forwards: usize,
    pub writes: usize,
    /// Writes sent to a replica (forwarded to the primary).
    pub forwarded_writes: usize,
    /// Reads that carried a bookmark covering some write.
    pub covering_reads: usize,
}

impl Report {
    pub fn rules(&self) -> Vec<Rule> {
        let mut r: Vec<Rule> = self.violations.iter().map(|v| v.rule).collect();
        r.sort();
        r.dedup();
        r
    }

    pub fn summary(&self) -> String {
        let pct = |a: usize, b: usize| {
            if b == 0 {
                0.0
            } else {
                100.0 * a as f64 / b as f64
            }
        };
        format!(
            "{} sessions; {} reads: {} served by replicas ({:.0}%), {} sent to the primary, \
             {} fell back to the primary (replica behind), {} first-primary forwards; \
             {} writes ({} forwarded by replicas); {} reads carried a covering bookmark; \
             {} errors; {} violations",
            self.sessions,
            self.reads,
            self.replica_reads,
            pct(self.replica_reads, self.reads),
            self.primary_reads,
            self.lag_fallbacks,
            self.first_primary_forwards,
            self.writes,
            self.forwarded_writes,
            self.covering_reads,
            self.errors.len(),
            self.violations.len(),
        )
    }

    pub fn first_violations(&self, limit: usize) -> String {
        let mut s = String::new();
        for v in self.violations.iter().take(limit) {
            let _ = writeln!(
                s,
                "  {:?} session {} step {}: {}",
                v.rule, v.session, v.step, v.detail
            );
        }
        s
    }
}

impl Violation {
    pub fn at(rule: Rule, e: &Event, detail: String) -> Violation {
        Violation {
            rule,
            session: e.session,
            step: e.step,
            detail,
        }
    }
}

/// An acknowledged write.
#[derive(Debug, Clone, Copy)]
pub struct Write {
    pub session: usize,
    pub step: usize,
    pub n: i64,
    pub bookmark: Bookmark,
}

/// Every acknowledged write, indexed for the checks.
pub struct Writes {
    pub by_id: BTreeMap<i64, Write>,
    /// (bookmark, id) by bookmark, the id replaced by the running maximum:
    /// the highest id among writes at or before a bookmark.
    pub covered: Vec<(Bookmark, i64)>,
    /// Per session, (id, n) by id, n replaced by the running maximum.
    pub mine: BTreeMap<usize, Vec<(i64, i64)>>,
    /// `prefix_digest[h]`: the digest of ids 1..=h, as far as every one of
    /// them is known.
    pub prefix_digest: Vec<i64>,
}

impl Writes {
    /// Indexes the acknowledged writes; reports an id given twice, and ids
    /// and bookmarks that disagree on the order of writes.
    pub fn index(history: &[Event], out: &mut Vec<Violation>) -> Writes {
        let mut by_id: BTreeMap<i64, Write> = BTreeMap::new();
        for e in history {
            let (Op::Write { n }, Ok(a)) = (e.op, &e.answer) else {
                continue;
            };
            // Anything unreadable is reported with its session.
            let (Seen::Written { id }, Some(bookmark)) = (a.seen, parse_bookmark(&a.bookmark))
            else {
                continue;
            };
            let w = Write {
                session: e.session,
                step: e.step,
                n,
                bookmark,
            };
            if let Some(prev) = by_id.insert(id, w) {
                out.push(Violation::at(
                    Rule::WriteOrder,
                    e,
                    format!(
                        "id {id} given to two writes (also session {} step {})",
                        prev.session, prev.step
                    ),
                ));
            }
        }
        let mut last: Option<(i64, Bookmark)> = None;
        for (&id, w) in &by_id {
            // Writes that one transaction committed (a group commit)
            // share its bookmark; a later id never has an earlier one.
            if let Some((pid, pb)) = last
                && w.bookmark < pb
            {
                out.push(Violation {
                    rule: Rule::WriteOrder,
                    session: w.session,
                    step: w.step,
                    detail: format!(
                        "write id {id} has bookmark {} but the earlier id {pid} has {pb}",
                        w.bookmark
                    ),
                });
            }
            last = Some((id, w.bookmark));
        }
        let mut covered: Vec<(Bookmark, i64)> =
            by_id.iter().map(|(&id, w)| (w.bookmark, id)).collect();
        covered.sort();
        let mut running = 0;
        for x in &mut covered {
            running = running.max(x.1);
            x.1 = running;
        }
        let mut mine: BTreeMap<usize, Vec<(i64, i64)>> = BTreeMap::new();
        for (&id, w) in &by_id {
            let ns = mine.entry(w.session).or_default();
            let n = ns.last().map_or(w.n, |&(_, m)| m.max(w.n));
            ns.push((id, n));
        }
        let mut prefix_digest = vec![0];
        for h in 1.. {
            let Some(w) = by_id.get(&h) else { break };
            let d = prefix_digest[prefix_digest.len() - 1] + row_hash(h, w.session as i64, w.n);
            prefix_digest.push(d);
        }
        Writes {
            by_id,
            covered,
            mine,
            prefix_digest,
        }
    }

    /// The highest id among acknowledged writes that `b` covers (0: none).
    pub fn covered_by(&self, b: Bookmark) -> i64 {
        let i = self.covered.partition_point(|(x, _)| *x <= b);
        if i == 0 { 0 } else { self.covered[i - 1].1 }
    }

    /// The highest `n` of `session` among ids 1..=hi.
    pub fn mine_upto(&self, session: usize, hi: i64) -> i64 {
        let Some(ns) = self.mine.get(&session) else {
            return 0;
        };
        match ns.partition_point(|&(id, _)| id <= hi) {
            0 => 0,
            i => ns[i - 1].1,
        }
    }
}

pub fn parse_bookmark(s: &str) -> Option<Bookmark> {
    s.parse().ok()
}

/// What a session has done and seen so far.
#[derive(Debug, Default)]
pub struct Past {
    /// Its highest write id.
    pub last_write: i64,
    /// The highest id any of its reads saw.
    pub max_read: i64,
    /// Its acknowledged writes.
    pub writes: i64,
    /// A write of it failed: it may or may not have committed.
    pub uncertain: bool,
}

/// Judges a recorded history: events of any number of sessions, in any
/// interleaving (each session's are put in step order).
pub fn check(history: &[Event]) -> Report {
    let mut report = Report::default();
    let writes = Writes::index(history, &mut report.violations);
    let mut sessions: BTreeMap<usize, Vec<&Event>> = BTreeMap::new();
    for e in history {
        sessions.entry(e.session).or_default().push(e);
    }
    report.sessions = sessions.len();
    for events in sessions.values_mut() {
        events.sort_by_key(|e| e.step);
        let mut past = Past::default();
        for (i, e) in events.iter().enumerate() {
            check_event(e, i == 0, &writes, &mut past, &mut report);
        }
    }
    report
}

pub fn check_event(e: &Event, first: bool, writes: &Writes, past: &mut Past, report: &mut Report) {
    let out = &mut report.violations;
    let sent = if e.sent.starts_with("first-") {
        None
    } else if let Some(b) = parse_bookmark(&e.sent) {
        Some(b)
    } else {
        out.push(Violation::at(
            Rule::Malformed,
            e,
            format!("sent bookmark {:?}", e.sent),
        ));
        return;
    };
    let a = match &e.answer {
        Ok(a) => a,
        Err(err) => {
            report.errors.push(format!(
                "session {} step {} {:?} via {:?}: {err}",
                e.session, e.step, e.op, e.to
            ));
            past.uncertain |= matches!(e.op, Op::Write { .. });
            return;
        }
    };
    let Some(got) = parse_bookmark(&a.bookmark) else {
        out.push(Violation::at(
            Rule::Malformed,
            e,
            format!("meta.bookmark {:?}", a.bookmark),
        ));
        return;
    };
    // The session's bookmark never goes back, and covers this answer.
    match a.header.as_deref().map(parse_bookmark) {
        Some(Some(h)) => {
            let floor = sent.map_or(got, |s| s.max(got));
            if h < floor {
                out.push(Violation::at(
                    Rule::BookmarkRegressed,
                    e,
                    format!("header bookmark {h} < max(sent, meta) {floor}"),
                ));
            }
        }
        other => out.push(Violation::at(
            Rule::Malformed,
            e,
            format!("header bookmark {:?} ({other:?})", a.header),
        )),
    }
    // Where it was served.
    if e.to == Node::Primary && !a.served_by_primary {
        out.push(Violation::at(
            Rule::Routing,
            e,
            "sent to the primary, served elsewhere".into(),
        ));
    }
    if let Node::Replica(region) = &e.to
        && !a.served_by_primary
        && a.served_by_region != *region
    {
        out.push(Violation::at(
            Rule::Routing,
            e,
            format!("sent to {region}, served by {}", a.served_by_region),
        ));
    }
    if first && e.sent == "first-primary" && !a.served_by_primary {
        out.push(Violation::at(
            Rule::Routing,
            e,
            "a first-primary session's first query was not served by the primary".into(),
        ));
    }
    match (e.op, a.seen) {
        (Op::Read, Seen::State(st)) => {
            report.reads += 1;
            match (&e.to, a.served_by_primary) {
                (Node::Primary, _) => report.primary_reads += 1,
                (Node::Replica(_), false) => report.replica_reads += 1,
                (Node::Replica(_), true) if sent.is_some() => report.lag_fallbacks += 1,
                (Node::Replica(_), true) => report.first_primary_forwards += 1,
            }
            if sent.is_some_and(|s| writes.covered_by(s) > 0) {
                report.covering_reads += 1;
            }
            check_read(e, st, sent, got, writes, past, out);
        }
        (Op::Write { n }, Seen::Written { id }) => {
            report.writes += 1;
            if e.to != Node::Primary {
                report.forwarded_writes += 1;
            }
            if !a.served_by_primary {
                out.push(Violation::at(
                    Rule::Routing,
                    e,
                    "a write not served by the primary".into(),
                ));
            }
            check_write(e, n, id, sent, got, writes, past, out);
        }
        (op, seen) => out.push(Violation::at(
            Rule::Malformed,
            e,
            format!("{op:?} answered with {seen:?}"),
        )),
    }
}

/// A read: `sent` is the bookmark it carried, `got` the one it reported.
pub fn check_read(
    e: &Event,
    st: State,
    sent: Option<Bookmark>,
    got: Bookmark,
    writes: &Writes,
    past: &mut Past,
    out: &mut Vec<Violation>,
) {
    let mut violate = |rule, detail| out.push(Violation::at(rule, e, detail));
    if st.hi < past.last_write || (!past.uncertain && st.mine < past.writes) {
        violate(
            Rule::ReadYourWrites,
            format!(
                "saw up to id {} (own n {}) after writing id {} (own n {})",
                st.hi, st.mine, past.last_write, past.writes
            ),
        );
    }
    if st.hi < past.max_read {
        violate(
            Rule::MonotonicReads,
            format!(
                "saw up to id {} after a read saw up to id {}",
                st.hi, past.max_read
            ),
        );
    }
    if let Some(s) = sent {
        if got < s {
            violate(
                Rule::BookmarkRegressed,
                format!("read answered at {got}, asked for {s}"),
            );
        }
        let need = writes.covered_by(s);
        if st.hi < need {
            violate(
                Rule::BookmarkCoverage,
                format!(
                    "carried bookmark {s}, which covers id {need}, but saw up to id {}",
                    st.hi
                ),
            );
        }
    }
    if let Some(w) = writes.by_id.get(&st.hi)
        && w.bookmark > got
    {
        violate(
            Rule::BookmarkUnderstated,
            format!(
                "saw id {} (bookmark {}) but reported {got}",
                st.hi, w.bookmark
            ),
        );
    }
    if st.count != st.hi {
        violate(
            Rule::NotAPrefix,
            format!("{} rows up to id {}", st.count, st.hi),
        );
    } else if let Some(&want) = writes.prefix_digest.get(st.hi as usize) {
        if st.digest != want {
            violate(
                Rule::NotAPrefix,
                format!(
                    "digest {} for ids 1..={}, expected {want}",
                    st.digest, st.hi
                ),
            );
        }
        let mine = writes.mine_upto(e.session, st.hi);
        if st.mine != mine {
            violate(
                Rule::NotAPrefix,
                format!("own n {} in ids 1..={}, expected {mine}", st.mine, st.hi),
            );
        }
    }
    past.max_read = past.max_read.max(st.hi);
}

/// A write of the session's `n`-th row, given `id`.
#[allow(clippy::too_many_arguments)]
pub fn check_write(
    e: &Event,
    n: i64,
    id: i64,
    sent: Option<Bookmark>,
    got: Bookmark,
    writes: &Writes,
    past: &mut Past,
    out: &mut Vec<Violation>,
) {
    let mut violate = |rule, detail| out.push(Violation::at(rule, e, detail));
    if id <= past.max_read || id <= past.last_write {
        violate(
            Rule::WritesFollowReads,
            format!(
                "write got id {id} after the session saw id {} and wrote id {}",
                past.max_read, past.last_write
            ),
        );
    }
    if let Some(s) = sent {
        if got <= s {
            violate(
                Rule::BookmarkRegressed,
                format!("write committed at {got}, not after the carried {s}"),
            );
        }
        let need = writes.covered_by(s);
        if id <= need {
            violate(
                Rule::WritesFollowReads,
                format!("write got id {id}, but its bookmark {s} covers id {need}"),
            );
        }
    }
    if n != past.writes + 1 && !past.uncertain {
        violate(
            Rule::Malformed,
            format!("write n {n} after {} writes (harness bug)", past.writes),
        );
    }
    past.last_write = past.last_write.max(id);
    past.writes = n;
}

pub fn one(sql: &str, params: Vec<Value>) -> Body {
    Body::One(Statement {
        sql: sql.into(),
        params,
    })
}

pub fn int(v: Option<&serde_json::Value>) -> Result<i64, String> {
    match v {
        None | Some(serde_json::Value::Null) => Ok(0),
        Some(x) => x.as_i64().ok_or_else(|| format!("not an integer: {x}")),
    }
}

pub fn decode(op: Op, reply: &Reply) -> Result<Answer, String> {
    let [r] = &reply.response.result[..] else {
        return Err(format!("{} results", reply.response.result.len()));
    };
    let seen = match op {
        Op::Write { .. } => Seen::Written {
            id: r.meta.last_row_id,
        },
        Op::Read => {
            let [row] = &r.results[..] else {
                return Err(format!("{} rows", r.results.len()));
            };
            Seen::State(State {
                hi: int(row.get("hi"))?,
                count: int(row.get("c"))?,
                mine: int(row.get("mine"))?,
                digest: int(row.get("digest"))?,
            })
        }
    };
    Ok(Answer {
        served_by_primary: r.meta.served_by_primary,
        served_by_region: r.meta.served_by_region.clone(),
        bookmark: r.meta.bookmark.clone(),
        header: reply.bookmark.clone(),
        seen,
    })
}

pub fn node_of(n: &NodeInfo) -> Node {
    if n.primary {
        Node::Primary
    } else {
        Node::Replica(n.region.clone())
    }
}

/// Sends one request of `session` through `node` and records it.
pub fn request(
    s: &ClientSession<'_>,
    constraint: &str,
    session: usize,
    step: usize,
    node: &NodeInfo,
    op: Op,
) -> Event {
    let sent = s.bookmark().unwrap_or_else(|| constraint.to_string());
    let body = match op {
        Op::Read => one(READ, vec![Value::Integer(session as i64)]),
        Op::Write { n } => one(
            WRITE,
            vec![Value::Integer(session as i64), Value::Integer(n)],
        ),
    };
    let answer = s
        .query_via(&node.url, &body)
        .map_err(|e| e.to_string())
        .and_then(|r| decode(op, &r));
    Event {
        session,
        step,
        sent,
        to: node_of(node),
        op,
        answer,
    }
}
