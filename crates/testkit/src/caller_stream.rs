//! What the tests on the caller's memory and stream share (`tests/gpu_stream_api.rs`,
//! `tests/gpu_two_devices.rs`): bf16 inputs on the host, NaN-poisoned cudarc slices, and one
//! forward and backward through `forward_on` / `backward_on` with contiguous views.

use std::sync::Arc;

use flash_attn::cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use flash_attn::{
    AttentionShape, BackwardViews, FlashOptions, Gpu, GradientViews, TensorMut, TensorRef,
    Workspace, backward_on, forward_on,
};
use half::bf16;

use crate::inputs::uniform;

/// Host values rounded to bf16, as the device holds them.
pub fn bf16_values(seed: u64, len: usize) -> Vec<bf16> {
    uniform(seed, len).into_iter().map(bf16::from_f32).collect()
}

pub fn widen(x: &[bf16]) -> Vec<f32> {
    x.iter().map(|v| v.to_f32()).collect()
}

pub fn bits(x: &[bf16]) -> Vec<u16> {
    x.iter().map(|v| v.to_bits()).collect()
}

/// `len` copies of `nan` on `stream`: an output slice no kernel has written yet.
pub fn poisoned<T: DeviceRepr + Copy>(
    stream: &Arc<CudaStream>,
    nan: T,
    len: usize,
) -> CudaSlice<T> {
    stream.clone_htod(&vec![nan; len]).unwrap()
}

/// Q, K, V and dO of one call, on the host.
pub struct Inputs {
    pub q: Vec<bf16>,
    pub k: Vec<bf16>,
    pub v: Vec<bf16>,
    pub d_o: Vec<bf16>,
}

impl Inputs {
    /// Fresh values for `shape`, each tensor from its own stream of `seed`.
    pub fn new(seed: u64, shape: &AttentionShape) -> Inputs {
        Inputs {
            q: bf16_values(seed, shape.q_elems()),
            k: bf16_values(seed ^ 1, shape.k_elems()),
            v: bf16_values(seed ^ 2, shape.v_elems()),
            d_o: bf16_values(seed ^ 3, shape.o_elems()),
        }
    }
}

/// O, LSE, dQ, dK, dV of one forward and backward, downloaded.
pub type Results = (Vec<bf16>, Vec<f32>, Vec<bf16>, Vec<bf16>, Vec<bf16>);

/// One forward and backward of `x` on `stream` with contiguous views, outputs NaN-poisoned first;
/// `workspaces` are the forward's and the backward's.
pub fn forward_backward(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    shape: &AttentionShape,
    x: &Inputs,
    options: &FlashOptions,
    workspaces: &[Workspace; 2],
) -> Results {
    let up = |v: &[bf16]| stream.clone_htod(v).unwrap();
    let (q, k, v, d_o) = (up(&x.q), up(&x.k), up(&x.v), up(&x.d_o));
    let mut o = poisoned(stream, bf16::NAN, shape.o_elems());
    let mut lse = poisoned(stream, f32::NAN, shape.row_elems());
    let r = |t| TensorRef::new(t, stream);
    forward_on(
        gpu,
        stream,
        shape,
        [&r(&q), &r(&k), &r(&v)],
        &mut TensorMut::new(&mut o, stream),
        &mut TensorMut::new(&mut lse, stream),
        &workspaces[0],
        options,
    )
    .unwrap();
    let mut g = [
        poisoned(stream, bf16::NAN, shape.q_elems()),
        poisoned(stream, bf16::NAN, shape.k_elems()),
        poisoned(stream, bf16::NAN, shape.v_elems()),
    ];
    {
        let [g_q, g_k, g_v] = &mut g;
        let (q, k, v, o_r, d_o) = (r(&q), r(&k), r(&v), r(&o), r(&d_o));
        let lse_r = TensorRef::new(&lse, stream);
        backward_on(
            gpu,
            stream,
            shape,
            BackwardViews {
                q: &q,
                k: &k,
                v: &v,
                o: &o_r,
                d_o: &d_o,
                lse: &lse_r,
            },
            GradientViews {
                dq: &mut TensorMut::new(g_q, stream),
                dk: &mut TensorMut::new(g_k, stream),
                dv: &mut TensorMut::new(g_v, stream),
                d_sinks: None,
            },
            &workspaces[1],
            options,
        )
        .unwrap();
    }
    let [g_q, g_k, g_v] = g.map(|t| stream.clone_dtoh(&t).unwrap());
    (
        stream.clone_dtoh(&o).unwrap(),
        stream.clone_dtoh(&lse).unwrap(),
        g_q,
        g_k,
        g_v,
    )
}
