//! Sequential consistency of sessions, checked from the outside.
//!
//! Many concurrent sessions do random reads and writes, each request sent
//! through a random node of a [`LocalCluster`] whose replicas lag behind
//! the primary (the replica subscriber's delay knob). Every request and
//! answer is recorded; [`check`] then judges the whole recorded history.
//!
//! The data makes every answer checkable. A write appends one row to
//! `log(id AUTOINCREMENT, session, n)`, `n` counting the session's writes:
//! its id is its place in the one order of writes. A read returns the
//! state it saw in summary: the highest id, the row count, the session's
//! own last `n` and a digest of every row. Ids are dense (rows are never
//! deleted and a rolled-back insert gives its id back), so a state is a
//! prefix of the write order exactly when its count equals its highest id
//! and its digest equals that prefix's digest.
//!
//! What is checked, per session (in the order it issued requests):
//! - read-your-writes: a read sees every write the session made before it;
//! - monotonic reads: a read sees everything an earlier read saw;
//! - writes-follow-reads: a write is ordered after everything the session
//!   read or wrote before it;
//! - bookmarks: an answer's bookmark is never older than the one the
//!   request carried (a write's is newer), a read sees every write the
//!   carried bookmark covers (also bookmarks handed over from another
//!   session), and a read's bookmark covers everything it saw;
//!
//! and globally: one total order of writes, the same in ids and bookmarks;
//! every state read is a prefix of it; after the run every node holds every
//! acknowledged write.
//!
//! `WALRELAY_SEED=n` replays a seed's choices (the interleaving is the
//! scheduler's); `WALRELAY_SOAK=1` runs more seeds, sessions and requests.

mod common;

use common::consistency::*;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};
use walrelay_engine::Value;
use walrelay_engine::http::client::NodeInfo;
use walrelay_engine::local_cluster::{LocalCluster, LocalClusterConfig};
use walrelay_engine::{Bookmark, Epoch, Sequence};

// ---------------------------------------------------------------------------
// The workload

/// How a run is shaped.
#[derive(Debug, Clone)]
struct Workload {
    /// Concurrent sessions (one thread each).
    threads: usize,
    /// Sessions each thread runs one after another.
    sessions_per_thread: usize,
    /// Requests per session.
    ops: std::ops::Range<usize>,
    write_percent: u32,
    /// Requests sent straight to the primary; the rest go to a random
    /// replica.
    primary_percent: u32,
    delay_ms: u64,
    max_wait_ms: u64,
}

const REGIONS: [&str; 3] = ["region-a", "region-b", "region-c"];

/// Waits until every replica has confirmed the primary's latest bookmark.
fn replicas_catch_up(c: &LocalCluster) {
    let latest = c.primary.database().latest_bookmark();
    for (r, region) in c.replicas.iter().zip(REGIONS) {
        assert!(
            r.node().wait_confirmed(latest, Duration::from_secs(20)),
            "{region} never reached {latest} (at {})",
            r.replica().confirmed()
        );
    }
}

/// One session's life on one thread.
fn run_session(
    rng: &mut SmallRng,
    w: &Workload,
    c: &LocalCluster,
    nodes: &[NodeInfo],
    board: &Mutex<Vec<String>>,
    session: usize,
    events: &mut Vec<Event>,
) {
    let client = c.client(REGIONS[rng.random_range(0..REGIONS.len())]);
    // D1's three ways to start: anywhere, at the primary, or from a
    // bookmark another session handed over.
    let constraint = match rng.random_range(0..100) {
        0..15 => "first-primary".to_string(),
        15..35 => {
            let b = board.lock().expect("board");
            if b.is_empty() {
                "first-unconstrained".to_string()
            } else {
                b[rng.random_range(0..b.len())].clone()
            }
        }
        _ => "first-unconstrained".to_string(),
    };
    let s = client.session(&constraint);
    let mut n = 0;
    for step in 0..rng.random_range(w.ops.clone()) {
        let op = if rng.random_range(0..100) < w.write_percent {
            n += 1;
            Op::Write { n }
        } else {
            Op::Read
        };
        let node = if rng.random_range(0..100) < w.primary_percent {
            &nodes[0]
        } else {
            &nodes[rng.random_range(1..nodes.len())]
        };
        events.push(request(&s, &constraint, session, step, node, op));
    }
    if let Some(b) = s.bookmark() {
        board.lock().expect("board").push(b);
    }
}

