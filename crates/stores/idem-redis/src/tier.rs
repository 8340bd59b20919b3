//! The store as a tier of a tiered store (docs/contract.md §2, "Tiers"):
//! imports, the token high-water mark and floor, and the completed keys.

use std::time::{Duration, Instant};

use idem_core::tier::{FilterProbe, Handover, ImportItem, Imported, SharedFilter, Tier};
use idem_core::{FencingToken, Key, StoreError};
use redis::{Cmd, Value};

use crate::conn::Conn;
use crate::layout::{
    HIGH_WATER_KEY, RECORD_PATTERN, handover_list_key, handover_member, handover_of, key_of,
    millis, record_key,
};
use crate::reply::{LATEST_MS, corrupt, number, pack_completed, unavailable};
use crate::script::ScriptItem;
use crate::store::{Inner, RedisStore, TOKENS_PER_MS};

/// The longest `raise_token_floor` waits for Redis's clock to pass a floor.
const FLOOR_WAIT: Duration = Duration::from_secs(1);

/// How many keys `completed_keys` looks at in one round trip.
const KEYS_PER_LOOK: usize = 1024;

/// Most handovers listed or unlisted in one command.
const HANDOVERS_PER_CALL: usize = 1024;

/// The Redis store as either tier of a tiered store.
///
/// - **`import_many`** raises the high-water mark to the batch's highest
///   token (one script call), then writes the records, one script call per
///   hash slot, all in one round trip. An imported record is packed as
///   `complete` leaves one, with its own token and times, and Redis
///   forgets it when its retention ends.
/// - **The high-water mark** is one key, `idem:token-high-water` (on a
///   cluster, in one hash slot), without expiry: the highest token
///   imported or floor raised, as durable as Redis's persistence (RDB or
///   AOF) makes it. [`token_high_water`](Tier::token_high_water) answers
///   the larger of it and Redis's time in ms × 1 024 + 1 023 (on a
///   cluster, the latest master's), which bounds every token `begin` has
///   issued: a token is the key's last one plus one, at least the time × 1
///   024 (see the [crate docs](crate#fencing-tokens)).
/// - **`raise_token_floor`**: since new tokens follow Redis's clock, a
///   floor ahead of that clock is passed only by waiting. It stores the
///   floor and waits up to a second for Redis's clock (on a cluster, every
///   master's) to pass it; a floor further ahead is refused and nothing is
///   stored.
/// - **`completed_keys`** reads the whole keyspace on every call: `SCAN`
///   on every master for record keys, then, in key order after `after`,
///   one script call per hash slot and round trip that tells which are
///   live completed records, until the page is full. Paging through N
///   record keys L at a time scans all N keys N / L times, and each call
///   holds every record key in memory meanwhile: it is meant for
///   rebuilding a filter at start, with pages as large as memory allows.
///
/// An imported token is expected to lie below Redis's time × 1 024, as
/// tokens of a tier whose floor was raised to this store's high-water
/// mark do. A token ahead of that clock holds while its record lives; once
/// Redis forgets the record, the key's next token follows the clock again.
impl Tier for RedisStore {
    async fn import_many(&self, items: &[ImportItem]) -> Result<Vec<Imported>, StoreError> {
        let inner = self.state();
        inner.limits.check_import_items(items)?;
        let Some(highest) = items.iter().map(|i| i.record.token.get()).max() else {
            return Ok(Vec::new());
        };
        // The mark first: a call cut short in between leaves the mark
        // raised and nothing written, never a record it does not count.
        inner.raise_high_water(highest).await?;
        // On an error, the items that were written stay written: imported
        // again, they are kept.
        inner.import_items(items).await.into_iter().collect()
    }

