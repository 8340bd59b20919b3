//! The claim protocol, model-checked: every interleaving of two or three
//! consumers and two copies of one message (the producer's duplicate is
//! taken at any moment), with crashes, a pause past the lease, a failing
//! handler, a handler that looks at its lease a step before its effect,
//! refused or late renewals, store calls whose answers are lost (applied
//! or not), a store that loses a completed record, the broker's
//! redelivery and the store's clock, explored exhaustively with
//! stateright. The store decides with idem's own functions
//! (`idem_core::machine`), the ones the in-process stores call; the
//! consumer does on each answer, and on each lost one, what the guard and
//! the runner do. A second, smaller model follows a key's fencing tokens
//! across a store's expiry, a restart that loses its data and a failover
//! to a node whose clock is behind. docs/design.md ("The protocol,
//! model-checked") says what the models cover and what they leave out.
//!
//! Each deliberately broken variant of the protocol must be caught: a test
//! that passes on the real protocol would prove nothing if it also passed on
//! a broken one.

use std::collections::BTreeSet;

use idem_core::Timestamp;
use idem_core::machine::{self, Current, Decision};
use stateright::{Checker, HasDiscoveries, Model, Property};

/// A lease, in ticks of the store's clock.
const LEASE: u8 = 3;
/// The watchdog reports the lease lost once this little of it is left.
const LOST_AT: u8 = LEASE / 3;
/// A busy or handed-back copy comes back after this many ticks.
const RETRY_DELAY: u8 = 1;
/// Deliveries that failed or killed their consumer before the copy is
/// dead-lettered.
const MAX_ATTEMPTS: u8 = 2;

/// A flaw put into the protocol on purpose, to show the checker finds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Flaw {
    /// The protocol as idem runs it.
    None,
    /// `begin` takes a key over while its lease is still live.
    BeginIgnoresLease,
    /// `complete` takes any caller's outcome: the lease and the fencing
    /// token are not checked.
    CompleteUnfenced,
    /// `release` deletes a claim whoever asks: the owner's token is not
    /// checked.
    ReleaseUnfenced,
    /// `extend` pushes out a live lease whoever asks: the owner's token is
    /// not checked.
    ExtendUnfenced,
    /// `release` forgets the key's last token with its record, so the next
    /// `begin` counts from the first token again.
    TokenResetOnRelease,
    /// The watchdog reports the lease lost only after it has run out.
    LateWatchdog,
    /// The store drops a completed record, and nothing records the loss.
    StoreForgetsCompleted,
    /// The fenced sink takes every write: it trusts the handler's check
    /// of its lease instead of the token.
    SinkUnfenced,
    /// The consumer acks each copy as it is delivered (auto-ack), before
    /// the handler runs.
    AckOnDelivery,
}

/// Where the effect goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Sink {
    /// Two views of one sink: every write (plain), and the writes whose
    /// fencing token is above every token taken before (fenced).
    PlainAndFenced,
    /// The inbox: the effect commits with a row for the key in one
    /// transaction, and a copy whose key has a row changes nothing.
    Transactional,
}

/// The most consumers a model runs.
const MAX_CONSUMERS: usize = 3;

/// What the model lets go wrong, each at most this often per execution.
#[derive(Clone, Debug)]
struct Protocol {
    consumers: usize,
    /// The handler's look at its lease and its effect are two steps (the
    /// watchdog may report between them), not one.
    check_apart: bool,
    crashes: u8,
    pauses: u8,
    failures: u8,
    /// Store calls whose answer is lost (`begin`, `extend`, `complete`,
    /// `release`).
    lost_answers: u8,
    /// Completed records the store loses.
    store_losses: u8,
    sink: Sink,
    flaw: Flaw,
}

/// The key's record, with the lease's time left in ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Record {
    Absent,
    InProgress { token: u8, left: u8 },
    Completed { token: u8 },
}

