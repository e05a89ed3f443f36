//! What both in-order combines of the split-KV partials share: the merged LSE of one row from
//! every part's LSE, a warp at a time, with `attn::merge`'s policy (a part with `LSE = −∞`
//! contributes nothing, a row empty in every part has `LSE = −∞`, a NaN LSE makes the row NaN).

use crate::arch::{exp, ln, shfl_xor, warp_sum};
use crate::attn::online_state::Real;

use super::MAX_SPLITS;

/// LSEs per lane: every part of a row, `MAX_SPLITS` at most.
pub(super) const LSES_PER_LANE: usize = MAX_SPLITS as usize / 32;

/// Warp maximum that keeps a NaN (a NaN LSE makes the row NaN).
#[inline(always)]
fn warp_max_nan(mut x: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        x = x.max_nan(shfl_xor(x, m));
        m >>= 1;
    }
    x
}

/// Lane `l`'s LSEs of parts `l, l + 32, …` (`−∞` past the last part), every part's loaded
/// before any is used; `lse(q)` reads part `q`'s.
#[inline(always)]
pub(super) fn lane_lses(
    parts: usize,
    lane: usize,
    lse: impl Fn(usize) -> f32,
) -> [f32; LSES_PER_LANE] {
    let mut lses = [f32::NEG_INFINITY; LSES_PER_LANE];
    for (k, l) in lses.iter_mut().enumerate() {
        let q = lane + 32 * k;
        if q < parts {
            *l = lse(q);
        }
    }
    lses
}

/// The row's merged LSE from every lane's [`lane_lses`], the same in every lane; all 32 lanes
/// call it.
#[inline(always)]
pub(super) fn merged_lse(lses: &[f32; LSES_PER_LANE]) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for &l in lses {
        m = m.max_nan(l);
    }
    let m = warp_max_nan(m);
    // `m` is −∞ (every part empty: LSE −∞, O 0) or NaN (the row is NaN): both are the LSE.
    if m == f32::NEG_INFINITY || m.is_nan() {
        return m;
    }
    let mut sum = 0.0;
    for &l in lses {
        if l != f32::NEG_INFINITY {
            sum += exp(l - m);
        }
    }
    m + ln(warp_sum(sum))
}

/// The weight of a non-empty part with LSE `l` in a row of merged LSE `lse` (NaN where the row
/// is NaN).
#[inline(always)]
pub(super) fn weight(l: f32, lse: f32) -> f32 {
    exp(l - lse)
}
