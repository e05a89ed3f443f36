//! How rows and keys split into sequences (key lengths, packed batches), and the exact kernels'
//! block sizes: `#[repr(C)]` parts of the launch parameters.

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

    /// The tensor row of sequence `b`'s key row `j` (`first`: the sequence's first row in a
    /// contiguous layout).
    ///
    /// # Safety
    /// Paged: `b · table_width + j / page_size` is inside the table (the host checked every
    /// sequence's rows against its pages).
    #[inline(always)]
    pub unsafe fn row(&self, b: u32, first: u64, j: u32) -> u64 {
        if self.table == 0 {
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
    use super::KeyPages;

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
