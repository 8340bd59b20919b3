//! A client that disconnects never cancels a store operation half-way: the
//! server runs it detached from the connection, so every key ends up
//! completed or free to claim again, never stuck.

mod support;

use std::time::Duration;

use serde_json::json;
use support::{post, start};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const KEYS: usize = 600;

/// Writes a whole `POST /v1/gone/complete` and closes the connection at once,
/// without waiting for the answer.
async fn complete_and_hang_up(addr: &str, key: &str, token: u64) {
    let body = json!({"key": key, "token": token, "outcome": {"done": key}}).to_string();
    let request = format!(
        "POST /v1/gone/complete HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    drop(stream);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_hang_up_on_complete_leave_no_key_stuck_on_the_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    let addr = idem.base.trim_start_matches("http://").to_owned();
    let lease = Duration::from_millis(1000);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("k{i}")).collect();
    let items: Vec<_> = keys
        .iter()
        .map(|k| json!({"key": k, "lease_ms": lease.as_millis() as u64}))
        .collect();
    let begun = post(&idem.url("/v1/gone/begin-batch"), json!({"items": items}))
        .await
        .json();
    let hang_ups: Vec<_> = keys
        .iter()
        .enumerate()
        .map(|(i, key)| {
            let token = begun["results"][i]["token"].as_u64().unwrap();
            let (addr, key) = (addr.clone(), key.clone());
            tokio::spawn(async move { complete_and_hang_up(&addr, &key, token).await })
        })
        .collect();
    for h in hang_ups {
        h.await.unwrap();
    }

    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    let (mut completed, mut acquired, mut stuck) = (0, 0, Vec::new());
    for key in &keys {
        let again = post(&idem.url("/v1/gone/begin"), json!({"key": key}))
            .await
            .json();
        match again["status"].as_str().unwrap() {
            "completed" => {
                assert_eq!(again["outcome"], json!({"done": key}));
                completed += 1;
            }
            "acquired" => acquired += 1,
            _ => stuck.push(key.clone()),
        }
    }
    assert!(
        stuck.is_empty(),
        "{} of {KEYS} keys are stuck in progress after their lease ran out \
         ({completed} completed, {acquired} free to claim again), e.g. {:?}",
        stuck.len(),
        &stuck[..stuck.len().min(5)]
    );
    assert_eq!(idem.terminate().await, 0);
}
