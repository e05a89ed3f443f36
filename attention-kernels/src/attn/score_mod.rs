//! Score modifiers and the local window, in one place for the kernels and the CPU reference.
//!
//! For query row `i` of a sequence with `n_q` rows and `n_k` keys, write `a = i + n_k − n_q` (the
//! row's aligned diagonal: bottom-right aligned, like the causal mask of
//! `abi::shape::allowed_key_end`). Then:
//! - the local window `(left, right)` allows key `j` iff `a − left ≤ j ≤ a + right`, intersected
//!   with `0 ≤ j < n_k` and with the causal mask when it is on ([`key_range`]); windowed-out keys
//!   are masked keys (they never contribute, whatever they hold) and blocks of keys that no row of
//!   a block sees are skipped, not masked;
//! - the score `s = τ·⟨q_i, k_j⟩` becomes `c · tanh(s / c)` with a softcap `c` (the scale is
//!   applied before, as FlashAttention's `softcap` and Gemma 2 do), then
//!   `− slope_h · |a − j|` is added with ALiBi ([`ScoreMod::apply`]): FlashAttention-2's
//!   non-causal bias; under causal it equals `slope_h · (j − a)`, which FlashAttention-2's causal
//!   kernel shifts by the row constant `slope_h · a` (the same P, O and gradients; LSE differs by
//!   that constant);
//! - a sink logit `σ_h` joins each row's softmax denominator with no value row:
//!   `LSE = ln(Σ_j e^{s_j} + e^{σ_h})`, `P_j = e^{s_j − LSE}`; a row with no allowed key has
//!   `O = 0`, `LSE = σ_h` ([`with_sink`]).
//!
//! The masks and the non-finite policy of [`mask`](super::mask) apply to the modified score.

use crate::attn::online_state::Real;

/// A window extent that bounds nothing.
pub const UNBOUNDED: u32 = u32::MAX;

/// Keys a row sees on each side of its aligned diagonal; [`UNBOUNDED`] on a side leaves it open.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub left: u32,
    pub right: u32,
}

impl Window {
    /// No window: every key the other masks allow.
    pub const NONE: Window = Window {
        left: UNBOUNDED,
        right: UNBOUNDED,
    };

    pub const fn is_none(&self) -> bool {
        self.left == UNBOUNDED && self.right == UNBOUNDED
    }
}

impl Default for Window {
    fn default() -> Self {
        Window::NONE
    }
}

/// `x` clamped to `0 ..= n`.
const fn clamp(x: i64, n: u32) -> u32 {
    if x < 0 {
        0
    } else if x > n as i64 {
        n
    } else {
        x as u32
    }
}

/// The keys `start .. end` query row `i` may see (empty when `start >= end`): the causal prefix
/// of `abi::shape::allowed_key_end` cut to the window. Both ends grow with `i`, so a block of rows
/// `i0 ..= i1` sees keys `key_range(i0).0 .. key_range(i1).1` at most, and no other.
#[inline(always)]
pub const fn key_range(i: u32, n_q: u32, n_k: u32, causal: bool, window: Window) -> (u32, u32) {
    key_range_at(i as i64 + n_k as i64 - n_q as i64, n_k, causal, window)
}

/// [`key_range`] of the row whose aligned diagonal is `diagonal = i + n_k − n_q`.
#[inline(always)]
pub const fn key_range_at(diagonal: i64, n_k: u32, causal: bool, window: Window) -> (u32, u32) {
    let mut end = if causal {
        clamp(diagonal + 1, n_k)
    } else {
        n_k
    };
    let start = if window.left == UNBOUNDED {
        0
    } else {
        clamp(diagonal - window.left as i64, n_k)
    };
    if window.right != UNBOUNDED {
        let right_end = clamp(diagonal + window.right as i64 + 1, n_k);
        if right_end < end {
            end = right_end;
        }
    }
    (start, end)
}

