//! `idem consume`'s settings: what it refuses before it opens anything, and
//! what `--help` promises.

mod support;

use support::run;

fn refused(args: &[&str], field: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("file://{}/data", dir.path().display());
    let mut all = vec!["consume", "--store", &store];
    all.extend_from_slice(args);
    let (code, _, err) = run(&all, &[]);
    assert_eq!(code, 2, "{args:?}: {err}");
    assert!(err.contains(&format!("`{field}`")), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        !dir.path().join("data").exists(),
        "nothing is opened before the settings are checked"
    );
    err
}

const FROM: &str = "redis://127.0.0.1:6379?stream=orders&group=idem";
const TO: &str = "http://127.0.0.1:8080/handle";

#[test]
fn bad_settings_are_refused_with_what_to_give() {
    let e = refused(&["--to", TO], "from");
    assert!(e.contains("amqp://"), "{e}");
    let e = refused(&["--from", FROM], "to");
    assert!(e.contains("http://127.0.0.1:8080/handle"), "{e}");
    let e = refused(&["--from", "mqtt://127.0.0.1:1883", "--to", TO], "from");
    assert!(e.contains("nats://") && e.contains("kafka://"), "{e}");
    let e = refused(
        &["--from", "kafka://127.0.0.1:9092?topic=t", "--to", TO],
        "from",
    );
    if cfg!(feature = "kafka") {
        assert!(e.contains("no `group`"), "{e}");
    } else {
        // A build without the broker says which feature brings it.
        assert!(e.contains("--features kafka"), "{e}");
    }
    let e = refused(
        &["--from", FROM, "--to", TO, "--retry", "sometimes"],
        "retry",
    );
    assert!(e.contains("redeliver or blocking"), "{e}");
    let e = refused(&["--from", FROM, "--to", "https://example.com/h"], "to");
    assert!(e.contains("http://"), "{e}");
    let e = refused(&["--from", FROM, "--to", TO, "--key", "json:order"], "key");
    assert!(e.contains("starts with `/`"), "{e}");
    refused(
        &["--from", FROM, "--to", TO, "--concurrency", "0"],
        "concurrency",
    );
    // `--batch` and what goes with it: the flags after --from and --to,
    // the setting named, and what the message says to give.
    let batch_cases: [(&[&str], &str, &str); 5] = [
        (&["--batch", "0"], "batch", "1 to 1000"),
        (&["--batch", "1001"], "batch", "1 to 1000"),
        (&["--batch-linger-ms", "5"], "batch_linger_ms", "--batch N"),
        (
            &["--batch", "8", "--batch-linger-ms", "1001"],
            "batch_linger_ms",
            "0 to 1000",
        ),
        (
            &["--batch", "64", "--concurrency", "32"],
            "concurrency",
            "--batch 64",
        ),
    ];
    for (flags, field, says) in batch_cases {
        let mut args = vec!["--from", FROM, "--to", TO];
        args.extend_from_slice(flags);
        let e = refused(&args, field);
        assert!(e.contains(says), "{flags:?}: {e}");
    }
    refused(
        &["--from", FROM, "--to", TO, "--max-attempts", "0"],
        "max_attempts",
    );
    refused(
        &["--from", FROM, "--to", TO, "--namespace", "a b"],
        "namespace",
    );
    refused(
        &["--from", FROM, "--to", TO, "--metrics-listen", "nowhere"],
        "metrics_listen",
    );
    refused(
        &[
            "--from",
            FROM,
            "--to",
            TO,
            "--retry-initial-ms",
            "500",
            "--retry-max-ms",
            "100",
        ],
        "retry_max_ms",
    );
    let e = refused(
        &["--from", FROM, "--to", TO, "--completion-linger-ms", "5000"],
        "completion_linger_ms",
    );
    assert!(e.contains("give 0 to 1000"), "{e}");
}

#[test]
fn the_toml_file_and_the_environment_supply_settings() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("idem.toml");
    std::fs::write(&file, format!("to = \"{TO}\"\nkey = \"header:\"\n")).unwrap();
    let config = file.display().to_string();
    let (code, _, err) = run(&["consume", "--config", &config], &[("IDEM_FROM", FROM)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`key`"), "the file's key was read: {err}");
    std::fs::write(&file, "unknown_setting = 1\n").unwrap();
    let (code, _, err) = run(&["consume", "--config", &config], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unknown_setting"), "{err}");
}

#[test]
fn help_documents_the_interface() {
    let (code, out, _) = run(&["consume", "--help"], &[]);
    assert_eq!(code, 0);
    for flag in [
        "--from",
        "--to",
        "--store",
        "--namespace",
        "--key",
        "--concurrency",
        "--max-attempts",
        "--dead-letter",
        "--retry",
        "--completion-linger-ms",
        "kafka://",
        "--metrics-listen",
        "Idempotency-Key",
        "Idem-Fencing-Token",
        "Idem-Attempt",
        "Idem-Header-NAME",
        "idem-last-error",
        "SIGTERM",
    ] {
        assert!(out.contains(flag), "--help lacks {flag}");
    }
}
