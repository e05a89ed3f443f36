//! Two devices in one process (issue 13 item 5), each through the entry points on the caller's
//! memory and stream (`gpu_on`, `forward_on`, `backward_on`, `merge_on`), against the f64
//! reference:
//! - a `Gpu` and a stream per device, forward and backward from two threads at once on different
//!   random problems;
//! - the keys of one problem split in two halves, `(O, LSE)` of one half on each device, device
//!   1's parts brought to device 0 (`copy_across_devices`: peer where the devices allow it, and
//!   through the host, which must give the same bits), merged there, against the reference over
//!   all keys; rows with no key in one half and rows with none in either;
//! - device 1's buffers used from a thread where device 0's context is current, and read back
//!   from a thread that never touched CUDA;
//! - refusals: the library's device-0 buffers with a device-1 `Gpu`, copies of mismatched views,
//!   memory on the wrong device, a merge on another context's stream.
//!
//! - `merge_on` against `merge_into` bit for bit, and its refusals, on one device (the one test
//!   here that runs with a single device).
//!
//! It prints the devices' names and which copy path ran. With fewer than two devices each
//! two-device test prints `SKIP <test>: ...` and returns.

use std::io::Write;
use std::ops::Range;
use std::sync::{Arc, Barrier};
use std::thread;

use flash_attn::cudarc::driver::result::ctx::get_current;
use flash_attn::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use flash_attn::reference::{Forward, Gradients, backward_from_output_f32, forward_f32};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, CopyPath, CopyRoute, DType, DeviceF32,
    DeviceTensor, Direction, FlashOptions, Gpu, PartShape, Strides, TensorMut, TensorRef,
    Workspace, can_access_peer, copy_across_devices, forward_on, merge, merge_on,
};
use flash_attn_testkit::caller_stream::{
    Inputs, Results, bf16_values, bits, forward_backward, poisoned, widen,
};
use flash_attn_testkit::inputs::uniform;
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, lse_err, rel_err, skip};
use half::bf16;

/// bf16 bounds of `tests/gpu_matrix.rs` and `tests/gpu_stream_api.rs`: ‖out − ref‖/‖ref‖ and the
/// worst LSE error.
const BOUND: f64 = 1e-2;
const LSE_BOUND: f64 = 2e-3;
/// A merged O is rounded to bf16 twice (each part's O, then the merge's): the end-to-end bound of
/// `tests/gpu_merge.rs`.
const MERGED_BOUND: f64 = 2e-2;

/// A line on stderr that libtest does not capture (as the testkit's `skip`).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A `Gpu` on devices 0 and 1, or `None` after a `SKIP` line when either does not answer.
fn two_gpus_or_skip(test: &str) -> Option<[Gpu; 2]> {
    let mut gpus = Vec::new();
    for ordinal in 0..2 {
        match flash_attn::gpu_on(ordinal) {
            Ok(gpu) => gpus.push(gpu),
            Err(AttentionError::NoDevice(why)) => {
                skip(
                    test,
                    &format!("needs two CUDA devices, device {ordinal}: {why}"),
                );
                return None;
            }
            Err(e) => panic!("{test}: device {ordinal} failed to start: {e}"),
        }
    }
    for (ordinal, gpu) in gpus.iter().enumerate() {
        say(&format!(
            "{test}: device {ordinal}: {} (compute capability {:?})",
            gpu.device_name(),
            gpu.compute_capability()
        ));
    }
    gpus.try_into().ok()
}

fn f32_bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

fn inputs(seed: u64, shape: &AttentionShape) -> Inputs {
    Inputs::new(seed, shape)
}

/// The f64 reference of `x`: the forward, and the backward with `D` from `o`, the O the kernels
/// read (`backward_from_output_f32`, as `tests/gpu_matrix.rs`).
fn reference(
    shape: &AttentionShape,
    x: &Inputs,
    options: &FlashOptions,
    o: &[bf16],
) -> (Forward, Gradients) {
    let (q, k, v, d_o) = (widen(&x.q), widen(&x.k), widen(&x.v), widen(&x.d_o));
    let f = forward_f32(shape, &q, &k, &v, &options.attention).unwrap();
    let b =
        backward_from_output_f32(shape, (&q, &k, &v), &widen(o), &d_o, &options.attention).unwrap();
    (f, b)
}

