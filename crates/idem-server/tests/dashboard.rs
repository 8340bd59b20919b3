//! The Grafana dashboard (`ops/grafana/idem.json`) references only metrics
//! idem emits: each name in its queries is in the exposition of a running
//! `idem serve` (on the tiered store, after traffic that takes a lease
//! over, is refused and uses a stale token), or, for a metric only an
//! event or another command emits, a name the binary's sources register.
//! A panel that shows the tiers apart finds both tiers in those series.

mod support;

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::{Value, json};

/// The metric names in a PromQL expression (`idem_…`), histogram and
/// summary series suffixes taken off.
fn names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("idem_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(tail.len());
        let name = &tail[..end];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        out.push(base.to_owned());
        rest = &tail[end..];
    }
    out
}

/// Every panel's queries.
fn dashboard_exprs() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ops/grafana/idem.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn dashboard_names() -> BTreeSet<String> {
    dashboard_exprs().iter().flat_map(|e| names_in(e)).collect()
}

/// Whether `"name"` is written in the sources of the crates the binary is
/// built from.
fn registered_in_sources(name: &str) -> bool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let quoted = format!("\"{name}\"");
    let mut dirs = vec![root.join("crates")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let file = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if !matches!(file, "tests" | "benches" | "examples" | "target") {
                    dirs.push(path);
                }
            } else if file.ends_with(".rs")
                && std::fs::read_to_string(&path).is_ok_and(|s| s.contains(&quoted))
            {
                return true;
            }
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_references_only_metrics_idem_emits() {
    let names = dashboard_names();
    assert!(names.len() >= 15, "{names:?}");

    let cold = tempfile::tempdir().unwrap();
    let cold_url = format!("file://{}", cold.path().display());
    let serve = support::start(
        &[
            "serve",
            "--store",
            "tiered",
            "--hot-store",
            "memory://",
            "--cold-store",
            &cold_url,
        ],
        &[],
    )
    .await;
    let begin = |lease: u64| json!({"key": "k", "lease_ms": lease});
    let url = serve.url("/v1/orders/begin");
    assert_eq!(support::post(&url, begin(30)).await.status, 200);
    tokio::time::sleep(std::time::Duration::from_millis(60)).await;
    // A takeover, then a complete by the overtaken token.
    assert_eq!(support::post(&url, begin(5000)).await.status, 200);
    let stale = json!({"key": "k", "token": 1, "outcome": 1});
    assert_eq!(
        support::post(&serve.url("/v1/orders/complete"), stale)
            .await
            .status,
        409
    );
    // A namespace no request may use is refused before it is routed.
    let refused = support::post(&serve.url("/v1/bad%2Fns/begin"), begin(10)).await;
    assert_eq!(refused.status, 400);
    let exposition = support::get(&serve.url("/metrics")).await.body;
    let exposition = String::from_utf8_lossy(&exposition).into_owned();
    serve.terminate().await;

    let scraped: BTreeSet<String> = exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .flat_map(names_in)
        .collect();
    for live in [
        "idem_operations_total",
        "idem_lease_takeovers_total",
        "idem_stale_tokens_total",
        "idem_store_calls_total",
        "idem_store_call_seconds",
        "idem_http_requests_total",
        "idem_refused_requests_total",
        "idem_filter_lookups_total",
    ] {
        assert!(
            scraped.contains(live),
            "idem serve emits {live}: {scraped:?}"
        );
    }
    let unknown: Vec<&String> = names
        .iter()
        .filter(|n| !scraped.contains(*n) && !registered_in_sources(n))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics no idem binary emits: {unknown:?}"
    );

    // The panels that show the tiers apart: each metric they query has a
    // series of the hot tier and one of the cold tier.
    let by_tier: Vec<String> = dashboard_exprs()
        .into_iter()
        .filter(|e| e.contains("tier!=\"\""))
        .collect();
    assert!(by_tier.len() >= 2, "panels by tier: {by_tier:?}");
    for name in by_tier.iter().flat_map(|e| names_in(e)) {
        for tier in ["tier=\"hot\"", "tier=\"cold\""] {
            assert!(
                exposition
                    .lines()
                    .any(|l| l.starts_with(&name) && l.contains(tier)),
                "the dashboard charts {name} by tier, and idem serve has no {tier} series of it"
            );
        }
    }
}

#[test]
fn names_come_out_of_queries_without_their_series_suffixes() {
    assert_eq!(
        names_in(
            "histogram_quantile(0.99, sum by (le) (rate(idem_store_call_seconds_bucket[5m]))) + idem_x_total"
        ),
        ["idem_store_call_seconds", "idem_x_total"]
    );
}

#[test]
fn a_panel_that_adds_series_shows_data_when_only_one_side_has_fired() {
    // A counter that never fired has no series, and `a + b` with one side
    // empty is empty: each side falls back to zero.
    for expr in dashboard_exprs() {
        let sides: Vec<&str> = expr.split(" + ").collect();
        if sides.len() < 2 {
            continue;
        }
        for side in sides {
            assert!(
                side.trim().ends_with("or vector(0))"),
                "{side:?} in {expr:?} has no `or vector(0)`"
            );
        }
    }
}