/// What a consumer is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Phase {
    Idle,
    /// Claimed `token` for `copy`; the handler runs and has not yet looked
    /// at its lease.
    Holding {
        copy: u8,
        token: u8,
    },
    /// The handler found its lease held (`ClaimHandle::is_lost` was
    /// false); its effect is next. The watchdog may report the lease lost
    /// in between: the check does not hold the lease.
    Checked {
        copy: u8,
        token: u8,
    },
    /// The handler's effect is done; `complete` is next.
    Effected {
        copy: u8,
        token: u8,
    },
    /// A `complete` went unanswered: the guard sends it again while the
    /// lease lasts, and gives up when it has run out. `landed`: the store
    /// applied it (which the consumer does not know): the claim is over.
    Storing {
        copy: u8,
        token: u8,
        landed: bool,
    },
    /// `complete` is stored; the ack is next.
    Completed {
        copy: u8,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Consumer {
    phase: Phase,
    /// Stopped (SIGSTOP): does nothing, its watchdog included.
    paused: bool,
    /// Its watchdog has reported the lease lost.
    lost: bool,
    /// Ticks left on the lease the store granted this consumer, as far as
    /// it knows (0: none). Never more than the store's own count.
    lease: u8,
    /// Its lease ran out while it was stopped: its watchdog could not say.
    missed: bool,
}

const IDLE: Consumer = Consumer {
    phase: Phase::Idle,
    paused: false,
    lost: false,
    lease: 0,
    missed: false,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum CopyState {
    /// In the queue, deliverable once `wait` ticks have passed.
    Ready {
        wait: u8,
    },
    /// Delivered to a consumer, not settled.
    Taken,
    Acked,
    DeadLettered,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    record: Record,
    next_token: u8,
    /// The highest token `begin` has handed out, and whether one was not
    /// above every token before it.
    top_token: u8,
    token_went_back: bool,
    /// The outcome of the first `complete` of the record the store holds
    /// (the completer's token).
    first_outcome: Option<u8>,
    /// The model's consumers first; the slots past them stay idle.
    consumers: [Consumer; MAX_CONSUMERS],
    copies: [CopyState; 2],
    attempts: [u8; 2],
    /// Writes the plain sink took, writes the fenced one took, the highest
    /// token the fenced one took, and whether it took one below that.
    plain: u8,
    fenced: u8,
    fence_top: u8,
    fence_below: bool,
    /// Effects the transactional sink committed, and whether its inbox
    /// holds the key.
    committed: u8,
    inbox: bool,
    /// Consumer faults that can each cost one more effect: a crash after
    /// the effect, or a lease that ran out on a holder stopped or past its
    /// check (slow between check and effect, or past its effect).
    consumer_faults: u8,
    /// Completed records the store lost (recorded), and those it dropped
    /// without a record (the flawed store).
    store_losses: u8,
    forgotten: u8,
    /// Second effects charged to a store loss: the first extra effect after
    /// each loss is the store's; every other one must follow a consumer
    /// fault.
    store_doubles: u8,
    crashes: u8,
    pauses: u8,
    failures: u8,
    lost_answers: u8,
    /// A takeover found its previous holder running and unaware.
    untold_takeover: bool,
}

/// What became of a store call's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Answer {
    Received,
    /// The store applied the call; its answer was lost (a timeout, a cut
    /// connection).
    LostApplied,
    /// The call never reached the store, and the caller cannot tell.
    LostUnapplied,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// The store's clock moves on a tick (leases, retry delays, watchdogs).
    Tick,
    /// The broker delivers copy `.1` to consumer `.0`, which begins.
    Deliver(usize, u8, Answer),
    /// The watchdog renews the lease.
    Renew(usize, Answer),
    /// The handler looks at its lease. Lost: it stops (the release's
    /// answer is `.1`); held: its effect is next.
    Check(usize, Answer),
    /// The handler's effect.
    Effect(usize),
    /// The handler fails: release, hand the copy back.
    Fail(usize, Answer),
    Complete(usize, Answer),
    /// The guard stops sending a `complete` that went unanswered: the
    /// lease has run out. No release; the copy is retried later.
    GiveUp(usize),
    Ack(usize),
    Crash(usize),
    Pause(usize),
    Resume(usize),
    /// The broker gives a paused consumer's copy to another (ack timeout).
    Redeliver(u8),
    /// The store loses the key's completed record (a Redis without
    /// persistence restarting). Its tokens keep rising: the token model
    /// below checks that.
    StoreLoss,
}

/// The model's store clock in milliseconds: `now` is fixed, and a lease is
/// its ticks left from now (what idem's decision functions compare).
const NOW: Timestamp = Timestamp::from_millis(1_000_000);

fn expires(left: u8) -> Timestamp {
    NOW.after(std::time::Duration::from_millis(u64::from(left)))
}

/// The fenced sink's rule (the one idem's chaos sink applies): a write is
/// taken only if its token is above every token taken before.
fn fence_takes(top: u8, token: u8) -> bool {
    token > top
}

impl Protocol {
    fn new(consumers: usize) -> Self {
        Self {
            consumers,
            check_apart: true,
            crashes: 1,
            pauses: 1,
            failures: 1,
            lost_answers: 0,
            store_losses: 1,
            sink: Sink::PlainAndFenced,
            flaw: Flaw::None,
        }
    }

    /// idem's decision for a `begin` now.
    fn decide(&self, s: &State) -> Decision {
        let current = match s.record {
            Record::Absent => Current::Absent,
            Record::InProgress { left, .. } => Current::InProgress {
                fingerprint: None,
                lease_expires_at: expires(left),
                attempts: 1,
            },
            Record::Completed { .. } => Current::Completed { fingerprint: None },
        };
        let decision = machine::decide_begin(current, None, NOW);
        if self.flaw == Flaw::BeginIgnoresLease && matches!(decision, Decision::Wait { .. }) {
            return Decision::Acquire { attempt: 2 };
        }
        decision
    }

    /// The store's side of an acquisition: a new token and record.
    fn acquire(s: &mut State) -> u8 {
        if let Record::InProgress { token: old, .. } = s.record {
            // The previous holder must be gone, stopped, or told.
            let unaware = s.consumers.iter().any(|h| {
                matches!(Protocol::holder(h), Some((_, token)) if token == old)
                    && !h.paused
                    && !h.lost
                    && !h.missed
            });
            s.untold_takeover |= unaware;
        }
        let token = s.next_token;
        s.next_token += 1;
        s.token_went_back |= token <= s.top_token;
        s.top_token = s.top_token.max(token);
        s.record = Record::InProgress { token, left: LEASE };
        token
    }

    /// `begin` for `copy`, answered.
    fn begin(&self, s: &mut State, c: usize, copy: u8) {
        match self.decide(s) {
            Decision::Acquire { .. } => {
                let token = Protocol::acquire(s);
                s.consumers[c] = Consumer {
                    phase: Phase::Holding { copy, token },
                    lease: LEASE,
                    ..IDLE
                };
            }
            // Busy: back to the queue for a while, no attempt counted.
            Decision::Wait { .. } => Protocol::hand_back(s, copy, RETRY_DELAY, false),
            // A duplicate of completed work: acked without a call.
            Decision::Replay => s.copies[copy as usize] = CopyState::Acked,
            Decision::Mismatch => unreachable!("the model has no fingerprints"),
        }
    }

    /// Whether `token` owns the record now.
    fn owns(s: &State, held: u8) -> bool {
        match s.record {
            Record::InProgress { token, left } => {
                machine::owns(u64::from(token), u64::from(held), expires(left), NOW)
            }
            _ => false,
        }
    }

    /// `release` by `token`, if it reaches the store.
    fn release(&self, s: &mut State, token: u8, answer: Answer) {
        if answer == Answer::LostUnapplied {
            s.lost_answers += 1;
            return;
        }
        let owns = match (self.flaw, s.record) {
            (Flaw::ReleaseUnfenced, Record::InProgress { .. }) => true,
            _ => Protocol::owns(s, token),
        };
        if owns {
            s.record = Record::Absent;
            if self.flaw == Flaw::TokenResetOnRelease {
                s.next_token = 1;
            }
        }
    }

    /// The copy goes back to the queue (if nobody has settled it since).
    fn hand_back(s: &mut State, copy: u8, wait: u8, attempt: bool) {
        let i = copy as usize;
        if matches!(s.copies[i], CopyState::Taken | CopyState::Ready { .. }) {
            s.copies[i] = CopyState::Ready { wait };
            if attempt {
                s.attempts[i] += 1;
            }
        }
    }

    /// The handler gave up its claim (failed, or stopped on a lost lease):
    /// release, and the copy back with an attempt counted.
    fn stop(&self, s: &mut State, c: usize, answer: Answer) -> Option<()> {
        let (copy, token) = Protocol::holder(&s.consumers[c])?;
        self.release(s, token, answer);
        Protocol::hand_back(s, copy, RETRY_DELAY, true);
        s.consumers[c].phase = Phase::Idle;
        s.consumers[c].lease = 0;
        Some(())
    }

    /// The handler's effect, on the sink.
    fn effect(&self, s: &mut State, c: usize) -> Option<()> {
        let Phase::Checked { copy, token } = s.consumers[c].phase else {
            return None;
        };
        match self.sink {
            Sink::PlainAndFenced => {
                if s.plain > 0 && s.store_doubles < s.store_losses {
                    s.store_doubles += 1;
                }
                s.plain += 1;
                if self.flaw == Flaw::SinkUnfenced || fence_takes(s.fence_top, token) {
                    s.fence_below |= token < s.fence_top;
                    s.fence_top = s.fence_top.max(token);
                    s.fenced += 1;
                }
            }
            Sink::Transactional => {
                if !s.inbox {
                    s.inbox = true;
                    s.committed += 1;
                }
            }
        }
        s.consumers[c].phase = Phase::Effected { copy, token };
        Some(())
    }

    fn holder(c: &Consumer) -> Option<(u8, u8)> {
        match c.phase {
            Phase::Holding { copy, token }
            | Phase::Checked { copy, token }
            | Phase::Effected { copy, token }
            | Phase::Storing { copy, token, .. } => Some((copy, token)),
            _ => None,
        }
    }
}

/// One state for all those that differ only in the order of consumers or
/// of the copies, which are interchangeable (a path's consumer and copy
/// numbers refer to the order of the state before each step).
fn canonical(s: &mut State, consumers: usize) {
    if (s.copies[1], s.attempts[1]) < (s.copies[0], s.attempts[0]) {
        s.copies.swap(0, 1);
        s.attempts.swap(0, 1);
        for c in &mut s.consumers {
            match &mut c.phase {
                Phase::Holding { copy, .. }
                | Phase::Checked { copy, .. }
                | Phase::Effected { copy, .. }
                | Phase::Storing { copy, .. }
                | Phase::Completed { copy } => *copy = 1 - *copy,
                Phase::Idle => {}
            }
        }
    }
    s.consumers[..consumers].sort_unstable();
}

/// Consumers that hold a claim the store still promises them. (A claim
/// whose `complete` landed is over, whether or not its holder heard.)
fn live_holders(s: &State) -> usize {
    s.consumers
        .iter()
        .filter(|c| {
            Protocol::holder(c).is_some()
                && c.lease > 0
                && !matches!(c.phase, Phase::Storing { landed: true, .. })
        })
        .count()
}

/// The message has had its effect, or is dead-lettered. (Its record may
/// stay unfinished: a holder whose `complete` came after its lease acks,
/// and the record waits for the next copy or its retention.)
fn effected_or_dead_lettered(m: &Protocol, s: &State) -> bool {
    let effect = match m.sink {
        Sink::PlainAndFenced => s.plain > 0,
        Sink::Transactional => s.committed > 0,
    };
    effect || s.copies.contains(&CopyState::DeadLettered)
}

impl Model for Protocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            record: Record::Absent,
            next_token: 1,
            top_token: 0,
            token_went_back: false,
            first_outcome: None,
            consumers: [IDLE; MAX_CONSUMERS],
            // The producer's duplicate is in the queue from the start: a
            // delivery is never forced, so it is taken at any moment.
            copies: [CopyState::Ready { wait: 0 }; 2],
            attempts: [0; 2],
            plain: 0,
            fenced: 0,
            fence_top: 0,
            fence_below: false,
            committed: 0,
            inbox: false,
            consumer_faults: 0,
            store_losses: 0,
            forgotten: 0,
            store_doubles: 0,
            crashes: 0,
            pauses: 0,
            failures: 0,
            lost_answers: 0,
            untold_takeover: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let waiting = s
            .copies
            .iter()
            .any(|c| matches!(c, CopyState::Ready { wait } if *wait > 0))
            || matches!(s.record, Record::InProgress { left, .. } if left > 0);
        if waiting {
            actions.push(Action::Tick);
        }
        if matches!(s.record, Record::Completed { .. })
            && s.store_losses + s.forgotten < self.store_losses
        {
            actions.push(Action::StoreLoss);
        }
        let lose = s.lost_answers < self.lost_answers;
        for (i, c) in s.consumers[..self.consumers].iter().enumerate() {
            if c.paused {
                actions.push(Action::Resume(i));
                continue;
            }
            match c.phase {
                Phase::Idle => {
                    for (copy, state) in s.copies.iter().enumerate() {
                        if *state == (CopyState::Ready { wait: 0 }) {
                            let copy = copy as u8;
                            actions.push(Action::Deliver(i, copy, Answer::Received));
                            // A copy past its attempts is dead-lettered
                            // without a call.
                            if lose && s.attempts[copy as usize] < MAX_ATTEMPTS {
                                actions.push(Action::Deliver(i, copy, Answer::LostApplied));
                                actions.push(Action::Deliver(i, copy, Answer::LostUnapplied));
                            }
                        }
                    }
                }
                Phase::Holding { .. } => {
                    actions.push(Action::Check(i, Answer::Received));
                    // A release whose answer is lost after it was applied
                    // is one received: the guard ignores the answer.
                    if c.lost && lose {
                        actions.push(Action::Check(i, Answer::LostUnapplied));
                    }
                    if s.failures < self.failures {
                        actions.push(Action::Fail(i, Answer::Received));
                        if lose {
                            actions.push(Action::Fail(i, Answer::LostUnapplied));
                        }
                    }
                }
                Phase::Checked { .. } => actions.push(Action::Effect(i)),
                // Retries end with the lease; the first call goes out
                // whatever is left of it.
                Phase::Storing { .. } if c.lease == 0 => actions.push(Action::GiveUp(i)),
                Phase::Effected { .. } | Phase::Storing { .. } => {
                    actions.push(Action::Complete(i, Answer::Received));
                    if lose {
                        actions.push(Action::Complete(i, Answer::LostApplied));
                        actions.push(Action::Complete(i, Answer::LostUnapplied));
                    }
                }
                Phase::Completed { .. } => actions.push(Action::Ack(i)),
            }
            if Protocol::holder(c).is_some() {
                if !c.lost && c.lease < LEASE {
                    actions.push(Action::Renew(i, Answer::Received));
                    // A renewal lost before the store applied it is one
                    // not sent yet: the watchdog sends it again.
                    if lose {
                        actions.push(Action::Renew(i, Answer::LostApplied));
                    }
                }
                if s.pauses < self.pauses {
                    actions.push(Action::Pause(i));
                }
            }
            if c.phase != Phase::Idle && s.crashes < self.crashes {
                actions.push(Action::Crash(i));
            }
        }
        for copy in 0..2u8 {
            let held_by_paused = s
                .consumers
                .iter()
                .any(|c| c.paused && matches!(Protocol::holder(c), Some((k, _)) if k == copy));
            if held_by_paused && s.copies[copy as usize] == CopyState::Taken {
                actions.push(Action::Redeliver(copy));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Tick => {
                for copy in &mut s.copies {
                    if let CopyState::Ready { wait } = copy {
                        *wait = wait.saturating_sub(1);
                    }
                }
                if let Record::InProgress { left, .. } = &mut s.record {
                    *left = left.saturating_sub(1);
                }
                for c in &mut s.consumers {
                    if Protocol::holder(c).is_none() {
                        continue;
                    }
                    let ran_out_before = c.lease == 0;
                    if c.lease > 0 {
                        c.lease -= 1;
                        let past_check = matches!(
                            c.phase,
                            Phase::Checked { .. } | Phase::Effected { .. } | Phase::Storing { .. }
                        );
                        if c.lease == 0 && (past_check || c.paused) {
                            s.consumer_faults += 1;
                            c.missed |= c.paused;
                        }
                    }
                    // The watchdog runs on the consumer's own timer: it
                    // reports the loss in time unless the process is
                    // stopped.
                    let report = match self.flaw {
                        Flaw::LateWatchdog => ran_out_before,
                        _ => c.lease <= LOST_AT,
                    };
                    if !c.paused && report {
                        c.lost = true;
                    }
                }
            }
            Action::Deliver(c, copy, answer) => {
                let i = copy as usize;
                if s.attempts[i] >= MAX_ATTEMPTS {
                    s.copies[i] = CopyState::DeadLettered;
                } else {
                    s.copies[i] = if self.flaw == Flaw::AckOnDelivery {
                        CopyState::Acked
                    } else {
                        CopyState::Taken
                    };
                    match answer {
                        Answer::Received => self.begin(&mut s, c, copy),
                        // The runner retries a copy whose `begin` failed,
                        // no attempt counted; a claim made meanwhile is
                        // nobody's and runs out with its lease.
                        Answer::LostApplied | Answer::LostUnapplied => {
                            if answer == Answer::LostApplied {
                                // Only an acquisition changes the store.
                                if !matches!(self.decide(&s), Decision::Acquire { .. }) {
                                    return None;
                                }
                                Protocol::acquire(&mut s);
                            }
                            s.lost_answers += 1;
                            Protocol::hand_back(&mut s, copy, RETRY_DELAY, false);
                        }
                    }
                }
            }
            Action::Renew(c, answer) => {
                let (_, token) = Protocol::holder(&s.consumers[c])?;
                let owns = match (self.flaw, s.record) {
                    (Flaw::ExtendUnfenced, Record::InProgress { left, .. }) => left > 0,
                    _ => Protocol::owns(&s, token),
                };
                if let (true, Record::InProgress { left, .. }) = (owns, &mut s.record) {
                    *left = LEASE;
                }
                match answer {
                    Answer::Received if owns => s.consumers[c].lease = LEASE,
                    Answer::Received => s.consumers[c].lost = true,
                    // The watchdog retries; the store's lease is now longer
                    // than the holder reckons, which only makes it stop
                    // early.
                    _ if owns => s.lost_answers += 1,
                    _ => return None,
                }
            }
            Action::Check(c, answer) => {
                let consumer = s.consumers[c];
                let Phase::Holding { copy, token } = consumer.phase else {
                    return None;
                };
                if consumer.lost {
                    self.stop(&mut s, c, answer)?;
                } else {
                    s.consumers[c].phase = Phase::Checked { copy, token };
                    if !self.check_apart {
                        self.effect(&mut s, c);
                    }
                }
            }
            Action::Effect(c) => self.effect(&mut s, c)?,
            Action::Fail(c, answer) => {
                s.failures += 1;
                self.stop(&mut s, c, answer)?;
            }
            Action::Complete(c, answer) => {
                let (copy, token, landed) = match s.consumers[c].phase {
                    Phase::Effected { copy, token } => (copy, token, false),
                    Phase::Storing {
                        copy,
                        token,
                        landed,
                    } => (copy, token, landed),
                    _ => return None,
                };
                let stores = match (self.flaw, s.record) {
                    (
                        Flaw::CompleteUnfenced,
                        Record::InProgress { .. } | Record::Completed { .. },
                    ) => true,
                    _ => Protocol::owns(&s, token),
                };
                // A retry of a `complete` that landed: `Ok` again.
                let retried = matches!(s.record, Record::Completed { token: t }
                    if machine::completed_by(u64::from(t), u64::from(token), expires(1), NOW));
                if answer == Answer::LostApplied && !stores {
                    // Nothing to apply: the same as a lost call.
                    return None;
                }
                if stores && answer != Answer::LostUnapplied {
                    s.record = Record::Completed { token };
                    s.first_outcome.get_or_insert(token);
                }
                if answer == Answer::Received {
                    s.consumers[c].phase = if stores || retried {
                        Phase::Completed { copy }
                    } else {
                        // Stale: the lease was lost after the effect,
                        // which stands; the guard says ack (a later copy
                        // finds the key expired and runs again, a fault's
                        // double).
                        if s.copies[copy as usize] != CopyState::DeadLettered {
                            s.copies[copy as usize] = CopyState::Acked;
                        }
                        Phase::Idle
                    };
                    s.consumers[c].lease = 0;
                } else {
                    s.lost_answers += 1;
                    s.consumers[c].phase = Phase::Storing {
                        copy,
                        token,
                        landed: landed || (stores && answer == Answer::LostApplied),
                    };
                }
            }
            Action::GiveUp(c) => {
                let Phase::Storing { copy, .. } = s.consumers[c].phase else {
                    return None;
                };
                // The claim is left to run out (no release); the copy is
                // retried, no attempt counted.
                Protocol::hand_back(&mut s, copy, RETRY_DELAY, false);
                s.consumers[c] = IDLE;
            }
            Action::Ack(c) => {
                let Phase::Completed { copy } = s.consumers[c].phase else {
                    return None;
                };
                if s.copies[copy as usize] != CopyState::DeadLettered {
                    s.copies[copy as usize] = CopyState::Acked;
                }
                s.consumers[c].phase = Phase::Idle;
            }
            Action::Crash(c) => {
                s.crashes += 1;
                let consumer = s.consumers[c];
                let copy = match consumer.phase {
                    Phase::Holding { copy, .. }
                    | Phase::Checked { copy, .. }
                    | Phase::Completed { copy } => copy,
                    Phase::Effected { copy, .. } | Phase::Storing { copy, .. } => {
                        s.consumer_faults += 1;
                        copy
                    }
                    Phase::Idle => return None,
                };
                // The broker sees the connection drop and counts the death.
                Protocol::hand_back(&mut s, copy, 0, true);
                // It restarts empty-handed (and takes its time to: a
                // delivery is never forced).
                s.consumers[c] = IDLE;
            }
            Action::Pause(c) => {
                s.pauses += 1;
                s.consumers[c].paused = true;
            }
            Action::Resume(c) => s.consumers[c].paused = false,
            Action::Redeliver(copy) => s.copies[copy as usize] = CopyState::Ready { wait: 0 },
            Action::StoreLoss => {
                s.record = Record::Absent;
                if self.flaw == Flaw::StoreForgetsCompleted {
                    s.forgotten += 1;
                } else {
                    s.store_losses += 1;
                    // The outcome a duplicate was promised is gone with it.
                    s.first_outcome = None;
                }
            }
        }
        canonical(&mut s, self.consumers);
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("never two live holders", |_, s: &State| {
                live_holders(s) <= 1
            }),
            Property::always(
                "every token begin hands out is above every one before it",
                |_, s: &State| !s.token_went_back,
            ),
            Property::always(
                "a completed outcome never changes while the store keeps it",
                |_, s: &State| match s.record {
                    Record::Completed { token } => s.first_outcome == Some(token),
                    _ => true,
                },
            ),
            Property::always(
                "a takeover finds its previous holder gone, stopped or told",
                |_, s: &State| !s.untold_takeover,
            ),
            Property::always(
                "a state with nothing left to do has every copy settled",
                |m: &Protocol, s: &State| {
                    let mut next = Vec::new();
                    m.actions(s, &mut next);
                    !next.is_empty()
                        || (s
                            .copies
                            .iter()
                            .all(|c| matches!(c, CopyState::Acked | CopyState::DeadLettered))
                            && s.consumers.iter().all(|c| c.phase == Phase::Idle))
                },
            ),
            Property::eventually(
                "every message is effected or dead-lettered",
                effected_or_dead_lettered,
            ),
            Property::sometimes(
                "a key is taken over from a holder still at work",
                |_, s: &State| {
                    let mut tokens = s.consumers.iter().filter_map(Protocol::holder);
                    matches!((tokens.next(), tokens.next()), (Some((_, a)), Some((_, b))) if a != b)
                },
            ),
            Property::sometimes("a copy is dead-lettered", |_, s: &State| {
                s.copies.contains(&CopyState::DeadLettered)
            }),
        ];
        if self.check_apart {
            properties.push(Property::sometimes(
                "the lease is reported lost between a holder's check and its effect",
                |_, s: &State| {
                    s.consumers
                        .iter()
                        .any(|c| c.lost && matches!(c.phase, Phase::Checked { .. }))
                },
            ));
        }
        if self.lost_answers > 0 {
            properties.extend([
                Property::sometimes("a claim is left that nobody holds", |_, s: &State| {
                    matches!(s.record, Record::InProgress { token, .. }
                        if !s.consumers.iter().any(|c| matches!(Protocol::holder(c), Some((_, t)) if t == token)))
                }),
                Property::sometimes(
                    "a complete lands though its answer is lost",
                    |_, s: &State| {
                        s.consumers
                            .iter()
                            .any(|c| matches!(c.phase, Phase::Storing { landed: true, .. }))
                    },
                ),
            ]);
        }
        match self.sink {
            Sink::PlainAndFenced => {
                properties.extend([
                    Property::always(
                        "every second effect the store did not cause follows a crash or a lapsed lease",
                        |_, s: &State| s.plain <= 1 + s.store_doubles + s.consumer_faults,
                    ),
                    Property::always(
                        "every second effect on the fenced sink follows a fault",
                        |_, s: &State| s.fenced <= 1 + s.consumer_faults + s.store_losses,
                    ),
                    Property::always(
                        "the fenced sink never takes a write below a token it took",
                        |_, s: &State| !s.fence_below,
                    ),
                    Property::sometimes("the plain sink takes an effect twice", |_, s: &State| {
                        s.plain > 1
                    }),
                    Property::sometimes("the fenced sink refuses a stale write", |_, s: &State| {
                        s.fenced < s.plain
                    }),
                ]);
                if self.store_losses > 0 {
                    properties.push(Property::sometimes(
                        "a lost completed record costs a second effect",
                        |_, s: &State| s.store_doubles > 0,
                    ));
                }
            }
            Sink::Transactional => properties.push(Property::always(
                "the transactional sink never applies an effect twice",
                |_, s: &State| s.committed <= 1,
            )),
        }
        properties
    }
}

