//! The semantic options of one attention call, shared by the CPU reference and the GPU kernels.
//!
//! Semantics (the article's 0x02A): `S = τ·QKᵀ`, mask before the row max, softmax, dropout on the
//! normalised probabilities with inverted scaling, `O = P_use·V`, saved `LSE = m + log ℓ` (f32).

use attention_kernels::abi::philox::DropoutRng;
use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::attn::score_mod::UNBOUNDED;
pub use attention_kernels::attn::score_mod::{Window, key_range};

use crate::error::{Result, invalid};

/// Which keys each sequence may see, beyond the causal mask.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Lengths {
    /// Every key of every batch item.
    #[default]
    Full,
    /// Batch item `b` sees keys `0 .. key_lengths[b]` only (padding mask); `len == batch`.
    KeyLengths(Vec<u32>),
    /// Packed variable-length batch: tensors hold one batch item (`batch == 1`) of concatenated
    /// sequences; sequence `s` owns query rows `cu_seqlens_q[s] .. cu_seqlens_q[s+1]` and keys
    /// `cu_seqlens_k[s] .. cu_seqlens_k[s+1]`. Both start at 0, are non-decreasing, have the same
    /// length, and end at `n_q` and `n_k`.
    Packed {
        cu_seqlens_q: Vec<u32>,
        cu_seqlens_k: Vec<u32>,
    },
}

/// Dropout on the normalised probabilities: drop probability `p` in `[0, 1)`; the mask is a pure
/// function of `(seed, offset, sequence, head, row, col)` (see `attention_kernels::abi::philox`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    pub p: f32,
    pub seed: u64,
    pub offset: u64,
}

/// Options of one attention call. `AttentionOptions::default()` is plain softmax attention with
/// `τ = 1/√d`, no mask and no dropout.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AttentionOptions {
    /// `τ`; `None` means `1/√head_dim`.
    pub scale: Option<f32>,
    /// Causal mask, bottom-right aligned: row `i` of a sequence with `n_q` rows and `n_k` keys sees
    /// keys `j <= i + n_k - n_q` (see `attention_kernels::abi::shape::causal_key_end`). With
    /// `KeyLengths` the item's `n_k` is its key length; with `Packed`, `n_q`/`n_k` are the
    /// sequence's own counts (`attention_kernels::abi::shape::allowed_key_end`).
    pub causal: bool,
    pub lengths: Lengths,
    pub dropout: Option<Dropout>,
    /// Local window `(left, right)`, bottom-right aligned like the causal mask: row `i` of a
    /// sequence with `n_q` rows and `n_k` keys sees key `j` iff
    /// `i + n_k − n_q − left <= j <= i + n_k − n_q + right` (and `j <= i + n_k − n_q` when
    /// `causal` is also set; key lengths and packed sequences give `n_q`, `n_k` as for causal).
    /// Windowed-out keys are masked keys; a row left with none has `O = 0`, `LSE = −∞` (or the
    /// sink). `None`: no window (see `attention_kernels::attn::score_mod::key_range`).
    pub window: Option<Window>,
    /// Logit softcap `c > 0`: each scaled score `s = τ·⟨q, k⟩` becomes `c · tanh(s / c)` before
    /// any bias, mask or softmax (FlashAttention's `softcap`, Gemma 2); the backward multiplies
    /// dS by `1 − tanh²(s / c)`.
    pub softcap: Option<f32>,
    /// ALiBi slopes, one per query head (`heads_q` finite values): the score of row `i`, key `j`
    /// gets `− slope_h · |i + n_k − n_q − j|` added after the softcap (FlashAttention-2's bias;
    /// under causal it is `slope_h · (j − (i + n_k − n_q))`, so P, O and the gradients match
    /// FlashAttention-2's causal kernel, whose LSE omits the row constant). No slope gradient.
    pub alibi_slopes: Option<Vec<f32>>,
    /// Sink logits, one per query head (`heads_q` finite values, gpt-oss): an extra logit
    /// `σ_h` in each row's softmax denominator with no value row, so
    /// `LSE = ln(Σ_j e^{s_j} + e^{σ_h})` and `P_j = e^{s_j − LSE}`; a row with no allowed key
    /// has `O = 0`, `LSE = σ_h`. The backward returns
    /// `dσ_h = −Σ_rows e^{σ_h − LSE} · rowsum(dO ∘ O)`.
    pub sinks: Option<Vec<f32>>,
}

