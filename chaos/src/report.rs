//! The table of RELIABILITY.md, written between its markers.

use std::fmt::Write as _;
use std::path::Path;

use crate::history::Outcome;

const START: &str = "<!-- chaos:start -->";
const END: &str = "<!-- chaos:end -->";

/// The Markdown for `rows`, from `command` on `machine`.
pub fn markdown(rows: &[Outcome], skipped: &[String], command: &str, machine: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "{START}");
    let _ = writeln!(s, "`{command}`, {machine}.\n");
    s.push_str(
        "| broker | store | fault | consumers | sent | duplicates sent | faults | effects | lost \
         | dead letters | doubled, plain (unexplained) | doubled, fenced (unexplained) | stale writes refused \
         | doubled, inbox | recovery ms | s | result |\n| --- | --- | --- | ---: | ---: | ---: | ---: \
         | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for o in rows {
        let figures: Vec<String> = o.figures().into_iter().map(|(_, v)| v).collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            o.broker,
            o.store,
            o.fault,
            figures.join(" | "),
            if o.passed() { "pass" } else { "**FAIL**" },
        );
    }
    s.push_str("\nEach row again, alone:\n\n");
    for o in rows {
        let _ = writeln!(s, "- `{}`", o.command);
    }
    let failed: Vec<&Outcome> = rows.iter().filter(|o| !o.passed()).collect();
    if !failed.is_empty() {
        s.push_str("\nWhat failed:\n\n");
        for o in failed {
            let _ = writeln!(s, "- {} / {} / {}:", o.broker, o.store, o.fault);
            for p in &o.problems {
                let _ = writeln!(s, "  - {p}");
            }
        }
    }
    let mut limits: Vec<(&str, &str)> = rows
        .iter()
        .filter_map(|o| o.limits.map(|l| (o.broker, l)))
        .collect();
    limits.dedup();
    if !limits.is_empty() || !skipped.is_empty() {
        s.push_str("\nNot run, and the test brokers' limits:\n\n");
        for (broker, l) in limits {
            let _ = writeln!(s, "- {broker}: {l}.");
        }
        for why in skipped {
            let _ = writeln!(s, "- {why}");
        }
    }
    let _ = writeln!(s, "{END}");
    s
}

/// Replaces the section between the markers in `path` (or appends it).
pub fn write(path: &Path, section: &str) -> Result<(), String> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let new = match (old.find(START), old.find(END)) {
        (Some(a), Some(b)) if a < b => {
            format!(
                "{}{}{}",
                &old[..a],
                section.trim_end(),
                &old[b + END.len()..]
            )
        }
        _ => format!("{old}\n{section}"),
    };
    std::fs::write(path, new).map_err(|e| format!("{}: {e}", path.display()))
}
