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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::routing::post;
use http::{HeaderMap, StatusCode};
use parking_lot::Mutex;
use tokio::sync::mpsc;

use crate::fault::{Action, Plan};
use crate::fleet::{Procs, signal};
use crate::record::{Call, End, Injected, Link, Lost, Record};

/// Something the run must do for the sink: restart a killed consumer,
/// publish another copy of a key.
#[derive(Debug)]
pub enum Event {
    Killed(usize),
    Duplicate(String),
}

/// What the sink keeps: the run's record as it grows, and the state the
/// run and the faults need.
#[derive(Default)]
pub struct Ledger {
    pub record: Record,
    pub in_flight: usize,
    pub last_call: Option<Duration>,
    /// Keys with at least one plain effect.
    pub applied: usize,
    /// When the last fault's effects ended.
    pub last_fault: Option<Duration>,
    plan: Plan,
    /// Highest token the fenced sink applied, per key.
    fence: HashMap<String, u64>,
    /// Highest token that reached the fenced sink, per key: a holder
    /// shows its token to the resource first, as a lock service's client
    /// does, and a write below it is refused.
    seen: HashMap<String, u64>,
    /// Keys whose new holders' writes wait for a stopped holder's late
    /// write, with the stopped process.
    held: HashMap<String, u32>,
}

impl Ledger {
    /// Applies `key`'s write with `token` to both sinks; answers whether
    /// the fenced one took it.
    fn apply(&mut self, key: &str, call: usize, token: u64) -> bool {
        let fenced = self.fence.get(key).is_none_or(|top| token > *top)
            && self.seen.get(key).is_none_or(|top| token >= *top);
        if fenced {
            self.fence.insert(key.to_owned(), token);
        }
        let calls = self
            .record
            .keys
            .get_mut(key)
            .expect("the call was recorded");
        if !calls.iter().any(|c| c.effect) {
            self.applied += 1;
        }
        let c = &mut calls[call];
        c.effect = true;
        c.fenced = fenced;
        fenced
    }

    fn end(&mut self, key: &str, call: usize, end: End, at: Duration) {
        let c = &mut self
            .record
            .keys
            .get_mut(key)
            .expect("the call was recorded")[call];
        if c.end == End::InFlight {
            c.end = end;
            c.ended = Some(at);
            self.in_flight -= 1;
        }
    }

    /// Notes a fault in the ledger, its effects lasting until `last`.
    pub fn fault(&mut self, fault: Injected) {
        self.last_fault = self.last_fault.max(Some(fault.last()));
        self.record.faults.push(fault);
    }

