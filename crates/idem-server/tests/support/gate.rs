//! A TCP proxy on loopback that a test owns, in front of a service: it
//! passes every byte both ways until it is told to hold them, as a network
//! partition does (connections stay open, nothing gets through, new ones
//! are accepted and go nowhere), and passes again when told.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Gate {
    pub port: u16,
    held: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Gate {
    /// Listens on a free loopback port and forwards to `127.0.0.1:upstream`.
    pub async fn before(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (held, _) = watch::channel(false);
        let gate = held.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let gate = gate.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let (cr, cw) = client.into_split();
                    let (sr, sw) = server.into_split();
                    tokio::select! {
                        _ = pump(cr, sw, gate.clone()) => {}
                        _ = pump(sr, cw, gate) => {}
                    }
                });
            }
        });
        Self { port, held, accept }
    }

    /// From now on nothing passes, either way, on any connection.
    pub fn hold(&self) {
        self.held.send_replace(true);
    }

    /// Bytes pass again.
    pub fn pass(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, waiting while the gate holds.
async fn pump(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    mut held: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        while *held.borrow_and_update() {
            if held.changed().await.is_err() {
                return;
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Held while waiting to read: wait until it passes again.
            _ = held.changed() => continue,
        };
        // Bytes read just as the gate closed wait with it.
        while *held.borrow_and_update() {
            if held.changed().await.is_err() {
                return;
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), to.flush()).await;
    }
}
