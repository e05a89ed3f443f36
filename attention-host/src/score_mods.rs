//! The window and score modifiers on the device: [`ScoreMods`] with the per-head arrays it
//! points to.

use attention_kernels::abi::params::ScoreMods;

use crate::error::Result;
use crate::options::AttentionOptions;
use crate::runtime::Queue;
use crate::runtime::buffer::DeviceF32;

/// A `ScoreMods` with the device arrays it points to (kept alive as long as the parameters).
pub struct DeviceScoreMods {
    pub params: ScoreMods,
    _arrays: Vec<DeviceF32>,
}

impl DeviceScoreMods {
    /// Uploads the slopes and sinks of `options` (validated against the call's shape);
    /// `d_sinks`: where the backward writes the sink gradients (the forward passes `None`; used
    /// only when the call has sinks). On the queue's stream for temporaries.
    pub(crate) fn upload(
        queue: &Queue,
        options: &AttentionOptions,
        d_sinks: Option<&DeviceF32>,
    ) -> Result<DeviceScoreMods> {
        let mut arrays = Vec::new();
        let mut upload = |values: &Option<Vec<f32>>| -> Result<u64> {
            let Some(values) = values else { return Ok(0) };
            let a = DeviceF32::from_slice_on(values, queue.context(), queue.temporaries)?;
            let ptr = a.device_ptr();
            arrays.push(a);
            Ok(ptr)
        };
        let params = ScoreMods {
            window: options.window_or_none(),
            softcap: options.softcap.unwrap_or(0.0),
            alibi_slopes: upload(&options.alibi_slopes)?,
            sinks: upload(&options.sinks)?,
            d_sinks: match (&options.sinks, d_sinks) {
                (Some(_), Some(d)) => d.device_ptr(),
                _ => 0,
            },
        };
        Ok(DeviceScoreMods {
            params,
            _arrays: arrays,
        })
    }
}
