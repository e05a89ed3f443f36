//! The entry points on memory and a stream the caller owns: Q, K, V, O, LSE and the gradients as
//! [`TensorRef`] / [`TensorMut`] views (cudarc slices or raw device pointers, with strides), the
//! kernels queued on the caller's `CudaStream` of the `Gpu`'s context.
//!
//! Asynchronous and capturable: nothing here synchronises, fills an output or allocates outside
//! stream order. The workspace is the caller's ([`Workspace::on_stream`], reusable by every call
//! with the same plan); the call's own temporaries (staging copies, uploaded option arrays) come
//! from the library's pool in stream order on the caller's stream and return to it there, so a
//! call may be captured into a CUDA graph. Options that upload host arrays (key lengths, packed
//! sequences, ALiBi slopes, sink logits) are refused under capture: the graph would read the host
//! memory again at each replay.
//!
//! Zero-copy where the kernels allow it: the tensor-core families (`sm80`, `sm90`: forward,
//! backward and its preprocess, dQ conversion and NaN-row passes) take each tensor's strides, so
//! a view at a 16-byte aligned address whose strides are whole 16-byte chunks (8 elements of f16
//! or bf16: `[B, N, H, d]`, `[B, H, N, d]`, Q, K, V of one fused `[B, N, 3, H, d]` projection,
//! their gradients) is read and written in place. The `exact` and `decode` families take
//! contiguous tensors only: they run views in the contiguous layout in place. Any other view (a
//! misaligned address, a stride that splits a 16-byte chunk, a strided view on `exact` or
//! `decode`) is gathered into a contiguous temporary before the kernels and, for outputs,
//! scattered back after them, with strided copies on the same stream: correct for every family
//! and option, at the cost of one extra read and write of that tensor. The returned plan's
//! [`Plan::staged`] names the tensors that were staged (empty when all ran in place). LSE and the
//! sink gradients are flat f32 arrays: in place when 16-byte aligned. Offsets are 64-bit: a view
//! may span more than 2^31 elements (each view's span is checked against its memory first). The
//! paged KV cache ([`crate::kv_cache`]) is not a view: its page pool is the library's own,
//! contiguous `[pages, page_size, heads_kv, head_dim]`, read by the decode family without strides.

use std::sync::Arc;

use attention_kernels::abi::layout::TensorStrides;
use attention_kernels::abi::params::{BackwardStrides, ForwardStrides};
use attention_kernels::abi::shape::AttentionShape;
use cudarc::driver::CudaStream;
use cudarc::driver::sys;

use crate::attention::{
    check_d_sinks, choose, launch_backward_strided, launch_forward_strided, takes_strides,
};
use crate::borrowed::{Dims, Named, TensorMut, TensorRef, View, check_aliasing};
use crate::dtype::DType;
use crate::error::{Result, driver, invalid};
use crate::family::Direction;
use crate::flash_options::FlashOptions;
use crate::plan::Plan;
use crate::problem::Problem;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use crate::runtime::{Gpu, Queue};
use crate::tensors::{BackwardInputs, GradientBuffers, Workspace};

/// What the backward reads: Q, K, V, O, dO in one dtype and the forward's LSE (f32
/// `[batch, heads_q, n_q]`, contiguous).
pub struct BackwardViews<'t, 'a> {
    pub q: &'t TensorRef<'a>,
    pub k: &'t TensorRef<'a>,
    pub v: &'t TensorRef<'a>,
    pub o: &'t TensorRef<'a>,
    pub d_o: &'t TensorRef<'a>,
    pub lse: &'t TensorRef<'a>,
}

/// What the backward writes: dQ in Q's shape, dK and dV in K's, each with its own strides; the
/// sink gradients (f32 `[heads_q]`) for a call with sink logits.
pub struct GradientViews<'t, 'a> {
    pub dq: &'t mut TensorMut<'a>,
    pub dk: &'t mut TensorMut<'a>,
    pub dv: &'t mut TensorMut<'a>,
    pub d_sinks: Option<&'t mut TensorMut<'a>>,
}