/// Runs the workload on a fresh cluster; returns the history, ending with
/// one read per node after the replicas caught up.
fn run(seed: u64, w: &Workload) -> Vec<Event> {
    let dir = tempfile::tempdir().expect("dir");
    let c = LocalCluster::start(
        dir.path(),
        LocalClusterConfig {
            replica_regions: REGIONS.iter().map(|r| r.to_string()).collect(),
            replica_delay_ms: w.delay_ms,
            replica_max_wait_ms: w.max_wait_ms,
            ..LocalClusterConfig::default()
        },
    )
    .expect("cluster");
    let nodes = c.nodes();
    assert!(nodes[0].primary && nodes.len() == 1 + REGIONS.len());
    {
        let client = c.client("region-a");
        let setup = client.session("first-primary");
        setup.query(CREATE, vec![]).expect("create");
        setup.query(INDEX, vec![]).expect("index");
    }
    // An unconstrained read on a replica that has no table yet would fail.
    replicas_catch_up(&c);

    let board = Mutex::new(Vec::new());
    let barrier = Barrier::new(w.threads);
    let mut history: Vec<Event> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..w.threads)
            .map(|t| {
                let (c, nodes, board, barrier) = (&c, &nodes, &board, &barrier);
                scope.spawn(move || {
                    let mut rng = SmallRng::seed_from_u64(
                        seed ^ (t as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    );
                    let mut events = Vec::new();
                    barrier.wait();
                    for k in 0..w.sessions_per_thread {
                        let session = t * w.sessions_per_thread + k;
                        run_session(&mut rng, w, c, nodes, board, session, &mut events);
                    }
                    events
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("session thread"))
            .collect()
    });

    // Afterwards every node holds every acknowledged write: one session
    // per node, starting from the newest bookmark of any answer.
    let newest = history
        .iter()
        .filter_map(|e| e.answer.as_ref().ok())
        .map(|a| a.bookmark.clone())
        .max()
        .expect("answers");
    replicas_catch_up(&c);
    let client = c.client("region-a");
    let first = w.threads * w.sessions_per_thread;
    for (i, node) in nodes.iter().enumerate() {
        let s = client.session(&newest);
        let e = request(&s, &newest, first + i, 0, node, Op::Read);
        if let Ok(a) = &e.answer {
            assert_eq!(
                a.served_by_primary, node.primary,
                "a caught-up {:?} serves the final read itself",
                e.to
            );
        }
        history.push(e);
    }
    history
}

/// Runs `seed`, checks its history, prints what happened and asserts zero
/// violations; returns the report for the caller's own assertions.
fn run_and_check(name: &str, seed: u64, w: &Workload) -> Report {
    eprintln!("{name}: seed={seed} (replay: WALRELAY_SEED={seed}) {w:?}");
    let started = Instant::now();
    let history = run(seed, w);
    let ran = started.elapsed();
    let report = check(&history);
    eprintln!(
        "{name}: {} requests in {:.1}s; {}",
        history.len(),
        ran.as_secs_f64(),
        report.summary()
    );
    assert!(
        report.errors.is_empty(),
        "{name} seed {seed}: {} requests failed, e.g. {:?}",
        report.errors.len(),
        &report.errors[..report.errors.len().min(5)]
    );
    assert!(
        report.violations.is_empty(),
        "{name} seed {seed}: {} violations of {:?}:\n{}",
        report.violations.len(),
        report.rules(),
        report.first_violations(20)
    );
    assert!(
        report.sessions > w.threads * w.sessions_per_thread,
        "every session and the final reads were checked"
    );
    // No write lost, none invented: the final reads (the coverage check
    // already holds them to every acknowledged write) see exactly those.
    let first_final = w.threads * w.sessions_per_thread;
    for e in history.iter().filter(|e| e.session >= first_final) {
        let Ok(Answer {
            seen: Seen::State(st),
            ..
        }) = &e.answer
        else {
            panic!("final read {e:?}");
        };
        assert_eq!(
            st.hi as usize, report.writes,
            "{:?} holds exactly the acknowledged writes",
            e.to
        );
    }
    assert!(
        report.covering_reads > report.reads / 2,
        "reads carried bookmarks"
    );
    report
}

fn soak() -> bool {
    common::soak()
}

fn workload(delay_ms: u64, max_wait_ms: u64) -> Workload {
    Workload {
        threads: if soak() { 96 } else { 56 },
        sessions_per_thread: if soak() { 4 } else { 2 },
        ops: if soak() { 20..50 } else { 12..28 },
        write_percent: 35,
        primary_percent: 15,
        delay_ms,
        max_wait_ms,
    }
}

// ---------------------------------------------------------------------------
// The cluster runs

#[test]
fn concurrent_sessions_through_lagging_replicas_are_sequentially_consistent() {
    // Replicas lag by about as long as a read may wait for them: most
    // reads are served by a replica after waiting, some wait in vain and
    // are served by the primary.
    for seed in common::seeds(1, 4) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let delay_ms = rng.random_range(18..=30);
        let report = run_and_check("lagging", seed, &workload(delay_ms, 30));
        assert!(
            report.replica_reads * 3 > report.reads,
            "lagging replicas served a good share of the reads (typically 65-80%)"
        );
    }
}

