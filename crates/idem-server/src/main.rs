//! `idem`: the idem service and gateway.
//!
//! - `idem serve`: the HTTP API (begin, complete, release, extend, batches,
//!   record lookup, health, metrics, OpenAPI) over a store chosen by URL.
//! - `idem proxy --upstream URL`: the Idempotency-Key gateway in front of any
//!   HTTP service.
//! - `idem consume --from SOURCE_URL --to URL`: the sidecar that feeds any
//!   HTTP handler from a broker, effectively once.
//! - `idem inspect NS KEY`, `idem ls NS`, `idem release NS KEY --force`,
//!   `idem stats [NS]`, `idem purge NS --expired | --all --yes`: looking
//!   inside a store, and the operator's overrides.
//! - `idem dlq ls|show|replay --from BROKER_URL`: dead letters listed, read
//!   and replayed after a fix.
//! - `idem doctor --store URL [--from BROKER_URL]`: whether idem can work
//!   here, each problem with its fix.
//! - `idem migrate --store URL`, `idem sweep --store URL`: upkeep of an SQL
//!   store's tables.
//! - `idem health`, `idem completions SHELL`, `idem man`: the container's
//!   health check, shell completions and manual pages.

mod config;
mod consume;
mod dlq;
mod doctor;
mod health;
mod manual;
mod ops;
mod proxy;
mod run;
mod serve;
mod status;
mod store;
#[cfg(feature = "sql")]
mod upkeep;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use run::Failure;

#[derive(Parser, Debug)]
#[command(
    name = "idem",
    version,
    about = "Make at-least-once delivery safe: however often a request or message arrives, its effect happens once.",
    long_about = None,
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the HTTP API for clients in any language.
    Serve(serve::ServeArgs),
    /// Put the Idempotency-Key gateway in front of an HTTP service.
    Proxy(proxy::ProxyArgs),
    /// Feed messages from a broker to an HTTP handler, effectively once.
    Consume(consume::ConsumeArgs),
    /// Show one record: state, token, attempts, lease left, outcome.
    Inspect(ops::InspectArgs),
    /// List a namespace's records, e.g. stuck ones: `--state in-progress
    /// --older-than 10m`.
    Ls(ops::LsArgs),
    /// Take a live claim from a holder known to be gone (`--force`), or
    /// release a namespace's stuck claims (`--stuck --older-than 10m
    /// --yes`: those whose lease ran out, and those `--token` names): the
    /// next delivery runs the work again.
    #[command(after_long_help = ops::RELEASE_EXIT_CODES)]
    Release(ops::ReleaseArgs),
    /// Count a namespace's records (or every namespace's) by state, with
    /// the oldest claim in progress and the store's size.
    Stats(ops::counts::StatsArgs),
    /// Remove a namespace's expired records (`--expired`), or all of them
    /// (`--all --yes`).
    Purge(ops::counts::PurgeArgs),
    /// List, show and replay the dead letters of a broker source.
    Dlq(dlq::DlqArgs),
    /// Check that idem can work here: the store (reach, round trip, a
    /// claim, clock skew, schema, settings) and the broker, each problem
    /// with its fix.
    Doctor(doctor::DoctorArgs),
    /// Bring an SQL store's tables up to the schema this idem needs.
    #[cfg(feature = "sql")]
    Migrate(upkeep::MigrateArgs),
    /// Delete an SQL store's expired records now, in small batches.
    #[cfg(feature = "sql")]
    Sweep(upkeep::SweepArgs),
    /// Ask a running idem whether it is ready (exit 0) or not (1): the
    /// container image's health check.
    Health(health::HealthArgs),
    /// Print the completion script for a shell.
    Completions(manual::CompletionsArgs),
    /// Print the manual page, or write every page into a directory.
    Man(manual::ManArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("idem: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(args) => serve::run(args).await,
            Command::Proxy(args) => proxy::run(args).await,
            Command::Consume(args) => consume::run(args).await,
            Command::Inspect(args) => ops::inspect(args).await,
            Command::Ls(args) => ops::ls(args).await,
            Command::Release(args) => ops::release(args).await,
            Command::Stats(args) => ops::counts::stats(args).await,
            Command::Purge(args) => ops::counts::purge(args).await,
            Command::Dlq(args) => dlq::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
            #[cfg(feature = "sql")]
            Command::Migrate(args) => upkeep::migrate(args).await,
            #[cfg(feature = "sql")]
            Command::Sweep(args) => upkeep::sweep(args).await,
            Command::Health(args) => health::run(args).await,
            Command::Completions(args) => manual::completions(args),
            Command::Man(args) => manual::man(args),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Config(e)) => {
            eprintln!("idem: {e}");
            ExitCode::from(2)
        }
        Err(Failure::Run(e)) => {
            eprintln!("idem: {e}");
            ExitCode::FAILURE
        }
        Err(Failure::Exit(code, e)) => {
            eprintln!("idem: {e}");
            ExitCode::from(code)
        }
    }
}
