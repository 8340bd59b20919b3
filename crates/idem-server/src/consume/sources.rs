//! The broker behind `--from`, chosen by the URL's scheme.

use idem_consumer::{BoxSource, Report};

use super::Job;
use crate::config::{ConfigError, bad};
use crate::run::Failure;

/// Checks that this build reads `from`'s scheme, before anything opens.
pub fn check(from: &str) -> Result<(), ConfigError> {
    let Some((scheme, _)) = from.split_once("://") else {
        return Err(bad(
            "from",
            format!(
                "{:?} is not a URL; {FORMS}",
                idem_core::text::redacted_url(from)
            ),
        ));
    };
    let known: &[&str] = &[
        #[cfg(feature = "amqp")]
        "amqp",
        #[cfg(feature = "amqp")]
        "amqps",
        #[cfg(feature = "jetstream")]
        "nats",
        #[cfg(feature = "jetstream")]
        "tls",
        #[cfg(feature = "redis-streams")]
        "redis",
        #[cfg(feature = "redis-streams")]
        "rediss",
        #[cfg(feature = "kafka")]
        "kafka",
        #[cfg(feature = "rocketmq")]
        "rocketmq",
    ];
    if known.contains(&scheme) {
        #[cfg(feature = "kafka")]
        if scheme == "kafka" {
            idem_kafka::KafkaConfig::from_url(from).map_err(|e| bad("from", e.to_string()))?;
        }
        Ok(())
    } else if let Some(feature) = feature_of(scheme) {
        Err(bad(
            "from",
            format!(
                "{scheme}:// sources are not in this build of idem: build it with \
                 `cargo build --release --features {feature}` (or `--features full` for every \
                 broker)"
            ),
        ))
    } else {
        Err(bad(
            "from",
            format!("{scheme}:// sources are not supported; {FORMS}"),
        ))
    }
}

/// The cargo feature that brings `scheme`'s broker into the build.
fn feature_of(scheme: &str) -> Option<&'static str> {
    match scheme {
        "amqp" | "amqps" => Some("amqp"),
        "nats" | "tls" => Some("jetstream"),
        "redis" | "rediss" => Some("redis-streams"),
        "kafka" => Some("kafka"),
        "rocketmq" => Some("rocketmq"),
        _ => None,
    }
}

/// Connects the source `from` names and runs `job` on it.
pub async fn run(from: &str, job: Job) -> Result<Report, Failure> {
    check(from)?;
    let scheme = from.split_once("://").map_or(from, |(s, _)| s);
    match scheme {
        #[cfg(feature = "amqp")]
        "amqp" | "amqps" => amqp(from, job).await,
        #[cfg(feature = "jetstream")]
        "nats" | "tls" => jetstream(from, job).await,
        #[cfg(feature = "redis-streams")]
        "redis" | "rediss" => redis_streams(from, job).await,
        #[cfg(feature = "kafka")]
        "kafka" => kafka(from, job).await,
        #[cfg(feature = "rocketmq")]
        "rocketmq" => rocketmq(from, job).await,
        _ => unreachable!("checked above"),
    }
}

const FORMS: &str = "give amqp://USER:PASS@HOST:PORT/VHOST?queue=NAME, \
    nats://HOST:PORT?stream=STREAM&consumer=NAME&subject=SUBJECT, \
    redis://HOST:PORT?stream=NAME&group=GROUP or \
    kafka://HOST:PORT?topic=TOPIC&group=GROUP or \
    rocketmq://NAMESRV_HOST:PORT?topic=TOPIC&group=GROUP";

#[cfg(feature = "amqp")]
async fn amqp(from: &str, job: Job) -> Result<Report, Failure> {
    let mut config = idem_amqp::AmqpConfig::from_url(from)
        .map_err(|e| bad("from", e.to_string()))?
        .concurrency(job.concurrency)
        .lease(job.lease);
    if let Some(name) = &job.dead_letter {
        config = config.dead_letter(name.clone());
    }
    let source = idem_amqp::AmqpSource::connect(config)
        .await
        .map_err(|e| Failure::Run(e.to_string()))?;
    let report = job.run(BoxSource::new(source.clone())).await;
    // Hands back what the broker sent ahead, without counting an attempt.
    source.close().await;
    report
}

#[cfg(feature = "jetstream")]
async fn jetstream(from: &str, job: Job) -> Result<Report, Failure> {
    use idem_jetstream::{JetStreamConfig, JetStreamSource};

    let mut config = JetStreamConfig::from_url(from)
        .map_err(|e| bad("from", e.to_string()))?
        .concurrency(job.concurrency)
        .lease(job.lease);
    if let Some(subject) = &job.dead_letter {
        config = config.dead_letter(subject.clone());
    }
    // The error names the server as host:port only: never the password.
    let source = JetStreamSource::connect(config)
        .await
        .map_err(|e| Failure::Run(e.to_string()))?;
    job.run(BoxSource::new(source)).await
}

#[cfg(feature = "redis-streams")]
async fn redis_streams(from: &str, job: Job) -> Result<Report, Failure> {
    use idem_redis_streams::{RedisStreamConfig, RedisStreamSource};
    let mut config = RedisStreamConfig::from_url(from)
        .map_err(|e| bad("from", e.to_string()))?
        .concurrency(job.concurrency)
        .lease(job.lease);
    if let Some(name) = &job.dead_letter {
        config = config.dead_letter(name.clone());
    }
    let source = RedisStreamSource::connect(config)
        .await
        .map_err(|e| Failure::Run(e.to_string()))?;
    job.run(BoxSource::new(source)).await
}

#[cfg(feature = "kafka")]
async fn kafka(from: &str, mut job: Job) -> Result<Report, Failure> {
    use idem_kafka::{KafkaConfig, KafkaSource, RetryMode};

    let mut config = KafkaConfig::from_url(from)
        .map_err(|e| bad("from", e.to_string()))?
        .concurrency(job.concurrency)
        .lease(job.lease);
    if job.blocking {
        config = config.retry(RetryMode::Blocking);
    } else if *config.retry_mode() == RetryMode::Blocking {
        job.blocking = true;
    }
    if let Some(topic) = &job.dead_letter {
        config = config.dead_letter(topic.clone());
    }
    let source = KafkaSource::connect(config)
        .await
        .map_err(|e| Failure::Run(e.to_string()))?;
    let report = job.run(BoxSource::new(source.clone())).await;
    // Commits what finished and leaves the group.
    source.close().await;
    report
}

#[cfg(feature = "rocketmq")]
async fn rocketmq(from: &str, job: Job) -> Result<Report, Failure> {
    use idem_rocketmq::{RocketMqConfig, RocketMqSource};
    let mut config = RocketMqConfig::from_url(from)
        .map_err(|e| bad("from", e.to_string()))?
        .concurrency(job.concurrency)
        .lease(job.lease);
    // The broker parks a message in %DLQ% after its own count of
    // redeliveries, without idem's headers: never before the runner's last
    // attempt.
    let reconsume = config.max_reconsume_times_value().max(job.max_attempts);
    config = config.max_reconsume_times(reconsume);
    if let Some(topic) = &job.dead_letter {
        config = config.dead_letter(topic.clone());
    }
    let source = RocketMqSource::connect(config)
        .await
        .map_err(|e| Failure::Run(e.to_string()))?;
    let report = job.run(BoxSource::new(source.clone())).await;
    // Commits the offsets; what the runner never acked (handed back at
    // shutdown, or not yet fetched) goes to the next consumer uncounted.
    source.shutdown().await;
    report
}
