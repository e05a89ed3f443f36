//! The `wgmma` backward's main kernel, FlashAttention-2 schedule (K/V outer, Q inner).
//!
//! A thread block owns one K/V block of `64 · WG` keys of one (batch, kv-head); warpgroup `w` owns
//! keys `64w .. 64w + 64` and keeps their dK and dV accumulators in registers across the loop over
//! the Q blocks (64 rows, every query head of the GQA group) that can see them. Q, dO and the
//! rows' statistics stream through three shared stages (`cp.async` fills block `i + 1` while block
//! `i` is computed and step `i − 1`'s last products may still read theirs). Per Q block, each product one `wgmma` chain of the warpgroup:
//!   `Sᵀ = K·Qᵀ` and `dPᵀ = V·dOᵀ` (both operands K-major in shared memory),
//!   `Pᵀ = 2^(Sᵀ·τ·log2 e − LSE·log2 e)`, `dSᵀ = Pᵀ ∘ (dPᵀ − D)` in registers,
//!   `dV += Pᵀ·dO` and `dK += dSᵀ·Q` (A from registers, B = dO or Q transposed),
//!   `dQ = dS·K` with `dS` read transposed from the `dSᵀ` tile every warpgroup wrote, each
//!   warpgroup taking `d / WG` columns, added into the f32 accumulator with `red.global.add`.
//! The products of one step are issued as separate groups so that `Pᵀ` is computed while `dPᵀ`
//! runs and `dSᵀ` while dV runs. With `CARRY_DQ`, dQ of step `i` is left running into step
//! `i + 1` (its `dSᵀ` tile is double-buffered) and its reductions are sent while step `i + 1`'s
//! `dPᵀ` runs; that keeps 8 · DQ more registers live across the step, which d = 128 does not have
//! (ptxas serializes the products and spills) and which d = 32 gives to a second block per SM, so
//! there dQ is waited for and sent in its own step, with dK issued after it so that the
//! reductions run under dK. Two barriers
//! per step: one publishes the landed Q/dO stage, one the `dSᵀ` tile; a stage or `dSᵀ` buffer is
//! overwritten only after every warpgroup has waited for the products that read it.
//! The `GENERAL` instances take every option, as the forward's do: sequences located from the
//! layout (`grid.z` is the sequence; rows past a packed sequence's end are masked, since their
//! statistics belong to the next one) and dropout (`dV += (P∘Z)ᵀ·dO`, `dS = P ∘ (dP∘Z − D)`, with
//! the exact kernels' Philox draws). The `WINDOW` instances add the local window: a K/V block
//! visits only the Q blocks whose rows' windows reach it (`attn::backward::window_q_blocks`) and masks
//! only the pairs across a window edge (`window_needs_mask`). The `MODS` instances (general and
//! windowed too) add softcap (dS times `1 − tanh²`) and ALiBi (`attn::score_mod`). Each is kept
//! apart so that the others pay no registers for it (a window-only call of full-length
//! sequences runs the `window` one); d = 128's `mods` instance, which spilled on the unsliced
//! tiles, is `SLICED` (`sm90::backward_mods_config`). The others take the
//! sequence from the kernel parameters.
//! The `DETERMINISTIC` instances (without `GENERAL` or `CARRY_DQ`) add each Q block's dQ in key
//! order: a semaphore per (batch, head, Q block) counts the K/V blocks that have added theirs
//! (`attn::backward::dq_adds_before`); one thread waits for its count, the block adds, and one
//! thread releases the count + 1. Their barriers sit on compile-time paths only.
//! The `SLICED` instances (d = 192 and 256, and d = 128's `mods`; d = 192's plain calls run
//! `backward_transposed` instead) split the head dim instead of the keys: both warpgroups
//! own the block's 64 keys; each computes `Sᵀ`, `Pᵀ`, `dPᵀ` and `dSᵀ` for its half of the Q
//! block's rows (`m64n32`, `WgBackwardConfig::score_queries`) and writes `Pᵀ` (times Z) and
//! `dSᵀ` to the two `dSᵀ` buffers, which it does not need for dQ (not carried); after a barrier
//! each accumulates dK, dV and dQ of its own half of the head dim only
//! (`WgBackwardConfig::slice_cols`) over all 64 rows, A from those tiles, so the accumulators
//! fit in registers. A half of up to 96 columns takes one dQ chain, issued before dV and dK so
//! that its reductions run under them; d = 256's halves take two 64-column chains, issued
//! before dV and before dK. The tiles hold each half from a 128-column boundary
//! (`tile::GappedTile`; d = 128's halves are whole panels and sit side by side,
//! `WgBackwardConfig::slice_stride`): 256 columns at d = 160 and 192 too, so that each group's operands of
//! dV, dK and dQ start a panel, and both groups issue the same products (products of different
//! shapes would sit in a branch on the warpgroup, which ptxas cannot tell uniform, and that
//! serializes every `wgmma` of the kernel, C7520).
//! The instances without sequences of their own or dropout (plain, window, deterministic) load
//! each step's Q and dO tiles with the tensor memory accelerator (`sm90::tma_loads_backward`):
//! thread 0 issues their boxes and two bulk copies of the rows' statistics on the stage's
//! `mbarrier`, which every thread waits on (the general instances copy the statistics with
//! `cp.async`).
//! The d = 256 instances among them that are not deterministic add dQ with the accelerator too
//! (`sm90::bulk_dq`): each group waits for its dV product and stages its first 64-column chain
//! of dQ (f32) in its own panels of the stage's dO tile, then after dK its second chain in its
//! panels of the Q tile, both dead for the rest of the step; after each chain a barrier of the
//! group's own warps, then its first thread sends the chain's two 32-column boxes with
//! `cp.reduce.async.bulk.tensor` into the accumulator (rows past n_q fall outside its tensor
//! map). A step later both senders wait for their reads before the `dSᵀ` barrier, after which
//! thread 0 refills the stage. No `red.global` is left in them.
//! The tall configuration (d = 64's plain instance, `WgBackwardConfig::tall_q_blocks`) takes Q
//! blocks of 128 rows: each group's `Sᵀ` and `dPᵀ` are `m64n128` (`NS` = 16 fragments), dV and
//! dK take 8 k-steps, and the groups split dQ by rows (64 each, all 64 columns: `m64n64` over
//! the block's 128 keys) instead of by columns; dQ is not carried and two stages suffice.
//! Generic over `KD = d / 16`, `ND` (fragments of dK, dV: `d / 8`, or a slice's), `NS` and
//! `NA` (fragments of a group's `Sᵀ` columns and of its `Pᵀ` A operands), `WG` and
//! `DQ` (fragments of one dQ chain, [`WgBackwardConfig::dq_cols`]), so every register array has
//! a compile-time size.

