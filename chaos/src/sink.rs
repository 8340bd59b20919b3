//! The sink: the HTTP handler every consumer calls (`idem consume --to`),
//! which records each call and its effect, and injects the run's faults at
//! the moment they are meant to happen (a consumer killed after `begin`,
//! after its effect, after its answer; stopped mid-call).
//!
//! One stream of writes, two sinks over it:
//! - **plain**: every write is an effect (an append, an email sent);
//! - **fenced**: a write is applied only if its fencing token is above
//!   every token already applied for its key, and refused (409) otherwise,
//!   as a store that checks idem's tokens would.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::fault::{Action, Plan};
use crate::fleet::Procs;

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

/// Something the run must do for the sink: restart a killed consumer,
/// publish another copy of a key.
#[derive(Debug)]
pub enum Event {
    Killed(usize),
    Duplicate(String),
}

/// Everything the sink saw.
#[derive(Default)]
pub struct Ledger {
    pub keys: HashMap<String, Vec<Call>>,
    pub calls: u64,
    pub in_flight: usize,
    pub last_call: Option<Duration>,
    /// Consumer processes killed: which, when.
    pub kills: Vec<(u32, Duration)>,
    /// Consumer processes stopped: which, from, to.
    pub stops: Vec<(u32, Duration, Option<Duration>)>,
    /// Keys with at least one plain effect.
    pub applied: usize,
    /// When the store lost its records (a restart without persistence).
    pub wipes: Vec<Duration>,
    /// When a store or broker link was cut, slowed or restarted: from, to.
    pub disruptions: Vec<(Duration, Duration)>,
    /// Faults injected.
    pub injected: u64,
    /// When the last kill, stop or wipe happened.
    pub last_fault: Option<Duration>,
    /// Calls with headers the sink could not read.
    pub malformed: u64,
    plan: Plan,
    /// Highest token the fenced sink applied, per key.
    fence: HashMap<String, u64>,
}

impl Ledger {
    /// Applies `key`'s write with `token` to both sinks; answers whether
    /// the fenced one took it.
    fn apply(&mut self, key: &str, call: usize, token: u64) -> bool {
        let fenced = self.fence.get(key).is_none_or(|top| token > *top);
        if fenced {
            self.fence.insert(key.to_owned(), token);
        }
        let calls = self.keys.get_mut(key).expect("the call was recorded");
        if !calls.iter().any(|c| c.effect) {
            self.applied += 1;
        }
        let c = &mut calls[call];
        c.effect = true;
        c.fenced = fenced;
        fenced
    }

    fn end(&mut self, key: &str, call: usize, end: End, at: Duration) {
        let c = &mut self.keys.get_mut(key).expect("the call was recorded")[call];
        if c.end == End::InFlight {
            c.end = end;
            c.ended = Some(at);
            self.in_flight -= 1;
        }
    }

    /// Marks every open call of `process` killed.
    fn killed(&mut self, process: u32, at: Duration) {
        self.kills.push((process, at));
        self.last_fault = Some(at);
        let mut closed = 0;
        for c in self.keys.values_mut().flatten() {
            if c.process == process && c.end == End::InFlight {
                c.end = End::Killed;
                c.ended = Some(at);
                closed += 1;
            }
        }
        self.in_flight -= closed;
    }
}

struct Shared {
    start: Instant,
    lease: Duration,
    ledger: Mutex<Ledger>,
    procs: Procs,
    events: mpsc::UnboundedSender<Event>,
}

