//! The consumer thread. librdkafka serves rebalances from inside `poll`, so
//! one thread owns the consumer and polls it: it hands messages to
//! [`fetch`](crate::KafkaSource) through a buffer, pauses a retry topic's
//! partition while its next message is not due, commits finished offsets
//! on an interval, and waits for the work on revoked partitions before it
//! lets them go.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use idem_consumer::Delivery;
use parking_lot::{Condvar, Mutex};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::BorrowedMessage;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Message as _, Offset, TopicPartitionList};

use crate::config::{KafkaConfig, Lanes};
use crate::offsets::Offsets;
use crate::record::{self, Receipt};

/// A topic and partition; topic names are shared, not copied per message.
pub(crate) type Tp = (Arc<str>, i32);

/// What the consumer thread and the source's verbs share.
pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    /// A tracked message was finished (a revoke may be waiting for it).
    pub(crate) finished: Condvar,
    /// The buffer has messages.
    pub(crate) ready: tokio::sync::Notify,
    /// The buffer was drained.
    pub(crate) drained: Condvar,
    pub(crate) stop: AtomicBool,
    /// Wakes the background writers of copies when the source closes.
    pub(crate) stopping: tokio::sync::Notify,
    pub(crate) config: KafkaConfig,
    /// The topics subscribed to, so a message's topic is looked up, not
    /// allocated.
    topics: Vec<Arc<str>>,
    /// Most messages buffered before polling slows down.
    high_water: usize,
    /// Most messages buffered at all: at this many every assigned
    /// partition is paused at the broker until the buffer is back at
    /// `high_water`.
    pub(crate) bound: usize,
}

#[derive(Default)]
pub(crate) struct State {
    /// Polled, not yet fetched by the runner.
    pub(crate) buffer: VecDeque<Delivery<Receipt>>,
    /// The partitions assigned to this member.
    pub(crate) partitions: HashMap<Tp, Track>,
    next_epoch: u64,
    /// Paused at the broker, by the consumer thread.
    paused: HashSet<Tp>,
    /// The buffer reached its bound: every partition is paused until it is
    /// back at the high-water mark.
    full: bool,
    /// Partitions whose lane the runner paused, with their messages
    /// polled and not yet fetched, kept out of the buffer in order until
    /// the lane is resumed.
    pub(crate) lanes_paused: HashMap<Tp, VecDeque<Delivery<Receipt>>>,
    /// Retry-topic partitions whose next message is due later.
    held_until: HashMap<Tp, Instant>,
    /// The last consumer lag read per partition.
    pub(crate) lag: HashMap<Tp, i64>,
    /// Set when the consumer thread has ended.
    pub(crate) closed: bool,
}

/// One assigned partition: its offsets, and the assignment it belongs to
/// (a receipt from an earlier one settles nothing).
pub(crate) struct Track {
    pub(crate) epoch: u64,
    pub(crate) offsets: Offsets,
    /// `topic/partition`, the messages' lane when lanes are partitions.
    lane: Bytes,
}

impl Shared {
    pub(crate) fn new(config: KafkaConfig) -> Self {
        let topics = config.subscribed().into_iter().map(Arc::from).collect();
        let high_water = (config.concurrency * 4).max(256);
        Self {
            bound: high_water + high_water / 4,
            state: Mutex::new(State::default()),
            finished: Condvar::new(),
            ready: tokio::sync::Notify::new(),
            drained: Condvar::new(),
            stop: AtomicBool::new(false),
            stopping: tokio::sync::Notify::new(),
            config,
            topics,
            high_water,
        }
    }

    /// Marks the receipt's message finished, if its partition is still
    /// this member's in the same assignment.
    pub(crate) fn finish(&self, receipt: &Receipt) {
        let mut state = self.state.lock();
        if let Some(track) = state.partitions.get_mut(&receipt.tp)
            && track.epoch == receipt.epoch
        {
            track.offsets.finished(receipt.offset);
        }
        drop(state);
        self.finished.notify_all();
    }

