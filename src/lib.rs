//! Exact, IO-aware attention (FlashAttention) for NVIDIA GPUs, with kernels written in Rust.
//!
//! The kernels live in `attention-kernels`, are compiled to PTX by this crate's `build.rs` and are
//! embedded here as [`PTX`]; `attention-host` loads and launches them through cust.

pub mod bench;
pub mod inputs;
pub mod ptx_info;
pub mod sampled_rows;
pub mod testing;

pub use attention_host::*;

/// The PTX of every kernel, compiled from `attention-kernels` for [`PTX_ARCH`].
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/attention_kernels.ptx"));
/// Architecture the embedded PTX targets (`FLASH_ATTN_ARCH` at build time, default `sm_90`).
pub const PTX_ARCH: &str = env!("FLASH_ATTN_PTX_ARCH");
/// Where the build copied the PTX for reading (`target/ptx/<arch>/attention_kernels.ptx`).
pub const PTX_PATH: &str = env!("FLASH_ATTN_PTX_PATH");

/// Creates a context on device 0 and loads the embedded kernels.
pub fn gpu() -> Result<Gpu> {
    Gpu::new(PTX)
}
