//! The stamp of a published table: the commit it ran, the day, and the
//! version of every broker and store it ran against, each read from the
//! server or program itself.

use std::time::Duration;

use crate::store::shell;

/// `what version` lines: idem's commit, then each broker and store. One
/// that cannot be read says why instead of a version.
pub async fn stamp() -> Vec<(&'static str, String)> {
    let tools = std::env::var("IDEM_TOOLS").unwrap_or_else(|_| "/var/cache/idem-tools".into());
    let postgres = idem_testkit::services::url(
        "IDEM_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let tansu = format!("{tools}/bin/tansu");
    let rocketmq = format!("{tools}/bin/rocketmq-broker-rust");
    vec![
        ("idem", commit().await),
        ("date", read("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).await),
        (
            "Redis",
            first_word_after(&read("redis-server", &["--version"]).await, "v="),
        ),
        (
            "PostgreSQL",
            read("psql", &[&postgres, "-tAc", "show server_version"]).await,
        ),
        (
            "MariaDB",
            read(
                "mariadb",
                &[
                    "-h",
                    "127.0.0.1",
                    "-u",
                    "root",
                    "-N",
                    "-B",
                    "-e",
                    "select version()",
                ],
            )
            .await,
        ),
        ("RabbitMQ", read("rabbitmqctl", &["version"]).await),
        ("NATS", nats_version().await),
        ("tansu (Kafka protocol)", read(&tansu, &["--version"]).await),
        (
            "RocketMQ (Rust broker)",
            read(&rocketmq, &["--version"]).await,
        ),
    ]
}

/// The commit checked out, with `+changes` when the tree differs from it.
pub async fn commit() -> String {
    let head = read("git", &["rev-parse", "--short=12", "HEAD"]).await;
    let dirty = shell("git", &["status", "--porcelain", "--untracked-files=no"])
        .await
        .is_ok_and(|s| !s.trim().is_empty());
    if dirty {
        format!("{head}+changes")
    } else {
        head
    }
}

/// What `program args` prints, trimmed to one line, or why it could not.
async fn read(program: &str, args: &[&str]) -> String {
    match tokio::time::timeout(Duration::from_secs(10), shell(program, args)).await {
        Ok(Ok(out)) => out.lines().next().unwrap_or_default().trim().to_owned(),
        Ok(Err(e)) => format!("unknown ({e})"),
        Err(_) => format!("unknown ({program} did not answer within 10 s)"),
    }
}

fn first_word_after(text: &str, marker: &str) -> String {
    match text.split_once(marker) {
        Some((_, rest)) => rest.split_whitespace().next().unwrap_or(rest).to_owned(),
        None => text.to_owned(),
    }
}

/// The NATS server's version, from the `INFO` it greets a client with.
async fn nats_version() -> String {
    use tokio::io::AsyncBufReadExt;
    let url = idem_testkit::services::url("IDEM_TEST_NATS_URL", "nats://127.0.0.1:4222");
    let addr = url.trim_start_matches("nats://").to_owned();
    let greet = async {
        let stream = tokio::net::TcpStream::connect(&addr).await.ok()?;
        let mut line = String::new();
        tokio::io::BufReader::new(stream)
            .read_line(&mut line)
            .await
            .ok()?;
        let info: serde_json::Value = serde_json::from_str(line.strip_prefix("INFO ")?).ok()?;
        Some(info["version"].as_str()?.to_owned())
    };
    match tokio::time::timeout(Duration::from_secs(5), greet).await {
        Ok(Some(v)) => v,
        _ => format!("unknown (no INFO from {addr})"),
    }
}
