//! The GPU test matrix: one list of cases, each run through the public entry points
//! (`flash_attn::forward_into` / `backward_into`) on every kernel family that admits it, forced
//! with `KernelChoice::Only`, against the f64 reference given the same dtype-rounded inputs.
//!
//! Two covering lists (axis `a` of case `i` takes value `i mod |a|`, binary axes at different
//! strides, so every value of every axis appears and pairs vary): one over the exact kernels'
//! whole domain (f32/f16/bf16, both schedules, head dims 16 … 256), one over the tensor-core
//! domain (f16/bf16, head dims 64 and 128, row-owned), both over causal × (N_q, N_k) (tails,
//! N_q ≠ N_k, one token, 4097) × dropout × GQA/MQA × lengths (full, per-item key lengths, packed).
//! Outputs are NaN-poisoned before each launch, so an unwritten element fails. The backward gets
//! O and LSE from the reference forward (O rounded to the dtype), so each pass is checked on its
//! own; its reference takes `D = rowsum(dO ∘ O)` from that rounded O (in a row with one visible
//! key `dP − D` cancels exactly, and the rounding of O alone would otherwise be measured).
//!
//! Bounds on ‖out − ref‖/‖ref‖ (LSE: worst absolute error, 2e-3):
//! - f32 `2e-5` (≪ 1e-4): f32 accumulation over up to 4097 keys (≈ √N·2⁻²⁴ relative) plus the
//!   `ex2.approx`/`lg2.approx` error (≈ 2⁻²²).
//! - f16 `2e-3`: outputs rounded to 11 significant bits (2⁻¹¹ ≈ 4.9e-4 per element) and, in the
//!   backward, D computed from the stored f16 O, which `dS = P(dP − D)` amplifies where dP ≈ D.
//! - bf16 `1e-2`: the same with 8 significant bits (2⁻⁸ ≈ 3.9e-3 per element).
//!
//! dQ and dK also pass within f32's resolution of their terms (`testing::rel_err_of_sums`:
//! `‖out − ref‖ ≤ 4 · 2⁻²⁴ · ‖Σ|terms|‖`): where `dP − D` cancels in every row (one query row
//! that sees one key, `reports/h100/run-bulk-dq-d128/`) the result is rounding alone, far below
//! its terms, and no f32 evaluation holds it to the dtype's relative bound.
//!
//! A fourth list runs every tensor-core head dim (multiples of 8 from 32 to 128, zero-padded to
//! the compiled 64 or 128) over the same axes, one case in four with the window and every
//! score modifier; a fifth head dims 136 … 256 (compiled 192 and 256; the backward in head-dim
//! slices), forward and backward, over the same axes.
//!
//! A sixth list gives V and O head dims of their own (`head_dim_v`: DeepSeek's 192/128, narrower
//! and wider V), on the same axes, on every family.
//!
//! A seventh crosses the window alone with the wide compiled head dims (the plain `window`
//! instances, which the lists above leave to the general and modifier ones there).
//!
//! A third list crosses the local window (left/right 0, one-sided, wider than N, with and without
//! causal), softcap, ALiBi and sink logits (alone and together) with the axes above; the sink
//! gradient `dσ_h` is held to the same bound relative to `Σ_rows |P_sink · D|`.
//!
//! `FLASH_ATTN_FAMILIES=exact,sm80` restricts the families (sanitizer runs one family at a time);
//! `FLASH_ATTN_MATRIX_MAX_LEN=n` keeps the cases whose sequences are at most `n` long and
//! `FLASH_ATTN_MATRIX_MAX_HEAD_DIM=d` those whose head dim is at most `d` (racecheck of the exact
//! kernels, whose every shared-memory access it checks).

