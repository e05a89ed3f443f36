//! `flash-attn bench`: times kernels on the anchor shapes and writes one evidence bundle per run.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use flash_attn::materialized::{MaterializedWorkspace, check_options, materialized_forward};
use flash_attn::options::alibi_slopes;
use flash_attn::timing::{time_calls, time_pipelined};
use flash_attn::{
    AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceTensor, Family, FlashOptions,
    Gpu, KernelChoice, Plan, memory,
};
use flash_attn_testkit::bench::{
    CaseRecord, anchor_cases, backward_flops, environment, forward_flops, headdim_cases,
    running_fixture, window_cases, windowed_forward_flops,
};
use flash_attn_testkit::inputs::uniform;
use flash_attn_testkit::sampled_rows::check_rows;
use serde_json::json;

use super::CliResult;

/// What `bench` times: the materialized baseline, or the kernel family a plan picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    Materialized,
    Planned(KernelChoice),
}

impl std::str::FromStr for Kernel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "materialized" => Ok(Kernel::Materialized),
            _ => s.parse().map(Kernel::Planned).map_err(|e| {
                format!("{e}; or materialized (the three-stage baseline, forward only)")
            }),
        }
    }
}

impl std::fmt::Display for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kernel::Materialized => f.write_str("materialized"),
            Kernel::Planned(choice) => choice.fmt(f),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Pass {
    Forward,
    Backward,
}

/// How a sample is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Timing {
    /// Many calls queued back to back between two events, per-call time (a loop that does not
    /// wait between calls; how the peers are timed too).
    Pipelined,
    /// One call between two events, waited on before the next (adds the launch latency).
    Synced,
}

