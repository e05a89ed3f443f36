//! The tensor-core forward, FlashAttention-2 schedule.
//!
//! A thread block owns `16 · WARPS` query rows of one (batch, head); each warp owns 16 of them and
//! keeps their Q fragments in registers for the whole kernel (up to d = 128; past it they are
//! read from the shared Q tile at every k-step, whose registers O needs). K/V blocks of `8 · NK` keys stream
//! through two shared stages: `cp.async` fills block `j + 1` while block `j` is computed, with one
//! barrier per block. `S = Q·Kᵀ` and `O += P·V` both run on `mma.sync`; P never leaves registers
//! (see `tile::mma`). Generic over `KD = d / 16` (k-steps of QKᵀ), `ND = d / 8` (n-tiles of O),
//! `NK` (n-tiles of S) and `NP = NK / 2` (k-steps of PV), so every register array has a
//! compile-time size and every loop over one unrolls.
//!
//! The `GENERAL` instances take key lengths, packed sequences and dropout, as the `wgmma`
//! forward's do: the sequence is located from the layout (`grid.z` is the sequence,
//! `attn::sequence`), and P is multiplied by the exact kernels' Philox draws after ℓ has summed
//! the undropped P (`attn::dropout`). The `MODS` instances add the local window (blocks outside
//! every row's window are skipped), softcap, ALiBi and sink logits (`attn::row_keys`,
//! `attn::score_mod`). Instances without `GENERAL` serve full-length batches without dropout with
//! the sequence taken from the kernel parameters. The two flags are independent (four instance
//! sets), so that no call pays registers for an option it does not use.

use crate::abi::params::TensorCoreForwardParams;
use crate::abi::storage::{Bf16, F16};
use crate::arch::{
    block_x, grid_dim_x, opaque, shared_window, sync_threads_or, sync_warp, thread_x,
};
use crate::attn::dropout::{apply_dropout, dropout_multiplier};
use crate::attn::grid::head_and_sequence;
use crate::attn::mask::{Exponent, Operand, non_finite_part, sanitize_own_chunks, scored_out};
use crate::attn::row_keys::RowKeys;
use crate::attn::score_mod::{ScoreMod, Window, distance};
use crate::attn::sequence::Sequence;
use crate::attn::softmax::{RowState, pack, rescale};
use crate::kernels::sm80::forward::TcConfig;
use crate::tile::SwizzledTile;
use crate::tile::cp_async::{ChunkedTile, GlobalRows, wait_all};
use crate::tile::mem::{load_shared_16, stage_fragments, store_global_16};
use crate::tile::mma::{FragA, FragC, MmaElem};

/// Whether `row` (below `n_q` of `lens = (n_q, n_k)`, or past it: then true) scores `key`
/// other than `−∞` after the score modifiers (`mask::scored_out`): whether the key is in the
/// row's support.
///
/// # Safety
/// A row below `n_q` is a row of `q`, `key` a row of `k`.
#[inline(always)]
unsafe fn in_support<T: Exponent>(
    (score_mod, scale_log2): (ScoreMod<f32>, f32),
    (row, key): (u32, u32),
    (n_q, n_k): (u32, u32),
    (q, k): (Operand, Operand),
    head_dim: u32,
) -> bool {
    let score = |raw| score_mod.apply_log2(raw, scale_log2, distance(row, key, n_q, n_k));
    // SAFETY: forwarded to the caller.
    row >= n_q || !unsafe { scored_out::<T>(q, k, (row, key), head_dim, score) }
}

#[inline(always)]
unsafe fn forward<
    T: MmaElem + Exponent,
    const KD: usize,
    const ND: usize,
    const NK: usize,
    const NP: usize,
    const WARPS: usize,
    const GENERAL: bool,
    const MODS: bool,
