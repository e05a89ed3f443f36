//! Plans of calls nobody in this repository picked: random shapes, dtypes, options, forced
//! families and devices (an H100/H200 with and without the `sm_90a` module, an A100, a 99 KiB
//! sm_89 card, a Turing one). No device needed. Every call is either refused with a reason or
//! planned on a kernel the device can launch: an entry point of the module its family loads, a
//! block of at most 1024 threads, shared memory within the device's, a grid within the hardware's
//! extents. A panic anywhere in `Problem::new` or `plan::select` fails the test with the call.
//! `FLASH_ATTN_TEST_SEED` replays a run.

use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};

use flash_attn::plan::select;
use flash_attn::{
    AttentionOptions, AttentionShape, DType, DeviceCaps, Direction, Family, FlashOptions,
    KernelChoice, Plan, Problem,
};
use flash_attn_testkit::testing::fresh_seed;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const CALLS: usize = 12_000;

fn devices() -> Vec<(&'static str, DeviceCaps)> {
    let ada = DeviceCaps {
        compute_capability: (8, 9),
        wgmma: false,
        max_shared_per_block: 99 * 1024,
        multiprocessors: 128,
    };
    let turing = DeviceCaps {
        compute_capability: (7, 5),
        wgmma: false,
        max_shared_per_block: 64 * 1024,
        multiprocessors: 40,
    };
    vec![
        ("sm_90a", DeviceCaps::for_arch("sm_90", true).unwrap()),
        (
            "sm_90 without sm_90a",
            DeviceCaps::for_arch("sm_90", false).unwrap(),
        ),
        ("sm_80", DeviceCaps::for_arch("sm_80", false).unwrap()),
        ("sm_89 99 KiB", ada),
        ("sm_75", turing),
    ]
}

/// A length: mostly small and near the tiles' edges, sometimes large or empty.
fn length(rng: &mut StdRng) -> u32 {
    match rng.gen_range(0..10) {
        0 => 0,
        1 => 1,
        2..=4 => [63, 64, 65, 127, 128, 129, 192, 255, 4096][rng.gen_range(0..9)],
        5 => rng.gen_range(1..=1 << 20),
        _ => rng.gen_range(1..=700),
    }
}

fn head_dim(rng: &mut StdRng) -> u32 {
    match rng.gen_range(0..4) {
        0 => 8 * rng.gen_range(4..=32),
        1 => rng.gen_range(0..=300),
        _ => [32, 64, 80, 96, 128, 160, 192, 256][rng.gen_range(0..8)],
    }
}

/// Increasing offsets of `sequences` packed sequences (decreasing ones sometimes).
fn cu_seqlens(rng: &mut StdRng, sequences: usize) -> Vec<u32> {
    let mut cu = vec![0u32];
    for _ in 0..sequences {
        let next = cu.last().unwrap() + rng.gen_range(0..=300);
        cu.push(next);
    }
    if rng.gen_bool(0.05) && sequences > 1 {
        cu.swap(1, 2);
    }
    cu
}

fn random_call(rng: &mut StdRng) -> (AttentionShape, DType, FlashOptions) {
    let heads_kv = rng.gen_range(1..=8);
    let heads_q = if rng.gen_bool(0.9) {
        heads_kv * rng.gen_range(1..=8)
    } else {
        rng.gen_range(1..=64)
    };
    // A fifth are decode steps: a few query rows, the decode family's head dims.
    let decode = rng.gen_bool(0.2);
    let d = if decode {
        [64, 128][rng.gen_range(0..2)]
    } else {
        head_dim(rng)
    };
    let d_v = if decode || rng.gen_bool(0.8) {
        d
    } else {
        head_dim(rng)
    };
    let n_q = match rng.gen_range(0..10) {
        _ if decode => rng.gen_range(1..=4),
        0..=2 => rng.gen_range(1..=16),
        _ => length(rng),
    };
    // One call in ten packs its sequences: batch 1, the rows their offsets end at.
    let packed = rng.gen_bool(0.1).then(|| {
        let sequences = rng.gen_range(1..=6);
        let q = cu_seqlens(rng, sequences);
        let k = if rng.gen_bool(0.5) {
            q.clone()
        } else {
            cu_seqlens(rng, sequences)
        };
        (q, k)
    });
    let (batch, n_q, n_k) = match &packed {
        Some((q, k)) => (1, *q.last().unwrap(), *k.last().unwrap()),
        None if rng.gen_bool(0.05) => (rng.gen_range(1..=100_000), n_q, length(rng)),
        None => (rng.gen_range(1..=6), n_q, length(rng)),
    };
    let shape = AttentionShape::new(batch, n_q, n_k, heads_q, heads_kv, d).with_head_dim_v(d_v);
    let dtype = [DType::Bf16, DType::F16, DType::F32][rng.gen_range(0..3)];

    let mut a = AttentionOptions::new().causal(rng.gen_bool(0.4));
    if rng.gen_bool(0.1) {
        a = a.scale([0.125, -0.5, 0.0, f32::NAN][rng.gen_range(0..4)]);
    }
    if let Some((q, k)) = packed {
        a = a.packed(q, k);
    } else if batch <= 6 && rng.gen_bool(0.2) {
        let lengths = (0..batch).map(|_| rng.gen_range(0..=n_k + 2)).collect();
        a = a.key_lengths(lengths);
    }
    if rng.gen_bool(0.15) {
        a = a.dropout([0.1, 0.0, 0.5, 1.0, -0.1][rng.gen_range(0..5)], 7, 3);
    }
    if rng.gen_bool(0.15) {
        a = a.window(length(rng), length(rng));
    }
    if rng.gen_bool(0.1) {
        a = a.softcap([30.0, 5.0, 0.0, -1.0][rng.gen_range(0..4)]);
    }
    let heads = |rng: &mut StdRng| {
        if rng.gen_bool(0.9) {
            heads_q
        } else {
            rng.gen_range(1..=64)
        }
    };
    if rng.gen_bool(0.1) {
        let n = heads(rng);
        a = a.alibi_slopes((0..n).map(|i| 0.5f32.powi(i as i32 + 1)).collect());
    }
    if rng.gen_bool(0.1) {
        let n = heads(rng);
        a = a.sinks((0..n).map(|i| i as f32 - 1.5).collect());
    }
    let mut o = FlashOptions::new(a);
    if rng.gen_bool(0.3) {
        let family = Family::ALL[rng.gen_range(0..Family::ALL.len())];
        o = o.kernel(KernelChoice::Only(family));
    }
    if rng.gen_bool(0.15) {
        o = o.deterministic(true);
    }
    if rng.gen_bool(0.05) {
        o = o.decode_splits(Some(rng.gen_range(0..=200)));
    }
    (shape, dtype, o)
}

