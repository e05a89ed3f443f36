//! Criterion benches of the plan's kernels (the fastest family this device runs) on the running
//! fixture (B=1, N=4096, H=32, d=128, bf16), causal and not: `forward_into` / `backward_into`
//! into buffers allocated once, and `flash_attn::forward` as a user calls it (allocation, launch,
//! wait). Each iteration batch is timed on the GPU with CUDA events around back-to-back calls
//! (`iter_custom`). Prints a SKIP line
//! and registers nothing where no CUDA device answers. The evidence bundles of `flash-attn bench`
//! remain the recorded measurements; this is for local comparisons with criterion's statistics.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use flash_attn::timing::time_calls;
use flash_attn::{
    AttentionOptions, BackwardInputs, DType, DeviceTensor, Direction, FlashOptions, Gpu,
    GradientBuffers, Workspace,
};
use flash_attn_testkit::bench::{backward_flops, forward_flops, running_fixture};
use flash_attn_testkit::inputs::uniform;

/// GPU time of `iters` back-to-back calls.
fn gpu_time(gpu: &Gpu, iters: u64, mut call: impl FnMut() -> flash_attn::Result<()>) -> Duration {
    let ms = time_calls(gpu, 0, 1, || (0..iters).try_for_each(|_| call())).expect("kernel launch");
    Duration::from_secs_f64(ms[0] as f64 * 1e-3)
}

fn kernels(c: &mut Criterion) {
    let Some(gpu) = flash_attn_testkit::testing::gpu_or_skip("benches/kernels") else {
        return;
    };
    let shape = running_fixture();
    let dtype = DType::Bf16;
    let upload = |seed, len| DeviceTensor::from_f32(dtype, &uniform(seed, len)).expect("upload");
    let (q, k, v, d_o) = (
        upload(1, shape.q_elems()),
        upload(2, shape.k_elems()),
        upload(3, shape.v_elems()),
        upload(4, shape.q_elems()),
    );
    // Throughput counts FLOPs (the anchors' count) as elements: criterion's Gelem/s are GFLOP/s.
    let mut group = c.benchmark_group("bf16_fixture");
    group.sample_size(20);
    for causal in [false, true] {
        let options = FlashOptions::new(AttentionOptions::new().causal(causal));
        let fwd = flash_attn::forward(&gpu, &shape, &q, &k, &v, &options).expect("forward");
        group.throughput(Throughput::Elements(forward_flops(&shape, causal) as u64));
        group.bench_function(format!("forward causal={causal}"), |b| {
            b.iter_custom(|iters| {
                gpu_time(&gpu, iters, || {
                    flash_attn::forward_into(&gpu, &shape, &q, &k, &v, &fwd.o, &fwd.lse, &options)
                        .map(drop)
                })
            })
        });
        group.bench_function(format!("forward whole call causal={causal}"), |b| {
            b.iter_custom(|iters| {
                gpu_time(&gpu, iters, || {
                    flash_attn::forward(&gpu, &shape, &q, &k, &v, &options).map(drop)
                })
            })
        });
        let inputs = BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            o: &fwd.o,
            d_o: &d_o,
            lse: &fwd.lse,
        };
        let out = GradientBuffers::poisoned(&shape, dtype).expect("outputs");
        let plan = flash_attn::plan(&gpu, &shape, dtype, &options, Direction::Backward);
        let workspace = Workspace::new(&plan.expect("plan")).expect("workspace");
        group.throughput(Throughput::Elements(backward_flops(&shape, causal) as u64));
        group.bench_function(format!("backward causal={causal}"), |b| {
            b.iter_custom(|iters| {
                gpu_time(&gpu, iters, || {
                    flash_attn::backward_into(&gpu, &shape, &inputs, &out, &workspace, &options)
                        .map(drop)
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
