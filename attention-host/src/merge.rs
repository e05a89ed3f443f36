//! The public merge of partial results: `(O, LSE)` pairs computed over disjoint key sets (cascade
//! attention over a shared prefix, attention spread over devices, split-KV decode) combined into
//! the `(O, LSE)` of the union, exactly (`attention_kernels::attn::merge`, the forward's empty-row
//! and non-finite policy). [`crate::reference::merge`] is its f64 reference.
//!
//! [`merge`] and [`merge_into`] take the library's buffers (device 0); [`merge_on`] takes the
//! caller's memory and stream on any device, as [`crate::stream_api`] does.

use attention_kernels::abi::params::{MERGE_MAX_PARTS, MergeParams, MergeParts};
use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::kernels::merge::MERGE_WARPS;
use cudarc::driver::CudaStream;

use crate::attention::check_owned_context;
use crate::borrowed::{Dims, Named, TensorMut, TensorRef, check_aliasing};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::instances;
use crate::options::checked_elems;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use crate::runtime::{Gpu, LaunchConfig, Queue};
use crate::stream_api::check_stream;

/// The shape of one part: O `[batch, n_q, heads, head_dim]` (the call's `head_dim_v`), LSE f32 `[batch, heads, n_q]`
/// (what [`crate::forward`] writes, with `heads = heads_q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartShape {
    pub batch: u32,
    pub n_q: u32,
    pub heads: u32,
    pub head_dim: u32,
}

impl PartShape {
    /// The shape of the O and LSE a forward of `shape` writes.
    pub fn of(shape: &AttentionShape) -> PartShape {
        PartShape {
            batch: shape.batch,
            n_q: shape.n_q,
            heads: shape.heads_q,
            head_dim: shape.head_dim_v,
        }
    }

    /// Elements of one O, checked.
    pub fn o_elems(&self) -> Result<usize> {
        checked_elems("O", &[self.batch, self.n_q, self.heads, self.head_dim])
    }

    /// Elements of one LSE (rows), checked.
    pub fn lse_elems(&self) -> Result<usize> {
        checked_elems("LSE", &[self.batch, self.n_q, self.heads])
    }

    fn validate(&self) -> Result<()> {
        for (name, v) in [
            ("batch", self.batch),
            ("n_q", self.n_q),
            ("heads", self.heads),
            ("head_dim", self.head_dim),
        ] {
            if v == 0 {
                return Err(invalid!("{name} must be at least 1"));
            }
        }
        self.o_elems().map(drop)
    }

    /// The merge's grid: one warp per row.
    pub(crate) fn launch_config(&self) -> Result<LaunchConfig> {
        let blocks = self.lse_elems()?.div_ceil(MERGE_WARPS as usize);
        let blocks = u32::try_from(blocks)
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| invalid!("{self:?} has more rows than one merge launch takes"))?;
        Ok(LaunchConfig {
            grid: (blocks, 1, 1),
            block: (32 * MERGE_WARPS, 1, 1),
            shared_bytes: 0,
        })
    }
}

/// The merged O (the parts' dtype) and LSE (f32).
pub struct Merged {
    pub o: DeviceTensor,
    pub lse: DeviceF32,
}

