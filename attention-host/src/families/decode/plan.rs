//! When and how the decode family runs a call.
//!
//! Threshold: the family takes calls whose query rows per K/V head (`H_q / H_kv · N_q`) fit its
//! largest row tile, 16 (one decode step of up to 16 heads per K/V head, or a speculative /
//! chunked step of a few rows): there its SIMT products stay bandwidth bound (`kernels::decode`)
//! and each K/V row is read once. Larger groups are prefill, for the tensor-core families.
//!
//! With the `candidates` feature (not yet run on a GPU) the family runs the candidate
//! `mma.sync` split kernel instead (`kernels::decode::mma`: the same rows as one 16-row MMA
//! tile), with one wave of splits (`blocks_per_sm`, `choose_splits_one_wave`).

use attention_kernels::abi::grid::MAX_GRID_YZ;
use attention_kernels::kernels::decode::DecodeConfig;
#[cfg(feature = "candidates")]
use attention_kernels::kernels::decode::mma;
use attention_kernels::kernels::decode::{
    HEAD_DIMS, MAX_ROW_TILE, MAX_SPLITS, STEP_KEYS, THREADS, row_tile,
};

use crate::dtype::DType;
use crate::family::{Direction, Family};
use crate::flash_options::Schedule;
use crate::instances;
use crate::options::Lengths;
use crate::plan::types::{DeviceCaps, Plan, Tiles, WORKSPACE_ALIGN};
use crate::problem::Problem;

/// Blocks per SM the split count aims at: a decode block is small (4 warps, ≤ 17 KiB of shared
/// memory), so several run per SM and hide each other's memory latency.
const BLOCKS_PER_SM: u32 = 4;

/// `(splits, keys_per_split)` for `batch_heads` (sequences × K/V heads) blocks of work over
/// `n_k` keys on `sms` SMs: enough splits that the grid fills every SM `BLOCKS_PER_SM` times,
/// never a split shorter than one step of keys, never more than `MAX_SPLITS` (256).
pub fn choose_splits(sms: u32, batch_heads: u32, n_k: u32) -> (u32, u32) {
    let steps = n_k.div_ceil(STEP_KEYS).max(1);
    let target = (sms * BLOCKS_PER_SM).div_ceil(batch_heads.max(1));
    let wanted = target.clamp(1, MAX_SPLITS.min(steps));
    let keys_per_split = steps.div_ceil(wanted) * STEP_KEYS;
    (n_k.max(1).div_ceil(keys_per_split), keys_per_split)
}

/// Candidate `mma.sync` split blocks (the `candidates` feature) of head dim `head_dim` resident
/// on one SM of `device`: the fewer of what its shared memory holds (a block's window plus the
/// 1 KiB the driver reserves per block, from the per-block opt-in limit plus that 1 KiB) and
/// what the 64 K registers hold (2 blocks of 128 threads at d = 128; at d = 64, 4 with the
/// `sm_90a` module's kernel and 3 with the base module's: the ptxas counts in
/// `reports/PERF_LOG_DECODE.md`).
#[cfg(feature = "candidates")]
pub fn blocks_per_sm(device: &DeviceCaps, head_dim: u32) -> u32 {
    const RESERVED: u32 = 1024;
    let by_shared =
        (device.max_shared_per_block + RESERVED) / (mma::shared_bytes(head_dim) + RESERVED);
    let by_registers = match (head_dim > 64, device.wgmma) {
        (true, _) => 2,
        (false, true) => 4,
        (false, false) => 3,
    };
    by_shared.min(by_registers).max(1)
}

/// The candidate kernel's split count (the `candidates` feature): `(splits, keys_per_split)`
/// for `batch_heads` (sequences × K/V heads) blocks of work over `n_k` keys on `sms` SMs holding
/// `per_sm` blocks each: as many splits as fill every block slot once (one wave: no tail of a
/// second, no block waiting for a slot), never a split shorter than one tile of keys, never
/// more than `MAX_SPLITS` (256). Batches with more blocks of work than slots run unsplit.
#[cfg(feature = "candidates")]
pub fn choose_splits_one_wave(sms: u32, per_sm: u32, batch_heads: u32, n_k: u32) -> (u32, u32) {
    let tiles = n_k.div_ceil(mma::BLOCK_KEYS).max(1);
    let target = (sms * per_sm) / batch_heads.max(1);
    let wanted = target.clamp(1, MAX_SPLITS.min(tiles));
    let keys_per_split = tiles.div_ceil(wanted) * mma::BLOCK_KEYS;
    (n_k.max(1).div_ceil(keys_per_split), keys_per_split)
}