fn check(what: &str, got: &Results, (f, b): &(Forward, Gradients)) {
    let errors = [
        ("o", rel_err(&widen(&got.0), &f.o), BOUND),
        ("lse", lse_err(&got.1, &f.lse), LSE_BOUND),
        ("dq", rel_err(&widen(&got.2), &b.dq), BOUND),
        ("dk", rel_err(&widen(&got.3), &b.dk), BOUND),
        ("dv", rel_err(&widen(&got.4), &b.dv), BOUND),
    ];
    let line: Vec<String> = errors
        .iter()
        .map(|(name, err, _)| format!("{name} {err:.2e}"))
        .collect();
    say(&format!("{what}: {}", line.join(", ")));
    for (name, err, bound) in errors {
        assert!(err <= bound, "{what}: {name} error {err} over {bound}");
    }
}

#[test]
fn two_devices_run_forward_and_backward_at_once_on_their_own_streams() {
    let test = "two_devices_run_forward_and_backward_at_once_on_their_own_streams";
    let Some(gpus) = two_gpus_or_skip(test) else {
        return;
    };
    let seed = fresh_seed(test);
    // Different problems: GQA 2 causal d 64 on device 0, GQA 4 non-causal d 128 with N_q ≠ N_k
    // and tails on device 1.
    let problems = [
        (
            AttentionShape {
                batch: 2,
                n_q: 200,
                n_k: 300,
                heads_q: 4,
                heads_kv: 2,
                head_dim: 64,
                head_dim_v: 64,
            },
            AttentionOptions::new().causal(true),
        ),
        (
            AttentionShape {
                batch: 1,
                n_q: 333,
                n_k: 257,
                heads_q: 8,
                heads_kv: 2,
                head_dim: 128,
                head_dim_v: 128,
            },
            AttentionOptions::new(),
        ),
    ];
    const CALLS: usize = 3;
    let start = Barrier::new(2);
    thread::scope(|s| {
        for (ordinal, (gpu, (shape, attention))) in gpus.iter().zip(&problems).enumerate() {
            let start = &start;
            s.spawn(move || {
                let options = FlashOptions::new(attention.clone());
                let x = inputs(seed.wrapping_add(ordinal as u64 * 0x9e37_79b9), shape);
                // Setup errors wait for the barrier too, so a failing thread cannot leave the
                // other waiting for ever.
                let setup = || -> Result<_, String> {
                    let stream = gpu.context().new_stream().map_err(|e| e.to_string())?;
                    let plans = [Direction::Forward, Direction::Backward].map(|d| {
                        flash_attn::plan(gpu, shape, DType::Bf16, &options, d)
                            .map_err(|e| e.to_string())
                    });
                    let [f, b] = plans;
                    let plans = [f?, b?];
                    say(&format!(
                        "{test}: device {ordinal} runs {} and {}",
                        plans[0].entry, plans[1].entry
                    ));
                    let [f, b] = plans
                        .each_ref()
                        .map(|p| Workspace::on_stream(gpu, p, &stream).map_err(|e| e.to_string()));
                    Ok((stream, [f?, b?]))
                };
                let ready = setup();
                // Both threads queue their calls together, so the two devices' work overlaps.
                start.wait();
                let (stream, workspaces) =
                    ready.unwrap_or_else(|e| panic!("{test}: device {ordinal}: {e}"));
                assert!(gpu.owns_stream(&stream));
                let runs: Vec<Results> = (0..CALLS)
                    .map(|_| forward_backward(gpu, &stream, shape, &x, &options, &workspaces))
                    .collect();
                let what = format!("{test}: device {ordinal}");
                let want = reference(shape, &x, &options, &runs[0].0);
                // Every call against the same reference: O, LSE, dK and dV are the same bits in
                // every call (one block writes each), so the backward read the same O.
                for (call, got) in runs.iter().enumerate() {
                    let what = format!("{what}, call {call}");
                    assert_eq!(bits(&got.0), bits(&runs[0].0), "{what}: O");
                    assert_eq!(f32_bits(&got.1), f32_bits(&runs[0].1), "{what}: LSE");
                    assert_eq!(bits(&got.3), bits(&runs[0].3), "{what}: dK");
                    assert_eq!(bits(&got.4), bits(&runs[0].4), "{what}: dV");
                    check(&what, got, &want);
                }
            });
        }
    });
}

