//! What is in the embedded PTX: entry points, and each kernel's resources as `ptxas -v` reports them.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Names of the kernels (`.visible .entry`) in `ptx`, in file order.
pub fn entry_points(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or(rest))
        .collect()
}

/// Resources of one kernel from `ptxas -v`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    pub name: String,
    pub registers: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub stack_frame: u32,
    /// Static shared memory; dynamic shared memory is chosen at launch.
    pub shared_bytes: u32,
}

/// Finds `ptxas`: `$PTXAS`, then `PATH`, then the `nvidia-cuda-nvcc-cu12` wheel, then `/usr/local/cuda`.
pub fn find_ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Some(PathBuf::from(p));
    }
    if let Ok(out) = Command::new("which").arg("ptxas").output()
        && out.status.success()
    {
        return Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    let wheel = Command::new("python3")
        .args(["-c", "import nvidia.cuda_nvcc, os; print(os.path.join(list(nvidia.cuda_nvcc.__path__)[0], 'bin', 'ptxas'))"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    wheel
        .into_iter()
        .chain([PathBuf::from("/usr/local/cuda/bin/ptxas")])
        .find(|p| p.is_file())
}

/// Runs `ptxas -arch=<arch> -v` on `ptx_file` and parses its per-kernel report.
pub fn ptxas_resources(
    ptxas: &Path,
    ptx_file: &Path,
    arch: &str,
) -> Result<Vec<KernelResources>, String> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-v", "-o", "/dev/null"])
        .arg(ptx_file)
        .output()
        .map_err(|e| format!("running {}: {e}", ptxas.display()))?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!("{} failed:\n{text}", ptxas.display()));
    }
    Ok(parse_ptxas(&text))
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let at = line.find(unit)?;
    line[..at].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output: a "Function properties for x" line (or, before it, "Compiling entry
/// function 'x'"), then its stack/spill and register lines. Keyed by the name each of those lines
/// gives, since ptxas interleaves other lines (performance notes) between a kernel's.
pub fn parse_ptxas(text: &str) -> Vec<KernelResources> {
    let mut kernels: Vec<KernelResources> = Vec::new();
    let mut current: Option<usize> = None;
    for line in text.lines() {
        let named = line
            .split("Compiling entry function '")
            .nth(1)
            .and_then(|rest| rest.split('\'').next())
            .or_else(|| line.split("Function properties for ").nth(1).map(str::trim));
        if let Some(name) = named {
            current = Some(match kernels.iter().position(|k| k.name == name) {
                Some(i) => i,
                None => {
                    kernels.push(KernelResources {
                        name: name.to_owned(),
                        ..Default::default()
                    });
                    kernels.len() - 1
                }
            });
            continue;
        }
        let Some(k) = current.map(|i| &mut kernels[i]) else {
            continue;
        };
        if line.contains("stack frame") {
            k.stack_frame = number_before(line, "bytes stack frame").unwrap_or(0);
            k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
            k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
        }
        if line.contains("Used") && line.contains("registers") {
            k.registers = number_before(line, "registers").unwrap_or(0);
            k.shared_bytes = number_before(line, "bytes smem").unwrap_or(0);
        }
    }
    kernels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_entry_points_and_ptxas_report() {
        let ptx = ".visible .entry alpha(\n\t.param .u64 a\n)\n.visible .entry beta(\n";
        assert_eq!(entry_points(ptx), ["alpha", "beta"]);
        let report = "ptxas info    : Compiling entry function 'alpha' for 'sm_90'\n\
            ptxas info    : Function properties for alpha\n    \
            16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 1 barriers, 2176 bytes smem\n";
        let parsed = parse_ptxas(report);
        assert_eq!(
            parsed,
            [KernelResources {
                name: "alpha".into(),
                registers: 40,
                spill_stores: 8,
                spill_loads: 4,
                stack_frame: 16,
                shared_bytes: 2176
            }]
        );
    }

    /// ptxas may report other kernels' compile lines and performance notes between a kernel's
    /// "Compiling" line and its properties; the properties line names the kernel.
    #[test]
    fn attributes_properties_to_the_kernel_they_name() {
        let report = "ptxas info    : Compiling entry function 'alpha' for 'sm_90a'\n\
            ptxas info    : Compiling entry function 'beta' for 'sm_90a'\n\
            ptxas info    : (C7510) Potential Performance Loss: wgmma serialized in 'alpha'\n\
            ptxas info    : Function properties for alpha\n    \
            72 bytes stack frame, 80 bytes spill stores, 100 bytes spill loads\n\
            ptxas info    : Used 255 registers, used 1 barriers\n\
            ptxas info    : Function properties for beta\n    \
            0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 128 registers, used 1 barriers\n";
        let parsed = parse_ptxas(report);
        assert_eq!(parsed.len(), 2);
        assert_eq!((parsed[0].registers, parsed[0].spill_stores), (255, 80));
        assert_eq!((parsed[1].registers, parsed[1].spill_stores), (128, 0));
    }
}
