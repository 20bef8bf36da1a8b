//! A whole cluster in one process, each node with its HTTP endpoint on
//! loopback: five followers, a primary and replicas in named regions. For
//! tests, benchmarks and embedding; `walrelay up` runs the same roles as
//! separate processes.
//!
//! Authentication is on unless the config says `insecure`: the cluster
//! keeps a token store at `<dir>/tokens` with one admin token (all
//! databases, read-write), which [`LocalCluster::client`] sends.
//! Replication is always authenticated, with a fresh cluster key held in
//! memory only.

use crate::http::auth::{ApiToken, Auth, Permission, Scope};
use crate::http::client::{Client, NodeInfo};
use crate::http::server::{HttpConfig, HttpServer, Node, Role, serve};
use crate::http::token_store::{self, StoreError, TokenStore};
use crate::replica::ReplicaOptions;
use crate::replication::{
    PrimaryConfig, PrimaryError, ReplicaConfig, ReplicatedPrimary, ReplicatedReplica,
};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use walrelay_replicator::net::Backend;
use walrelay_replicator::node::follower::{FollowerNode, FollowerNodeConfig};
use walrelay_replicator::{ClusterKey, DatabaseId};

/// How to build a local cluster.
#[derive(Debug, Clone)]
pub struct LocalClusterConfig {
    pub followers: usize,
    pub primary_region: String,
    /// One replica per entry, in that region.
    pub replica_regions: Vec<String>,
    /// Injected replication delay on every replica (ms).
    pub replica_delay_ms: u64,
    /// How long a replica read waits for a session's bookmark before the
    /// primary serves it.
    pub replica_max_wait_ms: u64,
    /// How long a write waits for its confirmation before failing (the
    /// primary's `confirm_timeout_ms`).
    pub confirm_timeout_ms: u64,
    pub http: HttpConfig,
    /// What one query may cost, on the primary and every replica.
    pub limits: crate::limits::Limits,
    /// Serve HTTP without authentication.
    pub insecure: bool,
    /// Cold storage: every follower runs an uploader (this configuration,
    /// with its own rank and scratch directory), the primary rebuilds and
    /// time-travels from it, replicas bootstrap from it. None: none.
    pub archive: Option<(walrelay_archive::Store, walrelay_archive::ArchiverConfig)>,
}

