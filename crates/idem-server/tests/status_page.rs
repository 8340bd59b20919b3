//! The status page at `/` of `idem serve`: `/status.json` charts begin
//! answers per namespace and lists the claims stuck in progress (without
//! their keys when auth is on); `--no-status-page` turns it off; and in a
//! real browser (headless Chromium) the page draws its chart from live
//! traffic with no error in the console.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::{Process, get, post, post_auth, start};

/// `/status.json` once `ready` holds of it, within `limit`.
async fn status_when(
    idem: &Process,
    query: &str,
    limit: Duration,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    status_seen_by(idem, None, query, limit, ready).await
}

/// [`status_when`], asked with `token`.
async fn status_seen_by(
    idem: &Process,
    token: Option<&str>,
    query: &str,
    limit: Duration,
    ready: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + limit;
    loop {
        let status = get_with(&idem.url(&format!("/status.json{query}")), token)
            .await
            .json();
        if ready(&status) {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "not as expected within {limit:?}: {status:#}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn get_with(url: &str, token: Option<&str>) -> support::Answer {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("authorization", b.as_str()))
        .collect();
    support::send(http::Method::GET, url, &headers, bytes::Bytes::new()).await
}

/// What `family`'s chart counted of `outcome` over the window.
fn charted(status: &Value, family: &str, outcome: &str) -> f64 {
    let tick = status["activity"]["tick_seconds"].as_f64().unwrap_or(0.0);
    status["activity"]["families"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["family"] == family)
        .flat_map(|f| {
            f["outcomes"][outcome]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|rate| rate.as_f64().unwrap_or(0.0) * tick)
        .sum()
}

fn namespace<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["store"]["namespaces"]
        .as_array()
        .and_then(|all| all.iter().find(|n| n["namespace"] == name))
        .unwrap_or_else(|| panic!("{name} is not counted: {status:#}"))
}

/// Begins `n` keys of `ns` and completes them.
async fn begin_and_complete(base: &str, ns: &str, prefix: &str, n: usize) {
    begin_and_complete_as(base, None, ns, prefix, n).await;
}

/// [`begin_and_complete`] with a bearer token.
async fn begin_and_complete_as(base: &str, bearer: Option<&str>, ns: &str, prefix: &str, n: usize) {
    let call = async |path: &str, body: Value| match bearer {
        Some(t) => post_auth(&format!("{base}/v1/{ns}/{path}"), t, body).await,
        None => post(&format!("{base}/v1/{ns}/{path}"), body).await,
    };
    for i in 0..n {
        let key = format!("{prefix}-{i}");
        let begun = call("begin", json!({"key": key})).await;
        assert_eq!(begun.status, 200);
        let token = begun.json()["token"].as_u64().expect("acquired");
        let done = call(
            "complete",
            json!({"key": key, "token": token, "outcome": {"n": i}}),
        )
        .await;
        assert_eq!(done.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_json_charts_begins_by_namespace_and_lists_stuck_claims() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let idem = start(&["serve", "--store", &store, "--stuck-after", "1s"], &[]).await;

    // One claim left held, in progress for longer than --stuck-after.
    let held = post(
        &idem.url("/v1/orders/begin"),
        json!({"key": "stuck \u{7}key", "lease_ms": 60_000}),
    )
    .await;
    assert_eq!(held.json()["status"], "acquired");
    begin_and_complete(&idem.base, "orders", "order", 30).await;
    begin_and_complete(&idem.base, "carts", "cart", 5).await;
    // Ten duplicates, answered from the store.
    for i in 0..10 {
        let again = post(
            &idem.url("/v1/orders/begin"),
            json!({"key": format!("order-{i}")}),
        )
        .await;
        assert_eq!(again.json()["status"], "completed");
    }
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let status = status_when(&idem, "", Duration::from_secs(15), |s| {
        charted(s, "begins", "acquired") >= 36.0 && charted(s, "begins", "completed") >= 10.0
    })
    .await;
    assert_eq!(status["service"], "idem serve");
    assert_eq!(charted(&status, "begins", "acquired"), 36.0, "{status:#}");
    assert_eq!(charted(&status, "begins", "completed"), 10.0);
    let busiest = &status["activity"]["families"][0]["namespaces"];
    assert_eq!(
        busiest[0]["namespace"], "orders",
        "the busiest first: {busiest}"
    );
    assert_eq!(busiest[0]["in_window"]["acquired"], 31);
    assert_eq!(busiest[1]["namespace"], "carts");

    let store = &status["store"];
    assert_eq!(store["healthy"], true, "{store:#}");
    assert_eq!(store["counted"], true);
    let orders = namespace(&status, "orders");
    assert_eq!(orders["in_progress"], 1, "{orders:#}");
    assert_eq!(orders["completed"], 30);
    assert!(orders["oldest_in_progress_seconds"].as_f64().unwrap() >= 1.0);
    let stuck = orders["stuck"].as_array().unwrap();
    assert_eq!(stuck.len(), 1, "{orders:#}");
    assert_eq!(stuck[0]["key"], "stuck \\u{7}key", "the key, escaped");
    assert_eq!(stuck[0]["attempts"], 1);
    assert!(stuck[0]["lease_left_ms"].as_u64().unwrap() > 50_000);
    assert_eq!(namespace(&status, "carts")["stuck"], json!([]));

    // One namespace alone.
    let carts = status_when(&idem, "?namespace=carts", Duration::from_secs(5), |_| true).await;
    assert_eq!(charted(&carts, "begins", "acquired"), 5.0, "{carts:#}");
    assert_eq!(charted(&carts, "begins", "completed"), 0.0);

    // The page itself, and what it loads, all from here.
    let page = get(&idem.url("/")).await;
    assert_eq!(page.status, 200);
    assert_eq!(page.headers["content-type"], "text/html; charset=utf-8");
    let csp = page.headers["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"),
        "{csp}"
    );
    let html = String::from_utf8(page.body.to_vec()).unwrap();
    assert!(html.contains(r#"<svg id="chart""#) && html.contains(r#"src="/status.js""#));
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    for (path, kind) in [
        ("/status.js", "text/javascript"),
        ("/status.css", "text/css"),
    ] {
        let file = get(&idem.url(path)).await;
        assert_eq!(file.status, 200, "{path}");
        assert!(
            file.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind)
        );
    }
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_stuck_claims_show_without_their_keys() {
    const TOKEN: &str = "orders-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let grant = format!("orders={TOKEN}");
    let idem = start(
        &[
            "serve",
            "--store",
            &store,
            "--stuck-after",
            "1s",
            "--auth-token",
            &grant,
        ],
        &[],
    )
    .await;
    let held = post_auth(
        &idem.url("/v1/orders/begin"),
        TOKEN,
        json!({"key": "customer-42"}),
    )
    .await;
    assert_eq!(held.json()["status"], "acquired");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let status = status_seen_by(&idem, Some(TOKEN), "", Duration::from_secs(15), |s| {
        charted(s, "begins", "acquired") >= 1.0
    })
    .await;
    assert_eq!(status["store"]["keys_shown"], false);
    let stuck = &namespace(&status, "orders")["stuck"];
    assert_eq!(stuck.as_array().unwrap().len(), 1, "{stuck}");
    assert_eq!(stuck[0]["key"], Value::Null);
    assert!(!status.to_string().contains("customer-42"));
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_who_leave_mid_request_leave_the_page_working() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let idem = start(&["serve", "--store", &store], &[]).await;
    // Each gives up at once: most leave while the first look is under way.
    for _ in 0..50 {
        let _ =
            tokio::time::timeout(Duration::from_micros(200), get(&idem.url("/status.json"))).await;
    }
    let status = status_when(&idem, "", Duration::from_secs(5), |s| {
        s["store"]["healthy"] == true
    })
    .await;
    assert_eq!(status["store"]["counted"], true, "{status:#}");
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_status_page_serves_none() {
    for off in ["--no-status-page", "--status-page=off"] {
        let idem = start(&["serve", "--store", "memory://", off], &[]).await;
        assert_eq!(get(&idem.url("/")).await.status, 404);
        assert_eq!(get(&idem.url("/status.json")).await.status, 404);
        assert_eq!(get(&idem.url("/healthz")).await.status, 200);
        assert_eq!(idem.terminate().await, 0);
    }
}

const TENANT_A: &str = "tenant-a-token-0123456789";
const TENANT_B: &str = "tenant-b-token-0123456789";
const OPERATOR: &str = "operator-token-0123456789";

/// `idem serve` with auth for two tenants and an operator (`*`), one key
/// begun in each tenant's namespace, and `extra` flags.
async fn two_tenants(store: &str, extra: &[&str]) -> Process {
    let (a, b, all) = (
        format!("tenant-a-orders={TENANT_A}"),
        format!("tenant-b-payroll={TENANT_B}"),
        format!("*={OPERATOR}"),
    );
    let mut args = vec![
        "serve",
        "--store",
        store,
        "--auth-token",
        &a,
        "--auth-token",
        &b,
        "--auth-token",
        &all,
    ];
    args.extend_from_slice(extra);
    let idem = start(&args, &[]).await;
    for (ns, token) in [
        ("tenant-a-orders", TENANT_A),
        ("tenant-b-payroll", TENANT_B),
    ] {
        let url = idem.url(&format!("/v1/{ns}/begin"));
        let held = post_auth(&url, token, json!({"key": format!("{ns}-secret-key")})).await;
        assert_eq!(held.json()["status"], "acquired");
    }
    idem
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_each_token_sees_its_own_namespaces_and_nobody_else_sees_any() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let idem = two_tenants(&store, &[]).await;
    let status_json = idem.url("/status.json");
    // Without a token, or with an unknown one: nothing.
    assert_eq!(get(&status_json).await.status, 401);
    assert_eq!(
        get_with(&status_json, Some("not-a-token-0123456789"))
            .await
            .status,
        401
    );
    let both_counted = |s: &Value| {
        ["tenant-a-orders", "tenant-b-payroll"]
            .iter()
            .all(|ns| s.to_string().contains(ns))
    };
    // The operator sees both tenants and the store's address.
    let all = status_seen_by(
        &idem,
        Some(OPERATOR),
        "",
        Duration::from_secs(15),
        both_counted,
    )
    .await;
    assert!(
        all["store"]["description"]
            .as_str()
            .unwrap()
            .contains(dir.path().to_str().unwrap())
    );
    // A tenant sees its own namespace, not the other's, nor the store.
    let a = status_seen_by(&idem, Some(TENANT_A), "", Duration::from_secs(15), |s| {
        s.to_string().contains("tenant-a-orders")
    })
    .await;
    let text = a.to_string();
    assert!(!text.contains("tenant-b"), "{a:#}");
    assert!(!text.contains(dir.path().to_str().unwrap()), "{a:#}");
    assert!(a["store"].get("findings").is_none(), "{a:#}");
    assert_eq!(namespace(&a, "tenant-a-orders")["in_progress"], 1, "{a:#}");
    assert!(!text.contains("secret-key"), "keys never show: {a:#}");
    let other = get_with(
        &idem.url("/status.json?namespace=tenant-b-payroll"),
        Some(TENANT_A),
    )
    .await;
    assert_eq!(other.status, 403);
    // /metrics names every namespace: a token for every namespace only.
    assert_eq!(get(&idem.url("/metrics")).await.status, 401);
    assert_eq!(
        get_with(&idem.url("/metrics"), Some(TENANT_A)).await.status,
        403
    );
    let metrics = get_with(&idem.url("/metrics"), Some(OPERATOR)).await;
    assert_eq!(metrics.status, 200);
    assert!(String::from_utf8_lossy(&metrics.body).contains("tenant-b-payroll"));
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_status_page_and_public_metrics_are_the_operator_s_choice() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let idem = two_tenants(
        &store,
        &[
            "--status-page",
            "public",
            "--public-metrics",
            "--stuck-after",
            "1s",
        ],
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let status = status_when(&idem, "", Duration::from_secs(15), |s| {
        s.to_string().contains("tenant-b-payroll-secret-key")
    })
    .await;
    assert_eq!(status["store"]["keys_shown"], true);
    assert!(status.to_string().contains("tenant-a-orders"));
    let metrics = get(&idem.url("/metrics")).await;
    assert_eq!(metrics.status, 200);
    assert_eq!(idem.terminate().await, 0);
}

/// Chromium and the page driver, or why not.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let chromium = PathBuf::from(
        std::env::var("IDEM_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
    );
    if !chromium.exists() {
        return idem_testkit::services::absent(
            "Chromium",
            &chromium.display().to_string(),
            "not installed (apt-get install chromium, or set IDEM_CHROMIUM)",
        );
    }
    if !idem_testkit::services::program("node") {
        return None;
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/browser");
    if !dir.join("node_modules/playwright-core").exists() {
        return idem_testkit::services::absent(
            "playwright-core",
            &dir.display().to_string(),
            "not installed (npm ci in that directory)",
        );
    }
    Some((chromium, dir))
}

/// Looks at the page of `idem` in Chromium while `orders` and `carts` get
/// traffic (with `bearer`, which the page is given too when it asks):
/// what the page showed, as the driver reports it.
async fn look_in_browser(idem: &Process, bearer: Option<&str>) -> Option<Value> {
    let (chromium, dir) = browser()?;
    // Traffic for as long as the browser looks.
    let base = idem.base.clone();
    let token = bearer.map(str::to_owned);
    let traffic = tokio::spawn(async move {
        for round in 0.. {
            let t = token.as_deref();
            begin_and_complete_as(&base, t, "orders", &format!("live-{round}"), 5).await;
            begin_and_complete_as(&base, t, "carts", &format!("live-{round}"), 2).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join(match bearer {
        Some(_) => "status-page-token.png",
        None => "status-page.png",
    });
    let _ = std::fs::remove_file(&shot);
    let mut node = tokio::process::Command::new("node");
    node.arg(dir.join("status_page.mjs"))
        .arg(idem.url("/"))
        .arg(&shot)
        .arg("orders")
        .env("IDEM_CHROMIUM", &chromium)
        .current_dir(&dir)
        .kill_on_drop(true);
    if let Some(t) = bearer {
        node.env("IDEM_STATUS_TOKEN", t);
    }
    let out = tokio::time::timeout(Duration::from_secs(90), node.output())
        .await
        .expect("the browser finishes within 90 s")
        .unwrap();
    traffic.abort();
    let said = String::from_utf8_lossy(&out.stdout);
    eprintln!("{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the page failed in Chromium: {said}");
    let png = std::fs::metadata(&shot).expect("a screenshot").len();
    assert!(png > 10_000, "a screenshot of {png} bytes is blank");
    eprintln!("screenshot: {}", shot.display());
    Some(serde_json::from_str(said.trim()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_draws_live_traffic_in_a_browser() {
    let data = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", data.path().display());
    let idem = start(&["serve", "--store", &store, "--stuck-after", "1s"], &[]).await;
    let held = post(&idem.url("/v1/orders/begin"), json!({"key": "stuck-order"})).await;
    assert_eq!(held.json()["status"], "acquired");
    let Some(seen) = look_in_browser(&idem, None).await else {
        return;
    };
    let lines = seen["seen"]["lines"].as_array().unwrap();
    assert!(lines.contains(&json!("acquired")), "{seen}");
    let stuck = seen["seen"]["stuck"].to_string();
    assert!(
        stuck.contains("stuck-order"),
        "the stuck claim is listed: {stuck}"
    );
    assert_eq!(idem.terminate().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_the_page_asks_for_a_token_and_shows_what_it_may_see() {
    const ORDERS: &str = "orders-and-carts-0123456789";
    let data = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", data.path().display());
    let (grant, other) = (
        format!("orders,carts={ORDERS}"),
        "payroll=payroll-token-0123456789".to_owned(),
    );
    let idem = start(
        &[
            "serve",
            "--store",
            &store,
            "--auth-token",
            &grant,
            "--auth-token",
            &other,
        ],
        &[],
    )
    .await;
    let payroll = post_auth(
        &idem.url("/v1/payroll/begin"),
        "payroll-token-0123456789",
        json!({"key": "salary"}),
    )
    .await;
    assert_eq!(payroll.json()["status"], "acquired");
    let Some(seen) = look_in_browser(&idem, Some(ORDERS)).await else {
        return;
    };
    assert_eq!(seen["asked_for_token"], true, "{seen}");
    assert_eq!(seen["before_token"]["namespaces"], json!([]), "{seen}");
    let lines = seen["seen"]["lines"].as_array().unwrap();
    assert!(lines.contains(&json!("acquired")), "{seen}");
    let listed = seen["seen"]["namespaces"].to_string();
    assert!(
        listed.contains("orders") && !listed.contains("payroll"),
        "{listed}"
    );
    assert_eq!(idem.terminate().await, 0);
}
