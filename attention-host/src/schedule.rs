//! The paper's schedule model (FlashAttention-1 Algorithms 1 and 4): block sizes from the on-chip
//! capacity `M` (in scalar words), and the K/V-outer, Q-inner visit order over score tiles, with
//! true tail extents when a block size does not divide a length.

use std::ops::Range;

/// Rows per query block (`B_r`) and keys per K/V block (`B_c`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub block_rows: u64,
    pub block_cols: u64,
}

impl BlockSizes {
    /// The paper's rule `B_c = ⌈M / 4d⌉`, `B_r = min(B_c, d)`: K_j, V_j, Q_i, O_i fit in `M` words.
    pub fn paper(sram_words: u64, head_dim: u64) -> Self {
        let block_cols = sram_words.div_ceil(head_dim.saturating_mul(4));
        BlockSizes {
            block_cols,
            block_rows: block_cols.min(head_dim),
        }
    }
}

/// One score tile `S_ij`: query block `q_block` (rows `rows`) against K/V block `kv_block`
/// (keys `cols`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visit {
    pub kv_block: u64,
    pub q_block: u64,
    pub rows: Range<u64>,
    pub cols: Range<u64>,
}

/// `N_q` query rows and `N_k` keys cut into blocks of `B_r` rows and `B_c` keys; the last block of
/// each axis holds the remainder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub n_q: u64,
    pub n_k: u64,
    pub blocks: BlockSizes,
}

impl Schedule {
    /// `None` if a length or a block size is zero.
    pub fn new(n_q: u64, n_k: u64, blocks: BlockSizes) -> Option<Self> {
        (n_q > 0 && n_k > 0 && blocks.block_rows > 0 && blocks.block_cols > 0).then_some(Schedule {
            n_q,
            n_k,
            blocks,
        })
    }

    /// `T_r = ⌈N_q / B_r⌉`.
    pub fn row_blocks(&self) -> u64 {
        self.n_q.div_ceil(self.blocks.block_rows)
    }

    /// `T_c = ⌈N_k / B_c⌉`.
    pub fn col_blocks(&self) -> u64 {
        self.n_k.div_ceil(self.blocks.block_cols)
    }

    /// Query rows of block `i`.
    pub fn rows(&self, i: u64) -> Range<u64> {
        let start = i * self.blocks.block_rows;
        start..(start + self.blocks.block_rows).min(self.n_q)
    }

    /// Keys of block `j`.
    pub fn cols(&self, j: u64) -> Range<u64> {
        let start = j * self.blocks.block_cols;
        start..(start + self.blocks.block_cols).min(self.n_k)
    }

    /// The visit order of Algorithms 1 and 4: K/V block `j` outer (loaded once), query block `i`
    /// inner (Q, O and the row state reloaded for every `j`).
    pub fn visits(&self) -> impl Iterator<Item = Visit> + '_ {
        (0..self.col_blocks()).flat_map(move |kv_block| {
            (0..self.row_blocks()).map(move |q_block| Visit {
                kv_block,
                q_block,
                rows: self.rows(q_block),
                cols: self.cols(kv_block),
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paper_block_sizes_of_the_sensitivity_fixture() {
        let blocks = BlockSizes::paper(65_536, 64);
        assert_eq!(
            blocks,
            BlockSizes {
                block_cols: 256,
                block_rows: 64
            }
        );
        let s = Schedule::new(4096, 4096, blocks).unwrap();
        assert_eq!((s.col_blocks(), s.row_blocks()), (16, 64));
        // B_r = B_c when the capacity is small against d.
        assert_eq!(
            BlockSizes::paper(1000, 64),
            BlockSizes {
                block_cols: 4,
                block_rows: 4
            }
        );
    }

    #[test]
    fn non_multiple_forward_fixture_visits_nine_tiles_kv_outer() {
        let s = Schedule::new(
            7,
            10,
            BlockSizes {
                block_rows: 3,
                block_cols: 4,
            },
        )
        .unwrap();
        assert_eq!((s.row_blocks(), s.col_blocks()), (3, 3));
        let visits: Vec<_> = s.visits().collect();
        assert_eq!(visits.len(), 9);
        let order: Vec<_> = visits.iter().map(|v| (v.kv_block, v.q_block)).collect();
        assert_eq!(
            order,
            [
                (0, 0),
                (0, 1),
                (0, 2),
                (1, 0),
                (1, 1),
                (1, 2),
                (2, 0),
                (2, 1),
                (2, 2)
            ]
        );
        assert_eq!(visits[8].rows, 6..7);
        assert_eq!(visits[8].cols, 8..10);
    }

    #[test]
    fn backward_fixture_tile_shapes() {
        let s = Schedule::new(
            4,
            5,
            BlockSizes {
                block_rows: 2,
                block_cols: 3,
            },
        )
        .unwrap();
        let rows: Vec<_> = (0..s.row_blocks()).map(|i| s.rows(i).count()).collect();
        let cols: Vec<_> = (0..s.col_blocks()).map(|j| s.cols(j).count()).collect();
        assert_eq!((rows, cols), (vec![2, 2], vec![3, 2]));
        let tiles: Vec<_> = s
            .visits()
            .map(|v| (v.rows.count(), v.cols.count()))
            .collect();
        assert_eq!(tiles, [(2, 3), (2, 3), (2, 2), (2, 2)]);
    }

    /// Every score position is visited exactly once, tails included, for many shapes.
    #[test]
    fn visits_cover_every_score_position_once() {
        for (n_q, n_k, b_r, b_c) in [
            (7, 10, 3, 4),
            (4, 5, 2, 3),
            (1, 1, 4, 4),
            (9, 3, 9, 1),
            (13, 17, 5, 16),
            (64, 64, 16, 32),
        ] {
            let s = Schedule::new(
                n_q,
                n_k,
                BlockSizes {
                    block_rows: b_r,
                    block_cols: b_c,
                },
            )
            .unwrap();
            let mut seen = vec![0u32; (n_q * n_k) as usize];
            for v in s.visits() {
                for i in v.rows.clone() {
                    for j in v.cols.clone() {
                        seen[(i * n_k + j) as usize] += 1;
                    }
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "{n_q}x{n_k} in {b_r}x{b_c} blocks"
            );
            assert_eq!(s.visits().count() as u64, s.row_blocks() * s.col_blocks());
        }
        assert!(
            Schedule::new(
                0,
                3,
                BlockSizes {
                    block_rows: 1,
                    block_cols: 1
                }
            )
            .is_none()
        );
        assert!(
            Schedule::new(
                3,
                3,
                BlockSizes {
                    block_rows: 0,
                    block_cols: 1
                }
            )
            .is_none()
        );
    }
}
