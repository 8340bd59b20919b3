//! A process-wide metrics recorder for the tests: counters and gauges read
//! back by name and labels.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use metrics::atomics::AtomicU64;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use parking_lot::Mutex;

#[derive(Default)]
pub struct TestRecorder {
    counters: Mutex<HashMap<String, Arc<AtomicU64>>>,
    gauges: Mutex<HashMap<String, Arc<AtomicU64>>>,
}

/// The recorder, installed as the global one on first use.
pub fn recorder() -> &'static TestRecorder {
    static RECORDER: OnceLock<&'static TestRecorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder: &'static TestRecorder = Box::leak(Box::default());
        metrics::set_global_recorder(recorder).expect("no other recorder in the tests");
        recorder
    })
}

/// `name{a=1,b=2}`, labels sorted.
fn id(key: &Key) -> String {
    let mut labels: Vec<String> = key
        .labels()
        .map(|l| format!("{}={}", l.key(), l.value()))
        .collect();
    labels.sort();
    format!("{}{{{}}}", key.name(), labels.join(","))
}

impl TestRecorder {
    /// The counter `name{labels}` (labels as `a=1,b=2`, sorted), 0 if never
    /// counted.
    pub fn counter(&self, name: &str, labels: &str) -> u64 {
        self.counters
            .lock()
            .get(&format!("{name}{{{labels}}}"))
            .map_or(0, |c| c.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The gauge `name{labels}`, if it was ever set.
    pub fn gauge(&self, name: &str, labels: &str) -> Option<f64> {
        self.gauges
            .lock()
            .get(&format!("{name}{{{labels}}}"))
            .map(|g| f64::from_bits(g.load(std::sync::atomic::Ordering::Relaxed)))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let c = self.counters.lock().entry(id(key)).or_default().clone();
        Counter::from_arc(c)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let g = self.gauges.lock().entry(id(key)).or_default().clone();
        Gauge::from_arc(g)
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}
