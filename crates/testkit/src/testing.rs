//! Support for tests that need a GPU: they skip, visibly, where no CUDA device answers.

use std::io::Write;

use rand::Rng;

use flash_attn::{AttentionError, AttentionOptions, Family, Gpu, KernelChoice};

/// The GPU, or `None` after printing a `SKIP` line naming `test` when no CUDA device answers.
/// Any other failure (a module that does not load, a driver error) panics: that is a failure, not
/// a reason to skip.
pub fn gpu_or_skip(test: &str) -> Option<Gpu> {
    match flash_attn::gpu() {
        Ok(gpu) => Some(gpu),
        Err(AttentionError::NoDevice(why)) => {
            skip(test, &format!("no CUDA device answered ({why})"));
            None
        }
        Err(e) => panic!("{test}: the GPU runtime failed to start: {e}"),
    }
}

/// The kernel families a GPU test covers: every one, or those `FLASH_ATTN_FAMILIES` names
/// (comma separated; sanitizer runs take one family at a time).
pub fn families() -> Vec<Family> {
    match std::env::var("FLASH_ATTN_FAMILIES") {
        Err(_) => Family::ALL.to_vec(),
        Ok(list) => list
            .split(',')
            .map(|name| match name.parse() {
                Ok(KernelChoice::Only(f)) => f,
                _ => panic!("FLASH_ATTN_FAMILIES: unknown family {name:?}"),
            })
            .collect(),
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

/// Prints `SKIP <test>: <why>` straight to stderr: libtest captures `eprintln!` of passing tests,
/// and a skip must show.
pub fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "SKIP {test}: {why}");
}

/// Whether `out` is the same non-finite value as `reference` (NaN for NaN, the same infinity):
/// the reference's policy for non-finite inputs is exact, so its non-finite positions must be
/// reproduced exactly, and a non-finite `out` where the reference is finite is a failure.
pub fn same_non_finite(out: f32, reference: f64) -> bool {
    if reference.is_nan() {
        out.is_nan()
    } else {
        out as f64 == reference
    }
}

/// `‖out − ref‖ / ‖ref‖` over the positions where the reference is finite; infinity when a
/// position the reference gives non-finite is not the same NaN or infinity in `out`
/// ([`same_non_finite`]), or when `out` is non-finite where the reference is finite. Never NaN,
/// so it can be compared against a bound and combined with [`worst`]. Where the exact result is
/// zero (the reference's RMS below 1e-10, i.e. f64 rounding of an exact 0), the RMS of `out`
/// itself.
///
/// With a single allowed key the softmax is constant, so dQ = dK = 0 exactly, while f32 leaves
/// ~1e-7 of cancellation in `dP − D`; dividing that by the f64 reference's own ~1e-17 measures
/// nothing. An absolute RMS against the same bound is the meaningful check there: inputs are O(1),
/// and a wrong kernel leaves errors of the inputs' order.
pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    squared_sums(out, reference).map_or(f64::INFINITY, relative)
}

