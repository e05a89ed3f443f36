//! Host side of the tensor-core backward (`attention_kernels::flash_tc_backward`): validation,
//! workspace and the three launches. The main kernel is `mma.sync` (any sm_80+ device) or `wgmma`
//! (`attention_kernels::flash_wgmma`, compute capability 9.0); preprocess and dQ conversion are
//! shared.

use attention_kernels::flash_tc_backward::{
    self, CONVERT_THREADS, PREPROCESS_WARPS, TcBackwardConfig,
};
use attention_kernels::flash_wgmma::{self, WgBackwardConfig};
use attention_kernels::params::{AttentionShape, TensorCoreBackwardParams};

use crate::buffer::{DeviceF32, DeviceTensor};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::flash::layout::DeviceLayout;
use crate::materialized::check_qkv;
use crate::options::{AttentionOptions, checked_elems, validate_shape};
use crate::runtime::{Gpu, LaunchConfig};
use crate::tensor_core::{check_kernel_family, check_tensor_core_call, needs_general};

/// dQ (Q's layout), dK and dV (K/V's layout, summed over each KV head's query heads), in the
/// inputs' dtype.
pub struct BackwardOutput {
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
}

impl BackwardOutput {
    /// NaN-poisoned outputs for `shape`, so an element the kernels fail to write shows.
    pub fn poisoned(shape: &AttentionShape, dtype: DType) -> Result<BackwardOutput> {
        validate_shape(shape)?;
        Ok(BackwardOutput {
            dq: DeviceTensor::poisoned(dtype, shape.q_elems())?,
            dk: DeviceTensor::poisoned(dtype, shape.kv_elems())?,
            dv: DeviceTensor::poisoned(dtype, shape.kv_elems())?,
        })
    }
}

/// f32 scratch of one backward: the dQ accumulator (Q's layout) and the rows' `LSE · log2 e` and
/// `D = rowsum(dO ∘ O)`, `[batch, heads_q, n_q_pad]`.
pub struct BackwardWorkspace {
    shape: AttentionShape,
    n_q_pad: u32,
    dq_accum: DeviceF32,
    lse_log2: DeviceF32,
    d_sum: DeviceF32,
}

impl BackwardWorkspace {
    /// Allocates the workspace for `shape` (its contents are written by every call before use).
    pub fn new(shape: &AttentionShape) -> Result<BackwardWorkspace> {
        validate_shape(shape)?;
        let cfg = flash_tc_backward::config(shape.head_dim).ok_or_else(|| {
            invalid!(
                "no tensor-core backward compiled for head_dim {}",
                shape.head_dim
            )
        })?;
        let n_q_pad = cfg.n_q_pad(shape.n_q);
        // The kernels count padded rows in `u32`.
        let rows = checked_elems("padded LSE", &[shape.batch, shape.heads_q, n_q_pad])?;
        if rows > i32::MAX as usize {
            return Err(invalid!(
                "{rows} padded rows are more than the kernels index"
            ));
        }
        Ok(BackwardWorkspace {
            shape: *shape,
            n_q_pad,
            dq_accum: DeviceF32::poisoned(shape.q_elems())?,
            lse_log2: DeviceF32::poisoned(rows)?,
            d_sum: DeviceF32::poisoned(rows)?,
        })
    }

    /// Bytes of device memory the workspace holds.
    pub fn size_bytes(&self) -> usize {
        4 * (self.dq_accum.len() + self.lse_log2.len() + self.d_sum.len())
    }
}

/// Checks that the tensor-core backward can run `shape` in `dtype` with `options` (the rules of
/// the forward, `check_tensor_core_call`), and returns the tile configuration of its main kernel.
/// Needs no device.
pub fn tensor_core_backward_config(
    shape: &AttentionShape,
    dtype: DType,
    options: &AttentionOptions,
) -> Result<TcBackwardConfig> {
    check_tensor_core_call("backward", shape, dtype, options, false)?;
    flash_tc_backward::config(shape.head_dim).ok_or_else(|| {
        invalid!(
            "no tensor-core backward compiled for head_dim {}",
            shape.head_dim
        )
    })
}

