//! Table names and sharding, shared by every SQL store.

use std::fmt;

use idem_core::Key;
use xxhash_rust::xxh3::xxh3_64;

/// The record tables of one store: `PREFIX` when there is one shard,
/// `PREFIX_00` … `PREFIX_NN` when the table is split by a stable hash of the
/// key. The prefix is checked against identifier rules, never taken raw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tables {
    prefix: String,
    shards: u16,
}

/// A table prefix or shard count the store refuses.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidTable(String);

/// Longest prefix: leaves room for `_NN` and the index names within the
/// 63-character identifier limit of PostgreSQL (MySQL allows 64).
pub const MAX_PREFIX_BYTES: usize = 40;

/// Most shards.
pub const MAX_SHARDS: u16 = 256;

impl Tables {
    /// Tables named after `prefix`, split into `shards` (1 = not split).
    pub fn new(prefix: &str, shards: u16) -> Result<Self, InvalidTable> {
        let ok_start = prefix
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
        let ok_rest = prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok_start || !ok_rest || prefix.len() > MAX_PREFIX_BYTES {
            return Err(InvalidTable(format!(
                "table prefix {prefix:?} is not allowed: use 1 to {MAX_PREFIX_BYTES} characters of a-z, 0-9 and _, starting with a letter or _ (e.g. idem_records)"
            )));
        }
        if shards == 0 || shards > MAX_SHARDS {
            return Err(InvalidTable(format!(
                "{shards} shards: give 1 to {MAX_SHARDS} (16 is the classic split)"
            )));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
            shards,
        })
    }

    /// How many tables.
    pub fn shards(&self) -> u16 {
        self.shards
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The shard `key` lives in: a stable hash of its namespace and bytes,
    /// the same on every host and across versions.
    pub fn shard_of(&self, key: &Key) -> u16 {
        (xxh3_64(&key.encode()) % u64::from(self.shards)) as u16
    }

    /// The name of shard `shard` (unquoted; every character is safe).
    pub fn name(&self, shard: u16) -> TableName<'_> {
        TableName {
            tables: self,
            shard,
        }
    }

    /// The table `key` lives in.
    pub fn for_key(&self, key: &Key) -> TableName<'_> {
        self.name(self.shard_of(key))
    }

    /// Every table's name.
    pub fn all(&self) -> impl Iterator<Item = TableName<'_>> {
        (0..self.shards).map(|s| self.name(s))
    }
}

/// One table's name; `Display` writes it.
#[derive(Clone, Copy, Debug)]
pub struct TableName<'a> {
    tables: &'a Tables,
    shard: u16,
}

impl fmt::Display for TableName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.tables.shards == 1 {
            f.write_str(&self.tables.prefix)
        } else {
            let width = if self.tables.shards > 100 { 3 } else { 2 };
            write!(f, "{}_{:0width$}", self.tables.prefix, self.shard)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_follow_identifier_rules() {
        for bad in [
            "",
            "1abc",
            "Idem",
            "idem-records",
            "idem;drop",
            "a\"b",
            &"a".repeat(41),
        ] {
            assert!(Tables::new(bad, 1).is_err(), "{bad:?}");
        }
        assert!(Tables::new("idem_records", 16).is_ok());
        assert!(Tables::new("_x9", 1).is_ok());
        assert!(Tables::new("idem", 0).is_err());
        assert!(Tables::new("idem", 257).is_err());
    }

    #[test]
    fn names_and_shards_are_stable() {
        let one = Tables::new("idem", 1).unwrap();
        let key = Key::new("orders", "m-1").unwrap();
        assert_eq!(one.for_key(&key).to_string(), "idem");
        let sixteen = Tables::new("idem", 16).unwrap();
        let names: Vec<String> = sixteen.all().map(|t| t.to_string()).collect();
        assert_eq!(names.first().unwrap(), "idem_00");
        assert_eq!(names.last().unwrap(), "idem_15");
        // The hash is part of the on-disk layout: it must never change.
        assert_eq!(sixteen.shard_of(&key), sixteen.shard_of(&key.clone()));
        let spread: std::collections::HashSet<u16> = (0..1000)
            .map(|i| sixteen.shard_of(&Key::new("orders", format!("m-{i}")).unwrap()))
            .collect();
        assert_eq!(spread.len(), 16);
    }
}
