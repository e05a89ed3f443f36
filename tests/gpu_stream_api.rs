//! The entry points on the caller's memory and stream (`forward_on`, `backward_on`): cudarc
//! slices on a stream of the program's own, against the library's owned path (bitwise) and the
//! f64 reference; strided views (one fused QKV projection, `[B, H, N, d]`) against contiguous
//! tensors (bitwise) and the f64 reference, run in place (no staging copy) on the tensor-core
//! families and staged on the others; aliasing refused; a `Gpu` made on the program's context; and forward and
//! backward captured into a CUDA graph, replayed on fresh inputs written into the same buffers.
//! Outputs start NaN-poisoned. Skips visibly where no CUDA device answers.

use std::sync::Arc;

use flash_attn::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use flash_attn::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use flash_attn::reference::{backward_f32, forward_f32};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, BackwardInputs, BackwardViews, DType,
    DeviceTensor, Direction, Family, FlashOptions, Gpu, GradientBuffers, GradientViews,
    KernelChoice, Strides, TensorMut, TensorRef, Workspace, backward_on, forward_on,
};
use flash_attn_testkit::caller_stream::{Inputs, Results, bits, forward_backward, poisoned, widen};
use flash_attn_testkit::testing::{families, fresh_seed, gpu_or_skip, lse_err, rel_err, skip};
use half::bf16;

/// bf16 bound of `tests/gpu_matrix.rs`: ‖out − ref‖/‖ref‖ ≤ 1e-2, LSE within 2e-3.
const BOUND: f64 = 1e-2;
const LSE_BOUND: f64 = 2e-3;

fn shape(heads_kv: u32) -> AttentionShape {
    AttentionShape {
        batch: 2,
        n_q: 96,
        n_k: 130,
        heads_q: 4,
        heads_kv,
        head_dim: 64,
        head_dim_v: 64,
    }
}

/// The plan `options` gets for `direction`, or `None` after a visible line when the family
/// cannot run the call here (no `wgmma` module, decode with too many rows).
fn runnable(
    gpu: &Gpu,
    test: &str,
    shape: &AttentionShape,
    options: &FlashOptions,
    direction: Direction,
) -> Option<flash_attn::Plan> {
    match flash_attn::plan(gpu, shape, DType::Bf16, options, direction) {
        Ok(plan) => Some(plan),
        Err(AttentionError::InvalidInput(why)) => {
            skip(test, &format!("{:?} {direction:?}: {why}", options.kernel));
            None
        }
        Err(e) => panic!("{test}: {e}"),
    }
}

fn inputs(test: &str, shape: &AttentionShape) -> Inputs {
    inputs_from(fresh_seed(test), shape)
}

fn inputs_from(seed: u64, shape: &AttentionShape) -> Inputs {
    Inputs::new(seed, shape)
}

