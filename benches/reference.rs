//! The f64 CPU reference, forward and backward, over a few sizes (causal, GQA).

use attention_host::AttentionShape;
use attention_host::options::AttentionOptions;
use attention_host::reference::{backward, forward};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn random(n: usize, rng: &mut StdRng) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()
}

fn reference(c: &mut Criterion) {
    let mut group = c.benchmark_group("reference");
    group.sample_size(10);
    let options = AttentionOptions::new().causal(true);
    for n in [64u32, 128, 256] {
        let shape = AttentionShape {
            batch: 1,
            n_q: n,
            n_k: n,
            heads_q: 4,
            heads_kv: 2,
            head_dim: 64,
            head_dim_v: 64,
        };
        let mut rng = StdRng::seed_from_u64(n as u64);
        let (q, k, v, d_o) = (
            random(shape.q_elems(), &mut rng),
            random(shape.k_elems(), &mut rng),
            random(shape.v_elems(), &mut rng),
            random(shape.q_elems(), &mut rng),
        );
        group.bench_with_input(BenchmarkId::new("forward", n), &n, |b, _| {
            b.iter(|| forward(&shape, &q, &k, &v, &options).unwrap())
        });
        group.bench_with_input(BenchmarkId::new("backward", n), &n, |b, _| {
            b.iter(|| backward(&shape, &q, &k, &v, &d_o, &options).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, reference);
criterion_main!(benches);
