//! Provides the PTX this crate embeds: the kernels of `attention-kernels` as two modules, a base
//! one (every kernel but the `wgmma` ones) and the `sm_90a` one (all of them), which the runtime
//! loads on compute capability 9.0 devices, whose driver is the only one that runs `sm_90a` code.
//!
//! By default they are the modules shipped in `ptx/` (base module for `sm_80`, which every later
//! architecture can JIT from), produced by `scripts/regen-ptx.sh` from the kernel sources recorded
//! in `ptx/kernel-sources.sha256`: building needs no child build, no nightly feature and no
//! component beyond a default toolchain's, so a dependent builds with any toolchain from the MSRV.
//!
//! With the `rebuild-ptx` feature (implied by `tuning`), this script compiles them from the
//! sources instead, with rustc's NVPTX backend. The child build uses the pinned toolchain of
//! `rust-toolchain.toml` with `-Zbuild-std=core` (no prebuilt `rust-std` exists for
//! `nvptx64-nvidia-cuda`), `RUSTC_BOOTSTRAP=1` for the unstable device features, and a target
//! directory of its own so it never waits on the lock of the build that runs this script. A
//! kernel that fails to compile fails this build with the compiler's own output.
//! `FLASH_ATTN_ARCH` selects the base module's architecture (default `sm_80`, e.g. `sm_90`); the
//! `sm_90a` module is built with `--cfg flash_attn_sm90a`, which adds the `wgmma` kernels. The
//! rebuilt PTX is written to `target/ptx/<arch>/attention_kernels.ptx`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const KERNEL_CRATE: &str = "attention-kernels";
const PTX_NAME: &str = "attention_kernels.ptx";

const SHIPPED_DIR: &str = "ptx";
const SHIPPED_BASE: &str = "attention_kernels.ptx";
const SHIPPED_HOPPER: &str = "attention_kernels_sm90a.ptx";
/// The architecture of the shipped base module (and the default of a rebuilt one).
const DEFAULT_ARCH: &str = "sm_80";

