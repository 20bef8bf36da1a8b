//! `walrelay node`: a fleet node, hosting many databases and, on one node,
//! the control plane; and the fleet flags of `walrelay primary|replica`.

use crate::cmd::{AuthArgs, ReplicationAuthArgs, http_auth, install_stop_handler, stopping};
use anyhow::{Context, Result, bail};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use walrelay_engine::fleet::catalog::{Catalog, CatalogReads, PgCatalog, SqliteCatalog};
use walrelay_engine::fleet::control::{
    ControlConfig, ControlPlane, HostApi, HostNode, LimitsService,
};
use walrelay_engine::fleet::host::{Host, HostConfig, LocalOpener, ReplicatedOpener};
use walrelay_engine::fleet::link::{HttpHostApi, Internal, InternalAuth};
use walrelay_engine::fleet::replica_host::{ReplicaHost, ReplicaHostConfig};
use walrelay_engine::fleet::routes::Routes;
use walrelay_engine::fleet::{Fleet, FleetConfig, LocalHostApi};
use walrelay_engine::http::server::{HttpConfig, Node, Role, serve};
use walrelay_engine::{ClusterKey, Database, Options, Synchronous};

/// The replicated history of the embedded catalog (ids of databases the
/// control plane creates are random and never this small).
pub const CATALOG_DATABASE_ID: walrelay_replicator::DatabaseId = walrelay_replicator::DatabaseId(2);

/// How a primary or replica node takes part in a fleet (it keeps a
/// routing table and passes control-plane calls on).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct FleetLinkArgs {
    /// The control plane's node (HTTP base URL): control-plane calls, and
    /// queries for fleet databases this node has no route to, go there.
    #[arg(long)]
    pub fleet_control_url: Option<String>,
    /// Every other node's HTTP base URL, comma-separated: each database's
    /// routing entry is sent to all of them.
    #[arg(long, value_delimiter = ',')]
    pub fleet_peers: Vec<String>,
}

impl FleetLinkArgs {
    /// A fleet that hosts nothing (None without `--fleet-control-url`);
    /// with `replicas`, it keeps read replicas of the fleet's databases
    /// (a replica node) and runs its background thread (idle closing,
    /// usage reports).
    pub fn fleet(
        &self,
        dir: &Path,
        http: SocketAddr,
        key: Option<&ClusterKey>,
        replicas: Option<ReplicaHostConfig>,
    ) -> Result<Option<Arc<Fleet>>> {
        let Some(control) = &self.fleet_control_url else {
            return Ok(None);
        };
        let routes = Arc::new(Routes::open(&dir.join("routes.db")).context("opening routes.db")?);
        let mut config = FleetConfig::new(format!("http://{http}"));
        config.control_url = Some(control.clone());
        config.peers = self.fleet_peers.clone();
        config.auth = InternalAuth::new(key);
        let mut fleet = Fleet::new(
            config,
            routes,
            None,
            None,
            Arc::new(CatalogReads::default()),
        );
        let start = replicas.is_some();
        if let Some(r) = replicas {
            fleet = fleet.with_replicas(ReplicaHost::new(r).context("opening the fleet replicas")?);
        }
        let fleet = Arc::new(fleet);
        if start {
            fleet.start();
        }
        Ok(Some(fleet))
    }
}

