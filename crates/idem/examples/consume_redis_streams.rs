//! The consumer runner on a Redis stream, with records in Redis: each
//! `orders` entry's effect happens once, however often it is delivered.
//! Ctrl-C shuts down gracefully.
//!
//! `cargo run -p idem --example consume_redis_streams --features redis,redis-streams`

use idem::consumer::{HandlerError, Message, Runner};
use idem::redis_streams::{RedisStreamConfig, RedisStreamSource};
use idem::{Bytes, ClaimHandle, Guard, RedisStore};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = RedisStreamConfig::from_url("redis://127.0.0.1:6379?stream=orders&group=idem")?;
    let source = RedisStreamSource::connect(config).await?;
    let guard = Guard::new(
        RedisStore::builder("redis://127.0.0.1:6379")
            .connect()
            .await?,
    );
    let handler = |message: Message, claim: ClaimHandle| async move {
        // Apply the order once; hand claim.token() to a sink that checks it.
        println!("order {:?}, token {:?}", message.key, claim.token());
        Ok::<_, HandlerError>(Bytes::new())
    };
    let stop = CancellationToken::new();
    let on_signal = stop.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        on_signal.cancel();
    });
    let report = Runner::new(guard, source, handler)
        .concurrency(32)
        .run(stop)
        .await?;
    println!("{report:?}");
    Ok(())
}
