//! Support for tests that need a GPU: they skip, visibly, where no CUDA device answers.

use std::io::Write;

use rand::Rng;

use flash_attn::{AttentionError, AttentionOptions, Gpu};

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

/// `‖out − ref‖ / ‖ref‖`; a non-finite element of `out` gives infinity. Where the exact result is
/// zero (the reference's RMS below 1e-10, i.e. f64 rounding of an exact 0), the RMS of `out`
/// itself.
///
/// With a single allowed key the softmax is constant, so dQ = dK = 0 exactly, while f32 leaves
/// ~1e-7 of cancellation in `dP − D`; dividing that by the f64 reference's own ~1e-17 measures
/// nothing. An absolute RMS against the same bound is the meaningful check there: inputs are O(1),
/// and a wrong kernel leaves errors of the inputs' order.
pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len());
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        diff += (o as f64 - r).powi(2);
        norm += r * r;
    }
    let len = reference.len() as f64;
    if norm / len < 1e-20 {
        (diff / len).sqrt()
    } else {
        (diff / norm).sqrt()
    }
}

/// Worst absolute LSE error; a row the reference gives `−∞` (no allowed key) must be `−∞` too,
/// and anything else non-finite gives infinity.
pub fn lse_err(out: &[f32], reference: &[f64]) -> f64 {
    let mut worst = 0.0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if r == f64::NEG_INFINITY {
            if o != f32::NEG_INFINITY {
                return f64::INFINITY;
            }
        } else if !o.is_finite() {
            return f64::INFINITY;
        } else {
            worst = worst.max((o as f64 - r).abs());
        }
    }
    worst
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
