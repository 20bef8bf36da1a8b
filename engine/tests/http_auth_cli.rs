//! Authentication from the command line: `walrelay token create`, and
//! `walrelay primary`/`replica`, which start only with `--tokens FILE` or
//! `--insecure` (and warn with the latter).

mod common;

use common::{Proc, free_port, join_addrs, wait_accepting};
use std::path::Path;
use walrelay_engine::http::auth::{ApiToken, Grant, Permission, Scope};
use walrelay_engine::http::client::{Client, NodeInfo};
use walrelay_engine::http::token_store::TokenStore;

fn walrelay(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_walrelay"))
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run walrelay")
}

#[test]
fn token_create_prints_a_token_once_and_stores_only_its_hash_and_revoke_removes_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = dir.path().join("tokens");
    let s = store.display().to_string();
    let out = walrelay(&[
        "token",
        "create",
        "--tokens",
        &s,
        "--database",
        "main",
        "--read-only",
    ]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let token: ApiToken = text.trim().parse().expect("stdout is the token alone");
    let stored = std::fs::read_to_string(&store).expect("store");
    assert!(
        !stored.contains(&token.expose()["wrt_".len() + 17..]),
        "no secret"
    );
    let out = walrelay(&["token", "create", "--tokens", &s, "--all"]);
    assert!(out.status.success(), "{out:?}");
    let admin: ApiToken = String::from_utf8(out.stdout)
        .expect("utf-8")
        .trim()
        .parse()
        .expect("token");
    let loaded = TokenStore::open(&store).expect("open");
    assert_eq!(loaded.len(), 2);
    assert_eq!(
        loaded.verify(&token).expect("valid"),
        Grant {
            scope: Scope::Database("main".into()),
            permission: Permission::Read
        }
    );
    assert_eq!(
        loaded.verify(&admin).expect("valid"),
        Grant {
            scope: Scope::All,
            permission: Permission::ReadWrite
        }
    );
    // A scope is required, and only one.
    assert!(
        !walrelay(&["token", "create", "--tokens", &s])
            .status
            .success()
    );
    assert!(
        !walrelay(&[
            "token",
            "create",
            "--tokens",
            &s,
            "--all",
            "--database",
            "main"
        ])
        .status
        .success()
    );
    assert_eq!(TokenStore::open(&store).expect("open").len(), 2);
    // Revoking by id removes exactly that token; a second time fails.
    let id = token.id().to_string();
    assert!(
        walrelay(&["token", "revoke", "--tokens", &s, &id])
            .status
            .success()
    );
    assert!(
        !walrelay(&["token", "revoke", "--tokens", &s, &id])
            .status
            .success()
    );
    let loaded = TokenStore::open(&store).expect("open");
    assert_eq!(loaded.len(), 1);
    assert!(loaded.verify(&token).is_err() && loaded.verify(&admin).is_ok());
}

/// `walrelay primary` or `replica` with `--http` and `extra`: it must not
/// start; what it printed.
fn refused_start(role: &str, dir: &Path, extra: &[&str]) -> String {
    let d = dir.join(role).display().to_string();
    let http = free_port().to_string();
    // Replication runs unauthenticated here so that only the HTTP API's
    // authentication decides.
    let mut args = vec![role, "--dir", &d, "--http", &http, "--insecure-replication"];
    let unreachable = "127.0.0.1:1".to_string();
    let primary_url = "http://127.0.0.1:1".to_string();
    match role {
        "primary" => args.extend(["--followers", unreachable.as_str()]),
        _ => args.extend([
            "--leader",
            unreachable.as_str(),
            "--primary-http",
            primary_url.as_str(),
        ]),
    }
    args.extend(extra);
    let out = walrelay(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{role} {extra:?} started: {stderr}");
    stderr
}

#[test]
fn a_node_with_neither_tokens_nor_insecure_or_with_a_bad_store_refuses_to_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad-tokens");
    std::fs::write(&bad, b"[]").expect("write");
    let missing = dir.path().join("no-such-file").display().to_string();
    let bad = bad.display().to_string();
    for role in ["primary", "replica"] {
        let e = refused_start(role, dir.path(), &[]);
        assert!(
            e.contains("--tokens FILE") && e.contains("--insecure"),
            "{e}"
        );
        let e = refused_start(role, dir.path(), &["--tokens", &bad]);
        assert!(e.contains("token store") && e.contains("not valid"), "{e}");
        let e = refused_start(role, dir.path(), &["--tokens", &missing]);
        assert!(e.contains("token store"), "{e}");
        let e = refused_start(role, dir.path(), &["--tokens", &bad, "--insecure"]);
        assert!(e.contains("cannot be used with"), "{e}");
    }
}

#[test]
fn an_insecure_primary_serves_without_a_token_and_warns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (key, _) = common::cluster_key_file(dir.path());
    let (followers, addrs) = common::spawn_followers(dir.path(), 3, &key);
    let http = free_port();
    let mut args = vec![
        "primary".into(),
        "--dir".into(),
        dir.path().join("primary").display().to_string(),
        "--followers".into(),
        join_addrs(&addrs),
        "--listen".into(),
        free_port().to_string(),
        "--http".into(),
        http.to_string(),
        "--insecure".into(),
    ];
    args.extend(common::key_args(&key));
    let mut primary = Proc::spawn("primary", &args);
    primary.wait_line("primary epoch");
    wait_accepting(http, "the primary's HTTP");
    let warning = primary.wait_line("WARNING");
    assert!(warning.contains("without authentication"), "{warning}");
    let client = Client::new(
        vec![NodeInfo {
            url: format!("http://{http}"),
            region: "primary-region".into(),
            primary: true,
        }],
        "primary-region",
        "main",
    );
    let s = client.session("first-primary");
    s.query("CREATE TABLE t(x)", vec![])
        .expect("no token needed");
    let r = s
        .query("SELECT count(*) AS n FROM t", vec![])
        .expect("read");
    assert_eq!(r.response.result[0].results[0]["n"], 0);
    let metrics = ureq::get(format!("http://{http}/metrics"))
        .call()
        .expect("metrics without a token");
    assert_eq!(metrics.status().as_u16(), 200);
    primary.assert_running();
    drop(followers);
}
