//! The `walrelay` processes: follower and primary, and what every process
//! shares (the replica is in `replica_cmd`; `up`, which runs a local
//! cluster of them, in `up_cmd`).
//!
//! Each long-running process stops on SIGINT or SIGTERM: a follower and a
//! replica simply exit (their state is crash-safe); a primary stops its
//! workload, waits for every commit to be confirmed and writes its stop
//! marker so the next start continues the log.
//!
//! Replication is authenticated: follower, primary and replica each need
//! `--cluster-key FILE` (the same key on every process of a cluster), or
//! `--insecure-replication` to run the replication ports open, which is
//! said on stderr at every start. `up` creates `<dir>/cluster.key` if it is
//! missing and hands it to every process.

use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use walrelay_engine::host_archiving::{HostArchiver, HostArchiverConfig};
use walrelay_engine::http::auth::Auth;
use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
use walrelay_engine::http::time_travel::TimeTravelConfig;
use walrelay_engine::http::token_store::TokenStore;
use walrelay_engine::replication::{PrimaryConfig, ReplicatedPrimary, database_path};
use walrelay_engine::{Constraint, Value};
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower_host::{FollowerHost, FollowerHostConfig};
use walrelay_replicator::{Bookmark, ClusterKey, DatabaseId};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to the stop flag.
pub fn install_stop_handler() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_signal` only stores to an atomic, which is
        // async-signal-safe; the handler has the C ABI signal() expects.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

pub fn stopping() -> bool {
    STOP.load(Ordering::SeqCst)
}

/// Parses `--net` (a clap value parser).
pub fn backend(name: &str) -> Result<Backend, String> {
    Ok(match name {
        "auto" => Backend::Auto,
        "std" => Backend::Std,
        "io_uring" => Backend::IoUring,
        other => return Err(format!("unknown transport {other:?} (auto, std, io_uring)")),
    })
}

pub(crate) fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Auto => "auto",
        Backend::Std => "std",
        Backend::IoUring => "io_uring",
    }
}

/// How a process authenticates its replication connections.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplicationAuthArgs {
    /// The cluster key file (64 hex digits, mode 0600) every replication
    /// connection is authenticated with; every process of a cluster needs
    /// the same one.
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "insecure_replication",
        conflicts_with = "insecure_replication"
    )]
    pub cluster_key: Option<PathBuf>,
    /// Run the replication ports unauthenticated: anyone who can reach them
    /// can read the whole log, fence the primary and forge records.
    #[arg(long)]
    pub insecure_replication: bool,
}

impl ReplicationAuthArgs {
    /// The key to run with (None only under `--insecure-replication`, which
    /// is warned about on stderr).
    pub fn key(&self, process: &str) -> Result<Option<ClusterKey>> {
        match &self.cluster_key {
            Some(path) => Ok(Some(ClusterKey::load(path)?)),
            None if self.insecure_replication => {
                eprintln!(
                    "walrelay {process}: WARNING: --insecure-replication: replication connections are not authenticated; anyone who can reach this process's replication ports can read the whole log, fence the primary and forge records"
                );
                Ok(None)
            }
            None => bail!("--cluster-key FILE is required (or --insecure-replication)"),
        }
    }
}

/// Most demo writers a command runs (`primary --demo-writers`, `up
/// --writers`): each is a thread.
pub const MAX_DEMO_WRITERS: u64 = 64;

/// The name of the key file `up` keeps in its data directory.
pub const CLUSTER_KEY_FILE: &str = "cluster.key";

/// A parsed address list (an alias, so clap does not treat `Vec` as
/// "repeat the flag" and takes the whole comma-separated list at once).
pub type Addrs = Vec<SocketAddr>;

