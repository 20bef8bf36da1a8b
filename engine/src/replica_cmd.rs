//! `walrelay replica`: a read replica process streaming from a primary,
//! serving reads over HTTP (the other processes are in `cmd`).

use crate::cmd::{
    Addrs, AuthArgs, ReplicationAuthArgs, backend, http_auth, install_stop_handler, parse_addrs,
    stopping,
};
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_engine::ReplicaOptions;
use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
use walrelay_engine::replication::{ReplicaConfig, ReplicatedReplica, database_path};
use walrelay_replicator::DatabaseId;
use walrelay_replicator::net::Backend;

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
    /// Cold storage: a replica with no database starts from its newest
    /// archived state, and one that fell behind the followers' retained
    /// log starts over from it.
    #[arg(long)]
    pub store: Option<String>,
    /// Injected replication delay (testing).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
    /// Append every confirm lag sample (µs, one a line) to this file, for
    /// benchmarks that need exact percentiles over a whole run.
    #[arg(long)]
    pub confirm_lag_log: Option<PathBuf>,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub replication_auth: ReplicationAuthArgs,
    #[command(flatten)]
    pub fleet: crate::fleet_cmd::FleetLinkArgs,
    /// A replica of a fleet database kept here, unused this long, is
    /// closed (it resumes from its files on the next read).
    #[arg(long, default_value_t = 60_000)]
    pub fleet_replica_idle_ms: u64,
}

pub fn replica(a: ReplicaArgs) -> Result<()> {
    install_stop_handler();
    let cluster_key = a.replication_auth.key("replica")?;
    let fleet_key = cluster_key.clone();
    let (dir, leader) = (a.dir.clone(), a.leader);
    // Checked before anything starts: a bad store stops the start.
    let auth = match (a.http, &a.primary_http) {
        (Some(addr), Some(_)) => Some(http_auth(&a.auth, "replica", addr)?),
        (Some(_), None) => bail!("--http needs --primary-http (where writes are forwarded)"),
        _ => None,
    };
    std::fs::create_dir_all(&dir)?;
    let store = crate::cmd::open_store(a.store.as_deref())?;
    let restart_marker = dir.join(REBOOTSTRAP_MARKER);
    if restart_marker.exists() {
        // The last run fell behind the followers' retained log: its
        // database is discarded and rebuilt from cold storage.
        for p in walrelay_vfs::replica_files(&database_path(&dir)) {
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e).with_context(|| format!("removing {}", p.display())),
            }
        }
        std::fs::remove_file(&restart_marker)?;
    }
    let fleet_store = store.clone();
    let r = Arc::new(
        ReplicatedReplica::start(ReplicaConfig {
            store,
            mux: None,
            database: DatabaseId(a.database),
            path: database_path(&dir),
            leader,
            followers: a.followers.clone(),
            backend: a.net,
            auth: cluster_key,
            options: ReplicaOptions {
                region: a.region.clone(),
                max_wait_ms: a.max_wait_ms,
                // Durable (the default): after a power cut the database
                // file never holds pages past the persisted watermark.
                ..ReplicaOptions::default()
            },
            delay_ms: a.delay_ms,
        })
        .context("starting the replica")?,
    );
    let http = match (a.http, a.primary_http.clone(), auth) {
        (Some(addr), Some(primary_url), Some(auth)) => {
            let mut node = Node::new(
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
            );
            // Reads of the fleet's databases that reach this node are
            // answered by replicas of them kept here, in this region.
            let replicas = walrelay_engine::fleet::replica_host::ReplicaHostConfig {
                dir: dir.join("fleet-replicas"),
                followers: a.followers.clone(),
                backend: a.net,
                auth: fleet_key.clone(),
                store: fleet_store.clone(),
                region: a.region.clone(),
                max_wait_ms: a.max_wait_ms,
                max_open: 0,
                idle_close_ms: a.fleet_replica_idle_ms,
            };
            if let Some(fleet) = a
                .fleet
                .fleet(&dir, addr, fleet_key.as_ref(), Some(replicas))?
            {
                node = node.with_fleet(fleet);
            }
            let node = Arc::new(node);
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
    let mut lag_log = match &a.confirm_lag_log {
        Some(p) => Some(std::fs::File::options().create(true).append(true).open(p)?),
        None => None,
    };
    let mut last_report = Instant::now();
    let mut fell_behind = None;
    while !stopping() {
        std::thread::sleep(Duration::from_millis(50));
        if let Some(start) = r.node().archived()
            && a.store.is_some()
        {
            fell_behind = Some(start);
            break;
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            last_report = Instant::now();
            let mut lags = r.node().take_confirm_lags_us();
            if let Some((_, node)) = &http {
                node.observe_confirm_lags(&lags);
            }
            if let Some(f) = &mut lag_log {
                use std::io::Write;
                let text: String = lags.iter().map(|l| format!("{l}\n")).collect();
                f.write_all(text.as_bytes())?;
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
    if let Some(fleet) = http.as_ref().and_then(|(_, node)| node.fleet()) {
        fleet.stop();
    }
    drop(http);
    let _ = r.replica().persist();
    if let Some(start) = fell_behind {
        std::fs::write(&restart_marker, start.to_string())?;
        eprintln!(
            "replica {}: the followers' log now starts at {start}, after this replica's {}; exiting to start over from cold storage (run it again; `up` does)",
            dir.display(),
            r.replica().confirmed()
        );
        std::process::exit(REBOOTSTRAP_EXIT);
    }
    println!(
        "replica {} stopping at {}",
        dir.display(),
        r.replica().confirmed()
    );
    Ok(())
}

/// `DIR/rebootstrap`: a replica left behind by the followers' retention
/// writes it before exiting; its next start discards the database and
/// bootstraps from cold storage.
const REBOOTSTRAP_MARKER: &str = "rebootstrap";
/// The exit code of a replica that must start over from cold storage.
pub const REBOOTSTRAP_EXIT: i32 = 4;
