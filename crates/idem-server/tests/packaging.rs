//! What ships beside the binary works with it: the manual pages and shell
//! completions cover every command, the systemd units pass
//! `systemd-analyze verify` (their man: links resolving to those pages),
//! and the container image's settings (`Dockerfile`) start a non-root
//! `idem serve` on the file store that its own health check calls ready.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{run, start};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes every manual page into `dir`; answers the file names.
fn manual_pages(dir: &Path) -> Vec<String> {
    let (code, out, err) = run(&["man", "--dir", dir.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("manual pages"), "{out}");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn manual_pages_and_completions_cover_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("man1");
    let pages = manual_pages(&man1);
    for page in [
        "idem.1",
        "idem-serve.1",
        "idem-proxy.1",
        "idem-consume.1",
        "idem-dlq.1",
        "idem-dlq-replay.1",
        "idem-doctor.1",
        "idem-health.1",
        "idem-migrate.1",
    ] {
        assert!(pages.iter().any(|p| p == page), "no {page} in {pages:?}");
    }
    let serve = std::fs::read_to_string(man1.join("idem-serve.1")).unwrap();
    assert!(
        serve.starts_with(".ie") || serve.contains(".TH"),
        "not roff: {serve:.200}"
    );
    assert!(
        serve.contains("stuck\\-after") || serve.contains("stuck-after"),
        "every flag is on the page"
    );
    // As a person reads it, where man is installed.
    if Command::new("man").arg("--version").output().is_ok() {
        let shown = Command::new("man")
            .args(["-l", man1.join("idem-serve.1").to_str().unwrap()])
            .env("MANPAGER", "cat")
            .env("MANWIDTH", "100")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.status.success() && text.contains("--store"), "{text}");
    }

    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef idem"),
        ("fish", "complete -c idem"),
    ] {
        let (code, out, err) = run(&["completions", shell], &[]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains(marker), "{shell}: {out:.300}");
        for word in ["serve", "consume", "store", "stuck-after"] {
            assert!(out.contains(word), "{shell} completes no {word}");
        }
    }
    let (code, _, err) = run(&["completions", "tcsh"], &[]);
    assert_eq!(code, 2);
    assert!(err.contains("possible values"), "{err}");
}

#[test]
fn systemd_units_pass_systemd_analyze_verify() {
    if !idem_testkit::services::program("systemd-analyze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    manual_pages(&dir.path().join("man/man1"));
    for unit in ["idem.service", "idem-consume@.service"] {
        let text = std::fs::read_to_string(root().join("ops/systemd").join(unit)).unwrap();
        assert!(text.contains("ExecStart=/usr/local/bin/idem "), "{unit}");
        // The binary under test where the unit expects it to be installed.
        let text = text.replace("/usr/local/bin/idem", env!("CARGO_BIN_EXE_idem"));
        let name = unit.replace("@.", "@orders.");
        let path = dir.path().join(&name);
        std::fs::write(&path, text).unwrap();
        let checked = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .env("MANPATH", dir.path().join("man"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&checked.stderr);
        assert!(checked.status.success(), "{unit}: {said}");
        let problems: Vec<&str> = said
            .lines()
            .filter(|l| l.contains(&name) || l.contains("idem"))
            .collect();
        assert!(problems.is_empty(), "{unit}: {problems:?}");
    }
}

/// The last stage of the Dockerfile: its instructions, continuation lines
/// joined.
fn runtime_stage() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    let joined = text.replace("\\\n", " ");
    let stages: Vec<&str> = joined.split("\nFROM ").collect();
    assert!(stages.len() >= 3, "a build stage and a runtime stage");
    assert!(
        stages[1].contains("--locked") && stages[1].contains("--features full"),
        "the image builds every store and broker from the lock file"
    );
    stages
        .last()
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| {
            let (op, rest) = l.trim().split_once(' ').unwrap_or((l, ""));
            (op.to_owned(), rest.trim().to_owned())
        })
        .collect()
}

fn exec_form(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{json} is not exec form: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_idem_serve_as_non_root_and_its_health_check_passes() {
    let stage = runtime_stage();
    let get = |op: &str| {
        stage
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, rest)| rest.clone())
            .collect::<Vec<_>>()
    };
    let user = get("USER").pop().expect("a USER");
    assert!(
        !user.starts_with("root") && !user.starts_with("0"),
        "{user}"
    );
    assert_eq!(get("VOLUME"), [r#"["/data"]"#]);
    assert_eq!(get("EXPOSE"), ["7700"]);
    let env: Vec<(String, String)> = get("ENV")
        .join(" ")
        .split_whitespace()
        .map(|pair| {
            let (k, v) = pair.split_once('=').expect("ENV NAME=VALUE");
            (k.to_owned(), v.to_owned())
        })
        .collect();
    let value = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    assert_eq!(value("IDEM_STORE").as_deref(), Some("file:///data"));
    assert_eq!(value("IDEM_LISTEN").as_deref(), Some("0.0.0.0:7700"));
    let entrypoint = exec_form(&get("ENTRYPOINT").pop().unwrap());
    let cmd = exec_form(&get("CMD").pop().unwrap());
    assert_eq!(entrypoint, ["/usr/local/bin/idem"]);
    assert_eq!(cmd, ["serve"]);
    let health = get("HEALTHCHECK").pop().expect("a HEALTHCHECK");
    let probe = exec_form(
        health
            .split_once("CMD ")
            .expect("HEALTHCHECK … CMD [...]")
            .1,
    );
    assert_eq!(probe[..2], ["/usr/local/bin/idem", "health"]);

    // The image's command and settings, on a fresh directory for /data and
    // a free port for 7700.
    let data = tempfile::tempdir().unwrap();
    let store = value("IDEM_STORE")
        .unwrap()
        .replace("/data", &data.path().join("data").display().to_string());
    let idem = start(
        &cmd.iter().map(String::as_str).collect::<Vec<_>>(),
        &[("IDEM_STORE", &store)],
    )
    .await;
    let port = idem.base.rsplit(':').next().unwrap().to_owned();
    let probe: Vec<String> = probe[1..]
        .iter()
        .map(|a| a.replace("7700", &port))
        .collect();
    let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
    let (code, out, err) = run(&probe, &[]);
    assert_eq!(
        code, 0,
        "the health check fails on a ready idem: {out}{err}"
    );
    assert!(out.contains("200"), "{out}");
    assert!(
        data.path().join("data").exists(),
        "the store is in the volume"
    );
    assert_eq!(idem.terminate().await, 0);
    let (code, _, err) = run(&probe, &[]);
    assert_eq!(code, 1, "the health check passes with nothing listening");
    assert!(err.contains(&port), "{err}");
}
