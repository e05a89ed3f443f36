//! When and how the decode family runs a call.
//!
//! Threshold: the family takes calls whose query rows per K/V head (`H_q / H_kv · N_q`) fit the
//! split kernel's 16-row `mma.sync` tile (one decode step of up to 16 heads per K/V head, or a
//! speculative / chunked step of a few rows): each K/V row is read once and the kernel stays
//! bandwidth bound (`kernels::decode`). Larger groups are prefill, for the tensor-core families.
//! Splits: one wave of blocks, as many per SM as keep one d = 128 block's bytes in flight
//! (`wave_blocks_per_sm`, `choose_splits`).

use attention_kernels::abi::grid::MAX_GRID_YZ;
use attention_kernels::kernels::decode::{
    BLOCK_KEYS, DecodeCombine, DecodeConfig, HEAD_DIMS, MAX_ROWS, MAX_SPLITS, THREADS, shared_bytes,
};

use crate::dtype::DType;
use crate::family::{Direction, Family};
use crate::flash_options::Schedule;
use crate::instances;
use crate::options::Lengths;
use crate::plan::types::{DeviceCaps, Plan, SPLIT_COUNTERS, Tiles, WORKSPACE_ALIGN};
use crate::problem::Problem;

/// Split blocks of head dim `head_dim` resident on one SM of `device`: the fewer of what its
/// shared memory holds (a block's window plus the 1 KiB the driver reserves per block, from the
/// per-block opt-in limit plus that 1 KiB) and what the 64 K registers hold (2 blocks of 128
/// threads at d = 128; at d = 64, 4 with the `sm_90a` module's kernel and 3 with the base
/// module's: the ptxas counts in `reports/PERF_LOG_DECODE.md`).
pub fn blocks_per_sm(device: &DeviceCaps, head_dim: u32) -> u32 {
    const RESERVED: u32 = 1024;
    let by_shared = (device.max_shared_per_block + RESERVED) / (shared_bytes(head_dim) + RESERVED);
    let by_registers = match (head_dim > 64, device.wgmma) {
        (true, _) => 2,
        (false, true) => 4,
        (false, false) => 3,
    };
    by_shared.min(by_registers).max(1)
}

/// Split blocks per SM that one wave of splits aims at: the two K/V tiles in flight of
/// one d = 128 block per SM (64 KiB) are enough to keep HBM busy, and a second resident block
/// only adds merge parts and blocks finishing unevenly (the H200 sweep of
/// `reports/PERF_LOG_DECODE.md`: 16 splits of 32,768 keys over 8 K/V heads, 128 blocks, beat 32
/// splits, 256 blocks, on every row). Smaller head dims take as many blocks as make up the same
/// bytes, at most what fits (`blocks_per_sm`).
pub fn wave_blocks_per_sm(device: &DeviceCaps, head_dim: u32) -> u32 {
    (128 / head_dim.max(1)).clamp(1, blocks_per_sm(device, head_dim))
}

/// `(splits, keys_per_split)` for `batch_heads` (sequences × K/V heads) blocks of work over `n_k`
/// keys on `sms` SMs taking `per_sm` blocks each: as many splits as make one wave of `sms ·
/// per_sm` blocks (no tail of a second, no block waiting for a slot), never a split shorter than
/// one tile of keys, never more than `MAX_SPLITS` (256). Batches with more blocks of work than
/// slots run unsplit.
pub fn choose_splits(sms: u32, per_sm: u32, batch_heads: u32, n_k: u32) -> (u32, u32) {
    split_keys((sms * per_sm) / batch_heads.max(1), n_k)
}

/// `(splits, keys_per_split)` for about `wanted` splits (1 to `MAX_SPLITS`) of `n_k` keys:
/// whole tiles per split, never more splits than tiles.
pub fn split_keys(wanted: u32, n_k: u32) -> (u32, u32) {
    let tiles = n_k.div_ceil(BLOCK_KEYS).max(1);
    let wanted = wanted.clamp(1, MAX_SPLITS.min(tiles));
    let keys_per_split = tiles.div_ceil(wanted) * BLOCK_KEYS;
    (n_k.max(1).div_ceil(keys_per_split), keys_per_split)
}

/// The plan of the decode family for `problem` over contiguous K and V, or why it cannot run it.
pub(crate) fn plan(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
) -> std::result::Result<Plan, String> {
    plan_keys(
        device,
        problem,
        direction,
        wave_blocks_per_sm(device, problem.shape.head_dim),
    )
}

/// Pages of at least this many rows (four tiles) run the contiguous plan's wave; smaller ones
/// fill every block slot.
pub const PAGE_ROWS_FOR_ONE_WAVE: u32 = 4 * BLOCK_KEYS;

