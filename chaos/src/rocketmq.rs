//! RocketMQ's end state read with the RocketMQ client's own pull consumer
//! and admin rather than idem's source: the dead-letter topic whole, from
//! each queue's minimum to its maximum offset committing nothing, and the
//! consumers' group's progress as the broker counts it.

#![allow(deprecated)] // The classic pull consumer reads between two offsets.

use std::time::Duration;

use idem_rocketmq::ClientHost;
use rocketmq_client_rust::{DefaultMQAdminExt, DefaultMQPullConsumer, MQAdminReadExt, PullStatus};

/// Messages one pull asks for.
const PULL: i32 = 32;

/// How long the group's committed offsets may take to reach the end: the
/// client commits every 5 s and at shutdown.
pub const COMMIT_WAIT: Duration = Duration::from_secs(12);

/// Every message of `topic` through `key` (the run's key in a body). A
/// topic the name server does not know holds nothing: the test broker can
/// lose a topic created just before a restart (its topic table not yet
/// flushed), and a message sent to it since would have created it again
/// (or failed, and stayed with the consumers' group, whose backlog is
/// checked).
pub async fn read_all(
    name_servers: &str,
    topic: &str,
    key: fn(&[u8]) -> String,
) -> Result<Vec<String>, String> {
    if !topic_exists(name_servers, topic).await? {
        return Ok(Vec::new());
    }
    let host = ClientHost::new(0).map_err(|e| e.to_string())?;
    let read = async {
        let consumer = DefaultMQPullConsumer::builder(host.runtime())
            .consumer_group(format!("idem-chaos-reader-{}", std::process::id()))
            .name_server_addr(name_servers.to_owned())
            .build()
            .map_err(|e| format!("a pull consumer: {e}"))?;
        Box::pin(consumer.start())
            .await
            .map_err(|e| format!("a pull consumer: {e}"))?;
        let queues = Box::pin(consumer.fetch_subscribe_message_queues(topic))
            .await
            .map_err(|e| format!("the queues of topic {topic}: {e}"))?;
        let mut keys = Vec::new();
        for q in &queues {
            let fail = |e: &dyn std::fmt::Display| format!("reading topic {topic}: {e}");
            let mut offset = Box::pin(consumer.min_offset(q))
                .await
                .map_err(|e| fail(&e))?;
            let max = Box::pin(consumer.max_offset(q))
                .await
                .map_err(|e| fail(&e))?;
            while offset < max {
                let pulled = Box::pin(consumer.pull(q, "*", offset, PULL))
                    .await
                    .map_err(|e| fail(&e))?;
                if *pulled.pull_status() == PullStatus::Found {
                    for m in pulled.msg_found_list().unwrap_or_default() {
                        keys.push(key(&m.body().unwrap_or_default()));
                    }
                }
                let next = i64::try_from(pulled.next_begin_offset()).unwrap_or(i64::MAX);
                if next <= offset {
                    return Err(format!(
                        "topic {topic} queue {}: stuck at offset {offset} below its end {max}",
                        q.queue_id()
                    ));
                }
                offset = next;
            }
        }
        // The read is done; a shutdown that fails loses nothing.
        let _ = Box::pin(consumer.shutdown()).await;
        Ok(keys)
    };
    let keys = read.await;
    host.shutdown().await;
    keys
}

/// An admin client of `name_servers` on `host`'s runtime, started; `role`
/// goes into its instance name.
async fn start_admin(
    host: &ClientHost,
    role: &str,
    name_servers: &str,
) -> Result<DefaultMQAdminExt, String> {
    let mut admin = DefaultMQAdminExt::new(host.runtime());
    admin
        .client_config_mut()
        .set_instance_name(format!("idem-chaos-{role}-{}", std::process::id()).into());
    admin.set_namesrv_addr(name_servers.to_owned());
    Box::pin(admin.start())
        .await
        .map_err(|e| format!("an admin client: {e}"))?;
    Ok(admin)
}

/// Whether the name server lists `topic`.
async fn topic_exists(name_servers: &str, topic: &str) -> Result<bool, String> {
    let host = ClientHost::new(0).map_err(|e| e.to_string())?;
    let read = async {
        let mut admin = start_admin(&host, "topics", name_servers).await?;
        let listed = Box::pin(admin.fetch_all_topic_list())
            .await
            .map_err(|e| format!("the topics the name server knows: {e}"));
        Box::pin(admin.shutdown()).await;
        Ok(listed?.topic_list.iter().any(|t| t.as_str() == topic))
    };
    let exists = read.await;
    host.shutdown().await;
    exists
}