/// Merges the parts `(o_parts[p], lse_parts[p])` (1 to [`MERGE_MAX_PARTS`] of them, one dtype:
/// f32, f16 or bf16), computed over disjoint key sets of the same query rows; waits for the
/// result. A part with `LSE = −∞` on a row contributes nothing there; a row empty in every part is
/// `O = 0`, `LSE = −∞`; a NaN LSE makes its row NaN. More parts merge in stages (the merge is
/// associative). The library's buffers live on device 0: a `Gpu` of another context is refused
/// (it runs [`merge_on`]).
///
/// # Example
///
/// Cascade attention: the same query rows over a shared prefix and over their own keys, merged
/// into attention over both.
///
/// ```no_run
/// use attention_host::{AttentionShape, DeviceTensor, FlashOptions, PartShape, forward, merge};
/// # fn run(gpu: &attention_host::Gpu, q: &DeviceTensor, prefix_kv: [&DeviceTensor; 2],
/// #        own_kv: [&DeviceTensor; 2]) -> attention_host::Result<()> {
/// let prefix = AttentionShape::new(1, 16, 8192, 8, 8, 128);
/// let own = AttentionShape { n_k: 300, ..prefix };
/// let options = FlashOptions::default();
/// let a = forward(gpu, &prefix, q, prefix_kv[0], prefix_kv[1], &options)?;
/// let b = forward(gpu, &own, q, own_kv[0], own_kv[1], &options)?;
/// let both = merge(gpu, &PartShape::of(&prefix), &[&a.o, &b.o], &[&a.lse, &b.lse])?;
/// println!("merged O: {} elements", both.o.len());
/// # Ok(())
/// # }
/// ```
pub fn merge(
    gpu: &Gpu,
    shape: &PartShape,
    o_parts: &[&DeviceTensor],
    lse_parts: &[&DeviceF32],
) -> Result<Merged> {
    check_owned_context(gpu)?;
    let dtype = check_parts(shape, o_parts, lse_parts)?;
    let out = Merged {
        o: DeviceTensor::uninitialized(dtype, shape.o_elems()?)?,
        lse: DeviceF32::uninitialized(shape.lse_elems()?)?,
    };
    launch(
        &Queue::own(gpu),
        shape,
        dtype,
        &pointers(o_parts, lse_parts),
        (out.o.device_ptr(), out.lse.device_ptr()),
        o_parts.len(),
    )?;
    gpu.synchronize()?;
    Ok(out)
}

/// As [`merge`], into `o` (the parts' dtype) and `lse` the caller owns, distinct from every part,
/// without waiting.
///
/// # Example
///
/// ```no_run
/// use attention_host::{DeviceF32, DeviceTensor, ForwardOutput, PartShape, merge_into};
/// # fn run(gpu: &attention_host::Gpu, shape: PartShape, a: &ForwardOutput, b: &ForwardOutput)
/// #        -> attention_host::Result<()> {
/// let o = DeviceTensor::poisoned(a.o.dtype(), shape.o_elems()?)?;
/// let lse = DeviceF32::poisoned(shape.lse_elems()?)?;
/// merge_into(gpu, &shape, &[&a.o, &b.o], &[&a.lse, &b.lse], &o, &lse)?;
/// println!("{} rows merged", lse.to_vec()?.len()); // reading back waits for the merge
/// # Ok(())
/// # }
/// ```
pub fn merge_into(
    gpu: &Gpu,
    shape: &PartShape,
    o_parts: &[&DeviceTensor],
    lse_parts: &[&DeviceF32],
    o: &DeviceTensor,
    lse: &DeviceF32,
) -> Result<()> {
    check_owned_context(gpu)?;
    let dtype = check_parts(shape, o_parts, lse_parts)?;
    if o.dtype() != dtype || o.len() != shape.o_elems()? {
        return Err(invalid!(
            "o must be {dtype} with {} elements, it is {} with {}",
            shape.o_elems()?,
            o.dtype(),
            o.len()
        ));
    }
    if lse.len() != shape.lse_elems()? {
        return Err(invalid!(
            "lse must hold {} f32, it holds {}",
            shape.lse_elems()?,
            lse.len()
        ));
    }
    let aliased = o_parts.iter().any(|p| p.device_ptr() == o.device_ptr())
        || lse_parts.iter().any(|p| p.device_ptr() == lse.device_ptr());
    if aliased {
        return Err(invalid!(
            "the merge's outputs must not be one of its parts (rows are read while written)"
        ));
    }
    launch(
        &Queue::own(gpu),
        shape,
        dtype,
        &pointers(o_parts, lse_parts),
        (o.device_ptr(), lse.device_ptr()),
        o_parts.len(),
    )
}

