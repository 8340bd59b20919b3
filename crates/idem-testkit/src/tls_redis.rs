//! A Redis of a test's own that speaks TLS only, as managed Redis services
//! do: a CA the test makes signs the server's certificate and a client
//! certificate, and Redis asks for the client's (its default once TLS is
//! on). Optionally a one-node Redis Cluster, serving every slot.
//!
//! Needs `redis-server` and `redis-cli` on the `PATH`; without them a test
//! skips or fails as [`services::absent`] decides.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
};
use tokio::process::{Child, Command};

use crate::services;

/// A running TLS Redis; stopped when dropped.
pub struct TlsRedis {
    /// `rediss://127.0.0.1:PORT`.
    pub url: String,
    /// The CA's certificate (PEM).
    pub ca: String,
    /// The client's certificate (PEM).
    pub client_cert: String,
    /// The client's private key (PEM).
    pub client_key: String,
    dir: PathBuf,
    _server: Child,
}

impl TlsRedis {
    /// Starts a standalone Redis, or with `cluster` a one-node cluster;
    /// `None` (after saying why) when Redis is not installed.
    pub async fn start(cluster: bool) -> Option<Self> {
        if !services::program("redis-server") {
            return None;
        }
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("idem-redis-tls-{port}"));
        std::fs::create_dir_all(&dir).expect("a temporary directory for the TLS Redis");
        let pki = Pki::new();
        for (name, pem) in [
            ("ca.pem", &pki.ca),
            ("server.pem", &pki.server_cert),
            ("server.key", &pki.server_key),
            ("client.pem", &pki.client_cert),
            ("client.key", &pki.client_key),
        ] {
            std::fs::write(dir.join(name), pem).expect("certificate files written");
        }
        let file = |name: &str| path_text(&dir.join(name));
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--tls-cert-file", &file("server.pem")])
            .args(["--tls-key-file", &file("server.key")])
            .args(["--tls-ca-cert-file", &file("ca.pem")])
            .args(["--dir", &path_text(&dir)]);
        if cluster {
            cmd.args(["--cluster-enabled", "yes", "--tls-cluster", "yes"])
                .args(["--cluster-config-file", &file("nodes.conf")]);
        }
        let server = cmd
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server starts");
        let redis = TlsRedis {
            url: format!("rediss://127.0.0.1:{port}"),
            ca: pki.ca,
            client_cert: pki.client_cert,
            client_key: pki.client_key,
            dir,
            _server: server,
        };
        // Up once a TLS client gets an answer; a cluster, once it serves
        // every slot.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            assert!(Instant::now() < deadline, "the TLS Redis did not come up");
            if redis.cli(&["PING"]).await.as_deref() == Some("PONG") {
                if !cluster {
                    break;
                }
                redis.cli(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).await;
                let info = redis.cli(&["CLUSTER", "INFO"]).await.unwrap_or_default();
                if info.contains("cluster_state:ok") {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Some(redis)
    }

    /// Where one of the PEM files is: `ca.pem`, `client.pem` or
    /// `client.key`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// `redis-cli` over TLS with the client certificate: its answer, if it
    /// ran.
    async fn cli(&self, args: &[&str]) -> Option<String> {
        let port = self.url.rsplit(':').next().unwrap_or_default();
        let out = Command::new("redis-cli")
            .args(["--tls", "-h", "127.0.0.1", "-p", port])
            .args(["--cacert", &path_text(&self.file("ca.pem"))])
            .args(["--cert", &path_text(&self.file("client.pem"))])
            .args(["--key", &path_text(&self.file("client.key"))])
            .args(args)
            .output()
            .await
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate it
/// signed; all PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
    client_cert: String,
    client_key: String,
}

impl Pki {
    fn new() -> Self {
        // Each its own name: a certificate named like its issuer reads as
        // self-signed.
        let params = |name: &str, sans: Vec<String>| {
            let mut p = CertificateParams::new(sans).expect("certificate names");
            p.distinguished_name = DistinguishedName::new();
            p.distinguished_name.push(DnType::CommonName, name);
            p
        };
        let mut ca_params = params("idem test CA", vec![]);
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = || KeyPair::generate().expect("a key pair");
        let ca = CertifiedIssuer::self_signed(ca_params, key()).expect("the CA");
        let signed = |name: &str, sans: Vec<String>| {
            let k = key();
            let cert = params(name, sans)
                .signed_by(&k, &ca)
                .expect("a signed certificate");
            (cert.pem(), k.serialize_pem())
        };
        let (server_cert, server_key) = signed(
            "idem test Redis",
            vec!["127.0.0.1".into(), "localhost".into()],
        );
        let (client_cert, client_key) = signed("idem test client", vec![]);
        Pki {
            ca: ca.pem(),
            server_cert,
            server_key,
            client_cert,
            client_key,
        }
    }
}

/// A free port whose cluster bus port (+10 000) is free too.
fn free_port() -> u16 {
    loop {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = l.local_addr().expect("its address").port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn path_text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
