//! The FP8 (e4m3) `wgmma` forward: `forward`'s warp-specialized plain instance with 8-bit Q, K
//! and V, for full-length sequences, causal or not, at d = 128 (one 128-byte swizzle row per
//! row of Q, K and V).
//!
//! A block owns 128 query rows of one (batch, head): two consumer warpgroups of 64 rows and a
//! producer warpgroup. The producer's first thread issues the accelerator's loads of K and of V
//! (row-major, keys by head dim); all its threads then transpose each V block into a K-major
//! tile (head dim by keys), since 8-bit products read both operands K-major, storing the keys
//! in the order that lets P's accumulators serve as the A operand without an exchange between
//! lanes (`tile::wgmma_fp8`). `S = Q·Kᵀ` and `O += P·V` are `m64n128k32` products on e4m3 with
//! f32 accumulation, software-pipelined and issued in turns as in `forward`.
//!
//! The stored values are scaled: real `Q = δ_Q · Q₈` and so on, with per-head factors δ. The
//! scores take `δ_Q δ_K` into the base-2 scale, and O takes `δ_V` at the end. The fold makes
//! the weights 2⁸ · P (P at most 1; the factor joins the row maximum in the exponent,
//! `RowState::fold_biased`) before they are rounded to e4m3, so that weights down to 2⁻¹⁷ keep a
//! value (e4m3's smallest is 2⁻⁹) while the largest stays below its 448. ℓ sums the unrounded
//! 2⁸ · P, so O's normalisation cancels the factor and the LSE gives back its 8 ln 2.
//!
//! A NaN of V (e4m3 has no infinities) under the causal mask would reach the rows that may not
//! see its key as 0 · NaN through P·V. The producer zeroes the NaNs of each block across the
//! diagonal as it transposes it and flags them; once the consumers have stored O, it finds each
//! column's first NaN key of those blocks in global memory and writes NaN over the rows that see
//! it (the slow path of `forward`'s `non_finite_part`, for a block that held one).

use crate::abi::params::Fp8ForwardParams;
use crate::abi::storage::Bf16;
use crate::arch::{
    block_x, claim_registers, grid_dim_x, named_arrive, named_sync, release_registers,
    shared_window, sync_threads, thread_x,
};
use crate::attn::grid::head_and_sequence;
use crate::attn::row_keys::RowKeys;
use crate::attn::score_mod::{ScoreMod, Window, keys_every_row_sees};
use crate::attn::sequence::Sequence;
use crate::attn::softmax::{RowState, rescale};
use crate::kernels::sm90::forward::mask_and_fold;
use crate::kernels::sm90::{FP8_D128, Fp8Config};
use crate::tile::cp_async::{ChunkedTile, GlobalRows, wait_all};
use crate::tile::fp8_layout::{is_nan, key_of_position, nan_bytes, transpose_square};
use crate::tile::mem::{stage_fragments, store_shared_u32, store_staged_rows};
use crate::tile::mem_backward::load_shared_u32;
use crate::tile::mma::{FragA, FragC};
use crate::tile::tma;
use crate::tile::wgmma::{self, Accumulator, Desc};
use crate::tile::wgmma_fp8::{E4m3Accumulator, pack_p, transpose_4x4};
use crate::tile::{PanelTile, SwizzledTile};

/// Named barriers: every consumer thread, the producer warpgroup, the turn of consumer
/// warpgroup `g` at the tensor cores (`TURN + g`), and O stored.
const CONSUMERS: u32 = 1;
const PRODUCER: u32 = 2;
const TURN: u32 = 3;
/// Every consumer has stored O (only where a diagonal block of V held a NaN).
const STORED: u32 = 5;

/// The quiet NaN of bf16.
const BF16_NAN: u16 = 0x7fc0;

/// log₂ of P's factor before its rounding to e4m3 (see the module docs).
const P_LOG2: f32 = 8.0;

/// The descriptor of a `PanelTile` K-major operand.
#[inline(always)]
fn desc((start, lbo, sbo): (u32, u32, u32)) -> Desc {
    Desc::swizzle_128(start, lbo, sbo)
}

