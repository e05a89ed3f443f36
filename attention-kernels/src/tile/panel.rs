//! Shared tiles in the layout `wgmma` reads with 128-byte swizzling: the columns are cut into
//! panels of 64 16-bit elements (128 bytes), each panel stores all rows at 128 bytes apart, and
//! 16-byte chunk `c` of row `r` sits at chunk position `c ^ (r % 8)` inside its row. Every 8 rows of
//! a panel form one 1024-byte swizzle atom.
//!
//! The same bytes serve both operand orientations (PTX ISA, "matrix descriptor"):
//! - K-major (Q and K in `Q·Kᵀ`, rows = M or N, columns = K): 8-row groups are 1024 bytes apart
//!   (stride offset); one k-step of 16 columns is 32 bytes inside a panel row, so the descriptor of
//!   k-step `kk` starts `(kk % 4) · 32` bytes into panel `kk / 4`.
//! - MN-major (V in `P·V`, rows = K = keys, columns = N = head dim): 8 key rows are 1024 bytes
//!   apart (stride offset), panels of 64 columns one panel apart (leading offset).
//!
//! Like `SwizzledTile`, eight consecutive chunks of a row and one chunk of eight consecutive rows
//! land in eight different bank groups, so `cp.async` fills and 16-byte reads are conflict-free.

/// A tile at shared-space address `base` (1024-byte aligned) with `rows` rows of `cols` 16-bit
/// elements (`cols` a multiple of 64, `rows` a multiple of 8).
#[derive(Clone, Copy, Debug)]
pub struct PanelTile {
    base: u32,
    rows: u32,
    chunks: u32,
}

/// Bytes of one row of a panel: 64 elements.
pub const PANEL_ROW_BYTES: u32 = 128;
/// Bytes of one swizzle atom: 8 panel rows.
pub const ATOM_BYTES: u32 = 8 * PANEL_ROW_BYTES;

impl PanelTile {
    #[inline(always)]
    pub const fn new(base: u32, rows: u32, cols: u32) -> Self {
        assert!(
            cols.is_multiple_of(64) && rows.is_multiple_of(8),
            "panels need columns in 64s and rows in 8s"
        );
        PanelTile {
            base,
            rows,
            chunks: cols / 8,
        }
    }

    /// 16-byte chunks per row.
    #[inline(always)]
    pub const fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Bytes from one panel to the next.
    #[inline(always)]
    pub const fn panel_bytes(&self) -> u32 {
        self.rows * PANEL_ROW_BYTES
    }

    /// Byte offset of logical chunk `chunk` of row `row` from the tile's start.
    #[inline(always)]
    pub const fn chunk_offset(&self, row: u32, chunk: u32) -> u32 {
        (chunk / 8) * self.panel_bytes() + row * PANEL_ROW_BYTES + ((chunk % 8) ^ (row % 8)) * 16
    }

    /// Shared-space address of logical chunk `chunk` of row `row`.
    #[inline(always)]
    pub const fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        self.base + self.chunk_offset(row, chunk)
    }

    /// Start address, leading and stride byte offsets of the K-major operand made of rows
    /// `row0 ..` (a multiple of 8) and columns `16 kk .. 16 kk + 16`.
    #[inline(always)]
    pub const fn k_major(&self, row0: u32, kk: u32) -> (u32, u32, u32) {
        let start = self.base + row0 * PANEL_ROW_BYTES + self.k_step_offset(kk);
        // The leading offset is unused when one k-step lies inside the 128-byte swizzle row.
        (start, 16, ATOM_BYTES)
    }

    /// Bytes from the K-major operand of k-step 0 to that of k-step `kk` (the same rows).
    #[inline(always)]
    pub const fn k_step_offset(&self, kk: u32) -> u32 {
        (kk / 4) * self.panel_bytes() + (kk % 4) * 32
    }

    /// Start address, leading and stride byte offsets of the MN-major operand made of rows
    /// (the K dimension) `k0 .. k0 + 16` (`k0` a multiple of 8) and the columns from `col0` on
    /// (a multiple of 64, or of 8 when the operand's columns end inside that panel).
    #[inline(always)]
    pub const fn mn_major(&self, k0: u32, col0: u32) -> (u32, u32, u32) {
        let start = self.base + (col0 / 64) * self.panel_bytes() + (col0 % 64) * 2;
        (
            start + Self::mn_step_offset(k0),
            self.panel_bytes(),
            ATOM_BYTES,
        )
    }

    /// Bytes from the MN-major operand of rows `0 ..` to that of rows `k0 ..` (the same
    /// columns).
    #[inline(always)]
    pub const fn mn_step_offset(k0: u32) -> u32 {
        k0 * PANEL_ROW_BYTES
    }
}

/// A [`PanelTile`] read as runs of `run` logical chunks, `stride` chunks apart: the tile itself
/// (`run == stride`), or two runs, the second from the middle of the tile. The sliced `wgmma`
/// backward stores each warpgroup's head-dim slice from a 128-column boundary this way, so that
/// a slice narrower than 128 columns (d = 160 and 192 in halves) is one MN-major operand that
/// starts a panel. Every method takes logical coordinates; the chunks past each run are never
/// read or written through them.
#[derive(Clone, Copy, Debug)]
pub struct GappedTile {
    tile: PanelTile,
    run: u32,
    stride: u32,
}