#[test]
fn concurrent_sessions_through_replicas_that_lag_past_the_wait_fall_back_and_stay_consistent() {
    // Replicas lag longer than a read may wait: a read needing a recent
    // bookmark is served by the primary, a read needing an older one by a
    // replica.
    for seed in common::seeds(1, 2) {
        let report = run_and_check("far-behind", seed, &workload(60, 15));
        assert!(report.lag_fallbacks > 0, "reads fell back to the primary");
        assert!(
            report.replica_reads > 0,
            "replicas served the reads they could"
        );
    }
}

#[test]
fn concurrent_sessions_through_replicas_without_delay_are_sequentially_consistent() {
    for seed in common::seeds(1, 2) {
        let report = run_and_check("no-delay", seed, &workload(0, 1_000));
        assert!(
            report.replica_reads * 10 > report.reads * 7,
            "replicas served most reads"
        );
    }
}

/// The negative control: the same cluster, with a session that drops its
/// bookmark on reads (as a buggy replica ignoring it would). The replicas
/// really lag, so the checker must see stale reads.
#[test]
fn a_session_whose_bookmark_is_ignored_reads_stale_state_and_the_checker_says_so() {
    let dir = tempfile::tempdir().expect("dir");
    let c = LocalCluster::start(
        dir.path(),
        LocalClusterConfig {
            replica_regions: REGIONS.iter().map(|r| r.to_string()).collect(),
            replica_delay_ms: 300,
            replica_max_wait_ms: 20,
            ..LocalClusterConfig::default()
        },
    )
    .expect("cluster");
    let nodes = c.nodes();
    let client = c.client("region-a");
    let setup = client.session("first-primary");
    setup.query(CREATE, vec![]).expect("create");
    replicas_catch_up(&c);
    let s = client.session("first-primary");
    let mut history = Vec::new();
    for i in 0..3 {
        history.push(request(
            &s,
            "first-primary",
            0,
            2 * i,
            &nodes[0],
            Op::Write { n: i as i64 + 1 },
        ));
        // What the session would have sent, recorded as sent; the replica
        // never sees it.
        let sent = s.bookmark().expect("wrote");
        let replica = &nodes[1 + i % REGIONS.len()];
        let answer = client
            .send(
                &replica.url,
                Some("first-unconstrained"),
                &one(READ, vec![Value::Integer(0)]),
            )
            .map_err(|e| e.to_string())
            .and_then(|r| decode(Op::Read, &r));
        history.push(Event {
            session: 0,
            step: 2 * i + 1,
            sent,
            to: node_of(replica),
            op: Op::Read,
            answer,
        });
    }
    let report = check(&history);
    eprintln!("{}\n{}", report.summary(), report.first_violations(10));
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let rules = report.rules();
    for rule in [
        Rule::ReadYourWrites,
        Rule::BookmarkCoverage,
        Rule::BookmarkRegressed,
    ] {
        assert!(rules.contains(&rule), "{rule:?} reported: {rules:?}");
    }
}

