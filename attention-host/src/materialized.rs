//! Host side of the article's materialized baseline (0x02B): three launches, `S` and `P` stored.

use attention_kernels::abi::grid::MAX_GRID_YZ;
use attention_kernels::abi::params::{
    MaterializedOutputParams, MaterializedScoresParams, MaterializedSoftmaxParams,
};
use attention_kernels::abi::shape::AttentionShape;

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::options::{AttentionOptions, CheckedElems, Lengths};
use crate::runtime::buffer::DeviceTensor;
use crate::runtime::{Gpu, LaunchConfig};
use crate::tensors::check_qkv;

const TILE: u32 = 16;
const TILE_SHARED_BYTES: u32 = 2 * TILE * (TILE + 1) * 4;
const SOFTMAX_WARPS: u32 = 4;

/// The global `S` and `P` of the materialized schedule, `[batch, heads_q, n_q, n_k]` each.
pub struct MaterializedWorkspace {
    shape: AttentionShape,
    s: DeviceTensor,
    p: DeviceTensor,
}

impl MaterializedWorkspace {
    /// Allocates `S` and `P` (NaN-poisoned) for `shape` in `dtype`.
    pub fn new(shape: &AttentionShape, dtype: DType) -> Result<MaterializedWorkspace> {
        crate::options::validate_shape(shape)?;
        let scores = shape.checked_score_elems()?;
        Ok(MaterializedWorkspace {
            shape: *shape,
            s: DeviceTensor::poisoned(dtype, scores)?,
            p: DeviceTensor::poisoned(dtype, scores)?,
        })
    }

    /// Bytes of `S` plus `P`.
    pub fn size_bytes(&self) -> usize {
        self.s.size_bytes() + self.p.size_bytes()
    }
}

/// Refuses the options the materialized baseline does not take: it supports scale and the
/// causal mask only (no device needed, so a caller can refuse a call before looking for one).
pub fn check_options(options: &AttentionOptions) -> Result<()> {
    if options.dropout.is_some() || options.lengths != Lengths::Full || options.has_score_mods() {
        return Err(invalid!(
            "the materialized baseline supports scale and causal only"
        ));
    }
    Ok(())
}

/// The materialized forward into `o` (`[batch, n_q, heads_q, head_dim_v]`, q's dtype): three
/// launches that write `S`, read it and write `P`, read `P` and write `O`. Supports scale and the
/// causal mask; dropout and length masks are the fused kernels' job. Queues the work on the GPU's
/// stream; call `gpu.synchronize()` to wait for it.
#[allow(clippy::too_many_arguments)]
pub fn materialized_forward(
    gpu: &Gpu,
    workspace: &MaterializedWorkspace,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    options: &AttentionOptions,
) -> Result<()> {
    let shape = &workspace.shape;
    check_qkv(shape, q, k, v)?;
    options.validate(shape)?;
    check_options(options)?;
    let dtype = q.dtype();
    if o.len() != shape.o_elems() || o.dtype() != dtype || workspace.s.dtype() != dtype {
        return Err(invalid!(
            "o must hold {} {dtype} elements and the workspace be {dtype}; got {} {} and a {} workspace",
            shape.o_elems(),
            o.len(),
            o.dtype(),
            workspace.s.dtype()
        ));
    }
    let (s, p) = (&workspace.s, &workspace.p);
    // A comparator that writes all of S: it keeps the plain grid (Q tiles in y, planes in z).
    let planes = shape.batch * shape.heads_q;
    if planes > MAX_GRID_YZ || shape.n_q.div_ceil(TILE) > MAX_GRID_YZ {
        return Err(invalid!(
            "the materialized baseline takes at most {MAX_GRID_YZ} (batch x heads) planes and {} query rows",
            MAX_GRID_YZ * TILE
        ));
    }

    let scores = MaterializedScoresParams {
        q: q.device_ptr(),
        k: k.device_ptr(),
        s: s.device_ptr(),
        shape: *shape,
        scale: options.scale_for(shape.head_dim),
        causal: options.causal as u32,
    };
    let tiles = LaunchConfig {
        grid: (shape.n_k.div_ceil(TILE), shape.n_q.div_ceil(TILE), planes),
        block: (TILE, TILE, 1),
        shared_bytes: TILE_SHARED_BYTES,
    };
    gpu.launch(&format!("materialized_scores_{dtype}"), tiles, &scores)?;

    let rows = planes * shape.n_q;
    let softmax = MaterializedSoftmaxParams {
        s: s.device_ptr(),
        p: p.device_ptr(),
        rows,
        n_k: shape.n_k,
    };
    let per_row = LaunchConfig {
        grid: (rows.div_ceil(SOFTMAX_WARPS), 1, 1),
        block: (32 * SOFTMAX_WARPS, 1, 1),
        shared_bytes: 0,
    };
    gpu.launch(&format!("materialized_softmax_{dtype}"), per_row, &softmax)?;

    let output = MaterializedOutputParams {
        p: p.device_ptr(),
        v: v.device_ptr(),
        o: o.device_ptr(),
        shape: *shape,
    };
    let out_tiles = LaunchConfig {
        grid: (
            shape.head_dim_v.div_ceil(TILE),
            shape.n_q.div_ceil(TILE),
            planes,
        ),
        ..tiles
    };
    gpu.launch(&format!("materialized_output_{dtype}"), out_tiles, &output)
}
