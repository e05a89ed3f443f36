//! Dropout on the normalised probabilities, drawn from the Philox stream every family and the
//! CPU reference share.

use crate::abi::philox::DropoutRng;

/// The inverted-dropout multiplier `Z` of (batch, head, row, col) given the call's Philox `key`:
/// the same decision as `DropoutRng::keep`, without recomputing the key per element.
#[inline(always)]
pub fn dropout_multiplier(
    rng: &DropoutRng,
    key: [u32; 2],
    batch: u32,
    head: u32,
    row: u32,
    col: u32,
) -> f32 {
    if !rng.enabled() {
        return 1.0;
    }
    let w = DropoutRng::draws(key, batch, head, row, col / 4);
    // A match rather than `w[col % 4]`: a dynamic index would put `w` in local memory.
    let draw = match col % 4 {
        0 => w[0],
        1 => w[1],
        2 => w[2],
        _ => w[3],
    };
    if draw >= rng.threshold {
        rng.keep_scale
    } else {
        0.0
    }
}
