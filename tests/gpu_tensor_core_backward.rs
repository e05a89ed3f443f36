//! The tensor-core backward against the f64 CPU reference on fresh random inputs.
//!
//! Q, K, V, dO are drawn, rounded to the storage dtype, and given to both sides as the same
//! values. O and LSE come from the reference forward (O rounded to the dtype, LSE to f32), so the
//! backward is checked on its own, not through the GPU forward. Outputs are NaN-poisoned before
//! each call (`tensor_core_backward` does it), so an unwritten element fails. Skips, with a
//! visible line, where no CUDA device answers. The `wgmma` main kernels run where the device loads
//! the sm_90a module; a visible line says when they are not tested.

use attention_kernels::{flash_tc_backward, flash_wgmma};
use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::tensor_core_backward::{
    BackwardInputs, BackwardOutput, BackwardWorkspace, TcBackwardKernel, backward_kernel_name,
    tensor_core_backward, tensor_core_backward_kernel, tensor_core_backward_variant_into,
    wgmma_backward_kernel_name,
};
use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, Gpu};
use flash_attn_testkit::inputs::uniform;
use flash_attn_testkit::sampled_rows::relative_error;
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, skip};

/// Bounds on `‖got − ref‖ / ‖ref‖` per gradient. The kernel multiplies 16-bit operands (inputs,
/// and P and dS rounded to the dtype for the tensor cores) with f32 accumulation, and its D comes
/// from the rounded O. Emulating exactly that on these shapes (`scripts/backward_numerics.py`)
/// gives at most 3.6e-3 (bf16, 8 significant bits) and 4.8e-4 (f16, 11 bits); the bounds leave
/// about 3× beside that, far below what a wrong index or a dropped block produces (order 1).
fn bound(dtype: DType) -> f64 {
    match dtype {
        DType::Bf16 => 1e-2,
        _ => 2e-3,
    }
}

