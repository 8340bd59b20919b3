//! The table of RELIABILITY.md, written between its markers.

use std::fmt::Write as _;
use std::path::Path;

use crate::broker::Broker;
use crate::fault::Fault;
use crate::judge::Outcome;
use crate::spec::{RunnerKind, Spec};

/// The markers around section `name` of a page.
fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- {name}:start -->"),
        format!("<!-- {name}:end -->"),
    )
}

/// The figures of the report's columns after the run's names, each with
/// its label.
pub fn figures(o: &Outcome) -> [(&'static str, String); 16] {
    let r = &o.reasons;
    let reasons: Vec<String> = [
        ("kill", r.kill),
        ("stop", r.stop),
        ("loss", r.loss),
        ("slow store", r.slow_store),
        ("disk full", r.disk_full),
        ("rolled back", r.rolled_back),
    ]
    .iter()
    .filter(|(_, n)| *n > 0)
    .map(|(why, n)| format!("{n} {why}"))
    .collect();
    [
        (
            "consumers",
            if o.names.runner == RunnerKind::Sidecar.title() {
                o.consumers.to_string()
            } else {
                format!("{} ({})", o.consumers, o.names.runner)
            },
        ),
        ("sent", o.sent.to_string()),
        ("copies", o.duplicates.to_string()),
        ("faults", o.injected.to_string()),
        ("effects", o.effects.to_string()),
        ("lost", o.lost.to_string()),
        (
            "dead letters",
            o.dead_letters.map_or("—".into(), |n| n.to_string()),
        ),
        (
            "doubled (unexplained)",
            format!("{} ({})", o.doubled_plain, o.unexplained),
        ),
        (
            "explained by",
            if reasons.is_empty() {
                "—".into()
            } else {
                reasons.join(", ")
            },
        ),
        ("bound", o.bound.to_string()),
        (
            "fenced doubled (unexplained)",
            if o.fenced {
                format!("{} ({})", o.doubled_fenced, o.unexplained_fenced)
            } else {
                "—".into()
            },
        ),
        (
            "stale refused",
            if o.fenced {
                o.refused.to_string()
            } else {
                "—".into()
            },
        ),
        (
            "inbox doubled",
            o.doubled_inbox.map_or("—".into(), |n| n.to_string()),
        ),
        (
            "final copies handled",
            o.replayed.map_or("—".into(), |n| n.to_string()),
        ),
        (
            "recovery ms",
            o.recover_ms.map_or("—".into(), |m| m.to_string()),
        ),
        ("s", format!("{:.1}", o.seconds)),
    ]
}

/// The Markdown for `rows`, from `command` on `machine`.
pub fn markdown(
    rows: &[Outcome],
    skipped: &[String],
    command: &str,
    machine: &str,
    stamp: &[(&str, String)],
    section: &str,
) -> String {
    let (start, end) = markers(section);
    let mut s = String::new();
    let _ = writeln!(s, "{start}");
    let _ = writeln!(s, "`{command}`, {machine}.\n");
    let stamp: Vec<String> = stamp
        .iter()
        .map(|(what, v)| format!("{what} {v}"))
        .collect();
    let _ = writeln!(s, "Ran on: {}.\n", stamp.join("; "));
    s.push_str(
        "| broker | store | fault | consumers | sent | duplicates sent | faults | effects | lost \
         | dead letters | doubled, plain (unexplained) | explained by | bound | doubled, fenced (unexplained) \
         | stale writes refused | doubled, inbox | final copies handled | recovery ms | s | result |\n\
         | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: \
         | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for o in rows {
        let figures: Vec<String> = figures(o).into_iter().map(|(_, v)| v).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            o.names.broker,
            o.names.store,
            o.names.fault,
            figures.join(" | "),
            if o.passed() { "pass" } else { "**FAIL**" },
        );
    }
    s.push_str("\nEach row again, alone:\n\n");
    for o in rows {
        let _ = writeln!(s, "- `{}`", o.names.command);
    }
    let failed: Vec<&Outcome> = rows.iter().filter(|o| !o.passed()).collect();
    if !failed.is_empty() {
        s.push_str("\nWhat failed:\n\n");
        for o in failed {
            let _ = writeln!(
                s,
                "- {} / {} / {}:",
                o.names.broker, o.names.store, o.names.fault
            );
            for p in &o.problems {
                let _ = writeln!(s, "  - {p}");
            }
        }
    }
    let limits: std::collections::BTreeSet<(&str, &str)> = rows
        .iter()
        .filter_map(|o| Some((&*o.names.broker, o.names.limits.as_deref()?)))
        .collect();
    if !limits.is_empty() || !skipped.is_empty() {
        s.push_str("\nNot run, and the test brokers' limits:\n\n");
        for (broker, l) in limits {
            let _ = writeln!(s, "- {broker}: {l}.");
        }
        let skipped: std::collections::BTreeSet<&String> = skipped.iter().collect();
        for why in skipped {
            let _ = writeln!(s, "- {why}");
        }
    }
    let _ = writeln!(s, "{end}");
    s
}

/// The combinations of `matrix` that do not run, grouped by why, as
/// section `section`: each fault with the brokers and stores it does not
/// run on under `idem consume`, and for the other runners, why not. (The
/// HTTP runs' faults and the brokers' are kinds apart, not gaps.)
pub fn uncovered(matrix: &[Spec], section: &str) -> String {
    use std::collections::{BTreeMap, BTreeSet};
    let http = |spec: &Spec| matches!(spec.broker, Broker::Proxy | Broker::Serve);
    let http_fault = |spec: &Spec| {
        matches!(
            spec.fault,
            Fault::ClientCuts | Fault::ProxyKill | Fault::ServeKill
        )
    };
    let mut sidecar: BTreeMap<&str, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let mut runners: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for spec in matrix {
        if http(spec) != http_fault(spec) {
            continue;
        }
        let Some(reason) = spec.unfit() else { continue };
        if spec.runner == RunnerKind::Sidecar {
            sidecar
                .entry(reason)
                .or_default()
                .entry(spec.fault.to_string())
                .or_default()
                .insert(format!("{} / {}", spec.broker, spec.store));
        } else if !http(spec) {
            runners
                .entry(reason)
                .or_default()
                .insert(spec.runner.title());
        }
    }
    let (start, end) = markers(section);
    let mut s = format!("{start}\n");
    for (reason, faults) in sidecar {
        let _ = writeln!(s, "- {reason}:");
        for (fault, on) in faults {
            let on: Vec<&str> = on.iter().map(String::as_str).collect();
            let _ = writeln!(s, "  - `{fault}` on {}", on.join(", "));
        }
    }
    for (reason, by) in runners {
        let by: Vec<&str> = by.into_iter().collect();
        let _ = writeln!(s, "- with the {}: {reason}", by.join("; the "));
    }
    let _ = writeln!(s, "{end}");
    s
}

/// Replaces the text between the markers of section `name` in `path`
/// with `text` (or appends it).
pub fn write(path: &Path, text: &str, name: &str) -> Result<(), String> {
    let (start, end) = markers(name);
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(&start), old.find(&end)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{}{}", &old[..a], text.trim_end(), &old[b + end.len()..])
        }
        _ => format!("{old}\n{text}"),
    };
    std::fs::write(path, new).map_err(|e| format!("{}: {e}", path.display()))
}
