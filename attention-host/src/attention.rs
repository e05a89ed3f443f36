//! The entry points: one per direction. Each validates the call once ([`Problem`]), asks
//! [`plan::select`] for the family and instance, checks the tensors, and hands the launch to that
//! family's launcher.
//!
//! `forward` / `backward` allocate their outputs; `forward_into` / `backward_into` launch into
//! buffers the caller owns (timing loops, poisoned test outputs). None of them waits: the kernels
//! are queued on the GPU's stream, as the allocations and frees of the library's buffers are, so a
//! buffer dropped early is freed only after the work that reads it. Reading a result back
//! (`to_f32`, `to_vec`) or [`Gpu::synchronize`] waits, and reports a fault of the queued kernels.

use attention_kernels::abi::layout::KeyPages;
use attention_kernels::abi::params::{BackwardStrides, ForwardStrides};
use attention_kernels::abi::shape::AttentionShape;

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::family::Direction;
use crate::flash_options::FlashOptions;
use crate::plan::{self, DeviceCaps, Plan, Tiles};
use crate::problem::Problem;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use crate::runtime::{Gpu, Queue};
use crate::tensors::{BackwardInputs, GradientBuffers, Workspace, check_qkv};

/// O (`[batch, n_q, heads_q, head_dim]`, the inputs' dtype), LSE (f32 `[batch, heads_q, n_q]`,
/// natural log, `−∞` for rows with no allowed key), and the plan that computed them.
pub struct ForwardOutput {
    pub o: DeviceTensor,
    pub lse: DeviceF32,
    pub plan: Plan,
}

/// dQ (Q's layout), dK and dV (K/V's layout, summed over each KV head's query heads) in the
/// inputs' dtype, the sink gradients (f32 `[heads_q]`) when the call has sink logits, and the
/// plan that computed them.
pub struct Gradients {
    pub dq: DeviceTensor,
    pub dk: DeviceTensor,
    pub dv: DeviceTensor,
    pub d_sinks: Option<DeviceF32>,
    pub plan: Plan,
}

/// The plan [`forward`] or [`backward`] would run on `gpu` for this call.
pub fn plan(
    gpu: &Gpu,
    shape: &AttentionShape,
    dtype: DType,
    options: &FlashOptions,
    direction: Direction,
) -> Result<Plan> {
    choose(gpu, &Problem::new(shape, dtype, options)?, direction, None)
}

/// O and LSE of `softmax(mask(τ·QKᵀ)) · V` with dropout, on the fastest family that can run the
/// call (or the one `options.kernel` names). Returns once the kernels are queued (see the module
/// docs).
pub fn forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    options: &FlashOptions,
) -> Result<ForwardOutput> {
    forward_with_lengths(gpu, shape, [q, k, v], options, None)
}

/// As [`forward`]; with `device_key_lengths` (a KV cache's, equal to `options`' `KeyLengths`),
/// the kernels read the key lengths there instead of an upload of them.
pub(crate) fn forward_with_lengths(
    gpu: &Gpu,
    shape: &AttentionShape,
    [q, k, v]: [&DeviceTensor; 3],
    options: &FlashOptions,
    device_key_lengths: Option<u64>,
) -> Result<ForwardOutput> {
    let (problem, plan) =
        prepare_forward(gpu, shape, None, [q, k, v], options, device_key_lengths)?;
    let out = ForwardOutput {
        o: DeviceTensor::uninitialized(problem.dtype, shape.o_elems())?,
        lse: DeviceF32::uninitialized(shape.row_elems())?,
        plan,
    };
    let workspace = Workspace::on_own_queue(gpu, &out.plan)?;
    launch_forward(
        &Queue::own(gpu),
        &problem,
        &out.plan,
        q,
        k,
        v,
        &out.o,
        &out.lse,
        &workspace,
    )?;
    Ok(out)
}

/// As [`forward`], into `o` and `lse` the caller owns. Returns the plan it ran.
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
    forward_into_tiles(gpu, shape, None, q, k, v, o, lse, options, None)
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
    forward_into_tiles(gpu, shape, Some(tiles), q, k, v, o, lse, options, None)
}

/// As [`forward_into`], on `tiles` if given, with key lengths as [`forward_with_lengths`] takes
/// them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward_into_tiles(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Option<Tiles>,
    q: &DeviceTensor,
    k: &DeviceTensor,
    v: &DeviceTensor,
    o: &DeviceTensor,
    lse: &DeviceF32,
    options: &FlashOptions,
    device_key_lengths: Option<u64>,
) -> Result<Plan> {
    let (problem, plan) =
        prepare_forward(gpu, shape, tiles, [q, k, v], options, device_key_lengths)?;
    check_tensor("o", o, problem.dtype, shape.o_elems())?;
    check_lse(lse, shape)?;
    let workspace = Workspace::on_own_queue(gpu, &plan)?;
    launch_forward(
        &Queue::own(gpu),
        &problem,
        &plan,
        q,
        k,
        v,
        o,
        lse,
        &workspace,
    )?;
    Ok(plan)
}

