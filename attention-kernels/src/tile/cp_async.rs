//! `cp.async`: global → shared copies of 16 bytes that bypass registers and L1 (`.cg`), so the next
//! K/V block streams in while the current one is computed.

use core::arch::asm;

use super::{GappedTile, PanelTile, SwizzledTile};

/// Starts copying 16 bytes from `src` (global, 16-byte aligned) to shared address `dst`. With
/// `valid == false` nothing is read and the 16 bytes become zeros (source size 0): tails of a tile
/// hold zeros, never stale data or NaN that `0 · NaN` would spread.
///
/// # Safety
/// `dst` must be inside the shared window; `src` must be a readable global address even when
/// `valid` is false.
#[inline(always)]
pub unsafe fn copy16(dst: u32, src: u64, valid: bool) {
    let bytes: u32 = if valid { 16 } else { 0 };
    // SAFETY: the caller guarantees both addresses.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, options(nostack));
    }
}

/// Starts copying 4 bytes from `src` (global, 4-byte aligned) to shared address `dst`, or writes
/// zeros there with `valid == false` (through L1: `.cg` takes only 16-byte copies).
///
/// # Safety
/// As [`copy16`].
#[inline(always)]
pub unsafe fn copy4(dst: u32, src: u64, valid: bool) {
    let bytes: u32 = if valid { 4 } else { 0 };
    // SAFETY: the caller guarantees both addresses.
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4, {n};",
             d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, options(nostack));
    }
}

/// Waits until every `cp.async` this thread issued has landed. Other threads see the data only
/// after a barrier that follows.
#[inline(always)]
pub fn wait_all() {
    // SAFETY: waiting has no preconditions.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) }
}

/// Closes the group of the `cp.async` this thread issued since the last commit (possibly none),
/// for [`wait_groups`].
#[inline(always)]
pub fn commit() {
    // SAFETY: committing has no preconditions.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) }
}

/// Waits until at most `PENDING` of this thread's committed groups are still in flight (the
/// most recent ones): with one group per tile, the oldest tiles have landed and the newest
/// `PENDING` keep loading. Other threads see the data only after a barrier that follows.
#[inline(always)]
pub fn wait_groups<const PENDING: u32>() {
    // SAFETY: waiting has no preconditions.
    unsafe { asm!("cp.async.wait_group {n};", n = const PENDING, options(nostack)) }
}

/// Rows of a global tensor: row `r` starts at `base + r · stride` bytes and exists for `r < limit`;
/// each holds `chunks` 16-byte chunks (the real head dim / 8: a tile wider than that, the compiled
/// head dim of a padded call, fills its other chunks with zeros).
#[derive(Clone, Copy)]
pub struct GlobalRows {
    pub base: u64,
    pub stride: u64,
    pub limit: u32,
    pub chunks: u32,
}

/// A shared tile stored as 16-byte chunks: what `fill_async` needs to know of its layout.
pub trait ChunkedTile {
    /// 16-byte chunks per row.
    fn chunks(&self) -> u32;
    /// Shared-space address of logical chunk `chunk` of row `row`.
    fn chunk_addr(&self, row: u32, chunk: u32) -> u32;

    /// Starts filling rows `0 .. rows` of the tile from rows `first .. first + rows` of `src`;
    /// rows at or past `src.limit` and chunks at or past `src.chunks` become zeros (zero columns
    /// change no product, so a padded head dim computes the real one's result). The block's `threads` threads share the work,
    /// consecutive threads on consecutive chunks so that global reads coalesce.
    ///
    /// # Safety
    /// The tile must hold `rows` rows; every row of `src` below its limit must be readable.
    #[inline(always)]
    unsafe fn fill_async(&self, src: GlobalRows, first: u32, rows: u32, tid: u32, threads: u32) {
        let chunks = self.chunks();
        let mut i = tid;
        while i < rows * chunks {
            let (r, c) = (i / chunks, i % chunks);
            let valid = first + r < src.limit && c < src.chunks;
            let at = if valid {
                src.base + (first + r) as u64 * src.stride + c as u64 * 16
            } else {
                src.base
            };
            // SAFETY: the caller guarantees the tile size and the readable rows.
            unsafe { copy16(self.chunk_addr(r, c), at, valid) };
            i += threads;
        }
    }
}

impl ChunkedTile for SwizzledTile {
    #[inline(always)]
    fn chunks(&self) -> u32 {
        SwizzledTile::chunks(self)
    }
    #[inline(always)]
    fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        SwizzledTile::chunk_addr(self, row, chunk)
    }
}

impl ChunkedTile for GappedTile {
    #[inline(always)]
    fn chunks(&self) -> u32 {
        GappedTile::chunks(self)
    }
    #[inline(always)]
    fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        GappedTile::chunk_addr(self, row, chunk)
    }
}

impl ChunkedTile for PanelTile {
    #[inline(always)]
    fn chunks(&self) -> u32 {
        PanelTile::chunks(self)
    }
    #[inline(always)]
    fn chunk_addr(&self, row: u32, chunk: u32) -> u32 {
        PanelTile::chunk_addr(self, row, chunk)
    }
}