#[test]
fn borrowed_slices_on_a_caller_stream_match_the_owned_path_bitwise() {
    let test = "borrowed_slices_on_a_caller_stream_match_the_owned_path_bitwise";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    for family in families() {
        for heads_kv in [4, 2] {
            // The decode family takes at most 16 query rows per K/V head.
            let shape = match family {
                Family::Decode => AttentionShape {
                    n_q: 4,
                    ..shape(heads_kv)
                },
                _ => shape(heads_kv),
            };
            let x = inputs(test, &shape);
            let options = FlashOptions::new(AttentionOptions::new().causal(true))
                .kernel(KernelChoice::Only(family))
                .deterministic(family == Family::Exact);
            let Some(plan) = runnable(&gpu, test, &shape, &options, Direction::Forward) else {
                continue;
            };
            // The owned path.
            let up = |v: &[bf16]| DeviceTensor::from_bf16(v).unwrap();
            let (q, k, v) = (up(&x.q), up(&x.k), up(&x.v));
            let owned = flash_attn::forward(&gpu, &shape, &q, &k, &v, &options).unwrap();
            let (o_owned, lse_owned) = (owned.o.to_bf16().unwrap(), owned.lse.to_vec().unwrap());

            // The same call on the caller's slices and stream.
            let dq = stream.clone_htod(&x.q).unwrap();
            let dk = stream.clone_htod(&x.k).unwrap();
            let dv = stream.clone_htod(&x.v).unwrap();
            let mut o = poisoned(&stream, bf16::NAN, shape.o_elems());
            let mut lse = poisoned(&stream, f32::NAN, shape.row_elems());
            let workspace = Workspace::on_stream(&gpu, &plan, &stream).unwrap();
            let ran = forward_on(
                &gpu,
                &stream,
                &shape,
                [
                    &TensorRef::new(&dq, &stream),
                    &TensorRef::new(&dk, &stream),
                    &TensorRef::new(&dv, &stream),
                ],
                &mut TensorMut::new(&mut o, &stream),
                &mut TensorMut::new(&mut lse, &stream),
                &workspace,
                &options,
            )
            .unwrap();
            assert_eq!(ran.entry, owned.plan.entry);
            assert!(
                ran.staged.is_empty(),
                "{family:?}: contiguous views run in place"
            );
            let o_host = stream.clone_dtoh(&o).unwrap();
            let lse_host = stream.clone_dtoh(&lse).unwrap();
            assert_eq!(bits(&o_host), bits(&o_owned), "{family:?} {heads_kv}: O");
            let lse_bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(lse_bits(&lse_host), lse_bits(&lse_owned), "{family:?}: LSE");
            let reference = forward_f32(
                &shape,
                &widen(&x.q),
                &widen(&x.k),
                &widen(&x.v),
                &options.attention,
            )
            .unwrap();
            let err = rel_err(&widen(&o_host), &reference.o);
            assert!(err <= BOUND, "{family:?}: O error {err}");
            assert!(lse_err(&lse_host, &reference.lse) <= LSE_BOUND);

            // The backward, on the forward's O and LSE.
            let Some(bplan) = runnable(&gpu, test, &shape, &options, Direction::Backward) else {
                continue;
            };
            let d_o_owned = up(&x.d_o);
            let out = GradientBuffers::poisoned(&shape, DType::Bf16).unwrap();
            flash_attn::backward_into(
                &gpu,
                &shape,
                &BackwardInputs {
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &owned.o,
                    d_o: &d_o_owned,
                    lse: &owned.lse,
                },
                &out,
                &Workspace::new(&bplan).unwrap(),
                &options,
            )
            .unwrap();
            let d_o = stream.clone_htod(&x.d_o).unwrap();
            let mut grads = [
                poisoned(&stream, bf16::NAN, shape.q_elems()),
                poisoned(&stream, bf16::NAN, shape.k_elems()),
                poisoned(&stream, bf16::NAN, shape.v_elems()),
            ];
            let bworkspace = Workspace::on_stream(&gpu, &bplan, &stream).unwrap();
            {
                let r = |t| TensorRef::new(t, &stream);
                let (q, k, v, o, d_o) = (r(&dq), r(&dk), r(&dv), r(&o), r(&d_o));
                let lse = TensorRef::new(&lse, &stream);
                let [g_q, g_k, g_v] = &mut grads;
                backward_on(
                    &gpu,
                    &stream,
                    &shape,
                    BackwardViews {
                        q: &q,
                        k: &k,
                        v: &v,
                        o: &o,
                        d_o: &d_o,
                        lse: &lse,
                    },
                    GradientViews {
                        dq: &mut TensorMut::new(g_q, &stream),
                        dk: &mut TensorMut::new(g_k, &stream),
                        dv: &mut TensorMut::new(g_v, &stream),
                        d_sinks: None,
                    },
                    &bworkspace,
                    &options,
                )
                .unwrap();
            }
            let [g_q, g_k, g_v] = grads.map(|g| stream.clone_dtoh(&g).unwrap());
            // dK, dV: one chip per key block, bitwise; dQ by atomics (bitwise only for the exact
            // family's deterministic pass), against the reference.
            assert_eq!(
                bits(&g_k),
                bits(&out.dk.to_bf16().unwrap()),
                "{family:?}: dK"
            );
            assert_eq!(
                bits(&g_v),
                bits(&out.dv.to_bf16().unwrap()),
                "{family:?}: dV"
            );
            if options.deterministic {
                assert_eq!(
                    bits(&g_q),
                    bits(&out.dq.to_bf16().unwrap()),
                    "{family:?}: dQ"
                );
            }
            let want = backward_f32(
                &shape,
                &widen(&x.q),
                &widen(&x.k),
                &widen(&x.v),
                &widen(&x.d_o),
                &options.attention,
            )
            .unwrap();
            for (name, got, want) in [
                ("dq", &g_q, &want.dq),
                ("dk", &g_k, &want.dk),
                ("dv", &g_v, &want.dv),
            ] {
                let err = rel_err(&widen(got), want);
                assert!(err <= BOUND, "{family:?} {heads_kv}: {name} error {err}");
            }
        }
    }
}

/// `[B, N, 3, H, d]` of Q, K, V (each `[B, N, H, d]`).
fn fuse(shape: &AttentionShape, parts: [&[bf16]; 3]) -> Vec<bf16> {
    let row = (shape.heads_q * shape.head_dim) as usize;
    let rows = (shape.batch * shape.n_q) as usize;
    let mut fused = Vec::with_capacity(3 * rows * row);
    for r in 0..rows {
        for part in parts {
            fused.extend_from_slice(&part[r * row..(r + 1) * row]);
        }
    }
    fused
}

/// `[B, N, H, d]` → `[B, H, N, d]`, or back with `inverse`.
fn transpose(shape: &AttentionShape, n: u32, heads: u32, x: &[bf16], inverse: bool) -> Vec<bf16> {
    let (b, n, h, d) = (
        shape.batch as usize,
        n as usize,
        heads as usize,
        shape.head_dim as usize,
    );
    let mut out = vec![bf16::ZERO; x.len()];
    for bi in 0..b {
        for t in 0..n {
            for hi in 0..h {
                let bnhd = ((bi * n + t) * h + hi) * d;
                let bhnd = ((bi * h + hi) * n + t) * d;
                let (from, to) = if inverse { (bhnd, bnhd) } else { (bnhd, bhnd) };
                out[to..to + d].copy_from_slice(&x[from..from + d]);
            }
        }
    }
    out
}

