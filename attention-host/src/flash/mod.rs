//! Host side of the exact tiled kernels: options, the paper's block-size rule, the sequence layout
//! on the device, and the forward and backward launchers.

pub mod backward;
pub mod blocks;
pub mod forward;
pub mod layout;
pub mod options;

pub use attention_kernels::flash::params::BlockSizes;
pub use blocks::{KernelFamily, choose_block_sizes, paper_block_sizes};
pub use options::{FlashOptions, Schedule};

/// Threads per block of every tiled kernel: 8 warps, enough to hide shared-memory latency while
/// the tiles fit one block per multiprocessor.
pub const THREADS: u32 = 256;
