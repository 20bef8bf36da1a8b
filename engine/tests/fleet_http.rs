//! The control-plane API over HTTP, at walrelay's paths and Cloudflare's:
//! create, list, get, delete, queries by name and uuid, and bad input.

mod common;

use common::fleet::{HttpFleet as Fixture, Reply, Tuning};
use serde_json::json;

fn fixture() -> Fixture {
    Fixture::start(Tuning {
        max_open: 16,
        idle_close_ms: 60_000,
        heartbeat_ms: 60_000,
        limits: false,
    })
}

fn refused(r: &Reply, status: u16, what: &str) {
    assert_eq!(r.status, status, "{what}: {}", r.json);
    assert_eq!(r.json["success"], false, "{what}");
    assert!(
        r.json["errors"][0]["message"].is_string(),
        "{what}: {}",
        r.json
    );
}

#[test]
fn a_database_created_over_http_is_listed_queried_by_name_and_uuid_and_deleted() {
    let fx = fixture();
    let r = fx.admin("POST", "/v1/databases", Some(json!({"name": "shop"})));
    assert_eq!(r.status, 200, "{}", r.json);
    let uuid = r.json["result"]["uuid"].as_str().unwrap().to_string();
    assert_eq!(r.json["result"]["name"], "shop");
    assert!(
        r.json["result"]["created_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );

    let q = fx.query("shop", "CREATE TABLE t(x); ");
    assert_eq!(q.status, 200, "{}", q.json);
    assert_eq!(fx.query("shop", "INSERT INTO t VALUES (42)").status, 200);
    let q = fx.query(&uuid, "SELECT x FROM t");
    assert_eq!(q.json["result"][0]["results"][0]["x"], 42, "{}", q.json);
    // `main` is still the node's own database, apart from the fleet's.
    assert_eq!(fx.query("main", "SELECT 1 AS one").status, 200);

    let got = fx.admin("GET", &format!("/v1/databases/{uuid}"), None);
    assert_eq!(got.json["result"]["name"], "shop");
    let by_name = fx.admin("GET", "/v1/databases/shop", None);
    assert_eq!(by_name.json["result"]["uuid"], uuid.as_str());

    for i in 0..3 {
        fx.admin(
            "POST",
            "/v1/databases",
            Some(json!({"name": format!("more-{i}")})),
        );
    }
    let list = fx.admin("GET", "/v1/databases?per_page=2&page=2", None);
    assert_eq!(list.json["result_info"]["total_count"], 4, "{}", list.json);
    assert_eq!(list.json["result"].as_array().unwrap().len(), 2);
    let filtered = fx.admin("GET", "/v1/databases?name=more", None);
    assert_eq!(filtered.json["result_info"]["total_count"], 3);

    let del = fx.admin("DELETE", &format!("/v1/databases/{uuid}"), None);
    assert_eq!(del.status, 200, "{}", del.json);
    refused(
        &fx.query("shop", "SELECT x FROM t"),
        404,
        "query after delete",
    );
    refused(
        &fx.query(&uuid, "SELECT x FROM t"),
        404,
        "query by uuid after delete",
    );
    refused(
        &fx.admin("GET", &format!("/v1/databases/{uuid}"), None),
        404,
        "get after delete",
    );
    assert_eq!(fx.node.reads.on_query_path(), 0);
}

#[test]
fn cloudflares_paths_create_list_get_and_delete_per_account() {
    let fx = fixture();
    let base = "/client/v4/accounts/acct-1/d1/database";
    let r = fx.admin(
        "POST",
        base,
        Some(json!({"name": "cf", "primary_location_hint": "weur"})),
    );
    assert_eq!(r.status, 200, "{}", r.json);
    let uuid = r.json["result"]["uuid"].as_str().unwrap().to_string();
    // Another account does not see it, and may use the same name.
    let other = fx.admin("GET", "/client/v4/accounts/acct-2/d1/database", None);
    assert_eq!(other.json["result_info"]["total_count"], 0);
    assert_eq!(
        fx.admin(
            "POST",
            "/client/v4/accounts/acct-2/d1/database",
            Some(json!({"name": "cf"}))
        )
        .status,
        200
    );
    // A name in a Cloudflare path is looked up in the path's account.
    for (account, value) in [("acct-1", 1), ("acct-2", 2)] {
        let q = |sql: &str| {
            fx.admin(
                "POST",
                &format!("/client/v4/accounts/{account}/d1/database/cf/query"),
                Some(json!({ "sql": sql })),
            )
        };
        assert_eq!(q("CREATE TABLE t(x)").status, 200, "{account}");
        assert_eq!(q(&format!("INSERT INTO t VALUES ({value})")).status, 200);
    }
    for (account, value) in [("acct-1", 1), ("acct-2", 2)] {
        let r = fx.admin(
            "POST",
            &format!("/client/v4/accounts/{account}/d1/database/cf/query"),
            Some(json!({ "sql": "SELECT x FROM t" })),
        );
        assert_eq!(
            r.json["result"][0]["results"],
            json!([{ "x": value }]),
            "{account}"
        );
    }
    let list = fx.admin("GET", base, None);
    assert_eq!(list.json["result"][0]["uuid"], uuid.as_str());
    let got = fx.admin("GET", &format!("{base}/{uuid}"), None);
    assert_eq!(got.json["result"]["name"], "cf");
    assert_eq!(
        fx.admin("DELETE", &format!("{base}/{uuid}"), None).status,
        200
    );
    refused(
        &fx.admin("GET", &format!("{base}/{uuid}"), None),
        404,
        "deleted",
    );
}

#[test]
fn bad_control_plane_requests_get_a_clear_4xx_and_change_nothing() {
    let fx = fixture();
    let create = |body: &str| fx.call("POST", "/v1/databases", Some(&fx.admin), Some(body));
    refused(&create("{"), 400, "malformed JSON");
    refused(&create("[]"), 400, "not an object");
    refused(&create(r#"{"name":"Bad Name"}"#), 400, "a bad name");
    refused(&create(r#"{"name":""}"#), 400, "an empty name");
    refused(
        &create(&format!(r#"{{"name":"{}"}}"#, "a".repeat(65))),
        400,
        "a long name",
    );
    refused(
        &create(r#"{"name":"x","surprise":1}"#),
        400,
        "an unknown field",
    );
    refused(
        &create(r#"{"name":"x","account":"no spaces"}"#),
        400,
        "a bad account",
    );
    let uuid_name = format!(r#"{{"name":"{}"}}"#, uuid_like());
    refused(&create(&uuid_name), 400, "a uuid-shaped name");
    let huge = format!(r#"{{"name":"x","pad":"{}"}}"#, "p".repeat(64 << 10));
    // The node may refuse it before the client has sent it all (the
    // connection is then cut: status 0); either way nothing is created.
    let bearer = fx.admin.bearer();
    let r = fx.post_with("/v1/databases", &[("authorization", &bearer)], &huge);
    assert!(
        r.status == 413 || r.status == 0,
        "an oversized body: {}",
        r.status
    );
    for q in [
        "page=0",
        "per_page=0",
        "per_page=10001",
        "page=-1",
        "page=x",
        "name=Bad",
    ] {
        refused(
            &fx.admin("GET", &format!("/v1/databases?{q}"), None),
            400,
            q,
        );
    }
    refused(
        &fx.admin("GET", "/v1/databases/no-such-db", None),
        404,
        "unknown name",
    );
    refused(
        &fx.admin("DELETE", &format!("/v1/databases/{}", uuid_like()), None),
        404,
        "unknown uuid",
    );
    // Authorization: none, read-only for a write, one database's token.
    refused(
        &fx.call("POST", "/v1/databases", None, Some(r#"{"name":"x"}"#)),
        401,
        "no token",
    );
    refused(
        &fx.call(
            "POST",
            "/v1/databases",
            Some(&fx.reader),
            Some(r#"{"name":"x"}"#),
        ),
        403,
        "a read-only token",
    );
    refused(
        &fx.call("GET", "/v1/databases", Some(&fx.scoped), None),
        403,
        "a scoped token",
    );
    assert_eq!(
        fx.call("GET", "/v1/databases", Some(&fx.reader), None)
            .status,
        200
    );
    // A taken name.
    assert_eq!(create(r#"{"name":"x"}"#).status, 200);
    refused(&create(r#"{"name":"x"}"#), 409, "a taken name");
    // Nothing above created anything but the one database.
    let list = fx.admin("GET", "/v1/databases", None);
    assert_eq!(list.json["result_info"]["total_count"], 1, "{}", list.json);
    assert_eq!(fx.node.host.hosted_count(), 1);
}

fn uuid_like() -> String {
    walrelay_engine::fleet::names::DatabaseUuid::random().to_string()
}

#[test]
fn internal_calls_need_the_cluster_keys_proof_and_bad_ones_change_nothing() {
    let fx = fixture();
    let proof =
        walrelay_engine::fleet::link::InternalAuth::new(Some(&common::fleet::test_cluster_key()))
            .header_value();
    let wrong = walrelay_engine::fleet::link::InternalAuth::new(Some(
        &walrelay_engine::ClusterKey::from_bytes([8; 32]),
    ))
    .header_value();
    let uuid = walrelay_engine::fleet::names::DatabaseUuid::random().to_string();
    let init =
        json!({"uuid": uuid, "database_id": 99, "account": "a", "name": "sneaky"}).to_string();
    for headers in [
        vec![],
        vec![("x-walrelay-node", wrong.as_str())],
        vec![("x-walrelay-node", "00")],
    ] {
        let r = fx.post_with("/internal/fleet/init", &headers, &init);
        assert_eq!(r.status, 401, "{headers:?}: {}", r.json);
    }
    // An admin API token is not the cluster's proof either.
    let bearer = fx.admin.bearer();
    let r = fx.post_with("/internal/fleet/init", &[("authorization", &bearer)], &init);
    assert_eq!(r.status, 401);
    let with = [("x-walrelay-node", proof.as_str())];
    for (call, body) in [
        ("init", "{"),
        (
            "init",
            r#"{"uuid":"nope","database_id":1,"account":"a","name":"n"}"#,
        ),
        (
            "init",
            r#"{"uuid":"x","database_id":1,"account":"a","name":"Bad Name","more":1}"#,
        ),
        ("activate", r#"{"uuid":"x"}"#),
        ("heartbeat", "[]"),
        ("routes", r#"[{"op":"put","route":{"uuid":"x"}}]"#),
        ("report", r#"{"sizes":"no"}"#),
        ("replication", r#"{"uuid":"x","database_id":1}"#),
        (
            "adopt",
            r#"{"uuid":"nope","database_id":1,"account":"a","name":"n"}"#,
        ),
        ("adopt", r#"{"uuid":"x"}"#),
        ("ping", "[]"),
        (
            "replication",
            r#"{"uuid":"nope","database_id":1,"open":true}"#,
        ),
        (
            "replication",
            r#"{"uuid":"x","database_id":1,"open":true,"more":1}"#,
        ),
    ] {
        let r = fx.post_with(&format!("/internal/fleet/{call}"), &with, body);
        assert_eq!(r.status, 400, "{call} {body}: {}", r.json);
    }
    let r = fx.post_with("/internal/fleet/nonsense", &with, "{}");
    assert_eq!(r.status, 404);
    let r = fx.post_with("/internal/fleet/ping", &with, "{}");
    assert_eq!(r.status, 200, "{}", r.json);
    let r = fx.post_with("/internal/fleet/ping", &[], "{}");
    assert_eq!(r.status, 401, "{}", r.json);
    // Where a database nobody hosts takes replicas: nowhere, and asking
    // opens nothing.
    let ask = json!({"uuid": uuid, "database_id": 99, "open": true}).to_string();
    let r = fx.post_with("/internal/fleet/replication", &[], &ask);
    assert_eq!(r.status, 401, "{}", r.json);
    let r = fx.post_with("/internal/fleet/replication", &with, &ask);
    assert_eq!(r.status, 404, "{}", r.json);
    let huge = "x".repeat(9 << 20);
    let r = fx.post_with("/internal/fleet/routes", &with, &huge);
    assert!(r.status == 413 || r.status == 0, "{}", r.status);
    // Nothing was created, nothing was routed.
    assert_eq!(fx.node.host.hosted_count(), 0);
    assert!(fx.node.routes.is_empty());
    // The proof works.
    let r = fx.post_with("/internal/fleet/init", &with, &init);
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(fx.node.host.hosted_count(), 1);
}

#[test]
fn a_token_scoped_to_a_fleet_database_reaches_it_by_name_and_uuid_and_no_other() {
    let fx = fixture();
    let mut uuids = Vec::new();
    for name in ["shop", "other"] {
        let r = fx.admin("POST", "/v1/databases", Some(json!({ "name": name })));
        assert_eq!(r.status, 200, "{}", r.json);
        uuids.push(r.json["result"]["uuid"].as_str().unwrap().to_string());
    }
    let body = json!({"sql": "SELECT 1 AS one"}).to_string();
    for path in ["shop", uuids[0].as_str()] {
        let r = fx.call(
            "POST",
            &format!("/v1/databases/{path}/query"),
            Some(&fx.shop),
            Some(&body),
        );
        assert_eq!(r.status, 200, "{path}: {}", r.json);
    }
    for path in ["other", uuids[1].as_str()] {
        let r = fx.call(
            "POST",
            &format!("/v1/databases/{path}/query"),
            Some(&fx.shop),
            Some(&body),
        );
        refused(&r, 403, path);
    }
    // Nor the control plane.
    let r = fx.call("GET", "/v1/databases", Some(&fx.shop), None);
    refused(&r, 403, "list");
}
