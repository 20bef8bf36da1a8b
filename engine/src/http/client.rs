//! A client-side session handle over HTTP, like D1's `withSession()`.
//!
//! A session's queries go to the nearest replica: one in the client's
//! preferred region if there is one, any replica otherwise. The exception
//! is the first query of a `first-primary` session, which goes to the
//! primary. Replicas forward writes, and reads they cannot serve in time,
//! to the primary. The session's bookmark travels in `x-d1-bookmark` and
//! only grows.

use super::api::{self, BOOKMARK_HEADER, Body, Response, Statement};
use super::auth::ApiToken;
use crate::session::Constraint;
use crate::value::Value;
use parking_lot::Mutex;
use std::time::Duration;
use walrelay_replicator::Bookmark;

/// An HTTP agent for query traffic. Timeouts are per phase, not global:
/// a global deadline makes ureq resolve every address (even a literal IP)
/// on a thread of its own.
pub(crate) fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(2)))
        .timeout_send_request(Some(timeout))
        .timeout_recv_response(Some(timeout))
        .timeout_recv_body(Some(timeout))
        .http_status_as_error(false)
        .build()
        .new_agent()
}

/// An answer as it came over the wire.
pub(crate) struct RawAnswer {
    pub status: u16,
    pub bookmark: Option<String>,
    pub body: Vec<u8>,
    /// The `Retry-After` header, in seconds.
    pub retry_after_s: Option<u32>,
}

/// One query request, as the client sends it and a replica forwards it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub database: &'a str,
    /// `x-d1-bookmark`.
    pub bookmark: Option<&'a str>,
    /// `Authorization`, as the client sent it.
    pub authorization: Option<&'a str>,
    pub payload: &'a [u8],
    /// Sent by a replica on a client's behalf ([`super::forward`]).
    pub forwarded: bool,
    /// Another endpoint's path and query (time travel); None: the query
    /// endpoint.
    pub path: Option<&'a str>,
}

/// POSTs a query body to a node's endpoint (the client's request and a
/// replica's forward are the same request).
pub(crate) fn post_query(
    agent: &ureq::Agent,
    base_url: &str,
    request: &Request<'_>,
    max_answer_bytes: u64,
) -> Result<RawAnswer, ureq::Error> {
    let url = match request.path {
        Some(path) => format!("{base_url}{path}"),
        None => format!("{base_url}/v1/databases/{}/query", request.database),
    };
    let mut req = agent.post(url).header("content-type", "application/json");
    if let Some(h) = request.bookmark {
        req = req.header(BOOKMARK_HEADER, h);
    }
    if let Some(a) = request.authorization {
        req = req.header("authorization", a);
    }
    if request.forwarded {
        req = req.header(super::forward::FORWARDED_HEADER, "1");
    }
    let mut resp = req.send(request.payload)?;
    let status = resp.status().as_u16();
    let bookmark = resp
        .headers()
        .get(BOOKMARK_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let retry_after_s = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let body = resp
        .body_mut()
        .with_config()
        .limit(max_answer_bytes)
        .read_to_vec()?;
    Ok(RawAnswer {
        status,
        bookmark,
        body,
        retry_after_s,
    })
}

/// A node the client can send to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Base URL, e.g. `http://127.0.0.1:8101`.
    pub url: String,
    pub region: String,
    pub primary: bool,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The node answered with an error (4xx/5xx, D1's error shape).
    #[error("HTTP {status}: {message}")]
    Refused {
        status: u16,
        code: u32,
        message: String,
    },
    #[error("transport: {0}")]
    Transport(String),
    /// The node could not be reached: the request never left (safe to
    /// send elsewhere).
    #[error("unreachable: {0}")]
    Unreachable(String),
    #[error("undecodable answer: {0}")]
    Decode(String),
    #[error("no node to send to")]
    NoNode,
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub response: Response,
    /// The session's bookmark after the request (the response header).
    pub bookmark: Option<String>,
    /// The node the request was sent to.
    pub sent_to: String,
}

/// Knows the nodes of one database.
#[derive(Debug)]
pub struct Client {
    nodes: Vec<NodeInfo>,
    region: String,
    database: String,
    agent: ureq::Agent,
    /// Sent as `Authorization: Bearer <token>` (its `Debug` hides the
    /// secret).
    token: Option<ApiToken>,
}

impl Client {
    pub fn new(nodes: Vec<NodeInfo>, preferred_region: &str, database: &str) -> Client {
        let agent = agent(Duration::from_secs(30));
        Client {
            nodes,
            region: preferred_region.to_string(),
            database: database.to_string(),
            agent,
            token: None,
        }
    }

    /// The same client, sending `token` with every request.
    pub fn with_token(mut self, token: &ApiToken) -> Client {
        self.token = Some(token.clone());
        self
    }

    /// Starts a session: `first-primary`, `first-unconstrained` or a
    /// bookmark from an earlier session.
    pub fn session(&self, constraint: &str) -> ClientSession<'_> {
        ClientSession {
            client: self,
            state: Mutex::new(State {
                header: constraint
                    .parse::<Constraint>()
                    .map_err(|_| constraint.to_string()),
                started: false,
            }),
        }
    }

    pub fn primary(&self) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.primary)
    }

    /// The replica in the preferred region, else any replica, else the
    /// primary.
    pub fn nearest(&self) -> Option<&NodeInfo> {
        let replicas = || self.nodes.iter().filter(|n| !n.primary);
        replicas()
            .find(|n| n.region == self.region)
            .or_else(|| replicas().next())
            .or_else(|| self.primary())
    }

    /// Sends one request to `url` with the given session header.
    pub fn send(&self, url: &str, header: Option<&str>, body: &Body) -> Result<Reply, ClientError> {
        let payload = serde_json::to_vec(&api::encode_body(body))
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        let authorization = self.token.as_ref().map(ApiToken::bearer);
        let request = Request {
            forwarded: false,
            path: None,
            database: &self.database,
            bookmark: header,
            authorization: authorization.as_deref(),
            payload: &payload,
        };
        let raw = post_query(&self.agent, url, &request, 256 << 20).map_err(|e| {
            if super::forward::never_sent(&e) {
                ClientError::Unreachable(e.to_string())
            } else {
                ClientError::Transport(e.to_string())
            }
        })?;
        if raw.status == super::forward::NOT_PRIMARY_STATUS {
            return Err(ClientError::Unreachable(format!(
                "{url} is not the primary"
            )));
        }
        let (status, bookmark, bytes) = (raw.status, raw.bookmark, raw.body);
        let response: Response =
            serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))?;
        if status >= 400 || !response.success {
            let (code, message) = response
                .errors
                .first()
                .map_or((0, String::new()), |e| (e.code, e.message.clone()));
            return Err(ClientError::Refused {
                status,
                code,
                message,
            });
        }
        Ok(Reply {
            response,
            bookmark,
            sent_to: url.to_string(),
        })
    }
}