/// The key blocks `first .. end` (of `block` keys) rows `i0 ..= i1` visit: every other block holds
/// no key any of them sees, so it is skipped, not masked (a window of `w` keys costs about `w`
/// keys per row, not `n_k`).
#[inline(always)]
pub const fn key_blocks(
    (i0, i1): (u32, u32),
    (n_q, n_k): (u32, u32),
    causal: bool,
    window: Window,
    block: u32,
) -> (u32, u32) {
    let start = key_range(i0, n_q, n_k, causal, window).0;
    let end = key_range(i1, n_q, n_k, causal, window).1;
    (start / block, end.div_ceil(block))
}

/// The keys `start .. end` every row of `i0 ..= i1` sees (none when `start >= end`): the last
/// row starts latest and the first ends earliest.
#[inline(always)]
pub const fn keys_every_row_sees(
    (i0, i1): (u32, u32),
    (n_q, n_k): (u32, u32),
    causal: bool,
    window: Window,
) -> (u32, u32) {
    (
        key_range(i1, n_q, n_k, causal, window).0,
        key_range(i0, n_q, n_k, causal, window).1,
    )
}

/// Whether the keys `k0 .. k0 + block` hold one that some row of `i0 ..= i1` may not see: a block
/// across a window edge, the causal diagonal or the key length. Only those need the per-element
/// mask; every other visited block takes the plain path.
#[inline(always)]
pub const fn straddles(
    rows: (u32, u32),
    k0: u32,
    block: u32,
    lens: (u32, u32),
    causal: bool,
    window: Window,
) -> bool {
    let (start, end) = keys_every_row_sees(rows, lens, causal, window);
    k0 + block > end || k0 < start
}

/// The query rows `first .. end` that may see a key of `k0 .. k1` (`k0 < k1`): every row
/// outside sees none of them (rows inside may still see none at the edges). The backward's K/V
/// blocks visit only the Q blocks of these rows.
#[inline(always)]
pub const fn rows_seeing_keys(
    k0: u32,
    k1: u32,
    n_q: u32,
    n_k: u32,
    causal: bool,
    window: Window,
) -> (u32, u32) {
    if k0 >= n_k {
        return (0, 0);
    }
    // Row i's diagonal is i + shift; it sees key j only if j <= i + shift (causal) and
    // j <= i + shift + right, and only keys j >= i + shift − left.
    let shift = n_k as i64 - n_q as i64;
    let mut first = 0i64;
    if causal {
        first = k0 as i64 - shift;
    }
    if window.right != UNBOUNDED {
        let by_right = k0 as i64 - shift - window.right as i64;
        if by_right > first {
            first = by_right;
        }
    }
    let end = if window.left == UNBOUNDED {
        n_q
    } else {
        clamp(k1 as i64 - shift + window.left as i64, n_q)
    };
    (clamp(first, n_q), end)
}

/// The score modifiers of one (call, query head): softcap `c` (0: off) and ALiBi slope (0: off).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ScoreMod<R> {
    pub softcap: R,
    pub slope: R,
}

impl<R: Real + From<f32>> ScoreMod<R> {
    /// The modified score of `s = τ·⟨q_i, k_j⟩` at row `i`, key `j`, and its derivative
    /// `∂s'/∂s` (`1 − tanh²(s / c)` under a softcap, else 1), which the backward multiplies
    /// into dS.
    #[inline(always)]
    pub fn apply(&self, s: R, i: u32, j: u32, n_q: u32, n_k: u32) -> (R, R) {
        let (mut s, mut grad) = (s, R::ONE);
        if self.softcap != R::ZERO {
            let t = tanh(s / self.softcap);
            s = self.softcap * t;
            grad = R::ONE - t * t;
        }
        if self.slope != R::ZERO {
            s = s - self.slope * R::from(distance(i, j, n_q, n_k));
        }
        (s, grad)
    }
}

