//! The kernel families, siblings over `attn` and `tile`: `simt` (the exact kernels), `sm80`
//! (`mma.sync`), `sm90` (`wgmma`, the `sm_90a` module only), `decode` (split-KV, few query
//! rows), and what serves them all: `cache` (the KV cache's append), `merge` (combining saved
//! `(O, LSE)` parts) and `baseline` (the materialized three-stage reference kernels). Each
//! family's module holds its tile configurations, which the host plans with; the kernels exist
//! only in the device build.

#[cfg(target_arch = "nvptx64")]
mod baseline;
pub mod cache;
pub mod decode;
pub mod merge;
pub mod simt;
pub mod sm80;
pub mod sm90;