/// O and LSE of `softmax(mask(τ·QKᵀ)) · V` (as [`crate::forward`]) on the caller's memory and
/// `stream`, a stream of `gpu`'s context. `workspace` is [`Workspace::on_stream`]'s for this
/// call's plan ([`crate::plan()`]). Returns the plan once the work is queued; nothing waits.
///
/// # Example
///
/// ```no_run
/// use attention_host::{AttentionShape, FlashOptions, Direction, Workspace, forward_on, plan};
/// use attention_host::borrowed::{TensorMut, TensorRef};
/// # fn run(gpu: &attention_host::Gpu) -> attention_host::Result<()> {
/// let stream = gpu.context().new_stream().unwrap();
/// let shape = AttentionShape::new(2, 256, 256, 8, 8, 64);
/// let q = stream.alloc_zeros::<half::bf16>(shape.q_elems()).unwrap();
/// let (k, v) = (q.clone(), q.clone());
/// let mut o = stream.alloc_zeros::<half::bf16>(shape.o_elems()).unwrap();
/// let mut lse = stream.alloc_zeros::<f32>(shape.row_elems()).unwrap();
/// let options = FlashOptions::default();
/// let plan = plan(gpu, &shape, attention_host::DType::Bf16, &options, Direction::Forward)?;
/// let workspace = Workspace::on_stream(gpu, &plan, &stream)?;
/// forward_on(
///     gpu,
///     &stream,
///     &shape,
///     [&TensorRef::new(&q, &stream), &TensorRef::new(&k, &stream), &TensorRef::new(&v, &stream)],
///     &mut TensorMut::new(&mut o, &stream),
///     &mut TensorMut::new(&mut lse, &stream),
///     &workspace,
///     &options,
/// )?;
/// # Ok(())
/// # }
/// ```
#[allow(clippy::too_many_arguments)]
pub fn forward_on(
    gpu: &Gpu,
    stream: &CudaStream,
    shape: &AttentionShape,
    [q, k, v]: [&TensorRef; 3],
    o: &mut TensorMut,
    lse: &mut TensorMut,
    workspace: &Workspace,
    options: &FlashOptions,
) -> Result<Plan> {
    check_stream(gpu, stream)?;
    let problem = Problem::new(shape, q.view.dtype, options)?;
    let dims = dims(shape);
    let dtype = problem.dtype;
    let inputs = [
        ("q", &q.view, dims.q),
        ("k", &k.view, dims.k),
        ("v", &v.view, dims.v),
    ];
    let outputs = [("o", &o.view, dims.o), ("lse", &lse.view, dims.rows)];
    check_views(&inputs, &outputs, dtype)?;
    let plan = choose(gpu, &problem, Direction::Forward, None)?;
    workspace.check(&plan)?;
    let queue = Queue::caller(gpu, stream);
    let strided = takes_strides(&plan);
    let [q, k, v] = inputs.map(|(_, view, d)| Staged::input(&queue, view, &d, strided));
    let (q, k, v) = (q?, k?, v?);
    let (o, lse) = (
        Staged::output(&queue, outputs[0].1, &dims.o, strided)?,
        Staged::output(&queue, outputs[1].1, &dims.rows, false)?,
    );
    let lse_f32 = lse.as_f32(&queue);
    let strides = ForwardStrides {
        q: q.strides(),
        k: k.strides(),
        v: v.strides(),
        o: o.strides(),
    };
    launch_forward_strided(
        &queue,
        &problem,
        &plan,
        [q.tensor(), k.tensor(), v.tensor()],
        o.tensor(),
        &lse_f32,
        workspace,
        &strides,
    )?;
    o.write_back(&queue)?;
    lse.write_back(&queue)?;
    let all = [&q, &k, &v, &o, &lse];
    Ok(with_staged(
        plan,
        &inputs.map(|(n, ..)| n),
        &outputs.map(|(n, ..)| n),
        &all,
    ))
}

