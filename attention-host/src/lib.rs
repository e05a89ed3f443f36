//! Host runtime of the attention kernels: load PTX through cust, validate every input, launch.
//! Also home of the f64 CPU reference the kernels are held to.

pub mod attention;
pub mod buffer;
pub mod dtype;
pub mod error;
pub mod flash;
pub mod instances;
pub mod ledger;
pub mod materialized;
pub mod memory;
pub mod options;
pub mod plan;
pub mod problem;
pub mod reference;
pub mod runtime;
pub mod schedule;
pub mod tensor_core;
pub mod tensor_core_backward;
pub mod timing;

pub use attention::{
    BackwardInputs, ForwardOutput, GradientBuffers, Gradients, Workspace, backward, backward_into,
    backward_variant_into, forward, forward_into, forward_variant_into, plan,
};
pub use attention_kernels::params::AttentionShape;
pub use buffer::{DeviceF32, DeviceTensor};
pub use dtype::DType;
pub use error::{AttentionError, Result};
pub use flash::{BlockSizes, FlashOptions, Schedule};
pub use options::{AttentionOptions, CheckedElems, Dropout, Lengths};
pub use plan::{DeviceCaps, Direction, Family, KernelChoice, Plan, Tiles};
pub use problem::Problem;
pub use runtime::{Gpu, KernelParams, LaunchConfig};
