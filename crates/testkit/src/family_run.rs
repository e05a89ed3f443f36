//! One case on one kernel family, as the GPU matrices run it: the public entry points
//! (`forward_into`, `backward_into`) into NaN-poisoned outputs, the backward fed O and LSE from the
//! f64 reference (O rounded to the dtype) so each pass is checked on its own.

use flash_attn::{
    AttentionShape, BackwardInputs, DType, DeviceF32, DeviceTensor, Direction, FlashOptions, Gpu,
    GradientBuffers, Workspace,
};

/// A case's inputs (already rounded to the dtype) and the reference forward's O and LSE.
pub struct HostCase<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub d_o: &'a [f32],
    pub o: &'a [f64],
    pub lse: &'a [f64],
}

/// What one family wrote, downloaded.
pub struct Outputs {
    pub o: Vec<f32>,
    pub lse: Vec<f32>,
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    /// The sink gradients, for a call with sink logits.
    pub d_sinks: Option<Vec<f32>>,
}

/// Forward and backward of `case` with `options` (whose `kernel` names the family); `None` where
/// the plan refuses the call in either direction. Any other failure panics.
pub fn run_case(
    gpu: &Gpu,
    shape: &AttentionShape,
    options: &FlashOptions,
    dt: DType,
    case: &HostCase,
) -> Option<Outputs> {
    let bwd_plan = flash_attn::plan(gpu, shape, dt, options, Direction::Backward).ok()?;
    let up = |x: &[f32]| DeviceTensor::from_f32(dt, x).unwrap();
    let (q, k, v, d_o) = (up(case.q), up(case.k), up(case.v), up(case.d_o));
    let (o, lse) = forward_on(gpu, shape, options, dt, (&q, &k, &v))?;

    let o_ref: Vec<f32> = case.o.iter().map(|&x| dt.round(x as f32)).collect();
    let lse_ref: Vec<f32> = case.lse.iter().map(|&x| x as f32).collect();
    let (o_in, lse_in) = (up(&o_ref), DeviceF32::from_slice(&lse_ref).unwrap());
    let inputs = BackwardInputs {
        q: &q,
        k: &k,
        v: &v,
        o: &o_in,
        d_o: &d_o,
        lse: &lse_in,
    };
    let mut grads = GradientBuffers::poisoned(shape, dt).unwrap();
    if options.attention.sinks.is_some() {
        grads = grads.with_d_sinks(shape).unwrap();
    }
    let workspace = Workspace::new(&bwd_plan).unwrap();
    flash_attn::backward_into(gpu, shape, &inputs, &grads, &workspace, options).unwrap();
    gpu.synchronize().unwrap();
    Some(Outputs {
        o,
        lse,
        dq: grads.dq.to_f32().unwrap(),
        dk: grads.dk.to_f32().unwrap(),
        dv: grads.dv.to_f32().unwrap(),
        d_sinks: grads.d_sinks.map(|d| d.to_vec().unwrap()),
    })
}

/// `forward_into` into NaN-poisoned O and LSE, checked to run the plan `plan` gives.
fn forward_on(
    gpu: &Gpu,
    shape: &AttentionShape,
    options: &FlashOptions,
    dt: DType,
    (q, k, v): (&DeviceTensor, &DeviceTensor, &DeviceTensor),
) -> Option<(Vec<f32>, Vec<f32>)> {
    let fwd_plan = flash_attn::plan(gpu, shape, dt, options, Direction::Forward).ok()?;
    let o = DeviceTensor::poisoned(dt, shape.o_elems()).unwrap();
    let lse = DeviceF32::poisoned(shape.row_elems()).unwrap();
    let ran = flash_attn::forward_into(gpu, shape, q, k, v, &o, &lse, options).unwrap();
    assert_eq!(
        ran, fwd_plan,
        "forward_into ran another plan than plan() gave"
    );
    gpu.synchronize().unwrap();
    Some((o.to_f32().unwrap(), lse.to_vec().unwrap()))
}
