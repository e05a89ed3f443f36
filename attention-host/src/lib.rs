//! Host side of the attention kernels. A call reads top to bottom:
//! [`attention`] (the entry points; [`stream_api`] those on the caller's memory and stream,
//! [`borrowed`] its views) → [`problem`] (validate once) → [`plan`](mod@plan) (choose the family
//! and instance) → [`families`] (that family's launcher) → [`runtime`] (context, module, typed
//! launches, buffers). [`tensors`], [`layout`], [`score_mods`] and [`instances`] are shared by every family; [`reference`](mod@reference) is
//! the f64 CPU reference the kernels are held to, [`ledger`] and [`schedule`] the article's
//! models, [`materialized`] the three-stage baseline.

pub mod attention;
pub mod borrowed;
pub mod cudarc_attention;
pub mod dtype;
pub mod error;
pub mod families;
pub mod family;
pub mod flash_options;
pub mod fp8;
pub mod instances;
pub mod kv_cache;
pub mod layout;
pub mod ledger;
pub mod materialized;
pub mod merge;
pub mod options;
pub mod plan;
pub mod problem;
pub mod reference;
pub mod runtime;
pub mod schedule;
pub mod score_mods;
pub mod stream_api;
pub mod tensors;

/// The CUDA driver bindings the runtime is built on ([`Gpu::context`], [`Gpu::stream`] and the
/// errors' sources are its types).
pub use cudarc;

pub use attention::{
    ForwardOutput, Gradients, backward, backward_into, backward_variant_into, forward,
    forward_into, forward_variant_into, plan,
};
pub use attention_kernels::abi::layout::BlockSizes;
pub use attention_kernels::abi::shape::AttentionShape;
pub use attention_kernels::kernels::decode::DecodeCombine;
pub use borrowed::{Element, Strides, TensorMut, TensorRef};
pub use cudarc_attention::CudarcAttention;
pub use dtype::DType;
pub use error::{AttentionError, Result};
pub use family::{Direction, Family, KernelChoice};
pub use flash_options::{FlashOptions, Schedule};
pub use kv_cache::{KvCache, PagedKvCache, PagedLayout};
pub use merge::{Merged, PartShape, merge, merge_into, merge_on};
pub use options::{
    AttentionOptions, CheckedElems, Dropout, Lengths, Window, alibi_slopes, key_range,
};
pub use plan::{DeviceCaps, Plan, Tiles};
pub use problem::Problem;
pub use runtime::buffer::{DeviceF32, DeviceTensor};
pub use runtime::memory;
pub use runtime::peer::{CopyPath, CopyRoute, can_access_peer, copy_across_devices};
pub use runtime::timing;
pub use runtime::{Gpu, KernelParams, LaunchConfig};
pub use stream_api::{BackwardViews, GradientViews, backward_on, forward_on};
pub use tensors::{BackwardInputs, GradientBuffers, Workspace};
