//! Subcommands of `flash-attn`, one module each.

mod bench;
mod ledger;
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
    /// Time kernels on the anchor shapes; writes an evidence bundle (JSON) per run.
    Bench(bench::BenchArgs),
    /// Block sizes, visit counts and the paper's forward/backward IO ledgers by term.
    Ledger(ledger::LedgerArgs),
    /// Where the PTX is, its entry points, and each kernel's registers, spills and shared memory.
    Ptx(ptx::PtxArgs),
}

pub type CliResult = Result<(), Box<dyn std::error::Error>>;

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Run(args) => run::run(args),
        Command::Ptx(args) => ptx::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Ledger(args) => ledger::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
