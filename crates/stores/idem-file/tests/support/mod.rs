//! What the crash and power-loss tests share: a child process that writes
//! under load until it is stopped, and the checks after the restart.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use idem_core::{Fenced, Key, Lease, Namespace, Record, ScanQuery, Store};
use idem_file::{Durability, FileStore};
use idem_testkit::cases::acquired;
use tokio::io::{AsyncBufReadExt, BufReader};

const DIR_VAR: &str = "IDEM_CRASH_TEST_DIR";
const MODE_VAR: &str = "IDEM_CRASH_TEST_MODE";
const RUN_VAR: &str = "IDEM_CRASH_TEST_RUN";
const BLOCK_VAR: &str = "IDEM_CRASH_TEST_TOKEN_BLOCK";
const OUTCOME_VAR: &str = "IDEM_CRASH_TEST_OUTCOME_BYTES";

/// How the child's store runs.
#[derive(Clone, Copy, Debug)]
pub struct Setup {
    pub durability: Durability,
    /// Tokens per raise of the durable token ceiling; `None` for the default.
    pub token_block: Option<u64>,
    /// The size of each outcome: large ones fill memtables, so the engine
    /// flushes tables and rotates journals while the child writes.
    pub outcome_bytes: usize,
}

impl Setup {
    pub fn new(durability: Durability) -> Self {
        Self {
            durability,
            token_block: None,
            outcome_bytes: 0,
        }
    }
}

/// The outcome stored for key `k`: the key, padded to `size` bytes.
fn outcome(k: &str, size: usize) -> Vec<u8> {
    let mut bytes = k.as_bytes().to_vec();
    bytes.resize(size.max(bytes.len()), b'.');
    bytes
}

fn mode_name(d: Durability) -> &'static str {
    match d {
        Durability::Immediate => "immediate",
        Durability::Buffered => "buffered",
        _ => "group",
    }
}

