//! Input checks shared by the forward and backward reference.

use attention_kernels::params::AttentionShape;

use crate::error::{Result, invalid};
use crate::options::AttentionOptions;

/// Checks options against `shape` and each named slice against the length it needs.
pub(super) fn check(
    shape: &AttentionShape,
    options: &AttentionOptions,
    slices: &[(&str, usize, usize)],
) -> Result<()> {
    options.validate(shape)?;
    for &(name, len, want) in slices {
        if len != want {
            return Err(invalid!(
                "{name} holds {len} elements, the shape {shape:?} needs {want}"
            ));
        }
    }
    Ok(())
}
