//! Random inputs and comparisons for the reference's tests.

use attention_kernels::abi::shape::AttentionShape;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Q, K, V and dO of `shape`, uniform in `[-1, 1)`, from `seed`.
pub struct Inputs {
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
    pub d_o: Vec<f64>,
}

pub fn inputs(shape: &AttentionShape, seed: u64) -> Inputs {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut draw = |n: usize| {
        (0..n)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect::<Vec<f64>>()
    };
    Inputs {
        q: draw(shape.q_elems()),
        k: draw(shape.k_elems()),
        v: draw(shape.v_elems()),
        d_o: draw(shape.o_elems()),
    }
}
