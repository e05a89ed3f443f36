//! Launcher of the tensor-core forward, one for both families: the `mma.sync` kernels
//! (`attention_kernels::kernels::sm80::forward`, any sm_80+ device) and the `wgmma` ones
//! (`attention_kernels::kernels::sm90`, the `sm_90a` module). [`crate::plan`] chose the instance.

use attention_kernels::abi::params::{ForwardStrides, TensorCoreForwardParams, TmaForwardParams};

use super::tensor_map::{Operand, encode};

use crate::error::Result;
use crate::layout::DeviceLayout;
use crate::plan::Plan;
use crate::problem::Problem;
use crate::runtime::Queue;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use crate::score_mods::DeviceScoreMods;

/// Launches `plan` (a tensor-core forward) without waiting. The caller validated the tensors
/// against `problem` and `strides` (every row inside its tensor's memory, strides and addresses
/// whole 16-byte chunks).
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_forward(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    [q, k, v]: [&DeviceTensor; 3],
    o: &DeviceTensor,
    lse: &DeviceF32,
    strides: &ForwardStrides,
) -> Result<()> {
    let (shape, options) = (&problem.shape, &problem.options.attention);
    let layout = DeviceLayout::upload(queue, problem)?;
    let mods = DeviceScoreMods::upload(queue, options, None)?;
    let params = TensorCoreForwardParams {
        q: q.device_ptr(),
        k: k.device_ptr(),
        v: v.device_ptr(),
        o: o.device_ptr(),
        lse: lse.device_ptr(),
        layout: layout.params,
        dropout: options.dropout_rng(),
        shape: *shape,
        scale_log2: options.scale_for(shape.head_dim) * std::f32::consts::LOG2_E,
        causal: options.causal as u32,
        mods: mods.params,
        strides: *strides,
    };
    if !plan.tensor_maps {
        return queue.launch(&plan.entry, plan.launch_config(), &params);
    }
    let kv = |ptr, head_dim, strides| Operand {
        ptr,
        batch: shape.batch,
        rows: shape.n_k,
        heads: shape.heads_kv,
        head_dim,
        strides,
    };
    let params = TmaForwardParams {
        align: Default::default(),
        k_map: encode(
            problem.dtype,
            &kv(params.k, shape.head_dim, strides.k),
            plan.block_keys,
        )?,
        v_map: encode(
            problem.dtype,
            &kv(params.v, shape.head_dim_v, strides.v),
            plan.block_keys,
        )?,
        base: params,
    };
    queue.launch(&plan.entry, plan.launch_config(), &params)
}
