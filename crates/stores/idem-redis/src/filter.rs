//! The shared key filter ([`Tier::SHARES_FILTER`](idem_core::tier::Tier)):
//! a tiered store's Bloom filter kept in the Redis hot tier, so that every
//! process in front of one cold tier sees every key any of them moved
//! there.
//!
//! # Layout
//!
//! On a cluster the filter is cut into one part per hash slot, each part
//! in the slot of the records it answers for: a key's bits live on the
//! master that holds its record, so whatever that master loses (a failover,
//! a restart from an older snapshot) is a suffix of its writes, and a key's
//! bits, set before its record is moved and its hot copy shortened, are
//! never lost while the shortening stays. A standalone Redis holds one
//! part. A part's keys, for filter `NAME` in the slot whose tag is `T`:
//!
//! - `idem:{T}:f:NAME:E:W`: the bits of generation `W` (Redis's time / the
//!   window), which expires `generations` windows after it began, under
//!   the epoch `E` of the settings kept;
//! - `idem:{T}:f:NAME:E:ready`: set once a rebuild has inserted every key
//!   of the cold tier; while it is missing, every lookup there answers
//!   "maybe".
//!
//! Beside them, `idem:{filter:NAME}` keeps the settings every process uses
//! (seed, size, window), and `idem:{filter:NAME}:rebuilding` the lease of
//! the process rebuilding it. A key's positions are derived from its keyed
//! 64-bit hash by double hashing within its part.

use std::sync::OnceLock;
use std::time::Duration;

use idem_core::StoreError;
use idem_core::tier::{FilterProbe, SharedFilter};
use redis::{Cmd, Value};

use crate::cluster::slot;
use crate::conn::Conn;
use crate::layout::{millis, record_key};
use crate::reply::{corrupt, number, unavailable};
use crate::script::ScriptItem;
use crate::store::Inner;

/// Hash slots of a cluster.
const SLOTS: usize = 16_384;

/// A tag whose hash slot is `slot`, for each slot: the decimal numbers
/// from 0, the first to land in each.
fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); SLOTS];
        let mut left = SLOTS;
        let mut n = 0u64;
        while left > 0 {
            let tag = n.to_string();
            let s = usize::from(self::slot(tag.as_bytes()));
            if tags[s].is_empty() {
                tags[s] = tag;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot)]
}

impl Inner {
    fn cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Bits in one part of `filter`: its bits shared out over the slots on
    /// a cluster, a multiple of 64.
    fn part_bits(&self, filter: &SharedFilter) -> u64 {
        let parts = if self.cluster() { SLOTS as u64 } else { 1 };
        filter.bits.div_ceil(parts).next_multiple_of(64).max(64)
    }

    /// The prefix of `filter`'s keys in the part for `slot`.
    fn part_prefix(&self, filter: &SharedFilter, slot: u16) -> String {
        let tag = if self.cluster() {
            slot_tag(slot)
        } else {
            "filter"
        };
        format!("idem:{{{tag}}}:f:{}:{:x}:", filter.name, filter.epoch)
    }

    /// The positions of `hash` in a part of `bits`, packed as the scripts
    /// read them.
    fn positions(filter: &SharedFilter, bits: u64, hash: u64) -> Vec<u8> {
        let (h1, h2) = (hash & 0xffff_ffff, (hash >> 32) | 1);
        (0..u64::from(filter.hashes))
            .flat_map(|j| (((h1 + j * h2) % bits) as u32).to_le_bytes())
            .collect()
    }

