//! The tensor-core families, `sm80` (`mma.sync`) and `sm90` (`wgmma`): one launcher per
//! direction serves both, since their kernels take the same parameters and differ only in the
//! entry point and tiles the plan carries.

pub(crate) mod backward;
pub(crate) mod forward;
pub(crate) mod tensor_map;
