//! The control plane: creation, listing, deletion and heartbeats, over
//! the catalog.
//!
//! Creation follows D1's order. Every attempt takes a fresh uuid and a
//! fresh database id; the database is initialised on its host first
//! ([`HostApi::init`]), then its catalog row is written — the creation
//! checkpoint, from which on the database exists — and the whole sequence
//! is retried on failure. A last, best-effort activation tells the host it
//! is live, and the host writes its routing entry. An attempt that
//! initialised a database but failed to checkpoint it leaves an orphan,
//! which learns at its first heartbeat that the catalog does not know it
//! and marks itself deleted.

use super::catalog::{AccountLimits, Catalog, CatalogError, DatabaseRow, Page, now_ms};
use super::host::HostError;
use super::names::{AccountId, DatabaseName, DatabaseUuid};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use walrelay_replicator::DatabaseId;

/// What the control plane asks of a node that hosts databases.
pub trait HostApi: Send + Sync + fmt::Debug {
    /// Creation's first step.
    fn init(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError>;
    /// Best effort: the database is live; it writes its routing entry.
    fn activate(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError>;
    /// Best effort: the database was deleted.
    fn delete(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError>;
    /// Failover: take over a live database whose node is gone; it writes
    /// its routing entry.
    fn adopt(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError>;
    /// Whether the node answers (the failure detector's probe).
    fn ping(&self) -> Result<(), HostError> {
        Ok(())
    }
}

/// Where a database should live.
#[derive(Debug, Clone)]
pub struct HostNode {
    /// Its HTTP base URL, as routing entries name it.
    pub url: String,
    /// Its location, matched against `primary_location_hint`.
    pub location: String,
    pub api: Arc<dyn HostApi>,
}

/// Why a control-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("no node can host databases")]
    NoHost,
    #[error("database creation failed after {attempts} attempts: {last}")]
    CreateFailed { attempts: u32, last: String },
    #[error("no database {0}")]
    NotFound(String),
    #[error("the control plane is unreachable: {0}")]
    Unreachable(String),
}

/// A heartbeat's question: this database's object asking what it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Heartbeat {
    pub uuid: String,
    pub database_id: u64,
    pub node: String,
}

/// What a database is, as the catalog says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Active,
    /// Deleted, or never checkpointed (an orphan), or another creation
    /// attempt's database owns the uuid.
    Deleted,
}

/// A heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeartbeatAnswer {
    pub verdict: Verdict,
    /// The node the catalog places it on (its routing entry's target).
    pub node: String,
    /// Its account's storage is at or over the limit: writes that would
    /// grow the database are refused.
    pub storage_over: bool,
}

/// Control-plane settings.
#[derive(Debug, Clone)]
pub struct ControlConfig {
    /// Creation attempts, each with fresh ids.
    pub create_attempts: u32,
    /// Heartbeats read account totals through a cache keyed by account and
    /// a time bucket this long (D1's `dynamic_ttl`).
    pub account_cache_bucket_ms: u64,
    /// A host node that has not answered the failure detector's probe for
    /// this long is declared dead and its databases move ([`super::failover`]);
    /// 0: no failover.
    pub failover_after_ms: u64,
    /// How often every host node is probed.
    pub probe_ms: u64,
}

impl Default for ControlConfig {
    fn default() -> ControlConfig {
        ControlConfig {
            create_attempts: 5,
            account_cache_bucket_ms: 5_000,
            failover_after_ms: 0,
            probe_ms: 1_000,
        }
    }
}

/// The account facts heartbeats need, cached per (account, bucket).
#[derive(Debug, Clone, Copy)]
struct AccountFacts {
    storage_over: bool,
}

/// The control plane's limit pipeline: the size queue, the analytics
/// table and the limit cache ([`super::limits`]).
#[derive(Debug)]
pub struct LimitsService {
    pub queue: Box<dyn super::size_queue::SizeQueue>,
    pub analytics: super::limits::Analytics,
    pub keys: super::limits::LimitKeys,
    /// Consumer threads writing sizes to the catalog (capped, so a spike
    /// of reports cannot overload it).
    pub consumers: usize,
    /// Sizes per consumer batch.
    pub consumer_batch: usize,
    /// How often deltas are folded into account totals (D1: 1 s).
    pub fold_ms: u64,
    /// How often the limiter looks for accounts over their daily rows.
    pub limiter_ms: u64,
}