/// Forward and backward with contiguous views, each direction's workspace planned for the call.
fn contiguous_run(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: &AttentionShape,
    x: &Inputs,
    options: &FlashOptions,
) -> Results {
    let workspace = |direction| {
        let plan = flash_attn::plan(gpu, shape, DType::Bf16, options, direction).unwrap();
        Workspace::on_stream(gpu, &plan, stream).unwrap()
    };
    let workspaces = [
        workspace(Direction::Forward),
        workspace(Direction::Backward),
    ];
    forward_backward(gpu, stream, shape, x, options, &workspaces)
}

/// Options whose gradients are bitwise reproducible: the exact family's deterministic dQ pass;
/// on the other families dQ is compared to the reference only.
fn compare(
    test: &str,
    family: Family,
    shape: &AttentionShape,
    x: &Inputs,
    options: &AttentionOptions,
    got: &Results,
    want: &Results,
) {
    assert_eq!(bits(&got.0), bits(&want.0), "{test} {family:?}: O");
    assert_eq!(
        got.1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        want.1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "{test} {family:?}: LSE"
    );
    assert_eq!(bits(&got.3), bits(&want.3), "{test} {family:?}: dK");
    assert_eq!(bits(&got.4), bits(&want.4), "{test} {family:?}: dV");
    if family == Family::Exact {
        assert_eq!(bits(&got.2), bits(&want.2), "{test} {family:?}: dQ");
    }
    let reference = backward_f32(
        shape,
        &widen(&x.q),
        &widen(&x.k),
        &widen(&x.v),
        &widen(&x.d_o),
        options,
    )
    .unwrap();
    let err = rel_err(&widen(&got.2), &reference.dq);
    assert!(err <= BOUND, "{test} {family:?}: dQ error {err}");
}

/// Families that run both directions of `shape` here.
fn both_directions(gpu: &Gpu, test: &str, shape: &AttentionShape) -> Vec<(Family, FlashOptions)> {
    families()
        .into_iter()
        .map(|f| {
            let options = FlashOptions::new(AttentionOptions::new().causal(true))
                .kernel(KernelChoice::Only(f))
                .deterministic(f == Family::Exact);
            (f, options)
        })
        .filter(|(_, o)| {
            runnable(gpu, test, shape, o, Direction::Forward).is_some()
                && runnable(gpu, test, shape, o, Direction::Backward).is_some()
        })
        .collect()
}

/// The tensor-core families read and write aligned strided views in place; the others stage them
/// (`strided`: the tensors `plan` ran with strides, all of them strided here but LSE).
fn assert_staging(test: &str, family: Family, plan: &flash_attn::Plan, strided: &[&str]) {
    match family {
        Family::Sm80 | Family::Sm90 => assert!(
            plan.staged.is_empty(),
            "{test} {family:?} {:?}: staged {:?}, expected every view in place",
            plan.direction,
            plan.staged
        ),
        Family::Exact | Family::Decode => assert_eq!(
            plan.staged, strided,
            "{test} {family:?} {:?}: the strided views are staged",
            plan.direction
        ),
    }
}

#[test]
fn fused_qkv_views_match_separate_tensors() {
    let test = "fused_qkv_views_match_separate_tensors";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    // Self-attention: one projection gives Q, K and V of the same length and heads.
    let shape = AttentionShape {
        n_k: 96,
        ..shape(4)
    };
    for (family, options) in both_directions(&gpu, test, &shape) {
        fused_run(&gpu, &stream, test, &shape, family, &options);
    }
}

/// Packed sequences (one batch item, rows 0..37 and 37..96: the second starts inside a 16-byte
/// chunk of rows) on the views of one fused projection, against contiguous tensors: the strided
/// kernels add the sequence's first row to the view's strides.
#[test]
fn packed_sequences_on_fused_views_match_separate_tensors() {
    let test = "packed_sequences_on_fused_views_match_separate_tensors";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let shape = AttentionShape {
        batch: 1,
        n_k: 96,
        ..shape(4)
    };
    let cu = vec![0, 37, 96];
    for family in families() {
        let options = FlashOptions::new(
            AttentionOptions::new()
                .causal(true)
                .packed(cu.clone(), cu.clone()),
        )
        .kernel(KernelChoice::Only(family))
        .deterministic(family == Family::Exact);
        if runnable(&gpu, test, &shape, &options, Direction::Forward).is_some()
            && runnable(&gpu, test, &shape, &options, Direction::Backward).is_some()
        {
            fused_run(&gpu, &stream, test, &shape, family, &options);
        }
    }
}

