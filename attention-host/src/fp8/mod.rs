//! The FP8 (e4m3) forward: Q, K and V stored as e4m3 bytes with per-head f32 descaling factors
//! (real value = factor · stored value; per-tensor factors are every head's the same), O in
//! bf16 and LSE in f32. It runs on the `wgmma` family only (`kernels::sm90::forward_fp8`,
//! compute capability 9.0: the 8-bit tensor-core products of sm_89 have no kernel here), at
//! d = 128, for plain calls: full-length sequences, causal or not, any scale; no lengths,
//! dropout, window or score modifiers. Everything else is refused with `InvalidInput`.
//!
//! [`reference()`] is the f64 reference on the dequantized inputs, which the GPU test bounds the
//! kernel's error against.

pub mod e4m3;

use attention_kernels::abi::layout::TensorStrides;
use attention_kernels::abi::params::{Fp8ForwardParams, TmaForwardParams};
use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::kernels::sm90::{Fp8Config, fp8_config};

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::families::tensor_core::tensor_map::{Operand, encode_bytes};
use crate::family::{Family, KernelChoice};
use crate::flash_options::FlashOptions;
use crate::options::Lengths;
use crate::problem::Problem;
use crate::reference;
use crate::runtime::buffer::{DeviceArray, DeviceF32, DeviceTensor};
use crate::runtime::{Gpu, LaunchConfig};

/// Descaling factors of Q (one per query head), K and V (one per K/V head).
#[derive(Clone, Debug, PartialEq)]
pub struct Fp8Descale {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

impl Fp8Descale {
    /// One factor per tensor, every head's.
    pub fn per_tensor(shape: &AttentionShape, q: f32, k: f32, v: f32) -> Fp8Descale {
        Fp8Descale {
            q: vec![q; shape.heads_q as usize],
            k: vec![k; shape.heads_kv as usize],
            v: vec![v; shape.heads_kv as usize],
        }
    }