impl Timing {
    fn name(self) -> &'static str {
        match self {
            Timing::Pipelined => "pipelined",
            Timing::Synced => "synced",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Shapes {
    /// Every row of the anchors table (d = 64 and 128, N = 512 … 16384, causal and not).
    Anchors,
    /// The running fixture B=1, N=4096, H=32, d=128 only.
    Fixture,
    /// The head-dim table: d = 32, 80, 96, 160, 192, 256 at N = 4096, B = 4, H = 2048/d
    /// rounded, causal and not.
    Headdims,
    /// The window cost: H = 16, d = 128, N = 16384 full, with the window (1024, 1024) and with
    /// (1024, 0), beside B = 8 × N = 2048 and B = 16 × N = 1024 full (the same rows, 2048 and
    /// 1024 keys each).
    Window,
}

/// One case: a shape and its mask (causal, local window).
struct Case {
    shape: AttentionShape,
    causal: bool,
    window: Option<(u32, u32)>,
}

impl Case {
    /// The case's mask and the options every case of the run takes.
    fn options(&self, extra: &ExtraOptions) -> AttentionOptions {
        let a = extra.apply(AttentionOptions::new().causal(self.causal), &self.shape);
        match self.window {
            Some((left, right)) => a.window(left, right),
            None => a,
        }
    }

    /// FLOPs as the anchors count them, or over the pairs the window allows.
    fn forward_flops(&self) -> f64 {
        match self.window {
            Some(_) => windowed_forward_flops(&self.shape, &self.mask()),
            None => forward_flops(&self.shape, self.causal),
        }
    }

    fn backward_flops(&self) -> f64 {
        match self.window {
            Some(_) => 2.5 * windowed_forward_flops(&self.shape, &self.mask()),
            None => backward_flops(&self.shape, self.causal),
        }
    }

    /// The mask alone (what the FLOPs are counted over).
    fn mask(&self) -> AttentionOptions {
        self.options(&ExtraOptions::default())
    }
}

/// Options every case of a run takes besides its mask, to time the instances that carry them:
/// the tensor-core families run a call with any of these on their general or modifier
/// instances, not the plain ones. FLOPs are counted as without them.
#[derive(Args, Debug, Default)]
struct ExtraOptions {
    /// Every sequence's key length given explicitly, each the shape's own (the same work, on
    /// the instances that take lengths).
    #[arg(long)]
    key_lengths: bool,
    /// Dropout of P with this probability (a fixed seed).
    #[arg(long, allow_negative_numbers = true)]
    dropout: Option<f32>,
    /// The tanh logit softcap with this cap.
    #[arg(long, allow_negative_numbers = true)]
    softcap: Option<f32>,
    /// ALiBi with the standard slopes of the query heads.
    #[arg(long)]
    alibi: bool,
    /// A sink logit per query head (0.5 each).
    #[arg(long)]
    sinks: bool,
}

impl ExtraOptions {
    fn apply(&self, mut a: AttentionOptions, shape: &AttentionShape) -> AttentionOptions {
        if self.key_lengths {
            a = a.key_lengths(vec![shape.n_k; shape.batch as usize]);
        }
        if let Some(p) = self.dropout {
            a = a.dropout(p, 0x5eed, 0);
        }
        if let Some(cap) = self.softcap {
            a = a.softcap(cap);
        }
        if self.alibi {
            a = a.alibi_slopes(alibi_slopes(shape.heads_q));
        }
        if self.sinks {
            a = a.sinks(vec![0.5; shape.heads_q as usize]);
        }
        a
    }

    /// The options taken, as the bundle records them.
    fn to_json(&self) -> serde_json::Value {
        json!({
            "key_lengths": self.key_lengths,
            "dropout": self.dropout,
            "softcap": self.softcap,
            "alibi": self.alibi,
            "sinks": self.sinks,
        })
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Kernel to time: auto (the family `flash_attn::forward` picks), exact, sm80, sm90, or
    /// materialized (the three-stage baseline, forward only).
    #[arg(long, default_value = "auto")]
    kernel: Kernel,
    /// Passes to time (both when absent; the materialized baseline has a forward only).
    #[arg(long, value_enum)]
    pass: Option<Pass>,
    /// Shapes to time.
    #[arg(long, value_enum, default_value = "fixture")]
    shapes: Shapes,
    /// Only causal (`true`) or only non-causal (`false`) cases; both when absent.
    #[arg(long)]
    causal: Option<bool>,
    /// Only the cases of these head dims (comma separated); all when absent.
    #[arg(long, value_delimiter = ',')]
    head_dim: Vec<u32>,
    /// Storage dtype.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// Untimed calls before sampling.
    #[arg(long, default_value_t = 5)]
    warmup: usize,
    /// Event-timed samples per case (at least 20).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(20..))]
    samples: u64,
    /// How each sample is taken.
    #[arg(long, value_enum, default_value = "pipelined")]
    timing: Timing,
    /// Bitwise reproducible gradients in the backward (`FlashOptions::deterministic`): the exact
    /// family's row-owned dQ pass, the tensor-core families' dQ atomics in key order. Time with
    /// and without to see its cost.
    #[arg(long)]
    deterministic: bool,
    /// Calls per pipelined sample; 0 picks enough for about 2 ms per sample (at most 200).
    #[arg(long, default_value_t = 0)]
    calls: usize,
    #[command(flatten)]
    extra: ExtraOptions,
    /// Directory for the evidence bundle (`bench-<kernel>-<unix time>.json`).
    #[arg(long, default_value = "reports/bench")]
    out: PathBuf,
}

pub fn run(args: &BenchArgs) -> CliResult {
    let plain = |(shape, causal)| Case {
        shape,
        causal,
        window: None,
    };
    let cases: Vec<Case> = match args.shapes {
        Shapes::Anchors => anchor_cases().into_iter().map(plain).collect(),
        Shapes::Fixture => vec![
            plain((running_fixture(), false)),
            plain((running_fixture(), true)),
        ],
        Shapes::Headdims => headdim_cases().into_iter().map(plain).collect(),
        Shapes::Window => window_cases()
            .into_iter()
            .map(|(shape, window)| Case {
                shape,
                causal: false,
                window,
            })
            .collect(),
    }
    .into_iter()
    .filter(|c| args.causal.is_none_or(|want| want == c.causal))
    .filter(|c| args.head_dim.is_empty() || args.head_dim.contains(&c.shape.head_dim))
    .collect();
    if cases.is_empty() {
        return Err(format!(
            "no {:?} case has head dim {:?} (and causal {:?})",
            args.shapes, args.head_dim, args.causal
        )
        .into());
    }
    // Bad options are refused here, before a device is looked for.
    for c in &cases {
        let options = c.options(&args.extra);
        options.validate(&c.shape)?;
        if args.kernel == Kernel::Materialized {
            check_options(&options)?;
        }
    }
    let gpu = flash_attn::gpu()?;
    let env = environment(&gpu);
    println!("{}", serde_json::to_string(&env)?);
    println!("options besides the masks: {}", args.extra.to_json());
    println!(
        "{:<10} {:<8} {:>3} {:>3} {:>6} {:>4} {:>6} {:>11} {:>10} {:>9} {:>10}",
        "kernel", "pass", "B", "H", "N", "d", "causal", "window", "median ms", "TFLOP/s", "rel err"
    );
    let mut records = Vec::new();
    let passes: Vec<Pass> = match (args.pass, args.kernel) {
        (Some(p), _) => vec![p],
        (None, Kernel::Materialized) => vec![Pass::Forward],
        (None, _) => vec![Pass::Forward, Pass::Backward],
    };
    for case in cases {
        let shape = case.shape;
        for &pass in &passes {
            let record = match (args.kernel, pass) {
                (Kernel::Materialized, Pass::Forward) => bench_materialized(&gpu, &case, args)?,
                (Kernel::Materialized, Pass::Backward) => {
                    return Err("the materialized baseline has no backward".into());
                }
                (Kernel::Planned(choice), Pass::Forward) => {
                    bench_forward(&gpu, &case, choice, args)?
                }
                (Kernel::Planned(choice), Pass::Backward) => {
                    bench_backward(&gpu, &case, choice, args)?
                }
            };
            let window = case
                .window
                .map_or("-".to_string(), |(l, r)| format!("{l},{r}"));
            println!(
                "{:<10} {:<8} {:>3} {:>3} {:>6} {:>4} {:>6} {:>11} {:>10.3} {:>9.1} {:>10.2e}",
                record.kernel,
                record.pass,
                shape.batch,
                shape.heads_q,
                shape.n_q,
                shape.head_dim,
                case.causal,
                window,
                record.median_ms(),
                record.tflops(),
                record.error["relative"].as_f64().unwrap_or(f64::NAN)
            );
            records.push(record.to_json());
        }
    }
    std::fs::create_dir_all(&args.out)?;
    let name = format!("bench-{}-{}.json", args.kernel, env["unix_time"]);
    let path = args.out.join(name);
    std::fs::write(
        &path,
        serde_json::to_string_pretty(
            &json!({"environment": env, "options": args.extra.to_json(), "cases": records}),
        )?,
    )?;
    println!("evidence bundle: {}", path.display());
    Ok(())
}

/// Per-call samples of `call` the way `args.timing` says, and the calls per sample.
fn sample(
    gpu: &Gpu,
    args: &BenchArgs,
    call: impl FnMut() -> flash_attn::Result<()>,
) -> flash_attn::Result<(Vec<f32>, usize)> {
    let samples = args.samples as usize;
    match args.timing {
        Timing::Synced => Ok((time_calls(gpu, args.warmup, samples, call)?, 1)),
        Timing::Pipelined => {
            let p = time_pipelined(gpu, args.warmup, samples, args.calls, call)?;
            Ok((p.per_call_ms, p.calls))
        }
    }
}

/// Fresh inputs rounded to `dtype`, on the host (for the check) and on the device.
fn inputs(
    shape: &AttentionShape,
    dtype: DType,
) -> flash_attn::Result<(Vec<Vec<f32>>, Vec<DeviceTensor>)> {
    flash_attn::options::validate_shape(shape)?;
    let seed = rand::random::<u64>();
    let host: Vec<Vec<f32>> = [shape.q_elems(), shape.k_elems(), shape.v_elems()]
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

/// The forward's error on sampled rows (first, middle and last of a few (batch, head) planes)
/// against the f64 reference, as the bundle records it.
fn forward_error(
    shape: &AttentionShape,
    options: &AttentionOptions,
    host: &[Vec<f32>],
    o: &DeviceTensor,
) -> flash_attn::Result<serde_json::Value> {
    let n = shape.n_q;
    let rows = [
        (0, 0, 0),
        (0, shape.heads_q / 2, n / 2),
        (shape.batch - 1, shape.heads_q - 1, n - 1),
    ];
    let relative = check_rows(
        shape,
        options,
        (&host[0], &host[1], &host[2]),
        &o.to_f32()?,
        &rows,
    )?;
    Ok(json!({"relative": relative, "on": format!("{} sampled rows vs f64", rows.len())}))
}

fn bench_materialized<'a>(
    gpu: &Gpu,
    case: &Case,
    args: &BenchArgs,
) -> flash_attn::Result<CaseRecord<'a>> {
    let (shape, options) = (&case.shape, case.options(&args.extra));
    let (host, dev) = inputs(shape, args.dtype)?;
    memory::reset_peak();
    let workspace = MaterializedWorkspace::new(shape, args.dtype)?;
    let o = DeviceTensor::poisoned(args.dtype, shape.o_elems())?;
    let (samples_ms, calls_per_sample) = sample(gpu, args, || {
        materialized_forward(gpu, &workspace, &dev[0], &dev[1], &dev[2], &o, &options)
    })?;
    let error = forward_error(shape, &options, &host, &o)?;
    Ok(CaseRecord {
        kernel: "materialized",
        pass: "forward",
        schedule: "three stages",
        block_sizes: json!({"tile": 16}),
        shape: *shape,
        causal: case.causal,
        window: case.window,
        dtype: args.dtype,
        flops: case.forward_flops(),
        warmup: args.warmup,
        timing: args.timing.name(),
        calls_per_sample,
        samples_ms,
        error,
        peak_bytes: memory::peak_bytes(),
    })
}

/// What a bundle records of the plan that ran.
fn plan_record(plan: &Plan) -> serde_json::Value {
    json!({
        "family": plan.family.name(),
        "entry": plan.entry,
        "threads": plan.threads,
        "rows_per_block": plan.block_rows,
        "keys_per_block": plan.block_keys,
        "shared_bytes": plan.shared_bytes,
        "workspace_bytes": plan.workspace_bytes(),
    })
}

fn bench_forward<'a>(
    gpu: &Gpu,
    case: &Case,
    choice: KernelChoice,
    args: &BenchArgs,
) -> flash_attn::Result<CaseRecord<'a>> {
    let shape = &case.shape;
    let options = FlashOptions::new(case.options(&args.extra)).kernel(choice);
    let (host, dev) = inputs(shape, args.dtype)?;
    memory::reset_peak();
    // The call a user makes: validation, plan, outputs from the pool, launch.
    let mut last = None;
    let (samples_ms, calls_per_sample) = sample(gpu, args, || {
        last = Some(flash_attn::forward(
            gpu, shape, &dev[0], &dev[1], &dev[2], &options,
        )?);
        Ok(())
    })?;
    let out = last.expect("the timing ran the forward");
    let (o, plan) = (out.o, out.plan);
    let error = forward_error(shape, &options.attention, &host, &o)?;
    Ok(CaseRecord {
        kernel: plan.family.name(),
        pass: "forward",
        schedule: "row-owned",
        block_sizes: plan_record(&plan),
        shape: *shape,
        causal: case.causal,
        window: case.window,
        dtype: args.dtype,
        flops: case.forward_flops(),
        warmup: args.warmup,
        timing: args.timing.name(),
        calls_per_sample,
        samples_ms,
        error,
        peak_bytes: memory::peak_bytes(),
    })
}

