//! Launches the tiled forward in the schedule the options ask for.

use attention_kernels::flash::params::{BlockSizes, FlashForwardParams};
use attention_kernels::params::AttentionShape;

use super::THREADS;
use super::blocks::{KernelFamily, choose_block_sizes};
use super::layout::DeviceLayout;
use super::options::{FlashOptions, Schedule};
use crate::buffer::{DeviceF32, DeviceTensor};
use crate::error::{Result, invalid};
use crate::materialized::check_qkv;
use crate::runtime::{Gpu, LaunchConfig};

/// O (`[batch, n_q, heads_q, head_dim]`, the inputs' dtype) and LSE (f32, `[batch, heads_q, n_q]`).
pub struct ForwardOutput {
    pub o: DeviceTensor,
    pub lse: DeviceF32,
    /// The `(B_r, B_c)` the kernels ran with.
    pub block_sizes: BlockSizes,
}

/// Largest head dimension the kernels are built and tested for.
pub const MAX_HEAD_DIM: u32 = 256;
/// Grid y (heads) and z (sequences) extents are limited to 65535 by the hardware.
const MAX_GRID_YZ: u32 = 65_535;

/// Checks everything both directions share: tensors against the shape, options, head dim, grid
/// extents. Returns the sizes the kernels of `family` will use.
pub(crate) fn check_call(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    options: &FlashOptions,
    family: KernelFamily,
) -> Result<BlockSizes> {
    check_qkv(shape, q, k, v)?;
    options.attention.validate(shape)?;
    if shape.head_dim > MAX_HEAD_DIM {
        return Err(invalid!(
            "head_dim {} exceeds the supported {MAX_HEAD_DIM}",
            shape.head_dim
        ));
    }
    let sequences = match &options.attention.lengths {
        crate::options::Lengths::Packed { cu_seqlens_q, .. } => cu_seqlens_q.len() as u32 - 1,
        _ => shape.batch,
    };
    if shape.heads_q > MAX_GRID_YZ || sequences > MAX_GRID_YZ {
        return Err(invalid!(
            "heads_q and the number of sequences must be at most {MAX_GRID_YZ}"
        ));
    }
    choose_block_sizes(
        family,
        shape.head_dim,
        gpu.max_shared_per_block()?,
        options.block_sizes,
    )
}

/// The exact forward: O and LSE of `softmax(mask(τ·QKᵀ))` with dropout, never materialising an
/// `N_q × N_k` buffer.
pub fn flash_forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    options: &FlashOptions,
) -> Result<ForwardOutput> {
    let blocks = check_call(gpu, shape, q, k, v, options, KernelFamily::Forward)?;
    let layout = DeviceLayout::upload(shape, &options.attention.lengths)?;
    let dtype = q.dtype();
    let o = DeviceTensor::poisoned(dtype, shape.q_elems())?;
    let lse = DeviceF32::poisoned(shape.row_elems())?;
    let attention = &options.attention;
    let mut params = FlashForwardParams {
        q: q.device_ptr(),
        k: k.device_ptr(),
        v: v.device_ptr(),
        o: o.device_ptr(),
        lse: lse.device_ptr(),
        o_state: 0,
        row_sum: 0,
        row_max: 0,
        layout: layout.params,
        dropout: attention.dropout_rng(),
        shape: *shape,
        blocks,
        scale: attention.scale_for(shape.head_dim),
        causal: attention.causal as u32,
        kv_block: 0,
        last: 1,
    };
    let cfg = LaunchConfig {
        grid: (
            layout.max_q_len.div_ceil(blocks.block_rows),
            shape.heads_q,
            layout.params.sequences,
        ),
        block: (THREADS, 1, 1),
        shared_bytes: KernelFamily::Forward.shared_bytes(blocks, shape.head_dim) as u32,
    };
    match options.schedule {
        Schedule::RowOwned => gpu.launch(&format!("flash_forward_{dtype}"), cfg, &params)?,
        Schedule::Paper => {
            // O (normalised, f32), ℓ and m in global memory between K/V blocks: O(N·d), not O(N²).
            let o_state = DeviceF32::poisoned(shape.q_elems())?;
            let row_sum = DeviceF32::poisoned(shape.row_elems())?;
            let row_max = DeviceF32::poisoned(shape.row_elems())?;
            params.o_state = o_state.device_ptr();
            params.row_sum = row_sum.device_ptr();
            params.row_max = row_max.device_ptr();
            let kv_blocks = layout.max_k_rows.div_ceil(blocks.block_cols);
            let name = format!("flash_forward_paper_{dtype}");
            for j in 0..kv_blocks {
                params.kv_block = j;
                params.last = (j + 1 == kv_blocks) as u32;
                gpu.launch(&name, cfg, &params)?;
            }
            gpu.synchronize()?;
        }
    }
    gpu.synchronize()?;
    Ok(ForwardOutput {
        o,
        lse,
        block_sizes: blocks,
    })
}
