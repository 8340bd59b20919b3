//! Settings: flags override `IDEM_*` environment variables, which override
//! the TOML file named by `--config`, which overrides the defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use idem_core::Limits;
use idem_http::api::{Auth, Grant, Namespaces};
use serde::Deserialize;

/// Settings `serve` and `proxy` share.
#[derive(Args, Debug, Default)]
pub struct CommonArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// PEM certificate chain: serve HTTPS (with --tls-key).
    #[arg(long, env = "IDEM_TLS_CERT", value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key for --tls-cert.
    #[arg(long, env = "IDEM_TLS_KEY", value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Largest request body in bytes [default: 16777216].
    #[arg(long, env = "IDEM_MAX_BODY_BYTES", value_name = "BYTES")]
    pub max_body_bytes: Option<usize>,
    /// How long a client may take to send a request's headers, and then
    /// its body, in milliseconds; a slower one gets 408 or is disconnected
    /// [default: 30000].
    #[arg(long, env = "IDEM_READ_TIMEOUT_MS", value_name = "MS")]
    pub read_timeout_ms: Option<u64>,
    /// Require a bearer token: NAMESPACES=TOKEN, where NAMESPACES is a
    /// comma-separated list or `*` for all. Repeat the flag for more tokens;
    /// in IDEM_AUTH_TOKENS separate them with `;`.
    #[arg(
        long = "auth-token",
        env = "IDEM_AUTH_TOKENS",
        value_delimiter = ';',
        value_name = "NAMESPACES=TOKEN"
    )]
    pub auth_tokens: Vec<String>,
}