impl GappedTile {
    /// Runs of `run` chunks, `stride` apart (see the type). A gap must keep k-steps (16 columns)
    /// whole and may not hold a panel's start.
    #[inline(always)]
    pub const fn new(tile: PanelTile, run: u32, stride: u32) -> Self {
        assert!(
            run == stride
                || (2 * stride == tile.chunks
                    && run < stride
                    && run.is_multiple_of(2)
                    && stride - run < 8),
            "two runs, each from a panel, k-steps whole"
        );
        GappedTile { tile, run, stride }
    }

    /// The tile's physical chunk of logical chunk `chunk`.
    #[inline(always)]
    pub const fn physical(&self, chunk: u32) -> u32 {
        if chunk >= self.run {
            chunk + self.stride - self.run
        } else {
            chunk
        }
    }

    /// Logical 16-byte chunks per row.
    #[inline(always)]
    pub const fn chunks(&self) -> u32 {
        if self.run == self.stride {
            self.tile.chunks
        } else {
            2 * self.run
        }
    }

    /// Shared-space address of logical chunk `chunk` of row `row`.
    #[inline(always)]
    pub const fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        self.tile.chunk_addr(row, self.physical(chunk))
    }

    /// The logical column that physical panel `panel` starts with; a copy of 64 columns from
    /// there fills the panel's part of a run (what else it writes is never read).
    #[inline(always)]
    pub const fn panel_origin(&self, panel: u32) -> u32 {
        let first = 8 * panel;
        8 * if first >= self.stride {
            first - (self.stride - self.run)
        } else {
            first
        }
    }

    /// The tile's k-step of logical k-step `kk` (16 columns: two chunks). Like [`physical`],
    /// written so that a tile without a gap folds to `kk` itself.
    ///
    /// [`physical`]: GappedTile::physical
    #[inline(always)]
    const fn physical_step(&self, kk: u32) -> u32 {
        if 2 * kk >= self.run {
            kk + (self.stride - self.run) / 2
        } else {
            kk
        }
    }

    /// As [`PanelTile::k_major`], logical k-step `kk`.
    #[inline(always)]
    pub const fn k_major(&self, row0: u32, kk: u32) -> (u32, u32, u32) {
        self.tile.k_major(row0, self.physical_step(kk))
    }

    /// As [`PanelTile::k_step_offset`], logical k-step `kk`.
    #[inline(always)]
    pub const fn k_step_offset(&self, kk: u32) -> u32 {
        self.tile.k_step_offset(self.physical_step(kk))
    }

    /// As [`PanelTile::mn_major`], from logical column `col0` (a multiple of 8) on, within one
    /// run.
    #[inline(always)]
    pub const fn mn_major(&self, k0: u32, col0: u32) -> (u32, u32, u32) {
        let col = if col0 >= 8 * self.run {
            col0 + 8 * (self.stride - self.run)
        } else {
            col0
        };
        self.tile.mn_major(k0, col)
    }
}