fn bench_backward<'a>(
    gpu: &Gpu,
    case: &Case,
    choice: KernelChoice,
    args: &BenchArgs,
) -> flash_attn::Result<CaseRecord<'a>> {
    let shape = &case.shape;
    let options = FlashOptions::new(case.options(&args.extra))
        .kernel(choice)
        .deterministic(args.deterministic);
    let (_, dev) = inputs(shape, args.dtype)?;
    let d_o = DeviceTensor::from_f32(args.dtype, &uniform(rand::random(), shape.o_elems()))?;
    let fwd = flash_attn::forward(gpu, shape, &dev[0], &dev[1], &dev[2], &options)?;
    let inputs = BackwardInputs {
        q: &dev[0],
        k: &dev[1],
        v: &dev[2],
        o: &fwd.o,
        d_o: &d_o,
        lse: &fwd.lse,
    };
    memory::reset_peak();
    // The call a user makes: validation, plan, gradients and workspace from the pool, launches.
    let mut last = None;
    let (samples_ms, calls_per_sample) = sample(gpu, args, || {
        last = Some(flash_attn::backward(gpu, shape, &inputs, &options)?);
        Ok(())
    })?;
    let out = last.expect("the timing ran the backward");
    let unwritten = [&out.dq, &out.dk, &out.dv]
        .iter()
        .map(|t| {
            t.to_f32()
                .map(|v| v.iter().filter(|x| !x.is_finite()).count())
        })
        .sum::<flash_attn::Result<usize>>()?;
    let plan = out.plan;
    Ok(CaseRecord {
        kernel: plan.family.name(),
        pass: "backward",
        schedule: if options.deterministic && plan.family == Family::Exact {
            "K/V-outer, row-owned dQ"
        } else if options.deterministic {
            "K/V-outer, dQ atomics in key order"
        } else {
            "K/V-outer, atomic dQ"
        },
        block_sizes: plan_record(&plan),
        shape: *shape,
        causal: case.causal,
        window: case.window,
        dtype: args.dtype,
        flops: case.backward_flops(),
        warmup: args.warmup,
        timing: args.timing.name(),
        calls_per_sample,
        samples_ms,
        error: json!({"relative": null, "non_finite_outputs": unwritten,
            "on": "not measured at this size: the GPU test matrix holds every family's backward to the f64 reference"}),
        peak_bytes: memory::peak_bytes(),
    })
}
