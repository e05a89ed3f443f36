//! `flash-attn ptx`: where the PTX is, its entry points, and ptxas's resource report.

use std::path::PathBuf;

use crate::ptx_info::{entry_points, find_ptxas, ptxas_resources};
use clap::Args;
use flash_attn::{PTX, PTX_ARCH, PTX_PATH, PTX_SM90A, PTX_SM90A_PATH};

use super::CliResult;

#[derive(Args, Debug)]
pub struct PtxArgs {
    /// Print the whole PTX text instead of the summary.
    #[arg(long)]
    dump: bool,
    /// The sm_90a module (every kernel plus the wgmma ones, loaded on compute capability 9.0)
    /// instead of the base one.
    #[arg(long)]
    sm90a: bool,
}

pub fn run(args: &PtxArgs) -> CliResult {
    let (ptx, arch, path) = if args.sm90a {
        let Some(ptx) = PTX_SM90A else {
            return Err(format!("this build ({PTX_ARCH}) has no sm_90a module").into());
        };
        (ptx, "sm_90a", PTX_SM90A_PATH)
    } else {
        (PTX, PTX_ARCH, PTX_PATH)
    };
    if args.dump {
        print!("{ptx}");
        return Ok(());
    }
    let path = PathBuf::from(path);
    println!("architecture: {arch}");
    if path.is_file() {
        println!("PTX file:     {}", path.display());
    } else {
        println!(
            "PTX file:     {} (not on this machine; the PTX is embedded in this binary)",
            path.display()
        );
    }
    let entries = entry_points(ptx);
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
        std::fs::write(&tmp, ptx)?;
        tmp
    };
    let resources = ptxas_resources(&ptxas, &file, arch)?;
    println!("resources from {} -arch={arch} -v:", ptxas.display());
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