use flash_attn::reference::{
    backward_from_output_f32, backward_magnitudes_from_output_f32, forward_f32,
};
use flash_attn::{
    AttentionOptions, AttentionShape, DType, DeviceCaps, Direction, Family, FlashOptions, Gpu,
    KernelChoice, Problem, Schedule,
};
use flash_attn_testkit::family_run::{HostCase, run_case};
use flash_attn_testkit::testing::{
    LengthMode, MATRIX_SIZES, families, fresh_seed, gpu_or_skip, lse_err, rel_err, rel_err_of_sums,
    skip,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The local window and score modifiers of a case (`AttentionOptions::window`, `softcap`,
/// `alibi_slopes`, `sinks`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mods {
    None,
    /// (left, right) extents.
    Window(u32, u32),
    Softcap,
    Alibi,
    Sinks,
    /// Window, softcap, ALiBi and sinks together.
    All(u32, u32),
}

impl Mods {
    fn apply(self, mut a: AttentionOptions, heads_q: u32, rng: &mut StdRng) -> AttentionOptions {
        let softcap = |a: AttentionOptions| a.softcap(3.0);
        let alibi = |a: AttentionOptions| a.alibi_slopes(flash_attn::alibi_slopes(heads_q));
        let mut sinks = |a: AttentionOptions| {
            a.sinks((0..heads_q).map(|_| rng.gen_range(-1.0f32..3.0)).collect())
        };
        match self {
            Mods::None => {}
            Mods::Window(l, r) => a = a.window(l, r),
            Mods::Softcap => a = softcap(a),
            Mods::Alibi => a = alibi(a),
            Mods::Sinks => a = sinks(a),
            Mods::All(l, r) => a = sinks(alibi(softcap(a.window(l, r)))),
        }
        a
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    schedule: Schedule,
    causal: bool,
    head_dim: u32,
    /// V's and O's head dim.
    head_dim_v: u32,
    n_q: u32,
    n_k: u32,
    dropout: bool,
    heads: (u32, u32),
    lengths: LengthMode,
    mods: Mods,
}

const EXACT_HEAD_DIMS: [u32; 8] = [16, 32, 40, 64, 80, 96, 128, 256];

/// The exact kernels' domain. Long sequences keep the head count and head dim modest so the f64
/// reference stays in seconds.
fn exact_cases() -> Vec<Case> {
    let heads = [(2, 2), (4, 2), (3, 1)];
    let mut short_cases = 0;
    (0..36)
        .map(|i| {
            let (n_q, n_k) = MATRIX_SIZES[i % MATRIX_SIZES.len()];
            let long = n_q.max(n_k) >= 1000;
            short_cases += !long as usize;
            let head_dim = if long {
                EXACT_HEAD_DIMS[i % 4]
            } else {
                EXACT_HEAD_DIMS[short_cases % 8]
            };
            Case {
                dtype: [DType::F32, DType::F16, DType::Bf16][i % 3],
                schedule: [Schedule::RowOwned, Schedule::Paper][(i / 3) % 2],
                causal: (i / 2) % 2 == 1,
                head_dim,
                head_dim_v: head_dim,
                n_q,
                n_k,
                dropout: (i / 5) % 2 == 1,
                heads: if long { (2, 1) } else { heads[(i / 4) % 3] },
                lengths: LengthMode::ALL[(i / 7) % 3],
                mods: Mods::None,
            }
        })
        .collect()
}

/// The tensor-core domain: both tensor-core families admit every case
/// (`tensor_core_lists_run_on_both_tensor_core_families`).
fn tensor_core_cases() -> Vec<Case> {
    let heads = [(2, 2), (4, 2), (3, 1)];
    (0..36)
        .map(|i| {
            let (n_q, n_k) = MATRIX_SIZES[i % MATRIX_SIZES.len()];
            let long = n_q.max(n_k) >= 1000;
            Case {
                dtype: [DType::Bf16, DType::F16][i % 2],
                schedule: Schedule::RowOwned,
                causal: (i / 2) % 2 == 1,
                head_dim: [64, 128][(i / 3) % 2],
                head_dim_v: [64, 128][(i / 3) % 2],
                n_q,
                n_k,
                dropout: (i / 5) % 2 == 1,
                heads: if long { (2, 1) } else { heads[(i / 4) % 3] },
                lengths: LengthMode::ALL[(i / 7) % 3],
                mods: Mods::None,
            }
        })
        .collect()
}

/// The tensor-core head dims from 32 to 128: the multiples of 8, padded to the compiled 64 or
/// 128 (zero columns on load, only the real ones stored).
const TENSOR_CORE_HEAD_DIMS: [u32; 13] = [32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128];
/// The wide ones (padded to the compiled 192 or 256, whose backward runs in head-dim slices):
/// every multiple of 8 between 128 and 192 and a spread above it.
const WIDE_HEAD_DIMS: [u32; 11] = [136, 144, 152, 160, 168, 176, 184, 192, 200, 232, 256];

/// Twice each of `dims`, so that each meets both dtypes, over causal, GQA/MQA, tails, length
/// modes, dropout, and the window with every score modifier (the `mods_` instances pad too).
fn head_dim_cases(dims: &[u32]) -> Vec<Case> {
    let sizes = [(128, 128), (97, 230), (230, 97), (1, 17), (1000, 1000)];
    let heads = [(2, 2), (4, 2), (3, 1)];
    (0..2 * dims.len())
        .map(|i| {
            let (n_q, n_k) = sizes[i % sizes.len()];
            let long = n_q.max(n_k) >= 1000;
            // The first pass has full lengths and no dropout (the default instances), the
            // second lengths and dropout (the general instances).
            let first_pass = i < dims.len();
            Case {
                dtype: [DType::Bf16, DType::F16][i % 2],
                schedule: Schedule::RowOwned,
                causal: (i / 2) % 2 == 1,
                head_dim: dims[i % dims.len()],
                head_dim_v: dims[i % dims.len()],
                n_q,
                n_k,
                dropout: !first_pass && i % 3 == 1,
                heads: if long { (2, 1) } else { heads[(i / 4) % 3] },
                lengths: if first_pass {
                    LengthMode::Full
                } else {
                    LengthMode::ALL[i % 3]
                },
                mods: if i % 4 == 3 {
                    Mods::All(64, 7)
                } else {
                    Mods::None
                },
            }
        })
        .collect()
}

/// The window alone at the wide compiled head dims, full lengths and no dropout, so that the
/// plain `window` instances run (the general and modifier ones take the window in
/// [`head_dim_cases`]): windows that skip blocks, with and without causal, under GQA.
fn wide_window_cases() -> Vec<Case> {
    let shapes = [
        ((97, 230), (64, 7), (2, 1)),
        ((230, 97), (16, 0), (4, 2)),
        ((1000, 1000), (100, 30), (2, 1)),
    ];
    [160, 192, 256]
        .into_iter()
        .flat_map(|d| shapes.into_iter().enumerate().map(move |(j, s)| (d, j, s)))
        .map(|(d, j, ((n_q, n_k), (left, right), heads))| Case {
            dtype: [DType::Bf16, DType::F16][j % 2],
            schedule: Schedule::RowOwned,
            causal: j % 2 == 1,
            head_dim: d,
            head_dim_v: d,
            n_q,
            n_k,
            dropout: false,
            heads,
            lengths: LengthMode::Full,
            mods: Mods::Window(left, right),
        })
        .collect()
}

/// (Q/K head dim, V/O head dim) pairs that differ: DeepSeek's MLA (192, 128), narrower and wider
/// V at the compiled head dims and between them (both padded to the wider one's instance).
const VALUE_HEAD_DIMS: [(u32, u32); 8] = [
    (192, 128),
    (128, 64),
    (64, 128),
    (96, 64),
    (256, 128),
    (48, 160),
    (128, 256),
    (72, 40),
];

/// Each pair of [`VALUE_HEAD_DIMS`] twice, over the axes of [`head_dim_cases`] (the second time
/// with key lengths or packed sequences), one case in five in f32 (the exact kernels only).
fn value_head_dim_cases() -> Vec<Case> {
    let n = VALUE_HEAD_DIMS.len();
    let dims: Vec<u32> = VALUE_HEAD_DIMS.iter().map(|&(d, _)| d).collect();
    head_dim_cases(&dims)
        .into_iter()
        .enumerate()
        .map(|(i, c)| Case {
            head_dim_v: VALUE_HEAD_DIMS[i % n].1,
            dtype: if i % 5 == 4 { DType::F32 } else { c.dtype },
            lengths: if i < n {
                c.lengths
            } else {
                LengthMode::ALL[1 + i % 2]
            },
            ..c
        })
        .collect()
}

/// The window and score modifiers over both domains' dtypes and head dims: windows with
/// left/right 0, one-sided, wider than the sequence, with and without causal, each modifier
/// alone and all together, under GQA, length masks and dropout.
fn score_mod_cases() -> Vec<Case> {
    let mods = [
        Mods::Window(0, 0),
        Mods::Window(16, 0),
        Mods::Window(3, 40),
        Mods::Window(u32::MAX, 0),
        Mods::Window(5000, 5000),
        Mods::Window(0, u32::MAX),
        Mods::Softcap,
        Mods::Alibi,
        Mods::Sinks,
        Mods::All(64, 7),
        Mods::All(200, 0),
    ];
    let sizes = [(128, 128), (97, 230), (230, 97), (1, 17), (1000, 1000)];
    let heads = [(2, 2), (4, 2), (3, 1)];
    (0..33)
        .map(|i| {
            let (n_q, n_k) = sizes[i % sizes.len()];
            let long = n_q.max(n_k) >= 1000;
            Case {
                dtype: [DType::Bf16, DType::F16, DType::F32][i % 3],
                // The paper schedule on half the f32 cases (exact only, like f32).
                schedule: if i % 3 == 2 && (i / 3) % 2 == 1 {
                    Schedule::Paper
                } else {
                    Schedule::RowOwned
                },
                causal: (i / 2) % 2 == 1,
                head_dim: [64, 128][(i / 3) % 2],
                head_dim_v: [64, 128][(i / 3) % 2],
                n_q,
                n_k,
                dropout: i % 7 == 3,
                heads: if long { (2, 1) } else { heads[(i / 4) % 3] },
                lengths: LengthMode::ALL[(i / 5) % 3],
                mods: mods[i % mods.len()],
            }
        })
        .collect()
}

impl Case {
    fn shape_and_options(&self, rng: &mut StdRng) -> (AttentionShape, FlashOptions) {
        let shape = AttentionShape {
            batch: self.lengths.batch(),
            n_q: self.n_q,
            n_k: self.n_k,
            heads_q: self.heads.0,
            heads_kv: self.heads.1,
            head_dim: self.head_dim,
            head_dim_v: self.head_dim_v,
        };
        let mut a = self.lengths.apply(
            AttentionOptions::new().causal(self.causal),
            (self.n_q, self.n_k),
            rng,
        );
        if self.dropout {
            a = a.dropout(0.17, rng.r#gen(), rng.gen_range(0..1000));
        }
        a = self.mods.apply(a, self.heads.0, rng);
        (shape, FlashOptions::new(a).schedule(self.schedule))
    }
}

fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        DType::Bf16 => 1e-2,
    }
}

/// The limit `var` sets, or none.
fn limit(var: &str) -> u32 {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{var} must be a number"))
        })
        .unwrap_or(u32::MAX)
}

