//! Input checks shared by the forward and backward reference.

use attention_kernels::abi::shape::AttentionShape;

use crate::error::{Result, invalid};
use crate::options::AttentionOptions;

/// The elements a slice needs for a shape, e.g. `AttentionShape::q_elems`.
pub(super) type Need = fn(&AttentionShape) -> usize;

/// Checks options against `shape`, then each named slice against the length it needs (computed
/// only once the shape is known not to overflow).
pub(super) fn check(
    shape: &AttentionShape,
    options: &AttentionOptions,
    slices: &[(&str, usize, Need)],
) -> Result<()> {
    options.validate(shape)?;
    for &(name, len, need) in slices {
        let want = need(shape);
        if len != want {
            return Err(invalid!(
                "{name} holds {len} elements, the shape {shape:?} needs {want}"
            ));
        }
    }
    Ok(())
}