/// As [`merge_into`] on memory and a stream the caller owns, on any device: the parts and the
/// outputs as contiguous views (O `[batch, n_q, heads, head_dim]` in one dtype, LSE f32
/// `[batch, heads, n_q]`) in `gpu`'s context, the kernel queued on `stream` (a stream of that
/// context); nothing waits. Parts brought from another device first
/// ([`crate::runtime::peer::copy_across_devices`]) merge here like local ones.
///
/// Refused before launching: what [`merge_into`] refuses, strided views, a view shorter than
/// its part, an LSE that is not f32, outputs overlapping a part or each other.
///
/// # Example
///
/// Two halves of the keys computed on two devices, merged on the first:
///
/// ```no_run
/// use attention_host::borrowed::{TensorMut, TensorRef};
/// use attention_host::{PartShape, merge_on};
/// use cudarc::driver::CudaSlice;
/// # fn run(gpu: &attention_host::Gpu, shape: PartShape, o_a: &CudaSlice<half::bf16>,
/// #        lse_a: &CudaSlice<f32>, o_b_copied: &CudaSlice<half::bf16>,
/// #        lse_b_copied: &CudaSlice<f32>) -> attention_host::Result<()> {
/// let stream = gpu.context().new_stream().unwrap();
/// let mut o = stream.alloc_zeros::<half::bf16>(shape.o_elems()?).unwrap();
/// let mut lse = stream.alloc_zeros::<f32>(shape.lse_elems()?).unwrap();
/// merge_on(
///     gpu,
///     &stream,
///     &shape,
///     &[&TensorRef::new(o_a, &stream), &TensorRef::new(o_b_copied, &stream)],
///     &[&TensorRef::new(lse_a, &stream), &TensorRef::new(lse_b_copied, &stream)],
///     &mut TensorMut::new(&mut o, &stream),
///     &mut TensorMut::new(&mut lse, &stream),
/// )?;
/// # Ok(())
/// # }
/// ```
pub fn merge_on(
    gpu: &Gpu,
    stream: &CudaStream,
    shape: &PartShape,
    o_parts: &[&TensorRef],
    lse_parts: &[&TensorRef],
    o: &mut TensorMut,
    lse: &mut TensorMut,
) -> Result<()> {
    check_stream(gpu, stream)?;
    check_counts(shape, o_parts.len(), lse_parts.len())?;
    let dtype = o_parts[0].view.dtype;
    let dims_o = Dims {
        batch: shape.batch as usize,
        seq: shape.n_q as usize,
        heads: shape.heads as usize,
        head_dim: shape.head_dim as usize,
    };
    let dims_lse = Dims {
        batch: 1,
        seq: 1,
        heads: 1,
        head_dim: shape.lse_elems()?,
    };
    let parts: Vec<Named> = o_parts
        .iter()
        .map(|p| ("an O part", &p.view, dims_o))
        .chain(lse_parts.iter().map(|p| ("an LSE part", &p.view, dims_lse)))
        .collect();
    let outputs: [Named; 2] = [("o", &o.view, dims_o), ("lse", &lse.view, dims_lse)];
    let o_count = o_parts.len();
    let checks = parts
        .iter()
        .enumerate()
        .map(|(i, p)| (p, i < o_count, false));
    let checks = checks.chain([(&outputs[0], true, true), (&outputs[1], false, true)]);
    for (&(name, view, dims), is_o, output) in checks {
        if view.strides.is_some() {
            return Err(invalid!(
                "the merge reads and writes contiguous views: {name} has strides"
            ));
        }
        view.check(name, &dims, if is_o { dtype } else { DType::F32 }, output)?;
    }
    check_aliasing(&parts, &outputs)?;
    launch(
        &Queue::caller(gpu, stream),
        shape,
        dtype,
        &MergeParts {
            o: table(o_parts.iter().map(|p| p.view.ptr)),
            lse: table(lse_parts.iter().map(|p| p.view.ptr)),
        },
        (o.view.ptr, lse.view.ptr),
        o_parts.len(),
    )
}

