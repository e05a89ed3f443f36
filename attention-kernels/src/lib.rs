//! Device code for exact, IO-aware attention, and the pieces host and device share.
//!
//! This crate compiles twice: for `nvptx64-nvidia-cuda` (by the root crate's `build.rs`, giving the
//! PTX the host loads) and for the host, as an ordinary dependency of `attention-host`. Modules that
//! both sides need (launch parameters, storage conversions) are plain `core` code; the kernels
//! themselves exist only in the device build.
#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, core_float_math, stdarch_nvptx)
)]

// The host build links std for `exp`/`ln` (core has neither); the device build never does.
#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod abi;
#[cfg(target_arch = "nvptx64")]
mod arch;
pub mod attn;
pub mod kernels;
pub mod tile;
