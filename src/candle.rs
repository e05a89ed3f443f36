//! flash-attn's attention as a candle op: [`flash_attn`] on candle CUDA tensors, forward and
//! backward, on candle's own stream and memory.
//!
//! Q is `[batch, n_q, heads_q, head_dim]`, K `[batch, n_k, heads_kv, head_dim]` and V
//! `[batch, n_k, heads_kv, head_dim_v]` (the layout of candle-flash-attn; `head_dim_v` may differ
//! from `head_dim`), bf16 or f16, any strides with a contiguous last dimension (a `[B, H, N, d]`
//! tensor `.transpose(1, 2)` is read in place); O comes back contiguous
//! `[batch, n_q, heads_q, head_dim_v]`. Every option of [`FlashOptions`] passes through: causal,
//! window, softcap, ALiBi, sinks, dropout (the backward regenerates the forward's mask from the
//! same seed and offset), key lengths and packed sequences, kernel choice.
//!
//! Zero-copy: the kernels read candle's storage and write buffers allocated on candle's stream,
//! which candle then owns; nothing synchronises. The forward's LSE (f32 `[batch, heads_q, n_q]`)
//! stays with the op in candle's graph until the backward reads it.
//!
//! Behind the cargo feature `candle` (off by default: without it nothing of candle is built or
//! linked). With `candle` alone the op type-checks shapes and refuses CPU tensors; `candle-cuda`
//! adds candle's CUDA backend and the op's forward and backward.
//!
//! Sink logits are host constants of the options, not candle tensors, so their gradients (which
//! the backward computes) do not flow back into candle's graph.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use crate::{AttentionShape, FlashOptions};

/// `softmax(mask(τ·QKᵀ)) · V` under `options`, differentiable in Q, K and V through
/// flash-attn's backward. CUDA tensors only: on another device it returns an error.
///
/// # Example
///
/// ```no_run
/// use candle_core::{DType, Device, Tensor};
/// use flash_attn::{AttentionOptions, FlashOptions};
/// # fn run() -> candle_core::Result<()> {
/// let dev = Device::new_cuda(0)?;
/// let q = Tensor::randn(0f32, 1., (2, 128, 8, 64), &dev)?.to_dtype(DType::BF16)?;
/// let options = FlashOptions::new(AttentionOptions::new().causal(true));
/// let o = flash_attn::candle::flash_attn(&q, &q, &q, &options)?;
/// # Ok(())
/// # }
/// ```
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, options: &FlashOptions) -> Result<Tensor> {
    attention_shape(q.dims(), k.dims(), v.dims())?;
    let (q, k, v) = (
        head_dim_contiguous(q)?,
        head_dim_contiguous(k)?,
        head_dim_contiguous(v)?,
    );
    let op = FlashAttention {
        options: options.clone(),
        lse: Mutex::new(None),
    };
    q.apply_op3(&k, &v, op)
}

/// `t` itself when its last dimension is contiguous (the kernels take strides for the other
/// three), else a contiguous copy.
fn head_dim_contiguous(t: &Tensor) -> Result<Tensor> {
    match t.stride().last() {
        Some(1) => Ok(t.clone()),
        _ => t.contiguous(),
    }
}

