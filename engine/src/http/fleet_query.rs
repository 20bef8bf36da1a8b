//! Queries to the fleet's databases: found through the node's routing
//! table alone (never the catalog), run here if this node hosts the
//! database, passed on to its host otherwise.

use super::answer::{Answer, codes};
use super::api::{Body, Shape};
use super::server::{Caller, Node};
use crate::execution::CancelToken;
use crate::fleet::FleetError;
use crate::fleet::catalog::QueryPathGuard;
use crate::fleet::host::HostError;
use crate::session::Constraint;
use std::sync::atomic::Ordering;

fn fleet_error(e: &FleetError) -> Answer {
    match e {
        FleetError::Unknown(name) => Answer::error(
            404,
            codes::UNKNOWN_DATABASE,
            format!("unknown database {name:?}"),
        ),
        FleetError::Host(HostError::Deleted(_)) | FleetError::Host(HostError::NotHosted(_)) => {
            Answer::error(
                404,
                codes::UNKNOWN_DATABASE,
                "the database does not exist (deleted)",
            )
        }
        FleetError::Host(HostError::NotActive(_)) => {
            Answer::error(503, codes::UNAVAILABLE, "the database is being created").retry_after(1)
        }
        FleetError::Host(HostError::Busy(_)) => {
            Answer::error(503, codes::UNAVAILABLE, e.to_string()).retry_after(1)
        }
        other => Answer::error(503, codes::UNAVAILABLE, other.to_string()).retry_after(1),
    }
}

/// A query request, parsed.
pub(super) struct FleetRequest<'a> {
    pub header: Option<&'a str>,
    pub raw_body: &'a [u8],
    pub constraint: Constraint,
    pub body: &'a Body,
    pub shape: Shape,
}

impl Node {
    /// Runs a request on the fleet database `name` (a name in the caller's
    /// account, or a uuid).
    pub(super) fn fleet_query(
        &self,
        caller: &Caller,
        name: &str,
        request: &FleetRequest<'_>,
        cancel: &CancelToken,
    ) -> Answer {
        let FleetRequest {
            header,
            raw_body,
            constraint,
            body,
            shape,
        } = *request;
        let Some(fleet) = self.fleet() else {
            return Answer::error(
                404,
                codes::UNKNOWN_DATABASE,
                format!("unknown database {name:?}"),
            );
        };
        // Everything below runs without the catalog; a read would be
        // counted against this guard.
        let _on_query_path = QueryPathGuard::enter();
        fleet.stats.queries.fetch_add(1, Ordering::Relaxed);
        let account = fleet.config.default_account.clone();
        let route = match fleet.route(name, &account) {
            Ok(r) => r,
            // Not in this node's table: if it hosts nothing itself, the
            // control plane's node (the fleet's host in `walrelay up`) is
            // asked instead; routes reach every node in a later change.
            Err(FleetError::Unknown(_))
                if !fleet.runs_control_plane() && !caller.is_forwarded() =>
            {
                return match &fleet.config.control_url {
                    Some(url) => self.pass_query(url, caller, name, header, raw_body, shape),
                    None => fleet_error(&FleetError::Unknown(name.into())),
                };
            }
            Err(e) => return fleet_error(&e),
        };
        let open = match fleet.acquire(&route) {
            Ok(o) => o,
            // This node's own entry is stale (the database failed over
            // while it was away, and it forgot its copy): the entry goes,
            // and the control plane's node, whose table is current, takes
            // the request.
            Err(FleetError::Host(HostError::NotHosted(id)))
                if route.node == fleet.config.self_url && !caller.is_forwarded() =>
            {
                if let Ok(uuid) = route.uuid.parse() {
                    let _ = fleet.routes.remove(uuid, id);
                }
                return match &fleet.config.control_url {
                    Some(url) => self.pass_query(url, caller, &route.uuid, header, raw_body, shape),
                    None => fleet_error(&FleetError::Unknown(name.into())),
                };
            }
            Err(FleetError::Elsewhere(_)) if !caller.is_forwarded() => {
                if let Some(answer) = self.replica_read(fleet, &route, caller, request, cancel) {
                    return answer;
                }
                return self.pass_query(&route.node, caller, &route.uuid, header, raw_body, shape);
            }
            // Nodes without a (current) entry pass requests to the control
            // plane's node; it passes them on once more to the node its own
            // table names. No loop: only this node passes a forwarded
            // request, and never to itself.
            Err(FleetError::Elsewhere(_)) if fleet.runs_control_plane() => {
                return self.pass_query(&route.node, caller, &route.uuid, header, raw_body, shape);
            }
            Err(e) => return fleet_error(&e),
        };
        // The limit cache's key for the account (memory only).
        if fleet.metering.keys.blocked(&route.account) {
            return Answer::error(
                429,
                codes::LIMIT,
                "the account exceeded its daily rows limit (free plan); queries are refused until the end of the day (UTC)",
            );
        }
        let answer = self.run_on(open.database(), caller, constraint, body, shape, cancel);
        if let Some((read, written)) = answer.usage {
            fleet
                .metering
                .record(&route.uuid, &route.account, read, written);
        }
        answer
    }

