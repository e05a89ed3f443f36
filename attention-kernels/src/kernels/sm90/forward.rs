//! The `wgmma` forward: FlashAttention-2's schedule with each product issued by a warpgroup.
//!
//! A thread block owns `64 · WG` query rows of one (batch, head); warpgroup `w` owns rows
//! `64w .. 64w + 64` and reads its Q straight from shared memory for every `S = Q·Kᵀ`. `O += P·V`
//! takes P from registers (the scores' accumulator layout is the A operand's, see `tile::wgmma`)
//! and V transposed from shared memory. The online softmax is `attn::softmax`'s: each thread holds two
//! rows of its warp's 16.
//!
//! Software-pipelined as FlashAttention-3 does within a warpgroup: step `j` issues `S_j = Q·K_jᵀ`
//! and then `O += P_{j−1}·V_{j−1}`, and computes the softmax of `S_j` while the tensor cores run
//! the second product; O is rescaled by step j's factor once that product is done. So K runs one
//! block ahead of V: step `j` needs `K_j` and `V_{j−1}` and prefetches `K_{j+1}` and `V_j` with
//! `cp.async` into two stages each (one barrier per step).
//!
//! The `GENERAL` instances take every option: sequences (key lengths, packed batches) located as
//! the exact kernels do (`grid.z` is the sequence), and dropout, which multiplies P by the same
//! Philox draws as the exact kernels and the CPU reference after ℓ has summed the undropped P.
//! The others serve full-length batches without dropout with the sequence taken from the kernel
//! parameters, which cost no registers (the layout's values read from memory held 20 more, enough
//! to halve the blocks per SM at d = 64). The `WINDOW` instances add the local window: blocks
//! outside every row's window are skipped, and only blocks across a window edge are masked
//! (`attn::score_mod::key_blocks`, `straddles`). The `MODS` instances (general and windowed too)
//! add softcap, ALiBi and sink logits (`attn::score_mod`). Each kept apart so that the others pay
//! no registers for it: a window-only call of full-length sequences runs the `window` instance,
//! whose registers are the plain one's, not the `mods` one's (which spills at d = 128).
//! The instances without sequences of their own or dropout (plain, padded and window) up to
//! d = 192, and d = 256's plain one, load K and V with the tensor memory accelerator
//! (`sm90::tma_loads`): thread 0 issues each block's copies after the step
//! barrier, and every thread waits on the stage's `mbarrier` instead of its own `cp.async`
//! groups, so the warpgroups spend no issue slots on addresses and copies. Q, once per block,
//! still comes by `cp.async`. The general instances (lengths, packed sequences) keep `cp.async`:
//! their sequences do not sit at one tensor map's coordinates.
//! The plain instances of d = 96 to 256, and d = 64's for long sequences without the causal
//! mask (`sm90::warp_specialized`), add a producer warpgroup to their two (d = 64: three)
//! consumer warpgroups: one of its warps issues K's and V's copies, each once every consumer
//! warpgroup has released the stage's previous block on its `empty` barrier; `setmaxnreg` moves
//! its registers to the consumers. With no block-wide barrier per step left (the consumers meet
//! only on a V block across the causal diagonal, which they sanitize), they take turns issuing
//! their products (round robin on a named barrier per warpgroup), so one warpgroup's softmax
//! runs while another's products hold the tensor cores.
//! Generic over `KD = d / 16` (k-steps of `Q·Kᵀ`), `ND = d / 8` (fragments of O), `NK` (fragments
//! of S) and `NP = NK / 2` (k-steps of `P·V`), so every register array has a compile-time size.

use crate::abi::params::{TensorCoreForwardParams, TmaForwardParams};
use crate::abi::storage::{Bf16, F16};
use crate::arch::{
    block_x, claim_registers, grid_dim_x, named_arrive, named_sync, named_sync_or, opaque,
    release_registers, shared_window, sync_threads, sync_threads_or, thread_x,
};
use crate::attn::dropout::{apply_dropout, dropout_multiplier};
use crate::attn::grid::head_and_sequence;
use crate::attn::mask::{
    Exponent, Operand, Poison, non_finite_part, sanitize_own_chunks, scored_out,
};
use crate::attn::row_keys::RowKeys;
use crate::attn::score_mod::{ScoreMod, Window, distance, key_blocks};
use crate::attn::sequence::Sequence;
use crate::attn::softmax::{RowState, pack, rescale};
use crate::kernels::sm90::WgConfig;
use crate::tile::cp_async::{ChunkedTile, GlobalRows, wait_all};
use crate::tile::mem::{stage_fragments, store_shared_u32, store_staged_rows};
use crate::tile::mem_backward::load_shared_u32;
use crate::tile::mma::{FragA, FragC};
use crate::tile::tma;
use crate::tile::wgmma::{self, Accumulator, Desc, Wgmma};
use crate::tile::{PanelTile, SwizzledTile};

