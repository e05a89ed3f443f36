//! The entry points: one per direction. Each validates the call once ([`Problem`]), asks
//! [`plan::select`] for the family and instance, checks the tensors, and hands the launch to that
//! family's launcher.
//!
//! `forward` / `backward` allocate their outputs and wait; `forward_into` / `backward_into` launch
//! into buffers the caller owns and return without waiting (timing loops, poisoned test outputs).

use attention_kernels::abi::shape::AttentionShape;

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::flash_options::FlashOptions;
use crate::plan::{self, DeviceCaps, Direction, Plan, Tiles};
use crate::problem::Problem;
use crate::runtime::Gpu;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};

/// O (`[batch, n_q, heads_q, head_dim]`, the inputs' dtype), LSE (f32 `[batch, heads_q, n_q]`,
/// natural log, `−∞` for rows with no allowed key), and the plan that computed them.
pub struct ForwardOutput {
    pub o: DeviceTensor,
    pub lse: DeviceF32,
    pub plan: Plan,
}

/// dQ (Q's layout), dK and dV (K/V's layout, summed over each KV head's query heads) in the
/// inputs' dtype, and the plan that computed them.
pub struct Gradients {
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
    pub plan: Plan,
}

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

/// Buffers the backward writes: dQ in Q's layout, dK and dV in K/V's, the inputs' dtype.
pub struct GradientBuffers {
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
}

impl GradientBuffers {
    /// NaN-poisoned buffers for `shape`, so an element the kernels fail to write shows.
    pub fn poisoned(shape: &AttentionShape, dtype: DType) -> Result<GradientBuffers> {
        crate::options::validate_shape(shape)?;
        Ok(GradientBuffers {
            dq: DeviceTensor::poisoned(dtype, shape.q_elems())?,
            dk: DeviceTensor::poisoned(dtype, shape.kv_elems())?,
            dv: DeviceTensor::poisoned(dtype, shape.kv_elems())?,
        })
    }
}

/// The device scratch of one plan (its named f32 pieces, [`Plan::workspace`]), reusable by every
/// call with the same plan.
pub struct Workspace {
    pieces: Vec<(&'static str, u64)>,
    buffer: Option<DeviceF32>,
}

impl Workspace {
    /// Allocates the scratch `plan` needs (none for most forwards). Every call writes the pieces
    /// it reads before reading them.
    pub fn new(plan: &Plan) -> Result<Workspace> {
        let bytes = plan.workspace_bytes();
        let buffer = match bytes {
            0 => None,
            _ => {
                let floats = usize::try_from(bytes / 4)
                    .map_err(|_| invalid!("a workspace of {bytes} bytes does not fit in memory"))?;
                Some(DeviceF32::uninitialized(floats)?)
            }
        };
        Ok(Workspace {
            pieces: plan.workspace.clone(),
            buffer,
        })
    }

    /// Bytes of device memory the workspace holds.
    pub fn size_bytes(&self) -> u64 {
        self.pieces.iter().map(|(_, b)| b).sum()
    }

