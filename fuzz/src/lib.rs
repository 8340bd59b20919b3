//! What the fuzz targets share.

use std::sync::OnceLock;

/// One current-thread Tokio runtime per process, with timers: the targets
/// that drive tower services block on it, input after input.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime")
    })
}
