//! Settings: flags over environment over file; a bad setting stops startup
//! and names the field; a store that will not open stops it too, saying
//! what to check.

mod support;

use serde_json::json;
use support::{post, run, start};

#[test]
fn help_documents_every_option() {
    let (code, out, _) = run(&["serve", "--help"], &[]);
    assert_eq!(code, 0);
    for option in [
        "--listen",
        "--store",
        "--config",
        "--durability",
        "--tls-cert",
        "--tls-key",
        "--max-body-bytes",
        "--max-key-bytes",
        "--max-outcome-bytes",
        "--max-batch",
        "--max-lease-ms",
        "--default-lease-ms",
        "--default-retention-ms",
        "--auth-token",
        "--log",
        "--redis-ca-cert",
        "--redis-client-cert",
        "--redis-client-key",
        "IDEM_STORE",
        "IDEM_LISTEN",
    ] {
        assert!(
            out.contains(option),
            "serve --help does not mention {option}"
        );
    }
    let (code, out, _) = run(&["proxy", "--help"], &[]);
    assert_eq!(code, 0);
    for option in [
        "--upstream",
        "--require-key",
        "--keyless-window-ms",
        "--scope-header",
        "--scope-cookie",
        "--release-status",
        "--max-response-bytes",
    ] {
        assert!(
            out.contains(option),
            "proxy --help does not mention {option}"
        );
    }
}

#[test]
fn invalid_settings_stop_startup_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (vec!["serve", "--listen", "nowhere"], vec![], "`listen`"),
        (vec!["serve", "--store", "ftp://x"], vec![], "`store`"),
        (
            vec!["serve", "--store", "memory://", "--tls-cert", "c.pem"],
            vec![],
            "`tls_key`",
        ),
        (
            vec![
                "serve",
                "--store",
                "memory://",
                "--auth-token",
                "orders=short",
            ],
            vec![],
            "`auth_tokens`",
        ),
        (
            vec!["serve", "--store", "memory://", "--default-lease-ms", "0"],
            vec![],
            "`default_lease_ms`",
        ),
        (
            vec!["serve", "--store", "memory://"],
            vec![("IDEM_LOG", "=[")],
            "`log`",
        ),
        (vec!["proxy", "--store", "memory://"], vec![], "`upstream`"),
        (
            vec!["serve", "--store", "memory://", "--redis-ca-cert", "ca.pem"],
            vec![],
            "`redis_ca_cert`",
        ),
        (
            vec![
                "serve",
                "--store",
                "rediss://127.0.0.1:1",
                "--redis-ca-cert",
                "/nonexistent/ca.pem",
            ],
            vec![],
            "`redis_ca_cert`",
        ),
        (
            vec!["serve", "--store", "rediss://127.0.0.1:1"],
            vec![("IDEM_REDIS_CLIENT_CERT", "client.pem")],
            "`redis_client_key`",
        ),
    ];
    for (args, env, field) in cases {
        let (code, _, err) = run(&args, &env);
        assert_eq!(code, 2, "{args:?} should fail with 2, said {err}");
        assert!(
            err.contains(field),
            "{args:?}: {err:?} does not name {field}"
        );
    }
    let bad_file = dir.path().join("bad.toml");
    std::fs::write(&bad_file, "listen = \"127.0.0.1:0\"\nmax_batchh = 3\n").unwrap();
    let (code, _, err) = run(&["serve", "--config", bad_file.to_str().unwrap()], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("max_batchh"), "{err}");
    let (code, _, err) = run(
        &["serve", "--store", "memory://"],
        &[("IDEM_MAX_BATCH", "lots")],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("IDEM_MAX_BATCH") || err.contains("max-batch"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_will_not_open_stops_startup_saying_what_to_check() {
    // Nothing listens on a port just given back.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let store = format!("redis://app:hunter2@127.0.0.1:{port}");
    let (code, _, err) = run(
        &["serve", "--store", &store, "--listen", "127.0.0.1:0"],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    let shown = format!("cannot connect to Redis at redis://app:***@127.0.0.1:{port}");
    assert!(err.contains(&shown), "{err}");
    assert!(err.contains("--store (IDEM_STORE)"), "{err}");
    assert!(!err.contains("hunter2"), "the password is shown: {err}");
    assert!(!err.contains("invalid setting"), "{err}");

    // A directory another idem process holds.
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}", dir.path().display());
    let _holder = start(&["serve", "--store", &store], &[]).await;
    let (code, _, err) = run(
        &["serve", "--store", &store, "--listen", "127.0.0.1:0"],
        &[],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("another idem process"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_override_the_environment_which_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.toml");
    std::fs::write(
        &file,
        "store = \"memory://\"\nmax_batch = 1\nmax_key_bytes = 4\nmax_outcome_bytes = 8\n",
    )
    .unwrap();
    let idem = start(
        &[
            "serve",
            "--config",
            file.to_str().unwrap(),
            "--max-key-bytes",
            "6",
        ],
        &[("IDEM_MAX_KEY_BYTES", "5"), ("IDEM_MAX_BATCH", "2")],
    )
    .await;
    let begin = idem.url("/v1/c/begin");
    // The flag (6) beats the environment (5) and the file (4).
    assert_eq!(post(&begin, json!({"key": "123456"})).await.status, 200);
    assert_eq!(post(&begin, json!({"key": "1234567"})).await.status, 400);
    // The environment (2) beats the file (1).
    let batch = idem.url("/v1/c/begin-batch");
    assert_eq!(
        post(&batch, json!({"items": [{"key": "a"}, {"key": "b"}]}))
            .await
            .status,
        200
    );
    assert_eq!(
        post(
            &batch,
            json!({"items": [{"key": "c"}, {"key": "d"}, {"key": "e"}]})
        )
        .await
        .status,
        400
    );
    // The file (8) holds where nothing overrides it.
    let t = post(&begin, json!({"key": "o"})).await.json()["token"]
        .as_u64()
        .unwrap();
    let big = post(
        &idem.url("/v1/c/complete"),
        json!({"key": "o", "token": t, "outcome": "123456789"}),
    )
    .await;
    assert_eq!(big.status, 413);
}