/// dQ, dK, dV of `⟨dO, O⟩` with O from [`forward`] with the same options (the backward may run on
/// another family than the forward did). Returns once the kernels are queued.
pub fn backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    inputs: &BackwardInputs,
    options: &FlashOptions,
) -> Result<Gradients> {
    let (problem, plan) = prepare_backward(gpu, shape, None, inputs, options)?;
    let out = GradientBuffers {
        dq: DeviceTensor::uninitialized(problem.dtype, shape.q_elems())?,
        dk: DeviceTensor::uninitialized(problem.dtype, shape.k_elems())?,
        dv: DeviceTensor::uninitialized(problem.dtype, shape.v_elems())?,
        d_sinks: match options.attention.sinks {
            Some(_) => Some(DeviceF32::uninitialized(shape.heads_q as usize)?),
            None => None,
        },
    };
    let workspace = Workspace::new(&plan)?;
    launch_backward(&Queue::own(gpu), &problem, &plan, inputs, &out, &workspace)?;
    Ok(Gradients {
        dq: out.dq,
        dk: out.dk,
        dv: out.dv,
        d_sinks: out.d_sinks,
        plan,
    })
}

/// As [`backward`], into buffers and a workspace (made for [`plan()`]'s result) the caller owns,
/// Returns the plan it ran.
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
    let (problem, plan) = prepare_backward(gpu, shape, tiles, inputs, options)?;
    check_tensor("dq", &out.dq, problem.dtype, shape.q_elems())?;
    check_tensor("dk", &out.dk, problem.dtype, shape.k_elems())?;
    check_tensor("dv", &out.dv, problem.dtype, shape.v_elems())?;
    check_d_sinks(&problem, out)?;
    workspace.check(&plan)?;
    launch_backward(&Queue::own(gpu), &problem, &plan, inputs, out, workspace)?;
    Ok(plan)
}

/// The validated forward call and its plan, before anything is allocated.
fn prepare_forward(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Option<Tiles>,
    [q, k, v]: [&DeviceTensor; 3],
    options: &FlashOptions,
    device_key_lengths: Option<u64>,
) -> Result<(Problem, Plan)> {
    check_owned_context(gpu)?;
    let mut problem = Problem::new(shape, q.dtype(), options)?;
    if let Some(lengths) = device_key_lengths {
        problem = problem.with_device_key_lengths(lengths);
    }
    check_qkv(shape, q, k, v)?;
    let plan = choose(gpu, &problem, Direction::Forward, tiles)?;
    Ok((problem, plan))
}

/// The validated backward call and its plan, before anything is allocated.
fn prepare_backward(
    gpu: &Gpu,
    shape: &AttentionShape,
    tiles: Option<Tiles>,
    inputs: &BackwardInputs,
    options: &FlashOptions,
) -> Result<(Problem, Plan)> {
    check_owned_context(gpu)?;
    let problem = Problem::new(shape, inputs.q.dtype(), options)?;
    check_backward_inputs(&problem, inputs)?;
    let plan = choose(gpu, &problem, Direction::Backward, tiles)?;
    Ok((problem, plan))
}

/// The library's own buffers live in device 0's primary context: a `Gpu` of another context
/// ([`Gpu::on_device`], [`Gpu::for_context`]) runs the entry points of [`crate::stream_api`]
/// (and [`crate::merge::merge_on`]).
pub(crate) fn check_owned_context(gpu: &Gpu) -> Result<()> {
    let context = gpu.context();
    if context.ordinal() != 0 || !context.is_primary() {
        return Err(invalid!(
            "DeviceTensor buffers live in device 0's primary context, this Gpu is on device {}{}: use forward_on / backward_on with the caller's memory",
            context.ordinal(),
            if context.is_primary() {
                ""
            } else {
                " (not its primary context)"
            }
        ));
    }
    Ok(())
}

/// The plan of `problem`: [`plan::select`]'s, or the one of the given tuning `tiles`.
pub(crate) fn choose(
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

/// Whether `plan`'s kernels take per-tensor strides (the tensor-core families); the others read
/// and write contiguous tensors only.
pub(crate) fn takes_strides(plan: &Plan) -> bool {
    matches!(
        plan.tiles,
        Tiles::Sm80Forward(_)
            | Tiles::Sm90Forward(_)
            | Tiles::Sm80Backward(_)
            | Tiles::Sm90Backward(_)
    )
}

/// Launches the forward of `plan` on contiguous tensors.
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
) -> Result<()> {
    let strides = ForwardStrides::contiguous(&problem.shape);
    launch_forward_strided(queue, problem, plan, [q, k, v], o, lse, workspace, &strides)
}