/// The main kernel's PTX entry point for `cfg` on `dtype`.
pub fn backward_kernel_name(dtype: DType, cfg: &TcBackwardConfig) -> String {
    format!("flash_tc_backward_{dtype}_d{}_w{}", cfg.head_dim, cfg.warps)
}

/// The `wgmma` main kernel's PTX entry point (sm_90a module only) for `cfg` on `dtype`; `general`
/// names the instance that takes length masks and dropout.
pub fn wgmma_backward_kernel_name(dtype: DType, cfg: &WgBackwardConfig, general: bool) -> String {
    format!(
        "flash_wgmma_backward_{}{dtype}_d{}_g{}",
        if general { "general_" } else { "" },
        cfg.head_dim,
        cfg.warpgroups
    )
}

/// One compiled main kernel of the backward: `mma.sync` tiles or `wgmma` tiles. Both use Q blocks
/// of 64 rows, so they share the workspace layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcBackwardKernel {
    MmaSync(TcBackwardConfig),
    Wgmma(WgBackwardConfig),
}

impl From<TcBackwardConfig> for TcBackwardKernel {
    fn from(c: TcBackwardConfig) -> Self {
        TcBackwardKernel::MmaSync(c)
    }
}

impl From<WgBackwardConfig> for TcBackwardKernel {
    fn from(c: WgBackwardConfig) -> Self {
        TcBackwardKernel::Wgmma(c)
    }
}

impl TcBackwardKernel {
    pub fn name(&self, dtype: DType) -> String {
        self.entry(dtype, false)
    }
    /// The entry point a launch uses: the general instance when the call has length masks or
    /// dropout (only `wgmma` kernels have one; the launcher refuses them for `mma.sync`).
    fn entry(&self, dtype: DType, general: bool) -> String {
        match self {
            TcBackwardKernel::MmaSync(c) => backward_kernel_name(dtype, c),
            TcBackwardKernel::Wgmma(c) => wgmma_backward_kernel_name(dtype, c, general),
        }
    }
    /// The block shape, as the `mma.sync` configuration with the same keys and rows per block.
    pub fn tiles(&self) -> TcBackwardConfig {
        match self {
            TcBackwardKernel::MmaSync(c) => *c,
            TcBackwardKernel::Wgmma(c) => c.tiles(),
        }
    }
    pub fn threads(&self) -> u32 {
        match self {
            TcBackwardKernel::MmaSync(c) => c.threads(),
            TcBackwardKernel::Wgmma(c) => c.threads(),
        }
    }
    pub fn shared_bytes(&self) -> u32 {
        match self {
            TcBackwardKernel::MmaSync(c) => c.shared_bytes(),
            TcBackwardKernel::Wgmma(c) => c.shared_bytes(),
        }
    }
    /// Whether this build compiled the configuration.
    pub fn is_compiled(&self) -> bool {
        match self {
            TcBackwardKernel::MmaSync(c) => flash_tc_backward::VARIANTS.contains(c),
            TcBackwardKernel::Wgmma(c) => flash_wgmma::BACKWARD_VARIANTS.contains(c),
        }
    }
}

/// The main kernel [`tensor_core_backward`] runs on `gpu`: the `wgmma` default where the loaded
/// module has it (an H100/H200), else the `mma.sync` default.
pub fn tensor_core_backward_kernel(
    gpu: &Gpu,
    shape: &AttentionShape,
    dtype: DType,
    options: &AttentionOptions,
) -> Result<TcBackwardKernel> {
    if gpu.has_wgmma()
        && let Some(cfg) = flash_wgmma::backward_config(shape.head_dim)
    {
        check_tensor_core_call("backward", shape, dtype, options, true)?;
        return Ok(TcBackwardKernel::Wgmma(cfg));
    }
    Ok(TcBackwardKernel::MmaSync(tensor_core_backward_config(
        shape, dtype, options,
    )?))
}