/// The split kernel's row tile, entry point, shared memory and `(splits, keys_per_split)` for
/// `problem`, whose rows per K/V head fit `row_tile`: the SIMT kernel of that row tile.
#[cfg(not(feature = "candidates"))]
fn split_kernel(
    device: &DeviceCaps,
    problem: &Problem,
    row_tile: u32,
) -> std::result::Result<(u32, String, u32, (u32, u32)), String> {
    let s = &problem.shape;
    Ok((
        row_tile,
        instances::decode(problem.dtype, s.head_dim, row_tile),
        attention_kernels::kernels::decode::shared_bytes(row_tile, s.head_dim),
        choose_splits(
            device.multiprocessors,
            problem.sequences.saturating_mul(s.heads_kv),
            problem.max_k_rows,
        ),
    ))
}

/// With the `candidates` feature: the candidate `mma.sync` split kernel, whose 16-row tile takes
/// every group of up to 16 rows (`row_tile` is the SIMT kernel's, unused), with one wave of
/// splits; refused where its shared memory does not fit a block.
#[cfg(feature = "candidates")]
fn split_kernel(
    device: &DeviceCaps,
    problem: &Problem,
    _row_tile: u32,
) -> std::result::Result<(u32, String, u32, (u32, u32)), String> {
    const { assert!(mma::MAX_ROWS == MAX_ROW_TILE) };
    let s = &problem.shape;
    let shared_bytes = mma::shared_bytes(s.head_dim);
    if shared_bytes > device.max_shared_per_block {
        return Err(format!(
            "needs {shared_bytes} bytes of shared memory per block; the device allows {}",
            device.max_shared_per_block
        ));
    }
    let splits = choose_splits_one_wave(
        device.multiprocessors,
        blocks_per_sm(device, s.head_dim),
        problem.sequences.saturating_mul(s.heads_kv),
        problem.max_k_rows,
    );
    Ok((
        mma::MAX_ROWS,
        instances::decode_mma(problem.dtype, s.head_dim),
        shared_bytes,
        splits,
    ))
}

