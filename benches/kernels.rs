//! Criterion benches of the tensor-core kernels on the running fixture (B=1, N=4096, H=32, d=128,
//! bf16), causal and not. Each iteration batch is timed on the GPU with CUDA events around the
//! launches (`iter_custom`), so host launch overhead between batches stays out. Prints a SKIP line
//! and registers nothing where no CUDA device answers. The evidence bundles of `flash-attn bench`
//! remain the recorded measurements; this is for local comparisons with criterion's statistics.

use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use flash_attn::tensor_core::{tensor_core_forward, tensor_core_forward_into};
use flash_attn::tensor_core_backward::{
    BackwardInputs, BackwardOutput, BackwardWorkspace, tensor_core_backward_into,
};
use flash_attn::timing::time_calls;
use flash_attn::{AttentionOptions, DType, DeviceTensor, Gpu};
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
        upload(2, shape.kv_elems()),
        upload(3, shape.kv_elems()),
        upload(4, shape.q_elems()),
    );
    // Throughput counts FLOPs (the anchors' count) as elements: criterion's Gelem/s are GFLOP/s.
    let mut group = c.benchmark_group("tensor_core_bf16_fixture");
    group.sample_size(20);
    for causal in [false, true] {
        let options = AttentionOptions::new().causal(causal);
        let fwd = tensor_core_forward(&gpu, &shape, &q, &k, &v, &options).expect("forward");
        group.throughput(Throughput::Elements(forward_flops(&shape, causal) as u64));
        group.bench_function(format!("forward causal={causal}"), |b| {
            b.iter_custom(|iters| {
                gpu_time(&gpu, iters, || {
                    tensor_core_forward_into(&gpu, &shape, &q, &k, &v, &fwd, &options)
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
        let out = BackwardOutput::poisoned(&shape, dtype).expect("outputs");
        let workspace = BackwardWorkspace::new(&shape).expect("workspace");
        group.throughput(Throughput::Elements(backward_flops(&shape, causal) as u64));
        group.bench_function(format!("backward causal={causal}"), |b| {
            b.iter_custom(|iters| {
                gpu_time(&gpu, iters, || {
                    tensor_core_backward_into(&gpu, &shape, &inputs, &out, &workspace, &options)
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
