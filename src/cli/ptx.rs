//! `flash-attn ptx`: where the PTX is, its entry points, and ptxas's resource report.

use std::path::PathBuf;

use clap::Args;
use flash_attn::ptx_info::{entry_points, find_ptxas, ptxas_resources};
use flash_attn::{PTX, PTX_ARCH, PTX_PATH};

use super::CliResult;

#[derive(Args, Debug)]
pub struct PtxArgs {
    /// Print the whole PTX text instead of the summary.
    #[arg(long)]
    dump: bool,
}

pub fn run(args: &PtxArgs) -> CliResult {
    if args.dump {
        print!("{PTX}");
        return Ok(());
    }
    let path = PathBuf::from(PTX_PATH);
    println!("architecture: {PTX_ARCH}");
    if path.is_file() {
        println!("PTX file:     {}", path.display());
    } else {
        println!(
            "PTX file:     {} (not on this machine; the PTX is embedded in this binary)",
            path.display()
        );
    }
    let entries = entry_points(PTX);
    println!("entry points: {}", entries.len());
    let Some(ptxas) = find_ptxas() else {
        for e in entries {
            println!("  {e}");
        }
        println!(
            "ptxas not found ($PTXAS, PATH, the nvidia-cuda-nvcc-cu12 wheel, /usr/local/cuda): no resource report"
        );
        return Ok(());
    };
    // ptxas reads a file: use the build's copy, or write the embedded text next to the temp dir.
    let file = if path.is_file() {
        path
    } else {
        let tmp = std::env::temp_dir().join(format!("flash_attn_{}.ptx", std::process::id()));
        std::fs::write(&tmp, PTX)?;
        tmp
    };
    let resources = ptxas_resources(&ptxas, &file, PTX_ARCH)?;
    println!("resources from {} -arch={PTX_ARCH} -v:", ptxas.display());
    println!(
        "  {:<40} {:>5} {:>12} {:>11} {:>11} {:>10}",
        "kernel", "regs", "spill st/ld", "stack (B)", "static smem", ""
    );
    for name in entries {
        match resources.iter().find(|r| r.name == name) {
            Some(r) => println!(
                "  {:<40} {:>5} {:>5}/{:<6} {:>11} {:>11}",
                r.name, r.registers, r.spill_stores, r.spill_loads, r.stack_frame, r.shared_bytes
            ),
            None => println!("  {name:<40} (not in ptxas's report)"),
        }
    }
    Ok(())
}