/// Settings of the store and the records: what `serve`, `proxy` and
/// `consume` share.
#[derive(Args, Debug, Default)]
pub struct StoreArgs {
    /// A TOML file of settings (same names as the flags, with `_` for `-`).
    #[arg(long, env = "IDEM_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Where records live: file://PATH (default file://./idem-data), memory://,
    /// redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT (rediss://
    /// and rediss+cluster:// for TLS), postgres://USER@HOST:PORT/DB or
    /// mysql://USER@HOST:PORT/DB (with ?shards=N&table=PREFIX&pool_size=N
    /// &lock_timeout=5s; sslmode=require or ssl-mode=REQUIRED for TLS), or
    /// `tiered`: --hot-store in front of --cold-store.
    // The URL may hold a password: help never shows the environment's value.
    #[arg(long, env = "IDEM_STORE", value_name = "URL", hide_env_values = true)]
    pub store: Option<String>,
    /// How the file store makes completions durable [default: group].
    #[arg(long, env = "IDEM_DURABILITY", value_enum)]
    pub durability: Option<DurabilityArg>,
    /// With --store tiered: the hot tier, holding every record in progress
    /// and recent ones: memory:// or a Redis URL [default: memory://].
    #[arg(
        long,
        env = "IDEM_HOT_STORE",
        value_name = "URL",
        hide_env_values = true
    )]
    pub hot_store: Option<String>,
    /// With --store tiered: the cold tier, holding completed history:
    /// file://PATH, postgres://… or mysql://… [default: file://./idem-data].
    #[arg(
        long,
        env = "IDEM_COLD_STORE",
        value_name = "URL",
        hide_env_values = true
    )]
    pub cold_store: Option<String>,
    /// With --store tiered: how long the hot tier keeps a completed record
    /// (at least 1000); longer retentions also go to the cold tier
    /// [default: 10800000, 3 h].
    #[arg(long, env = "IDEM_HOT_RETENTION_MS", value_name = "MS")]
    pub hot_retention_ms: Option<u64>,
    /// With --store tiered: answer every completion only once the cold tier
    /// has it, whatever the hot tier (a memory hot tier does so anyway,
    /// unless --ack-before-cold).
    #[arg(long, env = "IDEM_WRITE_THROUGH")]
    pub write_through: bool,
    /// With --store tiered and a memory hot tier: answer a completion once
    /// the hot tier has it, before the cold tier does. Faster for a lone
    /// caller, but a crash of the process loses every completion then on
    /// its way to the cold tier (counted by the gauge
    /// idem_tiered_unprotected_completions): their redeliveries run again.
    #[arg(long, env = "IDEM_ACK_BEFORE_COLD")]
    pub ack_before_cold: bool,
    /// With --store tiered: how long a graceful stop waits for completions
    /// on their way to the cold tier; what is left is logged with its count
    /// (a Redis hot tier keeps it for the next process) [default: 30000].
    #[arg(long, env = "IDEM_FLUSH_TIMEOUT_MS", value_name = "MS")]
    pub flush_timeout_ms: Option<u64>,
    /// With --store tiered and a Redis hot tier: how long a completion stays
    /// on the hot tier's list of handovers before any process moves it to
    /// the cold tier (what a crashed process left moves after this)
    /// [default: 30000].
    #[arg(long, env = "IDEM_HANDOVER_GRACE_MS", value_name = "MS")]
    pub handover_grace_ms: Option<u64>,
    /// With --store tiered: distinct keys the key filter in front of the
    /// cold tier is sized for, per --filter-retention-ms (18 MB for 10 M at
    /// 0.1 % false positives); 0 turns the filter off [default: 10000000].
    #[arg(long, env = "IDEM_FILTER_ITEMS", value_name = "KEYS")]
    pub filter_items: Option<u64>,
    /// With --store tiered: how long the filter keeps a key; also the
    /// longest retention the tiered store accepts [default: 2592000000, 30 days].
    #[arg(long, env = "IDEM_FILTER_RETENTION_MS", value_name = "MS")]
    pub filter_retention_ms: Option<u64>,
    /// With --store tiered: the filter's secret hash seed, 32 hex digits
    /// (keep it secret; the same across restarts to reuse a snapshot)
    /// [default: a random seed at each start].
    #[arg(
        long,
        env = "IDEM_FILTER_SEED",
        value_name = "HEX",
        hide_env_values = true
    )]
    pub filter_seed: Option<String>,
    /// With --store tiered: where the filter's snapshot is written (every
    /// minute and at shutdown) and read at start; needs --filter-seed.
    #[arg(long, env = "IDEM_FILTER_SNAPSHOT", value_name = "FILE")]
    pub filter_snapshot: Option<PathBuf>,
    /// PEM certificate authority to trust for a rediss:// store, instead of
    /// the system's roots.
    #[arg(long, env = "IDEM_REDIS_CA_CERT", value_name = "FILE")]
    pub redis_ca_cert: Option<PathBuf>,
    /// PEM client certificate for a rediss:// store that asks for one (with
    /// --redis-client-key).
    #[arg(long, env = "IDEM_REDIS_CLIENT_CERT", value_name = "FILE")]
    pub redis_client_cert: Option<PathBuf>,
    /// PEM private key for --redis-client-cert.
    #[arg(long, env = "IDEM_REDIS_CLIENT_KEY", value_name = "FILE")]
    pub redis_client_key: Option<PathBuf>,
    /// Longest key in bytes [default: 255].
    #[arg(long, env = "IDEM_MAX_KEY_BYTES", value_name = "BYTES")]
    pub max_key_bytes: Option<usize>,
    /// Largest stored outcome in bytes [default: 1048576].
    #[arg(long, env = "IDEM_MAX_OUTCOME_BYTES", value_name = "BYTES")]
    pub max_outcome_bytes: Option<usize>,
    /// Most items in one batch request [default: 10000].
    #[arg(long, env = "IDEM_MAX_BATCH", value_name = "ITEMS")]
    pub max_batch: Option<usize>,
    /// Longest lease a client may ask for, in ms [default: 604800000, 7 days].
    #[arg(long, env = "IDEM_MAX_LEASE_MS", value_name = "MS")]
    pub max_lease_ms: Option<u64>,
    /// Lease when a request names none, in ms [default: 30000].
    #[arg(long, env = "IDEM_DEFAULT_LEASE_MS", value_name = "MS")]
    pub default_lease_ms: Option<u64>,
    /// Retention of completed records when a request names none, in ms
    /// [default: 86400000, 24 h].
    #[arg(long, env = "IDEM_DEFAULT_RETENTION_MS", value_name = "MS")]
    pub default_retention_ms: Option<u64>,
    /// Log filter, e.g. `info` or `idem=debug` [default: info,fjall=warn,lsm_tree=warn,async_nats=warn].
    #[arg(long, env = "IDEM_LOG", value_name = "FILTER")]
    pub log: Option<String>,
}

/// `--durability`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DurabilityArg {
    /// Concurrent completions share one fsync.
    Group,
    /// One fsync per completion.
    Immediate,
    /// No fsync: survives a killed process, not a power loss.
    Buffered,
}

