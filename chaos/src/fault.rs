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
    /// The store unreachable for two leases while the broker keeps
    /// delivering: every connection through the fault proxy cut and new
    /// ones closed as they come, a few times.
    StorePartition,
    /// The run's own `redis-server` stopped (`SIGSTOP`) for two leases and
    /// resumed (`SIGCONT`), a few times: the store hangs, its clock runs.
    StorePause,
    /// The disk under the store's files fills up (a small tmpfs of the
    /// run's own, a ballast file taking what room is left, and outcomes
    /// too large for the last page of the store's files) until the store
    /// refuses a write and for two leases, then the ballast is deleted and
    /// the store restarted: the consumer
    /// process for the file store, which stops at the first write the disk
    /// refuses; `redis-server` for Redis with `appendfsync always`, which
    /// exits at it. Nothing acknowledged may be lost (docs/guarantees.md,
    /// "When the disk fills up").
    DiskFull,
    /// The SQL server ends the consumers' sessions mid-transaction
    /// (`pg_terminate_backend`, `KILL CONNECTION`), a few times.
    DbCut,
    /// Every connection between the consumers and the broker cut (through
    /// a TCP fault proxy), a few times.
    BrokerCut,
    /// The broker link slowed: 200 ms each way a chunk and 64 KiB/s, for
    /// two leases, a few times.
    BrokerSlow,
    /// The broker unreachable for two leases, the store fine, a few
    /// times.
    BrokerPartition,
    /// The broker stopped and started again (RabbitMQ `stop_app` and
    /// `start_app`, the NATS server and the RocketMQ broker restarted).
    BrokerRestart,
    /// Slow handlers: a tenth of the calls take 1.2 to 3 leases, with a
    /// copy of their message published meanwhile. The watchdog must keep
    /// each claim: no second call while its holder is alive.
    SlowHandler,
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
    /// Several kinds of fault in one run, their kinds, order and moments
    /// drawn from `--seed`: kills, stops, link cuts, slowdowns and
    /// partitions of the store and the broker, a store crash.
    Nemesis,
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
            Fault::StorePartition => "store unreachable for two leases",
            Fault::StorePause => "store process stopped for two leases",
            Fault::DiskFull => "the store's disk full for two leases, then freed",
            Fault::DbCut => "SQL sessions ended mid-transaction",
            Fault::BrokerCut => "broker connections cut",
            Fault::BrokerSlow => "broker link slowed and throttled",
            Fault::BrokerPartition => "broker unreachable for two leases",
            Fault::BrokerRestart => "broker restart",
            Fault::SlowHandler => "slow handlers (1.2–3 leases), a copy meanwhile",
            Fault::Poison => "poison messages (refused, failing every attempt)",
            Fault::ClientCuts => "clients cut requests at 10 ms and retry",
            Fault::ProxyKill => "kill -9 of idem proxy mid-request, and client cuts",
            Fault::ServeKill => "kill -9 of idem serve mid-request, and client cuts",
            Fault::Nemesis => "a seeded mix of kills, stops, cuts, partitions and a store crash",
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
            Fault::StoreCut | Fault::StoreSlow | Fault::StorePartition if !store.shared() => {
                Some("the store lives in the consumer's process: no connection to cut or slow")
            }
            Fault::StorePause
                if !matches!(
                    store,
                    StoreKind::Redis | StoreKind::RedisAof | StoreKind::RedisOverPostgres
                ) =>
            {
                Some("stops a redis-server of the run's own: the Redis stores only")
            }
            Fault::StoreCut | Fault::StoreSlow | Fault::StorePartition
                if store == StoreKind::RedisCluster =>
            {
                Some(
                    "cluster nodes tell clients their own addresses: connections would go around a proxy",
                )
            }
            Fault::DiskFull if !matches!(store, StoreKind::File | StoreKind::RedisAof) => Some(
                "fills a disk under the store's own files: the file store and Redis with \
                 appendfsync always",
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
                | Fault::StorePartition
                | Fault::StorePause
                | Fault::DiskFull
                | Fault::DbCut
                | Fault::BrokerCut
                | Fault::BrokerSlow
                | Fault::BrokerPartition
                | Fault::BrokerRestart
        )
    }

    /// Whether each injection holds the run up for two leases or more
    /// (the store or the broker slowed, unreachable, paused or out of
    /// disk for two leases; a stopped holder waiting for a takeover).
    pub fn lasts_two_leases(self) -> bool {
        matches!(
            self,
            Fault::Zombie
                | Fault::DiskFull
                | Fault::StoreSlow
                | Fault::StorePartition
                | Fault::StorePause
                | Fault::BrokerSlow
                | Fault::BrokerPartition
        )
    }

    /// Whether the fault is injected at handler calls (the rest are timed
    /// by the run).
    pub fn at_calls(self) -> bool {
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
    /// Take `per_mille` thousandths of the lease, then apply and answer.
    Slow {
        per_mille: u32,
    },
}

