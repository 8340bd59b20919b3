//! The callers in other languages under `examples/callers/` (Python with
//! httpx, TypeScript on Node's `fetch`, Go's net/http), run against the
//! real binary: each client's check of `idem serve` (one run for eight
//! concurrent callers, renewals past the lease, release on failure), and
//! each language's HTTP handler fed by `idem consume` from Redis Streams,
//! one message per request and in batches,
//! with producer duplicates (every message's effect once).
#![cfg(feature = "redis-streams")]

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use idem_consumer::Message;
use idem_redis_streams::{RedisStreamConfig, RedisStreamPublisher};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn callers() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/callers")
}

/// A language's toolchain: the check program and the handler, each as a
/// command run in the language's directory; `None` (skipped with the
/// reason, a failure under CI) when the toolchain is missing.
struct Lang {
    name: &'static str,
    dir: PathBuf,
    check: Vec<String>,
    handler: Vec<String>,
}

fn have(program: &str, args: &[&str], dir: &Path) -> Result<(), String> {
    match std::process::Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
    {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(format!(
            "`{program} {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Err(format!("{program}: {e}")),
    }
}

fn langs() -> Vec<Lang> {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut found = Vec::new();
    let python = callers().join("python");
    match have("python3", &["-c", "import httpx"], &python) {
        Ok(()) => found.push(Lang {
            name: "python",
            dir: python,
            check: strings(&["python3", "check_once.py"]),
            handler: strings(&["python3", "handler.py"]),
        }),
        Err(e) => skip("Python with httpx (pip install httpx)", e),
    }
    let ts = callers().join("typescript");
    // `npm ci` installs the compiler; `tsc` builds dist/.
    match have("npx", &["--no-install", "tsc"], &ts) {
        Ok(()) => found.push(Lang {
            name: "typescript",
            dir: ts,
            check: strings(&["node", "dist/check_once.js"]),
            handler: strings(&["node", "dist/handler.js"]),
        }),
        Err(e) => skip(
            "TypeScript on Node (npm ci in examples/callers/typescript)",
            e,
        ),
    }
    let go = callers().join("go");
    match have("go", &["build", "-o", "bin/", "./..."], &go) {
        Ok(()) => found.push(Lang {
            name: "go",
            dir: go,
            check: strings(&["bin/check_once"]),
            handler: strings(&["bin/handler"]),
        }),
        Err(e) => skip("Go (apt-get install golang-go)", e),
    }
    found
}

fn skip(what: &str, why: String) {
    let _ = idem_testkit::services::absent::<()>(what, "", why);
}

fn command(lang: &Lang, argv: &[String], extra: &[&str]) -> Command {
    let program = if argv[0].contains('/') {
        lang.dir.join(&argv[0]).into_os_string()
    } else {
        argv[0].clone().into()
    };
    let mut cmd = Command::new(program);
    cmd.args(&argv[1..])
        .args(extra)
        .current_dir(&lang.dir)
        .kill_on_drop(true);
    cmd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_language_runs_its_work_once_through_idem_serve() {
    let idem = support::start(&["serve", "--store", "memory://"], &[]).await;
    let url = idem.url("");
    for lang in langs() {
        let out = command(&lang, &lang.check, &[url.trim_end_matches('/')])
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains(&format!("{}: ok", lang.name)),
            "{}: {}\n{}",
            lang.name,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_languages_handler_gets_every_message_once_from_idem_consume() {
    let Some(redis) = support::redis().await else {
        return;
    };
    for lang in langs() {
        for batch in [None, Some("16")] {
            handler_gets_every_message_once(&lang, &redis, batch).await;
        }
    }
}

/// 300 messages, a fifth of them published twice, through `idem consume`
/// (with `--batch N` when given) to `lang`'s handler: each effect once.
async fn handler_gets_every_message_once(lang: &Lang, redis: &str, batch: Option<&str>) {
    let name = format!("{} (batch {batch:?})", lang.name);
    let dir = tempfile::tempdir().unwrap();
    let effects = dir.path().join("effects.jsonl");
    let port = support::consume::free_port();
    let mut handler = command(lang, &lang.handler, &[&port.to_string()])
        .arg(&effects)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = BufReader::new(handler.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), ready.next_line())
        .await
        .unwrap_or_else(|_| panic!("{name}: the handler did not start"));
    assert!(
        line.unwrap().unwrap_or_default().contains("listening"),
        "{name}"
    );

    let stream = support::unique(&format!("callers-{}", lang.name));
    let from = format!("{redis}?stream={stream}&group=idem");
    let publisher = RedisStreamPublisher::connect(&RedisStreamConfig::from_url(&from).unwrap())
        .await
        .unwrap();
    let mut args = vec![
        "--from".into(),
        from.clone(),
        "--key".into(),
        "json:/key".into(),
        "--store".into(),
        redis.to_owned(),
        "--to".into(),
        format!("http://127.0.0.1:{port}/"),
    ];
    if let Some(n) = batch {
        args.extend(["--batch".into(), n.into()]);
    }
    let consume = support::consume::start(&args).await;
    // 300 messages, a fifth of them published twice (a new message id
    // each time, as a producer's retry would).
    let n = 300;
    for i in 0..n {
        let body = format!(r#"{{"key":"{}-{i}","n":{i}}}"#, lang.name);
        for _ in 0..(1 + usize::from(i % 5 == 0)) {
            publisher
                .publish(&Message::new(body.clone()))
                .await
                .unwrap();
        }
    }
    let counts = wait_for(&effects, n, Duration::from_secs(60)).await;
    assert_eq!(counts.len(), n, "{name}: every message handled");
    let doubled: Vec<_> = counts.iter().filter(|(_, c)| **c != 1).collect();
    assert!(doubled.is_empty(), "{name}: handled twice: {doubled:?}");
    assert_eq!(consume.terminate().await, 0);
    let _ = handler.kill().await;
    let _: redis::RedisResult<()> = redis::Client::open(redis)
        .and_then(|c| c.get_connection())
        .and_then(|mut c| redis::cmd("DEL").arg(&stream).query(&mut c));
}

/// The effects per key once `want` keys are in and nothing more came for
/// a second.
async fn wait_for(path: &Path, want: usize, within: Duration) -> HashMap<String, usize> {
    let start = Instant::now();
    let mut last = (0, Instant::now());
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut counts: HashMap<String, usize> = HashMap::new();
        for line in text.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            *counts
                .entry(v["key"].as_str().unwrap().to_owned())
                .or_default() += 1;
        }
        let lines = text.lines().count();
        if lines != last.0 {
            last = (lines, Instant::now());
        }
        let settled = counts.len() >= want && last.1.elapsed() > Duration::from_secs(1);
        if settled || start.elapsed() > within {
            return counts;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
