//! The operator's commands, on any store but memory: `idem inspect` (one
//! record), `idem ls` (a namespace's records, e.g. the stuck ones) and
//! `idem release --force` (take a live claim away from a holder known to be
//! gone), `idem stats` and `idem purge` (see [`counts`]). Human tables by
//! default, `--json` for scripts.
//!
//! Everything printed that came from the store (keys, outcomes) is escaped:
//! a key or an outcome can hold any bytes, and none of them reaches the
//! terminal as a control character.

pub mod counts;

use std::fmt::Write as _;
use std::time::Duration;

use clap::{Args, ValueEnum};
use idem_core::Clock as _;
use idem_core::{
    Entry, Fenced, Key, Namespace, Record, RecordState, ScanQuery, Store, SystemClock, Timestamp,
};
use serde_json::{Value, json};

pub(crate) use crate::config::parse_age;
use crate::config::{StoreArgs, bad, read_file, resolve_store};
use crate::run::{Failure, init_logging};
use crate::store::{self, HotTier, OpenStore, StoreSpec};

/// Bytes of an outcome shown unless `--full`.
const SHOWN_OUTCOME_BYTES: usize = 200;

/// Records `idem ls` lists unless `--limit` says otherwise.
const DEFAULT_LS_LIMIT: usize = 100;

/// Records one store call lists.
const PAGE: usize = 1000;

/// `idem inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// The namespace.
    pub namespace: String,
    /// The key, as the client gave it.
    pub key: String,
    /// Print the whole outcome [default: its first 200 bytes].
    #[arg(long)]
    pub full: bool,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `idem ls`.
#[derive(Args, Debug)]
pub struct LsArgs {
    /// The namespace.
    pub namespace: String,
    /// Only records in this state.
    #[arg(long, value_enum)]
    pub state: Option<StateArg>,
    /// Only records started (in progress) or completed longer ago than
    /// this: `90s`, `10m`, `2h`, `1d` or milliseconds.
    #[arg(long, value_name = "AGE", value_parser = parse_age)]
    pub older_than: Option<Duration>,
    /// List at most this many records (in key order).
    #[arg(long, default_value_t = DEFAULT_LS_LIMIT)]
    pub limit: usize,
    /// Print JSON lines (one record a line) instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `idem release`.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    /// The namespace.
    pub namespace: String,
    /// The key, as the client gave it (not with --stuck).
    #[arg(required_unless_present = "stuck", conflicts_with = "stuck")]
    pub key: Option<String>,
    /// Take the claim from its holder even though its lease is live (the
    /// holder is known to be gone): its token goes stale, and the next
    /// delivery runs the work again.
    #[arg(long, conflicts_with = "stuck")]
    pub force: bool,
    /// Release the namespace's claims in progress started longer ago than
    /// --older-than, but only those whose lease has already run out (their
    /// holder is gone; the key's attempt count starts over) and those
    /// whose token --token names. Live claims not named are kept, and
    /// printed with their tokens.
    #[arg(long)]
    pub stuck: bool,
    /// With --stuck: only claims started longer ago than this: `90s`,
    /// `10m`, `2h`, `1d` or milliseconds [default: 10m].
    #[arg(long, value_name = "AGE", value_parser = parse_age, requires = "stuck")]
    pub older_than: Option<Duration>,
    /// With --stuck: also release the live claim holding this token (its
    /// holder is known to be gone; `idem ls --state in-progress` shows
    /// each claim's token). Repeat it for more claims.
    #[arg(long = "token", value_name = "TOKEN", requires = "stuck")]
    pub tokens: Vec<u64>,
    /// With --stuck: confirm the release.
    #[arg(long, requires = "stuck")]
    pub yes: bool,
    /// Say what would be released, and release nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON instead of text (one line per claim with --stuck).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `idem release --stuck`'s exit codes.
pub const RELEASE_EXIT_CODES: &str = "Exit codes: 0 done; 1 failed (what was released before the \
    failure is printed); 2 bad settings; with --stuck, 3 no claim in progress was old enough, 4 \
    some were kept (each is printed with why).";

/// How long `idem release --stuck` holds a lapsed claim it took over to
/// release it; dropped between the two, the key waits this long.
const TAKEOVER_LEASE: Duration = Duration::from_secs(30);

/// A record state on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StateArg {
    InProgress,
    Completed,
}