/// The entry points of the shipped modules (the base one, and the `sm_90a` one where the build
/// has it).
struct Entries {
    base: HashSet<String>,
    sm90a: HashSet<String>,
}

impl Entries {
    fn of(ptx: &str) -> HashSet<String> {
        ptx.split(".entry ")
            .skip(1)
            .filter_map(|rest| {
                rest.split_once('(')
                    .map(|(name, _)| name.trim().to_string())
            })
            .collect()
    }

    fn shipped() -> Entries {
        Entries {
            base: Entries::of(flash_attn::PTX),
            sm90a: flash_attn::PTX_SM90A.map(Entries::of).unwrap_or_default(),
        }
    }
}

/// Why `plan` could not be launched on `device` as planned, if it could not.
fn unlaunchable(
    device: &DeviceCaps,
    choice: KernelChoice,
    plan: &Plan,
    entries: &Entries,
) -> Option<String> {
    let module = match plan.family {
        Family::Sm90 if device.wgmma => &entries.sm90a,
        Family::Sm90 => return Some("the sm90 family without the sm_90a module".into()),
        _ => &entries.base,
    };
    if !module.contains(plan.entry.as_str()) {
        return Some(format!("no entry point {}", plan.entry));
    }
    if matches!(plan.family, Family::Sm80 | Family::Decode) && device.compute_capability.0 < 8 {
        return Some("an mma.sync family below compute capability 8.0".into());
    }
    if let KernelChoice::Only(f) = choice
        && f != plan.family
    {
        return Some(format!("{f} was forced, {} planned", plan.family));
    }
    if plan.threads == 0 || plan.threads > 1024 || !plan.threads.is_multiple_of(32) {
        return Some(format!("{} threads a block", plan.threads));
    }
    if plan.shared_bytes > device.max_shared_per_block {
        return Some(format!("{} bytes of shared memory", plan.shared_bytes));
    }
    let (x, y, z) = plan.grid;
    if x > i32::MAX as u32 || y > 65_535 || z > 65_535 {
        return Some(format!("grid ({x}, {y}, {z})"));
    }
    None
}

#[test]
fn random_calls_are_planned_on_launchable_kernels_or_refused() {
    let seed = fresh_seed("random_calls_are_planned_on_launchable_kernels_or_refused");
    let mut rng = StdRng::seed_from_u64(seed);
    let devices = devices();
    let mut planned = HashMap::<Family, usize>::new();
    let entries = Entries::shipped();
    assert!(entries.base.len() > 100, "{} entries", entries.base.len());
    let mut refused = 0;
    for _ in 0..CALLS {
        let (shape, dtype, options) = random_call(&mut rng);
        let (name, device) = devices[rng.gen_range(0..devices.len())];
        let direction = if rng.gen_bool(0.5) {
            Direction::Forward
        } else {
            Direction::Backward
        };
        // Formatted only for a failure's message.
        let call =
            || format!("{shape:?} {dtype:?} {options:?} {direction:?} on {name} (seed {seed})");
        let planned_call = catch_unwind(AssertUnwindSafe(|| {
            Problem::new(&shape, dtype, &options).and_then(|p| select(&device, &p, direction))
        }))
        .unwrap_or_else(|_| panic!("planning panicked: {}", call()));
        match planned_call {
            Ok(plan) => {
                if let Some(why) = unlaunchable(&device, options.kernel, &plan, &entries) {
                    panic!("{why}: {}\n{plan}", call());
                }
                *planned.entry(plan.family).or_default() += 1;
            }
            Err(e) => {
                let why = e.to_string();
                assert!(
                    !why.trim().is_empty(),
                    "a refusal without a reason: {}",
                    call()
                );
                refused += 1;
            }
        }
    }
    eprintln!("{CALLS} calls: {refused} refused, planned {planned:?}");
    // The draws reach every family and refusals, so the checks above ran on each.
    for family in Family::ALL {
        assert!(
            planned.get(&family).copied().unwrap_or(0) >= 20,
            "{family}: {planned:?}"
        );
    }
    assert!(refused >= CALLS / 20, "{refused} refused");
}
