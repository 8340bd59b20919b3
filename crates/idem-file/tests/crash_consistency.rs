//! `kill -9` a process that writes under load; after a restart every
//! acknowledged completion is there, no record is corrupt, and fencing tokens
//! continue above every token issued before the crash.

use idem_testkit::cases::acquired;
use std::collections::HashMap;
use std::io::Write;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_core::{Fenced, Key, Lease, Namespace, Record, ScanQuery, Store};
use idem_file::{Durability, FileStore};
use tokio::io::{AsyncBufReadExt, BufReader};

const DIR_VAR: &str = "IDEM_CRASH_TEST_DIR";
const MODE_VAR: &str = "IDEM_CRASH_TEST_MODE";
const RUN_VAR: &str = "IDEM_CRASH_TEST_RUN";

fn mode(name: &str) -> Durability {
    match name {
        "immediate" => Durability::Immediate,
        "buffered" => Durability::Buffered,
        _ => Durability::GroupCommit,
    }
}

/// The child: writes until killed, printing `ACK key token` after each
/// acknowledged `complete`. Runs only when the parent starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "started by crash_keeps_every_acknowledged_completion"]
async fn crash_child_writer() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let store = FileStore::builder(&dir)
        .durability(mode(&std::env::var(MODE_VAR).unwrap_or_default()))
        .open()
        .unwrap();
    let run = std::env::var(RUN_VAR).unwrap_or_default();
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let tasks: Vec<_> = (0..256)
        .map(|task| {
            let (store, out, run) = (store.clone(), out.clone(), run.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let key = Key::new("crash", format!("k{run}-{task}-{i}")).unwrap();
                    let claim =
                        acquired(store.begin(&key, None, Lease::from_secs(60)).await.unwrap());
                    let outcome = key.bytes().clone();
                    let done = store
                        .complete(&key, claim.token, Some(outcome), Duration::from_secs(3600))
                        .await
                        .unwrap();
                    assert_eq!(done, Fenced::Ok(()));
                    let mut out = out.lock().unwrap();
                    writeln!(out, "ACK k{run}-{task}-{i} {}", claim.token.get()).unwrap();
                    out.flush().unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

async fn crash_once(dir: &std::path::Path, mode_name: &str, round: u32) -> (usize, usize) {
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "crash_child_writer", "--ignored", "--nocapture"])
        .env(DIR_VAR, dir)
        .env(MODE_VAR, mode_name)
        .env(RUN_VAR, round.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut acked: HashMap<String, u64> = HashMap::new();
    // Kill at a different moment each round: after 200 to 1 000 acks.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let kill_after = 200 + (nanos as usize + round as usize * 337) % 800;
    let mut killed = false;
    let reading = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(rest) = line.strip_prefix("ACK ") {
                let (k, t) = rest.split_once(' ').unwrap();
                acked.insert(k.to_string(), t.parse().unwrap());
                if !killed && acked.len() >= kill_after {
                    child.start_kill().unwrap(); // SIGKILL
                    killed = true;
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), reading)
        .await
        .expect("the child should ack and be killed within a minute");
    assert!(
        killed,
        "the child stopped by itself after {} acks",
        acked.len()
    );
    child.wait().await.unwrap();

    let store = FileStore::open(dir).expect("the store reopens after kill -9");
    for (k, token) in &acked {
        let key = Key::new("crash", k.clone()).unwrap();
        match store.get(&key).await.unwrap() {
            Some(Record::Completed(r)) => {
                assert_eq!(r.token.get(), *token, "{k}");
                assert_eq!(r.outcome.as_deref(), Some(k.as_bytes()), "{k}");
            }
            other => panic!("acknowledged completion of {k} is gone after the crash: {other:?}"),
        }
    }
    // Every record on disk reads back (scan fails on a corrupt one).
    let mut all = 0;
    let mut after = None;
    loop {
        let mut q = ScanQuery::new(Namespace::new("crash").unwrap()).limit(10_000);
        q.after = after.take();
        let page = store.scan(&q).await.expect("no record is corrupt");
        if page.is_empty() {
            break;
        }
        all += page.len();
        after = Some(page.last().unwrap().key.bytes().clone());
    }
    assert!(all >= acked.len());
    let max = acked.values().max().copied().unwrap_or(0);
    let fresh = Key::new("crash", format!("after-{round}")).unwrap();
    let claim = acquired(
        store
            .begin(&fresh, None, Lease::from_secs(1))
            .await
            .unwrap(),
    );
    assert!(
        claim.token.get() > max,
        "token {} after the crash is not above {max}",
        claim.token
    );
    (acked.len(), all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_keeps_every_acknowledged_completion() {
    let rounds = [
        ("group", 0),
        ("group", 1),
        ("group", 2),
        ("immediate", 3),
        ("buffered", 4),
    ];
    for (mode_name, round) in rounds {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        // Two crashes in one directory: recovery of a recovered store too.
        for again in 0..2 {
            let (acked, on_disk) = crash_once(dir.path(), mode_name, round * 2 + again).await;
            println!(
                "{mode_name} round {round}.{again}: {acked} acked, {on_disk} on disk after restart"
            );
        }
    }
}