/// Forward and backward of `family` on Q, K, V as views of one fused `[B, N, 3, H, d]`
/// projection and dQ, dK, dV as views of one fused gradient, against contiguous tensors.
fn fused_run(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    test: &str,
    shape: &AttentionShape,
    family: Family,
    options: &FlashOptions,
) {
    let shape = *shape;
    let s = Strides::fused_qkv(shape.n_q, shape.heads_q, shape.head_dim);
    let row = (shape.heads_q * shape.head_dim) as usize;
    let x = inputs(test, &shape);
    let want = contiguous_run(gpu, stream, &shape, &x, options);
    let fused = stream
        .clone_htod(&fuse(&shape, [&x.q, &x.k, &x.v]))
        .unwrap();
    let d_o = stream.clone_htod(&x.d_o).unwrap();
    let mut o = poisoned(stream, bf16::NAN, shape.o_elems());
    let mut lse = poisoned(stream, f32::NAN, shape.row_elems());
    let d_fused = poisoned(stream, bf16::NAN, 3 * shape.q_elems());
    let fplan = flash_attn::plan(gpu, &shape, DType::Bf16, options, Direction::Forward).unwrap();
    let bplan = flash_attn::plan(gpu, &shape, DType::Bf16, options, Direction::Backward).unwrap();
    let views = [0, 1, 2].map(|i| fused.slice(i * row..));
    let [q, k, v] = views
        .each_ref()
        .map(|p| TensorRef::new(p, stream).strided(s));
    let ran = forward_on(
        gpu,
        stream,
        &shape,
        [&q, &k, &v],
        &mut TensorMut::new(&mut o, stream),
        &mut TensorMut::new(&mut lse, stream),
        &Workspace::on_stream(gpu, &fplan, stream).unwrap(),
        options,
    )
    .unwrap();
    assert_staging(test, family, &ran, &["q", "k", "v"]);
    {
        // dQ, dK, dV interleaved in one fused gradient: three raw views of one slice.
        let (base, _read) = d_fused.device_ptr(stream);
        let len = 3 * shape.q_elems();
        // SAFETY: `d_fused` outlives the call and the synchronising downloads below; nothing
        // else uses it meanwhile.
        let grad = |i: usize| unsafe {
            TensorMut::from_raw(base + (i * row * 2) as u64, len - i * row, DType::Bf16).strided(s)
        };
        let (mut g_q, mut g_k, mut g_v) = (grad(0), grad(1), grad(2));
        let (o_r, d_o_r, lse_r) = (
            TensorRef::new(&o, stream),
            TensorRef::new(&d_o, stream),
            TensorRef::new(&lse, stream),
        );
        let ran = backward_on(
            gpu,
            stream,
            &shape,
            BackwardViews {
                q: &q,
                k: &k,
                v: &v,
                o: &o_r,
                d_o: &d_o_r,
                lse: &lse_r,
            },
            GradientViews {
                dq: &mut g_q,
                dk: &mut g_k,
                dv: &mut g_v,
                d_sinks: None,
            },
            &Workspace::on_stream(gpu, &bplan, stream).unwrap(),
            options,
        )
        .unwrap();
        assert_staging(test, family, &ran, &["q", "k", "v", "dq", "dk", "dv"]);
    }
    let d = stream.clone_dtoh(&d_fused).unwrap();
    let unfuse = |i: usize| -> Vec<bf16> {
        d.chunks(3 * row)
            .flat_map(|r| r[i * row..(i + 1) * row].to_vec())
            .collect()
    };
    let got = (
        stream.clone_dtoh(&o).unwrap(),
        stream.clone_dtoh(&lse).unwrap(),
        unfuse(0),
        unfuse(1),
        unfuse(2),
    );
    compare(test, family, &shape, &x, &options.attention, &got, &want);
}

#[test]
fn bhnd_views_match_bnhd() {
    let test = "bhnd_views_match_bnhd";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let shape = shape(2);
    for (family, options) in both_directions(&gpu, test, &shape) {
        let x = inputs(test, &shape);
        let want = contiguous_run(&gpu, &stream, &shape, &x, &options);
        let (sq, sk) = (
            Strides::bhnd(shape.n_q, shape.heads_q, shape.head_dim),
            Strides::bhnd(shape.n_k, shape.heads_kv, shape.head_dim),
        );
        let tq = |v: &[bf16]| {
            stream
                .clone_htod(&transpose(&shape, shape.n_q, shape.heads_q, v, false))
                .unwrap()
        };
        let tk = |v: &[bf16]| {
            stream
                .clone_htod(&transpose(&shape, shape.n_k, shape.heads_kv, v, false))
                .unwrap()
        };
        let (q, k, v, d_o) = (tq(&x.q), tk(&x.k), tk(&x.v), tq(&x.d_o));
        let mut o = poisoned(&stream, bf16::NAN, shape.o_elems());
        let mut lse = poisoned(&stream, f32::NAN, shape.row_elems());
        let mut g = [
            poisoned(&stream, bf16::NAN, shape.q_elems()),
            poisoned(&stream, bf16::NAN, shape.k_elems()),
            poisoned(&stream, bf16::NAN, shape.v_elems()),
        ];
        let fplan =
            flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
        let bplan =
            flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Backward).unwrap();
        let ran = forward_on(
            &gpu,
            &stream,
            &shape,
            [
                &TensorRef::new(&q, &stream).strided(sq),
                &TensorRef::new(&k, &stream).strided(sk),
                &TensorRef::new(&v, &stream).strided(sk),
            ],
            &mut TensorMut::new(&mut o, &stream).strided(sq),
            &mut TensorMut::new(&mut lse, &stream),
            &Workspace::on_stream(&gpu, &fplan, &stream).unwrap(),
            &options,
        )
        .unwrap();
        assert_staging(test, family, &ran, &["q", "k", "v", "o"]);
        {
            let [g_q, g_k, g_v] = &mut g;
            let (qr, kr, vr, or, dor, lr) = (
                TensorRef::new(&q, &stream).strided(sq),
                TensorRef::new(&k, &stream).strided(sk),
                TensorRef::new(&v, &stream).strided(sk),
                TensorRef::new(&o, &stream).strided(sq),
                TensorRef::new(&d_o, &stream).strided(sq),
                TensorRef::new(&lse, &stream),
            );
            let ran = backward_on(
                &gpu,
                &stream,
                &shape,
                BackwardViews {
                    q: &qr,
                    k: &kr,
                    v: &vr,
                    o: &or,
                    d_o: &dor,
                    lse: &lr,
                },
                GradientViews {
                    dq: &mut TensorMut::new(g_q, &stream).strided(sq),
                    dk: &mut TensorMut::new(g_k, &stream).strided(sk),
                    dv: &mut TensorMut::new(g_v, &stream).strided(sk),
                    d_sinks: None,
                },
                &Workspace::on_stream(&gpu, &bplan, &stream).unwrap(),
                &options,
            )
            .unwrap();
            let all = ["q", "k", "v", "o", "d_o", "dq", "dk", "dv"];
            assert_staging(test, family, &ran, &all);
        }
        let [g_q, g_k, g_v] = g.map(|t| stream.clone_dtoh(&t).unwrap());
        let back_q = |v: &[bf16]| transpose(&shape, shape.n_q, shape.heads_q, v, true);
        let back_k = |v: &[bf16]| transpose(&shape, shape.n_k, shape.heads_kv, v, true);
        let got = (
            back_q(&stream.clone_dtoh(&o).unwrap()),
            stream.clone_dtoh(&lse).unwrap(),
            back_q(&g_q),
            back_k(&g_k),
            back_k(&g_v),
        );
        compare(test, family, &shape, &x, &options.attention, &got, &want);
    }
}

