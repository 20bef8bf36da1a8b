//! The fleet: many databases per node, and a control plane that stays off
//! the query path (D1's design, as `../shared/reference` describes it).
//!
//! # Contract
//!
//! - [`catalog`]: the source of truth, a [`Catalog`](catalog::Catalog) in
//!   an embedded walrelay SQLite database or in PostgreSQL. Only the
//!   control plane and its background jobs read it; every read is counted,
//!   and reads made on a query path are counted separately
//!   ([`catalog::CatalogReads::on_query_path`], which stays 0).
//! - [`control`]: creation (host first, then the catalog row as the
//!   checkpoint, in a retry loop with fresh ids, then a best-effort
//!   activation), listing, deletion and heartbeat answers.
//! - [`host`]: the databases a node hosts, each with its own lifecycle
//!   record, opened on first use, closed when idle, at most `max_open` at
//!   once.
//! - [`routes`]: the node's routing table (D1's Workers KV), the only thing
//!   the query path reads to find a database; each database writes its own
//!   entry.
//! - [`failover`]: the control plane's failure detector, which moves a
//!   dead node's databases to live ones.
//! - [`heartbeat`]: each open database's periodic check with the control
//!   plane, which deletes orphans, repairs routing entries and turns
//!   deleted databases away.
//! - [`replica_host`]: a replica node's read replicas of fleet databases,
//!   opened on the first read that reaches it and following their primary.
//! - Names: [`names`] (uuid, account, database name).

pub mod catalog;
pub mod control;
pub mod failover;
pub mod heartbeat;
pub mod host;
pub mod limits;
pub mod link;
pub mod metering;
pub mod names;
pub mod replica_host;
pub mod routes;
pub mod size_queue;

use control::{ControlError, ControlPlane, HostApi};
use host::{Host, HostError, OpenDb};
use names::{AccountId, DatabaseName, DatabaseUuid};
use parking_lot::Mutex;
use routes::{Route, Routes};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64};
use walrelay_replicator::DatabaseId;

/// How a node takes part in the fleet.
#[derive(Debug, Clone)]
pub struct FleetConfig {
    /// This node's HTTP base URL, as routing entries name it.
    pub self_url: String,
    /// The account of requests that name none.
    pub default_account: AccountId,
    /// Heartbeat interval of an open database (D1: 30 s).
    pub heartbeat_ms: u64,
    /// Most extra delay added per database.
    pub heartbeat_jitter_ms: u64,
    /// An initialised database the catalog does not know is an orphan
    /// only once it is this old (its creation may still be running).
    pub orphan_grace_ms: u64,
    /// How often the heartbeat thread looks for due beats and idle
    /// databases.
    pub tick_ms: u64,
    /// Where the control plane is, for a node that does not run it (its
    /// HTTP base URL).
    pub control_url: Option<String>,
    /// Every other node's HTTP base URL: routing entries go to all.
    pub peers: Vec<String>,
    /// How internal calls between nodes are authenticated.
    pub auth: link::InternalAuth,
}

impl FleetConfig {
    pub fn new(self_url: String) -> FleetConfig {
        FleetConfig {
            self_url,
            default_account: AccountId::default_account(),
            heartbeat_ms: 30_000,
            heartbeat_jitter_ms: 5_000,
            orphan_grace_ms: 60_000,
            tick_ms: 250,
            control_url: None,
            peers: Vec::new(),
            auth: link::InternalAuth::new(None),
        }
    }
}

/// Fleet counters (`/metrics`).
#[derive(Debug, Default)]
pub struct FleetStats {
    pub heartbeats: AtomicU64,
    pub routes_repaired: AtomicU64,
    pub queries: AtomicU64,
    /// Fleet queries a read replica here answered.
    pub replica_reads: AtomicU64,
}

/// Why a fleet database could not be found or served.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("no database {0:?}")]
    Unknown(String),
    #[error("database {0:?} is served by another node")]
    Elsewhere(String),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Route(#[from] routes::RouteError),
}

