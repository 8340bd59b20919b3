//! The checks on a run's history: nothing lost, every double effect
//! explained by a fault, the fenced sink at one effect a key where fencing
//! is the defence, tokens increasing per key, never two live holders.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::broker::Broker;
use crate::fault::{Fault, Poison};
use crate::scenario::{RunnerKind, Spec};
use crate::sink::{Call, End, Ledger};
use crate::store::StoreKind;

/// How long a claim may take to reach the sink after `begin`: a second
/// holder that arrives before the first one's call plus the lease, less
/// this, took the key over while the first still held it.
const BEGIN_TO_CALL: Duration = Duration::from_millis(250);

/// What one run showed.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    pub broker: &'static str,
    pub store: &'static str,
    pub fault: &'static str,
    /// Which consumer processes ran.
    pub runner: &'static str,
    pub consumers: usize,
    /// Distinct messages published.
    pub sent: usize,
    /// Extra copies the producer published.
    pub duplicates: u64,
    /// Faults injected.
    pub injected: u64,
    /// Handler calls.
    pub calls: u64,
    /// Writes the plain sink applied.
    pub effects: u64,
    /// Messages without an effect at the end.
    pub lost: usize,
    /// Dead letters read back from the broker, in a run that expects some.
    pub dead_letters: Option<usize>,
    /// Plain-sink writes beyond the first of their key.
    pub doubled_plain: u64,
    /// Of those, how many no injected fault explains.
    pub unexplained: u64,
    /// Fenced-sink writes beyond the first of their key.
    pub doubled_fenced: u64,
    /// Of those, how many no kill or wipe explains: a stopped holder's
    /// late write the fenced sink took before the new holder's.
    pub unexplained_fenced: u64,
    /// Writes the fenced sink refused (a stale token).
    pub refused: u64,
    /// In a run with the transactional sink: committed effect rows beyond
    /// the first of their key (none is explained: the inbox must hold).
    pub doubled_inbox: Option<u64>,
    /// Calls whose token was not above every earlier call's of their key.
    pub token_order: u64,
    /// Calls that arrived while another holder's lease was certainly live.
    pub two_holders: u64,
    /// Longest time from a kill or stop to the next call of a key it held,
    /// in ms: how long a stuck `in_progress` record took to recover.
    pub recover_ms: Option<u64>,
    /// Consumers that did not stop within the grace at the end.
    pub forced_stops: usize,
    pub seconds: f64,
    /// Up to ten examples of what went wrong.
    pub problems: Vec<String>,
    /// The command that runs this row again.
    pub command: String,
    /// What this broker cannot do, said beside its rows.
    pub limits: Option<&'static str>,
    /// Whether the run had a fenced sink (the gateway's upstream gets no
    /// token).
    pub fenced: bool,
}

impl Outcome {
    /// Notes what went wrong, keeping the first ten examples.
    pub fn problem(&mut self, text: String) {
        if self.problems.len() < 10 {
            self.problems.push(text);
        }
    }

