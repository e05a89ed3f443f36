//! The attention layer every kernel family imports and none copies: masks and the policy for
//! non-finite inputs, the local window and the score modifiers, the online softmax state, the sequence a block works on, dropout, and the
//! row softmax of the tensor-core families, and their backward's pre- and post-processing.

pub mod backward;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod dropout;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod grid;
pub mod mask;
pub mod merge;
pub mod online_state;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod row_keys;
pub mod score_mod;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod sequence;
#[cfg(target_arch = "nvptx64")]
pub(crate) mod softmax;
