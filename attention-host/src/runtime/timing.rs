//! Event timing on the GPU, after warm-up calls: one CUDA-event-timed sample per call waited on
//! ([`time_calls`]), or samples of many calls queued back to back ([`time_pipelined`]), the way
//! a program that does not wait between calls sees them.

use cudarc::driver::sys::CUevent_flags;

use crate::error::{CudaContext, Result};
use crate::runtime::Gpu;

fn event(gpu: &Gpu) -> Result<cudarc::driver::CudaEvent> {
    gpu.context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .cuda("creating an event")
}

/// Milliseconds of each of `samples` calls of `call`, after `warmup` untimed calls. Each sample is
/// bracketed by events on the GPU's stream and waited on, so launch failures surface here.
pub fn time_calls(
    gpu: &Gpu,
    warmup: usize,
    samples: usize,
    mut call: impl FnMut() -> Result<()>,
) -> Result<Vec<f32>> {
    for _ in 0..warmup {
        call()?;
    }
    gpu.synchronize()?;
    let (start, stop) = (event(gpu)?, event(gpu)?);
    let mut out = Vec::with_capacity(samples);
    for _ in 0..samples {
        start.record(gpu.stream()).cuda("recording an event")?;
        call()?;
        stop.record(gpu.stream()).cuda("recording an event")?;
        stop.synchronize().cuda("waiting for an event")?;
        out.push(start.elapsed_ms(&stop).cuda("reading an event")?);
    }
    gpu.synchronize()?;
    Ok(out)
}

/// Samples of [`time_pipelined`]: milliseconds per call, and the calls each sample queued.
pub struct Pipelined {
    pub per_call_ms: Vec<f32>,
    pub calls: usize,
}

/// `samples` samples, each `calls` calls of `call` queued back to back between two events after
/// `warmup` untimed calls (themselves one batch): a call's host work overlaps the previous call's
/// kernels, as in a training or serving loop. `calls == 0` chooses the count so that a sample
/// spans about 2 ms (from the warm-up's mean), at most 200.
pub fn time_pipelined(
    gpu: &Gpu,
    warmup: usize,
    samples: usize,
    calls: usize,
    mut call: impl FnMut() -> Result<()>,
) -> Result<Pipelined> {
    let (start, stop) = (event(gpu)?, event(gpu)?);
    let mut batch = |n: usize| -> Result<f32> {
        start.record(gpu.stream()).cuda("recording an event")?;
        for _ in 0..n {
            call()?;
        }
        stop.record(gpu.stream()).cuda("recording an event")?;
        stop.synchronize().cuda("waiting for an event")?;
        Ok(start.elapsed_ms(&stop).cuda("reading an event")? / n as f32)
    };
    gpu.synchronize()?;
    let warm_ms = batch(warmup.max(1))?;
    let calls = match calls {
        0 => ((2.0 / warm_ms.max(1e-3)).ceil() as usize).clamp(1, 200),
        n => n,
    };
    let per_call_ms = (0..samples)
        .map(|_| batch(calls))
        .collect::<Result<Vec<f32>>>()?;
    gpu.synchronize()?;
    Ok(Pipelined { per_call_ms, calls })
}

/// Median of samples (the mean of the middle two for an even count).
pub fn median(samples: &[f32]) -> f32 {
    assert!(!samples.is_empty(), "median of no samples");
    let mut s = samples.to_vec();
    s.sort_by(f32::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        0.5 * (s[n / 2 - 1] + s[n / 2])
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
