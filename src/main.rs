//! `flash-attn`: command line tool of the crate.

mod cli;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "flash-attn", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Block sizes, visit counts and the logical-word IO ledgers of the paper schedules.
    Ledger(cli::ledger::LedgerArgs),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Ledger(args) => cli::ledger::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flash-attn: {e}");
            ExitCode::FAILURE
        }
    }
}
