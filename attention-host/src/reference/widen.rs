//! f32 entry points: the inputs the kernels read, widened exactly to f64.

use attention_kernels::abi::shape::AttentionShape;

use super::backward::{Gradients, backward, backward_from_output, backward_magnitudes_from_output};
use super::forward::{Forward, forward, forward_rows};
use crate::error::Result;
use crate::options::AttentionOptions;

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// [`forward`] of f32 inputs (e.g. f16/bf16 tensors already widened to f32), in f64.
pub fn forward_f32(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    options: &AttentionOptions,
) -> Result<Forward> {
    forward(shape, &widen(q), &widen(k), &widen(v), options)
}

/// [`backward`] of f32 inputs, in f64.
pub fn backward_f32(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
    options: &AttentionOptions,
) -> Result<Gradients> {
    backward(shape, &widen(q), &widen(k), &widen(v), &widen(d_o), options)
}

/// [`backward_from_output`] of f32 inputs, in f64.
pub fn backward_from_output_f32(
    shape: &AttentionShape,
    (q, k, v): (&[f32], &[f32], &[f32]),
    o: &[f32],
    d_o: &[f32],
    options: &AttentionOptions,
) -> Result<Gradients> {
    backward_from_output(
        shape,
        (&widen(q), &widen(k), &widen(v)),
        &widen(o),
        &widen(d_o),
        options,
    )
}

/// [`backward_magnitudes_from_output`] of f32 inputs, in f64.
pub fn backward_magnitudes_from_output_f32(
    shape: &AttentionShape,
    (q, k, v): (&[f32], &[f32], &[f32]),
    o: &[f32],
    d_o: &[f32],
    options: &AttentionOptions,
) -> Result<Gradients> {
    backward_magnitudes_from_output(
        shape,
        (&widen(q), &widen(k), &widen(v)),
        &widen(o),
        &widen(d_o),
        options,
    )
}

/// [`forward_rows`] of f32 inputs, in f64.
pub fn forward_rows_f32(
    shape: &AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    options: &AttentionOptions,
    rows: &[(u32, u32, u32)],
) -> Result<Vec<f64>> {
    forward_rows(shape, &widen(q), &widen(k), &widen(v), options, rows)
}
