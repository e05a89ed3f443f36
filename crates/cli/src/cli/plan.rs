//! `flash-attn plan`: which kernel family and instance a call would run, and why the others
//! would not, for a shape, dtype, options and an architecture (no GPU needed with `--arch`).

use clap::{Args, ValueEnum};
use flash_attn::{AttentionShape, DType, DeviceCaps, Direction, Problem, plan};

use super::CliResult;
use super::forward::CallArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Pass {
    Forward,
    Backward,
    Both,
}

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Architecture to plan for: sm_90 (H100/H200; with the build's sm_90a module) or sm_80
    /// (A100). Without it, the device that answers.
    #[arg(long)]
    arch: Option<String>,
    /// Batch size B.
    #[arg(long, default_value_t = 1)]
    batch: u32,
    /// Query rows N_q (per batch item; the total with packed sequences).
    #[arg(long, default_value_t = 4096)]
    n_q: u32,
    /// Keys N_k (default: N_q).
    #[arg(long)]
    n_k: Option<u32>,
    /// Query heads H_q.
    #[arg(long, default_value_t = 32)]
    heads_q: u32,
    /// K/V heads H_kv (default: H_q).
    #[arg(long)]
    heads_kv: Option<u32>,
    /// Head dimension d of Q and K.
    #[arg(long, default_value_t = 128)]
    head_dim: u32,
    /// Head dimension of V and O (default: --head-dim).
    #[arg(long)]
    head_dim_v: Option<u32>,
    /// Direction(s) to plan.
    #[arg(long, value_enum, default_value = "both")]
    pass: Pass,
    /// Compute dtype: f32, f16 or bf16.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// Bitwise reproducible gradients (exact: dQ without atomics; tensor cores: dQ atomics in key
    /// order).
    #[arg(long)]
    deterministic: bool,
    #[command(flatten)]
    call: CallArgs,
}

pub fn run(args: &PlanArgs) -> CliResult {
    let shape = AttentionShape {
        batch: args.batch,
        n_q: args.n_q,
        n_k: args.n_k.unwrap_or(args.n_q),
        heads_q: args.heads_q,
        heads_kv: args.heads_kv.unwrap_or(args.heads_q),
        head_dim: args.head_dim,
        head_dim_v: args.head_dim_v.unwrap_or(args.head_dim),
    };
    let dtype = args.dtype;
    let options = args
        .call
        .options(shape.heads_q)
        .deterministic(args.deterministic);
    let (device, on) = match &args.arch {
        Some(arch) => (
            DeviceCaps::for_arch(arch, flash_attn::PTX_SM90A.is_some())?,
            arch.clone(),
        ),
        None => {
            let gpu = flash_attn::gpu().map_err(|e| format!("{e} (give --arch sm_90 or sm_80)"))?;
            (DeviceCaps::of(&gpu)?, gpu.device_name())
        }
    };
    let problem = Problem::new(&shape, dtype, &options)?;
    println!(
        "call        B={} N_q={} N_k={} H_q={} H_kv={} d={}{} {dtype}, --kernel {}, on {on}",
        shape.batch,
        shape.n_q,
        shape.n_k,
        shape.heads_q,
        shape.heads_kv,
        shape.head_dim,
        if shape.head_dim_v == shape.head_dim {
            String::new()
        } else {
            format!(" d_v={}", shape.head_dim_v)
        },
        options.kernel
    );
    let directions: &[Direction] = match args.pass {
        Pass::Forward => &[Direction::Forward],
        Pass::Backward => &[Direction::Backward],
        Pass::Both => &[Direction::Forward, Direction::Backward],
    };
    for &direction in directions {
        print!("{}", plan::select(&device, &problem, direction)?);
    }
    Ok(())
}
