//! The stores a run can use, as `idem consume` arguments, and the Redis
//! servers a run starts for itself so that it can restart them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use clap::ValueEnum;
use idem_testkit::services;
use idem_testkit::small_disk::SmallDisk;
use tokio::process::{Child, Command};

use crate::toxic::Toxic;

/// A store the consumers share (or, for the embedded ones, the one
/// consumer uses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Memory,
    File,
    Tiered,
    /// A `redis-server` of the run's own without persistence.
    Redis,
    /// A `redis-server` of the run's own with `appendfsync always`.
    RedisAof,
    /// A Redis Cluster of the run's own: three masters, each with a
    /// replica, no persistence. Its restart is a master's failover.
    RedisCluster,
    Postgres,
    #[value(name = "mariadb")]
    MariaDb,
    /// A tiered store every consumer shares: a `redis-server` of the run's
    /// own with `appendfsync always` in front of a PostgreSQL table, with
    /// short hot retention and handover grace so that records move to,
    /// and are answered from, the cold tier within the run. Its restart
    /// is the hot tier's; its cut is the cold tier's.
    RedisOverPostgres,
}

impl StoreKind {
    pub fn title(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::File => "file",
            StoreKind::Tiered => "tiered (memory over file)",
            StoreKind::Redis => "Redis, no persistence",
            StoreKind::RedisAof => "Redis, appendfsync always",
            StoreKind::RedisCluster => "Redis Cluster, 3 masters with replicas",
            StoreKind::Postgres => "PostgreSQL",
            StoreKind::MariaDb => "MariaDB",
            StoreKind::RedisOverPostgres => "tiered (Redis, appendfsync always, over PostgreSQL)",
        }
    }

    /// Whether several consumer processes can share it; the embedded
    /// stores belong to one process, so their runs have one consumer.
    pub fn shared(self) -> bool {
        !matches!(
            self,
            StoreKind::Memory | StoreKind::File | StoreKind::Tiered
        )
    }

    /// Whether the run can restart its server.
    pub fn restartable(self) -> bool {
        self.shared()
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = self.to_possible_value().expect("no variant is skipped");
        f.write_str(value.get_name())
    }
}

/// What a store restart lost.
pub enum Restarted {
    /// Nothing: it keeps what it acknowledged.
    Kept,
    /// Every record: no persistence.
    LostAll,
    /// These keys' records (by the run's key): a failed-over Redis
    /// Cluster master's that its replica had not received.
    Lost(std::collections::HashSet<String>),
}

/// A store ready for the consumers.
pub struct Store {
    pub kind: StoreKind,
    /// `idem consume` arguments naming it.
    pub args: Vec<String>,
    redis: Option<OwnRedis>,
    cluster: Vec<OwnRedis>,
    /// The small disk the store's files are on, for a run that fills it.
    /// Declared last: it is unmounted after the server on it is gone.
    disk: Option<SmallDisk>,
}

/// The size of the small disk a run that fills it puts the store on: room
/// for a run's records and the file store's tables (a flush writes up to
/// 8 MiB), and quick to fill.
const SMALL_DISK_BYTES: u64 = 64 << 20;

