//! Block sizes: the paper's rule, rounded to what the kernels can hold.
//!
//! Algorithm 1 takes an on-chip capacity of `M` elements and sets `B_c = ⌈M/4d⌉`,
//! `B_r = min(⌈M/4d⌉, d)`. These kernels hold every tile in shared memory as f32 (inputs are
//! widened when loaded, whatever the storage dtype), so the working precision is f32 and
//! `M = (shared memory a block may opt in to) / 4`.
//!
//! Rounding: the kernels take any `B_r, B_c ≥ 1` (tails are predicated), but their real footprint
//! (`attention_kernels::kernels::simt::smem`: padded Q/K/V tiles, the score tile, the accumulators) is not
//! the paper's idealised `4·B_c·d`. Starting from the paper's sizes, the larger of `B_c` and `B_r`
//! shrinks in steps of 8 (to 1 at the least) until the footprint fits. The backward uses the
//! same rule against the larger footprint of its two tile kernels.

use attention_kernels::abi::layout::BlockSizes;
use attention_kernels::kernels::simt::smem;

use crate::error::{Result, invalid};

/// Which kernels the sizes are for (their footprints differ).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFamily {
    Forward,
    Backward,
}

impl KernelFamily {
    /// Shared memory the family's kernels need with these sizes, in bytes, for Q and K rows of
    /// `head_dim` elements and V and O rows of `head_dim_v`.
    pub fn shared_bytes(self, b: BlockSizes, head_dim: u32, head_dim_v: u32) -> u64 {
        let (br, bc) = (b.block_rows as u64, b.block_cols as u64);
        let widest = head_dim.max(head_dim_v) as u64;
        let floats = |f: fn(u32, u32, u32, u32) -> u32| {
            // Evaluate in u64: explicit sizes may be large enough to overflow the u32 sums.
            if br * bc * widest > u32::MAX as u64 / 16 {
                u64::MAX / 4
            } else {
                f(br as u32, bc as u32, head_dim, head_dim_v) as u64
            }
        };
        4 * match self {
            KernelFamily::Forward => floats(smem::forward_floats),
            KernelFamily::Backward => {
                floats(smem::backward_kv_floats).max(floats(smem::backward_dq_floats))
            }
        }
    }
}

/// The paper's sizes for `m_elems` elements of on-chip memory and head dimension `d`.
pub fn paper_block_sizes(m_elems: u32, d: u32) -> BlockSizes {
    let bc = m_elems.div_ceil(4 * d);
    BlockSizes {
        block_rows: bc.min(d),
        block_cols: bc,
    }
}

/// The sizes a call uses: `explicit` when given (checked to fit), else the paper's sizes for a
/// device with `shared_limit` bytes per block (for the wider of `head_dim`, Q's and K's, and
/// `head_dim_v`, V's and O's), shrunk to fit as described above.
pub fn choose_block_sizes(
    family: KernelFamily,
    (head_dim, head_dim_v): (u32, u32),
    shared_limit: u32,
    explicit: Option<BlockSizes>,
) -> Result<BlockSizes> {
    let bytes = |b: BlockSizes| family.shared_bytes(b, head_dim, head_dim_v);
    let fits = |b: BlockSizes| bytes(b) <= shared_limit as u64;
    if let Some(b) = explicit {
        if b.block_rows == 0 || b.block_cols == 0 {
            return Err(invalid!("block sizes must be at least 1, got {b:?}"));
        }
        if !fits(b) {
            return Err(invalid!(
                "block sizes {b:?} with head_dim {head_dim} (head_dim_v {head_dim_v}) need {} bytes of shared memory for the {family:?} \
                 kernels, the device allows {shared_limit}",
                bytes(b)
            ));
        }
        return Ok(b);
    }
    let mut b = paper_block_sizes(shared_limit / 4, head_dim.max(head_dim_v));
    while !fits(b) {
        if b.block_rows == 1 && b.block_cols == 1 {
            return Err(invalid!(
                "head_dim {head_dim} (head_dim_v {head_dim_v}) does not fit the {family:?} kernels in {shared_limit} bytes"
            ));
        }
        let shrink = |x: u32| x.saturating_sub(8).max(1);
        if b.block_cols >= b.block_rows {
            b.block_cols = shrink(b.block_cols);
        } else {
            b.block_rows = shrink(b.block_rows);
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const H200: u32 = 232_448;

    #[test]
    fn paper_rule_matches_the_article() {
        // M = 58112 f32 elements: B_c = ⌈58112 / 256⌉ = 227, B_r = min(227, 64) = 64.
        assert_eq!(
            paper_block_sizes(58_112, 64),
            BlockSizes {
                block_rows: 64,
                block_cols: 227
            }
        );
        assert_eq!(
            paper_block_sizes(58_112, 256),
            BlockSizes {
                block_rows: 57,
                block_cols: 57
            }
        );
    }

    #[test]
    fn chosen_sizes_fit_and_stay_paper_sized_when_they_can() {
        for d in [16, 32, 40, 64, 80, 96, 128, 256] {
            for family in [KernelFamily::Forward, KernelFamily::Backward] {
                let b = choose_block_sizes(family, (d, d), H200, None).unwrap();
                assert!(
                    family.shared_bytes(b, d, d) <= H200 as u64,
                    "{family:?} d={d} {b:?}"
                );
                let paper = paper_block_sizes(H200 / 4, d);
                assert!(b.block_rows <= paper.block_rows && b.block_cols <= paper.block_cols);
            }
        }
        assert_eq!(
            choose_block_sizes(KernelFamily::Forward, (64, 64), H200, None).unwrap(),
            BlockSizes {
                block_rows: 64,
                block_cols: 227
            }
        );
    }

    #[test]
    fn explicit_sizes_are_checked() {
        let ok = BlockSizes {
            block_rows: 16,
            block_cols: 32,
        };
        assert_eq!(
            choose_block_sizes(KernelFamily::Backward, (64, 64), H200, Some(ok)).unwrap(),
            ok
        );
        let zero = BlockSizes {
            block_rows: 0,
            block_cols: 32,
        };
        assert!(choose_block_sizes(KernelFamily::Forward, (64, 64), H200, Some(zero)).is_err());
        let huge = BlockSizes {
            block_rows: 4096,
            block_cols: 4096,
        };
        assert!(choose_block_sizes(KernelFamily::Forward, (64, 64), H200, Some(huge)).is_err());
    }
}