use crate::abi::layout::TensorStrides;
use crate::abi::params::{TMA_BACKWARD_DQ_MAP, TensorCoreBackwardParams, TmaBackwardParams};
use crate::abi::storage::{Bf16, F16};
use crate::arch::{ballot, sync_threads_or};
use crate::arch::{
    block_x, exp2, named_sync, opaque, shared_window, sync_threads, thread_x, warp_uniform,
};
use crate::attn::backward::{
    dq_adds_before, dq_semaphore, first_block_of_rows, needs_mask, window_needs_mask,
    window_q_blocks,
};
use crate::attn::dropout::transposed_keep_bits;
use crate::attn::grid::{head_and_sequence, head_here};
use crate::attn::mask::hidden;
use crate::attn::mask::{
    Exponent, MASKED, is_masked, quad_any, sanitize_own_chunks, sanitize_row_part,
};
use crate::attn::score_mod::{ScoreMod, Window, key_range};
use crate::attn::sequence::Sequence;
use crate::kernels::BACKWARD_SLICE_COLS;
use crate::kernels::sm90::{
    BACKWARD_D32, BACKWARD_D64, BACKWARD_D64_TALL, BACKWARD_D80, BACKWARD_D96, BACKWARD_D128,
    BACKWARD_D160, BACKWARD_D192, BACKWARD_D256, WgBackwardConfig, backward_mods_config, bulk_dq,
};
use crate::tile::cp_async::{ChunkedTile, GlobalRows, copy4, copy16, wait_all};
use crate::tile::mem::{stage_fragments_at, store_shared_u32, store_staged_rows};
use crate::tile::mem_backward::{
    load_shared_f32x2, load_shared_u32, red_add_f32x2, release_store, store_shared_f32x2,
    wait_equal_acquire,
};
use crate::tile::mma::{FragA, FragC, each_fragment};
use crate::tile::panel::f32_box_offset;
use crate::tile::tma;
use crate::tile::wgmma::{self, Accumulator, Desc, Wgmma};
use crate::tile::{GappedTile, PanelTile, SwizzledTile};

/// Query columns of `Sᵀ` per Q block: 8 fragments of 8.
const NQ: usize = 8;
/// k-steps over the Q block in `dV += Pᵀ·dO` and `dK += dSᵀ·Q`.
const NQP: usize = NQ / 2;

/// The descriptor of the operand `offset` bytes past `first` (`PanelTile::k_major`,
/// `mn_major`): `first`'s own, built once per product and advanced (`Desc::advanced`), when
/// `hoist`; else rebuilt from the address, as the general and modifier instances keep it (short
/// of registers, they spilled a quarter more holding the built one across a product).
#[inline(always)]
fn stepped(first: (u32, u32, u32), offset: u32, hoist: bool) -> Desc {
    if hoist {
        Desc::swizzle_128(first.0, first.1, first.2).advanced(offset)
    } else {
        Desc::swizzle_128(first.0 + offset, first.1, first.2)
    }
}

/// `acc += A · B` over the Q block's k-steps, one committed group: A (`Pᵀ` or `dSᵀ`) from
/// registers, one fragment per 16 queries, and B (dO or Q) MN-major from `b`.
///
/// # Safety
/// Queries `0 .. 16 · K` of B are filled and published; the whole warpgroup calls it.
#[inline(always)]
unsafe fn accumulate_rs<T: Wgmma, const N: usize, const K: usize>(
    acc: &mut [FragC; N],
    a: &[FragA; K],
    b: (u32, u32, u32),
    hoist: bool,
) where
    [FragC; N]: Accumulator,
{
    wgmma::fence();
    for (k, a) in a.iter().enumerate() {
        let b = stepped(b, PanelTile::mn_step_offset(16 * k as u32), hoist);
        // SAFETY: forwarded to the caller.
        unsafe { acc.mma_rs_trans_b::<T>(a, b) };
    }
    wgmma::commit();
}

/// `acc += A · B` over the Q block's k-steps, one committed group: A (`Pᵀ` or `dSᵀ`, every
/// query of the block) K-major from `a`, and B (dO or Q) MN-major from `b`. The sliced
/// instances accumulate dV and dK this way, each group over its slice of B's columns.
///
/// # Safety
/// Queries `0 .. 16 · NQP` of A and B (a Q block of
/// [`Q_BLOCK`](crate::attn::backward::Q_BLOCK) rows) are written and published; the whole
/// warpgroup calls it.
#[inline(always)]
unsafe fn accumulate_ss<T: Wgmma, const N: usize>(
    acc: &mut [FragC; N],
    a: PanelTile,
    b: (u32, u32, u32),
    hoist: bool,
) where
    [FragC; N]: Accumulator,
{
    wgmma::fence();
    let first = a.k_major(0, 0);
    for kk in 0..NQP as u32 {
        let (a, b) = (
            stepped(first, a.k_step_offset(kk), hoist),
            stepped(b, PanelTile::mn_step_offset(16 * kk), hoist),
        );
        // SAFETY: forwarded to the caller.
        unsafe { acc.mma_ss_trans_b::<T>(a, b, true) };
    }
    wgmma::commit();
}

#[inline(always)]
unsafe fn backward<
    T: Wgmma + Exponent,
    const KD: usize,
    const ND: usize,
    const NS: usize,
    const NA: usize,
    const WG: usize,
    const DQ: usize,
    const CARRY_DQ: bool,
    const GENERAL: bool,
    const WINDOW: bool,
    const MODS: bool,
    const DETERMINISTIC: bool,
    const SLICED: bool,
    const TMA: bool,
