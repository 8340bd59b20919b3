//! What the store settings name, read once: `--store`, and for `tiered`
//! its `--hot-store` and `--cold-store`. A URL idem cannot read, or a store
//! that cannot be the tier it is given as, is a bad setting here, before
//! anything is opened.

use crate::config::{ConfigError, StoreSettings, bad};

/// A store, as its settings name it.
pub enum StoreSpec {
    /// `memory://`: records that live and die with the process.
    Memory,
    /// `file://PATH`.
    File { path: String },
    /// `redis://`, `rediss://`, `redis+cluster://` or `rediss+cluster://`.
    #[cfg(feature = "redis")]
    Redis(RedisSpec),
    /// `postgres://`, `postgresql://`, `mysql://` or `mariadb://`.
    #[cfg(feature = "sql")]
    Sql(SqlSpec),
    /// `tiered`: a hot tier in front of a cold one (docs/high-volume.md).
    Tiered { hot: HotTier, cold: ColdTier },
}

/// What can be a tiered store's hot tier.
pub enum HotTier {
    /// `memory://`: this process's alone.
    Memory,
    /// Redis, shared by every process in front of the cold tier.
    #[cfg(feature = "redis")]
    Redis(RedisSpec),
}

/// What can be a tiered store's cold tier.
pub enum ColdTier {
    /// `file://PATH`.
    File { path: String },
    /// PostgreSQL or MySQL.
    #[cfg(feature = "sql")]
    Sql(SqlSpec),
}

/// A Redis server, or the nodes of a Redis Cluster.
#[cfg(feature = "redis")]
pub struct RedisSpec {
    /// `redis://HOST:PORT…` or `rediss://…`: the server, or each node
    /// given for a cluster.
    pub nodes: Vec<String>,
    /// Whether the nodes are a Redis Cluster's.
    pub cluster: bool,
}

/// A PostgreSQL or MySQL (MariaDB) database, with idem's query parameters.
#[cfg(feature = "sql")]
pub struct SqlSpec {
    /// The URL as given, idem's parameters (`?shards=N&table=…`) included.
    pub url: String,
    mysql: bool,
}

impl StoreSpec {
    /// The store `settings` name. The TLS settings for Redis are refused
    /// unless `--store` is a TLS Redis store.
    pub fn parse(settings: &StoreSettings) -> Result<Self, ConfigError> {
        let url = settings.store.as_str();
        let spec = if url == "tiered" || url == "tiered://" {
            let t = &settings.tiered;
            Self::Tiered {
                hot: HotTier::parse(&t.hot)?,
                cold: ColdTier::parse(&t.cold)?,
            }
        } else if let Some(path) = url.strip_prefix("file://") {
            Self::File {
                path: file_path(path)?,
            }
        } else if url == "memory://" || url == "memory:" {
            Self::Memory
        } else {
            Self::parse_served(url).ok_or_else(|| unsupported(url))?
        };
        let tls = &settings.redis_tls;
        if (tls.ca.is_some() || tls.client.is_some()) && !spec.is_tls_redis() {
            let field = if tls.ca.is_some() {
                "redis_ca_cert"
            } else {
                "redis_client_cert"
            };
            return Err(bad(
                field,
                "is for a TLS Redis store: give --store rediss://HOST:PORT or rediss+cluster://HOST:PORT,…",
            ));
        }
        Ok(spec)
    }

    /// A store served by another program (Redis, a database), or `None`.
    #[cfg_attr(not(any(feature = "redis", feature = "sql")), allow(unused_variables))]
    fn parse_served(url: &str) -> Option<Self> {
        #[cfg(feature = "redis")]
        if let Some(redis) = RedisSpec::parse(url) {
            return Some(Self::Redis(redis));
        }
        #[cfg(feature = "sql")]
        if let Some(sql) = SqlSpec::parse(url) {
            return Some(Self::Sql(sql));
        }
        None
    }

    /// The `store` label of its metrics: its kind, never its address.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::File { .. } => "file",
            #[cfg(feature = "redis")]
            Self::Redis(redis) => redis.kind(),
            #[cfg(feature = "sql")]
            Self::Sql(sql) => sql.kind(),
            Self::Tiered { .. } => "tiered",
        }
    }

    fn is_tls_redis(&self) -> bool {
        match self {
            #[cfg(feature = "redis")]
            Self::Redis(redis) => redis.is_tls(),
            _ => false,
        }
    }
}

