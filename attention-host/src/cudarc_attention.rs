//! Attention for ML programs built on cudarc (candle's and burn's CUDA backends sit on it): the
//! forward returns O and the LSE as new `CudaSlice`s on the program's stream, the backward takes
//! them back and returns the gradients, with the workspaces kept between calls. Everything is
//! queued on the one stream, allocated there in stream order (cudarc's `cuMemAllocAsync`), and
//! never waited for: a training step of such calls can be captured into a CUDA graph.
//!
//! candle's `CustomOp` (`flash_attn::candle`, feature `candle-cuda`) sits on this, through the
//! `_views` methods that take candle's strided storage in place.

use std::sync::{Arc, Mutex, PoisonError};

use attention_kernels::abi::shape::AttentionShape;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use crate::borrowed::{Element, TensorMut, TensorRef};
use crate::error::{CudaContext as _, Result};
use crate::family::Direction;
use crate::flash_options::FlashOptions;
use crate::plan::Plan;
use crate::runtime::Gpu;
use crate::stream_api::{BackwardViews, GradientViews, backward_on, forward_on};
use crate::tensors::Workspace;

/// The forward's results: O (`[batch, n_q, heads_q, head_dim]`, the inputs' type), the LSE (f32
/// `[batch, heads_q, n_q]`, natural log) the backward needs, and the plan that ran.
pub struct Forward<T> {
    pub o: CudaSlice<T>,
    pub lse: CudaSlice<f32>,
    pub plan: Plan,
}

/// dQ (Q's layout), dK and dV (K/V's), the sink gradients (f32 `[heads_q]`) when the call has sink
/// logits, and the plan that ran.
pub struct Grads<T> {
    pub dq: CudaSlice<T>,
    pub dk: CudaSlice<T>,
    pub dv: CudaSlice<T>,
    pub d_sinks: Option<CudaSlice<f32>>,
    pub plan: Plan,
}

/// The kernels loaded in the context of `stream`, launched on it; workspaces made on first use
/// of a plan and reused after.
pub struct CudarcAttention {
    workspaces: Mutex<Vec<Workspace>>,
    stream: Arc<CudaStream>,
    gpu: Gpu,
}