    /// The factors the kernel reads: Q's, then K's, then V's.
    fn packed(&self) -> Vec<f32> {
        [&self.q, &self.k, &self.v]
            .into_iter()
            .flatten()
            .copied()
            .collect()
    }
}

/// An e4m3 tensor on the device, `[batch, seq, heads, head_dim]` contiguous, one byte each.
pub struct DeviceE4m3(DeviceArray<u8>);

impl DeviceE4m3 {
    /// Uploads e4m3 bytes (`e4m3::from_f32` makes them).
    pub fn from_bits(bits: &[u8]) -> Result<DeviceE4m3> {
        Ok(DeviceE4m3(DeviceArray::from_slice(bits)?))
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.len() == 0
    }
    pub fn device_ptr(&self) -> u64 {
        self.0.device_ptr()
    }
}

/// `x` (`[.., heads, head_dim]` rows) quantized per head: each head's factor makes its largest
/// magnitude e4m3's 448 (1 for an all-zero head). Returns the bytes and the factors.
pub fn quantize_per_head(x: &[f32], heads: u32, head_dim: u32) -> (Vec<u8>, Vec<f32>) {
    let (h, d) = (heads as usize, head_dim as usize);
    let mut amax = vec![0.0f32; h];
    for (i, v) in x.iter().enumerate() {
        let head = (i / d) % h;
        amax[head] = amax[head].max(v.abs());
    }
    let factors: Vec<f32> = amax
        .iter()
        .map(|&a| if a > 0.0 { a / e4m3::MAX } else { 1.0 })
        .collect();
    let bits = x
        .iter()
        .enumerate()
        .map(|(i, v)| e4m3::from_f32(v / factors[(i / d) % h]))
        .collect();
    (bits, factors)
}

/// The real values of e4m3 `bits` with per-head `factors` (`[.., heads, head_dim]`), in f64:
/// exact products of an e4m3 value and an f32.
pub fn dequantize(bits: &[u8], factors: &[f32], head_dim: u32) -> Vec<f64> {
    let (h, d) = (factors.len(), head_dim as usize);
    bits.iter()
        .enumerate()
        .map(|(i, &b)| e4m3::to_f32(b) as f64 * factors[(i / d) % h] as f64)
        .collect()
}

/// Checks an FP8 call on a device of compute capability `cc` (`wgmma`: its `sm_90a` module is
/// loaded) before anything is allocated: the problem as every call's, then what this forward
/// takes. Returns the kernel's tiles.
pub fn check(
    cc: (u32, u32),
    wgmma: bool,
    shape: &AttentionShape,
    descale: &Fp8Descale,
    options: &FlashOptions,
) -> Result<Fp8Config> {
    checked(cc, wgmma, shape, descale, options).map(|(config, _)| config)
}

/// [`check`], also returning the validated problem (its grid).
fn checked(
    cc: (u32, u32),
    wgmma: bool,
    shape: &AttentionShape,
    descale: &Fp8Descale,
    options: &FlashOptions,
) -> Result<(Fp8Config, Problem)> {
    if cc < (8, 9) {
        return Err(invalid!(
            "FP8 (e4m3) attention needs 8-bit tensor cores (compute capability 8.9 or newer); \
             this device is {}.{}",
            cc.0,
            cc.1
        ));
    }
    if cc != (9, 0) || !wgmma {
        return Err(invalid!(
            "the FP8 (e4m3) forward runs on the wgmma family only (compute capability 9.0 with \
             its sm_90a module); this device is {}.{}",
            cc.0,
            cc.1
        ));
    }
    match options.kernel {
        KernelChoice::Auto | KernelChoice::Only(Family::Sm90) => {}
        KernelChoice::Only(f) => {
            return Err(invalid!(
                "the {f} family has no FP8 (e4m3) forward; only sm90 (wgmma) runs it"
            ));
        }
    }
    let problem = Problem::new(shape, DType::Bf16, options)?;
    let a = &options.attention;
    if a.lengths != Lengths::Full
        || a.dropout.is_some()
        || a.window.is_some()
        || a.softcap.is_some()
        || a.alibi_slopes.is_some()
        || a.sinks.is_some()
    {
        return Err(invalid!(
            "the FP8 (e4m3) forward takes full-length sequences, causal or not, and no dropout, \
             window, softcap, ALiBi or sink logits"
        ));
    }
    let config = match fp8_config(shape.head_dim) {
        Some(c) if shape.head_dim_v == shape.head_dim => c,
        _ => {
            return Err(invalid!(
                "the FP8 (e4m3) forward is compiled for head dim 128 only (Q/K {}, V {})",
                shape.head_dim,
                shape.head_dim_v
            ));
        }
    };
    let lens = [
        ("Q", descale.q.len(), shape.heads_q),
        ("K", descale.k.len(), shape.heads_kv),
        ("V", descale.v.len(), shape.heads_kv),
    ];
    for (name, len, heads) in lens {
        if len != heads as usize {
            return Err(invalid!(
                "{name}'s descaling factors: {len} given, one per head ({heads}) expected"
            ));
        }
    }
    if let Some(f) = descale
        .packed()
        .into_iter()
        .find(|f| !f.is_finite() || *f <= 0.0)
    {
        return Err(invalid!(
            "descaling factors must be finite and positive, got {f}"
        ));
    }
    Ok((config, problem))
}

/// The launch of `config` for `problem`: a block per 128 query rows of each (head, sequence)
/// pair, the pairs on the grid's y and z as every family's (folded past 65,535 of either).
fn launch_config(config: &Fp8Config, problem: &Problem, shape: &AttentionShape) -> LaunchConfig {
    let (y, z) = problem.grid_yz(shape.heads_q);
    LaunchConfig {
        grid: (shape.n_q.div_ceil(config.block_rows()), y, z),
        block: (config.threads(), 1, 1),
        shared_bytes: config.shared_bytes(),
    }
}

/// The FP8 forward's results: O (bf16) and LSE, queued on the `Gpu`'s stream.
pub struct Fp8Forward {
    pub o: DeviceTensor,
    pub lse: DeviceF32,
}

/// The FP8 forward of e4m3 `q`, `k`, `v` (contiguous `[batch, seq, heads, head_dim]`) with
/// `descale`, without waiting. Refused with `InvalidInput` as [`check`] says, or where a tensor's
/// length is not its shape's.
pub fn forward_e4m3(
    gpu: &Gpu,
    shape: &AttentionShape,
    [q, k, v]: [&DeviceE4m3; 3],
    descale: &Fp8Descale,
    options: &FlashOptions,
) -> Result<Fp8Forward> {
    let (config, problem) = checked(
        gpu.compute_capability(),
        gpu.has_wgmma(),
        shape,
        descale,
        options,
    )?;
    for (name, t, len) in [
        ("Q", q, shape.q_elems()),
        ("K", k, shape.k_elems()),
        ("V", v, shape.v_elems()),
    ] {
        if t.len() != len {
            return Err(invalid!(
                "{name} holds {} e4m3 elements, its shape {len}",
                t.len()
            ));
        }
    }
    let o = DeviceTensor::uninitialized(DType::Bf16, shape.o_elems())?;
    let lse = DeviceF32::uninitialized(shape.row_elems())?;
    let factors = DeviceF32::from_slice(&descale.packed())?;
    let (d, a) = (shape.head_dim, &options.attention);
    let q_strides = TensorStrides::contiguous(shape.n_q, shape.heads_q, d);
    let kv_strides = TensorStrides::contiguous(shape.n_k, shape.heads_kv, d);
    let kv = |ptr| Operand {
        ptr,
        batch: shape.batch,
        rows: shape.n_k,
        heads: shape.heads_kv,
        head_dim: d,
        strides: kv_strides,
    };
    let params = Fp8ForwardParams {
        align: TmaForwardParams::default().align,
        k_map: encode_bytes(&kv(k.device_ptr()), config.block_keys)?,
        v_map: encode_bytes(&kv(v.device_ptr()), config.block_keys)?,
        q: q.device_ptr(),
        o: o.device_ptr(),
        lse: lse.device_ptr(),
        descale: factors.device_ptr(),
        shape: *shape,
        scale_log2: a.scale_for(d) * std::f32::consts::LOG2_E,
        causal: a.causal as u32,
        q_strides,
        o_strides: q_strides,
        v: v.device_ptr(),
        v_strides: kv_strides,
    };
    if shape.n_q > 0 && shape.batch > 0 && shape.heads_q > 0 {
        let cfg = launch_config(&config, &problem, shape);
        gpu.launch(&crate::instances::sm90_forward_e4m3(&config), cfg, &params)?;
    }
    // The factors are read by the queued kernel: freed in stream order after it.
    drop(factors);
    Ok(Fp8Forward { o, lse })
}

/// The f64 reference of the FP8 forward: [`reference::forward`] on the dequantized inputs.
pub fn reference(
    shape: &AttentionShape,
    [q, k, v]: [&[u8]; 3],
    descale: &Fp8Descale,
    options: &FlashOptions,
) -> Result<reference::Forward> {
    let d = shape.head_dim;
    reference::forward(
        shape,
        &dequantize(q, &descale.q, d),
        &dequantize(k, &descale.k, d),
        &dequantize(v, &descale.v, shape.head_dim_v),
        &options.attention,
    )
}

#[cfg(test)]
mod tests;
