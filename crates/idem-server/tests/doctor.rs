//! `idem doctor` as an operator runs it: a healthy file store, Redis and
//! PostgreSQL pass; a Redis that evicts, tables not migrated, a store or a
//! broker that cannot be reached fail, each with its fix.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::{run, unique};

fn doctor(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["doctor"];
    all.extend_from_slice(args);
    run(&all, &[])
}

/// The line of check `check`, failing the test when there is none.
fn line<'a>(out: &'a str, check: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
        .unwrap_or_else(|| panic!("no {check} line in:\n{out}"))
}

#[test]
fn a_healthy_file_store_passes_every_check() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let (code, out, err) = doctor(&["--store", &url]);
    assert_eq!(code, 0, "{out}{err}");
    for check in ["store", "round", "claims", "clock"] {
        assert!(line(&out, check).starts_with("ok"), "{out}");
    }
    let (code, out, _) = doctor(&["--store", &url, "--json"]);
    assert_eq!(code, 0);
    let checks: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(checks.iter().all(|c| c["status"] == "ok"), "{out}");
    assert!(checks.iter().any(|c| c["check"] == "claims"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_passes_and_an_unreachable_store_or_broker_fails_with_a_fix() {
    let Some(url) = support::redis().await else {
        return;
    };
    let (code, out, err) = doctor(&["--store", &url]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(line(&out, "eviction").starts_with("ok"), "{out}");
    assert!(line(&out, "clock").contains("ahead of") || line(&out, "clock").contains("behind"));
    // The test Redis keeps nothing on disk: a warning, not a failure.
    assert!(line(&out, "persistence").starts_with("warn"), "{out}");
    assert!(
        out.contains("fix: redis-cli CONFIG SET appendonly yes"),
        "{out}"
    );
    // The probe leaves nothing behind that idem stats would list.
    let (code, out, err) = run(&["stats", "--store", &url, "--json"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("\"idem-doctor\""), "{out}");

    let (code, out, err) = doctor(&["--store", "redis://127.0.0.1:1"]);
    assert_eq!(code, 1);
    assert!(line(&out, "store").starts_with("FAIL"), "{out}");
    assert!(
        out.contains("fix:") && err.contains("a check failed"),
        "{out}{err}"
    );

    let (code, out, _) = doctor(&[
        "--store",
        &url,
        "--from",
        "amqp://guest:guest@127.0.0.1:1/%2f?queue=q",
    ]);
    assert_eq!(code, 1);
    assert!(line(&out, "store").starts_with("ok"), "{out}");
    assert!(line(&out, "broker").starts_with("FAIL"), "{out}");
}

/// A private `redis-server` that evicts under memory pressure.
struct EvictingRedis {
    child: Child,
    port: u16,
}

impl Drop for EvictingRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_evicts_records_fails() {
    if !idem_testkit::services::program("redis-server") {
        return;
    }
    let port = support::consume::free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--maxmemory",
            "100mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let redis = EvictingRedis { child, port };
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let mut tries = 0;
    let out = loop {
        let (code, out, _) = doctor(&["--store", &url]);
        if !line_or_none(&out, "store").is_some_and(|l| l.starts_with("FAIL")) {
            assert_eq!(code, 1, "{out}");
            break out;
        }
        tries += 1;
        assert!(tries < 50, "the private Redis never started: {out}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let eviction = line(&out, "eviction");
    assert!(
        eviction.starts_with("FAIL") && eviction.contains("allkeys-lru"),
        "{out}"
    );
    assert!(out.contains("maxmemory-policy noeviction"), "{out}");
}

fn line_or_none<'a>(out: &'a str, check: &str) -> Option<&'a str> {
    out.lines()
        .find(|l| l.split_whitespace().nth(1) == Some(check))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_not_migrated_fail_until_idem_migrate_runs() {
    let base = idem_testkit::services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    if let Err(e) = sqlx::PgPool::connect(&base).await {
        idem_testkit::services::absent::<()>("PostgreSQL", &base, e);
        return;
    }
    let table = unique("idem_doctor").replace('-', "_");
    let url = format!("{base}?table={table}");
    let (code, out, _) = doctor(&["--store", &url]);
    assert_eq!(code, 1, "{out}");
    assert!(line(&out, "store").starts_with("FAIL"), "{out}");
    assert!(out.contains("fix: idem migrate --store URL"), "{out}");
    let (code, _, err) = run(&["migrate", "--store", &url], &[]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = doctor(&["--store", &url]);
    assert_eq!(code, 0, "{out}{err}");
    for check in ["store", "claims", "schema", "fsync", "synchronous_commit"] {
        assert!(line(&out, check).starts_with("ok"), "{check}: {out}");
    }
    let pool = sqlx::PgPool::connect(&base).await.unwrap();
    for t in [
        table.clone(),
        format!("{table}_schema"),
        format!("{table}_tokens"),
    ] {
        let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE IF EXISTS \"{t}\"")))
            .execute(&pool)
            .await;
    }
}