/// Options of `walrelay follower`.
#[derive(clap::Args)]
pub struct FollowerArgs {
    #[arg(long)]
    pub listen: SocketAddr,
    #[arg(long)]
    pub dir: PathBuf,
    /// The other followers (catch-up sources), comma-separated.
    #[arg(long, default_value = "", value_parser = parse_addrs)]
    pub peers: Addrs,
    /// The follower serves every database a leader introduces (each in
    /// DIR/db/<id>/); this one keeps the single-database layout in DIR
    /// itself and serves connections that do not name a database (older
    /// peers). With `--store` it has an uploader of its own all the time;
    /// every other database gets one while it has records to archive (at
    /// most `--max-uploaders` at once).
    #[arg(long, default_value_t = 1)]
    pub database: u64,
    /// Stop after this many seconds (0: run until a signal).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    #[command(flatten)]
    pub auth: ReplicationAuthArgs,
    #[command(flatten)]
    pub archive: crate::archive_args::ArchiveArgs,
}

pub fn follower(a: FollowerArgs) -> Result<()> {
    let FollowerArgs {
        listen,
        dir,
        peers,
        database,
        net,
        auth,
        archive,
        seconds,
    } = a;
    let max_uploaders = archive.max_uploaders;
    let archive = archive
        .config(DatabaseId(database), &dir.join("archive"))
        .context("opening the cold store")?;
    install_stop_handler();
    let auth = auth.key("follower")?;
    let legacy = DatabaseId(database);
    let mut config = FollowerHostConfig::new(listen, dir.clone());
    config.peers = peers;
    config.segment_bytes = 64 << 20;
    config.backend = net;
    config.auth = auth;
    config.legacy = Some(legacy);
    let host = Arc::new(
        FollowerHost::start(config)
            .with_context(|| format!("starting follower in {}", dir.display()))?,
    );
    let node = host
        .database(legacy)
        .context("the follower's own database is not held")?;
    let durable = || {
        node.durable()
            .map(|b| b.to_string())
            .unwrap_or_else(|e| e.to_string())
    };
    let r = host.recovery(legacy).unwrap_or_default();
    if let Some(good) = r.mid_log_corruption {
        eprintln!(
            "follower {}: a damaged record after {good} in the middle of the log ({} records after it quarantined in {}/log/quarantine); they are fetched again from the leader and peers",
            host.addr(),
            r.records_after_corruption,
            dir.display()
        );
    }
    println!(
        "follower {} listening, log at {} ({} records, {} torn bytes cut, transport {}, storage {}); other databases a leader introduces are kept in {}/db (promises) and {}/shared (records of {} databases; {} bytes of a torn shared tail cut)",
        host.addr(),
        durable(),
        r.records,
        r.cut_bytes,
        host.backend(),
        host.storage_backend(),
        dir.display(),
        dir.display(),
        host.shared_log_recovery().databases,
        host.shared_log_recovery().cut_bytes,
    );
    let (uploader, others) = match archive {
        Some((store, config)) => {
            println!(
                "follower {} archiving database {legacy} to {} (rank {}, log starts at {}), and every other database it holds (up to {max_uploaders} uploaders at once)",
                host.addr(),
                store.url(),
                config.rank,
                node.log_start().unwrap_or_default()
            );
            let others = HostArchiver::start(
                Arc::clone(&host),
                store.clone(),
                HostArchiverConfig {
                    archiver: config.clone(),
                    work_dir: dir.join("archive").join("db"),
                    max_running: max_uploaders,
                    skip: Some(legacy),
                },
            )
            .context("starting the archivers of the other databases")?;
            let own = walrelay_engine::archiving::Uploader::start_db(node.clone(), store, config)
                .context("starting the archiver")?;
            (Some(own), Some(others))
        }
        None => (None, None),
    };
    let started = Instant::now();
    let mut last_report = Instant::now();
    while !stopping() && (seconds == 0 || started.elapsed() < Duration::from_secs(seconds)) {
        std::thread::sleep(Duration::from_millis(50));
        if let Some((id, why)) = host.broken().into_iter().next() {
            // Exit loudly: a supervisor restarts it, and the restart cuts
            // every log back to what was durable before the failure.
            bail!(
                "follower {} stopped taking records for database {id}: {why}",
                host.addr()
            );
        }
        if let Some(u) = &uploader
            && last_report.elapsed() >= Duration::from_secs(10)
        {
            last_report = Instant::now();
            let m = host.mux();
            println!(
                "follower {} log_bytes={} log_start={} databases={} open={} connections={} channels={} {}",
                host.addr(),
                node.disk_bytes().unwrap_or(0),
                node.log_start().unwrap_or_default(),
                host.databases().len(),
                host.open_databases().len(),
                m.connections,
                m.channels,
                u.summary()
            );
            if let Some(o) = &others {
                println!("follower {} {}", host.addr(), o.summary());
            }
            if let Some(log) = host.shared_log() {
                let s = log.stats();
                println!(
                    "follower {} shared_log segments={} disk_bytes={} live_bytes={} created={} reused={} from_spares={} compactions={} deleted={}",
                    host.addr(),
                    log.segments(),
                    log.disk_bytes(),
                    log.live_bytes(),
                    s.segments_created,
                    s.segments_reused,
                    s.spares_used,
                    s.compactions,
                    s.segments_deleted,
                );
            }
        }
    }
    // Both uploaders wind down at once: each uploads the confirmed log
    // and abandons any snapshot it was building.
    if let Some(u) = &uploader {
        u.request_shutdown();
    }
    if let Some(o) = others {
        o.stop();
    }
    if let Some(u) = uploader {
        u.stop();
    }
    let m = host.mux();
    println!(
        "follower {} replication: {} connections, {} channels, {} channels opened, {} refused frames or channels",
        host.addr(),
        m.connections,
        m.channels,
        m.channels_opened,
        m.refusals
    );
    println!("follower {} stopping at {}", host.addr(), durable());
    Ok(())
}

