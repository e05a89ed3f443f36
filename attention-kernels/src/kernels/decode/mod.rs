//! Split-KV decode: few query rows per sequence (decode steps, speculative or chunked steps).
//! One block per (key split, K/V head, sequence) computes the partial `(O, LSE)` of **every**
//! query row of the K/V head's group (`H_q / H_kv` heads × `N_q` rows, padded to a row tile) over
//! its key range, reading each K and V row once; `kernels::merge`'s strided combine then merges
//! the splits. The split count fills the machine when batch × K/V heads alone would not.
//!
//! K and V are either contiguous or the page pool of a paged cache: each key's tensor row comes
//! from `abi::layout::KeyPages` (the identity, or a block-table lookup), translated once per
//! step while scoring and kept in shared memory for `P·V`, so both layouts run the same code and
//! the same arithmetic in the same order.
//!
//! SIMT, not tensor cores: per key the block does `4·R·d` flops (`S = QKᵀ` and `PV` for `R`
//! rows) on `4·d` bytes of K and V, i.e. `R` flops per byte. The H200's f32 FMA rate (~67
//! TFLOP/s) over its HBM bandwidth (~4.8 TB/s) is ~14 flops per byte, so up to `R = 8` the f32
//! pipes keep up with memory and the kernel stays bandwidth bound; `R = 16` is at the balance
//! point. The plan takes this family only up to [`MAX_ROW_TILE`] rows.

#[cfg(target_arch = "nvptx64")]
mod kernel;

/// One decode launch: the row tile, and the keys split over `splits` blocks per (K/V head,
/// sequence), `keys_per_split` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    pub head_dim: u32,
    pub row_tile: u32,
    pub splits: u32,
    pub keys_per_split: u32,
}

/// Threads per block: four warps.
pub const THREADS: u32 = 128;
/// Keys per step: one per thread while scoring.
pub const STEP_KEYS: u32 = THREADS;
/// The compiled row tiles (`H_q / H_kv · N_q` rows, rounded up to one of these).
pub const ROW_TILES: [u32; 5] = [1, 2, 4, 8, 16];
/// The largest row tile: more rows per K/V head go to the prefill families.
pub const MAX_ROW_TILE: u32 = 16;
/// The compiled head dims.
pub const HEAD_DIMS: [u32; 2] = [64, 128];

/// The smallest compiled row tile holding `rows` rows.
pub fn row_tile(rows: u32) -> Option<u32> {
    ROW_TILES.into_iter().find(|&t| t >= rows)
}

/// Dynamic shared memory of one block: Q (later the output accumulator) `R × d` f32, the step's
/// scores `R × STEP_KEYS` f32, per row `m`, `ℓ` and the step's rescale factor, and the tensor row
/// of each of the step's keys (`u32`, translated through the block table when paged).
pub const fn shared_bytes(row_tile: u32, head_dim: u32) -> u32 {
    4 * row_tile * (head_dim + STEP_KEYS + 3) + 4 * STEP_KEYS
}
