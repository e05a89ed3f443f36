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
        // A-register order (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) is, in the
        // stored tile, (rows 0-7, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 0), (8-15, 1).
        let addr = self.chunk_addr(
            row0 + (lane & 7) + ((lane >> 4) << 3),
            chunk0 + ((lane >> 3) & 1),
        );
        // SAFETY: forwarded to the caller.
        FragA(unsafe { x4_trans(addr) })
    }
}
