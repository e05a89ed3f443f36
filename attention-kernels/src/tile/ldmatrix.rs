//! `ldmatrix`: one warp loads four 8×8 matrices of 16-bit elements from shared memory straight into
//! the register layout of `mma.sync` operands (`.trans` transposes each matrix on the way).

use core::arch::asm;

use super::SwizzledTile;
use super::mma::{FragA, FragB};

/// Lane `l` gives the row address of matrix `l / 8`, row `l % 8`; register `i` of lane `l` receives
/// row `l / 4`, elements `2(l % 4)` and `2(l % 4) + 1` of matrix `i`.
///
/// # Safety
/// Every lane's `addr` must be a 16-byte aligned row inside the shared window.
#[inline(always)]
pub unsafe fn x4(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{a}];",
             out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
             a = in(reg32) addr, options(nostack, readonly));
    }
    [r0, r1, r2, r3]
}

/// As [`x4`], each matrix transposed: register `i` of lane `l` holds elements `(2(l % 4), l / 4)`
/// and `(2(l % 4) + 1, l / 4)` of matrix `i`.
///
/// # Safety
/// As [`x4`].
#[inline(always)]
pub unsafe fn x4_trans(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the addresses.
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{a}];",
             out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
             a = in(reg32) addr, options(nostack, readonly));
    }
    [r0, r1, r2, r3]
}

impl SwizzledTile {
    /// A operand (row-major 16×16) from rows `row0 .. row0 + 16`, columns `16 kk .. 16 kk + 16`.
    ///
    /// # Safety
    /// The rows must lie inside the tile; all 32 lanes call it together.
    #[inline(always)]
    pub unsafe fn load_a(&self, row0: u32, kk: u32, lane: u32) -> FragA {
        // Matrices in A-register order: (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15).
        let addr = self.chunk_addr(row0 + (lane & 15), 2 * kk + (lane >> 4));
        // SAFETY: forwarded to the caller.
        FragA(unsafe { x4(addr) })
    }

    /// B operands of two adjacent n-tiles for `S = Q·Kᵀ`: the tile holds K row-major (one key per
    /// row), which is B (`d × keys`) column-major. Keys `key0 .. key0 + 16`, columns
    /// `16 kk .. 16 kk + 16`; returns the n-tiles of keys `key0 ..+8` and `key0 + 8 ..+8`.
    ///
    /// # Safety
    /// As [`Self::load_a`].
    #[inline(always)]
    pub unsafe fn load_b_pair(&self, key0: u32, kk: u32, lane: u32) -> [FragB; 2] {
        // Matrices: (keys 0-7, k 0-7), (keys 0-7, k 8-15), (keys 8-15, k 0-7), (keys 8-15, k 8-15).
        let addr = self.chunk_addr(
            key0 + (lane & 7) + ((lane >> 4) << 3),
            2 * kk + ((lane >> 3) & 1),
        );
        // SAFETY: forwarded to the caller.
        let r = unsafe { x4(addr) };
        [FragB([r[0], r[1]]), FragB([r[2], r[3]])]
    }

    /// B operands of two adjacent n-tiles for `O += P·V`: the tile holds V row-major (`keys × d`),
    /// B needs pairs of consecutive keys per register, hence the transpose. Keys `key0 .. key0 + 16`;
    /// returns the n-tiles of columns `8 chunk0 ..+8` and `8 chunk0 + 8 ..+8`.
    ///
    /// # Safety
    /// As [`Self::load_a`].
    #[inline(always)]
    pub unsafe fn load_b_pair_trans(&self, key0: u32, chunk0: u32, lane: u32) -> [FragB; 2] {
        // Matrices: (keys 0-7, cols 0-7), (keys 8-15, cols 0-7), (keys 0-7, cols 8-15), (8-15, 8-15).
        let addr = self.chunk_addr(key0 + (lane & 15), chunk0 + (lane >> 4));
        // SAFETY: forwarded to the caller.
        let r = unsafe { x4_trans(addr) };
        [FragB([r[0], r[1]]), FragB([r[2], r[3]])]
    }
}
