//! The split-KV decode family (`attention_kernels::kernels::decode`): its plan (row tile, split
//! count, workspace for the partials) and its launcher (partials, then the strided merge).

mod launch;
mod plan;

pub(crate) use launch::launch_forward;
pub(crate) use plan::plan;
pub use plan::{DecodeConfig, choose_splits};