/// K or V keys `keys` of every batch item of `x` (`[batch, n_k, heads_kv, d]`).
fn key_slice(s: &AttentionShape, x: &[bf16], keys: Range<u32>) -> Vec<bf16> {
    let row = (s.heads_kv * s.head_dim) as usize;
    (0..s.batch as usize)
        .flat_map(|b| {
            let first = (b * s.n_k as usize + keys.start as usize) * row;
            x[first..first + keys.len() * row].to_vec()
        })
        .collect()
}

/// `(O, LSE)` of `keys` of the problem on `gpu`'s `stream`: the half's own K/V tensors and each
/// batch item's key length clipped to the half.
fn half_forward(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: &AttentionShape,
    x: &Inputs,
    lengths: &[u32],
    keys: Range<u32>,
) -> (CudaSlice<bf16>, CudaSlice<f32>) {
    let half = AttentionShape {
        n_k: keys.len() as u32,
        ..*shape
    };
    let clipped = lengths
        .iter()
        .map(|&l| l.clamp(keys.start, keys.end) - keys.start)
        .collect();
    let options = FlashOptions::new(AttentionOptions::new().key_lengths(clipped));
    let plan = flash_attn::plan(gpu, &half, DType::Bf16, &options, Direction::Forward).unwrap();
    let workspace = Workspace::on_stream(gpu, &plan, stream).unwrap();
    let q = stream.clone_htod(&x.q).unwrap();
    let k = stream
        .clone_htod(&key_slice(shape, &x.k, keys.clone()))
        .unwrap();
    let v = stream.clone_htod(&key_slice(shape, &x.v, keys)).unwrap();
    let mut o = poisoned(stream, bf16::NAN, half.o_elems());
    let mut lse = poisoned(stream, f32::NAN, half.row_elems());
    let r = |t| TensorRef::new(t, stream);
    forward_on(
        gpu,
        stream,
        &half,
        [&r(&q), &r(&k), &r(&v)],
        &mut TensorMut::new(&mut o, stream),
        &mut TensorMut::new(&mut lse, stream),
        &workspace,
        &options,
    )
    .unwrap();
    (o, lse)
}

/// Copies `src` (device 1, `s1`) into a NaN-poisoned slice on device 0 (`s0`) by `route`.
fn bring<T: flash_attn::Element + Copy>(
    src: &CudaSlice<T>,
    s1: &Arc<CudaStream>,
    s0: &Arc<CudaStream>,
    nan: T,
    route: CopyRoute,
) -> (CudaSlice<T>, CopyPath) {
    let mut dst = poisoned(s0, nan, src.len());
    let path = copy_across_devices(
        &TensorRef::new(src, s1),
        s1,
        &mut TensorMut::new(&mut dst, s0),
        s0,
        route,
    )
    .unwrap();
    (dst, path)
}

