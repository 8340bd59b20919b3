//! `idem serve --store tiered`: a hot tier in front of a cold one, as users
//! run it: history that outlives the process and the hot tier, tokens that
//! never go back, the key filter's snapshot, and settings that cannot work
//! refused with what to change.

mod support;

use serde_json::json;
use support::{get, post, run, start};

const SEED: &str = "00112233445566778899aabbccddeeff";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_history_outlives_the_process_and_the_hot_tier() {
    let dir = tempfile::tempdir().unwrap();
    let cold = format!("file://{}", dir.path().join("cold").display());
    let snapshot = dir.path().join("filter.snapshot");
    let snapshot = snapshot.to_str().unwrap();
    let args = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &cold,
        "--hot-retention-ms",
        "1000",
        "--filter-seed",
        SEED,
        "--filter-snapshot",
        snapshot,
    ];
    let idem = start(&args, &[]).await;
    let mut last_token = 0u64;
    for i in 0..50 {
        let key = format!("order-{i}");
        let b = post(&idem.url("/v1/orders/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(b["status"], "acquired", "{b}");
        last_token = last_token.max(b["token"].as_u64().unwrap());
        let done = post(
            &idem.url("/v1/orders/complete"),
            json!({"key": key, "token": b["token"], "outcome": {"n": i}, "retention_ms": 3_600_000}),
        )
        .await;
        assert_eq!(done.status, 200, "{}", done.problem(200));
    }
    // A graceful stop flushes the write-behind queue and snapshots the filter.
    assert_eq!(idem.terminate().await, 0);
    assert!(
        std::path::Path::new(snapshot).exists(),
        "the filter's snapshot was written"
    );

    // A new process: its memory hot tier is empty, so every replay comes
    // from the cold tier.
    let idem = start(&args, &[]).await;
    for i in 0..50 {
        let key = format!("order-{i}");
        let b = post(&idem.url("/v1/orders/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(b["status"], "completed", "{key}: {b}");
        assert_eq!(b["outcome"], json!({"n": i}));
    }
    let fresh = post(&idem.url("/v1/orders/begin"), json!({"key": "new"}))
        .await
        .json();
    assert_eq!(fresh["status"], "acquired");
    assert!(
        fresh["token"].as_u64().unwrap() > last_token,
        "a token went back after the restart: {fresh} after {last_token}"
    );
    assert_eq!(idem.terminate().await, 0);
}

/// The value of the metric line that starts with `series` (name and
/// labels), if the page has one.
fn metric(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// A filter loaded from a good snapshot is caught up from the cold tier
/// with only what was completed after the snapshot, written there while
/// no filter was watching, and answers "certainly new" at once after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filter_snapshot_is_caught_up_with_what_was_written_since() {
    let dir = tempfile::tempdir().unwrap();
    let cold_dir = dir.path().join("cold");
    let cold = format!("file://{}", cold_dir.display());
    let snapshot = dir.path().join("filter.snapshot");
    let snapshot = snapshot.to_str().unwrap();
    let tiered = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &cold,
        "--filter-seed",
        SEED,
        "--filter-snapshot",
        snapshot,
    ];
    let deliver = |base: String, ns: &'static str, key: String| async move {
        let b = post(&format!("{base}/v1/{ns}/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(b["status"], "acquired", "{key}: {b}");
        let done = post(
            &format!("{base}/v1/{ns}/complete"),
            json!({"key": key, "token": b["token"], "outcome": "done", "retention_ms": 3_600_000}),
        )
        .await;
        assert_eq!(done.status, 200, "{}", done.problem(200));
    };
    let idem = start(&tiered, &[]).await;
    for i in 0..200 {
        deliver(idem.base.clone(), "before", format!("b-{i}")).await;
    }
    // Past the catch-up's margin before the last snapshot is taken.
    tokio::time::sleep(std::time::Duration::from_millis(5_500)).await;
    assert_eq!(idem.terminate().await, 0);
    assert!(std::path::Path::new(snapshot).exists());

    // The cold tier served on its own: 30 records the filter never saw.
    let plain = start(&["serve", "--store", &cold], &[]).await;
    for i in 0..30 {
        deliver(plain.base.clone(), "after", format!("a-{i}")).await;
    }
    assert_eq!(plain.terminate().await, 0);

    let idem = start(&tiered, &[]).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let page = loop {
        let page = get(&idem.url("/metrics")).await;
        let page = String::from_utf8_lossy(&page.body).into_owned();
        // The gauge turns to 1 just before the feed is counted: wait for
        // both.
        let fed = metric(&page, "idem_filter_fed_keys_total{how=\"catch_up\"} ").or(metric(
            &page,
            "idem_filter_fed_keys_total{how=\"rebuild\"} ",
        ));
        if metric(&page, "idem_filter_ready ") == Some(1.0) && fed.is_some() {
            break page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the filter is not ready 10 s after the start:\n{page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(
        metric(&page, "idem_filter_fed_keys_total{how=\"catch_up\"} "),
        Some(30.0),
        "the snapshot's 200 keys are not read again, the 30 written since are:\n{page}"
    );
    assert_eq!(
        metric(&page, "idem_filter_fed_keys_total{how=\"rebuild\"} "),
        None
    );
    for (ns, key) in (0..200)
        .map(|i| ("before", format!("b-{i}")))
        .chain((0..30).map(|i| ("after", format!("a-{i}"))))
    {
        let b = post(&idem.url(&format!("/v1/{ns}/begin")), json!({"key": key}))
            .await
            .json();
        assert_eq!(b["status"], "completed", "{ns}/{key}: {b}");
    }
    for i in 0..20 {
        deliver(idem.base.clone(), "fresh", format!("f-{i}")).await;
    }
    let page = get(&idem.url("/metrics")).await;
    let page = String::from_utf8_lossy(&page.body).into_owned();
    let skipped =
        metric(&page, "idem_tiered_cold_checks_total{answer=\"skipped\"} ").unwrap_or(0.0);
    assert!(
        skipped >= 15.0,
        "new keys are called new without asking the cold tier once caught up: {skipped} of 20\n{page}"
    );
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_on_redis_over_postgres() {
    let Some((redis, cold)) = support::redis_over_postgres("idem_tiered_cold").await else {
        return;
    };
    let args = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        &redis,
        "--cold-store",
        &cold,
        "--hot-retention-ms",
        "1000",
        "--write-through",
    ];
    let idem = start(&args, &[]).await;
    let key = format!(
        "t-{}-{}",
        std::process::id(),
        std::time::UNIX_EPOCH.elapsed().unwrap().as_nanos()
    );
    let b = post(&idem.url("/v1/tiered/begin"), json!({"key": key}))
        .await
        .json();
    assert_eq!(b["status"], "acquired", "{b}");
    let done = post(
        &idem.url("/v1/tiered/complete"),
        json!({"key": key, "token": b["token"], "outcome": "shipped", "retention_ms": 3_600_000}),
    )
    .await;
    assert_eq!(done.status, 200);
    // Gone from Redis after the hot retention, replayed from PostgreSQL.
    tokio::time::sleep(std::time::Duration::from_millis(1_300)).await;
    let replay = post(&idem.url("/v1/tiered/begin"), json!({"key": key}))
        .await
        .json();
    assert_eq!(replay["status"], "completed", "{replay}");
    assert_eq!(replay["outcome"], "shipped");
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_and_the_cold_tier_are_measured_apart() {
    let dir = tempfile::tempdir().unwrap();
    let cold = format!("file://{}", dir.path().display());
    let args = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &cold,
    ];
    let idem = start(&args, &[]).await;
    let b = post(&idem.url("/v1/orders/begin"), json!({"key": "k"}))
        .await
        .json();
    assert_eq!(b["status"], "acquired", "{b}");
    // Answered once the cold tier holds it (a memory hot tier's default).
    let done = post(
        &idem.url("/v1/orders/complete"),
        json!({"key": "k", "token": b["token"], "outcome": 1}),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.problem(200));
    let text = support::get(&idem.url("/metrics")).await.body;
    let text = String::from_utf8(text.to_vec()).unwrap();
    assert_eq!(idem.terminate().await, 0);

    let value = |series: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.strip_prefix(series).is_some_and(|v| v.starts_with(' ')))
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"));
        line[series.len()..].trim().parse().unwrap()
    };
    let calls = |labels: &str| value(&format!("idem_store_calls_total{{{labels}}}"));
    let timed = |labels: &str| value(&format!("idem_store_call_seconds_count{{{labels}}}"));
    // The whole store, as before: no tier label.
    assert_eq!(
        calls(r#"store="tiered",operation="begin",outcome="ok""#),
        1.0
    );
    // The claim and its completion in the hot tier.
    let hot = r#"store="memory",tier="hot""#;
    assert_eq!(
        calls(&format!(r#"{hot},operation="begin",outcome="ok""#)),
        1.0
    );
    assert_eq!(
        calls(&format!(r#"{hot},operation="complete",outcome="ok""#)),
        1.0
    );
    assert_eq!(timed(&format!(r#"{hot},operation="begin""#)), 1.0);
    // The completed record imported into the cold tier.
    let cold = r#"store="file",tier="cold""#;
    assert!(calls(&format!(r#"{cold},operation="import_many",outcome="ok""#)) >= 1.0);
    assert!(timed(&format!(r#"{cold},operation="import_many""#)) >= 1.0);
    assert!(
        !text.contains(r#"store="file",operation"#),
        "every cold tier series carries its tier:\n{text}"
    );
}

#[test]
fn tiered_settings_that_cannot_work_are_refused_with_what_to_change() {
    let cases: [(&[&str], &str); 5] = [
        (&["--hot-retention-ms", "10"], "at least 1000"),
        (&["--hot-store", "file://./x"], "cannot be a hot tier"),
        (&["--cold-store", "memory://"], "cannot be a cold tier"),
        (
            &["--filter-snapshot", "/tmp/f.snapshot"],
            "needs a fixed --filter-seed",
        ),
        (&["--filter-seed", "xyz"], "32 hex digits"),
    ];
    for (extra, says) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cold = format!("file://{}", dir.path().display());
        let mut args = vec!["serve", "--store", "tiered", "--listen", "127.0.0.1:0"];
        if !extra.contains(&"--cold-store") {
            args.extend(["--cold-store", &cold]);
        }
        args.extend(extra);
        let (code, _, err) = run(&args, &[]);
        assert_eq!(code, 2, "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_filter_retention_is_the_default_retention_too() {
    let dir = tempfile::tempdir().unwrap();
    let cold = format!("file://{}", dir.path().display());
    let args = [
        "serve",
        "--store",
        "tiered",
        "--cold-store",
        &cold,
        "--filter-retention-ms",
        "3600000",
    ];
    let idem = start(&args, &[]).await;
    let b = post(&idem.url("/v1/short/begin"), json!({"key": "k"}))
        .await
        .json();
    let done = post(
        &idem.url("/v1/short/complete"),
        json!({"key": "k", "token": b["token"], "outcome": 1}),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.problem(200));
    let record = support::get(&idem.url("/v1/short/record?key=k"))
        .await
        .json();
    let kept =
        record["expires_at_ms"].as_u64().unwrap() - record["completed_at_ms"].as_u64().unwrap();
    assert_eq!(kept, 3_600_000, "{record}");
    assert_eq!(idem.terminate().await, 0);
    // Asked for explicitly, a longer default is refused with both numbers.
    let mut longer = args.to_vec();
    longer.extend([
        "--default-retention-ms",
        "7200000",
        "--listen",
        "127.0.0.1:0",
    ]);
    let (code, _, err) = run(&longer, &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("3600000") && err.contains("filter_retention_ms"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_act_on_the_real_tiers_or_are_told_where_to_look() {
    // A memory hot tier lives in the serving process: refused, with where
    // to ask instead.
    let dir = tempfile::tempdir().unwrap();
    let cold = format!("file://{}", dir.path().display());
    for command in [&["inspect"][..], &["release", "--force"]] {
        let mut args = command.to_vec();
        args.extend(["--store", "tiered", "--cold-store", &cold, "ns", "k"]);
        let (code, _, err) = run(&args, &[]);
        assert_eq!(code, 2, "{command:?}: {err}");
        assert!(err.contains("curl"), "{command:?}: {err}");
    }
    // A Redis hot tier is read and changed where it lives.
    let Some(redis) = support::redis().await else {
        return;
    };
    let Some(cold) = support::postgres_table("idem_tiered_operator") else {
        return;
    };
    let tiers = [
        "--store",
        "tiered",
        "--hot-store",
        &redis,
        "--cold-store",
        &cold,
    ];
    let mut args = vec!["serve"];
    args.extend(tiers);
    let idem = start(&args, &[]).await;
    let ns = support::unique("op");
    let held = post(
        &idem.url(&format!("/v1/{ns}/begin")),
        json!({"key": "held", "lease_ms": 600_000}),
    )
    .await
    .json();
    assert_eq!(held["status"], "acquired", "{held}");
    let mut inspect = vec!["inspect", "--json"];
    inspect.extend(tiers);
    inspect.extend([ns.as_str(), "held"]);
    let (code, out, err) = run(&inspect, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"in_progress\""), "{out}");
    let mut release = vec!["release", "--force"];
    release.extend(tiers);
    release.extend([ns.as_str(), "held"]);
    let (code, _, err) = run(&release, &[]);
    assert_eq!(code, 0, "{err}");
    let again = post(
        &idem.url(&format!("/v1/{ns}/begin")),
        json!({"key": "held"}),
    )
    .await
    .json();
    assert_eq!(
        again["status"], "acquired",
        "released where it was held: {again}"
    );
    assert_eq!(idem.terminate().await, 0);
}

/// Completes one key with a year's retention on plain `idem serve --store
/// STORE`, then stops it.
async fn complete_for_a_year(store: &str) {
    let plain = start(&["serve", "--store", store], &[]).await;
    let b = post(&plain.url("/v1/adopted/begin"), json!({"key": "kept"}))
        .await
        .json();
    let done = post(
        &plain.url("/v1/adopted/complete"),
        json!({"key": "kept", "token": b["token"], "retention_ms": 365u64 * 24 * 3600 * 1000}),
    )
    .await;
    assert_eq!(done.status, 200, "{}", done.problem(200));
    assert_eq!(plain.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_tier_whose_records_outlive_the_filter_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = format!("file://{}", dir.path().display());
    let mut colds = vec![file];
    if let Some(pg) = support::postgres_table(&support::unique("adopted").replace('-', "_")) {
        colds.push(pg);
    }
    for cold in colds {
        complete_for_a_year(&cold).await;
        let args = [
            "serve",
            "--store",
            "tiered",
            "--cold-store",
            &cold,
            "--listen",
            "127.0.0.1:0",
        ];
        let (code, _, err) = run(&args, &[]);
        assert_eq!(code, 1, "{cold}: {err}");
        assert!(
            err.contains("--filter-retention-ms") && err.contains("2592000000"),
            "{cold}: {err}"
        );
        // Without the filter, or with one that keeps keys long enough, it
        // serves.
        let mut off = args.to_vec();
        off.extend(["--filter-items", "0"]);
        let idem = start(&off, &[]).await;
        assert_eq!(idem.terminate().await, 0);
    }
}
