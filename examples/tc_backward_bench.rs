//! Times the tensor-core backward (preprocess + main kernel + dQ conversion) on the anchor shapes
//! of `shared/anchors/sdpa_h200_2026-11-29.md` (PyTorch SDPA on one H200): bf16, d = 64 and 128,
//! N = 512 … 16384 with B = 16384 / N and H = 2048 / d, causal and not; and prints TFLOP/s next to
//! the anchors' flash and cuDNN backward numbers.
//!
//! FLOPs as the anchors count them: 2.5 × 4·B·H·N²·d, halved when causal. O and LSE come from the
//! tensor-core forward on random inputs (never zeros). Each shape: 5 warm-up calls, then 20
//! CUDA-event-timed calls; the median is reported. Every B·N·H·d here is the same, so one set of
//! input buffers serves all shapes of a head dimension. At N = 4096 every compiled configuration
//! (`sm80::backward::VARIANTS`) is timed too.

use attention_kernels::kernels::{sm80, sm90};
use flash_attn::timing::{median, time_calls};
use flash_attn::{
    AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceF32, DeviceTensor, Direction,
    FlashOptions, Gpu, GradientBuffers, Plan, Tiles, Workspace,
};
use rand::{Rng, SeedableRng};

const WARMUP: usize = 5;
const SAMPLES: usize = 20;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// (N, d, causal, flash bwd, cuDNN bwd) in TFLOP/s from the anchor table.
const ANCHORS: &[(u32, u32, bool, f64, f64)] = &[
    (512, 64, false, 142.0, 217.0),
    (512, 64, true, 93.0, 135.0),
    (1024, 64, false, 192.0, 310.0),
    (1024, 64, true, 140.0, 203.0),
    (2048, 64, false, 234.0, 385.0),
    (2048, 64, true, 179.0, 292.0),
    (4096, 64, false, 256.0, 410.0),
    (4096, 64, true, 216.0, 349.0),
    (8192, 64, false, 273.0, 432.0),
    (8192, 64, true, 245.0, 391.0),
    (16384, 64, false, 282.0, 442.0),
    (16384, 64, true, 264.0, 424.0),
    (512, 128, false, 162.0, 297.0),
    (512, 128, true, 106.0, 165.0),
    (1024, 128, false, 211.0, 370.0),
    (1024, 128, true, 156.0, 268.0),
    (2048, 128, false, 252.0, 476.0),
    (2048, 128, true, 202.0, 354.0),
    (4096, 128, false, 278.0, 514.0),
    (4096, 128, true, 234.0, 446.0),
    (8192, 128, false, 291.0, 521.0),
    (8192, 128, true, 269.0, 489.0),
    (16384, 128, false, 302.0, 535.0),
    (16384, 128, true, 302.0, 515.0),
];

fn backward_tflops(s: &AttentionShape, causal: bool, ms: f64) -> f64 {
    let flops =
        2.5 * 4.0 * (s.batch * s.heads_q) as f64 * (s.n_q as f64).powi(2) * s.head_dim as f64
            / if causal { 2.0 } else { 1.0 };
    flops / (ms * 1e-3) / 1e12
}

/// Median milliseconds of one backward with `tiles` (the plan's choice when `None`), after
/// checking that it wrote finite gradients, and the plan that ran.
fn time(
    gpu: &Gpu,
    tiles: Option<Tiles>,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    opts: &FlashOptions,
) -> Result<(f64, Plan)> {
    let out = GradientBuffers::poisoned(shape, inputs.q.dtype())?;
    let plan = flash_attn::plan(gpu, shape, inputs.q.dtype(), opts, Direction::Backward)?;
    let workspace = Workspace::new(&plan)?;
    let mut ran = None;
    let ms = time_calls(gpu, WARMUP, SAMPLES, || {
        ran = Some(match tiles {
            None => flash_attn::backward_into(gpu, shape, inputs, &out, &workspace, opts)?,
            Some(t) => {
                flash_attn::backward_variant_into(gpu, shape, t, inputs, &out, &workspace, opts)?
            }
        });
        Ok(())
    })?;
    let plan = ran.expect("time_calls ran the backward");
    for (name, t) in [("dq", &out.dq), ("dk", &out.dk), ("dv", &out.dv)] {
        if t.to_f32()?.iter().any(|x| !x.is_finite()) {
            return Err(format!("non-finite {name} from {} at {shape:?}", plan.entry).into());
        }
    }
    Ok((median(&ms) as f64, plan))
}

