//! Grids past the hardware's 65,535 in y or z: more than 65,535 sequences (batch items), and more
//! than 65,535 heads, each fold into the grid's y and z (`attention_kernels::abi::grid`). Every
//! family's forward and backward (preprocess, main kernel, dQ pass, NaN-row pass included), forced
//! through `forward_into` / `backward_into` into NaN-poisoned outputs, against the f64 reference
//! on fresh random inputs; small n and d keep the reference quick. Bounds as in
//! `tests/gpu_matrix.rs`: ‖out − ref‖/‖ref‖ ≤ 1e-2 (bf16), LSE within 2e-3.

use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::{AttentionOptions, AttentionShape, DType, Direction, FlashOptions, KernelChoice};
use flash_attn_testkit::family_run::{HostCase, run_case};
use flash_attn_testkit::testing::{families, fresh_seed, gpu_or_skip, lse_err, rel_err, skip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn grids_past_65535_sequences_or_heads_match_the_reference() {
    let test = "grids_past_65535_sequences_or_heads_match_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let dtype = DType::Bf16;
    // n_q < n_k, causal: tails in both directions and rows that see part of the keys.
    let shapes = [
        // 70,000 sequences: z folds in the forward and in the backward.
        AttentionShape {
            batch: 70_000,
            n_q: 5,
            n_k: 9,
            heads_q: 2,
            heads_kv: 1,
            head_dim: 64,
            head_dim_v: 64,
        },
        // 70,000 query heads and 70,000 K/V heads: y folds in both directions.
        AttentionShape {
            batch: 1,
            n_q: 5,
            n_k: 9,
            heads_q: 70_000,
            heads_kv: 70_000,
            head_dim: 64,
            head_dim_v: 64,
        },
        // 140,000 query heads on 35,000 K/V heads: y folds in the forward only.
        AttentionShape {
            batch: 1,
            n_q: 3,
            n_k: 3,
            heads_q: 140_000,
            heads_kv: 35_000,
            head_dim: 64,
            head_dim_v: 64,
        },
    ];
    let mut failures = Vec::new();
    for s in shapes {
        let mut draw = |n: usize, r: f32| -> Vec<f32> {
            (0..n).map(|_| dtype.round(rng.gen_range(-r..r))).collect()
        };
        let (q, k, v, d_o) = (
            draw(s.q_elems(), 2.0),
            draw(s.k_elems(), 2.0),
            draw(s.v_elems(), 1.0),
            draw(s.q_elems(), 1.0),
        );
        let a = AttentionOptions::new().causal(true);
        let want = forward_f32(&s, &q, &k, &v, &a).unwrap();
        let grads = backward_f32(&s, &q, &k, &v, &d_o, &a).unwrap();
        let case = HostCase {
            q: &q,
            k: &k,
            v: &v,
            d_o: &d_o,
            o: &want.o,
            lse: &want.lse,
        };
        for family in families() {
            let options = FlashOptions::new(a.clone()).kernel(KernelChoice::Only(family));
            let Some(got) = run_case(&gpu, &s, &options, dtype, &case) else {
                let why = flash_attn::plan(&gpu, &s, dtype, &options, Direction::Forward)
                    .and_then(|_| flash_attn::plan(&gpu, &s, dtype, &options, Direction::Backward))
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_default();
                skip(&format!("{test} {family} {s:?}"), &why);
                continue;
            };
            let errs = [
                ("o", rel_err(&got.o, &want.o)),
                ("lse", lse_err(&got.lse, &want.lse)),
                ("dq", rel_err(&got.dq, &grads.dq)),
                ("dk", rel_err(&got.dk, &grads.dk)),
                ("dv", rel_err(&got.dv, &grads.dv)),
            ];
            let ok = errs
                .iter()
                .all(|(n, e)| *e <= if *n == "lse" { 2e-3 } else { 1e-2 });
            let line = format!(
                "{} {family} {s:?}: {errs:?}",
                if ok { "ok  " } else { "FAIL" }
            );
            eprintln!("{line}");
            if !ok {
                failures.push(line);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
