//! What a run is: its broker, store, fault and consumers, the command
//! that runs it again, and the step it is at.

use std::time::Duration;

use clap::ValueEnum;

use crate::broker::Broker;
use crate::fault::{Fault, NEMESIS, Schedule};
use crate::judge::Names;
use crate::store::StoreKind;

/// Which consumer processes a run starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RunnerKind {
    /// `idem consume` with the sink as its HTTP handler.
    Sidecar,
    /// `idem-chaos worker`: the library's `Runner` with a Rust handler
    /// (Redis Streams, RabbitMQ and NATS; the memory and Redis stores).
    Library,
    /// The first consumer the library's, the others `idem consume`, on one
    /// store and one queue.
    Mixed,
    /// `idem-chaos worker` with the transactional sink: each effect a row
    /// written by the transaction that records the key in idem-sql's
    /// inbox, on the SQL store's database (PostgreSQL, MariaDB), with the
    /// sink called inside it.
    Inbox,
}

impl RunnerKind {
    pub fn title(self) -> &'static str {
        match self {
            RunnerKind::Sidecar => "idem consume",
            RunnerKind::Library => "library runner",
            RunnerKind::Mixed => "library runner + idem consume",
            RunnerKind::Inbox => "library runner, inbox",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub broker: Broker,
    pub runner: RunnerKind,
    pub store: StoreKind,
    pub fault: Fault,
    pub messages: usize,
    /// Consumer processes (one for a store that belongs to one process).
    pub consumers: usize,
    pub lease: Duration,
    /// How many times the fault is injected.
    pub times: usize,
    /// The run gives up waiting for its messages after this.
    pub deadline: Duration,
    /// What a nemesis draws its faults from.
    pub seed: u64,
}

impl Spec {
    /// The command that runs this spec again.
    pub fn command(&self) -> String {
        let runner = match self.runner {
            RunnerKind::Sidecar => String::new(),
            other => format!(
                " --runner {}",
                other.to_possible_value().expect("named").get_name()
            ),
        };
        let seed = if self.fault == Fault::Nemesis {
            format!(" --seed {}", self.seed)
        } else {
            String::new()
        };
        format!(
            "idem-chaos run --broker {}{runner} --store {} --fault {}{seed} --messages {} --consumers {} --lease-ms {} --times {}",
            self.broker,
            self.store,
            self.fault,
            self.messages,
            self.consumers,
            self.lease.as_millis(),
            self.times
        )
    }

    /// What the run injects, and when: `times` faults of its kind, or for
    /// a nemesis two more than `times`, drawn from the seed among the
    /// kinds that fit this broker and store.
    pub fn schedule(&self) -> Schedule {
        if self.fault == Fault::Nemesis {
            Schedule::drawn(
                self.seed,
                &self.nemesis_kinds(),
                self.times + 2,
                self.messages,
            )
        } else {
            Schedule::of(self.fault, self.messages, self.times)
        }
    }

    /// The kinds of fault a nemesis of this spec can draw.
    fn nemesis_kinds(&self) -> Vec<Fault> {
        NEMESIS
            .into_iter()
            .filter(|&fault| {
                Spec {
                    fault,
                    ..self.clone()
                }
                .unfit()
                .is_none()
            })
            .collect()
    }

    /// The names this spec's row is shown under.
    pub fn names(&self) -> Names {
        Names {
            broker: self.broker.title().into(),
            store: self.store.title().into(),
            fault: self.fault.title().into(),
            runner: self.runner.title().into(),
            command: self.command(),
            limits: self.broker.limits().map(Into::into),
        }
    }

    /// This spec with `runner`'s consumers.
    pub fn by(self, runner: RunnerKind) -> Self {
        Self { runner, ..self }
    }

    /// Why this spec cannot run, if it cannot.
    pub fn unfit(&self) -> Option<&'static str> {
        let http = matches!(self.broker, Broker::Proxy | Broker::Serve);
        let http_fault = matches!(
            self.fault,
            Fault::ClientCuts | Fault::ProxyKill | Fault::ServeKill
        );
        if http != http_fault {
            return Some(
                "client-cuts, proxy-kill and serve-kill are the HTTP runs' faults \
                 (--broker proxy or serve), and only they",
            );
        }
        if (self.broker == Broker::Proxy && self.fault == Fault::ServeKill)
            || (self.broker == Broker::Serve && self.fault == Fault::ProxyKill)
        {
            return Some("proxy-kill is the gateway's, serve-kill the service's");
        }
        if self.store == StoreKind::Memory
            && matches!(self.fault, Fault::ProxyKill | Fault::ServeKill)
        {
            return Some("a killed server takes the memory store with it");
        }
        if http {
            return (self.runner != RunnerKind::Sidecar)
                .then_some("the HTTP runs have no consumers");
        }
        if self.runner != RunnerKind::Sidecar {
            if !matches!(
                self.broker,
                Broker::RedisStreams | Broker::Amqp | Broker::Nats
            ) {
                return Some("the library worker reads Redis Streams, RabbitMQ and NATS");
            }
            let sql = matches!(self.store, StoreKind::Postgres | StoreKind::MariaDb);
            if self.runner == RunnerKind::Inbox && !sql {
                return Some("the inbox lives in the SQL store's database: PostgreSQL or MariaDB");
            }
            if !sql
                && !matches!(
                    self.store,
                    StoreKind::Memory | StoreKind::Redis | StoreKind::RedisAof
                )
            {
                return Some("the library worker runs on the memory, Redis and SQL stores");
            }
        }
        if self.fault == Fault::Nemesis && self.nemesis_kinds().len() < 2 {
            return Some("a nemesis needs at least two kinds of fault that fit");
        }
        if self.broker == Broker::Kafka && self.fault == Fault::Zombie {
            return Some(
                "tansu never gives a stopped member's partitions to another member: no one \
                 can take the key over",
            );
        }
        if matches!(
            self.fault,
            Fault::BrokerCut | Fault::BrokerSlow | Fault::BrokerPartition
        ) && let Some(why) = self.broker.unproxied()
        {
            return Some(why);
        }
        if matches!(self.fault, Fault::BrokerRestart)
            && let Some(why) = self.broker.unrestartable()
        {
            return Some(why);
        }
        self.fault.unfit(self.store)
    }
}

/// The step the current run is at, for the report when one hangs.
static STAGE: std::sync::Mutex<&str> = std::sync::Mutex::new("starting");

/// Records the step the run is at.
pub fn at(stage: &'static str) {
    *STAGE.lock().unwrap_or_else(|e| e.into_inner()) = stage;
}

/// Whether the current run is still starting its store, broker and
/// consumers: an error there means a service is absent.
pub fn setting_up() -> bool {
    stage().starts_with("starting") || stage().starts_with("opening")
}

/// The step the current run is at.
pub fn stage() -> &'static str {
    *STAGE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Messages each consumer process handles at once.
pub const CONCURRENCY: usize = 4;

/// Handler calls a message gets before it is dead-lettered.
pub const MAX_ATTEMPTS: u32 = 10;
