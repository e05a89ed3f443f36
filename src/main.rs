mod cli;

use clap::{Parser, Subcommand};

/// Exact, IO-aware attention on the GPU.
#[derive(Parser, Debug)]
#[command(name = "flash-attn", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// O and LSE from Q, K, V (.npy).
    Forward(cli::forward::ForwardArgs),
    /// dQ, dK, dV from Q, K, V, dO (.npy).
    Backward(cli::backward::BackwardArgs),
}

fn main() -> std::process::ExitCode {
    let result = match &Cli::parse().command {
        Command::Forward(a) => cli::forward::run(a),
        Command::Backward(a) => cli::backward::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flash-attn: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
