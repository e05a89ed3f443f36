//! Launcher of the exact recompute backward: D first (and the sink gradients), then K/V-outer dK/dV (and dQ by atomics, or
//! the deterministic row-owned dQ pass).

use attention_kernels::abi::layout::BlockSizes;
use attention_kernels::abi::params::FlashBackwardParams;

use super::THREADS;
use crate::error::{Result, driver};
use crate::instances;
use crate::layout::DeviceLayout;
use crate::plan::Plan;
use crate::problem::Problem;
use crate::runtime::{LaunchConfig, Queue};
use crate::score_mods::DeviceScoreMods;
use crate::tensors::{BackwardInputs, GradientBuffers, Workspace};

/// Rows of D per block of the `delta` kernel (one warp each).
const DELTA_WARPS: u32 = THREADS / 32;

/// Launches `plan` (an exact backward with `blocks`) without waiting. The caller validated the
/// tensors and the workspace against `problem` and `plan`.
pub(crate) fn launch_backward(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    blocks: BlockSizes,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
) -> Result<()> {
    let (shape, attention) = (&problem.shape, &problem.options.attention);
    let deterministic = problem.options.deterministic;
    let dtype = problem.dtype;
    let layout = DeviceLayout::upload(queue, problem)?;
    let mods = DeviceScoreMods::upload(queue, attention, out.d_sinks.as_ref())?;
    let dq_accum = if deterministic {
        0
    } else {
        let ptr = workspace.piece("dq_accum")?;
        zero_f32(queue, ptr, shape.q_elems())?;
        ptr
    };
    let params = FlashBackwardParams {
        q: inputs.q.device_ptr(),
        k: inputs.k.device_ptr(),
        v: inputs.v.device_ptr(),
        o: inputs.o.device_ptr(),
        d_o: inputs.d_o.device_ptr(),
        lse: inputs.lse.device_ptr(),
        delta: workspace.piece("delta")?,
        dq: out.dq.device_ptr(),
        dk: out.dk.device_ptr(),
        dv: out.dv.device_ptr(),
        dq_accum,
        layout: layout.params,
        dropout: attention.dropout_rng(),
        shape: *shape,
        blocks,
        scale: attention.scale_for(shape.head_dim),
        causal: attention.causal as u32,
        mods: mods.params,
    };
    // Below 2^31 rows (`validate_shape`).
    let rows = shape.row_elems() as u32;
    let delta_cfg = LaunchConfig {
        grid: (rows.div_ceil(DELTA_WARPS), 1, 1),
        block: (THREADS, 1, 1),
        shared_bytes: 0,
    };
    queue.launch(
        &instances::exact_backward(dtype, "delta"),
        delta_cfg,
        &params,
    )?;
    if mods.params.d_sinks != 0 {
        let sink_cfg = LaunchConfig {
            grid: (shape.heads_q, 1, 1),
            block: (32, 1, 1),
            shared_bytes: 0,
        };
        queue.launch(&instances::exact_d_sink(), sink_cfg, &params)?;
    }
    queue.launch(&plan.entry, plan.launch_config(), &params)?;
    if deterministic {
        let (y, z) = problem.grid_yz(shape.heads_q);
        let dq_cfg = LaunchConfig {
            grid: (problem.max_q_len.div_ceil(blocks.block_rows), y, z),
            ..plan.launch_config()
        };
        queue.launch(&instances::exact_backward(dtype, "dq"), dq_cfg, &params)
    } else {
        // A grid-stride loop: a bounded grid covers any element count.
        let blocks = shape.q_elems().div_ceil(THREADS as usize).min(65_535) as u32;
        let convert_cfg = LaunchConfig {
            grid: (blocks, 1, 1),
            block: (THREADS, 1, 1),
            shared_bytes: 0,
        };
        queue.launch(
            &instances::exact_backward(dtype, "dq_convert"),
            convert_cfg,
            &params,
        )
    }
}

/// Zeroes `len` f32 at `ptr` on the call's stream (the atomics accumulate into zeros).
fn zero_f32(queue: &Queue, ptr: u64, len: usize) -> Result<()> {
    // SAFETY: `ptr` is the start of a workspace piece of at least `len` f32 (the plan sized it),
    // owned by the caller's `Workspace` for the duration of the call.
    let status =
        unsafe { cudarc::driver::sys::cuMemsetD32Async(ptr, 0, len, queue.stream().cu_stream()) };
    driver(status, "zeroing the dQ accumulator")
}