impl CudarcAttention {
    /// Attention on `stream` with `gpu`, which must be of the stream's context
    /// ([`Gpu::for_context`] with `stream.context().clone()`).
    pub fn new(gpu: Gpu, stream: Arc<CudaStream>) -> Result<CudarcAttention> {
        if !gpu.owns_stream(&stream) {
            return Err(crate::error::invalid!(
                "the stream is not of the Gpu's context: make the Gpu with Gpu::for_context(stream.context().clone(), ..)"
            ));
        }
        Ok(CudarcAttention {
            workspaces: Mutex::new(Vec::new()),
            stream,
            gpu,
        })
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// O and LSE of `softmax(mask(τ·QKᵀ)) · V` for `q` (`[batch, n_q, heads_q, head_dim]`) and `k`,
    /// `v` (`[batch, n_k, heads_kv, head_dim]`), contiguous cudarc slices or views of one element
    /// type. Returns once queued.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use attention_host::cudarc_attention::CudarcAttention;
    /// use attention_host::{AttentionOptions, AttentionShape, FlashOptions, Gpu};
    /// # fn run(ptx: &str) -> attention_host::Result<()> {
    /// let context = cudarc::driver::CudaContext::new(0).unwrap();
    /// let stream = context.new_stream().unwrap();
    /// let attention = CudarcAttention::new(Gpu::for_context(context, ptx, None)?, stream.clone())?;
    /// let shape = AttentionShape::new(2, 128, 128, 4, 4, 64);
    /// let q = stream.alloc_zeros::<half::bf16>(shape.q_elems()).unwrap();
    /// let options = FlashOptions::new(AttentionOptions::new().causal(true));
    /// let fwd = attention.forward(&shape, &q, &q, &q, &options)?;
    /// let d_o = stream.alloc_zeros::<half::bf16>(shape.o_elems()).unwrap();
    /// let grads = attention.backward(&shape, &q, &q, &q, &fwd.o, &d_o, &fwd.lse, &options)?;
    /// println!("{} then {}", fwd.plan.entry, grads.plan.entry);
    /// # Ok(())
    /// # }
    /// ```
    pub fn forward<T: Element>(
        &self,
        shape: &AttentionShape,
        q: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        options: &FlashOptions,
    ) -> Result<Forward<T>> {
        let s = &self.stream;
        let (q, k, v) = (
            TensorRef::new(q, s),
            TensorRef::new(k, s),
            TensorRef::new(v, s),
        );
        self.forward_views(shape, [&q, &k, &v], options)
    }

    /// As [`CudarcAttention::forward`] on views of the stream's memory, strided ones included
    /// (a framework's tensor at an offset of its storage, `[B, H, N, d]` transposed, ...): Q, K,
    /// V of element type `T`.
    pub fn forward_views<T: Element>(
        &self,
        shape: &AttentionShape,
        [q, k, v]: [&TensorRef; 3],
        options: &FlashOptions,
    ) -> Result<Forward<T>> {
        let s = &self.stream;
        let plan = crate::attention::plan(&self.gpu, shape, T::DTYPE, options, Direction::Forward)?;
        // SAFETY: the kernels write every element of O and LSE (any bit pattern of f32, f16 or
        // bf16 is a value, so nothing reads an invalid one meanwhile).
        let mut o = unsafe { s.alloc::<T>(shape.o_elems()) }.cuda("allocating O")?;
        let mut lse = unsafe { s.alloc::<f32>(shape.row_elems()) }.cuda("allocating LSE")?;
        let ran = self.with_workspace(&plan, |workspace| {
            forward_on(
                &self.gpu,
                s,
                shape,
                [q, k, v],
                &mut TensorMut::new(&mut o, s),
                &mut TensorMut::new(&mut lse, s),
                workspace,
                options,
            )
        })?;
        Ok(Forward { o, lse, plan: ran })
    }

    /// dQ, dK, dV of `⟨dO, O⟩` for O and LSE of [`CudarcAttention::forward`] with the same
    /// options. Returns once queued.
    #[allow(clippy::too_many_arguments)]
    pub fn backward<T: Element>(
        &self,
        shape: &AttentionShape,
        q: &impl DevicePtr<T>,
        k: &impl DevicePtr<T>,
        v: &impl DevicePtr<T>,
        o: &impl DevicePtr<T>,
        d_o: &impl DevicePtr<T>,
        lse: &impl DevicePtr<f32>,
        options: &FlashOptions,
    ) -> Result<Grads<T>> {
        let s = &self.stream;
        let (q, k, v, o, d_o) = (
            TensorRef::new(q, s),
            TensorRef::new(k, s),
            TensorRef::new(v, s),
            TensorRef::new(o, s),
            TensorRef::new(d_o, s),
        );
        let lse = TensorRef::new(lse, s);
        let inputs = BackwardViews {
            q: &q,
            k: &k,
            v: &v,
            o: &o,
            d_o: &d_o,
            lse: &lse,
        };
        self.backward_views(shape, inputs, options)
    }

    /// As [`CudarcAttention::backward`] on views of the stream's memory, strided ones included;
    /// the gradients come back contiguous, of element type `T`.
    pub fn backward_views<T: Element>(
        &self,
        shape: &AttentionShape,
        inputs: BackwardViews,
        options: &FlashOptions,
    ) -> Result<Grads<T>> {
        let s = &self.stream;
        let plan =
            crate::attention::plan(&self.gpu, shape, T::DTYPE, options, Direction::Backward)?;
        // SAFETY: as in `forward_views`: the backward writes every element of its outputs.
        let alloc = |len: usize| unsafe { s.alloc::<T>(len) }.cuda("allocating a gradient");
        let (mut dq, mut dk, mut dv) = (
            alloc(shape.q_elems())?,
            alloc(shape.k_elems())?,
            alloc(shape.v_elems())?,
        );
        let mut d_sinks = match options.attention.sinks {
            // SAFETY: as above.
            Some(_) => Some(
                unsafe { s.alloc::<f32>(shape.heads_q as usize) }
                    .cuda("allocating the sink gradients")?,
            ),
            None => None,
        };
        let ran = self.with_workspace(&plan, |workspace| {
            let mut d_sinks = d_sinks.as_mut().map(|d| TensorMut::new(d, s));
            backward_on(
                &self.gpu,
                s,
                shape,
                inputs,
                GradientViews {
                    dq: &mut TensorMut::new(&mut dq, s),
                    dk: &mut TensorMut::new(&mut dk, s),
                    dv: &mut TensorMut::new(&mut dv, s),
                    d_sinks: d_sinks.as_mut(),
                },
                workspace,
                options,
            )
        })?;
        Ok(Grads {
            dq,
            dk,
            dv,
            d_sinks,
            plan: ran,
        })
    }

    /// Runs `call` with the workspace of `plan`, made on the stream the first time a plan needs
    /// it. The lock is held for the call, so two threads never queue work on one workspace in an
    /// order the stream does not see.
    fn with_workspace<R>(
        &self,
        plan: &Plan,
        call: impl FnOnce(&Workspace) -> Result<R>,
    ) -> Result<R> {
        let mut workspaces = self
            .workspaces
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let index = match workspaces.iter().position(|w| w.check(plan).is_ok()) {
            Some(i) => i,
            None => {
                workspaces.push(Workspace::on_stream(&self.gpu, plan, &self.stream)?);
                workspaces.len() - 1
            }
        };
        call(&workspaces[index])
    }
}