>(
    p: &TensorCoreBackwardParams,
    maps: u64,
) where
    [FragC; ND]: Accumulator,
    [FragC; NS]: Accumulator,
    [FragC; DQ]: Accumulator,
{
    // Tall Q blocks (`WgBackwardConfig::tall_q_blocks`): 128 queries in `Sᵀ`, plain instances.
    let tall = !SLICED && NS == 2 * NQ;
    const {
        assert!(KD >= 2 && WG > 0 && 2 * NA == NS);
        assert!(if SLICED {
            16 * KD == 8 * ND * WG
                && ND <= 16
                && (DQ == ND || 2 * DQ == ND)
                && WG == 2
                && !CARRY_DQ
                && NS * WG == NQ
        } else if NS == 2 * NQ {
            ND == 2 * KD
                && DQ == ND
                && WG == 2
                && !CARRY_DQ
                && !GENERAL
                && !WINDOW
                && !DETERMINISTIC
        } else {
            ND == 2 * KD
                && (DQ * WG == ND || 8 * DQ * WG == (16 * KD).next_multiple_of(64))
                && NS == NQ
        });
    };
    const { assert!(!DETERMINISTIC || !(CARRY_DQ || GENERAL || WINDOW)) };
    // Dropout's keep bits fill a `u32` (`transposed_keep_bits`).
    const { assert!(!GENERAL || NS <= 8) };
    const { assert!(WINDOW || !MODS) };
    const { assert!(!(TMA && GENERAL)) };
    let cfg = WgBackwardConfig {
        head_dim: 16 * KD as u32,
        warpgroups: WG as u32,
        split_head_dim: SLICED && 16 * KD as u32 <= BACKWARD_SLICE_COLS,
        tall_q_blocks: tall,
    };
    // d = 256's bulk dQ stages two chains of 64 columns per group (`stage_dq` below).
    const { assert!(!(SLICED && KD == 16) || (ND == 16 && DQ == 8)) };
    let bulk = bulk_dq(&cfg, TMA, DETERMINISTIC);
    let (d, bc, br) = (cfg.tile_cols(), cfg.block_keys(), cfg.block_rows());
    let threads = cfg.threads();
    let s = p.shape;
    let tid = thread_x();
    // The warpgroup's index made uniform for ptxas (`arch::warp_uniform`), so that the operand
    // descriptors that depend on it are built on the uniform datapath; not where it cost
    // registers the instance lacks: the general and modifier instances spill already, and
    // d = 32's 128 (two blocks per SM) spilled twice as much with it.
    let group = if GENERAL || MODS || KD == 2 {
        tid / 128
    } else {
        warp_uniform(tid / 128)
    };
    let (warp, lane) = ((tid / 32) % 4, tid % 32);
    // `bulk`: the thread that sends its group's dQ boxes and waits for their reads.
    let leader = tid % 128 == 0;
    // Descriptors built once per product and advanced per k-step (`stepped`).
    let hoist = !GENERAL && !MODS;
    let (g, t) = (lane / 4, lane % 4);
    let causal = p.causal != 0;
    let Some((hk, sq)) = head_and_sequence(s.heads_kv, p.layout.sequences) else {
        return;
    };
    let kv_block = block_x();
    let seq = if GENERAL {
        // SAFETY: `sq` is below the sequence count of a validated layout.
        unsafe { Sequence::locate(&p.layout, &s, sq) }
    } else {
        Sequence::full(&s, sq)
    };
    let k0 = kv_block * bc;
    if k0 >= seq.k_rows {
        // The grid covers the longest sequence; this one is shorter. The whole block leaves.
        return;
    }
    let heads_per_kv = s.heads_q / s.heads_kv;
    let (n_q, n_k) = (seq.q_len, seq.k_len);

    // Rows in memory hold the real head dims (`dr` for Q, K, dQ and dK, `head_dim_v` for V, O,
    // dO and dV); the tiles hold `d`, zeros past them.
    // V's chunk count is read anew at each use (`opaque`): held across the loop it costs the
    // wide instances spills.
    let (dr, real_chunks) = (s.head_dim, s.head_dim / 8);
    let v_chunks = || opaque(s.head_dim_v) / 8;
    let ts = &p.strides;
    // Byte address of the sequence's key row 0 of head hk in K-shaped tensors.
    let kv_at = |base: u64, strides: &TensorStrides| base + 2 * seq.k_row(strides, 0, hk);
    // Row of (the sequence's row 0, head h) in the padded statistics.
    let stats_row =
        |h: u32| (seq.batch * s.heads_q + h) as u64 * p.n_q_pad as u64 + seq.q_start as u64;

    // Every tile is derived from the window's address; the loop re-derives it through `opaque` so
    // that the dozens of descriptors are computed at their use instead of each holding registers
    // across the loop (which spilled at d = 128).
    let smem = shared_window();
    let (kv_bytes, q_bytes) = (bc * d * 2, br * d * 2);
    // K, V, Q and dO hold the head dim in logical columns; SLICED, each group's slice from a
    // 128-column boundary.
    let gapped = |tile: PanelTile| {
        if SLICED {
            GappedTile::new(tile, cfg.slice_cols() / 8, cfg.slice_stride() / 8)
        } else {
            GappedTile::new(tile, d / 8, d / 8)
        }
    };
    let k_tile = |base: u32| gapped(PanelTile::new(base, bc, d));
    let v_tile = |base: u32| gapped(PanelTile::new(base + kv_bytes, bc, d));
    let stages = cfg.stages();
    let stage = |base: u32, st: u32| base + 2 * kv_bytes + st * 2 * q_bytes;
    let q_tile = |base: u32, st: u32| gapped(PanelTile::new(stage(base, st), br, d));
    let do_tile = |base: u32, st: u32| gapped(PanelTile::new(stage(base, st) + q_bytes, br, d));
    let ds_base = |base: u32| base + 2 * kv_bytes + stages * 2 * q_bytes;
    // dSᵀ, per stage: one key per row, one query per column.
    let ds_tile = |base: u32, st: u32| PanelTile::new(ds_base(base) + st * bc * br * 2, bc, br);
    // Per stage: `LSE · log2 e` of the block's rows, then their `D`.
    let stats = |base: u32, st: u32| ds_base(base) + 2 * bc * br * 2 + st * 2 * br * 4;
    // Q/dO/statistics stage and dSᵀ buffer of step i.
    let stage_of = |i: u32| i % stages;

    // The window (`WINDOW` instances only; the others compile without it): the K/V block visits
    // only the Q blocks of rows whose window reaches it.
    let window = if WINDOW { p.mods.window } else { Window::NONE };
    let windowed = !window.is_none();
    let (first_block, end_block) = if windowed {
        window_q_blocks(k0, bc, (n_q, n_k), causal, window)
    } else {
        (
            first_block_of_rows(k0, n_q, n_k, causal, br),
            n_q.div_ceil(br),
        )
    };
    let per_head = end_block.saturating_sub(first_block);
    let iters = per_head * heads_per_kv;
    // Without GENERAL the K/V head is recomputed at each use (no register across the loop: no
    // spills at d = 128); GENERAL instances spill more that way, so they keep it.
    let kv_head = || if GENERAL { hk } else { head_here(s.heads_kv) };
    let head_of = |i: u32| kv_head() * heads_per_kv + i / per_head;
    let row0_of = |i: u32| (first_block + i % per_head) * br;

    // The accelerator's barriers, one per stage, after everything else (`TMA` instances).
    let barrier = |st: u32| smem + cfg.shared_bytes() + st * tma::BARRIER_BYTES;
    let map_bytes = core::mem::size_of::<crate::abi::params::TensorMap>() as u64;
    let fill = |i: u32, st: u32| {
        let (h, q0) = (head_of(i), row0_of(i));
        let row = stats_row(h) + q0 as u64;
        if TMA && tid == 0 {
            let at = [h as i32, q0 as i32, seq.batch as i32];
            // SAFETY: the barrier is initialized; the stage is free (every warpgroup passed the
            // barrier after its last read); each panel is 1024-byte aligned; the statistics are
            // padded to whole Q blocks, each 256-byte aligned (the sequence starts at row 0).
            unsafe {
                tma::arrive_expect_tx(barrier(st), 2 * q_bytes + 2 * br * 4);
                tma::load_bulk(stats(smem, st), p.lse_log2 + row * 4, br * 4, barrier(st));
                tma::load_bulk(
                    stats(smem, st) + br * 4,
                    p.d_sum + row * 4,
                    br * 4,
                    barrier(st),
                );
                for (tile, map) in [
                    (q_tile(smem, st), maps),
                    (do_tile(smem, st), maps + map_bytes),
                ] {
                    for panel in 0..d / 64 {
                        let col = tile.panel_origin(panel);
                        let dst = tile.chunk_addr(0, col / 8);
                        tma::load_4d(dst, map, barrier(st), [col as i32, at[0], at[1], at[2]]);
                    }
                }
            }
        }
        // SAFETY: each stage holds `br` rows; rows below n_q are inside Q and dO; the statistics
        // are padded to whole Q blocks, so every chunk is inside them, and a packed sequence's
        // rows are copied one by one (its first row need not start a 16-byte chunk).
        unsafe {
            // The sequence's first row recomputed here (`opaque`): hoisted out of the loop, Q's
            // and dO's offsets would each hold a register pair across it.
            let (batch, row0) = (opaque(seq.batch), opaque(seq.q_start));
            let rows = |base: u64, strides: &TensorStrides, chunks: u32| GlobalRows {
                base: base + 2 * strides.offset(batch, row0, h),
                stride: 2 * strides.seq,
                limit: n_q,
                chunks,
            };
            if !TMA {
                q_tile(smem, st).fill_async(rows(p.q, &ts.q, real_chunks), q0, br, tid, threads);
                do_tile(smem, st).fill_async(
                    rows(p.d_o, &ts.d_o, v_chunks()),
                    q0,
                    br,
                    tid,
                    threads,
                );
            }
            if GENERAL {
                if tid < 2 * br {
                    let (which, r) = (tid / br, tid % br);
                    let base = if which == 0 { p.lse_log2 } else { p.d_sum };
                    let valid = q0 + r < n_q;
                    let src = if valid {
                        base + (row + r as u64) * 4
                    } else {
                        base
                    };
                    copy4(stats(smem, st) + which * br * 4 + r * 4, src, valid);
                }
            } else if !TMA {
                let chunks = br / 4;
                if tid < 2 * chunks {
                    let (which, c) = (tid / chunks, tid % chunks);
                    let base = if which == 0 { p.lse_log2 } else { p.d_sum };
                    copy16(
                        stats(smem, st) + which * br * 4 + c * 16,
                        base + row * 4 + c as u64 * 16,
                        true,
                    );
                }
            }
        }
    };

    // SAFETY: the K and V tiles hold `bc` rows; rows below n_k are inside K and V. Keys past
    // the sequence's length load as zeros and are masked.
    unsafe {
        let rows = |base: u64, strides: &TensorStrides, chunks: u32| GlobalRows {
            base: kv_at(base, strides),
            stride: 2 * strides.seq,
            limit: n_k,
            chunks,
        };
        k_tile(smem).fill_async(rows(p.k, &ts.k, real_chunks), k0, bc, tid, threads);
        v_tile(smem).fill_async(rows(p.v, &ts.v, v_chunks()), k0, bc, tid, threads);
    }
    if TMA {
        if tid == 0 {
            for st in 0..stages {
                // SAFETY: the barriers lie past the tiles, inside the block's shared memory.
                unsafe { tma::init(barrier(st), 1) };
            }
            tma::fence_barrier_init();
        }
        sync_threads();
    }
    if iters > 0 {
        fill(0, 0);
    }

    let group_key = if SLICED { 0 } else { 64 * group };
    // The group's first query column of `Sᵀ`, `dPᵀ`, `Pᵀ` and `dSᵀ`: 0 (all of the block's),
    // or (SLICED) that of its share.
    let q_col0 = if SLICED { 8 * NS as u32 * group } else { 0 };
    let key_row = group_key + 16 * warp;
    let (key_lo, key_hi) = (k0 + key_row + g, k0 + key_row + g + 8);
    // The group's columns of dK and dV: all of them, or (SLICED) its slice.
    let (col0, cols) = if SLICED {
        (cfg.slice_cols() * group, cfg.slice_cols())
    } else {
        (0, d)
    };
    // The group's dQ: columns from `dq_col0` of every row of the Q block, or (tall) every
    // column of its rows from `dq_row0`.
    let dq_col0 = if SLICED {
        col0
    } else if tall {
        0
    } else {
        group * cfg.dq_cols()
    };
    let dq_row0 = if tall { 64 * group } else { 0 };
    // A key whose K row holds a non-finite value scores non-finite against every query: rows
    // that allow it have a NaN LSE (made empty by the preprocess; `nan_rows` writes their
    // gradients) or leave it out of their support (a −∞ score). Its K row is zeroed once here
    // (so dQ = dS·K cannot turn a masked 0 into NaN), and its P is MASKED. Bit 0: key g of the
    // warp, bit 1: key g + 8;
    // `k_poisoned`: any key of the block (block-uniform).
    let mut k_poison = 0u32;
    let mut k_poisoned = false;
    if iters > 0 {
        wait_all();
        sync_threads();
        let kt = k_tile(smem);
        for (bit, row) in [(0, key_row + g), (1, key_row + g + 8)] {
            // SAFETY: the lane's quarter of its own key rows of the K tile (of the group's
            // columns, SLICED), which only this quad touches before the barrier below.
            let bad = unsafe {
                sanitize_row_part::<T>(|c| kt.chunk_addr(row, col0 / 8 + c), cols / 8, t)
            };
            k_poison |= (bad as u32) << bit;
        }
        k_poison = quad_any(k_poison);
        if SLICED {
            // The other group sanitized the other columns of the same keys: trade the bits
            // through the `dSᵀ` buffers, unused until the loop's first barrier.
            // SAFETY: word `tid` (and the other group's `tid ± 128`) of the `dSᵀ` buffers.
            unsafe {
                store_shared_u32(ds_base(smem) + 4 * tid, k_poison);
                sync_threads();
                k_poison |= load_shared_u32(ds_base(smem) + 4 * ((tid + 128) % 256));
            }
        }
        if k_poison != 0 {
            wgmma::fence_proxy_async();
        }
        k_poisoned = sync_threads_or(k_poison != 0);
    }
    let mut dk = [FragC::default(); ND];
    let mut dv = [FragC::default(); ND];
    // dQ of the previous step: in flight until this step's first wait, then reduced.
    let mut dq = [FragC::default(); DQ];
    let mut dq_at = (0u32, 0u32);
    let reduce_dq = |dq: &[FragC; DQ], (h, q0): (u32, u32), dq_col0: u32| {
        // Each lane holds two consecutive columns of rows g and g + 8 per fragment: one 8-byte
        // vector reduction each, with no lane exchange.
        let row = q0 + dq_row0 + 16 * warp + g;
        let col = (dq_col0 + 2 * t) as u64;
        // The accumulator is contiguous, in Q's shape.
        let lo = p.dq_accum + (seq.q_offset(&s, row, h) as u64 + col) * 4;
        let hi = p.dq_accum + (seq.q_offset(&s, row + 8, h) as u64 + col) * 4;
        // Columns past the real head dim are padding (dQ there is 0), not in the accumulator,
        // nor are rows past n_q. A block inside both (the common case, one test for the whole
        // block) sends every fragment with no test of its own.
        let inside = q0 + br <= n_q && dq_col0 + 8 * DQ as u32 <= dr;
        for (j, f) in dq.iter().enumerate() {
            let [lo0, lo1, hi0, hi1] = f.0;
            let real = dq_col0 + 8 * (j as u32) < dr;
            let (at_lo, at_hi) = (lo + 32 * j as u64, hi + 32 * j as u64);
            // SAFETY: the row is below n_q and columns col + 8j .. + 2 < dr are inside the
            // accumulator, 8-byte aligned (col is even, rows are whole 16-byte chunks).
            unsafe {
                if inside {
                    red_add_f32x2(at_lo, [lo0, lo1]);
                    red_add_f32x2(at_hi, [hi0, hi1]);
                } else {
                    if real && row < n_q {
                        red_add_f32x2(at_lo, [lo0, lo1]);
                    }
                    if real && row + 8 < n_q {
                        red_add_f32x2(at_hi, [hi0, hi1]);
                    }
                }
            }
        }
    };
    let mut i = 0;
    while i < iters {
        // Block i has landed and is visible to the tensor cores; every warpgroup is done with
        // block i − 1 (its stage is refilled next) and with the previous dSᵀ.
        wait_all();
        let st = stage_of(i);
        if TMA {
            // SAFETY: block i's Q and dO were issued on its stage's barrier, whose phase
            // completes once per use: the parity of the uses before it.
            unsafe { tma::wait(barrier(st), (i / stages) & 1) };
        }
        let (h, q0) = (head_of(i), row0_of(i));
        let keys_of = |row: u32| key_range(row, n_q, n_k, causal, window);
        // Only pairs across a window edge, the causal diagonal or the key length are masked.
        let masked = if windowed {
            window_needs_mask((q0, k0), bc, (n_q, n_k), causal, window)
        } else {
            needs_mask(q0, k0, bc, n_q, n_k, causal)
        };
        // A non-finite Q row would reach dK as 0 · NaN through dSᵀ·Q. Every score of such a row
        // is non-finite, so its LSE is NaN or −∞ and the preprocess made it empty (P = 0,
        // D = 0; `nan_rows` writes a NaN row's gradients): zeroing its non-finite elements
        // changes no gradient. Each thread sanitizes the chunks it copied, before the barrier
        // that publishes them to the tensor cores.
        // The `TMA` instances (plain scores: no softcap or sink, which can leave such a row a
        // finite LSE) scan only a block with a row whose LSE is not finite: their statistics
        // land on the stage's barrier too, so every warp sees the block's rows (two a lane per 64).
        let scan = if TMA {
            let mut finite = true;
            for part in 0..br / 64 {
                // SAFETY: the stage's statistics have landed (its barrier).
                let lse = unsafe { load_shared_f32x2(stats(smem, st) + 256 * part + 8 * lane) };
                finite &= lse[0].is_finite() && lse[1].is_finite();
            }
            ballot(!finite) != 0
        } else {
            true
        };
        if scan {
            // SAFETY: the thread's own copies of the stage's Q have landed (`wait_all`, or the
            // stage's barrier).
            unsafe { sanitize_own_chunks::<T, _>(&q_tile(smem, st), br, tid, threads) };
        }
        wgmma::fence_proxy_async();
        sync_threads();
        if i + 1 < iters && !bulk {
            fill(i + 1, stage_of(i + 1));
        }
        let base = opaque(smem);
        // SLICED: `Pᵀ` in the first `dSᵀ` buffer, `dSᵀ` in the second.
        let (kt, vt, qt, dot, dst) = (
            k_tile(base),
            v_tile(base),
            q_tile(base, st),
            do_tile(base, st),
            ds_tile(base, if SLICED { 1 } else { i & 1 }),
        );
        let pt_tile = ds_tile(base, 0);

        let mut s_t = [FragC::default(); NS];
        let mut dp_t = [FragC::default(); NS];
        wgmma::fence();
        let (k_a, q_b) = (kt.k_major(group_key, 0), qt.k_major(q_col0, 0));
        for kk in 0..KD as u32 {
            let (a, b) = (
                stepped(k_a, kt.k_step_offset(kk), hoist),
                stepped(q_b, qt.k_step_offset(kk), hoist),
            );
            // SAFETY: the group's keys of K and V, and the stage's Q and dO, are filled.
            unsafe { s_t.mma_ss::<T>(a, b, kk > 0) };
        }
        wgmma::commit();
        let (v_a, do_b) = (vt.k_major(group_key, 0), dot.k_major(q_col0, 0));
        for kk in 0..KD as u32 {
            let (a, b) = (
                stepped(v_a, vt.k_step_offset(kk), hoist),
                stepped(do_b, dot.k_step_offset(kk), hoist),
            );
            // SAFETY: as above.
            unsafe { dp_t.mma_ss::<T>(a, b, kk > 0) };
        }
        wgmma::commit();
        // Sᵀ is done, and so is everything issued before it: the previous dQ.
        wgmma::wait::<1>();
        s_t.pin();
        if CARRY_DQ && i > 0 {
            dq.pin();
            reduce_dq(&dq, dq_at, dq_col0);
        }

        // Pᵀ into `s_t`. Keys past n_k (zero rows of K) and causally hidden pairs are masked; rows
        // past n_q and rows with no allowed key have LSE·log2 e = +∞, so P = 0 there already,
        // except past the end of a packed sequence (the next sequence's rows), masked too.
        // Softcap and ALiBi of head h (general instances only).
        let score_mod = if MODS {
            // SAFETY: the head's slope exists when ALiBi is on (validated by the host).
            unsafe { p.mods.for_head(h) }
        } else {
            ScoreMod::default()
        };
        let modified = score_mod.softcap != 0.0 || score_mod.slope != 0.0;
        // ALiBi's distance `|row + n_k − n_q − key|` of element e of fragment j.
        // In i32, which holds every row and key (below 2^31, the host's validation).
        let distance = |j: usize, e: usize| {
            let row = (q0 + q_col0 + 8 * j as u32 + 2 * t + (e % 2) as u32) as i32;
            let key = if e < 2 { key_lo } else { key_hi } as i32;
            (row + (n_k as i32 - n_q as i32) - key).unsigned_abs() as f32
        };
        each_fragment!(s_t, |j, f| {
            let col = q_col0 + 8 * j as u32 + 2 * t;
            // SAFETY: columns col, col + 1 are inside the stage's statistics.
            let lse = unsafe { load_shared_f32x2(stats(base, st) + col * 4) };
            for e in 0..4 {
                let x = f.0[e];
                let score = if modified {
                    score_mod.apply_log2(x, p.scale_log2, distance(j, e))
                } else {
                    x * p.scale_log2
                };
                f.0[e] = exp2(score - lse[e % 2]);
            }
        });
        // Most blocks of a long sequence hide no pair: the mask is a second pass over the few
        // that do, not a test per score everywhere.
        let past_end = GENERAL && q0 + br > n_q;
        let skip = past_end || masked || k_poisoned;
        if past_end || masked {
            each_fragment!(s_t, |j, f| {
                // Tall: each column recomputed here (`opaque`); hoisted out of the loop, the 16
                // fragments' columns held 16 registers across it and spilled.
                let lane_col = if tall { opaque(2 * t) } else { 2 * t };
                let col = q_col0 + 8 * j as u32 + lane_col;
                for e in 0..4 {
                    // A select, not a branch, so the loop unrolls and stays in registers.
                    let key = if e < 2 { key_lo } else { key_hi };
                    let row = q0 + col + (e % 2) as u32;
                    // MASKED (−0, which 2^x never is): dS below is 0 there, whatever dPᵀ.
                    let hidden = if windowed {
                        let (first, end) = keys_of(row);
                        row >= n_q || key < first || key >= end
                    } else {
                        row >= n_q || hidden(row, key, n_q, n_k, causal)
                    };
                    f.0[e] = if hidden { MASKED } else { f.0[e] };
                }
            });
        }
        if k_poisoned {
            for f in s_t.iter_mut() {
                for e in 0..4 {
                    let poisoned = (k_poison >> (e / 2)) & 1 != 0;
                    f.0[e] = if poisoned { MASKED } else { f.0[e] };
                }
            }
        }
        // Dropout: bit 4j + e of `keep` for element e of fragment j.
        let dropping = GENERAL && p.dropout.enabled();
        let keep = if dropping {
            transposed_keep_bits::<NS>(&p.dropout, (seq.index, h), q0 + q_col0, t, [key_lo, key_hi])
        } else {
            0
        };
        let z = |j: usize, e: usize| {
            if !dropping {
                1.0
            } else if (keep >> (4 * j + e)) & 1 != 0 {
                p.dropout.keep_scale
            } else {
                0.0
            }
        };
        // The A operands of the group's queries, 16 at a time.
        let mut pt_a = [FragA::default(); NA];
        for k in 0..NS / 2 {
            if dropping {
                let (mut l, mut r) = (s_t[2 * k], s_t[2 * k + 1]);
                for e in 0..4 {
                    l.0[e] *= z(2 * k, e);
                    r.0[e] *= z(2 * k + 1, e);
                }
                pt_a[k] = T::pack_a(&l, &r);
            } else {
                pt_a[k] = T::pack_a(&s_t[2 * k], &s_t[2 * k + 1]);
            }
        }
        // Registers (g, 16k + 2t), (g + 8, ..), (g, 16k + 8 + 2t), (g + 8, ..) of the A operand
        // `a[k]` to chunks 2k and 2k + 1 (of the group's queries) of rows key_row + g and
        // key_row + g + 8 of `tile`.
        let store_operand = |tile: PanelTile, a: &[FragA; NA]| {
            for (k, a) in a.iter().enumerate() {
                let c = q_col0 / 8 + 2 * k as u32;
                // SAFETY: the warp's own key rows of the tile, the group's own query chunks.
                unsafe {
                    store_shared_u32(tile.chunk_addr(key_row + g, c) + 4 * t, a.0[0]);
                    store_shared_u32(tile.chunk_addr(key_row + g + 8, c) + 4 * t, a.0[1]);
                    store_shared_u32(tile.chunk_addr(key_row + g, c + 1) + 4 * t, a.0[2]);
                    store_shared_u32(tile.chunk_addr(key_row + g + 8, c + 1) + 4 * t, a.0[3]);
                }
            }
        };
        // dV from `Pᵀ` in registers; SLICED, where each group holds half the block's queries,
        // through the `Pᵀ` tile (the first `dSᵀ` buffer, which SLICED, not carrying dQ, leaves
        // free), which both groups' products read after the barrier below.
        let do_b = dot.mn_major(0, col0);
        if SLICED {
            store_operand(pt_tile, &pt_a);
            wgmma::wait::<0>();
        } else {
            // SAFETY: the stage's dO is filled.
            unsafe { accumulate_rs::<T, ND, NA>(&mut dv, &pt_a, do_b, hoist) };
            wgmma::wait::<1>();
        }
        dp_t.pin();

        // dSᵀ = Pᵀ ∘ (dPᵀ∘Z − D) into `dp_t`, then to the dSᵀ tile for dQ.
        each_fragment!(dp_t, s_t, |j, f, pf| {
            let col = q_col0 + 8 * j as u32 + 2 * t;
            // SAFETY: columns col, col + 1 are inside the stage's statistics.
            let d_row = unsafe { load_shared_f32x2(stats(base, st) + br * 4 + col * 4) };
            // The softcap's `1 − tanh²`, recovered from P (`ScoreMod::grad_from_p`).
            let lse = if score_mod.softcap != 0.0 {
                // SAFETY: columns col, col + 1 are inside the stage's statistics.
                unsafe { load_shared_f32x2(stats(base, st) + col * 4) }
            } else {
                [0.0; 2]
            };
            for e in 0..4 {
                let grad = score_mod.grad_from_p(pf.0[e], lse[e % 2], distance(j, e));
                // A masked Pᵀ gives dS = 0 even where dPᵀ (a masked V) or D (a NaN row) is not
                // finite.
                let ds = pf.0[e] * (f.0[e] * z(j, e) - d_row[e % 2]) * grad;
                f.0[e] = if skip && is_masked(pf.0[e]) { 0.0 } else { ds };
            }
        });
        let mut ds_a = [FragA::default(); NA];
        for k in 0..NS / 2 {
            ds_a[k] = T::pack_a(&dp_t[2 * k], &dp_t[2 * k + 1]);
        }
        store_operand(dst, &ds_a);
        wgmma::fence_proxy_async();
        if bulk && leader {
            // The next stage held step i − 1's dQ until the bulk unit read it: each group's
            // sender waits for its reads before the barrier below, after which thread 0
            // refills the stage.
            tma::wait_bulk_reads();
        }
        let q_b = qt.mn_major(0, col0);
        if CARRY_DQ {
            // dK runs under the barrier's wait; the other instances issue it (and, SLICED, dV)
            // after dQ below.
            // SAFETY: the stage's Q is filled.
            unsafe { accumulate_rs::<T, ND, NA>(&mut dk, &ds_a, q_b, hoist) };
        }
        // dQ reads every warpgroup's `dSᵀ` rows (SLICED: dV and dK read every group's queries of
        // the `Pᵀ` and `dSᵀ` tiles).
        sync_threads();
        if bulk && i + 1 < iters {
            fill(i + 1, stage_of(i + 1));
        }

        let issue_dq = |dq: &mut [FragC; DQ], dq_col0: u32| {
            wgmma::fence();
            let (ds_a, k_b) = (dst.mn_major(0, dq_row0), kt.mn_major(0, dq_col0));
            for kk in 0..(bc / 16) {
                let step = PanelTile::mn_step_offset(16 * kk);
                let (a, b) = (stepped(ds_a, step, hoist), stepped(k_b, step, hoist));
                // SAFETY: keys 16kk .. 16kk + 16 of the dSᵀ and K tiles are written.
                unsafe { dq.mma_ss_trans::<T>(a, b, kk > 0) };
            }
            wgmma::commit();
        };
        // `bulk`: box `bx` (32 f32 columns, one panel) of the chain staged in `tile` by the
        // group whose slice starts at column `slice`; the staging and the sends both use it.
        let dq_box = |tile: GappedTile, slice: u32, bx: u32| tile.chunk_addr(0, slice / 8 + 8 * bx);
        // A chain's 64 columns (`bulk`) into the group's two panels of `tile` as two row-major
        // f32 boxes of 32 columns: 128 bytes a row, in the panels' own 128-byte swizzle, which
        // the dQ map's boxes share. Each lane's two columns of rows g and g + 8 per fragment.
        let stage_dq = |dq: &[FragC; DQ], tile: GappedTile| {
            let row = 16 * warp + g;
            for (j, f) in dq.iter().enumerate() {
                let j = j as u32;
                // Fragment j's columns 8j + 2t, + 1 lie in the chain's box j / 4.
                let panel = dq_box(tile, dq_col0, j / 4);
                let col = 8 * (j % 4) + 2 * t;
                let [lo0, lo1, hi0, hi1] = f.0;
                // SAFETY: rows row, row + 8 of the group's own panels, which no product reads
                // any more in this step (the caller waited for dV or dK); 8-byte aligned (col
                // is even).
                unsafe {
                    store_shared_f32x2(panel + f32_box_offset(row, col), [lo0, lo1]);
                    store_shared_f32x2(panel + f32_box_offset(row + 8, col), [hi0, hi1]);
                }
            }
        };
        // Once the group's four warps have staged chain `part` in `tile`, its sender adds the
        // chain's two boxes into the accumulator; the other group's staging is not waited for.
        let send_dq = |part: u32, tile: GappedTile| {
            wgmma::fence_proxy_async();
            named_sync(1 + group, 128);
            if leader {
                let dq_map = maps + TMA_BACKWARD_DQ_MAP as u64;
                let at = |col: u32| [col as i32, h as i32, q0 as i32, seq.batch as i32];
                for bx in 0..2 {
                    let col = dq_col0 + 8 * DQ as u32 * part + 32 * bx;
                    // SAFETY: the box is a whole 1024-byte aligned panel of the group's, written
                    // by its warps and published (fence and barrier above); the stage is
                    // refilled only after `wait_bulk_reads`. Rows past n_q are outside the map
                    // and not written.
                    unsafe { tma::reduce_add_4d(dq_box(tile, dq_col0, bx), dq_map, at(col)) };
                }
                tma::commit_bulk();
            }
        };
        if CARRY_DQ {
            issue_dq(&mut dq, dq_col0);
            dq_at = (h, q0);
        } else if bulk {
            // dV, dQ's first chain, dK, then its second chain: once dV is done the group's dO
            // panels take the first chain, once dK is its Q panels the second (one chain's
            // registers live at a time, as in the reduced path).
            // SAFETY: both groups' queries of the `Pᵀ` and `dSᵀ` tiles are written (the barrier
            // above); the stage's dO and Q are filled.
            unsafe { accumulate_ss::<T, ND>(&mut dv, pt_tile, do_b, hoist) };
            let mut dq_now = [FragC::default(); DQ];
            issue_dq(&mut dq_now, dq_col0);
            // SAFETY: as above.
            unsafe { accumulate_ss::<T, ND>(&mut dk, dst, q_b, hoist) };
            wgmma::wait::<1>();
            dq_now.pin();
            stage_dq(&dq_now, dot);
            send_dq(0, dot);
            let mut dq_now = [FragC::default(); DQ];
            issue_dq(&mut dq_now, dq_col0 + 8 * DQ as u32);
            wgmma::wait::<0>();
            dq_now.pin();
            stage_dq(&dq_now, qt);
            send_dq(1, qt);
        } else {
            let semaphore = |h: u32| {
                p.dq_semaphores + 4 * dq_semaphore(seq.batch * s.heads_q + h, q0 / br, p.n_q_pad)
            };
            // One chain of `DQ` fragments at a time: all of the group's columns, or (SLICED)
            // its slice in one or two chains.
            let dq_cols = 8 * DQ as u32;
            let parts = if SLICED { ND / DQ } else { 1 } as u32;
            for part in 0..parts {
                let col = dq_col0 + part * dq_cols;
                let mut dq_now = [FragC::default(); DQ];
                issue_dq(&mut dq_now, col);
                if SLICED {
                    // dV after the first chain, dK after the last: each chain's reductions run
                    // while the products issued after it do.
                    // SAFETY: both groups' queries of the `Pᵀ` and `dSᵀ` tiles are written
                    // (the barrier above); the stage's dO and Q are filled.
                    unsafe {
                        if part == 0 {
                            accumulate_ss::<T, ND>(&mut dv, pt_tile, do_b, hoist);
                        }
                        if part + 1 == parts {
                            accumulate_ss::<T, ND>(&mut dk, dst, q_b, hoist);
                        }
                    }
                    if parts == 1 {
                        wgmma::wait::<2>();
                    } else {
                        wgmma::wait::<1>();
                    }
                } else {
                    // dK after dQ, so that dQ's reductions run under it.
                    // SAFETY: the stage's Q is filled.
                    unsafe { accumulate_rs::<T, ND, NA>(&mut dk, &ds_a, q_b, hoist) };
                    wgmma::wait::<1>();
                }
                dq_now.pin();
                if DETERMINISTIC && part == 0 {
                    if tid == 0 {
                        // Blocks start in grid order and the waited-for blocks have lower x
                        // (same y and z): each is resident or done, so the wait ends.
                        // SAFETY: the semaphore of (batch, h, Q block) exists; the preprocess
                        // zeroed it.
                        unsafe { wait_equal_acquire(semaphore(h), dq_adds_before(kv_block)) };
                    }
                    sync_threads();
                }
                reduce_dq(&dq_now, (h, q0), col);
            }
            // dK is done before the step ends: sliced, it reads the `dSᵀ` tile, which the next
            // step's barrier hands back to both groups; left running into the next step, its
            // accumulators made ptxas serialize every product (C7515).
            wgmma::wait::<0>();
            if DETERMINISTIC {
                // Every thread's adds precede the barrier; the release publishes them.
                sync_threads();
                if tid == 0 {
                    // SAFETY: as for the wait above.
                    unsafe { release_store(semaphore(h), dq_adds_before(kv_block) + 1) };
                }
            }
        }
        i += 1;
    }

    wgmma::wait::<0>();
    dq.pin();
    dk.pin();
    dv.pin();
    if bulk && leader {
        // The last steps' stages are read before the block's shared memory goes.
        tma::wait_bulk_reads();
    }
    if CARRY_DQ && iters > 0 {
        reduce_dq(&dq, dq_at, dq_col0);
    }

    // Stage dK (× τ) and dV row-major through the K and V tiles once every warpgroup is done
    // reading them and their copies have landed (when no iteration ran).
    wait_all();
    sync_threads();
    let (k_out, v_out) = (
        SwizzledTile::new(smem, d),
        SwizzledTile::new(smem + kv_bytes, d),
    );
    for (tile, acc, scale) in [(k_out, &dk, p.scale), (v_out, &dv, 1.0)] {
        // SAFETY: the warp's 16 key rows and the group's chunks are inside the tile.
        unsafe { stage_fragments_at::<T, ND>(tile, (key_row, col0 / 8), acc, scale, lane) };
    }
    sync_threads();
    // The real head dims' chunks only (the tiles may hold padding columns past them).
    for (tile, dst, strides, chunks) in [
        (k_out, p.dk, &ts.dk, real_chunks),
        (v_out, p.dv, &ts.dv, v_chunks()),
    ] {
        // SAFETY: the chunks are inside the tile (chunks ≤ its chunks); the global rows below
        // the sequence's key rows are its dK or dV rows.
        unsafe {
            store_staged_rows(
                tile,
                (bc, chunks),
                (kv_at(dst, strides), 2 * strides.seq),
                (k0, seq.k_rows),
                (tid, threads),
            )
        };
    }
}