// `LAUNCH_BOUNDS`, `TUNING_LAUNCH_BOUNDS`: the sm_90a entries compiled for a number of resident
// blocks per SM.
include!("attention-kernels/src/kernels/sm90/launch_bounds.rs");

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=FLASH_ATTN_ARCH");
    let arch = env::var("FLASH_ATTN_ARCH").ok();
    let rebuild = env::var_os("CARGO_FEATURE_REBUILD_PTX").is_some();

    // (embedded file, readable copy) of each module.
    let (base, hopper, base_arch) = if rebuild {
        let arch = arch.unwrap_or_else(|| DEFAULT_ARCH.to_owned());
        if !arch.starts_with("sm_") || arch.len() < 5 || arch.ends_with('a') {
            panic!(
                "FLASH_ATTN_ARCH must name the base module's architecture, such as sm_80 or sm_90, got {arch:?}"
            );
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
        let target_root = target_root(&out_dir);
        // Embedded from OUT_DIR, which is this feature set's own; `target/ptx` is shared by every
        // build (with and without `tuning`) and only for reading.
        let write = |arch: &str, wgmma: bool, embedded: &str| {
            let ptx = build_ptx(&kernel_dir, &target_root, arch, wgmma);
            fs::write(out_dir.join(embedded), &ptx).expect("write OUT_DIR PTX");
            let dir = target_root.join("ptx").join(arch);
            fs::create_dir_all(&dir).expect("create target/ptx");
            fs::write(dir.join(PTX_NAME), &ptx).expect("write target/ptx copy");
            (out_dir.join(embedded), dir.join(PTX_NAME))
        };
        let base = write(&arch, false, SHIPPED_BASE);
        let hopper = write("sm_90a", true, SHIPPED_HOPPER);
        (base, hopper, arch)
    } else {
        let shipped = manifest_dir.join(SHIPPED_DIR);
        let (base, hopper) = (shipped.join(SHIPPED_BASE), shipped.join(SHIPPED_HOPPER));
        for path in [&base, &hopper] {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        let text = fs::read_to_string(&base)
            .unwrap_or_else(|e| panic!("the shipped PTX {} is unreadable: {e}", base.display()));
        let shipped_arch = text
            .lines()
            .find_map(|l| l.strip_prefix(".target "))
            .unwrap_or_else(|| panic!("{} names no .target", base.display()))
            .trim()
            .to_owned();
        if let Some(arch) = arch.filter(|a| *a != shipped_arch) {
            panic!(
                "FLASH_ATTN_ARCH={arch}: the shipped base module is for {shipped_arch}; enable the \
                 `rebuild-ptx` feature to compile the kernels for another architecture"
            );
        }
        ((base.clone(), base), (hopper.clone(), hopper), shipped_arch)
    };

    for (name, (embedded, readable)) in [("PTX", base), ("PTX_SM90A", hopper)] {
        println!(
            "cargo:rustc-env=FLASH_ATTN_{name}_EMBEDDED={}",
            embedded.display()
        );
        println!(
            "cargo:rustc-env=FLASH_ATTN_{name}_PATH={}",
            readable.display()
        );
    }
    println!("cargo:rustc-env=FLASH_ATTN_PTX_ARCH={base_arch}");
    println!(
        "cargo:rustc-env=FLASH_ATTN_PTX_ORIGIN={}",
        if rebuild { "rebuilt" } else { "shipped" }
    );
    println!(
        "cargo:rustc-env=FLASH_ATTN_GIT_COMMIT={}",
        git_commit(&manifest_dir)
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

/// Compiles the kernel crate for `arch` in `<target-dir>/ptx-build/<arch>[-tuning]`; `wgmma` adds
/// the `flash_attn_sm90a` cfg.
fn build_ptx(kernel_dir: &Path, target_root: &Path, arch: &str, wgmma: bool) -> String {
    // The root package's `tuning` feature compiles the candidate tiles into the PTX too. Its own
    // target directory: the PTX file carries no feature hash in its name, so a build that shared
    // the directory could find its unit fresh and read the other feature set's PTX.
    let tuning = env::var_os("CARGO_FEATURE_TUNING").is_some();
    let child_target = target_root.join("ptx-build").join(if tuning {
        format!("{arch}-tuning")
    } else {
        arch.to_owned()
    });
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
    if wgmma { with_launch_bounds(ptx) } else { ptx }
}

/// `ptx` with each [`LAUNCH_BOUNDS`] entry's (and in a `tuning` build each
/// [`TUNING_LAUNCH_BOUNDS`] entry's) `.maxntid` and `.minnctapersm` directives after its
/// parameter list (between the `)` closing it and the `{` of its body); an entry missing from the
/// module fails the build rather than losing its bounds.
fn with_launch_bounds(mut ptx: String) -> String {
    let tuning: &[(&str, u32, u32)] = if env::var_os("CARGO_FEATURE_TUNING").is_some() {
        TUNING_LAUNCH_BOUNDS
    } else {
        &[]
    };
    for &(entry, threads, blocks) in LAUNCH_BOUNDS.iter().chain(tuning) {
        let header = format!(".visible .entry {entry}(");
        let start = ptx
            .find(&header)
            .unwrap_or_else(|| panic!("LAUNCH_BOUNDS names {entry}, which the sm_90a PTX lacks"));
        let params_end = start
            + ptx[start..]
                .find("\n)")
                .unwrap_or_else(|| panic!("{entry}: no end of its parameter list"));
        let line_end = params_end + 1 + ptx[params_end + 1..].find('\n').expect("a line end");
        ptx.insert_str(
            line_end + 1,
            &format!(".maxntid {threads}, 1, 1\n.minnctapersm {blocks}\n"),
        );
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
