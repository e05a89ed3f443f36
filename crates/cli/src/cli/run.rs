//! `flash-attn run`: the main job. On a GPU, on the article's running fixture: the materialized
//! baseline, the exact tiled forward and backward, and the tensor-core forward, each timed and
//! checked against the f64 reference. Without a GPU, says so and runs the CPU path on a small
//! embedded input.

use clap::Args;
use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::timing::{median, time_calls};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceF32,
    DeviceTensor, Direction, FlashOptions, Gpu, GradientBuffers, KernelChoice, Workspace, memory,
};
use flash_attn_testkit::bench::{forward_flops, windowed_forward_flops};
use flash_attn_testkit::inputs::uniform;
use flash_attn_testkit::sampled_rows::{check_rows, relative_error};

use super::CliResult;
use super::forward::ScoreModArgs;

/// Seed of the embedded default input.
const DEFAULT_SEED: u64 = 0x02B;
/// Heads of the CPU path's small input.
const CPU_HEADS: u32 = 2;

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
    /// Kernel families to run, comma separated: auto (the one `flash_attn::forward` picks),
    /// exact, sm80, sm90.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    kernel: Vec<KernelChoice>,
    /// Timed samples per kernel (CUDA events, after 2 warm-up calls).
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// Seed of the random input.
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    #[command(flatten)]
    mods: ScoreModArgs,
}

pub fn run(args: &RunArgs) -> CliResult {
    // ALiBi slopes and sinks are per query head: the GPU fixture's heads, or the CPU input's.
    let options = |heads: u32| {
        args.mods
            .apply(AttentionOptions::new().causal(args.causal), heads)
    };
    match flash_attn::gpu() {
        Ok(gpu) => {
            let shape = AttentionShape {
                batch: args.batch,
                n_q: args.seq_len,
                n_k: args.seq_len,
                heads_q: args.heads,
                heads_kv: args.heads,
                head_dim: args.head_dim,
                head_dim_v: args.head_dim,
            };
            run_gpu(&gpu, &shape, args, &options(args.heads))
        }
        Err(AttentionError::NoDevice(why)) => {
            println!(
                "no CUDA device answered ({why}); running the CPU path on a small embedded input"
            );
            run_cpu(&options(CPU_HEADS), args.seed)
        }
        Err(e) => Err(e.into()),
    }
}

/// One line of the main job's table.
struct Stage {
    name: String,
    samples_ms: Vec<f32>,
    flops: f64,
    peak_bytes: usize,
    error: f64,
    checked_on: String,
}

fn run_gpu(
    gpu: &Gpu,
    shape: &AttentionShape,
    args: &RunArgs,
    options: &AttentionOptions,
) -> CliResult {
    let dtype = args.dtype;
    // Refuses shapes the kernels cannot take before any host input is built.
    flash_attn::Problem::new(shape, dtype, &FlashOptions::new(options.clone()))?;
    println!("device: {}", gpu.device_name());
    println!(
        "fixture: B={} N={} H={} d={} {dtype}{}, seed {:#x}",
        shape.batch,
        shape.n_q,
        shape.heads_q,
        shape.head_dim,
        if options.causal { " causal" } else { "" },
        args.seed
    );
    let lens = [
        shape.q_elems(),
        shape.k_elems(),
        shape.v_elems(),
        shape.o_elems(),
    ];
    let host: Vec<Vec<f32>> = lens
        .iter()
        .enumerate()
        .map(|(t, &len)| {
            let raw = uniform(args.seed + t as u64, len);
            raw.into_iter().map(|x| dtype.round(x)).collect()
        })
        .collect();
    let (q_h, k_h, v_h) = (&host[0], &host[1], &host[2]);
    let dev: Vec<DeviceTensor> = host
        .iter()
        .map(|h| DeviceTensor::from_f32(dtype, h))
        .collect::<Result<_, _>>()?;
    let (q, k, v, d_o) = (&dev[0], &dev[1], &dev[2], &dev[3]);
    let rows = sample_rows(shape);
    let mut stages = Vec::new();
    if options.has_score_mods() {
        println!("materialized baseline skipped: it takes scale and causal only");
    } else {
        run_materialized(
            gpu,
            shape,
            args,
            options,
            (q_h, k_h, v_h),
            (q, k, v),
            &rows,
            &mut stages,
        )?;
    }

    for &choice in &args.kernel {
        let flash = FlashOptions::new(options.clone()).kernel(choice);
        time_family(
            gpu,
            shape,
            &flash,
            &host,
            (q, k, v, d_o),
            &rows,
            args.samples,
            &mut stages,
        )?;
    }
    report(&stages, dtype)
}

