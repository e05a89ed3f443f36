//! Every entry point of the table of compiled instances (`flash_attn::instances`) is in the module
//! the host loads for its family, the kernels keep their register arrays out of local memory, and
//! the `wgmma` products stay in the kernels' own bodies.

use attention_kernels::kernels::{sm80, sm90};
use flash_attn::Family;
use flash_attn::instances::entry_points;

fn has_entry(ptx: &str, name: &str) -> bool {
    ptx.contains(&format!(".entry {name}("))
}

/// Bytes of the one parameter of entry point `name` in `ptx`.
fn param_bytes(ptx: &str, name: &str) -> usize {
    let decl = format!("{name}_param_0[");
    let at = ptx
        .find(&format!(".entry {name}("))
        .and_then(|e| ptx[e..].find(&decl).map(|d| e + d + decl.len()))
        .unwrap_or_else(|| panic!("{name}: no parameter declaration"));
    let close = ptx[at..].find(']').unwrap();
    ptx[at..at + close].parse::<usize>().unwrap()
}

/// The `wgmma` forward entries the host names for `c`: `(entry, general, padded)` as
/// `sm90::tma_loads` and `sm90::warp_specialized` take them (the window and mods instances
/// take smaller head dims too); the defaults have all five kinds (the mods one on
/// `sm90::mods_config`'s tiles), the tuning candidates the plain one.
fn sm90_forward_entries(dtype: flash_attn::DType, c: &sm90::WgConfig) -> Vec<(String, bool, bool)> {
    use flash_attn::instances::{
        sm90_forward, sm90_forward_mods, sm90_forward_padded, sm90_forward_window,
    };
    let mut entries = vec![(sm90_forward(dtype, c, false), false, false)];
    if sm90::config(c.head_dim) == Some(*c) {
        entries.push((sm90_forward_padded(dtype, c), false, true));
        entries.push((sm90_forward_window(dtype, c), false, true));
        entries.push((sm90_forward(dtype, c, true), true, true));
        entries.push((sm90_forward_mods(dtype, &sm90::mods_config(c)), true, true));
    }
    entries
}

#[test]
fn every_instance_has_its_entry_point() {
    let entries = entry_points();
    for family in Family::ALL {
        assert!(
            entries.iter().any(|e| e.family == family),
            "no {family} entry"
        );
    }
    for e in entries.iter().filter(|e| e.family != Family::Sm90) {
        assert!(has_entry(flash_attn::PTX, &e.name), "{} missing", e.name);
    }
    for name in flash_attn::instances::support_entry_points() {
        assert!(has_entry(flash_attn::PTX, &name), "{name} missing");
        if let Some(hopper) = flash_attn::PTX_SM90A {
            assert!(has_entry(hopper, &name), "{name} missing from sm_90a");
        }
    }
    let Some(hopper) = flash_attn::PTX_SM90A else {
        assert_ne!(
            flash_attn::PTX_ARCH,
            "sm_90",
            "an sm_90 build embeds the sm_90a module"
        );
        return;
    };
    // The sm_90a module holds every kernel of the base module plus the wgmma ones, which the base
    // module must not contain (no other architecture accepts them).
    assert!(hopper.contains(".target sm_90a"));
    assert!(!flash_attn::PTX.contains("wgmma"));
    for e in &entries {
        assert!(has_entry(hopper, &e.name), "{} missing from sm_90a", e.name);
    }
    for d in [64, 128] {
        assert!(sm80::forward::VARIANTS.contains(&sm80::forward::config(d).unwrap()));
        assert!(sm90::VARIANTS.contains(&sm90::config(d).unwrap()));
    }
}

