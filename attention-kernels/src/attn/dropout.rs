//! Dropout on the normalised probabilities, drawn from the Philox stream every family and the
//! CPU reference share: per element, and over the tensor-core kernels' register fragments.

use crate::abi::philox::DropoutRng;
use crate::tile::mma::{FragA, FragC};

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

/// Multiplies P (`sc`, the scores of keys `k0 ..` after `RowState::fold`, accumulator layout)
/// by the dropout multipliers of the lane's rows `rows` (g and g + 8 of its warp's 16). ℓ has
/// already summed the undropped P; only the product with V sees Z. The keep bits are gathered
/// first (bit `2j + c`: column `k0 + 8j + 2t + c`) in a loop that touches no register array, so
/// its ten Philox rounds per pair need not unroll; the loop that applies them must, and is small.
#[inline(always)]
pub fn apply_dropout<const NK: usize>(
    sc: &mut [FragC; NK],
    rng: &DropoutRng,
    (seq, head): (u32, u32),
    rows: [u32; 2],
    k0: u32,
    t: u32,
) {
    let key = rng.key();
    let mut keep = [0u32; 2];
    let mut j = 0;
    while j < NK as u32 {
        let col = k0 + 8 * j + 2 * t;
        keep[0] |= rng.pair_keep_bits(key, seq, head, rows[0], col) << (2 * j);
        keep[1] |= rng.pair_keep_bits(key, seq, head, rows[1], col) << (2 * j);
        j += 1;
    }
    for (j, f) in sc.iter_mut().enumerate() {
        for e in 0..4 {
            let kept = (keep[e / 2] >> (2 * j + e % 2)) & 1 != 0;
            f.0[e] *= if kept { rng.keep_scale } else { 0.0 };
        }
    }
}

/// The backwards' transposed view: the dropout keep bits of the lane's `Pᵀ` elements (one key per
/// row, one query per column), bit `4j + e` for element `e` of fragment `j` (key `keys[e / 2]`,
/// query `q0 + 8j + 2t + e % 2`). Gathered in a loop that touches no register array, so its ten
/// Philox rounds per element need not unroll. `NQ ≤ 8` (the bits fill a `u32`): each caller's
/// kernel asserts it of the instances that drop (the `wgmma` backward's tall instances, with
/// 16 fragments, never do).
#[inline(always)]
pub fn transposed_keep_bits<const NQ: usize>(
    rng: &DropoutRng,
    (seq, head): (u32, u32),
    q0: u32,
    t: u32,
    keys: [u32; 2],
) -> u32 {
    let key = rng.key();
    let mut keep = 0u32;
    let mut i = 0;
    while i < 4 * NQ as u32 {
        let (j, e) = (i / 4, i % 4);
        let query = q0 + 8 * j + 2 * t + e % 2;
        let k = if e < 2 { keys[0] } else { keys[1] };
        keep |= (rng.keep_with_key(key, seq, head, query, k) as u32) << i;
        i += 1;
    }
    keep
}

/// The A operand `a` built by `MmaElem::pack_a` from accumulator fragments `2k` and `2k + 1`,
/// with the elements that [`transposed_keep_bits`] `keep` drops set to 0 (bits `8k ..`: word `w`
/// holds the elements of bits `8k + 2w` (low half) and `8k + 2w + 1`). The kept ones are left as
/// they are, not multiplied by `1/(1 − p)`: the caller scales the sum once (a rounded `P` times
/// the scale would round twice).
#[inline(always)]
pub fn drop_operand(a: FragA, keep: u32, k: usize) -> FragA {
    let mut out = a;
    for (w, word) in out.0.iter_mut().enumerate() {
        let bits = keep >> (8 * k + 2 * w);
        let mask = (if bits & 1 != 0 { 0xffff } else { 0 })
            | (if bits & 2 != 0 { 0xffff_0000 } else { 0 });
        *word &= mask;
    }
    out
}