/// dQ, dK, dV (as [`crate::backward`]) on the caller's memory and `stream`, a stream of `gpu`'s
/// context; `workspace` is [`Workspace::on_stream`]'s for the backward plan. Returns the plan once
/// the work is queued; nothing waits.
///
/// # Example
///
/// ```no_run
/// use attention_host::{AttentionShape, FlashOptions, Direction, Workspace, backward_on, plan};
/// use attention_host::borrowed::{TensorMut, TensorRef};
/// use attention_host::stream_api::{BackwardViews, GradientViews};
/// # fn run(gpu: &attention_host::Gpu) -> attention_host::Result<()> {
/// let stream = gpu.context().new_stream().unwrap();
/// let shape = AttentionShape::new(1, 128, 128, 4, 4, 64);
/// let zeros = || stream.alloc_zeros::<half::f16>(shape.q_elems()).unwrap();
/// let (q, k, v, o, d_o) = (zeros(), zeros(), zeros(), zeros(), zeros());
/// let lse = stream.alloc_zeros::<f32>(shape.row_elems()).unwrap();
/// let (mut dq, mut dk, mut dv) = (zeros(), zeros(), zeros());
/// let options = FlashOptions::default();
/// let plan = plan(gpu, &shape, attention_host::DType::F16, &options, Direction::Backward)?;
/// let workspace = Workspace::on_stream(gpu, &plan, &stream)?;
/// let r = |t| TensorRef::new(t, &stream);
/// let (q, k, v, o, d_o, lse) = (r(&q), r(&k), r(&v), r(&o), r(&d_o), TensorRef::new(&lse, &stream));
/// backward_on(
///     gpu,
///     &stream,
///     &shape,
///     BackwardViews { q: &q, k: &k, v: &v, o: &o, d_o: &d_o, lse: &lse },
///     GradientViews {
///         dq: &mut TensorMut::new(&mut dq, &stream),
///         dk: &mut TensorMut::new(&mut dk, &stream),
///         dv: &mut TensorMut::new(&mut dv, &stream),
///         d_sinks: None,
///     },
///     &workspace,
///     &options,
/// )?;
/// # Ok(())
/// # }
/// ```
#[allow(clippy::too_many_arguments)]
pub fn backward_on(
    gpu: &Gpu,
    stream: &CudaStream,
    shape: &AttentionShape,
    inputs: BackwardViews,
    grads: GradientViews,
    workspace: &Workspace,
    options: &FlashOptions,
) -> Result<Plan> {
    check_stream(gpu, stream)?;
    let problem = Problem::new(shape, inputs.q.view.dtype, options)?;
    let dims = dims(shape);
    let dims_heads = Dims {
        batch: 1,
        seq: 1,
        heads: 1,
        head_dim: shape.heads_q as usize,
    };
    let dtype = problem.dtype;
    let ins = [
        ("q", &inputs.q.view, dims.q),
        ("k", &inputs.k.view, dims.k),
        ("v", &inputs.v.view, dims.v),
        ("o", &inputs.o.view, dims.o),
        ("d_o", &inputs.d_o.view, dims.o),
        ("lse", &inputs.lse.view, dims.rows),
    ];
    let mut outs = vec![
        ("dq", &grads.dq.view, dims.q),
        ("dk", &grads.dk.view, dims.k),
        ("dv", &grads.dv.view, dims.v),
    ];
    if let Some(d) = &grads.d_sinks {
        outs.push(("d_sinks", &d.view, dims_heads));
    }
    check_views(&ins, &outs, dtype)?;
    if options.attention.sinks.is_some() && grads.d_sinks.is_none() {
        return Err(invalid!(
            "a call with sink logits writes their gradients: pass d_sinks ({} f32)",
            shape.heads_q
        ));
    }
    let plan = choose(gpu, &problem, Direction::Backward, None)?;
    workspace.check(&plan)?;
    let queue = Queue::caller(gpu, stream);
    let strided = takes_strides(&plan);
    // LSE and the sink gradients are flat f32 arrays: never strided.
    let staged_in = ins
        .iter()
        .map(|(name, view, d)| Staged::input(&queue, view, d, strided && *name != "lse"))
        .collect::<Result<Vec<_>>>()?;
    let staged_out = outs
        .iter()
        .map(|(name, view, d)| Staged::output(&queue, view, d, strided && *name != "d_sinks"))
        .collect::<Result<Vec<_>>>()?;
    let lse = staged_in[5].as_f32(&queue);
    let out = GradientBuffers {
        dq: staged_out[0].share(&queue),
        dk: staged_out[1].share(&queue),
        dv: staged_out[2].share(&queue),
        d_sinks: staged_out.get(3).map(|d| d.as_f32(&queue)),
    };
    check_d_sinks(&problem, &out)?;
    let backward_inputs = BackwardInputs {
        q: staged_in[0].tensor(),
        k: staged_in[1].tensor(),
        v: staged_in[2].tensor(),
        o: staged_in[3].tensor(),
        d_o: staged_in[4].tensor(),
        lse: &lse,
    };
    let strides = BackwardStrides {
        q: staged_in[0].strides(),
        k: staged_in[1].strides(),
        v: staged_in[2].strides(),
        o: staged_in[3].strides(),
        d_o: staged_in[4].strides(),
        dq: staged_out[0].strides(),
        dk: staged_out[1].strides(),
        dv: staged_out[2].strides(),
    };
    launch_backward_strided(
        &queue,
        &problem,
        &plan,
        &backward_inputs,
        &out,
        workspace,
        &strides,
    )?;
    for staged in &staged_out {
        staged.write_back(&queue)?;
    }
    let names = |v: &[Named]| v.iter().map(|(n, ..)| *n).collect::<Vec<_>>();
    let all = staged_in.iter().chain(&staged_out).collect::<Vec<_>>();
    Ok(with_staged(plan, &names(&ins), &names(&outs), &all))
}