    async fn raise_token_floor(&self, floor: FencingToken) -> Result<(), StoreError> {
        let inner = self.state();
        // From this millisecond on, every token Redis issues (its time ×
        // 1 024 or more) exceeds the floor.
        let passes_at = floor.get() / TOKENS_PER_MS + 1;
        let started = Instant::now();
        let mut earliest = inner.clocks().await?.0;
        if passes_at.saturating_sub(earliest) > millis(FLOOR_WAIT) {
            return Err(clock_behind(floor, passes_at - earliest));
        }
        inner.raise_high_water(floor.get()).await?;
        while earliest < passes_at {
            let left = FLOOR_WAIT.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(clock_behind(floor, passes_at - earliest));
            }
            tokio::time::sleep(Duration::from_millis(passes_at - earliest).min(left)).await;
            earliest = inner.clocks().await?.0;
        }
        Ok(())
    }

    async fn record_high_water(&self, token: FencingToken) -> Result<(), StoreError> {
        self.state().raise_high_water(token.get()).await.map(drop)
    }

    async fn token_high_water(&self) -> Result<FencingToken, StoreError> {
        let inner = self.state();
        let (mark, now) = inner.raise_high_water(0).await?;
        // On a cluster each master issues tokens on its own clock.
        let latest = match inner.conn {
            Conn::Single(_) => now,
            Conn::Cluster(_) => inner.clocks().await?.1.max(now),
        };
        let issued = latest
            .saturating_mul(TOKENS_PER_MS)
            .saturating_add(TOKENS_PER_MS - 1);
        Ok(FencingToken::new(mark.max(issued)))
    }

    const KEEPS_HANDOVERS: bool = true;

    const SHARES_FILTER: bool = true;

    async fn agree_filter(&self, proposed: &SharedFilter) -> Result<SharedFilter, StoreError> {
        self.state().agree_filter(proposed).await
    }

    async fn filter_insert(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<(), StoreError> {
        self.state().filter_insert(filter, probes).await
    }

    async fn filter_check(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<Vec<bool>, StoreError> {
        self.state().filter_check(filter, probes).await
    }

    async fn filter_ready(&self, filter: &SharedFilter) -> Result<bool, StoreError> {
        self.state().filter_readiness(filter, false).await
    }

    async fn filter_mark_ready(&self, filter: &SharedFilter) -> Result<(), StoreError> {
        self.state().filter_readiness(filter, true).await.map(drop)
    }

    async fn filter_rebuild_lease(
        &self,
        filter: &SharedFilter,
        holder: &str,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        self.state()
            .filter_rebuild_lease(filter, holder, hold)
            .await
    }

    async fn shorten(&self, items: &[Handover], keep: Duration) -> Result<(), StoreError> {
        let inner = self.state();
        let calls = items
            .iter()
            .map(|i| ScriptItem {
                key: record_key(&i.key),
                group: 0,
            })
            .collect();
        let keep = millis(keep);
        let shared = |_: &[usize], cmd: &mut Cmd| {
            cmd.arg(keep);
        };
        let own = |i: usize, cmd: &mut Cmd| {
            cmd.arg(&items[i].token.get().to_le_bytes()[..]);
        };
        let script = &inner.scripts.shorten;
        for reply in inner
            .run_script(&inner.conn, script, calls, shared, own, 0)
            .await
        {
            reply?;
        }
        Ok(())
    }

    async fn list_handovers(&self, list: &str, items: &[Handover]) -> Result<(), StoreError> {
        let inner = self.state();
        for chunk in items.chunks(HANDOVERS_PER_CALL) {
            let mut call = inner.scripts.list_handovers.key(handover_list_key(list));
            for h in chunk {
                call.arg(handover_member(h));
            }
            call.invoke_async::<Value>(&mut inner.conn())
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn due_handovers(
        &self,
        list: &str,
        listed_for: Duration,
        limit: usize,
    ) -> Result<Vec<Handover>, StoreError> {
        let inner = self.state();
        let members: Vec<Vec<u8>> = inner
            .scripts
            .handovers_due
            .key(handover_list_key(list))
            .arg(millis(listed_for))
            .arg(limit)
            .invoke_async(&mut inner.conn())
            .await
            .map_err(unavailable)?;
        // A member idem did not write is skipped: it names no record.
        Ok(members.iter().filter_map(|m| handover_of(m)).collect())
    }

    async fn unlist_handovers(&self, list: &str, items: &[Handover]) -> Result<(), StoreError> {
        let inner = self.state();
        for chunk in items.chunks(HANDOVERS_PER_CALL) {
            let mut cmd = redis::cmd("ZREM");
            cmd.arg(handover_list_key(list));
            for h in chunk {
                cmd.arg(handover_member(h));
            }
            cmd.query_async::<Value>(&mut inner.conn())
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }

    async fn completed_keys(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<Key>, StoreError> {
        let inner = self.state();
        if limit == 0 {
            return Ok(Vec::new());
        }
        let after = after.map(Key::encode);
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = inner
            .scan_keys(RECORD_PATTERN)
            .await?
            .into_iter()
            .filter_map(|k| {
                let encoded = key_of(&k)?.encode();
                let wanted = after.as_deref().is_none_or(|a| &encoded[..] > a);
                wanted.then_some((encoded, k))
            })
            .collect();
        found.sort_unstable();
        found.dedup();
        let mut keys = Vec::new();
        for chunk in found.chunks(KEYS_PER_LOOK) {
            let live = inner
                .live_completed(chunk.iter().map(|(_, k)| k.clone()).collect())
                .await?;
            for ((encoded, _), live) in chunk.iter().zip(live) {
                if live {
                    keys.push(
                        Key::decode(encoded).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                    );
                    if keys.len() == limit {
                        return Ok(keys);
                    }
                }
            }
        }
        Ok(keys)
    }
}

impl Inner {
    /// Writes `items` (limits checked), in as few script calls as slots
    /// allow; each item's answer on its own.
    async fn import_items(&self, items: &[ImportItem]) -> Vec<Result<Imported, StoreError>> {
        let calls = items
            .iter()
            .map(|i| ScriptItem {
                key: record_key(&i.key),
                group: 0,
            })
            .collect();
        let own = |i: usize, cmd: &mut Cmd| {
            let record = &items[i].record;
            let ends = record.expires_at.as_millis().min(LATEST_MS);
            cmd.arg(pack_completed(record)).arg(ends).arg(ends + 1);
        };
        self.run_script(&self.conn, &self.scripts.import, calls, |_, _| {}, own, 0)
            .await
            .into_iter()
            .map(|reply| {
                let (_, v) = reply?;
                match number(&v) {
                    Some(1) => Ok(Imported::Written),
                    Some(0) => Ok(Imported::Kept),
                    _ => Err(corrupt("import", &v)),
                }
            })
            .collect()
    }

    /// Which of the record keys `keys` hold a live completed record, each
    /// judged on its own master's clock.
    async fn live_completed(&self, keys: Vec<Vec<u8>>) -> Result<Vec<bool>, StoreError> {
        let calls = keys
            .into_iter()
            .map(|key| ScriptItem { key, group: 0 })
            .collect();
        let script = &self.scripts.completed;
        self.run_script(&self.conn, script, calls, |_, _| {}, |_, _| {}, 0)
            .await
            .into_iter()
            .map(|reply| {
                let (_, v) = reply?;
                match number(&v) {
                    Some(n) if n <= 1 => Ok(n == 1),
                    _ => Err(corrupt("completed_keys", &v)),
                }
            })
            .collect()
    }

    /// Raises the high-water mark to `at_least` when it is lower (0
    /// reads it); answers the mark and Redis's time (ms) on the node that
    /// keeps it.
    async fn raise_high_water(&self, at_least: u64) -> Result<(u64, u64), StoreError> {
        let v: Value = self
            .scripts
            .high_water
            .key(HIGH_WATER_KEY)
            .arg(at_least.to_string())
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        match &v {
            Value::Array(a) if a.len() == 2 => match (number(&a[0]), number(&a[1])) {
                (Some(mark), Some(now)) => Ok((mark, now)),
                _ => Err(corrupt("the token high-water mark", &v)),
            },
            _ => Err(corrupt("the token high-water mark", &v)),
        }
    }

    /// Redis's time (ms) on every master: the earliest and the latest.
    async fn clocks(&self) -> Result<(u64, u64), StoreError> {
        let masters = self.masters().await?;
        let times = futures_util::future::join_all(
            masters
                .iter()
                .map(|m| self.query_node(m, redis::cmd("TIME"))),
        )
        .await;
        let mut range: Option<(u64, u64)> = None;
        for time in times {
            let ms = time_ms(&time?)?;
            range = Some(range.map_or((ms, ms), |(lo, hi)| (lo.min(ms), hi.max(ms))));
        }
        range.ok_or_else(|| {
            StoreError::unavailable(
                "Redis Cluster lists no master that is up (CLUSTER NODES): wait for it to recover",
            )
        })
    }
}

/// `TIME`'s answer (seconds, microseconds) in milliseconds.
pub(crate) fn time_ms(v: &Value) -> Result<u64, StoreError> {
    let parts = match v {
        Value::Array(parts) if parts.len() == 2 => (number(&parts[0]), number(&parts[1])),
        _ => (None, None),
    };
    match parts {
        (Some(s), Some(us)) => Ok(s.saturating_mul(1000).saturating_add(us / 1000)),
        _ => Err(corrupt("TIME", v)),
    }
}

/// Redis's clock is further behind a token floor than
/// `raise_token_floor` waits.
#[derive(Debug, thiserror::Error)]
#[error(
    "Redis's clock (on a cluster, its slowest master's) is {behind_ms} ms behind token floor {floor}, \
     the tokens another tier holds or has reserved; Redis's tokens follow its clock (ms × 1024), \
     so new ones would not all exceed the floor: set the clocks of Redis and of the other tier's \
     server right (NTP), or open again once Redis's clock has passed the floor"
)]
struct ClockBehind {
    floor: u64,
    behind_ms: u64,
}

fn clock_behind(floor: FencingToken, behind_ms: u64) -> StoreError {
    StoreError::unavailable(ClockBehind {
        floor: floor.get(),
        behind_ms,
    })
}
