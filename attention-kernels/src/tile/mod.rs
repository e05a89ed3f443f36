//! Tensor-core tiles: the inline PTX of `mma.sync`, `ldmatrix` and `cp.async` hidden once behind
//! register fragments and swizzled shared tiles, so kernels are written in these types only.
//!
//! The swizzle is plain address arithmetic and compiles for the host too, where its bank-conflict
//! properties are tested; everything else is device code.

pub mod fp8_layout;
pub mod fragment_addr;
pub mod panel;
pub mod swizzle;

#[cfg(target_arch = "nvptx64")]
pub mod cp_async;
#[cfg(target_arch = "nvptx64")]
pub mod ldmatrix;
#[cfg(target_arch = "nvptx64")]
pub mod ldmatrix_a_trans;
#[cfg(target_arch = "nvptx64")]
pub mod mem;
#[cfg(target_arch = "nvptx64")]
pub mod mem_backward;
#[cfg(target_arch = "nvptx64")]
pub mod mma;
#[cfg(target_arch = "nvptx64")]
pub mod order;
#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
pub mod tma;
#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
pub mod wgmma;
#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
pub mod wgmma_fp8;

pub use panel::{GappedTile, PanelTile};
pub use swizzle::SwizzledTile;

/// Four accumulator or weight values of one lane in an `m16n8` fragment (elements 0, 1: row g;
/// 2, 3: row g + 8).
pub trait Quad {
    fn quad(&mut self) -> &mut [f32; 4];
    fn get(&self) -> [f32; 4];
}

impl Quad for [f32; 4] {
    #[inline(always)]
    fn quad(&mut self) -> &mut [f32; 4] {
        self
    }
    #[inline(always)]
    fn get(&self) -> [f32; 4] {
        *self
    }
}
