//! Support for tests that need a GPU: they skip, visibly, where no CUDA device answers.

use crate::{AttentionError, Gpu};

/// The GPU, or `None` after printing a `SKIP` line naming `test` when no CUDA device answers.
/// Any other failure (a module that does not load, a driver error) panics: that is a failure, not
/// a reason to skip.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match crate::gpu() {
        Ok(gpu) => Some(gpu),
        Err(AttentionError::NoDevice(why)) => {
            eprintln!("SKIP {test}: no CUDA device answered ({why})");
            None
        }
        Err(e) => panic!("{test}: the GPU runtime failed to start: {e}"),
    }
}

/// A fresh seed for random inputs, printed so a failing run can be replayed with
/// `FLASH_ATTN_TEST_SEED=<seed>`.
pub fn fresh_seed(test: &str) -> u64 {
    let seed = std::env::var("FLASH_ATTN_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("{test}: input seed {seed}");
    seed
}
