//! The inverted-dropout multiplier `Z` the reference applies, drawn from the kernels' Philox RNG.

use attention_kernels::abi::philox::DropoutRng;

use crate::options::AttentionOptions;

/// `Z(s, h, i, j)`: 0 where [`DropoutRng::keep`] drops, `1/(1 − p)` (in f64) where it keeps.
#[derive(Clone, Copy, Debug)]
pub struct DropoutMask {
    pub rng: DropoutRng,
    pub keep_scale: f64,
}

impl DropoutMask {
    pub fn new(options: &AttentionOptions) -> Self {
        let keep_scale = options.dropout.map_or(1.0, |d| 1.0 / (1.0 - d.p as f64));
        DropoutMask {
            rng: options.dropout_rng(),
            keep_scale,
        }
    }

    /// Multiplier of local (row, col) of sequence `sequence`, query head `head`.
    pub fn multiplier(&self, sequence: u32, head: u32, row: u32, col: u32) -> f64 {
        if self.rng.keep(sequence, head, row, col) {
            self.keep_scale
        } else {
            0.0
        }
    }
}
