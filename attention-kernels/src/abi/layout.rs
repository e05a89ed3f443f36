//! How rows and keys split into sequences (key lengths, packed batches), and the exact kernels'
//! block sizes: `#[repr(C)]` parts of the launch parameters.

/// Every batch item sees all `n_k` keys.
pub const LENGTHS_FULL: u32 = 0;
/// Batch item `b` sees keys `0 .. key_lengths[b]`.
pub const LENGTHS_KEY: u32 = 1;
/// One batch item of packed sequences delimited by `cu_seqlens_q` / `cu_seqlens_k`.
pub const LENGTHS_PACKED: u32 = 2;

/// How rows and keys split into sequences. Pointers are device addresses of `u32` arrays (0 when
/// the mode does not use them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SequenceLayout {
    pub key_lengths: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub mode: u32,
    /// Batch items, or packed sequences.
    pub sequences: u32,
}

/// Tile extents: `B_r` query rows by `B_c` keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub block_rows: u32,
    pub block_cols: u32,
}
