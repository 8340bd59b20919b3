//! Offline batch (docs/guide.md): a nightly import that dies half way and
//! is run again applies each row once.
//!
//! The import reads 12 000 invoice rows from a CSV file and books each into
//! a ledger file. Rows are claimed and completed in batches of 500
//! (`Store::begin_many`, `Store::complete_many`) on the embedded file store
//! (`idem::FileStore`, nothing else to run). The first run is a child
//! process that ends abruptly (`std::process::exit`, no cleanup) after
//! half the rows, with its next batch claimed and not yet worked on. The
//! second run reopens the store from the same directory: the finished rows
//! answer `Completed` and are skipped, the claims of the dead run died with
//! it, and the rest are booked. A third run finds everything done.
//!
//! ```sh
//! cargo run -p idem --example guide_offline_batch
//! ```
//!
//! Works in a temporary directory. Exits non-zero when a row was booked
//! twice or not at all.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use idem::{Begin, BeginItem, CompleteItem, FileStore, Fingerprint, Key, Lease, Store};

type Error = Box<dyn std::error::Error + Send + Sync>;

const ROWS: usize = 12_000;
const BATCH: usize = 500;
/// Longer than a batch takes; a batch that may take longer extends it.
const LEASE: Lease = Lease::from_secs(300);
/// How long a booked row is remembered: longer than any re-run can come.
const RETENTION: Duration = Duration::from_secs(30 * 24 * 3600);
/// The exit status of the run that dies.
const DIED: i32 = 3;

/// What one run did.
#[derive(Debug, Default)]
struct Run {
    /// Rows booked by this run.
    booked: usize,
    /// Rows a run before had booked: skipped.
    skipped: usize,
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, flag, after, dir] = args.as_slice()
        && flag == "--die-after"
    {
        // The first run, in a process of its own.
        let run = import(Path::new(dir), Some(after.parse()?)).await?;
        return Err(format!("the import should have died, but finished: {run:?}").into());
    }

    let dir = tempfile::tempdir()?;
    write_input(&dir.path().join("invoices.csv"))?;
    println!("input: {ROWS} rows in invoices.csv, booked in batches of {BATCH}");

    let started = Instant::now();
    let status = std::process::Command::new(std::env::current_exe()?)
        .arg("--die-after")
        .arg((ROWS / 2).to_string())
        .arg(dir.path())
        .status()?;
    if status.code() != Some(DIED) {
        return Err(format!("the first run should have died with status {DIED}: {status}").into());
    }
    let first = booked_rows(dir.path())?.len();
    println!(
        "run 1: booked {first} rows, then the process died ({status}) in {:.2} s",
        started.elapsed().as_secs_f64()
    );

    let started = Instant::now();
    let second = import(dir.path(), None).await?;
    println!(
        "run 2: {} rows already booked (skipped), {} booked, in {:.2} s",
        second.skipped,
        second.booked,
        started.elapsed().as_secs_f64()
    );
    let third = import(dir.path(), None).await?;
    println!(
        "run 3: {} rows already booked (skipped), {} booked",
        third.skipped, third.booked
    );

    let ledger = booked_rows(dir.path())?;
    let mut ids = ledger.clone();
    ids.sort_unstable();
    ids.dedup();
    println!(
        "ledger: {} entries for {} distinct rows",
        ledger.len(),
        ids.len()
    );

    assert_eq!(first, ROWS / 2, "the first run booked half before dying");
    assert_eq!(second.skipped, first, "the re-run skipped what was booked");
    assert_eq!(first + second.booked, ROWS, "the re-run booked the rest");
    assert_eq!((third.skipped, third.booked), (ROWS, 0));
    assert_eq!(ids.len(), ROWS, "every row booked");
    assert_eq!(ledger.len(), ROWS, "no row booked twice");
    println!("ok: {ROWS} rows booked once each across 3 runs and a crash");
    Ok(())
}

/// Books every row of `dir/invoices.csv` not booked before, into
/// `dir/ledger.csv`, with the records in `dir/idem-data`. With `die_after`,
/// the process ends once that many rows are booked and the next batch is
/// claimed.
async fn import(dir: &Path, die_after: Option<usize>) -> Result<Run, Error> {
    let store = FileStore::open(dir.join("idem-data"))?;
    let input = BufReader::new(File::open(dir.join("invoices.csv"))?);
    let mut ledger = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("ledger.csv"))?;
    let mut run = Run::default();
    let rows: Vec<String> = input.lines().skip(1).collect::<Result<_, _>>()?;
    for batch in rows.chunks(BATCH) {
        let items = batch
            .iter()
            .map(|line| {
                let id = line.split(',').next().unwrap_or_default();
                Ok(BeginItem {
                    key: Key::new("nightly-invoices", id.to_owned())?,
                    // A row changed since the run that booked it is refused
                    // (`Begin::Mismatch`), not skipped silently.
                    fingerprint: Some(Fingerprint::xxh3(line.as_bytes())),
                    lease: LEASE,
                })
            })
            .collect::<Result<Vec<_>, Error>>()?;
        let answers = store.begin_many(&items).await?;
        if die_after.is_some_and(|n| run.booked >= n) {
            let claimed = answers
                .iter()
                .filter(|a| matches!(a, Begin::Acquired(_)))
                .count();
            println!("run 1: dying with {claimed} rows claimed and not booked");
            std::process::exit(DIED);
        }
        let mut done = Vec::new();
        let mut entries = String::new();
        for ((line, item), answer) in batch.iter().zip(&items).zip(answers) {
            match answer {
                Begin::Acquired(claim) => {
                    entries.push_str(line);
                    entries.push('\n');
                    done.push(CompleteItem {
                        key: item.key.clone(),
                        token: claim.token,
                        outcome: None,
                        retention: RETENTION,
                    });
                }
                Begin::Completed { .. } => run.skipped += 1,
                Begin::InProgress { retry_after } => {
                    return Err(format!(
                        "row {} is being booked by another import (its claim ends within {retry_after:?}); run one import at a time",
                        item.key
                    )
                    .into());
                }
                Begin::Mismatch => {
                    return Err(format!("row {} changed since it was booked", item.key).into());
                }
            }
        }
        // The effect first, durably, then the records. A run that dies
        // between the two books this batch again: keep batches small, or
        // make the effect keyed by the row id.
        ledger.write_all(entries.as_bytes())?;
        ledger.sync_data()?;
        if !done.is_empty() {
            for (item, answer) in done.iter().zip(store.complete_many(&done).await?) {
                if answer.is_stale() {
                    return Err(format!("the claim of row {} ran out", item.key).into());
                }
            }
        }
        run.booked += done.len();
    }
    Ok(run)
}

/// `invoice_id,customer,amount_cents`, one row per invoice.
fn write_input(path: &Path) -> Result<(), Error> {
    let mut out = BufWriter::new(File::create(path)?);
    writeln!(out, "invoice_id,customer,amount_cents")?;
    for n in 0..ROWS {
        writeln!(
            out,
            "inv-{n:06},customer-{:04},{}",
            n % 997,
            500 + n % 4_500
        )?;
    }
    out.flush()?;
    Ok(())
}

/// The invoice ids in the ledger, one per booking.
fn booked_rows(dir: &Path) -> Result<Vec<String>, Error> {
    let path = dir.join("ledger.csv");
    if !path.exists() {
        return Ok(Vec::new());
    }
    BufReader::new(File::open(path)?)
        .lines()
        .map(|line| Ok(line?.split(',').next().unwrap_or_default().to_owned()))
        .collect()
}
