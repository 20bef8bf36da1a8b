//! The HTTP face of a node, and a client that routes sessions across
//! nodes.
//!
//! - [`api`]: the D1-shaped request and response format.
//! - [`auth`]: API tokens (`Authorization: Bearer wrt_...`), what they
//!   grant, and the check every request passes first.
//! - [`token_store`]: the file of token hashes a node checks against.
//! - [`server`]: a node's endpoint (`POST /v1/databases/{name}/query`,
//!   `GET /metrics`), with write forwarding and read fallback on replicas.
//! - [`time_travel`]: which bookmark a time names, and restoring the
//!   database in place from cold storage (D1's Time Travel API).
//! - [`transfer`]: export (a SQL dump) and import, and the short-lived
//!   links of Cloudflare's export and import flows.
//! - [`cloudflare`]: Cloudflare's own REST paths and envelope
//!   (`/client/v4/accounts/{account_id}/d1/database/{database_id}/...`).
//! - [`metrics`]: the Prometheus exposition.
//! - [`client`]: a session handle that sends a session's queries to the
//!   nearest replica (the first to the primary under `first-primary`) and
//!   carries its bookmark across requests.

mod answer;
pub mod api;
pub mod auth;
pub mod client;
pub mod cloudflare;
mod control_api;
mod fleet_internal;
mod fleet_query;
pub mod forward;
mod hot_route;
mod listen;
pub mod metrics;
mod routes;
pub mod server;
pub mod time_travel;
pub mod token_store;
pub mod transfer;
mod unread_body;
mod write_timeout;