/// Messages of `group`'s topics (its subscription and `%RETRY%GROUP`)
/// stored but not committed as consumed, waited on for up to `wait` (see
/// [`COMMIT_WAIT`]) to reach zero: a problem when they do not.
pub async fn group_backlog(
    name_servers: &str,
    group: &str,
    wait: Duration,
) -> Result<Option<String>, String> {
    let host = ClientHost::new(0).map_err(|e| e.to_string())?;
    let read = async {
        let mut admin = start_admin(&host, "admin", name_servers).await?;
        let deadline = tokio::time::Instant::now() + wait;
        let behind = loop {
            let stats = Box::pin(admin.examine_consume_stats(group.into(), None, None, None, None))
                .await
                .map_err(|e| format!("the progress of group {group}: {e}"))?;
            let behind: i64 = stats
                .offset_table
                .values()
                .map(|o| (o.get_broker_offset() - o.get_consumer_offset().max(0)).max(0))
                .sum();
            if behind == 0 || tokio::time::Instant::now() >= deadline {
                break behind;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        Box::pin(admin.shutdown()).await;
        Ok((behind != 0).then(|| {
            format!(
                "RocketMQ group {group}: {behind} messages stored but not consumed at the end \
                 (after waiting {wait:?} for the client's commits)"
            )
        }))
    };
    let problem = read.await;
    host.shutdown().await;
    problem
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_consumer::Source;

    fn key(body: &[u8]) -> String {
        serde_json::from_slice::<serde_json::Value>(body).unwrap()["key"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Against the test broker: messages a group has not consumed show as
    /// its backlog, one it consumed whole shows none, the reader gets
    /// every message of a topic, and a topic never made reads as empty.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unconsumed_messages_show_as_backlog_and_every_message_is_read() {
        let base =
            idem_testkit::services::url("IDEM_TEST_ROCKETMQ_URL", "rocketmq://127.0.0.1:9876");
        let publisher = match idem_rocketmq::RocketMqPublisher::connect(&base).await {
            Ok(p) => p,
            Err(e) => {
                idem_testkit::services::absent::<()>("RocketMQ", &base, e);
                return;
            }
        };
        let topic = format!("chaos_rocketmq_reader_{:x}", fastrand::u32(..));
        let group = format!("{topic}_group");
        publisher.create_topic(&topic, 2).await.unwrap();
        let config =
            idem_rocketmq::RocketMqConfig::from_url(&format!("{base}?topic={topic}&group={group}"))
                .unwrap();
        let name_servers = config.name_servers().to_owned();
        let source = idem_rocketmq::RocketMqSource::connect(config)
            .await
            .unwrap();
        let publish = async |keys: &[&str]| {
            for k in keys {
                let body = format!(r#"{{"key":"{k}"}}"#);
                publisher.publish(&topic, k, &[], body).await.unwrap();
            }
        };
        publish(&["a", "b", "c"]).await;
        let mut consumed = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while consumed < 3 && tokio::time::Instant::now() < deadline {
            for delivery in source.fetch(8).await.unwrap() {
                source.ack(delivery).await.unwrap();
                consumed += 1;
            }
        }
        assert_eq!(consumed, 3, "the group consumed what was published");
        // Commits the offsets.
        source.shutdown().await;
        let none = group_backlog(&name_servers, &group, COMMIT_WAIT)
            .await
            .unwrap();
        assert_eq!(
            none, None,
            "a group that consumed everything is behind by nothing"
        );
        publish(&["d", "e"]).await;
        let behind = group_backlog(&name_servers, &group, Duration::from_secs(1))
            .await
            .unwrap()
            .expect("two messages no one consumed");
        assert!(
            behind.contains(": 2 messages stored but not consumed"),
            "{behind}"
        );
        let mut keys = read_all(&name_servers, &topic, key).await.unwrap();
        keys.sort();
        assert_eq!(keys, ["a", "b", "c", "d", "e"]);
        let missing = format!("{topic}_never_made");
        assert!(
            read_all(&name_servers, &missing, key)
                .await
                .unwrap()
                .is_empty()
        );
        publisher.shutdown().await;
    }
}
