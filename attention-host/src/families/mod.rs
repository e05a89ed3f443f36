//! One launcher per kernel family, siblings over the shared layers (the sequence layout, the
//! workspace, the runtime). `plan` decides which runs; `attention` hands it the call.

pub mod decode;
pub mod exact;
pub(crate) mod tensor_core;