pub(crate) fn check_stream(gpu: &Gpu, stream: &CudaStream) -> Result<()> {
    if !gpu.owns_stream(stream) {
        return Err(invalid!(
            "the stream belongs to another context than the Gpu's: make the Gpu with Gpu::for_context(stream.context().clone(), ..)"
        ));
    }
    Ok(())
}

/// The extents of each role for `shape`: Q and dQ, K and dK, V and dV, O and dO, and the LSE
/// (as one flat f32 row).
struct RoleDims {
    q: Dims,
    k: Dims,
    v: Dims,
    o: Dims,
    rows: Dims,
}

fn dims(shape: &AttentionShape) -> RoleDims {
    let q = Dims {
        batch: shape.batch as usize,
        seq: shape.n_q as usize,
        heads: shape.heads_q as usize,
        head_dim: shape.head_dim as usize,
    };
    let k = Dims {
        seq: shape.n_k as usize,
        heads: shape.heads_kv as usize,
        ..q
    };
    let rows = Dims {
        batch: 1,
        seq: 1,
        heads: 1,
        head_dim: shape.row_elems(),
    };
    let d_v = shape.head_dim_v as usize;
    RoleDims {
        q,
        k,
        v: Dims { head_dim: d_v, ..k },
        o: Dims { head_dim: d_v, ..q },
        rows,
    }
}

/// Each view fits its memory and role (f32 and no strides for the LSE and sink gradients), outputs
/// have disjoint rows, and no output overlaps another tensor of the call.
fn check_views(inputs: &[Named], outputs: &[Named], dtype: DType) -> Result<()> {
    for (views, output) in [(inputs, false), (outputs, true)] {
        for &(name, view, dims) in views {
            let flat = name == "lse" || name == "d_sinks";
            if flat && view.strides.is_some() {
                return Err(invalid!(
                    "{name} is a contiguous f32 array: it takes no strides"
                ));
            }
            let want = if flat { DType::F32 } else { dtype };
            view.check(name, &dims, want, output)?;
        }
    }
    check_aliasing(inputs, outputs)
}

