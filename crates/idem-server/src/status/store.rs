//! The store as the status page shows it: whether it answers, what it finds
//! in its own settings, and each namespace's records counted, with the
//! claims that have been in progress too long.
//!
//! The store is looked at in the background while the page asks, never
//! while a request waits (but for the very first look, up to
//! [`FIRST_LOOK_WAIT`]): a request gets the last look and starts the next
//! one when it is due. Looks are at least [`REFRESH`] apart, and further
//! apart on a store where counting is slow (ten times the last look's
//! length), so that a page left open costs the store at most a tenth of
//! its time; the stored namespaces are listed at most every
//! [`LIST_EVERY`]. A closed page costs nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use idem_core::admin::{Admin, Severity};
use idem_core::{
    Clock as _, Key, Namespace, RecordState, ScanQuery, SharedStore, Store as _, SystemClock,
    Timestamp,
};
use serde_json::{Value, json};

use crate::ops::{entry_json, shown};

/// The shortest time between two looks.
pub const REFRESH: Duration = Duration::from_secs(10);

/// The longest time between two listings of the stored namespaces (a scan
/// of the whole keyspace on Redis).
pub const LIST_EVERY: Duration = Duration::from_secs(300);

/// How long the first request waits for the first look.
pub const FIRST_LOOK_WAIT: Duration = Duration::from_secs(2);

/// Namespaces counted on each look, those with recent activity first.
pub const MAX_COUNTED_NAMESPACES: usize = 20;

/// Stuck claims listed per namespace.
pub const MAX_STUCK_LISTED: usize = 10;

/// The longest one store call of a look may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// The store behind a status page.
pub struct StoreWatch {
    store: SharedStore,
    admin: Option<Arc<dyn Admin>>,
    description: String,
    /// Whether stuck claims show their keys: not when the service asks
    /// callers for a token, as the page asks for none.
    show_keys: bool,
    /// A claim in progress for longer than this is listed as stuck
    /// (`--stuck-after`).
    stuck_after: Duration,
    /// The last look, and when the next is due.
    last: Mutex<Option<(Arc<Value>, Instant)>>,
    /// A look is under way.
    looking: AtomicBool,
    /// Told of each finished look.
    looked: tokio::sync::Notify,
    /// The stored namespaces, and when they were listed.
    listed: Mutex<Option<(Vec<String>, Instant)>>,
}

impl StoreWatch {
    pub fn new(
        store: SharedStore,
        admin: Option<Arc<dyn Admin>>,
        description: String,
        show_keys: bool,
        stuck_after: Duration,
    ) -> Self {
        Self {
            store,
            admin,
            description,
            show_keys,
            stuck_after,
            last: Mutex::default(),
            looking: AtomicBool::new(false),
            looked: tokio::sync::Notify::new(),
            listed: Mutex::default(),
        }
    }