>(
    p: &TensorCoreForwardParams,
) {
    const { assert!(ND == 2 * KD && NK == 2 * NP && NP > 0 && KD >= 4 && WARPS > 0) };
    // Up to d = 128 each warp keeps its Q fragments in registers for the whole kernel; past it
    // (d/4 registers a thread: 48 at d = 192, 64 at 256, beside O's d/2) it reloads each k-step's
    // fragment from the Q tile, which holds Q until the loop ends, as the scores need it.
    let q_in_registers = KD <= 8;
    let (d, bc, br) = (16 * KD as u32, 8 * NK as u32, 16 * WARPS as u32);
    let threads = 32 * WARPS as u32;
    let s = p.shape;
    let (tid, warp, lane) = (thread_x(), thread_x() / 32, thread_x() % 32);
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
    if GENERAL && q0 >= seq.q_len {
        // The grid covers the longest sequence; this one is shorter. The whole block leaves.
        return;
    }

    // Rows in memory hold the real head dims (`head_dim` for Q and K, `head_dim_v` for V and
    // O); the tiles hold `d`, zeros past them.
    let (st, real_chunks, v_chunks) = (&p.strides, s.head_dim / 8, s.head_dim_v / 8);
    let hk = s.kv_head(h);
    // Byte address of (the sequence's row 0, head h) in O.
    // O's own offset is taken after the loop (held across it, it costs a register pair).
    let o_dst_of = |seq: &Sequence| p.o + 2 * seq.q_row(&st.o, 0, h);
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
    let q_tile = SwizzledTile::new(smem, d);
    let kv_bytes = bc * d * 2;
    let kv_base = smem + br * d * 2;
    let k_tile = |stage: u32| SwizzledTile::new(kv_base + stage * 2 * kv_bytes, d);
    let v_tile = |stage: u32| SwizzledTile::new(kv_base + stage * 2 * kv_bytes + kv_bytes, d);
    let fill_kv = |block: u32, stage: u32| {
        // SAFETY: each stage holds `bc` rows; rows below n_k are inside K and V.
        unsafe {
            k_tile(stage).fill_async(k_rows, block * bc, bc, tid, threads);
            v_tile(stage).fill_async(v_rows, block * bc, bc, tid, threads);
        }
    };

    // The window and the score modifiers: `MODS` instances only (the host routes every call
    // that has one there), so the others compile without them.
    let window = if MODS { p.mods.window } else { Window::NONE };
    let windowed = !window.is_none();
    let last_row = (q0 + br).min(seq.q_len) - 1;
    // Blocks before the first row's window start and past the last row's end are skipped.
    let first_block = seq.key_range(q0, causal, window).0 / bc;
    let n_blocks = seq.key_range(last_row, causal, window).1.div_ceil(bc);
    let warp_row = 16 * warp;
    let (row_lo, row_hi) = (q0 + warp_row + lane / 4, q0 + warp_row + lane / 4 + 8);
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

    // SAFETY: the Q tile holds `br` rows; rows below n_q are inside Q.
    unsafe { q_tile.fill_async(q_rows, q0, br, tid, threads) };
    if n_blocks > first_block {
        fill_kv(first_block, first_block & 1);
    }
    // A causal diagonal block (or a window's edge) hides some of its keys from some rows: a
    // non-finite V there would reach them as 0 · NaN through P·V. Its V is sanitized as it lands
    // (each thread its own chunks, before the barrier that publishes them; the barrier votes
    // whether any was non-finite), and the allowed keys' non-finite part is added after the
    // loop. Keys past the sequence's length load as zeros and need nothing.
    let diagonal =
        |block: u32| (causal || windowed) && block < n_blocks && keys.partial(block * bc, bc);
    let sanitize_v = |block: u32, stage: u32| {
        // SAFETY: the thread's own copies of the stage's V have landed (`wait_all` before).
        diagonal(block) && unsafe { sanitize_own_chunks::<T, _>(&v_tile(stage), bc, tid, threads) }
    };
    wait_all();
    let mut poisoned = sync_threads_or(sanitize_v(first_block, first_block & 1));
    // SAFETY (both): the warp's 16 rows are inside the Q tile, which holds Q until the loop ends.
    let q_fragment = |kk: usize| unsafe { q_tile.load_a(warp_row, kk as u32, lane) };
    let mut q_frag = [FragA::default(); KD];
    if q_in_registers {
        for (kk, f) in q_frag.iter_mut().enumerate() {
            *f = q_fragment(kk);
        }
    }

    let mut o = [FragC::default(); ND];
    let mut state = RowState::new();
    let mut block = first_block;
    while block < n_blocks {
        if block > first_block {
            // This block has landed, and every warp is done with the previous one, whose stage
            // the next fill overwrites.
            wait_all();
            poisoned |= sync_threads_or(sanitize_v(block, block & 1));
        }
        let stage = block & 1;
        if block + 1 < n_blocks {
            fill_kv(block + 1, stage ^ 1);
        }

        let k0 = block * bc;
        let mut sc = [FragC::default(); NK];
        for (kk, held) in q_frag.iter().enumerate() {
            let qf = &if q_in_registers {
                *held
            } else {
                q_fragment(kk)
            };
            for np in 0..NP {
                // SAFETY: keys 16 np .. 16 np + 16 are inside the K tile.
                let [b0, b1] =
                    unsafe { k_tile(stage).load_b_pair(16 * np as u32, kk as u32, lane) };
                T::mma(&mut sc[2 * np], qf, &b0);
                T::mma(&mut sc[2 * np + 1], qf, &b1);
            }
        }
        keys.prepare(&mut sc, (p.scale_log2, true), k0, lane % 4);
        let alpha = state.fold(&mut sc, 1.0);
        rescale(&mut o, alpha);
        if GENERAL && p.dropout.enabled() {
            let rows = [row_lo, row_hi];
            apply_dropout(&mut sc, &p.dropout, (seq.index, h), rows, k0, lane % 4);
        }
        let pf: [FragA; NP] = pack::<T, NK, NP>(&sc);

        for (kk, pa) in pf.iter().enumerate() {
            for dp in 0..KD {
                // SAFETY: keys 16 kk .. 16 kk + 16 and chunks 2 dp, 2 dp + 1 are inside the V tile.
                let [b0, b1] =
                    unsafe { v_tile(stage).load_b_pair_trans(16 * kk as u32, 2 * dp as u32, lane) };
                T::mma(&mut o[2 * dp], pa, &b0);
                T::mma(&mut o[2 * dp + 1], pa, &b1);
            }
        }
        block += 1;
    }

    // SAFETY: the head's sink exists when sinks are on (validated by the host).
    let sink = if MODS {
        unsafe { p.mods.sink(h) }
    } else {
        None
    };
    let lse = state.finish(&mut o, sink);
    if poisoned {
        let v = Operand {
            base: v_rows.base,
            stride: v_rows.stride,
            tiles: v_chunks,
        };
        // Every visited block with a window: blocks the product already took non-finite values
        // from add them again, which changes nothing.
        let rows = [row_lo, row_hi];
        let from = if windowed {
            first_block * bc
        } else {
            keys.unmasked_end / bc * bc
        };
        let dropping = p.dropout.enabled();
        let key = p.dropout.key();
        let dropped = |r: usize, col: u32| {
            dropping && dropout_multiplier(&p.dropout, key, seq.index, h, rows[r], col) == 0.0
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
        let span = (from, n_blocks * bc);
        // SAFETY (all): a row below the sequence's length is a row of Q, an allowed key a row of
        // K and of V. The others pass the shape's lengths themselves (copies would take stack in
        // the closure's environment) and drop nothing.
        let poison = if GENERAL {
            let lens = (seq.q_len, seq.k_len);
            let in_support = |r: usize, key: u32| unsafe {
                let scores = (score_mod, p.scale_log2);
                in_support::<T>(scores, (rows[r], key), lens, (q_op, k_op), s.head_dim)
            };
            unsafe { non_finite_part::<T, ND>(span, starts, ends, v, lane, dropped, in_support) }
        } else {
            let in_support = |r: usize, key: u32| unsafe {
                in_support::<T>(
                    (score_mod, p.scale_log2),
                    (rows[r], key),
                    (s.n_q, s.n_k),
                    (q_op, k_op),
                    s.head_dim,
                )
            };
            let kept = |_, _| false;
            unsafe { non_finite_part::<T, ND>(span, starts, ends, v, lane, kept, in_support) }
        };
        poison.apply(&mut o);
    }
    // Stage O through the warp's own Q rows (only this warp ever read them) so that the global
    // stores are 16 bytes wide and coalesced. The warp barrier orders the lanes' `ldmatrix` reads
    // of those rows before the other lanes' stores: with fewer than two K/V blocks no block-wide
    // barrier lies between them, and racecheck reports the pair as a hazard.
    sync_warp();
    // SAFETY: the warp's 16 rows and all ND chunks are inside the Q tile.
    unsafe { stage_fragments::<T, ND>(q_tile, warp_row, &o, 1.0, lane) };
    sync_warp();
    let t = lane % 4;
    // The general instances' sequence again: read anew rather than kept in registers across the
    // loop.
    let seq = if GENERAL { locate() } else { seq };
    let o_dst = o_dst_of(&seq);
    let chunks = q_tile.chunks();
    for i in 0..(16 * ND as u32 / 32) {
        let idx = 32 * i + lane;
        let (r, c) = (idx / chunks, idx % chunks);
        let row = q0 + warp_row + r;
        // SAFETY: the shared chunk is inside the Q tile; the global row is below n_q and the
        // chunk below O's real head dim.
        unsafe {
            let v = load_shared_16(q_tile.chunk_addr(warp_row + r, c));
            if row < seq.q_len && c < v_chunks {
                store_global_16(o_dst + row as u64 * 2 * st.o.seq + c as u64 * 16, v);
            }
        }
    }
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

/// One entry point per (dtype, configuration), named `flash_tc_forward_<dtype>_d<d>_w<warps>_k<keys>`
/// as the host formats it, and for the defaults `flash_tc_forward_general_…` (lengths and
/// dropout), `flash_tc_forward_mods_…` (the window and score modifiers) and
/// `flash_tc_forward_general_mods_…` (both); `tests/ptx_entries.rs` checks that every `VARIANTS`
/// entry exists.
macro_rules! entry_points {
    ($($name:ident => $t:ty, $cfg:expr, $general:literal, $mods:literal;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: TensorCoreForwardParams) {
            // SAFETY: the host validated the buffers against `p` and launched the configuration's
            // grid, block and shared memory.
            unsafe {
                forward::<
                    $t,
                    { $cfg.head_dim as usize / 16 },
                    { $cfg.head_dim as usize / 8 },
                    { $cfg.block_keys as usize / 8 },
                    { $cfg.block_keys as usize / 16 },
                    { $cfg.warps as usize },
                    $general,
                    $mods,
                >(&p)
            }
        }
    )*};
}

entry_points! {
    flash_tc_forward_bf16_d64_w4_k64 => Bf16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, false, false;
    flash_tc_forward_f16_d64_w4_k64 => F16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, false, false;
    flash_tc_forward_general_bf16_d64_w4_k64 => Bf16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, true, false;
    flash_tc_forward_general_f16_d64_w4_k64 => F16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, true, false;
    flash_tc_forward_mods_bf16_d64_w4_k64 => Bf16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, false, true;
    flash_tc_forward_mods_f16_d64_w4_k64 => F16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, false, true;
    flash_tc_forward_general_mods_bf16_d64_w4_k64 => Bf16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, true, true;
    flash_tc_forward_general_mods_f16_d64_w4_k64 => F16, TcConfig { head_dim: 64, warps: 4, block_keys: 64 }, true, true;
    flash_tc_forward_bf16_d128_w8_k64 => Bf16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, false, false;
    flash_tc_forward_f16_d128_w8_k64 => F16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, false, false;
    flash_tc_forward_general_bf16_d128_w8_k64 => Bf16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, true, false;
    flash_tc_forward_general_f16_d128_w8_k64 => F16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, true, false;
    flash_tc_forward_mods_bf16_d128_w8_k64 => Bf16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, false, true;
    flash_tc_forward_mods_f16_d128_w8_k64 => F16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, false, true;
    flash_tc_forward_general_mods_bf16_d128_w8_k64 => Bf16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, true, true;
    flash_tc_forward_general_mods_f16_d128_w8_k64 => F16, TcConfig { head_dim: 128, warps: 8, block_keys: 64 }, true, true;
    flash_tc_forward_bf16_d192_w4_k32 => Bf16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, false, false;
    flash_tc_forward_f16_d192_w4_k32 => F16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, false, false;
    flash_tc_forward_general_bf16_d192_w4_k32 => Bf16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, true, false;
    flash_tc_forward_general_f16_d192_w4_k32 => F16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, true, false;
    flash_tc_forward_mods_bf16_d192_w4_k32 => Bf16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, false, true;
    flash_tc_forward_mods_f16_d192_w4_k32 => F16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, false, true;
    flash_tc_forward_general_mods_bf16_d192_w4_k32 => Bf16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, true, true;
    flash_tc_forward_general_mods_f16_d192_w4_k32 => F16, TcConfig { head_dim: 192, warps: 4, block_keys: 32 }, true, true;
    flash_tc_forward_bf16_d256_w4_k32 => Bf16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, false, false;
    flash_tc_forward_f16_d256_w4_k32 => F16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, false, false;
    flash_tc_forward_general_bf16_d256_w4_k32 => Bf16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, true, false;
    flash_tc_forward_general_f16_d256_w4_k32 => F16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, true, false;
    flash_tc_forward_mods_bf16_d256_w4_k32 => Bf16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, false, true;
    flash_tc_forward_mods_f16_d256_w4_k32 => F16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, false, true;
    flash_tc_forward_general_mods_bf16_d256_w4_k32 => Bf16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, true, true;
    flash_tc_forward_general_mods_f16_d256_w4_k32 => F16, TcConfig { head_dim: 256, warps: 4, block_keys: 32 }, true, true;
}

/// Tuning candidates (the `tuning` feature): compared against the defaults by the timing examples.
#[cfg(feature = "tuning")]
entry_points! {
    flash_tc_forward_bf16_d64_w4_k128 => Bf16, TcConfig { head_dim: 64, warps: 4, block_keys: 128 }, false, false;
    flash_tc_forward_f16_d64_w4_k128 => F16, TcConfig { head_dim: 64, warps: 4, block_keys: 128 }, false, false;
    flash_tc_forward_bf16_d64_w8_k128 => Bf16, TcConfig { head_dim: 64, warps: 8, block_keys: 128 }, false, false;
    flash_tc_forward_f16_d64_w8_k128 => F16, TcConfig { head_dim: 64, warps: 8, block_keys: 128 }, false, false;
    flash_tc_forward_bf16_d128_w4_k64 => Bf16, TcConfig { head_dim: 128, warps: 4, block_keys: 64 }, false, false;
    flash_tc_forward_f16_d128_w4_k64 => F16, TcConfig { head_dim: 128, warps: 4, block_keys: 64 }, false, false;
}