/// One entry point per (dtype, configuration), named `flash_wgmma_backward_<dtype>_d<d>_g<groups>`
/// as the host formats it, `flash_wgmma_backward_general_…` (lengths and dropout),
/// `flash_wgmma_backward_window_…` (the window alone), `flash_wgmma_backward_mods_…` (all of
/// those and the score modifiers), and
/// `flash_wgmma_backward_det_…` with bitwise reproducible dQ (scale and causal only).
/// `cp_async` lines take [`TensorCoreBackwardParams`], `tma` ones [`TmaBackwardParams`], whose
/// tensor maps the kernel reads in parameter space (as the forward's).
macro_rules! entry_points {
    (@params cp_async) => {
        TensorCoreBackwardParams
    };
    (@params tma) => {
        TmaBackwardParams
    };
    (@tma cp_async) => {
        false
    };
    (@tma tma) => {
        true
    };
    (@run cp_async $name:ident $p:ident) => {
        (&$p, 0)
    };
    (@run tma $name:ident $p:ident) => {
        (&$p.base, crate::tile::tma::param_maps!($name))
    };
    ($($kind:ident $name:ident => $t:ty, $cfg:expr, $general:literal, $window:literal, $mods:literal, $det:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: entry_points!(@params $kind)) {
            let (params, maps) = entry_points!(@run $kind $name p);
            // SAFETY: the host validated the buffers against `p`, ran the preprocess kernel on the
            // workspace, and launched the configuration's grid, block and shared memory (and
            // encoded the tensor maps of a `tma` entry).
            unsafe {
                backward::<
                    $t,
                    { $cfg.head_dim as usize / 16 },
                    { $cfg.slice_cols() as usize / 8 },
                    { $cfg.score_queries() as usize / 8 },
                    { $cfg.score_queries() as usize / 16 },
                    { $cfg.warpgroups as usize },
                    { $cfg.dq_cols() as usize / 8 },
                    { $cfg.carry_dq() && !$det },
                    $general,
                    $window,
                    $mods,
                    $det,
                    { $cfg.sliced() },
                    { entry_points!(@tma $kind) },
                >(params, maps)
            }
        }
    )*};
}