/// Opens the store `args` name, refusing the memory store (it lives inside
/// one process: there is nothing to look at from outside).
pub(crate) async fn open(args: StoreArgs) -> Result<OpenStore, Failure> {
    let file = read_file(args.config.as_deref())?;
    open_with(args, &file).await.map(|(store, _)| store)
}

/// [`open`] with the settings file read already; also answers the record
/// retention the settings give (`default_retention_ms`).
pub(crate) async fn open_with(
    args: StoreArgs,
    file: &crate::config::FileSettings,
) -> Result<(OpenStore, Duration), Failure> {
    let mut settings = resolve_store(args, file)?;
    let retention = settings.default_retention;
    init_logging(&settings.log)?;
    let spec = StoreSpec::parse(&settings)?;
    match &spec {
        StoreSpec::Memory => {
            return Err(bad(
                "store",
                "memory:// lives inside the process that uses it: point --store at the store \
                 `idem serve` or `idem consume` runs on (file://, redis://, postgres://, mysql://)",
            )
            .into());
        }
        StoreSpec::Tiered { hot, .. } => {
            if matches!(hot, HotTier::Memory) {
                return Err(bad(
                    "store",
                    "a tiered store's memory hot tier lives inside the process that serves it: \
                     ask that server over HTTP (curl 'HOST:PORT/v1/NS/record?key=KEY'), or point \
                     --store at the cold tier for completed history",
                )
                .into());
            }
            // An operator's look reads and acts on the real tiers: no
            // filter to rebuild, and nothing moved on the way.
            settings.tiered.filter_items = None;
            settings.tiered.sweep_handovers = false;
        }
        _ => {}
    }
    let file = matches!(spec, StoreSpec::File { .. });
    let store = store::open_spec(&spec, &settings)
        .await
        .map_err(|e| match e {
            Failure::Run(why) if file => Failure::Run(format!(
                "{why}. A file store is one process's at a time: stop the idem serve or idem \
                 consume using it first, or ask the running server over HTTP: \
                 curl 'HOST:PORT/v1/NS/record?key=KEY'"
            )),
            other => other,
        })?;
    Ok((store, retention))
}

fn key_of(namespace: &str, key: &str) -> Result<Key, Failure> {
    Key::new(namespace, key.to_owned()).map_err(|e| bad("key", e.to_string()).into())
}

fn namespace_of(namespace: &str) -> Result<Namespace, Failure> {
    Namespace::new(namespace).map_err(|e| bad("namespace", e.to_string()).into())
}

fn failed(store: &OpenStore, what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::Run(format!("{what} on the {} failed: {e}", store.description))
}

/// Prints one record.
pub async fn inspect(args: InspectArgs) -> Result<(), Failure> {
    let key = key_of(&args.namespace, &args.key)?;
    let store = open(args.store).await?;
    let record = store.store.get(&key).await;
    let now = SystemClock.now();
    let result = match record {
        Err(e) => Err(failed(&store, "reading the record", e)),
        Ok(None) if args.json => {
            println!(
                "{}",
                json!({"namespace": key.namespace().as_str(), "key": shown(key.bytes()), "state": "absent"})
            );
            Ok(())
        }
        Ok(None) => {
            println!("{key}: no record (never begun, released, or expired after its retention)");
            Ok(())
        }
        Ok(Some(record)) => {
            let entry = Entry { key, record };
            if args.json {
                println!("{}", entry_json(&entry, now, args.full));
            } else {
                print!("{}", entry_text(&entry, now, args.full));
            }
            Ok(())
        }
    };
    store.close().await;
    result
}

