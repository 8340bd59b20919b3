//! The judge: reads a run's record (the history and the fault ledger,
//! [`crate::record`]) and what the run was asked to do ([`Facts`]), and
//! says whether idem kept its promise. It knows nothing of how a run is
//! driven.
//!
//! Every double effect is either explained by one fault of the ledger
//! under a rule named after the contract's own limit, or a failure:
//!
//! - **kill**: the earlier holder's process was killed inside its claim
//!   of the key (from its `begin` to a lease after its call ended: a
//!   `complete` that has not landed by then is refused);
//! - **stop**: the earlier holder's process was stopped inside its claim,
//!   or within a lease after it (its lease then ran out while it slept);
//! - **loss**: the store lost the key's record after the earlier effect
//!   and before the later claim (a Redis without persistence restarted; a
//!   failed Redis Cluster master's unreplicated writes);
//! - **slow store**: the store was slower than the lease while the earlier
//!   claim was live, so its renewals could not land;
//! - **rolled back** (transactional runs only): the earlier holder's
//!   transaction never committed (its token has no committed effect row),
//!   so its call to the sink, made inside it, was undone as far as the
//!   business row goes; the committed rows are judged on their own, and
//!   nothing explains a second one.
//!
//! A cut, slowed or restarted broker link, a store connection cut, a
//! session ended outside a transactional run and a restart of a store that
//! keeps what it acknowledged explain nothing. Each fault explains at most
//! one double per claim it cut: the row's bound.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::record::{Call, End, Injected, Record};

/// How long a claim may take to reach the sink after `begin`: a
/// transaction opened at `begin` can lose its session before the call.
const BEGIN_TO_CALL: Duration = Duration::from_millis(250);

/// The names a row is shown under, and the command that runs it again.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Names {
    pub broker: Cow<'static, str>,
    pub store: Cow<'static, str>,
    pub fault: Cow<'static, str>,
    pub runner: Cow<'static, str>,
    pub command: String,
    /// What this broker cannot do, said beside its rows.
    pub limits: Option<Cow<'static, str>>,
}

/// What the judge is told besides the record.
pub struct Facts {
    pub names: Names,
    pub consumers: usize,
    /// Claims one consumer process holds at most at once (its
    /// `--concurrency`: a claim keeps its permit until it is completed or
    /// released).
    pub concurrency: usize,
    /// Every message the run sent, by key.
    pub keys: Vec<String>,
    /// The poison keys, each with the calls it must get before it is
    /// dead-lettered.
    pub poison: HashMap<String, usize>,
    /// Extra copies the producer sent.
    pub copies: u64,
    pub lease: Duration,
    /// In a run whose sink is called inside the inbox's transaction: the
    /// tokens of the committed effect rows, per key.
    pub committed: Option<HashMap<String, Vec<u64>>>,
    /// Consumers that did not stop within the grace at the end.
    pub forced_stops: usize,
    pub elapsed: Duration,
}

/// Why a double effect was allowed.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Reasons {
    pub kill: u64,
    pub stop: u64,
    pub loss: u64,
    pub slow_store: u64,
    pub disk_full: u64,
    pub rolled_back: u64,
}

impl Reasons {
    fn count(&mut self, reason: Reason) {
        match reason {
            Reason::Kill => self.kill += 1,
            Reason::Stop => self.stop += 1,
            Reason::Loss => self.loss += 1,
            Reason::SlowStore => self.slow_store += 1,
            Reason::DiskFull => self.disk_full += 1,
            Reason::RolledBack => self.rolled_back += 1,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    Kill,
    Stop,
    Loss,
    SlowStore,
    DiskFull,
    RolledBack,
}

/// What one run showed.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub names: Names,
    pub consumers: usize,
    /// Distinct messages published.
    pub sent: usize,
    /// Extra copies the producer published (requests retried, for the
    /// HTTP runs).
    pub duplicates: u64,
    /// Faults injected.
    pub injected: u64,
    /// Handler calls.
    pub calls: u64,
    /// Writes the plain sink applied.
    pub effects: u64,
    /// Messages without an effect at the end.
    pub lost: usize,
    /// Dead letters read back from the broker.
    pub dead_letters: Option<usize>,
    /// Plain-sink writes beyond the first of their key.
    pub doubled_plain: u64,
    /// Of those, how many no injected fault explains.
    pub unexplained: u64,
    /// The explained ones, by the rule that allowed each.
    pub reasons: Reasons,
    /// How many doubles the run's faults could explain at most: the
    /// claims open at each kill, stop, slow period or ended session, and
    /// the keys whose records a store lost.
    pub bound: u64,
    /// Fenced-sink writes beyond the first of their key.
    pub doubled_fenced: u64,
    /// Of those, how many no fault explains.
    pub unexplained_fenced: u64,
    /// Writes the fenced sink refused (a stale token).
    pub refused: u64,
    /// In a run with the transactional sink: committed effect rows beyond
    /// the first of their key (none is explained: the inbox must hold).
    pub doubled_inbox: Option<u64>,
    /// Calls the final copy of every key caused (none unless a store lost
    /// the key's record).
    pub replayed: Option<u64>,
    /// Calls whose token was not above every earlier call's of their key.
    pub token_order: u64,
    /// Calls that arrived while another holder of their key was alive.
    pub two_holders: u64,
    /// Longest time from a kill or stop to the next call of a key it held,
    /// in ms: how long a stuck `in_progress` record took to recover.
    pub recover_ms: Option<u64>,
    pub seconds: f64,
    /// Up to ten examples of what went wrong.
    pub problems: Vec<String>,
    /// Whether the run had a fenced sink (the gateway's upstream gets no
    /// token).
    pub fenced: bool,
}

impl Outcome {
    /// An outcome of `names` with nothing counted yet.
    pub fn empty(names: Names, consumers: usize, sent: usize, elapsed: Duration) -> Self {
        Self {
            names,
            consumers,
            sent,
            duplicates: 0,
            injected: 0,
            calls: 0,
            effects: 0,
            lost: 0,
            dead_letters: None,
            doubled_plain: 0,
            unexplained: 0,
            reasons: Reasons::default(),
            bound: 0,
            doubled_fenced: 0,
            unexplained_fenced: 0,
            refused: 0,
            doubled_inbox: None,
            replayed: None,
            token_order: 0,
            two_holders: 0,
            recover_ms: None,
            seconds: elapsed.as_secs_f64(),
            problems: Vec::new(),
            fenced: true,
        }
    }