/// [`rel_err`] of its [`squared_sums`].
fn relative((diff, norm, finite): (f64, f64, usize)) -> f64 {
    if finite == 0 {
        return 0.0;
    }
    let len = finite as f64;
    if norm / len < 1e-20 {
        (diff / len).sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// `(‖out − ref‖², ‖ref‖², count)` over the positions where the reference is finite; `None` where
/// a non-finite value of either is not matched ([`rel_err`]).
fn squared_sums(out: &[f32], reference: &[f64]) -> Option<(f64, f64, usize)> {
    assert_eq!(out.len(), reference.len());
    let (mut diff, mut norm, mut finite) = (0.0f64, 0.0f64, 0usize);
    for (&o, &r) in out.iter().zip(reference) {
        if !r.is_finite() {
            if !same_non_finite(o, r) {
                return None;
            }
            continue;
        }
        if !o.is_finite() {
            return None;
        }
        diff += (o as f64 - r).powi(2);
        norm += r * r;
        finite += 1;
    }
    Some((diff, norm, finite))
}

/// The resolution of f32 arithmetic on a sum, relative to the norm of its terms' magnitudes: a
/// few units of f32 rounding (2⁻²⁴), several times what the kernels leave on a cancelled sum
/// (`reports/h100/run-bulk-dq-d128/`).
pub const F32_RESOLUTION: f64 = 4.0 / (1u64 << 24) as f64;

/// [`rel_err`] of a gradient whose terms can cancel (dQ, dK), or, where smaller, its error over
/// f32's resolution of the terms: within `bound` when `‖out − ref‖ ≤ bound · ‖ref‖` (or
/// [`rel_err`]'s absolute RMS of an exact zero) or `‖out − ref‖ ≤ F32_RESOLUTION · ‖magnitudes‖`.
/// `magnitudes` holds the same sums over the terms' absolute values
/// (`reference::backward_magnitudes_from_output`). Where the terms cancel (`dP − D`: a row with
/// one visible key has `dS = 0` exactly, and the reference's own value is then the rounding of
/// the stored O) the result is far below its terms, and f32 cannot keep the dtype's relative
/// accuracy of it; a wrong term still leaves an error of the terms' order.
pub fn rel_err_of_sums(out: &[f32], reference: &[f64], magnitudes: &[f64], bound: f64) -> f64 {
    assert_eq!(reference.len(), magnitudes.len());
    let terms = magnitudes
        .iter()
        .filter(|v| v.is_finite())
        .map(|v| v * v)
        .sum::<f64>()
        .sqrt();
    let Some(sums) = squared_sums(out, reference) else {
        return f64::INFINITY;
    };
    let against_result = relative(sums);
    if terms > 0.0 {
        against_result.min(sums.0.sqrt() * bound / (F32_RESOLUTION * terms))
    } else {
        against_result
    }
}

/// Worst absolute LSE error; a row the reference gives non-finite (`−∞`: no allowed key; NaN: a
/// NaN or `+∞` score) must be the same in `out` ([`same_non_finite`]), and anything else
/// non-finite gives infinity. Never NaN.
pub fn lse_err(out: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let mut acc = 0.0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if !r.is_finite() {
            if !same_non_finite(o, r) {
                return f64::INFINITY;
            }
        } else if !o.is_finite() {
            return f64::INFINITY;
        } else {
            acc = worst(acc, (o as f64 - r).abs());
        }
    }
    acc
}

/// The larger of two errors, NaN if either is (`f64::max` returns the other operand and would
/// let a NaN error pass a bound).
pub fn worst(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// The (N_q, N_k) axis of the GPU test matrices: one token, tails on either side, N_q ≠ N_k, an
/// exact tile multiple, several tiles with tails short enough for a sanitizer (333 × 300), and
/// 4097 (one past a power of two).
pub const MATRIX_SIZES: [(u32, u32); 10] = [
    (1, 1),
    (333, 300),
    (17, 97),
    (97, 17),
    (128, 128),
    (1000, 17),
    (17, 1000),
    (4097, 97),
    (97, 4097),
    (1000, 1000),
];

/// The length axis of the GPU test matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LengthMode {
    Full,
    KeyLengths,
    Packed,
}

impl LengthMode {
    pub const ALL: [LengthMode; 3] = [LengthMode::Full, LengthMode::KeyLengths, LengthMode::Packed];

    /// The batch a case of this mode uses: packed sequences need batch 1.
    pub fn batch(self) -> u32 {
        if self == LengthMode::Packed { 1 } else { 2 }
    }

    /// `options` with this mode's lengths for `n_q` rows and `n_k` keys: key lengths give one
    /// item a random prefix of the keys (possibly none) and the other every key; packed gives
    /// three sequences at random cuts (some may be empty).
    pub fn apply(
        self,
        options: AttentionOptions,
        (n_q, n_k): (u32, u32),
        rng: &mut impl Rng,
    ) -> AttentionOptions {
        match self {
            LengthMode::Full => options,
            LengthMode::KeyLengths => options.key_lengths(vec![rng.gen_range(0..=n_k), n_k]),
            LengthMode::Packed => {
                let q = three_sequences(rng, n_q);
                options.packed(q, three_sequences(rng, n_k))
            }
        }
    }
}

/// Three sequences' cumulative offsets over `n` rows (some may be empty).
fn three_sequences(rng: &mut impl Rng, n: u32) -> Vec<u32> {
    let mut cuts = [rng.gen_range(0..=n), rng.gen_range(0..=n)];
    cuts.sort();
    vec![0, cuts[0], cuts[1], n]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_output_fails_against_a_finite_reference() {
        let reference = [1.0, 2.0, 3.0];
        assert_eq!(rel_err(&[1.0, f32::NAN, 3.0], &reference), f64::INFINITY);
        assert_eq!(lse_err(&[1.0, f32::NAN, 3.0], &reference), f64::INFINITY);
        assert_eq!(
            rel_err(&[1.0, f32::INFINITY, 3.0], &reference),
            f64::INFINITY
        );
        assert!(rel_err(&[1.0, 2.0, 3.0], &reference) < 1e-12);
    }

    #[test]
    fn non_finite_positions_must_match_exactly() {
        let reference = [1.0, f64::NAN, f64::NEG_INFINITY, f64::INFINITY];
        let same = [1.0, f32::NAN, f32::NEG_INFINITY, f32::INFINITY];
        assert!(rel_err(&same, &reference) < 1e-12);
        assert_eq!(lse_err(&same, &reference), 0.0);
        // A finite value, or the wrong non-finite one, where the reference is NaN or infinite.
        for bad in [
            [1.0, 0.0, f32::NEG_INFINITY, f32::INFINITY],
            [1.0, f32::NAN, f32::NAN, f32::INFINITY],
            [1.0, f32::NAN, f32::NEG_INFINITY, f32::NAN],
            [1.0, f32::NAN, 0.0, f32::INFINITY],
        ] {
            assert_eq!(rel_err(&bad, &reference), f64::INFINITY, "{bad:?}");
            assert_eq!(lse_err(&bad, &reference), f64::INFINITY, "{bad:?}");
        }
    }

    #[test]
    fn sums_far_below_their_terms_are_measured_against_the_terms() {
        let bound = 2e-3;
        // Well above the floor: rel_err itself, however large the magnitudes.
        let (reference, magnitudes) = ([3.0, -4.0], [300.0, 400.0]);
        let out = [3.003f32, -4.0];
        assert_eq!(
            rel_err_of_sums(&out, &reference, &magnitudes, bound),
            rel_err(&out, &reference)
        );
        // A cancelled sum (‖ref‖ = 5e-4, its terms' magnitudes 5e3): an error of 1e-6 is 2e-3
        // of the result but 1e-6 · bound / (F32_RESOLUTION · 5e3) of the floor; an error of 1%
        // of the terms (a wrong term) is not hidden.
        let reference = [3e-4, -4e-4];
        let magnitudes = [3e3, 4e3];
        let noisy = [3.01e-4f32, -4.0e-4];
        assert!(rel_err(&noisy, &reference) > 1.9e-3);
        let err = rel_err_of_sums(&noisy, &reference, &magnitudes, bound);
        let want = 1e-6 * bound / (F32_RESOLUTION * 5e3);
        assert!((err / want - 1.0).abs() < 1e-4, "{err} {want}");
        assert!(rel_err_of_sums(&[30.0, -4e-4], &reference, &magnitudes, bound) > 1.0);
        assert_eq!(
            rel_err_of_sums(&[f32::NAN, 0.0], &reference, &magnitudes, bound),
            f64::INFINITY
        );
        // No terms at all: rel_err's absolute RMS of an exact zero.
        assert_eq!(
            rel_err_of_sums(&[1e-3, 0.0], &[0.0, 0.0], &[0.0, 0.0], bound),
            rel_err(&[1e-3, 0.0], &[0.0, 0.0])
        );
        // Never above rel_err.
        assert_eq!(
            rel_err_of_sums(&[1e-3, 0.0], &[0.0, 0.0], &[1e-9, 0.0], bound),
            rel_err(&[1e-3, 0.0], &[0.0, 0.0])
        );
    }

    #[test]
    fn worst_keeps_nan() {
        assert!(worst(f64::NAN, 1.0).is_nan());
        assert!(worst(1.0, f64::NAN).is_nan());
        assert_eq!(worst(1.0, 2.0), 2.0);
        // What it replaces: f64::max drops the NaN.
        assert_eq!(f64::NAN.max(1.0), 1.0);
    }
}
