//! The merge of saved `(O, LSE)` parts over disjoint key sets (`attn::merge`): the public merge
//! (`states`, parts from a table of addresses) and the split-KV combine (`combine`, parts at a
//! fixed stride, one block per row). The launch shapes are shared with the host; the kernels
//! exist only in the device build.

#[cfg(target_arch = "nvptx64")]
mod combine;
#[cfg(target_arch = "nvptx64")]
mod states;

/// Rows (one warp each) per block of the merge.
pub const MERGE_WARPS: u32 = 4;
/// Threads per block of the split-KV combine (one block per output row); also its most parts.
pub const COMBINE_THREADS: u32 = 256;
/// Warps per block of the combine.
pub const COMBINE_WARPS: u32 = COMBINE_THREADS / 32;

/// Dynamic shared memory of the combine: a weight per part, a reduction slot per warp, and four
/// column sums per thread.
pub const fn combine_shared_bytes() -> u32 {
    4 * (COMBINE_THREADS + COMBINE_WARPS + 4 * COMBINE_THREADS)
}
