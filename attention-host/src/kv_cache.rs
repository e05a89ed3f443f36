//! A contiguous KV cache for decoding: preallocated K and V `[batch, capacity, heads_kv,
//! head_dim]`, each sequence's length kept on the host (every append is checked against the
//! capacity before launch) and uploaded with each append. Attention of new queries over the cache
//! is the library's forward with the sequences' lengths as key lengths (causal is bottom-right
//! aligned to each sequence's own length, so the new rows see the cache and themselves).

use attention_kernels::abi::params::CacheAppendParams;
use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::kernels::cache::APPEND_THREADS;

use crate::attention::{ForwardOutput, forward};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::flash_options::FlashOptions;
use crate::instances;
use crate::options::{Lengths, checked_elems};
use crate::runtime::buffer::{DeviceArray, DeviceTensor};
use crate::runtime::{Gpu, LaunchConfig};

/// K and V caches of `batch` sequences of at most `capacity` rows each.
pub struct KvCache {
    k: DeviceTensor,
    v: DeviceTensor,
    batch: u32,
    capacity: u32,
    heads_kv: u32,
    head_dim: u32,
    lengths: Vec<u32>,
}

impl KvCache {
    /// An empty cache. Its rows start NaN: rows past a sequence's length are masked keys, which
    /// never contribute whatever they hold (and a kernel that read one would show it).
    pub fn new(
        dtype: DType,
        batch: u32,
        capacity: u32,
        heads_kv: u32,
        head_dim: u32,
    ) -> Result<KvCache> {
        for (name, x) in [
            ("batch", batch),
            ("capacity", capacity),
            ("heads_kv", heads_kv),
            ("head_dim", head_dim),
        ] {
            if x == 0 {
                return Err(invalid!("{name} must be at least 1"));
            }
        }
        let row_bytes = heads_kv as u64 * head_dim as u64 * dtype.size_bytes() as u64;
        if !row_bytes.is_multiple_of(16) {
            return Err(invalid!(
                "a cache row (heads_kv · head_dim · {} bytes = {row_bytes}) must be a whole number of 16-byte chunks",
                dtype.size_bytes()
            ));
        }
        let elems = checked_elems("the cache", &[batch, capacity, heads_kv, head_dim])?;
        Ok(KvCache {
            k: DeviceTensor::poisoned(dtype, elems)?,
            v: DeviceTensor::poisoned(dtype, elems)?,
            batch,
            capacity,
            heads_kv,
            head_dim,
            lengths: vec![0; batch as usize],
        })
    }

