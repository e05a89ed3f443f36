//! The reference's policy for non-finite inputs and masked keys (`attention_host::reference`),
//! on every GPU family, forward and backward: the exact SIMT kernels, the `mma.sync` tensor-core
//! kernels and the `wgmma` ones (each forced), against the f64 reference given the same
//! dtype-rounded inputs. NaN and infinite positions of O, LSE, dQ, dK, dV must be the
//! reference's exactly; finite positions are held to the matrix tests' bounds
//! (`flash_attn::testing::{rel_err, lse_err}`).
//!
//! Scenarios: NaN in one Q row; +∞ in one Q row (its scores ±∞); +∞ in one K row at a key every
//! row sees; NaN/±∞ in K and V past a batch item's key length, and in a neighbouring packed
//! sequence; NaN in V or K at a causally masked key that only the last row sees; empty rows (key
//! length 0, causal with N_q > N_k) next to NaN inputs. Lengths of 300 and more over several
//! tiles with tails. Local windows with NaN/±∞ in K and V of keys outside most rows' windows
//! (windowed-out keys are masked keys). Pairs the plan refuses (the decode family runs no
//! backward) are counted per family in a visible line. Where no CUDA device answers, the test
//! prints `SKIP` and returns.
//!
//! Every family runs through the public entry points (`forward_into` / `backward_into`, forced
//! with `KernelChoice::Only`) into NaN-poisoned outputs; the backward gets O and LSE from the
//! reference forward (O rounded to the dtype), as in `tests/gpu_matrix.rs`.
//! `FLASH_ATTN_FAMILIES` restricts the families (sanitizer runs).

use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::{
    AttentionOptions, AttentionShape, DType, Family, FlashOptions, Gpu, KernelChoice,
};
use flash_attn_testkit::family_run::{HostCase, Outputs, run_case};
use flash_attn_testkit::testing::{families, fresh_seed, gpu_or_skip, lse_err, rel_err, skip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

struct Scenario {
    name: String,
    shape: AttentionShape,
    options: AttentionOptions,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    d_o: Vec<f32>,
}

fn shape(batch: u32, n_q: u32, n_k: u32, head_dim: u32) -> AttentionShape {
    AttentionShape::new(batch, n_q, n_k, 2, 1, head_dim)
}

fn random(rng: &mut StdRng, n: usize, amp: f32, dt: DType) -> Vec<f32> {
    (0..n)
        .map(|_| dt.round(rng.gen_range(-1.0f32..1.0) * amp))
        .collect()
}

/// Element offset of (batch item, row, head) in a `[batch, n, heads, d]` tensor.
fn at(s: &AttentionShape, n: u32, heads: u32, item: u32, row: u32, head: u32) -> usize {
    ((item as usize * n as usize + row as usize) * heads as usize + head as usize)
        * s.head_dim as usize
}

fn q_row(s: &AttentionShape, item: u32, row: u32, head: u32) -> usize {
    at(s, s.n_q, s.heads_q, item, row, head)
}

fn kv_row(s: &AttentionShape, item: u32, row: u32) -> usize {
    at(s, s.n_k, s.heads_kv, item, row, 0)
}

const POISONS: [f32; 3] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];