/// Lists a namespace's records, one page of the store at a time.
pub async fn ls(args: LsArgs) -> Result<(), Failure> {
    let namespace = namespace_of(&args.namespace)?;
    if args.limit == 0 {
        return Err(bad("limit", "must be at least 1").into());
    }
    let store = open(args.store).await?;
    let now = SystemClock.now();
    let mut query = ScanQuery::new(namespace).limit(PAGE.min(args.limit));
    if let Some(state) = args.state {
        query = query.state(match state {
            StateArg::InProgress => RecordState::InProgress,
            StateArg::Completed => RecordState::Completed,
        });
    }
    if let Some(age) = args.older_than {
        query = query.older_than(Timestamp::from_millis(
            now.as_millis().saturating_sub(age.as_millis() as u64),
        ));
    }
    let mut rows: Vec<Entry> = Vec::new();
    let bar = spinner("listing records".into());
    let result = loop {
        query.limit = PAGE.min(args.limit - rows.len());
        let page = match store.store.scan(&query).await {
            Ok(page) => page,
            Err(e) => break Err(failed(&store, "listing records", e)),
        };
        let full = page.len() == query.limit;
        if let Some(last) = page.last() {
            query.after = Some(last.key.bytes().clone());
        }
        if args.json {
            bar.suspend(|| {
                for entry in &page {
                    println!("{}", entry_json(entry, now, false));
                }
            });
        }
        bar.inc(page.len() as u64);
        rows.extend(page);
        if !full || rows.len() >= args.limit {
            break Ok(());
        }
    };
    bar.finish_and_clear();
    if result.is_ok() && !args.json {
        print!("{}", table(&rows, now));
        if rows.len() == args.limit {
            println!("(first {} records; --limit lists more)", args.limit);
        }
    }
    store.close().await;
    result
}

/// Takes a live claim away from its holder.
pub async fn release(args: ReleaseArgs) -> Result<(), Failure> {
    if args.stuck {
        return release_stuck(args).await;
    }
    let key = key_of(&args.namespace, args.key.as_deref().unwrap_or_default())?;
    if !args.force && !args.dry_run {
        return Err(bad(
            "force",
            "idem release takes a live claim away from its holder, whose work may still be \
             running: pass --force once you know the holder is gone",
        )
        .into());
    }
    let store = open(args.store).await?;
    let result = release_one(&store, &key, args.dry_run).await;
    store.close().await;
    let (token, attempts, held) = result?;
    if args.dry_run {
        if args.json {
            println!(
                "{}",
                json!({"namespace": key.namespace().as_str(), "key": shown(key.bytes()), "status": "would_release",
                       "token": token, "attempts": attempts, "held_ms": held.as_millis() as u64})
            );
        } else {
            println!(
                "{key}: would release token {token} (attempt {attempts}, held for {}); nothing was released",
                age(held)
            );
        }
        return Ok(());
    }
    tracing::warn!(
        key = %key,
        overridden_token = token,
        attempts,
        held_ms = held.as_millis() as u64,
        "released by an operator"
    );
    if args.json {
        println!(
            "{}",
            json!({"namespace": key.namespace().as_str(), "key": shown(key.bytes()), "status": "released",
                   "overridden_token": token, "attempts": attempts, "held_ms": held.as_millis() as u64})
        );
    } else {
        println!(
            "{key}: released; token {token} (attempt {attempts}, held for {}) is stale now, and the next delivery runs the work again",
            age(held)
        );
    }
    Ok(())
}