impl Store {
    /// Sets up `kind` for run `run` (a name of letters, digits and `_`),
    /// with files under `dir`, or, with `small_disk`, on a small disk of
    /// the run's own (a tmpfs mount, which needs root) that it can fill.
    pub async fn start(
        kind: StoreKind,
        run: &str,
        dir: &Path,
        small_disk: bool,
    ) -> Result<Self, String> {
        let disk = if small_disk {
            let disk = SmallDisk::mount(SMALL_DISK_BYTES).map_err(|e| {
                format!("a small disk for the store to fill (a tmpfs mount, which needs root): {e}")
            })?;
            Some(disk)
        } else {
            None
        };
        let dir = disk.as_ref().map_or(dir, SmallDisk::path).to_owned();
        let dir = dir.as_path();
        let arg = |url: String| vec!["--store".to_owned(), url];
        let mut redis = None;
        let mut cluster = Vec::new();
        let args = match kind {
            StoreKind::Memory => arg("memory://".into()),
            StoreKind::File => arg(format!("file://{}", dir.join("store").display())),
            StoreKind::Tiered => vec![
                "--store".into(),
                "tiered".into(),
                "--hot-store".into(),
                "memory://".into(),
                "--cold-store".into(),
                format!("file://{}", dir.join("cold").display()),
            ],
            StoreKind::Redis | StoreKind::RedisAof => {
                let own = OwnRedis::start(dir.join("redis"), kind == StoreKind::RedisAof).await?;
                let url = format!("redis://127.0.0.1:{}", own.port);
                redis = Some(own);
                arg(url)
            }
            StoreKind::RedisCluster => {
                cluster = start_cluster(&dir.join("cluster")).await?;
                let seeds: Vec<String> = cluster
                    .iter()
                    .take(3)
                    .map(|n| format!("127.0.0.1:{}", n.port))
                    .collect();
                arg(format!("redis+cluster://{}", seeds.join(",")))
            }
            StoreKind::Postgres => {
                let url = services::url(
                    "IDEM_TEST_POSTGRES_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                );
                arg(with_table(&url, run))
            }
            StoreKind::MariaDb => {
                let url = services::url("IDEM_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test");
                arg(with_table(&url, run))
            }
            StoreKind::RedisOverPostgres => {
                let own = OwnRedis::start(dir.join("redis"), true).await?;
                let hot = format!("redis://127.0.0.1:{}", own.port);
                redis = Some(own);
                let cold = services::url(
                    "IDEM_TEST_POSTGRES_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                );
                [
                    "--store",
                    "tiered",
                    "--hot-store",
                    &hot,
                    "--cold-store",
                    &with_table(&cold, run),
                    "--hot-retention-ms",
                    "2000",
                    "--handover-grace-ms",
                    "3000",
                ]
                .map(String::from)
                .to_vec()
            }
        };
        Ok(Self {
            kind,
            args,
            redis,
            cluster,
            disk,
        })
    }

    /// Fills the small disk under the store's files until it refuses a
    /// write with `ENOSPC`.
    pub fn fill_disk(&self) -> Result<(), String> {
        let disk = self
            .disk
            .as_ref()
            .ok_or("the store is not on a small disk")?;
        disk.fill()
            .map(drop)
            .map_err(|e| format!("filling the disk at {}: {e}", disk.path().display()))
    }

    /// What is on the small disk: each file's size and the room left, and
    /// for Redis its persistence state and the end of its log, for a run
    /// whose fill the store never noticed.
    pub async fn disk_report(&self) -> String {
        let Some(disk) = &self.disk else {
            return "no small disk".into();
        };
        let mut files = Vec::new();
        let mut dirs = vec![disk.path().to_owned()];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    dirs.push(entry.path());
                } else {
                    let name = entry.path();
                    let name = name.strip_prefix(disk.path()).unwrap_or(&name);
                    files.push(format!("{} {} B", name.display(), meta.len()));
                }
            }
        }
        files.sort();
        let free = disk_free(disk.path()).map_or_else(|e| e, |b| format!("{b} B"));
        let mut report = format!("room left {free}; files: {}", files.join(", "));
        if let Some(redis) = &self.redis {
            let info = shell(
                "redis-cli",
                &["-p", &redis.port.to_string(), "info", "persistence"],
            )
            .await
            .unwrap_or_else(|e| e);
            let wanted: Vec<&str> = info
                .lines()
                .filter(|l| {
                    [
                        "aof_enabled",
                        "aof_last_write_status",
                        "aof_rewrite_in_progress",
                    ]
                    .iter()
                    .any(|k| l.starts_with(k))
                })
                .map(str::trim)
                .collect();
            let log = std::fs::read_to_string(redis.dir.join("redis.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(8).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            report.push_str(&format!(
                "; redis-server: {}; its log ends: {}",
                wanted.join(" "),
                tail.join(" | ")
            ));
        }
        report
    }

    /// Has the store's own `redis-server` write 64 KiB to its append-only
    /// file (a key of the run's own, outside idem's): on a full disk it
    /// exits at that append, whether or not the consumers write meanwhile.
    /// Nothing for the other stores.
    pub async fn write_a_page(&self) {
        if let Some(redis) = &self.redis {
            let value = "x".repeat(64 << 10);
            let _ = shell_with_input(
                "redis-cli",
                &[
                    "-p",
                    &redis.port.to_string(),
                    "-x",
                    "SET",
                    "idem-chaos:page",
                ],
                &value,
            )
            .await;
        }
    }

    /// Whether the store's own `redis-server` has exited (it does at the
    /// first append-only write its full disk refuses).
    pub fn server_exited(&mut self) -> Result<bool, String> {
        match &mut self.redis {
            Some(redis) => Ok(redis.child.try_wait().map_err(|e| e.to_string())?.is_some()),
            None => Ok(false),
        }
    }

    /// Frees the small disk the run filled, and starts the store's own
    /// `redis-server` again if the full disk made it exit.
    pub async fn free_disk(&mut self) -> Result<(), String> {
        let disk = self
            .disk
            .as_ref()
            .ok_or("the store is not on a small disk")?;
        disk.free()
            .map_err(|e| format!("freeing the disk at {}: {e}", disk.path().display()))?;
        if self.server_exited()?
            && let Some(redis) = &mut self.redis
        {
            redis.restart().await?;
        }
        Ok(())
    }

    /// The store's URL (`--store`'s value; `tiered` for the tiered store).
    pub fn url(&self) -> &str {
        self.args
            .iter()
            .skip_while(|a| *a != "--store")
            .nth(1)
            .map_or("", String::as_str)
    }

    /// Crashes the store's server and starts it again: `kill -9` of the
    /// run's own `redis-server` (same port and files) or of `mariadbd`,
    /// PostgreSQL stopped in immediate mode (no checkpoint, crash recovery
    /// at the start), a Redis Cluster master failed over; answers what it
    /// lost. `touched` answers the keys handled so far.
    pub async fn restart(
        &mut self,
        touched: &(dyn Fn() -> Vec<String> + Sync),
    ) -> Result<Restarted, String> {
        match self.kind {
            StoreKind::Postgres => {
                let version = std::fs::read_dir("/etc/postgresql")
                    .ok()
                    .and_then(|mut d| d.next())
                    .and_then(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .ok_or("no PostgreSQL cluster under /etc/postgresql to restart")?;
                let ctl = |action: &'static str| {
                    let version = version.clone();
                    async move {
                        let mut args = vec!["--skip-systemctl-redirect", &version, "main", action];
                        if action == "stop" {
                            args.extend(["-m", "immediate"]);
                        }
                        shell("pg_ctlcluster", &args).await
                    }
                };
                ctl("stop").await?;
                ctl("start").await?;
                wait_port(5432).await?;
                return Ok(Restarted::Kept);
            }
            StoreKind::MariaDb => {
                shell("pkill", &["-9", "-x", "mariadbd"]).await?;
                for _ in 0..100 {
                    if shell("pgrep", &["-x", "mariadbd"]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                start_daemon("/usr/sbin/mariadbd", &[]).await?;
                wait_port(3306).await?;
                return Ok(Restarted::Kept);
            }
            StoreKind::RedisCluster => return fail_over(&mut self.cluster, touched).await,
            _ => {}
        }
        let Some(redis) = &mut self.redis else {
            return Err(format!("the run cannot restart the {} store", self.kind));
        };
        redis.restart().await?;
        Ok(if redis.aof {
            Restarted::Kept
        } else {
            Restarted::LostAll
        })
    }

    /// Sends the consumers' store connections through a fault proxy (a
    /// tiered store's: its cold tier's).
    pub async fn through_proxy(&mut self) -> Result<Toxic, String> {
        let flag = match self.kind {
            StoreKind::RedisOverPostgres => "--cold-store",
            _ => "--store",
        };
        let at = self
            .args
            .iter()
            .position(|a| a == flag)
            .ok_or("the store has no URL to send through a proxy")?;
        let url = &self.args[at + 1];
        let default = match self.kind {
            StoreKind::Postgres | StoreKind::RedisOverPostgres => 5432,
            StoreKind::MariaDb => 3306,
            _ => 6379,
        };
        let (routed, toxic) = Toxic::before(url, default).await?;
        self.args[at + 1] = routed;
        Ok(toxic)
    }

    /// Stops the run's own `redis-server` (`SIGSTOP`; a tiered store's hot
    /// tier) for `how_long`, then resumes it.
    pub async fn pause(&self, how_long: Duration) -> Result<(), String> {
        let pid = self
            .redis
            .as_ref()
            .and_then(|r| r.child.id())
            .ok_or_else(|| {
                format!(
                    "the {} store has no redis-server of the run's own",
                    self.kind
                )
            })?;
        crate::fleet::signal(pid, libc::SIGSTOP);
        tokio::time::sleep(how_long).await;
        crate::fleet::signal(pid, libc::SIGCONT);
        Ok(())
    }

    /// Ends every session of the consumers on the SQL server, whatever
    /// they were doing; answers how many.
    pub async fn end_sessions(&self) -> Result<usize, String> {
        match self.kind {
            StoreKind::Postgres => {
                let url = services::url(
                    "IDEM_TEST_POSTGRES_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                );
                let out = shell(
                    "psql",
                    &[
                        &url,
                        "-tAc",
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid() \
                         AND backend_type = 'client backend'",
                    ],
                )
                .await?;
                Ok(out.trim().parse().unwrap_or(0))
            }
            StoreKind::MariaDb => {
                let ids = shell(
                    "mariadb",
                    &[
                        "-h",
                        "127.0.0.1",
                        "-u",
                        "root",
                        "-N",
                        "-e",
                        "SELECT id FROM information_schema.processlist \
                         WHERE db = 'test' AND id <> CONNECTION_ID()",
                    ],
                )
                .await?;
                let kills: String = ids
                    .split_whitespace()
                    .filter(|id| id.parse::<u64>().is_ok())
                    .map(|id| format!("KILL CONNECTION {id};"))
                    .collect();
                if !kills.is_empty() {
                    // A session that ended by itself meanwhile is no error.
                    let _ = shell(
                        "mariadb",
                        &["-h", "127.0.0.1", "-u", "root", "-f", "-e", &kills],
                    )
                    .await;
                }
                Ok(ids.split_whitespace().count())
            }
            _ => Err(format!("the {} store has no sessions to end", self.kind)),
        }
    }

    pub async fn stop(self) {
        for mut redis in self.redis.into_iter().chain(self.cluster) {
            let _ = redis.child.kill().await;
        }
    }
}

/// `url` with `table=NAME` added to its query.
fn with_table(url: &str, table: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}table={table}")
}

/// A `redis-server` on a free loopback port, its files in a directory of
/// the run's.
struct OwnRedis {
    port: u16,
    dir: PathBuf,
    aof: bool,
    /// `redis-server` arguments besides port, files and persistence.
    extra: Vec<String>,
    child: Child,
}

impl OwnRedis {
    async fn start(dir: PathBuf, aof: bool) -> Result<Self, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Self::start_with(dir, aof, Vec::new()).await
    }

    async fn start_with(dir: PathBuf, aof: bool, extra: Vec<String>) -> Result<Self, String> {
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = free_port()?;
        let child = spawn_redis(&dir, port, aof, &extra).await?;
        Ok(Self {
            port,
            dir,
            aof,
            extra,
            child,
        })
    }

    async fn kill(&mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }

    async fn restart(&mut self) -> Result<(), String> {
        self.kill().await;
        self.child = spawn_redis(&self.dir, self.port, self.aof, &self.extra).await?;
        Ok(())
    }
}

