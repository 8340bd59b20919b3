//! The faults a run injects, and when.

use std::collections::{HashMap, VecDeque};
use std::fmt;

use clap::ValueEnum;

use crate::store::StoreKind;

/// One kind of fault, injected a few times in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Fault {
    /// Nothing: the baseline.
    None,
    /// The producer sends messages again: right after the original, while
    /// the original is being handled, and after it completed.
    Duplicates,
    /// `kill -9` of a consumer after `begin`, before the effect.
    KillAfterBegin,
    /// `kill -9` after the effect, before `complete`.
    KillAfterEffect,
    /// `kill -9` just after the handler answered: between `complete` and
    /// the ack, or before `complete` lands.
    KillAfterAnswer,
    /// `kill -9` while a message is in its retry chain (its first attempt
    /// failed, the kill comes in the second).
    KillInRetry,
    /// `SIGSTOP` of a consumer mid-call past its lease, another consumer
    /// takes the key over, then `SIGCONT`: the stopped one's write comes
    /// late with a stale token.
    Zombie,
    /// The store's server killed and started again mid-run (a Redis of
    /// the run's own), or the system's PostgreSQL or MariaDB restarted.
    StoreRestart,
    /// Every connection between the consumers and the store cut (through
    /// a TCP fault proxy), a few times.
    StoreCut,
    /// The store slowed past the lease: every chunk each way waits a lease,
    /// for two leases, a few times. Renewals cannot land; the watchdog
    /// reports each lease lost before another consumer can take it.
    StoreSlow,
    /// The SQL server ends the consumers' sessions mid-transaction
    /// (`pg_terminate_backend`, `KILL CONNECTION`), a few times.
    DbCut,
    /// Every connection between the consumers and the broker cut (through
    /// a TCP fault proxy), a few times.
    BrokerCut,
    /// The broker link slowed: 200 ms each way a chunk and 64 KiB/s, for
    /// two leases, a few times.
    BrokerSlow,
    /// The broker stopped and started again (RabbitMQ `stop_app` and
    /// `start_app`, the NATS server and the RocketMQ broker restarted).
    BrokerRestart,
    /// Poison messages: one key in 25 the handler refuses (422), another
    /// it fails every time (503) until the last attempt. The dead letters
    /// are read back from the broker: exactly those keys, each once.
    Poison,
    /// Gateway: clients that give up mid-request (a cut connection) and
    /// retry.
    ClientCuts,
    /// Gateway: the clients' cuts, and `idem proxy` killed (`kill -9`) and
    /// restarted while requests are in flight.
    ProxyKill,
    /// Service: the clients' cuts, and `idem serve` killed (`kill -9`) and
    /// restarted on its store while requests are in flight.
    ServeKill,
}

impl Fault {
    /// What the report says the fault is.
    pub fn title(self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Duplicates => "producer duplicates (before, during, after)",
            Fault::KillAfterBegin => "kill -9 after begin",
            Fault::KillAfterEffect => "kill -9 after the effect, before complete",
            Fault::KillAfterAnswer => "kill -9 after the answer (around complete and ack)",
            Fault::KillInRetry => "kill -9 in a retry chain",
            Fault::Zombie => "SIGSTOP past the lease, then SIGCONT",
            Fault::StoreRestart => "store restart",
            Fault::StoreCut => "store connections cut",
            Fault::StoreSlow => "store slowed past the lease",
            Fault::DbCut => "SQL sessions ended mid-transaction",
            Fault::BrokerCut => "broker connections cut",
            Fault::BrokerSlow => "broker link slowed and throttled",
            Fault::BrokerRestart => "broker restart",
            Fault::Poison => "poison messages (refused, failing every attempt)",
            Fault::ClientCuts => "clients cut requests at 10 ms and retry",
            Fault::ProxyKill => "kill -9 of idem proxy mid-request, and client cuts",
            Fault::ServeKill => "kill -9 of idem serve mid-request, and client cuts",
        }
    }

    /// Why the fault cannot run on `store`, if it cannot.
    pub fn unfit(self, store: StoreKind) -> Option<&'static str> {
        match self {
            Fault::Zombie if !store.shared() => {
                Some("needs a second consumer on the same store to take the key over")
            }
            Fault::StoreRestart if !store.restartable() => {
                Some("the store lives in the consumer's process: a kill is its restart")
            }
            Fault::StoreCut | Fault::StoreSlow if !store.shared() => {
                Some("the store lives in the consumer's process: no connection to cut or slow")
            }
            Fault::StoreCut | Fault::StoreSlow if store == StoreKind::RedisCluster => Some(
                "cluster nodes tell clients their own addresses: connections would go around a proxy",
            ),
            Fault::DbCut if !matches!(store, StoreKind::Postgres | StoreKind::MariaDb) => {
                Some("sessions ended by the SQL server: PostgreSQL and MariaDB only")
            }
            Fault::KillAfterBegin
            | Fault::KillAfterEffect
            | Fault::KillAfterAnswer
            | Fault::KillInRetry
                if store == StoreKind::Memory =>
            {
                Some("a killed process takes the memory store with it")
            }
            _ => None,
        }
    }

    /// Whether the run injects the fault `times` times as the messages
    /// are applied.
    pub fn timed(self) -> bool {
        matches!(
            self,
            Fault::StoreCut
                | Fault::StoreSlow
                | Fault::DbCut
                | Fault::BrokerCut
                | Fault::BrokerSlow
                | Fault::BrokerRestart
        )
    }

    /// Whether the fault is injected at handler calls (the rest are timed
    /// by the run).
    fn at_calls(self) -> bool {
        matches!(
            self,
            Fault::KillAfterBegin
                | Fault::KillAfterEffect
                | Fault::KillAfterAnswer
                | Fault::KillInRetry
                | Fault::Zombie
        )
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.to_possible_value().expect("no variant is skipped");
        f.write_str(value.get_name())
    }
}

