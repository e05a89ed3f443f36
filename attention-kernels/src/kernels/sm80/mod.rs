//! The `mma.sync` family (any sm_80+ device): forward and backward tile configurations and
//! kernels. The backward's preprocess and dQ conversion serve the `sm90` backward too.

pub mod backward;
pub mod forward;
