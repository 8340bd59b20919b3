//! Versioned migrations: applied once however many stores open together,
//! checked when asked not to apply, and refused for a different shard
//! count or a newer schema.
// Every test here reaches MySQL too (or shares its support code).
#![cfg(feature = "mysql")]

mod support;

use idem_sql::{OpenError, SCHEMA_VERSION, SqlStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_opening_together_apply_each_version_once() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("migrate");
        // Without migrating, a fresh prefix is refused with what to run.
        match SqlStore::builder(&url)
            .table(&prefix)
            .migrate(false)
            .connect()
            .await
        {
            Err(OpenError::Migrate(m)) => assert!(m.contains("idem migrate"), "{m}"),
            Err(e) => {
                let _ = idem_testkit::services::absent::<()>(service, &url, e);
                continue;
            }
            Ok(_) => panic!("{service}: opened tables that do not exist"),
        }
        let opens = (0..6).map(|_| {
            let (url, prefix) = (url.clone(), prefix.clone());
            tokio::spawn(async move {
                SqlStore::builder(&url)
                    .table(&prefix)
                    .shards(4)
                    .connect()
                    .await
            })
        });
        let mut stores = Vec::new();
        for open in opens {
            stores.push(
                open.await
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{service}: {e}")),
            );
        }
        let schema = if url.starts_with("postgres") {
            format!("\"{prefix}_schema\"")
        } else {
            format!("`{prefix}_schema`")
        };
        let rows = support::count(&url, &format!("SELECT COUNT(*) FROM {schema}")).await;
        assert_eq!(
            rows,
            i64::from(SCHEMA_VERSION),
            "{service}: one row per version"
        );

        let again = SqlStore::builder(&url)
            .table(&prefix)
            .shards(4)
            .run_migrations()
            .await
            .unwrap();
        assert!(again.applied.is_empty());
        assert_eq!(again.version, SCHEMA_VERSION);
        // Checking only: the schema is current, so this opens.
        SqlStore::builder(&url)
            .table(&prefix)
            .shards(4)
            .migrate(false)
            .connect()
            .await
            .unwrap();

        match SqlStore::builder(&url)
            .table(&prefix)
            .shards(8)
            .connect()
            .await
        {
            Err(OpenError::Migrate(m)) => assert!(m.contains("shards=4"), "{m}"),
            other => panic!(
                "{service}: another shard count must be refused, got {:?}",
                other.err()
            ),
        }
        support::exec(
            &url,
            &format!(
                "INSERT INTO {schema} (version, description, shards) VALUES (99, 'future', 4)"
            ),
        )
        .await;
        match SqlStore::builder(&url)
            .table(&prefix)
            .shards(4)
            .connect()
            .await
        {
            Err(OpenError::Migrate(m)) => assert!(m.contains("upgrade idem"), "{m}"),
            other => panic!(
                "{service}: a newer schema must be refused, got {:?}",
                other.err()
            ),
        }
        support::drop_tables(&stores[0], &url).await;
    }
}

/// A store made at schema version 1 gains the token high-water table, one
/// row per record table, and (on PostgreSQL) the completion index, when
/// it opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_one_tables_gain_the_token_marks() {
    for (service, url) in support::databases() {
        let prefix = support::fresh_prefix("upgrade");
        let Some(store) = support::open(service, &url, |b| b.table(&prefix).shards(4)).await else {
            continue;
        };
        let q = |name: &str| {
            if url.starts_with("postgres") {
                format!("\"{name}\"")
            } else {
                format!("`{name}`")
            }
        };
        let (schema, tokens) = (
            q(&format!("{prefix}_schema")),
            q(&format!("{prefix}_tokens")),
        );
        // Back to version 1: what a store opened by an older idem left.
        support::exec(&url, &format!("DROP TABLE {tokens}")).await;
        support::exec(&url, &format!("DELETE FROM {schema} WHERE version >= 2")).await;
        if url.starts_with("postgres") {
            let drop = format!(
                "DO $$ DECLARE i record; BEGIN
                   FOR i IN SELECT indexname FROM pg_indexes
                            WHERE indexname LIKE '{prefix}\\_%\\_completed' LOOP
                     EXECUTE format('DROP INDEX %I', i.indexname);
                   END LOOP;
                 END $$"
            );
            support::exec(&url, &drop).await;
        }
        match SqlStore::builder(&url)
            .table(&prefix)
            .shards(4)
            .migrate(false)
            .connect()
            .await
        {
            Err(OpenError::Migrate(m)) => {
                assert!(
                    m.contains("schema version 1") && m.contains("idem migrate"),
                    "{m}"
                )
            }
            other => panic!(
                "{service}: version 1 tables must be refused without migrating, got {:?}",
                other.err()
            ),
        }
        let migrated = SqlStore::builder(&url)
            .table(&prefix)
            .shards(4)
            .run_migrations()
            .await
            .unwrap();
        assert_eq!(migrated.applied, [2, 3], "{service}");
        let rows = support::count(&url, &format!("SELECT COUNT(*) FROM {tokens}")).await;
        assert_eq!(rows, 4, "{service}: one mark per record table");
        if url.starts_with("postgres") {
            let indexes = support::count(
                &url,
                &format!(
                    "SELECT COUNT(*) FROM pg_indexes WHERE indexname LIKE '{prefix}\\_%\\_completed'"
                ),
            )
            .await;
            assert_eq!(indexes, 4, "one completion index per record table");
        }
        support::drop_tables(&store, &url).await;
    }
}