#[test]
fn keys_split_over_two_devices_merge_on_device_zero() {
    let test = "keys_split_over_two_devices_merge_on_device_zero";
    let Some([gpu0, gpu1]) = two_gpus_or_skip(test) else {
        return;
    };
    let (s0, s1) = (
        gpu0.context().new_stream().unwrap(),
        gpu1.context().new_stream().unwrap(),
    );
    let shape = AttentionShape {
        batch: 3,
        n_q: 77,
        n_k: 300,
        heads_q: 8,
        heads_kv: 2,
        head_dim: 128,
        head_dim_v: 128,
    };
    // Item 0 sees every key; item 1 only keys of the first half (none in the second); item 2
    // none at all.
    let lengths = [300, 120, 0];
    let split = 170;
    let x = inputs(fresh_seed(test), &shape);
    // Both halves queued before either is read: the devices work at the same time.
    let (o_a, lse_a) = half_forward(&gpu0, &s0, &shape, &x, &lengths, 0..split);
    let (o_b, lse_b) = half_forward(&gpu1, &s1, &shape, &x, &lengths, split..shape.n_k);

    let peer = can_access_peer(&s0, &s1).unwrap();
    let (o_b0, o_path) = bring(&o_b, &s1, &s0, bf16::NAN, CopyRoute::Auto);
    let (lse_b0, lse_path) = bring(&lse_b, &s1, &s0, f32::NAN, CopyRoute::Auto);
    assert_eq!(o_path, lse_path);
    assert_eq!(o_path == CopyPath::Peer, peer);
    say(&format!(
        "{test}: device 0 {} device 1's memory: copy path {o_path}",
        if peer { "can access" } else { "cannot access" }
    ));
    // The fallback, taken on purpose, gives the same bits, as does device 1's own download.
    let (o_staged, staged) = bring(&o_b, &s1, &s0, bf16::NAN, CopyRoute::Staged);
    let (lse_staged, _) = bring(&lse_b, &s1, &s0, f32::NAN, CopyRoute::Staged);
    assert_eq!(staged, CopyPath::Staged);
    let on_device_1 = (s1.clone_dtoh(&o_b).unwrap(), s1.clone_dtoh(&lse_b).unwrap());
    for (name, got) in [
        (o_path.to_string(), (&o_b0, &lse_b0)),
        (staged.to_string(), (&o_staged, &lse_staged)),
    ] {
        assert_eq!(
            bits(&s0.clone_dtoh(got.0).unwrap()),
            bits(&on_device_1.0),
            "O, {name}"
        );
        let lse = s0.clone_dtoh(got.1).unwrap();
        assert_eq!(f32_bits(&lse), f32_bits(&on_device_1.1), "LSE, {name}");
    }
    // Item 1's rows have no key in the second half: LSE −∞ there, before the merge.
    let rows = (shape.heads_q * shape.n_q) as usize;
    assert!(
        on_device_1.1[rows..]
            .iter()
            .all(|&l| l == f32::NEG_INFINITY)
    );

    let part = PartShape::of(&shape);
    let mut o = poisoned(&s0, bf16::NAN, shape.o_elems());
    let mut lse = poisoned(&s0, f32::NAN, shape.row_elems());
    {
        let r = |t| TensorRef::new(t, &s0);
        let (oa, ob) = (r(&o_a), r(&o_b0));
        let (la, lb) = (TensorRef::new(&lse_a, &s0), TensorRef::new(&lse_b0, &s0));
        merge_on(
            &gpu0,
            &s0,
            &part,
            &[&oa, &ob],
            &[&la, &lb],
            &mut TensorMut::new(&mut o, &s0),
            &mut TensorMut::new(&mut lse, &s0),
        )
        .unwrap();
    }
    let (o, lse) = (s0.clone_dtoh(&o).unwrap(), s0.clone_dtoh(&lse).unwrap());
    let all = AttentionOptions::new().key_lengths(lengths.to_vec());
    let want = forward_f32(&shape, &widen(&x.q), &widen(&x.k), &widen(&x.v), &all).unwrap();
    let (eo, el) = (rel_err(&widen(&o), &want.o), lse_err(&lse, &want.lse));
    say(&format!(
        "{test}: halves {split} + {} keys merged on device 0: O rel {eo:.2e}, LSE abs {el:.2e}",
        shape.n_k - split
    ));
    assert!(eo <= MERGED_BOUND, "O error {eo}");
    assert!(el <= LSE_BOUND, "LSE error {el}");
    // Item 2 has no key in either half: exactly O = 0, LSE = −∞.
    let item = shape.q_elems() / shape.batch as usize;
    assert!(
        o[2 * item..].iter().all(|v| v.to_bits() == 0),
        "O of item 2"
    );
    assert!(lse[2 * rows..].iter().all(|&l| l == f32::NEG_INFINITY));
}