/// Named barriers of the warp-specialized instances: every consumer thread (`CONSUMERS`), and
/// the turn of consumer warpgroup `g` at the tensor cores (`TURN + g`).
const CONSUMERS: u32 = 1;
const TURN: u32 = 2;

/// Scales, modifies and masks the scores `sc` of keys `k0 .. k0 + 8·NK` (`RowKeys::prepare`)
/// and folds them into `state`: `sc` becomes P times `2^bias` (`RowState::fold_biased`; the
/// bias is 0 except in the FP8 forward), the result is the factor that rescales O. A function
/// rather than a closure so that it is always inlined (a call would put the scores in local
/// memory). `fold_scale`, constant per instance: whether it has the registers for a second
/// copy of the fold, which takes the scale in the exponent's `fma` (one instruction per score
/// fewer) where `RowKeys::scale_in_fold` allows (a factor chosen at run time made ptxas spill).
#[inline(always)]
pub(super) fn mask_and_fold<const NK: usize>(
    sc: &mut [FragC; NK],
    state: &mut RowState,
    (scale_log2, bias): (f32, f32),
    k0: u32,
    keys: &RowKeys,
    t: u32,
    fold_scale: bool,
) -> [f32; 2] {
    if fold_scale && keys.scale_in_fold(scale_log2) {
        keys.prepare(sc, (scale_log2, false), k0, t);
        state.fold_biased(sc, scale_log2, bias)
    } else {
        keys.prepare(sc, (scale_log2, true), k0, t);
        state.fold_biased(sc, 1.0, bias)
    }
}

/// `sc = Q·Kᵀ` of the warpgroup's 64 rows from `row0` of `q` against the keys of `k`, issued as
/// one committed group. A function rather than a closure so that it is always inlined: LLVM
/// outlined the closure at d = 192, and the accumulators, passed to the call through local
/// memory, made ptxas serialize every `wgmma` of the kernel (C7520).
///
/// # Safety
/// Q rows `row0 .. row0 + 64` and all of K are filled and published to the async proxy; all 128
/// threads of the warpgroup call it.
#[inline(always)]
unsafe fn scores<T: Wgmma, const KD: usize, const NK: usize>(
    sc: &mut [FragC; NK],
    q: PanelTile,
    row0: u32,
    k: PanelTile,
) where
    [FragC; NK]: Accumulator,
{
    let (a, b) = (desc(q.k_major(row0, 0)), desc(k.k_major(0, 0)));
    for kk in 0..KD as u32 {
        let (a, b) = (
            a.advanced(q.k_step_offset(kk)),
            b.advanced(k.k_step_offset(kk)),
        );
        // SAFETY: forwarded to the caller.
        unsafe { sc.mma_ss::<T>(a, b, kk > 0) };
    }
    wgmma::commit();
}

/// `o += P·V` with P from registers (`pf`, the keys of `v`), issued as one committed group. A
/// function for the reason `scores` is.
///
/// # Safety
/// `v` is filled and published to the async proxy; all 128 threads of the warpgroup call it.
#[inline(always)]
unsafe fn accumulate<T: Wgmma, const ND: usize, const NP: usize>(
    o: &mut [FragC; ND],
    pf: &[FragA; NP],
    v: PanelTile,
) where
    [FragC; ND]: Accumulator,
{
    let b = desc(v.mn_major(0, 0));
    for (kk, pa) in pf.iter().enumerate() {
        // Keys 16 kk .. 16 kk + 16.
        let b = b.advanced(PanelTile::mn_step_offset(16 * kk as u32));
        // SAFETY: forwarded to the caller.
        unsafe { o.mma_rs_trans_b::<T>(pa, b) };
    }
    wgmma::commit();
}

/// The descriptor of a `PanelTile` operand (`k_major`, `mn_major`).
#[inline(always)]
fn desc((start, lbo, sbo): (u32, u32, u32)) -> Desc {
    Desc::swizzle_128(start, lbo, sbo)
}

#[inline(always)]
unsafe fn forward<
    T: Wgmma + Exponent,
    const KD: usize,
    const ND: usize,
    const NK: usize,
    const NP: usize,
    const WG: usize,
    const GENERAL: bool,
    const WINDOW: bool,
    const MODS: bool,
    const PADDED: bool,
    const TMA: bool,
    const WS: bool,