    /// Marks every open call of `process` killed.
    fn killed(&mut self, process: u32, at: Duration) {
        self.fault(Injected::Kill { process, at });
        let mut closed = 0;
        for c in self.record.keys.values_mut().flatten() {
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
    /// Whether a successful call is answered with [`HEAVY_ANSWER`] bytes.
    heavy: AtomicBool,
}

/// The size of a heavy answer: more than the last page of each of a
/// store's files holds, so that storing it as the outcome needs room on
/// the disk.
const HEAVY_ANSWER: usize = 64 << 10;

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
            heavy: AtomicBool::new(false),
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

    /// Notes that the store lost the records `lost` now.
    pub fn lost(&self, lost: Lost) {
        let at = self.now();
        self.with(|l| {
            l.fault(Injected::Loss { at, lost });
            l.record.injected += 1;
        });
    }

    /// Notes that `link` was disrupted from `from` to now.
    pub fn disrupted(&self, link: Link, from: Duration) {
        let to = self.now();
        self.with(|l| {
            l.fault(Injected::Disrupted { link, from, to });
            l.record.injected += 1;
        });
    }

    /// SIGKILLs every consumer, as an orchestrator replaces failing
    /// processes; the run restarts each.
    pub fn kill_every_consumer(&self) {
        for (slot, process) in self.shared.procs.every_running() {
            self.shared.kill(slot, process);
        }
    }

    /// Notes that the disk under the store was full from `from`, and that
    /// it was freed and the store restarted now.
    pub fn disk_freed(&self, from: Duration) {
        let to = self.now();
        self.with(|l| {
            l.fault(Injected::DiskFull { from, to });
            l.record.injected += 1;
        });
    }

    /// With `on`, answers each successful call with [`HEAVY_ANSWER`] bytes,
    /// which the consumer stores as its outcome: on a full disk the store's
    /// next completion then needs a new page, and is refused at once rather
    /// than after the few kilobytes the last page of its files still holds.
    pub fn heavy_answers(&self, on: bool) {
        self.shared.heavy.store(on, Ordering::Relaxed);
    }

    /// Notes `fault` in the ledger without counting it as a fault of its
    /// own (a part of one counted already).
    pub fn note(&self, fault: Injected) {
        self.with(|l| l.fault(fault));
    }

    /// Notes that the store was slower than the lease from `from` to now.
    pub fn slowed(&self, from: Duration) {
        let to = self.now();
        self.with(|l| {
            l.fault(Injected::SlowStore { from, to });
            l.record.injected += 1;
        });
    }

    /// Stops serving and hands over the record.
    pub fn finish(self) -> Record {
        self.server.abort();
        std::mem::take(&mut self.shared.ledger.lock().record)
    }
}

fn header<T: std::str::FromStr>(h: &HeaderMap, name: &str) -> Option<T> {
    h.get(name)?.to_str().ok()?.parse().ok()
}

/// `POST /c/{slot}/{process}`: one handler call of consumer `slot`'s
/// process `process`.
async fn call(
    State(s): State<Arc<Shared>>,
    path: Path<(usize, u32)>,
    headers: HeaderMap,
) -> (StatusCode, Vec<u8>) {
    let status = handle(&s, path, headers).await;
    let heavy = status.is_success() && s.heavy.load(Ordering::Relaxed);
    (
        status,
        if heavy {
            vec![b'x'; HEAVY_ANSWER]
        } else {
            Vec::new()
        },
    )
}

async fn handle(
    s: &Arc<Shared>,
    Path((slot, process)): Path<(usize, u32)>,
    headers: HeaderMap,
) -> StatusCode {
    let (Some(key), Some(token), Some(attempt)) = (
        header::<String>(&headers, "idempotency-key"),
        header::<u64>(&headers, "idem-fencing-token"),
        header::<u32>(&headers, "idem-attempt"),
    ) else {
        s.ledger.lock().record.malformed += 1;
        return StatusCode::BAD_REQUEST;
    };
    let now = s.now();
    let (index, action) = {
        let mut l = s.ledger.lock();
        let index = l.record.calls;
        l.record.calls += 1;
        l.in_flight += 1;
        l.last_call = Some(now);
        let seen = l.seen.entry(key.clone()).or_default();
        *seen = token.max(*seen);
        let calls = l.record.keys.entry(key.clone()).or_default();
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
            l.record.injected += 1;
        }
        (index_in_key, action)
    };
    match action {
        Action::Apply { duplicate } => {
            if duplicate {
                let _ = s.events.send(Event::Duplicate(key.clone()));
            }
            unheld(s, &key, process).await;
            answer(s, &key, index, token)
        }
        Action::Slow { per_mille } => {
            // Another copy while the handler works: its consumer must find
            // the key held, however long the work takes.
            let _ = s.events.send(Event::Duplicate(key.clone()));
            tokio::time::sleep(s.lease * per_mille / 1000).await;
            answer(s, &key, index, token)
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
            let status = answer(s, &key, index, token);
            // The answer is on its way; the kill lands while the consumer
            // stores the outcome or acks.
            let s = s.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(2)).await;
                s.kill(slot, process);
            });
            status
        }
        Action::Zombie => zombie(s, slot, process, &key, index, token).await,
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
/// published (one a lease, until another consumer has taken the key over:
/// see below), waits for that takeover, then
/// lets the stopped caller's write arrive late, resumes it, and answers.
/// Every other stop lets the late write land after the new holder's write
/// (the new holder's token already applied); the others, after the new
/// holder's call has shown its token but before its write, which waits.
/// Either way the fenced sink must refuse the late write.
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
    let from = s.now();
    let (fault, before_write) = {
        let mut l = s.ledger.lock();
        let before_write = l.record.stops().count() % 2 == 1;
        if before_write {
            l.held.insert(key.to_owned(), process);
        }
        l.fault(Injected::Stop {
            process,
            key: key.to_owned(),
            from,
            to: None,
        });
        (l.record.faults.len() - 1, before_write)
    };
    let deadline = Instant::now() + s.lease * 4 + Duration::from_secs(30);
    // A copy a lease until another consumer takes the key over: a broker
    // that pushes messages (RabbitMQ) may hand a copy to the stopped
    // consumer itself, whose prefetch has room, and there it stays.
    let mut next_copy = Instant::now();
    while Instant::now() < deadline {
        let taken_over = s.ledger.lock().record.keys[key]
            .iter()
            .any(|c| c.process != process && (before_write || c.effect));
        if taken_over {
            break;
        }
        if Instant::now() >= next_copy {
            let _ = s.events.send(Event::Duplicate(key.to_owned()));
            next_copy = Instant::now() + s.lease;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = answer(s, key, index, token);
    s.ledger.lock().held.remove(key);
    signal(pid, libc::SIGCONT);
    let now = s.now();
    let mut l = s.ledger.lock();
    if let Injected::Stop { to, .. } = &mut l.record.faults[fault] {
        *to = Some(now);
    }
    l.last_fault = l.last_fault.max(Some(now));
    l.plan.resumed();
    status
}

/// Waits while a stopped holder other than `process` holds `key`'s
/// writes back (see [`zombie`]), four leases at most.
async fn unheld(s: &Shared, key: &str, process: u32) {
    let deadline = Instant::now() + s.lease * 4;
    while Instant::now() < deadline && s.ledger.lock().held.get(key).is_some_and(|&p| p != process)
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
