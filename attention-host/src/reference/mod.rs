//! The f64 CPU reference the kernels are held to: forward `(O, LSE)` and backward `(dQ, dK, dV)`
//! for every option of [`AttentionOptions`](crate::AttentionOptions), computed densely row by row.
//!
//! Semantics (the article's 0x02A, 0x0DB): for sequence `s`, query head `h`, row `i`, the allowed
//! keys are the prefix `0 .. allowed_key_end(i, n_q, n_k, causal)` of the sequence's own keys
//! (`key_lengths[b]` keys for padded batches, the packed sequence's keys for `cu_seqlens`).
//! `S_ij = τ·⟨q_i, k_j⟩` with K/V head `g(h) = h / (H_q / H_kv)`; `P = softmax(S)` over the
//! allowed keys; `Z_ij = keep(s, h, i, j) / (1 − p)` from [`DropoutRng`] with local row and column;
//! `O_i = Σ_j P_ij Z_ij v_j`; `LSE_i = m_i + ln ℓ_i` (of the undropped `P`). Backward:
//! `D_i = rowsum(dO_i ∘ O_i)`, `dS_ij = P_ij (Z_ij ⟨dO_i, v_j⟩ − D_i)`, `dV_j += P_ij Z_ij dO_i`,
//! `dQ_i += τ dS_ij k_j`, `dK_j += τ dS_ij q_i`.
//!
//! The local window, softcap, ALiBi and sink logits follow `attention_kernels::attn::score_mod`
//! (the kernels' own functions, in f64): allowed keys are `key_range`'s, each score is modified
//! before the softmax, the sink joins the denominator, and the backward multiplies dS by the
//! softcap's `1 − tanh²` and returns `dσ_h = −Σ_rows P_sink · D`.
//!
//! Rows with no allowed key (an empty sequence, a causal row above the diagonal, a zero key
//! length, a window that misses every key) give `O = 0`, `LSE = −∞` (the sink logit with one)
//! and zero gradients, never NaN.
//!
//! Non-finite inputs follow IEEE propagation, with one rule for `−∞`:
//! - a score of `−∞` (e.g. from an infinite input) at an allowed key is treated as masked: the key
//!   leaves the row's support, its `V` is never read, and a row whose scores are all `−∞` is a row
//!   with no allowed key;
//! - a NaN or `+∞` score at an allowed key makes that row's `O` and `LSE` NaN (`exp(∞ − ∞)`),
//!   and its gradients NaN;
//! - a NaN or infinite `V` at an allowed key reaches `O` by ordinary arithmetic (`0 · ∞ = NaN`
//!   even where `P` underflows to 0); masked keys never contribute, whatever they hold.
//!
//! [`DropoutRng`]: attention_kernels::abi::philox::DropoutRng

mod backward;
mod dropout;
mod forward;
mod merge;
mod row;
#[cfg(test)]
mod score_mod_tests;
mod sequences;
#[cfg(test)]
mod test_support;
mod validate;
mod widen;

pub use backward::{Gradients, backward, backward_from_output, backward_magnitudes_from_output};
pub use dropout::DropoutMask;
pub use forward::{Forward, forward, forward_rows};
pub use merge::{Part, merge};
pub use sequences::{Sequence, sequences};
pub use widen::{
    backward_f32, backward_from_output_f32, backward_magnitudes_from_output_f32, forward_f32,
    forward_rows_f32,
};