/// Launches the forward of `plan` on tensors with `strides` (the caller checked every view's
/// rows against its memory); only a family that [`takes_strides`] takes non-contiguous ones.
#[allow(clippy::too_many_arguments)]
pub(crate) fn launch_forward_strided(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    [q, k, v]: [&DeviceTensor; 3],
    o: &DeviceTensor,
    lse: &DeviceF32,
    workspace: &Workspace,
    strides: &ForwardStrides,
) -> Result<()> {
    if !takes_strides(plan) && *strides != ForwardStrides::contiguous(&problem.shape) {
        return Err(invalid!(
            "{:?} reads contiguous tensors only: stage the strided views first",
            plan.family
        ));
    }
    match plan.tiles {
        Tiles::Exact(blocks) => crate::families::exact::forward::launch_forward(
            queue, problem, plan, blocks, q, k, v, o, lse, workspace,
        ),
        Tiles::Sm80Forward(_) | Tiles::Sm90Forward(_) => {
            crate::families::tensor_core::forward::launch_forward(
                queue,
                problem,
                plan,
                [q, k, v],
                o,
                lse,
                strides,
            )
        }
        Tiles::Decode(_) => crate::families::decode::launch_forward(
            queue,
            problem,
            plan,
            q,
            k,
            v,
            o,
            lse,
            workspace,
            KeyPages::CONTIGUOUS,
        ),
        Tiles::Sm80Backward(_) | Tiles::Sm90Backward(_) => {
            unreachable!("plan::select gave a backward plan for a forward")
        }
    }
}

/// Launches the backward of `plan` on contiguous tensors.
pub(crate) fn launch_backward(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
) -> Result<()> {
    let strides = BackwardStrides::contiguous(&problem.shape);
    launch_backward_strided(queue, problem, plan, inputs, out, workspace, &strides)
}

/// As [`launch_forward_strided`], for the backward.
pub(crate) fn launch_backward_strided(
    queue: &Queue,
    problem: &Problem,
    plan: &Plan,
    inputs: &BackwardInputs,
    out: &GradientBuffers,
    workspace: &Workspace,
    strides: &BackwardStrides,
) -> Result<()> {
    if !takes_strides(plan) && *strides != BackwardStrides::contiguous(&problem.shape) {
        return Err(invalid!(
            "{:?} reads contiguous tensors only: stage the strided views first",
            plan.family
        ));
    }
    match plan.tiles {
        Tiles::Exact(blocks) => crate::families::exact::backward::launch_backward(
            queue, problem, plan, blocks, inputs, out, workspace,
        ),
        Tiles::Sm80Backward(_) | Tiles::Sm90Backward(_) => {
            crate::families::tensor_core::backward::launch_backward(
                queue, problem, plan, inputs, out, workspace, strides,
            )
        }
        Tiles::Sm80Forward(_) | Tiles::Sm90Forward(_) | Tiles::Decode(_) => {
            unreachable!("plan::select gave a forward plan for a backward")
        }
    }
}

pub(crate) fn check_tensor(name: &str, t: &DeviceTensor, dtype: DType, want: usize) -> Result<()> {
    if t.dtype() != dtype || t.len() != want {
        return Err(invalid!(
            "{name} must be {dtype} with {want} elements, it is {} with {}",
            t.dtype(),
            t.len()
        ));
    }
    Ok(())
}

/// A call with sink logits writes their gradients: the buffers must hold `heads_q` f32 for them.
pub(crate) fn check_d_sinks(problem: &Problem, out: &GradientBuffers) -> Result<()> {
    let heads = problem.shape.heads_q as usize;
    match (&problem.options.attention.sinks, &out.d_sinks) {
        (None, _) => Ok(()),
        (Some(_), Some(d)) if d.len() == heads => Ok(()),
        (Some(_), d) => Err(invalid!(
            "a call with sink logits needs d_sinks of {heads} f32 (GradientBuffers::with_d_sinks), got {}",
            d.as_ref()
                .map_or("none".to_owned(), |d| format!("{} f32", d.len()))
        )),
    }
}

pub(crate) fn check_lse(lse: &DeviceF32, shape: &AttentionShape) -> Result<()> {
    if lse.len() != shape.row_elems() {
        return Err(invalid!(
            "lse must hold {} f32 ([batch, heads_q, n_q]), it holds {}",
            shape.row_elems(),
            lse.len()
        ));
    }
    Ok(())
}

fn check_backward_inputs(problem: &Problem, i: &BackwardInputs) -> Result<()> {
    check_qkv(&problem.shape, i.q, i.k, i.v)?;
    check_tensor("o", i.o, problem.dtype, problem.shape.o_elems())?;
    check_tensor("d_o", i.d_o, problem.dtype, problem.shape.o_elems())?;
    check_lse(i.lse, &problem.shape)
}
