//! Shared-memory addresses of the backward's fragment moves, as plain arithmetic so that they
//! compile for the host too, where a model of `ldmatrix` and of the `mma.sync` fragment layouts
//! checks them (the tests below).

use super::SwizzledTile;

impl SwizzledTile {
    /// Row address lane `lane` gives `ldmatrix.x4.trans` so that the four matrices form the A
    /// operand (16×16) whose rows are columns `8 chunk0 .. 8 chunk0 + 16` of the tile and whose k
    /// index runs over tile rows `row0 .. row0 + 16`. A-register order (rows 0-7, k 0-7),
    /// (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) is, in the stored tile, (rows 0-7, chunk 0),
    /// (rows 0-7, chunk 1), (rows 8-15, chunk 0), (rows 8-15, chunk 1).
    #[inline(always)]
    pub const fn a_trans_addr(&self, row0: u32, chunk0: u32, lane: u32) -> u32 {
        self.chunk_addr(
            row0 + (lane & 7) + ((lane >> 4) << 3),
            chunk0 + ((lane >> 3) & 1),
        )
    }

    /// Where lane (g, t) stores the four words of an A operand built from accumulators
    /// (`MmaElem::pack_a`) so that the tile holds it row-major at rows `row0 .. row0 + 16`, chunks
    /// `c`, `c + 1`: rows g and g + 8, columns 2t, 2t + 1 of each chunk.
    #[inline(always)]
    pub const fn quad_addrs(&self, row0: u32, c: u32, g: u32, t: u32) -> [u32; 4] {
        [
            self.chunk_addr(row0 + g, c) + 4 * t,
            self.chunk_addr(row0 + g + 8, c) + 4 * t,
            self.chunk_addr(row0 + g, c + 1) + 4 * t,
            self.chunk_addr(row0 + g + 8, c + 1) + 4 * t,
        ]
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::HashMap;
    use std::vec::Vec;

    /// Shared memory as 16-bit elements by byte address.
    type Smem = HashMap<u32, u16>;

    /// A tile of `rows` × `cols` whose element (r, c) is `r · cols + c`.
    fn numbered(tile: &SwizzledTile, rows: u32, cols: u32) -> Smem {
        let mut m = Smem::new();
        for r in 0..rows {
            for c in 0..cols {
                m.insert(
                    tile.chunk_addr(r, c / 8) + 2 * (c % 8),
                    (r * cols + c) as u16,
                );
            }
        }
        m
    }

    /// `ldmatrix.x4.trans`: lane l's row address feeds row l % 8 of matrix l / 8; register i of
    /// lane l receives elements (2(l % 4), l / 4) and (2(l % 4) + 1, l / 4) of matrix i.
    fn ldmatrix_x4_trans(m: &Smem, addr: impl Fn(u32) -> u32) -> Vec<[(u16, u16); 4]> {
        let row = |mat: u32, r: u32| addr(8 * mat + r);
        (0..32)
            .map(|l| {
                let (g, t) = (l / 4, l % 4);
                core::array::from_fn(|i| {
                    let i = i as u32;
                    (m[&(row(i, 2 * t) + 2 * g)], m[&(row(i, 2 * t + 1) + 2 * g)])
                })
            })
            .collect()
    }

    /// Element (row, k) of an A operand held as lane registers: registers (row g, k 2t..),
    /// (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..).
    fn a_element(regs: &[[(u16, u16); 4]], row: u32, k: u32) -> u16 {
        let lane = 4 * (row % 8) + (k % 8) / 2;
        let reg = (row / 8) + 2 * (k / 8);
        let pair = regs[lane as usize][reg as usize];
        if k.is_multiple_of(2) { pair.0 } else { pair.1 }
    }

    #[test]
    fn transposed_a_loads_read_the_tile_columns_as_rows() {
        let (rows, cols) = (128, 64);
        let tile = SwizzledTile::new(0, cols);
        let m = numbered(&tile, rows, cols);
        for row0 in (0..rows).step_by(16) {
            for chunk0 in (0..cols / 8).step_by(2) {
                let regs = ldmatrix_x4_trans(&m, |l| tile.a_trans_addr(row0, chunk0, l));
                for r in 0..16 {
                    for k in 0..16 {
                        let want = ((row0 + k) * cols + 8 * chunk0 + r) as u16;
                        assert_eq!(a_element(&regs, r, k), want, "row0 {row0} chunk0 {chunk0}");
                    }
                }
            }
        }
    }

    #[test]
    fn quad_stores_lay_an_a_operand_out_row_major() {
        let tile = SwizzledTile::new(0, 64);
        for row0 in [0, 16, 48] {
            for c in [0, 2, 6] {
                let mut m = Smem::new();
                for l in 0..32 {
                    let (g, t) = (l / 4, l % 4);
                    // Register j holds A elements (row, k) and (row, k + 1) as `a_element` reads them.
                    for (j, addr) in tile.quad_addrs(row0, c, g, t).into_iter().enumerate() {
                        let (row, k) = (g + 8 * (j as u32 % 2), 2 * t + 8 * (j as u32 / 2));
                        m.insert(addr, (row * 16 + k) as u16);
                        m.insert(addr + 2, (row * 16 + k + 1) as u16);
                    }
                }
                for row in 0..16 {
                    for k in 0..16 {
                        let col = 8 * c + k;
                        let at = tile.chunk_addr(row0 + row, col / 8) + 2 * (col % 8);
                        assert_eq!(m[&at], (row * 16 + k) as u16, "row0 {row0} c {c}");
                    }
                }
            }
        }
    }
}
