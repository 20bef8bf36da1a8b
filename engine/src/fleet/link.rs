//! Calls between a fleet's nodes, over their HTTP ports: the control
//! plane asking a host to init, activate or delete a database, a host's
//! databases sending heartbeats, and routing entries sent to every node.
//! This module owns the wire format of these calls.
//!
//! ```text
//! every request carries  x-walrelay-node: <64 hex digits>
//!     BLAKE3 derive_key("walrelay 2026-11 internal http", cluster key): a
//!     node without the cluster key cannot call (none is asked for when
//!     the cluster runs without one, --insecure-replication)
//! POST /internal/fleet/init       {"uuid":"…","database_id":n,"account":"…","name":"…"}
//! POST /internal/fleet/adopt      {"uuid":"…","database_id":n,"account":"…","name":"…"}
//!     (failover: host a live database whose node is gone)
//! POST /internal/fleet/ping       {}  (the control plane's failure detector)
//! POST /internal/fleet/activate   {"uuid":"…","database_id":n}
//! POST /internal/fleet/delete     {"uuid":"…","database_id":n}
//!     200 {} | 4xx/5xx {"error":"…"}
//! POST /internal/fleet/heartbeat  {"uuid":"…","database_id":n,"node":"http://…"}
//!     200 {"verdict":"active"|"deleted","node":"http://…","storage_over":bool}
//! POST /internal/fleet/routes     [{"op":"put","route":{…}} | {"op":"remove","uuid":"…","database_id":n}, …]
//!     200 {"changed": n}
//! POST /internal/fleet/replication {"uuid":"…","database_id":n,"open":bool}
//!     200 {"leader":"ip:port"|null,"at":"bookmark"|null}: where a read replica of the database
//!     subscribes now (with open, its host opens it if it was idle; else
//!     null while it is closed) | 404 not hosted or deleted | 503 it takes
//!     no replicas
//! ```
//!
//! Bodies are at most [`MAX_INTERNAL_BODY_BYTES`]; answers likewise.

use super::control::{ControlError, Heartbeat, HeartbeatAnswer, HostApi};
use super::host::HostError;
use super::names::{AccountId, DatabaseName, DatabaseUuid};
use super::routes::RouteChange;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use std::time::Duration;
use walrelay_replicator::{ClusterKey, DatabaseId};

/// How long the failure detector's probe waits for an answer.
pub const PING_TIMEOUT_MS: u64 = 1_000;
/// How long a push of routing entries to one node may take.
pub const ROUTES_TIMEOUT_MS: u64 = 2_000;
/// How long a replica node waits to learn where a primary is.
pub const LOCATE_TIMEOUT_MS: u64 = 2_000;

/// The header every internal call carries.
pub const NODE_HEADER: &str = "x-walrelay-node";
/// Largest internal request or answer body.
pub const MAX_INTERNAL_BODY_BYTES: usize = 8 << 20;
const CONTEXT: &str = "walrelay 2026-11 internal http";

/// How nodes prove to each other that they belong to the cluster.
#[derive(Clone)]
pub struct InternalAuth(Option<[u8; 32]>);

impl std::fmt::Debug for InternalAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "InternalAuth(keyed)"
        } else {
            "InternalAuth(none)"
        })
    }
}

impl InternalAuth {
    /// Keyed by the cluster key; None: no check (a cluster run without one).
    pub fn new(key: Option<&ClusterKey>) -> InternalAuth {
        InternalAuth(key.map(|k| k.derive(CONTEXT)))
    }

    /// The header's value this node sends ("" without a key).
    pub fn header_value(&self) -> String {
        self.0
            .map(|s| s.iter().map(|b| format!("{b:02x}")).collect())
            .unwrap_or_default()
    }

    /// Whether a request's header proves membership (compared in constant
    /// time).
    pub fn check(&self, header: Option<&[u8]>) -> bool {
        let Some(secret) = self.0 else {
            return true;
        };
        let want = self.header_value();
        let Some(got) = header else {
            return false;
        };
        if got.len() != want.len() {
            return false;
        }
        got.iter()
            .zip(want.as_bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
            && !secret.is_empty()
    }
}

/// Why an internal call failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("{url} answered {status}: {message}")]
    Refused {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{url} answered malformed JSON: {reason}")]
    Malformed { url: String, reason: String },
}

/// The error body of an internal call.
#[derive(Debug, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
}

/// A database named by both its ids.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ids {
    pub uuid: String,
    pub database_id: u64,
}

/// Creation's first step, as sent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InitBody {
    pub uuid: String,
    pub database_id: u64,
    pub account: String,
    pub name: String,
}

/// The answer of `replication`: where the database's primary takes read
/// replicas now (it changes when the database is reopened).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaSource {
    pub leader: Option<std::net::SocketAddr>,
    /// The database's newest bookmark when asked (a new replica waits,
    /// boundedly, to reach it before it serves).
    #[serde(default)]
    pub at: Option<String>,
}

/// The question of `replication`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicationAsk {
    pub uuid: String,
    pub database_id: u64,
    /// Open the database if it is idle.
    pub open: bool,
}