/// Releases `key`'s live claim (unless `dry_run`: then it only looks);
/// answers its token, attempts and how long it was held.
async fn release_one(
    store: &OpenStore,
    key: &Key,
    dry_run: bool,
) -> Result<(u64, u32, Duration), Failure> {
    let now = SystemClock.now();
    let claim = match store.store.get(key).await {
        Err(e) => return Err(failed(store, "reading the record", e)),
        Ok(None) => {
            return Err(Failure::Run(format!(
                "{key}: no record to release (never begun, released, or expired)"
            )));
        }
        Ok(Some(Record::Completed(c))) => {
            return Err(Failure::Run(format!(
                "{key}: completed {} ago with token {}: duplicates get its outcome, and release \
                 only ends claims in progress",
                age(now.since(c.completed_at)),
                c.token.get()
            )));
        }
        Ok(Some(Record::InProgress(p))) => p,
    };
    if claim.lease_expires_at <= now {
        return Err(Failure::Run(format!(
            "{key}: its lease ran out {} ago: nothing to release, the next delivery takes it over",
            age(now.since(claim.lease_expires_at))
        )));
    }
    if dry_run {
        return Ok((
            claim.token.get(),
            claim.attempts,
            now.since(claim.started_at),
        ));
    }
    match store.store.release(key, claim.token).await {
        Ok(Fenced::Ok(())) => Ok((
            claim.token.get(),
            claim.attempts,
            now.since(claim.started_at),
        )),
        Ok(Fenced::Stale) => Err(Failure::Run(format!(
            "{key}: the record changed while it was being released (completed, or its lease ran \
             out): run idem inspect again"
        ))),
        Err(e) => Err(failed(store, "releasing the record", e)),
    }
}

/// What `idem release --stuck` did with one claim.
enum Stuck {
    /// Released (or would be, in a dry run): its lease had run out, or
    /// `--token` named it.
    Released { named: bool },
    /// Kept, and why.
    Kept(String),
}

/// Releases a namespace's stuck claims: those started longer ago than
/// `--older-than` whose lease has run out, and those `--token` names.
///
/// # Cancel safety
///
/// Each claim is released on its own. A lapsed claim is taken over (a
/// `begin`, which only succeeds once the lease has ended) and released;
/// stopped between the two, its key waits for [`TAKEOVER_LEASE`] and is
/// then taken over by the next delivery as before.
async fn release_stuck(args: ReleaseArgs) -> Result<(), Failure> {
    let namespace = namespace_of(&args.namespace)?;
    if !args.yes && !args.dry_run {
        return Err(bad(
            "yes",
            "release --stuck releases every claim of the namespace whose lease has run out, and \
             those --token names: pass --yes to confirm, or --dry-run to see which",
        )
        .into());
    }
    let older_than = args.older_than.unwrap_or(Duration::from_secs(600));
    let store = open(args.store).await?;
    let result = release_stuck_in(
        &store,
        &namespace,
        older_than,
        &args.tokens,
        args.dry_run,
        args.json,
    )
    .await;
    let in_memory = if store.file.is_some() {
        " (the file store keeps claims in progress in the memory of the idem serve that holds \
         it: release them through its API)"
    } else {
        ""
    };
    store.close().await;
    let (matched, released, kept) = result?;
    let unmatched: Vec<String> = args
        .tokens
        .iter()
        .filter(|t| !matched.contains(t))
        .map(u64::to_string)
        .collect();
    let found = released + kept;
    let done = if args.dry_run {
        "would release"
    } else {
        "released"
    };
    let summary = format!(
        "{namespace}: {done} {released} of {found} claims in progress started more than {} ago",
        age(older_than)
    );
    if !unmatched.is_empty() {
        return Err(Failure::Exit(
            4,
            format!(
                "{summary}; no such claim holds token {}: it completed, ended or was taken over \
                 meanwhile, or is younger than --older-than (idem ls --state in-progress shows \
                 each claim's token)",
                unmatched.join(", ")
            ),
        ));
    }
    if found == 0 {
        return Err(Failure::Exit(
            3,
            format!(
                "{namespace}: no claim in progress started more than {} ago{in_memory}",
                age(older_than)
            ),
        ));
    }
    if kept > 0 {
        return Err(Failure::Exit(
            4,
            format!("{summary}; {kept} kept (each printed above with why)"),
        ));
    }
    if !args.json {
        println!("{summary}");
    }
    Ok(())
}

