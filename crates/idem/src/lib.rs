//! idem makes at-least-once delivery safe: however often a message or request
//! arrives, its business effect happens once.
//!
//! This crate gathers idem's parts behind features:
//! - always: the record, the [`Store`] contract, the [`Guard`] and the
//!   [`MemoryStore`] (from `idem-core`);
//! - `file` (default): [`FileStore`], the embedded durable store;
//! - `redis`: `RedisStore`, on standalone Redis or Redis Cluster, and its
//!   distributed `Lock` (watchdog, fencing tokens, fair waiting);
//! - `sql`: `SqlStore` on PostgreSQL or MySQL/MariaDB, with the consumed
//!   messages table and guarded state transitions, as `idem::sql`;
//! - `consumer`: the broker-independent consumer runner, as `idem::consumer`;
//!   `amqp`, `jetstream`, `redis-streams`, `kafka` and `rocketmq` add each
//!   broker's source, as `idem::amqp`, `idem::jetstream`,
//!   `idem::redis_streams`, `idem::kafka` (it builds librdkafka from its C
//!   sources) and `idem::rocketmq`.
//!
//! ```no_run
//! use idem::{FileStore, Guard, Key, Lease};
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let guard = Guard::new(FileStore::open("./idem-data")?).lease(Lease::from_secs(30));
//! let key = Key::new("payments", "charge-42")?;
//! let receipt: String = guard
//!     .run(&key, None, |claim| async move {
//!         // Charge the card once; hand `claim.token()` to a sink that checks it.
//!         Ok::<_, std::io::Error>(format!("charged by holder {:?}", claim.token()))
//!     })
//!     .await?;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub use idem_core::*;

#[cfg(feature = "file")]
pub use idem_file::{Durability, FileStore, FileStoreBuilder, OpenError};

#[cfg(feature = "redis")]
pub use idem_redis::{ConnectError, Lock, LockGuard, RedisStore, RedisStoreBuilder};

/// The SQL store on PostgreSQL or MySQL/MariaDB, and the business-layer
/// tools that work in the caller's own SQL transaction.
#[cfg(feature = "sql")]
pub use idem_sql as sql;

/// The key filter and the tiered store (`idem-tiered`).
#[cfg(feature = "tiered")]
pub use idem_tiered as tiered;

/// The consumer runner: takes messages from a broker and runs the handler
/// once per key under the guard.
#[cfg(feature = "consumer")]
pub use idem_consumer as consumer;

/// RabbitMQ (AMQP 0-9-1) as a consumer source.
#[cfg(feature = "amqp")]
pub use idem_amqp as amqp;

/// NATS JetStream as a consumer source.
#[cfg(feature = "jetstream")]
pub use idem_jetstream as jetstream;

/// Apache Kafka (or any Kafka-protocol broker) as a consumer source.
#[cfg(feature = "kafka")]
pub use idem_kafka as kafka;
/// Redis Streams as a consumer source.
#[cfg(feature = "redis-streams")]
pub use idem_redis_streams as redis_streams;

/// Apache RocketMQ as a consumer source.
#[cfg(feature = "rocketmq")]
pub use idem_rocketmq as rocketmq;
