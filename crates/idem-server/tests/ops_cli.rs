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

/// A key with a terminal escape and a right-to-left override: printed raw,
/// `evil…fdp.exe` would read `evil…exe.pdf`.
const EVIL: &str = "evil\x1b[2J\u{202e}fdp.exe";

/// Writes: `live` in progress for an hour, `lapsed` in progress with its
/// lease run out, `paid` completed with a JSON outcome, and a key and an
/// outcome full of terminal escapes.
async fn populate(store: &SharedStore) -> Setup {
    let ns = unique("ops");
    let key = |k: &str| Key::new(&ns, k.to_owned()).unwrap();
    let live = acquire(store, &key("live"), HOUR).await;
    acquire(store, &key("lapsed"), Duration::from_millis(1)).await;
    done(store, &key("paid"), br#"{"paid":42}"#).await;
    done(store, &key(EVIL), b"\x1b]0;pwned\x07\xe2\x80\x8b\xff").await;
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
    // Nor do invisible characters that would make it read otherwise: a
    // right-to-left override, a zero-width space.
    for args in [&["ls", ns][..], &["inspect", ns, EVIL][..]] {
        let (code, out, err) = idem(args, url);
        assert_eq!(code, 0, "{err}");
        for raw in ['\x1b', '\x07', '\u{202e}', '\u{200b}'] {
            assert!(!out.contains(raw), "{raw:?} in {out:?}");
        }
        assert!(out.contains("evil\\u{1b}[2J\\u{202e}fdp.exe"), "{out}");
    }
    let (_, out, _) = idem(&["inspect", ns, EVIL], url);
    assert!(out.contains("\\u{1b}]0;pwned\\u{7}\\u{200b}\\xff"), "{out}");

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
    // A look first: nothing changes.
    let (code, out, err) = idem(&["release", ns, "live", "--dry-run", "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "would_release");
    assert_eq!(v["token"], setup.live.get());
    let (code, out, err) = idem(&["release", ns, "live", "--force", "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"], "released", "the dry run released nothing");
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

    let (code, out, err) = idem(&["purge", ns, "--all", "--dry-run", "--json"], url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["would_remove"].as_u64().unwrap() >= 2, "{out}");
    let (_, out, _) = idem(&["stats", ns, "--json"], url);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["namespaces"][0]["completed"], 2,
        "a dry run removes nothing: {out}"
    );

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

/// A port nothing listens on yet.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Redis Cluster node of this test's own, killed when dropped.
struct ClusterNode {
    port: u16,
    bus: u16,
    child: std::process::Child,
}

impl ClusterNode {
    fn start(dir: &std::path::Path) -> Self {
        Self::start_at(dir, free_port(), free_port())
    }

    /// A node on `port`: the node that was there before, when its
    /// cluster configuration file in `dir` is still there.
    fn start_at(dir: &std::path::Path, port: u16, bus: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
            .args(["--cluster-port", &bus.to_string()])
            .args(["--cluster-require-full-coverage", "no"])
            .arg("--cluster-config-file")
            .arg(dir.join(format!("nodes-{port}.conf")))
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server runs");
        let node = Self { port, bus, child };
        wait(|| node.cli(&["PING"]) == "PONG");
        node
    }

    fn cli(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait(mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out");
}

/// On a Redis Cluster whose second master is down and marked `fail?`
/// (no replica to take over), `idem stats`, `ls` and `purge --all` name
/// the slots they could not reach and exit non-zero, and the purge
/// removes nothing, on the master that is up either; `idem doctor` fails
/// the cluster. Once the master is back, the same commands cover every
/// slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_commands_name_the_slots_of_a_failing_master_and_fail() {
    if !idem_testkit::services::program("redis-server") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let up = ClusterNode::start(dir.path());
    let mut down = ClusterNode::start(dir.path());
    up.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "8191"]);
    down.cli(&["CLUSTER", "ADDSLOTSRANGE", "8192", "16383"]);
    let bus = up.bus.to_string();
    down.cli(&["CLUSTER", "MEET", "127.0.0.1", &up.port.to_string(), &bus]);
    wait(|| {
        [&up, &down]
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
    });
    let url = format!("redis+cluster://127.0.0.1:{}", up.port);
    let store: SharedStore = std::sync::Arc::new(
        idem_redis::RedisStore::cluster_builder(&[&format!("redis://127.0.0.1:{}", up.port)])
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap(),
    );
    let ns = unique("cluster");
    for i in 0..40 {
        done(&store, &Key::new(&ns, format!("k{i}")).unwrap(), b"ok").await;
    }
    let on_up = || up.cli(&["DBSIZE"]).parse::<u64>().unwrap();
    let before = on_up();
    assert!(before > 0 && before < 40, "keys on both masters: {before}");
    let (code, out, err) = idem(&["stats", &ns, "--json"], &url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["namespaces"][0]["completed"], 40, "{out}");

    let _ = down.child.kill();
    let _ = down.child.wait();
    wait(|| up.cli(&["CLUSTER", "NODES"]).contains("fail"));
    let slots = "slots 8192-16383 have no master that is up";
    for args in [
        vec!["stats"],
        vec!["stats", &ns],
        vec!["ls", &ns],
        vec!["purge", &ns, "--all", "--yes"],
        vec!["purge", &ns, "--all", "--dry-run"],
    ] {
        let (code, out, err) = idem(&args, &url);
        assert_eq!(code, 1, "{args:?}: {out}");
        assert!(err.contains(slots), "{args:?}: {err}");
        assert!(err.contains(" is marked master,fail"), "{args:?}: {err}");
        assert!(!out.contains("removed"), "{args:?}: {out}");
    }
    assert_eq!(on_up(), before, "nothing was purged");
    let (code, out, err) = idem(&["doctor"], &url);
    assert_ne!(code, 0, "{out}");
    assert!(format!("{out}{err}").contains(slots), "{out}{err}");

    // Back, empty (it kept nothing on disk) but serving its slots again.
    let back = ClusterNode::start_at(dir.path(), down.port, down.bus);
    wait(|| !up.cli(&["CLUSTER", "NODES"]).contains("fail"));
    let (code, out, err) = idem(&["stats", &ns, "--json"], &url);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["namespaces"][0]["completed"], before, "{out}");
    let (code, out, err) = idem(&["purge", &ns, "--all", "--yes"], &url);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("removed {before}")), "{out}");
    assert_eq!(on_up(), 0);
    drop((up, back));
}

