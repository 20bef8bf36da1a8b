//! `walrelay up`: a local cluster of `walrelay` processes on 127.0.0.1
//! (followers, a primary running a demo workload, replicas), started in
//! order, reported on, supervised (a primary that dies is replaced by a
//! promoted replica: [`crate::supervisor`]) and stopped primary first on
//! Ctrl-C.

use crate::cmd::{CLUSTER_KEY_FILE, backend, backend_name, install_stop_handler};
use crate::cpu_scheduling::CpuScheduling;
use crate::supervisor::{Plan, Slot, Supervised};
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use walrelay_replicator::ClusterKey;
use walrelay_replicator::net::Backend;

/// Options of `walrelay up`.
#[derive(clap::Args)]
pub struct UpArgs {
    /// Data directory (a fresh temporary one if omitted).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// The primary listens here; followers on the next ports.
    #[arg(long, default_value_t = 7100, value_parser = clap::value_parser!(u16).range(1..))]
    pub base_port: u16,
    #[arg(long, default_value_t = 5, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=9))]
    pub followers: usize,
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    /// Concurrent demo writers on the primary (each a thread).
    #[arg(long, default_value_t = 4, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=crate::cmd::MAX_DEMO_WRITERS))]
    pub writers: usize,
    /// Stop after this many seconds (0: run until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// Transport: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = backend)]
    pub net: Backend,
    /// The largest write transaction, in bytes of pages (the primary's
    /// `--max-transaction-bytes`).
    #[arg(
        long,
        default_value_t = walrelay_engine::Limits::default().max_transaction_bytes,
        value_parser = clap::value_parser!(u64).range(walrelay_engine::MIN_TRANSACTION_BYTES..)
    )]
    pub max_transaction_bytes: u64,
    /// Every write its own transaction on the primary (the primary's
    /// `--no-group-commit`).
    #[arg(long)]
    pub no_group_commit: bool,
    /// The primary's `--group-commit-delay-us`.
    #[arg(
        long,
        default_value_t = walrelay_engine::Options::default().group_commit_delay_us,
        value_parser = clap::value_parser!(u64).range(0..=walrelay_engine::MAX_GROUP_COMMIT_DELAY_US)
    )]
    pub group_commit_delay_us: u64,
    /// The primary's `--confirm-timeout-ms`: how long a write waits with no
    /// confirmation at all before it fails.
    #[arg(
        long,
        default_value_t = walrelay_engine::replication::PrimaryConfig::DEFAULT_CONFIRM_TIMEOUT_MS,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub confirm_timeout_ms: u64,
    /// The primary's `--eager-followers`: how many followers get each
    /// record at once (default W, the others getting batches; N: all).
    #[arg(long)]
    pub eager_followers: Option<usize>,

    /// Serve the HTTP API without authentication (by default `up` keeps a
    /// token store in DIR/tokens and an admin token in DIR/token).
    #[arg(long)]
    pub insecure: bool,
    /// Cold storage for the log and snapshots (default: DIR/store on the
    /// local filesystem); any `--store` URL the nodes take.
    #[arg(long)]
    pub store: Option<String>,
    /// Followers upload confirmed records at most this late...
    #[arg(long, default_value_t = 10_000)]
    pub archive_lag_ms: u64,
    /// ...or once this many bytes of them are unarchived (each
    /// follower's uploader waits for a multiple of it by its rank)...
    #[arg(long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub archive_lag_bytes: u64,
    /// ...snapshot after this much log...
    #[arg(long, default_value_t = 256 << 20)]
    pub snapshot_log_bytes: u64,
    /// ...and keep this much archived log on local disk.
    #[arg(long, default_value_t = 64 << 20)]
    pub local_keep_bytes: u64,
    /// Fleet nodes, each hosting many databases (created through
    /// `POST /v1/databases`), on the HTTP ports after the replicas'; the
    /// first also runs the control plane (0: no fleet).
    #[arg(long, default_value_t = 3)]
    pub fleet_nodes: usize,
    /// The fleet's heartbeat interval (D1: 30 s).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub heartbeat_ms: u64,
    /// How the read replicas' threads are scheduled (default: as
    /// `--cpu-scheduling`). A replica is off the commit path; on a machine
    /// it shares with a saturated primary, `normal` lets its wake-ups
    /// preempt, so a confirmed write becomes visible there sooner (under
    /// the demo, its confirm lag's p99 about halved) at some of the
    /// primary's throughput (about 8% at 16 HTTP connections):
    /// papers/performance-log.md, thirty-second session.
    #[arg(long, value_enum)]
    pub replica_cpu_scheduling: Option<CpuScheduling>,
    /// The fleet's catalog: `embedded` or a postgres:// URL.
    #[arg(long, default_value = "embedded")]
    pub catalog: String,
    /// A fleet node that does not answer the control plane's probes this
    /// long (hung or cut off: `up` restarts one that exits) has its
    /// databases moved to the others (0: never).
    #[arg(long, default_value_t = 10_000)]
    pub fleet_failover_ms: u64,
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

