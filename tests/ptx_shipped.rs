//! The PTX shipped in `ptx/` is the one the kernel sources produce: `ptx/kernel-sources.sha256`
//! (written by `scripts/regen-ptx.sh`) records the SHA-256 of every file the PTX is a function of
//! and of the modules themselves, and this test recomputes them. A kernel change committed without
//! regenerating fails here; `scripts/regen-ptx.sh --check` (run by `scripts/test.sh`) also
//! rebuilds the PTX and compares it byte for byte.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const RECORD: &str = "ptx/kernel-sources.sha256";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// False (with a SKIP line) where the test binary runs away from the source tree it was built
/// from, e.g. carried to a GPU machine; where the tree is there, every file it needs must be.
fn source_tree_here(test: &str) -> bool {
    let here = root().join("Cargo.toml").is_file();
    if !here {
        eprintln!(
            "SKIP {test}: the source tree {} is not on this machine",
            root().display()
        );
    }
    here
}

fn sha256(path: &Path) -> String {
    let bytes = fs::read(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every file under `dir`, relative to the crate root.
fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(root().join(dir)).unwrap() {
        let entry = entry.unwrap();
        let path = dir.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// `sha256sum`'s lines: hash, two spaces, path.
fn recorded() -> BTreeMap<PathBuf, String> {
    let text = fs::read_to_string(root().join(RECORD)).expect("read ptx/kernel-sources.sha256");
    text.lines()
        .map(|line| {
            let (hash, path) = line
                .split_once("  ")
                .unwrap_or_else(|| panic!("malformed line in {RECORD}: {line:?}"));
            (PathBuf::from(path), hash.to_owned())
        })
        .collect()
}

#[test]
fn shipped_ptx_matches_the_kernel_sources() {
    if !source_tree_here("shipped_ptx_matches_the_kernel_sources") {
        return;
    }
    let mut tracked: Vec<PathBuf> = [
        "attention-kernels/Cargo.toml",
        "build.rs",
        "rust-toolchain.toml",
        "ptx/attention_kernels.ptx",
        "ptx/attention_kernels_sm90a.ptx",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    files_under(Path::new("attention-kernels/src"), &mut tracked);
    let record = recorded();
    let mut stale: Vec<String> = tracked
        .iter()
        .filter(|path| record.get(*path) != Some(&sha256(path)))
        .map(|path| format!("{} (changed or new)", path.display()))
        .collect();
    stale.extend(
        record
            .keys()
            .filter(|path| !tracked.contains(path))
            .map(|path| format!("{} (gone)", path.display())),
    );
    assert!(
        stale.is_empty(),
        "the shipped PTX is stale against: {}. Run scripts/regen-ptx.sh and commit ptx/.",
        stale.join(", ")
    );
}

#[test]
fn shipped_modules_are_the_embedded_ones() {
    if !source_tree_here("shipped_modules_are_the_embedded_ones") {
        return;
    }
    if flash_attn::PTX_ORIGIN != "shipped" {
        eprintln!("SKIP: this build compiled its own PTX (rebuild-ptx)");
        return;
    }
    let read = |p: &str| fs::read_to_string(root().join(p)).unwrap();
    assert_eq!(flash_attn::PTX, read("ptx/attention_kernels.ptx"));
    assert_eq!(
        flash_attn::PTX_SM90A,
        Some(read("ptx/attention_kernels_sm90a.ptx").as_str())
    );
    assert_eq!(flash_attn::PTX_ARCH, "sm_80");
    assert!(flash_attn::PTX.contains("\n.target sm_80"));
}

#[test]
fn launch_bounds_sit_after_their_entries_parameters() {
    let ptx = flash_attn::PTX_SM90A.expect("the build embeds the sm_90a module");
    for &(entry, threads, blocks) in attention_kernels::kernels::sm90::LAUNCH_BOUNDS {
        let header = format!(".visible .entry {entry}(");
        let start = ptx
            .find(&header)
            .unwrap_or_else(|| panic!("{entry} missing"));
        let body = start + ptx[start..].find("\n{").expect("a body");
        let directives = format!(".maxntid {threads}, 1, 1\n.minnctapersm {blocks}");
        assert!(
            ptx[start..body].ends_with(&directives),
            "{entry}: its header does not end with {directives:?}: {:?}",
            &ptx[start..body]
        );
    }
    assert_eq!(
        ptx.matches(".minnctapersm").count(),
        attention_kernels::kernels::sm90::LAUNCH_BOUNDS.len()
    );
}
