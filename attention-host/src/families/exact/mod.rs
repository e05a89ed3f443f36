//! The exact SIMT family: the paper's block-size rule and the forward and backward launchers.

pub(crate) mod backward;
pub mod blocks;
pub(crate) mod forward;

pub use blocks::{KernelFamily, choose_block_sizes, paper_block_sizes};

/// Threads per block of every exact kernel: 8 warps, enough to hide shared-memory latency while
/// the tiles fit one block per multiprocessor.
pub const THREADS: u32 = 256;