/// The materialized baseline (S and P in HBM), timed and checked on the sampled rows.
#[allow(clippy::too_many_arguments)]
fn run_materialized(
    gpu: &Gpu,
    shape: &AttentionShape,
    args: &RunArgs,
    options: &AttentionOptions,
    (q_h, k_h, v_h): (&[f32], &[f32], &[f32]),
    (q, k, v): (&DeviceTensor, &DeviceTensor, &DeviceTensor),
    rows: &[(u32, u32, u32)],
    stages: &mut Vec<Stage>,
) -> CliResult {
    let dtype = args.dtype;
    memory::reset_peak();
    let workspace = MaterializedWorkspace::new(shape, dtype)?;
    let o = DeviceTensor::poisoned(dtype, shape.o_elems())?;
    let samples_ms = time_calls(gpu, 2, args.samples, || {
        materialized_forward(gpu, &workspace, q, k, v, &o, options)
    })?;
    let error = check_rows(shape, options, (q_h, k_h, v_h), &o.to_f32()?, rows)?;
    stages.push(Stage {
        name: "materialized forward (S, P in HBM)".into(),
        samples_ms,
        flops: forward_flops(shape, options.causal),
        peak_bytes: memory::peak_bytes(),
        error,
        checked_on: format!("{} sampled rows", rows.len()),
    });
    Ok(())
}

/// The backward of one (batch 0, head 0) plane against the f64 reference of that plane: the
/// whole fixture's reference would take minutes on the CPU, one head takes seconds.
fn check_backward_head(
    shape: &AttentionShape,
    options: &AttentionOptions,
    host: &[Vec<f32>],
    [dq, dk, dv]: [&DeviceTensor; 3],
) -> Result<(f64, String), Box<dyn std::error::Error>> {
    let plane = AttentionShape {
        batch: 1,
        heads_q: 1,
        heads_kv: 1,
        ..*shape
    };
    let d = shape.head_dim as usize;
    let slice = |t: &[f32], heads: u32, n: u32| -> Vec<f32> {
        (0..n as usize)
            .flat_map(|i| t[i * heads as usize * d..][..d].to_vec())
            .collect()
    };
    let (hq, hk) = (shape.heads_q, shape.heads_kv);
    // The plane's one head is head 0: its ALiBi slope and sink.
    let mut options = options.clone();
    for values in [&mut options.alibi_slopes, &mut options.sinks]
        .into_iter()
        .flatten()
    {
        values.truncate(1);
    }
    let options = &options;
    let want = backward_f32(
        &plane,
        &slice(&host[0], hq, shape.n_q),
        &slice(&host[1], hk, shape.n_k),
        &slice(&host[2], hk, shape.n_k),
        &slice(&host[3], hq, shape.n_q),
        options,
    )?;
    let widen = |t: &[f32], heads, n| -> Vec<f64> {
        slice(t, heads, n).iter().map(|&x| x as f64).collect()
    };
    let errors = [
        relative_error(&widen(&dq.to_f32()?, hq, shape.n_q), &want.dq),
        relative_error(&widen(&dk.to_f32()?, hk, shape.n_k), &want.dk),
        relative_error(&widen(&dv.to_f32()?, hk, shape.n_k), &want.dv),
    ];
    let worst = errors.iter().copied().fold(
        0.0,
        |m: f64, e| if e.is_nan() { f64::NAN } else { m.max(e) },
    );
    Ok((
        worst,
        format!(
            "head 0: dQ {:.1e} dK {:.1e} dV {:.1e}",
            errors[0], errors[1], errors[2]
        ),
    ))
}