    /// Tells the consumer thread and the background writers to stop.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.stopping.notify_waiters();
    }

    /// Sleeps `wait`; false if the source closed meanwhile (or had).
    ///
    /// # Cancel safety
    ///
    /// Holds nothing: dropping it only ends the wait.
    pub(crate) async fn sleep_unless_stopped(&self, wait: Duration) -> bool {
        let stopping = self.stopping.notified();
        tokio::pin!(stopping);
        stopping.as_mut().enable();
        if self.stop.load(Ordering::Acquire) {
            return false;
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => !self.stop.load(Ordering::Acquire),
            () = stopping => false,
        }
    }

    /// Whether the receipt's partition is still this member's, in the
    /// assignment the message came in.
    pub(crate) fn holds(&self, receipt: &Receipt) -> bool {
        self.state
            .lock()
            .partitions
            .get(&receipt.tp)
            .is_some_and(|t| t.epoch == receipt.epoch)
    }

    /// Marks the receipt's message as worked on by nobody: its offset is
    /// not committed, and a revoke or close does not wait for it.
    pub(crate) fn abandon(&self, receipt: &Receipt) {
        let mut state = self.state.lock();
        if let Some(track) = state.partitions.get_mut(&receipt.tp)
            && track.epoch == receipt.epoch
        {
            track.offsets.abandoned(receipt.offset);
        }
        drop(state);
        self.finished.notify_all();
    }

    /// Puts a delivery back at the front of the buffer, if its partition is
    /// still this member's in the same assignment (else the partition's
    /// owner has it from the committed offset).
    pub(crate) fn put_back(&self, delivery: Delivery<Receipt>) {
        let mut state = self.state.lock();
        let closed = state.closed;
        let Some(track) = state
            .partitions
            .get_mut(&delivery.receipt.tp)
            .filter(|t| t.epoch == delivery.receipt.epoch)
        else {
            return;
        };
        if !closed {
            track.offsets.in_work(delivery.receipt.offset);
            if let Some(parked) = state.lanes_paused.get_mut(&delivery.receipt.tp) {
                parked.push_front(delivery);
                return;
            }
            state.buffer.push_front(delivery);
            drop(state);
            self.ready.notify_one();
        }
    }

    /// The partition whose lane is `lane`, when lanes are partitions.
    fn lane_partition(&self, state: &State, lane: &Bytes) -> Option<Tp> {
        if self.config.lanes != Lanes::Partition {
            return None;
        }
        state
            .partitions
            .iter()
            .find(|(_, track)| track.lane == *lane)
            .map(|(tp, _)| tp.clone())
    }

    /// Keeps the messages of `lane`'s partition out of the buffer until
    /// [`resume_lane`](Self::resume_lane); the consumer thread pauses the
    /// partition at the broker.
    pub(crate) fn pause_lane(&self, lane: &Bytes) {
        let mut state = self.state.lock();
        let Some(tp) = self.lane_partition(&state, lane) else {
            return;
        };
        if state.lanes_paused.contains_key(&tp) {
            return;
        }
        let (parked, rest) = std::mem::take(&mut state.buffer)
            .into_iter()
            .partition(|d| d.receipt.tp == tp);
        state.buffer = rest;
        state.lanes_paused.insert(tp, parked);
    }

    /// Hands out `lane`'s messages again, those kept first, in order; the
    /// consumer thread resumes the partition at the broker.
    pub(crate) fn resume_lane(&self, lane: &Bytes) {
        let mut state = self.state.lock();
        let Some(tp) = self.lane_partition(&state, lane) else {
            return;
        };
        let Some(parked) = state.lanes_paused.remove(&tp) else {
            return;
        };
        let any = !parked.is_empty();
        for delivery in parked.into_iter().rev() {
            state.buffer.push_front(delivery);
        }
        drop(state);
        if any {
            self.ready.notify_one();
        }
    }

    fn topic(&self, name: &str) -> Arc<str> {
        self.topics
            .iter()
            .find(|t| &***t == name)
            .cloned()
            .unwrap_or_else(|| Arc::from(name))
    }

    fn tpl(parts: impl IntoIterator<Item = (Tp, Offset)>) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in parts {
            // Only fails for a partition listed twice.
            let _ = tpl.add_partition_offset(&topic, partition, offset);
        }
        tpl
    }
}