// ---------------------------------------------------------------------------
// The checker on fabricated histories

/// Builds histories by hand: writes get the ids and bookmarks given, reads
/// see a consistent prefix of the writes (filled in by `done`) unless told
/// otherwise. Sessions carry their bookmark as the client does.
#[derive(Default)]
struct Fab {
    events: Vec<Event>,
    headers: BTreeMap<usize, String>,
    steps: BTreeMap<usize, usize>,
    writes: BTreeMap<usize, i64>,
}

fn bm(seq: u64) -> String {
    Bookmark::new(Epoch(1), Sequence(seq)).to_string()
}

impl Fab {
    fn push(&mut self, session: usize, op: Op, seen: Seen, bookmark: u64) -> &mut Event {
        let header = self
            .headers
            .entry(session)
            .or_insert_with(|| "first-unconstrained".into());
        let sent = header.clone();
        let b = bm(bookmark);
        if sent.starts_with("first-") || b > sent {
            *header = b.clone();
        }
        let step = self.steps.entry(session).or_default();
        *step += 1;
        self.events.push(Event {
            session,
            step: *step,
            sent,
            to: Node::Replica("region-a".into()),
            op,
            answer: Ok(Answer {
                served_by_primary: matches!(op, Op::Write { .. }),
                served_by_region: "region-a".into(),
                bookmark: b,
                header: Some(header.clone()),
                seen,
            }),
        });
        self.events.last_mut().expect("pushed")
    }

    /// The session's next write, with row `id` at `bookmark`.
    fn write(&mut self, session: usize, id: i64, bookmark: u64) -> &mut Event {
        let n = self.writes.entry(session).or_default();
        *n += 1;
        let n = *n;
        self.push(session, Op::Write { n }, Seen::Written { id }, bookmark)
    }

    /// A read that saw ids 1..=hi, answered at `bookmark`.
    fn read(&mut self, session: usize, hi: i64, bookmark: u64) -> &mut Event {
        let st = State {
            hi,
            count: -1,
            mine: -1,
            digest: -1,
        };
        self.push(session, Op::Read, Seen::State(st), bookmark)
    }

    /// Fills in each read's count, own n and digest from the writes, where
    /// the test left them at -1.
    fn done(mut self) -> Vec<Event> {
        let rows: BTreeMap<i64, (usize, i64)> = self
            .events
            .iter()
            .filter_map(|e| match (e.op, &e.answer) {
                (
                    Op::Write { n },
                    Ok(Answer {
                        seen: Seen::Written { id },
                        ..
                    }),
                ) => Some((*id, (e.session, n))),
                _ => None,
            })
            .collect();
        for e in &mut self.events {
            let session = e.session;
            if let Ok(Answer {
                seen: Seen::State(st),
                ..
            }) = &mut e.answer
            {
                let prefix = || rows.range(..=st.hi);
                if st.count == -1 {
                    st.count = prefix().count() as i64;
                }
                if st.mine == -1 {
                    st.mine = prefix()
                        .filter(|(_, (s, _))| *s == session)
                        .map(|(_, (_, n))| *n)
                        .max()
                        .unwrap_or(0);
                }
                if st.digest == -1 {
                    st.digest = prefix()
                        .map(|(&id, &(s, n))| row_hash(id, s as i64, n))
                        .sum();
                }
            }
        }
        self.events
    }
}

/// Two sessions interleaved, as a correct system could answer them
/// (bookmark k is the transaction of id k).
fn consistent() -> Fab {
    let mut f = Fab::default();
    f.read(0, 0, 0);
    f.write(0, 1, 1);
    f.read(1, 1, 1);
    f.write(1, 2, 2);
    f.read(0, 1, 1); // a replica not yet at id 2: fine for session 0
    f.write(0, 3, 3);
    f.read(1, 3, 3);
    f.read(0, 3, 3);
    f
}

fn rules_of(history: &[Event]) -> Vec<Rule> {
    let r = check(history);
    assert!(r.errors.is_empty(), "{:?}", r.errors);
    r.rules()
}