/// The saved forward state and the incoming gradient: `o` and `d_o` in the dtype of `q`, `lse`
/// f32 `[batch, heads_q, n_q]` in natural log (`−∞` for rows with no allowed key).
pub struct BackwardInputs<'a> {
    pub q: &'a DeviceTensor,
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    pub o: &'a DeviceTensor,
    pub d_o: &'a DeviceTensor,
    pub lse: &'a DeviceF32,
}

/// Runs the backward into fresh, NaN-poisoned outputs with a fresh workspace and waits for it.
pub fn tensor_core_backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    options: &AttentionOptions,
) -> Result<BackwardOutput> {
    tensor_core_backward_kernel(gpu, shape, inputs.q.dtype(), options)?;
    let out = BackwardOutput::poisoned(shape, inputs.q.dtype())?;
    let workspace = BackwardWorkspace::new(shape)?;
    tensor_core_backward_into(gpu, shape, inputs, &out, &workspace, options)?;
    gpu.synchronize()?;
    Ok(out)
}

/// Launches the three kernels into existing outputs and workspace without waiting (for timing
/// loops). Every buffer is checked against `shape` before the first launch.
pub fn tensor_core_backward_into(
    gpu: &Gpu,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    out: &BackwardOutput,
    workspace: &BackwardWorkspace,
    options: &AttentionOptions,
) -> Result<()> {
    let kernel = tensor_core_backward_kernel(gpu, shape, inputs.q.dtype(), options)?;
    tensor_core_backward_variant_into(gpu, kernel, shape, inputs, out, workspace, options)
}