    /// The figures of the report's columns after the run's names, each
    /// with its label.
    pub fn figures(&self) -> [(&'static str, String); 13] {
        [
            (
                "consumers",
                if self.runner == RunnerKind::Sidecar.title() {
                    self.consumers.to_string()
                } else {
                    format!("{} ({})", self.consumers, self.runner)
                },
            ),
            ("sent", self.sent.to_string()),
            ("copies", self.duplicates.to_string()),
            ("faults", self.injected.to_string()),
            ("effects", self.effects.to_string()),
            ("lost", self.lost.to_string()),
            (
                "dead letters",
                self.dead_letters.map_or("—".into(), |n| n.to_string()),
            ),
            (
                "doubled (unexplained)",
                format!("{} ({})", self.doubled_plain, self.unexplained),
            ),
            (
                "fenced doubled (unexplained)",
                if self.fenced {
                    format!("{} ({})", self.doubled_fenced, self.unexplained_fenced)
                } else {
                    "—".into()
                },
            ),
            (
                "stale refused",
                if self.fenced {
                    self.refused.to_string()
                } else {
                    "—".into()
                },
            ),
            (
                "inbox doubled",
                self.doubled_inbox.map_or("—".into(), |n| n.to_string()),
            ),
            (
                "recovery ms",
                self.recover_ms.map_or("—".into(), |m| m.to_string()),
            ),
            ("s", format!("{:.1}", self.seconds)),
        ]
    }

    /// Whether the run kept idem's promise: nothing lost, every double
    /// explained, no stale write taken by the fenced sink after a later
    /// holder had called, tokens in order, one live holder at a time.
    pub fn passed(&self) -> bool {
        self.problems.is_empty()
    }
}

/// An empty outcome of the gateway run of `spec`, for it to fill in. The
/// upstream gets no fencing token through the proxy: no fenced sink.
pub fn gateway_outcome(spec: &Spec, keys: &[String], elapsed: Duration) -> Outcome {
    let run = Run {
        broker: spec.broker,
        store: spec.store,
        fault: spec.fault,
        runner: spec.runner,
        consumers: 1,
        keys: Vec::new(),
        duplicates: 0,
        lease: spec.lease,
        forced_stops: 0,
        elapsed,
        command: spec.command(),
    };
    let mut o = judge(&run, &Ledger::default());
    o.sent = keys.len();
    o.fenced = false;
    o
}

/// What the run knew besides the ledger.
pub struct Run {
    pub broker: Broker,
    pub runner: RunnerKind,
    pub store: StoreKind,
    pub fault: Fault,
    pub consumers: usize,
    pub keys: Vec<String>,
    pub duplicates: u64,
    pub lease: Duration,
    pub forced_stops: usize,
    pub elapsed: Duration,
    pub command: String,
}

/// Checks the history of `run`.
pub fn judge(run: &Run, ledger: &Ledger) -> Outcome {
    let mut o = Outcome {
        broker: run.broker.title(),
        store: run.store.title(),
        fault: run.fault.title(),
        runner: run.runner.title(),
        consumers: run.consumers,
        sent: run.keys.len(),
        duplicates: run.duplicates,
        injected: ledger.injected,
        calls: ledger.calls,
        effects: 0,
        lost: 0,
        dead_letters: None,
        doubled_plain: 0,
        unexplained: 0,
        doubled_fenced: 0,
        unexplained_fenced: 0,
        refused: 0,
        doubled_inbox: None,
        token_order: 0,
        two_holders: 0,
        recover_ms: None,
        forced_stops: run.forced_stops,
        seconds: run.elapsed.as_secs_f64(),
        problems: Vec::new(),
        command: run.command.clone(),
        limits: run.broker.limits(),
        fenced: true,
    };
    for key in &run.keys {
        if run.fault == Fault::Poison && Poison::of(key).is_some() {
            if let Some(calls) = ledger.keys.get(key)
                && calls.iter().any(|c| c.effect)
            {
                o.problem(format!("{key}: a poison message had an effect"));
            }
            continue;
        }
        let Some(calls) = ledger.keys.get(key) else {
            o.lost += 1;
            o.problem(format!("{key}: never handled"));
            continue;
        };
        if !calls.iter().any(|c| c.effect) {
            o.lost += 1;
            o.problem(format!("{key}: {} calls, no effect", calls.len()));
        }
    }
    for (key, calls) in &ledger.keys {
        let mut order: Vec<&Call> = calls.iter().collect();
        order.sort_by_key(|c| c.arrived);
        // Effects, in the order they were applied.
        let mut effects: Vec<&Call> = order.iter().copied().filter(|c| c.effect).collect();
        effects.sort_by_key(|c| c.ended.unwrap_or(c.arrived));
        o.effects += effects.len() as u64;
        for pair in effects.windows(2) {
            o.doubled_plain += 1;
            if !explained(ledger, run.lease, pair[0], pair[1]) {
                o.unexplained += 1;
                o.problem(format!(
                    "{key}: effect again (token {} after {}) with no fault to explain it",
                    pair[1].token, pair[0].token
                ));
            }
        }
        let mut fenced: Vec<&Call> = effects.iter().copied().filter(|c| c.fenced).collect();
        fenced.sort_by_key(|c| c.ended.unwrap_or(c.arrived));
        for pair in fenced.windows(2) {
            o.doubled_fenced += 1;
            if !explained_fenced(ledger, run.lease, &order, pair[0], pair[1]) {
                o.unexplained_fenced += 1;
                o.problem(format!(
                        "{key}: the fenced sink took token {} after token {}, a stopped holder's late write",
                        pair[1].token, pair[0].token
                    ),
                );
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
                if overlaps(ledger, run.lease, a, b) {
                    o.two_holders += 1;
                    o.problem(format!(
                            "{key}: token {} (consumer {}, attempt {}) called {:?} after token {} (consumer {}), whose lease was live",
                            b.token,
                            b.slot,
                            b.attempt,
                            b.arrived - a.arrived,
                            a.token,
                            a.slot
                        ),
                    );
                }
            }
        }
    }
    o.recover_ms = recovery(ledger).map(|d| d.as_millis() as u64);
    o
}

/// Checks the transactional sink's committed effects (`rows`: effect rows
/// per key): one for every message, none for a poison message, no other
/// key. A key the sink saw applied but whose transaction never committed
/// is lost, whatever the plain sink says.
pub fn judge_inbox(o: &mut Outcome, run: &Run, ledger: &Ledger, rows: &HashMap<String, u64>) {
    let mut doubled = 0;
    for key in &run.keys {
        let n = rows.get(key).copied().unwrap_or(0);
        let poison = run.fault == Fault::Poison && Poison::of(key).is_some();
        match (poison, n) {
            (true, 0) | (false, 1) => {}
            (true, n) => o.problem(format!("{key}: a poison message committed {n} effects")),
            (false, 0) => {
                // A key the sink never applied is counted lost already.
                if ledger
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
    let known: std::collections::HashSet<&str> = run.keys.iter().map(String::as_str).collect();
    for key in rows.keys().filter(|k| !known.contains(k.as_str())) {
        o.problem(format!("{key:?}: an effect for a key the run never sent"));
    }
    o.doubled_inbox = Some(doubled);
}

/// Checks the dead letters read back after a run of poison messages: every
/// poison key there exactly once, no other key, each refused message
/// called once and each failing one `max_attempts` times.
pub fn judge_dead_letters(
    o: &mut Outcome,
    keys: &[String],
    ledger: &Ledger,
    dead: &[String],
    max_attempts: u32,
) {
    o.dead_letters = Some(dead.len());
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for key in dead {
        *seen.entry(key.as_str()).or_default() += 1;
    }
    for key in keys {
        let Some(poison) = Poison::of(key) else {
            if seen.contains_key(key.as_str()) {
                o.problem(format!(
                    "{key}: dead-lettered, but its handler never refused it"
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
        let calls = ledger.keys.get(key).map_or(0, Vec::len);
        let wanted = match poison {
            Poison::Refused => 1,
            Poison::Failing => max_attempts as usize,
        };
        if calls != wanted {
            o.problem(format!(
                "{key}: {poison:?} poison message called {calls} times, not {wanted}"
            ));
        }
    }
    for key in seen.keys() {
        if !keys.iter().any(|k| k == key) {
            o.problem(format!(
                "a dead letter that is no message of the run: {key}"
            ));
        }
    }
}

/// Whether a fault explains `later` applying its key's effect again after
/// `earlier`: the earlier holder's process was killed before the later
/// write (a call its process sent just before the kill can reach the sink
/// after it, and never be completed), or stopped, or the store lost its
/// records in between, or a link was disrupted while the earlier holder's
/// claim was live (its `complete` or renewals could not land).
fn explained(ledger: &Ledger, lease: Duration, earlier: &Call, later: &Call) -> bool {
    let from = earlier.arrived;
    let to = later.ended.unwrap_or(later.arrived);
    disrupted(ledger, lease, earlier, to)
        || ledger
            .kills
            .iter()
            .any(|&(p, at)| p == earlier.process && at <= to)
        || ledger
            .stops
            .iter()
            .any(|&(p, _, _)| p == earlier.process || p == later.process)
        || ledger.wipes.iter().any(|&at| at >= from && at <= to)
}

/// Whether a fault explains the fenced sink taking `later` after
/// `earlier`: the earlier holder was killed after its write, or the store
/// lost its records, or the earlier holder was stopped after its write had
/// landed (so it could not complete: a crash, as far as the key knows), or
/// its late write landed before any later holder had shown itself to the
/// sink (a token check cannot refuse a write whose successor it has not
/// seen). A stopped holder's write that lands after the next holder's call
/// must be refused.
fn explained_fenced(
    ledger: &Ledger,
    lease: Duration,
    calls: &[&Call],
    earlier: &Call,
    later: &Call,
) -> bool {
    let from = earlier.arrived;
    let to = later.ended.unwrap_or(later.arrived);
    let written = earlier.ended.unwrap_or(to);
    let successor_seen = calls
        .iter()
        .any(|c| c.token > earlier.token && c.arrived < written);
    disrupted(ledger, lease, earlier, to)
        || !successor_seen && ledger.stops.iter().any(|&(p, _, _)| p == earlier.process)
        || ledger
            .kills
            .iter()
            .any(|&(p, at)| p == earlier.process && at <= to)
        || ledger.wipes.iter().any(|&at| at >= from && at <= to)
        || ledger
            .stops
            .iter()
            .any(|&(p, stopped, _)| p == earlier.process && written <= stopped)
}

/// Whether a link was disrupted while `earlier`'s claim was live: from its
/// `begin` (up to [`BEGIN_TO_CALL`] before its call: a transaction opened
/// there may already have lost its session) to a lease after the call
/// ended (its `complete`, its renewals), and before `to`.
fn disrupted(ledger: &Ledger, lease: Duration, earlier: &Call, to: Duration) -> bool {
    let live_until = earlier.ended.unwrap_or(to) + lease;
    let begun = earlier.arrived.saturating_sub(BEGIN_TO_CALL);
    ledger
        .disruptions
        .iter()
        .any(|&(start, end)| start <= live_until.min(to) && end >= begun)
}

/// Whether `b` was called while `a`'s holder certainly still held the key:
/// `a` still open, its process neither killed nor stopped, and `b` inside
/// `a`'s first lease.
fn overlaps(ledger: &Ledger, lease: Duration, a: &Call, b: &Call) -> bool {
    let open = a.end == End::InFlight || a.ended.is_some_and(|e| e > b.arrived);
    let stopped = ledger.stops.iter().any(|&(p, _, _)| p == a.process);
    open && !stopped && b.arrived + BEGIN_TO_CALL < a.arrived + lease
}

/// The longest time from a kill or a stop to the next call of a key whose
/// call it cut.
fn recovery(ledger: &Ledger) -> Option<Duration> {
    let mut longest = None;
    for calls in ledger.keys.values() {
        for c in calls {
            let cut = match c.end {
                End::Killed => c.ended,
                _ => ledger
                    .stops
                    .iter()
                    .find(|&&(p, from, _)| p == c.process && from >= c.arrived)
                    .filter(|&&(_, from, _)| c.ended.is_none_or(|e| e >= from))
                    .map(|&(_, from, _)| from),
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

#[cfg(test)]
mod tests {
    use super::*;

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

    fn judged(fault: Fault, keys: &[&str], ledger: &Ledger) -> Outcome {
        judge(&run_of(fault, keys), ledger)
    }

    fn run_of(fault: Fault, keys: &[&str]) -> Run {
        Run {
            broker: Broker::RedisStreams,
            store: StoreKind::Redis,
            fault,
            runner: RunnerKind::Sidecar,
            consumers: 2,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            duplicates: 0,
            lease: LEASE,
            forced_stops: 0,
            elapsed: ms(1000),
            command: String::new(),
        }
    }

    fn ledger(calls: &[(&str, Call)]) -> Ledger {
        let mut l = Ledger::default();
        for (key, c) in calls {
            l.keys.entry(key.to_string()).or_default().push(c.clone());
        }
        l
    }

    #[test]
    fn a_clean_history_passes() {
        let l = ledger(&[
            ("a", call(1, 10, 0, 5, true)),
            ("b", call(2, 11, 0, 5, true)),
        ]);
        let o = judged(Fault::None, &["a", "b"], &l);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!((o.effects, o.lost, o.doubled_plain), (2, 0, 0));
    }

    #[test]
    fn a_message_without_an_effect_is_lost() {
        let l = ledger(&[("a", call(1, 10, 0, 5, true))]);
        let o = judged(Fault::None, &["a", "b"], &l);
        assert_eq!(o.lost, 1);
        assert!(!o.passed());
    }

    #[test]
    fn a_double_effect_with_no_fault_behind_it_fails() {
        let l = ledger(&[
            ("a", call(1, 10, 0, 5, true)),
            ("a", call(2, 20, 3000, 3005, true)),
        ]);
        let o = judged(Fault::None, &["a"], &l);
        assert_eq!((o.doubled_plain, o.unexplained), (1, 1));
        assert_eq!((o.doubled_fenced, o.unexplained_fenced), (1, 1));
        assert!(!o.passed());
    }

    #[test]
    fn a_double_effect_across_a_store_cut_in_its_claim_is_explained() {
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 5, true)),
            ("a", call(2, 20, 3000, 3005, true)),
        ]);
        // Cut 1 s after the first call: its lease was still live.
        l.disruptions.push((ms(1000), ms(1000)));
        let o = judged(Fault::StoreCut, &["a"], &l);
        assert_eq!((o.doubled_plain, o.unexplained), (1, 0));
        assert_eq!((o.doubled_fenced, o.unexplained_fenced), (1, 0));
        assert!(o.passed(), "{:?}", o.problems);
    }

    #[test]
    fn a_cut_between_begin_and_the_call_explains_a_double_and_one_before_does_not() {
        let calls = [
            ("a", call(1, 10, 5000, 5005, true)),
            ("a", call(2, 20, 5300, 5305, true)),
        ];
        // The session ended 100 ms before the call: inside the claim, whose
        // transaction was already open.
        let mut l = ledger(&calls);
        l.disruptions.push((ms(4900), ms(4900)));
        let o = judged(Fault::DbCut, &["a"], &l);
        assert_eq!((o.doubled_plain, o.unexplained), (1, 0), "{:?}", o.problems);
        // A second before the call: before the claim began.
        let mut l = ledger(&calls);
        l.disruptions.push((ms(4000), ms(4000)));
        let o = judged(Fault::DbCut, &["a"], &l);
        assert_eq!((o.doubled_plain, o.unexplained), (1, 1));
    }

    #[test]
    fn a_cut_after_the_first_claim_ended_explains_no_double() {
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 5, true)),
            ("a", call(2, 20, 9000, 9005, true)),
        ]);
        // Cut well past the first call's lease.
        l.disruptions.push((ms(6000), ms(6000)));
        let o = judged(Fault::StoreCut, &["a"], &l);
        assert_eq!((o.doubled_plain, o.unexplained), (1, 1));
        assert!(!o.passed());
    }

    #[test]
    fn a_double_effect_after_its_holder_was_killed_is_explained() {
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 5, true)),
            ("a", call(2, 20, 3000, 3005, true)),
        ]);
        l.kills.push((1, ms(10)));
        let o = judged(Fault::KillAfterEffect, &["a"], &l);
        assert_eq!((o.doubled_plain, o.unexplained), (1, 0));
        assert!(o.passed(), "{:?}", o.problems);
    }

