//! The keys the two rows of a lane (g and g + 8 of its warp's 16) and its block see under the
//! causal mask and the local window, and the score modifiers of the tensor-core forwards: one
//! place that turns a block of raw `Q·Kᵀ` scores into masked, modified base-2 scores for the
//! online softmax, for `mma.sync` and `wgmma` alike.

use crate::attn::score_mod::{ScoreMod, Window, key_range_at, keys_every_row_sees};
use crate::tile::mma::{FragC, each_fragment};

/// The keys the rows of a lane and of its block see, and how their scores are modified. Few
/// registers: the lane's rows' ranges are recomputed from their diagonal where a block needs
/// them (the window and the softcap come from the kernel parameters, which cost none).
#[derive(Clone, Copy)]
pub struct RowKeys {
    /// The aligned diagonal `i + n_k − n_q` of row g (row g + 8's is 8 more).
    diagonal: i32,
    n_k: u32,
    causal: bool,
    window: Window,
    /// Keys `masked_before .. unmasked_end` are allowed for every row of the block: blocks
    /// inside skip the mask.
    pub masked_before: u32,
    pub unmasked_end: u32,
    /// Softcap and ALiBi (off where the instance has no modifiers, so the code folds away).
    score_mod: ScoreMod<f32>,
}

impl RowKeys {
    /// The lane's rows `row_lo`, `row_lo + 8` of a block of rows `first ..= last`, in a
    /// sequence of `n_q` rows and `n_k` keys.
    #[inline(always)]
    pub fn new(
        row_lo: u32,
        (first, last): (u32, u32),
        (n_q, n_k): (u32, u32),
        (causal, window): (bool, Window),
        score_mod: ScoreMod<f32>,
    ) -> RowKeys {
        // Rows and keys are below 2^31 (the host's validation).
        let diagonal = (row_lo as i64 + n_k as i64 - n_q as i64) as i32;
        let (masked_before, unmasked_end) =
            keys_every_row_sees((first, last), (n_q, n_k), causal, window);
        RowKeys {
            diagonal,
            n_k,
            causal,
            window,
            masked_before,
            unmasked_end,
            score_mod,
        }
    }

    /// The keys `starts[r] .. ends[r]` rows g (`r = 0`) and g + 8 may see.
    #[inline(always)]
    pub fn ranges(&self) -> ([u32; 2], [u32; 2]) {
        let at =
            |r: i64| key_range_at(self.diagonal as i64 + r, self.n_k, self.causal, self.window);
        let ((s0, e0), (s1, e1)) = (at(0), at(8));
        ([s0, s1], [e0, e1])
    }

    /// Whether the block of keys `k0 .. k0 + bc` holds a key some row of the block may not see
    /// (`score_mod::straddles`, from the kept ends).
    #[inline(always)]
    pub fn partial(&self, k0: u32, bc: u32) -> bool {
        k0 + bc > self.unmasked_end || k0 < self.masked_before
    }

    /// Raw scores `sc` of keys `k0 .. k0 + 8·NK` (lane columns `k0 + 8j + 2t + c`) to base-2
    /// scores: times `τ · log2 e`, modified (softcap, ALiBi), and `−∞` at keys the row may not
    /// see. Blocks every row sees whole skip the mask. Without `scale` (see
    /// [`RowKeys::scale_in_fold`]) the scores stay unscaled, masked only.
    #[inline(always)]
    pub fn prepare<const NK: usize>(
        &self,
        sc: &mut [FragC; NK],
        (scale_log2, scale): (f32, bool),
        k0: u32,
        t: u32,
    ) {
        const { assert!(NK <= 16) };
        let m = self.score_mod;
        if m.softcap != 0.0 || m.slope != 0.0 {
            let col0 = k0 + 2 * t;
            each_fragment!(sc, |j, f| {
                for e in 0..4 {
                    let col = (col0 + 8 * j as u32 + (e % 2) as u32) as i32;
                    let diagonal = self.diagonal + 8 * (e / 2) as i32;
                    let distance = (diagonal - col).unsigned_abs() as f32;
                    f.0[e] = m.apply_log2(f.0[e], scale_log2, distance);
                }
            });
        } else if scale {
            for f in sc.iter_mut() {
                for e in 0..4 {
                    f.0[e] *= scale_log2;
                }
            }
        }
        if self.partial(k0, 8 * NK as u32) {
            let (starts, ends) = self.ranges();
            // Selects, not branches, so `sc` stays in registers.
            let col0 = k0 + 2 * t;
            each_fragment!(sc, |j, f| {
                for e in 0..4 {
                    let col = col0 + 8 * j as u32 + (e % 2) as u32;
                    let hidden = col >= ends[e / 2] || col < starts[e / 2];
                    f.0[e] = if hidden { f32::NEG_INFINITY } else { f.0[e] };
                }
            });
        }
    }

    /// Whether `RowState::fold` can take the scale in its `fma` instead of `prepare` multiplying
    /// the scores by it: without modifiers, and with `τ > 0` (the raw scores' maximum, scaled,
    /// is then the scaled scores').
    #[inline(always)]
    pub fn scale_in_fold(&self, scale_log2: f32) -> bool {
        self.score_mod.softcap == 0.0 && self.score_mod.slope == 0.0 && scale_log2 > 0.0
    }
}
