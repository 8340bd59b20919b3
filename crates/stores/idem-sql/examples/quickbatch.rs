use std::time::{Duration, Instant};
use idem_core::{Begin, BeginItem, CompleteItem, Key, Lease, Store};
use idem_sql::SqlStore;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let url = std::env::args().nth(1).unwrap();
    let conc: usize = std::env::args().nth(2).unwrap().parse().unwrap();
    let size: usize = std::env::args().nth(3).unwrap().parse().unwrap();
    let store = SqlStore::builder(&url).table("idem_quickbench").connect().await.unwrap();
    let run = std::process::id();
    let t0 = Instant::now();
    let dur = Duration::from_secs(5);
    let tasks: Vec<_> = (0..conc).map(|t| {
        let store = store.clone();
        tokio::spawn(async move {
            let mut n = 0u64;
            let mut b = 0u64;
            while t0.elapsed() < dur {
                let items: Vec<BeginItem> = (0..size).map(|i| BeginItem { key: Key::new("qb", format!("{run}-{t}-{b}-{i}")).unwrap(), fingerprint: None, lease: Lease::from_secs(30) }).collect();
                let a = Instant::now();
                let got = store.begin_many(&items).await.unwrap();
                let m = Instant::now();
                let done: Vec<CompleteItem> = items.iter().zip(got).map(|(it, g)| { let Begin::Acquired(c) = g else { panic!() }; CompleteItem { key: it.key.clone(), token: c.token, outcome: None, retention: Duration::from_secs(60) } }).collect();
                let r = store.complete_many(&done).await.unwrap();
                assert!(r.iter().all(|f| !f.is_stale()));
                if t == 0 && b % 20 == 3 { eprintln!("begin_many {:?} complete_many {:?}", m - a, m.elapsed()); }
                n += size as u64; b += 1;
            }
            n
        })
    }).collect();
    let mut total = 0;
    for t in tasks { total += t.await.unwrap(); }
    println!("{url} conc={conc} size={size}: {:.0} cycles/s", total as f64 / t0.elapsed().as_secs_f64());
}