/// [`release_stuck`] on an open store: answers the named tokens found,
/// and how many claims were released and kept.
async fn release_stuck_in(
    store: &OpenStore,
    namespace: &Namespace,
    older_than: Duration,
    tokens: &[u64],
    dry_run: bool,
    json: bool,
) -> Result<(Vec<u64>, usize, usize), Failure> {
    let now = SystemClock.now();
    let mut query = ScanQuery::new(namespace.clone())
        .state(RecordState::InProgress)
        .older_than(Timestamp::from_millis(
            now.as_millis()
                .saturating_sub(older_than.as_millis() as u64),
        ))
        .limit(PAGE);
    let (mut matched, mut released, mut kept) = (Vec::new(), 0, 0);
    loop {
        let page = store
            .store
            .scan(&query)
            .await
            .map_err(|e| failed(store, "listing claims in progress", e))?;
        if let Some(last) = page.last() {
            query.after = Some(last.key.bytes().clone());
        }
        for entry in &page {
            let Record::InProgress(claim) = &entry.record else {
                continue;
            };
            let named = tokens.contains(&claim.token.get());
            if named {
                matched.push(claim.token.get());
            }
            let now = SystemClock.now();
            let lapsed = claim.lease_expires_at <= now;
            let what = if !lapsed && !named {
                Stuck::Kept(format!(
                    "its lease is live for {} more: its holder may still be working (renewing \
                     it); name it with --token {} once you know the holder is gone",
                    age(claim.lease_expires_at.since(now)),
                    claim.token.get()
                ))
            } else if dry_run {
                Stuck::Released { named }
            } else {
                release_claim(store, &entry.key, claim, lapsed).await?
            };
            match &what {
                Stuck::Released { .. } => released += 1,
                Stuck::Kept(_) => kept += 1,
            }
            print_stuck(&entry.key, claim, &what, now, dry_run, json);
        }
        if page.len() < query.limit {
            return Ok((matched, released, kept));
        }
    }
}

/// Releases one stuck claim: a live one by its token (named by the
/// operator), a lapsed one by taking it over first (its token no longer
/// releases it).
async fn release_claim(
    store: &OpenStore,
    key: &Key,
    claim: &idem_core::InProgress,
    lapsed: bool,
) -> Result<Stuck, Failure> {
    let token = if lapsed {
        match store
            .store
            .begin(
                key,
                claim.fingerprint,
                idem_core::Lease::new(TAKEOVER_LEASE),
            )
            .await
        {
            Ok(idem_core::Begin::Acquired(c)) => c.token,
            Ok(idem_core::Begin::Completed { .. }) => {
                return Ok(Stuck::Kept("completed meanwhile".into()));
            }
            Ok(_) => {
                return Ok(Stuck::Kept(
                    "still held: another holder took it over meanwhile, or by the store's clock \
                     its lease has not run out yet"
                        .into(),
                ));
            }
            Err(e) => return Err(failed(store, &format!("taking over {key}"), e)),
        }
    } else {
        claim.token
    };
    match store.store.release(key, token).await {
        Ok(Fenced::Ok(())) => {
            tracing::warn!(
                key = %key,
                overridden_token = claim.token.get(),
                attempts = claim.attempts,
                lease_ran_out = lapsed,
                "released by an operator"
            );
            Ok(Stuck::Released { named: !lapsed })
        }
        Ok(Fenced::Stale) => Ok(Stuck::Kept(
            "it changed while being released (completed, or its lease ran out and another \
             holder took it over)"
                .into(),
        )),
        Err(e) => Err(failed(store, &format!("releasing {key}"), e)),
    }
}

fn print_stuck(
    key: &Key,
    claim: &idem_core::InProgress,
    what: &Stuck,
    now: Timestamp,
    dry_run: bool,
    json: bool,
) {
    let held = now.since(claim.started_at);
    let (status, why) = match what {
        Stuck::Released { named: true } => ("released", "its token was named".to_owned()),
        Stuck::Released { named: false } => (
            "released",
            format!(
                "its lease ran out {} ago; the key's attempt count starts over",
                age(now.since(claim.lease_expires_at))
            ),
        ),
        Stuck::Kept(why) => ("kept", why.clone()),
    };
    let status = match (status, dry_run) {
        ("released", true) => "would_release",
        (s, _) => s,
    };
    if json {
        println!(
            "{}",
            json!({"key": shown(key.bytes()), "status": status, "why": why,
                   "token": claim.token.get(), "attempts": claim.attempts,
                   "held_ms": held.as_millis() as u64})
        );
    } else {
        println!(
            "{}: {} (token {}, attempt {}, held for {}): {why}",
            shown(key.bytes()),
            status.replace('_', " "),
            claim.token.get(),
            claim.attempts,
            age(held)
        );
    }
}