/// `idem release NS --stuck`: claims older than `--older-than` whose lease
/// ran out are released (after a `--dry-run` that changes nothing), live
/// ones are kept with their tokens unless `--token` names them, younger
/// ones are not looked at; exit codes 3 (none old enough) and 4 (some
/// kept, or a named token not found). The released keys run again with
/// larger tokens; the holder of a named claim is stale.
async fn check_release_stuck(store: &SharedStore, url: &str) {
    /// How much older than the young claim the older ones are.
    const GAP: Duration = Duration::from_secs(3);
    let ns = unique("stuck");
    let key = |k: &str| Key::new(&ns, k.to_owned()).unwrap();
    let live = acquire(store, &key("live"), HOUR).await;
    for k in ["lapsed-a", "lapsed-b", EVIL] {
        acquire(store, &key(k), Duration::from_millis(1)).await;
    }
    done(store, &key("done"), b"ok").await;
    tokio::time::sleep(GAP).await;
    let young = acquire(store, &key("young"), Duration::from_millis(1)).await;
    let young_at = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(20)).await;
    // The cut-off sits half the gap above the young claim's age at each
    // call, however slowly the calls before it ran: the older claims are
    // past it, the young one is not until the command takes half the gap
    // to start.
    let stuck = |extra: &[&str]| {
        let cut = format!("{}ms", (young_at.elapsed() + GAP / 2).as_millis());
        let mut args = vec!["release", ns.as_str(), "--stuck", "--older-than", &cut];
        args.extend_from_slice(extra);
        idem(&args, url)
    };
    let by_key = |out: &str| -> std::collections::BTreeMap<String, Value> {
        json_lines(out)
            .into_iter()
            .map(|v| (v["key"].as_str().unwrap().to_owned(), v))
            .collect()
    };

    let (code, _, err) = stuck(&[]);
    assert_eq!(code, 2, "no --yes: {err}");
    assert!(err.contains("--yes") && err.contains("--dry-run"), "{err}");

    let (code, out, err) = stuck(&["--dry-run", "--json"]);
    assert_eq!(code, 4, "the live claim is kept: {err}");
    let seen = by_key(&out);
    assert_eq!(
        seen.len(),
        4,
        "young and completed keys are not listed: {out}"
    );
    for k in ["lapsed-a", "lapsed-b"] {
        assert_eq!(seen[k]["status"], "would_release", "{out}");
    }
    assert_eq!(seen["live"]["status"], "kept", "{out}");
    assert_eq!(seen["live"]["token"], live.get(), "{out}");
    assert!(
        seen["live"]["why"]
            .as_str()
            .unwrap()
            .contains(&format!("--token {}", live.get())),
        "{out}"
    );
    assert!(
        !out.contains('\x1b') && !out.contains('\u{202e}'),
        "keys escaped: {out}"
    );
    assert!(
        store.get(&key("lapsed-a")).await.unwrap().is_some(),
        "a dry run releases nothing"
    );

    let (code, out, err) = stuck(&["--yes"]);
    assert_eq!(code, 4, "{out}{err}");
    assert!(
        err.contains("released 3 of 4") && err.contains("1 kept"),
        "{err}"
    );
    assert!(out.contains("attempt count starts over"), "{out}");
    assert!(err.contains("released by an operator"), "logged: {err}");
    for k in ["lapsed-a", "lapsed-b", EVIL] {
        assert!(store.get(&key(k)).await.unwrap().is_none(), "{k} released");
    }
    assert!(store.get(&key("young")).await.unwrap().is_some());
    assert!(store.get(&key("done")).await.unwrap().is_some());

    let (code, _, err) = stuck(&["--yes", "--token", "999"]);
    assert_eq!(code, 4, "{err}");
    assert!(err.contains("no such claim holds token 999"), "{err}");

    let token = live.get().to_string();
    let (code, out, err) = stuck(&["--yes", "--json", "--token", &token]);
    assert_eq!(code, 0, "{out}{err}");
    let seen = by_key(&out);
    assert_eq!(seen["live"]["status"], "released", "{out}");
    assert_eq!(
        store
            .complete(&key("live"), live, None, HOUR)
            .await
            .unwrap(),
        Fenced::Stale,
        "the named holder's token is stale"
    );

    let (code, _, err) = stuck(&["--yes"]);
    assert_eq!(code, 3, "nothing left: {err}");
    assert!(err.contains("no claim in progress"), "{err}");

    // The released keys run again, with larger tokens, from attempt 1.
    for k in ["lapsed-a", "live"] {
        let Begin::Acquired(c) = store.begin(&key(k), None, Lease::new(HOUR)).await.unwrap() else {
            panic!("{k} runs again")
        };
        assert!(c.token > young, "{k}: {c:?}");
        assert_eq!(c.attempt, 1, "{k}: {c:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stuck_on_redis() {
    let Some(url) = support::redis().await else {
        return;
    };
    let store: SharedStore =
        std::sync::Arc::new(idem_redis::RedisStore::connect(&url).await.unwrap());
    check_release_stuck(&store, &url).await;
}

#[cfg(feature = "mysql")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stuck_on_mariadb() {
    let base =
        idem_testkit::services::url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
    let url = format!("{base}?table=idem_ops_cli");
    let store = match idem_sql::SqlStore::connect(&url).await {
        Ok(s) => s,
        Err(e) => {
            idem_testkit::services::absent::<()>("MariaDB", &base, e);
            return;
        }
    };
    let store: SharedStore = std::sync::Arc::new(store);
    check_release_stuck(&store, &url).await;
}