/// The child: writes until stopped, printing `TOKEN t` after each acquired
/// claim and `ACK key token` after each acknowledged `complete`. Runs only
/// when a parent starts it; stops quietly once the store fails (after a
/// power cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "started by the crash and power-loss tests"]
async fn child_writer() {
    let Ok(dir) = std::env::var(DIR_VAR) else {
        return;
    };
    let mut builder = FileStore::builder(&dir).durability(
        match std::env::var(MODE_VAR).unwrap_or_default().as_str() {
            "immediate" => Durability::Immediate,
            "buffered" => Durability::Buffered,
            _ => Durability::GroupCommit,
        },
    );
    if let Some(block) = std::env::var(BLOCK_VAR).ok().and_then(|b| b.parse().ok()) {
        builder = builder.token_block(block);
    }
    let store = builder.open().unwrap();
    let run = std::env::var(RUN_VAR).unwrap_or_default();
    let size = std::env::var(OUTCOME_VAR)
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(0);
    let out = Arc::new(std::sync::Mutex::new(std::io::stdout()));
    let say = move |line: String| {
        let mut out = out.lock().unwrap();
        writeln!(out, "{line}").unwrap();
        out.flush().unwrap();
    };
    let tasks: Vec<_> = (0..256)
        .map(|task| {
            let (store, say, run) = (store.clone(), say.clone(), run.clone());
            tokio::spawn(async move {
                for i in 0.. {
                    let key = Key::new("crash", format!("k{run}-{task}-{i}")).unwrap();
                    let Ok(begin) = store.begin(&key, None, Lease::from_secs(60)).await else {
                        return;
                    };
                    let claim = acquired(begin);
                    say(format!("TOKEN {}", claim.token.get()));
                    let outcome = outcome(&format!("k{run}-{task}-{i}"), size).into();
                    let Ok(done) = store
                        .complete(&key, claim.token, Some(outcome), Duration::from_secs(3600))
                        .await
                    else {
                        return;
                    };
                    assert_eq!(done, Fenced::Ok(()));
                    say(format!("ACK k{run}-{task}-{i} {}", claim.token.get()));
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

/// What a child reported before it was stopped.
pub struct Written {
    /// Acknowledged completions: key to token.
    pub acked: HashMap<String, u64>,
    /// The lowest and the highest token it reported.
    pub min_token: u64,
    pub max_token: u64,
}

/// Runs the child on the store in `dir` until it has acknowledged a few
/// hundred completions (a different number each round), then calls `stop`,
/// which must end the child, and reads what it reported up to its end.
pub async fn write_until_stopped(
    dir: &Path,
    setup: Setup,
    round: u32,
    stop: impl FnOnce(&mut tokio::process::Child),
) -> Written {
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "support::child_writer",
            "--ignored",
            "--nocapture",
        ])
        .env(DIR_VAR, dir)
        .env(MODE_VAR, mode_name(setup.durability))
        .env(RUN_VAR, round.to_string())
        .env(OUTCOME_VAR, setup.outcome_bytes.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    if let Some(block) = setup.token_block {
        command.env(BLOCK_VAR, block.to_string());
    }
    let mut child = command.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut written = Written {
        acked: HashMap::new(),
        min_token: u64::MAX,
        max_token: 0,
    };
    // Stop at a different moment each round: after 200 to 1 000 acks.
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let stop_after = 200 + (nanos as usize + round as usize * 337) % 800;
    let mut stop = Some(stop);
    let reading = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(token) = line.strip_prefix("TOKEN ") {
                let token = token.parse().unwrap();
                written.min_token = written.min_token.min(token);
                written.max_token = written.max_token.max(token);
            } else if let Some(rest) = line.strip_prefix("ACK ") {
                let (k, t) = rest.split_once(' ').unwrap();
                written.acked.insert(k.to_string(), t.parse().unwrap());
                if written.acked.len() >= stop_after
                    && let Some(stop) = stop.take()
                {
                    stop(&mut child);
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(60), reading)
        .await
        .expect("the child should ack and be stopped within a minute");
    assert!(
        stop.is_none(),
        "the child stopped by itself after {} acks",
        written.acked.len()
    );
    child.wait().await.unwrap();
    written
}

/// What the restarted store holds of what the child wrote.
pub struct Found {
    /// Acknowledged completions that are missing or different.
    pub lost: Vec<String>,
    /// Records on disk.
    pub on_disk: usize,
}

/// Checks the reopened store against what the child reported: every record
/// decodes, and a fresh token is above every token the child reported.
/// Acknowledged completions that are missing are returned, not failed on.
pub async fn check_restarted(
    store: &FileStore,
    setup: Setup,
    written: &Written,
    round: u32,
) -> Found {
    let mut lost = Vec::new();
    for (k, token) in &written.acked {
        let key = Key::new("crash", k.clone()).unwrap();
        match store.get(&key).await.unwrap() {
            Some(Record::Completed(r))
                if r.token.get() == *token
                    && r.outcome.as_deref() == Some(&outcome(k, setup.outcome_bytes)[..]) => {}
            other => lost.push(format!("{k} (token {token}): {other:?}")),
        }
    }
    // Every record on disk reads back (scan fails on a corrupt one).
    let mut on_disk = 0;
    let mut after = None;
    loop {
        let mut q = ScanQuery::new(Namespace::new("crash").unwrap()).limit(10_000);
        q.after = after.take();
        let page = store.scan(&q).await.expect("no record is corrupt");
        if page.is_empty() {
            break;
        }
        on_disk += page.len();
        after = Some(page.last().unwrap().key.bytes().clone());
    }
    let max = written.max_token;
    let fresh = Key::new("crash", format!("after-{round}")).unwrap();
    let claim = acquired(
        store
            .begin(&fresh, None, Lease::from_secs(1))
            .await
            .unwrap(),
    );
    assert!(
        claim.token.get() > max,
        "token {} after the restart is not above {max}, issued before",
        claim.token
    );
    Found { lost, on_disk }
}
