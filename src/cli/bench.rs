//! `flash-attn bench`: times kernels on the anchor shapes and writes one evidence bundle per run.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use flash_attn::bench::{CaseRecord, anchor_cases, environment, forward_flops, running_fixture};
use flash_attn::inputs::uniform;
use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::sampled_rows::check_rows;
use flash_attn::timing::time_calls;
use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceTensor, Gpu, memory};
use serde_json::json;

use super::CliResult;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Kernel {
    /// The three-stage materialized baseline (forward only).
    Materialized,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Shapes {
    /// Every row of the anchors table (d = 64 and 128, N = 512 … 16384, causal and not).
    Anchors,
    /// The running fixture B=1, N=4096, H=32, d=128 only.
    Fixture,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Kernel to time.
    #[arg(long, value_enum, default_value = "materialized")]
    kernel: Kernel,
    /// Shapes to time.
    #[arg(long, value_enum, default_value = "fixture")]
    shapes: Shapes,
    /// Only causal (`true`) or only non-causal (`false`) cases; both when absent.
    #[arg(long)]
    causal: Option<bool>,
    /// Storage dtype.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// Untimed calls before sampling.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Event-timed samples per case (at least 20).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(20..))]
    samples: u64,
    /// Directory for the evidence bundle (`bench-<kernel>-<unix time>.json`).
    #[arg(long, default_value = "reports/bench")]
    out: PathBuf,
}

pub fn run(args: &BenchArgs) -> CliResult {
    let gpu = flash_attn::gpu()?;
    let cases: Vec<(AttentionShape, bool)> = match args.shapes {
        Shapes::Anchors => anchor_cases(),
        Shapes::Fixture => vec![(running_fixture(), false), (running_fixture(), true)],
    }
    .into_iter()
    .filter(|(_, c)| args.causal.is_none_or(|want| want == *c))
    .collect();
    let env = environment(&gpu);
    println!("{}", serde_json::to_string(&env)?);
    println!(
        "{:<10} {:<8} {:>3} {:>3} {:>6} {:>4} {:>6} {:>10} {:>9} {:>10}",
        "kernel", "pass", "B", "H", "N", "d", "causal", "median ms", "TFLOP/s", "rel err"
    );
    let mut records = Vec::new();
    for (shape, causal) in cases {
        let record = match args.kernel {
            Kernel::Materialized => bench_materialized(&gpu, &shape, causal, args)?,
        };
        println!(
            "{:<10} {:<8} {:>3} {:>3} {:>6} {:>4} {:>6} {:>10.3} {:>9.1} {:>10.2e}",
            record.kernel,
            record.pass,
            shape.batch,
            shape.heads_q,
            shape.n_q,
            shape.head_dim,
            causal,
            record.median_ms(),
            record.tflops(),
            record.error["relative"].as_f64().unwrap_or(f64::NAN)
        );
        records.push(record.to_json());
    }
    std::fs::create_dir_all(&args.out)?;
    let name = format!("bench-{:?}-{}.json", args.kernel, env["unix_time"]).to_lowercase();
    let path = args.out.join(name);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&json!({"environment": env, "cases": records}))?,
    )?;
    println!("evidence bundle: {}", path.display());
    Ok(())
}

/// Fresh inputs rounded to `dtype`, on the host (for the check) and on the device.
fn inputs(
    shape: &AttentionShape,
    dtype: DType,
) -> flash_attn::Result<(Vec<Vec<f32>>, Vec<DeviceTensor>)> {
    let seed = rand::random::<u64>();
    let host: Vec<Vec<f32>> = [shape.q_elems(), shape.kv_elems(), shape.kv_elems()]
        .iter()
        .enumerate()
        .map(|(t, &len)| {
            uniform(seed + t as u64, len)
                .into_iter()
                .map(|x| dtype.round(x))
                .collect()
        })
        .collect();
    let device = host
        .iter()
        .map(|h| DeviceTensor::from_f32(dtype, h))
        .collect::<flash_attn::Result<_>>()?;
    Ok((host, device))
}

/// Rows the forward error is measured on: first, middle and last of a few (batch, head) planes.
fn check_rows_of(shape: &AttentionShape) -> Vec<(u32, u32, u32)> {
    let n = shape.n_q;
    [
        (0, 0, 0),
        (0, shape.heads_q / 2, n / 2),
        (shape.batch - 1, shape.heads_q - 1, n - 1),
    ]
    .into_iter()
    .collect()
}

fn bench_materialized<'a>(
    gpu: &Gpu,
    shape: &AttentionShape,
    causal: bool,
    args: &BenchArgs,
) -> flash_attn::Result<CaseRecord<'a>> {
    let options = AttentionOptions::new().causal(causal);
    let (host, dev) = inputs(shape, args.dtype)?;
    memory::reset_peak();
    let workspace = MaterializedWorkspace::new(shape, args.dtype)?;
    let o = DeviceTensor::poisoned(args.dtype, shape.q_elems())?;
    let samples_ms = time_calls(gpu, args.warmup, args.samples as usize, || {
        materialized_forward(gpu, &workspace, &dev[0], &dev[1], &dev[2], &o, &options)
    })?;
    let rows = check_rows_of(shape);
    let relative = check_rows(
        shape,
        &options,
        (&host[0], &host[1], &host[2]),
        &o.to_f32()?,
        &rows,
    )?;
    Ok(CaseRecord {
        kernel: "materialized",
        pass: "forward",
        schedule: "three stages",
        block_sizes: json!({"tile": 16}),
        shape: *shape,
        causal,
        dtype: args.dtype,
        flops: forward_flops(shape, causal),
        warmup: args.warmup,
        samples_ms,
        error: json!({"relative": relative, "on": format!("{} sampled rows vs f64", rows.len())}),
        peak_bytes: memory::peak_bytes(),
    })
}