/// Byte offset of f32 column `col` (0..32) of row `row` inside one panel read as a box of 32
/// f32 columns: 128 bytes a row in the panels' 128-byte swizzle, the layout of a tensor map's
/// f32 box of 32 columns. The d = 256 backward stages dQ this way for the accelerator's bulk
/// reductions (`kernels::sm90::bulk_dq`), each lane a fragment's pair of columns at once.
#[inline(always)]
pub const fn f32_box_offset(row: u32, col: u32) -> u32 {
    row * PANEL_ROW_BYTES + ((col / 4) ^ (row % 8)) * 16 + 4 * (col % 4)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::HashSet;

    fn bank_group(offset: u32) -> u32 {
        (offset / 16) % 8
    }

    #[test]
    fn panels_are_a_permutation_of_the_tile() {
        for (rows, cols) in [(64, 64), (128, 128), (64, 128), (8, 256)] {
            let tile = PanelTile::new(0, rows, cols);
            let offsets: HashSet<u32> = (0..rows)
                .flat_map(|r| (0..tile.chunks()).map(move |c| tile.chunk_offset(r, c)))
                .collect();
            let all: HashSet<u32> = (0..rows * cols / 8).map(|i| 16 * i).collect();
            assert_eq!(offsets, all, "{rows}×{cols}");
        }
    }

    /// The hardware's 128-byte swizzle: inside each 1024-byte atom, address bits 4–6 are XORed with
    /// bits 7–9. Our chunk of (row, col) must be where the unswizzled canonical layout lands.
    #[test]
    fn layout_is_the_hardware_128_byte_swizzle() {
        let tile = PanelTile::new(0, 128, 128);
        for row in 0..128 {
            for chunk in 0..16 {
                let plain = (chunk / 8) * tile.panel_bytes() + row * 128 + (chunk % 8) * 16;
                let swizzled = plain ^ (((plain >> 7) & 7) << 4);
                assert_eq!(
                    tile.chunk_offset(row, chunk),
                    swizzled,
                    "row {row} chunk {chunk}"
                );
            }
        }
    }

    /// The f32 box a panel holds: each element where the hardware's 128-byte swizzle puts
    /// it, all 64 × 32 of them apart, and the chunks the panel's own layout names.
    #[test]
    fn f32_boxes_are_the_hardware_128_byte_swizzle() {
        let panel = PanelTile::new(0, 64, 64);
        let mut seen = HashSet::new();
        for row in 0..64 {
            for col in 0..32 {
                let plain = row * 128 + col * 4;
                let swizzled = plain ^ (((plain >> 7) & 7) << 4);
                assert_eq!(f32_box_offset(row, col), swizzled, "row {row} col {col}");
                assert!(seen.insert(swizzled));
            }
            for chunk in 0..8 {
                assert_eq!(
                    f32_box_offset(row, 4 * chunk),
                    panel.chunk_offset(row, chunk)
                );
            }
        }
        assert_eq!(seen.len() as u32, panel.panel_bytes() / 4);
    }

    #[test]
    fn descriptors_step_through_panels() {
        let tile = PanelTile::new(1024, 128, 128);
        assert_eq!(tile.k_major(0, 0), (1024, 16, 1024));
        assert_eq!(tile.k_major(64, 3), (1024 + 64 * 128 + 96, 16, 1024));
        assert_eq!(tile.k_major(0, 4), (1024 + 128 * 128, 16, 1024));
        assert_eq!(tile.mn_major(16, 0), (1024 + 16 * 128, 128 * 128, 1024));
        assert_eq!(
            tile.mn_major(16, 64),
            (1024 + 128 * 128 + 16 * 128, 128 * 128, 1024)
        );
        assert_eq!(tile.mn_major(0, 32), (1024 + 64, 128 * 128, 1024));
    }

    #[test]
    fn fills_and_row_reads_hit_distinct_bank_groups() {
        let tile = PanelTile::new(0, 64, 128);
        for row in 0..64 {
            for chunk0 in (0..16).step_by(8) {
                let groups: HashSet<u32> = (chunk0..chunk0 + 8)
                    .map(|c| bank_group(tile.chunk_offset(row, c)))
                    .collect();
                assert_eq!(groups.len(), 8);
            }
        }
        for row0 in (0..64).step_by(8) {
            for chunk in 0..16 {
                let groups: HashSet<u32> = (row0..row0 + 8)
                    .map(|r| bank_group(tile.chunk_offset(r, chunk)))
                    .collect();
                assert_eq!(groups.len(), 8);
            }
        }
    }

    #[test]
    fn gapped_tile_skips_its_gap() {
        let tile = PanelTile::new(1024, 64, 256);
        // d = 192 in two slices of 96 columns, each from a 128-column boundary.
        let gapped = GappedTile::new(tile, 12, 16);
        assert_eq!(gapped.chunks(), 24);
        assert_eq!(gapped.chunk_addr(5, 11), tile.chunk_addr(5, 11));
        assert_eq!(gapped.chunk_addr(5, 12), tile.chunk_addr(5, 16));
        assert_eq!(gapped.chunk_addr(63, 23), tile.chunk_addr(63, 27));
        assert_eq!(
            (0..4)
                .map(|p| gapped.panel_origin(p))
                .collect::<std::vec::Vec<_>>(),
            [0, 64, 96, 160]
        );
        assert_eq!(gapped.k_step_offset(5), tile.k_step_offset(5));
        assert_eq!(gapped.k_step_offset(6), tile.k_step_offset(8));
        assert_eq!(gapped.k_major(0, 11), tile.k_major(0, 13));
        assert_eq!(gapped.mn_major(16, 96), tile.mn_major(16, 128));
        assert_eq!(gapped.mn_major(16, 0), tile.mn_major(16, 0));
        // d = 160: slices of 80.
        let gapped = GappedTile::new(tile, 10, 16);
        assert_eq!(
            (0..4)
                .map(|p| gapped.panel_origin(p))
                .collect::<std::vec::Vec<_>>(),
            [0, 64, 80, 144]
        );
        assert_eq!(gapped.k_step_offset(4), tile.k_step_offset(4));
        assert_eq!(gapped.k_step_offset(5), tile.k_step_offset(8));
        assert_eq!(gapped.mn_major(0, 80), tile.mn_major(0, 128));
        // Every logical chunk lands on a distinct physical one, none in the gap.
        let physical: HashSet<u32> = (0..gapped.chunks()).map(|c| gapped.physical(c)).collect();
        assert_eq!(physical.len(), 20);
        assert!(physical.iter().all(|&c| !(10..16).contains(&c) && c < 26));
        // Without a gap, the tile itself.
        let plain = GappedTile::new(tile, 32, 32);
        for c in 0..32 {
            assert_eq!(plain.chunk_addr(9, c), tile.chunk_addr(9, c));
        }
        assert_eq!(plain.panel_origin(3), 192);
    }
}
