//! The filter is sized from the keys expected per retention and the
//! false-positive rate, and holds exactly the bit arrays that sizing calls
//! for.

mod filter_support;

use std::time::Duration;

use idem_tiered::filter::{BloomSizing, ConfigError, FilterConfig, KeyFilter};

use filter_support::{RETENTION, at, config, seed};

#[test]
fn one_array_for_10m_keys_at_0_1_percent_fits_in_18_mb() {
    let sizing = BloomSizing::new(10_000_000, 0.001);
    assert!(sizing.bytes() <= 18_000_000, "{sizing:?}");
    assert_eq!(sizing.bits % 64, 0);
    let fastbloom_bits = fastbloom::optimal_size(10_000_000, 0.001).div_ceil(64) * 64;
    assert_eq!(sizing.bits, fastbloom_bits as u64);
    assert_eq!(sizing.hashes, 10);
    let expected = fastbloom::expected_false_pos(
        sizing.hashes,
        fastbloom::expected_density(sizing.hashes, sizing.bits as usize, 10_000_000),
    );
    assert!(expected <= 0.001 * 1.01, "expected rate {expected}");
}

#[test]
fn each_generation_holds_one_window_at_its_share_of_the_rate() {
    let sizing = config(10_000_000).sizing().unwrap();
    assert_eq!(sizing.generations, 4);
    assert_eq!(sizing.window, RETENTION / 3);
    assert_eq!(sizing.generation.items, 3_333_334);
    // Four full generations together answer `Maybe` for 0.1 % of new keys.
    let whole = 1.0 - (1.0 - sizing.generation.false_positive_rate).powi(4);
    assert!((whole - 0.001).abs() < 1e-12, "whole rate {whole}");
    assert_eq!(
        sizing.generation,
        BloomSizing::new(3_333_334, sizing.generation.false_positive_rate)
    );
}

#[test]
fn memory_is_the_bit_arrays_the_sizing_promised() {
    let config = config(10_000_000);
    let filter = KeyFilter::new(&config, at(0)).unwrap();
    let sizing = config.sizing().unwrap();
    assert_eq!(filter.memory_bytes(), sizing.total_bytes());
    assert_eq!(filter.memory_bytes(), 4 * sizing.generation.bytes());
    assert_eq!(filter.stats().bytes, filter.memory_bytes());
    // The figure the module docs give for 10 M keys at 0.1 % over 4
    // generations.
    assert_eq!(filter.memory_bytes(), 28_770_336);
}

#[test]
fn documented_memory_figures_hold() {
    let mut eight = config(10_000_000);
    eight.generations = 8;
    let mut one_percent = config(10_000_000);
    one_percent.false_positive_rate = 0.01;
    let megabytes = |config: &FilterConfig| config.sizing().unwrap().total_bytes() as f64 / 1e6;
    assert_eq!(format!("{:.1}", megabytes(&eight)), "26.7");
    assert_eq!(format!("{:.1}", megabytes(&one_percent)), "20.8");
    assert_eq!(
        format!(
            "{:.2}",
            BloomSizing::new(10_000_000, 0.001).bytes() as f64 / 1e6
        ),
        "17.97"
    );
}

#[test]
fn settings_that_cannot_work_say_what_to_change() {
    let refused = |change: fn(&mut FilterConfig)| {
        let mut config = config(1_000);
        change(&mut config);
        config.sizing().unwrap_err()
    };
    let one = refused(|c| c.generations = 1);
    assert_eq!(one, ConfigError::Generations { generations: 1 });
    assert!(one.to_string().contains("must be 2 to 64"), "{one}");
    for rate in [0.0, 1.0, -0.1, f64::NAN] {
        let mut config = config(1_000);
        config.false_positive_rate = rate;
        let error = config.sizing().unwrap_err();
        assert!(
            matches!(error, ConfigError::FalsePositiveRate { .. }),
            "{error}"
        );
        assert!(error.to_string().contains("0.001 is 0.1 %"), "{error}");
    }
    let none = refused(|c| c.expected_items = 0);
    assert!(
        none.to_string()
            .contains("distinct keys inserted per retention"),
        "{none}"
    );
    let short = refused(|c| c.retention = Duration::from_millis(2));
    assert!(
        short.to_string().contains("lengthen the retention"),
        "{short}"
    );
    let huge = refused(|c| c.expected_items = u64::MAX / 2);
    assert!(matches!(huge, ConfigError::TooLarge { .. }), "{huge}");
    assert!(huge.to_string().contains("lower expected_items"), "{huge}");
    assert!(
        KeyFilter::new(
            &FilterConfig {
                generations: 65,
                ..config(1_000)
            },
            at(0)
        )
        .is_err()
    );
    assert_eq!(config(1_000).seed, seed());
}
