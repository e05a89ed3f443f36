//! Event timing on the GPU: warm-up calls, then one CUDA-event-timed sample per call.

use cudarc::driver::sys::CUevent_flags;

use crate::error::{CudaContext, Result};
use crate::runtime::Gpu;

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
    let event = || {
        gpu.context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .cuda("creating an event")
    };
    let (start, stop) = (event()?, event()?);
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
