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
//!
//! With the `candidates` feature the PTX also holds the split kernel of `mma` (`decode/mma/`) on
//! `mma.sync` tensor cores (not yet run on a GPU), and the plan picks it instead of this one.

#[cfg(target_arch = "nvptx64")]
/// `body` for `c = 0, 1, …` below `n` (at most 16), each with a constant `c`: the
/// chunk arrays are indexed only by constants and stay in registers (a rolled loop would index
/// them at run time and move them to local memory; LLVM does not unroll bodies this large).
macro_rules! each_chunk {
    ($c:ident < $n:expr => $body:block) => {
        each_chunk!(@ $c, $n, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@ $c:ident, $n:expr, $body:block, $($i:literal)*) => {$(
        if $i < $n {
            let $c: usize = $i;
            $body
        }
    )*};
}

#[cfg(target_arch = "nvptx64")]
mod combine;
#[cfg(target_arch = "nvptx64")]
mod kernel;
#[cfg(feature = "candidates")]
pub mod mma;

/// One decode launch: the row tile, and the keys split over `splits` blocks per (K/V head,
/// sequence), `keys_per_split` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    pub head_dim: u32,
    /// The rows the split kernel computes: the smallest of [`ROW_TILES`] holding `H_q / H_kv ·
    /// N_q` (the candidate `mma` kernel, the `candidates` feature: its 16-row MMA tile, always).
    pub row_tile: u32,
    pub splits: u32,
    pub keys_per_split: u32,
    /// How the splits' partials become O and LSE.
    pub combine: DecodeCombine,
}

/// The combine of the splits' partial `(O, LSE)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DecodeCombine {
    /// The generic strided merge (`kernels::merge`), whose lanes wait on each part's LSE
    /// before loading its O (a chain of dependent loads per part).
    Merge,
    /// `flash_decode_combine_*`: one block per row whose warps take the parts in turn, every
    /// part's LSE loaded at once (the default: it halves the time of long single-sequence
    /// decodes, `reports/PERF_LOG_DECODE.md`).
    #[default]
    Parallel,
}

/// Most splits of one decode launch: bounds the partials' workspace and the combine's work per
/// row (each warp of the parallel combine holds `MAX_SPLITS / 32` LSEs per lane).
pub const MAX_SPLITS: u32 = 256;
/// Most warps of a parallel combine block (one block per query row, warp `w` takes parts `w, w +
/// warps, …`): up to 16 parts' loads in flight per row without relying on the scheduler to keep
/// several loads of one warp in flight.
pub const COMBINE_MAX_WARPS: u32 = 16;

/// Warps of a parallel combine block for `parts` splits: one per part, at most
/// [`COMBINE_MAX_WARPS`].
pub const fn combine_warps(parts: u32) -> u32 {
    if parts < 1 {
        1
    } else if parts > COMBINE_MAX_WARPS {
        COMBINE_MAX_WARPS
    } else {
        parts
    }
}

/// Dynamic shared memory of a parallel combine block of `warps` warps: each warp's sums of its
/// parts, `head_dim` f32.
pub const fn combine_shared_bytes(warps: u32, head_dim: u32) -> u32 {
    4 * warps * head_dim
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