/// `idem_kafka_consumer_lag{group,topic,partition}`.
fn lag_gauge(group: &str, topic: &str, partition: i32) -> metrics::Gauge {
    metrics::gauge!(
        "idem_kafka_consumer_lag",
        "group" => group.to_owned(),
        "topic" => topic.to_owned(),
        "partition" => partition.to_string(),
    )
}

/// The consumer's callbacks: rebalances, commits, statistics.
pub(crate) struct Context {
    pub(crate) shared: Arc<Shared>,
}

impl ClientContext for Context {
    fn stats(&self, statistics: Statistics) {
        let group = &self.shared.config.group;
        let mut state = self.shared.state.lock();
        for (topic, t) in &statistics.topics {
            for (&partition, p) in &t.partitions {
                // What is not yet finished: past the offset the source
                // stored for its last finished message, else past the
                // last commit, else the whole partition (nothing finished
                // here yet). Messages fetched into the runner but not
                // finished count, as they would come again after a crash.
                let lag = if p.consumer_lag_stored >= 0 {
                    p.consumer_lag_stored
                } else if p.committed_offset >= 0 && p.hi_offset >= 0 {
                    p.hi_offset - p.committed_offset
                } else if p.hi_offset >= 0 && p.lo_offset >= 0 {
                    p.hi_offset - p.lo_offset
                } else {
                    continue;
                };
                if partition < 0 || lag < 0 {
                    continue;
                }
                let tp = (self.shared.topic(topic), partition);
                if !state.partitions.contains_key(&tp) {
                    continue;
                }
                lag_gauge(group, topic, partition).set(lag as f64);
                state.lag.insert(tp, lag);
            }
        }
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.revoke(consumer, tpl);
        }
    }

    fn post_rebalance(&self, _consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let mut state = self.shared.state.lock();
            for e in tpl.elements() {
                let tp = (self.shared.topic(e.topic()), e.partition());
                state.paused.remove(&tp);
                state.held_until.remove(&tp);
                if !state.partitions.contains_key(&tp) {
                    let epoch = state.next_epoch;
                    state.next_epoch += 1;
                    let lane = Bytes::from(format!("{}/{}", tp.0, tp.1));
                    state.partitions.insert(
                        tp,
                        Track {
                            epoch,
                            offsets: Offsets::default(),
                            lane,
                        },
                    );
                }
            }
            tracing::info!(assigned = tpl.count(), group = %self.shared.config.group, "partitions assigned");
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(error = %e, "committing offsets failed; they are committed again");
            let mut state = self.shared.state.lock();
            for e in offsets.elements() {
                let tp = (self.shared.topic(e.topic()), e.partition());
                if let Some(track) = state.partitions.get_mut(&tp) {
                    track.offsets.uncommitted();
                }
            }
        }
    }
}

