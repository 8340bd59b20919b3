//! A TCP fault proxy on loopback. The consumers reach a store or a broker
//! through it, and the run can slow what passes (latency per chunk, a
//! bandwidth limit), cut every connection open through it (new ones are
//! let through at once: a blip), or make what is behind it unreachable for
//! a while (every connection cut and new ones closed as they come: a
//! partition).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The faults in force, shared by every connection.
struct Faults {
    /// Added to every chunk each way, in ms.
    latency_ms: AtomicU64,
    /// Bytes a second each way (0: no limit).
    rate: AtomicU64,
    /// Bumped by a cut: connections opened before it close.
    cuts: watch::Sender<u64>,
    /// Partitioned: new connections are closed at once.
    down: AtomicBool,
}

/// A proxy from a loopback port of its own to `upstream`.
pub struct Toxic {
    pub port: u16,
    faults: Arc<Faults>,
    accept: JoinHandle<()>,
}

impl Toxic {
    /// Listens on a free loopback port and forwards to `host:port`.
    pub async fn start(host: String, port: u16) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("the fault proxy cannot listen: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?.port();
        let faults = Arc::new(Faults {
            latency_ms: AtomicU64::new(0),
            rate: AtomicU64::new(0),
            cuts: watch::channel(0).0,
            down: AtomicBool::new(false),
        });
        let shared = faults.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                if shared.down.load(Ordering::Relaxed) {
                    drop(client);
                    continue;
                }
                let faults = shared.clone();
                let host = host.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect((host.as_str(), port)).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    forward(client, server, faults).await;
                });
            }
        });
        Ok(Self {
            port: local,
            faults,
            accept,
        })
    }

    /// A proxy in front of what `url` names (its port defaulting to
    /// `default_port`), and `url` sent through it.
    pub async fn before(url: &str, default_port: u16) -> Result<(String, Self), String> {
        let (_, host, port) =
            reroute(url, 0, default_port).ok_or_else(|| format!("cannot read {url}"))?;
        let toxic = Self::start(host, port).await?;
        let routed = reroute(url, toxic.port, default_port)
            .expect("read above")
            .0;
        Ok((routed, toxic))
    }

    /// Delays every chunk by `latency` each way (zero: none).
    pub fn slow(&self, latency: Duration) {
        self.faults
            .latency_ms
            .store(latency.as_millis() as u64, Ordering::Relaxed);
    }

    /// Limits each direction of each connection to `bytes_per_second`
    /// (zero: no limit).
    pub fn limit(&self, bytes_per_second: u64) {
        self.faults.rate.store(bytes_per_second, Ordering::Relaxed);
    }

    /// Closes every connection open through the proxy.
    pub fn cut(&self) {
        self.faults.cuts.send_modify(|n| *n += 1);
    }

    /// Makes what is behind the proxy unreachable (every open connection
    /// cut, new ones closed as they come) until [`heal`](Toxic::heal).
    pub fn partition(&self) {
        self.faults.down.store(true, Ordering::Relaxed);
        self.cut();
    }

    /// Ends a partition.
    pub fn heal(&self) {
        self.faults.down.store(false, Ordering::Relaxed);
    }
}

impl Drop for Toxic {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Pumps both ways until either side closes or a cut comes.
async fn forward(client: TcpStream, server: TcpStream, faults: Arc<Faults>) {
    let mut cut = faults.cuts.subscribe();
    cut.mark_unchanged();
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, &faults) => {}
        _ = pump(server_read, client_write, &faults) => {}
        _ = cut.changed() => {}
    }
    // Dropping both halves of both streams closes the connections.
}

async fn pump(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    faults: &Faults,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        let latency = faults.latency_ms.load(Ordering::Relaxed);
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
        let rate = faults.rate.load(Ordering::Relaxed);
        if rate > 0 {
            tokio::time::sleep(Duration::from_secs_f64(n as f64 / rate as f64)).await;
        }
        to.write_all(&buf[..n]).await?;
    }
}

/// `url` sent through a proxy on `port`, and the host and port it named:
/// `scheme://[user@]host[:port][/rest]`, the port defaulting to
/// `default_port`.
pub fn reroute(url: &str, port: u16, default_port: u16) -> Option<(String, String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let (host, upstream_port) = match hostport.rsplit_once(':') {
        Some((h, p)) => (h, p.parse().ok()?),
        None => (hostport, default_port),
    };
    let user = user.map_or(String::new(), |u| format!("{u}@"));
    let routed = format!("{scheme}://{user}127.0.0.1:{port}{tail}");
    Some((routed, host.to_owned(), upstream_port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_sent_through_the_proxy_with_its_user_path_and_query() {
        let (url, host, port) =
            reroute("amqp://guest:guest@127.0.0.1:5672/%2f?queue=q", 40000, 5672).unwrap();
        assert_eq!(url, "amqp://guest:guest@127.0.0.1:40000/%2f?queue=q");
        assert_eq!((host.as_str(), port), ("127.0.0.1", 5672));
        let (url, host, port) = reroute("redis://localhost?stream=s", 40001, 6379).unwrap();
        assert_eq!(url, "redis://127.0.0.1:40001?stream=s");
        assert_eq!((host.as_str(), port), ("localhost", 6379));
    }

    /// An echo server on a free loopback port; answers the port.
    async fn echo() -> u16 {
        let upstream = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = upstream.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = upstream.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_cut_closes_open_connections_and_lets_new_ones_through() {
        let up_port = echo().await;
        let toxic = Toxic::start("127.0.0.1".into(), up_port).await.unwrap();
        let mut a = TcpStream::connect(("127.0.0.1", toxic.port)).await.unwrap();
        a.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        a.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");

        toxic.slow(Duration::from_millis(200));
        let started = std::time::Instant::now();
        a.write_all(b"slow").await.unwrap();
        a.read_exact(&mut buf).await.unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "each way waits"
        );
        toxic.slow(Duration::ZERO);

        toxic.cut();
        let n = tokio::time::timeout(Duration::from_secs(5), a.read(&mut buf))
            .await
            .expect("the cut connection closes")
            .unwrap_or(0);
        assert_eq!(n, 0);
        let mut b = TcpStream::connect(("127.0.0.1", toxic.port)).await.unwrap();
        b.write_all(b"back").await.unwrap();
        b.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"back");
    }

    #[tokio::test]
    async fn a_partition_closes_every_connection_until_it_heals() {
        let up_port = echo().await;
        let toxic = Toxic::start("127.0.0.1".into(), up_port).await.unwrap();
        let mut a = TcpStream::connect(("127.0.0.1", toxic.port)).await.unwrap();
        let mut buf = [0u8; 4];
        toxic.partition();
        let n = tokio::time::timeout(Duration::from_secs(5), a.read(&mut buf))
            .await
            .expect("the open connection closes")
            .unwrap_or(0);
        assert_eq!(n, 0);
        // A new connection is closed at once, with nothing through.
        let mut b = TcpStream::connect(("127.0.0.1", toxic.port)).await.unwrap();
        let _ = b.write_all(b"lost").await;
        let n = tokio::time::timeout(Duration::from_secs(5), b.read(&mut buf))
            .await
            .expect("the new connection closes")
            .unwrap_or(0);
        assert_eq!(n, 0);
        toxic.heal();
        let mut c = TcpStream::connect(("127.0.0.1", toxic.port)).await.unwrap();
        c.write_all(b"back").await.unwrap();
        c.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"back");
    }
}