/// A spinner on standard error while a long command runs, with a count;
/// invisible when standard error is not a terminal (a script, a pipe).
pub(crate) fn spinner(message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {pos} {elapsed}")
            .expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Bytes from the store, printable: UTF-8 as it is with control and
/// invisible formatting characters escaped (`\n`, `\u{202e}`: see
/// [`idem_core::text::is_invisible`]), other bytes as `\xNN`.
pub(crate) fn shown(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if idem_core::text::is_invisible(c) {
                s.extend(c.escape_default());
            } else {
                s.push(c);
            }
        }
        for b in chunk.invalid() {
            let _ = write!(s, "\\x{b:02x}");
        }
    }
    s
}

/// An outcome as JSON: its own JSON when it is JSON, a string when it is
/// text, `{"dead_lettered": true}` for the outcome a consumer records for a
/// key whose message it dead-lettered, and `{"base64": …}` otherwise; cut
/// to 200 bytes unless `full`.
pub(crate) fn outcome_json(outcome: &[u8], full: bool) -> Value {
    use base64::Engine as _;
    if idem_consumer::dlq::is_dead_lettered(Some(outcome)) {
        return json!({"dead_lettered": true});
    }
    if !full && outcome.len() > SHOWN_OUTCOME_BYTES {
        return json!({
            "truncated": shown(&outcome[..SHOWN_OUTCOME_BYTES]),
            "bytes": outcome.len(),
        });
    }
    if let Ok(v) = serde_json::from_slice::<Value>(outcome) {
        return v;
    }
    match std::str::from_utf8(outcome) {
        Ok(text) => Value::String(text.to_owned()),
        Err(_) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(outcome)}),
    }
}

pub(crate) fn entry_json(entry: &Entry, now: Timestamp, full: bool) -> Value {
    let mut v = json!({
        "namespace": entry.key.namespace().as_str(),
        "key": shown(entry.key.bytes()),
        "token": entry.record.token().get(),
    });
    let fields = match &entry.record {
        Record::InProgress(p) => json!({
            "state": "in_progress",
            "attempts": p.attempts,
            "started_at_ms": p.started_at.as_millis(),
            "lease_expires_at_ms": p.lease_expires_at.as_millis(),
            "lease_left_ms": p.lease_expires_at.as_millis().saturating_sub(now.as_millis()),
            "fingerprint": p.fingerprint.as_ref().map(|f| f.to_hex()),
        }),
        Record::Completed(c) => json!({
            "state": "completed",
            "completed_at_ms": c.completed_at.as_millis(),
            "expires_at_ms": c.expires_at.as_millis(),
            "fingerprint": c.fingerprint.as_ref().map(|f| f.to_hex()),
            "outcome": c.outcome.as_deref().map(|o| outcome_json(o, full)),
        }),
    };
    if let (Value::Object(v), Value::Object(fields)) = (&mut v, fields) {
        v.extend(fields);
    }
    v
}

fn entry_text(entry: &Entry, now: Timestamp, full: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "key          {}/{}",
        entry.key.namespace(),
        shown(entry.key.bytes())
    );
    match &entry.record {
        Record::InProgress(p) => {
            let lease = if p.lease_expires_at > now {
                format!("{} left", age(p.lease_expires_at.since(now)))
            } else {
                format!(
                    "ran out {} ago: the next delivery takes it over",
                    age(now.since(p.lease_expires_at))
                )
            };
            let _ = writeln!(s, "state        in progress");
            let _ = writeln!(s, "token        {}", p.token.get());
            let _ = writeln!(s, "attempts     {}", p.attempts);
            let _ = writeln!(s, "started      {} ago", age(now.since(p.started_at)));
            let _ = writeln!(s, "lease        {lease}");
            if let Some(f) = &p.fingerprint {
                let _ = writeln!(s, "fingerprint  {}", f.to_hex());
            }
        }
        Record::Completed(c) => {
            let _ = writeln!(s, "state        completed");
            let _ = writeln!(s, "token        {}", c.token.get());
            let _ = writeln!(s, "completed    {} ago", age(now.since(c.completed_at)));
            let _ = writeln!(s, "expires in   {}", age(c.expires_at.since(now)));
            if let Some(f) = &c.fingerprint {
                let _ = writeln!(s, "fingerprint  {}", f.to_hex());
            }
            match &c.outcome {
                None => {
                    let _ = writeln!(s, "outcome      (none)");
                }
                Some(o) if !full && o.len() > SHOWN_OUTCOME_BYTES => {
                    let _ = writeln!(
                        s,
                        "outcome      {}… ({} bytes; --full shows it all)",
                        shown(&o[..SHOWN_OUTCOME_BYTES]),
                        o.len()
                    );
                }
                Some(o) => {
                    let _ = writeln!(s, "outcome      {}", shown(o));
                }
            }
        }
    }
    s
}

