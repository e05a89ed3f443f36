//! One `Gpu` from several threads: shared by two threads, created on one and used and dropped on
//! another, launching one kernel with different shared-memory sizes at once, and buffers that
//! outlive the `Gpu` and move between threads. Where no CUDA device answers, each test prints
//! `SKIP <test>: ...` to stderr and returns.

use std::thread;

use flash_attn::families::exact::KernelFamily;
use flash_attn::reference::forward_f32;
use flash_attn::{
    AttentionOptions, AttentionShape, BlockSizes, DType, DeviceF32, DeviceTensor, FlashOptions, Gpu,
};
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, rel_err, skip};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

// The runtime's types cross threads (checked when this file compiles).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Gpu>();
    send_sync::<DeviceTensor>();
    send_sync::<DeviceF32>();
};

const SHAPE: AttentionShape = AttentionShape {
    batch: 1,
    n_q: 200,
    n_k: 300,
    heads_q: 2,
    heads_kv: 1,
    head_dim: 64,
    head_dim_v: 64,
};
/// f32 storage: the bound of `gpu_exact` (f32 accumulation, `ex2.approx`).
const BOUND: f64 = 2e-5;

struct Inputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    options: AttentionOptions,
    reference: Vec<f64>,
}

fn inputs(seed: u64, causal: bool) -> Inputs {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut random = |n| {
        (0..n)
            .map(|_| rng.gen_range(-1.5f32..1.5))
            .collect::<Vec<_>>()
    };
    let (q, k, v) = (
        random(SHAPE.q_elems()),
        random(SHAPE.k_elems()),
        random(SHAPE.v_elems()),
    );
    let options = AttentionOptions::new().causal(causal);
    let reference = forward_f32(&SHAPE, &q, &k, &v, &options).unwrap().o;
    Inputs {
        q,
        k,
        v,
        options,
        reference,
    }
}

/// Uploads on the calling thread, runs the exact forward, downloads, and checks O.
fn forward_and_check(gpu: &Gpu, inputs: &Inputs, options: &FlashOptions, what: &str) {
    let up = |x: &[f32]| DeviceTensor::from_f32(DType::F32, x).unwrap();
    let (q, k, v) = (up(&inputs.q), up(&inputs.k), up(&inputs.v));
    let out = flash_attn::forward(gpu, &SHAPE, &q, &k, &v, options)
        .unwrap_or_else(|e| panic!("{what}: forward failed: {e}"));
    let err = rel_err(&out.o.to_f32().unwrap(), &inputs.reference);
    assert!(err < BOUND, "{what}: relative error {err}");
}

#[test]
fn one_gpu_shared_by_two_threads() {
    let test = "one_gpu_shared_by_two_threads";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let seed = fresh_seed(test);
    let cases = [inputs(seed, false), inputs(seed + 1, true)];
    thread::scope(|s| {
        for (t, case) in cases.iter().enumerate() {
            let gpu = &gpu;
            s.spawn(move || {
                let options = FlashOptions::new(case.options.clone());
                for i in 0..10 {
                    forward_and_check(gpu, case, &options, &format!("thread {t}, call {i}"));
                }
            });
        }
    });
}

/// Two threads launch the same kernel at once with different dynamic shared-memory sizes, both
/// above the 48 KiB default: neither launch may be refused because of the other's size.
#[test]
fn concurrent_launches_with_different_shared_sizes() {
    let test = "concurrent_launches_with_different_shared_sizes";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let sizes = [(32, 64), (64, 128)];
    let bytes = sizes.map(|(r, c)| {
        let b = BlockSizes {
            block_rows: r,
            block_cols: c,
        };
        KernelFamily::Forward.shared_bytes(b, SHAPE.head_dim, SHAPE.head_dim_v)
    });
    let limit = gpu.max_shared_per_block().unwrap() as u64;
    if bytes.iter().any(|&b| b > limit) {
        skip(
            test,
            &format!("the device allows {limit} bytes, the test needs {bytes:?}"),
        );
        return;
    }
    assert!(bytes.iter().all(|&b| b > 48 * 1024) && bytes[0] != bytes[1]);
    let case = inputs(fresh_seed(test), false);
    thread::scope(|s| {
        for (r, c) in sizes {
            let (gpu, case) = (&gpu, &case);
            s.spawn(move || {
                let options = FlashOptions::new(case.options.clone()).block_sizes(r, c);
                for i in 0..25 {
                    forward_and_check(gpu, case, &options, &format!("blocks ({r}, {c}), call {i}"));
                }
            });
        }
    });
}

/// Created on one thread, used and dropped on another that never touched CUDA before.
#[test]
fn gpu_created_on_one_thread_used_on_another() {
    let test = "gpu_created_on_one_thread_used_on_another";
    let Some(gpu) = thread::spawn(move || gpu_or_skip(test)).join().unwrap() else {
        return;
    };
    let case = inputs(fresh_seed(test), true);
    thread::spawn(move || {
        let options = FlashOptions::new(case.options.clone());
        forward_and_check(&gpu, &case, &options, "on the second thread");
        drop(gpu);
    })
    .join()
    .unwrap();
}

/// Buffers keep the context alive: dropping the `Gpu` first leaves them readable, from another
/// thread too, and they free themselves there.
#[test]
fn buffers_outlive_the_gpu_and_move_between_threads() {
    let test = "buffers_outlive_the_gpu_and_move_between_threads";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let case = inputs(fresh_seed(test), false);
    let up = |x: &[f32]| DeviceTensor::from_f32(DType::F32, x).unwrap();
    let (q, k, v) = (up(&case.q), up(&case.k), up(&case.v));
    let out =
        flash_attn::forward(&gpu, &SHAPE, &q, &k, &v, &FlashOptions::new(case.options)).unwrap();
    let bits = DeviceTensor::from_f32(DType::Bf16, &case.q).unwrap();
    drop(gpu);
    let reference = case.reference;
    thread::spawn(move || {
        let err = rel_err(&out.o.to_f32().unwrap(), &reference);
        assert!(err < BOUND, "O read after the Gpu was dropped: {err}");
        assert_eq!(out.lse.to_vec().unwrap().len(), SHAPE.row_elems());
        let rounded: Vec<f32> = case.q.iter().map(|&x| DType::Bf16.round(x)).collect();
        assert_eq!(bits.to_f32().unwrap(), rounded);
        assert_eq!(q.to_f32().unwrap(), case.q);
        drop((out, bits, q, k, v));
    })
    .join()
    .unwrap();
    // A fresh Gpu after all of that starts as usual.
    let gpu = gpu_or_skip(test).expect("the device answered a moment ago");
    let case = inputs(fresh_seed(test), true);
    forward_and_check(
        &gpu,
        &case,
        &FlashOptions::new(case.options.clone()),
        "a fresh Gpu",
    );
}
