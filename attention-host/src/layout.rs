//! The sequence layout on the device: which rows and keys form each sequence.

use crate::error::Result;
use crate::options::Lengths;
use crate::problem::Problem;
use crate::runtime::Queue;
use crate::runtime::buffer::DeviceArray;
use attention_kernels::abi::layout::{LENGTHS_FULL, LENGTHS_KEY, LENGTHS_PACKED, SequenceLayout};

/// A `SequenceLayout` with the device arrays it points to (kept alive as long as the layout).
pub struct DeviceLayout {
    pub params: SequenceLayout,
    /// Longest sequence in query rows and in key rows: the grid's Q and K/V block extents.
    pub max_q_len: u32,
    pub max_k_rows: u32,
    _arrays: Vec<DeviceArray<u32>>,
}

impl DeviceLayout {
    /// Uploads the arrays of `problem`'s lengths on the queue's stream for temporaries, except
    /// key lengths the device holds already.
    pub(crate) fn upload(queue: &Queue, problem: &Problem) -> Result<DeviceLayout> {
        let (shape, lengths) = (&problem.shape, &problem.options.attention.lengths);
        let upload = |v: &[u32]| DeviceArray::from_slice_on(v, queue.context(), queue.temporaries);
        let mut params = SequenceLayout {
            sequences: shape.batch,
            ..Default::default()
        };
        let (mut max_q_len, mut max_k_rows) = (shape.n_q, shape.n_k);
        let arrays = match lengths {
            Lengths::Full => {
                params.mode = LENGTHS_FULL;
                vec![]
            }
            Lengths::KeyLengths(lens) => {
                params.mode = LENGTHS_KEY;
                match problem.device_key_lengths {
                    Some(on_device) => {
                        params.key_lengths = on_device;
                        vec![]
                    }
                    None => {
                        let a = upload(lens)?;
                        params.key_lengths = a.device_ptr();
                        vec![a]
                    }
                }
            }
            Lengths::Packed {
                cu_seqlens_q,
                cu_seqlens_k,
            } => {
                params.mode = LENGTHS_PACKED;
                params.sequences = cu_seqlens_q.len() as u32 - 1;
                let widest = |cu: &[u32]| cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
                (max_q_len, max_k_rows) = (widest(cu_seqlens_q), widest(cu_seqlens_k));
                let (q, k) = (upload(cu_seqlens_q)?, upload(cu_seqlens_k)?);
                params.cu_seqlens_q = q.device_ptr();
                params.cu_seqlens_k = k.device_ptr();
                vec![q, k]
            }
        };
        Ok(DeviceLayout {
            params,
            max_q_len,
            max_k_rows,
            _arrays: arrays,
        })
    }
}
