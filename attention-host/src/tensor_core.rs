//! Host side of the tensor-core forward: validation, the choice between the `mma.sync` kernels
//! (`attention_kernels::flash_tc`, any sm_80+ device) and the `wgmma` ones
//! (`attention_kernels::flash_wgmma`, compute capability 9.0), and the launch.

use attention_kernels::flash_tc::{self, TcConfig};
use attention_kernels::flash_wgmma::{self, WgConfig};
use attention_kernels::params::{AttentionShape, TensorCoreForwardParams};

use crate::buffer::{DeviceF32, DeviceTensor};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::flash::layout::DeviceLayout;
use crate::materialized::check_qkv;
use crate::options::{AttentionOptions, Lengths};
use crate::runtime::{Gpu, LaunchConfig};

/// What the forward returns: `O` (`[batch, n_q, heads_q, head_dim]`, the inputs' dtype) and the
/// saved `LSE` (f32 `[batch, heads_q, n_q]`, natural log; `−∞` for rows with no allowed key).
pub struct ForwardOutput {
    pub o: DeviceTensor,
    pub lse: DeviceF32,
}

/// Whether a call needs the general instances of the `wgmma` kernels: length masks or dropout.
pub(crate) fn needs_general(options: &AttentionOptions) -> bool {
    options.dropout.is_some() || options.lengths != Lengths::Full
}

/// What both launchers check of the kernel they were given: the `wgmma` kernels need the sm_90a
/// module, and length masks and dropout (`general`) run on the default `wgmma` tiles only.
pub(crate) fn check_kernel_family(
    gpu: &Gpu,
    kernel: &dyn std::fmt::Debug,
    wgmma: bool,
    default_wgmma: bool,
    general: bool,
) -> Result<()> {
    if wgmma && !gpu.has_wgmma() {
        return Err(invalid!(
            "the wgmma kernels need the sm_90a module on a compute capability 9.0 device"
        ));
    }
    if general && !default_wgmma {
        return Err(invalid!(
            "length masks and dropout run on the default wgmma tiles only, not {kernel:?}"
        ));
    }
    Ok(())
}

/// What both tensor-core passes admit: f16/bf16 storage, head dims 64 and 128, a batch, head and
/// sequence count that fit the grid's y and z, and length masks and dropout only where
/// `general` (the `wgmma` kernels) says they can be run. `pass` names the pass in the refusal.
pub(crate) fn check_tensor_core_call(
    pass: &str,
    shape: &AttentionShape,
    dtype: DType,
    options: &AttentionOptions,
    general: bool,
) -> Result<()> {
    options.validate(shape)?;
    if needs_general(options) && !general {
        return Err(invalid!(
            "the mma.sync tensor-core {pass} supports scale and causal only (no dropout, no \
             length masks); the wgmma one (compute capability 9.0) takes every option"
        ));
    }
    if let Lengths::Packed { cu_seqlens_q, .. } = &options.lengths
        && cu_seqlens_q.len() - 1 > u16::MAX as usize
    {
        return Err(invalid!("at most 65535 packed sequences (grid z)"));
    }
    if dtype == DType::F32 {
        return Err(invalid!(
            "the tensor-core {pass} takes f16 or bf16 inputs, not f32"
        ));
    }
    if !matches!(shape.head_dim, 64 | 128) {
        return Err(invalid!(
            "the tensor-core {pass} supports head_dim 64 and 128, not {}",
            shape.head_dim
        ));
    }
    if shape.heads_q > u16::MAX as u32 || shape.batch > u16::MAX as u32 {
        return Err(invalid!(
            "heads_q and batch must be at most 65535 (grid y and z)"
        ));
    }
    Ok(())
}

/// Checks that the tensor-core forward can run `shape` in `dtype` with `options`, and returns the
/// tile configuration it would use. Needs no device.
pub fn tensor_core_config(
    shape: &AttentionShape,
    dtype: DType,
    options: &AttentionOptions,
) -> Result<TcConfig> {
    check_tensor_core_call("forward", shape, dtype, options, false)?;
    flash_tc::config(shape.head_dim).ok_or_else(|| {
        invalid!(
            "no tensor-core forward compiled for head_dim {}",
            shape.head_dim
        )
    })
}

