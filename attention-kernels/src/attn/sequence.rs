//! Locating one sequence (a batch item or one packed sequence) and its rows in the tensors.

use crate::abi::layout::{LENGTHS_KEY, LENGTHS_PACKED, SequenceLayout, TensorStrides};
use crate::abi::shape::AttentionShape;
use crate::abi::shape::allowed_key_end;
use crate::attn::score_mod::{Window, key_range};

/// Rows and keys of one sequence. Row and key indices inside it are local (`0 .. q_len`).
#[derive(Clone, Copy)]
pub struct Sequence {
    /// Batch index of the tensors holding the sequence (0 for packed sequences).
    pub batch: u32,
    /// The `batch` coordinate of the dropout RNG: the batch item, or the packed sequence index.
    pub index: u32,
    pub q_start: u32,
    pub q_len: u32,
    pub k_start: u32,
    /// Key rows the sequence owns in K/V (and so writes in dK/dV): `n_k`, or the packed length.
    pub k_rows: u32,
    /// Keys any row may see (`k_len <= k_rows`; smaller only with key lengths).
    pub k_len: u32,
}

impl Sequence {
    /// # Safety
    /// `s < layout.sequences`, and the layout's arrays are valid device arrays of its mode.
    #[inline(always)]
    pub unsafe fn locate(layout: &SequenceLayout, shape: &AttentionShape, s: u32) -> Sequence {
        let read = |p: u64, i: u32| unsafe { *(p as *const u32).add(i as usize) };
        match layout.mode {
            LENGTHS_PACKED => {
                let (q0, q1) = (
                    read(layout.cu_seqlens_q, s),
                    read(layout.cu_seqlens_q, s + 1),
                );
                let (k0, k1) = (
                    read(layout.cu_seqlens_k, s),
                    read(layout.cu_seqlens_k, s + 1),
                );
                Sequence {
                    batch: 0,
                    index: s,
                    q_start: q0,
                    q_len: q1 - q0,
                    k_start: k0,
                    k_rows: k1 - k0,
                    k_len: k1 - k0,
                }
            }
            mode => {
                let k_len = if mode == LENGTHS_KEY {
                    read(layout.key_lengths, s)
                } else {
                    shape.n_k
                };
                Sequence {
                    batch: s,
                    index: s,
                    q_start: 0,
                    q_len: shape.n_q,
                    k_start: 0,
                    k_rows: shape.n_k,
                    k_len,
                }
            }
        }
    }

    /// Batch item `b` of a call without length masks: every row sees all `n_k` keys (the
    /// tensor-core instances without length masks).
    #[inline(always)]
    pub fn full(shape: &AttentionShape, b: u32) -> Sequence {
        Sequence {
            batch: b,
            index: b,
            q_start: 0,
            q_len: shape.n_q,
            k_start: 0,
            k_rows: shape.n_k,
            k_len: shape.n_k,
        }
    }

    #[inline(always)]
    pub fn key_end(&self, i: u32, causal: bool) -> u32 {
        allowed_key_end(i, self.q_len, self.k_len, causal)
    }

    /// The keys `start .. end` local row `i` may see under the causal mask and the window
    /// ([`key_range`] over the sequence's own rows and keys).
    #[inline(always)]
    pub fn key_range(&self, i: u32, causal: bool, window: Window) -> (u32, u32) {
        key_range(i, self.q_len, self.k_len, causal, window)
    }

    /// The keys any of local rows `i0 ..= i1` may see, as whole blocks of `block` keys:
    /// `first .. end` with `first` a multiple of `block` (both ends of [`key_range`] grow with
    /// the row); blocks outside it are skipped.
    #[inline(always)]
    pub fn block_key_range(
        &self,
        i0: u32,
        i1: u32,
        causal: bool,
        window: Window,
        block: u32,
    ) -> (u32, u32) {
        let (start, _) = self.key_range(i0, causal, window);
        let (_, end) = self.key_range(i1, causal, window);
        (start / block * block, end)
    }

    /// Element offset of (local query row `i`, head `h`) in a Q-shaped tensor (Q, O, dQ, dO)
    /// with `strides`.
    #[inline(always)]
    pub fn q_row(&self, strides: &TensorStrides, i: u32, h: u32) -> u64 {
        strides.offset(self.batch, self.q_start + i, h)
    }

    /// Element offset of (local key `j`, K/V head `hk`) in a K-shaped tensor (K, V, dK, dV)
    /// with `strides`.
    #[inline(always)]
    pub fn k_row(&self, strides: &TensorStrides, j: u32, hk: u32) -> u64 {
        strides.offset(self.batch, self.k_start + j, hk)
    }

    /// [`Sequence::q_row`] in a contiguous tensor, for the kernels that take no strides (exact,
    /// decode): the same offset, in the arithmetic order those kernels were tuned with (the
    /// strided form costs the decode kernels registers); `abi::layout`'s tests check the two
    /// agree. Q and dQ rows: `head_dim` elements.
    #[inline(always)]
    pub fn q_offset(&self, shape: &AttentionShape, i: u32, h: u32) -> usize {
        self.q_row_index(shape, i, h) * shape.head_dim as usize
    }

    /// [`Sequence::q_offset`] in O or dO, whose rows hold `head_dim_v` elements.
    #[inline(always)]
    pub fn o_offset(&self, shape: &AttentionShape, i: u32, h: u32) -> usize {
        self.q_row_index(shape, i, h) * shape.head_dim_v as usize
    }

    /// [`Sequence::k_row`] in a contiguous tensor (as [`Sequence::q_offset`]): K and dK.
    #[inline(always)]
    pub fn k_offset(&self, shape: &AttentionShape, j: u32, hk: u32) -> usize {
        self.k_row_index(shape, j, hk) * shape.head_dim as usize
    }

    /// [`Sequence::k_offset`] in V or dV, whose rows hold `head_dim_v` elements.
    #[inline(always)]
    pub fn v_offset(&self, shape: &AttentionShape, j: u32, hk: u32) -> usize {
        self.k_row_index(shape, j, hk) * shape.head_dim_v as usize
    }

    /// Row of (local query row `i`, head `h`) in a contiguous `[batch, n_q, heads_q, ·]` tensor.
    #[inline(always)]
    fn q_row_index(&self, shape: &AttentionShape, i: u32, h: u32) -> usize {
        (self.batch as usize * shape.n_q as usize + (self.q_start + i) as usize)
            * shape.heads_q as usize
            + h as usize
    }

    /// Row of (local key `j`, K/V head `hk`) in a contiguous `[batch, n_k, heads_kv, ·]` tensor.
    #[inline(always)]
    fn k_row_index(&self, shape: &AttentionShape, j: u32, hk: u32) -> usize {
        (self.batch as usize * shape.n_k as usize + (self.k_start + j) as usize)
            * shape.heads_kv as usize
            + hk as usize
    }

    /// Index of (local query row `i`, head `h`) in LSE or D.
    #[inline(always)]
    pub fn row_index(&self, shape: &AttentionShape, i: u32, h: u32) -> usize {
        (self.batch as usize * shape.heads_q as usize + h as usize) * shape.n_q as usize
            + (self.q_start + i) as usize
    }
}