/// `sc = Q·Kᵀ` of the 64 rows from `row0` of `q` against the keys of `k`, one committed group.
///
/// # Safety
/// The rows and K are filled and published to the async proxy; the whole warpgroup calls it.
#[inline(always)]
unsafe fn scores<const KD: usize, const NK: usize>(
    sc: &mut [FragC; NK],
    q: PanelTile,
    row0: u32,
    k: PanelTile,
) where
    [FragC; NK]: E4m3Accumulator,
{
    let (a, b) = (desc(q.k_major(row0, 0)), desc(k.k_major(0, 0)));
    for kk in 0..KD as u32 {
        // 32 one-byte columns are the 32 bytes of a 16-bit k-step.
        let (a, b) = (
            a.advanced(q.k_step_offset(kk)),
            b.advanced(k.k_step_offset(kk)),
        );
        // SAFETY: forwarded to the caller.
        unsafe { sc.mma_ss_e4m3(a, b, kk > 0) };
    }
    wgmma::commit();
}

/// `o += P·V` with P's bytes from registers and `vt` the transposed V block, one committed
/// group.
///
/// # Safety
/// `vt` is filled and published to the async proxy; the whole warpgroup calls it.
#[inline(always)]
unsafe fn accumulate<const ND: usize, const NP: usize>(
    o: &mut [FragC; ND],
    pf: &[FragA; NP],
    vt: PanelTile,
) where
    [FragC; ND]: E4m3Accumulator,
{
    let b = desc(vt.k_major(0, 0));
    for (kk, pa) in pf.iter().enumerate() {
        // SAFETY: forwarded to the caller.
        unsafe { o.mma_rs_e4m3(pa, b.advanced(vt.k_step_offset(kk as u32))) };
    }
    wgmma::commit();
}

/// Transposes the V block in `raw` (rows = keys, 128 one-byte head-dim columns) into `vt` (rows
/// = head-dim columns, 128 keys in the order of `key_of_position`): each of the producer's 128
/// threads moves eight 4×4 byte squares, a warp's lanes spread over 8 key groups and 4 column
/// groups so that its 32-bit loads and stores hit at most two words per bank. With `sanitize`,
/// NaNs become 0; returns whether the thread found one.
///
/// # Safety
/// `raw` holds the landed block; nothing reads `vt` until the caller publishes it.
#[inline(always)]
unsafe fn transpose_v(raw: PanelTile, vt: PanelTile, p: u32, sanitize: bool) -> bool {
    let mut nan = 0;
    for u in 0..8 {
        // Key group `kg`: positions 4·kg .. 4·kg + 4; column group `cg`: columns 4·cg .. + 4.
        let (kg, cg) = transpose_square(p, u);
        let step = 32 * (kg / 8);
        let mut w = [0u32; 4];
        for (i, w) in w.iter_mut().enumerate() {
            let key = step + key_of_position(4 * (kg % 8) + i as u32);
            // SAFETY: inside the raw tile: row < 128, byte < 128.
            *w = unsafe { load_shared_u32(raw.chunk_addr(key, cg / 4) + 4 * (cg % 4)) };
            if sanitize {
                let m = nan_bytes(*w);
                nan |= m;
                *w &= !m;
            }
        }
        for (i, col) in transpose_4x4(w).into_iter().enumerate() {
            let row = 4 * cg + i as u32;
            // SAFETY: inside the transposed tile, as above.
            unsafe { store_shared_u32(vt.chunk_addr(row, kg / 4) + 4 * (kg % 4), col) };
        }
    }
    nan != 0
}

/// Writes NaN to O's column `col` in each row of `rows` that may see a key in
/// `keys.0 .. keys.1` whose V holds a NaN in that column: V's rows (e4m3) from global memory at
/// `v + key · v_stride`, O's (bf16) at `o + row · o_stride`. Rows see keys below
/// `row + shift + 1` (causal, bottom-right aligned), so the first such key decides. Slow, for
/// the rare diagonal blocks the producer flagged.
///
/// # Safety
/// Every key in `keys` is a row of V with 128 bytes and every row of `rows` a row of O; `col` is
/// below 128.
#[inline(always)]
unsafe fn write_nans(
    (o, o_stride): (u64, u64),
    (v, v_stride): (u64, u64),
    rows: (u32, u32),
    keys: (u32, u32),
    shift: i64,
    col: u32,
) {
    let mut key = keys.0;
    // SAFETY: a byte of a row of V (caller).
    while key < keys.1
        && !is_nan(unsafe { *((v + key as u64 * v_stride + col as u64) as *const u8) })
    {
        key += 1;
    }
    for row in rows.0..rows.1 {
        if key < keys.1 && row as i64 + shift >= key as i64 {
            // SAFETY: an element of a row of O (caller).
            unsafe { *((o + row as u64 * o_stride + 2 * col as u64) as *mut u16) = BF16_NAN };
        }
    }
}