impl ScoreMod<f32> {
    /// [`apply`](Self::apply) for the tensor-core kernels, whose scores are in base-2 units:
    /// `raw = ⟨q_i, k_j⟩` (unscaled) to the modified score times `log2 e`, with
    /// `scale_log2 = τ · log2 e` and `distance = |i + n_k − n_q − j|`.
    #[inline(always)]
    pub fn apply_log2(&self, raw: f32, scale_log2: f32, distance: f32) -> f32 {
        let mut s = raw * scale_log2;
        if self.softcap != 0.0 {
            // c·tanh(τ·raw / c) · log2 e, with τ·raw = s · ln 2.
            let c_log2 = self.softcap * core::f32::consts::LOG2_E;
            s = c_log2 * tanh(s / c_log2);
        }
        s - self.slope * core::f32::consts::LOG2_E * distance
    }

    /// `∂s'/∂s` of [`apply_log2`](Self::apply_log2) at the same `raw`: `1 − tanh²` under a
    /// softcap, else 1.
    #[inline(always)]
    pub fn grad_log2(&self, raw: f32, scale_log2: f32) -> f32 {
        if self.softcap == 0.0 {
            return 1.0;
        }
        let c_log2 = self.softcap * core::f32::consts::LOG2_E;
        let t = tanh(raw * scale_log2 / c_log2);
        1.0 - t * t
    }
}

impl ScoreMod<f32> {
    /// The softcap's `∂s'/∂s = 1 − tanh²` recovered from the probability `p = 2^(s'·log2 e −
    /// lse_log2)` the backward already holds (keeping `tanh` would hold a register per score
    /// across its products): `log2 p + lse_log2` is the modified score in base-2 units, which
    /// plus ALiBi's bias is `c·log2 e·tanh`. Clamped, so that a `p` that underflowed to 0 gives 0,
    /// not NaN. 1 without a softcap.
    #[inline(always)]
    pub fn grad_from_p(&self, p: f32, lse_log2: f32, distance: f32) -> f32 {
        if self.softcap == 0.0 {
            return 1.0;
        }
        let c_log2 = self.softcap * core::f32::consts::LOG2_E;
        let bias = self.slope * core::f32::consts::LOG2_E * distance;
        let t = ((p.ln() * core::f32::consts::LOG2_E + lse_log2 + bias) / c_log2).clamp(-1.0, 1.0);
        1.0 - t * t
    }
}

/// `|i + n_k − n_q − j|`, ALiBi's distance of row `i` from key `j`, as f32.
#[inline(always)]
pub fn distance(i: u32, j: u32, n_q: u32, n_k: u32) -> f32 {
    (i as i64 + n_k as i64 - n_q as i64 - j as i64).unsigned_abs() as f32
}

/// `tanh x` from `exp` (the device has no accurate `tanh`): `(1 − e) / (1 + e)` with
/// `e = exp(−2|x|)`, signed; `tanh(±∞) = ±1`, `tanh(NaN) = NaN`.
#[inline(always)]
pub fn tanh<R: Real + From<f32>>(x: R) -> R {
    let negative = x < R::ZERO;
    let ax = if negative { R::ZERO - x } else { x };
    let e = (R::from(-2.0) * ax).exp();
    let t = (R::ONE - e) / (R::ONE + e);
    if negative { R::ZERO - t } else { t }
}

/// `(LSE, factor)` of a row whose allowed keys gave the running maximum `m` and sum
/// `ℓ = Σ e^{s_j − m}`, with the sink logit `sink` joining the denominator: the row's
/// `LSE = ln(ℓ e^m + e^sink)`, and `factor = 1 / (ℓ + e^{sink − m})` by which the unnormalised
/// output is multiplied. A row with no allowed key (`ℓ = 0`) gets `LSE = sink`, factor 0 (O = 0);
/// a NaN row stays NaN.
#[inline(always)]
pub fn with_sink<R: Real + From<f32>>(m: R, l: R, sink: R) -> (R, R) {
    if l == R::ZERO {
        return (sink, R::ZERO);
    }
    let top = if sink > m { sink } else { m };
    // ℓ e^m + e^sink = e^top (ℓ e^{m − top} + e^{sink − top}), each exponent ≤ 0.
    let scaled = l * (m - top).exp() + (sink - top).exp();
    (top + scaled.ln(), (m - top).exp() / scaled)
}

