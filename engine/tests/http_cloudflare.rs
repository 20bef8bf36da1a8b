//! Cloudflare's paths and envelope refuse bad input clearly: every bad
//! request to `/client/v4/accounts/{account_id}/d1/database/{database_id}/...`
//! is a 4xx in D1's error shape and changes nothing. The happy paths are
//! driven by Cloudflare's own SDK in `d1_sdk.rs`.

mod common;

use common::{HttpCluster, http_kit::BytesReply};
use serde_json::json;
use walrelay_engine::http::auth::{Permission, Scope};
use walrelay_engine::http::server::HttpConfig;
use walrelay_engine::local_cluster::LocalClusterConfig;

const BASE: &str = "/client/v4/accounts/0123456789abcdef0123456789abcdef/d1/database";

fn cluster() -> HttpCluster {
    HttpCluster::start(
        LocalClusterConfig {
            http: HttpConfig {
                max_import_bytes: 8 << 10,
                ..HttpConfig::default()
            },
            ..LocalClusterConfig::default()
        },
        &["CREATE TABLE t(x)", "INSERT INTO t VALUES (1)"],
    )
}

fn refused(r: &BytesReply, status: u16, code: u32, has: &str, what: &str) {
    r.assert_d1_error(status, code, has, what);
}

fn post(h: &HttpCluster, url: &str, path: &str, bearer: Option<&str>, body: &[u8]) -> BytesReply {
    let admin = h.admin();
    h.send(
        "POST",
        &format!("{url}{BASE}/{path}"),
        Some(bearer.unwrap_or(&admin)),
        body,
    )
}

/// An etag that is well formed but not the md5 of the file sent with it.
const WRONG_ETAG: &str = "0df1a6a4f2c4e5d0a5d1f2f2d0f8a0b1";