/// The plan over a paged cache of `page_size` rows per page. Small pages fill every block slot
/// (`blocks_per_sm`): with one block per SM, page 16 ran at 1.21× the contiguous cache, with two
/// at 1.09× (run split-paged, `reports/PERF_LOG_DECODE.md`). Pages of
/// [`PAGE_ROWS_FOR_ONE_WAVE`] rows or more take the contiguous plan's wave (page 256: 1.01×
/// there, against 1.04× with two blocks per SM).
pub(crate) fn plan_paged(
    device: &DeviceCaps,
    problem: &Problem,
    page_size: u32,
) -> std::result::Result<Plan, String> {
    let d = problem.shape.head_dim;
    let per_sm = match page_size >= PAGE_ROWS_FOR_ONE_WAVE {
        true => wave_blocks_per_sm(device, d),
        false => blocks_per_sm(device, d),
    };
    plan_keys(device, problem, Direction::Forward, per_sm)
}

/// The plan with a wave of `per_sm` split blocks per SM where the plan chooses the splits.
fn plan_keys(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
    per_sm: u32,
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
    if s.head_dim_v != s.head_dim {
        return Err(format!(
            "takes one head dim for Q, K and V (head_dim {} and head_dim_v {} differ)",
            s.head_dim, s.head_dim_v
        ));
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
    if rows > MAX_ROWS as u64 {
        return Err(format!(
            "takes at most {MAX_ROWS} query rows per K/V head (H_q/H_kv · N_q = {rows}): that is prefill"
        ));
    }
    let shared_bytes = shared_bytes(s.head_dim);
    if shared_bytes > device.max_shared_per_block {
        return Err(format!(
            "needs {shared_bytes} bytes of shared memory per block; the device allows {}",
            device.max_shared_per_block
        ));
    }
    let (splits, keys_per_split) = match o.decode_splits {
        None => choose_splits(
            device.multiprocessors,
            per_sm,
            problem.sequences.saturating_mul(s.heads_kv),
            problem.max_k_rows,
        ),
        // `Problem::new` refused counts outside 1 to MAX_SPLITS.
        Some(n) => split_keys(n, problem.max_k_rows),
    };
    let cfg = DecodeConfig {
        head_dim: s.head_dim,
        splits,
        keys_per_split,
        combine: o.decode_combine,
    };
    // A single split merging in the kernel writes O and LSE itself; the counters are u32.
    let pieces = match (cfg.combine, splits) {
        (DecodeCombine::LastSplit, 1) => Vec::new(),
        (combine, _) => {
            let mut pieces = vec![
                ("o_partial", splits as u64 * s.o_elems() as u64),
                ("lse_partial", splits as u64 * s.row_elems() as u64),
            ];
            if combine == DecodeCombine::LastSplit {
                pieces.push((SPLIT_COUNTERS, problem.sequences as u64 * s.heads_kv as u64));
            }
            pieces
        }
    };
    Ok(Plan {
        direction,
        family: Family::Decode,
        tiles: Tiles::Decode(cfg),
        entry: instances::decode(problem.dtype, s.head_dim),
        block_rows: MAX_ROWS,
        block_keys: keys_per_split,
        grid: (splits, s.heads_kv, problem.sequences),
        threads: THREADS,
        shared_bytes,
        tensor_maps: false,
        producer_warpgroup: false,
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

    fn shape(batch: u32, n_q: u32, n_k: u32, heads_q: u32, heads_kv: u32) -> AttentionShape {
        AttentionShape::new(batch, n_q, n_k, heads_q, heads_kv, 128)
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
                splits: 16,
                keys_per_split: 2048,
                combine: DecodeCombine::LastSplit,
            })
        );
        assert_eq!(p.entry, "flash_decode_mma_bf16_d128");
        assert_eq!(p.grid, (16, 8, 1));
        // Over a paged cache of small pages the wave fills both d = 128 slots of each SM; pages
        // of four tiles or more run the contiguous plan's.
        let problem = Problem::new(
            &shape(1, 1, 32768, 32, 8),
            DType::Bf16,
            &FlashOptions::default(),
        )
        .unwrap();
        assert_eq!(plan_paged(&h200, &problem, 16).unwrap().grid, (32, 8, 1));
        assert_eq!(plan_paged(&h200, &problem, 128).unwrap().grid, (32, 8, 1));
        assert_eq!(plan_paged(&h200, &problem, 256).unwrap().grid, p.grid);
        assert_eq!((p.block_rows, p.shared_bytes), (16, shared_bytes(128)));
        // The partials, and a counter per (sequence, K/V head) rounded up to the alignment.
        assert_eq!(
            p.workspace,
            vec![
                ("o_partial", 16 * 32 * 128 * 4),
                ("lse_partial", 16 * 32 * 4),
                (SPLIT_COUNTERS, WORKSPACE_ALIGN),
            ]
        );
        assert!(p.to_string().contains("splits: 16"), "{p}");
        // The parallel combine's launch needs no counters.
        let parallel = fwd(
            &h200,
            shape(1, 1, 32768, 32, 8),
            FlashOptions::default().decode_combine(DecodeCombine::Parallel),
        );
        assert_eq!(parallel.workspace, p.workspace[..2]);
        // Splits the caller asks for: whole tiles each, at most one per tile, 1 to 256.
        let asked = |n| FlashOptions::default().decode_splits(Some(n));
        let p64 = fwd(&h200, shape(1, 1, 32768, 32, 8), asked(64));
        assert_eq!((p64.grid, p64.block_keys), ((64, 8, 1), 512));
        assert_eq!(fwd(&h200, shape(1, 1, 100, 32, 8), asked(64)).grid.0, 2);
        for n in [0, 257] {
            let why = Problem::new(&shape(1, 1, 32768, 32, 8), DType::Bf16, &asked(n))
                .unwrap_err()
                .to_string();
            assert!(why.contains("1 to 256 times"), "{n}: {why}");
        }
        // More sequences × K/V heads than block slots: one split, which writes O and LSE itself.
        let single = fwd(&h200, shape(64, 1, 4096, 32, 8), FlashOptions::default());
        assert_eq!((single.grid, single.workspace.len()), ((1, 8, 64), 0));
        // The generic merge: the same split kernel and grid, the plan says which.
        let merge = fwd(
            &h200,
            shape(1, 1, 32768, 32, 8),
            FlashOptions::default().decode_combine(DecodeCombine::Merge),
        );
        assert_eq!(
            (merge.entry.as_str(), merge.grid),
            ("flash_decode_mma_bf16_d128", (16, 8, 1))
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
                (p.family, p.entry.as_str(), p.block_rows),
                (Family::Decode, "flash_decode_mma_bf16_d128", 16)
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
                    head_dim_v: 96,
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
        assert!(shared_bytes(128) <= 99 * 1024);
    }

    #[test]
    fn a_wave_takes_one_d128_block_per_sm_or_its_bytes_in_smaller_blocks() {
        let h200 = DeviceCaps::for_arch("sm_90", true).unwrap();
        let a100 = DeviceCaps::for_arch("sm_80", false).unwrap();
        assert_eq!(wave_blocks_per_sm(&h200, 128), 1);
        assert_eq!(wave_blocks_per_sm(&h200, 64), 2);
        assert_eq!(wave_blocks_per_sm(&a100, 128), 1);
        assert_eq!(wave_blocks_per_sm(&a100, 64), 2);
    }

    #[test]
    fn splits_fill_the_block_slots_once_without_splitting_below_a_tile() {
        // H200 (132 SMs, one d = 128 block each in a wave), the rows: batch · H_kv
        // blocks of work; the counts the sweep found fastest (reports/PERF_LOG_DECODE.md).
        assert_eq!(choose_splits(132, 1, 8, 32768), (16, 2048));
        assert_eq!(choose_splits(132, 1, 8, 131072), (16, 8192));
        assert_eq!(choose_splits(132, 1, 64, 8192), (2, 4096));
        assert_eq!(choose_splits(132, 1, 512, 4096), (1, 4096));
        assert_eq!(choose_splits(132, 1, 32, 131072), (4, 32768));
        // Few keys: one tile per split at most; one split when the heads fill the machine.
        assert_eq!(choose_splits(132, 2, 1, 300), (5, 64));
        assert_eq!(choose_splits(132, 2, 1, 1), (1, 64));
        assert_eq!(choose_splits(132, 2, 10_000, 1 << 20), (1, 1 << 20));
        // Never more than MAX_SPLITS nor more blocks than slots (where splitting at all);
        // every key is in a split and no split is empty.
        for (sms, per_sm, bh, n_k) in [
            (132, 2, 1, 1 << 24),
            (108, 1, 3, 1000),
            (132, 4, 7, 129),
            (1, 1, 1, 5),
            (132, 2, 1, 40_000),
        ] {
            let (splits, keys) = choose_splits(sms, per_sm, bh, n_k);
            assert!(splits <= MAX_SPLITS && keys % BLOCK_KEYS == 0);
            assert!(splits == 1 || splits * bh <= sms * per_sm);
            assert!(splits as u64 * keys as u64 >= n_k as u64);
            assert!(((splits - 1) as u64 * keys as u64) < n_k.max(1) as u64);
        }
        assert_eq!(choose_splits(132, 2, 1, 40_000).0, 209);
    }
}