/// `dσ_h = −Σ_rows e^{σ_h − LSE} · D` over rows `0 .. batch · n_q` of one head, by one warp
/// (every lane calls it; lane 0's result is the sum): `lse_d(b, i)` reads row i of batch item b's
/// natural-log LSE and `D = rowsum(dO ∘ O)`. A fixed order of addition, so every run gives the
/// same bits.
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn sink_gradient(
    sink: f32,
    batch: u32,
    n_q: u32,
    lse_d: impl Fn(u32, u32) -> (f32, f32),
) -> f32 {
    let lane = crate::arch::thread_x() % 32;
    let mut acc = 0.0f32;
    for b in 0..batch {
        let mut i = lane;
        while i < n_q {
            let (lse, d) = lse_d(b, i);
            acc -= (sink - lse).exp() * d;
            i += 32;
        }
    }
    crate::arch::warp_sum(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::shape::allowed_key_end;

    /// The window is the row's diagonal ± extents cut to the keys and the causal mask.
    #[test]
    fn key_range_follows_the_aligned_diagonal() {
        let w = |left, right| Window { left, right };
        // n_q = n_k = 6: row 3 with (1, 1) sees keys 2..=4.
        assert_eq!(key_range(3, 6, 6, false, w(1, 1)), (2, 5));
        assert_eq!(key_range(3, 6, 6, true, w(1, 1)), (2, 4));
        assert_eq!(key_range(0, 6, 6, false, w(0, 0)), (0, 1));
        assert_eq!(key_range(5, 6, 6, false, w(0, 0)), (5, 6));
        // Bottom-right aligned: n_q = 2, n_k = 5: row 0's diagonal is key 3.
        assert_eq!(key_range(0, 2, 5, false, w(1, 0)), (2, 4));
        assert_eq!(key_range(1, 2, 5, true, w(2, UNBOUNDED)), (2, 5));
        // n_q > n_k: rows above the diagonal see nothing with (0, 0).
        let (s, e) = key_range(0, 5, 2, false, w(0, 0));
        assert!(s >= e);
        // Larger than the sequence: the same as no window.
        for i in 0..7 {
            for causal in [false, true] {
                assert_eq!(
                    key_range(i, 7, 4, causal, w(100, 100)),
                    key_range(i, 7, 4, causal, Window::NONE)
                );
                assert_eq!(
                    key_range(i, 7, 4, causal, Window::NONE),
                    (0, allowed_key_end(i, 7, 4, causal))
                );
            }
        }
    }

    /// Both ends of the range grow with the row, which the block skipping relies on.
    #[test]
    fn key_range_ends_grow_with_the_row() {
        for (n_q, n_k) in [(9, 9), (3, 17), (17, 3)] {
            for causal in [false, true] {
                for (left, right) in [(0, 0), (2, 5), (UNBOUNDED, 1), (4, UNBOUNDED)] {
                    let window = Window { left, right };
                    for i in 1..n_q {
                        let (a, b) = (
                            key_range(i - 1, n_q, n_k, causal, window),
                            key_range(i, n_q, n_k, causal, window),
                        );
                        assert!(
                            a.0 <= b.0 && a.1 <= b.1,
                            "{n_q} {n_k} {causal} {window:?} {i}"
                        );
                    }
                }
            }
        }
    }

    /// Every row that sees a key of the range is inside `rows_seeing_keys`.
    #[test]
    fn rows_seeing_keys_covers_every_row_that_does() {
        for (n_q, n_k) in [(9, 9), (3, 17), (17, 3), (40, 40)] {
            for causal in [false, true] {
                for (left, right) in [
                    (0, 0),
                    (2, 5),
                    (UNBOUNDED, 1),
                    (4, UNBOUNDED),
                    (UNBOUNDED, UNBOUNDED),
                ] {
                    let window = Window { left, right };
                    for k0 in 0..n_k {
                        for k1 in k0 + 1..=n_k {
                            let (first, end) = rows_seeing_keys(k0, k1, n_q, n_k, causal, window);
                            for i in 0..n_q {
                                let (a, b) = key_range(i, n_q, n_k, causal, window);
                                let sees = a.max(k0) < b.min(k1);
                                assert!(
                                    !sees || (first <= i && i < end),
                                    "{n_q} {n_k} {causal} {window:?} keys {k0}..{k1} row {i}"
                                );
                            }
                            // Tight at both ends for these windows: the first and last rows
                            // of the range see a key of it, or the range is empty.
                            if first < end {
                                for i in [first, end - 1] {
                                    let (a, b) = key_range(i, n_q, n_k, causal, window);
                                    assert!(
                                        a.max(k0) < b.min(k1) || a >= b,
                                        "{n_q} {n_k} {causal} {window:?} keys {k0}..{k1} row {i}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn softcap_and_alibi_by_hand() {
        let m = ScoreMod::<f64> {
            softcap: 2.0,
            slope: 0.5,
        };
        // s = 1, c = 2: 2·tanh(0.5) = 0.924234314…; row 3, key 1 of 4 × 4: bias −0.5·2.
        let (s, g) = m.apply(1.0, 3, 1, 4, 4);
        assert!((s - (0.924_234_314_520_019_5 - 1.0)).abs() < 1e-9, "{s}");
        assert!(
            (g - (1.0 - 0.462_117_157_260_009_8f64.powi(2))).abs() < 1e-9,
            "{g}"
        );
        let (s, g) = ScoreMod::<f64>::default().apply(1.5, 0, 3, 4, 4);
        assert_eq!((s, g), (1.5, 1.0));
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(f32::NEG_INFINITY), -1.0);
        assert!(tanh(f32::NAN).is_nan());
        for x in [-3.0f64, -0.1, 1e-6, 0.7, 20.0] {
            assert!((tanh(x) - x.tanh()).abs() < 1e-15, "{x}");
        }
    }

    /// The base-2 form is the natural one times `log2 e`.
    #[test]
    fn log2_form_matches() {
        let m = ScoreMod::<f32> {
            softcap: 2.5,
            slope: 0.25,
        };
        let (tau, raw) = (0.3f32, 4.0f32);
        let (natural, grad) = m.apply(tau * raw, 5, 2, 6, 6);
        let base2 = m.apply_log2(raw, tau * core::f32::consts::LOG2_E, distance(5, 2, 6, 6));
        assert!((base2 - natural * core::f32::consts::LOG2_E).abs() < 1e-5);
        let g = m.grad_log2(raw, tau * core::f32::consts::LOG2_E);
        assert!((g - grad).abs() < 1e-6);
    }

    /// The gradient recovered from P is the one computed from the score.
    #[test]
    fn grad_from_p_matches_the_scores() {
        let m = ScoreMod::<f32> {
            softcap: 3.0,
            slope: 0.125,
        };
        let scale_log2 = 0.125 * core::f32::consts::LOG2_E;
        let lse_log2 = 5.5f32;
        for raw in [-30.0f32, -4.0, 0.5, 9.0, 40.0] {
            let dist = 3.0;
            let p = (m.apply_log2(raw, scale_log2, dist) - lse_log2).exp2();
            let want = m.grad_log2(raw, scale_log2);
            assert!(
                (m.grad_from_p(p, lse_log2, dist) - want).abs() < 1e-4,
                "{raw}"
            );
        }
        assert_eq!(m.grad_from_p(0.0, lse_log2, 1.0), 0.0);
        assert_eq!(ScoreMod::<f32>::default().grad_from_p(0.3, 1.0, 2.0), 1.0);
    }

    #[test]
    fn sink_joins_the_denominator() {
        // Scores {0, ln 2} (m = ln 2, ℓ = 1.5) and sink ln 3: LSE = ln(1 + 2 + 3) = ln 6.
        let (lse, f) = with_sink(2f64.ln(), 1.5, 3f64.ln());
        assert!((lse - 6f64.ln()).abs() < 1e-12);
        // O = Σ e^{s − m} v · factor must equal Σ e^{s} v / 6: factor = e^m / 6 = 1/3.
        assert!((f - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(with_sink(f64::NEG_INFINITY, 0.0, 0.25), (0.25, 0.0));
        assert!(with_sink(f32::NAN, f32::NAN, 1.0).0.is_nan());
    }
}