/// A node's part of the fleet.
#[derive(Debug)]
pub struct Fleet {
    pub config: FleetConfig,
    pub routes: Arc<Routes>,
    pub host: Option<Arc<Host>>,
    /// Read replicas of the fleet's databases kept here (a replica node).
    pub replicas: Option<Arc<replica_host::ReplicaHost>>,
    control: Option<Arc<ControlPlane>>,
    pub reads: Arc<catalog::CatalogReads>,
    pub stats: FleetStats,
    storage_over: Mutex<HashSet<DatabaseId>>,
    /// Rows and sizes for the limits, and the limit cache's keys.
    pub metering: metering::Metering,
    internal: link::Internal,
    /// The same calls with shorter bounds, kept (and their connections
    /// pooled) rather than made per call: route pushes, and a replica
    /// node asking where a primary is.
    routes_internal: link::Internal,
    locate_internal: link::Internal,
    stop: Arc<AtomicBool>,
    thread: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl Fleet {
    pub fn new(
        config: FleetConfig,
        routes: Arc<Routes>,
        host: Option<Arc<Host>>,
        control: Option<Arc<ControlPlane>>,
        reads: Arc<catalog::CatalogReads>,
    ) -> Fleet {
        Fleet {
            internal: link::Internal::new(config.auth.clone(), 10_000),
            routes_internal: link::Internal::new(config.auth.clone(), link::ROUTES_TIMEOUT_MS),
            locate_internal: link::Internal::new(config.auth.clone(), link::LOCATE_TIMEOUT_MS),
            config,
            routes,
            host,
            replicas: None,
            control,
            reads,
            stats: FleetStats::default(),
            storage_over: Mutex::new(HashSet::new()),
            metering: metering::Metering::default(),
            stop: Arc::new(AtomicBool::new(false)),
            thread: Mutex::new(Vec::new()),
        }
    }

    /// Keeps read replicas of the fleet's databases here; the replicas
    /// of databases no longer routed (deleted) are removed first.
    pub fn with_replicas(mut self, replicas: replica_host::ReplicaHost) -> Fleet {
        if !self.routes.is_empty() {
            let ids = self.routes.database_ids();
            if let Err(e) = replicas.sweep(&|id| ids.contains(&id)) {
                tracing::warn!(error = %e, "could not sweep the fleet replicas' directory");
            }
        }
        self.replicas = Some(Arc::new(replicas));
        self
    }

    /// Closes idle read replicas (those of deleted databases lose their
    /// files).
    pub(crate) fn close_idle_replicas(&self) {
        if let Some(r) = &self.replicas {
            // The routed ids are gathered once, and only if some replica
            // is idle (a scan of the whole table).
            let routed = std::cell::OnceCell::new();
            r.close_idle(&|id| {
                routed
                    .get_or_init(|| self.routes.database_ids())
                    .contains(&id)
            });
        }
    }

    /// Starts the heartbeat and idle-closing thread.
    pub fn start(self: &Arc<Fleet>) {
        let (fleet, stop) = (Arc::clone(self), Arc::clone(&self.stop));
        let mut threads = self.thread.lock();
        threads.push(
            std::thread::Builder::new()
                .name("walrelay-heartbeat".into())
                .spawn(move || heartbeat::run(fleet, stop))
                .expect("spawning the heartbeat thread"),
        );
        if let Some(control) = &self.control {
            threads.extend(control.start_jobs(Arc::clone(&self.stop)));
        }
    }

    /// Stops the thread and closes every hosted database.
    pub fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.thread.lock().drain(..) {
            let _ = t.join();
        }
        if let Some(h) = &self.host {
            h.close_all();
        }
        if let Some(r) = &self.replicas {
            r.close_all();
        }
    }

    /// The control plane, if this node runs it.
    pub fn control(&self) -> Result<&Arc<ControlPlane>, ControlError> {
        self.control.as_ref().ok_or(ControlError::NoHost)
    }

