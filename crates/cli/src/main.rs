//! `flash-attn`: the command line tool of the library. See `flash-attn --help`.

mod cli;
mod npy;
mod ptx_info;

fn main() -> std::process::ExitCode {
    cli::main()
}