/// `plan` with [`Plan::staged`] naming the tensors of `all` (inputs then outputs, named by
/// `inputs` and `outputs`) that went through a staging copy.
fn with_staged(
    mut plan: Plan,
    inputs: &[&'static str],
    outputs: &[&'static str],
    all: &[&Staged],
) -> Plan {
    plan.staged = inputs
        .iter()
        .chain(outputs)
        .zip(all)
        .filter(|(_, s)| s.copied)
        .map(|(n, _)| *n)
        .collect();
    plan
}

/// One tensor of the call as the kernels see it: the caller's memory in place, or a contiguous
/// temporary on the call's stream that the view is gathered into (inputs) or scattered from
/// (outputs).
struct Staged {
    view: View,
    dims: Dims,
    tensor: DeviceTensor,
    copied: bool,
    output: bool,
}

impl Staged {
    /// `strided`: the kernels take the view's strides.
    fn input(queue: &Queue, view: &View, dims: &Dims, strided: bool) -> Result<Staged> {
        let staged = Staged::new(queue, view, dims, false, strided)?;
        if staged.copied {
            copy_strided(queue, view, dims, staged.tensor.device_ptr(), Way::Gather)?;
        }
        Ok(staged)
    }

    fn output(queue: &Queue, view: &View, dims: &Dims, strided: bool) -> Result<Staged> {
        Staged::new(queue, view, dims, true, strided)
    }

    fn new(queue: &Queue, view: &View, dims: &Dims, output: bool, strided: bool) -> Result<Staged> {
        let copied = !view.in_place(dims, strided);
        let tensor = match copied {
            false => DeviceTensor::borrowed(view.dtype, view.ptr, dims.elems(), queue.context()),
            true => DeviceTensor::uninitialized_on(
                view.dtype,
                dims.elems(),
                queue.context(),
                queue.temporaries,
            )?,
        };
        Ok(Staged {
            view: *view,
            dims: *dims,
            tensor,
            copied,
            output,
        })
    }

    fn tensor(&self) -> &DeviceTensor {
        &self.tensor
    }

    /// The element strides the kernels address [`Staged::tensor`] with: the view's in place,
    /// the contiguous layout's when staged.
    fn strides(&self) -> TensorStrides {
        let s = match self.copied {
            false => self.view.strides_for(&self.dims),
            true => View {
                strides: None,
                ..self.view
            }
            .strides_for(&self.dims),
        };
        TensorStrides {
            batch: s.batch as u64,
            seq: s.seq as u64,
            head: s.head as u64,
        }
    }

    /// The same memory as another `DeviceTensor` (the backward's buffers are taken by value).
    fn share(&self, queue: &Queue) -> DeviceTensor {
        DeviceTensor::borrowed(
            self.view.dtype,
            self.tensor.device_ptr(),
            self.dims.elems(),
            queue.context(),
        )
    }

    /// The same memory as an f32 array (LSE, sink gradients).
    fn as_f32(&self, queue: &Queue) -> DeviceF32 {
        DeviceF32::borrowed(self.tensor.device_ptr(), self.dims.elems(), queue.context())
    }

    /// Scatters a staged output into the caller's view, after the kernels on the same stream.
    fn write_back(&self, queue: &Queue) -> Result<()> {
        if self.output && self.copied {
            copy_strided(
                queue,
                &self.view,
                &self.dims,
                self.tensor.device_ptr(),
                Way::Scatter,
            )?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Way {
    /// The strided view into the contiguous buffer.
    Gather,
    /// The contiguous buffer into the strided view.
    Scatter,
}

/// Copies between `view` and a contiguous `[batch, seq, heads, head_dim]` buffer at `packed`, on
/// the queue's stream, as 2D copies along the sequence: one per batch item when each row's heads
/// are contiguous (one in all when the batch items follow one another), else one per batch item
/// and head.
fn copy_strided(queue: &Queue, view: &View, dims: &Dims, packed: u64, way: Way) -> Result<()> {
    if dims.elems() == 0 {
        return Ok(());
    }
    let es = view.dtype.size_bytes();
    let s = view.strides_for(dims);
    let row = dims.heads * dims.head_dim;
    let copy = |src_at: usize, dst_at: usize, width: usize, height: usize| {
        let (view_at, packed_at) = (
            view.ptr + (src_at * es) as u64,
            packed + (dst_at * es) as u64,
        );
        let (view_pitch, packed_pitch) = (s.seq * es, row * es);
        if height > 1 && view_pitch < width * es {
            return Err(invalid!(
                "a view with sequence stride {} cannot be copied in rows of {width} elements",
                s.seq
            ));
        }
        let (src, src_pitch, dst, dst_pitch) = match way {
            Way::Gather => (view_at, view_pitch, packed_at, packed_pitch),
            Way::Scatter => (packed_at, packed_pitch, view_at, view_pitch),
        };
        // Every field spelled out: all-zero is not a valid CUDA_MEMCPY2D (its memory-type enum
        // has no zero value).
        let m = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            srcHost: std::ptr::null(),
            srcDevice: src,
            srcArray: std::ptr::null_mut(),
            srcPitch: src_pitch.max(width * es),
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: dst,
            dstArray: std::ptr::null_mut(),
            dstPitch: dst_pitch.max(width * es),
            WidthInBytes: width * es,
            Height: height,
        };
        // SAFETY: `check_views` showed every element of the view inside the caller's memory and
        // the packed buffer holds `dims.elems()` elements; the copy is queued on the call's
        // stream after (gather: before) the kernels that use the buffer.
        driver(
            unsafe { sys::cuMemcpy2DAsync_v2(&m, queue.stream().cu_stream()) },
            "copying a strided view",
        )
    };
    if s.head == dims.head_dim {
        if dims.batch == 1 || s.batch == dims.seq * s.seq {
            return copy(0, 0, row, dims.batch * dims.seq);
        }
        for b in 0..dims.batch {
            copy(b * s.batch, b * dims.seq * row, row, dims.seq)?;
        }
        return Ok(());
    }
    for b in 0..dims.batch {
        for h in 0..dims.heads {
            copy(
                b * s.batch + h * s.head,
                b * dims.seq * row + h * dims.head_dim,
                dims.head_dim,
                dims.seq,
            )?;
        }
    }
    Ok(())
}

impl Workspace {
    /// As [`Workspace::new`] in `gpu`'s context, allocated in stream order on `stream` and freed
    /// on it when dropped (the workspace keeps the stream alive): for [`forward_on`] and
    /// [`backward_on`] on that stream, reusable by every call with the same plan.
    pub fn on_stream(gpu: &Gpu, plan: &Plan, stream: &Arc<CudaStream>) -> Result<Workspace> {
        check_stream(gpu, stream)?;
        Workspace::allocate(plan, |floats| {
            DeviceF32::uninitialized_on(floats, gpu.context(), stream.cu_stream())
        })
        .map(|w| w.keeping(stream.clone()))
    }
}
