//! The public attention API: forward (O, LSE) and recompute backward (dQ, dK, dV), on device
//! tensors or on host slices, each through one entry point that chooses the kernel
//! ([`attention_host::plan::select`]).
//!
//! Options are one value, [`FlashOptions`]: the semantics ([`AttentionOptions`]: scale, causal,
//! key lengths / packed sequences, dropout), the kernel family ([`KernelChoice`], `Auto` by
//! default), the exact forward's [`Schedule`], optional explicit [`BlockSizes`] of the exact
//! kernels and the deterministic-gradient switch. Inputs that cannot run are refused with
//! `AttentionError::InvalidInput` before anything is allocated or launched.

pub use attention_host::families::exact::{KernelFamily, choose_block_sizes, paper_block_sizes};
pub use attention_host::{
    AttentionOptions, AttentionShape, BackwardInputs, BlockSizes, DType, DeviceF32, DeviceTensor,
    Direction, Family, FlashOptions, ForwardOutput, Gpu, Gradients, KernelChoice, Lengths, Plan,
    Schedule, backward, forward, plan,
};

use attention_host::Result;

/// O and LSE downloaded: O widened to f32 from the compute dtype, LSE `[batch, heads_q, n_q]`.
#[derive(Clone, Debug)]
pub struct HostForward {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub plan: Plan,
}

/// dQ, dK, dV downloaded and widened to f32; the sink gradients (`[heads_q]`) with sink logits.
#[derive(Clone, Debug)]
pub struct HostGradients {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub d_sinks: Option<Vec<f32>>,
    pub plan: Plan,
}

/// Forward on host slices (`[batch, seq, heads, head_dim]`), computed in `dtype` (inputs rounded to
/// it on upload).
pub fn forward_host(
    gpu: &Gpu,
    dtype: DType,
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    options: &FlashOptions,
) -> Result<HostForward> {
    let (q, k, v) = (
        DeviceTensor::from_f32(dtype, q)?,
        DeviceTensor::from_f32(dtype, k)?,
        DeviceTensor::from_f32(dtype, v)?,
    );
    let out = forward(gpu, shape, &q, &k, &v, options)?;
    Ok(HostForward {
        o: out.o.to_f32()?,
        lse: out.lse.to_vec()?,
        plan: out.plan,
    })
}

/// Backward on host slices; `o` and `lse` are the forward's outputs for the same inputs and options.
#[allow(clippy::too_many_arguments)]
pub fn backward_host(
    gpu: &Gpu,
    dtype: DType,
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    o: &[f32],
    lse: &[f32],
    d_o: &[f32],
    options: &FlashOptions,
) -> Result<HostGradients> {
    let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x);
    let (q, k, v, o, d_o) = (up(q)?, up(k)?, up(v)?, up(o)?, up(d_o)?);
    let lse = DeviceF32::from_slice(lse)?;
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &o,
        d_o: &d_o,
        lse: &lse,
    };
    let g = backward(gpu, shape, &inputs, options)?;
    Ok(HostGradients {
        dq: g.dq.to_f32()?,
        dk: g.dk.to_f32()?,
        dv: g.dv.to_f32()?,
        d_sinks: g.d_sinks.map(|d| d.to_vec()).transpose()?,
        plan: g.plan,
    })
}
