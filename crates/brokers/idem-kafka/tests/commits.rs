//! A slow message holds its partition's commit back: the commit never
//! passes a message still in work, however many after it finish.

mod support;

use std::sync::Arc;
use std::time::Duration;

use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use support::{Fixture, Running, wait_until};
use tokio::sync::Notify;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_message_at_offset_k_holds_the_commit_at_k() {
    let Some(f) = Fixture::new("commits", 1).await else {
        return;
    };
    for i in 0..10 {
        f.publish(&format!("m-{i}"), Some(0), "{}").await;
    }
    let release = Arc::new(Notify::new());
    let done = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handler = {
        let (release, done) = (release.clone(), done.clone());
        move |m: Message, _c: ClaimHandle| {
            let (release, done) = (release.clone(), done.clone());
            async move {
                let id = m.id.clone().unwrap();
                if id == "m-3" {
                    release.notified().await;
                }
                done.lock().push(id);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let source = f.source("").await;
    let running = Running::start(
        Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler).concurrency(16),
    );
    wait_until("the nine others", Duration::from_secs(30), || {
        done.lock().len() == 9
    })
    .await;
    // Several commit intervals pass with offsets 4..9 finished.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        f.committed().await.get(&0),
        Some(&3),
        "the commit stops at the slow message's offset"
    );
    release.notify_one();
    f.wait_committed(&[(0, 10)].into()).await;
    running.stop().await;
    source.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_commits_what_finished_and_a_restart_resumes_there() {
    let Some(f) = Fixture::new("resume", 1).await else {
        return;
    };
    for i in 0..20 {
        f.publish(&format!("m-{i}"), Some(0), "{}").await;
    }
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let handler = {
        let seen = seen.clone();
        move |m: Message, _c: ClaimHandle| {
            seen.lock().push(m.id.clone().unwrap());
            std::future::ready(Ok::<_, HandlerError>(Bytes::new()))
        }
    };
    // A commit interval longer than the test: only close commits.
    let source = f.source("&commit-interval-ms=600000").await;
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        handler.clone(),
    ));
    wait_until("20 handled", Duration::from_secs(30), || {
        seen.lock().len() == 20
    })
    .await;
    assert_eq!(
        f.committed().await.get(&0),
        None,
        "nothing committed before close"
    );
    running.stop().await;
    source.close().await;
    assert_eq!(f.committed().await.get(&0), Some(&20));

    for i in 20..25 {
        f.publish(&format!("m-{i}"), Some(0), "{}").await;
    }
    let source = f.source("").await;
    let running = Running::start(Runner::new(
        Guard::new(MemoryStore::new()),
        source.clone(),
        handler,
    ));
    wait_until("the 5 new ones", Duration::from_secs(30), || {
        seen.lock().len() == 25
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    running.stop().await;
    source.close().await;
    let seen = seen.lock().clone();
    assert_eq!(
        seen.len(),
        25,
        "the restart resumed at offset 20, replaying nothing: {seen:?}"
    );
}