/// Six `redis-server`s in cluster mode under `dir`, made one cluster of
/// three masters (the first three) each with a replica; answers once every
/// slot is served.
async fn start_cluster(dir: &Path) -> Result<Vec<OwnRedis>, String> {
    let extra: Vec<String> = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        // A dead master's replica takes over within a few seconds.
        "--cluster-node-timeout",
        "2000",
        // Replicas sync at once, not after waiting for more replicas.
        "--repl-diskless-sync-delay",
        "0",
    ]
    .map(String::from)
    .to_vec();
    let mut nodes = Vec::new();
    for i in 0..6 {
        nodes.push(OwnRedis::start_with(dir.join(format!("node{i}")), false, extra.clone()).await?);
    }
    let mut args: Vec<String> = vec!["--cluster".into(), "create".into()];
    args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
    args.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    shell("redis-cli", &args).await?;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    cluster_ok(ports.iter().copied()).await?;
    // A replica that has not synced yet cannot take over: a failover
    // before then would lose the master's whole dataset.
    for port in &ports {
        replica_synced(*port).await?;
    }
    Ok(nodes)
}

/// Waits up to 30 s until the node on `port`, if it is a replica, has its
/// link to its master up and has loaded what the master sent.
async fn replica_synced(port: u16) -> Result<(), String> {
    for _ in 0..300 {
        let info = shell(
            "redis-cli",
            &["-p", &port.to_string(), "info", "replication"],
        )
        .await
        .unwrap_or_default();
        if info.contains("role:master")
            || (info.contains("master_link_status:up")
                && info.contains("master_sync_in_progress:0"))
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "the Redis Cluster replica on {port} did not sync with its master within 30 s"
    ))
}

