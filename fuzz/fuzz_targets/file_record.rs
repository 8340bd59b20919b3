//! The file store's on-disk bytes: records and keys read back from disk
//! must decode or be refused with a reason, never panic, and what decodes
//! must encode to the same bytes.
#![no_main]

use idem_core::Key;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(key) = Key::decode(data) {
        assert_eq!(key.encode(), data, "a decoded key encodes to its bytes");
        assert!(key.matches_encoded(data));
    }
    if let Ok(record) = idem_file::on_disk::decode_completed(data) {
        assert_eq!(idem_file::on_disk::encode_completed(&record), data);
        assert_eq!(
            idem_file::on_disk::expires_at_of(data),
            Ok(record.expires_at)
        );
    }
    if let Some((_, key)) = idem_file::on_disk::split_expiry_key(data) {
        assert_eq!(key.len() + 8, data.len());
    }
});