fn main() -> Result<()> {
    let Some(gpu) = flash_attn_testkit::testing::gpu_or_skip("tc_backward_bench") else {
        println!("SKIP tc_backward_bench: no CUDA device");
        return Ok(());
    };
    println!("device: {} (wgmma: {})", gpu.device_name(), gpu.has_wgmma());
    let mut kernels: Vec<Tiles> = sm80::backward::VARIANTS
        .iter()
        .copied()
        .map(Tiles::Sm80Backward)
        .collect();
    if gpu.has_wgmma() {
        kernels.extend(
            sm90::BACKWARD_VARIANTS
                .iter()
                .copied()
                .map(Tiles::Sm90Backward),
        );
    }
    let head_dim_of = |t: &Tiles| match t {
        Tiles::Sm80Backward(c) => c.head_dim,
        Tiles::Sm90Backward(c) => c.head_dim,
        _ => 0,
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::thread_rng().r#gen());
    let dtype = DType::Bf16;
    let elems = 16384 * 2048;
    let mut table = Vec::new();
    let mut variants = Vec::new();
    for head_dim in [64, 128] {
        let mut draw = || -> Result<DeviceTensor> {
            let x: Vec<f32> = (0..elems).map(|_| rng.gen_range(-2.0f32..2.0)).collect();
            Ok(DeviceTensor::from_f32(dtype, &x)?)
        };
        let (q, k, v, d_o) = (draw()?, draw()?, draw()?, draw()?);
        for &(n, d, causal, flash, cudnn) in ANCHORS.iter().filter(|a| a.1 == head_dim) {
            let shape = AttentionShape {
                batch: 16384 / n,
                n_q: n,
                n_k: n,
                heads_q: 2048 / d,
                heads_kv: 2048 / d,
                head_dim: d,
                head_dim_v: d,
            };
            let opts = FlashOptions::new(AttentionOptions::new().causal(causal));
            let o = DeviceTensor::poisoned(dtype, shape.o_elems())?;
            let lse = DeviceF32::poisoned(shape.row_elems())?;
            flash_attn::forward_into(&gpu, &shape, &q, &k, &v, &o, &lse, &opts)?;
            let inputs = BackwardInputs {
                q: &q,
                k: &k,
                v: &v,
                o: &o,
                d_o: &d_o,
                lse: &lse,
            };
            let (med, _) = time(&gpu, None, &shape, &inputs, &opts)?;
            let rate = backward_tflops(&shape, causal, med);
            if n == 4096 {
                for &tiles in kernels.iter().filter(|t| head_dim_of(t) == d) {
                    let (ms, plan) = time(&gpu, Some(tiles), &shape, &inputs, &opts)?;
                    variants.push(format!(
                        "| {n} | {d} | {causal} | {} | {ms:.3} | {:.0} |",
                        plan.entry,
                        backward_tflops(&shape, causal, ms)
                    ));
                }
            }
            let line = format!(
                "| {} | {} | {n} | {d} | {causal} | {med:.3} | {rate:.0} | {flash:.0} | {cudnn:.0} | {:.2} |",
                shape.batch,
                shape.heads_q,
                rate / flash
            );
            println!("{line}");
            table.push(line);
        }
    }
    println!("\nbackward, bf16 (FLOPs = 2.5 × 4·B·H·N²·d, halved when causal):");
    println!("| B | H | N | d | causal | median ms | TFLOP/s | torch flash | cuDNN | × flash |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    table.iter().for_each(|row| println!("{row}"));
    println!("\nvariants (bf16, B = 4, H = 2048 / d):");
    println!("| N | d | causal | kernel | median ms | TFLOP/s |");
    println!("|---|---|---|---|---|---|");
    variants.iter().for_each(|row| println!("{row}"));
    Ok(())
}
