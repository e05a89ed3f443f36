//! A operands read transposed: the backward stores `dSᵀ` (one key per row) and needs `dS` as the
//! A operand of `dQ = dS·K`.

use super::SwizzledTile;
use super::ldmatrix::x4_trans;
use super::mma::FragA;

impl SwizzledTile {
    /// A operand (16×16) whose rows are columns `8 chunk0 .. 8 chunk0 + 16` of the tile and whose
    /// k index runs over tile rows `row0 .. row0 + 16`.
    ///
    /// # Safety
    /// The rows and chunks must lie inside the tile; all 32 lanes call it together.
    #[inline(always)]
    pub unsafe fn load_a_trans(&self, row0: u32, chunk0: u32, lane: u32) -> FragA {
        let addr = self.a_trans_addr(row0, chunk0, lane);
        // SAFETY: forwarded to the caller.
        FragA(unsafe { x4_trans(addr) })
    }
}
