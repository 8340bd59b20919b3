//! idem's memory store beside the `idempotent` crate's (0.3.0, the newest
//! that builds on this toolchain), on one workload: a fresh store fed 200 000
//! keys plus 10 % duplicates by one task; a delivery is a claim, and a
//! completion when claimed. Prints deliveries per second, best and median of
//! 7 runs each, interleaved so both see the same machine.

use std::time::{Duration, Instant};

use idem_core::{Begin, Key, Lease, MemoryStore, Namespace, Store};
use idempotent::fingerprint::{DefaultFingerprintStrategy, FingerprintStrategy};
use idempotent::store::{IdempotencyStore, InsertResult};
use idempotent::{CachedResponse, IdempotencyEntry, IdempotencyKey, Metadata};

const KEYS: usize = 200_000;

fn stream() -> Vec<String> {
    let mut out = Vec::with_capacity(KEYS + KEYS / 10);
    for i in 0..KEYS {
        out.push(format!("order-{i:010}"));
        if i % 10 == 9 {
            out.push(out[i / 2].clone());
        }
    }
    out
}

async fn idem_run(keys: &[Key]) -> Duration {
    let store = MemoryStore::new();
    let start = Instant::now();
    for key in keys {
        if let Begin::Acquired(claim) = store.begin(key, None, Lease::from_secs(30)).await.unwrap()
        {
            let done = store
                .complete(
                    key,
                    claim.token,
                    Some("ok".into()),
                    Duration::from_secs(3600),
                )
                .await
                .unwrap();
            assert!(!done.is_stale());
        }
    }
    start.elapsed()
}

async fn peer_run(keys: &[IdempotencyKey]) -> Duration {
    let store = idempotent::store::memory::MemoryStore::new(1024, Duration::from_secs(1));
    let fingerprint = DefaultFingerprintStrategy.compute("POST /orders", b"");
    let start = Instant::now();
    for key in keys {
        let entry = IdempotencyEntry::new(fingerprint, Duration::from_secs(3600));
        if let InsertResult::Claimed { fencing_token } =
            store.try_insert(key, entry.clone()).await.unwrap()
        {
            let response = CachedResponse {
                status_code: 200,
                metadata: Metadata::default(),
                body: b"ok".to_vec().into(),
            };
            store
                .complete(key, entry.complete(response), fencing_token)
                .await
                .unwrap();
        }
    }
    start.elapsed()
}

fn report(name: &str, deliveries: usize, mut runs: Vec<Duration>) {
    runs.sort();
    let rate = |d: Duration| deliveries as f64 / d.as_secs_f64() / 1e6;
    println!(
        "{name:<28} best {:.2} M/s  median {:.2} M/s",
        rate(runs[0]),
        rate(runs[runs.len() / 2])
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = stream();
    let ns = Namespace::new("orders").unwrap();
    let idem_keys: Vec<Key> = raw
        .iter()
        .map(|k| Key::in_namespace(ns.clone(), k.clone()).unwrap())
        .collect();
    let peer_keys: Vec<IdempotencyKey> = raw
        .iter()
        .map(|k| IdempotencyKey::new(k.clone()).unwrap())
        .collect();
    let (mut idem, mut peer) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        idem.push(rt.block_on(idem_run(&idem_keys)));
        peer.push(rt.block_on(peer_run(&peer_keys)));
    }
    println!(
        "{} deliveries per run ({KEYS} keys + 10 % duplicates), 1 task",
        raw.len()
    );
    report("idem MemoryStore", raw.len(), idem);
    report("idempotent 0.3.0 MemoryStore", raw.len(), peer);
}
