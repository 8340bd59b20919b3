//! One task, sequential calls: where does idem's Redis latency go? Rounds
//! interleave the variants; medians of per-round means.
use std::time::{Duration, Instant};

use idem_core::{FencingToken, Key, Lease, Store};
use idem_redis::RedisStore;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let store = RedisStore::connect(&url).await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut cm = client.get_connection_manager().await.unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return redis.call('GET', KEYS[1])")
        .query_async(&mut cm)
        .await
        .unwrap();
    let begin_src = concat!(
        include_str!("../../../crates/stores/idem-redis/src/scripts/time.lua"),
        include_str!("../../../crates/stores/idem-redis/src/scripts/begin_first.lua"),
        include_str!("../../../crates/stores/idem-redis/src/scripts/record.lua"),
        include_str!("../../../crates/stores/idem-redis/src/scripts/begin.lua")
    );
    let begin_sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(begin_src)
        .query_async(&mut cm)
        .await
        .unwrap();
    let n = 500;
    let pid = std::process::id();
    let names = [
        "raw GET",
        "raw GET, 1-command pipeline",
        "raw EVALSHA (GET in Lua)",
        "raw EVALSHA of idem's begin",
        "idem get",
        "idem begin",
        "idem release",
    ];
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    for round in 0..20 {
        for (v, slot) in times.iter_mut().enumerate() {
            let t = Instant::now();
            for i in 0..n {
                let k = format!("lat-{pid}-{round}-{i}");
                match v {
                    0 => {
                        let _: Option<String> = redis::cmd("GET")
                            .arg(&k)
                            .query_async(&mut cm)
                            .await
                            .unwrap();
                    }
                    1 => {
                        let mut p = redis::pipe();
                        p.cmd("GET").arg(&k);
                        let _: Vec<Option<String>> = p.query_async(&mut cm).await.unwrap();
                    }
                    2 => {
                        let _: Option<String> = redis::cmd("EVALSHA")
                            .arg(&sha)
                            .arg(1)
                            .arg(&k)
                            .query_async(&mut cm)
                            .await
                            .unwrap();
                    }
                    3 => {
                        let _: redis::Value = redis::cmd("EVALSHA")
                            .arg(&begin_sha)
                            .arg(1)
                            .arg(format!("idem:{{lat:{k}}}:r"))
                            .arg("1")
                            .arg(5000)
                            .arg(3_605_001)
                            .arg("")
                            .query_async(&mut cm)
                            .await
                            .unwrap();
                    }
                    4 => {
                        store.get(&Key::new("lat", k).unwrap()).await.unwrap();
                    }
                    5 => {
                        let _ = store
                            .begin(&Key::new("lat", k).unwrap(), None, Lease::from_secs(5))
                            .await
                            .unwrap();
                    }
                    _ => {
                        let _ = store
                            .release(&Key::new("lat", k).unwrap(), FencingToken::new(1))
                            .await
                            .unwrap();
                    }
                }
            }
            slot.push(t.elapsed() / n);
        }
    }
    for (name, mut t) in names.iter().zip(times) {
        t.sort();
        println!(
            "{name:<30} median {:?}/call (best round {:?})",
            t[t.len() / 2],
            t[0]
        );
    }
}