/// Makes internal calls.
#[derive(Debug, Clone)]
pub struct Internal {
    agent: ureq::Agent,
    auth: InternalAuth,
}

impl Internal {
    pub fn new(auth: InternalAuth, timeout_ms: u64) -> Internal {
        Internal {
            agent: crate::http::client::agent(Duration::from_millis(timeout_ms)),
            auth,
        }
    }

    pub fn auth(&self) -> &InternalAuth {
        &self.auth
    }

    /// The same calls with another timeout (the failure detector's probe
    /// must not wait for a hung node as long as a call may take).
    pub fn with_timeout(&self, timeout_ms: u64) -> Internal {
        Internal::new(self.auth.clone(), timeout_ms)
    }

    /// POSTs `body` as JSON to `base/path` and reads a JSON answer.
    pub fn post<T: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        base: &str,
        path: &str,
        body: &T,
    ) -> Result<R, LinkError> {
        let url = format!("{base}{path}");
        let bytes = serde_json::to_vec(body).map_err(|e| LinkError::Malformed {
            url: url.clone(),
            reason: e.to_string(),
        })?;
        let mut resp = self
            .agent
            .post(&url)
            .header(NODE_HEADER, &self.auth.header_value())
            .header("content-type", "application/json")
            .send(&bytes[..])
            .map_err(|e| LinkError::Unreachable {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let status = resp.status().as_u16();
        let answer = resp
            .body_mut()
            .with_config()
            .limit(MAX_INTERNAL_BODY_BYTES as u64)
            .read_to_vec()
            .map_err(|e| LinkError::Unreachable {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        if status != 200 {
            let message = serde_json::from_slice::<ErrorBody>(&answer)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&answer).chars().take(200).collect());
            return Err(LinkError::Refused {
                url,
                status,
                message,
            });
        }
        serde_json::from_slice(&answer).map_err(|e| LinkError::Malformed {
            url,
            reason: e.to_string(),
        })
    }
}

/// An empty JSON object, the answer of calls that return nothing.
#[derive(Debug, Serialize, Deserialize)]
pub struct Empty {}

/// The control plane's handle on a host on another node.
#[derive(Debug)]
pub struct HttpHostApi {
    pub url: String,
    pub internal: Internal,
}

fn host_error(id: DatabaseId, e: LinkError) -> HostError {
    HostError::Remote {
        id,
        reason: e.to_string(),
    }
}

impl HttpHostApi {
    /// `init` and `adopt`: a call carrying a database's whole record.
    fn call_with_record(
        &self,
        path: &str,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError> {
        let body = InitBody {
            uuid: uuid.to_string(),
            database_id: id.0,
            account: account.to_string(),
            name: name.to_string(),
        };
        self.internal
            .post::<_, Empty>(&self.url, path, &body)
            .map(|_| ())
            .map_err(|e| host_error(id, e))
    }
}

impl HostApi for HttpHostApi {
    fn init(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError> {
        self.call_with_record("/internal/fleet/init", uuid, id, account, name)
    }

    fn activate(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError> {
        let body = Ids {
            uuid: uuid.to_string(),
            database_id: id.0,
        };
        self.internal
            .post::<_, Empty>(&self.url, "/internal/fleet/activate", &body)
            .map(|_| ())
            .map_err(|e| host_error(id, e))
    }

    fn adopt(
        &self,
        uuid: DatabaseUuid,
        id: DatabaseId,
        account: &AccountId,
        name: &DatabaseName,
    ) -> Result<(), HostError> {
        self.call_with_record("/internal/fleet/adopt", uuid, id, account, name)
    }

    fn ping(&self) -> Result<(), HostError> {
        self.internal
            .with_timeout(PING_TIMEOUT_MS)
            .post::<_, Empty>(&self.url, "/internal/fleet/ping", &Empty {})
            .map(|_| ())
            .map_err(|e| host_error(DatabaseId(0), e))
    }

    fn delete(&self, uuid: DatabaseUuid, id: DatabaseId) -> Result<(), HostError> {
        let body = Ids {
            uuid: uuid.to_string(),
            database_id: id.0,
        };
        self.internal
            .post::<_, Empty>(&self.url, "/internal/fleet/delete", &body)
            .map(|_| ())
            .map_err(|e| host_error(id, e))
    }
}

/// A heartbeat sent to the control plane's node.
pub fn remote_heartbeat(
    internal: &Internal,
    control_url: &str,
    beat: &Heartbeat,
) -> Result<HeartbeatAnswer, ControlError> {
    internal
        .post(control_url, "/internal/fleet/heartbeat", beat)
        .map_err(|e| ControlError::Unreachable(e.to_string()))
}

/// The answer to a routes call.
#[derive(Debug, Serialize, Deserialize)]
pub struct Changed {
    pub changed: usize,
}

/// Sends routing changes to one node.
pub fn send_routes(
    internal: &Internal,
    node_url: &str,
    changes: &[RouteChange],
) -> Result<usize, LinkError> {
    internal
        .post::<_, Changed>(node_url, "/internal/fleet/routes", changes)
        .map(|c| c.changed)
}
