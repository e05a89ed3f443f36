//! Online softmax over the rows a lane holds (g and g + 8 of its warp's 16), in base 2.
//!
//! Scores arrive already multiplied by `τ · log2 e`, so `p = 2^(x − m)` is one subtraction and one
//! `ex2`. Each of the four lanes of a quad holds a quarter of a row: maxima are reduced over the
//! quad at every block (every lane needs `m`), sums only once at the end.

use crate::arch::{exp2, fma, log2, shfl_xor};
use crate::attn::mask::row_is_empty;
use crate::attn::score_mod::with_sink;
use crate::tile::mma::{FragA, FragC, MmaElem};

/// Running `(m, l)` of rows g and g + 8: `m` the base-2 row maximum so far, `l` this lane's part of
/// `Σ 2^(x − m)`.
pub struct RowState {
    m: [f32; 2],
    l: [f32; 2],
}

#[inline(always)]
fn quad_max(x: f32) -> f32 {
    let x = x.max(shfl_xor(x, 1));
    x.max(shfl_xor(x, 2))
}

/// The maximum of row `r`'s (g, g + 8) scores of `s`, reduced as a balanced tree: the maximum
/// is the same in any order, and a chain of `2·NK` dependent maxima would wait on each other.
#[inline(always)]
fn tree_max<const NK: usize>(s: &[FragC; NK], r: usize) -> f32 {
    let mut v = [0.0f32; NK];
    for (v, t) in v.iter_mut().zip(s) {
        *v = t.0[2 * r].max(t.0[2 * r + 1]);
    }
    let mut n = NK;
    while n > 1 {
        let half = n / 2;
        for i in 0..half {
            v[i] = v[i].max(v[i + half]);
        }
        if n % 2 == 1 {
            v[0] = v[0].max(v[n - 1]);
        }
        n = half;
    }
    v[0]
}

#[inline(always)]
fn quad_sum(x: f32) -> f32 {
    let x = x + shfl_xor(x, 1);
    x + shfl_xor(x, 2)
}

impl RowState {
    #[inline(always)]
    pub fn new() -> Self {
        RowState {
            m: [f32::NEG_INFINITY; 2],
            l: [0.0; 2],
        }
    }

    /// Folds one block of masked scores `s`, base-2 once multiplied by `scale` (> 0; 1 for
    /// scores already scaled), into the state and turns them into `P = 2^(scale·s − m)` in
    /// place, one `fma` and one `ex2` each; returns the factors `α` by which the output
    /// accumulated so far must be rescaled (rows g and g + 8, [`rescale`]).
    #[inline(always)]
    pub fn fold<const NK: usize>(&mut self, s: &mut [FragC; NK], scale: f32) -> [f32; 2] {
        self.fold_biased(s, scale, 0.0)
    }

    /// [`RowState::fold`] with every weight times `2^bias`, at no cost (the bias joins the
    /// row's maximum in the exponent's `fma`): ℓ sums the scaled weights, so O's normalisation
    /// in [`RowState::finish`] cancels the factor and only its LSE comes out `bias · ln 2` too
    /// large. The FP8 forward takes P into e4m3's range this way.
    #[inline(always)]
    pub fn fold_biased<const NK: usize>(
        &mut self,
        s: &mut [FragC; NK],
        scale: f32,
        bias: f32,
    ) -> [f32; 2] {
        let mut m_new = [0, 1].map(|r| self.m[r].max(tree_max(s, r) * scale));
        let mut alpha = [0.0f32; 2];
        let mut m_sub = [0.0f32; 2];
        for r in 0..2 {
            m_new[r] = quad_max(m_new[r]);
            // A row with nothing allowed yet keeps m = −∞; subtracting 0 instead keeps 2^(−∞) = 0
            // and avoids −∞ − (−∞) = NaN.
            m_sub[r] = if m_new[r] == f32::NEG_INFINITY {
                0.0
            } else {
                m_new[r]
            };
            alpha[r] = exp2(self.m[r] - m_sub[r]);
            self.m[r] = m_new[r];
            self.l[r] *= alpha[r];
        }
        for t in s.iter_mut() {
            for e in 0..4 {
                // `m − 0.0` folds to `m`: `fold` compiles as it did without a bias.
                t.0[e] = exp2(fma(t.0[e], scale, -(m_sub[e / 2] - bias)));
                self.l[e / 2] += t.0[e];
            }
        }
        alpha
    }

    /// `(m, ℓ)` of rows g and g + 8, `ℓ` summed over the quad: the state a split-KV kernel's
    /// warps merge (every lane of the warp must call it).
    #[inline(always)]
    pub fn stats(&self) -> ([f32; 2], [f32; 2]) {
        (self.m, [quad_sum(self.l[0]), quad_sum(self.l[1])])
    }

    /// Normalises `o` by the row sums and returns the natural-log `LSE = m ln 2 + ln l` of rows
    /// g and g + 8; a row that saw no allowed key gets `O = 0`, `LSE = −∞`. With a sink logit
    /// (natural units) the sum and LSE include it (`score_mod::with_sink`): an empty row gets
    /// `O = 0`, `LSE = sink`.
    #[inline(always)]
    pub fn finish<const ND: usize>(&self, o: &mut [FragC; ND], sink: Option<f32>) -> [f32; 2] {
        let mut lse = [f32::NEG_INFINITY; 2];
        let mut inv = [0.0f32; 2];
        for r in 0..2 {
            let l = quad_sum(self.l[r]);
            // A maximum that overflowed to +∞ only in `fold`'s scaling leaves every p at 0: the
            // row is a +∞ score's, NaN, as when the scaled score itself is +∞.
            let l = if self.m[r] == f32::INFINITY {
                f32::NAN
            } else {
                l
            };
            if let Some(sink) = sink {
                (lse[r], inv[r]) = with_sink(self.m[r] * core::f32::consts::LN_2, l, sink);
            } else if !row_is_empty(l) {
                // ℓ is NaN for a row with a NaN or +∞ score: O and LSE come out NaN, not empty.
                inv[r] = 1.0 / l;
                lse[r] = (self.m[r] + log2(l)) * core::f32::consts::LN_2;
            }
        }
        for t in o.iter_mut() {
            t.0[0] *= inv[0];
            t.0[1] *= inv[0];
            t.0[2] *= inv[1];
            t.0[3] *= inv[1];
        }
        lse
    }
}

/// Multiplies rows g and g + 8 of the output accumulators by `alpha`.
#[inline(always)]
pub fn rescale<const ND: usize>(o: &mut [FragC; ND], alpha: [f32; 2]) {
    for t in o.iter_mut() {
        t.0[0] *= alpha[0];
        t.0[1] *= alpha[0];
        t.0[2] *= alpha[1];
        t.0[3] *= alpha[1];
    }
}

/// `P` (scores after [`RowState::fold`]) as `NP = NK / 2` A fragments of the next product.
#[inline(always)]
pub fn pack<T: MmaElem, const NK: usize, const NP: usize>(s: &[FragC; NK]) -> [FragA; NP] {
    let mut p = [FragA::default(); NP];
    for (k, a) in p.iter_mut().enumerate() {
        *a = T::pack_a(&s[2 * k], &s[2 * k + 1]);
    }
    p
}
