//! The `walrelay` processes: follower, primary, replica, and `up`, which
//! runs a local cluster of them.
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
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use walrelay_engine::http::auth::Auth;
use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
use walrelay_engine::http::token_store::TokenStore;
use walrelay_engine::replication::{
    PrimaryConfig, ReplicaConfig, ReplicatedPrimary, ReplicatedReplica, database_path,
};
use walrelay_engine::{Constraint, ReplicaOptions, Value};
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower::{FollowerNode, FollowerNodeConfig};
use walrelay_replicator::{ClusterKey, DatabaseId};

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

fn backend_name(b: Backend) -> &'static str {
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
    #[arg(long, default_value_t = 1)]
    pub database: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    #[command(flatten)]
    pub auth: ReplicationAuthArgs,
}

pub fn follower(a: FollowerArgs) -> Result<()> {
    let FollowerArgs {
        listen,
        dir,
        peers,
        database,
        net,
        auth,
    } = a;
    install_stop_handler();
    let auth = auth.key("follower")?;
    let node = FollowerNode::start(FollowerNodeConfig {
        database: DatabaseId(database),
        listen,
        dir: dir.clone(),
        peers,
        segment_bytes: 64 << 20,
        backend: net,
        auth,
        catch_up_batch_bytes: walrelay_replicator::node::follower::CATCH_UP_BATCH_BYTES,
    })
    .with_context(|| format!("starting follower in {}", dir.display()))?;
    let r = node.recovery();
    println!(
        "follower {} listening, log at {} ({} records, {} torn bytes cut, transport {}, storage {})",
        node.addr(),
        node.durable(),
        r.records,
        r.cut_bytes,
        node.backend(),
        node.storage_backend()
    );
    while !stopping() {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(why) = node.broken() {
            // Exit loudly: a supervisor restarts it, and the restart cuts
            // the log back to what was durable before the failure.
            bail!("follower {} stopped taking records: {why}", node.addr());
        }
    }
    println!("follower {} stopping at {}", node.addr(), node.durable());
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
    #[arg(long, default_value_t = 5_000)]
    pub confirm_timeout_ms: u64,
    #[arg(long, default_value_t = 1)]
    pub database: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    /// Concurrent demo writers (0: none).
    #[arg(long, default_value_t = 0)]
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
    #[arg(long, default_value_t = walrelay_engine::Limits::default().max_transaction_bytes)]
    pub max_transaction_bytes: u64,

    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub replication_auth: ReplicationAuthArgs,
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
fn http_auth(a: &AuthArgs, who: &str, addr: SocketAddr) -> Result<Auth> {
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

pub fn primary(a: PrimaryArgs) -> Result<()> {
    install_stop_handler();
    // Checked before anything starts: a bad store stops the start.
    let auth = a
        .http
        .map(|addr| http_auth(&a.auth, "primary", addr))
        .transpose()?;
    let cluster_key = a.replication_auth.key("primary")?;
    std::fs::create_dir_all(&a.dir)?;
    let mut config = PrimaryConfig::new(database_path(&a.dir), a.followers.clone(), cluster_key);
    config.database = DatabaseId(a.database);
    if let Some(w) = a.write_quorum {
        config.write_quorum = w;
    }
    config.listen = Some(a.listen);
    config.confirm_timeout_ms = a.confirm_timeout_ms;
    config.backend = a.net;
    config.options.region = a.region.clone();
    config.options.limits.max_transaction_bytes = a.max_transaction_bytes;
    let write_quorum = config.write_quorum;
    let primary = Arc::new(ReplicatedPrimary::start(config).context("starting the primary")?);
    let http = match (a.http, auth) {
        (Some(addr), Some(auth)) => {
            let node = Node::new(
                Role::Primary(primary.database().clone()),
                HttpConfig {
                    database: a.database_name.clone(),
                    region: a.region.clone(),
                    ..HttpConfig::default()
                },
                auth,
            );
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
    while !stopping() && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(50));
        if last_report.elapsed() >= Duration::from_secs(1) {
            last_report = Instant::now();
            let mut l = std::mem::take(&mut *latencies.lock());
            let st = primary.status();
            if l.is_empty() {
                println!(
                    "primary confirmed={} followers_streaming={} commits/s=0 failed={} auth_refused={}",
                    st.confirmed,
                    st.streaming_followers,
                    failures.load(Ordering::Relaxed),
                    primary.leader().auth_refusals()
                );
            } else {
                l.sort_unstable();
                println!(
                    "primary confirmed={} followers_streaming={} commits/s={} commit_p50_us={} commit_p99_us={} failed={} auth_refused={}",
                    st.confirmed,
                    st.streaming_followers,
                    l.len(),
                    l[l.len() / 2],
                    l[(l.len() * 99 / 100).min(l.len() - 1)],
                    failures.load(Ordering::Relaxed),
                    primary.leader().auth_refusals()
                );
            }
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

/// Options of `walrelay replica`.
#[derive(clap::Args)]
pub struct ReplicaArgs {
    #[arg(long)]
    pub dir: PathBuf,
    /// The primary's replica address.
    #[arg(long)]
    pub leader: SocketAddr,
    /// Followers to catch up from, comma-separated.
    #[arg(long, default_value = "", value_parser = parse_addrs)]
    pub followers: Addrs,
    #[arg(long, default_value_t = 1)]
    pub database: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    /// Serve the HTTP API on this address (needs --primary-http).
    #[arg(long)]
    pub http: Option<SocketAddr>,
    /// This node's region label.
    #[arg(long, default_value = "replica-region")]
    pub region: String,
    /// The primary's HTTP base URL, where writes are forwarded.
    #[arg(long)]
    pub primary_http: Option<String>,
    #[arg(long, default_value = "main")]
    pub database_name: String,
    /// How long a read waits for the session's bookmark before the
    /// primary serves it.
    #[arg(long, default_value_t = 1_000)]
    pub max_wait_ms: u64,
    /// Injected replication delay (testing).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub replication_auth: ReplicationAuthArgs,
}

pub fn replica(a: ReplicaArgs) -> Result<()> {
    install_stop_handler();
    let cluster_key = a.replication_auth.key("replica")?;
    let (dir, leader) = (a.dir.clone(), a.leader);
    // Checked before anything starts: a bad store stops the start.
    let auth = match (a.http, &a.primary_http) {
        (Some(addr), Some(_)) => Some(http_auth(&a.auth, "replica", addr)?),
        (Some(_), None) => bail!("--http needs --primary-http (where writes are forwarded)"),
        _ => None,
    };
    std::fs::create_dir_all(&dir)?;
    let r = Arc::new(
        ReplicatedReplica::start(ReplicaConfig {
            database: DatabaseId(a.database),
            path: database_path(&dir),
            leader,
            followers: a.followers.clone(),
            backend: a.net,
            auth: cluster_key,
            options: ReplicaOptions {
                region: a.region.clone(),
                max_wait_ms: a.max_wait_ms,
                // The log is durable on the followers; a replica that loses
                // recent confirms to a power cut refetches them.
                durable: false,
                ..ReplicaOptions::default()
            },
            delay_ms: a.delay_ms,
        })
        .context("starting the replica")?,
    );
    let http = match (a.http, a.primary_http.clone(), auth) {
        (Some(addr), Some(primary_url), Some(auth)) => {
            let node = Arc::new(Node::new(
                Role::Replica {
                    replica: Arc::clone(&r),
                    primary_url,
                },
                HttpConfig {
                    database: a.database_name.clone(),
                    region: a.region.clone(),
                    ..HttpConfig::default()
                },
                auth,
            ));
            let server = serve(Arc::clone(&node), addr)
                .with_context(|| format!("serving HTTP on {addr}"))?;
            println!(
                "replica HTTP at {}/v1/databases/{}/query (region {})",
                server.url(),
                a.database_name,
                a.region
            );
            Some((server, node))
        }
        _ => None,
    };
    println!(
        "replica {} following {leader} from {}",
        dir.display(),
        r.replica().confirmed()
    );
    let mut last_report = Instant::now();
    while !stopping() {
        std::thread::sleep(Duration::from_millis(50));
        if last_report.elapsed() >= Duration::from_secs(1) {
            last_report = Instant::now();
            let mut lags = r.node().take_confirm_lags_us();
            if let Some((_, node)) = &http {
                node.observe_confirm_lags(&lags);
            }
            let confirmed = r.replica().confirmed();
            if lags.is_empty() {
                println!("replica {} confirmed={confirmed}", dir.display());
            } else {
                lags.sort_unstable();
                println!(
                    "replica {} confirmed={confirmed} confirms={} confirm_lag_p50_us={} confirm_lag_p99_us={}",
                    dir.display(),
                    lags.len(),
                    lags[lags.len() / 2],
                    lags[(lags.len() * 99 / 100).min(lags.len() - 1)]
                );
            }
        }
    }
    r.replica().database().stop_queries();
    drop(http);
    let _ = r.replica().persist();
    println!(
        "replica {} stopping at {}",
        dir.display(),
        r.replica().confirmed()
    );
    Ok(())
}

/// Options of `walrelay up`.
#[derive(clap::Args)]
pub struct UpArgs {
    /// Data directory (a fresh temporary one if omitted).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The primary listens here; followers on the next ports.
    #[arg(long, default_value_t = 7100)]
    pub base_port: u16,
    #[arg(long, default_value_t = 5)]
    pub followers: usize,
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    /// Concurrent demo writers on the primary.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    /// The largest write transaction, in bytes of pages (the primary's
    /// `--max-transaction-bytes`).
    #[arg(long, default_value_t = walrelay_engine::Limits::default().max_transaction_bytes)]
    pub max_transaction_bytes: u64,

    /// Serve the HTTP API without authentication (by default `up` keeps a
    /// token store in DIR/tokens and an admin token in DIR/token).
    #[arg(long)]
    pub insecure: bool,
}

fn addrs(base: u16, n: usize) -> Vec<SocketAddr> {
    (0..n)
        .map(|i| SocketAddr::from(([127, 0, 0, 1], base + i as u16)))
        .collect()
}

fn join(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn signal(child: &Child, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on a child we spawned and have not reaped; the
        // worst case is a signal to an already exited child, which fails.
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

pub fn up(a: UpArgs) -> Result<()> {
    install_stop_handler();
    if a.replicas > 26 {
        bail!("at most 26 replicas (regions region-a to region-z)");
    }
    // Followers take base+1..=base+N; HTTP takes base+10..=base+10+replicas.
    let highest = u32::from(a.base_port) + (a.followers as u32).max(10 + a.replicas as u32);
    if a.followers > 9 || highest > u32::from(u16::MAX) {
        bail!(
            "ports {}..={highest} do not fit (at most 9 followers, and a lower --base-port)",
            a.base_port
        );
    }
    let dir = match a.dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("walrelay-up-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    let key_file = dir.join(CLUSTER_KEY_FILE);
    ClusterKey::load_or_create(&key_file)?;
    let key_arg = |args: &mut Vec<String>| {
        args.extend(["--cluster-key".into(), key_file.display().to_string()]);
    };
    let exe = std::env::current_exe()?;
    let follower_addrs = addrs(a.base_port + 1, a.followers);
    let primary_addr = SocketAddr::from(([127, 0, 0, 1], a.base_port));
    println!(
        "walrelay up: 1 primary, {} followers, {} replicas in {} (Ctrl-C stops); replication authenticated with {}",
        a.followers,
        a.replicas,
        dir.display(),
        key_file.display()
    );
    let auth_flags = crate::token_cmd::up_auth(&dir, a.insecure)?;
    let auth_header = if a.insecure {
        String::new()
    } else {
        format!(
            " -H \"Authorization: Bearer $(cat {})\"",
            dir.join("token").display()
        )
    };
    println!(
        "  try: curl -s -X POST http://127.0.0.1:{}/v1/databases/main/query{auth_header} -H 'x-d1-bookmark: first-unconstrained' -d '{{\"sql\":\"SELECT count(*) FROM events\"}}'",
        a.base_port + 11
    );
    let spawn = |args: Vec<String>| -> Result<Child> {
        let mut command = Command::new(&exe);
        command.args(&args);
        // Own process group: a terminal's Ctrl-C reaches only `up`, which
        // then stops the primary first (it waits for its last commits to be
        // confirmed, which needs the followers still up) and the rest after.
        command.process_group(0);
        // SAFETY: the closure runs in the child between fork and exec and
        // calls only prctl(2), which is async-signal-safe; it asks the
        // kernel to SIGTERM the child if `up` dies without stopping it.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        command
            .spawn()
            .with_context(|| format!("spawning {args:?}"))
    };
    let mut others = Vec::new();
    for (i, addr) in follower_addrs.iter().enumerate() {
        let peers: Vec<SocketAddr> = follower_addrs
            .iter()
            .filter(|p| *p != addr)
            .copied()
            .collect();
        let mut args = vec![
            "follower".into(),
            "--listen".into(),
            addr.to_string(),
            "--dir".into(),
            dir.join(format!("follower-{i}")).display().to_string(),
            "--peers".into(),
            join(&peers),
            "--net".into(),
            backend_name(a.net).into(),
        ];
        key_arg(&mut args);
        others.push(spawn(args)?);
    }
    // HTTP: the primary on base+10, replicas on base+11...
    let http = |i: u16| SocketAddr::from(([127, 0, 0, 1], a.base_port + 10 + i));
    let primary_http = format!("http://{}", http(0));
    let mut primary_args = vec![
        "primary".into(),
        "--http".into(),
        http(0).to_string(),
        "--dir".into(),
        dir.join("primary").display().to_string(),
        "--followers".into(),
        join(&follower_addrs),
        "--listen".into(),
        primary_addr.to_string(),
        "--demo-writers".into(),
        a.writers.to_string(),
        "--max-transaction-bytes".into(),
        a.max_transaction_bytes.to_string(),
        "--net".into(),
        backend_name(a.net).into(),
    ];
    if a.seconds > 0 {
        primary_args.extend(["--seconds".into(), a.seconds.to_string()]);
    }
    key_arg(&mut primary_args);
    primary_args.extend(auth_flags.iter().cloned());
    let mut primary = spawn(primary_args)?;
    for i in 0..a.replicas {
        let mut args: Vec<String> = vec![
            "replica".into(),
            "--http".into(),
            http(1 + i as u16).to_string(),
            "--primary-http".into(),
            primary_http.clone(),
            "--region".into(),
            format!("region-{}", (b'a' + i as u8) as char),
            "--dir".into(),
            dir.join(format!("replica-{i}")).display().to_string(),
            "--leader".into(),
            primary_addr.to_string(),
            "--followers".into(),
            join(&follower_addrs),
            "--net".into(),
            backend_name(a.net).into(),
        ];
        key_arg(&mut args);
        args.extend(auth_flags.iter().cloned());
        others.push(spawn(args)?);
    }
    // The primary ends the run (its --seconds, or a signal); the rest
    // follow it down.
    let status = loop {
        if stopping() {
            signal(&primary, libc::SIGINT);
            break wait_bounded(&mut primary, "the primary")?;
        }
        if let Some(s) = primary.try_wait()? {
            break s;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for c in &others {
        signal(c, libc::SIGINT);
    }
    for mut c in others {
        let _ = wait_bounded(&mut c, "a follower or replica");
    }
    println!("walrelay up: stopped (data in {})", dir.display());
    if !status.success() {
        bail!("the primary exited with {status}");
    }
    Ok(())
}

/// How long `up` waits for a process it asked to stop before killing it.
const STOP_WAIT: Duration = Duration::from_secs(15);

/// Waits for a child asked to stop; past [`STOP_WAIT`] it is killed (a
/// hung process must not hang `up`).
fn wait_bounded(child: &mut Child, what: &str) -> Result<std::process::ExitStatus> {
    let deadline = Instant::now() + STOP_WAIT;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s);
        }
        if Instant::now() >= deadline {
            eprintln!(
                "walrelay up: {what} did not stop within {} s; killing it",
                STOP_WAIT.as_secs()
            );
            signal(child, libc::SIGKILL);
            return Ok(child.wait()?);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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