    /// A read answered by this node's replica of the database (opened on
    /// first use), or None: the request goes to the primary (this node
    /// keeps no replicas, it is a write, an atomic batch or first-primary
    /// session, the replica could not open, or it did not reach the
    /// session's bookmark within its wait).
    fn replica_read(
        &self,
        fleet: &crate::fleet::Fleet,
        route: &crate::fleet::routes::Route,
        caller: &Caller,
        request: &FleetRequest<'_>,
        cancel: &CancelToken,
    ) -> Option<Answer> {
        let replicas = fleet.replicas.as_ref()?;
        if request.constraint == Constraint::FirstPrimary
            || matches!(request.body, Body::Batch(_))
            || fleet.metering.keys.blocked(&route.account)
        {
            return None;
        }
        let locate = HostLocator { fleet, route };
        let replica = match replicas
            .acquire(walrelay_replicator::DatabaseId(route.database_id), &locate)
        {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(database = %route.uuid, error = %e, "no replica here: the read goes to the primary");
                return None;
            }
        };
        let answer = self
            .run_on_replica(
                replica.database(),
                caller,
                request.constraint,
                request.body,
                request.shape,
                cancel,
            )
            .ok()?;
        fleet.stats.replica_reads.fetch_add(1, Ordering::Relaxed);
        if let Some((read, written)) = answer.usage {
            fleet
                .metering
                .record(&route.uuid, &route.account, read, written);
        }
        Some(answer)
    }

    /// A Cloudflare path's `{database_id}` as the rest of the node reads
    /// it: a fleet database's name in the path's account becomes its uuid
    /// (a uuid, `main`, or a name the routing table does not know is
    /// passed on unchanged).
    pub(super) fn in_account(&self, account: &str, database: String) -> String {
        let Some(fleet) = self.fleet() else {
            return database;
        };
        let (Ok(account), Ok(name)) = (
            crate::fleet::names::AccountId::new(account),
            crate::fleet::names::DatabaseName::new(&database),
        ) else {
            return database;
        };
        fleet
            .routes
            .by_name(&account, &name)
            .map_or(database, |route| route.uuid)
    }

    /// For an endpoint other than a query (time travel): None if the fleet
    /// database `name` is hosted here, else the answer — the request
    /// passed to its node (`path_after` follows `/v1/databases/{uuid}`),
    /// or why not.
    pub(super) fn pass_to_host(
        &self,
        caller: &Caller,
        name: &str,
        path_after: &str,
    ) -> Option<Answer> {
        self.pass_to_host_with(caller, name, path_after, b"")
    }

    /// [`Node::pass_to_host`] with a request body (an import's SQL, an
    /// export's options).
    pub(super) fn pass_to_host_with(
        &self,
        caller: &Caller,
        name: &str,
        path_after: &str,
        payload: &[u8],
    ) -> Option<Answer> {
        let fleet = self.fleet()?;
        let _on_query_path = QueryPathGuard::enter();
        let route = match fleet.route(name, &fleet.config.default_account) {
            Ok(r) => r,
            Err(e) => return Some(fleet_error(&e)),
        };
        if route.node == fleet.config.self_url {
            return None;
        }
        if caller.is_forwarded() {
            return Some(Answer::error(
                503,
                codes::UNAVAILABLE,
                "the database is not hosted here (a stale route); retry",
            ));
        }
        let path = format!("/v1/databases/{}{path_after}", route.uuid);
        let request = super::client::Request {
            database: &route.uuid,
            bookmark: None,
            authorization: caller.authorization(),
            payload,
            forwarded: true,
            path: Some(&path),
        };
        let limit = self.config().max_export_bytes.max(1 << 20) as u64;
        Some(
            match super::client::post_query(self.agent(), &route.node, &request, limit) {
                Ok(raw) => Answer::relayed(raw),
                Err(e) => Answer::error(
                    503,
                    codes::UNAVAILABLE,
                    format!("the database's node {} did not answer: {e}", route.node),
                ),
            },
        )
    }

    /// A fleet database hosted elsewhere, as this node's replica of it
    /// (a replica node's, opened if needed), for reads such as an export;
    /// None if this node keeps no replicas or cannot open one.
    pub(super) fn replica_database(
        &self,
        name: &str,
    ) -> Option<std::sync::Arc<crate::fleet::replica_host::FleetReplica>> {
        let fleet = self.fleet()?;
        let replicas = fleet.replicas.as_ref()?;
        let _on_query_path = QueryPathGuard::enter();
        let route = fleet.route(name, &fleet.config.default_account).ok()?;
        if route.node == fleet.config.self_url {
            return None;
        }
        let locate = HostLocator {
            fleet,
            route: &route,
        };
        replicas
            .acquire(walrelay_replicator::DatabaseId(route.database_id), &locate)
            .ok()
    }

    /// A fleet database hosted on this node, for export, import and the
    /// like (a request for one hosted elsewhere is answered 421 with its
    /// node; callers that can pass it on do so first).
    pub(super) fn hosted_database(
        &self,
        name: &str,
    ) -> Result<std::sync::Arc<crate::fleet::host::OpenDb>, Answer> {
        let Some(fleet) = self.fleet() else {
            return Err(fleet_error(&FleetError::Unknown(name.into())));
        };
        let _on_query_path = QueryPathGuard::enter();
        let route = fleet
            .route(name, &fleet.config.default_account)
            .map_err(|e| fleet_error(&e))?;
        match fleet.acquire(&route) {
            Ok(open) => Ok(open),
            Err(FleetError::Elsewhere(_)) => Err(Answer::error(
                421,
                codes::UNAVAILABLE,
                format!(
                    "database {name:?} is served by {}: send this request there",
                    route.node
                ),
            )),
            Err(e) => Err(fleet_error(&e)),
        }
    }

    fn pass_query(
        &self,
        node_url: &str,
        caller: &Caller,
        name: &str,
        header: Option<&str>,
        payload: &[u8],
        shape: Shape,
    ) -> Answer {
        let raw_path = format!("/v1/databases/{name}/raw");
        let request = super::client::Request {
            database: name,
            bookmark: header,
            authorization: caller.authorization(),
            payload,
            forwarded: true,
            path: (shape == Shape::Arrays).then_some(raw_path.as_str()),
        };
        match super::client::post_query(self.agent(), node_url, &request, 64 << 20) {
            Ok(raw) => Answer::relayed(raw),
            Err(e) => Answer::error(
                503,
                codes::UNAVAILABLE,
                format!("the database's node {node_url} did not answer: {e}"),
            )
            .retry_after(1),
        }
    }
}

