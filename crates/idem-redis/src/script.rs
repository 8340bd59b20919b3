//! Running scripts: many items in few calls, in one pipelined round trip,
//! loading the scripts again when Redis has forgotten them.

use idem_core::StoreError;
use redis::aio::ConnectionLike;
use redis::{Cmd, Script, Value};

use crate::cluster::slot;
use crate::conn::Conn;
use crate::reply::{corrupt, unavailable};
use crate::store::Inner;

/// The store's scripts.
pub(crate) struct Scripts {
    pub(crate) begin: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
    pub(crate) extend: Script,
}

/// A script from `scripts/`, its parts in order: the shared ones it needs
/// (`time.lua`, `record.lua`) and its own. Each part up to the point where a
/// call returns is run on that call, so a script takes only what it uses,
/// and `begin` reads `record.lua` after its common case.
macro_rules! script {
    ($($file:literal),+) => {
        Script::new(concat!($(include_str!(concat!("scripts/", $file))),+))
    };
}

impl Scripts {
    pub(crate) fn new() -> Self {
        Scripts {
            begin: script!("time.lua", "begin_first.lua", "record.lua", "begin.lua"),
            complete: script!("time.lua", "complete.lua"),
            release: script!("time.lua", "record.lua", "release.lua"),
            extend: script!("time.lua", "record.lua", "extend.lua"),
        }
    }
}

/// One item of a many-item script call.
pub(crate) struct ScriptItem {
    /// Its record's key.
    pub(crate) key: Vec<u8>,
    /// Items of one group share a call (they share what the script takes
    /// once a call).
    pub(crate) group: u64,
}

/// Most items in one script call, so one call never holds Redis for long.
pub(crate) const ITEMS_PER_CALL: usize = 256;

impl Inner {
    /// Runs a many-item `script` over `items`: items are grouped by hash
    /// slot and by their `group` (what the script takes once a call: a
    /// lease, say), cut into calls of at most [`ITEMS_PER_CALL`], and all
    /// calls go out in one pipelined round trip (one per slot on a
    /// cluster). A call's arguments are what `shared(its items)` writes,
    /// then what `own(item)` writes for each item. Each call's reply starts
    /// with `lead` values of its own (Redis's time, say), then answers its
    /// items; a call of one item may instead answer with a value that is not
    /// an array, the item's answer alone. Answers each item, in order, with
    /// the first of its call's own values (nil when `lead` is 0 or the call
    /// answered alone).
    pub(crate) async fn run_script(
        &self,
        conn: &Conn,
        script: &Script,
        items: Vec<ScriptItem>,
        shared: impl Fn(&[usize], &mut Cmd),
        own: impl Fn(usize, &mut Cmd),
        lead: usize,
    ) -> Result<Vec<(Value, Value)>, StoreError> {
        let groups: Vec<Vec<usize>> = if items.len() == 1 {
            vec![vec![0]]
        } else {
            let cluster = matches!(conn, Conn::Cluster(_));
            let mut groups: std::collections::BTreeMap<(u16, u64), Vec<usize>> = Default::default();
            for (i, item) in items.iter().enumerate() {
                let slot = if cluster { slot(&item.key) } else { 0 };
                groups.entry((slot, item.group)).or_default().push(i);
            }
            groups.into_values().collect()
        };
        let mut cmds = Vec::new();
        let mut first_keys = Vec::new();
        let mut members = Vec::new();
        for idx in &groups {
            for chunk in idx.chunks(ITEMS_PER_CALL) {
                // Sized for the usual arguments, so it is written without
                // growing: keys, a few shared, two or so of each item's.
                let keys: usize = chunk.iter().map(|&i| items[i].key.len()).sum();
                let mut cmd = Cmd::with_capacity(6 + 3 * chunk.len(), 96 + keys + 32 * chunk.len());
                cmd.arg("EVALSHA").arg(script.get_hash()).arg(chunk.len());
                for &i in chunk {
                    cmd.arg(&items[i].key);
                }
                shared(chunk, &mut cmd);
                for &i in chunk {
                    own(i, &mut cmd);
                }
                cmds.push(cmd);
                first_keys.push(&items[chunk[0]].key[..]);
                members.push(chunk);
            }
        }
        let replies = self.pipelined(conn, &cmds, &first_keys).await?;
        let mut answers = vec![(Value::Nil, Value::Nil); items.len()];
        for (chunk, reply) in members.into_iter().zip(replies) {
            let mut per_item = match reply {
                Value::Array(per_item) => per_item,
                alone if chunk.len() == 1 => {
                    answers[chunk[0]] = (Value::Nil, alone);
                    continue;
                }
                _ => return Err(corrupt("a script call", &reply)),
            };
            if per_item.len() != lead + chunk.len() {
                return Err(corrupt("a script call", &Value::Array(per_item)));
            }
            let head = per_item.first().filter(|_| lead > 0).cloned();
            for (&i, v) in chunk.iter().zip(per_item.drain(lead..)) {
                answers[i] = (head.clone().unwrap_or(Value::Nil), v);
            }
        }
        Ok(answers)
    }