/// Options of `walrelay primary`.
#[derive(clap::Args)]
pub struct PrimaryArgs {
    #[arg(long)]
    pub dir: PathBuf,
    /// The N followers, comma-separated, in a fixed order.
    #[arg(long, value_parser = parse_addrs)]
    pub followers: Addrs,
    /// W (default: a majority of N).
    #[arg(long)]
    pub write_quorum: Option<usize>,
    /// Where replicas connect.
    #[arg(long, default_value = "127.0.0.1:7100")]
    pub listen: SocketAddr,
    /// How long a write waits with no confirmation at all before failing.
    #[arg(
        long,
        default_value_t = walrelay_engine::replication::PrimaryConfig::DEFAULT_CONFIRM_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub confirm_timeout_ms: u64,
    /// Followers sent every record as it commits (default: W, the thrifty
    /// fan-out: the others get records in batches every 10 ms). N sends
    /// every record to every follower: the better choice when the
    /// followers run on hosts of their own.
    #[arg(long)]
    pub eager_followers: Option<usize>,
    #[arg(long, default_value_t = 1)]
    pub database: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    /// Concurrent demo writers (0: none; each a thread).
    #[arg(long, default_value_t = 0, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_DEMO_WRITERS))]
    pub demo_writers: usize,
    /// Stop after this many seconds (0: run until a signal).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Serve the HTTP API on this address.
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// This node's region label (meta.served_by_region).
    #[arg(long, default_value = "primary-region")]
    pub region: String,
    /// The database's name in the HTTP API's paths.
    #[arg(long, default_value = "main")]
    pub database_name: String,
    /// The largest write transaction (bytes of pages it changes); a larger
    /// one is refused before it commits.
    #[arg(
        long,
        default_value_t = walrelay_engine::Limits::default().max_transaction_bytes,
        value_parser = clap::value_parser!(u64).range(walrelay_engine::MIN_TRANSACTION_BYTES..)
    )]
    pub max_transaction_bytes: u64,
    /// Every write its own transaction: no group commit (writes that queue
    /// behind the writer otherwise commit together and share a bookmark).
    #[arg(long)]
    pub no_group_commit: bool,
    /// Under load, how long a write group's leader waits at most for more
    /// writes before committing (PostgreSQL's commit_delay; only while at
    /// least 4 writes wait for confirmation, and only until that many
    /// have queued). 0: never.
    #[arg(
        long,
        default_value_t = walrelay_engine::Options::default().group_commit_delay_us,
        value_parser = clap::value_parser!(u64).range(0..=walrelay_engine::MAX_GROUP_COMMIT_DELAY_US)
    )]
    pub group_commit_delay_us: u64,
    /// Cold storage (as the followers' `--store`): where a rebuild starts,
    /// and what time travel reads.
    #[arg(long)]
    pub store: Option<String>,

    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub replication_auth: ReplicationAuthArgs,
    #[command(flatten)]
    pub fleet: crate::fleet_cmd::FleetLinkArgs,
}