impl Action {
    pub fn is_fault(self) -> bool {
        !matches!(self, Action::Apply { .. })
    }
}

/// The kinds a nemesis draws from (those that fit the run).
pub const NEMESIS: [Fault; 13] = [
    Fault::KillAfterBegin,
    Fault::KillAfterEffect,
    Fault::KillAfterAnswer,
    Fault::Zombie,
    Fault::StoreCut,
    Fault::StoreSlow,
    Fault::StorePartition,
    Fault::StorePause,
    Fault::DbCut,
    Fault::BrokerCut,
    Fault::BrokerSlow,
    Fault::BrokerPartition,
    Fault::StoreRestart,
];

/// What a run injects, and when: faults at handler calls (by call
/// number) and faults the run times itself (by the thousandths of the
/// messages that have had their effect).
#[derive(Clone, Debug, Default)]
pub struct Schedule {
    pub at_calls: Vec<(u64, Fault)>,
    pub timed: Vec<(usize, Fault)>,
}

impl Schedule {
    /// `times` faults of kind `fault` over a run of `messages`: at evenly
    /// spaced calls, or evenly as the messages are applied; a store
    /// restart once, at 40 %.
    pub fn of(fault: Fault, messages: usize, times: usize) -> Self {
        let mut s = Self::default();
        if fault == Fault::StoreRestart {
            s.timed.push((400, fault));
        } else if fault.at_calls() {
            let step = (messages as u64 / (times as u64 + 1)).max(1);
            s.at_calls = (1..=times as u64).map(|i| (i * step, fault)).collect();
        } else if fault.timed() {
            s.timed = (1..=times)
                .map(|k| (1000 * k / (times + 1), fault))
                .collect();
        }
        s
    }

    /// A nemesis: `count` faults drawn from `seed` among `kinds`, each at
    /// a call or a share of the messages between a tenth and nine tenths
    /// of the run; a store restart at most once.
    pub fn drawn(seed: u64, kinds: &[Fault], count: usize, messages: usize) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut s = Self::default();
        let mut restarted = false;
        for _ in 0..count {
            let open: Vec<Fault> = kinds
                .iter()
                .copied()
                .filter(|&k| !(restarted && k == Fault::StoreRestart))
                .collect();
            let Some(kind) = rng.choice(open) else {
                break;
            };
            restarted |= kind == Fault::StoreRestart;
            if kind.at_calls() {
                let m = messages as u64;
                s.at_calls.push((rng.u64(m / 10..=m * 9 / 10), kind));
            } else {
                s.timed.push((rng.usize(100..=900), kind));
            }
        }
        s.at_calls.sort_by_key(|&(at, _)| at);
        s.timed.sort_by_key(|&(at, _)| at);
        s
    }

    /// Whether any fault of the schedule is `kind`.
    pub fn has(&self, kind: Fault) -> bool {
        self.count(kind) > 0
    }

    /// How many faults of the schedule are `kind`.
    pub fn count(&self, kind: Fault) -> usize {
        let calls = self.at_calls.iter().filter(|&&(_, k)| k == kind).count();
        calls + self.timed.iter().filter(|&&(_, k)| k == kind).count()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let calls = self
            .at_calls
            .iter()
            .map(|(at, k)| format!("{k} at call {at}"));
        let timed = self
            .timed
            .iter()
            .map(|(at, k)| format!("{k} at {}.{}%", at / 10, at % 10));
        let all: Vec<String> = calls.chain(timed).collect();
        f.write_str(&all.join(", "))
    }
}

