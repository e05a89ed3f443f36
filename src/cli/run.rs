//! `flash-attn run`: the main job. On a GPU, the materialized baseline on the article's running
//! fixture, checked on sampled rows against an f64 CPU computation, with its time and memory.
//! Without a GPU, says so and runs the CPU path on a small embedded input.

use clap::Args;
use flash_attn::inputs::uniform;
use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::reference::forward_f32;
use flash_attn::sampled_rows::check_rows;
use flash_attn::timing::{median, time_calls};
use flash_attn::{AttentionError, AttentionOptions, AttentionShape, DType, DeviceTensor, Gpu};

use super::CliResult;

/// Seed of the embedded default input.
const DEFAULT_SEED: u64 = 0x02B;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Sequence length N (queries and keys).
    #[arg(long, default_value_t = 4096)]
    seq_len: u32,
    /// Batch size B.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Heads H.
    #[arg(long, default_value_t = 32)]
    heads: u32,
    /// Head dimension d.
    #[arg(long, default_value_t = 128)]
    head_dim: u32,
    /// Storage dtype: f32, f16 or bf16.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// Causal mask.
    #[arg(long)]
    causal: bool,
    /// Timed samples (CUDA events, after 2 warm-up calls).
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Seed of the random input.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
}

pub fn run(args: &RunArgs) -> CliResult {
    let options = AttentionOptions::new().causal(args.causal);
    match flash_attn::gpu() {
        Ok(gpu) => {
            let shape = AttentionShape {
                batch: args.batch,
                n_q: args.seq_len,
                n_k: args.seq_len,
                heads_q: args.heads,
                heads_kv: args.heads,
                head_dim: args.head_dim,
            };
            run_gpu(&gpu, &shape, args, &options)
        }
        Err(AttentionError::NoDevice(why)) => {
            println!(
                "no CUDA device answered ({why}); running the CPU path on a small embedded input"
            );
            run_cpu(&options, args.seed)
        }
        Err(e) => Err(e.into()),
    }
}

fn run_gpu(
    gpu: &Gpu,
    shape: &AttentionShape,
    args: &RunArgs,
    options: &AttentionOptions,
) -> CliResult {
    let dtype = args.dtype;
    println!("device: {}", gpu.device_name());
    println!(
        "fixture: B={} N={} H={} d={} {dtype}{}",
        shape.batch,
        shape.n_q,
        shape.heads_q,
        shape.head_dim,
        if options.causal { " causal" } else { "" }
    );
    let host: Vec<Vec<f32>> = (0..3)
        .map(|t| {
            let len = if t == 0 {
                shape.q_elems()
            } else {
                shape.kv_elems()
            };
            uniform(args.seed + t as u64, len)
                .into_iter()
                .map(|x| dtype.round(x))
                .collect()
        })
        .collect();
    let (q, k, v) = (
        DeviceTensor::from_f32(dtype, &host[0])?,
        DeviceTensor::from_f32(dtype, &host[1])?,
        DeviceTensor::from_f32(dtype, &host[2])?,
    );
    let (free_before, total) = gpu.memory_info()?;
    let workspace = MaterializedWorkspace::new(shape, dtype)?;
    let o = DeviceTensor::poisoned(dtype, shape.q_elems())?;
    let (free_during, _) = gpu.memory_info()?;

    let samples = time_calls(gpu, 2, args.samples, || {
        materialized_forward(gpu, &workspace, &q, &k, &v, &o, options)
    })?;
    let ms = median(&samples);
    let causal_factor = if options.causal { 0.5 } else { 1.0 };
    let flops = 4.0
        * shape.batch as f64
        * shape.heads_q as f64
        * (shape.n_q as f64)
        * (shape.n_k as f64)
        * shape.head_dim as f64
        * causal_factor;
    println!(
        "materialized baseline (3 stages, S and P in HBM): median {ms:.3} ms over {} samples (min {:.3}), {:.1} TFLOP/s",
        samples.len(),
        samples.iter().copied().fold(f32::INFINITY, f32::min),
        flops / (ms as f64 * 1e-3) / 1e12
    );
    let gib = |b: usize| b as f64 / (1u64 << 30) as f64;
    println!(
        "memory: S+P workspace {:.3} GiB; device memory in use {:.3} GiB before the call's buffers, {:.3} GiB with them (of {:.1} GiB)",
        gib(workspace.size_bytes()),
        gib(total - free_before),
        gib(total - free_during),
        gib(total)
    );

    let out = o.to_f32()?;
    let unwritten = out.iter().filter(|x| x.is_nan()).count();
    let rows = sample_rows(shape);
    let err = check_rows(shape, options, (&host[0], &host[1], &host[2]), &out, &rows)?;
    // S and P are stored in the working dtype, so each probability carries that dtype's rounding.
    let tolerance = match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 5e-3,
        DType::Bf16 => 2e-2,
    };
    println!(
        "check: {} sampled rows against f64 on the CPU: relative error {err:.3e} (tolerance {tolerance:.0e}); {unwritten} unwritten (NaN) outputs",
        rows.len()
    );
    if unwritten > 0 || err.is_nan() || err > tolerance {
        return Err(format!(
            "GPU output failed the CPU check (relative error {err:.3e}, {unwritten} unwritten)"
        )
        .into());
    }
    println!("ok");
    Ok(())
}

/// Rows spread over batch, heads and positions, including the first and the last row.
fn sample_rows(shape: &AttentionShape) -> Vec<(u32, u32, u32)> {
    let n = shape.n_q;
    let positions = [0, 1, n / 3, n / 2, n - 2, n - 1];
    let mut rows = Vec::new();
    for (t, &i) in positions.iter().enumerate() {
        let b = t as u32 % shape.batch;
        let h = (t as u32 * 7) % shape.heads_q;
        rows.push((b, h, i.min(n - 1)));
    }
    rows.dedup();
    rows
}

/// The CPU path: the f64 reference on a small embedded input.
fn run_cpu(options: &AttentionOptions, seed: u64) -> CliResult {
    let shape = AttentionShape {
        batch: 1,
        n_q: 128,
        n_k: 128,
        heads_q: 2,
        heads_kv: 2,
        head_dim: 32,
    };
    let q = uniform(seed, shape.q_elems());
    let k = uniform(seed + 1, shape.kv_elems());
    let v = uniform(seed + 2, shape.kv_elems());
    let out = forward_f32(&shape, &q, &k, &v, options)?;
    let checksum: f64 = out.o.iter().sum();
    let largest = out.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let lse_range = out
        .lse
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    println!(
        "CPU path: f64 reference, B=1 N={} H={} d={}{}: O sum {checksum:.9}, max |O| {largest:.6}, LSE in [{:.6}, {:.6}]",
        shape.n_q,
        shape.heads_q,
        shape.head_dim,
        if options.causal { " causal" } else { "" },
        lse_range.0,
        lse_range.1
    );
    Ok(())
}
