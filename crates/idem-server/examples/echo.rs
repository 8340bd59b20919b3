//! A bare axum server that parses a JSON body and echoes it: the HTTP
//! ceiling of a machine, to compare `idem serve` against, and a stand-in
//! upstream for `idem proxy`.
//!
//! `cargo run --release -p idem-server --example echo -- 127.0.0.1:7800`

use axum::Json;
use axum::routing::post;

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7800".into());
    let echo = || async |Json(v): Json<serde_json::Value>| Json(v);
    let app = axum::Router::new()
        .route("/echo", post(echo()))
        .route("/orders", post(echo()));
    let listener = tokio::net::TcpListener::bind(&addr).await.unwrap();
    println!(
        "echo listening on http://{}",
        listener.local_addr().unwrap()
    );
    axum::serve(listener, app).await.unwrap();
}
