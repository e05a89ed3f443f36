//! The merge of saved `(O, LSE)` parts over disjoint key sets (`attn::merge`): the public merge
//! and the split-KV combine. The launch shape is shared with the host; the kernel exists only in
//! the device build.

#[cfg(target_arch = "nvptx64")]
mod states;

/// Rows (one warp each) per block of the merge.
pub const MERGE_WARPS: u32 = 4;
