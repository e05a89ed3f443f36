//! Launcher of the decode family: the split kernel writes partial `(O, LSE)` per split into the
//! workspace and, by default, its last split merges them (`DecodeCombine::LastSplit`, one
//! launch); otherwise the plan's combine (the parallel combine, `kernels::decode`, or the
//! strided merge, `kernels::merge`) merges them into O and LSE.

use attention_kernels::abi::layout::KeyPages;
use attention_kernels::abi::params::{DecodeParams, MERGE_MAX_PARTS, MergeParams, MergeParts};
use attention_kernels::kernels::decode::{
    DecodeCombine, MAX_SPLITS, combine_shared_bytes, combine_warps,
};

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::instances;
use crate::layout::DeviceLayout;
use crate::merge::PartShape;
use crate::plan::{Plan, SPLIT_COUNTERS, Tiles};
use crate::problem::Problem;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use crate::runtime::{LaunchConfig, Queue};
use crate::tensors::Workspace;

/// Launches `plan` (a decode plan) without waiting, with K and V laid out as `pages` says
/// (contiguous `[batch, n_k, heads_kv, head_dim]`, or a paged cache's pool and block table). The
/// caller validated the tensors, the pages and the workspace against `problem` and `plan`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_forward(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    workspace: &Workspace,
    pages: KeyPages,
) -> Result<()> {
    let (shape, options) = (&problem.shape, &problem.options.attention);
    let layout = DeviceLayout::upload(queue, problem)?;
    let combine_with = match &plan.tiles {
        Tiles::Decode(cfg) => cfg.combine,
        other => return Err(invalid!("a decode launch got the plan of {other:?}")),
    };
    let splits = plan.grid.0;
    let in_kernel = combine_with == DecodeCombine::LastSplit;
    let piece = |name| match (in_kernel, splits) {
        (true, 1) => Ok(0),
        _ => workspace.piece(name),
    };
    let (o_part, lse_part) = (piece("o_partial")?, piece("lse_partial")?);
    let split_counters = match in_kernel {
        true => piece(SPLIT_COUNTERS)?,
        false => 0,
    };
    let params = DecodeParams {
        q: q.device_ptr(),
        k: k.device_ptr(),
        v: v.device_ptr(),
        o_part,
        lse_part,
        layout: layout.params,
        pages,
        shape: *shape,
        keys_per_split: plan.block_keys,
        scale_log2: options.scale_for(shape.head_dim) * std::f32::consts::LOG2_E,
        causal: options.causal as u32,
        merge_in_kernel: in_kernel as u32,
        o: o.device_ptr(),
        lse: lse.device_ptr(),
        split_counters,
    };
    queue.launch(&plan.entry, plan.launch_config(), &params)?;
    let parts = PartShape::of(shape);
    let combine = MergeParams {
        table: MergeParts {
            o: [0; MERGE_MAX_PARTS],
            lse: [0; MERGE_MAX_PARTS],
        },
        o_base: o_part,
        lse_base: lse_part,
        o_part_stride: 4 * shape.o_elems() as u64,
        lse_part_stride: 4 * shape.row_elems() as u64,
        o: o.device_ptr(),
        lse: lse.device_ptr(),
        parts: splits,
        batch: shape.batch,
        n_q: shape.n_q,
        heads: shape.heads_q,
        head_dim: shape.head_dim,
    };
    match combine_with {
        DecodeCombine::LastSplit => Ok(()),
        DecodeCombine::Merge => queue.launch(
            &instances::merge(DType::F32, problem.dtype, true),
            parts.launch_config()?,
            &combine,
        ),
        DecodeCombine::Parallel => {
            if combine.parts > MAX_SPLITS {
                return Err(invalid!(
                    "the parallel combine takes at most {MAX_SPLITS} splits, not {}",
                    combine.parts
                ));
            }
            let rows = u32::try_from(parts.lse_elems()?)
                .ok()
                .filter(|&r| r <= i32::MAX as u32)
                .ok_or_else(|| invalid!("{parts:?} has more rows than one combine launch takes"))?;
            let warps = combine_warps(combine.parts);
            let config = LaunchConfig {
                grid: (rows, 1, 1),
                block: (32 * warps, 1, 1),
                shared_bytes: combine_shared_bytes(warps, shape.head_dim),
            };
            queue.launch(
                &instances::decode_combine(problem.dtype, shape.head_dim),
                config,
                &combine,
            )
        }
    }
}