/// As [`tensor_core_backward_into`] with one of `flash_tc_backward::VARIANTS` or
/// `flash_wgmma::BACKWARD_VARIANTS` instead of the default tiles (for comparing configurations).
pub fn tensor_core_backward_variant_into(
    gpu: &Gpu,
    kernel: impl Into<TcBackwardKernel>,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    out: &BackwardOutput,
    workspace: &BackwardWorkspace,
    options: &AttentionOptions,
) -> Result<()> {
    let dtype = inputs.q.dtype();
    check_qkv(shape, inputs.q, inputs.k, inputs.v)?;
    let kernel = kernel.into();
    let wgmma = matches!(kernel, TcBackwardKernel::Wgmma(_));
    check_tensor_core_call("backward", shape, dtype, options, wgmma)?;
    let general = needs_general(options);
    let cfg = kernel.tiles();
    if cfg.head_dim != shape.head_dim || !kernel.is_compiled() {
        return Err(invalid!(
            "no compiled tensor-core backward {kernel:?} for head_dim {}",
            shape.head_dim
        ));
    }
    let default_wgmma = matches!(kernel, TcBackwardKernel::Wgmma(c)
        if Some(c) == flash_wgmma::backward_config(shape.head_dim));
    check_kernel_family(gpu, &kernel, wgmma, default_wgmma, general)?;
    if workspace.n_q_pad != cfg.n_q_pad(shape.n_q) {
        return Err(invalid!(
            "the workspace pads rows to {}, the kernel's Q blocks need {}",
            workspace.n_q_pad,
            cfg.n_q_pad(shape.n_q)
        ));
    }
    for (name, t, want) in [
        ("o", inputs.o, shape.q_elems()),
        ("d_o", inputs.d_o, shape.q_elems()),
        ("dq", &out.dq, shape.q_elems()),
        ("dk", &out.dk, shape.kv_elems()),
        ("dv", &out.dv, shape.kv_elems()),
    ] {
        if t.dtype() != dtype || t.len() != want {
            return Err(invalid!(
                "{name} must be {dtype} with {want} elements, it is {} with {}",
                t.dtype(),
                t.len()
            ));
        }
    }
    if inputs.lse.len() != shape.row_elems() {
        return Err(invalid!(
            "lse must hold {} elements, it holds {}",
            shape.row_elems(),
            inputs.lse.len()
        ));
    }
    if workspace.shape != *shape {
        return Err(invalid!(
            "the workspace was made for {:?}, not {shape:?}",
            workspace.shape
        ));
    }
    let scale = options.scale_for(shape.head_dim);
    let layout = DeviceLayout::upload(shape, &options.lengths)?;
    let params = TensorCoreBackwardParams {
        q: inputs.q.device_ptr(),
        k: inputs.k.device_ptr(),
        v: inputs.v.device_ptr(),
        o: inputs.o.device_ptr(),
        d_o: inputs.d_o.device_ptr(),
        lse: inputs.lse.device_ptr(),
        dq: out.dq.device_ptr(),
        dk: out.dk.device_ptr(),
        dv: out.dv.device_ptr(),
        dq_accum: workspace.dq_accum.device_ptr(),
        lse_log2: workspace.lse_log2.device_ptr(),
        d_sum: workspace.d_sum.device_ptr(),
        layout: layout.params,
        dropout: options.dropout_rng(),
        shape: *shape,
        n_q_pad: workspace.n_q_pad,
        scale,
        scale_log2: scale * std::f32::consts::LOG2_E,
        causal: options.causal as u32,
    };
    let rows = workspace.lse_log2.len() as u32;
    gpu.launch(
        &format!("flash_tc_backward_preprocess_{dtype}_d{}", shape.head_dim),
        LaunchConfig {
            grid: (rows.div_ceil(PREPROCESS_WARPS), 1, 1),
            block: (32 * PREPROCESS_WARPS, 1, 1),
            shared_bytes: 0,
        },
        &params,
    )?;
    gpu.launch(
        &kernel.entry(dtype, general),
        LaunchConfig {
            grid: (
                layout.max_k_rows.div_ceil(cfg.block_keys()),
                shape.heads_kv,
                layout.params.sequences,
            ),
            block: (kernel.threads(), 1, 1),
            shared_bytes: kernel.shared_bytes(),
        },
        &params,
    )?;
    gpu.launch(
        &format!("flash_tc_backward_convert_dq_{dtype}"),
        LaunchConfig {
            grid: (
                (shape.q_elems() / 8).div_ceil(CONVERT_THREADS as usize) as u32,
                1,
                1,
            ),
            block: (CONVERT_THREADS, 1, 1),
            shared_bytes: 0,
        },
        &params,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(head_dim: u32) -> AttentionShape {
        AttentionShape {
            batch: 2,
            n_q: 100,
            n_k: 70,
            heads_q: 4,
            heads_kv: 2,
            head_dim,
        }
    }

    #[test]
    fn accepts_half_types_at_head_dims_64_and_128() {
        for dtype in [DType::F16, DType::Bf16] {
            for d in [64, 128] {
                let cfg = tensor_core_backward_config(
                    &shape(d),
                    dtype,
                    &AttentionOptions::new().causal(true),
                )
                .unwrap();
                assert_eq!(cfg.head_dim, d);
                // Two blocks per SM (228 KiB, 1 KiB reserved per block) is the defaults' plan.
                assert!(2 * (cfg.shared_bytes() + 1024) <= 228 * 1024, "{cfg:?}");
            }
        }
        for cfg in flash_tc_backward::VARIANTS {
            assert!(cfg.shared_bytes() <= 227 * 1024, "{cfg:?}");
        }
    }

    #[test]
    fn refuses_what_the_forward_refuses() {
        // The rules are the forward's (`check_tensor_core_call`, tested there); one of each kind.
        let plain = AttentionOptions::new();
        for (s, dtype, o) in [
            (shape(128), DType::F32, plain.clone()),
            (shape(96), DType::Bf16, plain.clone()),
            (shape(64), DType::F16, plain.clone().dropout(0.1, 1, 0)),
        ] {
            let err = tensor_core_backward_config(&s, dtype, &o).unwrap_err();
            assert!(err.to_string().contains("tensor-core backward"), "{err}");
        }
    }
}
