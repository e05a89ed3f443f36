//! Split-KV decode: few query rows per sequence (decode steps, speculative or chunked steps).
//! One block per (key split, K/V head, sequence) computes the partial `(O, LSE)` of **every**
//! query row of the K/V head's group (`H_q / H_kv` heads × `N_q` rows, padded to a row tile) over
//! its key range, reading each K and V row once; `kernels::merge`'s strided combine (one block
//! per output row) then merges the splits. The split count fills the machine when batch × K/V
//! heads alone would not.
//!
//! SIMT, not tensor cores: per key the block does `4·R·d` flops (`S = QKᵀ` and `PV` for `R`
//! rows) on `4·d` bytes of K and V, i.e. `R` flops per byte. The H200's f32 FMA rate (~67
//! TFLOP/s) over its HBM bandwidth (~4.8 TB/s) is ~14 flops per byte, so up to `R = 8` the f32
//! pipes keep up with memory and the kernel stays bandwidth bound; `R = 16` is at the balance
//! point. The plan takes this family only up to [`MAX_ROW_TILE`] rows.

#[cfg(target_arch = "nvptx64")]
mod kernel;

/// Threads per block: four warps, each streaming its own keys.
pub const THREADS: u32 = 128;
/// Warps per block.
pub const WARPS: u32 = THREADS / 32;
/// Split granularity: every split but the last holds a multiple of this many keys.
pub const STEP_KEYS: u32 = 128;
/// Most splits per (sequence, K/V head): bounds the partials' workspace and the combine's work.
pub const MAX_SPLITS: u32 = crate::kernels::merge::COMBINE_THREADS;
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

/// Keys a lane group takes per iteration for a row tile of `rows`: its K and V chunks (`4·U`
/// registers each), `U · rows` scores and `8 · rows` accumulators must fit the registers.
pub const fn unroll(rows: usize) -> usize {
    match rows {
        0..=4 => 8,
        5..=8 => 4,
        _ => 2,
    }
}

/// Dynamic shared memory of one block in f32: the Q tile `R × d`, then per warp its merged state
/// (`R × d` accumulators, `R` maxima, `R` sums).
pub const fn shared_floats(row_tile: u32, head_dim: u32) -> u32 {
    row_tile * head_dim + WARPS * row_tile * (head_dim + 2)
}

/// Dynamic shared memory of one block in bytes.
pub const fn shared_bytes(row_tile: u32, head_dim: u32) -> u32 {
    4 * shared_floats(row_tile, head_dim)
}