/// A view 8 bytes off a 16-byte boundary cannot be read in 16-byte chunks: every family stages
/// it (and only it), and the result is the owned path's, bit for bit.
#[test]
fn a_misaligned_view_is_staged_and_matches_the_owned_path() {
    let test = "a_misaligned_view_is_staged_and_matches_the_owned_path";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let shape = shape(2);
    let x = inputs(test, &shape);
    for family in families() {
        let options = FlashOptions::new(AttentionOptions::new().causal(true))
            .kernel(KernelChoice::Only(family));
        let shape = match family {
            Family::Decode => AttentionShape { n_q: 4, ..shape },
            _ => shape,
        };
        let Some(plan) = runnable(&gpu, test, &shape, &options, Direction::Forward) else {
            continue;
        };
        let n = shape.q_elems();
        let q = &x.q[..n];
        let up = |v: &[bf16]| DeviceTensor::from_bf16(v).unwrap();
        let owned = flash_attn::forward(&gpu, &shape, &up(q), &up(&x.k), &up(&x.v), &options)
            .unwrap()
            .o
            .to_bf16()
            .unwrap();
        // Q four bf16 (8 bytes) into its buffer.
        let mut padded = vec![bf16::ZERO; 4];
        padded.extend_from_slice(q);
        let q_buf = stream.clone_htod(&padded).unwrap();
        let (k, v) = (
            stream.clone_htod(&x.k).unwrap(),
            stream.clone_htod(&x.v).unwrap(),
        );
        let mut o = poisoned(&stream, bf16::NAN, n);
        let mut lse = poisoned(&stream, f32::NAN, shape.row_elems());
        let q_view = q_buf.slice(4..);
        let ran = forward_on(
            &gpu,
            &stream,
            &shape,
            [
                &TensorRef::new(&q_view, &stream),
                &TensorRef::new(&k, &stream),
                &TensorRef::new(&v, &stream),
            ],
            &mut TensorMut::new(&mut o, &stream),
            &mut TensorMut::new(&mut lse, &stream),
            &Workspace::on_stream(&gpu, &plan, &stream).unwrap(),
            &options,
        )
        .unwrap();
        assert_eq!(ran.staged, ["q"], "{test} {family:?}");
        let got = stream.clone_dtoh(&o).unwrap();
        assert_eq!(bits(&got), bits(&owned), "{test} {family:?}: O");
    }
}

#[test]
fn an_output_aliasing_an_input_is_refused() {
    let test = "an_output_aliasing_an_input_is_refused";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    // Self-attention sizes: Q's memory also serves as K and V, so only the checks under test fail.
    let shape = AttentionShape {
        n_k: 96,
        ..shape(4)
    };
    let options = FlashOptions::default();
    let plan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
    let workspace = Workspace::on_stream(&gpu, &plan, &stream).unwrap();
    let qkv = stream.clone_htod(&inputs(test, &shape).q).unwrap();
    let lse = poisoned(&stream, f32::NAN, shape.row_elems());
    let (base, _read) = qkv.device_ptr(&stream);
    let (lse_at, _lse_read) = lse.device_ptr(&stream);
    let n = shape.q_elems();
    // SAFETY: views of live slices; the call is refused before anything is queued.
    let (q, mut o, mut o_shifted, mut l) = unsafe {
        (
            TensorRef::from_raw(base, n, DType::Bf16),
            TensorMut::from_raw(base, n, DType::Bf16),
            // One head into Q (its memory is not all Q's: refused before any of it is touched).
            TensorMut::from_raw(base + 2 * 64, n, DType::Bf16),
            TensorMut::from_raw(lse_at, shape.row_elems(), DType::F32),
        )
    };
    for (name, out) in [("o over q", &mut o), ("o one head into q", &mut o_shifted)] {
        let refused = forward_on(
            &gpu,
            &stream,
            &shape,
            [&q, &q, &q],
            out,
            &mut l,
            &workspace,
            &options,
        );
        match refused {
            Err(AttentionError::InvalidInput(why)) => {
                assert!(why.contains("overlap"), "{name}: {why}")
            }
            other => panic!(
                "{name}: expected InvalidInput, got {:?}",
                other.map(|p| p.entry)
            ),
        }
    }
    // LSE written over Q.
    let mut o_ok = poisoned(&stream, bf16::NAN, n);
    // SAFETY: as above.
    let mut l_over_q = unsafe { TensorMut::from_raw(base, shape.row_elems(), DType::F32) };
    let refused = forward_on(
        &gpu,
        &stream,
        &shape,
        [&q, &q, &q],
        &mut TensorMut::new(&mut o_ok, &stream),
        &mut l_over_q,
        &workspace,
        &options,
    );
    assert!(matches!(refused, Err(AttentionError::InvalidInput(_))));
    stream.synchronize().unwrap();
    // Nothing was launched: O is still NaN.
    assert!(stream.clone_dtoh(&o_ok).unwrap().iter().all(|v| v.is_nan()));
}

