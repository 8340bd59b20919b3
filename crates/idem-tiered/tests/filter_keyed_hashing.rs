//! Bit positions depend on the deployment's secret seed, and on the
//! namespace and the key without ambiguity; the seed never leaves the
//! process.

mod filter_support;

use idem_core::Key;
use idem_tiered::filter::{FilterConfig, FilterSeed, KeyFilter, Membership};

use filter_support::{RETENTION, at, config, key, no_keys, ready};

/// A filter under `seed` holding 300 keys, its newest generation full.
fn filter_under(seed: FilterSeed) -> KeyFilter {
    let mut config = FilterConfig::new(seed, 900, RETENTION);
    config.false_positive_rate = 0.05;
    let filter = KeyFilter::new(&config, at(0)).unwrap();
    filter.rebuild(no_keys(), None, |_, _| {}).unwrap();
    for n in 0..300 {
        filter.insert(&key(n));
    }
    filter
}

#[test]
fn keys_crafted_to_collide_under_one_seed_do_not_collide_under_another() {
    let attacked = filter_under(FilterSeed::new(1));
    // What an attacker who knew the seed could precompute: new keys whose
    // bits are all set, each one a needless trip to the store.
    let crafted: Vec<Key> = (0..)
        .map(|n| Key::new("orders", format!("crafted-{n}")).unwrap())
        .filter(|k| attacked.check(k) == Membership::Maybe)
        .take(200)
        .collect();
    let deployed = filter_under(FilterSeed::new(2));
    let still_colliding = crafted
        .iter()
        .filter(|k| deployed.check(k) == Membership::Maybe)
        .count();
    // Under another seed they are ordinary keys: about 1.3 % collide.
    assert!(
        still_colliding < 15,
        "{still_colliding} of 200 crafted keys still collide"
    );
}

#[test]
fn namespace_and_key_are_hashed_without_ambiguity() {
    let filter = ready(&config(10_000), at(0));
    let keys = 1_000;
    for n in 0..keys {
        filter.insert(&Key::new("ab", format!("c{n}")).unwrap());
    }
    // The same bytes split at another place are other keys.
    let resplit = (0..keys)
        .filter(|n| filter.check(&Key::new("a", format!("bc{n}")).unwrap()) == Membership::Maybe)
        .count();
    assert!(
        resplit < 10,
        "{resplit} of {keys} re-split keys answer Maybe"
    );
    assert_eq!(
        filter.check(&Key::new("ab", "c7").unwrap()),
        Membership::Maybe
    );
}

#[test]
fn the_same_seed_places_keys_the_same_way() {
    let a = ready(&config(1_000), at(0));
    let b = ready(&config(1_000), at(0));
    a.insert(&key(1));
    b.insert(&key(1));
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    a.write_snapshot(&dir_a.path().join("f"), at(0)).unwrap();
    b.write_snapshot(&dir_b.path().join("f"), at(0)).unwrap();
    assert_eq!(
        std::fs::read(dir_a.path().join("f")).unwrap(),
        std::fs::read(dir_b.path().join("f")).unwrap()
    );
}

#[test]
fn the_seed_shows_only_as_a_fingerprint() {
    let secret: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;
    let seed = FilterSeed::new(secret);
    let shown = format!(
        "{seed:?} {:?}",
        ready(&FilterConfig::new(seed, 100, RETENTION), at(0))
    );
    assert!(
        shown.contains(&format!("{:016x}", seed.fingerprint())),
        "{shown}"
    );
    for part in [
        format!("{secret:x}"),
        format!("{secret}"),
        "0123456789abcdef".into(),
        "fedcba9876543210".into(),
    ] {
        assert!(!shown.to_lowercase().contains(&part), "{shown}");
    }
    assert_ne!(
        seed.fingerprint(),
        FilterSeed::new(secret + 1).fingerprint()
    );
    assert_eq!(
        seed.fingerprint(),
        FilterSeed::from_bytes(secret.to_be_bytes()).fingerprint()
    );

    let filter = ready(&FilterConfig::new(seed, 100, RETENTION), at(0));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("filter.snapshot");
    filter.write_snapshot(&path, at(0)).unwrap();
    let written = std::fs::read(&path).unwrap();
    for bytes in [secret.to_be_bytes(), secret.to_le_bytes()] {
        assert!(
            !written
                .windows(8)
                .any(|w| w == &bytes[..8] || w == &bytes[8..])
        );
    }
    assert!(
        written
            .windows(8)
            .any(|w| w == seed.fingerprint().to_le_bytes())
    );
}
