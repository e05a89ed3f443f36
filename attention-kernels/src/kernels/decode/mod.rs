//! Split-KV decode: few query rows per sequence (decode steps, speculative or chunked steps).
//! One block per (key split, K/V head, sequence) computes the partial `(O, LSE)` of **every**
//! query row of the K/V head's group (`H_q / H_kv` heads × `N_q` rows, at most [`MAX_ROWS`]) over
//! its key range, reading each K and V row once; the parallel combine (`combine`) or
//! `kernels::merge`'s strided merge then merges the splits. The split count fills the machine
//! when batch × K/V heads alone would not.
//!
//! On the tensor cores (`split`: `mma.sync` m16n8k16, f32 accumulators): the group's rows are the
//! 16 rows of the A tile (`S = Q·Kᵀ`, then `O += P·V` with P from registers), padded with zero
//! rows that see no key. K/V tiles of [`BLOCK_KEYS`] keys stream through [`STAGES`] shared stages
//! (`cp.async`, two tiles in flight while one is computed, one barrier per tile); each of the
//! four warps takes 16 keys of a tile with its own online softmax state, and the warps' states
//! are merged once at the end. The keys' flops are `4·16·d` per key whatever the group, on `4·d`
//! bytes: 16 flops per byte, which `mma.sync` sustains far above HBM bandwidth, so every group
//! size stays bandwidth bound.
//!
//! K and V are either contiguous or the page pool of a paged cache (`abi::layout::KeyPages`): a
//! thread's contiguous rows are a fixed stride apart, so their copies take an add each (whole
//! tiles without predicates); paged rows are translated a tile ahead into shared memory, so that
//! a block-table lookup never delays the copies. Only the addresses differ: both layouts run the
//! same arithmetic in the same order. Rescaling the accumulators is skipped on tiles where no
//! row's maximum moved.

#[cfg(target_arch = "nvptx64")]
mod combine;
#[cfg(target_arch = "nvptx64")]
mod last_split;
#[cfg(target_arch = "nvptx64")]
mod parts;
#[cfg(target_arch = "nvptx64")]
mod split;

/// One decode launch: the keys split over `splits` blocks per (K/V head, sequence),
/// `keys_per_split` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeConfig {
    pub head_dim: u32,
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
    /// part's LSE loaded at once (it halves the time of long single-sequence decodes against
    /// `Merge`, `reports/PERF_LOG_DECODE.md`).
    Parallel,
    /// No combine launch: the split block of a (K/V head, sequence) that finishes last (counted
    /// on a workspace counter) merges every split's partials of its rows, in split order; a
    /// single split writes O and LSE itself (the default: `reports/PERF_LOG_DECODE.md`).
    #[default]
    LastSplit,
}

impl DecodeCombine {
    /// Every combine, the default last.
    pub const ALL: [DecodeCombine; 3] = [
        DecodeCombine::Merge,
        DecodeCombine::Parallel,
        DecodeCombine::LastSplit,
    ];
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
/// Keys per K/V tile (one shared stage); splits are whole tiles.
pub const BLOCK_KEYS: u32 = 64;
/// Shared K/V stages: tiles `j + 1` and `j + 2` load while tile `j` is computed.
pub const STAGES: u32 = 3;
/// Most query rows per K/V head: the rows of one `mma.sync` A tile. More are prefill.
pub const MAX_ROWS: u32 = 16;
/// The compiled head dims.
pub const HEAD_DIMS: [u32; 2] = [64, 128];

/// Row stride (f32) of a warp's staged output accumulator in the final merge: 8 words of padding
/// put the 8 rows of a fragment store in different banks.
pub const fn merge_stride(head_dim: u32) -> u32 {
    head_dim + 8
}

/// Dynamic shared memory of one block: the [`STAGES`] K and V tiles (16-bit elements; the Q tile
/// shares the last stage's K tile, and after the key loop the stages hold the warps' f32 output
/// accumulators for their merge), the tensor rows of two tiles' keys (`u32`), and each warp's
/// `m` and `ℓ` per row (f32): 97 KiB at d = 128, within the 99 KiB of sm_86/sm_89 blocks.
pub const fn shared_bytes(head_dim: u32) -> u32 {
    let stages = STAGES * 2 * BLOCK_KEYS * head_dim * 2;
    let merge = (THREADS / 32) * MAX_ROWS * merge_stride(head_dim) * 4;
    let kv = if stages > merge { stages } else { merge };
    kv + 2 * BLOCK_KEYS * 4 + 2 * (THREADS / 32) * MAX_ROWS * 4
}