/// Host inputs of one case and their f64 reference results.
struct Reference {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
    /// dQ's and dK's sums over their terms' magnitudes, the scale of their f32 rounding where
    /// the terms cancel ([`rel_err_of_sums`]).
    dq_magnitudes: Vec<f64>,
    dk_magnitudes: Vec<f64>,
    d_sinks: Option<Vec<f64>>,
    /// Per head `Σ_rows |P_sink · D|`, the scale of `dσ_h` (a sum of terms of both signs).
    d_sink_scale: Vec<f64>,
}

fn reference(
    shape: &AttentionShape,
    options: &AttentionOptions,
    dt: DType,
    rng: &mut StdRng,
) -> Reference {
    let mut draw = |n: usize, amp: f32| -> Vec<f32> {
        (0..n)
            .map(|_| dt.round(rng.gen_range(-1.0f32..1.0) * amp))
            .collect()
    };
    let (q, k, v, d_o) = (
        draw(shape.q_elems(), 1.5),
        draw(shape.k_elems(), 1.5),
        draw(shape.v_elems(), 1.5),
        draw(shape.o_elems(), 1.0),
    );
    let f = forward_f32(shape, &q, &k, &v, options).unwrap();
    // The kernels read O rounded to the dtype; the reference takes D from that same O.
    let stored_o: Vec<f32> = f.o.iter().map(|&x| dt.round(x as f32)).collect();
    let g = backward_from_output_f32(shape, (&q, &k, &v), &stored_o, &d_o, options).unwrap();
    let magnitudes =
        backward_magnitudes_from_output_f32(shape, (&q, &k, &v), &stored_o, &d_o, options).unwrap();
    // Per head `Σ_rows |P_sink · D|`.
    let d_sink_scale = magnitudes
        .d_sinks
        .unwrap_or_else(|| vec![0.0; shape.heads_q as usize]);
    Reference {
        q,
        k,
        v,
        d_o,
        o: f.o,
        lse: f.lse,
        dq: g.dq,
        dk: g.dk,
        dv: g.dv,
        dq_magnitudes: magnitudes.dq,
        dk_magnitudes: magnitudes.dk,
        d_sinks: g.d_sinks,
        d_sink_scale,
    }
}