/// The PTX entry point that runs `cfg` on `dtype`.
pub fn kernel_name(dtype: DType, cfg: &TcConfig) -> String {
    format!(
        "flash_tc_forward_{dtype}_d{}_w{}_k{}",
        cfg.head_dim, cfg.warps, cfg.block_keys
    )
}

/// The PTX entry point (sm_90a module only) that runs `cfg` on `dtype`; `general` names the
/// instance that takes length masks and dropout (compiled for the defaults only).
pub fn wgmma_kernel_name(dtype: DType, cfg: &WgConfig, general: bool) -> String {
    format!(
        "flash_wgmma_forward_{}{dtype}_d{}_g{}_k{}",
        if general { "general_" } else { "" },
        cfg.head_dim,
        cfg.warpgroups,
        cfg.block_keys
    )
}

/// One compiled tensor-core forward: `mma.sync` tiles or `wgmma` tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcKernel {
    MmaSync(TcConfig),
    Wgmma(WgConfig),
}

impl From<TcConfig> for TcKernel {
    fn from(c: TcConfig) -> Self {
        TcKernel::MmaSync(c)
    }
}

impl From<WgConfig> for TcKernel {
    fn from(c: WgConfig) -> Self {
        TcKernel::Wgmma(c)
    }
}

impl TcKernel {
    pub fn name(&self, dtype: DType) -> String {
        self.entry(dtype, false)
    }
    /// The entry point a launch uses: the general instance when the call has length masks or
    /// dropout (only `wgmma` kernels have one; the launcher refuses them for `mma.sync`).
    fn entry(&self, dtype: DType, general: bool) -> String {
        match self {
            TcKernel::MmaSync(c) => kernel_name(dtype, c),
            TcKernel::Wgmma(c) => wgmma_kernel_name(dtype, c, general),
        }
    }
    pub fn head_dim(&self) -> u32 {
        match self {
            TcKernel::MmaSync(c) => c.head_dim,
            TcKernel::Wgmma(c) => c.head_dim,
        }
    }
    /// Query rows per thread block.
    pub fn block_rows(&self) -> u32 {
        match self {
            TcKernel::MmaSync(c) => c.block_rows(),
            TcKernel::Wgmma(c) => c.block_rows(),
        }
    }
    /// Keys per K/V block.
    pub fn block_keys(&self) -> u32 {
        match self {
            TcKernel::MmaSync(c) => c.block_keys,
            TcKernel::Wgmma(c) => c.block_keys,
        }
    }
    pub fn threads(&self) -> u32 {
        match self {
            TcKernel::MmaSync(c) => c.threads(),
            TcKernel::Wgmma(c) => c.threads(),
        }
    }
    pub fn shared_bytes(&self) -> u32 {
        match self {
            TcKernel::MmaSync(c) => c.shared_bytes(),
            TcKernel::Wgmma(c) => c.shared_bytes(),
        }
    }
    /// Whether this build compiled the configuration.
    pub fn is_compiled(&self) -> bool {
        match self {
            TcKernel::MmaSync(c) => flash_tc::VARIANTS.contains(c),
            TcKernel::Wgmma(c) => flash_wgmma::VARIANTS.contains(c),
        }
    }
}

/// The forward kernel [`tensor_core_forward`] runs on `gpu`: the `wgmma` default where the loaded
/// module has it (an H100/H200), else the `mma.sync` default.
pub fn tensor_core_kernel(
    gpu: &Gpu,
    shape: &AttentionShape,
    dtype: DType,
    options: &AttentionOptions,
) -> Result<TcKernel> {
    if gpu.has_wgmma()
        && let Some(cfg) = flash_wgmma::config(shape.head_dim)
    {
        check_tensor_core_call("forward", shape, dtype, options, true)?;
        return Ok(TcKernel::Wgmma(cfg));
    }
    Ok(TcKernel::MmaSync(tensor_core_config(
        shape, dtype, options,
    )?))
}

/// Runs the forward into fresh outputs (poisoned first, so an unwritten element shows as NaN) and
/// waits for it.
pub fn tensor_core_forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    options: &AttentionOptions,
) -> Result<ForwardOutput> {
    check_qkv(shape, q, k, v)?;
    let out = ForwardOutput {
        o: DeviceTensor::poisoned(q.dtype(), shape.q_elems())?,
        lse: DeviceF32::poisoned(shape.row_elems())?,
    };
    tensor_core_forward_into(gpu, shape, q, k, v, &out, options)?;
    gpu.synchronize()?;
    Ok(out)
}