#[test]
fn device_one_buffers_run_from_a_thread_where_device_zero_is_current() {
    let test = "device_one_buffers_run_from_a_thread_where_device_zero_is_current";
    let Some([gpu0, gpu1]) = two_gpus_or_skip(test) else {
        return;
    };
    let shape = AttentionShape {
        batch: 2,
        n_q: 96,
        n_k: 130,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 64,
        head_dim_v: 64,
    };
    let x = inputs(fresh_seed(test), &shape);
    let options = FlashOptions::new(AttentionOptions::new().causal(true));
    // Made on this thread: device 1's stream, buffers and workspace. Q goes in `[B, H, N, d]`,
    // so the call also allocates a staging copy (from device 1's pool) and launches copies.
    let s1 = gpu1.context().new_stream().unwrap();
    let plan = flash_attn::plan(&gpu1, &shape, DType::Bf16, &options, Direction::Forward).unwrap();
    let workspace = Workspace::on_stream(&gpu1, &plan, &s1).unwrap();
    let (n, h, d) = (shape.n_q as usize, shape.heads_q as usize, 64);
    let mut q_bhnd = vec![bf16::ZERO; x.q.len()];
    for b in 0..shape.batch as usize {
        for t in 0..n {
            for hi in 0..h {
                let (from, to) = (((b * n + t) * h + hi) * d, ((b * h + hi) * n + t) * d);
                q_bhnd[to..to + d].copy_from_slice(&x.q[from..from + d]);
            }
        }
    }
    let q = s1.clone_htod(&q_bhnd).unwrap();
    let (k, v) = (s1.clone_htod(&x.k).unwrap(), s1.clone_htod(&x.v).unwrap());
    let mut o = poisoned(&s1, bf16::NAN, shape.o_elems());
    let mut lse = poisoned(&s1, f32::NAN, shape.row_elems());
    let sq = Strides::bhnd(shape.n_q, shape.heads_q, shape.head_dim);
    thread::scope(|s| {
        s.spawn(|| {
            let (qr, kr, vr) = (
                TensorRef::new(&q, &s1).strided(sq),
                TensorRef::new(&k, &s1),
                TensorRef::new(&v, &s1),
            );
            let (mut o_w, mut lse_w) = (TensorMut::new(&mut o, &s1), TensorMut::new(&mut lse, &s1));
            // cudarc made device 1's context current while taking the views: switch away.
            gpu0.make_current().unwrap();
            assert_eq!(get_current().unwrap(), Some(gpu0.context().cu_ctx()));
            forward_on(
                &gpu1,
                &s1,
                &shape,
                [&qr, &kr, &vr],
                &mut o_w,
                &mut lse_w,
                &workspace,
                &options,
            )
            .unwrap();
            // The call ran in device 1's context, and left it current.
            assert_eq!(get_current().unwrap(), Some(gpu1.context().cu_ctx()));
            // The views and the workspace (device 1's pool) are let go of from device 0's
            // context: each makes its own current.
            gpu0.make_current().unwrap();
            drop((qr, kr, vr, o_w, lse_w));
            drop(workspace);
        });
    });
    // Read back from a thread that never made a context current.
    let (o, lse) = thread::spawn(move || {
        assert_eq!(get_current().unwrap(), None);
        (s1.clone_dtoh(&o).unwrap(), s1.clone_dtoh(&lse).unwrap())
    })
    .join()
    .unwrap();
    let want = forward_f32(
        &shape,
        &widen(&x.q),
        &widen(&x.k),
        &widen(&x.v),
        &options.attention,
    )
    .unwrap();
    let (eo, el) = (rel_err(&widen(&o), &want.o), lse_err(&lse, &want.lse));
    say(&format!("{test}: O rel {eo:.2e}, LSE abs {el:.2e}"));
    assert!(eo <= BOUND, "O error {eo}");
    assert!(el <= LSE_BOUND, "LSE error {el}");
}

