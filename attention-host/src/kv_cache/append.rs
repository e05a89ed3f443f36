//! What both caches share: the checks of new rows and of a cache's row size, the lengths after an
//! append, and the append launch (its destination rows given by `KeyPages`), which advances the
//! device lengths itself.

use attention_kernels::abi::layout::KeyPages;
use attention_kernels::abi::params::CacheAppendParams;
use attention_kernels::kernels::cache::APPEND_THREADS;

use super::seq_lens::{AppendLengths, SeqLens};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::instances;
use crate::options::checked_elems;
use crate::runtime::buffer::{DeviceArray, DeviceTensor};
use crate::runtime::{Gpu, LaunchConfig};

/// Non-zero extents, and rows of whole 16-byte chunks (the append and the decode kernel move
/// rows in 16-byte chunks).
pub(crate) fn check_geometry(dtype: DType, extents: &[(&str, u32)], row: [u32; 2]) -> Result<()> {
    for &(name, x) in extents {
        if x == 0 {
            return Err(invalid!("{name} must be at least 1"));
        }
    }
    let row_bytes = row[0] as u64 * row[1] as u64 * dtype.size_bytes() as u64;
    if !row_bytes.is_multiple_of(16) {
        return Err(invalid!(
            "a cache row (heads_kv · head_dim · {} bytes = {row_bytes}) must be a whole number of 16-byte chunks",
            dtype.size_bytes()
        ));
    }
    Ok(())
}

/// The sequences' lengths after appending `new_lengths` (each at most `n_new`), each at most its
/// `room`, or why not.
pub(crate) fn grown_lengths(
    lengths: &[u32],
    new_lengths: &[u32],
    n_new: u32,
    room: impl Fn(usize) -> u32,
    what: &str,
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
            let room = room(b);
            len.checked_add(new).filter(|&l| l <= room).ok_or_else(|| {
                invalid!("sequence {b}: {len} cached + {new} new rows pass {what}: {room}")
            })
        })
        .collect()
}

/// A cache's K and V and the layout of their rows.
pub(crate) struct Destination<'a> {
    pub k: &'a DeviceTensor,
    pub v: &'a DeviceTensor,
    pub heads_kv: u32,
    pub head_dim: u32,
    /// Rows per sequence of the contiguous layout (unused when paged).
    pub capacity: u32,
    pub pages: KeyPages,
    /// The rows sequence `b` may hold, and what bounds them (for the refusal).
    pub room: &'a dyn Fn(usize) -> u32,
    pub room_name: &'a str,
}

/// Checks the lengths after the append against each sequence's room and `k_new`, `v_new`
/// (`[sequences, n_new, heads_kv, head_dim]`, the cache's dtype), queues the copy of item `b`'s
/// first `new_lengths[b]` rows to its rows `lengths[b] ..` and records the lengths after it.
/// Uploads `new_lengths` only when they differ between sequences.
pub(crate) fn append(
    gpu: &Gpu,
    to: &Destination,
    k_new: &DeviceTensor,
    v_new: &DeviceTensor,
    n_new: u32,
    lengths: &mut SeqLens,
    new_lengths: &[u32],
) -> Result<()> {
    let after = grown_lengths(lengths.host(), new_lengths, n_new, to.room, to.room_name)?;
    let batch = lengths.host().len() as u32;
    let elems = checked_elems("the new rows", &[batch, n_new, to.heads_kv, to.head_dim])?;
    for (name, t) in [("k_new", k_new), ("v_new", v_new)] {
        if t.dtype() != to.k.dtype() || t.len() != elems {
            return Err(invalid!(
                "{name} must be {} with {elems} elements ([batch, n_new, heads_kv, head_dim]), it is {} with {}",
                to.k.dtype(),
                t.dtype(),
                t.len()
            ));
        }
    }
    if n_new == 0 {
        return Ok(());
    }
    let row_chunks =
        (to.heads_kv as u64 * to.head_dim as u64 * to.k.dtype().size_bytes() as u64 / 16) as u32;
    let chunks = batch as u64 * n_new as u64 * row_chunks as u64;
    let blocks = u32::try_from(chunks.div_ceil(APPEND_THREADS as u64))
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| invalid!("{chunks} chunks are more than one append launch takes"))?;
    let counts = match new_lengths.iter().all(|&n| n == n_new) {
        true => None,
        false => Some(DeviceArray::from_slice(new_lengths)?),
    };
    let AppendLengths { before, after: out } = lengths.for_append();
    let params = CacheAppendParams {
        cache_k: to.k.device_ptr(),
        cache_v: to.v.device_ptr(),
        new_k: k_new.device_ptr(),
        new_v: v_new.device_ptr(),
        cache_lengths: before,
        new_lengths: counts.as_ref().map_or(0, |c| c.device_ptr()),
        lengths_out: out,
        pages: to.pages,
        batch,
        capacity: to.capacity,
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
    lengths.appended(after);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn appends_past_the_room_are_refused() {
        let grown = |lengths: &[u32], new: &[u32], n_new| {
            grown_lengths(lengths, new, n_new, |_| 8, "the capacity")
        };
        assert_eq!(grown(&[0, 5], &[3, 0], 3).unwrap(), [3, 5]);
        assert_eq!(grown(&[5, 8], &[3, 0], 3).unwrap(), [8, 8]);
        let e = grown(&[6, 0], &[3, 1], 3).unwrap_err().to_string();
        assert!(
            e.contains("sequence 0: 6 cached + 3 new rows pass the capacity: 8"),
            "{e}"
        );
        let e = grown(&[0, 0], &[4, 1], 3).unwrap_err().to_string();
        assert!(e.contains("4 new rows, but the new tensors hold 3"), "{e}");
        let e = grown(&[0], &[1, 1], 3).unwrap_err().to_string();
        assert!(e.contains("2 entries, the cache holds 1"), "{e}");
        let e = grown_lengths(&[u32::MAX], &[1], 1, |_| u32::MAX, "the capacity")
            .unwrap_err()
            .to_string();
        assert!(e.contains("pass the capacity"), "{e}");
        // Each sequence against its own room (a paged cache's pages).
        let e = grown_lengths(
            &[0, 0],
            &[2, 2],
            2,
            |b| [4, 1][b],
            "the rows its pages hold",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("sequence 1: 0 cached + 2 new rows pass the rows its pages hold: 1"),
            "{e}"
        );
    }

    #[test]
    fn rows_must_be_whole_chunks() {
        let dims = [("batch", 1), ("head_dim", 4)];
        check_geometry(DType::Bf16, &dims, [2, 4]).unwrap();
        let e = check_geometry(DType::Bf16, &dims, [1, 4])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("= 8) must be a whole number of 16-byte chunks"),
            "{e}"
        );
        let e = check_geometry(DType::Bf16, &[("batch", 0)], [2, 4])
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch must be at least 1"), "{e}");
    }
}