impl AttentionOptions {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }
    pub fn causal(mut self, causal: bool) -> Self {
        self.causal = causal;
        self
    }
    pub fn key_lengths(mut self, key_lengths: Vec<u32>) -> Self {
        self.lengths = Lengths::KeyLengths(key_lengths);
        self
    }
    pub fn packed(mut self, cu_seqlens_q: Vec<u32>, cu_seqlens_k: Vec<u32>) -> Self {
        self.lengths = Lengths::Packed {
            cu_seqlens_q,
            cu_seqlens_k,
        };
        self
    }
    pub fn dropout(mut self, p: f32, seed: u64, offset: u64) -> Self {
        self.dropout = Some(Dropout { p, seed, offset });
        self
    }

    /// A local window of `left` keys before and `right` keys after each row's aligned diagonal
    /// (see [`AttentionOptions::window`]); `u32::MAX` leaves that side open.
    pub fn window(mut self, left: u32, right: u32) -> Self {
        self.window = Some(Window { left, right });
        self
    }
    pub fn softcap(mut self, softcap: f32) -> Self {
        self.softcap = Some(softcap);
        self
    }
    pub fn alibi_slopes(mut self, slopes: Vec<f32>) -> Self {
        self.alibi_slopes = Some(slopes);
        self
    }
    pub fn sinks(mut self, sinks: Vec<f32>) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// The window the kernels take ([`Window::NONE`] without one).
    pub fn window_or_none(&self) -> Window {
        self.window.unwrap_or(Window::NONE)
    }

    /// Whether any of window, softcap, ALiBi or sinks is on.
    pub fn has_score_mods(&self) -> bool {
        self.window.is_some() || self.modifies_scores()
    }

    /// Whether any of softcap, ALiBi or sinks is on: what a window alone does not need (the
    /// `wgmma` family runs a window alone on instances without their registers).
    pub fn modifies_scores(&self) -> bool {
        self.softcap.is_some() || self.alibi_slopes.is_some() || self.sinks.is_some()
    }

    /// `τ` for head dimension `d`.
    pub fn scale_for(&self, head_dim: u32) -> f32 {
        self.scale.unwrap_or(1.0 / (head_dim as f32).sqrt())
    }

    /// The RNG parameters the kernels and the reference use (`OFF` without dropout).
    pub fn dropout_rng(&self) -> DropoutRng {
        match self.dropout {
            Some(d) => DropoutRng::new(d.p, d.seed, d.offset).unwrap_or(DropoutRng::OFF),
            None => DropoutRng::OFF,
        }
    }

    /// Checks the options against a shape; every refusal names what is wrong.
    pub fn validate(&self, shape: &AttentionShape) -> Result<()> {
        validate_shape(shape)?;
        if let Some(s) = self.scale
            && !s.is_finite()
        {
            return Err(invalid!("scale must be finite, got {s}"));
        }
        if let Some(d) = self.dropout
            && DropoutRng::new(d.p, d.seed, d.offset).is_none()
        {
            return Err(invalid!(
                "dropout probability must be in [0, 1), got {}",
                d.p
            ));
        }
        self.validate_score_mods(shape)?;
        match &self.lengths {
            Lengths::Full => Ok(()),
            Lengths::KeyLengths(lens) => {
                if lens.len() != shape.batch as usize {
                    return Err(invalid!(
                        "{} key lengths for a batch of {}",
                        lens.len(),
                        shape.batch
                    ));
                }
                if let Some((b, &l)) = lens.iter().enumerate().find(|(_, l)| **l > shape.n_k) {
                    return Err(invalid!(
                        "key length {l} of batch item {b} exceeds n_k = {}",
                        shape.n_k
                    ));
                }
                Ok(())
            }
            Lengths::Packed {
                cu_seqlens_q,
                cu_seqlens_k,
            } => {
                if shape.batch != 1 {
                    return Err(invalid!(
                        "packed sequences need batch = 1, got {}",
                        shape.batch
                    ));
                }
                if cu_seqlens_q.len() != cu_seqlens_k.len() || cu_seqlens_q.len() < 2 {
                    return Err(invalid!(
                        "cu_seqlens_q and cu_seqlens_k must have the same length >= 2, got {} and {}",
                        cu_seqlens_q.len(),
                        cu_seqlens_k.len()
                    ));
                }
                check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, shape.n_q)?;
                check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, shape.n_k)
            }
        }
    }
}