impl Shared {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// SIGKILLs `process` of consumer `slot` and has the slot restarted
    /// (once: a second kill of a dead process only closes its calls).
    fn kill(&self, slot: usize, process: u32) {
        let pid = self.procs.take(slot, process);
        if let Some(pid) = pid {
            signal(pid, libc::SIGKILL);
        }
        self.ledger.lock().killed(process, self.now());
        if pid.is_some() {
            let _ = self.events.send(Event::Killed(slot));
        }
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

/// The running sink.
pub struct Sink {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Sink {
    /// Starts the sink on a free loopback port.
    pub async fn start(
        plan: Plan,
        lease: Duration,
        procs: Procs,
        events: mpsc::UnboundedSender<Event>,
    ) -> Result<Self, String> {
        let shared = Arc::new(Shared {
            start: Instant::now(),
            lease,
            ledger: Mutex::new(Ledger {
                plan,
                ..Ledger::default()
            }),
            procs,
            events,
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("the sink cannot listen: {e}"))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let app = axum::Router::new()
            .route("/c/{slot}/{process}", post(call))
            .with_state(shared.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self {
            addr,
            shared,
            server,
        })
    }

    /// The handler URL, to which each consumer adds `/{slot}/{process}`.
    pub fn url(&self) -> String {
        format!("http://{}/c", self.addr)
    }

    /// Time since the run started.
    pub fn now(&self) -> Duration {
        self.shared.now()
    }

    /// Reads the ledger.
    pub fn with<T>(&self, f: impl FnOnce(&mut Ledger) -> T) -> T {
        f(&mut self.shared.ledger.lock())
    }

    /// Notes that the store lost its records now.
    pub fn wiped(&self) {
        let now = self.now();
        self.with(|l| {
            l.wipes.push(now);
            l.last_fault = Some(now);
            l.injected += 1;
        });
    }

    /// Notes that a link to the store or the broker was disrupted from
    /// `from` to `to`.
    pub fn disrupted(&self, from: Duration, to: Duration) {
        self.with(|l| {
            l.disruptions.push((from, to));
            l.last_fault = Some(to);
        });
    }

    /// Notes that the store restarted now, keeping its records.
    pub fn restarted(&self) {
        let now = self.now();
        self.with(|l| {
            l.last_fault = Some(now);
            l.injected += 1;
        });
    }

    /// Stops serving and hands over the ledger.
    pub fn finish(self) -> Ledger {
        self.server.abort();
        std::mem::take(&mut *self.shared.ledger.lock())
    }
}

fn header<T: std::str::FromStr>(h: &HeaderMap, name: &str) -> Option<T> {
    h.get(name)?.to_str().ok()?.parse().ok()
}

/// `POST /c/{slot}/{process}`: one handler call of consumer `slot`'s
/// process `process`.
async fn call(
    State(s): State<Arc<Shared>>,
    Path((slot, process)): Path<(usize, u32)>,
    headers: HeaderMap,
) -> StatusCode {
    let (Some(key), Some(token), Some(attempt)) = (
        header::<String>(&headers, "idempotency-key"),
        header::<u64>(&headers, "idem-fencing-token"),
        header::<u32>(&headers, "idem-attempt"),
    ) else {
        s.ledger.lock().malformed += 1;
        return StatusCode::BAD_REQUEST;
    };
    let now = s.now();
    let (index, action) = {
        let mut l = s.ledger.lock();
        let index = l.calls;
        l.calls += 1;
        l.in_flight += 1;
        l.last_call = Some(now);
        let calls = l.keys.entry(key.clone()).or_default();
        let first = calls.is_empty();
        let index_in_key = calls.len();
        calls.push(Call {
            slot,
            process,
            token,
            attempt,
            arrived: now,
            ended: None,
            end: End::InFlight,
            effect: false,
            fenced: false,
        });
        let action = l.plan.action(index, &key, attempt, first);
        if action.is_fault() {
            l.injected += 1;
        }
        (index_in_key, action)
    };
    match action {
        Action::Apply { duplicate } => {
            if duplicate {
                let _ = s.events.send(Event::Duplicate(key.clone()));
            }
            answer(&s, &key, index, token)
        }
        Action::Fail => {
            s.ledger
                .lock()
                .end(&key, index, End::Answered(503), s.now());
            StatusCode::SERVICE_UNAVAILABLE
        }
        Action::Refuse => {
            s.ledger
                .lock()
                .end(&key, index, End::Answered(422), s.now());
            StatusCode::UNPROCESSABLE_ENTITY
        }
        Action::KillBeforeEffect => {
            s.kill(slot, process);
            StatusCode::INTERNAL_SERVER_ERROR
        }
        Action::KillAfterEffect => {
            s.ledger.lock().apply(&key, index, token);
            s.kill(slot, process);
            StatusCode::INTERNAL_SERVER_ERROR
        }
        Action::KillAfterAnswer => {
            let status = answer(&s, &key, index, token);
            // The answer is on its way; the kill lands while the consumer
            // stores the outcome or acks.
            let s = s.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                s.kill(slot, process);
            });
            status
        }
        Action::Zombie => zombie(&s, slot, process, &key, index, token).await,
    }
}

/// Applies the call's write, ends it, and answers as the fenced sink does.
fn answer(s: &Shared, key: &str, index: usize, token: u64) -> StatusCode {
    let mut l = s.ledger.lock();
    let status = if l.apply(key, index, token) {
        StatusCode::OK
    } else {
        StatusCode::CONFLICT
    };
    l.end(key, index, End::Answered(status.as_u16()), s.now());
    status
}

/// Stops the caller (SIGSTOP) mid-call, has another copy of its message
/// published, waits until another consumer has taken the key over and
/// applied its effect (or four leases), then lets the stopped caller's
/// write arrive late, resumes it, and answers.
async fn zombie(
    s: &Arc<Shared>,
    slot: usize,
    process: u32,
    key: &str,
    index: usize,
    token: u64,
) -> StatusCode {
    let Some(pid) = s.procs.running(slot, process) else {
        s.ledger.lock().plan.resumed();
        return answer(s, key, index, token);
    };
    signal(pid, libc::SIGSTOP);
    let stopped_at = s.now();
    let stop = {
        let mut l = s.ledger.lock();
        l.stops.push((process, stopped_at, None));
        l.stops.len() - 1
    };
    let _ = s.events.send(Event::Duplicate(key.to_owned()));
    let deadline = Instant::now() + s.lease * 4 + Duration::from_secs(30);
    while Instant::now() < deadline {
        let taken_over = s.ledger.lock().keys[key]
            .iter()
            .any(|c| c.process != process && c.effect);
        if taken_over {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = answer(s, key, index, token);
    signal(pid, libc::SIGCONT);
    let now = s.now();
    let mut l = s.ledger.lock();
    l.stops[stop].2 = Some(now);
    l.last_fault = Some(now);
    l.plan.resumed();
    status
}
