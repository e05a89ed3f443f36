//! What one call reads and writes besides Q, K, V: the backward's saved state and incoming
//! gradient, the gradient buffers, and the device scratch a plan asks for.

use std::sync::Arc;

use attention_kernels::abi::shape::AttentionShape;
use cudarc::driver::CudaStream;

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::plan::{Plan, SPLIT_COUNTERS};
use crate::runtime::Gpu;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};

/// The saved forward state and the incoming gradient: `o` and `d_o` in the dtype of `q`, `lse`
/// f32 `[batch, heads_q, n_q]` in natural log, as the forward with the same options wrote them.
#[derive(Clone, Copy)]
pub struct BackwardInputs<'a> {
    pub q: &'a DeviceTensor,
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    pub o: &'a DeviceTensor,
    pub d_o: &'a DeviceTensor,
    pub lse: &'a DeviceF32,
}

/// Buffers the backward writes: dQ in Q's layout, dK and dV in K/V's, the inputs' dtype; the
/// sink gradients (f32 `[heads_q]`), which a call with sink logits needs and no other writes.
pub struct GradientBuffers {
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
    pub d_sinks: Option<DeviceF32>,
}

impl GradientBuffers {
    /// NaN-poisoned buffers for `shape`, so an element the kernels fail to write shows; no sink
    /// gradients ([`GradientBuffers::with_d_sinks`] adds them).
    pub fn poisoned(shape: &AttentionShape, dtype: DType) -> Result<GradientBuffers> {
        crate::options::validate_shape(shape)?;
        Ok(GradientBuffers {
            dq: DeviceTensor::poisoned(dtype, shape.q_elems())?,
            dk: DeviceTensor::poisoned(dtype, shape.k_elems())?,
            dv: DeviceTensor::poisoned(dtype, shape.v_elems())?,
            d_sinks: None,
        })
    }

    /// The buffers with NaN-poisoned sink gradients for `shape.heads_q` heads.
    pub fn with_d_sinks(mut self, shape: &AttentionShape) -> Result<GradientBuffers> {
        self.d_sinks = Some(DeviceF32::poisoned(shape.heads_q as usize)?);
        Ok(self)
    }
}

/// The device scratch of one plan (its named f32 pieces, [`Plan::workspace`]), reusable by every
/// call with the same plan.
pub struct Workspace {
    pieces: Vec<(&'static str, u64)>,
    buffer: Option<DeviceF32>,
    /// Where the split counters are when not in `buffer`: the `Gpu`'s own
    /// ([`Workspace::on_own_queue`]).
    counters: Option<u64>,
    /// The stream the buffer is freed on ([`Workspace::on_stream`]), kept alive until then
    /// (fields drop in order: the buffer first).
    _stream: Option<Arc<CudaStream>>,
}

impl Workspace {
    /// Allocates the scratch `plan` needs (none for most forwards). Every call writes the pieces
    /// it reads before reading them, except the decode family's split counters, zeroed here.
    pub fn new(plan: &Plan) -> Result<Workspace> {
        Workspace::allocate(plan, DeviceF32::uninitialized)
    }

    /// As [`Workspace::new`], for one call on `gpu`'s own stream: the split counters are the
    /// `Gpu`'s, which need no fill per call.
    pub(crate) fn on_own_queue(gpu: &Gpu, plan: &Plan) -> Result<Workspace> {
        let words = plan
            .workspace
            .iter()
            .find(|(name, _)| *name == SPLIT_COUNTERS)
            .map(|&(_, bytes)| bytes as usize / 4);
        let counters = words.map(|w| gpu.own_split_counters(w)).transpose()?;
        let pieces = plan
            .workspace
            .iter()
            .filter(|(name, _)| *name != SPLIT_COUNTERS)
            .copied()
            .collect();
        let mut workspace = Workspace::from_pieces(pieces, DeviceF32::uninitialized)?;
        workspace.counters = counters;
        Ok(workspace)
    }

    /// The workspace of `plan` with its buffer from `alloc` (given the f32 count), its split
    /// counters zeroed.
    pub(crate) fn allocate(
        plan: &Plan,
        alloc: impl FnOnce(usize) -> Result<DeviceF32>,
    ) -> Result<Workspace> {
        let workspace = Workspace::from_pieces(plan.workspace.clone(), alloc)?;
        // The split counters start at zero; the kernels leave them so.
        let mut offset = 0;
        for &(name, bytes) in &workspace.pieces {
            if let (SPLIT_COUNTERS, Some(buffer)) = (name, &workspace.buffer) {
                buffer.zero_words((offset / 4) as usize, (bytes / 4) as usize)?;
            }
            offset += bytes;
        }
        Ok(workspace)
    }

    /// `pieces` in one buffer from `alloc`, as it left them.
    fn from_pieces(
        pieces: Vec<(&'static str, u64)>,
        alloc: impl FnOnce(usize) -> Result<DeviceF32>,
    ) -> Result<Workspace> {
        let bytes: u64 = pieces.iter().map(|(_, b)| b).sum();
        let buffer = match bytes {
            0 => None,
            _ => {
                let floats = usize::try_from(bytes / 4)
                    .map_err(|_| invalid!("a workspace of {bytes} bytes does not fit in memory"))?;
                Some(alloc(floats)?)
            }
        };
        Ok(Workspace {
            pieces,
            buffer,
            counters: None,
            _stream: None,
        })
    }

    /// The workspace, keeping `stream` (where its buffer is freed) alive as long as itself.
    pub(crate) fn keeping(mut self, stream: Arc<CudaStream>) -> Workspace {
        self._stream = Some(stream);
        self
    }

    /// Bytes of device memory the workspace holds.
    pub fn size_bytes(&self) -> u64 {
        self.pieces.iter().map(|(_, b)| b).sum()
    }

    pub(crate) fn check(&self, plan: &Plan) -> Result<()> {
        if self.pieces != plan.workspace {
            return Err(invalid!(
                "the workspace holds {:?}, the plan needs {:?}",
                self.pieces,
                plan.workspace
            ));
        }
        Ok(())
    }

    /// Device address of the piece `name`.
    pub(crate) fn piece(&self, name: &str) -> Result<u64> {
        if let (SPLIT_COUNTERS, Some(at)) = (name, self.counters) {
            return Ok(at);
        }
        let mut offset = 0;
        for (piece, bytes) in &self.pieces {
            if *piece == name {
                let base = self.buffer.as_ref().map_or(0, |b| b.device_ptr());
                return Ok(base + offset);
            }
            offset += bytes;
        }
        Err(invalid!("the workspace has no {name} piece"))
    }
}

/// Checks that `q`, `k`, `v` match `shape` and one dtype.
pub fn check_qkv(
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
) -> Result<()> {
    crate::options::validate_shape(shape)?;
    for (name, t, want) in [
        ("q", q, shape.q_elems()),
        ("k", k, shape.k_elems()),
        ("v", v, shape.v_elems()),
    ] {
        if t.len() != want {
            return Err(invalid!(
                "{name} holds {} elements, the shape {shape:?} needs {want}",
                t.len()
            ));
        }
        if t.dtype() != q.dtype() {
            return Err(invalid!("{name} is {} but q is {}", t.dtype(), q.dtype()));
        }
    }
    Ok(())
}
