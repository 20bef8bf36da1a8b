//! A one-node fleet in this process: an embedded catalog, a host, the
//! control plane and the routing table, with hooks to inject faults.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use walrelay_engine::fleet::catalog::{
    AccountLimits, Catalog, CatalogError, CatalogReads, DatabaseRow, Page, SqliteCatalog,
};
use walrelay_engine::fleet::control::{ControlConfig, ControlPlane, HostApi, HostNode};
use walrelay_engine::fleet::host::{Host, HostConfig, HostError, LocalOpener};
use walrelay_engine::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use walrelay_engine::fleet::routes::Routes;
use walrelay_engine::fleet::{Fleet, FleetConfig, LocalHostApi};
use walrelay_engine::{Database, Options};
use walrelay_replicator::DatabaseId;

pub const NODE_URL: &str = "http://fleet-node.test";

/// A catalog whose next `fail_inserts` inserts fail (after the host was
/// initialised: the orphan case).
#[derive(Debug)]
pub struct FaultyCatalog {
    pub inner: Arc<dyn Catalog>,
    pub fail_inserts: AtomicU32,
}

impl Catalog for FaultyCatalog {
    fn insert(&self, row: &DatabaseRow, max: u64) -> Result<(), CatalogError> {
        if self
            .fail_inserts
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(CatalogError::Injected);
        }
        self.inner.insert(row, max)
    }
    fn get(&self, uuid: DatabaseUuid) -> Result<Option<DatabaseRow>, CatalogError> {
        self.inner.get(uuid)
    }
    fn by_name(
        &self,
        a: &AccountId,
        n: &DatabaseName,
    ) -> Result<Option<DatabaseRow>, CatalogError> {
        self.inner.by_name(a, n)
    }
    fn list(&self, a: &AccountId, p: Option<&str>, o: u64, n: u64) -> Result<Page, CatalogError> {
        self.inner.list(a, p, o, n)
    }
    fn mark_deleted(&self, uuid: DatabaseUuid, at: i64) -> Result<bool, CatalogError> {
        self.inner.mark_deleted(uuid, at)
    }
    fn account(&self, a: &AccountId) -> Result<AccountLimits, CatalogError> {
        self.inner.account(a)
    }
    fn set_account(&self, l: &AccountLimits) -> Result<(), CatalogError> {
        self.inner.set_account(l)
    }
    fn write_sizes(&self, s: &[(DatabaseUuid, AccountId, u64)]) -> Result<(), CatalogError> {
        self.inner.write_sizes(s)
    }
    fn fold_size_deltas(&self) -> Result<u64, CatalogError> {
        self.inner.fold_size_deltas()
    }
    fn account_storage_bytes(&self, a: &AccountId) -> Result<u64, CatalogError> {
        self.inner.account_storage_bytes(a)
    }
}

/// A host API whose activations and deletions can be made to fail (the
/// best-effort steps).
#[derive(Debug)]
pub struct FlakyHostApi {
    pub inner: LocalHostApi,
    pub fail_activate: AtomicU32,
    pub fail_delete: AtomicU32,
}

fn take(n: &AtomicU32) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl HostApi for FlakyHostApi {
    fn init(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        a: &AccountId,
        n: &DatabaseName,
    ) -> Result<(), HostError> {
        self.inner.init(uuid, id, a, n)
    }
    fn activate(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError> {
        if take(&self.fail_activate) {
            return Err(HostError::NotHosted(id));
        }
        self.inner.activate(uuid, id)
    }
    fn delete(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError> {
        if take(&self.fail_delete) {
            return Err(HostError::NotHosted(id));
        }
        self.inner.delete(uuid, id)
    }
}

/// The pieces of a one-node fleet.
pub struct OneNode {
    pub fleet: Arc<Fleet>,
    pub control: Arc<ControlPlane>,
    pub host: Arc<Host>,
    pub routes: Arc<Routes>,
    pub catalog: Arc<FaultyCatalog>,
    pub api: Arc<FlakyHostApi>,
    pub reads: Arc<CatalogReads>,
}

/// A one-node fleet under `dir` with heartbeats every `heartbeat_ms`
/// (driven by the test through `heartbeat::beat_due`, not a thread).
pub fn one_node(dir: &Path, max_open: usize, idle_close_ms: u64, heartbeat_ms: u64) -> OneNode {
    one_node_at(NODE_URL, dir, max_open, idle_close_ms, heartbeat_ms)
}

/// [`one_node`] whose routing entries name `url`.
pub fn one_node_at(
    url: &str,
    dir: &Path,
    max_open: usize,
    idle_close_ms: u64,
    heartbeat_ms: u64,
) -> OneNode {
    let reads = Arc::new(CatalogReads::default());
    let catalog_db =
        Database::open(dir.join("catalog.db"), Options::default()).expect("catalog opens");
    let sqlite: Arc<dyn Catalog> =
        Arc::new(SqliteCatalog::open(catalog_db, Arc::clone(&reads)).expect("catalog schema"));
    let catalog = Arc::new(FaultyCatalog {
        inner: sqlite,
        fail_inserts: AtomicU32::new(0),
    });
    let routes = Arc::new(Routes::open(&dir.join("routes.db")).expect("routes open"));
    let host = Arc::new(
        Host::open(
            HostConfig {
                dir: dir.join("dbs"),
                max_open,
                idle_close_ms,
                max_hosted: 1_000_000,
            },
            Box::new(LocalOpener {
                options: Options {
                    readers: 1,
                    ..Options::default()
                },
            }),
        )
        .expect("host opens"),
    );
    let api = Arc::new(FlakyHostApi {
        inner: LocalHostApi {
            host: Arc::clone(&host),
            routes: Arc::clone(&routes),
            self_url: url.into(),
        },
        fail_activate: AtomicU32::new(0),
        fail_delete: AtomicU32::new(0),
    });
    let control = Arc::new(ControlPlane::new(
        Arc::clone(&catalog) as Arc<dyn Catalog>,
        vec![HostNode {
            url: url.into(),
            location: "local".into(),
            api: Arc::clone(&api) as Arc<dyn HostApi>,
        }],
        ControlConfig::default(),
    ));
    let mut config = FleetConfig::new(url.into());
    config.heartbeat_ms = heartbeat_ms;
    config.heartbeat_jitter_ms = 1;
    let fleet = Arc::new(Fleet::new(
        config,
        Arc::clone(&routes),
        Some(Arc::clone(&host)),
        Some(Arc::clone(&control)),
        Arc::clone(&reads),
    ));
    OneNode {
        fleet,
        control,
        host,
        routes,
        catalog,
        api,
        reads,
    }
}
