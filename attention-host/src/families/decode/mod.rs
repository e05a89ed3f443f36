//! The split-KV decode family (`attention_kernels::kernels::decode`): its plan (split count, one
//! wave of blocks, workspace for the partials) and its launcher (partials, then the combine).

mod launch;
mod plan;

pub use attention_kernels::kernels::decode::DecodeConfig;
pub(crate) use launch::launch_forward;
pub use plan::{PAGE_ROWS_FOR_ONE_WAVE, blocks_per_sm, choose_splits, wave_blocks_per_sm};
pub(crate) use plan::{plan, plan_paged};
