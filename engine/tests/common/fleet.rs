//! A one-node fleet in this process: an embedded catalog, a host, the
//! control plane and the routing table, with hooks to inject faults.

use serde_json::{Value as Json, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use walrelay_engine::fleet::catalog::{
    AccountLimits, Catalog, CatalogError, CatalogReads, DatabaseRow, Page, SqliteCatalog,
};
use walrelay_engine::fleet::control::{
    ControlConfig, ControlPlane, HostApi, HostNode, LimitsService,
};
use walrelay_engine::fleet::host::{Host, HostConfig, HostError, LocalOpener};
use walrelay_engine::fleet::link::InternalAuth;
use walrelay_engine::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use walrelay_engine::fleet::routes::Routes;
use walrelay_engine::fleet::{Fleet, FleetConfig, LocalHostApi};
use walrelay_engine::http::auth::{ApiToken, Auth, Permission, Scope};
use walrelay_engine::http::server::{HttpConfig, HttpServer, Node, Role, serve};
use walrelay_engine::http::token_store::{self, TokenStore};
use walrelay_engine::{Database, Options};
use walrelay_replicator::DatabaseId;

pub const NODE_URL: &str = "http://fleet-node.test";

/// The cluster key of every test fleet.
pub fn test_cluster_key() -> walrelay_engine::ClusterKey {
    walrelay_engine::ClusterKey::from_bytes([7; 32])
}

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
    fn on_node(
        &self,
        node: &str,
        after: Option<DatabaseUuid>,
        limit: u64,
    ) -> Result<Vec<DatabaseRow>, CatalogError> {
        self.inner.on_node(node, after, limit)
    }
    fn set_node(&self, uuid: DatabaseUuid, node: &str) -> Result<bool, CatalogError> {
        self.inner.set_node(uuid, node)
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
    fn adopt(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        a: &AccountId,
        n: &DatabaseName,
    ) -> Result<(), HostError> {
        self.inner.adopt(uuid, id, a, n)
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
    one_node_tuned(
        url,
        dir,
        Tuning {
            max_open,
            idle_close_ms,
            heartbeat_ms,
            limits: false,
        },
    )
}

/// How a test's one-node fleet runs.
pub struct Tuning {
    pub max_open: usize,
    pub idle_close_ms: u64,
    pub heartbeat_ms: u64,
    /// Runs the limit pipeline with intervals of tens of milliseconds.
    pub limits: bool,
}

/// A one-node fleet with every knob.
pub fn one_node_tuned(url: &str, dir: &Path, t: Tuning) -> OneNode {
    let Tuning {
        max_open,
        idle_close_ms,
        heartbeat_ms,
        limits,
    } = t;
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
        if limits {
            ControlConfig {
                account_cache_bucket_ms: 100,
                ..ControlConfig::default()
            }
        } else {
            ControlConfig::default()
        },
    ));
    let control = if limits {
        let mut service = LimitsService::open(&dir.join("limits")).expect("limits open");
        service.consumers = 1;
        service.fold_ms = 50;
        service.limiter_ms = 100;
        Arc::new(
            Arc::try_unwrap(control)
                .expect("not shared yet")
                .with_limits(service),
        )
    } else {
        control
    };
    let mut config = FleetConfig::new(url.into());
    config.heartbeat_ms = heartbeat_ms;
    config.heartbeat_jitter_ms = 1;
    config.orphan_grace_ms = heartbeat_ms;
    config.tick_ms = 20;
    // Internal calls need the (test) cluster key's proof.
    config.auth = InternalAuth::new(Some(&test_cluster_key()));
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

/// A one-node fleet behind a node's HTTP API, with tokens of each kind.
pub struct HttpFleet {
    pub node: OneNode,
    pub server: Option<HttpServer>,
    pub url: String,
    pub admin: ApiToken,
    pub reader: ApiToken,
    pub scoped: ApiToken,
    /// Read-write for the fleet database named `shop` only.
    pub shop: ApiToken,
    agent: ureq::Agent,
    _dir: tempfile::TempDir,
}

/// A JSON answer.
pub struct Reply {
    pub status: u16,
    pub json: Json,
}

impl HttpFleet {
    /// Starts it (`tuning.limits` also starts the fleet's threads).
    pub fn start(tuning: Tuning) -> HttpFleet {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        let admin = token_store::create(&tokens, Scope::All, Permission::ReadWrite).unwrap();
        let reader = token_store::create(&tokens, Scope::All, Permission::Read).unwrap();
        let scoped = token_store::create(
            &tokens,
            Scope::Database("main".into()),
            Permission::ReadWrite,
        )
        .unwrap();
        let shop = token_store::create(
            &tokens,
            Scope::Database("shop".into()),
            Permission::ReadWrite,
        )
        .unwrap();
        let addr = super::free_port();
        let url = format!("http://{addr}");
        let threads = tuning.limits;
        let node = one_node_tuned(&url, dir.path(), tuning);
        if threads {
            node.fleet.start();
        }
        let main = Database::open(dir.path().join("main.db"), Options::default()).unwrap();
        let http = Node::new(
            Role::Primary(main),
            HttpConfig::default(),
            Auth::Tokens(Arc::new(TokenStore::open(&tokens).unwrap())),
        )
        .with_fleet(Arc::clone(&node.fleet));
        let server = serve(Arc::new(http), addr).unwrap();
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        HttpFleet {
            _dir: dir,
            node,
            server: Some(server),
            url,
            admin,
            reader,
            scoped,
            shop,
            agent,
        }
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&ApiToken>,
        body: Option<&str>,
    ) -> Reply {
        let url = format!("{}{path}", self.url);
        let auth = token.map(|t| t.bearer()).unwrap_or_default();
        let resp = match method {
            "POST" => self
                .agent
                .post(&url)
                .header("authorization", &auth)
                .send(body.unwrap_or("").as_bytes()),
            "DELETE" => self
                .agent
                .delete(&url)
                .header("authorization", &auth)
                .call(),
            _ => self.agent.get(&url).header("authorization", &auth).call(),
        };
        let mut resp = resp.expect("the node answers");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap();
        let json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        Reply { status, json }
    }

    /// POSTs `body` to `path` with `headers` only (no token).
    pub fn post_with(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        // Its own connection: a refused oversized body leaves the one it
        // was cut off on unusable.
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(30)))
            .http_status_as_error(false)
            .build()
            .new_agent();
        let mut req = agent.post(format!("{}{path}", self.url));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        // A refused oversized body may be cut off while it is sent: status 0.
        let Ok(mut resp) = req.send(body.as_bytes()) else {
            return Reply {
                status: 0,
                json: Json::Null,
            };
        };
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Json::String(text));
        Reply { status, json }
    }

    pub fn admin(&self, method: &str, path: &str, body: Option<Json>) -> Reply {
        let body = body.map(|b| b.to_string());
        self.call(method, path, Some(&self.admin), body.as_deref())
    }

    pub fn query(&self, db: &str, sql: &str) -> Reply {
        self.admin(
            "POST",
            &format!("/v1/databases/{db}/query"),
            Some(json!({ "sql": sql })),
        )
    }
}