/// Forward and backward of one kernel family, each timed twice: as a user calls it
/// (`flash_attn::forward` / `backward`: validation, plan, allocation, launch) and launched
/// into buffers allocated once (`forward_into` / `backward_into`: validation, plan, launch).
#[allow(clippy::too_many_arguments)]
fn time_family(
    gpu: &Gpu,
    shape: &AttentionShape,
    flash: &FlashOptions,
    host: &[Vec<f32>],
    (q, k, v, d_o): (&DeviceTensor, &DeviceTensor, &DeviceTensor, &DeviceTensor),
    rows: &[(u32, u32, u32)],
    samples: usize,
    stages: &mut Vec<Stage>,
) -> CliResult {
    let options = &flash.attention;
    let dtype = q.dtype();
    let plan = flash_attn::plan(gpu, shape, dtype, flash, Direction::Forward)?;
    let family = plan.family;
    println!("--kernel {}: forward plan\n{plan}", flash.kernel);
    let rows_note = format!("{} sampled rows", rows.len());
    let fwd_flops = windowed_forward_flops(shape, options);
    let check = |o: &DeviceTensor| {
        check_rows(
            shape,
            options,
            (&host[0], &host[1], &host[2]),
            &o.to_f32()?,
            rows,
        )
    };

    memory::reset_peak();
    let mut forward = None;
    let samples_ms = time_calls(gpu, 2, samples, || {
        forward = Some(flash_attn::forward(gpu, shape, q, k, v, flash)?);
        Ok(())
    })?;
    let forward = forward.expect("time_calls ran the forward");
    stages.push(Stage {
        name: format!("{family} forward (whole call)"),
        samples_ms,
        flops: fwd_flops,
        peak_bytes: memory::peak_bytes(),
        error: check(&forward.o)?,
        checked_on: rows_note.clone(),
    });

    memory::reset_peak();
    let o = DeviceTensor::poisoned(dtype, shape.o_elems())?;
    let lse = DeviceF32::poisoned(shape.row_elems())?;
    let samples_ms = time_calls(gpu, 2, samples, || {
        flash_attn::forward_into(gpu, shape, q, k, v, &o, &lse, flash).map(drop)
    })?;
    stages.push(Stage {
        name: format!("{family} forward (into buffers)"),
        samples_ms,
        flops: fwd_flops,
        peak_bytes: memory::peak_bytes(),
        error: check(&o)?,
        checked_on: rows_note,
    });

    let inputs = BackwardInputs {
        q,
        k,
        v,
        o: &forward.o,
        d_o,
        lse: &forward.lse,
    };
    let bwd_flops = 2.5 * windowed_forward_flops(shape, options);
    memory::reset_peak();
    let mut grads = None;
    let samples_ms = time_calls(gpu, 2, samples, || {
        grads = Some(flash_attn::backward(gpu, shape, &inputs, flash)?);
        Ok(())
    })?;
    let grads = grads.expect("time_calls ran the backward");
    let (error, checked_on) =
        check_backward_head(shape, options, host, [&grads.dq, &grads.dk, &grads.dv])?;
    stages.push(Stage {
        name: format!("{} backward (whole call)", grads.plan.family),
        samples_ms,
        flops: bwd_flops,
        peak_bytes: memory::peak_bytes(),
        error,
        checked_on,
    });

    memory::reset_peak();
    let mut out = GradientBuffers::poisoned(shape, dtype)?;
    if options.sinks.is_some() {
        out = out.with_d_sinks(shape)?;
    }
    let workspace = Workspace::new(&grads.plan)?;
    let samples_ms = time_calls(gpu, 2, samples, || {
        flash_attn::backward_into(gpu, shape, &inputs, &out, &workspace, flash).map(drop)
    })?;
    let (error, checked_on) =
        check_backward_head(shape, options, host, [&out.dq, &out.dk, &out.dv])?;
    stages.push(Stage {
        name: format!("{} backward (into buffers)", grads.plan.family),
        samples_ms,
        flops: bwd_flops,
        peak_bytes: memory::peak_bytes(),
        error,
        checked_on,
    });
    Ok(())
}

