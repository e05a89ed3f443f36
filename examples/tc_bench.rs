//! Times the tensor-core forward on the anchor shapes of `shared/anchors/sdpa_h200_2026-11-29.md`
//! (PyTorch SDPA on one H200) and prints TFLOP/s next to the peers' numbers.
//!
//! Each shape: random inputs (never zeros), 5 warm-up launches, then 30 launches each timed with a
//! pair of CUDA events; the median is reported. FLOPs = 4·B·H·N²·d, halved when causal.

use cust::event::{Event, EventFlags};
use flash_attn::{tensor_core_forward_into, AttentionOptions, AttentionShape, DType, DeviceF32, DeviceTensor, ForwardOutput};
use rand::{Rng, SeedableRng};

const WARMUP: usize = 5;
const SAMPLES: usize = 30;

/// (batch, heads, seq, head_dim, causal, dtype, PyTorch flash fwd, cuDNN fwd) in TFLOP/s (bf16).
const SHAPES: &[(u32, u32, u32, u32, bool, DType, Option<f64>, Option<f64>)] = &[
    (1, 32, 4096, 128, false, DType::Bf16, Some(345.0), Some(620.0)),
    (1, 32, 4096, 128, false, DType::F16, None, None),
    (1, 32, 4096, 128, true, DType::Bf16, None, None),
    (4, 16, 4096, 128, false, DType::Bf16, Some(340.0), Some(648.0)),
    (4, 16, 4096, 128, true, DType::Bf16, Some(296.0), Some(566.0)),
    (16, 16, 1024, 128, false, DType::Bf16, Some(310.0), Some(539.0)),
    (16, 16, 1024, 128, true, DType::Bf16, Some(226.0), Some(369.0)),
    (4, 32, 4096, 64, false, DType::Bf16, Some(293.0), Some(449.0)),
    (4, 32, 4096, 64, true, DType::Bf16, Some(272.0), Some(408.0)),
    (16, 32, 1024, 64, false, DType::Bf16, Some(277.0), Some(398.0)),
    (16, 32, 1024, 64, true, DType::Bf16, Some(204.0), Some(297.0)),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = match flash_attn::gpu() {
        Ok(gpu) => gpu,
        Err(flash_attn::AttentionError::NoDevice(why)) => {
            println!("SKIP tc_bench: no CUDA device answered ({why})");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("device: {}", gpu.device_name());
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::thread_rng().r#gen());
    let fmt = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{v:.0}"));
    let mut table = Vec::new();
    for &(batch, heads, n, head_dim, causal, dtype, flash, cudnn) in SHAPES {
        let s = AttentionShape { batch, n_q: n, n_k: n, heads_q: heads, heads_kv: heads, head_dim };
        let mut draw = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-2.0f32..2.0)).collect() };
        let (q, k, v) = (
            DeviceTensor::from_f32(dtype, &draw(s.q_elems()))?,
            DeviceTensor::from_f32(dtype, &draw(s.kv_elems()))?,
            DeviceTensor::from_f32(dtype, &draw(s.kv_elems()))?,
        );
        let out = ForwardOutput { o: DeviceTensor::poisoned(dtype, s.q_elems())?, lse: DeviceF32::poisoned(s.row_elems())? };
        let opts = AttentionOptions::new().causal(causal);
        for _ in 0..WARMUP {
            tensor_core_forward_into(&gpu, &s, &q, &k, &v, &out, &opts)?;
        }
        gpu.synchronize()?;
        let (start, stop) = (Event::new(EventFlags::DEFAULT)?, Event::new(EventFlags::DEFAULT)?);
        let mut ms = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            start.record(gpu.stream())?;
            tensor_core_forward_into(&gpu, &s, &q, &k, &v, &out, &opts)?;
            stop.record(gpu.stream())?;
            stop.synchronize()?;
            ms.push(stop.elapsed_time_f32(&start)? as f64);
        }
        gpu.synchronize()?;
        if out.o.to_f32()?.iter().any(|x| !x.is_finite()) {
            return Err(format!("non-finite output at {s:?} causal={causal}").into());
        }
        ms.sort_by(f64::total_cmp);
        let median = ms[SAMPLES / 2];
        let flops = 4.0 * (batch * heads) as f64 * (n as f64).powi(2) * head_dim as f64 / if causal { 2.0 } else { 1.0 };
        let tflops = flops / (median * 1e-3) / 1e12;
        table.push(format!(
            "| {batch} | {heads} | {n} | {head_dim} | {causal} | {dtype} | {median:.3} | {:.3} | {tflops:.0} | {} | {} |",
            ms[0],
            fmt(flash),
            fmt(cudnn)
        ));
    }
    println!("| B | H | N | d | causal | dtype | median ms | min ms | TFLOP/s | torch flash | cuDNN |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
    Ok(())
}
