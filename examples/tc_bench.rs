//! Times the tensor-core forward on the anchor shapes of `shared/anchors/sdpa_h200_2026-11-29.md`
//! (PyTorch SDPA on one H200) and prints TFLOP/s next to the peers' numbers, then compares the
//! compiled tile variants (`sm80::forward::VARIANTS`, and `sm90::VARIANTS` on an H100/H200) on
//! the long-sequence shapes. The main table times this device's default kernel.
//!
//! Each measurement: random inputs (never zeros), 5 warm-up launches, then 30 launches each timed
//! with a pair of CUDA events; the median is reported. FLOPs = 4·B·H·N²·d, halved when causal.

use attention_kernels::kernels::{sm80, sm90};
use flash_attn::timing::{median, time_calls};
use flash_attn::{
    AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, FlashOptions, Gpu, Plan,
    Tiles,
};
use flash_attn_testkit::bench::forward_flops;
use rand::{Rng, SeedableRng};

const WARMUP: usize = 5;
const SAMPLES: usize = 30;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One timed shape, with PyTorch's flash and cuDNN forward rates (TFLOP/s, bf16) where the anchor
/// file has them.
#[derive(Clone, Copy)]
struct Anchor {
    batch: u32,
    heads: u32,
    n: u32,
    head_dim: u32,
    causal: bool,
    dtype: DType,
    flash: Option<f64>,
    cudnn: Option<f64>,
}

const SHAPES: &[Anchor] = &[
    Anchor {
        batch: 1,
        heads: 32,
        n: 4096,
        head_dim: 128,
        causal: false,
        dtype: DType::Bf16,
        flash: Some(345.0),
        cudnn: Some(620.0),
    },
    Anchor {
        batch: 1,
        heads: 32,
        n: 4096,
        head_dim: 128,
        causal: false,
        dtype: DType::F16,
        flash: None,
        cudnn: None,
    },
    Anchor {
        batch: 1,
        heads: 32,
        n: 4096,
        head_dim: 128,
        causal: true,
        dtype: DType::Bf16,
        flash: None,
        cudnn: None,
    },
    Anchor {
        batch: 4,
        heads: 16,
        n: 4096,
        head_dim: 128,
        causal: false,
        dtype: DType::Bf16,
        flash: Some(340.0),
        cudnn: Some(648.0),
    },
    Anchor {
        batch: 4,
        heads: 16,
        n: 4096,
        head_dim: 128,
        causal: true,
        dtype: DType::Bf16,
        flash: Some(296.0),
        cudnn: Some(566.0),
    },
    Anchor {
        batch: 16,
        heads: 16,
        n: 1024,
        head_dim: 128,
        causal: false,
        dtype: DType::Bf16,
        flash: Some(310.0),
        cudnn: Some(539.0),
    },
    Anchor {
        batch: 16,
        heads: 16,
        n: 1024,
        head_dim: 128,
        causal: true,
        dtype: DType::Bf16,
        flash: Some(226.0),
        cudnn: Some(369.0),
    },
    Anchor {
        batch: 4,
        heads: 32,
        n: 4096,
        head_dim: 64,
        causal: false,
        dtype: DType::Bf16,
        flash: Some(293.0),
        cudnn: Some(449.0),
    },
    Anchor {
        batch: 4,
        heads: 32,
        n: 4096,
        head_dim: 64,
        causal: true,
        dtype: DType::Bf16,
        flash: Some(272.0),
        cudnn: Some(408.0),
    },
    Anchor {
        batch: 16,
        heads: 32,
        n: 1024,
        head_dim: 64,
        causal: false,
        dtype: DType::Bf16,
        flash: Some(277.0),
        cudnn: Some(398.0),
    },
    Anchor {
        batch: 16,
        heads: 32,
        n: 1024,
        head_dim: 64,
        causal: true,
        dtype: DType::Bf16,
        flash: Some(204.0),
        cudnn: Some(297.0),
    },
];

/// Indices into `SHAPES` on which every variant is timed.
const VARIANT_SHAPES: &[usize] = &[0, 4, 7, 8, 9, 10];

struct Inputs {
    shape: AttentionShape,
    q: DeviceTensor,
    k: DeviceTensor,
    v: DeviceTensor,
    o: DeviceTensor,
    lse: DeviceF32,
}

fn inputs(
    rng: &mut impl Rng,
    batch: u32,
    heads: u32,
    n: u32,
    head_dim: u32,
    dtype: DType,
) -> Result<Inputs> {
    let shape = AttentionShape {
        batch,
        n_q: n,
        n_k: n,
        heads_q: heads,
        heads_kv: heads,
        head_dim,
        head_dim_v: head_dim,
    };
    let mut draw =
        |len: usize| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-2.0f32..2.0)).collect() };
    Ok(Inputs {
        q: DeviceTensor::from_f32(dtype, &draw(shape.q_elems()))?,
        k: DeviceTensor::from_f32(dtype, &draw(shape.k_elems()))?,
        v: DeviceTensor::from_f32(dtype, &draw(shape.v_elems()))?,
        o: DeviceTensor::poisoned(dtype, shape.o_elems())?,
        lse: DeviceF32::poisoned(shape.row_elems())?,
        shape,
    })
}