#[test]
fn owned_buffers_copies_and_merges_refuse_the_wrong_device() {
    let test = "owned_buffers_copies_and_merges_refuse_the_wrong_device";
    let Some([gpu0, gpu1]) = two_gpus_or_skip(test) else {
        return;
    };
    let refused = |what: &str, r: Result<(), AttentionError>, says: &str| match r {
        Err(AttentionError::InvalidInput(why)) => {
            assert!(why.contains(says), "{what}: {why}")
        }
        other => panic!("{what}: expected InvalidInput, got {other:?}"),
    };
    // The library's own buffers live on device 0: a device-1 Gpu is refused before launching.
    let shape = AttentionShape {
        batch: 1,
        n_q: 4,
        n_k: 4,
        heads_q: 1,
        heads_kv: 1,
        head_dim: 64,
        head_dim_v: 64,
    };
    let t = DeviceTensor::from_f32(DType::Bf16, &vec![0.5; shape.q_elems()]).unwrap();
    let l = DeviceF32::from_slice(&vec![0.0; shape.row_elems()]).unwrap();
    let forward = flash_attn::forward(&gpu1, &shape, &t, &t, &t, &FlashOptions::default());
    refused("forward", forward.map(drop), "this Gpu is on device 1");
    let merged = merge(&gpu1, &PartShape::of(&shape), &[&t], &[&l]);
    refused("merge", merged.map(drop), "this Gpu is on device 1");

    let (s0, s1) = (
        gpu0.context().new_stream().unwrap(),
        gpu1.context().new_stream().unwrap(),
    );
    let on1 = poisoned(&s1, 0.0f32, 256);
    let mut on0 = poisoned(&s0, f32::NAN, 256);
    let mut short = poisoned(&s0, f32::NAN, 255);
    let copy = |src: &CudaSlice<f32>,
                ss: &Arc<CudaStream>,
                dst: &mut CudaSlice<f32>,
                ds: &Arc<CudaStream>| {
        copy_across_devices(
            &TensorRef::new(src, ss),
            ss,
            &mut TensorMut::new(dst, ds),
            ds,
            CopyRoute::Auto,
        )
        .map(drop)
    };
    refused(
        "copy of mismatched lengths",
        copy(&on1, &s1, &mut short, &s0),
        "same dtype and length",
    );
    let other0 = s0.clone_htod(&[1.0f32; 256]).unwrap();
    refused(
        "copy within one device",
        copy(&other0, &s0, &mut on0, &s0),
        "both streams are on device 0",
    );
    // Memory of one device passed with the other's stream: raw views, so that cudarc records no
    // event of one context on the other's stream.
    let other1 = poisoned(&s1, f32::NAN, 256);
    let (on1_at, other1_at) = (on1.device_ptr(&s1).0, other1.device_ptr(&s1).0);
    let raw_copy = |src: u64, ss: &Arc<CudaStream>, dst: u64, ds: &Arc<CudaStream>| {
        // SAFETY: views of live slices of 256 f32; the copy is refused before anything is queued.
        let (src, mut dst) = unsafe {
            (
                TensorRef::from_raw(src, 256, DType::F32),
                TensorMut::from_raw(dst, 256, DType::F32),
            )
        };
        copy_across_devices(&src, ss, &mut dst, ds, CopyRoute::Auto).map(drop)
    };
    refused(
        "source on the wrong device",
        raw_copy(on1_at, &s0, other1_at, &s1),
        "the source is memory of device 1, its stream is on device 0",
    );
    refused(
        "destination on the wrong device",
        raw_copy(on1_at, &s1, other1_at, &s0),
        "the destination is memory of device 1, its stream is on device 0",
    );
    // An address no allocation holds: refused (the driver's answer for it is not pinned down
    // here, only that nothing is copied).
    let e = raw_copy(on1_at, &s1, 16, &s0).expect_err("a copy to address 16");
    say(&format!("{test}: a copy to address 16: {e}"));
    s0.synchronize().unwrap();
    assert!(s0.clone_dtoh(&on0).unwrap().iter().all(|v| v.is_nan()));

    // A merge on device 0 with device 1's stream, and with a part too short for its shape.
    let part = PartShape {
        batch: 1,
        n_q: 2,
        heads: 2,
        head_dim: 64,
    };
    let (o1, l1) = (poisoned(&s1, 0.0f32, 256), poisoned(&s1, 0.0f32, 4));
    let (mut o, mut l) = (poisoned(&s1, f32::NAN, 256), poisoned(&s1, f32::NAN, 4));
    let merged = merge_on(
        &gpu0,
        &s1,
        &part,
        &[&TensorRef::new(&o1, &s1)],
        &[&TensorRef::new(&l1, &s1)],
        &mut TensorMut::new(&mut o, &s1),
        &mut TensorMut::new(&mut l, &s1),
    );
    refused(
        "merge on another context's stream",
        merged,
        "another context",
    );
    let short_lse = poisoned(&s1, 0.0f32, 3);
    let merged = merge_on(
        &gpu1,
        &s1,
        &part,
        &[&TensorRef::new(&o1, &s1)],
        &[&TensorRef::new(&short_lse, &s1)],
        &mut TensorMut::new(&mut o, &s1),
        &mut TensorMut::new(&mut l, &s1),
    );
    refused(
        "merge of a short LSE part",
        merged,
        "memory holds 3 elements",
    );
}