    /// Runs `cmds`, whose keys are `keys` (one each; may be empty for a
    /// single command), in one pipelined round trip: on a cluster, one
    /// pipeline per hash slot, all at once. Answers in order.
    pub(crate) async fn pipelined(
        &self,
        conn: &Conn,
        cmds: &[Cmd],
        keys: &[impl AsRef<[u8]>],
    ) -> Result<Vec<Value>, StoreError> {
        if matches!(conn, Conn::Single(_)) || cmds.len() == 1 {
            return self.pipeline(conn, cmds.iter()).await;
        }
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, k) in keys.iter().enumerate() {
            by_slot.entry(slot(k.as_ref())).or_default().push(i);
        }
        let groups = futures_util::future::try_join_all(
            by_slot
                .values()
                .map(|idx| self.pipeline(conn, idx.iter().map(|&i| &cmds[i]))),
        )
        .await?;
        let mut answers = vec![Value::Nil; cmds.len()];
        for (idx, replies) in by_slot.values().zip(groups) {
            for (&i, v) in idx.iter().zip(replies) {
                answers[i] = v;
            }
        }
        Ok(answers)
    }

    /// Runs `cmds` as one pipeline; loads the scripts and tries again once
    /// if Redis does not know them (after a restart or flush).
    pub(crate) async fn pipeline<'c>(
        &self,
        conn: &Conn,
        cmds: impl Iterator<Item = &'c Cmd>,
    ) -> Result<Vec<Value>, StoreError> {
        let cmds: Vec<&Cmd> = cmds.collect();
        let mut conn = conn.clone();
        let no_script = |e: &redis::RedisError| {
            e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        };
        // One command goes out as itself: a pipeline of one costs more.
        if let [cmd] = cmds[..] {
            let once = match cmd.query_async::<Value>(&mut conn).await {
                Err(e) if no_script(&e) => {
                    self.load_scripts(&mut conn).await?;
                    cmd.query_async(&mut conn).await
                }
                r => r,
            };
            return once.map(|v| vec![v]).map_err(unavailable);
        }
        let mut pipe = redis::pipe();
        for c in cmds {
            pipe.add_command(c.clone());
        }
        match pipe.query_async::<Vec<Value>>(&mut conn).await {
            Err(e) if no_script(&e) => {
                self.load_scripts(&mut conn).await?;
                pipe.query_async(&mut conn).await.map_err(unavailable)
            }
            r => r.map_err(unavailable),
        }
    }

    pub(crate) async fn load_scripts(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> Result<(), StoreError> {
        for s in [
            &self.scripts.begin,
            &self.scripts.complete,
            &self.scripts.release,
            &self.scripts.extend,
        ] {
            s.prepare_invoke()
                .load_async(conn)
                .await
                .map_err(unavailable)?;
        }
        Ok(())
    }
}
