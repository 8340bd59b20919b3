//! `idem serve --store file://…` on a damaged directory: damage the engine
//! can see stops it at startup with an error naming the directory and what
//! to do; a journal whose end no longer reads back (which looks like the
//! write a crash cut short) is cut, and the server says so as it starts.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::json;
use support::{post, start};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// A file store in `dir` holding completed records `k0`…`k9`, left by a
/// server that shut down cleanly.
async fn filled(dir: &Path) {
    let store = format!("file://{}", dir.display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    for i in 0..10 {
        let key = format!("k{i}");
        let held = post(&idem.url("/v1/orders/begin"), json!({"key": key}))
            .await
            .json();
        let token = held["token"].as_u64().unwrap();
        let done = post(
            &idem.url("/v1/orders/complete"),
            json!({"key": key, "token": token, "outcome": {"receipt": format!("receipt-{i}")}}),
        )
        .await;
        assert_eq!(done.status, 200);
    }
    assert_eq!(idem.terminate().await, 0);
}

/// The journal of the store in `dir`.
fn journal(dir: &Path) -> std::path::PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "jnl"))
        .expect("a journal")
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
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .await
        .unwrap();
    (code, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_journal_stops_serve_with_the_directory_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path()).await;
    let path = journal(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes
        .windows(9)
        .position(|w| w == b"receipt-4")
        .expect("the journal holds the outcome");
    bytes[at..at + 9].copy_from_slice(b"RECEIPT-X");
    std::fs::write(&path, bytes).unwrap();

    let (code, stderr) = serve_briefly(dir.path(), Duration::from_secs(30)).await;
    assert!(
        code.is_some_and(|c| c != 0),
        "serve exited {code:?} on a damaged store: {stderr}"
    );
    for part in [
        &dir.path().display().to_string()[..],
        "is damaged",
        "restore the directory from a backup",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_journal_cut_on_recovery_is_reported_as_serve_starts() {
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path()).await;
    let path = journal(dir.path());
    let len = std::fs::metadata(&path).unwrap().len();
    // The end of the journal no longer reads back as a whole write.
    let mut bytes = std::fs::read(&path).unwrap();
    let tail = bytes.len() - 40;
    for b in &mut bytes[tail..] {
        *b = 0xa5;
    }
    std::fs::write(&path, bytes).unwrap();

    let (code, stderr) = serve_briefly(dir.path(), Duration::from_secs(5)).await;
    assert_eq!(code, None, "serve keeps running after a crash: {stderr}");
    assert!(
        stderr.contains("cut") && stderr.contains("off the end of its journal"),
        "the cut is not reported: {stderr}"
    );
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    let now = std::fs::metadata(&path).unwrap().len();
    assert!(now < len, "the journal was cut ({len} → {now} bytes)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_reports_no_cut() {
    // The engine sets journal space aside as zeros and cuts it off when it
    // opens again: that is no loss, and nothing must call it one.
    let dir = tempfile::tempdir().unwrap();
    filled(dir.path()).await;
    for _ in 0..2 {
        let (code, stderr) = serve_briefly(dir.path(), Duration::from_secs(3)).await;
        assert_eq!(code, None, "{stderr}");
        assert!(!stderr.contains("off the end of its journal"), "{stderr}");
    }
    let store = format!("file://{}", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    let replay = post(&idem.url("/v1/orders/begin"), json!({"key": "k9"}))
        .await
        .json();
    assert_eq!(replay["outcome"]["receipt"], "receipt-9");
}