/// Worst `|got − want|` of the sink gradients over their scale; 0 without sinks, NaN where one
/// is missing or NaN.
fn d_sink_err(got: &Option<Vec<f32>>, r: &Reference) -> f64 {
    match (got, &r.d_sinks) {
        (None, None) => 0.0,
        (Some(got), Some(want)) => got
            .iter()
            .zip(want)
            .zip(&r.d_sink_scale)
            .map(|((&g, &w), &scale)| (g as f64 - w).abs() / scale.max(1e-30))
            .fold(
                0.0,
                |m: f64, e| if e.is_nan() { f64::NAN } else { m.max(e) },
            ),
        _ => f64::NAN,
    }
}

/// Forward and backward of one case on one family, each error by name; `None` where the family
/// does not admit the case (the plan says why).
fn run_family(
    gpu: &Gpu,
    shape: &AttentionShape,
    options: &FlashOptions,
    dt: DType,
    r: &Reference,
) -> Option<Vec<(&'static str, f64)>> {
    let case = HostCase {
        q: &r.q,
        k: &r.k,
        v: &r.v,
        d_o: &r.d_o,
        o: &r.o,
        lse: &r.lse,
    };
    let got = run_case(gpu, shape, options, dt, &case)?;
    Some(vec![
        ("o", rel_err(&got.o, &r.o)),
        ("lse", lse_err(&got.lse, &r.lse)),
        (
            "dq",
            rel_err_of_sums(&got.dq, &r.dq, &r.dq_magnitudes, bound(dt)),
        ),
        (
            "dk",
            rel_err_of_sums(&got.dk, &r.dk, &r.dk_magnitudes, bound(dt)),
        ),
        ("dv", rel_err(&got.dv, &r.dv)),
        ("dsink", d_sink_err(&got.d_sinks, r)),
    ])
}