impl AttentionOptions {
    fn validate_score_mods(&self, shape: &AttentionShape) -> Result<()> {
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid!("softcap must be finite and positive, got {c}"));
        }
        if let Some(w) = self.window
            && w == Window::NONE
        {
            return Err(invalid!(
                "a window of ({UNBOUNDED}, {UNBOUNDED}) bounds nothing: leave the window unset"
            ));
        }
        for (name, values) in [("alibi slopes", &self.alibi_slopes), ("sinks", &self.sinks)] {
            let Some(values) = values else { continue };
            if values.len() != shape.heads_q as usize {
                return Err(invalid!(
                    "{} {name} for heads_q = {} (one per query head)",
                    values.len(),
                    shape.heads_q
                ));
            }
            if let Some((h, x)) = values.iter().enumerate().find(|(_, x)| !x.is_finite()) {
                return Err(invalid!("{name} must be finite, head {h} has {x}"));
            }
        }
        Ok(())
    }
}

/// The standard ALiBi slopes of `heads` heads (Press et al.): for `n` the largest power of two
/// `<= heads`, `2^(−8k/n)` for `k = 1 ..= n`, then for the remaining heads every other slope of
/// the schedule of `2n`, `2^(−4k/n)` for `k = 1, 3, 5, …`.
pub fn alibi_slopes(heads: u32) -> Vec<f32> {
    let n = if heads == 0 { 0 } else { 1u32 << heads.ilog2() };
    let geometric = |n: u32, k: u32| 2f64.powf(-8.0 * k as f64 / n as f64) as f32;
    let mut slopes: Vec<f32> = (1..=n).map(|k| geometric(n, k)).collect();
    slopes.extend((0..heads - n).map(|k| geometric(2 * n, 2 * k + 1)));
    slopes
}

fn check_cu_seqlens(name: &str, cu: &[u32], total: u32) -> Result<()> {
    if cu[0] != 0 {
        return Err(invalid!("{name} must start at 0, got {}", cu[0]));
    }
    if let Some(w) = cu.windows(2).find(|w| w[1] < w[0]) {
        return Err(invalid!(
            "{name} must be non-decreasing, found {} then {}",
            w[0],
            w[1]
        ));
    }
    let last = *cu.last().unwrap();
    if last != total {
        return Err(invalid!(
            "{name} ends at {last} but the tensor holds {total} rows"
        ));
    }
    Ok(())
}

/// Largest row count of one tensor (`batch · n · heads`): rows, and so every extent, `batch ·
/// heads` and a row index inside a tensor, fit in `i32`.
pub const MAX_TENSOR_ROWS: u64 = i32::MAX as u64;