>(
    p: &TensorCoreForwardParams,
    maps: u64,
) where
    [FragC; NK]: Accumulator,
    [FragC; ND]: Accumulator,
{
    const { assert!(ND == 2 * KD && NK == 2 * NP && NP > 0 && KD >= 2 && WG > 0) };
    const { assert!(WINDOW || !MODS) };
    const { assert!(!(TMA && GENERAL)) };
    const { assert!(!WS || (TMA && (WG == 2 || WG == 3) && !PADDED)) };
    let (d, bc, br) = (16 * KD as u32, 8 * NK as u32, 64 * WG as u32);
    // The modifier instances (which spill already) and the three-consumer tile (160 registers a
    // consumer thread) keep one copy of the fold.
    let fold_scale = !MODS && WG == 2;
    // The scores' base-2 scale, and no bias of P (`mask_and_fold`).
    let scale = (p.scale_log2, 0.0);
    // Tiles hold whole 64-column panels: d = 96 uses three quarters of two (`WgConfig::tile_cols`).
    let dt = d.next_multiple_of(64);
    // The consumer warpgroups' threads: all of the block's but a warp-specialized one's producer.
    let threads = 128 * WG as u32;
    let s = p.shape;
    let tid = thread_x();
    let (group, warp, lane) = (tid / 128, (tid / 32) % 4, tid % 32);
    let causal = p.causal != 0;
    // Causal blocks near the end of the sequence do the most work: launch those first.
    let q_block = if causal {
        grid_dim_x() - 1 - block_x()
    } else {
        block_x()
    };
    let Some((h, sq)) = head_and_sequence(s.heads_q, p.layout.sequences) else {
        return;
    };
    let locate = || {
        if GENERAL {
            // SAFETY: `sq` is below the sequence count of a validated layout.
            unsafe { Sequence::locate(&p.layout, &s, opaque(sq)) }
        } else {
            Sequence::full(&s, sq)
        }
    };
    let seq = locate();
    let q0 = q_block * br;
    if q0 >= seq.q_len {
        // The grid covers the longest sequence; this one is shorter. The whole block leaves.
        return;
    }

    // Rows in memory hold the real head dims (`head_dim` for Q and K, `head_dim_v` for V and
    // O); the tiles hold `dt` columns, zeros past them. Instances for the compiled head dim only
    // (`!PADDED`, the host's choice when both equal it) fold the real head dims' guards away: a
    // run-time head dim costs the d = 64 kernel 34 registers.
    let (real_head_dim, real_head_dim_v) = if PADDED {
        (s.head_dim, s.head_dim_v)
    } else {
        (d, d)
    };
    // Byte addresses of the sequence's row 0 of head h (K/V head) and byte strides between rows.
    let (st, real_chunks, v_chunks) = (&p.strides, real_head_dim / 8, real_head_dim_v / 8);
    let hk = s.kv_head(h);
    let q_rows = GlobalRows {
        base: p.q + 2 * seq.q_row(&st.q, 0, h),
        stride: 2 * st.q.seq,
        limit: seq.q_len,
        chunks: real_chunks,
    };
    // Keys past the sequence's length are never seen: they load as zeros and are masked.
    let k_rows = GlobalRows {
        base: p.k + 2 * seq.k_row(&st.k, 0, hk),
        stride: 2 * st.k.seq,
        limit: seq.k_len,
        chunks: real_chunks,
    };
    let v_rows = GlobalRows {
        base: p.v + 2 * seq.k_row(&st.v, 0, hk),
        stride: 2 * st.v.seq,
        chunks: v_chunks,
        ..k_rows
    };

    let smem = shared_window();
    let q_tile = PanelTile::new(smem, br, dt);
    let kv_bytes = bc * dt * 2;
    let kv_base = smem + br * dt * 2;
    let k_tile = |block: u32| PanelTile::new(kv_base + (block & 1) * kv_bytes, bc, dt);
    let v_tile = |block: u32| PanelTile::new(kv_base + (2 + (block & 1)) * kv_bytes, bc, dt);
    // The tensor memory accelerator's instances (`TMA`): the barrier slots after the tiles
    // (`sm90::forward_barrier_slots`), and the two tensor maps at `maps` (K's, then V's). A
    // stage's `full` barrier completes when its block has landed; warp-specialized, its `empty`
    // barrier when every consumer thread has released it.
    let slot = |i: u32| kv_base + 4 * kv_bytes + i * tma::BARRIER_BYTES;
    let k_barrier = |block: u32| slot(block & 1);
    let v_barrier = |block: u32| slot(2 + (block & 1));
    let k_empty = |block: u32| slot(4 + (block & 1));
    let v_empty = |block: u32| slot(6 + (block & 1));
    let map_bytes = core::mem::size_of::<crate::abi::params::TensorMap>() as u64;
    // One thread issues a block's boxes, a 64-column panel each, and expects all of their bytes
    // (zeros past the keys and the head dim count too): thread 0, or the producer's first.
    let issuer = if WS { threads } else { 0 };
    let load = |map: u64, bar: u32, tile: PanelTile, block: u32| {
        if tid == issuer {
            let at = [0, hk as i32, (block * bc) as i32, seq.batch as i32];
            // SAFETY: the barrier is initialized; the stage is free (the step barrier before
            // this issue, or the stage's `empty` barrier, follows every read of its previous
            // block), each panel 1024-byte aligned.
            unsafe {
                tma::arrive_expect_tx(bar, kv_bytes);
                for panel in 0..dt / 64 {
                    let dst = tile.chunk_addr(0, 8 * panel);
                    tma::load_4d(dst, map, bar, [64 * panel as i32, at[1], at[2], at[3]]);
                }
            }
        }
    };
    // SAFETY (both): each stage holds `bc` rows; rows below n_k are inside K and V.
    let fill_k = |block: u32| {
        if TMA {
            load(maps, k_barrier(block), k_tile(block), block)
        } else {
            unsafe { k_tile(block).fill_async(k_rows, block * bc, bc, tid, threads) }
        }
    };
    let fill_v = |block: u32| {
        if TMA {
            load(maps + map_bytes, v_barrier(block), v_tile(block), block)
        } else {
            unsafe { v_tile(block).fill_async(v_rows, block * bc, bc, tid, threads) }
        }
    };

    // The window: `WINDOW` instances only (the host routes every call that has one there), so
    // the others compile without it.
    let window = if WINDOW { p.mods.window } else { Window::NONE };
    let windowed = !window.is_none();
    let last_row = (q0 + br).min(seq.q_len) - 1;
    // Blocks before the first row's window start and past the last row's end are skipped. The
    // plain instances keep their own code for the causal end (and its registers).
    let (first_block, n_blocks) = if windowed {
        key_blocks((q0, last_row), (seq.q_len, seq.k_len), causal, window, bc)
    } else {
        let (first, end) = seq.block_key_range(q0, last_row, causal, window, bc);
        (first / bc, end.div_ceil(bc))
    };

    // A stage's barrier completes once per block it holds: block `b`'s phase has the parity of
    // the stage's uses before it.
    let parity = |block: u32| ((block - first_block) / 2) & 1;
    if TMA {
        if tid == 0 {
            // SAFETY: the slots lie past the tiles, inside the block's shared memory.
            unsafe {
                for i in 0..4 {
                    tma::init(slot(i), 1);
                }
                if WS {
                    for i in 4..8 {
                        tma::init(slot(i), threads);
                    }
                }
            }
            tma::fence_barrier_init();
        }
        sync_threads();
    }

    let group_row = 64 * group;
    let (g, t) = (lane / 4, lane % 4);
    let row_lo = q0 + group_row + 16 * warp + g;
    let row_hi = row_lo + 8;
    let score_mod = if MODS {
        // SAFETY: the head's slope exists when ALiBi is on (validated by the host).
        unsafe { p.mods.for_head(h) }
    } else {
        ScoreMod::default()
    };
    let keys = RowKeys::new(
        row_lo,
        (q0, last_row),
        (seq.q_len, seq.k_len),
        (causal, window),
        score_mod,
    );

    // `setmaxnreg`: the producer keeps what issuing copies takes, the consumers share the rest
    // of what the block launched with (24 + 2 · 240 = 3 · 168; 32 + 3 · 160 = 4 · 128).
    if WS && group == WG as u32 {
        if WG == 3 {
            release_registers::<32>();
        } else {
            release_registers::<24>();
        }
        if warp == 0 && n_blocks > first_block {
            // The producer: K_j and V_{j−1} in the order the consumers take them, each stage
            // reused once both consumer warpgroups have released its previous block.
            let free = |empty: u32, block: u32| {
                let uses = (block - first_block) / 2;
                if uses > 0 {
                    // SAFETY: the stage's previous block was issued and is released by every
                    // consumer thread.
                    unsafe { tma::wait(empty, (uses - 1) & 1) };
                }
            };
            let produce_k = |block: u32| {
                free(k_empty(block), block);
                load(maps, k_barrier(block), k_tile(block), block);
            };
            let produce_v = |block: u32| {
                free(v_empty(block), block);
                load(maps + map_bytes, v_barrier(block), v_tile(block), block);
            };
            produce_k(first_block);
            for block in first_block + 1..n_blocks {
                produce_k(block);
                produce_v(block - 1);
            }
            produce_v(n_blocks - 1);
        }
        return;
    }
    if WS {
        if WG == 3 {
            claim_registers::<160>();
        } else {
            claim_registers::<240>();
        }
    }
    // SAFETY: the Q tile holds `br` rows; rows below n_q are inside Q.
    unsafe { q_tile.fill_async(q_rows, q0, br, tid, threads) };
    if WS {
        // Q is the consumers' own: published to their tensor cores here, K and V by the
        // producer's barriers.
        wait_all();
        wgmma::fence_proxy_async();
        named_sync(CONSUMERS, threads);
    } else if n_blocks > first_block {
        fill_k(first_block);
    }
    let mut o = [FragC::default(); ND];
    let mut state = RowState::new();
    // K_j and V_{j−1} have landed and are visible to the tensor cores, and every warp is done
    // with the products of step j − 1, whose stages the next fills overwrite.
    // A causal diagonal block (or a window's edge) hides some of its keys from some rows: a
    // non-finite V there would reach them as 0 · NaN through P·V. Its V is sanitized as it lands
    // (each thread its own chunks, before the step barrier that publishes them to the tensor
    // cores; the barrier votes whether any was non-finite), and the allowed keys' non-finite
    // part is added to O after the loop (±∞ and NaN survive every rescaling). Keys past the
    // sequence's length load as zeros and need nothing. `k_landed`, `v_landed`: the blocks whose
    // K and V this barrier publishes, if any.
    let step_barrier = |k_landed: Option<u32>, v_landed: Option<u32>| {
        if !WS {
            // Q's copies (the first barrier), and K's and V's without the accelerator.
            wait_all();
        }
        if TMA {
            // SAFETY: each block waited for was issued on its stage's barrier (by thread 0 or
            // the producer).
            unsafe {
                if let Some(block) = k_landed {
                    tma::wait(k_barrier(block), parity(block));
                }
                if let Some(block) = v_landed {
                    tma::wait(v_barrier(block), parity(block));
                }
            }
        }
        let bad = match v_landed {
            Some(block) if (causal || windowed) && keys.partial(block * bc, bc) => {
                // SAFETY: the thread's own copies of V_block have landed (`wait_all`, or the
                // stage's barrier).
                unsafe { sanitize_own_chunks::<T, _>(&v_tile(block), bc, tid, threads) }
            }
            // Warp-specialized, the consumers meet only where a V block needs sanitizing.
            _ if WS => return false,
            _ => false,
        };
        wgmma::fence_proxy_async();
        // Publishes the sanitized chunks to every consumer's products and votes whether any
        // value was non-finite: the whole block, or (warp-specialized) the consumers.
        if WS {
            named_sync_or(CONSUMERS, threads, bad)
        } else {
            sync_threads_or(bad)
        }
    };
    let mut poisoned = false;
    // Warp-specialized, the consumer warpgroups issue their products in turns (round robin):
    // one's softmax runs while another's products occupy the tensor cores. A turn is taken on
    // the group's own named barrier and passed to the next group's after the issue; the last
    // group passes first and skips its last pass, so every barrier completes.
    let last_group = WG as u32 - 1;
    let take_turn = || {
        if WS {
            named_sync(TURN + group, 2 * 128);
        }
    };
    let pass_turn = |last: bool| {
        if WS && !(last && group == last_group) {
            named_arrive(TURN + (group + 1) % WG as u32, 2 * 128);
        }
    };
    // Warp-specialized, every consumer thread releases a stage once its products have read it.
    let release = |empty: u32| {
        if WS {
            // SAFETY: the stage's barrier counts every consumer thread.
            unsafe { tma::arrive(empty) };
        }
    };

    if n_blocks > first_block {
        if WS && group == last_group {
            named_arrive(TURN, 2 * 128);
        }
        step_barrier(Some(first_block), None);
        if !WS {
            if n_blocks > first_block + 1 {
                fill_k(first_block + 1);
            }
            fill_v(first_block);
        }
        let mut sc = [FragC::default(); NK];
        take_turn();
        wgmma::fence();
        // SAFETY: the group's Q rows and K_first are published (barrier above).
        unsafe { scores::<T, KD, NK>(&mut sc, q_tile, group_row, k_tile(first_block)) };
        pass_turn(false);
        wgmma::wait::<0>();
        release(k_empty(first_block));
        sc.pin();
        // O is still zero: its factor changes nothing.
        let k0 = first_block * bc;
        mask_and_fold(&mut sc, &mut state, scale, k0, &keys, t, fold_scale);
        if GENERAL && p.dropout.enabled() {
            apply_dropout(&mut sc, &p.dropout, (seq.index, h), [row_lo, row_hi], k0, t);
        }
        // P of the previous step, waiting for its V.
        let mut pf = pack::<T, NK, NP>(&sc);
        for block in first_block + 1..n_blocks {
            poisoned |= step_barrier(Some(block), Some(block - 1));
            if !WS {
                if block + 1 < n_blocks {
                    fill_k(block + 1);
                }
                fill_v(block);
            }
            let mut sc = [FragC::default(); NK];
            take_turn();
            wgmma::fence();
            // SAFETY: K_block and V_{block−1} are published (barrier above).
            unsafe {
                scores::<T, KD, NK>(&mut sc, q_tile, group_row, k_tile(block));
                accumulate::<T, ND, NP>(&mut o, &pf, v_tile(block - 1));
            }
            pass_turn(false);
            wgmma::wait::<1>();
            release(k_empty(block));
            sc.pin();
            let k0 = block * bc;
            let alpha = mask_and_fold(&mut sc, &mut state, scale, k0, &keys, t, fold_scale);
            if GENERAL && p.dropout.enabled() {
                apply_dropout(&mut sc, &p.dropout, (seq.index, h), [row_lo, row_hi], k0, t);
            }
            wgmma::wait::<0>();
            release(v_empty(block - 1));
            o.pin();
            rescale(&mut o, alpha);
            pf = pack::<T, NK, NP>(&sc);
        }
        poisoned |= step_barrier(None, Some(n_blocks - 1));
        take_turn();
        wgmma::fence();
        // SAFETY: V_{n_blocks−1} is published (barrier above).
        unsafe { accumulate::<T, ND, NP>(&mut o, &pf, v_tile(n_blocks - 1)) };
        pass_turn(true);
        wgmma::wait::<0>();
        o.pin();
    }
    // Every consumer thread, and only those: a warp-specialized block's producer has left.
    let consumers_sync = || {
        if WS {
            named_sync(CONSUMERS, threads);
        } else {
            sync_threads();
        }
    };

    // SAFETY: the head's sink exists when sinks are on (validated by the host).
    let sink = if MODS {
        unsafe { p.mods.sink(h) }
    } else {
        None
    };
    let lse = state.finish(&mut o, sink);
    // The allowed diagonal keys' non-finite part, if any V there was: computed without touching
    // O's accumulators (ptxas serializes the wgmma pipeline otherwise) and put into the staged
    // O below.
    let mut poison = Poison::default();
    if poisoned {
        let v = Operand {
            base: v_rows.base,
            stride: v_rows.stride,
            tiles: v_chunks,
        };
        // Every visited block: blocks the product already took non-finite values from add
        // them again, which changes nothing.
        let from = if windowed {
            first_block * bc
        } else {
            keys.unmasked_end / bc * bc
        };
        // Copies of the parameters the slow path's closures read: a reference into the
        // parameters that escaped into the call would make every block copy all of them to
        // local memory at its start.
        let (rng, scale_log2) = (p.dropout, p.scale_log2);
        let dropping = GENERAL && rng.enabled();
        let key = rng.key();
        let rows = [row_lo, row_hi];
        let dropped = |r: usize, col: u32| {
            dropping && dropout_multiplier(&rng, key, seq.index, h, rows[r], col) == 0.0
        };
        let (starts, ends) = keys.ranges();
        let (q_op, k_op) = (
            Operand {
                base: q_rows.base,
                stride: q_rows.stride,
                tiles: real_chunks,
            },
            Operand {
                base: k_rows.base,
                stride: k_rows.stride,
                tiles: real_chunks,
            },
        );
        let (n_q, n_k) = (seq.q_len, seq.k_len);
        let in_support = |r: usize, key: u32| {
            let score =
                |raw| score_mod.apply_log2(raw, scale_log2, distance(rows[r], key, n_q, n_k));
            // SAFETY: a row below the sequence's length is a row of Q; an allowed key of K.
            rows[r] >= n_q
                || !unsafe { scored_out::<T>(q_op, k_op, (rows[r], key), real_head_dim, score) }
        };
        // SAFETY: allowed keys are below the sequence's key length, rows of V.
        poison = unsafe {
            non_finite_part::<T, ND>(
                (from, n_blocks * bc),
                starts,
                ends,
                v,
                lane,
                dropped,
                in_support,
            )
        };
    }
    // Stage O through the first K stage (row-major, 16-byte chunks swizzled) once every warpgroup
    // is done reading it, so that the global stores are 16 bytes wide and coalesced.
    consumers_sync();
    let staging = SwizzledTile::new(kv_base, dt);
    // SAFETY: the warp's 16 rows and all ND chunks are inside the staging tile.
    unsafe { stage_fragments::<T, ND>(staging, group_row + 16 * warp, &o, 1.0, lane) };
    if poisoned {
        // The lane's own elements of the staged rows (columns 8n + 2t, + 1 of rows g, g + 8).
        for n in 0..ND as u32 {
            for r in 0..2 {
                let row = group_row + 16 * warp + g + 8 * r as u32;
                let at = staging.chunk_addr(row, n) + 4 * t;
                // SAFETY: this lane staged the word just above; inside the staging tile.
                unsafe {
                    let word = load_shared_u32(at);
                    store_shared_u32(at, poison.patch_pair::<T>(r, n, word));
                }
            }
        }
    }
    consumers_sync();
    // The sequence again: read anew rather than kept in registers across the loop.
    let seq = locate();
    let (o_dst, o_stride) = (p.o + 2 * seq.q_row(&p.strides.o, 0, h), 2 * p.strides.o.seq);
    // O's real head dim's chunks only (the staging tile may hold padding columns past them).
    // SAFETY: the chunks are inside the staging tile (v_chunks ≤ its chunks); the global rows
    // below q_len are O's.
    unsafe {
        store_staged_rows(
            staging,
            (br, v_chunks),
            (o_dst, o_stride),
            (q0, seq.q_len),
            (tid, threads),
        )
    };
    if t == 0 {
        let lse_row =
            (seq.batch as u64 * s.heads_q as u64 + h as u64) * s.n_q as u64 + seq.q_start as u64;
        let lse_ptr = p.lse as *mut f32;
        for (row, value) in [(row_lo, lse[0]), (row_hi, lse[1])] {
            if row < seq.q_len {
                // SAFETY: the index is inside the [batch, heads_q, n_q] LSE tensor.
                unsafe { *lse_ptr.add((lse_row + row as u64) as usize) = value };
            }
        }
    }
}

