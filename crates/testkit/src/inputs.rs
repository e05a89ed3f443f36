//! Seeded random inputs: the embedded default input of the main job and the tests' fresh inputs.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// `len` values uniform in `[-1, 1)` from `seed` (never all zeros; the same seed gives the same values).
pub fn uniform(seed: u64, len: usize) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen_range(-1.0f32..1.0)).collect()
}
