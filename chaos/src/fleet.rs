//! The consumers: `idem consume` processes, one per slot, restarted after a
//! kill as an orchestrator would.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The consumer processes, shared with the sink (which kills and stops
/// them). Each process started gets a number of its own, its incarnation,
/// which is in its handler URL: a call says which process made it, even
/// one that arrives after its process was killed.
#[derive(Clone, Default)]
pub struct Procs(Arc<Mutex<ProcTable>>);

#[derive(Default)]
struct ProcTable {
    /// Each slot's running incarnation.
    running: Vec<Option<u32>>,
    /// Each incarnation's pid.
    pids: HashMap<u32, u32>,
    next: u32,
}

impl Procs {
    /// The pid of incarnation `process`, if it is the one running in
    /// `slot`.
    pub fn running(&self, slot: usize, process: u32) -> Option<u32> {
        let t = self.0.lock();
        (t.running.get(slot).copied().flatten() == Some(process))
            .then(|| t.pids.get(&process).copied())
            .flatten()
    }

    /// The pid of incarnation `process` if it is the one running in `slot`,
    /// which it no longer is: one check and one change under one lock, so
    /// that of two calls killing the same process at once only one kills it
    /// (and has its slot restarted).
    pub fn take(&self, slot: usize, process: u32) -> Option<u32> {
        let mut t = self.0.lock();
        let running = t.running.get_mut(slot)?;
        if *running != Some(process) {
            return None;
        }
        *running = None;
        t.pids.get(&process).copied()
    }

    /// Each slot's running incarnation, by slot.
    pub fn every_running(&self) -> Vec<(usize, u32)> {
        let t = self.0.lock();
        t.running
            .iter()
            .enumerate()
            .filter_map(|(slot, p)| Some((slot, (*p)?)))
            .collect()
    }

    /// No process runs in `slot`.
    fn forget(&self, slot: usize) {
        if let Some(p) = self.0.lock().running.get_mut(slot) {
            *p = None;
        }
    }

    /// A new incarnation for `slot`, not yet running.
    fn next(&self) -> u32 {
        let mut t = self.0.lock();
        t.next += 1;
        t.next
    }

    fn started(&self, slot: usize, process: u32, pid: Option<u32>) {
        let mut t = self.0.lock();
        if t.running.len() <= slot {
            t.running.resize(slot + 1, None);
        }
        t.running[slot] = Some(process);
        if let Some(pid) = pid {
            t.pids.insert(process, pid);
        }
    }
}

/// The consumer processes of a run.
pub struct Fleet {
    /// The program and arguments of each slot.
    commands: Vec<(PathBuf, Vec<String>)>,
    /// The handler URL without `/{slot}/{incarnation}`.
    to: String,
    logs: PathBuf,
    children: Vec<Option<Child>>,
    pub procs: Procs,
}

impl Fleet {
    /// One consumer a command (a program and its arguments), each given
    /// `--to TO/SLOT/N`.
    pub fn new(
        commands: Vec<(PathBuf, Vec<String>)>,
        to: String,
        logs: &Path,
        procs: Procs,
    ) -> Self {
        Self {
            children: (0..commands.len()).map(|_| None).collect(),
            commands,
            to,
            logs: logs.to_owned(),
            procs,
        }
    }

    /// Starts every slot at once and waits until each has printed its
    /// ready line.
    pub async fn start(&mut self) -> Result<(), String> {
        let launches = (0..self.children.len()).map(|slot| self.launch(slot, true));
        let children = futures_util::future::try_join_all(launches).await?;
        for (slot, child) in children.into_iter().enumerate() {
            self.children[slot] = Some(child);
        }
        Ok(())
    }

    /// Starts slot `slot` again after its process was killed.
    pub async fn restart(&mut self, slot: usize) -> Result<(), String> {
        if let Some(mut old) = self.children[slot].take()
            && tokio::time::timeout(Duration::from_secs(10), old.wait())
                .await
                .is_err()
        {
            let _ = old.kill().await;
            return Err(format!(
                "consumer {slot} was to be restarted after a kill, but its process was still running 10 s later"
            ));
        }
        let child = self.launch(slot, false).await?;
        self.children[slot] = Some(child);
        Ok(())
    }

    /// Starts the process of slot `slot`, with `wait_ready` once it has
    /// printed its ready line.
    async fn launch(&self, slot: usize, wait_ready: bool) -> Result<Child, String> {
        let log = self.logs.join(format!("consumer-{slot}.log"));
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("{}: {e}", log.display()))?;
        let process = self.procs.next();
        let (bin, args) = &self.commands[slot];
        let mut child = Command::new(bin)
            .args(args)
            .arg("--to")
            .arg(format!("{}/{slot}/{process}", self.to))
            .env_remove("IDEM_CONFIG")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{} does not start: {e}", bin.display()))?;
        self.procs.started(slot, process, child.id());
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        if wait_ready {
            match tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await {
                Ok(Ok(Some(_))) => {}
                _ => {
                    let _ = child.kill().await;
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: Vec<&str> = tail.lines().rev().take(5).collect();
                    return Err(format!(
                        "consumer {slot} printed no ready line within 60 s; its log ends: {}",
                        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                    ));
                }
            }
        }
        // Keep reading so the process never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(child)
    }

    /// SIGTERM to every consumer at once, then waits for each to exit
    /// (SIGKILL after `grace`); answers how many needed the SIGKILL.
    pub async fn stop(&mut self, grace: Duration) -> usize {
        let mut stopping = Vec::new();
        for (slot, child) in self.children.iter_mut().enumerate() {
            let Some(child) = child.take() else {
                continue;
            };
            if let Some(pid) = child.id() {
                // A stopped process would never see the SIGTERM.
                signal(pid, libc::SIGCONT);
                signal(pid, libc::SIGTERM);
            }
            stopping.push((slot, child));
        }
        let waits = stopping.into_iter().map(|(slot, mut child)| async move {
            let forced = tokio::time::timeout(grace, child.wait()).await.is_err();
            if forced {
                let _ = child.kill().await;
            }
            (slot, forced)
        });
        let mut forced = 0;
        for (slot, was_forced) in futures_util::future::join_all(waits).await {
            forced += usize::from(was_forced);
            self.procs.forget(slot);
        }
        forced
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) has no memory effects; a pid that is gone gives ESRCH.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[cfg(test)]
mod tests {
    use super::Procs;

    #[test]
    fn of_two_kills_of_one_process_only_the_first_finds_it() {
        let procs = Procs::default();
        let process = procs.next();
        procs.started(0, process, Some(4242));
        assert_eq!(procs.take(0, process), Some(4242));
        assert_eq!(procs.take(0, process), None);
        assert_eq!(procs.running(0, process), None);
    }
}