impl HotTier {
    fn parse(url: &str) -> Result<Self, ConfigError> {
        if url.starts_with("memory:") {
            return Ok(Self::Memory);
        }
        #[cfg(feature = "redis")]
        if let Some(redis) = RedisSpec::parse(url) {
            return Ok(Self::Redis(redis));
        }
        Err(bad(
            "hot_store",
            format!(
                "{:?} cannot be a hot tier; use memory:// or a Redis URL (redis://HOST:PORT, redis+cluster://HOST:PORT,…)",
                scheme(url)
            ),
        ))
    }

    /// The `store` label of its metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            #[cfg(feature = "redis")]
            Self::Redis(redis) => redis.kind(),
        }
    }
}

impl ColdTier {
    fn parse(url: &str) -> Result<Self, ConfigError> {
        if let Some(path) = url.strip_prefix("file://") {
            return Ok(Self::File {
                path: file_path(path)?,
            });
        }
        #[cfg(feature = "sql")]
        if let Some(sql) = SqlSpec::parse(url) {
            return Ok(Self::Sql(sql));
        }
        Err(bad(
            "cold_store",
            format!(
                "{:?} cannot be a cold tier; use file://PATH, postgres://USER@HOST:PORT/DB or mysql://USER@HOST:PORT/DB",
                scheme(url)
            ),
        ))
    }

    /// The `store` label of its metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::File { .. } => "file",
            #[cfg(feature = "sql")]
            Self::Sql(sql) => sql.kind(),
        }
    }
}

#[cfg(feature = "redis")]
impl RedisSpec {
    /// A Redis URL's server or cluster nodes; `None` for other schemes.
    fn parse(url: &str) -> Option<Self> {
        if let Some((scheme, nodes)) = url
            .split_once("+cluster://")
            .filter(|(scheme, _)| matches!(*scheme, "redis" | "rediss"))
        {
            return Some(Self {
                nodes: nodes
                    .split(',')
                    .map(|n| format!("{scheme}://{n}"))
                    .collect(),
                cluster: true,
            });
        }
        (url.starts_with("redis://") || url.starts_with("rediss://")).then(|| Self {
            nodes: vec![url.to_owned()],
            cluster: false,
        })
    }

    fn kind(&self) -> &'static str {
        if self.cluster {
            "redis-cluster"
        } else {
            "redis"
        }
    }

    fn is_tls(&self) -> bool {
        self.nodes.iter().all(|n| n.starts_with("rediss://"))
    }
}

#[cfg(feature = "sql")]
impl SqlSpec {
    /// A database URL; `None` for other schemes.
    pub fn parse(url: &str) -> Option<Self> {
        let mysql = match scheme(url) {
            "postgres" | "postgresql" => false,
            "mysql" | "mariadb" => true,
            _ => return None,
        };
        url.contains("://").then(|| Self {
            url: url.to_owned(),
            mysql,
        })
    }

    fn kind(&self) -> &'static str {
        if self.mysql { "mysql" } else { "postgres" }
    }
}

/// The path of a `file://` URL.
fn file_path(path: &str) -> Result<String, ConfigError> {
    if path.is_empty() {
        return Err(bad(
            "store",
            "file:// needs a path, e.g. file://./idem-data",
        ));
    }
    Ok(path.to_owned())
}

fn unsupported(url: &str) -> ConfigError {
    bad(
        "store",
        format!(
            "{:?} stores are not supported by this build; use file://PATH, memory://, redis://HOST:PORT or redis+cluster://HOST:PORT,HOST:PORT (rediss:// and rediss+cluster:// for TLS), postgres://USER@HOST:PORT/DB, mysql://USER@HOST:PORT/DB, or tiered (with --hot-store and --cold-store)",
            scheme(url)
        ),
    )
}

/// A URL's scheme: what comes before `://`, or all of it.
fn scheme(url: &str) -> &str {
    url.split_once("://").map_or(url, |(s, _)| s)
}