#[test]
fn a_second_gpu_on_the_programs_context_runs_on_its_stream() {
    let test = "a_second_gpu_on_the_programs_context_runs_on_its_stream";
    let Some(first) = gpu_or_skip(test) else {
        return;
    };
    let context = flash_attn::cudarc::driver::CudaContext::new(0).unwrap();
    let gpu = flash_attn::gpu_for_context(context.clone()).unwrap();
    drop(first);
    let stream = context.new_stream().unwrap();
    assert!(gpu.owns_stream(&stream));
    let shape = shape(2);
    let x = inputs(test, &shape);
    let options = FlashOptions::new(AttentionOptions::new().causal(true));
    let plan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
    let up = |v: &[bf16]| stream.clone_htod(v).unwrap();
    let (q, k, v) = (up(&x.q), up(&x.k), up(&x.v));
    let mut o = poisoned(&stream, bf16::NAN, shape.o_elems());
    let mut lse = poisoned(&stream, f32::NAN, shape.row_elems());
    let r = |t| TensorRef::new(t, &stream);
    forward_on(
        &gpu,
        &stream,
        &shape,
        [&r(&q), &r(&k), &r(&v)],
        &mut TensorMut::new(&mut o, &stream),
        &mut TensorMut::new(&mut lse, &stream),
        &Workspace::on_stream(&gpu, &plan, &stream).unwrap(),
        &options,
    )
    .unwrap();
    let reference = forward_f32(
        &shape,
        &widen(&x.q),
        &widen(&x.k),
        &widen(&x.v),
        &options.attention,
    )
    .unwrap();
    let err = rel_err(&widen(&stream.clone_dtoh(&o).unwrap()), &reference.o);
    assert!(err <= BOUND, "O error {err}");
    assert!(lse_err(&stream.clone_dtoh(&lse).unwrap(), &reference.lse) <= LSE_BOUND);
}

