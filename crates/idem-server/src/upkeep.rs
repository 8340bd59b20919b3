//! `idem migrate` and `idem sweep`: upkeep of the SQL stores' tables, run
//! on demand (a deploy step, a cron job) rather than from a serving
//! process.

use clap::Args;

use crate::config::{StoreArgs, StoreSettings, bad, read_file, resolve_store};
use crate::run::{Failure, init_logging};
use crate::store::{self, SqlSpec};

/// `idem migrate`.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

/// `idem sweep`.
#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Most rows one DELETE statement removes, so no statement holds many
    /// locks for long.
    #[arg(
        long,
        env = "IDEM_SWEEP_BATCH",
        value_name = "ROWS",
        default_value_t = 1000
    )]
    pub batch: u32,
}

/// The settings of `args` and the SQL store they name, or why there is
/// none.
fn sql_store(args: StoreArgs, command: &str) -> Result<(StoreSettings, SqlSpec), Failure> {
    let file = read_file(args.config.as_deref())?;
    let settings = resolve_store(args, &file)?;
    init_logging(&settings.log)?;
    let Some(sql) = SqlSpec::parse(&settings.store) else {
        return Err(bad(
            "store",
            format!(
                "idem {command} works on SQL stores: give --store postgres://USER@HOST:PORT/DB or mysql://USER@HOST:PORT/DB \
                 (the file, memory and Redis stores need no migrations and expire records themselves)"
            ),
        )
        .into());
    };
    Ok((settings, sql))
}

/// Brings the SQL store's tables up to the schema this idem needs, and says
/// what it did.
pub async fn migrate(args: MigrateArgs) -> Result<(), Failure> {
    let (settings, sql) = sql_store(args.store, "migrate")?;
    let builder = idem_sql::SqlStore::builder(&sql.url).limits(settings.limits.clone());
    let shown = idem_sql::redacted(&sql.url);
    let migrated = builder.run_migrations().await.map_err(store::sql_failure)?;
    if migrated.applied.is_empty() {
        println!("{shown}: already at schema version {}", migrated.version);
    } else {
        let applied: Vec<String> = migrated.applied.iter().map(|v| v.to_string()).collect();
        println!(
            "{shown}: applied schema version(s) {}; now at version {}",
            applied.join(", "),
            migrated.version
        );
    }
    Ok(())
}

/// Deletes every expired record of the SQL store now, in bounded batches,
/// and says how many.
pub async fn sweep(args: SweepArgs) -> Result<(), Failure> {
    let batch = args.batch;
    if batch == 0 {
        return Err(bad("batch", "must be at least 1").into());
    }
    let (settings, sql) = sql_store(args.store, "sweep")?;
    let store = store::sql(&sql, &settings, |b| {
        b.migrate(false).sweep_interval(None).sweep_batch(batch)
    })
    .await?;
    let n = store
        .sweep()
        .await
        .map_err(|e| Failure::Run(format!("sweeping {} failed: {e}", store.description())))?;
    println!("{}: deleted {n} expired record(s)", store.description());
    Ok(())
}