    pub fn runs_control_plane(&self) -> bool {
        self.control.is_some()
    }

    /// The fleet's gauges and counters, in Prometheus' text format.
    pub fn metrics_text(&self) -> String {
        use std::fmt::Write;
        use std::sync::atomic::Ordering::Relaxed;
        let mut t = String::new();
        let mut line = |name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(t, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        line(
            "walrelay_fleet_catalog_reads_on_query_path_total",
            "Catalog reads made while a query ran (must stay 0).",
            "counter",
            self.reads.on_query_path(),
        );
        line(
            "walrelay_fleet_catalog_reads_total",
            "Catalog reads by this node's control plane (creation, listing, heartbeats, limits).",
            "counter",
            self.reads.total(),
        );
        line(
            "walrelay_fleet_queries_total",
            "Queries to fleet databases received here.",
            "counter",
            self.stats.queries.load(Relaxed),
        );
        line(
            "walrelay_fleet_heartbeats_total",
            "Heartbeats sent by this node's databases.",
            "counter",
            self.stats.heartbeats.load(Relaxed),
        );
        line(
            "walrelay_fleet_routes_repaired_total",
            "Routing entries a heartbeat found missing or stale and rewrote.",
            "counter",
            self.stats.routes_repaired.load(Relaxed),
        );
        line(
            "walrelay_fleet_routes",
            "Entries in this node's routing table.",
            "gauge",
            self.routes.len() as u64,
        );
        if let Some(h) = &self.host {
            line(
                "walrelay_fleet_hosted_databases",
                "Databases hosted here.",
                "gauge",
                h.hosted_count(),
            );
            line(
                "walrelay_fleet_open_databases",
                "Databases open here.",
                "gauge",
                h.open_ids().len() as u64,
            );
            line(
                "walrelay_fleet_max_open_databases",
                "The open-database cap.",
                "gauge",
                h.max_open() as u64,
            );
            line(
                "walrelay_fleet_evictions_total",
                "Databases closed to make room under the cap.",
                "counter",
                h.stats.evicted.load(Relaxed),
            );
            line(
                "walrelay_fleet_idle_closes_total",
                "Databases closed after their idle time.",
                "counter",
                h.stats.closed_idle.load(Relaxed),
            );
            if let Some(m) = h.replication_mux() {
                line(
                    "walrelay_fleet_replication_connections",
                    "Real replication connections (one per follower, shared by every database).",
                    "gauge",
                    m.connections as u64,
                );
                line(
                    "walrelay_fleet_replication_channels",
                    "Replication channels (one per open database and follower) on them.",
                    "gauge",
                    m.channels as u64,
                );
                line(
                    "walrelay_fleet_replication_dials_total",
                    "Real replication connections dialed.",
                    "counter",
                    m.dials,
                );
                line(
                    "walrelay_fleet_replication_refusals_total",
                    "Replication frames, sends and channels refused by the multiplexer.",
                    "counter",
                    m.refusals,
                );
            }
        }
        if let Some(c) = &self.control {
            let f = c.failover_stats();
            line(
                "walrelay_fleet_failover_nodes_failed_total",
                "Host nodes the failure detector declared dead.",
                "counter",
                f.nodes_failed.load(Relaxed),
            );
            line(
                "walrelay_fleet_failover_databases_moved_total",
                "Databases moved off dead nodes.",
                "counter",
                f.databases_moved.load(Relaxed),
            );
            line(
                "walrelay_fleet_failover_move_failures_total",
                "Failover moves that failed (retried).",
                "counter",
                f.move_failures.load(Relaxed),
            );
        }
        if let Some(h) = &self.host {
            line(
                "walrelay_fleet_adopted_total",
                "Databases this node took over in a failover.",
                "counter",
                h.stats.adopted.load(Relaxed),
            );
            line(
                "walrelay_fleet_forgotten_total",
                "Databases this node gave up: they moved elsewhere.",
                "counter",
                h.stats.forgotten.load(Relaxed),
            );
        }
        if let Some(r) = &self.replicas {
            line(
                "walrelay_fleet_open_replicas",
                "Read replicas of fleet databases open here.",
                "gauge",
                r.open_count() as u64,
            );
            line(
                "walrelay_fleet_replicas_opened_total",
                "Read replicas opened (subscribed) here.",
                "counter",
                r.stats.opened.load(Relaxed),
            );
            line(
                "walrelay_fleet_replica_reads_total",
                "Fleet queries answered by a replica here.",
                "counter",
                self.stats.replica_reads.load(Relaxed),
            );
            if let Some(m) = r.mux_snapshot() {
                line(
                    "walrelay_fleet_replica_connections",
                    "Real connections of this node's replicas (one per primary node or follower, shared by every replica).",
                    "gauge",
                    m.connections as u64,
                );
                line(
                    "walrelay_fleet_replica_channels",
                    "Replica subscriptions and catch-ups open now, each a channel.",
                    "gauge",
                    m.channels as u64,
                );
            }
            line(
                "walrelay_fleet_replica_leader_moves_total",
                "Times a replica followed its primary to a new address.",
                "counter",
                r.stats.leader_moves.load(Relaxed),
            );
        }
        t
    }

    /// Internal calls to other nodes.
    pub fn internal(&self) -> &link::Internal {
        &self.internal
    }

    /// Internal calls bounded by [`link::LOCATE_TIMEOUT_MS`].
    pub fn locate_internal(&self) -> &link::Internal {
        &self.locate_internal
    }

    /// Asks the control plane (here or on its node) about a database.
    pub fn heartbeat(
        &self,
        beat: &control::Heartbeat,
    ) -> Result<control::HeartbeatAnswer, ControlError> {
        match (&self.control, &self.config.control_url) {
            (Some(c), _) => c.heartbeat(beat),
            (None, Some(url)) => link::remote_heartbeat(&self.internal, url, beat),
            (None, None) => Err(ControlError::NoHost),
        }
    }

    /// Sends this tick's report (usage, changed sizes) to the control
    /// plane and takes the limit cache's keys from its answer.
    pub fn send_report(&self) {
        let report = self.metering.collect(self.host.as_deref());
        let answer = match (&self.control, &self.config.control_url) {
            (Some(c), _) => c.report(&report),
            (None, Some(url)) => self
                .internal
                .post(url, "/internal/fleet/report", &report)
                .map_err(|e| ControlError::Unreachable(e.to_string())),
            (None, None) => return,
        };
        match answer {
            Ok(a) => self.metering.apply(&a),
            // An empty report only fetches the limit keys: its failure
            // (the control plane starting, or away) loses nothing.
            Err(e) if report.sizes.is_empty() && report.usage.is_empty() => {
                tracing::debug!(error = %e, "the limit keys were not fetched; asked again next tick");
            }
            Err(e) => {
                tracing::warn!(error = %e, "the usage report was not delivered; it is sent again");
                self.metering.undelivered(report);
            }
        }
    }

    /// Sends this node's queued routing changes to every other node; a
    /// node that did not take them gets them again with the databases'
    /// next heartbeats.
    pub fn send_routes(&self) -> usize {
        let changes = self.routes.take_outbox();
        if changes.is_empty() || self.config.peers.is_empty() {
            return 0;
        }
        // To every peer at once, each call bounded: a hung peer delays
        // this round by at most the timeout, and no other peer waits for it.
        let internal = &self.routes_internal;
        std::thread::scope(|scope| {
            for peer in &self.config.peers {
                let changes = &changes;
                scope.spawn(move || {
                    for chunk in changes.chunks(10_000) {
                        if let Err(e) = link::send_routes(internal, peer, chunk) {
                            tracing::warn!(peer, error = %e, "routing entries not sent (heartbeats resend them)");
                            return;
                        }
                    }
                });
            }
        });
        changes.len()
    }

    /// Finds a database by uuid or by name (in `account`), from the
    /// routing table alone.
    pub fn route(&self, name_or_uuid: &str, account: &AccountId) -> Result<Route, FleetError> {
        let found = match name_or_uuid.parse::<DatabaseUuid>() {
            Ok(uuid) => self.routes.get(uuid),
            Err(_) => DatabaseName::new(name_or_uuid)
                .ok()
                .and_then(|name| self.routes.by_name(account, &name)),
        };
        found.ok_or_else(|| FleetError::Unknown(name_or_uuid.chars().take(80).collect()))
    }

    /// The open database a route leads to, if this node hosts it.
    pub fn acquire(&self, route: &Route) -> Result<Arc<OpenDb>, FleetError> {
        if route.node != self.config.self_url {
            return Err(FleetError::Elsewhere(route.name.clone()));
        }
        let host = self
            .host
            .as_ref()
            .ok_or_else(|| FleetError::Elsewhere(route.name.clone()))?;
        let open = host.acquire(DatabaseId(route.database_id))?;
        let frozen = self.storage_over(open.id());
        if open.database().growth_frozen() != frozen {
            if let Err(e) = open.database().freeze_growth(frozen) {
                tracing::warn!(database = %open.id(), error = %e, "could not change the growth limit");
            }
        }
        // A stale route may lead to a later database's id with an old
        // uuid, or the reverse: the database's own record decides.
        if open.state.uuid != route.uuid {
            return Err(FleetError::Unknown(route.uuid.clone()));
        }
        Ok(open)
    }

    pub(crate) fn set_storage_over(&self, id: DatabaseId, over: bool) {
        {
            let mut set = self.storage_over.lock();
            if over {
                set.insert(id);
            } else {
                set.remove(&id);
            }
        }
        // An open database applies it now; one opened later on acquire.
        if let Some(host) = &self.host {
            if let Some(open) = host
                .open_ids()
                .contains(&id)
                .then(|| host.acquire(id).ok())
                .flatten()
            {
                if let Err(e) = open.database().freeze_growth(over) {
                    tracing::warn!(database = %id, error = %e, "could not change the growth limit");
                }
            }
        }
    }

    /// Whether `id`'s account was over its storage limit at its last
    /// heartbeat.
    pub fn storage_over(&self, id: DatabaseId) -> bool {
        self.storage_over.lock().contains(&id)
    }
}

/// The control plane's handle on a host in the same process.
#[derive(Debug)]
pub struct LocalHostApi {
    pub host: Arc<Host>,
    pub routes: Arc<Routes>,
    pub self_url: String,
}

impl HostApi for LocalHostApi {
    fn init(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError> {
        self.host.init(uuid, id, account, name).map(|_| ())
    }

    fn activate(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError> {
        let state = self.host.activate(id)?;
        self.publish(uuid, id, state)
    }

    fn adopt(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError> {
        let state = self.host.adopt(uuid, id, account, name)?;
        self.publish(uuid, id, state)
    }

    fn delete(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError> {
        self.host.delete(id)?;
        self.routes
            .unpublish(uuid, id)
            .map_err(|e| HostError::State {
                id,
                reason: e.to_string(),
            })?;
        Ok(())
    }
}

impl LocalHostApi {
    /// An active database writes its own routing entry.
    fn publish(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        state: host::HostedState,
    ) -> Result<(), HostError> {
        if state.lifecycle != host::Lifecycle::Active {
            return Ok(());
        }
        self.routes
            .publish(Route {
                uuid: uuid.to_string(),
                database_id: id.0,
                account: state.account,
                name: state.name,
                node: self.self_url.clone(),
                written_at_ms: catalog::now_ms(),
            })
            .map_err(|e| HostError::State {
                id,
                reason: e.to_string(),
            })
    }
}
