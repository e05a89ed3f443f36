//! How rows and keys split into sequences (key lengths, packed batches), where a tensor's rows
//! are (strides, pages), and the exact kernels' block sizes: `#[repr(C)]` parts of the launch
//! parameters.

/// Every batch item sees all `n_k` keys.
pub const LENGTHS_FULL: u32 = 0;
/// Batch item `b` sees keys `0 .. key_lengths[b]`.
pub const LENGTHS_KEY: u32 = 1;
/// One batch item of packed sequences delimited by `cu_seqlens_q` / `cu_seqlens_k`.
pub const LENGTHS_PACKED: u32 = 2;

/// How rows and keys split into sequences. Pointers are device addresses of `u32` arrays (0 when
/// the mode does not use them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SequenceLayout {
    pub key_lengths: u64,
    pub cu_seqlens_q: u64,
    pub cu_seqlens_k: u64,
    pub mode: u32,
    /// Batch items, or packed sequences.
    pub sequences: u32,
}

/// Element strides of a `[batch, seq, heads, head_dim]` tensor whose `head_dim` is contiguous:
/// the library's own contiguous layout, or a caller's view (`[batch, heads, seq, head_dim]`, one
/// of Q, K, V inside a fused projection). The kernels that take strides load and store whole
/// 16-byte chunks, so the host passes them only strides that are multiples of 8 elements over a
/// 16-byte aligned base, whose every row lies inside the tensor's memory (64-bit offsets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorStrides {
    pub batch: u64,
    pub seq: u64,
    pub head: u64,
}

impl TensorStrides {
    /// Contiguous `[batch, seq_len, heads, head_dim]`.
    pub const fn contiguous(seq_len: u32, heads: u32, head_dim: u32) -> TensorStrides {
        let (n, h, d) = (seq_len as u64, heads as u64, head_dim as u64);
        TensorStrides {
            batch: n * h * d,
            seq: h * d,
            head: d,
        }
    }

    /// Element offset of row `(b, i, h)` (batch item or tensor, sequence row, head): the one
    /// addressing rule of every kernel, for every tensor role.
    #[inline(always)]
    pub const fn offset(&self, b: u32, i: u32, h: u32) -> u64 {
        b as u64 * self.batch + i as u64 * self.seq + h as u64 * self.head
    }
}

/// Tile extents: `B_r` query rows by `B_c` keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub block_rows: u32,
    pub block_cols: u32,
}

/// Where a sequence's key rows are in K and V (and a cache append's destination rows): the
/// address translation of the paged KV cache, with the contiguous layout as its identity.
///
/// Contiguous (`table == 0`): sequence `b`'s key row `j` is tensor row `first + j`, `first` being
/// where the caller's layout puts the sequence. Paged: K and V are a pool `[pages, page_size,
/// heads_kv, head_dim]` and key row `j` is pool row `page · page_size + j % page_size`, with
/// `page = table[b · table_width + j / page_size]` (a device `u32` array of `sequences ·
/// table_width`). `page_size` is `1 << page_shift`: a power of two, so the translation is a shift
/// and a mask per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyPages {
    pub table: u64,
    pub table_width: u32,
    pub page_shift: u32,
}

impl KeyPages {
    /// The contiguous layout.
    pub const CONTIGUOUS: KeyPages = KeyPages {
        table: 0,
        table_width: 0,
        page_shift: 0,
    };

    /// Whether this is the contiguous layout (the identity).
    #[inline(always)]
    pub const fn is_contiguous(&self) -> bool {
        self.table == 0
    }

    /// The tensor row of sequence `b`'s key row `j` (`first`: the sequence's first row in a
    /// contiguous layout).
    ///
    /// # Safety
    /// Paged: `b · table_width + j / page_size` is inside the table (the host checked every
    /// sequence's rows against its pages).
    #[inline(always)]
    pub unsafe fn row(&self, b: u32, first: u64, j: u32) -> u64 {
        if self.is_contiguous() {
            first + j as u64
        } else {
            let slot = b as usize * self.table_width as usize + (j >> self.page_shift) as usize;
            // SAFETY: the caller's contract.
            let page = unsafe { *(self.table as *const u32).add(slot) };
            ((page as u64) << self.page_shift) | (j & ((1u32 << self.page_shift) - 1)) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{KeyPages, TensorStrides};

    #[test]
    fn offsets_follow_each_layout() {
        // [B, N, H, d] with N = 5, H = 3, d = 64.
        let bnhd = TensorStrides::contiguous(5, 3, 64);
        assert_eq!(bnhd.offset(0, 0, 0), 0);
        assert_eq!(bnhd.offset(1, 2, 1), ((5 + 2) * 3 + 1) * 64);
        // [B, H, N, d]: row i of head h is i·d + h·N·d into the batch item.
        let bhnd = TensorStrides {
            batch: 3 * 5 * 64,
            seq: 64,
            head: 5 * 64,
        };
        assert_eq!(bhnd.offset(1, 2, 1), ((3 + 1) * 5 + 2) * 64);
        // K of a fused [B, N, 3, H, d] projection: the view's base is H·d in, rows 3·H·d apart.
        let fused = TensorStrides {
            batch: 5 * 3 * 3 * 64,
            seq: 3 * 3 * 64,
            head: 64,
        };
        assert_eq!(fused.offset(1, 4, 2), (5 + 4) * 3 * 3 * 64 + 2 * 64);
        // The contiguous rule in the nested order of `Sequence::q_offset` / `k_offset` (the
        // kernels without strides), for every row of a small shape.
        let (n, h, d) = (7u64, 3u64, 24u64);
        let c = TensorStrides::contiguous(n as u32, h as u32, d as u32);
        for b in 0..4u64 {
            for i in 0..n {
                for hh in 0..h {
                    let nested = ((b * n + i) * h + hh) * d;
                    assert_eq!(c.offset(b as u32, i as u32, hh as u32), nested);
                }
            }
        }
        // Past 2^32 elements: the arithmetic is 64-bit.
        let wide = TensorStrides::contiguous(1 << 20, 64, 128);
        assert_eq!(wide.offset(3, 0, 0), 3 << 33);
        assert_eq!(wide.offset((1 << 30) - 1, 0, 0), ((1u64 << 30) - 1) << 33);
    }

    #[test]
    fn paged_rows_go_through_the_table_and_contiguous_rows_are_the_identity() {
        // Two sequences of three 4-row slots; the table is a host array here.
        let table: [u32; 6] = [7, 2, 5, 0, 9, 3];
        let paged = KeyPages {
            table: table.as_ptr() as u64,
            table_width: 3,
            page_shift: 2,
        };
        let row = |p: &KeyPages, b, first, j| unsafe { p.row(b, first, j) };
        assert_eq!(row(&paged, 0, 999, 0), 28);
        assert_eq!(row(&paged, 0, 999, 3), 31);
        assert_eq!(row(&paged, 0, 999, 4), 8);
        assert_eq!(row(&paged, 0, 999, 11), 23);
        assert_eq!(row(&paged, 1, 999, 5), 37);
        assert_eq!(row(&paged, 1, 999, 10), 14);
        assert_eq!(row(&KeyPages::CONTIGUOUS, 1, 600, 5), 605);
    }
}
