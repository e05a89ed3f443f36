//! Subcommands of `flash-attn`, one module each.

mod backward;
mod bench;
mod forward;
mod ledger;
mod memory;
mod plan;
mod ptx;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exact, IO-aware attention (FlashAttention) with kernels written in Rust, on NVIDIA GPUs.
#[derive(Parser, Debug)]
#[command(name = "flash-attn", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The main job: attention on the article's running fixture (B=1, S=4096, H=32, d=128, bf16)
    /// on the GPU, checked against the CPU; without a GPU, the CPU path on a small input.
    Run(run::RunArgs),
    /// O and LSE from Q, K, V given as .npy files ([batch, seq, heads, head_dim]).
    Forward(forward::ForwardArgs),
    /// dQ, dK, dV from Q, K, V, dO given as .npy files ([batch, seq, heads, head_dim]).
    Backward(backward::BackwardArgs),
    /// Time kernels on the anchor shapes; writes an evidence bundle (JSON) per run.
    Bench(bench::BenchArgs),
    /// Which kernel family and instance a call would run (tiles, grid, shared memory,
    /// workspace) and why each other family would not; `--arch` plans without a GPU.
    Plan(plan::PlanArgs),
    /// Block sizes, visit counts and the paper's forward/backward IO ledgers by term.
    Ledger(ledger::LedgerArgs),
    /// Device memory of forward and backward as N grows, against the materialized baseline.
    Memory(memory::MemoryArgs),
    /// Where the PTX is, its entry points, and each kernel's registers, spills and shared memory.
    Ptx(ptx::PtxArgs),
}

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run(args) => run::run(args),
        Command::Ptx(args) => ptx::run(args),
        Command::Forward(args) => forward::run(args),
        Command::Backward(args) => backward::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Ledger(args) => ledger::run(args),
        Command::Memory(args) => memory::run(args),
        Command::Plan(args) => plan::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