/// A register array the compiler could not keep in registers (a run-time index, a loop that did
/// not unroll) shows as a local-memory depot in the PTX. The tensor-core backward main kernels
/// have none. (The forwards carry a stack frame since the non-finite slow path landed:
/// `reports/ptxas-*.txt` shows its size, the performance log its cost.)
#[test]
fn tensor_core_backward_kernels_use_no_local_memory() {
    let modules = [Some(flash_attn::PTX), flash_attn::PTX_SM90A];
    let backward = |name: &str| {
        name.starts_with("flash_tc_backward_") || name.starts_with("flash_wgmma_backward_")
    };
    for e in entry_points()
        .iter()
        .filter(|e| e.family != Family::Exact && backward(&e.name))
    {
        for ptx in modules.iter().flatten() {
            let Some(start) = ptx.find(&format!(".entry {}(", e.name)) else {
                continue;
            };
            let body = &ptx[start..];
            let body = &body[..body.find("\n}").unwrap_or(body.len())];
            assert!(
                !body.contains("__local_depot"),
                "{} uses local memory",
                e.name
            );
        }
    }
}

/// Every `wgmma.mma_async` of the sm_90a module is in a kernel's body. LLVM may outline a closure
/// that issues products into a `.func` (it did at d = 192); the accumulators then go to local
/// memory around the call, and ptxas serializes every product of the kernel (its note C7520) —
/// 5–6× slower. `scripts/regen-ptx.sh` also runs ptxas on the module and fails on such notes.
#[test]
fn wgmma_products_are_not_outlined() {
    let Some(hopper) = flash_attn::PTX_SM90A else {
        eprintln!("SKIP wgmma_products_are_not_outlined: this build has no sm_90a module");
        return;
    };
    // The definition a line is in: the last top-level header before it (`.visible .entry` for a
    // kernel; `.func` also starts the prototypes at the top, which hold no instructions).
    let mut in_kernel = false;
    let mut function = "";
    let mut products = 0;
    for line in hopper.lines() {
        if let Some(rest) = line.strip_prefix(".visible .entry ") {
            (in_kernel, function) = (true, rest);
        } else if line.starts_with(".func ") || line.starts_with(".visible .func ") {
            (in_kernel, function) = (false, line);
        } else if line.contains("wgmma.mma_async") {
            assert!(in_kernel, "a wgmma product outside a kernel, in {function}");
            products += 1;
        }
    }
    assert!(products > 0, "the sm_90a module has no wgmma products");
}

