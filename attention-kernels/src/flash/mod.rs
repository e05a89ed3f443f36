//! Exact tiled attention (FlashAttention-1): Algorithm 1 forward in two schedules and the
//! Algorithm 4 recompute backward, SIMT f32 arithmetic over tiles held in shared memory.
//!
//! `params`, `mask` and `smem` are shared with the host (launch parameters, the mask coordinates
//! the reference must agree with, and the shared-memory footprint that the block-size rule needs);
//! the kernels themselves exist only in the device build.

pub mod mask;
pub mod params;
pub mod smem;

#[cfg(target_arch = "nvptx64")]
mod backward;
#[cfg(target_arch = "nvptx64")]
mod forward;
#[cfg(target_arch = "nvptx64")]
mod sequence;
#[cfg(target_arch = "nvptx64")]
mod tile;