#[test]
fn the_checker_accepts_a_consistent_interleaving() {
    let report = check(&consistent().done());
    assert!(
        report.violations.is_empty(),
        "{}",
        report.first_violations(10)
    );
    assert_eq!((report.reads, report.writes, report.sessions), (5, 3, 2));
}

#[test]
fn the_checker_reports_a_read_that_misses_the_sessions_own_write() {
    let mut f = consistent();
    f.write(1, 4, 4);
    // A lagging replica's consistent, but older, state.
    f.read(1, 3, 4);
    let rules = rules_of(&f.done());
    assert!(rules.contains(&Rule::ReadYourWrites), "{rules:?}");
    assert!(rules.contains(&Rule::BookmarkCoverage), "{rules:?}");
}

#[test]
fn the_checker_reports_a_read_older_than_an_earlier_read_of_the_session() {
    let mut f = consistent();
    // Session 1 saw id 3, wrote only id 2.
    f.read(1, 2, 3);
    assert_eq!(
        rules_of(&f.done()),
        vec![Rule::MonotonicReads, Rule::BookmarkCoverage]
    );
}

#[test]
fn the_checker_reports_a_write_ordered_before_what_its_session_read() {
    let mut f = Fab::default();
    f.write(0, 1, 1);
    f.write(1, 3, 3);
    f.read(0, 3, 3);
    // Session 0 saw id 3, then its write is ordered before it (the read
    // above saw this write before it was issued).
    f.write(0, 2, 2);
    assert_eq!(
        rules_of(&f.done()),
        vec![Rule::WritesFollowReads, Rule::BookmarkRegressed]
    );
}

#[test]
fn the_checker_accepts_writes_of_one_transaction_sharing_its_bookmark() {
    let mut f = Fab::default();
    // A group commit: three sessions' writes in one transaction.
    f.write(0, 1, 1);
    f.write(1, 2, 1);
    f.write(2, 3, 1);
    f.read(0, 3, 1);
    f.write(1, 4, 2);
    assert_eq!(rules_of(&f.done()), Vec::<Rule>::new());
}

#[test]
fn the_checker_reports_writes_whose_ids_and_bookmarks_disagree() {
    let mut f = Fab::default();
    f.write(0, 1, 2);
    f.write(1, 2, 1);
    assert_eq!(rules_of(&f.done()), vec![Rule::WriteOrder]);
}

#[test]
fn the_checker_reports_a_state_that_is_not_a_prefix_of_the_writes() {
    // A row missing in the middle.
    let mut f = consistent();
    if let Ok(Answer {
        seen: Seen::State(st),
        ..
    }) = &mut f.read(1, 3, 3).answer
    {
        st.count = 2;
    }
    assert_eq!(rules_of(&f.done()), vec![Rule::NotAPrefix]);
    // The right count, the wrong rows.
    let mut f = consistent();
    if let Ok(Answer {
        seen: Seen::State(st),
        ..
    }) = &mut f.read(1, 3, 3).answer
    {
        st.digest = 12_345;
    }
    assert_eq!(rules_of(&f.done()), vec![Rule::NotAPrefix]);
}

#[test]
fn the_checker_reports_a_read_reporting_a_bookmark_older_than_what_it_saw() {
    let mut f = consistent();
    f.read(1, 3, 2);
    assert_eq!(
        rules_of(&f.done()),
        vec![Rule::BookmarkRegressed, Rule::BookmarkUnderstated]
    );
}

#[test]
fn the_checker_reports_a_read_missing_a_write_a_handed_over_bookmark_covers() {
    let mut f = consistent();
    // Session 2 starts from session 1's bookmark (3) yet sees only id 1.
    f.headers.insert(2, bm(3));
    f.read(2, 1, 3);
    assert_eq!(rules_of(&f.done()), vec![Rule::BookmarkCoverage]);
}

#[test]
fn the_checker_reports_a_first_primary_query_a_replica_served() {
    let mut f = Fab::default();
    f.headers.insert(0, "first-primary".into());
    f.read(0, 0, 0);
    assert_eq!(rules_of(&f.done()), vec![Rule::Routing]);
}