fn report(stages: &[Stage], dtype: DType) -> CliResult {
    // Inputs are rounded to the dtype; the kernels accumulate in f32. bf16 and f16 outputs carry
    // one rounding of the result, and the materialized baseline also rounds S and P.
    let tolerance = match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 5e-3,
        DType::Bf16 => 2e-2,
    };
    println!(
        "{:<36} {:>10} {:>9} {:>12} {:>10}  checked on",
        "kernel", "median ms", "TFLOP/s", "peak MiB", "rel error"
    );
    let mut failed = Vec::new();
    for s in stages {
        let ms = median(&s.samples_ms);
        println!(
            "{:<36} {:>10.3} {:>9.1} {:>12.1} {:>10.2e}  {}",
            s.name,
            ms,
            s.flops / (ms as f64 * 1e-3) / 1e12,
            s.peak_bytes as f64 / (1u64 << 20) as f64,
            s.error,
            s.checked_on
        );
        if s.error.is_nan() || s.error > tolerance {
            failed.push(s.name.as_str());
        }
    }
    println!(
        "timing: CUDA events, median of {} calls after 2 warm-up calls; peak MiB: the library's device buffers during the calls (inputs included)",
        stages[0].samples_ms.len()
    );
    if !failed.is_empty() {
        return Err(format!(
            "relative error above {tolerance:.0e} (or unwritten output) in: {}",
            failed.join(", ")
        )
        .into());
    }
    println!("ok: every kernel within {tolerance:.0e} of the f64 reference");
    Ok(())
}

/// Rows spread over batch, heads and positions, including the first and the last row.
fn sample_rows(shape: &AttentionShape) -> Vec<(u32, u32, u32)> {
    let n = shape.n_q;
    let positions = [0, 1, n / 3, n / 2, n - 2, n - 1];
    let mut rows: Vec<_> = positions
        .iter()
        .enumerate()
        .map(|(t, &i)| {
            (
                t as u32 % shape.batch,
                (t as u32 * 7) % shape.heads_q,
                i.min(n - 1),
            )
        })
        .collect();
    rows.dedup();
    rows
}

/// The CPU path: the f64 reference on a small embedded input.
fn run_cpu(options: &AttentionOptions, seed: u64) -> CliResult {
    let shape = AttentionShape {
        batch: 1,
        n_q: 128,
        n_k: 128,
        heads_q: CPU_HEADS,
        heads_kv: CPU_HEADS,
        head_dim: 32,
        head_dim_v: 32,
    };
    let q = uniform(seed, shape.q_elems());
    let k = uniform(seed + 1, shape.k_elems());
    let v = uniform(seed + 2, shape.v_elems());
    let out = forward_f32(&shape, &q, &k, &v, options)?;
    let checksum: f64 = out.o.iter().sum();
    let largest = out.o.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    let (lo, hi) = out
        .lse
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        });
    println!(
        "CPU path: f64 reference, B=1 N={} H={} d={}{}: O sum {checksum:.9}, max |O| {largest:.6}, LSE in [{lo:.6}, {hi:.6}]",
        shape.n_q,
        shape.heads_q,
        shape.head_dim,
        if options.causal { " causal" } else { "" },
    );
    Ok(())
}