/// Checks `model` exhaustively and returns the checker.
fn check<M>(model: M) -> impl Checker<M>
where
    M: Model + Send + Sync + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync,
{
    let checker = model.checker().threads(2).spawn_bfs().join();
    assert!(checker.is_done(), "the state space was not exhausted");
    eprintln!(
        "{} states, {} unique, depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker
}

/// Checks `model` until it breaks `property`, and prints the path that
/// does; fails if the whole state space keeps it.
fn caught<M>(model: M, property: &'static str)
where
    M: Model + Send + Sync + std::fmt::Debug + 'static,
    M::State: std::fmt::Debug + std::hash::Hash + Clone + PartialEq + Send + Sync,
    M::Action: std::fmt::Debug + Clone + PartialEq + Send + Sync,
{
    let described = format!("{model:?}");
    let checker = model
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
        .spawn_bfs()
        .join();
    let path = checker.assert_any_discovery(property);
    eprintln!("\"{property}\" broken by {described}:\n{path}");
}

#[test]
fn two_consumers_hold_every_property() {
    check(Protocol::new(2)).assert_properties();
}

#[test]
fn three_consumers_hold_every_property() {
    // A third consumer adds the three-way races (two copies waiting while
    // one holds, two contenders for a takeover). The failing handler, the
    // store's loss, and a handler that looks at its lease a step before
    // its effect are left to the two-consumer check: here the look and
    // the effect are one step, which keeps this check short.
    let model = Protocol {
        check_apart: false,
        failures: 0,
        store_losses: 0,
        ..Protocol::new(3)
    };
    check(model).assert_properties();
}

#[test]
fn lost_answers_of_every_store_call_hold_every_property() {
    // One answer lost, of any call, applied or not, beside a pause, a
    // failing handler and the store's loss. The crash and the handler's
    // look at its lease a step apart are left to the two-consumer check,
    // which keeps this one short.
    let model = Protocol {
        lost_answers: 1,
        check_apart: false,
        crashes: 0,
        ..Protocol::new(2)
    };
    check(model).assert_properties();
}

#[test]
fn the_transactional_sink_applies_the_effect_once() {
    // Also when the store loses the completed record: the inbox is the
    // business database's, not the store's.
    let model = Protocol {
        sink: Sink::Transactional,
        ..Protocol::new(2)
    };
    check(model).assert_properties();
}

fn flawed(flaw: Flaw) -> Protocol {
    Protocol {
        flaw,
        ..Protocol::new(2)
    }
}

#[test]
fn a_begin_that_ignores_the_lease_is_caught_with_two_live_holders() {
    caught(flawed(Flaw::BeginIgnoresLease), "never two live holders");
}

#[test]
fn a_complete_that_ignores_lease_and_token_is_caught_changing_the_outcome() {
    caught(
        flawed(Flaw::CompleteUnfenced),
        "a completed outcome never changes while the store keeps it",
    );
}

#[test]
fn a_release_without_the_owners_token_is_caught_with_two_live_holders() {
    caught(flawed(Flaw::ReleaseUnfenced), "never two live holders");
}

#[test]
fn an_extend_without_the_owners_token_is_caught_with_two_live_holders() {
    caught(flawed(Flaw::ExtendUnfenced), "never two live holders");
}

#[test]
fn a_token_reset_on_release_is_caught_handing_out_a_token_again() {
    caught(
        flawed(Flaw::TokenResetOnRelease),
        "every token begin hands out is above every one before it",
    );
}

#[test]
fn a_watchdog_that_reports_after_the_lease_ran_out_is_caught_by_a_takeover() {
    caught(
        flawed(Flaw::LateWatchdog),
        "a takeover finds its previous holder gone, stopped or told",
    );
}

#[test]
fn a_store_that_forgets_a_completed_record_unrecorded_is_caught_by_the_second_effect() {
    caught(
        flawed(Flaw::StoreForgetsCompleted),
        "every second effect the store did not cause follows a crash or a lapsed lease",
    );
}

#[test]
fn a_sink_that_trusts_the_handlers_check_is_caught_taking_a_stale_write() {
    caught(
        flawed(Flaw::SinkUnfenced),
        "the fenced sink never takes a write below a token it took",
    );
}

#[test]
fn an_ack_on_delivery_is_caught_losing_the_message() {
    caught(
        flawed(Flaw::AckOnDelivery),
        "every message is effected or dead-lettered",
    );
}

// Fencing tokens across a failover.
//
// idem's Redis and SQL stores hand out the key's last token plus one, at
// least the store's clock in ms × 1024 (`begin.lua`, the SQL `begin`
// statement). The model below follows one key's tokens on a serving node
// and its replica, each with its own clock, through the record's expiry, a
// restart that loses the data, and a failover to the replica.

/// Tokens a tick of the clock is worth (1024 a millisecond in idem's
/// stores): more than the model's acquisitions, as a key is acquired fewer
/// than 1024 times in a millisecond.
const TOKENS_PER_TICK: u8 = 4;
/// Acquisitions of the key in one execution.
const BEGINS: u8 = 3;
/// Ticks a record lives after the acquisition that wrote it (a lease and
/// the abandoned retention, a completed record's retention, a released
/// key's tombstone).
const RECORD_LIFE: u8 = 2;
/// The serving node's clock stops here, so the state space ends.
const LAST_TICK: u8 = 8;

/// How a store hands out a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Minting {
    /// idem's Redis and SQL stores: the key's last token plus one, at least
    /// the clock × `TOKENS_PER_TICK`.
    LastTokenOrClock,
    /// Flawed: the key's last token plus one, the first token without a
    /// record (a counter kept in the record, no clock floor).
    LastTokenOnly,
    /// Flawed: the clock × `TOKENS_PER_TICK`, plus the acquisitions earlier
    /// in the same tick; the key's last token is not read.
    ClockOnly,
}

/// How the replica gets the serving node's writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Replication {
    /// Before the write is answered (a synchronous standby).
    Sync,
    /// Some time after (Redis's replication, an asynchronous standby): a
    /// failover loses what the replica had not yet copied.
    Async,
}