/// One entry point per (dtype, configuration), named `flash_wgmma_forward_<dtype>_d<d>_g<groups>_k<keys>`
/// as the host formats it, `flash_wgmma_forward_general_…` (lengths and dropout),
/// `flash_wgmma_forward_window_…` (the window alone) and `flash_wgmma_forward_mods_…` (all of
/// those and the score modifiers) for the defaults. The defaults' plain instances take the
/// compiled head dim only; `flash_wgmma_forward_padded_…` takes smaller ones (zero-padded
/// columns), as every other instance does. `cp_async` lines take [`TensorCoreForwardParams`],
/// `tma` and `ws` ones (`sm90::tma_loads`; `ws`: warp-specialized, `sm90::warp_specialized`,
/// launched with a producer warpgroup beside the consumers, `sm90::forward_threads`)
/// [`TmaForwardParams`], whose tensor maps the kernel reads in parameter space: its address,
/// taken by name (`<entry>_param_0`), made generic, plus `TMA_MAPS_OFFSET`.
macro_rules! entry_points {
    (@params cp_async $name:ident $p:ident) => {
        TensorCoreForwardParams
    };
    (@params tma $name:ident $p:ident) => {
        TmaForwardParams
    };
    (@params ws $name:ident $p:ident) => {
        TmaForwardParams
    };
    (@run cp_async $name:ident $p:ident) => {
        (&$p, 0)
    };
    (@tma cp_async) => {
        false
    };
    (@tma tma) => {
        true
    };
    (@tma ws) => {
        true
    };
    (@ws ws) => {
        true
    };
    (@ws $kind:ident) => {
        false
    };
    (@run ws $name:ident $p:ident) => {
        entry_points!(@run tma $name $p)
    };
    (@run tma $name:ident $p:ident) => {
        (&$p.base, crate::tile::tma::param_maps!($name))
    };
    ($($kind:ident $name:ident => $t:ty, $cfg:expr, $dropout:literal, $window:literal, $mods:literal, $padded:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: entry_points!(@params $kind $name p)) {
            let (params, maps) = entry_points!(@run $kind $name p);
            // SAFETY: the host validated the buffers against `p` and launched the configuration's
            // grid, block and shared memory (and encoded the tensor maps of a `tma` entry).
            unsafe {
                forward::<
                    $t,
                    { $cfg.head_dim as usize / 16 },
                    { $cfg.head_dim as usize / 8 },
                    { $cfg.block_keys as usize / 8 },
                    { $cfg.block_keys as usize / 16 },
                    { $cfg.warpgroups as usize },
                    $dropout,
                    $window,
                    $mods,
                    $padded,
                    { entry_points!(@tma $kind) },
                    { entry_points!(@ws $kind) },
                >(params, maps)
            }
        }
    )*};
}