/// `(median, min)` milliseconds of one launch of `tiles` (the plan's choice when `None`), and the
/// plan that ran.
fn time(gpu: &Gpu, tiles: Option<Tiles>, x: &Inputs, causal: bool) -> Result<(f64, f64, Plan)> {
    let opts = FlashOptions::new(AttentionOptions::new().causal(causal));
    let mut plan = None;
    let ms = time_calls(gpu, WARMUP, SAMPLES, || {
        let (s, o, l) = (&x.shape, &x.o, &x.lse);
        plan = Some(match tiles {
            None => flash_attn::forward_into(gpu, s, &x.q, &x.k, &x.v, o, l, &opts)?,
            Some(t) => flash_attn::forward_variant_into(gpu, s, t, &x.q, &x.k, &x.v, o, l, &opts)?,
        });
        Ok(())
    })?;
    let plan = plan.expect("time_calls ran the forward");
    if x.o.to_f32()?.iter().any(|v| !v.is_finite()) {
        return Err(format!(
            "non-finite output from {} at {:?} causal={causal}",
            plan.entry, x.shape
        )
        .into());
    }
    let min = ms.iter().copied().fold(f32::INFINITY, f32::min);
    Ok((median(&ms) as f64, min as f64, plan))
}

fn tflops(batch: u32, heads: u32, n: u32, head_dim: u32, causal: bool, ms: f64) -> f64 {
    let shape = AttentionShape {
        batch,
        n_q: n,
        n_k: n,
        heads_q: heads,
        heads_kv: heads,
        head_dim,
        head_dim_v: head_dim,
    };
    forward_flops(&shape, causal) / (ms * 1e-3) / 1e12
}

fn main() -> Result<()> {
    let gpu = match flash_attn::gpu() {
        Ok(gpu) => gpu,
        Err(flash_attn::AttentionError::NoDevice(why)) => {
            println!("SKIP tc_bench: no CUDA device answered ({why})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("device: {} (wgmma: {})", gpu.device_name(), gpu.has_wgmma());
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::thread_rng().r#gen());
    let fmt = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.0}"));
    let mut table = Vec::new();
    let mut variants = Vec::new();
    for (i, a) in SHAPES.iter().enumerate() {
        let Anchor {
            batch,
            heads,
            n,
            head_dim,
            causal,
            dtype,
            flash,
            cudnn,
        } = *a;
        let x = inputs(&mut rng, batch, heads, n, head_dim, dtype)?;
        let (median, min, _) = time(&gpu, None, &x, causal)?;
        let rate = tflops(batch, heads, n, head_dim, causal, median);
        table.push(format!(
            "| {batch} | {heads} | {n} | {head_dim} | {causal} | {dtype} | {median:.3} | {min:.3} | {rate:.0} | {} | {} |",
            fmt(flash),
            fmt(cudnn)
        ));
        if VARIANT_SHAPES.contains(&i) {
            let mut kernels: Vec<Tiles> = sm80::forward::VARIANTS
                .iter()
                .copied()
                .filter(|c| c.head_dim == head_dim)
                .map(Tiles::Sm80Forward)
                .collect();
            if gpu.has_wgmma() {
                kernels.extend(
                    sm90::VARIANTS
                        .iter()
                        .copied()
                        .filter(|c| c.head_dim == head_dim)
                        .map(Tiles::Sm90Forward),
                );
            }
            for tiles in kernels {
                let (median, _, plan) = time(&gpu, Some(tiles), &x, causal)?;
                let rate = tflops(batch, heads, n, head_dim, causal, median);
                variants.push(format!(
                    "| {batch} | {heads} | {n} | {head_dim} | {causal} | {} | {median:.3} | {rate:.0} |",
                    plan.entry
                ));
            }
        }
    }
    println!(
        "torch flash, cuDNN: TFLOP/s of PyTorch SDPA on one H200 from the anchors file \
         (shared/anchors/sdpa_h200_2026-11-29.md), not timed in this run: not a same-run comparison\n"
    );
    println!(
        "| B | H | N | d | causal | dtype | median ms | min ms | TFLOP/s | torch flash (anchors) | cuDNN (anchors) |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    table.iter().for_each(|row| println!("{row}"));
    println!("\nvariants (bf16):");
    println!("| B | H | N | d | causal | kernel | median ms | TFLOP/s |");
    println!("|---|---|---|---|---|---|---|---|");
    variants.iter().for_each(|row| println!("{row}"));
    Ok(())
}