/// Launches the forward into existing outputs without waiting (for timing loops).
pub fn tensor_core_forward_into(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    out: &ForwardOutput,
    options: &AttentionOptions,
) -> Result<()> {
    let kernel = tensor_core_kernel(gpu, shape, q.dtype(), options)?;
    tensor_core_forward_variant_into(gpu, kernel, shape, q, k, v, out, options)
}

/// As [`tensor_core_forward_into`] with one of `flash_tc::VARIANTS` or `flash_wgmma::VARIANTS`
/// instead of the default tiles (for comparing configurations).
#[allow(clippy::too_many_arguments)]
pub fn tensor_core_forward_variant_into(
    gpu: &Gpu,
    kernel: impl Into<TcKernel>,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    out: &ForwardOutput,
    options: &AttentionOptions,
) -> Result<()> {
    check_qkv(shape, q, k, v)?;
    let dtype = q.dtype();
    let kernel = kernel.into();
    let wgmma = matches!(kernel, TcKernel::Wgmma(_));
    check_tensor_core_call("forward", shape, dtype, options, wgmma)?;
    let general = needs_general(options);
    if kernel.head_dim() != shape.head_dim || !kernel.is_compiled() {
        return Err(invalid!(
            "no compiled tensor-core kernel {kernel:?} for head_dim {}",
            shape.head_dim
        ));
    }
    let default_wgmma =
        matches!(kernel, TcKernel::Wgmma(c) if Some(c) == flash_wgmma::config(shape.head_dim));
    check_kernel_family(gpu, &kernel, wgmma, default_wgmma, general)?;
    if out.o.dtype() != dtype || out.o.len() != shape.q_elems() {
        return Err(invalid!(
            "o must be {dtype} with {} elements",
            shape.q_elems()
        ));
    }
    if out.lse.len() != shape.row_elems() {
        return Err(invalid!(
            "lse must hold {} elements, it holds {}",
            shape.row_elems(),
            out.lse.len()
        ));
    }
    let layout = DeviceLayout::upload(shape, &options.lengths)?;
    let params = TensorCoreForwardParams {
        q: q.device_ptr(),
        k: k.device_ptr(),
        v: v.device_ptr(),
        o: out.o.device_ptr(),
        lse: out.lse.device_ptr(),
        layout: layout.params,
        dropout: options.dropout_rng(),
        shape: *shape,
        scale_log2: options.scale_for(shape.head_dim) * std::f32::consts::LOG2_E,
        causal: options.causal as u32,
    };
    let launch = LaunchConfig {
        grid: (
            layout.max_q_len.div_ceil(kernel.block_rows()),
            shape.heads_q,
            layout.params.sequences,
        ),
        block: (kernel.threads(), 1, 1),
        shared_bytes: kernel.shared_bytes(),
    };
    gpu.launch(&kernel.entry(dtype, general), launch, &params)
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
                let cfg =
                    tensor_core_config(&shape(d), dtype, &AttentionOptions::new().causal(true))
                        .unwrap();
                assert_eq!(cfg.head_dim, d);
                assert!(cfg.shared_bytes() <= 227 * 1024);
            }
        }
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let refused = |s: AttentionShape, dtype, o: AttentionOptions| {
            matches!(
                tensor_core_config(&s, dtype, &o),
                Err(crate::AttentionError::InvalidInput(_))
            )
        };
        let plain = AttentionOptions::new();
        assert!(refused(shape(128), DType::F32, plain.clone()));
        for d in [32, 80, 96, 256] {
            assert!(
                refused(shape(d), DType::Bf16, plain.clone()),
                "head_dim {d}"
            );
        }
        assert!(refused(
            shape(64),
            DType::F16,
            plain.clone().dropout(0.1, 1, 0)
        ));
        assert!(refused(
            shape(64),
            DType::F16,
            plain.clone().key_lengths(vec![10, 20])
        ));
        assert!(refused(
            AttentionShape {
                heads_kv: 3,
                ..shape(64)
            },
            DType::F16,
            plain
        ));
    }
}
