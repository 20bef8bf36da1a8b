//! More of the HTTP kit: requests to any path and method of a node (the
//! `/raw`, export/import and Cloudflare endpoints), with any credentials,
//! and answers that need not be JSON (a dump).

use super::{HttpCluster, Reply, admin_bearer};

/// An answer as bytes (a dump is SQL text, not JSON).
#[derive(Debug)]
pub struct BytesReply {
    pub status: u16,
    pub content_type: Option<String>,
    pub retry_after: Option<String>,
    pub body: Vec<u8>,
}

impl BytesReply {
    /// Asserts a D1-shaped error ([`super::assert_d1_error`]).
    pub fn assert_d1_error(&self, status: u16, code: u32, has: &str, what: &str) {
        let reply = super::Reply {
            status: self.status,
            content_type: self.content_type.clone(),
            bookmark: None,
            json: self.json(),
        };
        super::assert_d1_error(&reply, status, code, has, what);
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).expect("a UTF-8 body")
    }
}

impl HttpCluster {
    /// `method url` with `bearer` (`Authorization: Bearer ...` as is, or
    /// none) and `body`.
    pub fn send(&self, method: &str, url: &str, bearer: Option<&str>, body: &[u8]) -> BytesReply {
        let req = ureq::http::Request::builder()
            .method(method)
            .uri(url)
            .header("content-type", "application/json");
        let req = match bearer {
            Some(b) => req.header("authorization", b),
            None => req,
        };
        let req = req.body(body.to_vec()).expect("a request");
        let mut resp = self.agent.run(req).expect("the node answers");
        let header = |name: &str| {
            resp.headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let (content_type, retry_after) = (header("content-type"), header("retry-after"));
        let body = resp
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_vec()
            .expect("a body");
        BytesReply {
            status: resp.status().as_u16(),
            content_type,
            retry_after,
            body,
        }
    }

    /// POSTs `body` to `base` + `path` with the admin token, as the first
    /// query of an unconstrained session; the answer must be JSON.
    pub fn post_path(&self, base: &str, path: &str, body: &[u8]) -> Reply {
        let r = self.send(
            "POST",
            &format!("{base}{path}"),
            Some(&admin_bearer(&self.c)),
            body,
        );
        Reply {
            status: r.status,
            content_type: r.content_type.clone(),
            bookmark: None,
            json: r.json(),
        }
    }

    /// The admin token's `Authorization` value.
    pub fn admin(&self) -> String {
        admin_bearer(&self.c)
    }
}

impl HttpCluster {
    /// A new token in the cluster's store, once the nodes accept it (they
    /// re-read the store within a second).
    pub fn mint(
        &self,
        scope: walrelay_engine::http::auth::Scope,
        permission: walrelay_engine::http::auth::Permission,
    ) -> String {
        let store = self.c.tokens_path().expect("the cluster has a token store");
        let bearer = walrelay_engine::http::token_store::create(store, scope, permission)
            .expect("mint a token")
            .bearer();
        for (_, url) in self.nodes() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let r = self.send(
                    "POST",
                    &format!("{url}/v1/databases/main/query"),
                    Some(&bearer),
                    br#"{"sql":"SELECT 1"}"#,
                );
                if r.status != 401 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the new token was never accepted"
                );
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
        bearer
    }
}