/// The problem's shape from Q's and K/V's dimensions.
fn attention_shape(q: &[usize], k: &[usize], v: &[usize]) -> Result<AttentionShape> {
    let (&[b, n_q, h_q, d], &[b_k, n_k, h_kv, d_k]) = (q, k) else {
        candle_core::bail!(
            "flash_attn: Q and K must be 4-D [batch, seq, heads, head_dim], got {q:?} and {k:?}"
        );
    };
    let &[b_v, n_v, h_v, d_v] = v else {
        candle_core::bail!("flash_attn: V must be 4-D [batch, seq, heads, head_dim_v], got {v:?}");
    };
    if (b_v, n_v, h_v) != (b_k, n_k, h_kv) {
        candle_core::bail!("flash_attn: K {k:?} and V {v:?} differ in batch, keys or heads");
    }
    if b != b_k || d != d_k {
        candle_core::bail!("flash_attn: Q {q:?} and K {k:?} differ in batch or head_dim");
    }
    let u32_of = |x: usize, what: &str| {
        u32::try_from(x).map_err(|_| {
            candle_core::Error::Msg(format!("flash_attn: {what} {x} does not fit in u32"))
        })
    };
    Ok(AttentionShape {
        batch: u32_of(b, "batch")?,
        n_q: u32_of(n_q, "n_q")?,
        n_k: u32_of(n_k, "n_k")?,
        heads_q: u32_of(h_q, "heads_q")?,
        heads_kv: u32_of(h_kv, "heads_kv")?,
        head_dim: u32_of(d, "head_dim")?,
        head_dim_v: u32_of(d_v, "head_dim_v")?,
    })
}

/// One call's op in candle's graph: its options and, once the forward ran, its LSE.
struct FlashAttention {
    // Without the `cuda` feature no forward runs, so nothing reads these.
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    options: FlashOptions,
    #[cfg_attr(not(feature = "candle-cuda"), allow(dead_code))]
    lse: Mutex<Option<crate::cudarc::driver::CudaSlice<f32>>>,
}