    fn check(&self, plan: &Plan) -> Result<()> {
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

/// The plan [`forward`] or [`backward`] would run on `gpu` for this call.
pub fn plan(
    gpu: &Gpu,
    shape: &AttentionShape,
    dtype: DType,
    options: &FlashOptions,
    direction: Direction,
) -> Result<Plan> {
    let problem = Problem::new(shape, dtype, options)?;
    plan::select(&DeviceCaps::of(gpu)?, &problem, direction)
}

/// O and LSE of `softmax(mask(τ·QKᵀ)) · V` with dropout, on the fastest family that can run the
/// call (or the one `options.kernel` names); waits for the result.
pub fn forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    options: &FlashOptions,
) -> Result<ForwardOutput> {
    let problem = Problem::new(shape, q.dtype(), options)?;
    check_qkv(&problem, q, k, v)?;
    let plan = plan::select(&DeviceCaps::of(gpu)?, &problem, Direction::Forward)?;
    let out = ForwardOutput {
        o: DeviceTensor::uninitialized(problem.dtype, shape.q_elems())?,
        lse: DeviceF32::uninitialized(shape.row_elems())?,
        plan,
    };
    let workspace = Workspace::new(&out.plan)?;
    launch_forward(
        gpu, &problem, &out.plan, q, k, v, &out.o, &out.lse, &workspace,
    )?;
    gpu.synchronize()?;
    Ok(out)
}

/// As [`forward`], into `o` and `lse` the caller owns, without waiting. Returns the plan it ran.
#[allow(clippy::too_many_arguments)]
pub fn forward_into(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    options: &FlashOptions,
) -> Result<Plan> {
    forward_into_tiles(gpu, shape, None, q, k, v, o, lse, options)
}

/// As [`forward_into`] on one of the compiled tensor-core instances other than the default
/// ([`plan::with_tiles`]), for comparing tuning candidates.
#[allow(clippy::too_many_arguments)]
pub fn forward_variant_into(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Tiles,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    options: &FlashOptions,
) -> Result<Plan> {
    forward_into_tiles(gpu, shape, Some(tiles), q, k, v, o, lse, options)
}

#[allow(clippy::too_many_arguments)]
fn forward_into_tiles(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Option<Tiles>,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    options: &FlashOptions,
) -> Result<Plan> {
    let problem = Problem::new(shape, q.dtype(), options)?;
    check_qkv(&problem, q, k, v)?;
    check_tensor("o", o, problem.dtype, shape.q_elems())?;
    check_lse(lse, shape)?;
    let plan = choose(gpu, &problem, Direction::Forward, tiles)?;
    let workspace = Workspace::new(&plan)?;
    launch_forward(gpu, &problem, &plan, q, k, v, o, lse, &workspace)?;
    Ok(plan)
}

/// dQ, dK, dV of `⟨dO, O⟩` with O from [`forward`] with the same options (the backward may run on
/// another family than the forward did); waits for the result.
pub fn backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    options: &FlashOptions,
) -> Result<Gradients> {
    let problem = Problem::new(shape, inputs.q.dtype(), options)?;
    check_backward_inputs(&problem, inputs)?;
    let plan = plan::select(&DeviceCaps::of(gpu)?, &problem, Direction::Backward)?;
    let out = GradientBuffers {
        dq: DeviceTensor::uninitialized(problem.dtype, shape.q_elems())?,
        dk: DeviceTensor::uninitialized(problem.dtype, shape.kv_elems())?,
        dv: DeviceTensor::uninitialized(problem.dtype, shape.kv_elems())?,
    };
    let workspace = Workspace::new(&plan)?;
    launch_backward(gpu, &problem, &plan, inputs, &out, &workspace)?;
    gpu.synchronize()?;
    Ok(Gradients {
        dq: out.dq,
        dk: out.dk,
        dv: out.dv,
        plan,
    })
}

/// As [`backward`], into buffers and a workspace (made for [`plan`]'s result) the caller owns,
/// without waiting. Returns the plan it ran.
pub fn backward_into(
    gpu: &Gpu,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
    options: &FlashOptions,
) -> Result<Plan> {
    backward_into_tiles(gpu, shape, None, inputs, out, workspace, options)
}

/// As [`backward_into`] on one of the compiled tensor-core instances other than the default
/// ([`plan::with_tiles`]), for comparing tuning candidates.
pub fn backward_variant_into(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Tiles,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
    options: &FlashOptions,
) -> Result<Plan> {
    backward_into_tiles(gpu, shape, Some(tiles), inputs, out, workspace, options)
}

fn backward_into_tiles(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Option<Tiles>,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
    options: &FlashOptions,
) -> Result<Plan> {
    let problem = Problem::new(shape, inputs.q.dtype(), options)?;
    check_backward_inputs(&problem, inputs)?;
    check_tensor("dq", &out.dq, problem.dtype, shape.q_elems())?;
    check_tensor("dk", &out.dk, problem.dtype, shape.kv_elems())?;
    check_tensor("dv", &out.dv, problem.dtype, shape.kv_elems())?;
    let plan = choose(gpu, &problem, Direction::Backward, tiles)?;
    workspace.check(&plan)?;
    launch_backward(gpu, &problem, &plan, inputs, out, workspace)?;
    Ok(plan)
}

/// The plan of `problem`: [`plan::select`]'s, or the one of the given tuning `tiles`.
fn choose(
    gpu: &Gpu,
    problem: &Problem,
    direction: Direction,
    tiles: Option<Tiles>,
) -> Result<Plan> {
    let device = DeviceCaps::of(gpu)?;
    match tiles {
        None => plan::select(&device, problem, direction),
        Some(tiles) => plan::with_tiles(&device, problem, direction, tiles),
    }
}

#[allow(clippy::too_many_arguments)]
fn launch_forward(
    gpu: &Gpu,
    problem: &Problem,
    plan: &Plan,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    workspace: &Workspace,
) -> Result<()> {
    match plan.tiles {
        Tiles::Exact(blocks) => crate::families::exact::forward::launch_forward(
            gpu, problem, plan, blocks, q, k, v, o, lse, workspace,
        ),
        Tiles::Sm80Forward(_) | Tiles::Sm90Forward(_) => {
            crate::families::tensor_core::forward::launch_forward(
                gpu, problem, plan, q, k, v, o, lse,
            )
        }
        Tiles::Sm80Backward(_) | Tiles::Sm90Backward(_) => {
            unreachable!("plan::select gave a backward plan for a forward")
        }
    }
}

fn launch_backward(
    gpu: &Gpu,
    problem: &Problem,
    plan: &Plan,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
) -> Result<()> {
    match plan.tiles {
        Tiles::Exact(blocks) => crate::families::exact::backward::launch_backward(
            gpu, problem, plan, blocks, inputs, out, workspace,
        ),
        Tiles::Sm80Backward(_) | Tiles::Sm90Backward(_) => {
            crate::families::tensor_core::backward::launch_backward(
                gpu, problem, plan, inputs, out, workspace,
            )
        }
        Tiles::Sm80Forward(_) | Tiles::Sm90Forward(_) => {
            unreachable!("plan::select gave a forward plan for a backward")
        }
    }
}

fn check_tensor(name: &str, t: &DeviceTensor, dtype: DType, want: usize) -> Result<()> {
    if t.dtype() != dtype || t.len() != want {
        return Err(invalid!(
            "{name} must be {dtype} with {want} elements, it is {} with {}",
            t.dtype(),
            t.len()
        ));
    }
    Ok(())
}

fn check_lse(lse: &DeviceF32, shape: &AttentionShape) -> Result<()> {
    if lse.len() != shape.row_elems() {
        return Err(invalid!(
            "lse must hold {} f32 ([batch, heads_q, n_q]), it holds {}",
            shape.row_elems(),
            lse.len()
        ));
    }
    Ok(())
}

fn check_qkv(
    problem: &Problem,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
) -> Result<()> {
    let s = &problem.shape;
    check_tensor("q", q, problem.dtype, s.q_elems())?;
    check_tensor("k", k, problem.dtype, s.kv_elems())?;
    check_tensor("v", v, problem.dtype, s.kv_elems())
}

fn check_backward_inputs(problem: &Problem, i: &BackwardInputs) -> Result<()> {
    check_qkv(problem, i.q, i.k, i.v)?;
    check_tensor("o", i.o, problem.dtype, problem.shape.q_elems())?;
    check_tensor("d_o", i.d_o, problem.dtype, problem.shape.q_elems())?;
    check_lse(i.lse, &problem.shape)
}
