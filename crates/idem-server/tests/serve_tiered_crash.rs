//! `idem serve --store tiered` through a `kill -9`: by default no
//! acknowledged completion is lost, whatever the hot tier; a Redis hot tier
//! keeps what it acknowledged while the cold tier was cut off, and the next
//! process moves it; `--ack-before-cold` loses only what it says it may.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::gate::Gate;
use support::{Process, get, post, run, start, unique};

/// Begins and completes `n` keys one by one with `retention_ms`, then kills
/// the process (SIGKILL, no chance to flush) right after the last answer.
/// Returns the tokens of the acknowledged keys, in order.
async fn complete_then_kill(idem: Process, ns: &str, n: usize, retention_ms: u64) -> Vec<u64> {
    let mut tokens = Vec::new();
    for i in 0..n {
        let key = format!("k-{i}");
        let b = post(&idem.url(&format!("/v1/{ns}/begin")), json!({"key": key}))
            .await
            .json();
        assert_eq!(b["status"], "acquired", "{key}: {b}");
        let done = post(
            &idem.url(&format!("/v1/{ns}/complete")),
            json!({"key": key, "token": b["token"], "outcome": {"n": i}, "retention_ms": retention_ms}),
        )
        .await;
        assert_eq!(done.status, 200, "{}", done.problem(200));
        tokens.push(b["token"].as_u64().unwrap());
    }
    kill(idem).await;
    tokens
}

async fn kill(idem: Process) {
    let mut child = idem.child;
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

/// Asserts that every key `k-0`… of `ns` answers its stored outcome.
async fn all_completed(idem: &Process, ns: &str, n: usize) {
    for i in 0..n {
        let key = format!("k-{i}");
        let b = post(&idem.url(&format!("/v1/{ns}/begin")), json!({"key": key}))
            .await
            .json();
        assert_eq!(
            b["status"], "completed",
            "{key} was acknowledged, then lost: {b}"
        );
        assert_eq!(b["outcome"], json!({"n": i}));
    }
}

fn memory_over_file(dir: &std::path::Path, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "serve",
        "--store",
        "tiered",
        "--cold-store",
        &format!("file://{}", dir.join("cold").display()),
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

fn refs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn by_default_a_kill_loses_no_acknowledged_completion() {
    let dir = tempfile::tempdir().unwrap();
    let args = memory_over_file(dir.path(), &[]);
    let idem = start(&refs(&args), &[]).await;
    let tokens = complete_then_kill(idem, "crash", 300, 3_600_000).await;
    let idem = start(&refs(&args), &[]).await;
    all_completed(&idem, "crash", 300).await;
    let fresh = post(&idem.url("/v1/crash/begin"), json!({"key": "after"}))
        .await
        .json();
    let highest = tokens.iter().max().unwrap();
    assert!(
        fresh["token"].as_u64().unwrap() > *highest,
        "a token went back after the kill: {fresh} after {highest}"
    );
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_through_loses_no_completion_the_hot_tier_would_have_kept() {
    // Ten minutes of retention, under the default 3 h hot retention: the
    // hot tier alone would keep it, but a memory hot tier dies with the
    // process.
    let dir = tempfile::tempdir().unwrap();
    let args = memory_over_file(dir.path(), &["--write-through"]);
    let idem = start(&refs(&args), &[]).await;
    complete_then_kill(idem, "through", 50, 600_000).await;
    let idem = start(&refs(&args), &[]).await;
    all_completed(&idem, "through", 50).await;
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ack_before_cold_a_kill_loses_only_the_last_moments() {
    let dir = tempfile::tempdir().unwrap();
    let args = memory_over_file(
        dir.path(),
        &[
            "--ack-before-cold",
            "--hot-retention-ms",
            "1000",
            "--filter-items",
            "0",
        ],
    );
    let idem = start(&refs(&args), &[]).await;
    // The window is counted where operators look.
    let metrics = get(&idem.url("/metrics")).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains("idem_tiered_unprotected_completions"),
        "{text}"
    );
    let acked = Arc::new(Mutex::new(Vec::<(String, Instant, u64)>::new()));
    let until = Instant::now() + Duration::from_secs(4);
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (base, acked) = (idem.base.clone(), acked.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while Instant::now() < until {
                    let key = format!("c{c}-{i}");
                    i += 1;
                    let b = post(&format!("{base}/v1/window/begin"), json!({"key": key}))
                        .await
                        .json();
                    let token = b["token"].as_u64().unwrap();
                    let done = post(
                        &format!("{base}/v1/window/complete"),
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
    kill(idem).await;
    let killed = Instant::now();
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 100, "only {} completions in 4 s", acked.len());
    let idem = start(&refs(&args), &[]).await;
    let mut lost_late = 0;
    for (key, at, _) in &acked {
        let b = post(&idem.url("/v1/window/begin"), json!({"key": key}))
            .await
            .json();
        if b["status"] == "completed" {
            continue;
        }
        // What the flag's window may lose: completions acknowledged while
        // their records were still on their way, moments before the kill.
        let before_kill = killed - *at;
        assert!(
            before_kill < Duration::from_secs(2),
            "{key}, acknowledged {before_kill:?} before the kill, was lost: {b}"
        );
        lost_late += 1;
    }
    eprintln!(
        "{} acknowledged, {lost_late} lost in the last moments",
        acked.len()
    );
    let highest = acked.iter().map(|a| a.2).max().unwrap();
    let fresh = post(&idem.url("/v1/window/begin"), json!({"key": "after"}))
        .await
        .json();
    assert!(
        fresh["token"].as_u64().unwrap() > highest,
        "a token went back after the kill: {fresh} after {highest}"
    );
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_hot_tier_keeps_what_it_acknowledged_through_a_kill_with_the_cold_tier_cut() {
    let Some(redis) = support::redis().await else {
        return;
    };
    let Some(direct) = support::postgres_table(&unique("cut").replace('-', "_")) else {
        return;
    };
    let gate = Gate::before(5432).await;
    let routed = direct.replacen(":5432/", &format!(":{}/", gate.port), 1);
    let args = [
        "serve",
        "--store",
        "tiered",
        "--hot-store",
        &redis,
        "--cold-store",
        &routed,
        "--hot-retention-ms",
        "2000",
        "--handover-grace-ms",
        "1000",
    ];
    let idem = start(&args, &[]).await;
    // The filter is ready once rebuilt from the (empty) cold tier: new keys
    // need nothing from it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    gate.hold();
    let ns = unique("cut");
    complete_then_kill(idem, &ns, 20, 3_600_000).await;
    gate.pass();
    let idem = start(&args, &[]).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    all_completed(&idem, &ns, 20).await;
    // Moved to PostgreSQL by the new process, once listed for the grace:
    // `idem inspect` reads the cold tier's copy, whole retention and all.
    let started = Instant::now();
    loop {
        let (code, out, err) = run(&["inspect", "--store", &direct, "--json", &ns, "k-19"], &[]);
        assert_eq!(code, 0, "{err}");
        if out.contains("\"completed\"") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "not in the cold tier: {out}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(idem.terminate().await, 0);
}
