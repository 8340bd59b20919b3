//! Background work that lives as long as the store it serves.

use std::sync::{Arc, Weak};
use std::thread::Thread;
use std::time::Duration;

/// Runs `work` on a thread of its own every `every`, for as long as `owner`
/// lives. Unpark the returned thread when the owner drops so it exits at
/// once instead of at its next tick.
pub fn spawn_periodic<T: Send + Sync + 'static>(
    name: &str,
    owner: &Arc<T>,
    every: Duration,
    work: fn(&T),
) -> std::io::Result<Thread> {
    let owner: Weak<T> = Arc::downgrade(owner);
    let handle = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            loop {
                std::thread::park_timeout(every);
                match owner.upgrade() {
                    Some(owner) => work(&owner),
                    None => return,
                }
            }
        })?;
    Ok(handle.thread().clone())
}