pub fn up(a: UpArgs, scheduling: CpuScheduling) -> Result<()> {
    install_stop_handler();
    if a.replicas > 26 {
        bail!("at most 26 replicas (regions region-a to region-z)");
    }
    // Followers take base+1..=base+N; HTTP takes base+10..=base+10+replicas
    // and the fleet nodes the ports after those.
    let highest = u32::from(a.base_port)
        + (a.followers as u32).max(10 + a.replicas as u32 + a.fleet_nodes as u32);
    if a.followers > 9 || highest > u32::from(u16::MAX) {
        bail!(
            "ports {}..={highest} do not fit (at most 9 followers, and a lower --base-port)",
            a.base_port
        );
    }
    if let Some(eager) = a.eager_followers {
        let w = a.followers / 2 + 1;
        if eager < w || eager > a.followers {
            bail!(
                "--eager-followers {eager}: it takes between W ({w}) and N ({}), the followers",
                a.followers
            );
        }
    }
    let dir = match a.dir {
        Some(d) => d,
        None => std::env::temp_dir().join(format!("walrelay-up-{}", std::process::id())),
    };
    std::fs::create_dir_all(crate::supervisor::pid_dir(&dir))?;
    let key_file = dir.join(CLUSTER_KEY_FILE);
    ClusterKey::load_or_create(&key_file)?;
    let key_arg = |args: &mut Vec<String>| {
        args.extend(["--cluster-key".into(), key_file.display().to_string()]);
    };
    let store = match &a.store {
        Some(url) => url.clone(),
        None => std::path::absolute(dir.join("store"))?
            .display()
            .to_string(),
    };
    let exe = std::env::current_exe()?;
    let follower_addrs = addrs(a.base_port + 1, a.followers);
    let primary_addr = SocketAddr::from(([127, 0, 0, 1], a.base_port));
    println!(
        "walrelay up: 1 primary, {} followers, {} replicas in {} (Ctrl-C stops); replication authenticated with {}; cold storage at {store}",
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
    let replica_scheduling = a.replica_cpu_scheduling.unwrap_or(scheduling);
    let spawn = |args: Vec<String>| -> Result<Child> {
        let mut command = Command::new(&exe);
        // A slot's role decides: a promoted replica restarts as a primary.
        let scheduling = match args.first().map(String::as_str) {
            Some("replica") => replica_scheduling,
            _ => scheduling,
        };
        command
            .args(["--cpu-scheduling", scheduling.name()])
            .args(&args);
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
    let mut followers = Vec::new();
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
            "--store".into(),
            store.clone(),
            "--archive-rank".into(),
            i.to_string(),
            "--archive-lag-ms".into(),
            a.archive_lag_ms.to_string(),
            "--archive-lag-bytes".into(),
            a.archive_lag_bytes.to_string(),
            "--snapshot-log-bytes".into(),
            a.snapshot_log_bytes.to_string(),
            "--local-keep-bytes".into(),
            a.local_keep_bytes.to_string(),
        ];
        key_arg(&mut args);
        followers.push(Supervised::start(
            format!("follower {i}"),
            args,
            crate::supervisor::pid_dir(&dir).join(format!("follower-{i}")),
            &spawn,
        )?);
    }
    // Data nodes: slot 0 is `primary/`, slot k is `replica-{k-1}/`; each
    // keeps its HTTP port (base+10+slot) whatever its role. Which slot is
    // the primary survives restarts in DIR/primary-slot.
    let http = |i: usize| SocketAddr::from(([127, 0, 0, 1], a.base_port + 10 + i as u16));
    let slots: Vec<Slot> = (0..=a.replicas)
        .map(|k| Slot {
            http: http(k),
            dir: if k == 0 {
                dir.join("primary")
            } else {
                dir.join(format!("replica-{}", k - 1))
            },
            region: if k == 0 {
                "primary-region".to_string()
            } else {
                format!("region-{}", (b'a' + (k - 1) as u8) as char)
            },
        })
        .collect();
    let deadline = (a.seconds > 0).then(|| Instant::now() + Duration::from_secs(a.seconds));
    // Fleet nodes: HTTP on the ports after the data slots'.
    let fleet_http: Vec<SocketAddr> = (0..a.fleet_nodes)
        .map(|i| http(a.replicas + 1 + i))
        .collect();
    let http_urls: Vec<String> = slots
        .iter()
        .map(|s| s.http)
        .chain(fleet_http.iter().copied())
        .map(|h| format!("http://{h}"))
        .collect();
    let fleet_control_url = fleet_http.first().map(|h| format!("http://{h}"));
    for (i, addr) in fleet_http.iter().enumerate() {
        let me = format!("http://{addr}");
        let peers: Vec<&str> = http_urls
            .iter()
            .map(String::as_str)
            .filter(|u| *u != me)
            .collect();
        let mut args = vec![
            "node".into(),
            "--http".into(),
            addr.to_string(),
            "--dir".into(),
            dir.join(format!("node-{i}")).display().to_string(),
            "--location".into(),
            format!("fleet-{i}"),
            "--fleet-peers".into(),
            peers.join(","),
            "--heartbeat-ms".into(),
            a.heartbeat_ms.to_string(),
            // Every hosted database replicates to the same followers.
            "--followers".into(),
            join(&follower_addrs),
            "--net".into(),
            backend_name(a.net).into(),
            "--store".into(),
            store.clone(),
        ];
        if i == 0 {
            let hosts: Vec<String> = fleet_http
                .iter()
                .enumerate()
                .map(|(j, h)| format!("http://{h}@fleet-{j}"))
                .collect();
            args.extend([
                "--control-plane".into(),
                "--catalog".into(),
                a.catalog.clone(),
                "--failover-after-ms".into(),
                a.fleet_failover_ms.to_string(),
                "--hosts".into(),
                hosts.join(","),
            ]);
        } else {
            args.extend([
                "--fleet-control-url".into(),
                fleet_control_url.clone().unwrap_or_default(),
            ]);
        }
        key_arg(&mut args);
        args.extend(auth_flags.iter().cloned());
        followers.push(Supervised::start(
            format!("fleet node {i}"),
            args,
            crate::supervisor::pid_dir(&dir).join(format!("node-{i}")),
            &spawn,
        )?);
    }
    if let Some(url) = &fleet_control_url {
        println!(
            "  fleet: {} nodes from {url}; create a database: curl -s -X POST {url}/v1/databases{auth_header} -d '{{\"name\":\"shop\"}}'",
            a.fleet_nodes
        );
    }
    let plan = Plan {
        slots,
        follower_addrs: follower_addrs.clone(),
        primary_addr,
        writers: a.writers,
        max_transaction_bytes: a.max_transaction_bytes,
        group_commit: !a.no_group_commit,
        group_commit_delay_us: a.group_commit_delay_us,
        eager_followers: a.eager_followers,
        confirm_timeout_ms: a.confirm_timeout_ms,
        net: backend_name(a.net),
        key_file: key_file.clone(),
        auth_flags,
        dir: dir.clone(),
        deadline,
        store: store.clone(),
        fleet_control_url,
        http_urls,
    };
    let mut cluster = crate::supervisor::Cluster::start(plan, followers, &spawn)?;
    let status = cluster.run(&spawn)?;
    cluster.stop();
    println!("walrelay up: stopped (data in {})", dir.display());
    if !status.success() {
        bail!("the primary exited with {status}");
    }
    Ok(())
}