fn scenarios(rng: &mut StdRng, dt: DType, d: u32) -> Vec<Scenario> {
    let mut out = vec![];
    let mut base = |name: &str, shape: AttentionShape, options: AttentionOptions| {
        let q = random(rng, shape.q_elems(), 1.5, dt);
        let k = random(rng, shape.k_elems(), 1.5, dt);
        let v = random(rng, shape.v_elems(), 1.5, dt);
        let d_o = random(rng, shape.o_elems(), 1.0, dt);
        Scenario {
            name: format!("{name} d={d} {shape:?} causal={}", options.causal),
            shape,
            options,
            q,
            k,
            v,
            d_o,
        }
    };
    for causal in [false, true] {
        let opts = AttentionOptions::new().causal(causal);
        // NaN in one element of one Q row (row 200 of item 0, head 1).
        let s = shape(1, 333, 333, d);
        let mut c = base("nan_q_row", s, opts.clone());
        c.q[q_row(&s, 0, 200, 1) + 3] = f32::NAN;
        out.push(c);
        // +∞ in one Q row: its scores are ±∞ (NaN row unless every score is −∞).
        let s = shape(1, 300, 413, d);
        let mut c = base("inf_q_row", s, opts.clone());
        c.q[q_row(&s, 0, 299, 0) + 5] = f32::INFINITY;
        out.push(c);
        // −∞ in one Q row against keys positive in that column: every score is −∞, an empty
        // row (O = 0, LSE = −∞, no gradient) whose Q must not reach dK as 0 · ∞.
        let mut c = base("neg_inf_q_row_empty", s, opts.clone());
        for j in 0..s.n_k {
            let at = kv_row(&s, 0, j) + 5;
            c.k[at] = c.k[at].abs() + 0.25;
        }
        c.q[q_row(&s, 0, 299, 0) + 5] = f32::NEG_INFINITY;
        out.push(c);
        // +∞ in one K row at key 7, which every row sees (causal: all but the first rows):
        // rows scoring it +∞ are NaN, rows scoring it −∞ leave it out of their support.
        let s = shape(1, 333, 333, d);
        let mut c = base("inf_k_allowed", s, opts.clone());
        c.k[kv_row(&s, 0, 7) + 1] = f32::INFINITY;
        out.push(c);
        // Key lengths: item 0 sees 301 of 413 keys, item 1 none (empty rows); NaN/±∞ in K and V
        // past the lengths and a NaN in an empty row's Q.
        let s = shape(2, 350, 413, d);
        let mut c = base(
            "key_lengths_padding",
            s,
            opts.clone().key_lengths(vec![301, 0]),
        );
        for (item, from) in [(0, 301), (1, 0)] {
            for j in from..s.n_k {
                let x = POISONS[(j % 3) as usize];
                c.k[kv_row(&s, item, j) + (j % d) as usize] = x;
                c.v[kv_row(&s, item, j) + ((j + 1) % d) as usize] = x;
            }
        }
        c.q[q_row(&s, 1, 10, 0)] = f32::NAN;
        out.push(c);
        // Packed: three sequences; the middle one's K and V hold NaN/±∞ everywhere in one
        // column, so only its own rows may turn non-finite.
        let s = shape(1, 700, 900, d);
        let mut c = base(
            "packed_neighbour",
            s,
            opts.clone()
                .packed(vec![0, 310, 420, 700], vec![0, 333, 640, 900]),
        );
        for j in 333..640 {
            let x = POISONS[(j % 3) as usize];
            c.k[kv_row(&s, 0, j) + 2] = x;
            c.v[kv_row(&s, 0, j) + 9] = x;
        }
        out.push(c);
    }
    let causal = AttentionOptions::new().causal(true);
    // The last key is seen only by the last row (causal, bottom-right): NaN in its V, then in
    // its K. N_q < N_k and N_q = N_k.
    for (n_q, n_k) in [(333, 333), (300, 413)] {
        let s = shape(1, n_q, n_k, d);
        let mut c = base("nan_v_last_key", s, causal.clone());
        c.v[kv_row(&s, 0, n_k - 1) + 4] = f32::NAN;
        out.push(c);
        let mut c = base("nan_k_last_key", s, causal.clone());
        c.k[kv_row(&s, 0, n_k - 1) + 6] = f32::NAN;
        out.push(c);
    }
    // Local windows: K and V of keys 7 and 200 hold NaN/±∞; only rows whose window holds them
    // (7 ∈ [i − 32, i + right], 200 likewise) may turn non-finite. Causal, two-sided, and
    // (0, 0) with N_q > N_k, whose first rows see nothing.
    for (causal, (left, right), (n_q, n_k)) in [
        (true, (32, 0), (333, 333)),
        (false, (16, 4), (300, 413)),
        (false, (0, 0), (430, 333)),
    ] {
        let s = shape(1, n_q, n_k, d);
        let opts = AttentionOptions::new().causal(causal).window(left, right);
        let mut c = base(&format!("window_{left}_{right}_poisoned_keys"), s, opts);
        for (n, j) in [7u32, 200].into_iter().enumerate() {
            c.k[kv_row(&s, 0, j) + 3] = POISONS[n];
            c.v[kv_row(&s, 0, j) + 5] = POISONS[n + 1];
        }
        out.push(c);
    }
    // Causal with N_q > N_k: the first 97 rows are empty; NaN in one of their Q rows, +∞ in V
    // and NaN in K of the last key (seen only by the last row).
    let s = shape(1, 430, 333, d);
    let mut c = base("empty_rows_causal", s, causal.clone());
    c.q[q_row(&s, 0, 50, 1) + 7] = f32::NAN;
    c.v[kv_row(&s, 0, 332) + 8] = f32::INFINITY;
    c.k[kv_row(&s, 0, 332) + 9] = f32::NAN;
    out.push(c);
    out
}