/// Checks a shape on its own: non-zero extents, GQA divisibility, and the bound every kernel's
/// index arithmetic relies on.
///
/// The rule: the row counts `batch · n_q · heads_q` (Q, O, LSE) and `batch · n_k · heads_kv`
/// (K, V) are at most [`MAX_TENSOR_ROWS`] (`2³¹ − 1`), and each tensor's bytes, f32 included,
/// fit in `isize`. Element counts themselves are only limited by memory: kernels compute row,
/// key, head and sequence indices in `u32` and every element or byte offset in 64 bits (B = 1,
/// N = 2²⁰, H = 32, d = 128 is 2³² elements per tensor and runs).
pub fn validate_shape(s: &AttentionShape) -> Result<()> {
    for (name, v) in [
        ("batch", s.batch),
        ("n_q", s.n_q),
        ("n_k", s.n_k),
        ("heads_q", s.heads_q),
        ("heads_kv", s.heads_kv),
        ("head_dim", s.head_dim),
        ("head_dim_v", s.head_dim_v),
    ] {
        if v == 0 {
            return Err(invalid!("{name} must be at least 1"));
        }
    }
    if !s.heads_q.is_multiple_of(s.heads_kv) {
        return Err(invalid!(
            "heads_q = {} is not a multiple of heads_kv = {}",
            s.heads_q,
            s.heads_kv
        ));
    }
    for (name, factors) in [
        ("Q", [s.batch, s.n_q, s.heads_q]),
        ("K/V", [s.batch, s.n_k, s.heads_kv]),
    ] {
        // Three u32 factors can pass u64::MAX: checked, so an overflow is a refusal, not a panic.
        let rows = factors
            .iter()
            .try_fold(1u64, |acc, &f| acc.checked_mul(f as u64));
        match rows {
            Some(rows) if rows <= MAX_TENSOR_ROWS => {}
            Some(rows) => {
                return Err(invalid!(
                    "{name} has {rows} rows (batch x sequence x heads = {factors:?}); at most {MAX_TENSOR_ROWS} are supported"
                ));
            }
            None => {
                return Err(invalid!(
                    "{name} has more than 2^64 rows (batch x sequence x heads = {factors:?}); at most {MAX_TENSOR_ROWS} are supported"
                ));
            }
        }
    }
    // Rows fit in 31 bits, so only the head dimension can make the byte counts overflow.
    let largest = [
        s.checked_q_elems()?,
        s.checked_k_elems()?,
        s.checked_o_elems()?,
        s.checked_v_elems()?,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if largest
        .checked_mul(size_of::<f32>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(invalid!(
            "a tensor of {largest} elements is larger than any address space"
        ));
    }
    Ok(())
}

/// `∏ factors` in `usize`; an overflow is `InvalidInput` naming `what`, never a panic or a wrap.
pub fn checked_elems(what: &str, factors: &[u32]) -> Result<usize> {
    factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f as usize))
        .ok_or_else(|| invalid!("{what} of {factors:?} elements overflows usize"))
}

/// The element counts of [`AttentionShape`] with checked arithmetic. `AttentionShape::q_elems`
/// and its siblings multiply unchecked (they run on the device too): on the host they are only
/// used once [`validate_shape`] (which uses these) has accepted the shape.
pub trait CheckedElems {
    /// Elements of Q or dQ.
    fn checked_q_elems(&self) -> Result<usize>;
    /// Elements of K or dK.
    fn checked_k_elems(&self) -> Result<usize>;
    /// Elements of O or dO.
    fn checked_o_elems(&self) -> Result<usize>;
    /// Elements of V or dV.
    fn checked_v_elems(&self) -> Result<usize>;
    /// Elements of one materialized `[batch, heads_q, n_q, n_k]` score tensor.
    fn checked_score_elems(&self) -> Result<usize>;
    /// Elements of the per-row state `[batch, heads_q, n_q]`.
    fn checked_row_elems(&self) -> Result<usize>;
}

impl CheckedElems for AttentionShape {
    fn checked_q_elems(&self) -> Result<usize> {
        checked_elems("Q", &[self.batch, self.n_q, self.heads_q, self.head_dim])
    }
    fn checked_k_elems(&self) -> Result<usize> {
        checked_elems("K", &[self.batch, self.n_k, self.heads_kv, self.head_dim])
    }
    fn checked_o_elems(&self) -> Result<usize> {
        checked_elems("O", &[self.batch, self.n_q, self.heads_q, self.head_dim_v])
    }
    fn checked_v_elems(&self) -> Result<usize> {
        checked_elems("V", &[self.batch, self.n_k, self.heads_kv, self.head_dim_v])
    }
    fn checked_score_elems(&self) -> Result<usize> {
        checked_elems("S", &[self.batch, self.heads_q, self.n_q, self.n_k])
    }
    fn checked_row_elems(&self) -> Result<usize> {
        checked_elems("LSE", &[self.batch, self.heads_q, self.n_q])
    }
}