/// `merge_on`, which the two-device tests build on, on one device: the same bits as `merge_into`
/// on the library's buffers, with empty rows; and its refusals. Runs wherever one device answers.
#[test]
fn merge_on_matches_merge_into_on_one_device() {
    let test = "merge_on_matches_merge_into_on_one_device";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let stream = gpu.context().new_stream().unwrap();
    let part = PartShape {
        batch: 2,
        n_q: 5,
        heads: 4,
        head_dim: 64,
    };
    let (o_len, rows) = (part.o_elems().unwrap(), part.lse_elems().unwrap());
    let seed = fresh_seed(test);
    // Three parts; in part p every row r with (r + p) % 3 == 0 is empty (LSE −∞, O NaN so a read
    // shows), so some rows are empty in one part, none in all.
    let parts: Vec<(Vec<bf16>, Vec<f32>)> = (0..3u64)
        .map(|p| {
            let mut o = bf16_values(seed.wrapping_add(p), o_len);
            let mut lse: Vec<f32> = uniform(seed.wrapping_add(p) ^ 7, rows)
                .into_iter()
                .map(|x| 4.0 * x)
                .collect();
            for (r, l) in lse.iter_mut().enumerate() {
                if (r + p as usize).is_multiple_of(3) {
                    *l = f32::NEG_INFINITY;
                    // LSE row (b·heads + h)·n_q + i is O row (b·n_q + i)·heads + h.
                    let (n_q, heads) = (part.n_q as usize, part.heads as usize);
                    let (bh, i) = (r / n_q, r % n_q);
                    let row = ((bh / heads) * n_q + i) * heads + bh % heads;
                    o[row * 64..(row + 1) * 64].fill(bf16::NAN);
                }
            }
            (o, lse)
        })
        .collect();
    // The library's buffers.
    let owned: Vec<(DeviceTensor, DeviceF32)> = parts
        .iter()
        .map(|(o, l)| {
            (
                DeviceTensor::from_bf16(o).unwrap(),
                DeviceF32::from_slice(l).unwrap(),
            )
        })
        .collect();
    let (o_ref, lse_ref) = (
        DeviceTensor::poisoned(DType::Bf16, o_len).unwrap(),
        DeviceF32::poisoned(rows).unwrap(),
    );
    let o_parts: Vec<&DeviceTensor> = owned.iter().map(|p| &p.0).collect();
    let lse_parts: Vec<&DeviceF32> = owned.iter().map(|p| &p.1).collect();
    flash_attn::merge_into(&gpu, &part, &o_parts, &lse_parts, &o_ref, &lse_ref).unwrap();
    let (o_ref, lse_ref) = (o_ref.to_bf16().unwrap(), lse_ref.to_vec().unwrap());
    assert!(
        o_ref.iter().all(|v| !v.is_nan()),
        "no row is empty everywhere"
    );
    // The caller's slices.
    let slices: Vec<(CudaSlice<bf16>, CudaSlice<f32>)> = parts
        .iter()
        .map(|(o, l)| (stream.clone_htod(o).unwrap(), stream.clone_htod(l).unwrap()))
        .collect();
    let mut o = poisoned(&stream, bf16::NAN, o_len);
    let mut lse = poisoned(&stream, f32::NAN, rows);
    {
        let o_views: Vec<TensorRef> = slices
            .iter()
            .map(|p| TensorRef::new(&p.0, &stream))
            .collect();
        let lse_views: Vec<TensorRef> = slices
            .iter()
            .map(|p| TensorRef::new(&p.1, &stream))
            .collect();
        let (o_refs, lse_refs): (Vec<&TensorRef>, Vec<&TensorRef>) =
            (o_views.iter().collect(), lse_views.iter().collect());
        let call = |o: &mut TensorMut, lse: &mut TensorMut| {
            merge_on(&gpu, &stream, &part, &o_refs, &lse_refs, o, lse)
        };
        call(
            &mut TensorMut::new(&mut o, &stream),
            &mut TensorMut::new(&mut lse, &stream),
        )
        .unwrap();
        // Refused: an output over a part, an output with strides.
        let (part0, lse0) = (slices[0].0.device_ptr(&stream).0, lse.device_ptr(&stream).0);
        // SAFETY: views of live slices; the calls are refused before anything is queued.
        let (mut over, mut lse_w) = unsafe {
            (
                TensorMut::from_raw(part0, o_len, DType::Bf16),
                TensorMut::from_raw(lse0, rows, DType::F32),
            )
        };
        let e = call(&mut over, &mut lse_w).unwrap_err().to_string();
        assert!(e.contains("overlap"), "{e}");
        let mut spare = poisoned(&stream, bf16::NAN, o_len);
        let strides = Strides::bnhd(part.n_q, part.heads, part.head_dim);
        let e = call(
            &mut TensorMut::new(&mut spare, &stream).strided(strides),
            &mut lse_w,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("has strides"), "{e}");
    }
    assert_eq!(bits(&stream.clone_dtoh(&o).unwrap()), bits(&o_ref));
    assert_eq!(
        f32_bits(&stream.clone_dtoh(&lse).unwrap()),
        f32_bits(&lse_ref)
    );
}