/// The records as a table: key, state, token, attempts, age, lease left.
fn table(rows: &[Entry], now: Timestamp) -> String {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|e| match &e.record {
            Record::InProgress(p) => [
                shown(e.key.bytes()),
                "in progress".into(),
                p.token.get().to_string(),
                p.attempts.to_string(),
                age(now.since(p.started_at)),
                if p.lease_expires_at > now {
                    age(p.lease_expires_at.since(now))
                } else {
                    "ran out".into()
                },
            ],
            Record::Completed(c) => [
                shown(e.key.bytes()),
                "completed".into(),
                c.token.get().to_string(),
                String::new(),
                age(now.since(c.completed_at)),
                String::new(),
            ],
        })
        .collect();
    let head = ["KEY", "STATE", "TOKEN", "ATTEMPTS", "AGE", "LEASE LEFT"];
    let cells: Vec<Vec<String>> = cells.into_iter().map(Vec::from).collect();
    let mut s = columns(&head, &cells);
    if rows.is_empty() {
        s.push_str("(no records)\n");
    }
    s
}

/// Rows of cells under a heading, in columns two spaces apart.
pub(crate) fn columns(head: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut s = String::new();
    let mut line = |row: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (cell, w)) in row.zip(&widths).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            let _ = write!(l, "{cell:<w$}");
        }
        s.push_str(l.trim_end());
        s.push('\n');
    };
    line(&mut head.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    s
}

/// A duration as people read it: `850ms`, `42s`, `3m 12s`, `5h 3m`, `2d 4h`.
pub(crate) fn age(d: Duration) -> String {
    let ms = d.as_millis() as u64;
    let s = ms / 1000;
    match s {
        0 => format!("{ms}ms"),
        1..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d {}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_their_units_and_refuse_the_rest() {
        assert_eq!(parse_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("250"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_age("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_age("10 parsecs").unwrap_err().contains("unit"));
        assert!(parse_age("m").unwrap_err().contains("not a duration"));
        assert!(parse_age("99999999999999999999d").is_err());
    }

    #[test]
    fn bytes_from_the_store_never_reach_the_terminal_raw() {
        assert_eq!(shown(b"ok \xff\x1b[31m\n"), "ok \\xff\\u{1b}[31m\\n");
        assert_eq!(shown("café".as_bytes()), "café");
    }

    #[test]
    fn outcomes_show_as_json_text_or_base64_and_are_cut() {
        assert_eq!(outcome_json(br#"{"a":1}"#, false), json!({"a": 1}));
        assert_eq!(outcome_json(b"plain", false), json!("plain"));
        assert_eq!(outcome_json(b"\xff", false), json!({"base64": "/w=="}));
        let long = vec![b'x'; 500];
        assert_eq!(outcome_json(&long, false)["bytes"], 500);
        assert_eq!(outcome_json(&long, true), json!("x".repeat(500)));
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(age(Duration::from_millis(850)), "850ms");
        assert_eq!(age(Duration::from_secs(192)), "3m 12s");
        assert_eq!(age(Duration::from_secs(2 * 86400 + 4 * 3600)), "2d 4h");
    }
}
