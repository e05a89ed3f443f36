//! The splits' merge inside the split kernel (`super::DecodeCombine::LastSplit`): every split
//! block of a (K/V head, sequence) writes its partial `(O, LSE)`, then counts itself on the pair's
//! counter; the block that counts last reads every split's partials back (they are in L2, just
//! written) and writes O and LSE, so no combine launch follows. Parts are read and added in split
//! order whichever block is last, so the result does not depend on the blocks' timing. The
//! policy is `parts`'.

use crate::abi::storage::Storage;
use crate::arch::{atomic_add_u32_global, fence_gpu, sync_threads, sync_threads_or, thread_x};

use super::parts::{lane_lses, merged_lse, weight};
use super::{MAX_ROWS, MAX_SPLITS, THREADS};

/// The weight an empty part (`LSE = −∞`) gets in shared memory: −0, which no exponential gives,
/// so that it is skipped while a weight that underflows to +0 still multiplies its O (a
/// non-finite O then reaches the row, as in the parallel combine).
const EMPTY: f32 = -0.0;

/// Parts whose O loads one thread issues before adding any: the partials' L2 round trips
/// overlap instead of following one another.
const LOADS_IN_FLIGHT: usize = 16;

/// Four f32, one 16-byte load.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Cols4([f32; 4]);

/// Four elements of O, one 8-byte store.
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub(super) struct Out4<T>(pub [T; 4]);

/// Stores `x` as four `T` at `o + at` (elements).
///
/// # Safety
/// `at .. at + 4` is inside O, `at` a multiple of 4.
#[inline(always)]
pub(super) unsafe fn store4<T: Storage>(o: u64, at: usize, x: [f32; 4]) {
    // SAFETY: the caller's contract; O is 16-byte aligned (host-checked).
    unsafe { *((o as *mut T).add(at) as *mut Out4<T>) = Out4(x.map(T::from_f32)) };
}

/// Counts the block on `counter` after its partials' stores; whether it is the last of
/// `splits`. The last block resets the counter to 0 for the next launch and may then read every
/// split's partials. Every thread of the block calls it.
///
/// # Safety
/// `counter` is the (K/V head, sequence)'s u32 in global memory, which the launch's `splits`
/// blocks of that pair, and no others, count on, zero before them.
#[inline(always)]
pub(super) unsafe fn arrive_last(counter: *mut u32, splits: u32) -> bool {
    // Release: every thread's partial stores, then the barrier, then the count.
    fence_gpu();
    sync_threads();
    let mut last = false;
    if thread_x() == 0 {
        // SAFETY: the caller's contract.
        unsafe {
            last = atomic_add_u32_global(counter, 1) + 1 == splits;
            if last {
                core::ptr::write_volatile(counter, 0);
            }
        }
    }
    let last = sync_threads_or(last);
    // Acquire: the other splits' stores before this block's loads.
    fence_gpu();
    last
}

/// Where the block's rows are: partial O of part `q` at `o_part + q · o_elems`, partial LSE at
/// `lse_part + q · row_elems` (f32 elements), each row `r` at `row(r) = (O element offset, LSE
/// index)`, the same in the output `o` (`T`) and `lse` (f32).
pub(super) struct Partials<R: Fn(u32) -> (usize, usize)> {
    pub o_part: *const f32,
    pub lse_part: *const f32,
    pub o_elems: usize,
    pub row_elems: usize,
    pub o: u64,
    pub lse: u64,
    pub row: R,
}

/// Merges `parts` splits' partials of the block's `rows` rows (`≤ MAX_ROWS`, of `d` columns, a
/// multiple of 4) into O and LSE, `weights` a shared window of `MAX_ROWS · MAX_SPLITS` f32. Every thread of the block calls it,
/// after [`arrive_last`] said the block is last.
///
/// # Safety
/// Every part below `parts ≤ MAX_SPLITS` holds the rows' partials; `weights` is free.
#[inline(always)]
pub(super) unsafe fn merge_splits<T: Storage, R: Fn(u32) -> (usize, usize)>(
    at: &Partials<R>,
    parts: u32,
    rows: u32,
    d: u32,
    weights: *mut f32,
) {
    let (tid, parts) = (thread_x(), parts.min(MAX_SPLITS) as usize);
    let (warp, lane) = (tid / 32, (tid % 32) as usize);
    let weight_at = |r: u32, q: usize| r as usize * MAX_SPLITS as usize + q;
    // Each warp's rows: the merged LSE, and every part's weight in shared memory.
    let mut r = warp;
    while r < rows.min(MAX_ROWS) {
        let (_, lse_index) = (at.row)(r);
        // SAFETY: q < parts, and lse_index is a row of every part.
        let part_lse = |q: usize| unsafe { *at.lse_part.add(q * at.row_elems + lse_index) };
        let lses = lane_lses(parts, lane, part_lse);
        let lse = merged_lse(&lses);
        for (k, &l) in lses.iter().enumerate() {
            let q = lane + 32 * k;
            if q < parts {
                let w = if l == f32::NEG_INFINITY {
                    EMPTY
                } else {
                    weight(l, lse)
                };
                // SAFETY: inside the window.
                unsafe { *weights.add(weight_at(r, q)) = w };
            }
        }
        if lane == 0 {
            // SAFETY: as above.
            unsafe { *(at.lse as *mut f32).add(lse_index) = lse };
        }
        r += THREADS / 32;
    }
    sync_threads();
    // Each thread's (row, 4 columns): the parts' O in order, `LOADS_IN_FLIGHT` loads at a time.
    let quads = d / 4;
    let mut i = tid;
    while i < rows * quads {
        let (r, c) = (i / quads, 4 * (i % quads) as usize);
        let (o_at, _) = (at.row)(r);
        let mut acc = [0.0f32; 4];
        let mut first = 0;
        while first < parts {
            let mut x = [[0.0f32; 4]; LOADS_IN_FLIGHT];
            for (k, xk) in x.iter_mut().enumerate() {
                let q = first + k;
                if q < parts {
                    // SAFETY: q < parts; the row's 4 columns, 16-byte aligned (rows of d f32).
                    *xk =
                        unsafe { (*(at.o_part.add(q * at.o_elems + o_at + c) as *const Cols4)).0 };
                }
            }
            for (k, xk) in x.iter().enumerate() {
                let q = first + k;
                if q < parts {
                    // SAFETY: inside the window.
                    let w = unsafe { *weights.add(weight_at(r, q)) };
                    if w.to_bits() != EMPTY.to_bits() {
                        for (a, &y) in acc.iter_mut().zip(xk) {
                            *a += w * y;
                        }
                    }
                }
            }
            first += LOADS_IN_FLIGHT;
        }
        // SAFETY: row r's columns c .. c + 4 of O.
        unsafe { store4::<T>(at.o, o_at + c, acc) };
        i += THREADS;
    }
}
