//! What the RabbitMQ tests share: the broker's URL (skipping when it is
//! away), unique queue names, a raw look at queues, and running the runner
//! until a condition holds.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use idem_amqp::{AmqpConfig, AmqpPublisher};
use idem_consumer::{Handler, HandlerError, Message, Report, Runner};
use idem_core::{Bytes, ClaimHandle, Store};
use idem_testkit::services;
use lapin::message::BasicGetMessage;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub const DEFAULT_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The test broker's URL, or `None` (test skipped) when it is away.
pub async fn broker() -> Option<String> {
    let url = services::url("IDEM_TEST_AMQP_URL", DEFAULT_URL);
    match Connection::connect(&url, ConnectionProperties::default()).await {
        Ok(c) => {
            let _ = c.close(200, "OK".into()).await;
            Some(url)
        }
        Err(e) => services::absent("RabbitMQ", &url, e),
    }
}

/// A queue name no other test uses.
pub fn unique(what: &str) -> String {
    format!("idem-test-{what}-{:016x}", fastrand::u64(..))
}

/// The source configuration for `queue` on the broker at `url`.
pub fn config(url: &str, queue: &str) -> AmqpConfig {
    let sep = if url.contains('?') { '&' } else { '?' };
    AmqpConfig::from_url(&format!("{url}{sep}queue={queue}")).expect("test URL parses")
}

/// A message with id `id` and a small JSON body.
pub fn message(id: &str) -> Message {
    let mut m = Message::new(format!("{{\"id\":\"{id}\"}}"));
    m.id = Some(id.to_owned());
    m.content_type = Some("application/json".into());
    m
}

/// A plain connection to look at queues, as an operator would.
pub struct Inspect {
    url: String,
    connection: Connection,
    channel: Channel,
}

impl Inspect {
    pub async fn new(url: &str) -> Self {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("broker reachable");
        let channel = connection.create_channel().await.unwrap();
        Self {
            url: url.to_owned(),
            connection,
            channel,
        }
    }

    /// Messages ready in `queue` (not counting those delivered and unacked).
    pub async fn ready(&self, queue: &str) -> u32 {
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        self.channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .unwrap_or_else(|e| panic!("queue {queue} exists: {e}"))
            .message_count()
    }

    /// Messages ready in `queue`, 0 when it does not exist.
    pub async fn ready_or_zero(&self, queue: &str) -> u32 {
        // A missing queue closes the channel: one of its own.
        let channel = self.connection.create_channel().await.unwrap();
        let passive = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let n = channel
            .queue_declare(queue.into(), passive, FieldTable::default())
            .await
            .map_or(0, |q| q.message_count());
        let _ = channel.close(200, "OK".into()).await;
        n
    }

    /// Deletes one queue.
    pub async fn delete_one(&self, queue: &str) {
        self.channel
            .queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
            .unwrap();
    }

    /// Takes one message from `queue`, acked.
    pub async fn get(&self, queue: &str) -> Option<BasicGetMessage> {
        self.channel
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
    }

    /// Deletes `queue` and the queues the source made for it.
    pub async fn delete(&self, queue: &str) {
        for name in config(&self.url, queue).queues() {
            let _ = self
                .channel
                .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
    }

    /// Publishes `message` to `queue` as a producer that does not ask for
    /// persistence would (`delivery_mode` 1), confirmed.
    pub async fn publish_transient(&self, queue: &str, message: &Message) {
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(
                name.as_str().into(),
                AMQPValue::LongString(value.to_vec().into()),
            );
        }
        let mut props = BasicProperties::default()
            .with_delivery_mode(1)
            .with_headers(headers);
        if let Some(id) = &message.id {
            props = props.with_message_id(id.as_str().into());
        }
        self.publish_raw(queue, &message.body, props).await;
    }

