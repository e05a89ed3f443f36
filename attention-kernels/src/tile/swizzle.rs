//! Shared tiles of 16-bit elements with XOR-swizzled 16-byte chunks.
//!
//! A row of `cols` elements is `cols / 8` chunks of 16 bytes. Chunk `c` of row `r` is stored at
//! chunk position `c ^ (r % 8)`: the eight rows an `ldmatrix` reads for one 8×8 matrix (same
//! logical chunk, eight consecutive rows) then land in eight different 16-byte bank groups, and so
//! do the eight consecutive chunks of one row that `cp.async` fills — no bank conflicts either way,
//! and no padding. Needs rows of at least 8 chunks (`cols >= 64`, a multiple of 64).

/// A tile at shared-space address `base` (128-byte aligned) with rows of `cols` 16-bit elements.
/// The row count is the caller's allocation; the fields are compile-time constants in kernels.
#[derive(Clone, Copy, Debug)]
pub struct SwizzledTile {
    base: u32,
    chunks: u32,
}

impl SwizzledTile {
    #[inline(always)]
    pub const fn new(base: u32, cols: u32) -> Self {
        assert!(
            cols >= 64 && cols.is_multiple_of(64),
            "swizzled rows need a multiple of 8 chunks"
        );
        SwizzledTile {
            base,
            chunks: cols / 8,
        }
    }

    /// 16-byte chunks per row.
    #[inline(always)]
    pub const fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Byte offset of logical chunk `chunk` of row `row` from the tile's start.
    #[inline(always)]
    pub const fn chunk_offset(&self, row: u32, chunk: u32) -> u32 {
        (row * self.chunks + (chunk ^ (row & 7))) * 16
    }

    /// Shared-space address of logical chunk `chunk` of row `row`.
    #[inline(always)]
    pub const fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        self.base + self.chunk_offset(row, chunk)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::HashSet;

    /// The 16-byte bank group (of 8: 32 banks × 4 bytes) an offset falls in.
    fn bank_group(offset: u32) -> u32 {
        (offset / 16) % 8
    }

    #[test]
    fn swizzle_is_a_permutation_of_each_row() {
        for cols in [64, 128, 256] {
            let tile = SwizzledTile::new(0, cols);
            for row in 0..64 {
                let offsets: HashSet<u32> = (0..tile.chunks())
                    .map(|c| tile.chunk_offset(row, c))
                    .collect();
                let expected: HashSet<u32> = (0..tile.chunks())
                    .map(|c| (row * tile.chunks() + c) * 16)
                    .collect();
                assert_eq!(offsets, expected, "cols {cols} row {row}");
            }
        }
    }

    #[test]
    fn ldmatrix_rows_and_cp_async_chunks_hit_distinct_bank_groups() {
        for cols in [64, 128] {
            let tile = SwizzledTile::new(0, cols);
            for row0 in (0..64).step_by(8) {
                for chunk in 0..tile.chunks() {
                    // ldmatrix: eight consecutive rows, one logical chunk.
                    let groups: HashSet<u32> = (row0..row0 + 8)
                        .map(|r| bank_group(tile.chunk_offset(r, chunk)))
                        .collect();
                    assert_eq!(groups.len(), 8, "cols {cols} rows {row0}.. chunk {chunk}");
                }
            }
            for row in 0..64 {
                for chunk0 in (0..tile.chunks()).step_by(8) {
                    // cp.async / 16-byte stores: eight consecutive chunks of one row.
                    let groups: HashSet<u32> = (chunk0..chunk0 + 8)
                        .map(|c| bank_group(tile.chunk_offset(row, c)))
                        .collect();
                    assert_eq!(groups.len(), 8, "cols {cols} row {row} chunks {chunk0}..");
                }
            }
        }
    }
}