    /// Rows each sequence holds.
    pub fn lengths(&self) -> &[u32] {
        &self.lengths
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The cache's K and V (`[batch, capacity, heads_kv, head_dim]`).
    pub fn tensors(&self) -> (&DeviceTensor, &DeviceTensor) {
        (&self.k, &self.v)
    }

    /// Appends the first `new_lengths[b]` rows of item `b` of `k_new`, `v_new` (`[batch, n_new,
    /// heads_kv, head_dim]`, the cache's dtype) after the sequence's rows; refused before launch
    /// when a sequence would pass the capacity. Does not wait.
    pub fn append(
        &mut self,
        gpu: &Gpu,
        k_new: &DeviceTensor,
        v_new: &DeviceTensor,
        n_new: u32,
        new_lengths: &[u32],
    ) -> Result<()> {
        let after = grown_lengths(&self.lengths, new_lengths, n_new, self.capacity)?;
        let elems = checked_elems(
            "the new rows",
            &[self.batch, n_new, self.heads_kv, self.head_dim],
        )?;
        for (name, t) in [("k_new", k_new), ("v_new", v_new)] {
            if t.dtype() != self.k.dtype() || t.len() != elems {
                return Err(invalid!(
                    "{name} must be {} with {elems} elements ([batch, n_new, heads_kv, head_dim]), it is {} with {}",
                    self.k.dtype(),
                    t.dtype(),
                    t.len()
                ));
            }
        }
        if n_new == 0 {
            return Ok(());
        }
        let row_chunks =
            (self.heads_kv as u64 * self.head_dim as u64 * self.k.dtype().size_bytes() as u64 / 16)
                as u32;
        let chunks = self.batch as u64 * n_new as u64 * row_chunks as u64;
        let blocks = u32::try_from(chunks.div_ceil(APPEND_THREADS as u64))
            .ok()
            .filter(|&b| b <= i32::MAX as u32)
            .ok_or_else(|| invalid!("{chunks} chunks are more than one append launch takes"))?;
        let (cache_lengths, counts) = (
            DeviceArray::from_slice(&self.lengths)?,
            DeviceArray::from_slice(new_lengths)?,
        );
        let params = CacheAppendParams {
            cache_k: self.k.device_ptr(),
            cache_v: self.v.device_ptr(),
            new_k: k_new.device_ptr(),
            new_v: v_new.device_ptr(),
            cache_lengths: cache_lengths.device_ptr(),
            new_lengths: counts.device_ptr(),
            batch: self.batch,
            capacity: self.capacity,
            n_new,
            row_chunks,
        };
        gpu.launch(
            &instances::cache_append(),
            LaunchConfig {
                grid: (blocks, 1, 1),
                block: (APPEND_THREADS, 1, 1),
                shared_bytes: 0,
            },
            &params,
        )?;
        self.lengths = after;
        Ok(())
    }

    /// O and LSE of `q` (`[batch, n_q, heads_q, head_dim]`) over each sequence's cached rows (the
    /// new rows appended first), with `options` (which must not set lengths: the cache's are
    /// used). Causal aligns the `n_q` rows to the end of each sequence. Waits for the result.
    pub fn attend(
        &self,
        gpu: &Gpu,
        q: &DeviceTensor,
        n_q: u32,
        heads_q: u32,
        options: &FlashOptions,
    ) -> Result<ForwardOutput> {
        if options.attention.lengths != Lengths::Full {
            return Err(invalid!(
                "attention over the cache uses the cache's lengths; options must not set lengths"
            ));
        }
        let shape = self.shape(n_q, heads_q);
        let mut options = options.clone();
        options.attention.lengths = Lengths::KeyLengths(self.lengths.clone());
        forward(gpu, &shape, q, &self.k, &self.v, &options)
    }

    /// The shape of attention of `n_q` rows of `heads_q` heads over the cache.
    pub fn shape(&self, n_q: u32, heads_q: u32) -> AttentionShape {
        AttentionShape {
            batch: self.batch,
            n_q,
            n_k: self.capacity,
            heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
        }
    }
}

/// The sequences' lengths after appending `new_lengths` (each at most `n_new`), or why not.
fn grown_lengths(
    lengths: &[u32],
    new_lengths: &[u32],
    n_new: u32,
    capacity: u32,
) -> Result<Vec<u32>> {
    if new_lengths.len() != lengths.len() {
        return Err(invalid!(
            "new_lengths has {} entries, the cache holds {} sequences",
            new_lengths.len(),
            lengths.len()
        ));
    }
    lengths
        .iter()
        .zip(new_lengths)
        .enumerate()
        .map(|(b, (&len, &new))| {
            if new > n_new {
                return Err(invalid!(
                    "sequence {b}: {new} new rows, but the new tensors hold {n_new} per sequence"
                ));
            }
            len.checked_add(new)
                .filter(|&l| l <= capacity)
                .ok_or_else(|| {
                    invalid!(
                        "sequence {b}: {len} cached + {new} new rows pass the capacity {capacity}"
                    )
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_past_the_capacity_are_refused() {
        assert_eq!(grown_lengths(&[0, 5], &[3, 0], 3, 8).unwrap(), [3, 5]);
        assert_eq!(grown_lengths(&[5, 8], &[3, 0], 3, 8).unwrap(), [8, 8]);
        let e = grown_lengths(&[6, 0], &[3, 1], 3, 8)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("sequence 0: 6 cached + 3 new rows pass the capacity 8"),
            "{e}"
        );
        let e = grown_lengths(&[0, 0], &[4, 1], 3, 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("4 new rows, but the new tensors hold 3"), "{e}");
        let e = grown_lengths(&[0], &[1, 1], 3, 8).unwrap_err().to_string();
        assert!(e.contains("2 entries, the cache holds 1"), "{e}");
        let e = grown_lengths(&[u32::MAX], &[1], 1, u32::MAX)
            .unwrap_err()
            .to_string();
        assert!(e.contains("pass the capacity"), "{e}");
    }
}
