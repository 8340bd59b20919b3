//! What the Redis store does beyond the shared contract: Redis expires
//! records by itself, a released key keeps only a tombstone, and a Redis
//! restart (which loses everything without
//! persistence) leaves the store working, with records absent and tokens
//! still increasing; a cluster failover to a replica keeps completed and
//! claimed records and the same store object carries on. Single calls made
//! at the same time travel together and each caller still gets its own
//! answer.

use idem_testkit::cases::{acquired, deliver};
use std::time::Duration;

use idem_core::{Begin, Fenced, Key, Lease, Store, StoreError};
use idem_redis::RedisStore;
use idem_testkit::services;
use support::{OwnRedis, cli, cluster_node as node, free_port, until};

mod support;

/// The shared Redis's URL.
fn url() -> String {
    services::url("IDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379")
}

async fn shared() -> Option<RedisStore> {
    let url = url();
    match RedisStore::connect(&url).await {
        Ok(s) => Some(s),
        Err(e) => services::absent("Redis", &url, e),
    }
}

/// A plain connection, to look at what the store wrote.
async fn raw(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// The Redis key of `k`'s record.
fn record_of(k: &Key) -> String {
    format!(
        "idem:{{redis-behaviour:{}}}:r",
        String::from_utf8_lossy(k.bytes())
    )
}

fn key(k: &str) -> Key {
    Key::new("redis-behaviour", format!("{k}-{}", std::process::id())).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_itself_expires_records() {
    let Some(store) = shared().await else { return };
    let mut raw = raw(&url()).await;
    let k = key("expiry");
    let record = record_of(&k);
    let c = acquired(store.begin(&k, None, Lease::from_secs(5)).await.unwrap());
    let done = store
        .complete(&k, c.token, Some("x".into()), Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(done, Fenced::Ok(()));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&record)
        .query_async(&mut raw)
        .await
        .unwrap();
    // The key lives the retention plus 1 ms, never less.
    assert!(
        ttl > 0 && ttl <= 301,
        "retention is Redis's own expiry: {ttl}"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let exists: bool = redis::cmd("EXISTS")
        .arg(&record)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!exists, "Redis removed the expired record");
    let again = acquired(store.begin(&k, None, Lease::from_secs(5)).await.unwrap());
    assert!(again.token > c.token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_leaves_a_tombstone_that_only_remembers_the_token() {
    let Some(store) = shared().await else { return };
    let mut raw = raw(&url()).await;
    let k = key("tombstone");
    let record = record_of(&k);
    let c = acquired(store.begin(&k, None, Lease::from_secs(5)).await.unwrap());
    assert_eq!(store.release(&k, c.token).await.unwrap(), Fenced::Ok(()));
    assert_eq!(
        store.get(&k).await.unwrap(),
        None,
        "a released key is absent"
    );
    let packed: Vec<u8> = redis::cmd("GET")
        .arg(&record)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(packed[0], b'r', "a tombstone");
    assert_eq!(
        packed.len(),
        30,
        "only the packed header (the token) is kept"
    );
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&record)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 3_600_000, "the tombstone expires: {ttl}");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!(
            "idem:{{redis-behaviour:{}*",
            String::from_utf8_lossy(k.bytes())
        ))
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "one key per record: {keys:?}");
    let again = acquired(store.begin(&k, None, Lease::from_secs(5)).await.unwrap());
    assert!(again.token > c.token);
    assert_eq!(again.attempt, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_loses_records_but_not_the_store() {
    if !services::program("redis-server") {
        return;
    }
    let port = free_port();
    let mut redis = OwnRedis::start(port).await;
    let url = format!("redis://127.0.0.1:{}", redis.port);
    let store = RedisStore::builder(&url)
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let k = key("restart");
    let before = deliver(&store, &k, "done").await;

    redis.stop().await;
    let down = store.begin(&k, None, Lease::from_secs(60)).await;
    assert!(
        matches!(down, Err(StoreError::Unavailable(_))),
        "a stopped Redis is an error to retry, not a crash: {down:?}"
    );

    let _redis = OwnRedis::start(port).await;
    // The same store object reconnects by itself; the data is gone, so the
    // key is absent, and the scripts are loaded again on NOSCRIPT.
    let mut after = None;
    for _ in 0..40 {
        match store.begin(&k, None, Lease::from_secs(60)).await {
            Ok(b) => {
                after = Some(b);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let Some(Begin::Acquired(after)) = after else {
        panic!("the store did not recover after Redis came back: {after:?}");
    };
    assert_eq!(after.attempt, 1);
    assert!(
        after.token > before,
        "tokens keep increasing across a Redis that lost its data"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_makes_a_completion_visible_on_the_replica() {
    if !services::program("redis-server") {
        return;
    }
    let (pp, rp) = (free_port(), free_port());
    let _primary = OwnRedis::start(pp).await;
    let _replica = OwnRedis::start_with(rp, &["--replicaof", "127.0.0.1", &pp.to_string()]).await;
    let primary_url = format!("redis://127.0.0.1:{pp}");
    let mut raw_primary = raw(&primary_url).await;
    for _ in 0..100 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw_primary)
            .await
            .unwrap();
        if info.contains("connected_slaves:1") && info.contains("state=online") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = RedisStore::builder(&primary_url)
        .wait_for_replicas(1, Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let mut raw_replica = raw(&format!("redis://127.0.0.1:{rp}")).await;
    for i in 0..20 {
        let k = key(&format!("wait-{i}"));
        let record = record_of(&k);
        let c = acquired(store.begin(&k, None, Lease::from_secs(5)).await.unwrap());
        let done = store
            .complete(&k, c.token, Some("x".into()), Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(done, Fenced::Ok(()));
        let packed: Option<Vec<u8>> = redis::cmd("GET")
            .arg(&record)
            .query_async(&mut raw_replica)
            .await
            .unwrap();
        assert_eq!(
            packed.as_ref().map(|p| p[0]),
            Some(b'c'),
            "the replica had the completion when complete returned"
        );
    }
    // Each completion waited for the replica (WAIT ran on the primary).
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut raw_primary)
        .await
        .unwrap();
    let waits: u64 = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(waits >= 20, "WAIT ran {waits} times for 20 completions");
    // Asking for more replicas than exist: the completion stands, after
    // the WAIT timeout, even one longer than the store's call timeout; and
    // while it waits, the store's other calls go on.
    let greedy = RedisStore::builder(&primary_url)
        .timeout(Duration::from_millis(500))
        .wait_for_replicas(2, Duration::from_millis(1500))
        .connect()
        .await
        .unwrap();
    let k = key("wait-greedy");
    let c = acquired(greedy.begin(&k, None, Lease::from_secs(5)).await.unwrap());
    let waiting = tokio::spawn({
        let (greedy, k) = (greedy.clone(), k.clone());
        async move {
            let started = std::time::Instant::now();
            let done = greedy
                .complete(&k, c.token, None, Duration::from_secs(60))
                .await;
            (done, started.elapsed())
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    acquired(
        greedy
            .begin(&key("wait-meanwhile"), None, Lease::from_secs(5))
            .await
            .unwrap(),
    );
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "a begin waited {:?} behind a completion's WAIT",
        started.elapsed()
    );
    let (done, took) = waiting.await.unwrap();
    assert_eq!(done.unwrap(), Fenced::Ok(()));
    assert!(
        took >= Duration::from_millis(1400),
        "WAIT ran its course: {took:?}"
    );
    assert!(matches!(
        greedy.get(&k).await.unwrap(),
        Some(idem_core::Record::Completed(_))
    ));
}

/// 256 tasks each claim and complete keys of their own with leases,
/// retentions, fingerprints and outcomes that differ from task to task;
/// then every one meets its own completed record. Redis ran far fewer
/// script calls than there were operations: the calls were batched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_single_calls_are_batched_and_answered_each_their_own() {
    let Some(store) = shared().await else { return };
    let mut raw = raw(&url()).await;
    let script_calls = |info: String| -> u64 {
        info.lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    let info = || redis::cmd("INFO").arg("commandstats").clone();
    let before = script_calls(info().query_async(&mut raw).await.unwrap());
    let tasks = 256u64;
    let handles: Vec<_> = (0..tasks)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let k = key(&format!("batched-{t}"));
                let fp = (t % 2 == 0).then(|| idem_core::Fingerprint::xxh3(&t.to_le_bytes()));
                let lease = Lease::from_secs(5 + t % 3);
                let c = acquired(store.begin(&k, fp, lease).await.unwrap());
                assert_eq!(c.attempt, 1);
                let outcome = (t % 3 != 0).then(|| bytes::Bytes::from(format!("outcome {t}")));
                let retention = Duration::from_secs(60 + t % 4);
                let done = store
                    .complete(&k, c.token, outcome.clone(), retention)
                    .await
                    .unwrap();
                assert_eq!(done, Fenced::Ok(()), "task {t}");
                match store.begin(&k, fp, lease).await.unwrap() {
                    Begin::Completed { outcome: o, .. } => assert_eq!(o, outcome, "task {t}"),
                    other => panic!("task {t}: {other:?}"),
                }
                let Some(idem_core::Record::Completed(r)) = store.get(&k).await.unwrap() else {
                    panic!("task {t}: no completed record");
                };
                assert_eq!((r.token, r.fingerprint), (c.token, fp), "task {t}");
                assert_eq!(r.expires_at.since(r.completed_at), retention, "task {t}");
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
    let after = script_calls(info().query_async(&mut raw).await.unwrap());
    // Other tests may run scripts meanwhile; the store's own 768 script
    // operations alone would be 768 calls unbatched.
    eprintln!(
        "{} script calls for {} operations",
        after - before,
        3 * tasks
    );
    assert!(
        after - before < tasks,
        "{} script calls for {} operations",
        after - before,
        3 * tasks
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_keeps_records_and_the_store_carries_on() {
    if !services::program("redis-server") {
        return;
    }
    // A master serving every slot and its replica, each with a bus port of
    // its own choosing (and a directory of its own for nodes.conf).
    let (a, b, a_bus) = (free_port(), free_port(), free_port());
    let mut master = OwnRedis::start_with(a, &node(a_bus)).await;
    let _replica = OwnRedis::start_with(b, &node(free_port())).await;
    cli(a, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).await;
    let master_id = cli(a, &["CLUSTER", "MYID"]).await;
    let (a_port, a_bus) = (a.to_string(), a_bus.to_string());
    cli(b, &["CLUSTER", "MEET", "127.0.0.1", &a_port, &a_bus]).await;
    until("the replica knows the master", async || {
        cli(b, &["CLUSTER", "NODES"]).await.contains(&master_id)
    })
    .await;
    cli(b, &["CLUSTER", "REPLICATE", &master_id]).await;
    until("the replica is in sync", async || {
        cli(a, &["INFO", "replication"])
            .await
            .contains("state=online")
            && cli(b, &["CLUSTER", "INFO"])
                .await
                .contains("cluster_state:ok")
    })
    .await;

    let nodes = [
        format!("redis://127.0.0.1:{a}"),
        format!("redis://127.0.0.1:{b}"),
    ];
    let seeds: Vec<&str> = nodes.iter().map(String::as_str).collect();
    let store = RedisStore::cluster_builder(&seeds)
        .timeout(Duration::from_millis(500))
        // Every completion is on the replica before it is acknowledged.
        .wait_for_replicas(1, Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let done: Vec<Key> = (0..20)
        .map(|i| key(&format!("failover-done-{i}")))
        .collect();
    let mut last = 0;
    for k in &done {
        last = last.max(deliver(&store, k, "kept").await.get());
    }
    let held = key("failover-held");
    let claim = acquired(
        store
            .begin(&held, None, Lease::from_secs(60))
            .await
            .unwrap(),
    );
    // A claim is not waited for: let replication catch up with it.
    until("the claim reached the replica", async || {
        let rec = format!(
            "idem:{{redis-behaviour:{}}}:r",
            String::from_utf8_lossy(held.bytes())
        );
        // A cluster replica answers reads once told READONLY, on the same
        // connection.
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{b}"))
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (_, n): ((), u32) = redis::pipe()
            .cmd("READONLY")
            .cmd("EXISTS")
            .arg(&rec)
            .query_async(&mut c)
            .await
            .unwrap();
        n == 1
    })
    .await;

    master.stop().await;
    cli(b, &["CLUSTER", "FAILOVER", "TAKEOVER"]).await;
    until("the replica took over", async || {
        cli(b, &["ROLE"]).await.starts_with("master")
    })
    .await;

    // The same store object finds the new master (errors meanwhile are
    // Unavailable, to retry), and every record came along.
    let mut replay = None;
    for _ in 0..100 {
        match store.begin(&done[0], None, Lease::from_secs(60)).await {
            Ok(b) => {
                replay = Some(b);
                break;
            }
            Err(StoreError::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(e) => panic!("a failover is an error to retry, not {e}"),
        }
    }
    for (i, k) in done.iter().enumerate() {
        let b = match (i, replay.take()) {
            (0, Some(b)) => b,
            (0, None) => panic!("the store did not find the new master"),
            _ => store.begin(k, None, Lease::from_secs(60)).await.unwrap(),
        };
        match b {
            Begin::Completed { outcome, .. } => {
                assert_eq!(outcome.as_deref(), Some(&b"kept"[..]), "{k:?}")
            }
            other => panic!("{k:?} lost its completion in the failover: {other:?}"),
        }
    }
    assert!(
        matches!(
            store
                .begin(&held, None, Lease::from_secs(60))
                .await
                .unwrap(),
            Begin::InProgress { .. }
        ),
        "the claim survived the failover"
    );
    let ok = store
        .complete(
            &held,
            claim.token,
            Some("late".into()),
            Duration::from_secs(600),
        )
        .await
        .unwrap();
    assert_eq!(ok, Fenced::Ok(()), "its holder can still complete it");
    let fresh = acquired(
        store
            .begin(&key("failover-fresh"), None, Lease::from_secs(60))
            .await
            .unwrap(),
    );
    assert!(fresh.token.get() > last, "tokens keep increasing");
}

/// `stats_all` counts every namespace in one pass and reads only the head
/// of each record: records holding 256 KiB outcomes cost Redis a few
/// bytes each to count, not their outcomes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_reads_only_the_head_of_each_record() {
    if !services::program("redis-server") {
        return;
    }
    use idem_core::admin::Admin as _;
    let own = OwnRedis::start(free_port()).await;
    let url = format!("redis://127.0.0.1:{}", own.port);
    let store = RedisStore::connect(&url).await.unwrap();
    let big = bytes::Bytes::from(vec![b'x'; 256 * 1024]);
    for ns in ["big-a", "big-b"] {
        for i in 0..20 {
            let key = Key::new(ns, format!("k{i}")).unwrap();
            let claim = acquired(store.begin(&key, None, Lease::from_secs(60)).await.unwrap());
            if i % 2 == 0 {
                let done = store
                    .complete(
                        &key,
                        claim.token,
                        Some(big.clone()),
                        Duration::from_secs(600),
                    )
                    .await
                    .unwrap();
                assert!(matches!(done, Fenced::Ok(())));
            }
        }
    }
    let sent = || async {
        let info = cli(own.port, &["INFO", "stats"]).await;
        info.lines()
            .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
            .unwrap()
            .trim()
            .parse::<u64>()
            .unwrap()
    };
    let before = sent().await;
    let all = store.stats_all().await.unwrap();
    let cost = sent().await - before;
    let names: Vec<&str> = all.iter().map(|(ns, _)| ns.as_str()).collect();
    assert_eq!(names, ["big-a", "big-b"]);
    for (_, s) in &all {
        assert_eq!((s.in_progress, s.completed), (10, 10), "{s:?}");
    }
    // 20 outcomes of 256 KiB would be 5 MiB; the heads of 40 records and
    // the keys' names are a few KiB (INFO's own answers among them).
    assert!(cost < 64 * 1024, "counting sent {cost} bytes");
    let one = store.stats(&all[0].0).await.unwrap();
    assert_eq!(one, all[0].1);
}
