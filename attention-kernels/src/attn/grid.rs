//! The (head, sequence) pair a block works on, decoded from the grid's y and z as the host folded
//! them (`abi::grid`): every family's forward and backward main kernels use this one decoding.

use crate::abi::grid::unfold_heads_sequences;
use crate::arch::{block_y, block_z, grid_dim_y, opaque};

/// `(head, sequence)` of this block among `heads · sequences` pairs, or `None` for a block of a
/// folded grid past the last pair (the whole block leaves: the answer is uniform over it).
#[inline(always)]
pub fn head_and_sequence(heads: u32, sequences: u32) -> Option<(u32, u32)> {
    unfold_heads_sequences(block_y(), block_z(), grid_dim_y(), heads, sequences)
}

/// The head of [`head_and_sequence`] (no range check: for blocks past it), recomputed where it is
/// used from the special registers: a loop that needs it then holds no register for it, as it
/// held none when the head was `block_y()` itself.
#[inline(always)]
pub fn head_here(heads: u32) -> u32 {
    (opaque(block_y()) + opaque(grid_dim_y()) * opaque(block_z())) % heads
}