/// The TOML file: every field optional, unknown fields refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSettings {
    pub listen: Option<String>,
    pub store: Option<String>,
    pub durability: Option<DurabilityArg>,
    pub hot_store: Option<String>,
    pub cold_store: Option<String>,
    pub hot_retention_ms: Option<u64>,
    pub write_through: Option<bool>,
    pub ack_before_cold: Option<bool>,
    pub flush_timeout_ms: Option<u64>,
    pub handover_grace_ms: Option<u64>,
    pub filter_items: Option<u64>,
    pub filter_retention_ms: Option<u64>,
    pub filter_seed: Option<String>,
    pub filter_snapshot: Option<PathBuf>,
    pub redis_ca_cert: Option<PathBuf>,
    pub redis_client_cert: Option<PathBuf>,
    pub redis_client_key: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub max_body_bytes: Option<usize>,
    pub read_timeout_ms: Option<u64>,
    pub max_key_bytes: Option<usize>,
    pub max_outcome_bytes: Option<usize>,
    pub max_batch: Option<usize>,
    pub max_lease_ms: Option<u64>,
    pub default_lease_ms: Option<u64>,
    pub default_retention_ms: Option<u64>,
    #[serde(default)]
    pub auth: Vec<AuthEntry>,
    pub log: Option<String>,
    /// `proxy` only.
    pub upstream: Option<String>,
    /// `proxy` only.
    pub require_key: Option<bool>,
    /// `proxy` only.
    pub keyless_window_ms: Option<u64>,
    /// `proxy` only.
    #[serde(default)]
    pub scope_headers: Vec<String>,
    /// `proxy` only.
    #[serde(default)]
    pub scope_cookies: Vec<String>,
    /// `proxy` only.
    pub release_status: Option<String>,
    /// `proxy` only.
    pub max_response_bytes: Option<usize>,
    /// `proxy` only.
    pub upstream_ca_cert: Option<PathBuf>,
    /// `proxy` only.
    pub upstream_http2: Option<bool>,
    /// `proxy` only: a duration with its unit, e.g. `"10s"`.
    pub upstream_connect_timeout: Option<String>,
    /// `proxy` only: a duration with its unit, e.g. `"60s"`.
    pub upstream_timeout: Option<String>,
    /// `proxy` only: `x-forwarded`, `forwarded` or `none`.
    pub forwarded_headers: Option<String>,
    /// `consume` only.
    pub from: Option<String>,
    /// `consume` only.
    pub to: Option<String>,
    /// `consume` only.
    pub namespace: Option<String>,
    /// `consume` only.
    pub key: Option<String>,
    /// `consume` only.
    pub concurrency: Option<usize>,
    /// `consume` only.
    pub batch: Option<usize>,
    /// `consume` only.
    pub batch_linger_ms: Option<u64>,
    /// `consume` only.
    pub max_attempts: Option<u32>,
    /// `consume` only.
    pub dead_letter: Option<String>,
    /// `consume` only.
    pub metrics_listen: Option<String>,
    /// `consume` only.
    pub timeout_ms: Option<u64>,
    /// `consume` only.
    pub shutdown_grace_ms: Option<u64>,
    /// `consume` only.
    pub completion_linger_ms: Option<u64>,
    /// `consume` only.
    pub retry_initial_ms: Option<u64>,
    /// `consume` only.
    pub retry_max_ms: Option<u64>,
    /// `consume` only.
    pub retry: Option<String>,
    /// `consume` only.
    pub pause_status: Option<String>,
    /// `consume` only.
    pub dead_letter_status: Option<String>,
}

/// `[[auth]]` in the file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthEntry {
    pub token: String,
    pub namespaces: Vec<String>,
}

/// A configuration error: which setting, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting `{field}`: {problem}")]
pub struct ConfigError {
    pub field: &'static str,
    pub problem: String,
}

pub fn bad(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        problem: problem.into(),
    }
}

/// Parses a duration or an age: `90s`, `10m`, `2h`, `1d`, `250ms` or a
/// bare number of milliseconds.
pub fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number.parse().map_err(|_| {
        format!("{s:?} is not a duration: give e.g. 90s, 10m, 2h, 1d or milliseconds")
    })?;
    let unit_ms: u64 = match unit {
        "" | "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        other => {
            return Err(format!(
                "{other:?} is not a unit of time: use ms, s, m, h or d"
            ));
        }
    };
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{s:?} is too long"))
}