#[test]
fn forward_and_backward_captured_in_a_cuda_graph_replay_on_fresh_inputs() {
    let test = "forward_and_backward_captured_in_a_cuda_graph_replay_on_fresh_inputs";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let shape = AttentionShape {
        n_k: 96,
        ..shape(4)
    };
    let options = FlashOptions::new(AttentionOptions::new().causal(true));
    let fplan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
    let bplan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Backward).unwrap();
    eprintln!("{test}: forward {}, backward {}", fplan.entry, bplan.entry);
    let (fwork, bwork) = (
        Workspace::on_stream(&gpu, &fplan, &stream).unwrap(),
        Workspace::on_stream(&gpu, &bplan, &stream).unwrap(),
    );
    // Buffers the graph reads and writes: Q, K, V as views of one fused projection (read in
    // place by the tensor-core families, staged by the others: then the copies are captured
    // too), dO, and the outputs.
    let s = Strides::fused_qkv(shape.n_q, shape.heads_q, shape.head_dim);
    let row = (shape.heads_q * shape.head_dim) as usize;
    let mut fused = poisoned(&stream, bf16::ZERO, 3 * shape.q_elems());
    let mut d_o = poisoned(&stream, bf16::ZERO, shape.o_elems());
    let (o, lse) = (
        poisoned(&stream, bf16::NAN, shape.q_elems()),
        poisoned(&stream, f32::NAN, shape.row_elems()),
    );
    let grads = [
        poisoned(&stream, bf16::NAN, shape.q_elems()),
        poisoned(&stream, bf16::NAN, shape.k_elems()),
        poisoned(&stream, bf16::NAN, shape.v_elems()),
    ];
    // Raw views, taken outside the capture (cudarc's event bookkeeping stays out of the graph).
    let ptr = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
    let (fused_at, d_o_at, o_at, lse_at) =
        (ptr(&fused), ptr(&d_o), ptr(&o), lse.device_ptr(&stream).0);
    let g_at = grads.each_ref().map(ptr);
    let call = || {
        let n = shape.q_elems();
        // SAFETY: every slice outlives the graph's replays, which this test synchronises before
        // reading them; nothing else touches them meanwhile.
        unsafe {
            let part = |i: usize| {
                TensorRef::from_raw(
                    fused_at + (i * row * 2) as u64,
                    3 * n - i * row,
                    DType::Bf16,
                )
                .strided(s)
            };
            let (q, k, v) = (part(0), part(1), part(2));
            let mut o_w = TensorMut::from_raw(o_at, n, DType::Bf16);
            let mut lse_w = TensorMut::from_raw(lse_at, shape.row_elems(), DType::F32);
            forward_on(
                &gpu,
                &stream,
                &shape,
                [&q, &k, &v],
                &mut o_w,
                &mut lse_w,
                &fwork,
                &options,
            )?;
            let (o_r, lse_r, d_o_r) = (
                TensorRef::from_raw(o_at, n, DType::Bf16),
                TensorRef::from_raw(lse_at, shape.row_elems(), DType::F32),
                TensorRef::from_raw(d_o_at, n, DType::Bf16),
            );
            let [dq, dk, dv] = [
                (g_at[0], shape.q_elems()),
                (g_at[1], shape.k_elems()),
                (g_at[2], shape.v_elems()),
            ]
            .map(|(p, len)| TensorMut::from_raw(p, len, DType::Bf16));
            let (mut dq, mut dk, mut dv) = (dq, dk, dv);
            backward_on(
                &gpu,
                &stream,
                &shape,
                BackwardViews {
                    q: &q,
                    k: &k,
                    v: &v,
                    o: &o_r,
                    d_o: &d_o_r,
                    lse: &lse_r,
                },
                GradientViews {
                    dq: &mut dq,
                    dk: &mut dk,
                    dv: &mut dv,
                    d_sinks: None,
                },
                &bwork,
                &options,
            )
        }
    };
    // One run outside the capture loads the kernels (as a framework's warm-up step would).
    call().unwrap();
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    let captured = call();
    let graph = stream.end_capture(CUgraphInstantiate_flags(0));
    captured.expect("the calls queue under capture");
    let graph = graph.expect("capture ends").expect("a graph with nodes");
    let seed = fresh_seed(test);
    for replay in 0..2u64 {
        let x = inputs_from(seed.wrapping_add(replay * 0x9e37_79b9), &shape);
        stream
            .memcpy_htod(&fuse(&shape, [&x.q, &x.k, &x.v]), &mut fused)
            .unwrap();
        stream.memcpy_htod(&x.d_o, &mut d_o).unwrap();
        graph.launch().unwrap();
        stream.synchronize().unwrap();
        let want_f = forward_f32(
            &shape,
            &widen(&x.q),
            &widen(&x.k),
            &widen(&x.v),
            &options.attention,
        )
        .unwrap();
        let want_b = backward_f32(
            &shape,
            &widen(&x.q),
            &widen(&x.k),
            &widen(&x.v),
            &widen(&x.d_o),
            &options.attention,
        )
        .unwrap();
        let o_err = rel_err(&widen(&stream.clone_dtoh(&o).unwrap()), &want_f.o);
        assert!(o_err <= BOUND, "replay {replay}: O error {o_err}");
        let l_err = lse_err(&stream.clone_dtoh(&lse).unwrap(), &want_f.lse);
        assert!(l_err <= LSE_BOUND, "replay {replay}: LSE error {l_err}");
        for (name, g, want) in [
            ("dq", &grads[0], &want_b.dq),
            ("dk", &grads[1], &want_b.dk),
            ("dv", &grads[2], &want_b.dv),
        ] {
            let err = rel_err(&widen(&stream.clone_dtoh(g).unwrap()), want);
            assert!(err <= BOUND, "replay {replay}: {name} error {err}");
        }
    }
}

/// Option arrays uploaded from the host cannot be captured: refused with a message, not a
/// graph that would read freed host memory at replay.
#[test]
fn host_arrays_are_refused_under_capture() {
    let test = "host_arrays_are_refused_under_capture";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let shape = shape(4);
    let slopes = flash_attn::alibi_slopes(shape.heads_q);
    let options = FlashOptions::new(AttentionOptions::new().causal(true).alibi_slopes(slopes));
    let plan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
    let work = Workspace::on_stream(&gpu, &plan, &stream).unwrap();
    let x = inputs(test, &shape);
    let up = |v: &[bf16]| stream.clone_htod(v).unwrap();
    let (q, k, v) = (up(&x.q), up(&x.k), up(&x.v));
    let (o, lse) = (
        poisoned(&stream, bf16::NAN, shape.q_elems()),
        poisoned(&stream, f32::NAN, shape.row_elems()),
    );
    let at = |s: &CudaSlice<bf16>| s.device_ptr(&stream).0;
    let (qa, ka, va, oa, la) = (at(&q), at(&k), at(&v), at(&o), lse.device_ptr(&stream).0);
    // SAFETY: live slices, synchronised before they drop.
    let call = || unsafe {
        forward_on(
            &gpu,
            &stream,
            &shape,
            [
                &TensorRef::from_raw(qa, shape.q_elems(), DType::Bf16),
                &TensorRef::from_raw(ka, shape.k_elems(), DType::Bf16),
                &TensorRef::from_raw(va, shape.v_elems(), DType::Bf16),
            ],
            &mut TensorMut::from_raw(oa, shape.q_elems(), DType::Bf16),
            &mut TensorMut::from_raw(la, shape.row_elems(), DType::F32),
            &work,
            &options,
        )
    };
    call().unwrap();
    stream.synchronize().unwrap();
    stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .unwrap();
    let refused = call();
    let _ = stream.end_capture(CUgraphInstantiate_flags(0));
    match refused {
        Err(AttentionError::InvalidInput(why)) => assert!(why.contains("capture"), "{why}"),
        other => panic!("expected InvalidInput, got {:?}", other.map(|p| p.entry)),
    }
    // Outside the capture the same call runs and matches the reference.
    call().unwrap();
    let want = forward_f32(
        &shape,
        &widen(&x.q),
        &widen(&x.k),
        &widen(&x.v),
        &options.attention,
    )
    .unwrap();
    let err = rel_err(&widen(&stream.clone_dtoh(&o).unwrap()), &want.o);
    assert!(err <= BOUND, "O error {err}");
}

