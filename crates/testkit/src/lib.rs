//! What the tests, benches and the `flash-attn` tool share and the library does not ship: seeded
//! inputs, the examples' options, the GPU-or-skip guard and error measures of the tests, sampled-row checks, and the
//! evidence bundles of timed runs.

pub mod args;
pub mod bench;
pub mod caller_stream;
pub mod family_run;
pub mod inputs;
pub mod sampled_rows;
pub mod testing;
