//! Compiles `attention-kernels` to PTX with rustc's NVPTX backend and embeds it in this crate.
//!
//! The child build uses the pinned toolchain of `rust-toolchain.toml` with `-Zbuild-std=core`
//! (no prebuilt `rust-std` exists for `nvptx64-nvidia-cuda`), `RUSTC_BOOTSTRAP=1` for the
//! unstable device features, and a target directory of its own so it never waits on the lock of
//! the build that runs this script. A kernel that fails to compile fails this build with the
//! compiler's own output; the PTX is always the one just produced from the current sources.
//!
//! `FLASH_ATTN_ARCH` selects the architecture (default `sm_90`, e.g. `sm_80`). The PTX is copied to
//! `target/ptx/<arch>/attention_kernels.ptx` for reading.
//!
//! For `sm_90` (and `sm_90a`) a second module is built for `sm_90a` with `--cfg flash_attn_sm90a`:
//! every kernel plus the `wgmma` ones, which only the `a` target accepts. It is embedded as
//! `attention_kernels_sm90a.ptx` (empty for other architectures) and loaded on compute
//! capability 9.0 devices, whose driver is the only one that runs `sm_90a` code.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNEL_CRATE: &str = "attention-kernels";
const PTX_NAME: &str = "attention_kernels.ptx";
const HOPPER_PTX_NAME: &str = "attention_kernels_sm90a.ptx";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let arch = env::var("FLASH_ATTN_ARCH").unwrap_or_else(|_| "sm_90".to_owned());
    if !arch.starts_with("sm_") || arch.len() < 5 {
        panic!("FLASH_ATTN_ARCH must name an architecture such as sm_90 or sm_80, got {arch:?}");
    }

    let kernel_dir = manifest_dir.join(KERNEL_CRATE);
    println!(
        "cargo:rerun-if-changed={}",
        kernel_dir.join("src").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        kernel_dir.join("Cargo.toml").display()
    );
    println!("cargo:rerun-if-env-changed=FLASH_ATTN_ARCH");

    let target_root = target_root(&out_dir);
    let hopper = arch == "sm_90" || arch == "sm_90a";
    let base_arch = if arch == "sm_90a" { "sm_90" } else { &arch };
    let ptx = build_ptx(&kernel_dir, &target_root, base_arch, false);
    let hopper_ptx = if hopper {
        build_ptx(&kernel_dir, &target_root, "sm_90a", true)
    } else {
        String::new()
    };

    fs::write(out_dir.join(PTX_NAME), &ptx).expect("write embedded PTX");
    fs::write(out_dir.join(HOPPER_PTX_NAME), &hopper_ptx).expect("write embedded PTX");
    let readable = target_root.join("ptx").join(base_arch);
    fs::create_dir_all(&readable).expect("create target/ptx");
    fs::write(readable.join(PTX_NAME), &ptx).expect("write target/ptx copy");
    let hopper_readable = target_root.join("ptx").join("sm_90a").join(PTX_NAME);
    if hopper {
        fs::create_dir_all(hopper_readable.parent().unwrap()).expect("create target/ptx");
        fs::write(&hopper_readable, &hopper_ptx).expect("write target/ptx copy");
    }
    println!(
        "cargo:rustc-env=FLASH_ATTN_PTX_SM90A_PATH={}",
        hopper_readable.display()
    );

    println!("cargo:rustc-env=FLASH_ATTN_PTX_ARCH={base_arch}");
    println!(
        "cargo:rustc-env=FLASH_ATTN_GIT_COMMIT={}",
        git_commit(&manifest_dir)
    );
    println!(
        "cargo:rustc-env=FLASH_ATTN_PTX_PATH={}",
        readable.join(PTX_NAME).display()
    );
}

/// `<target-dir>`: OUT_DIR is `<target-dir>/[<triple>/]<profile>/build/<pkg>-<hash>/out`.
fn target_root(out_dir: &Path) -> PathBuf {
    let profile_dir = out_dir.ancestors().nth(3).expect("OUT_DIR layout");
    let parent = profile_dir.parent().expect("OUT_DIR layout");
    match env::var("TARGET") {
        Ok(t) if parent.file_name().is_some_and(|n| n == t.as_str()) => {
            parent.parent().unwrap().to_path_buf()
        }
        _ => parent.to_path_buf(),
    }
}

/// Compiles the kernel crate for `arch` in `<target-dir>/ptx-build/<arch>`; `wgmma` adds the
/// `flash_attn_sm90a` cfg.
fn build_ptx(kernel_dir: &Path, target_root: &Path, arch: &str, wgmma: bool) -> String {
    // The root package's `tuning` feature compiles the candidate tiles into the PTX too.
    let tuning = env::var_os("CARGO_FEATURE_TUNING").is_some();
    let child_target = target_root.join("ptx-build").join(arch);
    let mut rustflags = format!("-Ctarget-cpu={arch}\x1f-Cllvm-args=-unroll-threshold=1000");
    if wgmma {
        // PTX 8.3 for the vector reductions (`red.global.add.v4.f32`, 8.1+); LLVM would write 8.0.
        // rustc calls the feature unstable and says so in the child build's output.
        rustflags.push_str("\x1f-Ctarget-feature=+ptx83\x1f--cfg\x1fflash_attn_sm90a");
    }
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(kernel_dir)
        .args(["rustc", "--lib", "--release", "--crate-type", "cdylib"])
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .args(["--config", "profile.release.panic=\"abort\""])
        .args(["--config", "profile.release.debug=false"])
        .args(
            tuning
                .then_some(["--features", "tuning"])
                .into_iter()
                .flatten(),
        )
        .arg("--target-dir")
        .arg(&child_target)
        .env("RUSTC_BOOTSTRAP", "1")
        // The tensor-core kernels index register arrays only in loops that must unroll fully (as
        // CUDA's `#pragma unroll` would make them); the default threshold leaves some rolled,
        // which sends the arrays to local memory.
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    // What the parent cargo exports for its own host build must not leak into the device build.
    for var in [
        "RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_MAKEFLAGS",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    let output = cmd.output().expect("run cargo for the kernel build");
    if !output.status.success() {
        panic!(
            "compiling {KERNEL_CRATE} for nvptx64-nvidia-cuda ({arch}) failed:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let ptx_path = child_target
        .join("nvptx64-nvidia-cuda/release")
        .join(PTX_NAME);
    let ptx = fs::read_to_string(&ptx_path).unwrap_or_else(|e| {
        panic!(
            "kernel build succeeded but {} is unreadable: {e}",
            ptx_path.display()
        )
    });
    let expected = format!(".target {arch}");
    if !ptx.contains(&expected) {
        panic!("{} does not contain `{expected}`", ptx_path.display());
    }
    ptx
}

/// `git describe --always --dirty --abbrev=12` of the source tree, for evidence bundles; "unknown"
/// outside a git checkout. Reruns when HEAD moves or the index changes.
fn git_commit(manifest_dir: &Path) -> String {
    let git_dir = manifest_dir.join(".git");
    if git_dir.is_dir() {
        println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", git_dir.join("index").display());
    }
    Command::new("git")
        .args(["describe", "--always", "--dirty", "--abbrev=12"])
        .current_dir(manifest_dir)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned())
}
