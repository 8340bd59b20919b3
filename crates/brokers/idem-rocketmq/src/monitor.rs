//! How far a consumer group is behind, as the broker counts it.

use std::sync::Arc;

use idem_consumer::SourceError;
use rocketmq_client_rust::{DefaultMQAdminExt, MQAdminReadExt};
use tokio::sync::Mutex;

use crate::client::{self, ClientHost, ConnectError};

/// Reads consumer groups' progress from the brokers: messages stored but
/// not yet acked and committed, over the topic and the group's retry topic.
///
/// ```no_run
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use idem_rocketmq::RocketMqMonitor;
///
/// let monitor = RocketMqMonitor::connect("rocketmq://127.0.0.1:9876").await?;
/// println!("billing is {} messages behind", monitor.backlog("billing").await?);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RocketMqMonitor {
    admin: Arc<Mutex<DefaultMQAdminExt>>,
    _host: Arc<ClientHost>,
}

impl RocketMqMonitor {
    /// Starts an admin client against the name servers of `url`
    /// (`rocketmq://host:port[,host:port]`; a query is ignored).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the client being started.
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        let base = url.split('?').next().unwrap_or_default();
        let config = crate::RocketMqConfig::from_url(&format!("{base}?topic=t&group=g"))?;
        client::probe(config.name_servers()).await?;
        let host = ClientHost::new(0)?;
        let mut admin = DefaultMQAdminExt::new(host.runtime());
        admin
            .client_config_mut()
            .set_instance_name(client::instance_name("monitor").into());
        admin.set_namesrv_addr(config.name_servers().to_owned());
        Box::pin(admin.start())
            .await
            .map_err(|e| ConnectError::Client {
                what: "admin client",
                reason: e.to_string(),
            })?;
        Ok(Self {
            admin: Arc::new(Mutex::new(admin)),
            _host: host,
        })
    }

    /// Messages of `group`'s topics (its subscriptions and `%RETRY%GROUP`)
    /// stored but not yet committed as consumed. The client commits every
    /// 5 s and at shutdown, so a drained group reads 0 a few seconds after
    /// its last ack. A retry waiting for its delay level is not counted
    /// until it is due.
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it loses nothing.
    pub async fn backlog(&self, group: &str) -> Result<u64, SourceError> {
        let admin = self.admin.lock().await;
        let stats = Box::pin(admin.examine_consume_stats(group.into(), None, None, None, None))
            .await
            .map_err(|e| SourceError::new(format!("reading the progress of group `{group}`"), e))?;
        Ok(stats
            .offset_table
            .values()
            .map(|o| {
                let behind = o.get_broker_offset() - o.get_consumer_offset().max(0);
                u64::try_from(behind).unwrap_or(0)
            })
            .sum())
    }

    /// The topics the name servers know.
    ///
    /// # Cancel safety
    ///
    /// A read: dropping it loses nothing.
    pub async fn topics(&self) -> Result<Vec<String>, SourceError> {
        let admin = self.admin.lock().await;
        let list = Box::pin(admin.fetch_all_topic_list())
            .await
            .map_err(|e| SourceError::new("listing the topics", e))?;
        Ok(list.topic_list.iter().map(ToString::to_string).collect())
    }
}