/// How a node's HTTP API authenticates: one of the two is required with
/// `--http`.
#[derive(clap::Args)]
pub struct AuthArgs {
    /// API token store (see `walrelay token create`): requests need
    /// `Authorization: Bearer <token>`.
    #[arg(long, conflicts_with = "insecure")]
    pub tokens: Option<PathBuf>,
    /// Serve the HTTP API without authentication: anyone who can reach
    /// the port reads and writes every database.
    #[arg(long)]
    pub insecure: bool,
}

/// Prints a line to stderr in one write, so that lines of processes
/// sharing the stream (under `up`) do not interleave.
pub(crate) fn warn(line: &str) {
    use std::io::Write;
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// The node's [`Auth`] for an HTTP server on `addr`: the store is loaded
/// now (a bad one stops the start), and `--insecure` is said out loud.
pub(crate) fn http_auth(a: &AuthArgs, who: &str, addr: SocketAddr) -> Result<Auth> {
    match (&a.tokens, a.insecure) {
        (Some(path), _) => {
            let store = TokenStore::open(path)
                .with_context(|| format!("loading the API token store {}", path.display()))?;
            println!(
                "{who} HTTP API authentication: {} tokens from {}",
                store.len(),
                path.display()
            );
            Ok(Auth::Tokens(Arc::new(store)))
        }
        (None, true) => {
            warn(&format!(
                "WARNING: {who} HTTP API on {addr} runs --insecure, without authentication: anyone who can reach it can read and write every database"
            ));
            Ok(Auth::Insecure)
        }
        (None, false) => bail!(
            "--http needs --tokens FILE (API tokens; `walrelay token create` makes one) or --insecure (no authentication)"
        ),
    }
}

/// The exit status of a primary that another node's newer epoch fenced.
pub const FENCED_EXIT_CODE: i32 = 3;

/// Options of `walrelay promote`.
#[derive(clap::Args)]
pub struct PromoteArgs {
    /// A stopped replica's data directory.
    #[arg(long)]
    pub dir: PathBuf,
}

/// Prepares a stopped replica's directory to start as the primary
/// (`walrelay primary --dir` on it next): see
/// [`walrelay_engine::recovery::promote_replica`].
pub fn promote(a: PromoteArgs) -> Result<()> {
    let at = walrelay_engine::recovery::promote_replica(&database_path(&a.dir))
        .context("promoting the replica")?;
    println!(
        "{} is ready to start as the primary from {at}",
        a.dir.display()
    );
    Ok(())
}

pub fn primary(a: PrimaryArgs) -> Result<()> {
    install_stop_handler();
    // Checked before anything starts: a bad store stops the start.
    let auth = a
        .http
        .map(|addr| http_auth(&a.auth, "primary", addr))
        .transpose()?;
    let cluster_key = a.replication_auth.key("primary")?;
    let fleet_key = cluster_key.clone();
    std::fs::create_dir_all(&a.dir)?;
    let mut config = PrimaryConfig::new(database_path(&a.dir), a.followers.clone(), cluster_key);
    config.database = DatabaseId(a.database);
    if let Some(w) = a.write_quorum {
        config.write_quorum = w;
    }
    config.listen = Some(a.listen);
    config.confirm_timeout_ms = a.confirm_timeout_ms;
    config.eager_followers = a.eager_followers;
    config.backend = a.net;
    config.options.region = a.region.clone();
    config.options.limits.max_transaction_bytes = a.max_transaction_bytes;
    config.options.group_commit = !a.no_group_commit;
    config.options.group_commit_delay_us = a.group_commit_delay_us;
    config.store = open_store(a.store.as_deref())?;
    let time_travel = config.store.clone().map(|store| TimeTravelConfig {
        store,
        database: DatabaseId(a.database),
        work_dir: a.dir.join("time-travel"),
        archive_wait_ms: 30_000,
    });
    let write_quorum = config.write_quorum;
    let primary = Arc::new(ReplicatedPrimary::start(config).context("starting the primary")?);
    let http = match (a.http, auth) {
        (Some(addr), Some(auth)) => {
            let mut node = Node::new(
                Role::Primary(primary.database().clone()),
                HttpConfig {
                    database: a.database_name.clone(),
                    region: a.region.clone(),
                    time_travel,
                    ..HttpConfig::default()
                },
                auth,
            );
            if let Some(fleet) = a.fleet.fleet(&a.dir, addr, fleet_key.as_ref(), None)? {
                node = node.with_fleet(fleet);
            }
            let server =
                serve(Arc::new(node), addr).with_context(|| format!("serving HTTP on {addr}"))?;
            println!(
                "primary HTTP at {}/v1/databases/{}/query (region {})",
                server.url(),
                a.database_name,
                a.region
            );
            Some(server)
        }
        _ => None,
    };
    println!(
        "primary epoch {} replicas at {} followers {:?} W={} transport {}",
        primary.database().epoch().0,
        primary.replica_addr().map_or("-".into(), |a| a.to_string()),
        a.followers,
        write_quorum,
        primary.leader().backend()
    );
    let deadline = (a.seconds > 0).then(|| Instant::now() + Duration::from_secs(a.seconds));
    let done = Arc::new(AtomicBool::new(false));
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::<u64>::new()));
    let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut writers = Vec::new();
    if a.demo_writers > 0 {
        let s = primary.database().session(Constraint::FirstPrimary)?;
        s.prepare(
            "CREATE TABLE IF NOT EXISTS events(id INTEGER PRIMARY KEY, writer INTEGER, body TEXT)",
        )
        .run()
        .context("creating the demo table")?;
        for w in 0..a.demo_writers {
            let (p, done, lat, failures) = (
                Arc::clone(&primary),
                Arc::clone(&done),
                Arc::clone(&latencies),
                Arc::clone(&failures),
            );
            writers.push(std::thread::spawn(move || {
                let Ok(s) = p.database().session(Constraint::FirstPrimary) else {
                    return;
                };
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    n += 1;
                    let started = Instant::now();
                    let r = s
                        .prepare("INSERT INTO events(writer, body) VALUES (?1, ?2)")
                        .bind([Value::Integer(w as i64), Value::Text(format!("event {n}"))])
                        .run();
                    match r {
                        Ok(_) => lat.lock().push(started.elapsed().as_micros() as u64),
                        // Stopping: the write was rolled back, not failed.
                        Err(walrelay_engine::QueryError::Stopping) => break,
                        Err(e) => {
                            if failures.fetch_add(1, Ordering::Relaxed) % 100 == 0 {
                                eprintln!("primary: write failed: {e}");
                            }
                        }
                    }
                }
            }));
        }
    }
    let mut last_report = Instant::now();
    let mut last_confirmed = primary.status().confirmed;
    while !stopping() && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(epoch) = primary.leader().fenced() {
            // Another node won a newer epoch: this one must not serve a
            // write again. Exit without a clean-stop marker; a restart
            // rejoins the log (or `up` rebuilds this node as a replica).
            tracing::error!(by = epoch.0, "primary fenced by a newer epoch: exiting");
            eprintln!("primary: fenced by epoch {}; exiting", epoch.0);
            primary.database().stop_queries();
            std::process::exit(FENCED_EXIT_CODE);
        }
        let since_report = last_report.elapsed();
        if since_report >= Duration::from_secs(1) {
            last_report = Instant::now();
            let st = primary.status();
            let confirmed = confirmed_between(last_confirmed, st.confirmed);
            last_confirmed = st.confirmed;
            // commits/s counts every confirmed transaction, whoever wrote
            // it; the latencies are the demo writers' own.
            let mut line = format!(
                "primary confirmed={} followers_streaming={} eager_swaps={} commits/s={} failed={} auth_refused={}",
                st.confirmed,
                st.streaming_followers,
                st.eager_swaps,
                per_second(confirmed, since_report),
                failures.load(Ordering::Relaxed),
                primary.leader().auth_refusals()
            );
            let mut l = std::mem::take(&mut *latencies.lock());
            if !l.is_empty() {
                l.sort_unstable();
                line.push_str(&format!(
                    " demo_commits={} commit_p50_us={} commit_p99_us={}",
                    l.len(),
                    l[l.len() / 2],
                    l[(l.len() * 99 / 100).min(l.len() - 1)],
                ));
            }
            println!("{line}");
        }
    }
    let stop_started = Instant::now();
    done.store(true, Ordering::Relaxed);
    // Every running query stops now (a runaway read or write included;
    // a stopped write rolls back) and no new one starts.
    primary.database().stop_queries();
    for w in writers {
        let _ = w.join();
    }
    // No new requests from here; the in-flight ones end within the
    // server's grace period.
    drop(http);
    println!(
        "primary stopped its queries and HTTP in {} ms",
        stop_started.elapsed().as_millis()
    );
    let primary =
        Arc::try_unwrap(primary).map_err(|_| anyhow::anyhow!("the primary is still in use"))?;
    match primary.stop(Duration::from_secs(10)) {
        Ok(b) => println!("primary stopped cleanly at {b}"),
        Err(e) => bail!("primary could not stop cleanly: {e}"),
    }
    Ok(())
}

