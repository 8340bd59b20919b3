//! The few metrics the status page charts, read in process: a second
//! recorder beside Prometheus's that keeps only them, each in an atomic the
//! sampler reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Which activity a series counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// `idem serve`'s begin answers (`idem_operations_total{operation="begin"}`).
    Begins,
    /// `idem consume`'s settled messages (`idem_consumer_messages_total`).
    Messages,
}

/// One counted series: a family, a namespace and an outcome.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Series {
    pub family: Family,
    pub namespace: String,
    pub outcome: String,
}

impl Series {
    /// The series `key` counts, if the page charts it.
    fn of(key: &Key) -> Option<Self> {
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
        };
        let (family, outcome) = match key.name() {
            "idem_operations_total" if label("operation").as_deref() == Some("begin") => {
                (Family::Begins, label("result")?)
            }
            "idem_consumer_messages_total" => (Family::Messages, label("outcome")?),
            _ => return None,
        };
        Some(Self {
            family,
            namespace: label("namespace")?,
            outcome,
        })
    }
}

/// The counters and gauges the page reads. Cheap to clone: one table.
#[derive(Clone, Default)]
pub struct Watched {
    counters: Arc<Mutex<HashMap<Series, Arc<AtomicU64>>>>,
    /// The same cells by metric key: `metrics::counter!` registers on each
    /// call, and a known key is found here without reading its labels.
    by_key: Arc<Mutex<HashMap<Key, Arc<AtomicU64>>>>,
    /// `idem_consumer_lag` by namespace (f64 bits, as `metrics` keeps
    /// gauges in an `AtomicU64`).
    lags: Arc<Mutex<HashMap<String, Arc<AtomicU64>>>>,
}

impl Watched {
    /// Every watched counter's value now.
    pub fn counters(&self) -> Vec<(Series, u64)> {
        let counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        counters
            .iter()
            .map(|(s, c)| (s.clone(), c.load(Ordering::Relaxed)))
            .collect()
    }

    /// Each consuming namespace's lag now.
    pub fn lags(&self) -> Vec<(String, f64)> {
        let lags = self.lags.lock().unwrap_or_else(|e| e.into_inner());
        lags.iter()
            .map(|(ns, g)| (ns.clone(), f64::from_bits(g.load(Ordering::Relaxed))))
            .collect()
    }
}

impl Recorder for Watched {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        if !matches!(
            key.name(),
            "idem_operations_total" | "idem_consumer_messages_total"
        ) {
            return Counter::noop();
        }
        let mut by_key = self.by_key.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(cell) = by_key.get(key) {
            return Counter::from_arc(cell.clone());
        }
        let Some(series) = Series::of(key) else {
            return Counter::noop();
        };
        let mut counters = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        let cell = counters.entry(series).or_default().clone();
        by_key.insert(key.clone(), cell.clone());
        Counter::from_arc(cell)
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let namespace = key.labels().find(|l| l.key() == "namespace");
        match (key.name(), namespace) {
            ("idem_consumer_lag", Some(ns)) => {
                let mut lags = self.lags.lock().unwrap_or_else(|e| e.into_inner());
                Gauge::from_arc(lags.entry(ns.value().to_owned()).or_default().clone())
            }
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_charted_series_are_kept_and_they_count() {
        let watched = Watched::default();
        let meta = Metadata::new("t", metrics::Level::INFO, None);
        let begin = Key::from_parts(
            "idem_operations_total",
            vec![
                metrics::Label::new("namespace", "orders"),
                metrics::Label::new("operation", "begin"),
                metrics::Label::new("result", "acquired"),
            ],
        );
        let complete = Key::from_parts(
            "idem_operations_total",
            vec![
                metrics::Label::new("namespace", "orders"),
                metrics::Label::new("operation", "complete"),
                metrics::Label::new("result", "ok"),
            ],
        );
        watched.register_counter(&begin, &meta).increment(3);
        // The same series registered again shares the count.
        watched.register_counter(&begin, &meta).increment(2);
        watched.register_counter(&complete, &meta).increment(7);
        let lag = Key::from_parts(
            "idem_consumer_lag",
            vec![metrics::Label::new("namespace", "orders")],
        );
        watched.register_gauge(&lag, &meta).set(42.0);
        let counters = watched.counters();
        assert_eq!(counters.len(), 1);
        assert_eq!(counters[0].0.outcome, "acquired");
        assert_eq!(counters[0].1, 5);
        assert_eq!(watched.lags(), vec![("orders".to_owned(), 42.0)]);
    }
}
