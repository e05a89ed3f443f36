//! Host runtime of the attention kernels: load PTX through cust, validate every input, launch.
//! Also home of the f64 CPU reference the kernels are held to.

pub mod buffer;
pub mod dtype;
pub mod error;
pub mod flash;
pub mod ledger;
pub mod materialized;
pub mod memory;
pub mod options;
pub mod reference;
pub mod runtime;
pub mod schedule;
pub mod tensor_core;
pub mod tensor_core_backward;
pub mod timing;

pub use attention_kernels::params::AttentionShape;
pub use buffer::{DeviceF32, DeviceTensor};
pub use dtype::DType;
pub use error::{AttentionError, Result};
pub use flash::{
    BlockSizes, FlashOptions, ForwardOutput, Gradients, Schedule, flash_backward, flash_forward,
};
pub use options::{AttentionOptions, CheckedElems, Dropout, Lengths};
pub use runtime::{Gpu, KernelParams, LaunchConfig};