/// Options of `walrelay node`.
#[derive(clap::Args)]
pub struct NodeArgs {
    /// The HTTP API address.
    #[arg(long)]
    pub http: SocketAddr,
    /// Where the hosted databases, the routing table (and the embedded
    /// catalog) live.
    #[arg(long)]
    pub dir: PathBuf,
    /// This node's location, matched against `primary_location_hint`.
    #[arg(long, default_value = "local")]
    pub location: String,
    /// Run the control plane on this node.
    #[arg(long)]
    pub control_plane: bool,
    /// The catalog, for the control plane: `embedded` (a walrelay database
    /// in DIR/catalog) or a PostgreSQL URL (`postgres://user@host:port/db`).
    #[arg(long, default_value = "embedded")]
    pub catalog: String,
    /// The nodes that host databases, for the control plane: HTTP base
    /// URLs, each optionally `URL@location` (this node included).
    #[arg(long, value_delimiter = ',')]
    pub hosts: Vec<String>,
    #[command(flatten)]
    pub link: FleetLinkArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(flatten)]
    pub replication_auth: ReplicationAuthArgs,
    /// Heartbeat interval of an open database (D1: 30 s), plus jitter.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(100..))]
    pub heartbeat_ms: u64,
    #[arg(long, default_value_t = 5_000)]
    pub heartbeat_jitter_ms: u64,
    /// An open database unused this long is closed.
    #[arg(long, default_value_t = 60_000)]
    pub idle_close_ms: u64,
    /// Most databases open at once (0: from the file-descriptor limit).
    #[arg(long, default_value_t = 0)]
    pub max_open: usize,
    /// Most databases this node hosts.
    #[arg(long, default_value_t = 1_000_000)]
    pub max_hosted: u64,
    /// Stop after this many seconds (0: at Ctrl-C).
    #[arg(long, default_value_t = 0)]
    pub seconds: u64,
    /// The durability followers every hosted database replicates to (each
    /// follower hosts many databases); none: databases are local only.
    #[arg(long, value_parser = crate::cmd::parse_addrs, default_value = "")]
    pub followers: crate::cmd::Addrs,
    /// Transport to the followers: auto, std or io_uring.
    #[arg(long, default_value = "auto", value_parser = crate::cmd::backend)]
    pub net: walrelay_replicator::net::Backend,
    /// The cold store the followers archive every database to (any
    /// `--store` URL): hosted databases' time travel reads it, and a
    /// database adopted in a failover is rebuilt from it.
    #[arg(long)]
    pub store: Option<String>,
    /// With --control-plane: a host node that has not answered a probe
    /// for this long is declared dead and its databases move to the
    /// others (0: never).
    #[arg(long, default_value_t = 10_000)]
    pub failover_after_ms: u64,
    /// With --control-plane: how often every host node is probed.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(10..))]
    pub probe_ms: u64,
    /// With --control-plane: the queue databases' size changes ride to
    /// the catalog: `local` (a file in DIR/limits) or an existing Redis
    /// broker (`redis://host:port/`, a stream and a consumer group).
    #[arg(long, default_value = "local")]
    pub size_queue: String,
}

fn host_node(
    spec: &str,
    self_url: &str,
    local: &Arc<dyn HostApi>,
    internal: &Internal,
) -> HostNode {
    let (url, location) = spec.split_once('@').unwrap_or((spec, "local"));
    let api: Arc<dyn HostApi> = if url == self_url {
        Arc::clone(local)
    } else {
        Arc::new(HttpHostApi {
            url: url.to_string(),
            internal: internal.clone(),
        })
    };
    HostNode {
        url: url.to_string(),
        location: location.to_string(),
        api,
    }
}

/// How hosted databases open: replicated to the followers if there are
/// any, local otherwise.
fn opener(
    a: &NodeArgs,
    options: Options,
    key: Option<ClusterKey>,
    store: Option<walrelay_archive::Store>,
) -> Box<dyn walrelay_engine::fleet::host::Opener> {
    if a.followers.is_empty() {
        return Box::new(LocalOpener { options });
    }
    let mut template = walrelay_engine::replication::PrimaryConfig::new(
        a.dir.join("unused"),
        a.followers.clone(),
        key,
    );
    template.backend = a.net;
    // A database opened where it has no file (adopted in a failover, or
    // its file lost) is rebuilt from cold storage, then the log.
    template.store = store;
    // Every open database takes its read replicas on the node's one
    // replication port (the node's mux listens there once, routing by
    // database); replica nodes ask where (`replication`).
    template.listen = Some(SocketAddr::new(a.http.ip(), 0));
    template.options.readers = options.readers;
    template.options.region = options.region;
    Box::new(ReplicatedOpener::new(template, 5_000))
}