    #[test]
    fn a_token_not_above_the_last_fails() {
        let mut l = ledger(&[
            ("a", call(1, 20, 0, 5, false)),
            ("a", call(2, 20, 3000, 3005, true)),
        ]);
        l.keys.get_mut("a").unwrap()[0].effect = false;
        let o = judged(Fault::None, &["a"], &l);
        assert_eq!(o.token_order, 1);
        assert!(!o.passed());
    }

    #[test]
    fn a_second_holder_within_the_first_lease_fails() {
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 1500, true)),
            ("a", call(2, 20, 500, 505, false)),
        ]);
        l.keys.get_mut("a").unwrap()[1].effect = false;
        let o = judged(Fault::None, &["a"], &l);
        assert_eq!(o.two_holders, 1);
        assert!(!o.passed());
    }

    #[test]
    fn a_stopped_holder_past_its_lease_is_not_a_second_live_holder() {
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 4000, false)),
            ("a", call(2, 20, 2600, 2605, true)),
        ]);
        l.stops.push((1, ms(1), Some(ms(4000))));
        let o = judged(Fault::Zombie, &["a"], &l);
        assert_eq!((o.two_holders, o.refused, o.doubled_fenced), (0, 1, 0));
        assert!(o.passed(), "{:?}", o.problems);
    }

    #[test]
    fn a_late_write_before_any_successor_showed_itself_is_fencings_limit() {
        // No takeover came while the holder was stopped (the broker gave
        // the copy to nobody else): its write lands first, and the next
        // holder's call only arrives after it.
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 4000, true)),
            ("a", call(2, 20, 6000, 6005, true)),
        ]);
        l.stops.push((1, ms(1), Some(ms(4000))));
        let o = judged(Fault::Zombie, &["a"], &l);
        assert_eq!((o.doubled_fenced, o.unexplained_fenced), (1, 0));
        assert!(o.passed(), "{:?}", o.problems);
    }

    #[test]
    fn the_fenced_sink_taking_a_late_write_before_the_new_holders_fails() {
        // The stopped holder's write lands (4000) before the next holder's
        // (5000): both taken, and nothing but fencing was there to stop it.
        let mut l = ledger(&[
            ("a", call(1, 10, 0, 4000, true)),
            ("a", call(2, 20, 2600, 5000, true)),
        ]);
        l.stops.push((1, ms(1), Some(ms(4000))));
        let o = judged(Fault::Zombie, &["a"], &l);
        assert_eq!(o.unexplained_fenced, 1);
        assert!(!o.passed());
    }

    /// A poison run's ledger: k-0 applied, k-5 refused once, k-17 failed
    /// `failing` times.
    fn poison_ledger(failing: usize) -> Ledger {
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
        ledger(&calls)
    }

    fn dead_judged(ledger: &Ledger, dead: &[&str]) -> Outcome {
        let keys = ["k-0", "k-5", "k-17"];
        let mut o = judged(Fault::Poison, &keys, ledger);
        let keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
        let dead: Vec<String> = dead.iter().map(|k| k.to_string()).collect();
        judge_dead_letters(&mut o, &keys, ledger, &dead, 3);
        o
    }

    #[test]
    fn poison_messages_each_dead_lettered_once_pass() {
        let o = dead_judged(&poison_ledger(3), &["k-17", "k-5"]);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!((o.lost, o.dead_letters), (0, Some(2)));
    }

    #[test]
    fn dead_letters_missing_doubled_or_wrong_fail() {
        let l = poison_ledger(3);
        for dead in [
            &["k-17"][..],
            &["k-17", "k-5", "k-5"],
            &["k-17", "k-5", "k-0"],
            &["k-17", "k-5", "k-99"],
        ] {
            assert!(!dead_judged(&l, dead).passed(), "{dead:?}");
        }
        // Called more or fewer times than the attempts allow.
        assert!(!dead_judged(&poison_ledger(2), &["k-17", "k-5"]).passed());
        assert!(!dead_judged(&poison_ledger(4), &["k-17", "k-5"]).passed());
    }

    #[test]
    fn a_poison_message_with_an_effect_fails() {
        let mut l = poison_ledger(3);
        l.keys.get_mut("k-5").expect("k-5")[0].effect = true;
        assert!(!dead_judged(&l, &["k-17", "k-5"]).passed());
    }

    fn inbox_judged(fault: Fault, keys: &[&str], rows: &[(&str, u64)]) -> Outcome {
        let run = run_of(fault, keys);
        let l = ledger(
            &keys
                .iter()
                .enumerate()
                .map(|(i, k)| (*k, call(1, i as u64 + 1, 0, 5, true)))
                .collect::<Vec<_>>(),
        );
        let mut o = judge(&run, &l);
        let rows = rows.iter().map(|(k, n)| (k.to_string(), *n)).collect();
        judge_inbox(&mut o, &run, &l, &rows);
        o
    }

    #[test]
    fn one_committed_effect_a_key_passes_the_inbox() {
        let o = inbox_judged(Fault::DbCut, &["a", "b"], &[("a", 1), ("b", 1)]);
        assert!(o.passed(), "{:?}", o.problems);
        assert_eq!((o.lost, o.doubled_inbox), (0, Some(0)));
    }

    #[test]
    fn a_second_committed_effect_fails_the_inbox_whatever_the_fault() {
        let o = inbox_judged(Fault::KillAfterEffect, &["a", "b"], &[("a", 3), ("b", 1)]);
        assert_eq!(o.doubled_inbox, Some(2));
        assert!(!o.passed());
    }

    #[test]
    fn an_effect_the_sink_saw_but_never_committed_is_lost() {
        let o = inbox_judged(Fault::DbCut, &["a", "b"], &[("a", 1)]);
        assert_eq!(o.lost, 1);
        assert!(
            o.problems.iter().any(|p| p.starts_with("b:")),
            "{:?}",
            o.problems
        );
    }

    #[test]
    fn the_inbox_holds_no_poison_and_no_stranger() {
        // k-5 is refused, so it must commit nothing.
        let o = inbox_judged(Fault::Poison, &["k-4", "k-5"], &[("k-4", 1), ("k-5", 1)]);
        assert!(
            o.problems
                .iter()
                .any(|p| p.contains("poison message committed")),
            "{:?}",
            o.problems
        );
        let o = inbox_judged(Fault::None, &["a"], &[("a", 1), ("z", 1)]);
        assert!(
            o.problems.iter().any(|p| p.contains("never sent")),
            "{:?}",
            o.problems
        );
    }
}