impl LimitsService {
    /// Opens the local queue and the analytics file in `dir`.
    pub fn open(dir: &std::path::Path) -> Result<LimitsService, super::limits::LimitsError> {
        LimitsService::open_with(dir, "local")
    }

    /// Opens the queue `size_queue` names (`local`: a file in `dir`; or a
    /// `redis://` broker, [`super::size_queue::open`]) and the analytics
    /// file in `dir`.
    pub fn open_with(
        dir: &std::path::Path,
        size_queue: &str,
    ) -> Result<LimitsService, super::limits::LimitsError> {
        std::fs::create_dir_all(dir).map_err(|e| {
            super::limits::LimitsError::Malformed(format!("{}: {e}", dir.display()))
        })?;
        Ok(LimitsService {
            queue: super::size_queue::open(size_queue, &dir.join("size-queue.db"))?,
            analytics: super::limits::Analytics::open(&dir.join("analytics.db"))?,
            keys: super::limits::LimitKeys::default(),
            consumers: 2,
            consumer_batch: 10_000,
            fold_ms: 1_000,
            limiter_ms: 10_000,
        })
    }
}

/// The control plane.
#[derive(Debug)]
pub struct ControlPlane {
    catalog: Arc<dyn Catalog>,
    hosts: Vec<HostNode>,
    config: ControlConfig,
    limits: Option<Arc<LimitsService>>,
    account_cache: Mutex<HashMap<(AccountId, i64), AccountFacts>>,
    next_host: std::sync::atomic::AtomicUsize,
    failover: super::failover::FailoverStats,
}

impl ControlPlane {
    pub fn new(catalog: Arc<dyn Catalog>, hosts: Vec<HostNode>, config: ControlConfig) -> Self {
        ControlPlane {
            catalog,
            hosts,
            config,
            account_cache: Mutex::new(HashMap::new()),
            next_host: Default::default(),
            limits: None,
            failover: Default::default(),
        }
    }

    /// The host nodes databases are placed on.
    pub fn hosts(&self) -> &[HostNode] {
        &self.hosts
    }

    pub fn failover_stats(&self) -> &super::failover::FailoverStats {
        &self.failover
    }

    /// Runs the limit pipeline too.
    pub fn with_limits(mut self, limits: LimitsService) -> ControlPlane {
        self.limits = Some(Arc::new(limits));
        self
    }

    pub fn limits(&self) -> Option<&Arc<LimitsService>> {
        self.limits.as_ref()
    }

    /// Takes a host node's report (sizes into the durable queue, usage
    /// into the analytics table) and answers with the limit cache's keys.
    pub fn report(
        &self,
        report: &super::limits::Report,
    ) -> Result<super::limits::ReportAnswer, ControlError> {
        let Some(l) = &self.limits else {
            return Ok(super::limits::ReportAnswer::default());
        };
        let failed = |e: super::limits::LimitsError| ControlError::Unreachable(e.to_string());
        if !report.sizes.is_empty() {
            l.queue.push(&report.sizes).map_err(failed)?;
        }
        if !report.usage.is_empty() {
            l.analytics.insert(&report.usage).map_err(failed)?;
        }
        Ok(super::limits::ReportAnswer {
            blocked: l.keys.live(),
        })
    }

