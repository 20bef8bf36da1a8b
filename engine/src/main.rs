//! The `walrelay` binary.

mod archive_args;
mod archive_cmd;
mod cmd;
mod cpu_scheduling;
mod fleet_cmd;
mod replica_cmd;
mod supervisor;
mod token_cmd;
mod up_cmd;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Instant;
use walrelay_engine::{
    CheckpointMode, Constraint, Meta, Options, ReplicaOptions, Synchronous, Value, pair,
};

/// Every process of a cluster is this binary. jemalloc serves its many
/// small, short-lived allocations (requests, records, answers) with less
/// CPU than glibc's malloc, whose arenas grow and trim under this load
/// (papers/performance.md, lever 51).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "walrelay",
    version,
    about = "Replicated SQLite storage with WAL capture"
)]
struct Cli {
    /// How this process's threads are scheduled: `batch` (SCHED_BATCH: a
    /// woken thread does not preempt the one that woke it; fewer context
    /// switches per write) or `normal` (SCHED_OTHER). `up` passes its
    /// choice to every process it starts.
    #[arg(long, global = true, value_enum, default_value_t = cpu_scheduling::CpuScheduling::Batch)]
    cpu_scheduling: cpu_scheduling::CpuScheduling,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Open a database through the capturing VFS with an in-process read
    /// replica, run a small workload through sessions, and print bookmarks
    /// and meta as it goes.
    Demo {
        /// Database file (a fresh temporary one if omitted).
        #[arg(long)]
        db: Option<PathBuf>,
        /// Orders to place in the write phase.
        #[arg(long, default_value_t = 200)]
        orders: u32,
    },
    /// Run a local cluster, each node its own process on 127.0.0.1: one
    /// primary running a demo workload, durability followers and read
    /// replicas. Prints commit latency and confirm lag as it runs; Ctrl-C
    /// stops it cleanly.
    Up(up_cmd::UpArgs),
    /// Run a durability follower.
    Follower(cmd::FollowerArgs),
    /// Run a primary replicating to W of N followers.
    Primary(cmd::PrimaryArgs),
    /// Run a read replica streaming from a primary.
    Replica(replica_cmd::ReplicaArgs),
    /// Run a fleet node: it hosts many databases (opened on first use,
    /// closed when idle) and, with --control-plane, the control plane.
    Node(fleet_cmd::NodeArgs),
    /// Prepare a stopped replica's directory to start as the primary.
    Promote(cmd::PromoteArgs),
    /// Write a database as it was at a bookmark or time, from cold
    /// storage, as a standalone SQLite file.
    Restore(archive_cmd::RestoreArgs),
    /// Create a new database from another's history at a bookmark or
    /// time, in cold storage.
    Fork(archive_cmd::ForkArgs),
    /// Manage the HTTP API's tokens.
    #[command(subcommand)]
    Token(token_cmd::TokenCommand),
}

fn show(what: &str, m: &Meta) {
    println!(
        "  {what:<34} bookmark={} primary={} region={} rows_read={} rows_written={} changes={} last_row_id={} {}us",
        m.bookmark,
        m.served_by_primary,
        m.served_by_region,
        m.rows_read,
        m.rows_written,
        m.changes,
        m.last_row_id,
        m.duration_us
    );
}

