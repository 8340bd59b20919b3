//! `idem serve --store tiered`: a hot tier in front of a cold one, as users
//! run it: history that outlives the process and the hot tier, tokens that
//! never go back, the key filter's snapshot, and settings that cannot work
//! refused with what to change.

mod support;

use serde_json::json;
use support::{post, run, start};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_on_redis_over_postgres() {
    let Some(redis) = support::redis().await else {
        return;
    };
    let pg = idem_testkit::services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let cold = format!(
        "{pg}{}table=idem_tiered_cold",
        if pg.contains('?') { '&' } else { '?' }
    );
    let (code, _, err) = run(&["migrate", "--store", &cold], &[]);
    if code != 0 && idem_testkit::services::absent::<()>("PostgreSQL", &pg, err).is_none() {
        return;
    }
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

/// Runs `idem serve` on a memory hot tier over a file cold tier, acks
/// completions from four clients until `ack_for` has passed, then kills the
/// process (SIGKILL, no chance to flush) and starts it again. Returns the
/// acknowledged keys with how long before the kill each was acknowledged,
/// the highest token handed out before the kill, and the restarted process.
async fn kill_mid_stream(
    extra: &[&str],
    dir: &std::path::Path,
    ack_for: std::time::Duration,
) -> (Vec<(String, std::time::Duration)>, u64, support::Process) {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    let cold = format!("file://{}", dir.join("cold").display());
    let mut args = vec![
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        "memory://",
        "--cold-store",
        &cold,
        "--hot-retention-ms",
        "1000",
        "--filter-items",
        "0",
    ];
    args.extend(extra);
    let idem = start(&args, &[]).await;
    let acked = Arc::new(Mutex::new(Vec::<(String, Instant, u64)>::new()));
    let until = Instant::now() + ack_for;
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (base, acked) = (idem.base.clone(), acked.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < until {
                    let key = format!("c{c}-{i}");
                    i += 1;
                    let b = post(&format!("{base}/v1/crash/begin"), json!({"key": key})).await.json();
                    let token = b["token"].as_u64().unwrap();
                    let done = post(
                        &format!("{base}/v1/crash/complete"),
                        json!({"key": key, "token": token, "outcome": "done", "retention_ms": 3_600_000}),
                    )
                    .await;
                    if done.status == 200 {
                        acked.lock().unwrap().push((key, Instant::now(), token));
                    }
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let mut child = idem.child;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
    let killed = Instant::now();
    let acked = acked.lock().unwrap().clone();
    let highest = acked.iter().map(|a| a.2).max().unwrap_or(0);
    let acked = acked
        .into_iter()
        .map(|(k, at, _)| (k, killed - at))
        .collect();
    (acked, highest, start(&args, &[]).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_stream_loses_only_the_last_moments_and_never_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let (acked, highest, idem) =
        kill_mid_stream(&[], dir.path(), std::time::Duration::from_secs(4)).await;
    assert!(acked.len() > 100, "only {} completions in 4 s", acked.len());
    let mut lost_late = 0;
    for (key, before_kill) in &acked {
        let b = post(&idem.url("/v1/crash/begin"), json!({"key": key}))
            .await
            .json();
        if b["status"] == "completed" {
            continue;
        }
        // What a crash may lose: completions acknowledged while their
        // records were still on the write-behind queue, moments before it.
        assert!(
            *before_kill < std::time::Duration::from_secs(2),
            "{key}, acknowledged {before_kill:?} before the kill, was lost: {b}"
        );
        lost_late += 1;
    }
    eprintln!(
        "{} acknowledged, {lost_late} lost in the last moments",
        acked.len()
    );
    let fresh = post(&idem.url("/v1/crash/begin"), json!({"key": "after"}))
        .await
        .json();
    assert!(
        fresh["token"].as_u64().unwrap() > highest,
        "a token went back after the kill: {fresh} after {highest}"
    );
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_mid_stream_with_write_through_loses_no_acknowledged_completion() {
    let dir = tempfile::tempdir().unwrap();
    let (acked, highest, idem) = kill_mid_stream(
        &["--write-through"],
        dir.path(),
        std::time::Duration::from_secs(3),
    )
    .await;
    assert!(acked.len() > 50, "only {} completions in 3 s", acked.len());
    for (key, _) in &acked {
        let b = post(&idem.url("/v1/crash/begin"), json!({"key": key}))
            .await
            .json();
        assert_eq!(
            b["status"], "completed",
            "{key} was acknowledged, then lost: {b}"
        );
    }
    let fresh = post(&idem.url("/v1/crash/begin"), json!({"key": "after"}))
        .await
        .json();
    assert!(fresh["token"].as_u64().unwrap() > highest);
    assert_eq!(idem.terminate().await, 0);
}