impl Context {
    /// Takes back the buffered messages of the revoked partitions, waits
    /// (up to the revoke grace) for those in work to finish, commits what
    /// finished, and forgets the partitions.
    fn revoke(&self, consumer: &BaseConsumer<Self>, tpl: &TopicPartitionList) {
        let shared = &self.shared;
        let revoked: Vec<Tp> = tpl
            .elements()
            .iter()
            .map(|e| (shared.topic(e.topic()), e.partition()))
            .collect();
        // Lost (the session timed out): the partitions are someone else's
        // already, and a commit would be refused.
        let lost = consumer.assignment_lost();
        let mut state = shared.state.lock();
        let mut taken_back: HashMap<Tp, i64> = HashMap::new();
        state.buffer.retain(|d| {
            if revoked.contains(&d.receipt.tp) {
                let first = taken_back.entry(d.receipt.tp.clone()).or_insert(i64::MAX);
                *first = (*first).min(d.receipt.offset);
                false
            } else {
                true
            }
        });
        for tp in &revoked {
            if let Some(parked) = state.lanes_paused.remove(tp)
                && let Some(first) = parked.front()
            {
                let first_taken = taken_back.entry(tp.clone()).or_insert(i64::MAX);
                *first_taken = (*first_taken).min(first.receipt.offset);
            }
        }
        for (tp, first) in taken_back {
            if let Some(track) = state.partitions.get_mut(&tp) {
                track.offsets.forget_from(first);
            }
        }
        let deadline = Instant::now() + shared.config.revoke_grace;
        let unfinished = |state: &State| {
            revoked
                .iter()
                .filter_map(|tp| state.partitions.get(tp))
                .map(|t| t.offsets.unfinished())
                .sum::<usize>()
        };
        while !lost && unfinished(&state) > 0 {
            if shared.finished.wait_until(&mut state, deadline).timed_out() {
                tracing::warn!(
                    unfinished = unfinished(&state),
                    grace = ?shared.config.revoke_grace,
                    "partitions revoked with work still running; their next owner gets those messages again"
                );
                break;
            }
        }
        let mut commit = Vec::new();
        // librdkafka keeps a partition paused across assignments: resumed
        // as it goes, it is read when it comes back.
        let paused: Vec<Tp> = revoked
            .iter()
            .filter(|tp| state.paused.contains(*tp))
            .cloned()
            .collect();
        for tp in &revoked {
            if let Some(track) = state.partitions.remove(tp)
                && let Some(next) = track.offsets.to_commit()
                && !lost
            {
                commit.push((tp.clone(), Offset::Offset(next)));
            }
            state.paused.remove(tp);
            state.held_until.remove(tp);
            // The partition's lag is its next owner's to report: a gauge
            // left at its last value here would count the lag twice.
            if state.lag.remove(tp).is_some() {
                lag_gauge(&shared.config.group, &tp.0, tp.1).set(0.0);
            }
        }
        drop(state);
        if !paused.is_empty() {
            let _ = consumer.resume(&Shared::tpl(
                paused.into_iter().map(|tp| (tp, Offset::Invalid)),
            ));
        }
        if !commit.is_empty()
            && let Err(e) = consumer.commit(&Shared::tpl(commit), CommitMode::Sync)
        {
            tracing::warn!(error = %e, "committing the revoked partitions' offsets failed; their next owner gets those messages again");
        }
        tracing::info!(revoked = revoked.len(), lost, "partitions revoked");
    }
}

/// The consumer thread's loop, until the source is closed or dropped.
///
/// While the buffer is at its high-water mark the thread waits for the
/// runner to take from it, but polls at least every 100 ms (a message more
/// each time), so that rebalances are served. Should the buffer still grow
/// to its bound (the runner stopped fetching), every partition is paused
/// at the broker until the runner has taken it back to the high-water
/// mark: memory stays bounded whatever the runner does. Pausing at the
/// high-water mark itself made every resume a fresh fetch, which held
/// throughput to a few hundred messages a second (BENCHMARKS.md, "Kafka");
/// a runner that keeps fetching never reaches the bound.
pub(crate) fn run(consumer: BaseConsumer<Context>, shared: Arc<Shared>) {
    let mut last_commit = Instant::now();
    while !shared.stop.load(Ordering::Acquire) {
        {
            let mut state = shared.state.lock();
            let buffered = state.buffer.len();
            if buffered >= shared.bound {
                state.full = true;
            } else if buffered <= shared.high_water {
                state.full = false;
            }
            if !state.full && buffered >= shared.high_water {
                shared
                    .drained
                    .wait_for(&mut state, Duration::from_millis(100));
            }
        }
        pause_and_resume(&consumer, &shared);
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => take(&consumer, &shared, &m),
            Some(Err(e)) => tracing::warn!(error = %e, "Kafka consumer error"),
            None => {}
        }
        if last_commit.elapsed() >= shared.config.commit_interval {
            commit(&consumer, &shared, CommitMode::Async);
            last_commit = Instant::now();
        }
    }
    commit(&consumer, &shared, CommitMode::Sync);
    // Leaves the group: the revoke callback takes the buffered messages
    // back and waits for those in work.
    drop(consumer);
    let mut state = shared.state.lock();
    state.closed = true;
    state.buffer.clear();
    state.lanes_paused.clear();
    state.partitions.clear();
    drop(state);
    shared.ready.notify_one();
}