#[derive(Debug)]
struct State {
    /// What the next request sends in `x-d1-bookmark`: a constraint, or
    /// text that is not one (sent as it is, for the node to refuse).
    header: Result<Constraint, String>,
    started: bool,
}

impl State {
    fn header_text(&self) -> String {
        match &self.header {
            Ok(Constraint::FirstPrimary) => "first-primary".into(),
            Ok(Constraint::FirstUnconstrained) => "first-unconstrained".into(),
            Ok(Constraint::Bookmark(b)) => b.to_string(),
            Err(raw) => raw.clone(),
        }
    }
}

/// One session: sequentially consistent across every node it touches.
#[derive(Debug)]
pub struct ClientSession<'c> {
    client: &'c Client,
    state: Mutex<State>,
}

impl ClientSession<'_> {
    /// Runs one statement where the session's routing sends it.
    pub fn query(&self, sql: &str, params: Vec<Value>) -> Result<Reply, ClientError> {
        let body = Body::One(Statement {
            sql: sql.to_string(),
            params,
        });
        self.send_routed(&body)
    }

    /// Sends where the session's routing says; a node that cannot be
    /// reached (the request never left) is skipped for the next one, so a
    /// session goes on through a failover: replicas forward writes to
    /// whichever node is the primary now.
    fn send_routed(&self, body: &Body) -> Result<Reply, ClientError> {
        let first = self.route()?;
        let mut last = match self.query_via(&first, body) {
            Err(e @ ClientError::Unreachable(_)) => e,
            other => return other,
        };
        for node in &self.client.nodes {
            if node.url == first {
                continue;
            }
            match self.query_via(&node.url, body) {
                Err(e @ ClientError::Unreachable(_)) => last = e,
                other => return other,
            }
        }
        Err(last)
    }

    /// Runs statements as one atomic batch.
    pub fn batch(&self, statements: Vec<(String, Vec<Value>)>) -> Result<Reply, ClientError> {
        let body = Body::Batch(
            statements
                .into_iter()
                .map(|(sql, params)| Statement { sql, params })
                .collect(),
        );
        self.send_routed(&body)
    }

    /// Sends through a chosen node (tests, or a caller with its own
    /// routing); the session's bookmark is carried all the same.
    pub fn query_via(&self, url: &str, body: &Body) -> Result<Reply, ClientError> {
        let header = self.state.lock().header_text();
        let reply = self.client.send(url, Some(&header), body)?;
        let mut st = self.state.lock();
        st.started = true;
        if let Some(b) = reply
            .bookmark
            .as_deref()
            .and_then(|b| b.parse::<Bookmark>().ok())
        {
            // A session's bookmark only grows.
            let newer = match st.header {
                Ok(Constraint::Bookmark(cur)) => b > cur,
                _ => true,
            };
            if newer {
                st.header = Ok(Constraint::Bookmark(b));
            }
        }
        Ok(reply)
    }

    fn route(&self) -> Result<String, ClientError> {
        let st = self.state.lock();
        let node = if !st.started && st.header == Ok(Constraint::FirstPrimary) {
            self.client.primary()
        } else {
            self.client.nearest()
        };
        node.map(|n| n.url.clone()).ok_or(ClientError::NoNode)
    }

    /// The session's bookmark (None before its first answer).
    pub fn bookmark(&self) -> Option<String> {
        match self.state.lock().header {
            Ok(Constraint::Bookmark(b)) => Some(b.to_string()),
            _ => None,
        }
    }
}