#[test]
fn a_strided_lse_and_a_stream_of_another_gpu_are_refused() {
    let test = "a_strided_lse_and_a_stream_of_another_gpu_are_refused";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    // Self-attention sizes: Q's memory also serves as K and V, so only the checks under test fail.
    let shape = AttentionShape {
        n_k: 96,
        ..shape(4)
    };
    let options = FlashOptions::default();
    let plan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
    let work = Workspace::on_stream(&gpu, &plan, &stream).unwrap();
    let q = poisoned(&stream, bf16::ZERO, shape.q_elems());
    let mut o = poisoned(&stream, bf16::NAN, shape.o_elems());
    let mut lse = poisoned(&stream, f32::NAN, shape.row_elems());
    let r = TensorRef::new(&q, &stream);
    let refused = forward_on(
        &gpu,
        &stream,
        &shape,
        [&r, &r, &r],
        &mut TensorMut::new(&mut o, &stream),
        &mut TensorMut::new(&mut lse, &stream).strided(Strides::bnhd(1, 1, 1)),
        &work,
        &options,
    );
    match refused {
        Err(AttentionError::InvalidInput(why)) => assert!(why.contains("no strides"), "{why}"),
        other => panic!("expected InvalidInput, got {:?}", other.map(|p| p.entry)),
    }
    // Another device's stream, where there is a second device.
    if let Ok(other) = flash_attn::gpu_on(1) {
        let theirs = other.context().new_stream().unwrap();
        assert!(!gpu.owns_stream(&theirs));
    } else {
        skip(
            test,
            "no second device: the other-context check ran on one device only",
        );
    }
}

#[test]
fn cudarc_attention_trains_on_slices_with_the_lse_kept() {
    let test = "cudarc_attention_trains_on_slices_with_the_lse_kept";
    let Some(first) = gpu_or_skip(test) else {
        return;
    };
    let stream = first.context().new_stream().unwrap();
    let attention = flash_attn::attention_on(stream.clone()).unwrap();
    for options in [
        FlashOptions::new(AttentionOptions::new().causal(true)),
        FlashOptions::new(
            AttentionOptions::new()
                .window(17, 0)
                .sinks(vec![0.5, -0.25, 1.0, 0.0]),
        ),
    ] {
        let shape = shape(2);
        let x = inputs(test, &shape);
        let up = |v: &[bf16]| stream.clone_htod(v).unwrap();
        let (q, k, v, d_o) = (up(&x.q), up(&x.k), up(&x.v), up(&x.d_o));
        let fwd = attention.forward(&shape, &q, &k, &v, &options).unwrap();
        let grads = attention
            .backward(&shape, &q, &k, &v, &fwd.o, &d_o, &fwd.lse, &options)
            .unwrap();
        // A second step reuses the workspace and gives the same dK (no atomics there).
        let again = attention
            .backward(&shape, &q, &k, &v, &fwd.o, &d_o, &fwd.lse, &options)
            .unwrap();
        let (qf, kf, vf, dof) = (widen(&x.q), widen(&x.k), widen(&x.v), widen(&x.d_o));
        let want_f = forward_f32(&shape, &qf, &kf, &vf, &options.attention).unwrap();
        let want_b = backward_f32(&shape, &qf, &kf, &vf, &dof, &options.attention).unwrap();
        let host = |s: &CudaSlice<bf16>| widen(&stream.clone_dtoh(s).unwrap());
        let label = format!("{} / {}", fwd.plan.entry, grads.plan.entry);
        assert!(rel_err(&host(&fwd.o), &want_f.o) <= BOUND, "{label}: O");
        assert!(
            lse_err(&stream.clone_dtoh(&fwd.lse).unwrap(), &want_f.lse) <= LSE_BOUND,
            "{label}: LSE"
        );
        for (name, got, want) in [
            ("dq", &grads.dq, &want_b.dq),
            ("dk", &grads.dk, &want_b.dk),
            ("dv", &grads.dv, &want_b.dv),
        ] {
            let err = rel_err(&host(got), want);
            assert!(err <= BOUND, "{label}: {name} error {err}");
        }
        assert_eq!(
            bits(&stream.clone_dtoh(&grads.dk).unwrap()),
            bits(&stream.clone_dtoh(&again.dk).unwrap())
        );
        match (&grads.d_sinks, &want_b.d_sinks) {
            (None, None) => {}
            (Some(got), Some(want)) => {
                let got = stream.clone_dtoh(got).unwrap();
                let err = rel_err(&got, want);
                assert!(err <= BOUND, "{label}: d_sinks error {err}");
            }
            _ => panic!("{label}: sink gradients present on one side only"),
        }
    }
}