fn demo(db_path: Option<PathBuf>, orders: u32) -> Result<()> {
    let tmp;
    let path = match db_path {
        Some(p) => p,
        None => {
            tmp = tempfile_dir()?;
            tmp.join("demo.db")
        }
    };
    println!("walrelay demo: {}", path.display());
    let mut replica_path = path.clone().into_os_string();
    replica_path.push(".replica");
    let (db, replica) = pair(
        &path,
        &replica_path,
        Options {
            synchronous: Synchronous::Normal,
            region: "primary-region".into(),
            ..Options::default()
        },
        ReplicaOptions {
            region: "replica-region".into(),
            ..ReplicaOptions::default()
        },
    )
    .with_context(|| format!("opening {} with an in-process replica", path.display()))?;
    println!(
        "opened: epoch {} latest bookmark {}; replica at {} confirmed {}",
        db.epoch().0,
        db.latest_bookmark(),
        std::path::Path::new(&replica_path).display(),
        replica.confirmed()
    );

    let s = db.session(Constraint::FirstPrimary)?;
    println!("schema (one batch, one transaction):");
    let rs = s.batch([
        s.prepare("CREATE TABLE IF NOT EXISTS customers(id INTEGER PRIMARY KEY, name TEXT NOT NULL)"),
        s.prepare(
            "CREATE TABLE IF NOT EXISTS orders(id INTEGER PRIMARY KEY, customer INTEGER NOT NULL \
             REFERENCES customers(id), amount_cents INTEGER NOT NULL, placed_at TEXT NOT NULL)",
        ),
        s.prepare("INSERT OR IGNORE INTO customers(id, name) VALUES (1, 'ada'), (2, 'grace'), (3, 'edsger')"),
    ])?;
    show("batch", &rs[2].meta);

    println!("writes ({orders} orders, one transaction each):");
    let started = Instant::now();
    let mut last = None;
    for i in 0..orders {
        let r = s
            .prepare("INSERT INTO orders(customer, amount_cents, placed_at) VALUES (?1, ?2, datetime('now'))")
            .bind([Value::from(i64::from(i % 3 + 1)), Value::from(i64::from(100 + i * 7 % 900))])
            .run()?;
        if i < 3 || i + 1 == orders {
            show(&format!("order {i}"), &r.meta);
        } else if i == 3 {
            println!("  ...");
        }
        last = Some(r.meta.bookmark);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "  {orders} commits in {:.1} ms ({:.0} commits/s)",
        secs * 1e3,
        f64::from(orders) / secs
    );

    let bookmark = s
        .bookmark()
        .context("session has a bookmark after writing")?;
    println!("session bookmark after writes: {bookmark}");

    println!("a new session on the replica, continuing from that bookmark, reads those writes:");
    let s2 = replica.session(Constraint::Bookmark(bookmark))?;
    let r = s2
        .prepare(
            "SELECT c.name AS name, count(*) AS orders, sum(o.amount_cents) AS cents \
             FROM orders o JOIN customers c ON c.id = o.customer GROUP BY c.id ORDER BY c.id",
        )
        .all()?;
    for row in &r.results {
        println!(
            "  {:<8} orders={:<5} total=${:.2}",
            row.get("name").and_then(Value::as_str).unwrap_or("?"),
            row.get("orders").and_then(Value::as_i64).unwrap_or(0),
            row.get("cents").and_then(Value::as_i64).unwrap_or(0) as f64 / 100.0
        );
    }
    show("report", &r.meta);
    anyhow::ensure!(
        Some(r.meta.bookmark) >= last,
        "a read after a write reflects it"
    );
    match s2
        .prepare("INSERT INTO orders(customer, amount_cents, placed_at) VALUES (1, 1, 'now')")
        .run()
    {
        Err(e) => println!("a write on the replica is refused: {e}"),
        Ok(_) => anyhow::bail!("the replica accepted a write"),
    }

    match s.prepare("SELECT * FROM missing_table").all() {
        Err(e) => println!("bad input is a typed error: {e}"),
        Ok(_) => anyhow::bail!("a query on a missing table succeeded"),
    }
    match "not-a-bookmark".parse::<Constraint>() {
        Err(e) => println!("a malformed bookmark is a typed error: {e}"),
        Ok(_) => anyhow::bail!("a malformed bookmark parsed"),
    }
    let stats = db.checkpoint(CheckpointMode::Truncate)?;
    println!(
        "checkpoint (TRUNCATE): {} frames backfilled; latest bookmark {}",
        stats.backfilled_frames,
        db.latest_bookmark()
    );
    Ok(())
}

/// A fresh directory under the system temp dir, kept after exit so the
/// demo's database can be inspected.
fn tempfile_dir() -> Result<PathBuf> {
    let d = std::env::temp_dir().join(format!("walrelay-demo-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Node events (epochs, fencing, refusals, limits) go to stderr through
/// `tracing`, at the level `WALRELAY_LOG` names (error, warn, info, debug,
/// trace; info by default). Status lines stay on stdout.
fn init_logs() {
    let level = std::env::var("WALRELAY_LOG")
        .ok()
        .and_then(|v| v.parse::<tracing::Level>().ok())
        .unwrap_or(tracing::Level::INFO);
    tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
}

fn main() -> Result<()> {
    init_logs();
    let cli = Cli::parse();
    cli.cpu_scheduling.apply();
    match cli.command {
        Command::Demo { db, orders } => demo(db, orders),
        Command::Up(a) => up_cmd::up(a, cli.cpu_scheduling),
        Command::Follower(a) => cmd::follower(a),
        Command::Primary(a) => cmd::primary(a),
        Command::Replica(a) => replica_cmd::replica(a),
        Command::Node(a) => fleet_cmd::node(a),
        Command::Promote(a) => cmd::promote(a),
        Command::Restore(a) => archive_cmd::restore(a),
        Command::Fork(a) => archive_cmd::fork(a),
        Command::Token(c) => token_cmd::token(c),
    }
}
