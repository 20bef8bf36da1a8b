//! The query routes served without the router.
//!
//! `POST /v1/databases/{name}/query` and `.../raw` carry every read and
//! write of the D1-shaped API, and axum's router cost about a tenth of a
//! primary's HTTP threads at 16 connections (papers/performance.md, lever
//! 68): the route's service cloned and its handler's future boxed per
//! request, the request's headers copied for the handler, the path's
//! parameters decoded into a map. A request whose path names a database
//! plainly is matched here by hand and runs the same route body
//! ([`super::routes::query_answer`]) with the request's own headers; every
//! other request, and any query route this matcher is unsure of (a name
//! with percent-escapes, an empty one), goes to the router as before, so
//! the answer to each request is the one the router would give.

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
        name: String,
        shape: Shape,
        request: Request<Watched>,
    },
    Router(F),
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
            Some((name, shape)) => Routed::Query {
                name: name.to_owned(),
                shape,
                request,
            },
            None => Routed::Router(router(request)),
        }
    }

    /// The answer.
    pub(super) async fn answer(self, node: Arc<Node>) -> Response {
        match self {
            Routed::Query {
                name,
                shape,
                request,
            } => {
                let (parts, body) = request.into_parts();
                let body = axum::body::Body::new(body);
                let answer = super::routes::query_answer(node, name, parts.headers, body, shape);
                super::answer::response(answer.await)
            }
            Routed::Router(routed) => match routed.await {
                Ok(response) => response,
                Err(never) => match never {},
            },
        }
    }
}

/// The database name and the answer's shape of a request for
/// `/v1/databases/{name}/query` or `.../raw`, if its path names the
/// database as the router would read it unchanged: POST, one non-empty
/// path segment with no percent-escape.
pub(super) fn query_target<B>(request: &Request<B>) -> Option<(&str, Shape)> {
    if request.method() != Method::POST {
        return None;
    }
    let rest = request.uri().path().strip_prefix("/v1/databases/")?;
    let (name, route) = rest.split_once('/')?;
    let shape = match route {
        "query" => Shape::Objects,
        "raw" => Shape::Arrays,
        _ => return None,
    };
    (!name.is_empty() && !name.contains('%')).then_some((name, shape))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: Method, uri: &str) -> Option<(String, Shape)> {
        let request = Request::builder().method(method).uri(uri).body(()).unwrap();
        query_target(&request).map(|(name, shape)| (name.to_owned(), shape))
    }

    #[test]
    fn a_post_to_a_plainly_named_databases_query_or_raw_route_is_taken() {
        let post = |uri| target(Method::POST, uri);
        assert_eq!(
            post("/v1/databases/main/query"),
            Some(("main".into(), Shape::Objects))
        );
        assert_eq!(
            post("/v1/databases/main/raw?x=1"),
            Some(("main".into(), Shape::Arrays))
        );
        assert_eq!(
            post("http://host:1/v1/databases/a-b_c.d/query"),
            Some(("a-b_c.d".into(), Shape::Objects))
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
        ] {
            assert_eq!(target(Method::POST, uri), None, "{uri}");
        }
        for method in [Method::GET, Method::PUT, Method::HEAD, Method::DELETE] {
            assert_eq!(target(method, "/v1/databases/main/query"), None);
        }
    }
}