/// The plan of the decode family for `problem`, or why it cannot run it.
pub(crate) fn plan(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
) -> std::result::Result<Plan, String> {
    let (s, o) = (&problem.shape, &problem.options);
    if direction == Direction::Backward {
        return Err("runs the forward only (decode steps need no gradients)".into());
    }
    if device.compute_capability.0 < 8 {
        return Err("needs compute capability 8.0 or newer".into());
    }
    if problem.dtype == DType::F32 {
        return Err("takes f16 or bf16, not f32".into());
    }
    if o.attention.dropout.is_some() {
        return Err("runs without dropout (decode is inference)".into());
    }
    if o.attention.has_score_mods() {
        return Err("takes no local window, softcap, ALiBi or sink logits".into());
    }
    if matches!(o.attention.lengths, Lengths::Packed { .. }) {
        return Err("takes full or per-sequence key lengths, not packed sequences".into());
    }
    if o.schedule == Schedule::Paper || o.block_sizes.is_some() {
        return Err(
            "has fixed tiles; the paper's schedule and explicit (B_r, B_c) are exact's".into(),
        );
    }
    if !HEAD_DIMS.contains(&s.head_dim) {
        return Err(format!(
            "is compiled for head_dim 64 and 128, not {}",
            s.head_dim
        ));
    }
    if s.heads_kv > MAX_GRID_YZ || problem.sequences > MAX_GRID_YZ {
        return Err(format!(
            "launches a grid row per K/V head and sequence: at most {MAX_GRID_YZ} of each"
        ));
    }
    let rows = (s.heads_q / s.heads_kv) as u64 * s.n_q as u64;
    let Some(row_tile) = u32::try_from(rows).ok().and_then(row_tile) else {
        return Err(format!(
            "takes at most {MAX_ROW_TILE} query rows per K/V head (H_q/H_kv · N_q = {rows}): that is prefill"
        ));
    };
    let (row_tile, entry, shared_bytes, (splits, keys_per_split)) =
        split_kernel(device, problem, row_tile)?;
    let cfg = DecodeConfig {
        head_dim: s.head_dim,
        row_tile,
        splits,
        keys_per_split,
        combine: o.decode_combine,
    };
    let pieces = [
        ("o_partial", splits as u64 * s.q_elems() as u64),
        ("lse_partial", splits as u64 * s.row_elems() as u64),
    ];
    Ok(Plan {
        direction,
        family: Family::Decode,
        tiles: Tiles::Decode(cfg),
        entry,
        block_rows: row_tile,
        block_keys: keys_per_split,
        grid: (splits, s.heads_kv, problem.sequences),
        threads: THREADS,
        shared_bytes,
        workspace: pieces
            .into_iter()
            .map(|(name, floats)| (name, (4 * floats).next_multiple_of(WORKSPACE_ALIGN)))
            .collect(),
        not_chosen: Vec::new(),
        staged: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use attention_kernels::abi::shape::AttentionShape;

    use super::*;
    use crate::family::KernelChoice;
    use crate::flash_options::FlashOptions;
    use crate::options::AttentionOptions;
    use crate::plan::select;
    use attention_kernels::kernels::decode::DecodeCombine;

    fn shape(batch: u32, n_q: u32, n_k: u32, heads_q: u32, heads_kv: u32) -> AttentionShape {
        AttentionShape {
            batch,
            n_q,
            n_k,
            heads_q,
            heads_kv,
            head_dim: 128,
        }
    }

    fn select_on(
        device: &DeviceCaps,
        s: AttentionShape,
        dtype: DType,
        options: FlashOptions,
        direction: Direction,
    ) -> crate::error::Result<Plan> {
        select(
            device,
            &Problem::new(&s, dtype, &options).unwrap(),
            direction,
        )
    }

    /// Which calls go to the decode family, whichever split kernel it runs.
    #[test]
    fn auto_routes_few_rows_per_kv_head_to_decode_and_the_rest_elsewhere() {
        let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
        let fwd = |dev, s, o| select_on(dev, s, DType::Bf16, o, Direction::Forward).unwrap();
        // Causal chunks of a few rows, GQA 16, key lengths: still decode.
        let causal = FlashOptions::new(AttentionOptions::new().causal(true));
        assert_eq!(
            fwd(&h200, shape(2, 4, 1000, 8, 2), causal).family,
            Family::Decode
        );
        assert_eq!(
            fwd(&h200, shape(2, 1, 1000, 16, 1), FlashOptions::default()).family,
            Family::Decode
        );
        let lengths = FlashOptions::new(AttentionOptions::new().key_lengths(vec![0, 7]));
        assert_eq!(
            fwd(&h200, shape(2, 1, 300, 4, 4), lengths).family,
            Family::Decode
        );
        // Prefill, too many rows per K/V head, and the backward go elsewhere.
        for s in [shape(1, 512, 32768, 32, 8), shape(1, 5, 4096, 32, 8)] {
            assert_eq!(fwd(&h200, s, FlashOptions::default()).family, Family::Sm90);
        }
        let b = select_on(
            &h200,
            shape(1, 1, 4096, 32, 8),
            DType::Bf16,
            FlashOptions::default(),
            Direction::Backward,
        );
        assert_eq!(b.unwrap().family, Family::Sm90);
    }

    #[cfg(not(feature = "candidates"))]
    #[test]
    fn auto_takes_decode_for_few_rows_per_kv_head() {
        let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
        let a100 = DeviceCaps::for_arch("sm_80", false).unwrap();
        let fwd = |dev, s, o| select_on(dev, s, DType::Bf16, o, Direction::Forward).unwrap();
        let p = fwd(&h200, shape(1, 1, 32768, 32, 8), FlashOptions::default());
        assert_eq!(p.family, Family::Decode);
        assert_eq!(
            p.tiles,
            Tiles::Decode(DecodeConfig {
                head_dim: 128,
                row_tile: 4,
                splits: 64,
                keys_per_split: 512,
                combine: DecodeCombine::Parallel,
            })
        );
        assert_eq!(p.entry, "flash_decode_bf16_d128_r4");
        assert_eq!(p.grid, (64, 8, 1));
        assert_eq!(
            p.workspace,
            vec![
                ("o_partial", 64 * 32 * 128 * 4),
                ("lse_partial", 64 * 32 * 4)
            ]
        );
        assert!(p.to_string().contains("splits: 64"), "{p}");
        // The generic merge: the same split kernel and grid, the plan says which.
        let merge = fwd(
            &h200,
            shape(1, 1, 32768, 32, 8),
            FlashOptions::default().decode_combine(DecodeCombine::Merge),
        );
        assert_eq!(
            (merge.entry.as_str(), merge.grid),
            ("flash_decode_bf16_d128_r4", (64, 8, 1))
        );
        assert!(merge.to_string().contains("combine: Merge"), "{merge}");
        let a = fwd(&a100, shape(1, 1, 32768, 32, 8), FlashOptions::default());
        assert_eq!((a.family, a.grid), (Family::Decode, (52, 8, 1)));
    }

    #[cfg(feature = "candidates")]
    #[test]
    fn auto_takes_the_candidate_mma_decode_for_few_rows_per_kv_head() {
        let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
        let a100 = DeviceCaps::for_arch("sm_80", false).unwrap();
        let fwd = |dev, s, o| select_on(dev, s, DType::Bf16, o, Direction::Forward).unwrap();
        let p = fwd(&h200, shape(1, 1, 32768, 32, 8), FlashOptions::default());
        assert_eq!(p.family, Family::Decode);
        assert_eq!(
            p.tiles,
            Tiles::Decode(DecodeConfig {
                head_dim: 128,
                row_tile: 16,
                splits: 32,
                keys_per_split: 1024,
                combine: DecodeCombine::Parallel,
            })
        );
        assert_eq!(p.entry, "flash_decode_mma_bf16_d128");
        assert_eq!(p.grid, (32, 8, 1));
        assert_eq!((p.block_rows, p.shared_bytes), (16, mma::shared_bytes(128)));
        assert_eq!(
            p.workspace,
            vec![
                ("o_partial", 32 * 32 * 128 * 4),
                ("lse_partial", 32 * 32 * 4)
            ]
        );
        assert!(p.to_string().contains("splits: 32"), "{p}");
        // The generic merge: the same split kernel and grid, the plan says which.
        let merge = fwd(
            &h200,
            shape(1, 1, 32768, 32, 8),
            FlashOptions::default().decode_combine(DecodeCombine::Merge),
        );
        assert_eq!(
            (merge.entry.as_str(), merge.grid),
            ("flash_decode_mma_bf16_d128", (32, 8, 1))
        );
        assert!(merge.to_string().contains("combine: Merge"), "{merge}");
        // The A100's 163 KiB hold one d = 128 block per SM: 108 slots, 13 splits of 8 heads.
        let a = fwd(&a100, shape(1, 1, 32768, 32, 8), FlashOptions::default());
        assert_eq!((a.family, a.grid), (Family::Decode, (13, 8, 1)));
        // One 16-row tile whatever the group: MQA with 16 query heads, 4 rows of GQA 4, 1 row.
        for s in [
            shape(1, 1, 4096, 16, 1),
            shape(2, 4, 4096, 8, 2),
            shape(2, 1, 4096, 8, 8),
        ] {
            let p = fwd(&h200, s, FlashOptions::default());
            assert_eq!(
                (p.entry.as_str(), p.block_rows, cfg(&p).row_tile),
                ("flash_decode_mma_bf16_d128", 16, 16)
            );
        }
    }

    #[test]
    fn forced_decode_refuses_what_it_cannot_run_with_the_reason() {
        let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
        let only =
            |a: AttentionOptions| FlashOptions::new(a).kernel(KernelChoice::Only(Family::Decode));
        let refusal = |s, dtype, o, direction| {
            select_on(&h200, s, dtype, o, direction)
                .unwrap_err()
                .to_string()
        };
        let one = shape(2, 1, 300, 8, 2);
        for (s, dtype, o, direction, why) in [
            (
                one,
                DType::Bf16,
                only(AttentionOptions::new().dropout(0.1, 1, 0)),
                Direction::Forward,
                "without dropout",
            ),
            (
                one,
                DType::F32,
                only(AttentionOptions::new()),
                Direction::Forward,
                "not f32",
            ),
            (
                one,
                DType::Bf16,
                only(AttentionOptions::new().window(16, 0)),
                Direction::Forward,
                "no local window",
            ),
            (
                one,
                DType::Bf16,
                only(AttentionOptions::new().softcap(30.0)),
                Direction::Forward,
                "softcap",
            ),
            (
                one,
                DType::F16,
                only(AttentionOptions::new()),
                Direction::Backward,
                "forward only",
            ),
            (
                shape(1, 3, 300, 8, 2),
                DType::F16,
                only(AttentionOptions::new().packed(vec![0, 1, 3], vec![0, 100, 300])),
                Direction::Forward,
                "packed",
            ),
            (
                AttentionShape {
                    head_dim: 96,
                    ..one
                },
                DType::F16,
                only(AttentionOptions::new()),
                Direction::Forward,
                "head_dim 64 and 128, not 96",
            ),
            (
                shape(1, 8, 300, 8, 2),
                DType::F16,
                only(AttentionOptions::new()),
                Direction::Forward,
                "= 32",
            ),
        ] {
            let e = refusal(s, dtype, o, direction);
            assert!(e.contains("decode") && e.contains(why), "{e}");
        }
    }

    #[test]
    fn splits_fill_the_machine_without_splitting_below_a_step() {
        // H200 (132 SMs), the rows: batch · H_kv blocks of work.
        assert_eq!(choose_splits(132, 8, 32768), (64, 512));
        assert_eq!(choose_splits(132, 8, 131072), (64, 2048));
        assert_eq!(choose_splits(132, 64, 8192), (8, 1024));
        assert_eq!(choose_splits(132, 512, 4096), (2, 2048));
        assert_eq!(choose_splits(132, 32, 131072), (17, 7808));
        // Few keys: one step per split at most; one split when the heads fill the machine.
        assert_eq!(choose_splits(132, 1, 300), (3, 128));
        assert_eq!(choose_splits(132, 1, 1), (1, 128));
        assert_eq!(choose_splits(132, 10_000, 1 << 20), (1, 1 << 20));
        // Never more than MAX_SPLITS; every key is in a split and no split is empty.
        for (sms, bh, n_k) in [(132, 1, 1 << 24), (108, 3, 1000), (132, 7, 129), (1, 1, 5)] {
            let (splits, keys) = choose_splits(sms, bh, n_k);
            assert!(splits <= MAX_SPLITS && keys % STEP_KEYS == 0);
            assert!(splits as u64 * keys as u64 >= n_k as u64);
            assert!(((splits - 1) as u64 * keys as u64) < n_k.max(1) as u64);
        }
    }

    #[cfg(feature = "candidates")]
    fn cfg(p: &Plan) -> DecodeConfig {
        match p.tiles {
            Tiles::Decode(c) => c,
            ref other => panic!("not a decode plan: {other:?}"),
        }
    }

    #[cfg(feature = "candidates")]
    #[test]
    fn blocks_per_sm_follow_shared_memory_and_registers() {
        let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
        let a100 = DeviceCaps::for_arch("sm_80", false).unwrap();
        assert_eq!(blocks_per_sm(&h200, 128), 2);
        assert_eq!(blocks_per_sm(&h200, 64), 4);
        assert_eq!(blocks_per_sm(&a100, 128), 1);
        assert_eq!(blocks_per_sm(&a100, 64), 3);
        // The base module's d = 64 kernel takes more registers than the sm_90a one.
        let base_module = DeviceCaps::for_arch("sm_90", false).unwrap();
        assert_eq!(blocks_per_sm(&base_module, 64), 3);
        // sm_86/sm_89: 99 KiB per block still takes d = 128.
        assert!(mma::shared_bytes(128) <= 99 * 1024);
    }

    #[cfg(feature = "candidates")]
    #[test]
    fn splits_fill_the_block_slots_once_without_splitting_below_a_tile() {
        // H200 (132 SMs, 2 d = 128 blocks each), the rows: batch · H_kv blocks of work.
        assert_eq!(choose_splits_one_wave(132, 2, 8, 32768), (32, 1024));
        assert_eq!(choose_splits_one_wave(132, 2, 8, 131072), (33, 4032));
        assert_eq!(choose_splits_one_wave(132, 2, 64, 8192), (4, 2048));
        assert_eq!(choose_splits_one_wave(132, 2, 512, 4096), (1, 4096));
        assert_eq!(choose_splits_one_wave(132, 2, 32, 131072), (8, 16384));
        // Few keys: one tile per split at most; one split when the heads fill the machine.
        assert_eq!(choose_splits_one_wave(132, 2, 1, 300), (5, 64));
        assert_eq!(choose_splits_one_wave(132, 2, 1, 1), (1, 64));
        assert_eq!(
            choose_splits_one_wave(132, 2, 10_000, 1 << 20),
            (1, 1 << 20)
        );
        // Never more than MAX_SPLITS nor more blocks than slots (where splitting at all);
        // every key is in a split and no split is empty.
        for (sms, per_sm, bh, n_k) in [
            (132, 2, 1, 1 << 24),
            (108, 1, 3, 1000),
            (132, 4, 7, 129),
            (1, 1, 1, 5),
            (132, 2, 1, 40_000),
        ] {
            let (splits, keys) = choose_splits_one_wave(sms, per_sm, bh, n_k);
            assert!(splits <= MAX_SPLITS && keys % mma::BLOCK_KEYS == 0);
            assert!(splits == 1 || splits * bh <= sms * per_sm);
            assert!(splits as u64 * keys as u64 >= n_k as u64);
            assert!(((splits - 1) as u64 * keys as u64) < n_k.max(1) as u64);
        }
        assert_eq!(choose_splits_one_wave(132, 2, 1, 40_000).0, 209);
    }
}