/// Asks a database's host where its primary takes replicas.
struct HostLocator<'a> {
    fleet: &'a crate::fleet::Fleet,
    route: &'a crate::fleet::routes::Route,
}

impl crate::fleet::replica_host::LocateLeader for HostLocator<'_> {
    fn locate(
        &self,
        open: bool,
    ) -> Result<
        Option<crate::fleet::replica_host::Located>,
        crate::fleet::replica_host::ReplicaHostError,
    > {
        let ask = crate::fleet::link::ReplicationAsk {
            uuid: self.route.uuid.clone(),
            database_id: self.route.database_id,
            open,
        };
        self.fleet
            .locate_internal()
            .post::<_, crate::fleet::link::ReplicaSource>(
                &self.route.node,
                "/internal/fleet/replication",
                &ask,
            )
            .map(|s| {
                s.leader.map(|leader| crate::fleet::replica_host::Located {
                    leader,
                    // A malformed one is only a missed wait.
                    at: s.at.and_then(|b| b.parse().ok()),
                })
            })
            .map_err(|e| {
                let id = walrelay_replicator::DatabaseId(self.route.database_id);
                match e {
                    crate::fleet::link::LinkError::Refused { status: 404, .. } => {
                        crate::fleet::replica_host::ReplicaHostError::Gone { id }
                    }
                    e => crate::fleet::replica_host::ReplicaHostError::NoLeader {
                        id,
                        reason: e.to_string(),
                    },
                }
            })
    }
}