impl CustomOp3 for FlashAttention {
    fn name(&self) -> &'static str {
        "flash-attn"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        candle_core::bail!("flash_attn runs on CUDA devices; these tensors are on the CPU")
    }

    #[cfg(feature = "candle-cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        match s1.dtype() {
            candle_core::DType::BF16 => {
                cuda::forward::<half::bf16>(self, [(s1, l1), (s2, l2), (s3, l3)])
            }
            candle_core::DType::F16 => {
                cuda::forward::<half::f16>(self, [(s1, l1), (s2, l2), (s3, l3)])
            }
            dt => candle_core::bail!("flash_attn takes bf16 or f16 tensors, not {dt:?}"),
        }
    }

    #[cfg(feature = "candle-cuda")]
    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        o: &Tensor,
        d_o: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let d_o = head_dim_contiguous(&d_o.to_dtype(o.dtype())?)?;
        let [dq, dk, dv] = match q.dtype() {
            candle_core::DType::BF16 => cuda::backward::<half::bf16>(self, [q, k, v, o, &d_o])?,
            candle_core::DType::F16 => cuda::backward::<half::f16>(self, [q, k, v, o, &d_o])?,
            dt => candle_core::bail!("flash_attn takes bf16 or f16 tensors, not {dt:?}"),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

#[cfg(feature = "candle-cuda")]
mod cuda {
    use std::sync::{Arc, Mutex, PoisonError};

    use candle_core::cuda_backend::{CudaDType, CudaStorage};
    use candle_core::op::BackpropOp;
    use candle_core::{Layout, Result, Shape, Storage, Tensor};

    use super::{FlashAttention, attention_shape};
    use crate::cudarc::driver::{CudaStream, CudaView};
    use crate::{BackwardViews, CudarcAttention, Element, Strides, TensorRef};

    /// The kernels loaded once per candle stream (a candle `CudaDevice` and its clones share one),
    /// with their workspaces; kept for the program's life.
    static ATTENTIONS: Mutex<Vec<Arc<CudarcAttention>>> = Mutex::new(Vec::new());

    fn attention_for(stream: Arc<CudaStream>) -> Result<Arc<CudarcAttention>> {
        let mut all = ATTENTIONS.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(a) = all.iter().find(|a| Arc::ptr_eq(a.stream(), &stream)) {
            return Ok(a.clone());
        }
        let attention = Arc::new(crate::attention_on(stream).map_err(candle_core::Error::wrap)?);
        all.push(attention.clone());
        Ok(attention)
    }

    /// The tensor's elements from its storage offset on, and its strides: the view the kernels
    /// read in place (the last dimension is contiguous: `flash_attn` and `bwd` made it so).
    fn data<'s, T: CudaDType>(
        s: &'s CudaStorage,
        l: &Layout,
    ) -> Result<(CudaView<'s, T>, Strides)> {
        let stride = l.stride();
        if stride.len() != 4 || stride[3] != 1 {
            candle_core::bail!("flash_attn: a view with strides {stride:?} (the last must be 1)");
        }
        let slice = s.as_cuda_slice::<T>()?;
        let view = slice.slice(l.start_offset()..);
        let strides = Strides {
            batch: stride[0],
            seq: stride[1],
            head: stride[2],
        };
        Ok((view, strides))
    }

    fn wrap(e: crate::AttentionError) -> candle_core::Error {
        candle_core::Error::wrap(e)
    }

    pub(super) fn forward<T: CudaDType + Element>(
        op: &FlashAttention,
        [(s1, l1), (s2, l2), (s3, l3)]: [(&CudaStorage, &Layout); 3],
    ) -> Result<(CudaStorage, Shape)> {
        let shape = attention_shape(l1.dims(), l2.dims(), l3.dims())?;
        let device = s1.device.clone();
        let attention = attention_for(device.cuda_stream())?;
        let stream = attention.stream();
        let (q, k, v) = (data::<T>(s1, l1)?, data::<T>(s2, l2)?, data::<T>(s3, l3)?);
        let q = TensorRef::new(&q.0, stream).strided(q.1);
        let k = TensorRef::new(&k.0, stream).strided(k.1);
        let v = TensorRef::new(&v.0, stream).strided(v.1);
        let out = attention
            .forward_views::<T>(&shape, [&q, &k, &v], &op.options)
            .map_err(wrap)?;
        *op.lse.lock().unwrap_or_else(PoisonError::into_inner) = Some(out.lse);
        let o_dims = [l1.dims()[0], l1.dims()[1], l1.dims()[2], l3.dims()[3]];
        Ok((T::wrap_cuda_slice(out.o, device), Shape::from(&o_dims[..])))
    }

    pub(super) fn backward<T: CudaDType + Element>(
        op: &FlashAttention,
        tensors: [&Tensor; 5],
    ) -> Result<[Tensor; 3]> {
        let [q, k, v, ..] = tensors;
        let shape = attention_shape(q.dims(), k.dims(), v.dims())?;
        let guards = tensors.map(|t| t.storage_and_layout());
        let mut storages = Vec::with_capacity(5);
        for (storage, layout) in &guards {
            match &**storage {
                Storage::Cuda(s) => storages.push((s, *layout)),
                _ => {
                    candle_core::bail!("flash_attn's backward: a tensor is not on the CUDA device")
                }
            }
        }
        let device = storages[0].0.device.clone();
        let attention = attention_for(device.cuda_stream())?;
        let stream = attention.stream();
        let views = storages
            .iter()
            .map(|(s, l)| data::<T>(s, l))
            .collect::<Result<Vec<_>>>()?;
        let refs = views
            .iter()
            .map(|(view, strides)| TensorRef::new(view, stream).strided(*strides))
            .collect::<Vec<_>>();
        let lse = op.lse.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(lse) = lse.as_ref() else {
            candle_core::bail!("flash_attn's backward: the forward's LSE is missing");
        };
        let lse = TensorRef::new(lse, stream);
        let inputs = BackwardViews {
            q: &refs[0],
            k: &refs[1],
            v: &refs[2],
            o: &refs[3],
            d_o: &refs[4],
            lse: &lse,
        };
        let grads = attention
            .backward_views::<T>(&shape, inputs, &op.options)
            .map_err(wrap)?;
        let tensor = |slice, dims: &[usize]| {
            let storage = Storage::Cuda(T::wrap_cuda_slice(slice, device.clone()));
            Tensor::from_storage(storage, dims, BackpropOp::none(), false)
        };
        Ok([
            tensor(grads.dq, q.dims()),
            tensor(grads.dk, k.dims()),
            tensor(grads.dv, v.dims()),
        ])
    }
}