/// Runs `cfg` through the public entry point when it is this device's default, else as a variant;
/// either way into NaN-poisoned outputs.
fn run(
    gpu: &Gpu,
    cfg: TcBackwardKernel,
    s: &AttentionShape,
    inputs: &BackwardInputs,
    opts: &AttentionOptions,
) -> BackwardOutput {
    if tensor_core_backward_kernel(gpu, s, inputs.q.dtype(), opts).unwrap() == cfg {
        return tensor_core_backward(gpu, s, inputs, opts).unwrap();
    }
    let out = BackwardOutput::poisoned(s, inputs.q.dtype()).unwrap();
    let workspace = BackwardWorkspace::new(s).unwrap();
    tensor_core_backward_variant_into(gpu, cfg, s, inputs, &out, &workspace, opts).unwrap();
    gpu.synchronize().unwrap();
    out
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

#[test]
fn every_backward_kernel_is_in_the_ptx() {
    for d in [64, 128] {
        assert!(flash_tc_backward::VARIANTS.contains(&flash_tc_backward::config(d).unwrap()));
    }
    for cfg in flash_tc_backward::VARIANTS {
        let d = cfg.head_dim;
        for dtype in [DType::F16, DType::Bf16] {
            for name in [
                backward_kernel_name(dtype, &cfg),
                format!("flash_tc_backward_preprocess_{dtype}_d{d}"),
                format!("flash_tc_backward_convert_dq_{dtype}"),
            ] {
                assert!(
                    flash_attn::PTX.contains(&format!(".entry {name}(")),
                    "{name} missing from the PTX"
                );
            }
        }
    }
}

#[test]
fn every_wgmma_backward_kernel_is_in_the_sm90a_ptx() {
    let Some(hopper) = flash_attn::PTX_SM90A else {
        skip(
            "every_wgmma_backward_kernel_is_in_the_sm90a_ptx",
            "no sm_90a module built",
        );
        return;
    };
    for d in [64, 128] {
        let cfg = flash_wgmma::backward_config(d).unwrap();
        assert!(flash_wgmma::BACKWARD_VARIANTS.contains(&cfg));
    }
    for cfg in flash_wgmma::BACKWARD_VARIANTS {
        for dtype in [DType::F16, DType::Bf16] {
            let general = Some(cfg) == flash_wgmma::backward_config(cfg.head_dim);
            let names = [
                Some(wgmma_backward_kernel_name(dtype, &cfg, false)),
                general.then(|| wgmma_backward_kernel_name(dtype, &cfg, true)),
            ];
            for name in names.into_iter().flatten() {
                assert!(
                    hopper.contains(&format!(".entry {name}(")),
                    "{name} missing"
                );
            }
        }
    }
}

/// The kernels keep every register array in registers: an array the compiler could not (a
/// run-time index, a loop that did not unroll) shows as a local-memory depot in the PTX.
#[test]
fn backward_kernels_use_no_local_memory() {
    for cfg in flash_tc_backward::VARIANTS {
        for dtype in [DType::F16, DType::Bf16] {
            let name = backward_kernel_name(dtype, &cfg);
            let start = flash_attn::PTX
                .find(&format!(".entry {name}("))
                .unwrap_or_else(|| panic!("{name} missing from the PTX"));
            let body = &flash_attn::PTX[start..];
            let body = &body[..body.find("\n}").unwrap_or(body.len())];
            assert!(!body.contains("__local_depot"), "{name} uses local memory");
        }
    }
}

#[test]
fn tensor_core_backward_matches_reference() {
    let test = "tensor_core_backward_matches_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let seed = fresh_seed(test);
    let mut kernels: Vec<TcBackwardKernel> = flash_tc_backward::VARIANTS
        .into_iter()
        .map(Into::into)
        .collect();
    if gpu.has_wgmma() {
        kernels.extend(
            flash_wgmma::BACKWARD_VARIANTS
                .into_iter()
                .map(TcBackwardKernel::from),
        );
    } else {
        skip(
            &format!("wgmma kernels in {test}"),
            &format!("{} loads no sm_90a module", gpu.device_name()),
        );
    }
    // (batch, n_q, n_k, heads_q, heads_kv): one token, tails of every kind, an exact tile
    // multiple, GQA and MQA, n_q < n_k and n_q > n_k (causal rows that see no key).
    let shapes = [
        (1, 1, 1, 1, 1),
        (1, 17, 17, 2, 1),
        (2, 97, 97, 2, 2),
        (1, 128, 128, 4, 2),
        (1, 257, 257, 2, 1),
        (1, 77, 300, 2, 1),
        (1, 300, 77, 2, 2),
        (1, 64, 256, 4, 1),
    ];
    let mut failures = Vec::new();
    let mut case = 0u64;
    for dtype in [DType::Bf16, DType::F16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                for &(batch, n_q, n_k, heads_q, heads_kv) in &shapes {
                    case += 1;
                    let s = AttentionShape {
                        batch,
                        n_q,
                        n_k,
                        heads_q,
                        heads_kv,
                        head_dim,
                    };
                    let draw = |which: u64, len: usize, amp: f32| -> Vec<f32> {
                        uniform(seed ^ (case << 8 | which), len)
                            .into_iter()
                            .map(|x| dtype.round(amp * x))
                            .collect()
                    };
                    let (q, k, v, d_o) = (
                        draw(1, s.q_elems(), 2.0),
                        draw(2, s.kv_elems(), 2.0),
                        draw(3, s.kv_elems(), 1.0),
                        draw(4, s.q_elems(), 1.0),
                    );
                    let opts = AttentionOptions::new().causal(causal);
                    let fwd = forward_f32(&s, &q, &k, &v, &opts).unwrap();
                    let o: Vec<f32> = fwd.o.iter().map(|&x| dtype.round(x as f32)).collect();
                    let lse: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
                    let want = backward_f32(&s, &q, &k, &v, &d_o, &opts).unwrap();

                    let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
                    let (qd, kd, vd, od, dod) = (up(&q), up(&k), up(&v), up(&o), up(&d_o));
                    let lse_d = DeviceF32::from_slice(&lse).unwrap();
                    let inputs = BackwardInputs {
                        q: &qd,
                        k: &kd,
                        v: &vd,
                        o: &od,
                        d_o: &dod,
                        lse: &lse_d,
                    };
                    for &cfg in kernels.iter().filter(|c| c.tiles().head_dim == head_dim) {
                        let got = run(&gpu, cfg, &s, &inputs, &opts);
                        let err = |t: &DeviceTensor, w: &[f64]| {
                            relative_error(&widen(&t.to_f32().unwrap()), w)
                        };
                        let errs = [
                            err(&got.dq, &want.dq),
                            err(&got.dk, &want.dk),
                            err(&got.dv, &want.dv),
                        ];
                        // NaN (an unwritten or non-finite element) fails this comparison.
                        let ok = errs.iter().all(|&e| e <= bound(dtype));
                        let name = cfg.name(dtype);
                        println!(
                            "{} {name} causal={causal} b={batch} nq={n_q} nk={n_k} hq={heads_q} hkv={heads_kv}: rel dQ {:.2e} dK {:.2e} dV {:.2e}",
                            if ok { "ok  " } else { "FAIL" },
                            errs[0],
                            errs[1],
                            errs[2]
                        );
                        if !ok {
                            failures.push(format!("{name} causal={causal} {s:?}: {errs:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "seed {seed}: {} cases failed: {failures:#?}",
        failures.len()
    );
}