/// What the sink does with one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Apply the write and answer; with `duplicate`, also have another
    /// copy of the message published (a producer duplicate while the
    /// original is being handled).
    Apply {
        duplicate: bool,
    },
    /// Answer 503: the handler failed, the message is retried.
    Fail,
    /// Answer 422: the handler refuses the message for good.
    Refuse,
    KillBeforeEffect,
    KillAfterEffect,
    KillAfterAnswer,
    Zombie,
}

impl Action {
    pub fn is_fault(self) -> bool {
        !matches!(self, Action::Apply { .. })
    }
}

/// When a run's faults happen: at evenly spaced handler calls.
#[derive(Default)]
pub struct Plan {
    fault: Option<Fault>,
    /// Call numbers at which the next fault is injected.
    at: VecDeque<u64>,
    /// Keys whose first attempt failed, waiting for their retry's kill.
    retrying: HashMap<String, bool>,
    /// A consumer is stopped: the next stop waits, so that another
    /// consumer is always there to take the key over.
    stopped: bool,
}

impl Plan {
    /// `times` faults of kind `fault` spread over a run of `messages`.
    pub fn new(fault: Fault, messages: usize, times: usize) -> Self {
        let at = if fault.at_calls() {
            let step = messages as u64 / (times as u64 + 1);
            (1..=times as u64).map(|i| i * step.max(1)).collect()
        } else {
            VecDeque::new()
        };
        Self {
            fault: Some(fault),
            at,
            retrying: HashMap::new(),
            stopped: false,
        }
    }

    /// The stopped consumer runs again.
    pub fn resumed(&mut self) {
        self.stopped = false;
    }

    /// The action for call number `index`, of `key` at `attempt`; `first`
    /// when it is the key's first call.
    pub fn action(&mut self, index: u64, key: &str, attempt: u32, first: bool) -> Action {
        let Some(fault) = self.fault else {
            return Action::Apply { duplicate: false };
        };
        if fault == Fault::Poison {
            return match Poison::of(key) {
                Some(Poison::Refused) => Action::Refuse,
                Some(Poison::Failing) => Action::Fail,
                None => Action::Apply { duplicate: false },
            };
        }
        if fault == Fault::KillInRetry && attempt >= 2 && self.retrying.get(key) == Some(&false) {
            self.retrying.insert(key.to_owned(), true);
            return Action::KillBeforeEffect;
        }
        let due = self.at.front().is_some_and(|at| index >= *at)
            && !(fault == Fault::Zombie && self.stopped);
        // A key already hit by a fault is left alone, so that each fault
        // lands on a fresh key.
        if due && first {
            self.at.pop_front();
            return match fault {
                Fault::KillAfterBegin => Action::KillBeforeEffect,
                Fault::KillAfterEffect => Action::KillAfterEffect,
                Fault::KillAfterAnswer => Action::KillAfterAnswer,
                Fault::KillInRetry => {
                    self.retrying.insert(key.to_owned(), false);
                    Action::Fail
                }
                Fault::Zombie => {
                    self.stopped = true;
                    Action::Zombie
                }
                _ => Action::Apply { duplicate: false },
            };
        }
        let duplicate = fault == Fault::Duplicates && first && index % 10 == 3;
        Action::Apply { duplicate }
    }
}

/// What a poison message does to its handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poison {
    /// Refused at once (422): dead-lettered after one call.
    Refused,
    /// Failing every attempt (503): dead-lettered after the last.
    Failing,
}

impl Poison {
    /// What the run's key `key` (`k-N`) is in a run of poison messages.
    pub fn of(key: &str) -> Option<Self> {
        let n: u64 = key.strip_prefix("k-")?.parse().ok()?;
        match n % 25 {
            5 => Some(Poison::Refused),
            17 => Some(Poison::Failing),
            _ => None,
        }
    }
}