impl Drop for HttpFleet {
    fn drop(&mut self) {
        self.server.take();
        self.node.fleet.stop();
    }
}

/// A host whose databases replicate to `followers` real follower
/// processes (each hosting many databases), as a fleet node's do.
pub struct ReplicatedHost {
    pub host: Arc<Host>,
    _followers: Vec<super::procs::Proc>,
}

impl ReplicatedHost {
    pub fn start(dir: &Path, followers: usize, max_open: usize, idle_close_ms: u64) -> Self {
        let (key_path, key) = super::procs::cluster_key_file(dir);
        let (procs, addrs) = super::procs::spawn_followers(dir, followers, &key_path);
        let mut template =
            walrelay_engine::replication::PrimaryConfig::new(dir.join("unused"), addrs, Some(key));
        template.backend = walrelay_replicator::net::Backend::Std;
        let host = Host::open(
            HostConfig {
                dir: dir.join("dbs"),
                max_open,
                idle_close_ms,
                max_hosted: 100,
            },
            Box::new(walrelay_engine::fleet::host::ReplicatedOpener::new(
                template, 5_000,
            )),
        )
        .expect("host");
        ReplicatedHost {
            host: Arc::new(host),
            _followers: procs,
        }
    }

    /// Initialises and activates a database per id, named `{prefix}{i}`.
    pub fn add(&self, ids: &[DatabaseId], prefix: &str) {
        for (i, id) in ids.iter().enumerate() {
            self.host
                .init(
                    DatabaseUuid::random(),
                    *id,
                    &AccountId::default_account(),
                    &DatabaseName::new(&format!("{prefix}{i}")).expect("name"),
                )
                .expect("init");
            self.host.activate(*id).expect("activate");
        }
    }
}
