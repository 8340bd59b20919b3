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
    pub(crate) reopen: Script,
    pub(crate) extend: Script,
    pub(crate) import: Script,
    pub(crate) completed: Script,
    pub(crate) high_water: Script,
    pub(crate) shorten: Script,
    pub(crate) list_handovers: Script,
    pub(crate) handovers_due: Script,
    pub(crate) filter_agree: Script,
    pub(crate) filter_check: Script,
    pub(crate) filter_insert: Script,
    pub(crate) filter_lease: Script,
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
            reopen: script!("time.lua", "record.lua", "reopen.lua"),
            extend: script!("time.lua", "record.lua", "extend.lua"),
            import: script!("time.lua", "import.lua"),
            completed: script!("time.lua", "completed.lua"),
            high_water: script!("time.lua", "high_water.lua"),
            shorten: script!("time.lua", "shorten.lua"),
            list_handovers: script!("time.lua", "list_handovers.lua"),
            handovers_due: script!("time.lua", "handovers_due.lua"),
            filter_agree: script!("filter_agree.lua"),
            filter_check: script!("time.lua", "filter_check.lua"),
            filter_insert: script!("time.lua", "filter_insert.lua"),
            filter_lease: script!("filter_lease.lua"),
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

/// One command's answer, or why it failed.
pub(crate) type Answer = redis::RedisResult<Value>;

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
    /// answered alone); an item whose call failed gets that call's error,
    /// and only those items: calls fail one by one (a master down, a slot
    /// moving, a script error on one node), each on its own.
    pub(crate) async fn run_script(
        &self,
        conn: &Conn,
        script: &Script,
        items: Vec<ScriptItem>,
        shared: impl Fn(&[usize], &mut Cmd),
        own: impl Fn(usize, &mut Cmd),
        lead: usize,
    ) -> Vec<Result<(Value, Value), StoreError>> {
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
        let replies = self.pipelined(conn, &cmds, &first_keys).await;
        let mut answers: Vec<Result<(Value, Value), StoreError>> = (0..items.len())
            .map(|_| Ok((Value::Nil, Value::Nil)))
            .collect();
        for (chunk, reply) in members.into_iter().zip(replies) {
            let fail = |answers: &mut Vec<_>, e: &dyn Fn() -> StoreError| {
                for &i in chunk {
                    answers[i] = Err(e());
                }
            };
            let mut per_item = match reply {
                Ok(Value::Array(per_item)) => per_item,
                Ok(alone) if chunk.len() == 1 => {
                    answers[chunk[0]] = Ok((Value::Nil, alone));
                    continue;
                }
                Ok(other) => {
                    fail(&mut answers, &|| corrupt("a script call", &other));
                    continue;
                }
                Err(e) => {
                    fail(&mut answers, &|| unavailable(e.clone()));
                    continue;
                }
            };
            if per_item.len() != lead + chunk.len() {
                let reply = Value::Array(per_item);
                fail(&mut answers, &|| corrupt("a script call", &reply));
                continue;
            }
            let head = per_item.first().filter(|_| lead > 0).cloned();
            for (&i, v) in chunk.iter().zip(per_item.drain(lead..)) {
                answers[i] = Ok((head.clone().unwrap_or(Value::Nil), v));
            }
        }
        answers
    }

    /// Runs `cmds`, whose keys are `keys` (one each; may be empty for a
    /// single command), in one pipelined round trip: on a cluster, one
    /// pipeline per hash slot, all at once. Answers each command, in
    /// order, on its own.
    pub(crate) async fn pipelined(
        &self,
        conn: &Conn,
        cmds: &[Cmd],
        keys: &[impl AsRef<[u8]>],
    ) -> Vec<Answer> {
        if matches!(conn, Conn::Single(_)) || cmds.len() == 1 {
            return self.pipeline(conn, cmds.iter().collect()).await;
        }
        let mut by_slot: std::collections::BTreeMap<u16, Vec<usize>> = Default::default();
        for (i, k) in keys.iter().enumerate() {
            by_slot.entry(slot(k.as_ref())).or_default().push(i);
        }
        // Each slot's pipeline on its own: one that fails (its master down,
        // the slot moving) leaves the others' answers alone.
        let groups = futures_util::future::join_all(
            by_slot
                .values()
                .map(|idx| self.pipeline(conn, idx.iter().map(|&i| &cmds[i]).collect())),
        )
        .await;
        let mut answers = vec![Ok(Value::Nil); cmds.len()];
        for (idx, replies) in by_slot.values().zip(groups) {
            for (&i, v) in idx.iter().zip(replies) {
                answers[i] = v;
            }
        }
        answers
    }

    /// Runs `cmds` as one pipeline, answering each command on its own;
    /// loads the scripts and sends again, once, the commands Redis answered
    /// with `NOSCRIPT` (after a restart, a flush or a failover).
    pub(crate) async fn pipeline(&self, conn: &Conn, cmds: Vec<&Cmd>) -> Vec<Answer> {
        let mut conn = conn.clone();
        let mut answers = send(&mut conn, &cmds).await;
        let again: Vec<usize> = (0..answers.len())
            .filter(|&i| matches!(&answers[i], Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)))
            .collect();
        if again.is_empty() {
            return answers;
        }
        let retried = match self.load_scripts(&mut conn).await {
            Ok(()) => {
                send(
                    &mut conn,
                    &again.iter().map(|&i| cmds[i]).collect::<Vec<_>>(),
                )
                .await
            }
            Err(e) => vec![Err(e); again.len()],
        };
        for (i, a) in again.into_iter().zip(retried) {
            answers[i] = a;
        }
        answers
    }

    pub(crate) async fn load_scripts(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> redis::RedisResult<()> {
        for s in [
            &self.scripts.begin,
            &self.scripts.complete,
            &self.scripts.release,
            &self.scripts.reopen,
            &self.scripts.extend,
            &self.scripts.import,
            &self.scripts.completed,
            &self.scripts.high_water,
            &self.scripts.shorten,
            &self.scripts.list_handovers,
            &self.scripts.handovers_due,
            &self.scripts.filter_agree,
            &self.scripts.filter_check,
            &self.scripts.filter_insert,
            &self.scripts.filter_lease,
        ] {
            s.prepare_invoke().load_async(conn).await?;
        }
        Ok(())
    }
}

/// Sends `cmds` in one round trip (one command as itself: a pipeline of one
/// costs more); answers each, a failure of the whole round trip for all.
async fn send(conn: &mut Conn, cmds: &[&Cmd]) -> Vec<Answer> {
    if let [cmd] = cmds {
        return vec![cmd.query_async::<Value>(conn).await];
    }
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for c in cmds {
        pipe.add_command((*c).clone());
    }
    match pipe.query_async::<Vec<Value>>(conn).await {
        Ok(values) if values.len() == cmds.len() => {
            values.into_iter().map(Value::extract_error).collect()
        }
        Ok(values) => {
            let e = redis::RedisError::from((
                redis::ErrorKind::Parse,
                "a pipeline's answers do not match its commands",
                format!("{} commands, {} answers", cmds.len(), values.len()),
            ));
            vec![Err(e); cmds.len()]
        }
        Err(e) => vec![Err(e); cmds.len()],
    }
}