/// Runs a fleet node until Ctrl-C or `--seconds`.
pub fn node(a: NodeArgs) -> Result<()> {
    install_stop_handler();
    let auth = http_auth(&a.auth, "node", a.http)?;
    let key = a.replication_auth.key("node")?;
    if !a.control_plane && a.link.fleet_control_url.is_none() {
        bail!("a node needs --control-plane or --fleet-control-url URL");
    }
    std::fs::create_dir_all(&a.dir)?;
    // Checked before anything starts: a bad store stops the start.
    let store = crate::cmd::open_store(a.store.as_deref())?;
    let self_url = format!("http://{}", a.http);
    let reads = Arc::new(CatalogReads::default());
    let routes = Arc::new(Routes::open(&a.dir.join("routes.db")).context("opening routes.db")?);
    let options = Options {
        readers: 1,
        synchronous: Synchronous::Full,
        region: a.location.clone(),
        ..Options::default()
    };
    let host = Arc::new(
        Host::open(
            HostConfig {
                dir: a.dir.join("dbs"),
                max_open: a.max_open,
                idle_close_ms: a.idle_close_ms,
                max_hosted: a.max_hosted,
            },
            opener(&a, options, key.clone(), store.clone()),
        )
        .context("opening the hosted databases")?,
    );
    let internal = Internal::new(InternalAuth::new(key.as_ref()), 10_000);
    let local: Arc<dyn HostApi> = Arc::new(LocalHostApi {
        host: Arc::clone(&host),
        routes: Arc::clone(&routes),
        self_url: self_url.clone(),
    });
    // The embedded catalog is a walrelay database too: replicated to the
    // followers (as database CATALOG_DATABASE_ID) when there are any.
    let mut catalog_primary = None;
    let control = if a.control_plane {
        let catalog: Arc<dyn Catalog> = if a.catalog == "embedded" {
            std::fs::create_dir_all(a.dir.join("catalog"))?;
            let path = a.dir.join("catalog").join("db");
            let db = if a.followers.is_empty() {
                Database::open(&path, Options::default()).context("opening the embedded catalog")?
            } else {
                let mut config = walrelay_engine::replication::PrimaryConfig::new(
                    path,
                    a.followers.clone(),
                    key.clone(),
                );
                config.database = CATALOG_DATABASE_ID;
                config.backend = a.net;
                config.tail_limit_bytes = walrelay_engine::fleet::host::FLEET_TAIL_LIMIT_BYTES;
                let p = walrelay_engine::replication::ReplicatedPrimary::start(config)
                    .context("starting the replicated catalog")?;
                let db = p.database().clone();
                catalog_primary = Some(p);
                db
            };
            Arc::new(SqliteCatalog::open(db, Arc::clone(&reads)).context("the catalog schema")?)
        } else if a.catalog.starts_with("postgres://") || a.catalog.starts_with("postgresql://") {
            Arc::new(
                PgCatalog::connect(&a.catalog, Arc::clone(&reads))
                    .context("connecting to the PostgreSQL catalog")?,
            )
        } else {
            bail!("--catalog must be `embedded` or a postgres:// URL");
        };
        let specs = if a.hosts.is_empty() {
            vec![format!("{self_url}@{}", a.location)]
        } else {
            a.hosts.clone()
        };
        let hosts = specs
            .iter()
            .map(|s| host_node(s, &self_url, &local, &internal))
            .collect();
        // The limit pipeline (sizes through the queue into the catalog,
        // usage into the analytics table, the limiter's keys).
        let limits = LimitsService::open_with(&a.dir.join("limits"), &a.size_queue)
            .context("opening the limits' queue and analytics")?;
        Some(Arc::new(
            ControlPlane::new(
                catalog,
                hosts,
                ControlConfig {
                    failover_after_ms: a.failover_after_ms,
                    probe_ms: a.probe_ms,
                    ..ControlConfig::default()
                },
            )
            .with_limits(limits),
        ))
    } else {
        None
    };
    let mut config = FleetConfig::new(self_url.clone());
    config.control_url = a.link.fleet_control_url.clone();
    config.peers = a.link.fleet_peers.clone();
    config.auth = InternalAuth::new(key.as_ref());
    config.heartbeat_ms = a.heartbeat_ms;
    config.heartbeat_jitter_ms = a.heartbeat_jitter_ms;
    config.orphan_grace_ms = a.heartbeat_ms.max(60_000);
    let fleet = Arc::new(Fleet::new(
        config,
        routes,
        Some(Arc::clone(&host)),
        control,
        reads,
    ));
    fleet.start();
    let http = Node::new(
        Role::Fleet,
        HttpConfig {
            database: String::new(),
            region: a.location.clone(),
            fleet_store: store.map(|s| (s, a.dir.join("time-travel"))),
            ..HttpConfig::default()
        },
        auth,
    )
    .with_fleet(Arc::clone(&fleet));
    let server =
        serve(Arc::new(http), a.http).with_context(|| format!("serving HTTP on {}", a.http))?;
    println!(
        "node HTTP at {} hosting {} databases (at most {} open){}",
        server.url(),
        host.hosted_count(),
        host.max_open(),
        if a.control_plane {
            ", control plane here"
        } else {
            ""
        }
    );
    let deadline = (a.seconds > 0).then(|| Instant::now() + Duration::from_secs(a.seconds));
    while !stopping() && deadline.is_none_or(|d| Instant::now() < d) {
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(server);
    fleet.stop();
    if let Some(p) = catalog_primary {
        if let Err(e) = p.stop(Duration::from_secs(10)) {
            eprintln!(
                "node: the catalog did not stop cleanly ({e}); its next start recovers it from the followers"
            );
        }
    }
    println!("node stopped");
    Ok(())
}
