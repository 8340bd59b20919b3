//! Many threads insert and look up through one shared filter, without a
//! lock, while it rotates: no inserted key is lost.

mod filter_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idem_tiered::filter::Membership;

use filter_support::{at, config, hours, key, ready};

const THREADS: u64 = 4;
const PER_THREAD: u64 = 50_000;

#[test]
fn concurrent_inserts_and_rotations_lose_no_key() {
    let filter = Arc::new(ready(&config(THREADS * PER_THREAD), at(0)));
    let done = Arc::new(AtomicBool::new(false));
    let rotator = {
        let (filter, done) = (filter.clone(), done.clone());
        std::thread::spawn(move || {
            // Three rotations keep the generation the first keys went to:
            // it becomes the oldest, still live.
            let mut rotations = 0;
            for hour in 1..=3 {
                while !done.load(Ordering::Relaxed) && filter.stats().inserts < hour * 40_000 {
                    std::thread::yield_now();
                }
                if filter.rotate(hours(hour as f64)) {
                    rotations += 1;
                }
            }
            rotations
        })
    };
    let workers: Vec<_> = (0..THREADS)
        .map(|thread| {
            let filter = filter.clone();
            std::thread::spawn(move || {
                for n in thread * PER_THREAD..(thread + 1) * PER_THREAD {
                    filter.insert(&key(n));
                    assert_eq!(filter.check(&key(n)), Membership::Maybe);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    done.store(true, Ordering::Relaxed);
    assert_eq!(rotator.join().unwrap(), 3);
    let lost = (0..THREADS * PER_THREAD)
        .filter(|&n| filter.check(&key(n)).is_absent())
        .count();
    assert_eq!(lost, 0);
}