#[derive(Clone, Debug)]
struct Tokens {
    minting: Minting,
    replication: Replication,
    /// Whether the serving node fails over to its replica (once).
    failover: bool,
    /// Ticks the replica's clock is behind the serving node's. The failover
    /// itself takes a tick.
    behind: u8,
    /// Whether the serving node can lose its data (a restart without
    /// persistence, its clock going on), once. The restart takes a tick.
    wipe: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Node {
    clock: u8,
    /// The key's record: its token, and the tick it expires at (a time on
    /// the clock that wrote it, kept as such by a replica: a row's
    /// `expires_at`, a Redis key's expiry).
    record: Option<(u8, u8)>,
    /// Acquisitions in the current tick (`ClockOnly`'s count).
    this_tick: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Nodes {
    serving: Node,
    /// The replica, until it takes over.
    replica: Option<Node>,
    begins: u8,
    wiped: bool,
    /// The highest token handed out for the key, and whether one was not
    /// above every token before it.
    top: u8,
    went_back: bool,
    /// A token was handed out after the serving node forgot the key's
    /// last one (expiry, a wipe, a failover that lost it).
    minted_unremembered: bool,
    /// A token was handed out after a failover.
    minted_after_failover: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum TokenAction {
    /// Both clocks move on a tick.
    Tick,
    /// The key is acquired on the serving node.
    Begin,
    /// The serving node drops the key's record at its expiry.
    Expire,
    /// The replica copies the serving node's record (asynchronous).
    Replicate,
    /// The replica takes over, with what it has and its own clock.
    Failover,
    /// The serving node restarts without its data.
    Wipe,
}

impl Tokens {
    fn mint(&self, node: &Node) -> u8 {
        let last = node.record.map(|(token, _)| token);
        let clock = node.clock * TOKENS_PER_TICK;
        match self.minting {
            Minting::LastTokenOrClock => last.map_or(clock, |t| (t + 1).max(clock)),
            Minting::LastTokenOnly => last.map_or(1, |t| t + 1),
            Minting::ClockOnly => clock + node.this_tick,
        }
    }
}

impl Model for Tokens {
    type State = Nodes;
    type Action = TokenAction;

    fn init_states(&self) -> Vec<Nodes> {
        let node = |clock| Node {
            clock,
            record: None,
            this_tick: 0,
        };
        vec![Nodes {
            serving: node(1 + self.behind),
            replica: self.failover.then(|| node(1)),
            begins: 0,
            wiped: false,
            top: 0,
            went_back: false,
            minted_unremembered: false,
            minted_after_failover: false,
        }]
    }

    fn actions(&self, s: &Nodes, actions: &mut Vec<TokenAction>) {
        if s.serving.clock < LAST_TICK {
            actions.push(TokenAction::Tick);
        }
        if s.begins < BEGINS {
            actions.push(TokenAction::Begin);
        }
        if matches!(s.serving.record, Some((_, end)) if end <= s.serving.clock) {
            actions.push(TokenAction::Expire);
        }
        if let Some(replica) = s.replica {
            if self.replication == Replication::Async && replica.record != s.serving.record {
                actions.push(TokenAction::Replicate);
            }
            actions.push(TokenAction::Failover);
        }
        if self.wipe && !s.wiped {
            actions.push(TokenAction::Wipe);
        }
    }

    fn next_state(&self, last: &Nodes, action: TokenAction) -> Option<Nodes> {
        let mut s = last.clone();
        let sync = self.replication == Replication::Sync;
        match action {
            TokenAction::Tick => {
                for node in std::iter::once(&mut s.serving).chain(s.replica.as_mut()) {
                    node.clock += 1;
                    node.this_tick = 0;
                }
            }
            TokenAction::Begin => {
                let token = self.mint(&s.serving);
                s.went_back |= token <= s.top;
                s.minted_unremembered |= s.begins > 0 && s.serving.record.is_none();
                s.minted_after_failover |= s.replica.is_none() && self.failover;
                s.top = s.top.max(token);
                s.begins += 1;
                s.serving.this_tick += 1;
                s.serving.record = Some((token, s.serving.clock + RECORD_LIFE));
            }
            TokenAction::Expire => s.serving.record = None,
            TokenAction::Replicate => {}
            TokenAction::Failover => {
                let replica = s.replica.take()?;
                s.serving = Node {
                    clock: replica.clock + 1,
                    this_tick: 0,
                    ..replica
                };
            }
            TokenAction::Wipe => {
                s.wiped = true;
                s.serving = Node {
                    clock: s.serving.clock + 1,
                    record: None,
                    this_tick: 0,
                };
            }
        }
        if let Some(replica) = &mut s.replica
            && (sync || action == TokenAction::Replicate)
        {
            replica.record = s.serving.record;
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "a token handed out for the key is above every one before it",
                |_, s: &Nodes| !s.went_back,
            ),
            Property::sometimes(
                "a token is handed out after the serving node forgot the last one",
                |_, s: &Nodes| s.minted_unremembered,
            ),
        ];
        if self.failover {
            properties.push(Property::sometimes(
                "a token is handed out after a failover",
                |_, s: &Nodes| s.minted_after_failover,
            ));
        }
        properties
    }
}

/// The property every token model is held to.
const TOKENS_RISE: &str = "a token handed out for the key is above every one before it";

fn tokens(minting: Minting, replication: Replication, behind: u8) -> Tokens {
    Tokens {
        minting,
        replication,
        failover: true,
        behind,
        wipe: false,
    }
}

#[test]
fn tokens_rise_across_expiry_and_a_restart_that_loses_the_data() {
    let model = Tokens {
        failover: false,
        wipe: true,
        ..tokens(Minting::LastTokenOrClock, Replication::Sync, 0)
    };
    check(model).assert_properties();
}

#[test]
fn tokens_rise_across_a_failover_to_a_clock_behind_by_a_records_life_with_every_write_replicated() {
    let model = tokens(Minting::LastTokenOrClock, Replication::Sync, RECORD_LIFE);
    check(model).assert_properties();
}

#[test]
fn tokens_rise_across_a_failover_that_loses_writes_when_the_new_clock_is_not_behind() {
    let model = tokens(Minting::LastTokenOrClock, Replication::Async, 0);
    check(model).assert_properties();
}

/// What idem's stores do not promise: after a failover that lost the key's
/// last write, its next token is the new node's clock, lower than the
/// lost one when that clock is behind by the failover's own time or more.
#[test]
fn a_failover_that_loses_the_last_write_to_a_clock_behind_hands_out_a_lower_token() {
    caught(
        tokens(Minting::LastTokenOrClock, Replication::Async, 1),
        TOKENS_RISE,
    );
}

/// The same with every write replicated, once the record has expired and
/// the clock is behind by more than the record's life.
#[test]
fn a_failover_to_a_clock_behind_by_more_than_a_records_life_hands_out_a_lower_token() {
    caught(
        tokens(
            Minting::LastTokenOrClock,
            Replication::Sync,
            RECORD_LIFE + 1,
        ),
        TOKENS_RISE,
    );
}

#[test]
fn tokens_without_the_clock_floor_are_caught_going_back_once_the_store_forgets_the_key() {
    let model = Tokens {
        failover: false,
        wipe: true,
        ..tokens(Minting::LastTokenOnly, Replication::Sync, 0)
    };
    caught(model, TOKENS_RISE);
}

#[test]
fn tokens_from_the_clock_alone_are_caught_going_back_across_a_failover() {
    caught(
        tokens(Minting::ClockOnly, Replication::Sync, 1),
        TOKENS_RISE,
    );
}
