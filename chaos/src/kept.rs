//! A suite's finished rows kept in a file (`idem-chaos suite --resume
//! FILE`), so that a suite of hours can stop and go on later: one JSON
//! line a row, the row's outcome and the commit it ran at.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::judge::Outcome;
use crate::spec::Spec;

/// The rows a file holds, by the command that ran each.
pub struct Kept {
    path: PathBuf,
    /// The commit the rows run now are kept under.
    commit: String,
    rows: HashMap<String, Outcome>,
    /// How many rows ran at each commit.
    commits: BTreeMap<String, usize>,
}

/// One line of the file.
#[derive(Serialize, Deserialize)]
struct Line {
    commit: String,
    #[serde(flatten)]
    outcome: Outcome,
}

impl Kept {
    /// Reads the rows `path` holds (none if it does not exist yet); rows
    /// run from now on are kept under `commit`.
    pub fn open(path: &Path, commit: String) -> Result<Self, String> {
        let mut kept = Self {
            path: path.to_owned(),
            commit,
            rows: HashMap::new(),
            commits: BTreeMap::new(),
        };
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(kept),
            Err(e) => return Err(format!("reading the kept rows in {}: {e}", path.display())),
        };
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line =
                line.map_err(|e| format!("reading the kept rows in {}: {e}", path.display()))?;
            if line.trim().is_empty() {
                continue;
            }
            let Line { commit, outcome } = serde_json::from_str(&line).map_err(|e| {
                format!(
                    "{} line {}: not a kept row ({e}); delete the line, or the file to start over",
                    path.display(),
                    n + 1
                )
            })?;
            *kept.commits.entry(commit).or_default() += 1;
            kept.rows.insert(outcome.names.command.clone(), outcome);
        }
        Ok(kept)
    }

    /// The row `spec` ran to, if the file holds it, under the names this
    /// build gives it.
    pub fn row(&self, spec: &Spec) -> Option<Outcome> {
        let mut o = self.rows.get(&spec.command())?.clone();
        o.names = spec.names();
        Some(o)
    }

    /// Adds a finished row to the file at once, so that a suite stopped
    /// after it does not run it again.
    pub fn keep(&mut self, outcome: &Outcome) -> Result<(), String> {
        let line = serde_json::to_string(&Line {
            commit: self.commit.clone(),
            outcome: outcome.clone(),
        })
        .map_err(|e| e.to_string())?;
        File::options()
            .create(true)
            .append(true)
            .open(&self.path)
            .and_then(|mut f| {
                writeln!(f, "{line}")?;
                f.sync_data()
            })
            .map_err(|e| format!("keeping a row in {}: {e}", self.path.display()))?;
        *self.commits.entry(self.commit.clone()).or_default() += 1;
        self.rows
            .insert(outcome.names.command.clone(), outcome.clone());
        Ok(())
    }

    /// The commits the rows ran at, each with its count of rows.
    pub fn commits(&self) -> Vec<String> {
        self.commits
            .iter()
            .map(|(commit, n)| format!("{commit} ({n} rows)"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::broker::Broker;
    use crate::fault::Fault;
    use crate::spec::RunnerKind;
    use crate::store::StoreKind;

    fn spec(fault: Fault) -> Spec {
        Spec {
            broker: Broker::Amqp,
            runner: RunnerKind::Sidecar,
            store: StoreKind::Redis,
            fault,
            messages: 300,
            consumers: 3,
            lease: Duration::from_secs(2),
            times: 3,
            deadline: Duration::from_secs(120),
            seed: 1,
        }
    }

    /// A kept row comes back whole after the file is opened again, under
    /// its spec's names; a row not kept is run; a row kept at another
    /// commit is counted under that commit.
    #[test]
    fn rows_kept_come_back_after_a_stop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        let done = spec(Fault::Zombie);
        let mut o = Outcome::failed(done.names(), "the broker went away".into());
        o.doubled_plain = 3;
        o.reasons.stop = 3;
        o.seconds = 21.5;
        let mut kept = Kept::open(&path, "aaa".into()).unwrap();
        kept.keep(&o).unwrap();
        drop(kept);
        let mut kept = Kept::open(&path, "bbb".into()).unwrap();
        let back = kept.row(&done).expect("the kept row");
        assert_eq!(back.names.command, done.command());
        assert_eq!((back.doubled_plain, back.reasons.stop), (3, 3));
        assert_eq!(back.problems, o.problems);
        assert!(!back.passed(), "a failed row stays failed");
        assert!(kept.row(&spec(Fault::StoreCut)).is_none());
        kept.keep(&Outcome::failed(spec(Fault::StoreCut).names(), "x".into()))
            .unwrap();
        assert_eq!(kept.commits(), ["aaa (1 rows)", "bbb (1 rows)"]);
    }

    /// A line that is not a kept row is refused with where it is.
    #[test]
    fn a_damaged_file_is_refused_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rows.jsonl");
        std::fs::write(&path, "{\"commit\":\"a\"}\n").unwrap();
        let Err(e) = Kept::open(&path, "b".into()) else {
            panic!("a damaged file was read");
        };
        assert!(e.contains("line 1: not a kept row"), "{e}");
    }
}