/// Waits up to 30 s until every node on `ports` says the cluster serves
/// every slot.
async fn cluster_ok(ports: impl Iterator<Item = u16> + Clone) -> Result<(), String> {
    for _ in 0..300 {
        let mut ok = true;
        for port in ports.clone() {
            let info = shell("redis-cli", &["-p", &port.to_string(), "cluster", "info"])
                .await
                .unwrap_or_default();
            ok &= info.contains("cluster_state:ok");
        }
        if ok {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the run's Redis Cluster did not reach cluster_state:ok within 30 s".into())
}

/// Fails a master of the cluster over: `kill -9` of the first node that
/// is a master now, and waits until its replica serves its slots (the
/// killed node stays down). Replication is
/// asynchronous: what the master took that its replica had not received
/// is lost with it. Once the replica serves, every master is asked for
/// the record of each key `touched` answers then (every key handled so
/// far, so every key begun before the kill): those no master holds are
/// what was lost.
async fn fail_over(
    nodes: &mut [OwnRedis],
    touched: &(dyn Fn() -> Vec<String> + Sync),
) -> Result<Restarted, String> {
    let role_of = |port: u16| async move {
        shell("redis-cli", &["-p", &port.to_string(), "role"])
            .await
            .unwrap_or_default()
    };
    let mut master = None;
    for (i, n) in nodes.iter().enumerate() {
        if role_of(n.port).await.starts_with("master") {
            master = Some(i);
            break;
        }
    }
    let i = master.ok_or("no master in the run's Redis Cluster")?;
    let info = shell(
        "redis-cli",
        &["-p", &nodes[i].port.to_string(), "info", "replication"],
    )
    .await?;
    let replica: u16 = info
        .lines()
        .find(|l| l.starts_with("slave0:"))
        .and_then(|l| {
            l.split(',')
                .find_map(|f| f.strip_prefix("port=")?.trim().parse().ok())
        })
        .ok_or("the master to fail over has no replica")?;
    // The namespace of the run's records, from any one of them.
    let mut namespace = None;
    for n in nodes.iter() {
        let one = shell(
            "redis-cli",
            &[
                "-p",
                &n.port.to_string(),
                "--scan",
                "--pattern",
                "idem:{*}:r",
            ],
        )
        .await
        .unwrap_or_default();
        namespace = one.lines().find_map(|k| {
            let inner = k.strip_prefix("idem:{")?;
            Some(inner.split_once(':')?.0.to_owned())
        });
        if namespace.is_some() {
            break;
        }
    }
    nodes[i].kill().await;
    let killed = nodes[i].port;
    let ports: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    // The cluster notices the death only after its node timeout: wait
    // until the replica has taken the slots over, or a restart within the
    // timeout would bring the dead master back empty, as master.
    wait_role(replica, "master").await?;
    cluster_ok(ports.iter().copied().filter(|p| *p != killed)).await?;
    let mut lost = std::collections::HashSet::new();
    let touched = touched();
    if let Some(ns) = namespace {
        let asks: String = touched
            .iter()
            .map(|k| format!("EXISTS idem:{{{ns}:{k}}}:r\n"))
            .collect();
        let mut held = vec![false; touched.len()];
        for &port in ports.iter().filter(|p| **p != killed) {
            if !role_of(port).await.starts_with("master") {
                continue;
            }
            // A master answers 1 or 0 for its own slots, MOVED for others'.
            let answers = shell_with_input("redis-cli", &["-p", &port.to_string()], &asks).await?;
            // (redis-cli follows each error it prints with an empty line.)
            let answers = answers.lines().filter(|l| !l.trim().is_empty());
            for (h, answer) in held.iter_mut().zip(answers) {
                *h |= answer.trim() == "1";
            }
        }
        lost.extend(
            touched
                .iter()
                .zip(&held)
                .filter(|(_, h)| !**h)
                .map(|(k, _)| k.clone()),
        );
    }
    // The killed node stays down: without persistence, a node that comes
    // back with its old cluster configuration can serve its old slots,
    // empty, until it learns of the failover.
    Ok(Restarted::Lost(lost))
}

/// Waits up to 30 s until the node on `port` says its role is `role`.
async fn wait_role(port: u16, role: &str) -> Result<(), String> {
    for _ in 0..300 {
        let now = shell("redis-cli", &["-p", &port.to_string(), "role"])
            .await
            .unwrap_or_default();
        if now.starts_with(role) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "the Redis Cluster node on {port} did not become a {role} within 30 s"
    ))
}

/// A loopback port nothing listens on now.
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Starts `redis-server` and waits until it answers.
async fn spawn_redis(dir: &Path, port: u16, aof: bool, extra: &[String]) -> Result<Child, String> {
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
    ])
    .arg("--dir")
    .arg(dir)
    .args(["--logfile", "redis.log"])
    .args(extra);
    if aof {
        cmd.args(["--appendonly", "yes", "--appendfsync", "always"]);
    } else {
        cmd.args(["--appendonly", "no"]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("redis-server does not start (is it installed?): {e}"))?;
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            // Loading an append-only file can take a moment after the
            // port opens; PING answers only once it is loaded.
            if ping(port).await {
                return Ok(child);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!(
        "redis-server on port {port} did not answer within 5 s"
    ))
}