    /// Runs `script` (`filter_check` or `filter_insert`) over `probes`,
    /// one call per slot and chunk, all in one round trip.
    async fn filter_script(
        &self,
        script: &redis::Script,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Vec<Result<(Value, Value), StoreError>> {
        let bits = self.part_bits(filter);
        let keys: Vec<Vec<u8>> = probes.iter().map(|p| record_key(&p.key)).collect();
        let calls = keys
            .iter()
            .map(|k| ScriptItem {
                key: k.clone(),
                group: 0,
            })
            .collect();
        let window = millis(filter.window).max(1);
        let shared = |chunk: &[usize], cmd: &mut Cmd| {
            cmd.arg(self.part_prefix(filter, slot(&keys[chunk[0]])))
                .arg(window)
                .arg(filter.generations)
                .arg(filter.hashes);
        };
        let own = |i: usize, cmd: &mut Cmd| {
            cmd.arg(Self::positions(filter, bits, probes[i].hash));
        };
        self.run_script(&self.conn, script, calls, shared, own, 0)
            .await
    }

    pub(crate) async fn agree_filter(
        &self,
        proposed: &SharedFilter,
    ) -> Result<SharedFilter, StoreError> {
        if self.part_bits(proposed) > 1 << 32 {
            return Err(StoreError::unavailable(format!(
                "a shared key filter of {} bits per generation is too large for Redis (at most 2^32 bits a key); lower --filter-items or raise the false-positive rate",
                proposed.bits
            )));
        }
        let v: Value = self
            .scripts
            .filter_agree
            .key(format!("idem:{{filter:{}}}", proposed.name))
            .arg(format!("{:032x}", proposed.seed))
            .arg(proposed.bits)
            .arg(proposed.hashes)
            .arg(millis(proposed.window))
            .arg(proposed.generations)
            .arg(proposed.epoch)
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let fields = match &v {
            Value::Array(f) if f.len() == 6 => f,
            _ => return Err(corrupt("the shared key filter's settings", &v)),
        };
        let text = |i: usize| match &fields[i] {
            Value::BulkString(b) => std::str::from_utf8(b).ok().map(str::to_owned),
            _ => None,
        };
        let agreed = (|| {
            Some(SharedFilter {
                name: proposed.name.clone(),
                seed: u128::from_str_radix(&text(0)?, 16).ok()?,
                bits: number(&fields[1])?,
                hashes: u32::try_from(number(&fields[2])?).ok()?,
                window: Duration::from_millis(number(&fields[3])?),
                generations: u32::try_from(number(&fields[4])?).ok()?,
                epoch: number(&fields[5])?,
            })
        })();
        agreed.ok_or_else(|| corrupt("the shared key filter's settings", &v))
    }

    pub(crate) async fn filter_insert(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<(), StoreError> {
        for reply in self
            .filter_script(&self.scripts.filter_insert, filter, probes)
            .await
        {
            reply?;
        }
        Ok(())
    }

    pub(crate) async fn filter_check(
        &self,
        filter: &SharedFilter,
        probes: &[FilterProbe],
    ) -> Result<Vec<bool>, StoreError> {
        self.filter_script(&self.scripts.filter_check, filter, probes)
            .await
            .into_iter()
            .map(|reply| match number(&reply?.1) {
                Some(n) if n <= 1 => Ok(n == 1),
                _ => Err(StoreError::Corrupt(
                    "the shared key filter answered neither 0 nor 1".into(),
                )),
            })
            .collect()
    }

    /// Reads (or, with `mark`, sets) the readiness of every part; whether
    /// all are ready.
    pub(crate) async fn filter_readiness(
        &self,
        filter: &SharedFilter,
        mark: bool,
    ) -> Result<bool, StoreError> {
        let slots: Vec<u16> = if self.cluster() {
            (0..SLOTS as u16).collect()
        } else {
            vec![0]
        };
        // Plain commands, a thousand slots a round trip: all 16 384 at once
        // are more than a cluster answers within its response timeout.
        let mut ready = true;
        for part in slots.chunks(1_024) {
            let keys: Vec<String> = part
                .iter()
                .map(|&s| format!("{}ready", self.part_prefix(filter, s)))
                .collect();
            let cmds: Vec<Cmd> = keys
                .iter()
                .map(|k| {
                    let mut cmd = redis::cmd(if mark { "SET" } else { "EXISTS" });
                    cmd.arg(k);
                    if mark {
                        cmd.arg("1");
                    }
                    cmd
                })
                .collect();
            for reply in self.pipelined(&self.conn, &cmds, &keys).await {
                let reply = reply.map_err(unavailable)?;
                ready &= mark || number(&reply) == Some(1);
            }
        }
        Ok(ready)
    }

    pub(crate) async fn filter_rebuild_lease(
        &self,
        filter: &SharedFilter,
        holder: &str,
        hold: Duration,
    ) -> Result<bool, StoreError> {
        let v: Value = self
            .scripts
            .filter_lease
            .key(format!("idem:{{filter:{}}}:rebuilding", filter.name))
            .arg(holder)
            .arg(millis(hold).max(1))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(number(&v) == Some(1))
    }
}

#[cfg(test)]
mod tests {
    use super::{SLOTS, slot, slot_tag};

    #[test]
    fn every_slot_has_a_tag_in_it() {
        for s in 0..SLOTS as u16 {
            assert_eq!(slot(slot_tag(s).as_bytes()), s);
            assert_eq!(
                slot(format!("idem:{{{}}}:f:x:1", slot_tag(s)).as_bytes()),
                s
            );
        }
    }
}