    /// Starts the limit jobs (consumers, the fold, the limiter) until
    /// `stop` is set.
    pub fn start_jobs(
        self: &Arc<Self>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> Vec<std::thread::JoinHandle<()>> {
        use std::sync::atomic::Ordering::Relaxed;
        use std::time::Duration;
        let mut threads = Vec::new();
        if self.config.failover_after_ms > 0 {
            let (cp, stop) = (Arc::clone(self), Arc::clone(&stop));
            let probe = Duration::from_millis(self.config.probe_ms.max(1));
            let after = Duration::from_millis(self.config.failover_after_ms);
            threads.push(
                std::thread::Builder::new()
                    .name("walrelay-failover".into())
                    .spawn(move || super::failover::run(cp, probe, after, stop))
                    .expect("spawning the failure detector"),
            );
        }
        let Some(l) = self.limits.clone() else {
            return threads;
        };
        for i in 0..l.consumers.max(1) {
            let (cp, l, stop) = (Arc::clone(self), Arc::clone(&l), Arc::clone(&stop));
            threads.push(
                std::thread::Builder::new()
                    .name(format!("walrelay-sizes-{i}"))
                    .spawn(move || {
                        while !stop.load(Relaxed) {
                            match super::limits::consume(
                                l.queue.as_ref(),
                                cp.catalog.as_ref(),
                                l.consumer_batch,
                            ) {
                                Ok(0) => std::thread::sleep(Duration::from_millis(50)),
                                Ok(_) => {}
                                Err(e) => {
                                    tracing::warn!(error = %e, "size consumer failed");
                                    std::thread::sleep(Duration::from_millis(500));
                                }
                            }
                        }
                    })
                    .expect("spawning a size consumer"),
            );
        }
        let (cp, jl, jstop) = (Arc::clone(self), Arc::clone(&l), Arc::clone(&stop));
        threads.push(
            std::thread::Builder::new()
                .name("walrelay-limits".into())
                .spawn(move || {
                    let mut next_fold = std::time::Instant::now();
                    let mut next_limiter = std::time::Instant::now();
                    while !jstop.load(Relaxed) {
                        let now = std::time::Instant::now();
                        if now >= next_fold {
                            next_fold = now + Duration::from_millis(jl.fold_ms.max(1));
                            if let Err(e) = cp.catalog.fold_size_deltas() {
                                tracing::warn!(error = %e, "folding size deltas failed");
                            }
                        }
                        if now >= next_limiter {
                            next_limiter = now + Duration::from_millis(jl.limiter_ms.max(1));
                            if let Err(e) = super::limits::Limiter::run_once(
                                &jl.analytics,
                                cp.catalog.as_ref(),
                                &jl.keys,
                            ) {
                                tracing::warn!(error = %e, "the limiter failed");
                            }
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
                .expect("spawning the limit jobs"),
        );
        threads
    }

    pub fn catalog(&self) -> &Arc<dyn Catalog> {
        &self.catalog
    }

    /// Placement: a node in the hinted location if there is one, otherwise
    /// the next node in turn.
    fn place(&self, hint: Option<&str>) -> Result<&HostNode, ControlError> {
        if self.hosts.is_empty() {
            return Err(ControlError::NoHost);
        }
        if let Some(h) = hint.filter(|h| !h.is_empty()) {
            let matching: Vec<&HostNode> = self.hosts.iter().filter(|n| n.location == h).collect();
            if !matching.is_empty() {
                let i = self
                    .next_host
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok(matching[i % matching.len()]);
            }
        }
        let i = self
            .next_host
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(&self.hosts[i % self.hosts.len()])
    }

    fn host(&self, url: &str) -> Option<&HostNode> {
        self.hosts.iter().find(|h| h.url == url)
    }

    /// Creates a database (see the module doc for the order of steps).
    pub fn create(
        &self,
        account: &AccountId,
        name: &DatabaseName,
        location_hint: Option<&str>,
    ) -> Result<DatabaseRow, ControlError> {
        let limits = self.catalog.account(account)?;
        // A cheap early refusal, so that the common mistake leaves no
        // orphan behind; the checkpoint's unique index is what decides.
        if self.catalog.by_name(account, name)?.is_some() {
            return Err(CatalogError::NameTaken(name.to_string()).into());
        }
        let mut last = String::new();
        for attempt in 1..=self.config.create_attempts.max(1) {
            let node = self.place(location_hint)?;
            // Fresh ids every attempt: a failed attempt's object can never
            // believe it owns the database a later attempt created.
            let uuid = DatabaseUuid::random();
            let id = fresh_database_id();
            if let Err(e) = node.api.init(uuid, id, account, name) {
                tracing::warn!(attempt, %uuid, database = %id, error = %e, "create: init failed");
                last = e.to_string();
                continue;
            }
            let row = DatabaseRow {
                uuid,
                database_id: id,
                account: account.clone(),
                name: name.clone(),
                node: node.url.clone(),
                location: location_hint.unwrap_or("").to_string(),
                created_at_ms: now_ms(),
                deleted_at_ms: None,
            };
            match self.catalog.insert(&row, limits.max_databases) {
                Ok(()) => {
                    if let Err(e) = node.api.activate(uuid, id) {
                        // Its heartbeat activates it.
                        tracing::warn!(%uuid, error = %e, "create: activation failed (heartbeat repairs)");
                    }
                    tracing::info!(%uuid, database = %id, %account, %name, node = %node.url, attempt, "database created");
                    return Ok(row);
                }
                Err(e @ (CatalogError::NameTaken(_) | CatalogError::TooManyDatabases(_))) => {
                    // Not retried: the orphan left behind is told so by
                    // its heartbeat.
                    return Err(e.into());
                }
                Err(e) => {
                    tracing::warn!(attempt, %uuid, database = %id, error = %e, "create: checkpoint failed; retrying with fresh ids");
                    last = e.to_string();
                }
            }
        }
        Err(ControlError::CreateFailed {
            attempts: self.config.create_attempts.max(1),
            last,
        })
    }

    /// A live database by uuid.
    pub fn get(&self, uuid: DatabaseUuid) -> Result<DatabaseRow, ControlError> {
        match self.catalog.get(uuid)? {
            Some(row) if row.deleted_at_ms.is_none() => Ok(row),
            _ => Err(ControlError::NotFound(uuid.to_string())),
        }
    }

    /// A live database by account and name.
    pub fn by_name(
        &self,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<DatabaseRow, ControlError> {
        self.catalog
            .by_name(account, name)?
            .ok_or_else(|| ControlError::NotFound(name.to_string()))
    }

    pub fn list(
        &self,
        account: &AccountId,
        name_prefix: Option<&str>,
        page: u64,
        per_page: u64,
    ) -> Result<Page, ControlError> {
        let offset = page.saturating_sub(1).saturating_mul(per_page);
        Ok(self.catalog.list(account, name_prefix, offset, per_page)?)
    }

    /// Deletes a database: the catalog first (from then on it is deleted),
    /// then, best effort, its host (a heartbeat repairs a failure).
    pub fn delete(&self, uuid: DatabaseUuid) -> Result<DatabaseRow, ControlError> {
        let row = self.get(uuid)?;
        if !self.catalog.mark_deleted(uuid, now_ms())? {
            return Err(ControlError::NotFound(uuid.to_string()));
        }
        if let Some(host) = self.host(&row.node) {
            if let Err(e) = host.api.delete(uuid, row.database_id) {
                tracing::warn!(%uuid, error = %e, "delete: the host was not told (heartbeat repairs)");
            }
        }
        tracing::info!(%uuid, database = %row.database_id, "database deleted");
        Ok(row)
    }

    /// Answers a database's heartbeat.
    pub fn heartbeat(&self, beat: &Heartbeat) -> Result<HeartbeatAnswer, ControlError> {
        let deleted = HeartbeatAnswer {
            verdict: Verdict::Deleted,
            node: beat.node.clone(),
            storage_over: false,
        };
        let Ok(uuid) = beat.uuid.parse::<DatabaseUuid>() else {
            return Ok(deleted);
        };
        let Some(row) = self.catalog.get(uuid)? else {
            return Ok(deleted);
        };
        if row.deleted_at_ms.is_some() || row.database_id.0 != beat.database_id {
            return Ok(deleted);
        }
        let facts = self.account_facts(&row.account)?;
        Ok(HeartbeatAnswer {
            verdict: Verdict::Active,
            node: row.node,
            storage_over: facts.storage_over,
        })
    }

    /// An account's facts through the (account, time bucket) cache: every
    /// database of an account shares one answer per bucket.
    fn account_facts(&self, account: &AccountId) -> Result<AccountFacts, ControlError> {
        let bucket = now_ms() / self.config.account_cache_bucket_ms.max(1) as i64;
        let key = (account.clone(), bucket);
        if let Some(f) = self.account_cache.lock().get(&key) {
            return Ok(*f);
        }
        let limits: AccountLimits = self.catalog.account(account)?;
        let used = self.catalog.account_storage_bytes(account)?;
        let facts = AccountFacts {
            storage_over: used >= limits.max_storage_bytes,
        };
        let mut cache = self.account_cache.lock();
        cache.retain(|(_, b), _| *b >= bucket);
        cache.insert(key, facts);
        Ok(facts)
    }
}

/// A random database id, never below 16: small ids are reserved (1 is
/// `main`'s in `walrelay up`, 2 the embedded catalog's).
pub fn fresh_database_id() -> DatabaseId {
    loop {
        let id = getrandom::u64().expect("the OS random source works") >> 1;
        if id >= 16 {
            return DatabaseId(id);
        }
    }
}