/// When a run's faults happen: at the handler calls its schedule names.
#[derive(Default)]
pub struct Plan {
    fault: Option<Fault>,
    /// Call numbers at which the next faults are injected, and which.
    at: VecDeque<(u64, Fault)>,
    /// Keys whose first attempt failed, waiting for their retry's kill.
    retrying: HashMap<String, bool>,
    /// A consumer is stopped: the next stop waits, so that another
    /// consumer is always there to take the key over.
    stopped: bool,
}

impl Plan {
    /// The plan of a run of `fault` with `schedule`.
    pub fn new(fault: Fault, schedule: &Schedule) -> Self {
        Self {
            fault: Some(fault),
            at: schedule.at_calls.iter().copied().collect(),
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
        let due = self
            .at
            .front()
            .copied()
            .filter(|&(at, kind)| index >= at && !(kind == Fault::Zombie && self.stopped));
        // A key already hit by a fault is left alone, so that each fault
        // lands on a fresh key.
        if let Some((_, kind)) = due
            && first
        {
            self.at.pop_front();
            return match kind {
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
        if fault == Fault::SlowHandler && first && index % 10 == 5 {
            // 1.2 to 3 leases, in seven steps.
            let step = (index / 10 % 7) as u32;
            return Action::Slow {
                per_mille: 1200 + step * 300,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_draws_the_same_schedule_every_time_and_another_seed_another() {
        let kinds = [Fault::KillAfterEffect, Fault::StoreCut, Fault::StoreRestart];
        let a = Schedule::drawn(7, &kinds, 6, 300);
        assert_eq!(
            a.to_string(),
            Schedule::drawn(7, &kinds, 6, 300).to_string()
        );
        assert_ne!(
            a.to_string(),
            Schedule::drawn(8, &kinds, 6, 300).to_string()
        );
        assert_eq!(a.at_calls.len() + a.timed.len(), 6);
        for seed in 0..50 {
            let s = Schedule::drawn(seed, &kinds, 6, 300);
            assert!(s.count(Fault::StoreRestart) <= 1, "{s}");
            assert!(
                s.at_calls
                    .iter()
                    .all(|&(at, k)| (30..=270).contains(&at) && k.at_calls())
            );
            assert!(
                s.timed
                    .iter()
                    .all(|&(at, k)| (100..=900).contains(&at) && !k.at_calls())
            );
        }
    }

    #[test]
    fn one_kind_is_spread_evenly() {
        let s = Schedule::of(Fault::KillAfterEffect, 300, 3);
        assert_eq!(
            s.at_calls,
            [
                (75, Fault::KillAfterEffect),
                (150, Fault::KillAfterEffect),
                (225, Fault::KillAfterEffect)
            ]
        );
        let s = Schedule::of(Fault::StoreCut, 300, 3);
        assert_eq!(
            s.timed.iter().map(|t| t.0).collect::<Vec<_>>(),
            [250, 500, 750]
        );
        let s = Schedule::of(Fault::StoreRestart, 300, 3);
        assert_eq!(s.timed, [(400, Fault::StoreRestart)]);
        assert!(Schedule::of(Fault::Poison, 300, 3).to_string().is_empty());
    }
}