#[test]
fn cloudflare_queries_answer_in_the_envelope_and_refuse_bad_bodies() {
    let h = cluster();
    for (node, url) in h.nodes() {
        let r = post(
            &h,
            &url,
            "main/query",
            None,
            br#"{"sql":"SELECT x FROM t"}"#,
        );
        assert_eq!(r.status, 200, "{node}");
        assert_eq!(
            r.json(),
            json!({"result": [{"results": [{"x": 1}], "success": true, "meta": r.json()["result"][0]["meta"]}],
                   "success": true, "errors": [], "messages": []})
        );
        let before = h.state();
        refused(
            &post(&h, &url, "main/query", None, b"{oops"),
            400,
            7400,
            "malformed JSON",
            node,
        );
        refused(
            &post(&h, &url, "main/raw", None, br#"{"batch": 3}"#),
            400,
            7400,
            "the body must be",
            node,
        );
        refused(
            &post(&h, &url, "nope/query", None, br#"{"sql":"SELECT 1"}"#),
            404,
            7404,
            "unknown database",
            node,
        );
        refused(
            &post(
                &h,
                &url,
                "main/query",
                Some("Bearer wrt_x"),
                br#"{"sql":"SELECT 1"}"#,
            ),
            401,
            10000,
            "",
            node,
        );
        before.assert_same(&h.state(), node);
    }
}

#[test]
fn cloudflare_export_refuses_unknown_databases_formats_and_bodies() {
    let h = cluster();
    for (node, url) in h.nodes() {
        refused(
            &post(
                &h,
                &url,
                "nope/export",
                None,
                br#"{"output_format":"polling"}"#,
            ),
            404,
            7404,
            "unknown database",
            node,
        );
        refused(
            &post(
                &h,
                &url,
                "main/export",
                None,
                br#"{"output_format":"file"}"#,
            ),
            400,
            7400,
            "polling",
            node,
        );
        refused(
            &post(&h, &url, "main/export", None, b"not json"),
            400,
            7400,
            "malformed export request",
            node,
        );
        refused(
            &post(
                &h,
                &url,
                "main/export",
                None,
                br#"{"output_format":"polling","extra":1}"#,
            ),
            400,
            7400,
            "unknown field",
            node,
        );
    }
    // A signed URL serves its dump; a made-up one is a 404.
    let url = h.c.primary_http.url();
    let r = post(
        &h,
        &url,
        "main/export",
        None,
        br#"{"output_format":"polling"}"#,
    );
    assert_eq!(r.status, 200);
    let signed = r.json()["result"]["result"]["signed_url"]
        .as_str()
        .expect("signed_url")
        .to_string();
    assert!(signed.starts_with(&url), "{signed} is on the node asked");
    let dump = h.send("GET", &signed, None, b"");
    assert_eq!(dump.status, 200);
    assert!(dump.text().contains("INSERT INTO \"t\""));
    let forged = format!("{}{}", &signed[..signed.len() - 4], "0000");
    refused(
        &h.send("GET", &forged, None, b""),
        404,
        7404,
        "no such transfer link",
        "a forged signed URL",
    );
}

#[test]
fn cloudflare_import_refuses_bad_actions_etags_uploads_and_tokens_and_changes_nothing() {
    let h = cluster();
    let read_only = h.mint(Scope::All, Permission::Read);
    let url = h.c.primary_http.url();
    let before = h.state();
    let imp =
        |body: serde_json::Value| post(&h, &url, "main/import", None, body.to_string().as_bytes());
    refused(
        &imp(json!({"action": "explode"})),
        400,
        7400,
        "unknown action",
        "an unknown action",
    );
    refused(
        &post(&h, &url, "main/import", None, b"{"),
        400,
        7400,
        "malformed import request",
        "malformed JSON",
    );
    refused(
        &imp(json!({"action": "init"})),
        400,
        7400,
        "etag",
        "init without an etag",
    );
    refused(
        &imp(json!({"action": "init", "etag": "not-an-md5"})),
        400,
        7400,
        "32 hex digits",
        "a malformed etag",
    );
    refused(
        &imp(json!({"action": "ingest", "etag": "0".repeat(32)})),
        400,
        7400,
        "filename",
        "ingest without a filename",
    );
    refused(
        &imp(json!({"action": "ingest", "etag": "0".repeat(32), "filename": "main-x.sql"})),
        404,
        7404,
        "no pending upload",
        "ingest of nothing announced",
    );
    refused(
        &imp(json!({"action": "poll"})),
        400,
        7400,
        "current_bookmark",
        "poll without a bookmark",
    );
    refused(
        &imp(json!({"action": "poll", "current_bookmark": "00000001-0000000000000001"})),
        404,
        7404,
        "no import",
        "poll of an unknown import",
    );
    refused(
        &post(
            &h,
            &url,
            "main/import",
            Some(&read_only),
            json!({"action": "init", "etag": "0".repeat(32)})
                .to_string()
                .as_bytes(),
        ),
        403,
        10000,
        "read-write",
        "a read-only token importing",
    );
    refused(
        &post(
            &h,
            &url,
            "nope/import",
            None,
            br#"{"action":"poll","current_bookmark":"x"}"#,
        ),
        404,
        7404,
        "unknown database",
        "an unknown database",
    );

    // init, then: ingest before the upload; a wrong etag; a file whose md5
    // is not the etag; an upload over max_import_bytes.
    let file = b"INSERT INTO t VALUES (2);\n";
    let claimed = WRONG_ETAG;
    let init = imp(json!({"action": "init", "etag": claimed}));
    assert_eq!(init.status, 200, "{}", init.text());
    let j = init.json();
    let upload = j["result"]["upload_url"]
        .as_str()
        .expect("upload_url")
        .to_string();
    let filename = j["result"]["filename"]
        .as_str()
        .expect("filename")
        .to_string();
    refused(
        &imp(json!({"action": "ingest", "etag": claimed, "filename": filename})),
        400,
        7400,
        "nothing was uploaded",
        "ingest before the upload",
    );
    refused(
        &h.send("PUT", &upload, None, &vec![b' '; 9 << 10]),
        413,
        7413,
        "exceeds the limit",
        "an upload over max_import_bytes",
    );
    let put = h.send("PUT", &upload, None, file);
    assert_eq!(put.status, 200);
    refused(
        &imp(json!({"action": "ingest", "etag": "1".repeat(32), "filename": filename})),
        400,
        7400,
        "not the one",
        "a different etag at ingest",
    );
    refused(
        &imp(json!({"action": "ingest", "etag": claimed, "filename": filename})),
        400,
        7400,
        "md5",
        "a file whose md5 is not its etag",
    );
    refused(
        &h.send("PUT", &format!("{upload}x"), None, file),
        404,
        7404,
        "no such transfer link",
        "an unknown upload link",
    );
    before.assert_same(&h.state(), "refused imports");
}
