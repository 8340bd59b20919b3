//! Shutdown: a running handler finishes and is acked; what is handed back
//! comes back without an attempt counted.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_amqp::AmqpSource;
use idem_consumer::{HandlerError, Message, Runner};
use idem_core::{Bytes, ClaimHandle, Guard, MemoryStore};
use parking_lot::Mutex;
use support::{Inspect, Running, broker, config, eventually, message, publish, unique};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_lets_a_slow_handler_finish_and_acks_it() {
    let Some(url) = broker().await else { return };
    let queue = unique("graceful");
    let config = config(&url, &queue);
    publish(&config, [message("slow")]).await;

    let started = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let handler = {
        let (started, finished) = (started.clone(), finished.clone());
        move |_m: Message, _c: ClaimHandle| {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.store(true, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(1500)).await;
                finished.store(true, Ordering::SeqCst);
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let source = AmqpSource::connect(config).await.unwrap();
    let runner = Runner::new(Guard::new(MemoryStore::new()), source.clone(), handler);
    let running = Running::start(runner);
    assert!(
        eventually(Duration::from_secs(10), || async {
            started.load(Ordering::SeqCst)
        })
        .await
    );
    let report = running.stop().await;
    assert!(
        finished.load(Ordering::SeqCst),
        "run returned only after the handler finished"
    );
    assert_eq!(report.handled, 1, "{report:?}");
    assert_eq!(report.requeued, 0, "{report:?}");
    source.close().await;
    let inspect = Inspect::new(&url).await;
    assert_eq!(inspect.ready(&queue).await, 0, "acked, not handed back");
    inspect.delete(&queue).await;
    inspect.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_handed_back_at_shutdown_return_without_an_attempt_counted() {
    let Some(url) = broker().await else { return };
    let queue = unique("handback");
    // The broker sends 4 ahead while the runner works on 1 at a time.
    let config = config(&url, &queue).concurrency(4);
    publish(&config, (0..4).map(|i| message(&format!("m{i}")))).await;

    // A handler that outlives the grace: its claim is released and the
    // message handed back; the three prefetched are handed back by close.
    let started = Arc::new(AtomicBool::new(false));
    let stuck = {
        let started = started.clone();
        move |_m: Message, _c: ClaimHandle| {
            started.store(true, Ordering::SeqCst);
            async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok::<_, HandlerError>(Bytes::new())
            }
        }
    };
    let store = MemoryStore::new();
    let source = AmqpSource::connect(config.clone()).await.unwrap();
    let runner = Runner::new(Guard::new(store.clone()), source.clone(), stuck)
        .concurrency(1)
        .shutdown_grace(Duration::from_millis(100));
    let running = Running::start(runner);
    assert!(
        eventually(Duration::from_secs(10), || async {
            started.load(Ordering::SeqCst)
        })
        .await
    );
    let report = running.stop().await;
    assert_eq!(report.requeued, 1, "{report:?}");
    source.close().await;

    let attempts = Arc::new(Mutex::new(Vec::new()));
    let record = {
        let attempts = attempts.clone();
        move |m: Message, _c: ClaimHandle| {
            attempts.lock().push(m.attempt);
            async { Ok::<_, HandlerError>(Bytes::new()) }
        }
    };
    let source = AmqpSource::connect(config).await.unwrap();
    let runner = Runner::new(Guard::new(store), source.clone(), record);
    let running = Running::start(runner);
    let all = eventually(Duration::from_secs(10), || async {
        attempts.lock().len() == 4
    })
    .await;
    let report = running.stop().await;
    source.close().await;
    assert!(all, "{report:?}");
    assert_eq!(
        *attempts.lock(),
        [1, 1, 1, 1],
        "no attempt counted for a hand-back"
    );
    let inspect = Inspect::new(&url).await;
    assert_eq!(inspect.ready(&queue).await, 0);
    inspect.delete(&queue).await;
    inspect.close().await;
}