entry_points! {
    tma flash_wgmma_backward_bf16_d64_g2 => Bf16, BACKWARD_D64, false, false, false, false;
    tma flash_wgmma_backward_f16_d64_g2 => F16, BACKWARD_D64, false, false, false, false;
    tma flash_wgmma_backward_bf16_d128_g2 => Bf16, BACKWARD_D128, false, false, false, false;
    tma flash_wgmma_backward_f16_d128_g2 => F16, BACKWARD_D128, false, false, false, false;
    cp_async flash_wgmma_backward_general_bf16_d64_g2 => Bf16, BACKWARD_D64, true, false, false, false;
    cp_async flash_wgmma_backward_general_f16_d64_g2 => F16, BACKWARD_D64, true, false, false, false;
    cp_async flash_wgmma_backward_general_bf16_d128_g2 => Bf16, BACKWARD_D128, true, false, false, false;
    cp_async flash_wgmma_backward_general_f16_d128_g2 => F16, BACKWARD_D128, true, false, false, false;
    cp_async flash_wgmma_backward_mods_bf16_d64_g2 => Bf16, BACKWARD_D64, true, true, true, false;
    tma flash_wgmma_backward_window_bf16_d64_g2 => Bf16, BACKWARD_D64, false, true, false, false;
    cp_async flash_wgmma_backward_mods_f16_d64_g2 => F16, BACKWARD_D64, true, true, true, false;
    tma flash_wgmma_backward_window_f16_d64_g2 => F16, BACKWARD_D64, false, true, false, false;
    tma flash_wgmma_backward_window_bf16_d128_g2 => Bf16, BACKWARD_D128, false, true, false, false;
    cp_async flash_wgmma_backward_mods_bf16_d128_g2_sliced => Bf16, backward_mods_config(&BACKWARD_D128), true, true, true, false;
    cp_async flash_wgmma_backward_mods_f16_d128_g2_sliced => F16, backward_mods_config(&BACKWARD_D128), true, true, true, false;
    tma flash_wgmma_backward_window_f16_d128_g2 => F16, BACKWARD_D128, false, true, false, false;
    tma flash_wgmma_backward_det_bf16_d64_g2 => Bf16, BACKWARD_D64, false, false, false, true;
    tma flash_wgmma_backward_det_f16_d64_g2 => F16, BACKWARD_D64, false, false, false, true;
    tma flash_wgmma_backward_det_bf16_d128_g2 => Bf16, BACKWARD_D128, false, false, false, true;
    tma flash_wgmma_backward_det_f16_d128_g2 => F16, BACKWARD_D128, false, false, false, true;
    tma flash_wgmma_backward_bf16_d64_g2_tall => Bf16, BACKWARD_D64_TALL, false, false, false, false;
    tma flash_wgmma_backward_f16_d64_g2_tall => F16, BACKWARD_D64_TALL, false, false, false, false;
    tma flash_wgmma_backward_bf16_d32_g2 => Bf16, BACKWARD_D32, false, false, false, false;
    tma flash_wgmma_backward_f16_d32_g2 => F16, BACKWARD_D32, false, false, false, false;
    tma flash_wgmma_backward_bf16_d80_g2 => Bf16, BACKWARD_D80, false, false, false, false;
    tma flash_wgmma_backward_f16_d80_g2 => F16, BACKWARD_D80, false, false, false, false;
    tma flash_wgmma_backward_bf16_d96_g2 => Bf16, BACKWARD_D96, false, false, false, false;
    tma flash_wgmma_backward_f16_d96_g2 => F16, BACKWARD_D96, false, false, false, false;
    tma flash_wgmma_backward_bf16_d160_g2 => Bf16, BACKWARD_D160, false, false, false, false;
    tma flash_wgmma_backward_f16_d160_g2 => F16, BACKWARD_D160, false, false, false, false;
    tma flash_wgmma_backward_bf16_d192_g2 => Bf16, BACKWARD_D192, false, false, false, false;
    tma flash_wgmma_backward_f16_d192_g2 => F16, BACKWARD_D192, false, false, false, false;
    cp_async flash_wgmma_backward_general_bf16_d192_g2 => Bf16, BACKWARD_D192, true, false, false, false;
    cp_async flash_wgmma_backward_general_f16_d192_g2 => F16, BACKWARD_D192, true, false, false, false;
    cp_async flash_wgmma_backward_mods_bf16_d192_g2 => Bf16, BACKWARD_D192, true, true, true, false;
    cp_async flash_wgmma_backward_mods_f16_d192_g2 => F16, BACKWARD_D192, true, true, true, false;
    tma flash_wgmma_backward_window_bf16_d192_g2 => Bf16, BACKWARD_D192, false, true, false, false;
    tma flash_wgmma_backward_window_f16_d192_g2 => F16, BACKWARD_D192, false, true, false, false;
    tma flash_wgmma_backward_det_bf16_d192_g2 => Bf16, BACKWARD_D192, false, false, false, true;
    tma flash_wgmma_backward_det_f16_d192_g2 => F16, BACKWARD_D192, false, false, false, true;
    tma flash_wgmma_backward_bf16_d256_g2 => Bf16, BACKWARD_D256, false, false, false, false;
    tma flash_wgmma_backward_f16_d256_g2 => F16, BACKWARD_D256, false, false, false, false;
    cp_async flash_wgmma_backward_general_bf16_d256_g2 => Bf16, BACKWARD_D256, true, false, false, false;
    cp_async flash_wgmma_backward_general_f16_d256_g2 => F16, BACKWARD_D256, true, false, false, false;
    cp_async flash_wgmma_backward_mods_bf16_d256_g2 => Bf16, BACKWARD_D256, true, true, true, false;
    cp_async flash_wgmma_backward_mods_f16_d256_g2 => F16, BACKWARD_D256, true, true, true, false;
    tma flash_wgmma_backward_window_bf16_d256_g2 => Bf16, BACKWARD_D256, false, true, false, false;
    tma flash_wgmma_backward_window_f16_d256_g2 => F16, BACKWARD_D256, false, true, false, false;
    tma flash_wgmma_backward_det_bf16_d256_g2 => Bf16, BACKWARD_D256, false, false, false, true;
    tma flash_wgmma_backward_det_f16_d256_g2 => F16, BACKWARD_D256, false, false, false, true;
}
