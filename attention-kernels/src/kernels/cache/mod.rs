//! The KV cache's append: new K/V rows copied into a preallocated cache (contiguous or paged,
//! `abi::layout::KeyPages`) at per-sequence positions. The launch shape is shared with the host; the kernel exists only in
//! the device build.

#[cfg(target_arch = "nvptx64")]
mod append;

/// Threads per block of the append (one 16-byte chunk of K and one of V each).
pub const APPEND_THREADS: u32 = 256;