    /// Publishes `body` with `props` to `queue` through the default
    /// exchange, confirmed.
    pub async fn publish_raw(&self, queue: &str, body: &[u8], props: BasicProperties) {
        let channel = self.connection.create_channel().await.unwrap();
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .unwrap();
        let confirm = channel
            .basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .unwrap()
            .await
            .unwrap();
        assert!(confirm.is_ack(), "{queue} took the message");
        let _ = channel.close(200, "OK".into()).await;
    }

    /// Declares `queue` durable, as a user's own queue.
    pub async fn declare(&self, queue: &str) {
        self.channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::durable(),
                FieldTable::default(),
            )
            .await
            .unwrap();
    }

    pub async fn close(self) {
        let _ = self.connection.close(200, "OK".into()).await;
    }
}

/// Stops the broker's application and starts it again at once, then waits
/// until it accepts connections. Every connection to it is lost; durable
/// queues keep their persistent messages and lose the others.
///
/// Other tests on the broker lose it meanwhile: the window is kept to the
/// two commands, and this returns only once the broker is back.
pub async fn restart_broker(url: &str) {
    let stopped = rabbitmqctl_status(&["stop_app"]).await;
    // Started again whatever happened, so that no failure leaves it down.
    let started = rabbitmqctl_status(&["start_app"]).await;
    let back = eventually(Duration::from_secs(60), || async {
        match Connection::connect(url, ConnectionProperties::default()).await {
            Ok(c) => {
                let _ = c.close(200, "OK".into()).await;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    assert!(stopped.is_ok(), "rabbitmqctl stop_app: {stopped:?}");
    assert!(started.is_ok(), "rabbitmqctl start_app: {started:?}");
    assert!(back, "the broker accepts connections again");
}

async fn rabbitmqctl_status(args: &[&str]) -> Result<(), String> {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// A runner running in a task of its own.
pub struct Running {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<Report, idem_consumer::RunError>>,
}

impl Running {
    pub fn start<S, Src, H>(runner: Runner<S, Src, H>) -> Self
    where
        S: Store + Clone,
        Src: idem_consumer::Source,
        H: Handler,
    {
        let stop = CancellationToken::new();
        let task = tokio::spawn(runner.run(stop.clone()));
        Self { stop, task }
    }

    /// Cancels the runner and waits for its graceful end.
    pub async fn stop(self) -> Report {
        self.stop.cancel();
        self.task.await.unwrap().expect("runner starts")
    }
}

/// Waits (up to `limit`) until `n` ids took effect and `queue` has nothing
/// ready, lets the last prefetched copies settle, then stops the runner and
/// closes the source; whether it drained, and the runner's report.
pub async fn drain(
    running: Running,
    source: &idem_amqp::AmqpSource,
    inspect: &Inspect,
    queue: &str,
    effects: &Effects,
    n: usize,
    limit: Duration,
) -> (bool, Report) {
    let drained = eventually(limit, || async {
        effects.lock().len() == n && inspect.ready(queue).await == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    let report = running.stop().await;
    source.close().await;
    (drained, report)
}

/// Polls `check` every 20 ms until it holds or `limit` passes; whether it held.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A vhost of the test's own on the test broker, so that closing all its
/// connections (as a broker restart would) touches no other test. Needs
/// `rabbitmqctl` on the broker's machine; `None` (test skipped) without it.
pub struct Vhost {
    pub name: String,
    pub url: String,
}

impl Vhost {
    pub async fn create(url: &str) -> Option<Self> {
        if !services::program("rabbitmqctl") {
            return None;
        }
        let name = unique("vhost");
        rabbitmqctl(&["add_vhost", &name]).await;
        let mut parsed = url::Url::parse(url).unwrap();
        parsed.set_path(&name);
        let vhost = Self {
            name,
            url: parsed.into(),
        };
        vhost.permit(true).await;
        Some(vhost)
    }

    /// Closes every client connection to the vhost from the server side.
    pub async fn close_all_connections(&self) {
        rabbitmqctl(&["close_all_connections", "-p", &self.name, "test"]).await;
    }

    /// Takes the test user's permissions on the vhost away (connections are
    /// refused) or gives them back.
    pub async fn permit(&self, allowed: bool) {
        if allowed {
            rabbitmqctl(&[
                "set_permissions",
                "-p",
                &self.name,
                "guest",
                ".*",
                ".*",
                ".*",
            ])
            .await;
        } else {
            rabbitmqctl(&["clear_permissions", "-p", &self.name, "guest"]).await;
        }
    }

    /// Deletes the vhost and its queues.
    pub async fn delete(self) {
        rabbitmqctl(&["delete_vhost", &self.name]).await;
    }
}

async fn rabbitmqctl(args: &[&str]) {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .expect("rabbitmqctl runs");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Publishes `messages` to the configured queue, each confirmed.
pub async fn publish(config: &AmqpConfig, messages: impl IntoIterator<Item = Message>) {
    let publisher = AmqpPublisher::connect(config).await.unwrap();
    for m in messages {
        publisher.publish(&m).await.unwrap();
    }
    publisher.close().await;
}

/// How many times each message id's effect happened.
pub type Effects = Arc<Mutex<HashMap<String, u32>>>;

/// A handler that works for `work`, then applies its message's effect.
pub fn applying(
    effects: &Effects,
    work: Duration,
) -> impl Fn(
    Message,
    ClaimHandle,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Bytes, HandlerError>> + Send>>
+ Send
+ Sync
+ 'static {
    let effects = effects.clone();
    move |m: Message, _c: ClaimHandle| {
        let effects = effects.clone();
        Box::pin(async move {
            tokio::time::sleep(work).await;
            *effects.lock().entry(m.id.unwrap()).or_default() += 1;
            Ok(Bytes::new())
        })
    }
}

/// The ids whose effect happened other than once.
pub fn repeated(effects: &Effects) -> Vec<(String, u32)> {
    let effects = effects.lock();
    effects
        .iter()
        .filter(|(_, n)| **n != 1)
        .map(|(id, n)| (id.clone(), *n))
        .collect()
}

/// Each handler call's message id, attempt number and time.
pub type Calls = Arc<Mutex<Vec<(String, u32, tokio::time::Instant)>>>;

/// A handler that records each call in `calls`, then answers `decide(id,
/// attempt)`.
pub fn recording(
    calls: &Calls,
    decide: fn(&str, u32) -> Result<Bytes, HandlerError>,
) -> impl Fn(Message, ClaimHandle) -> std::future::Ready<Result<Bytes, HandlerError>>
+ Send
+ Sync
+ 'static {
    let calls = calls.clone();
    move |m: Message, _c: ClaimHandle| {
        let id = m.id.clone().unwrap_or_default();
        calls
            .lock()
            .push((id.clone(), m.attempt, tokio::time::Instant::now()));
        std::future::ready(decide(&id, m.attempt))
    }
}

/// A TCP proxy in front of the broker that can stall: stop passing bytes
/// either way while every connection stays open, as a hung link (a dead
/// switch, a frozen broker) does until the heartbeat notices.
pub struct Stall {
    /// The broker's URL through the proxy.
    pub url: String,
    stalled: Arc<AtomicBool>,
}

impl Stall {
    /// A proxy in front of the broker at `url`.
    pub async fn before(url: &str) -> Self {
        let mut routed = url::Url::parse(url).expect("the broker URL parses");
        let upstream = format!(
            "{}:{}",
            routed.host_str().expect("the broker URL has a host"),
            routed.port().unwrap_or(5672)
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        routed
            .set_port(Some(listener.local_addr().unwrap().port()))
            .unwrap();
        let stalled = Arc::new(AtomicBool::new(false));
        let shared = stalled.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(pump(client_read, server_write, shared.clone()));
                tokio::spawn(pump(server_read, client_write, shared.clone()));
            }
        });
        Self {
            url: routed.to_string(),
            stalled,
        }
    }

    /// Stops passing bytes, for good.
    pub fn stall(&self) {
        self.stalled.store(true, Ordering::SeqCst);
    }
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, stalled: Arc<AtomicBool>) {
    let mut buf = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while stalled.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