entry_points! {
    ws flash_wgmma_forward_bf16_d80_g2_k128 => Bf16, WgConfig { head_dim: 80, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d80_g2_k128 => F16, WgConfig { head_dim: 80, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_bf16_d160_g2_k64 => Bf16, WgConfig { head_dim: 160, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d160_g2_k64 => F16, WgConfig { head_dim: 160, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_bf16_d64_g3_k128 => Bf16, WgConfig { head_dim: 64, warpgroups: 3, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d64_g3_k128 => F16, WgConfig { head_dim: 64, warpgroups: 3, block_keys: 128 }, false, false, false, false;
    tma flash_wgmma_forward_bf16_d32_g2_k64 => Bf16, WgConfig { head_dim: 32, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    tma flash_wgmma_forward_f16_d32_g2_k64 => F16, WgConfig { head_dim: 32, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    tma flash_wgmma_forward_bf16_d64_g2_k64 => Bf16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    tma flash_wgmma_forward_f16_d64_g2_k64 => F16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_bf16_d96_g2_k128 => Bf16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d96_g2_k128 => F16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    cp_async flash_wgmma_forward_general_bf16_d96_g2_k128 => Bf16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, true, false, false, true;
    cp_async flash_wgmma_forward_general_f16_d96_g2_k128 => F16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, true, false, false, true;
    cp_async flash_wgmma_forward_mods_bf16_d96_g2_k64 => Bf16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_bf16_d96_g2_k128 => Bf16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, false, true, false, true;
    cp_async flash_wgmma_forward_mods_f16_d96_g2_k64 => F16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_f16_d96_g2_k128 => F16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, false, true, false, true;
    tma flash_wgmma_forward_padded_bf16_d96_g2_k128 => Bf16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, false, false, false, true;
    tma flash_wgmma_forward_padded_f16_d96_g2_k128 => F16, WgConfig { head_dim: 96, warpgroups: 2, block_keys: 128 }, false, false, false, true;
    ws flash_wgmma_forward_bf16_d128_g2_k128 => Bf16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d128_g2_k128 => F16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    cp_async flash_wgmma_forward_general_bf16_d64_g2_k64 => Bf16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, true, false, false, true;
    cp_async flash_wgmma_forward_general_f16_d64_g2_k64 => F16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, true, false, false, true;
    cp_async flash_wgmma_forward_general_bf16_d128_g2_k128 => Bf16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, true, false, false, true;
    cp_async flash_wgmma_forward_general_f16_d128_g2_k128 => F16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, true, false, false, true;
    cp_async flash_wgmma_forward_mods_bf16_d64_g2_k64 => Bf16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_bf16_d64_g2_k64 => Bf16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, false, true, false, true;
    cp_async flash_wgmma_forward_mods_f16_d64_g2_k64 => F16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_f16_d64_g2_k64 => F16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, false, true, false, true;
    cp_async flash_wgmma_forward_mods_bf16_d128_g2_k64 => Bf16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_bf16_d128_g2_k128 => Bf16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, false, true, false, true;
    cp_async flash_wgmma_forward_mods_f16_d128_g2_k64 => F16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_f16_d128_g2_k128 => F16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, false, true, false, true;
    ws flash_wgmma_forward_bf16_d192_g2_k64 => Bf16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d192_g2_k64 => F16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    cp_async flash_wgmma_forward_general_bf16_d192_g2_k64 => Bf16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, true, false, false, true;
    cp_async flash_wgmma_forward_general_f16_d192_g2_k64 => F16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, true, false, false, true;
    cp_async flash_wgmma_forward_mods_bf16_d192_g2_k64 => Bf16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_bf16_d192_g2_k64 => Bf16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, false, true, false, true;
    cp_async flash_wgmma_forward_mods_f16_d192_g2_k64 => F16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    tma flash_wgmma_forward_window_f16_d192_g2_k64 => F16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, false, true, false, true;
    ws flash_wgmma_forward_bf16_d256_g2_k64 => Bf16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d256_g2_k64 => F16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, false, false, false, false;
    cp_async flash_wgmma_forward_general_bf16_d256_g2_k64 => Bf16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, true, false, false, true;
    cp_async flash_wgmma_forward_general_f16_d256_g2_k64 => F16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, true, false, false, true;
    cp_async flash_wgmma_forward_mods_bf16_d256_g2_k64 => Bf16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    cp_async flash_wgmma_forward_window_bf16_d256_g2_k64 => Bf16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, false, true, false, true;
    cp_async flash_wgmma_forward_mods_f16_d256_g2_k64 => F16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, true, true, true, true;
    cp_async flash_wgmma_forward_window_f16_d256_g2_k64 => F16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, false, true, false, true;
    tma flash_wgmma_forward_padded_bf16_d64_g2_k64 => Bf16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    tma flash_wgmma_forward_padded_f16_d64_g2_k64 => F16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    tma flash_wgmma_forward_padded_bf16_d128_g2_k128 => Bf16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, false, false, false, true;
    tma flash_wgmma_forward_padded_f16_d128_g2_k128 => F16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 128 }, false, false, false, true;
    tma flash_wgmma_forward_padded_bf16_d192_g2_k64 => Bf16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    tma flash_wgmma_forward_padded_f16_d192_g2_k64 => F16, WgConfig { head_dim: 192, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    cp_async flash_wgmma_forward_padded_bf16_d256_g2_k64 => Bf16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    cp_async flash_wgmma_forward_padded_f16_d256_g2_k64 => F16, WgConfig { head_dim: 256, warpgroups: 2, block_keys: 64 }, false, false, false, true;
}

/// Tuning candidates (the `tuning` feature): compared against the defaults by the timing examples.
#[cfg(feature = "tuning")]
entry_points! {
    ws flash_wgmma_forward_bf16_d64_g2_k128 => Bf16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d64_g2_k128 => F16, WgConfig { head_dim: 64, warpgroups: 2, block_keys: 128 }, false, false, false, false;
    ws flash_wgmma_forward_bf16_d64_g3_k64 => Bf16, WgConfig { head_dim: 64, warpgroups: 3, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d64_g3_k64 => F16, WgConfig { head_dim: 64, warpgroups: 3, block_keys: 64 }, false, false, false, false;
    tma flash_wgmma_forward_bf16_d128_g2_k64 => Bf16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    tma flash_wgmma_forward_f16_d128_g2_k64 => F16, WgConfig { head_dim: 128, warpgroups: 2, block_keys: 64 }, false, false, false, true;
    ws flash_wgmma_forward_bf16_d128_g3_k64 => Bf16, WgConfig { head_dim: 128, warpgroups: 3, block_keys: 64 }, false, false, false, false;
    ws flash_wgmma_forward_f16_d128_g3_k64 => F16, WgConfig { head_dim: 128, warpgroups: 3, block_keys: 64 }, false, false, false, false;
}
