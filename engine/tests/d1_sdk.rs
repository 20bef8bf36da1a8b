//! Cloudflare's official Python SDK (PyPI `cloudflare==4.3.1`) against a
//! node of a local cluster, through Cloudflare's paths and envelope: the
//! script `d1_sdk/sdk_flow.py` queries (several statements, parameters),
//! raw, batch, exports and downloads the signed URL, imports (init, PUT,
//! ingest, poll), asks for a time-travel bookmark and checks that errors
//! surface as the SDK's exceptions.
//!
//! Under `CI=true` a missing python3 or SDK fails the test; elsewhere it
//! is skipped with the reason printed (`python3 -m pip install
//! 'cloudflare==4.3.1'`).

mod common;

use common::HttpCluster;
use std::process::Command;
use walrelay_archive::{ArchiverConfig, Store};
use walrelay_engine::local_cluster::LocalClusterConfig;
use walrelay_replicator::DatabaseId;

const SDK: &str = "4.3.1";

/// Whether python3 with the SDK at [`SDK`] is here; why not otherwise.
fn sdk_available() -> Result<(), String> {
    let out = Command::new("python3")
        .args(["-c", "import cloudflare; print(cloudflare.__version__)"])
        .output()
        .map_err(|e| format!("python3 did not run: {e}"))?;
    let version = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() {
        return Err(format!(
            "the cloudflare SDK is not installed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    if version != SDK {
        return Err(format!("cloudflare {version} is installed, not {SDK}"));
    }
    Ok(())
}

#[test]
fn cloudflares_python_sdk_drives_a_node_through_cloudflares_paths() {
    if let Err(why) = sdk_available() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci, "CI=true and the SDK test cannot run: {why}");
        eprintln!("skipped: {why} (python3 -m pip install 'cloudflare=={SDK}')");
        return;
    }
    // Cold storage (a directory), so time travel can answer.
    let store_dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(&format!("file://{}", store_dir.path().display())).expect("store");
    let mut archiver = ArchiverConfig::new(DatabaseId(1), store_dir.path().join("unused"));
    archiver.max_lag_ms = 0;
    archiver.max_lag_bytes = 0;
    archiver.local_keep_bytes = 0;
    let h = HttpCluster::start(
        LocalClusterConfig {
            replica_regions: vec!["region-a".into()],
            archive: Some((store, archiver)),
            ..LocalClusterConfig::default()
        },
        &[],
    );
    let token = h.admin();
    let token = token.strip_prefix("Bearer ").unwrap_or(&token);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/d1_sdk/sdk_flow.py");
    for (node, url) in [
        ("primary", h.c.primary_http.url()),
        ("replica", h.c.replica_http[0].url()),
    ] {
        let db = "main";
        if node == "replica" {
            // The replica must know what the primary run created, or the
            // script's CREATE TABLE would collide: start afresh there.
            let r = h.post(
                &h.c.primary_http.url(),
                br#"{"sql":"DROP TABLE sdk; DROP TABLE imported"}"#,
            );
            assert_eq!(r.status, 200, "{}", r.json);
            h.wait_replicas();
        }
        let out = Command::new("python3")
            .args([script, &url, token, db])
            .output()
            .expect("python3 runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.trim_end().ends_with("ok"),
            "the SDK script failed against the {node}:\n{stdout}\n{stderr}"
        );
    }
    // What the script imported through the replica is on the primary.
    let r = h.post(
        &h.c.primary_http.url(),
        br#"{"sql":"SELECT count(*) AS n FROM imported"}"#,
    );
    assert_eq!(r.json["result"][0]["results"][0]["n"], 2, "{}", r.json);
}

#[test]
fn cloudflares_python_sdk_creates_lists_gets_queries_and_deletes_fleet_databases() {
    if let Err(why) = sdk_available() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci, "CI=true and the SDK test cannot run: {why}");
        eprintln!("skipped: {why} (python3 -m pip install 'cloudflare=={SDK}')");
        return;
    }
    let fx = common::fleet::HttpFleet::start(common::fleet::Tuning {
        max_open: 16,
        idle_close_ms: 60_000,
        heartbeat_ms: 60_000,
        limits: false,
    });
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/d1_sdk/sdk_fleet.py");
    let out = Command::new("python3")
        .args([script, &fx.url, &fx.admin.expose()])
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "the SDK script failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
