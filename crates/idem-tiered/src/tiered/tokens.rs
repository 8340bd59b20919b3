//! Tokens never go back across tiers and restarts.
//!
//! The hot tier issues every token. When the store opens, the hot tier's
//! floor is raised to the cold tier's high-water mark. A hot tier that
//! forgets everything when the process ends (memory) would also forget the
//! tokens it issued but never wrote to the cold tier, so its tokens are
//! reserved in the cold tier in blocks: before a token above the reserved
//! mark is handed out, the mark moves a block past it, durably.

use std::sync::atomic::{AtomicU64, Ordering};

use idem_core::tier::Tier;
use idem_core::{FencingToken, StoreError};

/// Tokens reserved at a time: one cold-tier write per 65 536 claims.
const BLOCK: u64 = 1 << 16;

pub(super) struct TokenBlocks {
    /// Whether the hot tier's tokens need reserving.
    reserve: bool,
    /// Every token up to this one is reserved in the cold tier.
    reserved: AtomicU64,
    moving: tokio::sync::Mutex<()>,
}

impl TokenBlocks {
    pub async fn open<H: Tier, C: Tier>(hot: &H, cold: &C) -> Result<Self, StoreError> {
        let high = cold
            .token_high_water()
            .await?
            .max(hot.token_high_water().await?);
        hot.raise_token_floor(high).await?;
        let blocks = Self {
            reserve: H::VOLATILE,
            reserved: AtomicU64::new(high.get()),
            moving: tokio::sync::Mutex::new(()),
        };
        if blocks.reserve {
            blocks.move_past(high, cold).await?;
        }
        Ok(blocks)
    }

    /// Called with each token the hot tier hands out, before the caller
    /// hears of it.
    pub async fn issued<C: Tier>(&self, token: FencingToken, cold: &C) -> Result<(), StoreError> {
        if !self.reserve || token.get() <= self.reserved.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one_at_a_time = self.moving.lock().await;
        if token.get() <= self.reserved.load(Ordering::Acquire) {
            return Ok(());
        }
        self.move_past(token, cold).await
    }

    async fn move_past<C: Tier>(&self, token: FencingToken, cold: &C) -> Result<(), StoreError> {
        let mark = token.get().saturating_add(BLOCK);
        cold.record_high_water(FencingToken::new(mark)).await?;
        self.reserved.fetch_max(mark, Ordering::AcqRel);
        Ok(())
    }
}