/// Why a local cluster did not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalClusterError {
    #[error(transparent)]
    Start(#[from] PrimaryError),
    #[error(transparent)]
    Tokens(#[from] StoreError),
}

impl Default for LocalClusterConfig {
    fn default() -> LocalClusterConfig {
        LocalClusterConfig {
            followers: 5,
            primary_region: "primary-region".into(),
            replica_regions: vec!["region-a".into(), "region-b".into()],
            replica_delay_ms: 0,
            replica_max_wait_ms: 1_000,
            confirm_timeout_ms: PrimaryConfig::DEFAULT_CONFIRM_TIMEOUT_MS,
            http: HttpConfig::default(),
            limits: crate::limits::Limits::default(),
            insecure: false,
            archive: None,
        }
    }
}

/// A running cluster. Dropping it stops the HTTP servers; the replication
/// threads end with the process.
pub struct LocalCluster {
    pub primary: Arc<ReplicatedPrimary>,
    pub replicas: Vec<Arc<ReplicatedReplica>>,
    pub followers: Vec<Arc<FollowerNode>>,
    /// The followers' uploaders (with cold storage).
    pub uploaders: Vec<crate::archiving::Uploader>,
    pub primary_http: HttpServer,
    pub replica_http: Vec<HttpServer>,
    config: LocalClusterConfig,
    key: ClusterKey,
    /// The token store and its admin token (None when insecure).
    tokens: Option<(PathBuf, ApiToken)>,
}

impl std::fmt::Debug for LocalCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCluster")
            .field("primary", &self.primary_http.url())
            .field(
                "replicas",
                &self
                    .replica_http
                    .iter()
                    .map(|h| h.url())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

impl LocalCluster {
    /// The key every replication connection of the cluster authenticates
    /// with (for a node added by hand).
    pub fn cluster_key(&self) -> &ClusterKey {
        &self.key
    }

    /// Starts everything under `dir`.
    pub fn start(
        dir: &Path,
        config: LocalClusterConfig,
    ) -> Result<LocalCluster, LocalClusterError> {
        let io = |e: std::io::Error| PrimaryError::Replication(e.to_string());
        let (auth, tokens) = if config.insecure {
            (Auth::Insecure, None)
        } else {
            std::fs::create_dir_all(dir).map_err(io)?;
            let path = dir.join("tokens");
            let admin = token_store::create(&path, Scope::All, Permission::ReadWrite)?;
            let store = Arc::new(TokenStore::open(&path)?);
            (Auth::Tokens(store), Some((path, admin)))
        };
        let key = ClusterKey::generate().map_err(|e| PrimaryError::Replication(e.to_string()))?;
        let followers = (0..config.followers)
            .map(|i| {
                FollowerNode::start(FollowerNodeConfig {
                    database: DatabaseId(1),
                    listen: any_port(),
                    dir: dir.join(format!("follower-{i}")),
                    peers: vec![],
                    segment_bytes: 16 << 20,
                    backend: Backend::Auto,
                    auth: Some(key.clone()),
                    catch_up_batch_bytes: walrelay_replicator::node::follower::CATCH_UP_BATCH_BYTES,
                })
                .map(Arc::new)
                .map_err(|e| PrimaryError::Replication(e.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let store = config.archive.as_ref().map(|(s, _)| s.clone());
        let mut uploaders = Vec::new();
        if let Some((store, template)) = &config.archive {
            for (i, f) in followers.iter().enumerate() {
                let mut c = template.clone();
                c.rank = i as u32;
                c.work_dir = dir.join(format!("follower-{i}")).join("archive");
                uploaders.push(
                    crate::archiving::Uploader::start(Arc::clone(f), store.clone(), c)
                        .map_err(io)?,
                );
            }
        }
        let addrs: Vec<SocketAddr> = followers.iter().map(|f| f.addr()).collect();
        let mut pc = PrimaryConfig::new(dir.join("primary.db"), addrs.clone(), Some(key.clone()));
        pc.listen = Some(any_port());
        pc.confirm_timeout_ms = config.confirm_timeout_ms;
        pc.options.region = config.primary_region.clone();
        pc.options.limits = config.limits;
        pc.store = store.clone();
        let primary = Arc::new(ReplicatedPrimary::start(pc)?);
        let time_travel = store
            .clone()
            .map(|store| crate::http::time_travel::TimeTravelConfig {
                store,
                database: DatabaseId(1),
                work_dir: dir.join("time-travel"),
                archive_wait_ms: 30_000,
            });
        let primary_http = serve(
            Arc::new(Node::new(
                Role::Primary(primary.database().clone()),
                HttpConfig {
                    region: config.primary_region.clone(),
                    time_travel,
                    ..config.http.clone()
                },
                auth.clone(),
            )),
            any_port(),
        )
        .map_err(io)?;
        let mut replicas = Vec::new();
        let mut replica_http = Vec::new();
        for (i, region) in config.replica_regions.iter().enumerate() {
            let r = Arc::new(ReplicatedReplica::start(ReplicaConfig {
                store: store.clone(),
                mux: None,
                database: DatabaseId(1),
                path: dir.join(format!("replica-{i}.db")),
                leader: primary.replica_addr().ok_or_else(|| {
                    PrimaryError::Replication("the primary listens for no replicas".into())
                })?,
                followers: addrs.clone(),
                backend: Backend::Auto,
                auth: Some(key.clone()),
                options: ReplicaOptions {
                    region: region.clone(),
                    max_wait_ms: config.replica_max_wait_ms,
                    limits: config.limits,
                    ..ReplicaOptions::default()
                },
                delay_ms: config.replica_delay_ms,
            })?);
            let http = serve(
                Arc::new(Node::new(
                    Role::Replica {
                        replica: Arc::clone(&r),
                        primary_url: primary_http.url(),
                    },
                    HttpConfig {
                        region: region.clone(),
                        ..config.http.clone()
                    },
                    auth.clone(),
                )),
                any_port(),
            )
            .map_err(io)?;
            replicas.push(r);
            replica_http.push(http);
        }
        Ok(LocalCluster {
            primary,
            replicas,
            followers,
            uploaders,
            primary_http,
            replica_http,
            config,
            key,
            tokens,
        })
    }

    /// Every node, as a client sees them.
    pub fn nodes(&self) -> Vec<NodeInfo> {
        let mut nodes = vec![NodeInfo {
            url: self.primary_http.url(),
            region: self.config.primary_region.clone(),
            primary: true,
        }];
        for (h, region) in self.replica_http.iter().zip(&self.config.replica_regions) {
            nodes.push(NodeInfo {
                url: h.url(),
                region: region.clone(),
                primary: false,
            });
        }
        nodes
    }

    /// A client preferring `region`, with the admin token.
    pub fn client(&self, region: &str) -> Client {
        let client = Client::new(self.nodes(), region, &self.config.http.database);
        match self.admin_token() {
            Some(t) => client.with_token(t),
            None => client,
        }
    }

    /// The admin token (all databases, read-write); None when insecure.
    pub fn admin_token(&self) -> Option<&ApiToken> {
        self.tokens.as_ref().map(|(_, t)| t)
    }

    /// The token store every node checks; None when insecure.
    pub fn tokens_path(&self) -> Option<&Path> {
        self.tokens.as_ref().map(|(p, _)| p.as_path())
    }
}
