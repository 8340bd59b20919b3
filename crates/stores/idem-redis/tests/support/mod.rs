//! Redis servers a test starts itself, on free ports, so stopping or
//! pausing them disturbs no other test; and the shared test cluster.

#![allow(dead_code)]

use std::process::Stdio;
use std::time::Duration;

use idem_redis::RedisStore;
use idem_testkit::services;
use tokio::process::{Child, Command};

/// A store on the shared 3-master test cluster
/// (`IDEM_TEST_REDIS_CLUSTER_URLS`, default
/// `redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002`;
/// `scripts/redis-cluster` starts one), or `None` when the test is skipped.
pub async fn test_cluster() -> Option<RedisStore> {
    let urls = services::url(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "redis://127.0.0.1:7000,redis://127.0.0.1:7001,redis://127.0.0.1:7002",
    );
    let nodes: Vec<&str> = urls.split(',').collect();
    let store = RedisStore::cluster_builder(&nodes)
        .timeout(Duration::from_secs(5))
        .connect()
        .await;
    match store {
        Ok(store) => Some(store),
        Err(e) => services::absent("Redis Cluster", &urls, e),
    }
}

/// A Redis of our own on a free port, so restarting it disturbs no one.
pub struct OwnRedis {
    pub port: u16,
    child: Option<Child>,
}

impl OwnRedis {
    pub async fn start(port: u16) -> Self {
        Self::start_with(port, &[] as &[&str]).await
    }

    pub async fn start_with(port: u16, extra: &[impl AsRef<std::ffi::OsStr>]) -> Self {
        // A replica writes the snapshot it receives into its directory:
        // keep that out of the source tree.
        let dir = std::env::temp_dir().join(format!("idem-redis-test-{port}"));
        std::fs::create_dir_all(&dir).expect("a temporary directory for redis-server");
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed");
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self {
            port,
            child: Some(child),
        }
    }

    /// Sends the server `signal` (`STOP` freezes it, `CONT` resumes it).
    pub async fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().and_then(Child::id).expect("running");
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .status()
            .await
            .expect("kill runs");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    pub async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().await.unwrap();
        }
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `redis-cli -p PORT ARGS…`: its answer.
pub async fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .await
        .expect("redis-cli runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Polls `check` every 50 ms for up to 30 s (a replica's first sync on a
/// loaded machine takes several seconds).
pub async fn until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..600 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// The options of a cluster node with bus port `bus` (each node of a test
/// cluster picks its own, so clusters of several tests never meet).
pub fn cluster_node(bus: u16) -> Vec<String> {
    let bus = bus.to_string();
    [
        "--cluster-enabled",
        "yes",
        "--cluster-node-timeout",
        "1000",
        "--cluster-port",
        &bus,
    ]
    .map(str::to_owned)
    .to_vec()
}