/// The `wgmma` forward's parameters: the instances `sm90::tma_loads` names take the tensor maps
/// ahead of the others (`TmaForwardParams`), which the host's launcher passes by the same rule;
/// a mismatch would hand a kernel the wrong bytes.
#[test]
fn sm90_forward_entries_take_the_parameters_the_host_passes() {
    use attention_kernels::abi::params::{TensorCoreForwardParams, TmaForwardParams};
    use flash_attn::DType;
    let Some(hopper) = flash_attn::PTX_SM90A else {
        return;
    };
    let (tma, plain) = (
        size_of::<TmaForwardParams>(),
        size_of::<TensorCoreForwardParams>(),
    );
    let mut checked = 0;
    for c in sm90::VARIANTS {
        for dtype in [DType::F16, DType::Bf16] {
            for (name, general, padded) in sm90_forward_entries(dtype, c) {
                let want = if sm90::tma_loads(c, general, padded) {
                    tma
                } else {
                    plain
                };
                assert_eq!(param_bytes(hopper, &name), want, "{name}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 50, "{checked} entries checked");
}

/// The warp-specialized forward instances (`sm90::warp_specialized`) launch a producer
/// warpgroup beside the consumers: the host's thread count, and the `.maxntid` bound the kernel
/// was compiled for (which `setmaxnreg`'s register split needs), are the same, and every other
/// instance has no bound but its own warpgroups'. A kernel launched with fewer threads than it
/// was written for would wait forever on its producer.
#[test]
fn warp_specialized_forward_entries_are_compiled_for_the_threads_the_host_launches() {
    use flash_attn::DType;
    let Some(hopper) = flash_attn::PTX_SM90A else {
        return;
    };
    let bound = |name: &str| {
        let at = hopper
            .find(&format!(".entry {name}("))
            .unwrap_or_else(|| panic!("{name}: no entry"));
        let body = at + hopper[at..].find('{').unwrap();
        let header = &hopper[at..body];
        header.find(".maxntid ").map(|i| {
            header[i + 9..]
                .split(',')
                .next()
                .unwrap()
                .trim()
                .parse::<u32>()
                .unwrap()
        })
    };
    let mut specialized = 0;
    for c in sm90::VARIANTS {
        for dtype in [DType::F16, DType::Bf16] {
            for (name, general, padded) in sm90_forward_entries(dtype, c) {
                let ws = sm90::warp_specialized(c, general, padded);
                let threads = sm90::forward_threads(c, ws);
                assert_eq!(threads, c.threads() + if ws { 128 } else { 0 });
                if ws {
                    assert_eq!(bound(&name), Some(threads), "{name}");
                    specialized += 1;
                } else {
                    assert!(bound(&name).is_none_or(|t| t == threads), "{name}");
                }
            }
        }
    }
    // With the `tuning` feature, the three warp-specialized plain candidates too.
    let candidates = if cfg!(feature = "tuning") { 3 } else { 0 };
    assert_eq!(
        specialized,
        2 * (7 + candidates),
        "d = 64, 80, 96, 128, 160, 192 and 256 (and the candidates), bf16 and f16"
    );
}

/// As above for the `wgmma` backward's main kernels (`sm90::tma_loads_backward`,
/// `TmaBackwardParams`).
#[test]
fn sm90_backward_entries_take_the_parameters_the_host_passes() {
    use attention_kernels::abi::params::{TensorCoreBackwardParams, TmaBackwardParams};
    use flash_attn::DType;
    use flash_attn::instances::{sm90_backward, sm90_backward_mods, sm90_backward_window};
    let Some(hopper) = flash_attn::PTX_SM90A else {
        return;
    };
    let (tma, plain) = (
        size_of::<TmaBackwardParams>(),
        size_of::<TensorCoreBackwardParams>(),
    );
    let mut checked = 0;
    for c in sm90::BACKWARD_VARIANTS {
        // The defaults compile every kind of instance, the plain-only configurations one.
        let kinds = if sm90::backward_config(c.head_dim) == Some(*c) {
            5
        } else {
            1
        };
        for dtype in [DType::F16, DType::Bf16] {
            let entries = [
                (sm90_backward(dtype, c, false, false), false),
                (sm90_backward(dtype, c, false, true), false),
                (sm90_backward_window(dtype, c), false),
                (sm90_backward(dtype, c, true, false), true),
                (
                    sm90_backward_mods(dtype, &sm90::backward_mods_config(c)),
                    true,
                ),
            ];
            for (name, general) in entries.into_iter().take(kinds) {
                let want = if sm90::tma_loads_backward(c, general) {
                    tma
                } else {
                    plain
                };
                assert_eq!(param_bytes(hopper, &name), want, "{name}");
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "{checked} entries checked");
}

/// The FP8 forward's entry takes the parameters `flash_attn::fp8` passes and is compiled for
/// the threads it launches (its producer warpgroup and two consumers), without local memory.
#[test]
fn fp8_forward_entry_matches_its_launch() {
    use attention_kernels::abi::params::Fp8ForwardParams;
    let Some(hopper) = flash_attn::PTX_SM90A else {
        return;
    };
    let c = sm90::FP8_D128;
    let name = flash_attn::instances::sm90_forward_e4m3(&c);
    assert_eq!(param_bytes(hopper, &name), size_of::<Fp8ForwardParams>());
    let at = hopper.find(&format!(".entry {name}(")).unwrap();
    let body = at + hopper[at..].find("\n{").unwrap();
    assert!(
        hopper[at..body].contains(&format!(".maxntid {}, 1, 1", c.threads())),
        "{name}: not compiled for {} threads",
        c.threads()
    );
    let end = body
        + hopper[body..]
            .find("\n.visible")
            .unwrap_or(hopper.len() - body);
    assert!(
        !hopper[body..end].contains(".local"),
        "{name} uses local memory"
    );
}
