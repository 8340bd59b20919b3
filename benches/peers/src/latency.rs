//! One task, sequential calls: where does idem's Redis latency go?
use std::time::{Duration, Instant};

use idem_core::{Key, Lease, Store};
use idem_redis::RedisStore;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".into());
    let store = RedisStore::connect(&url).await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut cm = client.get_connection_manager().await.unwrap();
    let n = 3000;
    let t = Instant::now();
    for i in 0..n {
        let _: Option<String> = redis::cmd("GET")
            .arg(format!("lat-{i}"))
            .query_async(&mut cm)
            .await
            .unwrap();
    }
    println!("raw GET via ConnectionManager: {:?}/call", t.elapsed() / n);
    let t = Instant::now();
    for i in 0..n {
        let k = Key::new("lat", format!("g-{i}")).unwrap();
        store.get(&k).await.unwrap();
    }
    println!("idem get (HGETALL): {:?}/call", t.elapsed() / n);
    let t = Instant::now();
    for i in 0..n {
        let k = Key::new("lat", format!("b-{i}-{}", std::process::id())).unwrap();
        let _ = store.begin(&k, None, Lease::from_secs(5)).await.unwrap();
    }
    println!("idem begin (script): {:?}/call", t.elapsed() / n);
    let t = Instant::now();
    for i in 0..n {
        let k = Key::new("lat", format!("r-{i}")).unwrap();
        let _ = store
            .release(&k, idem_core::FencingToken::new(1))
            .await
            .unwrap();
    }
    println!(
        "idem release (script, no pipeline): {:?}/call",
        t.elapsed() / n
    );
    let t = Instant::now();
    for i in 0..n {
        let mut p = redis::pipe();
        p.cmd("GET").arg(format!("lat-{i}"));
        let _: Vec<Option<String>> = p.query_async(&mut cm).await.unwrap();
    }
    println!(
        "raw GET as a 1-command pipeline: {:?}/call",
        t.elapsed() / n
    );
    let _ = Duration::ZERO;
}
