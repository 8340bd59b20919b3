//! The last five minutes of activity: every [`TICK`], what each watched
//! counter added since the tick before.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use super::recorder::{Family, Series};

/// How often the counters are read.
pub const TICK: Duration = Duration::from_secs(2);

/// Ticks kept: five minutes.
pub const WINDOW: usize = 150;

/// Namespaces listed per family, the busiest first.
pub const MAX_LISTED_NAMESPACES: usize = 50;

/// Ticks the "now" rate averages over: ten seconds.
const NOW_TICKS: usize = 5;

/// The counts per tick, by series.
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Each series' value at the last tick.
    last: HashMap<Series, u64>,
    /// When each kept tick was taken (Unix ms), oldest first.
    times: VecDeque<u64>,
    /// What each series added in each kept tick, aligned with `times`.
    /// Series quiet for the whole window are dropped.
    added: HashMap<Series, VecDeque<u64>>,
}

/// One family's activity, for the page.
#[derive(Debug, Serialize)]
pub struct FamilyView {
    pub family: Family,
    /// The namespace the chart shows; `None`: all of them, summed.
    pub namespace: Option<String>,
    /// Per outcome, the rate (per second) in each tick.
    pub outcomes: BTreeMap<String, Vec<f64>>,
    /// The busiest namespaces over the window.
    pub namespaces: Vec<NamespaceActivity>,
}

/// A namespace's activity over the window.
#[derive(Debug, Serialize)]
pub struct NamespaceActivity {
    pub namespace: String,
    /// Per second, over the last ten seconds.
    pub per_second_now: f64,
    /// Counted in the window, by outcome.
    pub in_window: BTreeMap<String, u64>,
}

/// What the chart reads.
#[derive(Debug, Serialize)]
pub struct ActivityView {
    pub tick_seconds: f64,
    /// When each tick was taken (Unix ms).
    pub times_ms: Vec<u64>,
    pub families: Vec<FamilyView>,
}

impl History {
    /// Takes a tick at `now_ms` from the counters' values now.
    pub fn tick(&self, now_ms: u64, counters: Vec<(Series, u64)>) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let Inner { last, times, added } = &mut *inner;
        times.push_back(now_ms);
        let kept = times.len();
        for (series, value) in counters {
            // A series first seen now was registered since the last tick:
            // all it counts happened in this one.
            let before = last.insert(series.clone(), value).unwrap_or(0);
            let delta = value.saturating_sub(before);
            if delta == 0 && !added.contains_key(&series) {
                continue;
            }
            let row = added.entry(series).or_insert_with(|| {
                let mut row = VecDeque::with_capacity(WINDOW + 1);
                row.resize(kept - 1, 0);
                row
            });
            row.push_back(delta);
        }
        for row in added.values_mut() {
            row.resize(kept, 0);
        }
        if times.len() > WINDOW {
            times.pop_front();
            for row in added.values_mut() {
                row.pop_front();
            }
        }
        added.retain(|_, row| row.iter().any(|&n| n > 0));
    }

    /// The window, each family summed over its namespaces or, for
    /// `namespace`, that namespace's alone.
    pub fn view(&self, namespace: Option<&str>, may_see: impl Fn(&str) -> bool) -> ActivityView {
        let inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let secs = TICK.as_secs_f64();
        let ticks = inner.times.len();
        let mut families: BTreeMap<Family, FamilyView> = BTreeMap::new();
        // Per family and namespace: counted in the last ten seconds, and
        // in the window by outcome.
        type Busy<'a> = BTreeMap<&'a str, (u64, BTreeMap<String, u64>)>;
        let mut busy: BTreeMap<Family, Busy<'_>> = BTreeMap::new();
        for (series, row) in &inner.added {
            if !may_see(&series.namespace) {
                continue;
            }
            let family = families.entry(series.family).or_insert_with(|| FamilyView {
                family: series.family,
                namespace: namespace.map(str::to_owned),
                outcomes: BTreeMap::new(),
                namespaces: Vec::new(),
            });
            let (recent, by_outcome) = busy
                .entry(series.family)
                .or_default()
                .entry(&series.namespace)
                .or_default();
            *recent += row.iter().rev().take(NOW_TICKS).sum::<u64>();
            *by_outcome.entry(series.outcome.clone()).or_default() += row.iter().sum::<u64>();
            if namespace.is_some_and(|ns| ns != series.namespace) {
                continue;
            }
            let rates = family
                .outcomes
                .entry(series.outcome.clone())
                .or_insert_with(|| vec![0.0; ticks]);
            for (rate, &n) in rates.iter_mut().zip(row) {
                *rate += n as f64 / secs;
            }
        }
        for (family, namespaces) in busy {
            let mut listed: Vec<NamespaceActivity> = namespaces
                .into_iter()
                .map(|(ns, (recent, in_window))| NamespaceActivity {
                    namespace: ns.to_owned(),
                    per_second_now: recent as f64 / (NOW_TICKS.min(ticks).max(1) as f64 * secs),
                    in_window,
                })
                .collect();
            let total = |a: &NamespaceActivity| a.in_window.values().sum::<u64>();
            listed.sort_by(|a, b| total(b).cmp(&total(a)).then(a.namespace.cmp(&b.namespace)));
            listed.truncate(MAX_LISTED_NAMESPACES);
            if let Some(view) = families.get_mut(&family) {
                view.namespaces = listed;
            }
        }
        ActivityView {
            tick_seconds: secs,
            times_ms: inner.times.iter().copied().collect(),
            families: families.into_values().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn begins(ns: &str, outcome: &str) -> Series {
        Series {
            family: Family::Begins,
            namespace: ns.to_owned(),
            outcome: outcome.to_owned(),
        }
    }

    #[test]
    fn rates_are_what_each_tick_added_per_second() {
        let history = History::default();
        history.tick(0, vec![]);
        history.tick(2_000, vec![(begins("orders", "acquired"), 10)]);
        history.tick(
            4_000,
            vec![
                (begins("orders", "acquired"), 30),
                (begins("carts", "completed"), 4),
            ],
        );
        let view = history.view(None, |_| true);
        assert_eq!(view.times_ms, vec![0, 2_000, 4_000]);
        let begins_view = &view.families[0];
        assert_eq!(begins_view.outcomes["acquired"], vec![0.0, 5.0, 10.0]);
        assert_eq!(begins_view.outcomes["completed"], vec![0.0, 0.0, 2.0]);
        assert_eq!(begins_view.namespaces[0].namespace, "orders");
        assert_eq!(begins_view.namespaces[0].in_window["acquired"], 30);

        let carts = history.view(Some("carts"), |_| true);
        assert!(!carts.families[0].outcomes.contains_key("acquired"));
        assert_eq!(carts.families[0].outcomes["completed"], vec![0.0, 0.0, 2.0]);
    }

    #[test]
    fn the_window_keeps_five_minutes_and_forgets_quiet_series() {
        let history = History::default();
        history.tick(0, vec![(begins("orders", "acquired"), 1)]);
        for i in 1..=WINDOW as u64 + 10 {
            history.tick(i * 2_000, vec![(begins("orders", "acquired"), 1)]);
        }
        let view = history.view(None, |_| true);
        assert_eq!(view.times_ms.len(), WINDOW);
        assert!(view.families.is_empty(), "quiet for the whole window");
    }
}
