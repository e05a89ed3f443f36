//! The split-KV decode family (`attention_kernels::kernels::decode`): its plan (rows, split
//! count, workspace for the partials) and its launcher (partials, then the combine).

mod launch;
mod plan;

pub use attention_kernels::kernels::decode::DecodeConfig;
pub(crate) use launch::launch_forward;
pub use plan::choose_splits;
pub(crate) use plan::plan;
