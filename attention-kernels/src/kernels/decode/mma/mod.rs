//! CANDIDATE (the `candidates` feature; not yet run on a GPU): the split-KV decode kernel on
//! `mma.sync` tensor cores, `flash_decode_mma_{bf16,f16}_d{64,128}`, meant to replace the SIMT
//! split kernel (`super`). Same grid `(splits, H_kv, B)`, same partials and combines; with the
//! feature the decode plan picks it, and one wave of splits (`blocks_per_sm` in the host's plan).
//!
//! On the tensor cores (`mma.sync` m16n8k16, f32 accumulators): the group's rows (`H_q / H_kv ·
//! N_q`, at most [`MAX_ROWS`]) are the 16 rows of the A tile (`S = Q·Kᵀ`, then `O += P·V` with P
//! from registers), padded with zero rows that see no key. K/V tiles of [`BLOCK_KEYS`] keys
//! stream through [`STAGES`] shared stages (`cp.async`, two tiles in flight while one is
//! computed, one barrier per tile); each of the four warps takes 16 keys of a tile with its own
//! online softmax state, and the warps' states are merged once at the end. The keys' flops are
//! `4·16·d` per key whatever the group, on `4·d` bytes: 16 flops per byte, which `mma.sync`
//! sustains far above HBM bandwidth, so every group size stays bandwidth bound.
//!
//! K and V are either contiguous or the page pool of a paged cache: each key's tensor row comes
//! from `abi::layout::KeyPages` (the identity, or a block-table lookup), translated a tile ahead
//! into shared memory, so both layouts run the same code and the same arithmetic in the same
//! order.

#[cfg(target_arch = "nvptx64")]
mod kernel;

pub use super::THREADS;

/// Keys per K/V tile (one shared stage); splits are whole tiles.
pub const BLOCK_KEYS: u32 = 64;
/// Shared K/V stages: tiles `j + 1` and `j + 2` load while tile `j` is computed.
pub const STAGES: u32 = 3;
/// Most query rows per K/V head: the rows of one `mma.sync` A tile. More are prefill.
pub const MAX_ROWS: u32 = 16;

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
