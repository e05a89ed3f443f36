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
    Schedule,
};

// The entry points, each with an example (the ones that need a GPU are compiled, not run).

/// # Example
///
/// Runs everywhere: on a GPU the plan of this call on it, elsewhere the plan it would have on an
/// H100/H200 ([`plan::select`](attention_host::plan::select) with the capabilities of an
/// architecture).
///
/// ```
/// use flash_attn::{AttentionError, AttentionOptions, AttentionShape, DType, DeviceCaps};
/// use flash_attn::{Direction, FlashOptions, Problem};
///
/// // batch, n_q, n_k, heads_q, heads_kv, head_dim (of Q, K and, unless `with_head_dim_v`, V)
/// let shape = AttentionShape::new(2, 1024, 1024, 16, 4, 128);
/// let options = FlashOptions::new(AttentionOptions::new().causal(true));
/// let plan = match flash_attn::gpu() {
///     Ok(gpu) => flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward)?,
///     Err(AttentionError::NoDevice(_)) => {
///         let problem = Problem::new(&shape, DType::Bf16, &options)?;
///         let h100 = DeviceCaps::for_arch("sm_90", flash_attn::PTX_SM90A.is_some())?;
///         flash_attn::plan::select(&h100, &problem, Direction::Forward)?
///     }
///     Err(e) => return Err(e),
/// };
/// println!("{plan}");
/// # Ok::<(), AttentionError>(())
/// ```
pub use attention_host::attention::plan;

/// # Example
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceTensor, FlashOptions};
///
/// let gpu = flash_attn::gpu()?;
/// // Q and K rows of 192 elements, V and O rows of 128 (DeepSeek's MLA).
/// let shape = AttentionShape::new(1, 512, 512, 8, 8, 192).with_head_dim_v(128);
/// let (q, k, v) = (vec![0.5; shape.q_elems()], vec![0.25; shape.k_elems()], vec![1.0; shape.v_elems()]);
/// let upload = |x: &[f32]| DeviceTensor::from_f32(DType::Bf16, x);
/// let options = FlashOptions::new(AttentionOptions::new().causal(true));
/// let out = flash_attn::forward(&gpu, &shape, &upload(&q)?, &upload(&k)?, &upload(&v)?, &options)?;
/// let o: Vec<f32> = out.o.to_f32()?; // [batch, n_q, heads_q, head_dim_v]
/// let lse: Vec<f32> = out.lse.to_vec()?; // [batch, heads_q, n_q], kept for the backward
/// println!("{} ran; O[0] = {}, LSE[0] = {}", out.plan.entry, o[0], lse[0]);
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
pub use attention_host::attention::forward;

/// # Example
///
/// Buffers allocated once and reused across calls; nothing waits until `synchronize`.
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, FlashOptions};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(4, 2048, 2048, 16, 16, 128);
/// let upload = |n: usize| DeviceTensor::from_f32(DType::F16, &vec![0.1; n]);
/// let (q, k, v) = (upload(shape.q_elems())?, upload(shape.k_elems())?, upload(shape.v_elems())?);
/// let o = DeviceTensor::poisoned(DType::F16, shape.o_elems())?;
/// let lse = DeviceF32::poisoned(shape.row_elems())?;
/// let options = FlashOptions::new(AttentionOptions::new());
/// for _ in 0..10 {
///     flash_attn::forward_into(&gpu, &shape, &q, &k, &v, &o, &lse, &options)?;
/// }
/// gpu.synchronize()?;
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
pub use attention_host::attention::forward_into;

/// # Example
///
/// One of the compiled tensor-core instances, here the tiles the default plan picked (the others
/// are compiled with the `tuning` feature).
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, Direction, FlashOptions};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(1, 4096, 4096, 32, 32, 128);
/// let options = FlashOptions::new(AttentionOptions::new());
/// let tiles = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Forward)?.tiles;
/// let upload = |n: usize| DeviceTensor::from_f32(DType::Bf16, &vec![0.1; n]);
/// let (q, k, v) = (upload(shape.q_elems())?, upload(shape.k_elems())?, upload(shape.v_elems())?);
/// let o = DeviceTensor::poisoned(DType::Bf16, shape.o_elems())?;
/// let lse = DeviceF32::poisoned(shape.row_elems())?;
/// flash_attn::forward_variant_into(&gpu, &shape, tiles, &q, &k, &v, &o, &lse, &options)?;
/// gpu.synchronize()?;
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
pub use attention_host::attention::forward_variant_into;