    /// A run that could not finish: a failed row with its reason.
    pub fn failed(names: Names, reason: String) -> Self {
        let mut o = Self::empty(names, 0, 0, Duration::ZERO);
        o.problems.push(format!("the run did not finish: {reason}"));
        o
    }

    /// Notes what went wrong, keeping the first ten examples.
    pub fn problem(&mut self, text: String) {
        if self.problems.len() < 10 {
            self.problems.push(text);
        }
    }

    /// Whether the run kept idem's promise.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// The span of a call's claim: from its `begin` (up to [`BEGIN_TO_CALL`]
/// before the call) to a lease after the call ended, when a `complete`
/// that has not landed is refused. An open call's claim lasts to the end.
fn claim(c: &Call, lease: Duration) -> (Duration, Duration) {
    let end = c.ended.map_or(Duration::MAX, |e| e.saturating_add(lease));
    (c.arrived.saturating_sub(BEGIN_TO_CALL), end)
}

fn within(t: Duration, (from, to): (Duration, Duration)) -> bool {
    from <= t && t <= to
}

/// Why `later` may run the effect of key `held` again after `earlier`:
/// the fault of `faults` (its index) that explains it and the rule, or,
/// in a transactional run, no fault: the earlier transaction never
/// committed. `fenced` asks for the fenced sink, where the stop of a
/// holder in its call of this key explains a write only if it landed
/// before the stop (the late write must be refused); the stopped
/// process's other calls wrote when they were sent.
fn explain(
    faults: &[Injected],
    facts: &Facts,
    held: &str,
    earlier: &Call,
    later: &Call,
    fenced: bool,
) -> Option<(Option<usize>, Reason)> {
    if rolled_back(facts, held, earlier) {
        return Some((None, Reason::RolledBack));
    }
    let span = claim(earlier, facts.lease);
    let written = earlier.ended.unwrap_or(earlier.arrived);
    faults.iter().enumerate().find_map(|(i, f)| {
        let reason = match *f {
            Injected::Kill { process, at } if process == earlier.process && within(at, span) => {
                Reason::Kill
            }
            Injected::Stop {
                process,
                ref key,
                from,
                ..
            } if process == earlier.process
                && within(from, (span.0, span.1.saturating_add(facts.lease)))
                && (!fenced || key != held || written <= from) =>
            {
                Reason::Stop
            }
            Injected::Loss { at, ref lost }
                if lost.holds(held) && written <= at && later.arrived >= at =>
            {
                Reason::Loss
            }
            Injected::SlowStore { from, to } if from <= span.1 && span.0 <= to => Reason::SlowStore,
            // docs/guarantees.md, "When the disk fills up": a claim live
            // while the store refused writes may have had its `complete`
            // refused, and runs again after the store's restart.
            Injected::DiskFull { from, to } if from <= span.1 && span.0 <= to => Reason::DiskFull,
            _ => return None,
        };
        Some((Some(i), reason))
    })
}

/// The links disrupted during `span`, said after an unexplained double:
/// none of them explains it.
fn disrupted_during(record: &Record, (start, end): (Duration, Duration)) -> String {
    let links: Vec<String> = record
        .faults
        .iter()
        .filter_map(|f| match *f {
            Injected::Disrupted { link, from, to } if from <= end && start <= to => {
                Some(format!("{link:?} from {from:?} to {to:?}"))
            }
            _ => None,
        })
        .collect();
    if links.is_empty() {
        String::new()
    } else {
        format!(
            " (disrupted then, which explains no double: {})",
            links.join(", ")
        )
    }
}

/// Whether `call`'s transaction never committed, in a transactional run.
fn rolled_back(facts: &Facts, key: &str, call: &Call) -> bool {
    facts.committed.as_ref().is_some_and(|committed| {
        !committed
            .get(key)
            .is_some_and(|tokens| tokens.contains(&call.token))
    })
}

/// How many claims each fault of `record` could have cut: the keys with a
/// call live at a kill or stop of its process (no more than the claims a
/// process holds at once) or at a slow period or a full disk (no more than
/// every process's); the keys a loss held that had an effect before it.
/// Faults that explain nothing count none.
fn claims_cut(record: &Record, facts: &Facts) -> Vec<u64> {
    let lease = facts.lease;
    let one = facts.concurrency as u64;
    let all = one * facts.consumers as u64;
    let keys_where = |f: &dyn Fn(&Call) -> bool| {
        record
            .keys
            .values()
            .filter(|calls| calls.iter().any(f))
            .count() as u64
    };
    record
        .faults
        .iter()
        .map(|f| match *f {
            Injected::Kill { process, at } => {
                keys_where(&|c| c.process == process && within(at, claim(c, lease))).min(one)
            }
            Injected::Stop { process, from, .. } => keys_where(&|c| {
                let (a, b) = claim(c, lease);
                c.process == process && within(from, (a, b.saturating_add(lease)))
            })
            .min(one),
            Injected::Loss { at, ref lost } => record
                .keys
                .iter()
                .filter(|(k, calls)| {
                    lost.holds(k)
                        && calls
                            .iter()
                            .any(|c| c.effect && c.ended.is_some_and(|e| e <= at))
                })
                .count() as u64,
            Injected::SlowStore { from, to } | Injected::DiskFull { from, to } => {
                keys_where(&|c| {
                    let (a, b) = claim(c, lease);
                    from <= b && a <= to
                })
                .min(all)
            }
            Injected::Disrupted { .. } => 0,
        })
        .collect()
}

/// Checks the record of a run against what it was asked to do.
pub fn judge(facts: &Facts, record: &Record) -> Outcome {
    let mut o = Outcome::empty(
        facts.names.clone(),
        facts.consumers,
        facts.keys.len(),
        facts.elapsed,
    );
    o.duplicates = facts.copies;
    o.injected = record.injected;
    o.calls = record.calls;
    for key in &facts.keys {
        if facts.poison.contains_key(key) {
            if let Some(calls) = record.keys.get(key)
                && calls.iter().any(|c| c.effect)
            {
                o.problem(format!("{key}: a poison message had an effect"));
            }
            continue;
        }
        let Some(calls) = record.keys.get(key) else {
            o.lost += 1;
            o.problem(format!("{key}: never handled"));
            continue;
        };
        if !calls.iter().any(|c| c.effect) {
            o.lost += 1;
            o.problem(format!("{key}: {} calls, no effect", calls.len()));
        }
    }
    if record.malformed > 0 {
        o.problem(format!(
            "{} handler calls came without a readable key, token or attempt header",
            record.malformed
        ));
    }
    if facts.forced_stops > 0 {
        o.problem(format!(
            "{} consumers did not stop within the shutdown grace and were killed",
            facts.forced_stops
        ));
    }
    let cut = claims_cut(record, facts);
    // Effects whose transaction never committed: the database says which.
    let rolled: u64 = record
        .keys
        .iter()
        .map(|(k, calls)| {
            calls
                .iter()
                .filter(|c| c.effect && rolled_back(facts, k, c))
                .count() as u64
        })
        .sum();
    o.bound = cut.iter().sum::<u64>() + rolled;
    let mut charged = vec![0u64; cut.len()];
    for (key, calls) in &record.keys {
        let mut order: Vec<&Call> = calls.iter().collect();
        order.sort_by_key(|c| c.arrived);
        // Effects in the order of their claims.
        let mut effects: Vec<&Call> = order.iter().copied().filter(|c| c.effect).collect();
        effects.sort_by_key(|c| c.token);
        o.effects += effects.len() as u64;
        for pair in effects.windows(2) {
            o.doubled_plain += 1;
            match explain(&record.faults, facts, key, pair[0], pair[1], false) {
                Some((fault, reason)) => {
                    o.reasons.count(reason);
                    if let Some(i) = fault {
                        charged[i] += 1;
                    }
                }
                None => {
                    o.unexplained += 1;
                    o.problem(format!(
                        "{key}: effect again (token {} after {}) with no fault inside the first claim to explain it{}",
                        pair[1].token,
                        pair[0].token,
                        disrupted_during(record, claim(pair[0], facts.lease))
                    ));
                }
            }
        }
        let fenced: Vec<&Call> = effects.iter().copied().filter(|c| c.fenced).collect();
        for pair in fenced.windows(2) {
            o.doubled_fenced += 1;
            if explain(&record.faults, facts, key, pair[0], pair[1], true).is_none() {
                o.unexplained_fenced += 1;
                o.problem(format!(
                    "{key}: the fenced sink took token {} after token {} with no fault to explain it",
                    pair[1].token, pair[0].token
                ));
            }
        }
        o.refused += calls.iter().filter(|c| c.effect && !c.fenced).count() as u64;

        let mut top = None;
        for c in &order {
            if top.is_some_and(|t| c.token <= t) {
                o.token_order += 1;
                o.problem(format!(
                    "{key}: token {} after {}",
                    c.token,
                    top.unwrap_or(0)
                ));
            }
            top = top.max(Some(c.token));
        }
        for (i, a) in order.iter().enumerate() {
            for b in &order[i + 1..] {
                if alive(record, facts.lease, a, b.arrived) {
                    o.two_holders += 1;
                    o.problem(format!(
                        "{key}: token {} (consumer {}, attempt {}) called {:?} after token {} (consumer {}), whose holder was alive",
                        b.token,
                        b.slot,
                        b.attempt,
                        b.arrived - a.arrived,
                        a.token,
                        a.slot
                    ));
                }
            }
        }
    }
    for (i, (&n, &bound)) in charged.iter().zip(&cut).enumerate() {
        if n > bound {
            o.problem(format!(
                "fault {i} ({:?}) explains {n} doubles, more than the {bound} claims it could cut",
                record.faults[i]
            ));
        }
    }
    judge_stops(&mut o, record);
    o.recover_ms = recovery(record).map(|d| d.as_millis() as u64);
    o
}

/// Every stop (a `zombie`) must end with another process taking the
/// stopped call's key over while it slept, and the stopped holder's late
/// write refused by the fenced sink.
fn judge_stops(o: &mut Outcome, record: &Record) {
    for (process, key, from, to) in record.stops() {
        let calls = record.keys.get(key).map_or(&[][..], Vec::as_slice);
        let Some(held) = calls
            .iter()
            .find(|c| c.process == process && c.arrived <= from)
        else {
            o.problem(format!(
                "{key}: the stop of consumer process {process} at {from:?} held no call of it"
            ));
            continue;
        };
        let to = to.unwrap_or(Duration::MAX);
        let taken_over = calls
            .iter()
            .any(|c| c.process != process && c.arrived > from && c.arrived <= to);
        if !taken_over {
            o.problem(format!(
                "{key}: its holder was stopped past its lease and no other consumer took it over"
            ));
        }
        if !held.effect || held.fenced {
            o.problem(format!(
                "{key}: the stopped holder's late write (token {}) was not refused by the fenced sink",
                held.token
            ));
        }
    }
}

/// Whether the holder of call `a` was alive at `t` and still meant to
/// hold its key: its call open then, its process neither killed since the
/// claim began nor stopped at `t`, and no slow store period or full disk
/// since its claim began that its renewals could not cross.
fn alive(record: &Record, lease: Duration, a: &Call, t: Duration) -> bool {
    let open = a.arrived <= t && (a.end == End::InFlight || a.ended.is_some_and(|e| e > t));
    if !open {
        return false;
    }
    let begun = claim(a, lease).0;
    !record.faults.iter().any(|f| match *f {
        Injected::Kill { process, at } => process == a.process && begun <= at && at <= t,
        Injected::Stop {
            process, from, to, ..
        } => process == a.process && from <= t && to.is_none_or(|to| t <= to),
        Injected::SlowStore { from, .. } => from <= t && begun <= from.saturating_add(lease),
        // The store refused renewals from the moment the disk filled.
        Injected::DiskFull { from, to } => from <= t && begun <= to,
        _ => false,
    })
}

/// Checks the transactional sink's committed effects (`rows`: effect rows
/// per key): one for every message, none for a poison message, no other
/// key. A key the sink saw applied but whose transaction never committed
/// is lost, whatever the plain sink says.
pub fn judge_inbox(
    o: &mut Outcome,
    facts: &Facts,
    record: &Record,
    rows: &HashMap<String, Vec<u64>>,
) {
    let mut doubled = 0;
    for key in &facts.keys {
        let n = rows.get(key).map_or(0, Vec::len) as u64;
        let poison = facts.poison.contains_key(key);
        match (poison, n) {
            (true, 0) | (false, 1) => {}
            (true, n) => o.problem(format!("{key}: a poison message committed {n} effects")),
            (false, 0) => {
                // A key the sink never applied is counted lost already.
                if record
                    .keys
                    .get(key)
                    .is_some_and(|calls| calls.iter().any(|c| c.effect))
                {
                    o.lost += 1;
                }
                o.problem(format!(
                    "{key}: no committed effect in the inbox's database"
                ));
            }
            (false, n) => {
                doubled += n - 1;
                o.problem(format!(
                    "{key}: {n} committed effects: the inbox let a second transaction through"
                ));
            }
        }
    }
    let known: HashSet<&str> = facts.keys.iter().map(String::as_str).collect();
    for key in rows.keys().filter(|k| !known.contains(k.as_str())) {
        o.problem(format!("{key:?}: an effect for a key the run never sent"));
    }
    o.doubled_inbox = Some(doubled);
}

/// Checks the dead letters read back after a run: every poison key there
/// exactly once, no other key (in a run without poison, none at all), no
/// dead letter for a message that had its effect, each refused message
/// called once and each failing one as often as its attempts allow.
pub fn judge_dead_letters(o: &mut Outcome, facts: &Facts, record: &Record, dead: &[String]) {
    o.dead_letters = Some(dead.len());
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for key in dead {
        *seen.entry(key.as_str()).or_default() += 1;
    }
    for key in &facts.keys {
        let effect = record
            .keys
            .get(key)
            .is_some_and(|calls| calls.iter().any(|c| c.effect));
        let Some(&wanted) = facts.poison.get(key) else {
            if seen.contains_key(key.as_str()) {
                o.problem(format!(
                    "{key}: dead-lettered, but its handler never refused it{}",
                    if effect {
                        ", and it had its effect"
                    } else {
                        ""
                    }
                ));
            }
            continue;
        };
        match seen.get(key.as_str()).copied().unwrap_or(0) {
            0 => o.problem(format!(
                "{key}: a poison message missing from the dead letters"
            )),
            1 => {}
            n => o.problem(format!("{key}: dead-lettered {n} times")),
        }
        let calls = record.keys.get(key).map_or(0, Vec::len);
        if calls != wanted {
            o.problem(format!(
                "{key}: poison message called {calls} times, not {wanted}"
            ));
        }
    }
    for key in seen.keys() {
        if !facts.keys.iter().any(|k| k == key) {
            o.problem(format!(
                "a dead letter that is no message of the run: {key}"
            ));
        }
    }
}

/// Checks what the final copy of every key caused: `calls` new handler
/// calls per key and `dead` new dead letters. A completed record answers
/// its copy without a call; only a key whose record a store lost may be
/// called again (and must then have its effect once more, not be dead-
/// lettered).
pub fn judge_replay(
    o: &mut Outcome,
    record: &Record,
    calls: &HashMap<String, u64>,
    dead: &[String],
) {
    o.replayed = Some(calls.values().sum());
    for (key, &n) in calls {
        let lost = record.faults.iter().any(|f| match f {
            Injected::Loss { lost, .. } => lost.holds(key),
            _ => false,
        });
        if !lost {
            o.problem(format!(
                "{key}: its final copy was handled again ({n} calls): the store had forgotten its completed record"
            ));
        }
    }
    for key in dead {
        o.problem(format!("{key}: its final copy was dead-lettered"));
    }
}

/// The longest time from a kill or a stop to the next call of a key whose
/// call it cut.
fn recovery(record: &Record) -> Option<Duration> {
    let stops: Vec<_> = record.stops().collect();
    let mut longest = None;
    for calls in record.keys.values() {
        for c in calls {
            let cut = match c.end {
                End::Killed => c.ended,
                _ => stops
                    .iter()
                    .find(|&&(p, _, from, _)| p == c.process && from >= c.arrived)
                    .filter(|&&(_, _, from, _)| c.ended.is_none_or(|e| e >= from))
                    .map(|&(_, _, from, _)| from),
            };
            let Some(cut) = cut else { continue };
            if let Some(next) = calls
                .iter()
                .filter(|n| n.arrived > cut && n.process != c.process)
                .map(|n| n.arrived)
                .min()
            {
                longest = longest.max(Some(next - cut));
            }
        }
    }
    longest
}

/// One effect of an HTTP run (`idem proxy`'s upstream, or an `idem serve`
/// client's).
#[derive(Clone, Copy, Debug)]
pub struct HttpEffect {
    /// When its claim began: the upstream call's start, or the `begin`
    /// the client sent.
    pub begun: Duration,
    /// When the effect was applied.
    pub applied: Duration,
    /// The fencing token (`idem serve`'s clients have one).
    pub token: Option<u64>,
    /// When its outcome was stored, where the run can tell (a `complete`
    /// answered 200).
    pub stored: Option<Duration>,
}

/// What an HTTP run recorded: each key's effects in the order applied,
/// every answer a client ended with, and the server's kills.
#[derive(Default)]
pub struct HttpRecord {
    pub effects: HashMap<String, Vec<HttpEffect>>,
    pub answers: HashMap<String, Vec<String>>,
    pub kills: Vec<Duration>,
}

/// Checks an HTTP run: every key answered; a second effect only where the
/// server was killed inside the first effect's claim (from its `begin` to
/// its outcome stored, or a lease after it was applied); tokens increasing;
/// and every answer a client got the last effect's, whose outcome was the
/// one stored (a completed record is final).
pub fn judge_http(o: &mut Outcome, facts: &Facts, http: &HttpRecord) {
    o.fenced = false;
    o.bound = 0;
    for &k in &http.kills {
        o.bound += http
            .effects
            .values()
            .filter(|e| e.iter().any(|e| within(k, http_claim(e, facts.lease))))
            .count() as u64;
    }
    for key in &facts.keys {
        let effects = http.effects.get(key).map_or(&[][..], Vec::as_slice);
        o.calls += effects.len() as u64;
        o.effects += effects.len() as u64;
        let got = http.answers.get(key).map_or(&[][..], Vec::as_slice);
        if effects.is_empty() {
            o.lost += 1;
            o.problem(format!("{key}: no effect"));
        }
        if got.is_empty() {
            o.problem(format!("{key}: no answer within the run's deadline"));
        }
        for pair in effects.windows(2) {
            o.doubled_plain += 1;
            let (first, again) = (pair[0], pair[1]);
            if let (Some(a), Some(b)) = (first.token, again.token)
                && b <= a
            {
                o.token_order += 1;
                o.problem(format!("{key}: token {b} after {a}"));
            }
            if http
                .kills
                .iter()
                .any(|&k| within(k, http_claim(&first, facts.lease)))
            {
                o.reasons.kill += 1;
            } else {
                o.unexplained += 1;
                o.problem(format!(
                    "{key}: the effect ran again with no kill inside the first effect's claim"
                ));
            }
        }
        let Some(last) = effects.last() else { continue };
        let n = effects.len();
        let wanted = match last.token {
            Some(token) => format!(r#"{{"effect":{n},"token":{token}}}"#),
            None => format!(r#""effect":{n}}}"#),
        };
        for answer in got {
            let answer = answer.replace(' ', "");
            let right = if last.token.is_some() {
                answer == wanted
            } else {
                answer.ends_with(&wanted)
            };
            if !right {
                o.problem(format!(
                    "{key}: a client got {answer}, not the stored outcome of effect {n} of {n}"
                ));
            }
        }
    }
}

/// The claim of an HTTP run's effect: from its `begin` to its outcome
/// stored, or a lease after it was applied.
fn http_claim(e: &HttpEffect, lease: Duration) -> (Duration, Duration) {
    let end = e.stored.unwrap_or(e.applied.saturating_add(lease));
    (e.begun, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Link, Lost};

    const LEASE: Duration = Duration::from_secs(2);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A call of `process` with `token`, open from `from` to `to` ms, its
    /// write applied (and taken by the fenced sink when `fenced`).
    fn call(process: u32, token: u64, from: u64, to: u64, fenced: bool) -> Call {
        Call {
            slot: 0,
            process,
            token,
            attempt: 1,
            arrived: ms(from),
            ended: Some(ms(to)),
            end: End::Answered(200),
            effect: true,
            fenced,
        }
    }

    fn facts(keys: &[&str]) -> Facts {
        Facts {
            names: Names {
                broker: "b".into(),
                store: "s".into(),
                fault: "f".into(),
                runner: "r".into(),
                command: String::new(),
                limits: None,
            },
            consumers: 2,
            concurrency: 4,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            poison: HashMap::new(),
            copies: 0,
            lease: LEASE,
            committed: None,
            forced_stops: 0,
            elapsed: ms(1000),
        }
    }

    fn record(calls: &[(&str, Call)], faults: &[Injected]) -> Record {
        let mut r = Record::default();
        for (key, c) in calls {
            r.keys.entry(key.to_string()).or_default().push(c.clone());
        }
        r.faults = faults.to_vec();
        r
    }

    fn judged(keys: &[&str], r: &Record) -> Outcome {
        judge(&facts(keys), r)
    }

    fn double() -> [(&'static str, Call); 2] {
        [
            ("a", call(1, 10, 0, 5, true)),
            ("a", call(2, 20, 9000, 9005, true)),
        ]
    }

    fn kill(process: u32, at: u64) -> Injected {
        Injected::Kill {
            process,
            at: ms(at),
        }
    }

    fn link(link: Link, at: u64) -> Injected {
        Injected::Disrupted {
            link,
            from: ms(at),
            to: ms(at + 10),
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let r = record(
            &[
                ("a", call(1, 10, 0, 5, true)),
                ("b", call(2, 11, 0, 5, true)),
            ],
            &[],
        );
        let o = judged(&["a", "b"], &r);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!((o.effects, o.lost, o.doubled_plain, o.bound), (2, 0, 0, 0));
    }

    #[test]
    fn a_message_without_an_effect_is_lost() {
        let r = record(&[("a", call(1, 10, 0, 5, true))], &[]);
        let o = judged(&["a", "b"], &r);
        assert_eq!(o.lost, 1);
        assert!(!o.passed());
    }

    #[test]
    fn a_double_effect_with_no_fault_behind_it_fails() {
        let o = judged(&["a"], &record(&double(), &[]));
        assert_eq!((o.doubled_plain, o.unexplained), (1, 1));
        assert_eq!((o.doubled_fenced, o.unexplained_fenced), (1, 1));
        assert!(!o.passed());
    }

    #[test]
    fn a_kill_inside_the_first_claim_explains_a_double_and_one_outside_does_not() {
        // Killed 10 ms after its call: inside the claim.
        let o = judged(&["a"], &record(&double(), &[kill(1, 10)]));
        assert_eq!((o.doubled_plain, o.unexplained, o.reasons.kill), (1, 0, 1));
        assert_eq!(o.bound, 1);
        assert!(o.passed(), "{:?}", o.problems);
        // Killed 3 s after: its complete had landed or been refused by
        // then; the kill cut nothing of this key.
        let o = judged(&["a"], &record(&double(), &[kill(1, 3000)]));
        assert_eq!((o.unexplained, o.bound), (1, 0));
        assert!(!o.passed());
        // The later holder's kill explains nothing.
        let o = judged(&["a"], &record(&double(), &[kill(2, 9003)]));
        assert_eq!(o.unexplained, 1);
    }

    #[test]
    fn a_kill_explaining_more_doubles_than_claims_a_process_holds_fails() {
        // Five keys, each run again after one kill of a process that holds
        // four claims at most.
        let mut calls = Vec::new();
        for (i, key) in ["a", "b", "c", "d", "e"].into_iter().enumerate() {
            let t = i as u64;
            calls.push((key, call(1, 10 + t, t, t + 5, true)));
            calls.push((key, call(2, 20 + t, 9000 + t, 9005 + t, true)));
        }
        let o = judged(&["a", "b", "c", "d", "e"], &record(&calls, &[kill(1, 10)]));
        assert_eq!((o.doubled_plain, o.unexplained, o.bound), (5, 0, 4));
        assert!(
            o.problems
                .iter()
                .any(|p| p.contains("more than the 4 claims")),
            "{:?}",
            o.problems
        );
    }

    #[test]
    fn link_faults_and_a_store_that_keeps_its_records_explain_nothing() {
        for l in [
            Link::StoreCut,
            Link::SessionsEnded,
            Link::StoreRestart,
            Link::BrokerCut,
            Link::BrokerSlow,
            Link::BrokerRestart,
        ] {
            let o = judged(&["a"], &record(&double(), &[link(l, 3)]));
            assert_eq!((o.unexplained, o.bound), (1, 0), "{l:?}");
        }
    }

    #[test]
    fn a_transaction_that_never_committed_explains_its_write_and_nothing_else() {
        let calls = [
            ("a", call(1, 10, 5000, 5005, true)),
            ("a", call(2, 20, 5300, 5305, true)),
        ];
        let mut f = facts(&["a"]);
        // The later holder's row committed: the earlier one's rolled back.
        f.committed = Some([("a".to_owned(), vec![20])].into());
        let o = judge(&f, &record(&calls, &[]));
        assert_eq!(
            (o.unexplained, o.reasons.rolled_back, o.bound),
            (0, 1, 1),
            "{:?}",
            o.problems
        );
        // The earlier row committed: the second write has no excuse.
        f.committed = Some([("a".to_owned(), vec![10])].into());
        let o = judge(&f, &record(&calls, &[]));
        assert_eq!(o.unexplained, 1);
        // Not a transactional run: nothing is rolled back.
        let o = judged(&["a"], &record(&calls, &[]));
        assert_eq!(o.unexplained, 1);
    }

    #[test]
    fn a_store_loss_explains_only_the_keys_it_held() {
        let loss = |lost| Injected::Loss { at: ms(100), lost };
        let o = judged(&["a"], &record(&double(), &[loss(Lost::Everything)]));
        assert_eq!((o.unexplained, o.reasons.loss, o.bound), (0, 1, 1));
        let only_b = Lost::Keys(["b".to_owned()].into());
        let o = judged(&["a"], &record(&double(), &[loss(only_b)]));
        assert_eq!((o.unexplained, o.bound), (1, 0));
        // A loss before the first effect lost nothing of it.
        let o = judged(
            &["a"],
            &record(
                &double(),
                &[Injected::Loss {
                    at: ms(1),
                    lost: Lost::Everything,
                }],
            ),
        );
        assert_eq!(o.unexplained, 1);
    }

    #[test]
    fn a_slow_store_explains_only_claims_live_during_it() {
        let slow = |from, to| Injected::SlowStore {
            from: ms(from),
            to: ms(to),
        };
        let o = judged(&["a"], &record(&double(), &[slow(1000, 5000)]));
        assert_eq!((o.unexplained, o.reasons.slow_store), (0, 1));
        let o = judged(&["a"], &record(&double(), &[slow(2500, 6500)]));
        assert_eq!(o.unexplained, 1);
    }

    #[test]
    fn a_full_disk_explains_only_claims_live_while_it_was_full() {
        let full = |from, to| Injected::DiskFull {
            from: ms(from),
            to: ms(to),
        };
        let o = judged(&["a"], &record(&double(), &[full(1000, 5000)]));
        assert_eq!((o.unexplained, o.reasons.disk_full, o.bound), (0, 1, 1));
        // Filled once the claim was over (its complete stored or refused):
        // an acknowledged completion is kept, so nothing explains the copy
        // running again.
        let o = judged(&["a"], &record(&double(), &[full(2500, 6500)]));
        assert_eq!((o.unexplained, o.bound), (1, 0));
        assert!(!o.passed());
    }

    #[test]
    fn a_stop_explains_a_double_of_the_stopped_holder_only() {
        let stop = |process| Injected::Stop {
            process,
            key: "a".into(),
            from: ms(3),
            to: Some(ms(8000)),
        };
        let calls = [
            ("a", call(1, 10, 0, 5, true)),
            ("a", call(2, 20, 9000, 9005, true)),
        ];
        let o = judged(&["a"], &record(&calls, &[stop(1)]));
        assert_eq!((o.unexplained, o.reasons.stop), (0, 1));
        // The later holder stopped: no clause for it any more.
        let o = judged(&["a"], &record(&calls, &[stop(2)]));
        assert_eq!(o.unexplained, 1);
    }

    #[test]
    fn a_stopped_processs_other_calls_wrote_when_sent() {
        // Stopped at 3 ms in its call of "z"; its call of "a" was answered
        // a moment after the stop, then another process took "a" over.
        let stop = Injected::Stop {
            process: 1,
            key: "z".into(),
            from: ms(3),
            to: Some(ms(8000)),
        };
        let calls = [
            ("a", call(1, 10, 1, 4, true)),
            ("a", call(2, 20, 5000, 5005, true)),
        ];
        let o = judged(&["a"], &record(&calls, std::slice::from_ref(&stop)));
        assert_eq!(
            (o.unexplained, o.unexplained_fenced),
            (0, 0),
            "{:?}",
            o.problems
        );
        // Had "a" been the call the stop held, its write after the stop
        // would have been a late write the fenced sink must refuse.
        let held_a = Injected::Stop {
            process: 1,
            key: "a".into(),
            from: ms(3),
            to: Some(ms(8000)),
        };
        let o = judged(&["a"], &record(&calls, &[held_a]));
        assert_eq!(o.unexplained_fenced, 1);
    }

    #[test]
    fn a_token_not_above_the_last_fails() {
        let mut r = record(
            &[
                ("a", call(1, 20, 0, 5, false)),
                ("a", call(2, 20, 3000, 3005, true)),
            ],
            &[],
        );
        r.keys.get_mut("a").unwrap()[0].effect = false;
        let o = judged(&["a"], &r);
        assert_eq!(o.token_order, 1);
        assert!(!o.passed());
    }

    #[test]
    fn a_second_holder_while_the_first_is_alive_fails_however_long_it_runs() {
        // Ten leases into the first call, still renewing.
        let mut r = record(
            &[
                ("a", call(1, 10, 0, 30_000, true)),
                ("a", call(2, 20, 20_000, 20_005, false)),
            ],
            &[],
        );
        r.keys.get_mut("a").unwrap()[1].effect = false;
        let o = judged(&["a"], &r);
        assert_eq!(o.two_holders, 1);
        assert!(!o.passed());
    }

    #[test]
    fn a_stopped_holder_is_exempt_only_while_stopped() {
        let calls = [
            ("a", call(1, 10, 0, 4000, false)),
            ("a", call(2, 20, 2600, 2605, true)),
        ];
        let stop = |to| Injected::Stop {
            process: 1,
            key: "a".into(),
            from: ms(1),
            to: Some(ms(to)),
        };
        let o = judged(&["a"], &record(&calls, &[stop(3900)]));
        assert_eq!((o.two_holders, o.refused, o.doubled_fenced), (0, 1, 0));
        assert!(o.passed(), "{:?}", o.problems);
        // Resumed at 2 s: at 2.6 s it was alive, its call still open.
        let o = judged(&["a"], &record(&calls, &[stop(2000)]));
        assert_eq!(o.two_holders, 1);
        // Another process once stopped gives no exemption.
        let other = Injected::Stop {
            process: 3,
            key: "a".into(),
            from: ms(1),
            to: Some(ms(3900)),
        };
        let o = judged(&["a"], &record(&calls, &[other]));
        assert_eq!(o.two_holders, 1);
    }

    #[test]
    fn a_stop_without_a_takeover_or_with_its_late_write_taken_fails() {
        let stop = Injected::Stop {
            process: 1,
            key: "a".into(),
            from: ms(1),
            to: Some(ms(4000)),
        };
        // No one took the key over while the holder slept.
        let calls = [
            ("a", call(1, 10, 0, 4000, true)),
            ("a", call(2, 20, 6000, 6005, true)),
        ];
        let o = judged(&["a"], &record(&calls, std::slice::from_ref(&stop)));
        assert!(
            o.problems.iter().any(|p| p.contains("no other consumer")),
            "{:?}",
            o.problems
        );
        assert_eq!(o.unexplained_fenced, 1);
        // Taken over, but the fenced sink took the late write too.
        let calls = [
            ("a", call(1, 10, 0, 4000, true)),
            ("a", call(2, 20, 2600, 2605, true)),
        ];
        let o = judged(&["a"], &record(&calls, &[stop]));
        assert!(
            o.problems.iter().any(|p| p.contains("not refused")),
            "{:?}",
            o.problems
        );
    }

    #[test]
    fn malformed_calls_and_forced_stops_fail() {
        let mut r = record(&[("a", call(1, 10, 0, 5, true))], &[]);
        r.malformed = 1;
        assert!(!judged(&["a"], &r).passed());
        let r = record(&[("a", call(1, 10, 0, 5, true))], &[]);
        let mut f = facts(&["a"]);
        f.forced_stops = 1;
        assert!(!judge(&f, &r).passed());
    }

    /// A poison run's record: k-0 applied, k-5 refused once, k-17 failed
    /// `failing` times.
    fn poison_record(failing: usize) -> Record {
        let refused = Call {
            effect: false,
            end: End::Answered(422),
            ..call(1, 10, 0, 5, false)
        };
        let failed = |n: u64| Call {
            effect: false,
            end: End::Answered(503),
            ..call(1, 11 + n, n * 3000, n * 3000 + 5, false)
        };
        let mut calls = vec![("k-0", call(1, 9, 0, 5, true)), ("k-5", refused)];
        calls.extend((0..failing as u64).map(|n| ("k-17", failed(n))));
        record(&calls, &[])
    }

    fn dead_judged(r: &Record, dead: &[&str]) -> Outcome {
        let mut f = facts(&["k-0", "k-5", "k-17"]);
        f.poison = [("k-5".to_owned(), 1), ("k-17".to_owned(), 3)].into();
        let mut o = judge(&f, r);
        let dead: Vec<String> = dead.iter().map(|k| k.to_string()).collect();
        judge_dead_letters(&mut o, &f, r, &dead);
        o
    }

    #[test]
    fn poison_messages_each_dead_lettered_once_pass() {
        let o = dead_judged(&poison_record(3), &["k-17", "k-5"]);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!((o.lost, o.dead_letters), (0, Some(2)));
    }

    #[test]
    fn dead_letters_missing_doubled_or_wrong_fail() {
        let r = poison_record(3);
        for dead in [
            &["k-17"][..],
            &["k-17", "k-5", "k-5"],
            &["k-17", "k-5", "k-0"],
            &["k-17", "k-5", "k-99"],
        ] {
            assert!(!dead_judged(&r, dead).passed(), "{dead:?}");
        }
        // Called more or fewer times than the attempts allow.
        assert!(!dead_judged(&poison_record(2), &["k-17", "k-5"]).passed());
        assert!(!dead_judged(&poison_record(4), &["k-17", "k-5"]).passed());
    }

    #[test]
    fn a_poison_message_with_an_effect_fails() {
        let mut r = poison_record(3);
        r.keys.get_mut("k-5").expect("k-5")[0].effect = true;
        assert!(!dead_judged(&r, &["k-17", "k-5"]).passed());
    }

    #[test]
    fn a_dead_letter_in_a_run_without_poison_fails() {
        let r = record(&[("a", call(1, 10, 0, 5, true))], &[]);
        let f = facts(&["a"]);
        let mut o = judge(&f, &r);
        judge_dead_letters(&mut o, &f, &r, &["a".to_owned()]);
        assert!(
            o.problems.iter().any(|p| p.contains("had its effect")),
            "{:?}",
            o.problems
        );
    }

    #[test]
    fn the_final_copy_handled_again_fails_unless_a_loss_held_its_key() {
        let r = record(&[("a", call(1, 10, 0, 5, true))], &[]);
        let mut o = judged(&["a"], &r);
        judge_replay(&mut o, &r, &[("a".to_owned(), 1)].into(), &[]);
        assert!(!o.passed());
        let r = record(
            &[("a", call(1, 10, 0, 5, true))],
            &[Injected::Loss {
                at: ms(10),
                lost: Lost::Everything,
            }],
        );
        let mut o = judged(&["a"], &r);
        judge_replay(&mut o, &r, &[("a".to_owned(), 1)].into(), &[]);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!(o.replayed, Some(1));
        let mut o = judged(&["a"], &r);
        judge_replay(&mut o, &r, &HashMap::new(), &["a".to_owned()]);
        assert!(!o.passed());
    }

    fn inbox_judged(keys: &[&str], poison: &[&str], rows: &[(&str, u64)]) -> Outcome {
        let mut f = facts(keys);
        f.poison = poison.iter().map(|k| (k.to_string(), 1)).collect();
        let calls: Vec<(&str, Call)> = keys
            .iter()
            .enumerate()
            .filter(|(_, k)| !poison.contains(k))
            .map(|(i, k)| (*k, call(1, i as u64 + 1, 0, 5, true)))
            .collect();
        let r = record(&calls, &[]);
        let mut o = judge(&f, &r);
        let rows = rows
            .iter()
            .map(|(k, n)| (k.to_string(), (0..*n).collect()))
            .collect();
        judge_inbox(&mut o, &f, &r, &rows);
        o
    }

    #[test]
    fn one_committed_effect_a_key_passes_the_inbox() {
        let o = inbox_judged(&["a", "b"], &[], &[("a", 1), ("b", 1)]);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!((o.lost, o.doubled_inbox), (0, Some(0)));
    }

    #[test]
    fn a_second_committed_effect_fails_the_inbox_whatever_the_fault() {
        let o = inbox_judged(&["a", "b"], &[], &[("a", 3), ("b", 1)]);
        assert_eq!(o.doubled_inbox, Some(2));
        assert!(!o.passed());
    }

    #[test]
    fn an_effect_the_sink_saw_but_never_committed_is_lost() {
        let o = inbox_judged(&["a", "b"], &[], &[("a", 1)]);
        assert_eq!(o.lost, 1);
        assert!(
            o.problems.iter().any(|p| p.starts_with("b:")),
            "{:?}",
            o.problems
        );
    }

    #[test]
    fn the_inbox_holds_no_poison_and_no_stranger() {
        let o = inbox_judged(&["k-4", "k-5"], &["k-5"], &[("k-4", 1), ("k-5", 1)]);
        assert!(
            o.problems
                .iter()
                .any(|p| p.contains("poison message committed")),
            "{:?}",
            o.problems
        );
        let o = inbox_judged(&["a"], &[], &[("a", 1), ("z", 1)]);
        assert!(
            o.problems.iter().any(|p| p.contains("never sent")),
            "{:?}",
            o.problems
        );
    }

    fn http(effects: &[HttpEffect], answers: &[&str], kills: &[u64]) -> Outcome {
        let f = facts(&["a"]);
        let mut o = Outcome::empty(f.names.clone(), 1, 1, ms(1));
        let h = HttpRecord {
            effects: [("a".to_owned(), effects.to_vec())].into(),
            answers: [(
                "a".to_owned(),
                answers.iter().map(|a| a.to_string()).collect(),
            )]
            .into(),
            kills: kills.iter().map(|&k| ms(k)).collect(),
        };
        judge_http(&mut o, &f, &h);
        o
    }

    fn effect(begun: u64, applied: u64, token: u64, stored: Option<u64>) -> HttpEffect {
        HttpEffect {
            begun: ms(begun),
            applied: ms(applied),
            token: Some(token),
            stored: stored.map(ms),
        }
    }

    #[test]
    fn an_http_double_needs_a_kill_inside_the_first_claim() {
        let two = [effect(0, 10, 1, None), effect(3000, 3010, 2, Some(3020))];
        let last = r#"{"effect":2,"token":2}"#;
        assert!(http(&two, &[last], &[5]).passed());
        // Killed after the first outcome was stored: the store forgot it.
        let stored = [
            effect(0, 10, 1, Some(20)),
            effect(3000, 3010, 2, Some(3020)),
        ];
        assert!(!http(&stored, &[last], &[100]).passed());
        // Killed before the first claim began.
        assert!(!http(&two, &[last], &[]).passed());
    }

    #[test]
    fn every_http_answer_is_the_stored_outcome_of_the_last_effect() {
        let two = [effect(0, 10, 1, None), effect(3000, 3010, 2, Some(3020))];
        let o = http(&two, &[r#"{"effect":1,"token":1}"#], &[5]);
        assert!(
            o.problems
                .iter()
                .any(|p| p.contains("not the stored outcome")),
            "{:?}",
            o.problems
        );
        let one = [effect(0, 10, 7, Some(20))];
        assert!(http(&one, &[r#"{"effect":1,"token":7}"#], &[]).passed());
        assert!(!http(&one, &[r#"{"effect":1,"token":8}"#], &[]).passed());
    }
}
