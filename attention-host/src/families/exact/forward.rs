//! Launcher of the exact forward, in the schedule the options ask for.

use attention_kernels::abi::layout::BlockSizes;
use attention_kernels::abi::params::FlashForwardParams;

use crate::error::Result;
use crate::flash_options::Schedule;
use crate::layout::DeviceLayout;
use crate::plan::Plan;
use crate::problem::Problem;
use crate::runtime::Queue;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use crate::score_mods::DeviceScoreMods;
use crate::tensors::Workspace;

/// Launches `plan` (an exact forward with `blocks`) without waiting: O and LSE of
/// `softmax(mask(τ·QKᵀ))` with dropout, never materialising an `N_q × N_k` buffer. The caller
/// validated the tensors and the workspace against `problem` and `plan`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_forward(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    blocks: BlockSizes,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    workspace: &Workspace,
) -> Result<()> {
    let (shape, attention) = (&problem.shape, &problem.options.attention);
    let layout = DeviceLayout::upload(queue, problem)?;
    let mods = DeviceScoreMods::upload(queue, attention, None)?;
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
        mods: mods.params,
        kv_block: 0,
        last: 1,
    };
    match problem.options.schedule {
        Schedule::RowOwned => queue.launch(&plan.entry, plan.launch_config(), &params),
        Schedule::Paper => {
            // O (normalised, f32), ℓ and m in global memory between K/V blocks: O(N·d), not O(N²).
            params.o_state = workspace.piece("o_state")?;
            params.row_sum = workspace.piece("row_sum")?;
            params.row_max = workspace.piece("row_max")?;
            let kv_blocks = problem.max_k_rows.div_ceil(blocks.block_cols);
            for j in 0..kv_blocks {
                params.kv_block = j;
                params.last = (j + 1 == kv_blocks) as u32;
                queue.launch(&plan.entry, plan.launch_config(), &params)?;
            }
            Ok(())
        }
    }
}
