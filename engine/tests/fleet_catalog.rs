//! The catalog contract, run against both backends: the embedded walrelay
//! SQLite catalog and a real PostgreSQL server.

mod common;

use std::sync::Arc;
use walrelay_engine::fleet::catalog::{
    AccountLimits, Catalog, CatalogError, CatalogReads, DatabaseRow, PgCatalog, Plan,
    SqliteCatalog, now_ms,
};
use walrelay_engine::fleet::names::{AccountId, DatabaseName, DatabaseUuid};
use walrelay_engine::{Database, Options};
use walrelay_replicator::DatabaseId;

fn row(account: &str, name: &str, id: u64) -> DatabaseRow {
    DatabaseRow {
        uuid: DatabaseUuid::random(),
        database_id: DatabaseId(id),
        account: AccountId::new(account).unwrap(),
        name: DatabaseName::new(name).unwrap(),
        node: "http://n1".into(),
        location: String::new(),
        created_at_ms: now_ms() + id as i64,
        deleted_at_ms: None,
    }
}

/// Everything a catalog must do, identically on every backend.
fn contract(c: &dyn Catalog, reads: &CatalogReads) {
    let a = AccountId::new("acct").unwrap();
    let b = AccountId::new("other").unwrap();
    let r1 = row("acct", "one", 1 << 62);
    let r2 = row("acct", "two", 2);
    c.insert(&r1, 10).unwrap();
    c.insert(&r2, 10).unwrap();
    c.insert(&row("other", "one", 3), 10).unwrap();
    assert!(matches!(
        c.insert(&row("acct", "one", 4), 10),
        Err(CatalogError::NameTaken(_))
    ));
    assert!(matches!(
        c.insert(&row("acct", "three", 5), 2),
        Err(CatalogError::TooManyDatabases(2))
    ));
    let before = reads.total();
    assert_eq!(
        c.get(r1.uuid).unwrap().as_ref(),
        Some(&r1),
        "ids round-trip, even above 2^62"
    );
    assert!(reads.total() > before, "reads are counted");
    assert_eq!(
        c.by_name(&a, &DatabaseName::new("two").unwrap()).unwrap(),
        Some(r2.clone())
    );
    assert_eq!(c.get(DatabaseUuid::random()).unwrap(), None);
    let page = c.list(&a, None, 0, 1).unwrap();
    assert_eq!((page.total, page.rows.len()), (2, 1));
    assert_eq!(page.rows[0].uuid, r2.uuid, "creation order");
    assert_eq!(c.list(&a, Some("on"), 0, 10).unwrap().total, 1);
    assert_eq!(
        c.list(&a, Some("%"), 0, 10).unwrap().total,
        0,
        "no wildcards"
    );
    assert!(c.mark_deleted(r1.uuid, now_ms()).unwrap());
    assert!(
        !c.mark_deleted(r1.uuid, now_ms()).unwrap(),
        "already deleted"
    );
    assert!(c.get(r1.uuid).unwrap().unwrap().deleted_at_ms.is_some());
    assert_eq!(
        c.by_name(&a, &DatabaseName::new("one").unwrap()).unwrap(),
        None
    );
    c.insert(&row("acct", "one", 6), 10).unwrap(); // the name is free again
    assert_eq!(c.list(&b, None, 0, 10).unwrap().total, 1);

    // Failover: a node's live databases, paged in uuid order; moving one.
    let on_n1 = |after| c.on_node("http://n1", after, 2).unwrap();
    let first = on_n1(None);
    assert_eq!(first.len(), 2, "three live rows on n1, a page of two");
    assert!(first[0].uuid.to_string() < first[1].uuid.to_string());
    let rest = on_n1(Some(first[1].uuid));
    assert_eq!(rest.len(), 1);
    assert!(
        first.iter().chain(&rest).all(|r| r.deleted_at_ms.is_none()),
        "deleted rows are not moved"
    );
    assert!(c.set_node(r2.uuid, "http://n2").unwrap());
    assert_eq!(c.get(r2.uuid).unwrap().unwrap().node, "http://n2");
    assert_eq!(
        c.on_node("http://n2", None, 10).unwrap(),
        vec![c.get(r2.uuid).unwrap().unwrap()]
    );
    assert_eq!(
        on_n1(None).len() + on_n1(Some(on_n1(None)[1].uuid)).len(),
        2
    );
    assert!(
        !c.set_node(r1.uuid, "http://n2").unwrap(),
        "a deleted database stays put"
    );

    // Accounts: the Free plan by default, then whatever is set.
    assert_eq!(c.account(&a).unwrap(), AccountLimits::free(a.clone()));
    let paid = AccountLimits {
        plan: Plan::Paid,
        max_storage_bytes: 1_000,
        ..AccountLimits::free(a.clone())
    };
    c.set_account(&paid).unwrap();
    assert_eq!(c.account(&a).unwrap(), paid);

    // Sizes: the trigger writes deltas, the fold adds them per account,
    // once.
    c.write_sizes(&[(r1.uuid, a.clone(), 100), (r2.uuid, a.clone(), 200)])
        .unwrap();
    c.write_sizes(&[(r1.uuid, a.clone(), 150), (r2.uuid, a.clone(), 200)])
        .unwrap();
    assert_eq!(c.account_storage_bytes(&a).unwrap(), 0, "not folded yet");
    assert_eq!(
        c.fold_size_deltas().unwrap(),
        3,
        "two inserts and one change"
    );
    assert_eq!(c.account_storage_bytes(&a).unwrap(), 350);
    assert_eq!(c.fold_size_deltas().unwrap(), 0);
    c.write_sizes(&[(r1.uuid, a.clone(), 0)]).unwrap();
    c.fold_size_deltas().unwrap();
    assert_eq!(c.account_storage_bytes(&a).unwrap(), 200);
    assert_eq!(c.account_storage_bytes(&b).unwrap(), 0);
}

#[test]
fn the_embedded_catalog_keeps_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let reads = Arc::new(CatalogReads::default());
    let db = Database::open(dir.path().join("catalog.db"), Options::default()).unwrap();
    let c = SqliteCatalog::open(db, Arc::clone(&reads)).unwrap();
    contract(&c, &reads);
    // The schema is created idempotently on every open.
    let db = c.database().clone();
    drop(c);
    SqliteCatalog::open(db, Arc::clone(&reads)).unwrap();
}

#[test]
fn the_postgresql_catalog_keeps_the_contract() {
    let Some(pg) = common::pg::PgServer::start() else {
        return;
    };
    let url = pg.database("contract");
    let reads = Arc::new(CatalogReads::default());
    let c = PgCatalog::connect(&url, Arc::clone(&reads)).unwrap();
    contract(&c, &reads);
    // The schema is created idempotently on every connect.
    PgCatalog::connect(&url, Arc::clone(&reads)).unwrap();
}

#[test]
fn an_unreachable_postgresql_catalog_is_a_typed_error() {
    let port = common::free_port().port();
    let err = PgCatalog::connect(
        &format!("postgres://walrelay@127.0.0.1:{port}/x"),
        Arc::new(CatalogReads::default()),
    )
    .unwrap_err();
    assert!(matches!(err, CatalogError::Unavailable(_)), "{err}");
}