/// Forward and backward of `c` on `family`, or `None` where the family does not admit it.
fn run_family(
    gpu: &Gpu,
    c: &Scenario,
    dt: DType,
    family: Family,
    reference: &flash_attn::reference::Forward,
) -> Option<Outputs> {
    let options = FlashOptions::new(c.options.clone()).kernel(KernelChoice::Only(family));
    let case = HostCase {
        q: &c.q,
        k: &c.k,
        v: &c.v,
        d_o: &c.d_o,
        o: &reference.o,
        lse: &reference.lse,
    };
    run_case(gpu, &c.shape, &options, dt, &case)
}

fn bound(dt: DType) -> f64 {
    if dt == DType::Bf16 { 1e-2 } else { 2e-3 }
}

fn count_nan(x: &[f64]) -> usize {
    x.iter().filter(|x| x.is_nan()).count()
}

#[test]
fn non_finite_inputs_and_masked_keys_follow_the_reference_on_every_family() {
    let test = "non_finite_inputs_and_masked_keys_follow_the_reference_on_every_family";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let families = families();
    let (mut failures, mut passed) = (vec![], 0);
    let mut not_run = vec![0usize; families.len()];
    for (dt, d) in [
        (DType::Bf16, 128),
        (DType::Bf16, 64),
        (DType::F16, 128),
        (DType::Bf16, 192),
    ] {
        for c in scenarios(&mut rng, dt, d) {
            let want = forward_f32(&c.shape, &c.q, &c.k, &c.v, &c.options).unwrap();
            let want_g = backward_f32(&c.shape, &c.q, &c.k, &c.v, &c.d_o, &c.options).unwrap();
            // The scenario means something: the reference has finite and (mostly) NaN parts.
            assert!(want.o.iter().any(|x| x.is_finite()), "{}", c.name);
            for (i, &family) in families.iter().enumerate() {
                let Some(got) = run_family(&gpu, &c, dt, family, &want) else {
                    not_run[i] += 1;
                    continue;
                };
                let errs = [
                    ("o", rel_err(&got.o, &want.o)),
                    ("dq", rel_err(&got.dq, &want_g.dq)),
                    ("dk", rel_err(&got.dk, &want_g.dk)),
                    ("dv", rel_err(&got.dv, &want_g.dv)),
                ];
                let lse = lse_err(&got.lse, &want.lse);
                let ok = errs.iter().all(|e| e.1 <= bound(dt)) && lse <= 2e-3;
                let line = format!(
                    "{} {family:?} {dt} {}: {}, lse {lse:.2e} (reference NaN: o {}, dq {}, dk {}, dv {})",
                    if ok { "ok  " } else { "FAIL" },
                    c.name,
                    errs.iter()
                        .map(|(n, e)| format!("{n} {e:.2e}"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    count_nan(&want.o),
                    count_nan(&want_g.dq),
                    count_nan(&want_g.dk),
                    count_nan(&want_g.dv),
                );
                println!("{line}");
                if ok {
                    passed += 1;
                } else {
                    failures.push(line);
                }
            }
        }
    }
    let refused: Vec<String> = families
        .iter()
        .zip(&not_run)
        .filter(|(_, n)| **n > 0)
        .map(|(f, n)| format!("{f} {n}"))
        .collect();
    if !refused.is_empty() {
        skip(
            test,
            &format!(
                "(scenario, family) pairs the plan refuses: {}",
                refused.join(", ")
            ),
        );
    }
    println!("{passed} passed, {} failed", failures.len());
    assert!(
        failures.is_empty(),
        "{} cases differ from the reference:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
