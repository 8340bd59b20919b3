//! `idem inspect`, `idem ls`, `idem release --force`, `idem stats` and
//! `idem purge` as an operator runs them, against the file store, Redis and PostgreSQL: records written
//! through the library, read back through the binary.

mod support;

use std::time::Duration;

use idem_core::{Begin, Fenced, FencingToken, Key, Lease, SharedStore, Store};
use serde_json::Value;
use support::{run, unique};

const HOUR: Duration = Duration::from_secs(3600);

async fn acquire(store: &SharedStore, key: &Key, lease: Duration) -> FencingToken {
    match store.begin(key, None, Lease::new(lease)).await.unwrap() {
        Begin::Acquired(c) => c.token,
        other => panic!("{key}: {other:?}"),
    }
}

async fn done(store: &SharedStore, key: &Key, outcome: &'static [u8]) {
    let token = acquire(store, key, HOUR).await;
    let r = store
        .complete(key, token, Some(outcome.into()), HOUR)
        .await
        .unwrap();
    assert_eq!(r, Fenced::Ok(()));
}

/// What the records of one namespace were set up as.
struct Setup {
    ns: String,
    live: FencingToken,
}

/// Writes: `live` in progress for an hour, `lapsed` in progress with its
/// lease run out, `paid` completed with a JSON outcome, and a key and an
/// outcome full of terminal escapes.
async fn populate(store: &SharedStore) -> Setup {
    let ns = unique("ops");
    let key = |k: &str| Key::new(&ns, k.to_owned()).unwrap();
    let live = acquire(store, &key("live"), HOUR).await;
    acquire(store, &key("lapsed"), Duration::from_millis(1)).await;
    done(store, &key("paid"), br#"{"paid":42}"#).await;
    done(store, &key("evil\x1b[2J"), b"\x1b]0;pwned\x07\xff").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    Setup { ns, live }
}

fn idem(args: &[&str], store: &str) -> (i32, String, String) {
    let mut all = args.to_vec();
    all.extend(["--store", store]);
    run(&all, &[])
}

fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// What the commands answer about the completed records of `setup` on the
/// store at `url`.
fn check_completed(url: &str, setup: &Setup) {
    let ns = setup.ns.as_str();

    let (code, out, err) = idem(&["inspect", ns, "paid", "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "completed");
    assert_eq!(v["outcome"]["paid"], 42);
    assert!(v["expires_at_ms"].as_u64().unwrap() > v["completed_at_ms"].as_u64().unwrap());

    let (code, out, _) = idem(&["inspect", ns, "never"], url);
    assert_eq!(code, 0);
    assert!(out.contains("no record"), "{out}");

    let (code, out, err) = idem(&["ls", ns, "--state", "completed"], url);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("KEY"), "{out}");
    assert!(out.contains("paid") && !out.contains("live"), "{out}");

    // One completed record a page.
    let (_, out, _) = idem(&["ls", ns, "--state", "completed", "--limit", "1"], url);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.contains("(first 1 records"), "{out}");

    // What the store holds never reaches the terminal raw.
    for args in [&["ls", ns][..], &["inspect", ns, "evil\x1b[2J"][..]] {
        let (code, out, err) = idem(args, url);
        assert_eq!(code, 0, "{err}");
        assert!(!out.contains('\x1b') && !out.contains('\x07'), "{out:?}");
    }
    let (_, out, _) = idem(&["inspect", ns, "evil\x1b[2J"], url);
    assert!(out.contains("\\u{1b}]0;pwned\\u{7}\\xff"), "{out}");

    let (code, _, err) = idem(&["release", ns, "paid", "--force"], url);
    assert_eq!(code, 1);
    assert!(err.contains("completed"), "{err}");
}

/// What the commands answer about the records in progress of `setup`, on
/// a store they outlive (not the file store: its claims live in the
/// process that took them); answers the token the release overrode.
fn check_in_progress(url: &str, setup: &Setup) -> FencingToken {
    let ns = setup.ns.as_str();
    let (code, out, err) = idem(&["inspect", ns, "live"], url);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("in progress"), "{out}");
    assert!(
        out.contains(&format!("token        {}", setup.live.get())),
        "{out}"
    );
    assert!(out.contains("attempts     1"), "{out}");
    assert!(out.contains("left"), "{out}");

    let (code, out, err) = idem(&["ls", ns, "--state", "in-progress"], url);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("KEY"), "{out}");
    assert!(out.contains("live") && out.contains("lapsed"), "{out}");
    assert!(out.contains("ran out"), "{out}");
    assert!(!out.contains("paid"), "{out}");

    let (code, out, err) = idem(&["ls", ns, "--json"], url);
    assert_eq!(code, 0, "{err}");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 4, "{out}");
    let keys: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted, "key order");

    // Nothing started an hour ago.
    let (_, out, _) = idem(&["ls", ns, "--older-than", "1h"], url);
    assert!(out.contains("(no records)"), "{out}");

    // The override: refused without --force and for a lapsed lease; done,
    // with the token it overrode, otherwise.
    let (code, _, err) = idem(&["release", ns, "live"], url);
    assert_eq!(code, 2);
    assert!(err.contains("--force"), "{err}");
    let (code, _, err) = idem(&["release", ns, "lapsed", "--force"], url);
    assert_eq!(code, 1);
    assert!(err.contains("lease ran out"), "{err}");
    let (code, out, err) = idem(&["release", ns, "live", "--force", "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "released");
    assert_eq!(v["overridden_token"], setup.live.get());
    assert!(
        err.contains("released by an operator"),
        "the override is logged: {err}"
    );
    let (_, out, _) = idem(&["inspect", ns, "live"], url);
    assert!(out.contains("no record"), "{out}");
    setup.live
}

/// `idem stats` counts what `populate` wrote (`abandoned` claims: those
/// the store still holds), and `idem purge` removes it.
fn check_stats_and_purge(url: &str, setup: &Setup, abandoned: u64) {
    let ns = setup.ns.as_str();
    let (code, out, err) = idem(&["stats", ns, "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let counts = &v["namespaces"][0];
    assert_eq!(counts["namespace"], ns);
    assert_eq!(counts["in_progress"], 0, "{out}");
    assert_eq!(counts["abandoned"], abandoned, "{out}");
    assert_eq!(counts["completed"], 2, "{out}");
    assert_eq!(
        counts["oldest_in_progress_ms"].is_u64(),
        abandoned > 0,
        "{out}"
    );
    assert!(v["size_bytes"].as_u64().unwrap() > 0, "{out}");

    // Every namespace, as a table.
    let (code, out, err) = idem(&["stats"], url);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("NAMESPACE"), "{out}");
    assert!(out.lines().any(|l| l.starts_with(ns)), "{out}");
    assert!(out.contains("size: "), "{out}");

    let (code, _, err) = idem(&["purge", ns, "--all"], url);
    assert_eq!(code, 2, "--all without --yes");
    assert!(err.contains("--yes"), "{err}");
    let (code, _, err) = idem(&["purge", ns], url);
    assert_eq!(code, 2, "neither --expired nor --all");
    assert!(err.contains("--expired"), "{err}");

    let (code, out, err) = idem(&["purge", ns, "--expired", "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["removed"], 0, "nothing has expired: {out}");
    let (_, out, _) = idem(&["stats", ns, "--json"], url);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["namespaces"][0]["completed"], 2, "{out}");

    let (code, out, err) = idem(&["purge", ns, "--all", "--yes"], url);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("removed"), "{out}");
    assert!(err.contains("purged by an operator"), "logged: {err}");
    let (_, out, _) = idem(&["ls", ns], url);
    assert!(out.contains("(no records)"), "{out}");
    let (_, out, _) = idem(&["stats", ns, "--json"], url);
    let v: Value = serde_json::from_str(&out).unwrap();
    let counts = &v["namespaces"][0];
    for state in ["in_progress", "abandoned", "completed", "expired"] {
        assert_eq!(counts[state], 0, "{state}: {out}");
    }
}

/// After the release, the key runs again with a higher token.
async fn runs_again(store: &SharedStore, setup: &Setup, overridden: FencingToken) {
    let key = Key::new(&setup.ns, "live").unwrap();
    let token = acquire(store, &key, HOUR).await;
    assert!(token > overridden, "{token:?} after {overridden:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_read_and_release_on_the_file_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let url = format!("file://{}", path.display());
    let open =
        || -> SharedStore { std::sync::Arc::new(idem_file::FileStore::open(&path).unwrap()) };
    let store = open();
    let setup = populate(&store).await;
    // While a process holds the directory, the commands say what to do.
    let (code, _, err) = idem(&["ls", &setup.ns], &url);
    assert_eq!(code, 1);
    assert!(
        err.contains("stop the idem serve") && err.contains("/record?key="),
        "{err}"
    );
    drop(store);
    check_completed(&url, &setup);
    // The claims in progress ended with the process that took them.
    let (_, out, _) = idem(&["ls", &setup.ns, "--state", "in-progress"], &url);
    assert!(out.contains("(no records)"), "{out}");
    check_stats_and_purge(&url, &setup, 0);
    runs_again(&open(), &setup, setup.live).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_read_and_release_on_redis() {
    let Some(url) = support::redis().await else {
        return;
    };
    let store: SharedStore =
        std::sync::Arc::new(idem_redis::RedisStore::connect(&url).await.unwrap());
    let setup = populate(&store).await;
    check_completed(&url, &setup);
    let overridden = check_in_progress(&url, &setup);
    check_stats_and_purge(&url, &setup, 1);
    runs_again(&store, &setup, overridden).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_commands_read_and_release_on_postgres() {
    let base = idem_testkit::services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let url = format!("{base}?table=idem_ops_cli");
    let store = match idem_sql::SqlStore::connect(&url).await {
        Ok(s) => s,
        Err(e) => {
            idem_testkit::services::absent::<()>("PostgreSQL", &base, e);
            return;
        }
    };
    let store: SharedStore = std::sync::Arc::new(store);
    let setup = populate(&store).await;
    check_completed(&url, &setup);
    let overridden = check_in_progress(&url, &setup);
    check_stats_and_purge(&url, &setup, 1);
    runs_again(&store, &setup, overridden).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ls_pages_through_a_large_namespace() {
    // 2 500 records: three store pages, listed in key order up to --limit.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store: SharedStore = std::sync::Arc::new(idem_file::FileStore::open(&path).unwrap());
    for i in 0..2500 {
        let key = Key::new("bulk", format!("k{i:05}")).unwrap();
        done(&store, &key, b"ok").await;
    }
    drop(store);
    let url = format!("file://{}", path.display());
    let (code, out, err) = idem(&["ls", "bulk", "--json", "--limit", "2100"], &url);
    assert_eq!(code, 0, "{err}");
    let rows = json_lines(&out);
    assert_eq!(rows.len(), 2100);
    assert_eq!(rows[0]["key"], "k00000");
    assert_eq!(rows[2099]["key"], "k02099");
    let (_, out, _) = idem(&["ls", "bulk", "--json", "--limit", "100000"], &url);
    assert_eq!(out.lines().count(), 2500);
}

#[test]
fn the_memory_store_and_bad_input_are_refused_with_what_to_do() {
    let (code, _, err) = idem(&["ls", "orders"], "memory://");
    assert_eq!(code, 2);
    assert!(
        err.contains("memory://") && err.contains("--store"),
        "{err}"
    );
    let (code, _, err) = idem(&["ls", "bad/ns"], "file:///nonexistent-idem");
    assert_eq!(code, 2);
    assert!(err.contains("namespace"), "{err}");
    let (code, _, err) = idem(&["ls", "orders", "--older-than", "10 parsecs"], "file:///x");
    assert_eq!(code, 2);
    assert!(err.contains("unit"), "{err}");
}