/// Part addresses as the kernel's table takes them (unused slots 0).
fn table(ptrs: impl Iterator<Item = u64>) -> [u64; MERGE_MAX_PARTS] {
    let mut t = [0; MERGE_MAX_PARTS];
    for (slot, p) in t.iter_mut().zip(ptrs) {
        *slot = p;
    }
    t
}

fn pointers(o_parts: &[&DeviceTensor], lse_parts: &[&DeviceF32]) -> MergeParts {
    MergeParts {
        o: table(o_parts.iter().map(|p| p.device_ptr())),
        lse: table(lse_parts.iter().map(|p| p.device_ptr())),
    }
}

/// The shape is valid and there are as many O as LSE parts, 1 to [`MERGE_MAX_PARTS`].
fn check_counts(shape: &PartShape, o_parts: usize, lse_parts: usize) -> Result<()> {
    shape.validate()?;
    if o_parts != lse_parts {
        return Err(invalid!(
            "{o_parts} O parts but {lse_parts} LSE parts: each part is one (O, LSE) pair"
        ));
    }
    if o_parts == 0 || o_parts > MERGE_MAX_PARTS {
        return Err(invalid!(
            "merge takes 1 to {MERGE_MAX_PARTS} parts, got {o_parts} (merge more in stages)"
        ));
    }
    Ok(())
}

/// The parts' common dtype, once every part is checked against `shape`.
fn check_parts(
    shape: &PartShape,
    o_parts: &[&DeviceTensor],
    lse_parts: &[&DeviceF32],
) -> Result<DType> {
    check_counts(shape, o_parts.len(), lse_parts.len())?;
    let dtype = o_parts[0].dtype();
    let (o_elems, lse_elems) = (shape.o_elems()?, shape.lse_elems()?);
    for (p, (o, lse)) in o_parts.iter().zip(lse_parts).enumerate() {
        if o.dtype() != dtype {
            return Err(invalid!(
                "O part {p} is {} but part 0 is {dtype}",
                o.dtype()
            ));
        }
        if o.len() != o_elems {
            return Err(invalid!(
                "O part {p} holds {} elements, {shape:?} needs {o_elems} ([batch, n_q, heads, head_dim])",
                o.len()
            ));
        }
        if lse.len() != lse_elems {
            return Err(invalid!(
                "LSE part {p} holds {} f32, {shape:?} needs {lse_elems} ([batch, heads, n_q])",
                lse.len()
            ));
        }
    }
    Ok(dtype)
}

fn launch(
    queue: &Queue,
    shape: &PartShape,
    dtype: DType,
    table: &MergeParts,
    (o, lse): (u64, u64),
    parts: usize,
) -> Result<()> {
    let params = MergeParams {
        table: *table,
        o_base: 0,
        lse_base: 0,
        o_part_stride: 0,
        lse_part_stride: 0,
        o,
        lse,
        parts: parts as u32,
        batch: shape.batch,
        n_q: shape.n_q,
        heads: shape.heads,
        head_dim: shape.head_dim,
    };
    queue.launch(
        &instances::merge(dtype, dtype, false),
        shape.launch_config()?,
        &params,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_shapes_are_checked() {
        let s = PartShape {
            batch: 2,
            n_q: 3,
            heads: 4,
            head_dim: 8,
        };
        assert_eq!((s.o_elems().unwrap(), s.lse_elems().unwrap()), (192, 24));
        assert_eq!(s.launch_config().unwrap().grid, (6, 1, 1));
        let zero = PartShape { heads: 0, ..s };
        assert!(zero.validate().unwrap_err().to_string().contains("heads"));
        let huge = PartShape {
            batch: u32::MAX,
            n_q: u32::MAX,
            heads: u32::MAX,
            head_dim: 8,
        };
        assert!(huge.validate().is_err());
    }
}
