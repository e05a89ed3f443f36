//! Exact tiled attention (FlashAttention-1): Algorithm 1 forward in two schedules and the
//! Algorithm 4 recompute backward, SIMT f32 arithmetic over tiles held in shared memory.
//!
//! `smem` is shared with the host (the shared-memory footprint that the block-size rule needs);
//! the mask is `abi::shape::allowed_key_end`, the same function the
//! CPU reference uses. The kernels themselves exist only in the device build.

pub mod smem;

#[cfg(target_arch = "nvptx64")]
mod backward;
#[cfg(target_arch = "nvptx64")]
mod forward;
#[cfg(target_arch = "nvptx64")]
mod tile;