    /// The store's last look; starts the next when it is due. `active`
    /// are the namespaces busiest lately, counted first.
    ///
    /// # Cancel safety
    ///
    /// The look runs on its own task and is kept for the next caller when
    /// this one leaves; it only reads.
    pub async fn view(self: &Arc<Self>, active: Vec<String>) -> Arc<Value> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let due = last
            .as_ref()
            .is_none_or(|(_, next)| Instant::now() >= *next);
        let finished = self.looked.notified();
        if due && !self.looking.swap(true, Ordering::AcqRel) {
            let me = self.clone();
            tokio::spawn(async move {
                // Whatever ends the look, a panic too, the next one may start.
                let _done = LookDone(&me);
                let started = Instant::now();
                let view = Arc::new(me.look(active).await);
                let next = Instant::now() + REFRESH.max(started.elapsed() * 10);
                *me.last.lock().unwrap_or_else(|e| e.into_inner()) = Some((view, next));
            });
        }
        if let Some((view, _)) = last {
            return view;
        }
        let _ = tokio::time::timeout(FIRST_LOOK_WAIT, finished).await;
        match &*self.last.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((view, _)) => view.clone(),
            None => Arc::new(json!({
                "description": self.description,
                "looking": true,
                "refresh_seconds": REFRESH.as_secs(),
                "stuck_after_seconds": self.stuck_after.as_secs_f64(),
                "keys_shown": self.show_keys,
            })),
        }
    }

    /// The stored namespaces, listed again once [`LIST_EVERY`] has passed.
    async fn stored_namespaces(&self, admin: &dyn Admin) -> Result<Vec<String>, String> {
        if let Some((names, at)) = &*self.listed.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < LIST_EVERY
        {
            return Ok(names.clone());
        }
        let names: Vec<String> = timed(admin.namespaces())
            .await?
            .iter()
            .map(|ns| ns.as_str().to_owned())
            .collect();
        *self.listed.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((names.clone(), Instant::now()));
        Ok(names)
    }

    async fn look(&self, active: Vec<String>) -> Value {
        let now = SystemClock.now();
        let probe = Key::new("idem.readyz", "probe").expect("a valid key");
        let started = Instant::now();
        let (healthy, error) = match timed(self.store.get(&probe)).await {
            Ok(_) => (true, None),
            Err(e) => (false, Some(e)),
        };
        let answered_ms = started.elapsed().as_secs_f64() * 1e3;
        let mut view = json!({
            "description": self.description,
            "checked_at_ms": now.as_millis(),
            "healthy": healthy,
            "error": error,
            "answered_ms": answered_ms,
            "refresh_seconds": REFRESH.as_secs(),
            "stuck_after_seconds": self.stuck_after.as_secs_f64(),
            "keys_shown": self.show_keys,
        });
        if !healthy {
            return view;
        }
        let mut namespaces: Vec<String> = active;
        if let Some(admin) = &self.admin {
            view["counted"] = true.into();
            view["findings"] = match timed(admin.findings()).await {
                Ok(findings) => findings
                    .into_iter()
                    .map(|f| {
                        json!({
                            "severity": match f.severity {
                                Severity::Ok => "ok",
                                Severity::Warn => "warn",
                                Severity::Fail => "fail",
                            },
                            "check": shown(f.check.as_bytes()),
                            "detail": shown(f.detail.as_bytes()),
                            "fix": f.fix.map(|fix| shown(fix.as_bytes())),
                        })
                    })
                    .collect(),
                Err(e) => json!([{"severity": "warn", "check": "settings", "detail": e}]),
            };
            if let Ok(Some(size)) = timed(admin.size()).await {
                view["size"] = json!({"bytes": size.bytes, "what": size.what});
            }
            match self.stored_namespaces(&**admin).await {
                Ok(stored) => {
                    for ns in stored {
                        if !namespaces.contains(&ns) {
                            namespaces.push(ns);
                        }
                    }
                }
                Err(e) => view["namespaces_error"] = e.into(),
            }
        } else {
            view["counted"] = false.into();
        }
        view["namespaces_total"] = namespaces.len().into();
        namespaces.truncate(MAX_COUNTED_NAMESPACES);
        let mut listed = Vec::with_capacity(namespaces.len());
        for name in namespaces {
            // Names from the activity counters may be "(other)".
            let Ok(ns) = Namespace::new(&name) else {
                continue;
            };
            listed.push(self.namespace(ns, now).await);
        }
        view["namespaces"] = listed.into();
        view
    }

    /// One namespace: its records counted, and its stuck claims.
    async fn namespace(&self, ns: Namespace, now: Timestamp) -> Value {
        let mut out = json!({"namespace": ns.as_str()});
        let mut any_in_progress = true;
        if let Some(admin) = &self.admin {
            // The count stops on the server too when the page stops waiting.
            match timed(admin.stats_within(&ns, CALL_TIMEOUT)).await {
                Ok(stats) => {
                    any_in_progress = stats.in_progress + stats.abandoned > 0;
                    out["in_progress"] = stats.in_progress.into();
                    out["abandoned"] = stats.abandoned.into();
                    out["completed"] = stats.completed.into();
                    out["expired"] = stats.expired.into();
                    out["oldest_in_progress_seconds"] = stats
                        .oldest_in_progress
                        .map(|t| now.since(t).as_secs_f64())
                        .into();
                }
                Err(e) => out["error"] = e.into(),
            }
        }
        if !any_in_progress {
            out["stuck"] = json!([]);
            return out;
        }
        let before = Timestamp::from_millis(
            now.as_millis()
                .saturating_sub(self.stuck_after.as_millis() as u64),
        );
        let query = ScanQuery::new(ns)
            .state(RecordState::InProgress)
            .older_than(before)
            .limit(MAX_STUCK_LISTED + 1);
        match timed(self.store.scan(&query)).await {
            Ok(entries) => {
                out["stuck_more"] = (entries.len() > MAX_STUCK_LISTED).into();
                out["stuck"] = entries
                    .iter()
                    .take(MAX_STUCK_LISTED)
                    .map(|e| {
                        let mut v = entry_json(e, now, false);
                        if !self.show_keys {
                            v["key"] = Value::Null;
                        }
                        v
                    })
                    .collect();
            }
            Err(e) => out["stuck_error"] = e.into(),
        }
        out
    }
}

/// Marks the look ended and wakes those waiting for it, when dropped.
struct LookDone<'a>(&'a StoreWatch);

impl Drop for LookDone<'_> {
    fn drop(&mut self) {
        self.0.looking.store(false, Ordering::Release);
        self.0.looked.notify_waiters();
    }
}

/// A store call, cut off after [`CALL_TIMEOUT`]; its error as text.
async fn timed<T, E: std::fmt::Display>(
    call: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(shown(e.to_string().as_bytes())),
        Err(_) => Err(format!("no answer within {} s", CALL_TIMEOUT.as_secs())),
    }
}