/// The longest duration a flag takes.
const LONGEST_DURATION: Duration = Duration::from_secs(24 * 3600);

/// A duration as [`parse_age`] reads it, from 1 ms to 24 h, for the setting
/// `field`.
pub fn parse_duration(field: &'static str, text: &str) -> Result<Duration, ConfigError> {
    let d = parse_age(text).map_err(|e| bad(field, e))?;
    if d.is_zero() || d > LONGEST_DURATION {
        return Err(bad(
            field,
            format!("{:?} is out of range: give 1ms to 24h", text.trim()),
        ));
    }
    Ok(d)
}

/// Reads `--config`, if given.
pub fn read_file(path: Option<&Path>) -> Result<FileSettings, ConfigError> {
    let Some(path) = path else {
        return Ok(FileSettings::default());
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad("config", format!("cannot read {}: {e}", path.display())))?;
    toml::from_str(&text).map_err(|e| bad("config", format!("{}: {e}", path.display())))
}

/// Certificate files for a `rediss://` store.
#[derive(Debug, Default)]
pub struct RedisTls {
    /// The CA to trust instead of the system's roots.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key.
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The tiered store's settings, resolved.
#[derive(Debug)]
pub struct TieredSettings {
    pub hot: String,
    pub cold: String,
    pub hot_retention: Duration,
    pub write_through: bool,
    pub ack_before_cold: bool,
    pub flush_timeout: Duration,
    pub handover_grace: Duration,
    /// Whether this process moves what other processes left on the hot
    /// tier's list of handovers (not for an operator's short look).
    pub sweep_handovers: bool,
    /// `None`: no filter.
    pub filter_items: Option<u64>,
    pub filter_retention: Duration,
    pub filter_seed: Option<u128>,
    pub filter_snapshot: Option<PathBuf>,
}

/// Store settings, resolved: what `serve`, `proxy` and `consume` share.
#[derive(Debug)]
pub struct StoreSettings {
    pub store: String,
    pub tiered: TieredSettings,
    pub durability: DurabilityArg,
    pub redis_tls: RedisTls,
    pub limits: Limits,
    pub default_lease: Duration,
    pub default_retention: Duration,
    pub log: String,
}

/// What `serve` and `proxy` need, resolved.
#[derive(Debug)]
pub struct Common {
    pub listen: SocketAddr,
    pub tls: Option<(PathBuf, PathBuf)>,
    pub max_body_bytes: usize,
    /// The time a client has for a request's headers, and then its body.
    pub read_timeout: Duration,
    pub auth: Auth,
    pub settings: StoreSettings,
}

impl std::ops::Deref for Common {
    type Target = StoreSettings;
    fn deref(&self) -> &StoreSettings {
        &self.settings
    }
}

/// The tiered store's settings: flags and environment, then the file, then
/// the defaults.
fn resolve_tiered(args: &StoreArgs, file: &FileSettings) -> Result<TieredSettings, ConfigError> {
    let hot_retention = Duration::from_millis(
        args.hot_retention_ms
            .or(file.hot_retention_ms)
            .unwrap_or(3 * 3600 * 1000),
    );
    if hot_retention < Duration::from_secs(1) {
        return Err(bad(
            "hot_retention_ms",
            "must be at least 1000: records on their way to the cold tier are read back from the hot tier",
        ));
    }
    let filter_retention = Duration::from_millis(
        args.filter_retention_ms
            .or(file.filter_retention_ms)
            .unwrap_or(30 * 24 * 3600 * 1000),
    );
    if filter_retention.is_zero() {
        return Err(bad("filter_retention_ms", "must be at least 1"));
    }
    let filter_seed = match args.filter_seed.as_deref().or(file.filter_seed.as_deref()) {
        None => None,
        Some(hex) => Some(
            u128::from_str_radix(hex.trim(), 16)
                .ok()
                .filter(|_| hex.trim().len() == 32)
                .ok_or_else(|| {
                    bad(
                        "filter_seed",
                        "must be 32 hex digits (128 secret bits), e.g. from `openssl rand -hex 16`",
                    )
                })?,
        ),
    };
    let filter_snapshot = args
        .filter_snapshot
        .clone()
        .or(file.filter_snapshot.clone());
    if filter_snapshot.is_some() && filter_seed.is_none() {
        return Err(bad(
            "filter_snapshot",
            "needs a fixed --filter-seed (IDEM_FILTER_SEED): a snapshot is only readable under the seed it was written with",
        ));
    }
    Ok(TieredSettings {
        hot: args
            .hot_store
            .clone()
            .or(file.hot_store.clone())
            .unwrap_or_else(|| "memory://".to_owned()),
        cold: args
            .cold_store
            .clone()
            .or(file.cold_store.clone())
            .unwrap_or_else(|| "file://./idem-data".to_owned()),
        hot_retention,
        write_through: args.write_through || file.write_through.unwrap_or(false),
        ack_before_cold: args.ack_before_cold || file.ack_before_cold.unwrap_or(false),
        flush_timeout: Duration::from_millis(
            args.flush_timeout_ms
                .or(file.flush_timeout_ms)
                .unwrap_or(30_000),
        ),
        handover_grace: Duration::from_millis(
            args.handover_grace_ms
                .or(file.handover_grace_ms)
                .unwrap_or(30_000),
        ),
        sweep_handovers: true,
        filter_items: Some(
            args.filter_items
                .or(file.filter_items)
                .unwrap_or(10_000_000),
        )
        .filter(|&n| n > 0),
        filter_retention,
        filter_seed,
        filter_snapshot,
    })
}

/// Resolves the store settings: flags and environment, then the file, then
/// the defaults.
pub fn resolve_store(args: StoreArgs, file: &FileSettings) -> Result<StoreSettings, ConfigError> {
    let tiered = resolve_tiered(&args, file)?;
    let defaults = Limits::default();
    let limits = Limits {
        max_key_bytes: args
            .max_key_bytes
            .or(file.max_key_bytes)
            .unwrap_or(defaults.max_key_bytes),
        max_lease: args
            .max_lease_ms
            .or(file.max_lease_ms)
            .map_or(defaults.max_lease, Duration::from_millis),
        max_outcome_bytes: args
            .max_outcome_bytes
            .or(file.max_outcome_bytes)
            .unwrap_or(defaults.max_outcome_bytes),
        max_batch: args
            .max_batch
            .or(file.max_batch)
            .unwrap_or(defaults.max_batch),
        ..defaults
    };
    if limits.max_key_bytes == 0 {
        return Err(bad("max_key_bytes", "must be at least 1"));
    }
    if limits.max_lease.is_zero() {
        return Err(bad("max_lease_ms", "must be at least 1"));
    }
    let default_lease = Duration::from_millis(
        args.default_lease_ms
            .or(file.default_lease_ms)
            .unwrap_or(30_000),
    );
    if default_lease.is_zero() || default_lease > limits.max_lease {
        return Err(bad(
            "default_lease_ms",
            format!(
                "must be from 1 to max_lease_ms ({} ms)",
                limits.max_lease.as_millis()
            ),
        ));
    }
    // A tiered store with a key filter keeps records no longer than the
    // filter keeps keys: the default retention follows it down.
    let store_url = args.store.as_deref().or(file.store.as_deref());
    let filtered =
        matches!(store_url, Some("tiered" | "tiered://")) && tiered.filter_items.is_some();
    let longest = if filtered {
        limits.max_retention.min(tiered.filter_retention)
    } else {
        limits.max_retention
    };
    let default_retention = args
        .default_retention_ms
        .or(file.default_retention_ms)
        .map_or(
            Duration::from_secs(24 * 3600).min(longest),
            Duration::from_millis,
        );
    if default_retention.is_zero() || default_retention > longest {
        let why = if filtered {
            " (filter_retention_ms: the tiered store's key filter keeps keys no longer)"
        } else {
            ""
        };
        return Err(bad(
            "default_retention_ms",
            format!("must be from 1 to {} ms{why}", longest.as_millis()),
        ));
    }
    let redis_tls = RedisTls {
        ca: args.redis_ca_cert.or(file.redis_ca_cert.clone()),
        client: match (
            args.redis_client_cert.or(file.redis_client_cert.clone()),
            args.redis_client_key.or(file.redis_client_key.clone()),
        ) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(bad(
                    "redis_client_key",
                    "redis_client_cert is set, so redis_client_key must be too",
                ));
            }
            (None, Some(_)) => {
                return Err(bad(
                    "redis_client_cert",
                    "redis_client_key is set, so redis_client_cert must be too",
                ));
            }
        },
    };
    Ok(StoreSettings {
        store: args
            .store
            .or(file.store.clone())
            .unwrap_or_else(|| "file://./idem-data".to_owned()),
        tiered,
        durability: args
            .durability
            .or(file.durability)
            .unwrap_or(DurabilityArg::Group),
        redis_tls,
        limits,
        default_lease,
        default_retention,
        log: args
            .log
            .or(file.log.clone())
            .unwrap_or_else(|| "info,fjall=warn,lsm_tree=warn,async_nats=warn".to_owned()),
    })
}