#[inline(always)]
unsafe fn forward<const KD: usize, const ND: usize, const NK: usize, const NP: usize>(
    p: &Fp8ForwardParams,
    maps: u64,
    c: Fp8Config,
) where
    [FragC; NK]: E4m3Accumulator + Accumulator,
    [FragC; ND]: E4m3Accumulator + Accumulator,
{
    const { assert!(ND == KD * 4 && NK == 4 * NP && ND == 16 && NK == 16) };
    let (bc, br) = (c.block_keys, c.block_rows());
    let consumers = c.consumer_threads();
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
    let Some((h, b)) = head_and_sequence(s.heads_q, s.batch) else {
        return;
    };
    let seq = Sequence::full(&s, b);
    let q0 = q_block * br;
    if q0 >= seq.q_len {
        return;
    }
    let hk = s.kv_head(h);

    // Bytes of one tile (128 rows of 128 bytes) and the tiles: Q, two stages each of K, of V as
    // it lands and of V transposed; then the barriers.
    let tile_bytes = c.tile_bytes();
    let smem = shared_window();
    let tile = |i: u32, rows: u32| PanelTile::new(smem + i * tile_bytes, rows, 64);
    let q_tile = tile(0, br);
    let k_tile = |block: u32| tile(1 + (block & 1), bc);
    let v_raw = |block: u32| tile(3 + (block & 1), bc);
    let v_t = |block: u32| tile(5 + (block & 1), c.head_dim);
    let slot = |i: u32| smem + 7 * tile_bytes + i * tma::BARRIER_BYTES;
    let k_full = |block: u32| slot(block & 1);
    let k_empty = |block: u32| slot(2 + (block & 1));
    let v_landed = |block: u32| slot(4 + (block & 1));
    let vt_full = |block: u32| slot(6 + (block & 1));
    let vt_empty = |block: u32| slot(8 + (block & 1));
    // Set by the producer where a diagonal block's V held a NaN.
    let nan_flag = slot(10);

    let last_row = (q0 + br).min(seq.q_len) - 1;
    let (first, end) = seq.block_key_range(q0, last_row, causal, Window::NONE, bc);
    let (first_block, n_blocks) = (first / bc, end.div_ceil(bc));
    // A stage's barrier completes once per block it holds.
    let parity = |block: u32| ((block - first_block) / 2) & 1;
    let uses = |block: u32| (block - first_block) / 2;

    if tid == 0 {
        // SAFETY: the slots lie past the tiles, inside the block's shared memory.
        unsafe {
            for i in 0..6 {
                tma::init(slot(i), if (2..4).contains(&i) { consumers } else { 1 });
            }
            tma::init(slot(6), 128);
            tma::init(slot(7), 128);
            tma::init(slot(8), consumers);
            tma::init(slot(9), consumers);
            store_shared_u32(nan_flag, 0);
        }
        tma::fence_barrier_init();
    }
    sync_threads();

    if group == c.warpgroups {
        // The producer: 72 registers (3 · 168 = 72 + 2 · 216); with 40 or 56 its unrolled
        // transposes spilled.
        release_registers::<72>();
        if n_blocks <= first_block {
            return;
        }
        let ptid = tid - consumers;
        // Keys below this one every row of the block sees; blocks reaching past it are diagonal.
        let (_, unmasked_end) =
            keys_every_row_sees((q0, last_row), (seq.q_len, seq.k_len), causal, Window::NONE);
        let map_bytes = core::mem::size_of::<crate::abi::params::TensorMap>() as u64;
        let load = |map: u64, bar: u32, dst: PanelTile, block: u32| {
            let at = [0, hk as i32, (block * bc) as i32, seq.batch as i32];
            // SAFETY: the barrier is initialized and the stage free (its previous block released
            // or transposed); the box is one 1024-byte aligned 128-byte-row panel.
            unsafe {
                tma::arrive_expect_tx(bar, tile_bytes);
                tma::load_4d(dst.chunk_addr(0, 0), map, bar, at);
            }
        };
        let issue = |block: u32| {
            if ptid == 0 {
                if uses(block) > 0 {
                    // SAFETY: the stage's previous block was issued; every consumer releases it.
                    unsafe { tma::wait(k_empty(block), (uses(block) - 1) & 1) };
                }
                load(maps, k_full(block), k_tile(block), block);
                // V's raw stage is free: the producer transposed its previous block (barrier
                // at the end of `transpose`).
                load(maps + map_bytes, v_landed(block), v_raw(block), block);
            }
        };
        let transpose = |block: u32| {
            // SAFETY: the block was issued on `v_landed`; the transposed stage's previous block
            // was released by every consumer thread.
            unsafe {
                tma::wait(v_landed(block), parity(block));
                if uses(block) > 0 {
                    tma::wait(vt_empty(block), (uses(block) - 1) & 1);
                }
                let diagonal = causal && block * bc + bc > unmasked_end;
                if transpose_v(v_raw(block), v_t(block), ptid, diagonal) {
                    store_shared_u32(nan_flag, 1);
                }
            }
            wgmma::fence_proxy_async();
            // SAFETY: the barrier counts the producer's 128 threads.
            unsafe { tma::arrive(vt_full(block)) };
            named_sync(PRODUCER, 128);
        };
        issue(first_block);
        for block in first_block + 1..n_blocks {
            issue(block);
            transpose(block - 1);
        }
        transpose(n_blocks - 1);
        // SAFETY: initialized; the producer's writes precede its last barrier in `transpose`.
        if unsafe { load_shared_u32(nan_flag) } != 0 {
            // Once every consumer has stored O: one thread per column.
            named_sync(STORED, consumers + 128);
            let (n_q, n_k) = (seq.q_len, seq.k_len);
            let shift = n_k as i64 - n_q as i64;
            let o = (p.o + 2 * seq.q_row(&p.o_strides, 0, h), 2 * p.o_strides.seq);
            let v = (p.v + seq.k_row(&p.v_strides, 0, hk), p.v_strides.seq);
            let end = (last_row as i64 + shift + 1).clamp(0, n_k as i64) as u32;
            // SAFETY: the block's rows are rows of O, the keys up to the last row's end rows
            // of V; 128 producer threads, 128 columns.
            unsafe {
                write_nans(
                    o,
                    v,
                    (q0, last_row + 1),
                    (unmasked_end / bc * bc, end),
                    shift,
                    ptid,
                )
            };
        }
        return;
    }
    claim_registers::<216>();

    let q_rows = GlobalRows {
        base: p.q + seq.q_row(&p.q_strides, 0, h),
        stride: p.q_strides.seq,
        limit: seq.q_len,
        chunks: c.head_dim / 16,
    };
    // SAFETY: the Q tile holds `br` rows; rows below n_q are inside Q.
    unsafe { q_tile.fill_async(q_rows, q0, br, tid, consumers) };
    wait_all();
    wgmma::fence_proxy_async();
    named_sync(CONSUMERS, consumers);

    // SAFETY: the descaling factors exist for every head (validated by the host).
    let (dq, dk, dv) = unsafe {
        let f = p.descale as *const f32;
        let kv = s.heads_q as usize + hk as usize;
        (
            *f.add(h as usize),
            *f.add(kv),
            *f.add(kv + s.heads_kv as usize),
        )
    };
    // The scores' base-2 scale, and P's 2⁸ in the exponent (`mask_and_fold`).
    let scale = (p.scale_log2 * dq * dk, P_LOG2);

    let group_row = 64 * group;
    let (g, t) = (lane / 4, lane % 4);
    let row_lo = q0 + group_row + 16 * warp + g;
    let keys = RowKeys::new(
        row_lo,
        (q0, last_row),
        (seq.q_len, seq.k_len),
        (causal, Window::NONE),
        ScoreMod::default(),
    );
    let last_group = c.warpgroups - 1;
    let take_turn = || named_sync(TURN + group, 2 * 128);
    let pass_turn = |last: bool| {
        if !(last && group == last_group) {
            named_arrive(TURN + (group + 1) % c.warpgroups, 2 * 128);
        }
    };
    // SAFETY (all three): the barriers are initialized; each block waited for was issued on
    // them, and each release counts every consumer thread.
    let wait_k = |block: u32| unsafe { tma::wait(k_full(block), parity(block)) };
    let wait_v = |block: u32| unsafe { tma::wait(vt_full(block), parity(block)) };
    let release = |bar: u32| unsafe { tma::arrive(bar) };

    let mut o = [FragC::default(); ND];
    let mut state = RowState::new();
    if n_blocks > first_block {
        if group == last_group {
            named_arrive(TURN, 2 * 128);
        }
        wait_k(first_block);
        let mut sc = [FragC::default(); NK];
        take_turn();
        wgmma::fence();
        // SAFETY: the group's Q rows and K_first are published.
        unsafe { scores::<KD, NK>(&mut sc, q_tile, group_row, k_tile(first_block)) };
        pass_turn(false);
        wgmma::wait::<0>();
        release(k_empty(first_block));
        sc.pin();
        mask_and_fold(&mut sc, &mut state, scale, first_block * bc, &keys, t, true);
        let mut pf = pack_p::<NK, NP>(&sc);
        for block in first_block + 1..n_blocks {
            wait_k(block);
            wait_v(block - 1);
            let mut sc = [FragC::default(); NK];
            take_turn();
            wgmma::fence();
            // SAFETY: K_block and V_{block−1} (transposed) are published.
            unsafe {
                scores::<KD, NK>(&mut sc, q_tile, group_row, k_tile(block));
                accumulate::<ND, NP>(&mut o, &pf, v_t(block - 1));
            }
            pass_turn(false);
            wgmma::wait::<1>();
            release(k_empty(block));
            sc.pin();
            let alpha = mask_and_fold(&mut sc, &mut state, scale, block * bc, &keys, t, true);
            wgmma::wait::<0>();
            release(vt_empty(block - 1));
            o.pin();
            rescale(&mut o, alpha);
            pf = pack_p::<NK, NP>(&sc);
        }
        wait_v(n_blocks - 1);
        take_turn();
        wgmma::fence();
        // SAFETY: V_{n_blocks−1} (transposed) is published.
        unsafe { accumulate::<ND, NP>(&mut o, &pf, v_t(n_blocks - 1)) };
        pass_turn(true);
        wgmma::wait::<0>();
        o.pin();
    }

    let lse = state
        .finish(&mut o, None)
        .map(|x| x - P_LOG2 * core::f32::consts::LN_2);
    // Stage O (bf16, times δ_V) through the K stages once every consumer is done with them, so
    // that the global stores are 16 bytes wide and coalesced.
    named_sync(CONSUMERS, consumers);
    let staging = SwizzledTile::new(k_tile(0).chunk_addr(0, 0), c.head_dim);
    // SAFETY: the warp's 16 rows and all ND chunks are inside the staging tile (two K stages).
    unsafe { stage_fragments::<Bf16, ND>(staging, group_row + 16 * warp, &o, dv, lane) };
    named_sync(CONSUMERS, consumers);
    let (o_dst, o_stride) = (p.o + 2 * seq.q_row(&p.o_strides, 0, h), 2 * p.o_strides.seq);
    // SAFETY: the chunks are inside the staging tile; the global rows below q_len are O's.
    unsafe {
        store_staged_rows(
            staging,
            (br, c.head_dim / 8),
            (o_dst, o_stride),
            (q0, seq.q_len),
            (tid, consumers),
        )
    };
    if t == 0 {
        let lse_row = (seq.batch as u64 * s.heads_q as u64 + h as u64) * s.n_q as u64;
        let lse_ptr = p.lse as *mut f32;
        for (row, value) in [(row_lo, lse[0]), (row_lo + 8, lse[1])] {
            if row < seq.q_len {
                // SAFETY: the index is inside the [batch, heads_q, n_q] LSE tensor.
                unsafe { *lse_ptr.add((lse_row + row as u64) as usize) = value };
            }
        }
    }
    // SAFETY: the flag's word is initialized; every producer write to it precedes its arrival
    // on a transposed block this thread waited for, so every consumer reads the same value (0
    // where the block had no keys, and the producer returned).
    if unsafe { load_shared_u32(nan_flag) } != 0 {
        // The producer writes the allowed NaNs over the stored O.
        named_sync(STORED, consumers + 128);
    }
}

/// `flash_wgmma_forward_e4m3_d128_g2_k128`: the FP8 forward of [`FP8_D128`], launched with
/// `sm90::Fp8Config::threads` threads; its tensor maps are read in parameter space as
/// `forward`'s are.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn flash_wgmma_forward_e4m3_d128_g2_k128(p: Fp8ForwardParams) {
    let maps = crate::tile::tma::param_maps!(flash_wgmma_forward_e4m3_d128_g2_k128);
    // SAFETY: the host validated the buffers against `p`, encoded the tensor maps and launched
    // the configuration's grid, block and shared memory.
    unsafe { forward::<4, 16, 16, 4>(&p, maps, FP8_D128) }
}
