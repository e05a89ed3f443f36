//! The (head, sequence) pair a block works on, decoded from the grid's y and z as the host folded
//! them (`abi::grid`): every family's forward and backward main kernels use this one decoding.

use crate::abi::grid::unfold_heads_sequences;
use crate::arch::{block_y, block_z, grid_dim_y};

/// `(head, sequence)` of this block among `heads · sequences` pairs, or `None` for a block of a
/// folded grid past the last pair (the whole block leaves: the answer is uniform over it).
#[inline(always)]
pub fn head_and_sequence(heads: u32, sequences: u32) -> Option<(u32, u32)> {
    unfold_heads_sequences(block_y(), block_z(), grid_dim_y(), heads, sequences)
}
