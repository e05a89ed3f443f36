//! The shape of one call and the causal alignment, shared by the host, the kernels and the CPU
//! reference.

/// Shape of one attention call. `heads_q % heads_kv == 0` (GQA/MQA when `heads_kv < heads_q`).
/// Q, K, dQ and dK rows hold `head_dim` elements; V, O, dV and dO rows hold `head_dim_v`, which
/// most models keep equal to `head_dim` ([`AttentionShape::new`]) and some do not (DeepSeek's
/// MLA: 192 for `Q·Kᵀ`, 128 for V).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AttentionShape {
    pub batch: u32,
    pub n_q: u32,
    pub n_k: u32,
    pub heads_q: u32,
    pub heads_kv: u32,
    /// Head dim of Q and K: the inner dimension of the scores.
    pub head_dim: u32,
    /// Head dim of V and O.
    pub head_dim_v: u32,
}

impl AttentionShape {
    /// A shape whose V and O rows have the head dim of Q and K.
    pub const fn new(
        batch: u32,
        n_q: u32,
        n_k: u32,
        heads_q: u32,
        heads_kv: u32,
        head_dim: u32,
    ) -> Self {
        AttentionShape {
            batch,
            n_q,
            n_k,
            heads_q,
            heads_kv,
            head_dim,
            head_dim_v: head_dim,
        }
    }
    /// The same shape with V and O rows of `head_dim_v` elements.
    pub const fn with_head_dim_v(self, head_dim_v: u32) -> Self {
        AttentionShape { head_dim_v, ..self }
    }
    /// The larger of the two head dims: what a kernel's tiles are padded to.
    pub const fn widest_head_dim(&self) -> u32 {
        if self.head_dim > self.head_dim_v {
            self.head_dim
        } else {
            self.head_dim_v
        }
    }
    /// Elements of Q or dQ.
    pub const fn q_elems(&self) -> usize {
        self.batch as usize * self.n_q as usize * self.heads_q as usize * self.head_dim as usize
    }
    /// Elements of O or dO.
    pub const fn o_elems(&self) -> usize {
        self.batch as usize * self.n_q as usize * self.heads_q as usize * self.head_dim_v as usize
    }
    /// Elements of K or dK.
    pub const fn k_elems(&self) -> usize {
        self.batch as usize * self.n_k as usize * self.heads_kv as usize * self.head_dim as usize
    }
    /// Elements of V or dV.
    pub const fn v_elems(&self) -> usize {
        self.batch as usize * self.n_k as usize * self.heads_kv as usize * self.head_dim_v as usize
    }
    /// Elements of one materialized `[batch, heads_q, n_q, n_k]` score or probability tensor.
    pub const fn score_elems(&self) -> usize {
        self.batch as usize * self.heads_q as usize * self.n_q as usize * self.n_k as usize
    }
    /// Elements of the per-row saved state (`LSE`), laid out `[batch, heads_q, n_q]`.
    pub const fn row_elems(&self) -> usize {
        self.batch as usize * self.heads_q as usize * self.n_q as usize
    }
    /// The K/V head that query head `h` reads: `g(h) = h / (H_q / H_kv)`.
    pub const fn kv_head(&self, h: u32) -> u32 {
        h / (self.heads_q / self.heads_kv)
    }
}

/// Causal alignment: query row `i` may see key `j` iff `j <= i + (n_k - n_q)` (bottom-right
/// aligned, as FlashAttention-2 and PyTorch's `is_causal` with `N_q != N_k` in FA2 do), so the last
/// query row always sees every key. Returns the exclusive end of the allowed key range for row `i`
/// without the key-length limit.
pub const fn causal_key_end(i: u32, n_q: u32, n_k: u32) -> u32 {
    let end = i as i64 + 1 + n_k as i64 - n_q as i64;
    if end < 0 {
        0
    } else if end > n_k as i64 {
        n_k
    } else {
        end as u32
    }
}

/// Exclusive end of the keys query row `i` may see in a sequence of `n_q` rows and `n_k` keys: the
/// allowed keys of every row are the prefix `0 .. allowed_key_end`. For per-item key lengths and
/// packed sequences, `n_q`/`n_k` are that sequence's own counts, so causal alignment follows the
/// keys the sequence really has.
pub const fn allowed_key_end(i: u32, n_q: u32, n_k: u32, causal: bool) -> u32 {
    if causal {
        causal_key_end(i, n_q, n_k)
    } else {
        n_k
    }
}
