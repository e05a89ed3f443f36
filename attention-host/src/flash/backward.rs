//! Launches the recompute backward: D first, then K/V-outer dK/dV (and dQ by atomics, or the
//! deterministic row-owned dQ pass).

use attention_kernels::flash::params::{BlockSizes, FlashBackwardParams};
use attention_kernels::params::AttentionShape;

use super::THREADS;
use super::blocks::KernelFamily;
use super::forward::check_call;
use super::layout::DeviceLayout;
use super::options::FlashOptions;
use crate::buffer::{DeviceArray, DeviceF32, DeviceTensor};
use crate::error::{Result, invalid};
use crate::runtime::{Gpu, LaunchConfig};

/// dQ (shape of Q), dK and dV (shape of K), in the inputs' dtype.
pub struct Gradients {
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
    pub block_sizes: BlockSizes,
}

/// Rows of D per block of the `delta` kernel (one warp each).
const DELTA_WARPS: u32 = THREADS / 32;

/// Gradients of `⟨dO, O⟩` with O from `flash_forward` with the same `options`; `o` and `lse`
/// are that call's outputs, `d_o` has O's shape and dtype.
#[allow(clippy::too_many_arguments)]
pub fn flash_backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    d_o: &DeviceTensor,
    options: &FlashOptions,
) -> Result<Gradients> {
    let blocks = check_call(gpu, shape, q, k, v, options, KernelFamily::Backward)?;
    for (name, t) in [("o", o), ("d_o", d_o)] {
        if t.len() != shape.q_elems() || t.dtype() != q.dtype() {
            return Err(invalid!(
                "{name} must be {} with {} elements, got {} with {}",
                q.dtype(),
                shape.q_elems(),
                t.dtype(),
                t.len()
            ));
        }
    }
    if lse.len() != shape.row_elems() {
        return Err(invalid!(
            "lse holds {} values, the shape needs {}",
            lse.len(),
            shape.row_elems()
        ));
    }
    let layout = DeviceLayout::upload(shape, &options.attention.lengths)?;
    let dtype = q.dtype();
    let dq = DeviceTensor::poisoned(dtype, shape.q_elems())?;
    let dk = DeviceTensor::poisoned(dtype, shape.kv_elems())?;
    let dv = DeviceTensor::poisoned(dtype, shape.kv_elems())?;
    let delta = DeviceF32::poisoned(shape.row_elems())?;
    // Atomics accumulate into zeros; the deterministic pass needs no f32 buffer.
    let dq_accum = if options.deterministic {
        None
    } else {
        Some(DeviceArray::<f32>::zeroed(shape.q_elems())?)
    };
    let attention = &options.attention;
    let params = FlashBackwardParams {
        q: q.device_ptr(),
        k: k.device_ptr(),
        v: v.device_ptr(),
        o: o.device_ptr(),
        d_o: d_o.device_ptr(),
        lse: lse.device_ptr(),
        delta: delta.device_ptr(),
        dq: dq.device_ptr(),
        dk: dk.device_ptr(),
        dv: dv.device_ptr(),
        dq_accum: dq_accum.as_ref().map_or(0, DeviceArray::device_ptr),
        layout: layout.params,
        dropout: attention.dropout_rng(),
        shape: *shape,
        blocks,
        scale: attention.scale_for(shape.head_dim),
        causal: attention.causal as u32,
    };
    let shared_bytes = KernelFamily::Backward.shared_bytes(blocks, shape.head_dim) as u32;
    let sequences = layout.params.sequences;

    let rows = shape.row_elems() as u32;
    let delta_cfg = LaunchConfig {
        grid: (rows.div_ceil(DELTA_WARPS), 1, 1),
        block: (THREADS, 1, 1),
        shared_bytes: 0,
    };
    gpu.launch(&format!("flash_backward_delta_{dtype}"), delta_cfg, &params)?;

    let kv_cfg = LaunchConfig {
        grid: (
            layout.max_k_rows.div_ceil(blocks.block_cols),
            shape.heads_kv,
            sequences,
        ),
        block: (THREADS, 1, 1),
        shared_bytes,
    };
    gpu.launch(&format!("flash_backward_kv_{dtype}"), kv_cfg, &params)?;

    if options.deterministic {
        let dq_cfg = LaunchConfig {
            grid: (
                layout.max_q_len.div_ceil(blocks.block_rows),
                shape.heads_q,
                sequences,
            ),
            block: (THREADS, 1, 1),
            shared_bytes,
        };
        gpu.launch(&format!("flash_backward_dq_{dtype}"), dq_cfg, &params)?;
    } else {
        let elems = shape.q_elems() as u32;
        let convert_cfg = LaunchConfig {
            grid: (elems.div_ceil(THREADS).min(65_535), 1, 1),
            block: (THREADS, 1, 1),
            shared_bytes: 0,
        };
        gpu.launch(
            &format!("flash_backward_dq_convert_{dtype}"),
            convert_cfg,
            &params,
        )?;
    }
    gpu.synchronize()?;
    Ok(Gradients {
        dq,
        dk,
        dv,
        block_sizes: blocks,
    })
}
