//! `idem health`: asks a running idem whether it is ready, for container
//! health checks and scripts on images with no HTTP client of their own.

use std::time::Duration;

use clap::Args;
use http_body_util::{BodyExt, Empty};

use crate::run::Failure;

/// `idem health`.
#[derive(Args, Debug)]
#[command(
    after_long_help = "Exit status 0 when the answer is 2xx, 1 otherwise (the answer or the \
    error on stderr). For idem consume, ask its --metrics-listen address: \
    http://127.0.0.1:9464/ready."
)]
pub struct HealthArgs {
    /// What to ask: idem serve's /readyz answers 200 once its store answers.
    #[arg(
        long,
        default_value = "http://127.0.0.1:7700/readyz",
        value_name = "URL"
    )]
    pub url: http::Uri,
    /// How long to wait for the answer, in ms.
    #[arg(long, default_value_t = 3000, value_name = "MS")]
    pub timeout_ms: u64,
}

/// Asks `args.url`; an answer other than 2xx is a failure.
pub async fn run(args: HealthArgs) -> Result<(), Failure> {
    if args.url.scheme_str() != Some("http") {
        return Err(crate::config::bad("url", "must be an http:// URL").into());
    }
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Empty<bytes::Bytes>>();
    let url = args.url.clone();
    let asked = async move {
        let answer = client.get(url).await?;
        let status = answer.status();
        let body = answer.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, body))
    };
    let (status, body) = tokio::time::timeout(Duration::from_millis(args.timeout_ms), asked)
        .await
        .map_err(|_| {
            Failure::Run(format!(
                "{}: no answer within {} ms",
                args.url, args.timeout_ms
            ))
        })?
        .map_err(|e| Failure::Run(format!("{}: {}", args.url, crate::run::error_chain(&*e))))?;
    let text = crate::ops::shown(&body[..body.len().min(500)]);
    if status.is_success() {
        println!("{status} {text}");
        Ok(())
    } else {
        Err(Failure::Run(format!("{}: {status} {text}", args.url)))
    }
}
