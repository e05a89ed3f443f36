//! The append kernel: one thread per 16-byte chunk of a new row, for K and V, written where
//! `KeyPages` puts the row (contiguous or paged).

use crate::abi::params::CacheAppendParams;
use crate::arch::{block_dim_x, block_x, thread_x};

#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Chunk([u32; 4]);

/// Grid `⌈batch · n_new · row_chunks / APPEND_THREADS⌉`. Chunk `x` is item `b`, new row `i`,
/// chunk `c` of the row; rows past the item's count are not copied. The item's first chunk writes
/// its length after the append (every item has one: the host launches only for `n_new ≥ 1`).
unsafe fn append(p: &CacheAppendParams) {
    let x = block_x() as u64 * block_dim_x() as u64 + thread_x() as u64;
    let chunks = p.row_chunks as u64;
    if x >= p.batch as u64 * p.n_new as u64 * chunks {
        return;
    }
    let (row, c) = (x / chunks, x % chunks);
    let (b, i) = (row / p.n_new as u64, row % p.n_new as u64);
    // SAFETY: the length arrays hold `batch` entries (host-checked); `lengths_out` is another
    // array than the `cache_lengths` every chunk reads.
    let (start, count) = unsafe {
        let start = *(p.cache_lengths as *const u32).add(b as usize);
        let count = match p.new_lengths {
            0 => p.n_new,
            counts => *(counts as *const u32).add(b as usize),
        };
        if i == 0 && c == 0 {
            *(p.lengths_out as *mut u32).add(b as usize) = start + count;
        }
        (start, count)
    };
    if i >= count as u64 {
        return;
    }
    let src = (row * chunks + c) as usize;
    // SAFETY: the host checked every item's `start + count` against its rows (the capacity, or
    // the pages its table slots hold).
    let to = unsafe {
        p.pages
            .row(b as u32, b * p.capacity as u64, start + i as u32)
    };
    let dst = (to * chunks + c) as usize;
    // SAFETY: as above, and the tensors' sizes; the tensors are 16-byte aligned allocations with
    // rows of whole chunks.
    unsafe {
        *(p.cache_k as *mut Chunk).add(dst) = *(p.new_k as *const Chunk).add(src);
        *(p.cache_v as *mut Chunk).add(dst) = *(p.new_v as *const Chunk).add(src);
    }
}

/// Named as `attention_host::instances::cache_append` gives it.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn flash_cache_append(p: CacheAppendParams) {
    // SAFETY: the host validated the cache, the new rows and the lengths against `p`.
    unsafe { append(&p) }
}