async fn ping(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    if s.write_all(b"PING\r\n").await.is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await,
        Ok(Ok(n)) if buf[..n].starts_with(b"+PONG")
    )
}

/// Runs `program` with `args` (at most a minute); answers its standard
/// output, or what went wrong.
pub async fn shell(program: &str, args: &[&str]) -> Result<String, String> {
    shell_with_input(program, args, "").await
}

/// Runs `program` with `input` on its standard input; answers what it
/// printed.
pub async fn shell_with_input(program: &str, args: &[&str], input: &str) -> Result<String, String> {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{program} does not run: {e}"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let input = input.to_owned();
    let writer = tokio::spawn(async move {
        let _ = stdin.write_all(input.as_bytes()).await;
    });
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .map_err(|_| format!("{program} did not finish within a minute"))?
        .map_err(|e| format!("{program}: {e}"))?;
    let _ = writer.await;
    if !out.status.success() {
        return Err(format!(
            "{program} {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits up to a minute for something to listen on a loopback port.
pub async fn wait_port(port: u16) -> Result<(), String> {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("nothing listens on 127.0.0.1:{port} a minute on"))
}

/// Starts a system service's program in the background, as the machine's
/// own start script does.
pub async fn start_daemon(exec: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["--start", "--oknodo", "--background", "--exec", exec];
    if !args.is_empty() {
        all.push("--");
        all.extend_from_slice(args);
    }
    shell("start-stop-daemon", &all).await.map(drop)
}

/// The bytes an unprivileged writer can still put on the filesystem at
/// `path`, as `df` reads them.
fn disk_free(path: &Path) -> Result<u64, String> {
    let out = std::process::Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .map_err(|e| format!("df: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| format!("df printed {:?}", text.trim()))
}
