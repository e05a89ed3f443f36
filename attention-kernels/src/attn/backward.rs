//! What the tensor-core backwards (`sm80`, `sm90`) share around their main kernels: the
//! preprocess (`D = rowsum(dO ∘ O)`, `LSE · log2 e` per row, zeroed f32 dQ accumulator), the
//! dQ conversion, the gradients of NaN rows, and the Q blocks of 64 rows (128 in d = 64's plain
//! `wgmma` instance) whose padding lays out the row statistics.

#[cfg(target_arch = "nvptx64")]
mod nan_rows;
#[cfg(target_arch = "nvptx64")]
mod preprocess;

use crate::abi::shape::allowed_key_end;
use crate::attn::score_mod::{Window, rows_seeing_keys, straddles};

/// Query rows per Q block of every tensor-core backward main kernel but d = 64's plain `wgmma`
/// instance, whose Q blocks are [`TALL_Q_BLOCK`].
pub const Q_BLOCK: u32 = 64;
/// Query rows per Q block of d = 64's plain `wgmma` backward (`sm90::BACKWARD_D64_TALL`).
pub const TALL_Q_BLOCK: u32 = 2 * Q_BLOCK;

/// `n_q` rounded up to whole Q blocks of either height: the length of each (batch, head) row of
/// the padded statistics, so every Q block's statistics are whole 16-byte chunks inside it.
pub const fn n_q_pad(n_q: u32) -> u32 {
    n_q.div_ceil(TALL_Q_BLOCK) * TALL_Q_BLOCK
}

/// The deterministic backward's count for K/V block `kv_block` and a Q block it visits: how many
/// K/V blocks of the same (sequence, K/V head) add their part of that Q block's dQ before it
/// does. Every earlier K/V block visits each Q block this one visits ([`first_q_block`] does not
/// decrease with the keys), so the count is the block's index: the adds go in key order. A mask
/// that also bounds keys from the left (a local window) breaks that premise: there the count is
/// `kv_block` minus the first K/V block any row of the Q block sees, computed here for every
/// caller.
pub const fn dq_adds_before(kv_block: u32) -> u32 {
    kv_block
}

/// Index of the dQ semaphore of (`bh = batch · heads_q + head`, Q block `q_block`): the padded
/// statistics' layout, one entry per Q block.
pub const fn dq_semaphore(bh: u32, q_block: u32, n_q_pad: u32) -> u64 {
    bh as u64 * (n_q_pad / Q_BLOCK) as u64 + q_block as u64
}

/// The first Q block the K/V block starting at key `k0` visits (it visits every later one
/// too): causally, row i sees key k0 iff i ≥ k0 + n_q − n_k (`causal_key_end`), so earlier
/// blocks contribute nothing.
pub const fn first_q_block(k0: u32, n_q: u32, n_k: u32, causal: bool) -> u32 {
    first_block_of_rows(k0, n_q, n_k, causal, Q_BLOCK)
}

/// [`first_q_block`] for Q blocks of `rows` rows.
pub const fn first_block_of_rows(k0: u32, n_q: u32, n_k: u32, causal: bool, rows: u32) -> u32 {
    if causal {
        (k0 + n_q).saturating_sub(n_k) / rows
    } else {
        0
    }
}

/// Whether the (Q block at row `q0`, K/V block at key `k0`) pair holds a pair the row may not
/// see (a causally hidden key or one past `n_k`); `allowed_key_end` grows with the row, so
/// the block's first row decides.
pub const fn needs_mask(
    q0: u32,
    k0: u32,
    block_keys: u32,
    n_q: u32,
    n_k: u32,
    causal: bool,
) -> bool {
    allowed_key_end(q0, n_q, n_k, causal) < k0 + block_keys
}

/// With a local window, the Q blocks `first .. end` the K/V block of keys `k0 .. k0 + bc` visits:
/// only those holding a row whose window reaches the block. Without one, [`first_q_block`] and
/// every later one (the kernels branch on the window so that their plain instances keep that
/// code and its registers).
#[inline(always)]
pub const fn window_q_blocks(
    k0: u32,
    bc: u32,
    (n_q, n_k): (u32, u32),
    causal: bool,
    window: Window,
) -> (u32, u32) {
    let k1 = if k0 + bc < n_k { k0 + bc } else { n_k };
    let (first, end) = rows_seeing_keys(k0, k1, n_q, n_k, causal, window);
    (first / Q_BLOCK, end.div_ceil(Q_BLOCK))
}

/// With a local window, whether the (Q block at row `q0`, K/V block at key `k0` of `bc` keys)
/// pair needs the per-element mask: some row of the block may not see some key of it (a window
/// edge, the causal diagonal, the key length). Interior pairs take the plain path. Without a
/// window, [`needs_mask`].
#[inline(always)]
pub const fn window_needs_mask(
    (q0, k0): (u32, u32),
    bc: u32,
    (n_q, n_k): (u32, u32),
    causal: bool,
    window: Window,
) -> bool {
    let last = if q0 + Q_BLOCK < n_q {
        q0 + Q_BLOCK
    } else {
        n_q
    } - 1;
    straddles((q0, last), k0, bc, (n_q, n_k), causal, window)
}

