//! What the candle op checks before any device work, on CPU tensors (feature `candle`, with or
//! without `candle-cuda`): the shapes it is given, and that it runs on CUDA devices only.

use candle_core::{DType, Device, Tensor};
use flash_attn::FlashOptions;
use flash_attn::candle::flash_attn;

fn zeros(dims: (usize, usize, usize, usize)) -> Tensor {
    Tensor::zeros(dims, DType::BF16, &Device::Cpu).unwrap()
}

fn refused(q: &Tensor, k: &Tensor, v: &Tensor, want: &str) {
    let err = flash_attn(q, k, v, &FlashOptions::default()).expect_err("refused");
    assert!(err.to_string().contains(want), "{err}");
}

#[test]
fn shapes_are_checked() {
    let q = zeros((2, 16, 4, 64));
    let kv = zeros((2, 32, 2, 64));
    refused(&q.flatten_from(2).unwrap(), &kv, &kv, "must be 4-D");
    refused(
        &q,
        &kv,
        &zeros((2, 16, 2, 64)),
        "differ in batch, keys or heads",
    );
    // V of its own head dim is a shape the op takes: only the CPU device is refused.
    refused(&q, &kv, &zeros((2, 32, 2, 32)), "runs on CUDA devices");
    refused(
        &q,
        &zeros((1, 32, 2, 64)),
        &zeros((1, 32, 2, 64)),
        "batch or head_dim",
    );
}

#[test]
fn cpu_tensors_are_refused() {
    let q = zeros((1, 16, 2, 64));
    refused(&q, &q, &q, "runs on CUDA devices");
}
