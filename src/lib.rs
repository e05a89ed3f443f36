//! Exact, IO-aware attention (FlashAttention) for NVIDIA GPUs, with kernels written in Rust.
//!
//! The kernels live in `attention-kernels`, are compiled to PTX by this crate's `build.rs` and are
//! embedded here as [`PTX`]; `attention-host` loads and launches them through cust.

pub mod api;

pub use attention_host::*;

pub use api::{HostForward, HostGradients, backward_host, forward_host};

/// The PTX of every kernel, compiled from `attention-kernels` for [`PTX_ARCH`].
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/attention_kernels.ptx"));
/// The `sm_90a` module (every kernel of [`PTX`] plus the `wgmma` ones), built when [`PTX_ARCH`] is
/// `sm_90`; [`gpu`] loads it on compute capability 9.0 devices.
pub const PTX_SM90A: Option<&str> = {
    const TEXT: &str = include_str!(concat!(env!("OUT_DIR"), "/attention_kernels_sm90a.ptx"));
    if TEXT.is_empty() { None } else { Some(TEXT) }
};
/// Architecture the embedded PTX targets (`FLASH_ATTN_ARCH` at build time, default `sm_90`).
pub const PTX_ARCH: &str = env!("FLASH_ATTN_PTX_ARCH");
/// Where the build copied the PTX for reading (`target/ptx/<arch>/attention_kernels.ptx`).
pub const PTX_PATH: &str = env!("FLASH_ATTN_PTX_PATH");
/// The commit this library was built from (`git describe`-style, from `build.rs`), recorded in
/// evidence bundles.
pub const BUILD_COMMIT: &str = env!("FLASH_ATTN_GIT_COMMIT");
/// Where the build copied [`PTX_SM90A`] for reading (`target/ptx/sm_90a/attention_kernels.ptx`).
pub const PTX_SM90A_PATH: &str = env!("FLASH_ATTN_PTX_SM90A_PATH");

/// Retains device 0's primary context and loads the embedded kernels ([`PTX_SM90A`] on an
/// H100/H200).
pub fn gpu() -> Result<Gpu> {
    Gpu::with_hopper_module(PTX, PTX_SM90A)
}
