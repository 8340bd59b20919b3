//! What a run recorded, and all the judge reads: the history (every
//! handler call as the sink saw it) and the fault ledger (every fault the
//! run injected: what, when, on which process or keys). Nothing here knows
//! how a run is driven.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// One handler call as the sink saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub slot: usize,
    /// The consumer process (its incarnation: a restarted slot is a new
    /// process).
    pub process: u32,
    pub token: u64,
    pub attempt: u32,
    /// Since the run started.
    pub arrived: Duration,
    pub ended: Option<Duration>,
    pub end: End,
    /// Whether the plain sink applied its effect.
    pub effect: bool,
    /// Whether the fenced sink applied it (`false` with `effect`: refused).
    pub fenced: bool,
}

/// How a call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    InFlight,
    Answered(u16),
    /// Its consumer was killed while the call was open.
    Killed,
}

/// Which records a store lost.
#[derive(Clone, Debug)]
pub enum Lost {
    /// Every record it held: a Redis without persistence restarted.
    Everything,
    /// These keys' records only: those in a failed Redis Cluster master's
    /// slots that its replica had not received.
    Keys(HashSet<String>),
}

impl Lost {
    pub fn holds(&self, key: &str) -> bool {
        match self {
            Lost::Everything => true,
            Lost::Keys(keys) => keys.contains(key),
        }
    }
}

/// A link a fault disrupted: recorded for the report, it explains no
/// double (a claim survives each of them by the contract).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Every connection to the store cut, healing at once.
    StoreCut,
    /// The SQL server ended the consumers' sessions.
    SessionsEnded,
    /// A store restarted that keeps what it acknowledged.
    StoreRestart,
    /// Every connection to the broker cut.
    BrokerCut,
    /// The broker link slowed and throttled.
    BrokerSlow,
    /// The broker unreachable for a while.
    BrokerPartition,
    /// The broker stopped and started.
    BrokerRestart,
}

/// One fault the run injected, as the judge needs to know it.
#[derive(Clone, Debug)]
pub enum Injected {
    /// A consumer process killed (`SIGKILL`).
    Kill { process: u32, at: Duration },
    /// A consumer process stopped (`SIGSTOP`) in its call of `key`,
    /// resumed at `to`.
    Stop {
        process: u32,
        key: String,
        from: Duration,
        to: Option<Duration>,
    },
    /// The store lost records at `at`.
    Loss { at: Duration, lost: Lost },
    /// The store slower than the lease, stopped or unreachable, from
    /// `from` to `to` (longer than a lease): no renewal or `complete`
    /// could land, so leases ran out under running handlers.
    SlowStore { from: Duration, to: Duration },
    /// The disk under the store's files full from `from`, freed and the
    /// store restarted at `to`: the store refused writes (the file store
    /// stopped, Redis exited) in between, so claims live then may have had
    /// their `complete` refused.
    DiskFull { from: Duration, to: Duration },
    /// A link disrupted from `from` to `to`.
    Disrupted {
        link: Link,
        from: Duration,
        to: Duration,
    },
}

impl Injected {
    /// When the fault's effects may still come back: its end.
    pub fn last(&self) -> Duration {
        match *self {
            Injected::Kill { at, .. } | Injected::Loss { at, .. } => at,
            Injected::Stop { from, to, .. } => to.unwrap_or(from),
            Injected::SlowStore { to, .. }
            | Injected::DiskFull { to, .. }
            | Injected::Disrupted { to, .. } => to,
        }
    }
}

/// A run's record: the history and the fault ledger.
#[derive(Default)]
pub struct Record {
    /// Every handler call, per key, in the order they arrived.
    pub keys: HashMap<String, Vec<Call>>,
    pub calls: u64,
    /// Calls with headers the sink could not read.
    pub malformed: u64,
    /// The fault ledger.
    pub faults: Vec<Injected>,
    /// Faults injected, as the report counts them (a poison run counts
    /// the calls refused or failed).
    pub injected: u64,
}

impl Record {
    /// The stops of the run: which process, in its call of which key,
    /// from, to.
    pub fn stops(&self) -> impl Iterator<Item = (u32, &str, Duration, Option<Duration>)> + '_ {
        self.faults.iter().filter_map(|f| match f {
            Injected::Stop {
                process,
                key,
                from,
                to,
            } => Some((*process, key.as_str(), *from, *to)),
            _ => None,
        })
    }
}