/// # Example
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceTensor, FlashOptions};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(1, 512, 512, 8, 2, 64);
/// let upload = |n: usize| DeviceTensor::from_f32(DType::Bf16, &vec![0.1; n]);
/// let (q, k, v) = (upload(shape.q_elems())?, upload(shape.k_elems())?, upload(shape.v_elems())?);
/// let options = FlashOptions::new(AttentionOptions::new().causal(true));
/// let out = flash_attn::forward(&gpu, &shape, &q, &k, &v, &options)?;
/// let d_o = upload(shape.o_elems())?;
/// let inputs = BackwardInputs { q: &q, k: &k, v: &v, o: &out.o, d_o: &d_o, lse: &out.lse };
/// let grads = flash_attn::backward(&gpu, &shape, &inputs, &options)?;
/// let (dq, dk, dv) = (grads.dq.to_f32()?, grads.dk.to_f32()?, grads.dv.to_f32()?);
/// # let _ = (dq, dk, dv);
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
pub use attention_host::attention::backward;

/// # Example
///
/// Gradient buffers and the workspace (sized by the plan) allocated once; nothing waits until
/// `synchronize`.
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceTensor};
/// use flash_attn::{Direction, FlashOptions, GradientBuffers, Workspace};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(2, 1024, 1024, 16, 16, 128);
/// let upload = |n: usize| DeviceTensor::from_f32(DType::Bf16, &vec![0.1; n]);
/// let (q, k, v) = (upload(shape.q_elems())?, upload(shape.k_elems())?, upload(shape.v_elems())?);
/// let options = FlashOptions::new(AttentionOptions::new());
/// let out = flash_attn::forward(&gpu, &shape, &q, &k, &v, &options)?;
/// let d_o = upload(shape.o_elems())?;
/// let inputs = BackwardInputs { q: &q, k: &k, v: &v, o: &out.o, d_o: &d_o, lse: &out.lse };
/// let plan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Backward)?;
/// let workspace = Workspace::new(&plan)?;
/// let grads = GradientBuffers::poisoned(&shape, DType::Bf16)?;
/// flash_attn::backward_into(&gpu, &shape, &inputs, &grads, &workspace, &options)?;
/// gpu.synchronize()?;
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
pub use attention_host::attention::backward_into;

/// # Example
///
/// As [`backward_into`], on the tiles the default plan picked (others with the `tuning` feature).
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceTensor};
/// use flash_attn::{Direction, FlashOptions, GradientBuffers, Workspace};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(1, 4096, 4096, 32, 32, 128);
/// let upload = |n: usize| DeviceTensor::from_f32(DType::Bf16, &vec![0.1; n]);
/// let (q, k, v) = (upload(shape.q_elems())?, upload(shape.k_elems())?, upload(shape.v_elems())?);
/// let options = FlashOptions::new(AttentionOptions::new());
/// let out = flash_attn::forward(&gpu, &shape, &q, &k, &v, &options)?;
/// let d_o = upload(shape.o_elems())?;
/// let inputs = BackwardInputs { q: &q, k: &k, v: &v, o: &out.o, d_o: &d_o, lse: &out.lse };
/// let plan = flash_attn::plan(&gpu, &shape, DType::Bf16, &options, Direction::Backward)?;
/// let (workspace, grads) = (Workspace::new(&plan)?, GradientBuffers::poisoned(&shape, DType::Bf16)?);
/// flash_attn::backward_variant_into(&gpu, &shape, plan.tiles, &inputs, &grads, &workspace, &options)?;
/// gpu.synchronize()?;
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
pub use attention_host::attention::backward_variant_into;

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
///
/// # Example
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, DType, FlashOptions};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(1, 100, 300, 4, 4, 32);
/// let (q, k, v) = (vec![0.5; shape.q_elems()], vec![0.25; shape.k_elems()], vec![1.0; shape.v_elems()]);
/// let options = FlashOptions::new(AttentionOptions::new().dropout(0.1, 42, 0));
/// let out = flash_attn::forward_host(&gpu, DType::F32, &shape, &q, &k, &v, &options)?;
/// assert_eq!(out.o.len(), shape.o_elems());
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
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
///
/// # Example
///
/// ```no_run
/// use flash_attn::{AttentionOptions, AttentionShape, DType, FlashOptions};
///
/// let gpu = flash_attn::gpu()?;
/// let shape = AttentionShape::new(1, 128, 128, 4, 1, 64);
/// let (q, k, v) = (vec![0.5; shape.q_elems()], vec![0.25; shape.k_elems()], vec![1.0; shape.v_elems()]);
/// let d_o = vec![1.0; shape.o_elems()];
/// let options = FlashOptions::new(AttentionOptions::new().causal(true));
/// let fwd = flash_attn::forward_host(&gpu, DType::Bf16, &shape, &q, &k, &v, &options)?;
/// let g = flash_attn::backward_host(&gpu, DType::Bf16, &shape, &q, &k, &v, &fwd.o, &fwd.lse, &d_o, &options)?;
/// assert_eq!(g.dk.len(), shape.k_elems());
/// # Ok::<(), flash_attn::AttentionError>(())
/// ```
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
