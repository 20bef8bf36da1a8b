//! The server side of the fleet's internal calls (format:
//! [`crate::fleet::link`]): each checks the node header first, then reads
//! a bounded body.

use super::server::Node;
use crate::fleet::LocalHostApi;
use crate::fleet::control::{Heartbeat, HostApi};
use crate::fleet::host::HostError;
use crate::fleet::link::{
    Changed, Empty, ErrorBody, Ids, InitBody, MAX_INTERNAL_BODY_BYTES, NODE_HEADER, ReplicaSource,
    ReplicationAsk,
};
use crate::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use crate::fleet::routes::RouteChange;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use walrelay_replicator::DatabaseId;

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            error: message.into(),
        }),
    )
        .into_response()
}

fn host_status(e: &HostError) -> StatusCode {
    match e {
        HostError::NotHosted(_) | HostError::Deleted(_) => StatusCode::NOT_FOUND,
        HostError::Exists(_) => StatusCode::CONFLICT,
        HostError::BadRequest(_) | HostError::State { .. } => StatusCode::BAD_REQUEST,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    }
}

fn ids(body: &Ids) -> Result<(DatabaseUuid, DatabaseId), HostError> {
    let uuid = body
        .uuid
        .parse()
        .map_err(|e: crate::fleet::names::UuidParseError| HostError::BadRequest(e.to_string()))?;
    Ok((uuid, DatabaseId(body.database_id)))
}

/// Where a read replica of a database hosted here subscribes: the
/// database is opened (a replica asks when it starts following, or when
/// its leader went away) and its uuid checked against its own record.
fn replica_source(
    fleet: &crate::fleet::Fleet,
    ask: &ReplicationAsk,
) -> Result<ReplicaSource, HostError> {
    let (uuid, id) = ids(&Ids {
        uuid: ask.uuid.clone(),
        database_id: ask.database_id,
    })?;
    let host = fleet.host.as_ref().ok_or(HostError::NotHosted(id))?;
    let open = if ask.open {
        host.acquire(id)?
    } else {
        match host.get_open(id) {
            Some(open) => open,
            None => {
                return Ok(ReplicaSource {
                    leader: None,
                    at: None,
                });
            }
        }
    };
    if open.state.uuid != uuid.to_string() {
        return Err(HostError::NotHosted(id));
    }
    let leader = open.replica_addr().ok_or_else(|| HostError::Replication {
        id,
        reason: "the database takes no read replicas on this node".into(),
    })?;
    Ok(ReplicaSource {
        leader: Some(leader),
        at: Some(open.database().latest_bookmark().to_string()),
    })
}

/// `POST /internal/fleet/{call}`.
pub(super) async fn internal_route(
    State(node): State<Arc<Node>>,
    Path(call): Path<String>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let Some(fleet) = node.fleet().cloned() else {
        return error(StatusCode::NOT_FOUND, "this node serves no fleet");
    };
    if !fleet
        .internal()
        .auth()
        .check(headers.get(NODE_HEADER).map(|v| v.as_bytes()))
    {
        tracing::warn!(call, "refused an internal call without the cluster's proof");
        return error(
            StatusCode::UNAUTHORIZED,
            "internal calls need the cluster key",
        );
    }
    let idle = node.config().idle_timeout();
    let body = match super::routes::collect(body, MAX_INTERNAL_BODY_BYTES, idle).await {
        Ok(b) => b,
        Err(super::routes::BodyRead::TooLarge) => {
            return error(StatusCode::PAYLOAD_TOO_LARGE, "the body is too large");
        }
        Err(_) => return error(StatusCode::REQUEST_TIMEOUT, "the body did not arrive"),
    };
    tokio::task::spawn_blocking(move || {
        let local = || {
            fleet.host.as_ref().map(|host| LocalHostApi {
                host: Arc::clone(host),
                routes: Arc::clone(&fleet.routes),
                self_url: fleet.config.self_url.clone(),
            })
        };
        let host_call = |f: &dyn Fn(&LocalHostApi) -> Result<(), HostError>| -> Response {
            match local() {
                None => error(StatusCode::NOT_FOUND, "this node hosts no databases"),
                Some(api) => match f(&api) {
                    Ok(()) => axum::Json(Empty {}).into_response(),
                    Err(e) => error(host_status(&e), e.to_string()),
                },
            }
        };
        match call.as_str() {
            "ping" => {
                match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&body) {
                    Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                    Ok(_) => axum::Json(Empty {}).into_response(),
                }
            }
            "init" | "adopt" => match serde_json::from_slice::<InitBody>(&body) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(b) => host_call(&|api| {
                    let (uuid, id) = ids(&Ids {
                        uuid: b.uuid.clone(),
                        database_id: b.database_id,
                    })?;
                    let account = AccountId::new(&b.account)
                        .map_err(|e| HostError::BadRequest(e.to_string()))?;
                    let name = DatabaseName::new(&b.name)
                        .map_err(|e| HostError::BadRequest(e.to_string()))?;
                    if call == "adopt" {
                        api.adopt(uuid, id, &account, &name)
                    } else {
                        api.init(uuid, id, &account, &name)
                    }
                }),
            },
            "activate" | "delete" => match serde_json::from_slice::<Ids>(&body) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(b) => host_call(&|api| {
                    let (uuid, id) = ids(&b)?;
                    if call == "activate" {
                        api.activate(uuid, id)
                    } else {
                        api.delete(uuid, id)
                    }
                }),
            },
            "heartbeat" => match serde_json::from_slice::<Heartbeat>(&body) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(beat) => match fleet.control() {
                    Err(_) => error(
                        StatusCode::NOT_FOUND,
                        "this node does not run the control plane",
                    ),
                    Ok(c) => match c.heartbeat(&beat) {
                        Ok(a) => axum::Json(a).into_response(),
                        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
                    },
                },
            },
            "report" => match serde_json::from_slice::<crate::fleet::limits::Report>(&body) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(report) => match fleet.control() {
                    Err(_) => error(
                        StatusCode::NOT_FOUND,
                        "this node does not run the control plane",
                    ),
                    Ok(c) => match c.report(&report) {
                        Ok(a) => axum::Json(a).into_response(),
                        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
                    },
                },
            },
            "replication" => match serde_json::from_slice::<ReplicationAsk>(&body) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(b) => match replica_source(&fleet, &b) {
                    Ok(source) => axum::Json(source).into_response(),
                    Err(e) => error(host_status(&e), e.to_string()),
                },
            },
            "routes" => match serde_json::from_slice::<Vec<RouteChange>>(&body) {
                Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                Ok(changes) => match fleet.routes.apply(&changes) {
                    Ok(changed) => {
                        // A removed entry is a deleted (or moved) database:
                        // its replicas here go at once.
                        if let Some(replicas) = &fleet.replicas {
                            for change in &changes {
                                if let RouteChange::Remove { database_id, .. } = change {
                                    replicas.close(DatabaseId(*database_id), true);
                                }
                            }
                        }
                        axum::Json(Changed { changed }).into_response()
                    }
                    Err(e) => error(StatusCode::BAD_REQUEST, e.to_string()),
                },
            },
            _ => error(StatusCode::NOT_FOUND, "no such internal call"),
        }
    })
    .await
    .unwrap_or_else(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
}