/// Warps per block of the preprocess kernel, one row per warp.
pub const PREPROCESS_WARPS: u32 = 4;
/// Threads per block of the dQ conversion, eight elements each.
pub const CONVERT_THREADS: u32 = 256;
/// Threads per block of the NaN-row pass, one row each (a warp's NaN rows taken in turn by the
/// whole warp).
pub const NAN_ROWS_THREADS: u32 = 256;

/// Widening of two packed 16-bit elements, the lower one first (the inverse of `MmaElem::pack`
/// up to its rounding).
#[cfg(target_arch = "nvptx64")]
pub(crate) trait Pair: crate::tile::mma::MmaElem {
    fn unpack(w: u32) -> [f32; 2];
}

#[cfg(target_arch = "nvptx64")]
impl Pair for crate::abi::storage::Bf16 {
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        [f32::from_bits(w << 16), f32::from_bits(w & 0xffff_0000)]
    }
}

#[cfg(target_arch = "nvptx64")]
impl Pair for crate::abi::storage::F16 {
    #[inline(always)]
    fn unpack(w: u32) -> [f32; 2] {
        use crate::abi::storage::{F16, Storage};
        [F16(w as u16).to_f32(), F16((w >> 16) as u16).to_f32()]
    }
}

/// The block ranges of the windowed tensor-core kernels, against the pairs of rows and keys the
/// window allows (brute force): every visited block pair holds an allowed pair, no other does,
/// and only pairs holding a hidden one take the per-element mask.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn::score_mod::{UNBOUNDED, key_blocks, key_range, straddles};
    use crate::kernels::sm90;
    use std::format;
    use std::vec;
    use std::vec::Vec;

    /// The key blocks of `bc` keys that rows `i0 ..= i1` need (hold a key one of them sees), and
    /// those of them holding a key one of them does not see.
    fn needed_key_blocks(
        rows: (u32, u32),
        lens: (u32, u32),
        causal: bool,
        w: Window,
        bc: u32,
    ) -> (Vec<u32>, Vec<u32>) {
        let (n_q, n_k) = lens;
        let blocks = n_k.div_ceil(bc);
        let (mut needed, mut hidden) = (vec![false; blocks as usize], vec![false; blocks as usize]);
        for i in rows.0..=rows.1 {
            let (start, end) = key_range(i, n_q, n_k, causal, w);
            for b in 0..blocks {
                let (k0, k1) = (b * bc, (b + 1) * bc);
                needed[b as usize] |= start.max(k0) < end.min(k1);
                // Keys past n_k are hidden from every row.
                hidden[b as usize] |= start > k0 || end < k1;
            }
        }
        let pick = |f: &dyn Fn(usize) -> bool| (0..blocks).filter(|&b| f(b as usize)).collect();
        (pick(&|b| needed[b]), pick(&|b| needed[b] && hidden[b]))
    }

    /// Visited and masked block pairs of one direction, and the most one block visits.
    #[derive(Debug, Default)]
    struct Count {
        visited: u64,
        masked: u64,
        most: u64,
    }

    /// Forward: the key blocks a Q block visits and masks; backward: the Q blocks a K/V block
    /// visits and masks, each checked against the brute force.
    fn check(
        lens: (u32, u32),
        causal: bool,
        w: Window,
        (br, bc): (u32, u32),
        bwd_bc: u32,
    ) -> [Count; 2] {
        let (n_q, n_k) = lens;
        let what = format!("{lens:?} causal={causal} {w:?}");
        let mut forward = Count::default();
        for q0 in (0..n_q).step_by(br as usize) {
            let rows = (q0, (q0 + br).min(n_q) - 1);
            let (needed, hidden) = needed_key_blocks(rows, lens, causal, w, bc);
            let (first, end) = key_blocks(rows, lens, causal, w, bc);
            let visited: Vec<u32> = (first..end).collect();
            assert_eq!(visited, needed, "forward {what} q0={q0}");
            let masked: Vec<u32> = (first..end)
                .filter(|&b| straddles(rows, b * bc, bc, lens, causal, w))
                .collect();
            assert_eq!(masked, hidden, "forward {what} q0={q0}");
            forward.visited += visited.len() as u64;
            forward.masked += masked.len() as u64;
            forward.most = forward.most.max(visited.len() as u64);
        }
        let (bc, br) = (bwd_bc, Q_BLOCK);
        let per_q_block: Vec<_> = (0..n_q.div_ceil(br))
            .map(|q_block| {
                let q0 = q_block * br;
                needed_key_blocks((q0, (q0 + br).min(n_q) - 1), lens, causal, w, bc)
            })
            .collect();
        let mut backward = Count::default();
        for k0 in (0..n_k).step_by(bc as usize) {
            let (first, end) = if w.is_none() {
                (first_q_block(k0, n_q, n_k, causal), n_q.div_ceil(br))
            } else {
                window_q_blocks(k0, bc, lens, causal, w)
            };
            let mut visited = 0;
            for (q_block, (needed, hidden)) in per_q_block.iter().enumerate() {
                let (q_block, b) = (q_block as u32, k0 / bc);
                let q0 = q_block * br;
                let visits = first <= q_block && q_block < end;
                assert_eq!(
                    visits,
                    needed.contains(&b),
                    "backward {what} k0={k0} q0={q0}"
                );
                if visits {
                    let masked = if w.is_none() {
                        needs_mask(q0, k0, bc, n_q, n_k, causal)
                    } else {
                        window_needs_mask((q0, k0), bc, lens, causal, w)
                    };
                    assert_eq!(
                        masked,
                        hidden.contains(&b),
                        "backward {what} k0={k0} q0={q0}"
                    );
                    visited += 1;
                    backward.masked += masked as u64;
                }
            }
            backward.visited += visited;
            backward.most = backward.most.max(visited);
        }
        [forward, backward]
    }

    /// Small shapes: every window, causal or not, lengths that are and are not whole blocks.
    #[test]
    fn windowed_blocks_are_exactly_the_needed_ones() {
        let w = |left, right| Window { left, right };
        for lens in [
            (1, 1),
            (40, 40),
            (37, 91),
            (91, 37),
            (128, 128),
            (300, 300),
            (300, 77),
        ] {
            for causal in [false, true] {
                for window in [
                    w(0, 0),
                    w(5, 3),
                    w(16, 16),
                    w(70, 70),
                    w(UNBOUNDED, 7),
                    w(9, UNBOUNDED),
                    Window::NONE,
                ] {
                    for (fwd, bwd) in [((16, 8), 16), ((32, 16), 64)] {
                        check(lens, causal, window, fwd, bwd);
                    }
                }
            }
        }
    }

    /// Q blocks of [`TALL_Q_BLOCK`] rows (no window): a K/V block visits exactly the Q blocks
    /// from [`first_block_of_rows`] on that hold a row seeing one of its keys, and
    /// [`needs_mask`] flags exactly those holding a hidden pair; the padded statistics hold
    /// every tall block whole.
    #[test]
    fn tall_q_blocks_are_exactly_the_needed_ones() {
        let (br, bc) = (TALL_Q_BLOCK, 128);
        for (n_q, n_k) in [
            (1, 1),
            (40, 40),
            (37, 300),
            (300, 37),
            (128, 128),
            (300, 300),
        ] {
            assert!(n_q_pad(n_q).is_multiple_of(br) && n_q_pad(n_q) >= n_q);
            for causal in [false, true] {
                let what = format!("{n_q}x{n_k} causal={causal}");
                for k0 in (0..n_k).step_by(bc as usize) {
                    let first = first_block_of_rows(k0, n_q, n_k, causal, br);
                    for q_block in 0..n_q.div_ceil(br) {
                        let q0 = q_block * br;
                        let rows = (q0, (q0 + br).min(n_q) - 1);
                        let w = Window::NONE;
                        let (needed, hidden) = needed_key_blocks(rows, (n_q, n_k), causal, w, bc);
                        let b = k0 / bc;
                        assert_eq!(
                            q_block >= first,
                            needed.contains(&b),
                            "{what} k0={k0} q0={q0}"
                        );
                        if q_block >= first {
                            let masked = needs_mask(q0, k0, bc, n_q, n_k, causal);
                            assert_eq!(masked, hidden.contains(&b), "{what} k0={k0} q0={q0}");
                        }
                    }
                }
            }
        }
    }

    /// The benchmarked shapes (N = 16384, d = 128, the `wgmma` defaults' blocks): a window of
    /// 1024 on each side visits at most 17 key blocks per Q block (16 for 2048 keys) and 34 Q
    /// blocks per K/V block (32), masking 2 and 4 of them; (1024, 0) visits 9 and 18 (8 and 16
    /// for 1024 keys), masking 2 and 4 too: the other blocks take the plain path.
    #[test]
    fn a_window_of_1024_costs_about_2048_keys() {
        let (fwd, bwd) = (
            sm90::config(128).unwrap(),
            sm90::backward_config(128).unwrap(),
        );
        let blocks = ((fwd.block_rows(), fwd.block_keys), bwd.block_keys());
        assert_eq!((blocks, bwd.block_rows()), (((128, 128), 128), Q_BLOCK));
        let n = 16384;
        let w = |left, right| Window { left, right };
        for causal in [false, true] {
            for (window, most) in [(w(1024, 1024), [17, 34]), (w(1024, 0), [9, 18])] {
                let counts = check((n, n), causal, window, blocks.0, blocks.1);
                let what = format!("causal={causal} {window:?} {counts:?}");
                // Causal (1024, 1024) is (1024, 0).
                let most = if causal { [9, 18] } else { most };
                let blocks = u64::from(n / 128);
                for (count, (most, masked)) in counts.iter().zip([(most[0], 2), (most[1], 4)]) {
                    assert_eq!(count.most, most, "{what}");
                    assert!(count.visited <= blocks * most, "{what}");
                    assert!(count.masked <= blocks * masked, "{what}");
                }
            }
        }
    }
}
