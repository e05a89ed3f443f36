//! `flash-attn`: the command line tool of the library. See `flash-attn --help`.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
