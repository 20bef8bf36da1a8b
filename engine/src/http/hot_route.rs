//! The query routes served without the router.
//!
//! `POST /v1/databases/{name}/query` and `.../raw`, and Cloudflare's
//! `POST /client/v4/accounts/{account_id}/d1/database/{database_id}/query`
//! and `.../raw`, carry every read and write of the API, and axum's router
//! cost about a tenth of a
//! primary's HTTP threads at 16 connections (papers/performance.md, lever
//! 68): the route's service cloned and its handler's future boxed per
//! request, the request's headers copied for the handler, the path's
//! parameters decoded into a map. A request whose path names a database
//! (and an account) plainly is matched here by hand and runs the same
//! route body ([`super::routes::query_answer`], the Cloudflare name read
//! in its account as the Cloudflare route reads it) with the request's own
//! headers; every other request, and any query route this matcher is
//! unsure of (a segment with percent-escapes, an empty one), goes to the
//! router as before, so the answer to each request is the one the router
//! would give.

use super::api::Shape;
use super::server::Node;
use super::unread_body::Watched;
use axum::http::{Method, Request};
use axum::response::Response;
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

/// Where a request goes: the query route directly, or the router.
// Not boxed: it lives in its request's future, which hyper holds in place,
// and a box per request is what this module saves. (Clippy sees the
// router's future, the other variant, as empty; it is not.)
#[allow(clippy::large_enum_variant)]
pub(super) enum Routed<F> {
    Query {
        target: Target,
        shape: Shape,
        request: Request<Watched>,
    },
    Router(F),
}

/// The database a query route names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// `/v1/databases/{name}/...`: a name or id as it is.
    Plain(String),
    /// Cloudflare's `/client/v4/accounts/{account}/d1/database/{database}/...`.
    InAccount { account: String, database: String },
}

impl<F> Routed<F>
where
    F: Future<Output = Result<Response, Infallible>>,
{
    /// Routes `request`: `router` is called only for what the matcher does
    /// not take.
    pub(super) fn new(
        request: Request<Watched>,
        router: impl FnOnce(Request<Watched>) -> F,
    ) -> Self {
        match query_target(&request) {
            Some((target, shape)) => Routed::Query {
                target,
                shape,
                request,
            },
            None => Routed::Router(router(request)),
        }
    }

    /// The answer (`node` is taken only by the query route).
    pub(super) async fn answer(self, node: &Arc<Node>) -> Response {
        match self {
            Routed::Query {
                target,
                shape,
                request,
            } => {
                let name = match target {
                    Target::Plain(name) => name,
                    Target::InAccount { account, database } => node.in_account(&account, database),
                };
                let (parts, body) = request.into_parts();
                let body = axum::body::Body::new(body);
                let answer =
                    super::routes::query_answer(Arc::clone(node), name, parts.headers, body, shape);
                super::answer::response(answer.await)
            }
            Routed::Router(routed) => match routed.await {
                Ok(response) => response,
                Err(never) => match never {},
            },
        }
    }
}

/// The database and the answer's shape of a request for a query route
/// (`/v1/databases/{name}/query` or `.../raw`, or Cloudflare's
/// `/client/v4/accounts/{account_id}/d1/database/{database_id}/query` or
/// `.../raw`), if its path names them as the router would read them
/// unchanged: POST, each named segment non-empty and without a
/// percent-escape.
pub(super) fn query_target<B>(request: &Request<B>) -> Option<(Target, Shape)> {
    if request.method() != Method::POST {
        return None;
    }
    let path = request.uri().path();
    let (target, route) = if let Some(rest) = path.strip_prefix("/v1/databases/") {
        let (name, route) = rest.split_once('/')?;
        (Target::Plain(plain(name)?.to_owned()), route)
    } else {
        let rest = path.strip_prefix("/client/v4/accounts/")?;
        let (account, rest) = rest.split_once('/')?;
        let (database, route) = rest.strip_prefix("d1/database/")?.split_once('/')?;
        let target = Target::InAccount {
            account: plain(account)?.to_owned(),
            database: plain(database)?.to_owned(),
        };
        (target, route)
    };
    let shape = match route {
        "query" => Shape::Objects,
        "raw" => Shape::Arrays,
        _ => return None,
    };
    Some((target, shape))
}

/// A path segment the router would pass on unchanged.
fn plain(segment: &str) -> Option<&str> {
    (!segment.is_empty() && !segment.contains('%')).then_some(segment)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: Method, uri: &str) -> Option<(Target, Shape)> {
        let request = Request::builder().method(method).uri(uri).body(()).unwrap();
        query_target(&request)
    }

    fn plain_name(name: &str) -> Target {
        Target::Plain(name.into())
    }

    fn in_account(account: &str, database: &str) -> Target {
        Target::InAccount {
            account: account.into(),
            database: database.into(),
        }
    }

    #[test]
    fn a_post_to_a_plainly_named_databases_query_or_raw_route_is_taken() {
        let post = |uri| target(Method::POST, uri);
        assert_eq!(
            post("/v1/databases/main/query"),
            Some((plain_name("main"), Shape::Objects))
        );
        assert_eq!(
            post("/v1/databases/main/raw?x=1"),
            Some((plain_name("main"), Shape::Arrays))
        );
        assert_eq!(
            post("http://host:1/v1/databases/a-b_c.d/query"),
            Some((plain_name("a-b_c.d"), Shape::Objects))
        );
        assert_eq!(
            post("/client/v4/accounts/acct/d1/database/db-1/query"),
            Some((in_account("acct", "db-1"), Shape::Objects))
        );
        assert_eq!(
            post("/client/v4/accounts/acct/d1/database/db-1/raw"),
            Some((in_account("acct", "db-1"), Shape::Arrays))
        );
    }

    #[test]
    fn anything_the_router_might_read_otherwise_is_left_to_it() {
        for uri in [
            "/v1/databases/ma%69n/query",
            "/v1/databases//query",
            "/v1/databases/main/query/",
            "/v1/databases/main/queryx",
            "/v1/databases/main/export",
            "/v1/databases/main",
            "/v1/databases",
            "/v2/databases/main/query",
            "/v1/databases/a/b/query",
            "/client/v4/accounts/ac%63t/d1/database/db/query",
            "/client/v4/accounts/acct/d1/database/d%62/query",
            "/client/v4/accounts//d1/database/db/query",
            "/client/v4/accounts/acct/d1/database//query",
            "/client/v4/accounts/acct/d1/database/db/export",
            "/client/v4/accounts/acct/d1/database/db",
            "/client/v4/accounts/acct/d2/database/db/query",
            "/client/v4/accounts/acct/x/d1/database/db/query",
        ] {
            assert_eq!(target(Method::POST, uri), None, "{uri}");
        }
        for method in [Method::GET, Method::PUT, Method::HEAD, Method::DELETE] {
            assert_eq!(target(method.clone(), "/v1/databases/main/query"), None);
            assert_eq!(
                target(method, "/client/v4/accounts/a/d1/database/b/query"),
                None
            );
        }
    }
}
