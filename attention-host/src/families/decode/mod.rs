//! The split-KV decode family (`attention_kernels::kernels::decode`): its plan (row tile, split
//! count, workspace for the partials) and its launcher (partials, then the combine). With the
//! `candidates` feature the plan takes the candidate `mma.sync` split kernel and its one-wave
//! split count instead.

mod launch;
mod plan;

pub use attention_kernels::kernels::decode::DecodeConfig;
pub(crate) use launch::launch_forward;
pub use plan::choose_splits;
pub(crate) use plan::plan;
#[cfg(feature = "candidates")]
pub use plan::{blocks_per_sm, choose_splits_one_wave};