/// Buffers a polled message, or, from a retry topic before it is due,
/// seeks back to it and holds its partition until then.
fn take(consumer: &BaseConsumer<Context>, shared: &Shared, m: &BorrowedMessage<'_>) {
    let tp = (shared.topic(m.topic()), m.partition());
    let offset = m.offset();
    if *tp.0 != *shared.config.topic
        && let Some(due) = record::due(m)
    {
        let now = now_ms();
        if due > now {
            if let Err(e) =
                consumer.seek(&tp.0, tp.1, Offset::Offset(offset), Duration::from_secs(10))
            {
                tracing::warn!(error = %e, topic = %tp.0, "seeking back to a retry not yet due failed; it runs early");
            } else {
                let wait = Duration::from_millis((due - now) as u64);
                shared
                    .state
                    .lock()
                    .held_until
                    .insert(tp, Instant::now() + wait);
                return;
            }
        }
    }
    let by_key = shared.config.lanes == Lanes::Key;
    let (mut message, record_key, origin) = record::message(
        m,
        by_key
            .then(|| m.key().map(Bytes::copy_from_slice))
            .flatten(),
    );
    let mut state = shared.state.lock();
    let Some(track) = state.partitions.get_mut(&tp) else {
        return;
    };
    if !track.offsets.delivered(offset) {
        return;
    }
    if !by_key {
        message.lane = Some(track.lane.clone());
    }
    let receipt = Receipt {
        tp,
        offset,
        epoch: track.epoch,
        record_key,
        origin,
    };
    let delivery = Delivery { message, receipt };
    if let Some(parked) = state.lanes_paused.get_mut(&delivery.receipt.tp) {
        // Polled before the pause reached the broker.
        parked.push_back(delivery);
        return;
    }
    let was_empty = state.buffer.is_empty();
    state.buffer.push_back(delivery);
    drop(state);
    if was_empty {
        shared.ready.notify_one();
    }
}

/// Pauses at the broker the partitions that must not be read now, and
/// resumes the others: every partition while the buffer is full, a
/// partition whose lane the runner paused, and a retry topic's partition
/// while its next message is not due. A paused
/// partition's prefetched messages are dropped by librdkafka; it reads on
/// from the last message polled when resumed, so nothing is lost or
/// reordered.
fn pause_and_resume(consumer: &BaseConsumer<Context>, shared: &Shared) {
    let (pause, resume) = {
        let mut state = shared.state.lock();
        if state.held_until.is_empty()
            && state.paused.is_empty()
            && state.lanes_paused.is_empty()
            && !state.full
        {
            return;
        }
        let now = Instant::now();
        state.held_until.retain(|_, until| *until > now);
        let want: HashSet<Tp> = if state.full {
            state.partitions.keys().cloned().collect()
        } else {
            state
                .held_until
                .keys()
                .chain(state.lanes_paused.keys())
                .cloned()
                .collect()
        };
        if want == state.paused {
            return;
        }
        let pause: Vec<Tp> = want.difference(&state.paused).cloned().collect();
        let resume: Vec<Tp> = state.paused.difference(&want).cloned().collect();
        state.paused = want;
        (pause, resume)
    };
    let all = |tps: Vec<Tp>| Shared::tpl(tps.into_iter().map(|tp| (tp, Offset::Invalid)));
    if !pause.is_empty()
        && let Err(e) = consumer.pause(&all(pause))
    {
        tracing::warn!(error = %e, "pausing partitions failed");
    }
    if !resume.is_empty()
        && let Err(e) = consumer.resume(&all(resume))
    {
        tracing::warn!(error = %e, "resuming partitions failed");
    }
}

/// Commits each partition's finished prefix that moved since the last
/// commit.
fn commit(consumer: &BaseConsumer<Context>, shared: &Shared, mode: CommitMode) {
    let moved: Vec<(Tp, Offset)> = {
        let mut state = shared.state.lock();
        state
            .partitions
            .iter_mut()
            .filter_map(|(tp, track)| {
                let next = track.offsets.to_commit()?;
                // Counted as committed now; the commit callback undoes it
                // if the broker refuses.
                track.offsets.committed(next);
                Some((tp.clone(), Offset::Offset(next)))
            })
            .collect()
    };
    if moved.is_empty() {
        return;
    }
    if let Err(e) = consumer.commit(&Shared::tpl(moved), mode) {
        tracing::warn!(error = %e, "committing offsets failed; they are committed again");
        let mut state = shared.state.lock();
        for track in state.partitions.values_mut() {
            track.offsets.uncommitted();
        }
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
