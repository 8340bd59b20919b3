//! A small load generator for `idem serve`: N connections on one thread,
//! each running `begin` then `complete` on new keys, back to back (or, with
//! `batch`, `begin-batch` requests of 1 000 new keys). One thread, like
//! `redis-benchmark`, so the two compare fairly.
//!
//! `cargo run --release -p idem-server --example load -- http://127.0.0.1:7700 64 10 [batch]`

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

type Http = Client<HttpConnector, Full<Bytes>>;

async fn post(client: &Http, url: &str, body: String) -> (u16, Bytes) {
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let res = client.request(req).await.expect("the server answers");
    let status = res.status().as_u16();
    (status, res.into_body().collect().await.unwrap().to_bytes())
}

fn token(body: &[u8]) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap();
    assert_eq!(v["status"], "acquired", "{v}");
    v["token"].as_u64().unwrap()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:7700".into());
    let conns: usize = args.get(2).map_or(64, |a| a.parse().unwrap());
    let secs: u64 = args.get(3).map_or(10, |a| a.parse().unwrap());
    let batch = args.get(4).is_some_and(|a| a == "batch");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client: Http = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(conns)
            .build(connector);
        let (begin, complete) = (format!("{base}/v1/load/begin"), format!("{base}/v1/load/complete"));
        let begin_batch = format!("{base}/v1/load/begin-batch");
        // The end of each key of a batch and of its item: `{j}"}`.
        let key_ends: std::sync::Arc<Vec<String>> =
            std::sync::Arc::new((0..1000).map(|j| format!("{j}\"}}")).collect());
        let run = format!("{}", std::process::id());
        let deadline = Instant::now() + Duration::from_secs(secs);
        let tasks: Vec<_> = (0..conns)
            .map(|c| {
                let (client, begin, complete, run) = (client.clone(), begin.clone(), complete.clone(), run.clone());
                let (begin_batch, key_ends) = (begin_batch.clone(), key_ends.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut i = 0u64;
                    while Instant::now() < deadline {
                        i += 1;
                        if batch {
                            // One buffer and no formatting per key: this thread
                            // shares the cores with the server it measures.
                            let prefix = format!("{{\"key\":\"{run}-{c}-{i}-");
                            let mut body = String::with_capacity(16 + 1000 * (prefix.len() + 8));
                            body.push_str("{\"items\":[");
                            for (j, end) in key_ends.iter().enumerate() {
                                if j > 0 {
                                    body.push(',');
                                }
                                body.push_str(&prefix);
                                body.push_str(end);
                            }
                            body.push_str("]}");
                            let t0 = Instant::now();
                            let (s, _) = post(&client, &begin_batch, body).await;
                            assert_eq!(s, 200);
                            latencies.push(t0.elapsed());
                            continue;
                        }
                        let key = format!("{run}-{c}-{i}");
                        let t0 = Instant::now();
                        let (s, body) = post(&client, &begin, format!("{{\"key\":\"{key}\"}}")).await;
                        assert_eq!(s, 200);
                        let t1 = Instant::now();
                        let token = token(&body);
                        let (s, _) = post(
                            &client,
                            &complete,
                            format!("{{\"key\":\"{key}\",\"token\":{token},\"outcome\":{{\"ok\":true}}}}"),
                        )
                        .await;
                        assert_eq!(s, 200);
                        latencies.push(t1 - t0);
                        latencies.push(t1.elapsed());
                    }
                    latencies
                })
            })
            .collect();
        let start = Instant::now();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let elapsed = start.elapsed().as_secs_f64();
        all.sort();
        let pct = |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)];
        if batch {
            println!(
                "{conns} connections, {secs} s: {:.0} begin-batch requests/s, {:.0} keys/s, request latency p50 {:?} p99 {:?}",
                all.len() as f64 / elapsed,
                all.len() as f64 * 1000.0 / elapsed,
                pct(0.50),
                pct(0.99)
            );
            return;
        }
        println!(
            "{conns} connections, {secs} s: {:.0} requests/s, {:.0} begin+complete cycles/s, request latency p50 {:?} p99 {:?}",
            all.len() as f64 / elapsed,
            all.len() as f64 / 2.0 / elapsed,
            pct(0.50),
            pct(0.99)
        );
    });
}