/// Runs `list` on every family.
fn run_matrix(test: &str, list: Vec<Case>) {
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let max_len = limit("FLASH_ATTN_MATRIX_MAX_LEN");
    let max_head_dim = limit("FLASH_ATTN_MATRIX_MAX_HEAD_DIM");
    let all = list.len();
    let list: Vec<Case> = list
        .into_iter()
        .filter(|c| c.n_q.max(c.n_k) <= max_len && c.head_dim.max(c.head_dim_v) <= max_head_dim)
        .collect();
    if list.len() < all {
        eprintln!(
            "FLASH_ATTN_MATRIX_MAX_LEN={max_len} FLASH_ATTN_MATRIX_MAX_HEAD_DIM={max_head_dim}: {} of {all} cases",
            list.len()
        );
    }
    let families = families();
    let mut failures = vec![];
    let mut ran = vec![0usize; families.len()];
    for case in &list {
        let (shape, options) = case.shape_and_options(&mut rng);
        let r = reference(&shape, &options.attention, case.dtype, &mut rng);
        for (i, &family) in families.iter().enumerate() {
            let forced = options.clone().kernel(KernelChoice::Only(family));
            let Some(errs) = run_family(&gpu, &shape, &forced, case.dtype, &r) else {
                continue;
            };
            ran[i] += 1;
            let lse_ok = errs[1].1 <= 2e-3;
            let ok = lse_ok
                && errs
                    .iter()
                    .filter(|e| e.0 != "lse")
                    .all(|e| e.1 <= bound(case.dtype));
            let line = format!(
                "{} {family:<5} {case:?}: {}",
                if ok { "ok  " } else { "FAIL" },
                errs.iter()
                    .map(|(n, e)| format!("{n} {e:.2e}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            eprintln!("{line}");
            if !ok {
                failures.push(line);
            }
        }
    }
    for (family, n) in families.iter().zip(&ran) {
        eprintln!("{test}: {family} ran {n} of {} cases", list.len());
        if *n == 0 {
            skip(
                test,
                &format!("{family}: no case admitted on {}", gpu.device_name()),
            );
        }
    }
    assert!(
        failures.is_empty(),
        "cases over their bound:\n{}",
        failures.join("\n")
    );
}

#[test]
fn exact_domain_on_every_family() {
    let list = exact_cases();
    for d in EXACT_HEAD_DIMS {
        assert!(list.iter().any(|c| c.head_dim == d), "head dim {d} missing");
    }
    run_matrix("exact_domain_on_every_family", list);
}

#[test]
fn score_modifiers_on_every_family() {
    let list = score_mod_cases();
    for mode in LengthMode::ALL {
        assert!(
            list.iter()
                .any(|c| c.lengths == mode && c.mods != Mods::None)
        );
    }
    for causal in [false, true] {
        assert!(
            list.iter()
                .any(|c| c.causal == causal && matches!(c.mods, Mods::Window(..) | Mods::All(..)))
        );
    }
    run_matrix("score_modifiers_on_every_family", list);
}

#[test]
fn tensor_core_domain_on_every_family() {
    let list = tensor_core_cases();
    for n in [1, 17, 97, 128, 1000, 4097] {
        assert!(list.iter().any(|c| c.n_q == n) && list.iter().any(|c| c.n_k == n));
    }
    for d in [64, 128] {
        for mode in LengthMode::ALL {
            assert!(
                list.iter().any(|c| c.head_dim == d && c.lengths == mode),
                "d={d} {mode:?} missing"
            );
        }
    }
    run_matrix("tensor_core_domain_on_every_family", list);
}

/// `list` covers every head dim of `dims` in both dtypes, with a case on the default instances.
fn assert_head_dims_covered(list: &[Case], dims: &[u32]) {
    for &d in dims {
        for dtype in [DType::Bf16, DType::F16] {
            assert!(
                list.iter().any(|c| c.head_dim == d && c.dtype == dtype),
                "d={d} {dtype:?} missing"
            );
        }
        assert!(
            list.iter()
                .any(|c| c.head_dim == d && c.lengths == LengthMode::Full && !c.dropout),
            "d={d} has no case without lengths or dropout"
        );
    }
}

#[test]
fn tensor_core_head_dims_on_every_family() {
    let list = head_dim_cases(&TENSOR_CORE_HEAD_DIMS);
    assert_head_dims_covered(&list, &TENSOR_CORE_HEAD_DIMS);
    run_matrix("tensor_core_head_dims_on_every_family", list);
}

/// The wide head dims, forward and backward (the backward's head-dim slices: 128 + 64 columns
/// at the compiled 192, 128 + 128 at 256).
#[test]
fn tensor_core_wide_head_dims_on_every_family() {
    let list = head_dim_cases(&WIDE_HEAD_DIMS);
    assert_head_dims_covered(&list, &WIDE_HEAD_DIMS);
    run_matrix("tensor_core_wide_head_dims_on_every_family", list);
}

/// The window alone at d = 160, 192 and 256, forward and backward ([`wide_window_cases`]).
#[test]
fn wide_head_dims_under_a_window_on_every_family() {
    run_matrix(
        "wide_head_dims_under_a_window_on_every_family",
        wide_window_cases(),
    );
}

/// V and O of another head dim than Q and K, forward and backward, on every family.
#[test]
fn value_head_dims_on_every_family() {
    let list = value_head_dim_cases();
    for (d, d_v) in VALUE_HEAD_DIMS {
        assert!(
            list.iter()
                .any(|c| (c.head_dim, c.head_dim_v) == (d, d_v) && c.lengths != LengthMode::Full),
            "({d}, {d_v}) missing with length masks"
        );
    }
    run_matrix("value_head_dims_on_every_family", list);
}

/// Every case of the tensor-core lists (the half-precision, row-owned ones of the modifiers'
/// list) is planned on both tensor-core families of an H200, in every direction its test runs:
/// their GPU tests run each, none is left out as refused. Needs no device.
#[test]
fn tensor_core_lists_run_on_both_tensor_core_families() {
    let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
    let both = [Direction::Forward, Direction::Backward];
    let half = |c: &Case| c.dtype != DType::F32 && c.schedule == Schedule::RowOwned;
    let lists = [
        (tensor_core_cases(), &both[..]),
        (head_dim_cases(&TENSOR_CORE_HEAD_DIMS), &both[..]),
        (head_dim_cases(&WIDE_HEAD_DIMS), &both[..]),
        (wide_window_cases(), &both[..]),
        (
            value_head_dim_cases().into_iter().filter(half).collect(),
            &both[..],
        ),
        (
            score_mod_cases().into_iter().filter(half).collect(),
            &both[..],
        ),
    ];
    let mut rng = StdRng::seed_from_u64(1);
    for (list, directions) in lists {
        for case in &list {
            let (shape, options) = case.shape_and_options(&mut rng);
            for family in [Family::Sm80, Family::Sm90] {
                let forced = options.clone().kernel(KernelChoice::Only(family));
                let problem = Problem::new(&shape, case.dtype, &forced).unwrap();
                for &direction in directions {
                    let plan = flash_attn::plan::select(&h200, &problem, direction);
                    assert!(plan.is_ok(), "{family} {direction:?} {case:?}: {plan:?}");
                }
            }
        }
    }
}