/// How many transactions were confirmed from `before` to `now`, whoever
/// wrote them (the demo writers, HTTP clients, forwarded writes). A new
/// epoch numbers its transactions from one again, so all of its count.
fn confirmed_between(before: Bookmark, now: Bookmark) -> u64 {
    assert!(
        now >= before,
        "the confirmed bookmark went back: {before} -> {now}"
    );
    if now.epoch == before.epoch {
        now.sequence.0 - before.sequence.0
    } else {
        now.sequence.0
    }
}

/// `count` over `elapsed`, rounded to the nearest whole number.
fn per_second(count: u64, elapsed: Duration) -> u64 {
    let s = elapsed.as_secs_f64();
    if s <= 0.0 {
        return 0;
    }
    (count as f64 / s).round() as u64
}

/// Opens the cold store named by a `--store` option, if one was given.
pub fn open_store(spec: Option<&str>) -> Result<Option<walrelay_archive::Store>> {
    spec.map(walrelay_archive::Store::open)
        .transpose()
        .context("opening the cold store")
}

/// Parses "a:1,b:2".
pub fn parse_addrs(s: &str) -> Result<Vec<SocketAddr>, String> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|a| a.trim().parse().map_err(|e| format!("{a:?}: {e}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use walrelay_replicator::{Epoch, Sequence};

    fn at(epoch: u32, sequence: u64) -> Bookmark {
        Bookmark::new(Epoch(epoch), Sequence(sequence))
    }

    #[test]
    fn the_status_line_counts_every_confirmed_transaction_within_an_epoch() {
        assert_eq!(confirmed_between(at(3, 10), at(3, 10)), 0);
        assert_eq!(confirmed_between(at(3, 10), at(3, 250)), 240);
    }

    #[test]
    fn the_status_line_counts_a_new_epochs_transactions_from_its_start() {
        assert_eq!(confirmed_between(at(3, 900), at(4, 7)), 7);
    }

    #[test]
    #[should_panic(expected = "went back")]
    fn a_confirmed_bookmark_that_goes_back_is_a_bug_not_a_negative_rate() {
        confirmed_between(at(3, 10), at(3, 9));
    }

    #[test]
    fn the_rate_is_per_second_of_the_report_window() {
        assert_eq!(per_second(1_500, Duration::from_millis(1_500)), 1_000);
        assert_eq!(per_second(7, Duration::ZERO), 0);
    }
}