pub fn resolve_common(
    args: CommonArgs,
    listen_flag: Option<String>,
    default_listen: &str,
    file: &FileSettings,
) -> Result<Common, ConfigError> {
    let listen_text = listen_flag
        .or_else(|| file.listen.clone())
        .unwrap_or_else(|| default_listen.to_owned());
    let listen = listen_text.parse().map_err(|_| {
        bad(
            "listen",
            format!("{listen_text:?} is not an address; give host:port, e.g. {default_listen}"),
        )
    })?;
    let max_body_bytes = args
        .max_body_bytes
        .or(file.max_body_bytes)
        .unwrap_or(16 * 1024 * 1024);
    if max_body_bytes == 0 {
        return Err(bad("max_body_bytes", "must be at least 1"));
    }
    let read_timeout_ms = args
        .read_timeout_ms
        .or(file.read_timeout_ms)
        .unwrap_or(30_000);
    if read_timeout_ms == 0 {
        return Err(bad("read_timeout_ms", "must be at least 1"));
    }
    let tls = match (
        args.tls_cert.or(file.tls_cert.clone()),
        args.tls_key.or(file.tls_key.clone()),
    ) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => return Err(bad("tls_key", "tls_cert is set, so tls_key must be too")),
        (None, Some(_)) => return Err(bad("tls_cert", "tls_key is set, so tls_cert must be too")),
    };
    let mut grants = Vec::new();
    for spec in args.auth_tokens.iter().filter(|s| !s.trim().is_empty()) {
        let Some((namespaces, token)) = spec.split_once('=') else {
            return Err(bad(
                "auth_tokens",
                format!("{:?} is not NAMESPACES=TOKEN", redact(spec)),
            ));
        };
        grants.push(grant(
            "auth_tokens",
            token,
            namespaces.split(',').map(str::to_owned).collect(),
        )?);
    }
    if args.auth_tokens.is_empty() {
        for entry in &file.auth {
            grants.push(grant("auth", &entry.token, entry.namespaces.clone())?);
        }
    }
    Ok(Common {
        listen,
        tls,
        max_body_bytes,
        read_timeout: Duration::from_millis(read_timeout_ms),
        auth: Auth::new(grants),
        settings: resolve_store(args.store, file)?,
    })
}

