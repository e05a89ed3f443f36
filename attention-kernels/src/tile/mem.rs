//! Explicit-space loads and stores the epilogue uses to stage a tile through shared memory and
//! write it out in 16-byte pieces.

use core::arch::asm;

use super::SwizzledTile;
use super::mma::{FragC, MmaElem};

/// # Safety
/// `addr` must be a 4-byte aligned address inside the shared window.
#[inline(always)]
pub unsafe fn store_shared_u32(addr: u32, v: u32) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("st.shared.b32 [{a}], {v};", a = in(reg32) addr, v = in(reg32) v, options(nostack))
    }
}

/// The low 16 bits of `v`.
///
/// # Safety
/// `addr` must be a 2-byte aligned address inside the shared window.
#[inline(always)]
pub unsafe fn store_shared_u16(addr: u32, v: u32) {
    let h = v as u16;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("st.shared.b16 [{a}], {h};", a = in(reg32) addr, h = in(reg16) h, options(nostack))
    }
}

/// # Safety
/// `addr` must be a 16-byte aligned address inside the shared window.
#[inline(always)]
pub unsafe fn load_shared_16(addr: u32) -> [u32; 4] {
    let (r0, r1, r2, r3): (u32, u32, u32, u32);
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.shared.v4.b32 {{{0}, {1}, {2}, {3}}}, [{a}];",
             out(reg32) r0, out(reg32) r1, out(reg32) r2, out(reg32) r3,
             a = in(reg32) addr, options(nostack, readonly));
    }
    [r0, r1, r2, r3]
}

/// # Safety
/// `addr` must be a 16-byte aligned, writable global address.
#[inline(always)]
pub unsafe fn store_global_16(addr: u64, v: [u32; 4]) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("st.global.v4.b32 [{a}], {{{0}, {1}, {2}, {3}}};",
             in(reg32) v[0], in(reg32) v[1], in(reg32) v[2], in(reg32) v[3],
             a = in(reg64) addr, options(nostack));
    }
}

/// Stores a warp's accumulators (`MmaElem::pack`ed, times `scale`) row-major into rows
/// `row0 .. row0 + 16` of `tile`: fragment `j` is 16-byte chunk `j` of each row, lane `(g, t)`
/// writes rows `row0 + g` and `row0 + g + 8` at byte `4t` of it. The epilogues stage O, dK and dV
/// this way so that their global stores are whole coalesced chunks.
///
/// # Safety
/// Rows `row0 .. row0 + 16` and chunks `0 .. N` must lie inside the tile.
#[inline(always)]
pub unsafe fn stage_fragments<T: MmaElem, const N: usize>(
    tile: SwizzledTile,
    row0: u32,
    frags: &[FragC; N],
    scale: f32,
    lane: u32,
) {
    // SAFETY: forwarded to the caller.
    unsafe { stage_fragments_at::<T, N>(tile, (row0, 0), frags, scale, lane) }
}

/// [`stage_fragments`] from chunk `chunk0` (a head-dim slice): fragment `j` is 16-byte chunk
/// `chunk0 + j` of each row. The sliced backwards stage dK and dV this way.
///
/// # Safety
/// Rows `row0 .. row0 + 16` and chunks `chunk0 .. chunk0 + N` must lie inside the tile.
#[inline(always)]
pub unsafe fn stage_fragments_at<T: MmaElem, const N: usize>(
    tile: SwizzledTile,
    (row0, chunk0): (u32, u32),
    frags: &[FragC; N],
    scale: f32,
    lane: u32,
) {
    let (g, t) = (lane / 4, lane % 4);
    for (j, f) in frags.iter().enumerate() {
        // SAFETY: forwarded to the caller.
        unsafe {
            store_shared_u32(
                tile.chunk_addr(row0 + g, chunk0 + j as u32) + 4 * t,
                T::pack(scale * f.0[0], scale * f.0[1]),
            );
            store_shared_u32(
                tile.chunk_addr(row0 + g + 8, chunk0 + j as u32) + 4 * t,
                T::pack(scale * f.0[2], scale * f.0[3]),
            );
        }
    }
}

/// Copies rows `0 .. rows` of `tile`, 16-byte chunks `0 .. chunks` of each, to the global rows
/// `dst + (row0 + r) · stride`, skipping rows at or past `row_end`; `threads` threads share the
/// copy, this one starting at `first`. The forwards' epilogues send their staged O rows out
/// this way, and the backward its dK and dV rows, as whole coalesced chunks.
///
/// # Safety
/// The rows and chunks must lie inside the tile, and every global row below `row_end` must be
/// writable for `16 · chunks` bytes at 16-byte alignment.
#[inline(always)]
pub unsafe fn store_staged_rows(
    tile: SwizzledTile,
    (rows, chunks): (u32, u32),
    (dst, stride): (u64, u64),
    (row0, row_end): (u32, u32),
    (first, threads): (u32, u32),
) {
    let mut i = first;
    while i < rows * chunks {
        let (r, c) = (i / chunks, i % chunks);
        let row = row0 + r;
        // SAFETY: forwarded to the caller.
        unsafe {
            let v = load_shared_16(tile.chunk_addr(r, c));
            if row < row_end {
                store_global_16(dst + row as u64 * stride + c as u64 * 16, v);
            }
        }
        i += threads;
    }
}
