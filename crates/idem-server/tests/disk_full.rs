//! `idem serve --store file://…` on a disk that fills up (a small tmpfs,
//! `idem_testkit::small_disk`): the completion the disk refuses answers
//! 503 with a problem saying the disk is full and what to do, and so does
//! every later call, a new claim too, at once rather than hanging; a new
//! store on the full disk stops `idem serve` at startup, saying why. Once
//! room is freed and the server restarted, every acknowledged completion
//! replays and new claims complete.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem_testkit::small_disk::SmallDisk;
use serde_json::json;
use support::{Answer, Process, get, post, start};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// A request the server must answer within a few seconds, full disk or not.
async fn call(idem: &Process, path: &str, body: Option<serde_json::Value>) -> Answer {
    let url = idem.url(path);
    let request = async {
        match body {
            Some(body) => post(&url, body).await,
            None => get(&url).await,
        }
    };
    tokio::time::timeout(Duration::from_secs(10), request)
        .await
        .unwrap_or_else(|_| panic!("{path} got no answer within 10 s"))
}

/// A 503 problem whose detail names the full disk, the store's directory
/// and what to do; `Retry-After` set.
fn assert_disk_full_problem(answer: &Answer, dir: &Path, what: &str) {
    println!("{what}: {}", String::from_utf8_lossy(&answer.body));
    assert_eq!(
        answer.problem(503),
        "urn:idem:problem:store-unavailable",
        "{what}"
    );
    assert!(answer.headers.contains_key("retry-after"), "{what}");
    let detail = answer.json()["detail"].as_str().unwrap().to_lowercase();
    for part in [
        "is full",
        &dir.display().to_string()[..],
        "free space",
        "restart idem serve",
    ] {
        assert!(
            detail.contains(part),
            "{what}: {part:?} missing from {detail}"
        );
    }
}

/// Claims and completes `key`: the token and the complete's answer.
async fn deliver(idem: &Process, key: &str) -> (u64, Answer) {
    let held = call(idem, "/v1/orders/begin", Some(json!({"key": key}))).await;
    assert_eq!(held.status, 200, "{key}: {:?}", held.body);
    let token = held.json()["token"]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is new: {:?}", held.body));
    let body = json!({"key": key, "token": token, "outcome": {"receipt": key}});
    (token, call(idem, "/v1/orders/complete", Some(body)).await)
}

/// Runs `idem serve` on `dir` for at most `within`: its exit code (`None`
/// if it was still running) and what it wrote to stderr.
async fn serve_briefly(dir: &Path, within: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("file://{}", dir.display()))
        .env_remove("IDEM_CONFIG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let code = match tokio::time::timeout(within, child.wait()).await {
        Ok(status) => Some(status.unwrap().code().unwrap_or(-1)),
        Err(_) => {
            child.start_kill().unwrap();
            child.wait().await.unwrap();
            None
        }
    };
    let mut stderr = String::new();
    let mut pipe = child.stderr.take().unwrap();
    pipe.read_to_string(&mut stderr).await.unwrap();
    (code, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_503_saying_so_and_acknowledged_completions_replay_after_a_restart() {
    let Some(disk) = SmallDisk::mount_for_test(16 << 20) else {
        return;
    };
    let started = Instant::now();
    let dir = disk.path().join("store");
    let store = format!("file://{}", dir.display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    let mut acked = Vec::new();
    for i in 0..10 {
        let key = format!("before-{i}");
        let (_, done) = deliver(&idem, &key).await;
        assert_eq!(done.status, 200, "{key}: {:?}", done.body);
        acked.push(key);
    }
    disk.fill().unwrap();

    // Claims cost no write; completions write until the disk refuses one.
    let mut refused = None;
    for i in 0..100_000 {
        let key = format!("filling-{i}");
        let (token, done) = deliver(&idem, &key).await;
        if done.status == 200 {
            acked.push(key);
        } else {
            refused = Some((key, token, done));
            break;
        }
    }
    let (key, token, done) = refused.expect("the full disk refuses a completion");
    assert_disk_full_problem(&done, &dir, "the refused complete");
    let retry = json!({"key": key, "token": token});
    let again = call(&idem, "/v1/orders/complete", Some(retry)).await;
    assert_disk_full_problem(&again, &dir, "the retried complete");
    let begin = call(&idem, "/v1/orders/begin", Some(json!({"key": "new"}))).await;
    assert_disk_full_problem(&begin, &dir, "a new claim");
    let ready = call(&idem, "/readyz", None).await;
    assert_disk_full_problem(&ready, &dir, "/readyz");

    // A new store on the full disk: serve stops at startup, saying why.
    let elsewhere = disk.path().join("another");
    let (code, stderr) = serve_briefly(&elsewhere, Duration::from_secs(30)).await;
    println!("serve on a new store on the full disk: {code:?}: {stderr}");
    assert!(code.is_some_and(|c| c != 0), "{code:?}: {stderr}");
    assert!(
        stderr.contains("disk is full") && stderr.contains(&elsewhere.display().to_string()),
        "{stderr}"
    );

    println!("serve exited {} on SIGTERM", idem.terminate().await);
    disk.free().unwrap();
    let idem = start(&["serve", "--store", &store], &[]).await;
    for key in &acked {
        let replay = call(&idem, "/v1/orders/begin", Some(json!({"key": key}))).await;
        let replay = replay.json();
        assert_eq!(replay["status"], "completed", "{key}: {replay}");
        assert_eq!(
            replay["outcome"]["receipt"],
            key.as_str(),
            "{key}: {replay}"
        );
    }
    let (_, done) = deliver(&idem, "after").await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    assert_eq!(idem.terminate().await, 0);
    println!(
        "{} acknowledged completions replay after the restart; {:?}",
        acked.len(),
        started.elapsed()
    );
}
