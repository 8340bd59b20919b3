//! `idem serve --store postgres://…` and `mysql://…`, and the SQL upkeep
//! commands `idem migrate` and `idem sweep`, as users run them.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{post, run, start, unique};

/// The databases this build of idem opens: MySQL only with the `mysql`
/// feature.
fn databases() -> Vec<(&'static str, String)> {
    vec![
        (
            "PostgreSQL",
            idem_testkit::services::url(
                "IDEM_TEST_POSTGRES_URL",
                "postgres://postgres@127.0.0.1:5432/test",
            ),
        ),
        #[cfg(feature = "mysql")]
        (
            "MySQL",
            idem_testkit::services::url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
        ),
    ]
}

/// `url` with idem's settings added to its query.
fn with(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Whether `idem migrate` can reach the database; skips (or fails in CI)
/// when it cannot.
fn reachable(service: &str, url: &str) -> bool {
    let (code, _, err) = run(
        &["migrate", "--store", &with(url, "table=idem_cli_probe")],
        &[],
    );
    code == 0 || idem_testkit::services::absent::<()>(service, url, err).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_on_both_databases_and_records_outlive_the_process() {
    for (service, url) in databases() {
        if !reachable(service, &url) {
            continue;
        }
        let store = with(&url, "table=idem_serve_sql&shards=4&pool_size=4");
        let key = unique("order");
        let idem = start(&["serve", "--store", &store], &[]).await;
        let ready = support::get(&idem.url("/readyz")).await;
        assert_eq!(ready.status, 200, "{service}");
        let b = post(&idem.url("/v1/sql/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(b["status"], "acquired", "{service}");
        let busy = post(&idem.url("/v1/sql/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(busy["status"], "in_progress", "{service}");
        let done = post(
            &idem.url("/v1/sql/complete"),
            json!({"key": key, "token": b["token"], "outcome": {"paid": 42}, "retention_ms": 60000}),
        )
        .await;
        assert_eq!(done.status, 200, "{service}");
        assert_eq!(idem.terminate().await, 0);

        let idem = start(&["serve", "--store", &store], &[]).await;
        let replay = post(&idem.url("/v1/sql/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(replay["status"], "completed", "{service}");
        assert_eq!(replay["outcome"], json!({"paid": 42}), "{service}");
        let batch = post(
            &idem.url("/v1/sql/begin-batch"),
            json!({"items": [{"key": key}, {"key": unique("fresh")}]}),
        )
        .await
        .json();
        assert_eq!(batch["results"][0]["status"], "completed", "{service}");
        assert_eq!(batch["results"][1]["status"], "acquired", "{service}");
        assert_eq!(idem.terminate().await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_and_sweep_do_their_upkeep_and_say_so() {
    for (service, url) in databases() {
        if !reachable(service, &url) {
            continue;
        }
        let prefix = format!("idem_upkeep_{}", std::process::id());
        let store = with(&url, &format!("table={prefix}&shards=2"));
        let (code, out, err) = run(&["migrate", "--store", &store], &[]);
        assert_eq!(code, 0, "{service}: {err}");
        assert!(out.contains("applied schema version(s) 1"), "{out}");
        let (code, out, _) = run(&["migrate", "--store", &store], &[]);
        assert_eq!(code, 0);
        assert!(out.contains("already at schema version 3"), "{out}");
        let (code, _, err) = run(
            &[
                "migrate",
                "--store",
                &with(&url, &format!("table={prefix}&shards=3")),
            ],
            &[],
        );
        assert_eq!(code, 1);
        assert!(err.contains("shards=2"), "{err}");

        // Three records that expire at once, one that does not.
        let idem = start(&["serve", "--store", &store], &[]).await;
        for (i, retention) in [1, 1, 1, 600_000].into_iter().enumerate() {
            let key = format!("k{i}");
            let b = post(&idem.url("/v1/upkeep/begin"), json!({"key": key}))
                .await
                .json();
            let done = post(
                &idem.url("/v1/upkeep/complete"),
                json!({"key": key, "token": b["token"], "retention_ms": retention}),
            )
            .await;
            assert_eq!(done.status, 200);
        }
        assert_eq!(idem.terminate().await, 0);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (code, out, err) = run(&["sweep", "--store", &store, "--batch", "2"], &[]);
        assert_eq!(code, 0, "{service}: {err}");
        assert!(
            out.contains("deleted 3 expired record(s)"),
            "{service}: {out}"
        );
        let (_, out, _) = run(&["sweep", "--store", &store], &[]);
        assert!(out.contains("deleted 0 expired record(s)"), "{out}");
        // Drop the tables this test made.
        let drop = |t: &str| {
            if url.starts_with("postgres") {
                format!("DROP TABLE \"{t}\"")
            } else {
                format!("DROP TABLE `{t}`")
            }
        };
        let tables = [
            format!("{prefix}_00"),
            format!("{prefix}_01"),
            format!("{prefix}_schema"),
            format!("{prefix}_tokens"),
        ];
        drop_tables(&url, tables.iter().map(|t| drop(t)).collect()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upkeep_output_and_help_never_show_the_store_password() {
    let (service, url) = databases().into_iter().next().unwrap();
    if !reachable(service, &url) {
        return;
    }
    // The test server trusts local logins, so any password is accepted: one
    // in the user information, one as a query parameter.
    let Some((scheme, rest)) = url.split_once("://") else {
        panic!("{url} has a scheme")
    };
    let with_password = match rest.split_once('@') {
        Some((user, host)) => format!(
            "{scheme}://{}:hunter1@{host}",
            user.split(':').next().unwrap()
        ),
        None => format!("{scheme}://postgres:hunter1@{rest}"),
    };
    let prefix = format!("idem_redacted_{}", std::process::id());
    let store = with(&with_password, &format!("password=hunter2&table={prefix}"));
    for command in [
        vec!["migrate", "--store", &store],
        vec!["sweep", "--store", &store],
    ] {
        let (code, out, err) = run(&command, &[]);
        assert_eq!(code, 0, "{service}: {err}");
        assert!(out.contains("***"), "{out}");
        for secret in ["hunter1", "hunter2"] {
            assert!(
                !out.contains(secret) && !err.contains(secret),
                "{command:?} showed the password: {out}{err}"
            );
        }
    }
    // Help shows where settings come from, not what the environment holds.
    let (_, out, err) = run(&["sweep", "--help"], &[("IDEM_STORE", &store)]);
    assert!(out.contains("IDEM_STORE"), "{out}");
    assert!(!out.contains("hunter") && !err.contains("hunter"), "{out}");
    let tables = [
        prefix.clone(),
        format!("{prefix}_schema"),
        format!("{prefix}_tokens"),
    ];
    drop_tables(
        &url,
        tables
            .iter()
            .map(|t| format!("DROP TABLE \"{t}\""))
            .collect(),
    )
    .await;
}

async fn drop_tables(url: &str, statements: Vec<String>) {
    use sqlx::{AssertSqlSafe, Connection, Executor};
    for sql in statements {
        if url.starts_with("postgres") {
            let mut c = sqlx::PgConnection::connect(url).await.unwrap();
            c.execute(AssertSqlSafe(sql)).await.unwrap();
        } else {
            let mut c = sqlx::MySqlConnection::connect(url).await.unwrap();
            c.execute(AssertSqlSafe(sql)).await.unwrap();
        }
    }
}

#[test]
fn bad_sql_store_settings_and_unreachable_databases_are_clear() {
    let (code, _, err) = run(
        &[
            "serve",
            "--store",
            "postgres://u@127.0.0.1:5432/test?shards=many",
        ],
        &[],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("shards"), "{err}");
    let (code, _, err) = run(
        &["serve", "--store", "mysql://app:s3cret@127.0.0.1:1/test"],
        &[],
    );
    if cfg!(feature = "mysql") {
        assert_eq!(code, 1, "{err}");
        assert!(
            err.contains("is the server running") && !err.contains("s3cret"),
            "{err}"
        );
    } else {
        // A build without the MySQL driver says how to get one.
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("--features mysql") && !err.contains("s3cret"),
            "{err}"
        );
    }
    let (code, _, err) = run(&["sweep", "--store", "memory://"], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("works on SQL stores"), "{err}");
}
