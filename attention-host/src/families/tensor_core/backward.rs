//! Launcher of the tensor-core backward, one for both families: preprocess (`D`, `LSE · log2 e`,
//! zeroed dQ accumulator; then the sink gradients where the call has sink logits), the main
//! kernel (`mma.sync` from `attention_kernels::kernels::sm80::backward` or `wgmma` from
//! `attention_kernels::kernels::sm90`, as [`crate::plan`] chose), the dQ conversion, and the
//! gradients of NaN rows.

use attention_kernels::abi::layout::TensorStrides;
use attention_kernels::abi::params::{
    BackwardStrides, TensorCoreBackwardParams, TensorMap, TmaBackwardParams,
};
use attention_kernels::kernels::sm90;

use super::tensor_map::{Operand, encode, encode_f32};
use attention_kernels::attn::backward::{
    CONVERT_THREADS, NAN_ROWS_THREADS, PREPROCESS_WARPS, n_q_pad,
};

use crate::error::{Result, invalid};
use crate::instances;
use crate::layout::DeviceLayout;
use crate::plan::{Plan, Tiles, preprocess_blocks};
use crate::problem::Problem;
use crate::runtime::{LaunchConfig, Queue};
use crate::score_mods::DeviceScoreMods;
use crate::tensors::{BackwardInputs, GradientBuffers, Workspace};

/// Launches the four kernels of `plan` (a tensor-core backward) without waiting. The caller
/// validated the tensors and the workspace against `problem` and `plan`, and the tensors against
/// `strides` (as for the forward).
pub(crate) fn launch_backward(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
    strides: &BackwardStrides,
) -> Result<()> {
    let (shape, options) = (&problem.shape, &problem.options.attention);
    let dtype = problem.dtype;
    let scale = options.scale_for(shape.head_dim);
    let layout = DeviceLayout::upload(queue, problem)?;
    let n_q_pad = n_q_pad(shape.n_q);
    let mods = DeviceScoreMods::upload(queue, options, out.d_sinks.as_ref())?;
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
        dq_accum: workspace.piece("dq_accum")?,
        lse_log2: workspace.piece("lse_log2")?,
        d_sum: workspace.piece("d_sum")?,
        dq_semaphores: if problem.options.deterministic {
            workspace.piece("dq_semaphores")?
        } else {
            0
        },
        layout: layout.params,
        dropout: options.dropout_rng(),
        shape: *shape,
        n_q_pad,
        scale,
        scale_log2: scale * std::f32::consts::LOG2_E,
        causal: options.causal as u32,
        mods: mods.params,
        strides: *strides,
    };
    // Below 2^31 (the plan admits the family only then); Q's elements / 8 and its rows too.
    let blocks = |n: u64| {
        u32::try_from(n)
            .map_err(|_| invalid!("a backward grid of {n} blocks exceeds the hardware's"))
    };
    let compiled_head_dim = plan
        .tiles
        .compiled_head_dim()
        .ok_or_else(|| invalid!("{:?} is not a tensor-core backward plan", plan.tiles))?;
    // The preprocess is compiled per whole 64-column panels (d = 32's and 96's tiles are 64's
    // and 128's).
    queue.launch(
        &instances::tensor_core_preprocess(dtype, compiled_head_dim.next_multiple_of(64)),
        LaunchConfig {
            grid: (blocks(preprocess_blocks(shape))?, 1, 1),
            block: (32 * PREPROCESS_WARPS, 1, 1),
            shared_bytes: 0,
        },
        &params,
    )?;
    if mods.params.d_sinks != 0 {
        queue.launch(
            &instances::tensor_core_d_sink(),
            LaunchConfig {
                grid: (shape.heads_q, 1, 1),
                block: (32, 1, 1),
                shared_bytes: 0,
            },
            &params,
        )?;
    }
    if plan.tensor_maps {
        let q_rows = |ptr, head_dim, strides| Operand {
            ptr,
            batch: shape.batch,
            rows: shape.n_q,
            heads: shape.heads_q,
            head_dim,
            strides,
        };
        // The f32 accumulator, contiguous in Q's shape, for the instances that add dQ through
        // the accelerator's bulk reductions; the others never read the map.
        let bulk = matches!(plan.tiles, Tiles::Sm90Backward(c)
            if sm90::bulk_dq(&c, true, problem.options.deterministic));
        let dq_map = if bulk {
            let accum = TensorStrides::contiguous(shape.n_q, shape.heads_q, shape.head_dim);
            encode_f32(
                &q_rows(params.dq_accum, shape.head_dim, accum),
                plan.block_rows,
            )?
        } else {
            TensorMap::default()
        };
        let main = TmaBackwardParams {
            align: Default::default(),
            q_map: encode(
                dtype,
                &q_rows(params.q, shape.head_dim, strides.q),
                plan.block_rows,
            )?,
            do_map: encode(
                dtype,
                &q_rows(params.d_o, shape.head_dim_v, strides.d_o),
                plan.block_rows,
            )?,
            base: params,
            dq_map,
        };
        queue.launch(&plan.entry, plan.launch_config(), &main)?;
    } else {
        queue.launch(&plan.entry, plan.launch_config(), &params)?;
    }
    queue.launch(
        &instances::tensor_core_convert_dq(dtype),
        LaunchConfig {
            grid: (
                blocks((shape.q_elems() as u64 / 8).div_ceil(CONVERT_THREADS as u64))?,
                1,
                1,
            ),
            block: (CONVERT_THREADS, 1, 1),
            shared_bytes: 0,
        },
        &params,
    )?;
    queue.launch(
        &instances::tensor_core_nan_rows(dtype),
        LaunchConfig {
            grid: (
                blocks((shape.row_elems() as u64).div_ceil(NAN_ROWS_THREADS as u64))?,
                1,
                1,
            ),
            block: (NAN_ROWS_THREADS, 1, 1),
            shared_bytes: 0,
        },
        &params,
    )
}