fn redact(spec: &str) -> String {
    match spec.split_once('=') {
        Some((ns, _)) => format!("{ns}=<token>"),
        None => "<token>".to_owned(),
    }
}

fn grant(field: &'static str, token: &str, namespaces: Vec<String>) -> Result<Grant, ConfigError> {
    let token = token.trim();
    if token.len() < 16 {
        return Err(bad(field, "a token must be at least 16 characters"));
    }
    let namespaces: Vec<String> = namespaces
        .into_iter()
        .map(|n| n.trim().to_owned())
        .collect();
    if namespaces.iter().any(|n| n == "*") {
        return Ok(Grant::new(token, Namespaces::All));
    }
    for n in &namespaces {
        idem_core::Namespace::new(n).map_err(|e| bad(field, e.to_string()))?;
    }
    if namespaces.is_empty() {
        return Err(bad(field, "name at least one namespace, or `*`"));
    }
    Ok(Grant::new(token, Namespaces::Only(namespaces)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::parse_duration;

    #[test]
    fn durations_take_their_unit_or_are_milliseconds() {
        let ok = |t: &str| parse_duration("upstream_timeout", t).unwrap();
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("750"), Duration::from_millis(750));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok(" 2m "), Duration::from_secs(120));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
        assert_eq!(ok("1d"), Duration::from_secs(24 * 3600));
        for bad in ["", "s", "1.5s", "-1s", "10 sec", "99999999999999999999s"] {
            let e = parse_duration("upstream_timeout", bad).unwrap_err();
            assert!(e.to_string().contains("upstream_timeout"), "{bad:?}: {e}");
        }
        for out in ["0s", "25h", "0"] {
            let e = parse_duration("upstream_timeout", out).unwrap_err();
            assert!(e.to_string().contains("1ms to 24h"), "{out:?}: {e}");
        }
    }
}
