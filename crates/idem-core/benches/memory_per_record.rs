//! Bytes of heap per record in the memory store, counted by the allocator,
//! for 1 M records: in progress, and completed with a 2-byte outcome.
//!
//! `cargo bench -p idem-core --bench memory_per_record`

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use idem_core::{Begin, Key, Lease, MemoryStore, Namespace, Store};

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const RECORDS: usize = 1_000_000;

fn measure(complete: bool) {
    let ns = Namespace::new("orders").unwrap();
    let keys: Vec<Key> = (0..RECORDS)
        .map(|i| Key::in_namespace(ns.clone(), format!("order-{i:010}")).unwrap())
        .collect();
    let key_bytes = keys[0].bytes().len();
    let store = MemoryStore::builder().sweep_interval(None).build();
    let before = LIVE.load(Ordering::Relaxed);
    for key in &keys {
        let begun = store
            .begin(key, None, Lease::from_secs(60))
            .now_or_never()
            .unwrap();
        let Ok(Begin::Acquired(claim)) = begun else {
            panic!("fresh keys are acquired");
        };
        if complete {
            let done = store
                .complete(
                    key,
                    claim.token,
                    Some("ok".into()),
                    Duration::from_secs(3600),
                )
                .now_or_never()
                .unwrap()
                .unwrap();
            assert!(!done.is_stale());
        }
    }
    let used = (LIVE.load(Ordering::Relaxed) - before) as f64 / RECORDS as f64;
    let state = if complete {
        "completed, 2-byte outcome"
    } else {
        "in progress"
    };
    println!(
        "{RECORDS} records, {state}: {used:.1} bytes/record, {:.1} beyond the {key_bytes}-byte key",
        used - key_bytes as f64
    );
    drop(store);
}

fn main() {
    measure(false);
    measure(true);
}
