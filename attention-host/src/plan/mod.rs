//! The one place that decides which kernel runs a call.
//!
//! `select(device, problem, direction)` tries the families in order — `sm90` (`wgmma`, compute
//! capability 9.0 with the `sm_90a` module), `sm80` (`mma.sync`, any sm_80+ device), `exact` (the
//! SIMT kernels, every option, head dim and dtype) — and returns a [`Plan`]: the family, its tile
//! configuration, entry point, grid, shared memory and workspace, and why each other family was
//! not chosen. A [`KernelChoice`] other than `Auto` forces one family; a forced family that
//! cannot run the call is refused with its reason. Needs no device: [`DeviceCaps::for_arch`]
//! describes an architecture without one.

use std::fmt;

use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::attn::backward::{PREPROCESS_WARPS, Q_BLOCK, n_q_pad};
use attention_kernels::kernels::{MAX_TENSOR_CORE_HEAD_DIM, sm80, sm90, tensor_core_head_dim};

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::families::exact::{KernelFamily, THREADS, choose_block_sizes};
use crate::family::{Direction, Family, KernelChoice};
use crate::flash_options::Schedule;
use crate::instances;
use crate::problem::Problem;

pub(crate) mod types;
pub use types::{DeviceCaps, Plan, SPLIT_COUNTERS, Tiles, WORKSPACE_ALIGN};

/// Chooses the family and configuration that run `problem` in `direction` on `device`.
pub fn select(device: &DeviceCaps, problem: &Problem, direction: Direction) -> Result<Plan> {
    let mut attempts: Vec<(Family, std::result::Result<Plan, String>)> = Family::ALL
        .into_iter()
        .map(|f| (f, plan_family(device, problem, direction, f)))
        .collect();
    let chosen = match problem.options.kernel {
        KernelChoice::Auto => attempts.iter().position(|(_, a)| a.is_ok()),
        KernelChoice::Only(family) => {
            let i = attempts.iter().position(|(f, _)| *f == family).unwrap();
            if let Err(why) = &attempts[i].1 {
                return Err(invalid!("the {family} kernels cannot run this call: {why}"));
            }
            Some(i)
        }
    };
    let Some(chosen) = chosen else {
        let why: Vec<String> = attempts
            .iter()
            .filter_map(|(f, a)| a.as_ref().err().map(|e| format!("{f}: {e}")))
            .collect();
        return Err(invalid!(
            "no kernel family can run this call ({})",
            why.join("; ")
        ));
    };
    let mut plan = attempts.remove(chosen).1.unwrap();
    plan.not_chosen = attempts
        .into_iter()
        .map(|(f, a)| {
            let why = match (a, problem.options.kernel) {
                (Err(why), _) => why,
                (Ok(_), KernelChoice::Auto) => format!("could run it; {} comes first", plan.family),
                (Ok(_), choice) => format!("could run it; --kernel {choice} was asked for"),
            };
            (f, why)
        })
        .collect();
    Ok(plan)
}

/// The plan of `family` for the call, or why the family cannot run it.
fn plan_family(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
    family: Family,
) -> std::result::Result<Plan, String> {
    if family == Family::Decode {
        return crate::families::decode::plan(device, problem, direction);
    }
    admits(device, problem, direction, family)?;
    let tiles = match (family, direction) {
        (Family::Exact, _) => {
            let b = choose_block_sizes(
                exact_kind(direction),
                (problem.shape.head_dim, problem.shape.head_dim_v),
                device.max_shared_per_block,
                problem.options.block_sizes,
            )
            .map_err(|e| e.to_string())?;
            Tiles::Exact(b)
        }
        (Family::Decode, _) => unreachable!("the decode family plans itself"),
        (Family::Sm90 | Family::Sm80, _) => {
            let d = tensor_core_head_dims(&problem.shape)?;
            let tiles = match (family, direction) {
                (Family::Sm90, Direction::Forward) => {
                    sm90_forward_tiles(problem, d).map(Tiles::Sm90Forward)
                }
                (Family::Sm90, Direction::Backward) => {
                    sm90_backward_tiles(problem, d).map(Tiles::Sm90Backward)
                }
                (_, Direction::Forward) => sm80::forward::config(d).map(Tiles::Sm80Forward),
                (_, Direction::Backward) => sm80::backward::config(d).map(Tiles::Sm80Backward),
            };
            tiles.ok_or_else(|| head_dims("head_dim", d))?
        }
    };
    plan_tiles(device, problem, direction, family, tiles)
}

/// Whether the call runs the `wgmma` family's modifier instances: softcap, ALiBi or sinks, or a
/// window with key lengths, packed sequences or dropout (a window alone runs the `window` ones),
/// on the tiles of `sm90::mods_config` and `sm90::backward_mods_config`.
fn on_sm90_mods_instance(problem: &Problem) -> bool {
    problem.options.attention.has_score_mods() && !problem.window_only()
}

/// The `wgmma` forward's configuration for a call whose widest head dim is `d`: the default
/// one, for a plain call (full-length sequences, no dropout, window or score modifiers) the tiles
/// of its own that `sm90::plain_config` gives, and for a call on the modifier instance the tiles
/// of `sm90::mods_config`.
fn sm90_forward_tiles(problem: &Problem, d: u32) -> Option<sm90::WgConfig> {
    let (s, causal) = (&problem.shape, problem.options.attention.causal);
    sm90::config(d).map(|c| {
        if on_sm90_mods_instance(problem) {
            sm90::mods_config(&c)
        } else if problem.needs_general() {
            c
        } else {
            sm90::plain_config(&c, causal, problem.max_q_len, (s.head_dim, s.head_dim_v))
        }
    })
}

/// The `wgmma` backward's configuration for a call whose widest head dim is `d`: the default
/// one, for a plain call (full-length sequences, no dropout, window, score modifiers or
/// deterministic dQ) the tiles of its own that `sm90::backward_plain_config` gives, and for a
/// call on the modifier instance `sm90::backward_mods_config`'s.
fn sm90_backward_tiles(problem: &Problem, d: u32) -> Option<sm90::WgBackwardConfig> {
    let plain = !problem.needs_general() && !problem.options.deterministic;
    sm90::backward_config(d).map(|c| {
        if plain {
            sm90::backward_plain_config(&c, d)
        } else if on_sm90_mods_instance(problem) {
            sm90::backward_mods_config(&c)
        } else {
            c
        }
    })
}

/// The plan of one of the compiled tensor-core instances other than the default (the tuning
/// candidates of `sm80::forward::VARIANTS`, `sm90::VARIANTS`, …), for comparing them. Length
/// masks, dropout and score modifiers run only on the tiles the plan itself gives the call.
pub fn with_tiles(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
    tiles: Tiles,
) -> Result<Plan> {
    let d = tensor_core_head_dims(&problem.shape).map_err(|why| invalid!("{why}"))?;
    // Per family: whether `tiles` is compiled, its head dim, and the head dim of the
    // configuration the family chooses for the call (the one it pads to).
    let (family, candidate) = match tiles {
        Tiles::Sm90Forward(c) => (
            Family::Sm90,
            Candidate::of(c, sm90::config(d), sm90::VARIANTS, |c| c.head_dim),
        ),
        Tiles::Sm80Forward(c) => (
            Family::Sm80,
            Candidate::of(c, sm80::forward::config(d), sm80::forward::VARIANTS, |c| {
                c.head_dim
            }),
        ),
        Tiles::Sm90Backward(c) => (
            Family::Sm90,
            Candidate::of(c, sm90::backward_config(d), sm90::BACKWARD_VARIANTS, |c| {
                c.head_dim
            }),
        ),
        Tiles::Sm80Backward(c) => (
            Family::Sm80,
            Candidate::of(
                c,
                sm80::backward::config(d),
                sm80::backward::VARIANTS,
                |c| c.head_dim,
            ),
        ),
        Tiles::Exact(_) => {
            return Err(invalid!(
                "the exact kernels take explicit block sizes through FlashOptions::block_sizes"
            ));
        }
        Tiles::Decode(_) => {
            return Err(invalid!(
                "the decode family chooses its own tiles (force it with KernelChoice::Only)"
            ));
        }
    };
    let forward_tiles = matches!(tiles, Tiles::Sm90Forward(_) | Tiles::Sm80Forward(_));
    if forward_tiles != (direction == Direction::Forward) {
        return Err(invalid!("{tiles:?} is not a {direction:?} configuration"));
    }
    // The tiles the plan itself gives the call: a plain call's own (`sm90::plain_config`,
    // `sm90::backward_plain_config`), the `wgmma` modifier instances' (`sm90::mods_config`,
    // `sm90::backward_mods_config`).
    let own_tiles = match tiles {
        Tiles::Sm90Forward(c) => sm90_forward_tiles(problem, d) == Some(c),
        Tiles::Sm90Backward(c) => sm90_backward_tiles(problem, d) == Some(c),
        _ => candidate.default,
    };
    if !own_tiles && (!candidate.compiled || candidate.pads_to != Some(candidate.head_dim)) {
        return Err(invalid!("no compiled instance {tiles:?} for head_dim {d}"));
    }
    if problem.needs_general() && !own_tiles {
        return Err(invalid!(
            "length masks, dropout and score modifiers run on the tiles the plan gives the call only, not {tiles:?}"
        ));
    }
    if let Tiles::Sm90Forward(c) = tiles {
        let s = &problem.shape;
        if sm90::plain_only(&c) && !compiled_head_dims(s, &c) {
            return Err(invalid!(
                "{tiles:?} is compiled for head_dim = head_dim_v = {} only, not {} and {}",
                c.head_dim,
                s.head_dim,
                s.head_dim_v
            ));
        }
    }
    admits(device, problem, direction, family)
        .and_then(|()| plan_tiles(device, problem, direction, family, tiles))
        .map_err(|why| invalid!("the {family} kernels cannot run this call: {why}"))
}

/// Whether the call's Q/K and V head dims are both `c`'s compiled one: what the `wgmma`
/// forward's plain instances take (the padded ones take smaller head dims too).
fn compiled_head_dims(s: &AttentionShape, c: &sm90::WgConfig) -> bool {
    (s.head_dim, s.head_dim_v) == (c.head_dim, c.head_dim)
}

/// What [`with_tiles`] checks of explicit tiles against the family's own choice for the call.
struct Candidate {
    compiled: bool,
    head_dim: u32,
    pads_to: Option<u32>,
    default: bool,
}

impl Candidate {
    /// `c` against the family's `chosen` configuration and its compiled `variants`.
    fn of<C: PartialEq + Copy>(
        c: C,
        chosen: Option<C>,
        variants: &[C],
        head_dim: fn(&C) -> u32,
    ) -> Candidate {
        Candidate {
            compiled: variants.contains(&c),
            head_dim: head_dim(&c),
            pads_to: chosen.as_ref().map(head_dim),
            default: chosen == Some(c),
        }
    }
}

/// Why `family` cannot run the call on `device` whatever its tiles, if it cannot.
fn admits(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
    family: Family,
) -> std::result::Result<(), String> {
    match family {
        Family::Exact => Ok(()),
        Family::Decode => unreachable!("the decode family plans itself"),
        Family::Sm90 if !device.wgmma => {
            let (major, minor) = device.compute_capability;
            Err(format!(
                "needs the sm_90a module on a compute capability 9.0 device (this is {major}.{minor}{})",
                if (major, minor) == (9, 0) {
                    " without the sm_90a module"
                } else {
                    ""
                }
            ))
        }
        Family::Sm80 if device.compute_capability.0 < 8 => {
            Err("needs compute capability 8.0 or newer".into())
        }
        Family::Sm80 | Family::Sm90 => tensor_core_admits(problem, direction),
    }
}

fn exact_kind(direction: Direction) -> KernelFamily {
    match direction {
        Direction::Forward => KernelFamily::Forward,
        Direction::Backward => KernelFamily::Backward,
    }
}

/// Entry point, block, grid, shared memory and workspace of `tiles` for the call.
fn plan_tiles(
    device: &DeviceCaps,
    problem: &Problem,
    direction: Direction,
    family: Family,
    tiles: Tiles,
) -> std::result::Result<Plan, String> {
    let (s, dtype, general) = (&problem.shape, problem.dtype, problem.needs_general());
    // The `mma.sync` instances take lengths and dropout apart from the modifiers.
    let lengths_or_dropout = problem.needs_lengths_or_dropout();
    let mods = problem.options.attention.has_score_mods();
    // A window alone over full-length sequences without dropout: the `wgmma` family's `window`
    // instances, which carry neither the modifiers' nor the general options' registers.
    let window_only = problem.window_only();
    let mut tensor_maps = false;
    let mut producer_warpgroup = false;
    let (entry, block_rows, block_keys, threads, shared_bytes) = match tiles {
        Tiles::Exact(b) => {
            let entry = match (direction, problem.options.schedule) {
                (Direction::Forward, schedule) => {
                    instances::exact_forward(dtype, schedule == Schedule::Paper)
                }
                (Direction::Backward, _) => instances::exact_backward(dtype, "kv"),
            };
            let shared = exact_kind(direction).shared_bytes(b, s.head_dim, s.head_dim_v);
            let shared = u32::try_from(shared)
                .map_err(|_| format!("{b:?} needs {shared} bytes of shared memory"))?;
            (entry, b.block_rows, b.block_cols, THREADS, shared)
        }
        Tiles::Sm90Forward(c) if mods => {
            let entry = if window_only {
                instances::sm90_forward_window(dtype, &c)
            } else {
                instances::sm90_forward_mods(dtype, &c)
            };
            tensor_maps = sm90::tma_loads(&c, !window_only, true);
            producer_warpgroup = sm90::warp_specialized(&c, !window_only, true);
            (
                entry,
                c.block_rows(),
                c.block_keys,
                sm90::forward_threads(&c, producer_warpgroup),
                sm90::forward_shared_bytes(&c, tensor_maps, producer_warpgroup),
            )
        }
        Tiles::Sm90Forward(c) => {
            // The defaults' plain instances take their compiled head dim only.
            let padded =
                !general && !compiled_head_dims(s, &c) && sm90::config(c.head_dim) == Some(c);
            let entry = if padded {
                instances::sm90_forward_padded(dtype, &c)
            } else {
                instances::sm90_forward(dtype, &c, general)
            };
            tensor_maps = sm90::tma_loads(&c, general, padded);
            producer_warpgroup = sm90::warp_specialized(&c, general, padded);
            (
                entry,
                c.block_rows(),
                c.block_keys,
                sm90::forward_threads(&c, producer_warpgroup),
                sm90::forward_shared_bytes(&c, tensor_maps, producer_warpgroup),
            )
        }
        Tiles::Sm80Forward(c) => {
            let entry = if mods {
                instances::sm80_forward_mods(dtype, &c, lengths_or_dropout)
            } else {
                instances::sm80_forward(dtype, &c, lengths_or_dropout)
            };
            (
                entry,
                c.block_rows(),
                c.block_keys,
                c.threads(),
                c.shared_bytes(),
            )
        }
        Tiles::Sm90Backward(c) if mods => {
            let entry = if window_only {
                instances::sm90_backward_window(dtype, &c)
            } else {
                instances::sm90_backward_mods(dtype, &c)
            };
            tensor_maps = sm90::tma_loads_backward(&c, !window_only);
            (
                entry,
                c.block_rows(),
                c.block_keys(),
                c.threads(),
                sm90::backward_shared_bytes(&c, tensor_maps),
            )
        }
        Tiles::Sm90Backward(c) => {
            let deterministic = problem.options.deterministic;
            if deterministic && sm90::backward_config(c.head_dim) != Some(c) {
                return Err(format!("{c:?} has no deterministic instance"));
            }
            let entry = instances::sm90_backward(dtype, &c, general, deterministic);
            tensor_maps = sm90::tma_loads_backward(&c, general);
            (
                entry,
                c.block_rows(),
                c.block_keys(),
                c.threads(),
                sm90::backward_shared_bytes(&c, tensor_maps),
            )
        }
        Tiles::Sm80Backward(c) => {
            let deterministic = problem.options.deterministic;
            if deterministic && sm80::backward::config(c.head_dim) != Some(c) {
                return Err(format!("{c:?} has no deterministic instance"));
            }
            let entry = if mods {
                instances::sm80_backward_mods(dtype, &c, lengths_or_dropout)
            } else {
                instances::sm80_backward(dtype, &c, lengths_or_dropout, deterministic)
            };
            (
                entry,
                c.block_rows(),
                c.block_keys(),
                c.threads(),
                c.shared_bytes(),
            )
        }
        Tiles::Decode(_) => unreachable!("the decode family plans itself"),
    };
    if shared_bytes > device.max_shared_per_block {
        return Err(format!(
            "needs {shared_bytes} bytes of shared memory per block, the device allows {}",
            device.max_shared_per_block
        ));
    }
    // The forward's blocks own query rows; the backward's own keys (of each K/V head). The
    // (head, sequence) pairs take y and z, folded past 65,535 of either (`abi::grid`).
    let grid = match direction {
        Direction::Forward => {
            let (y, z) = problem.grid_yz(s.heads_q);
            (problem.max_q_len.div_ceil(block_rows), y, z)
        }
        Direction::Backward => {
            let (y, z) = problem.grid_yz(s.heads_kv);
            (problem.max_k_rows.div_ceil(block_keys), y, z)
        }
    };
    Ok(Plan {
        direction,
        family,
        tiles,
        entry,
        block_rows,
        block_keys,
        grid,
        threads,
        shared_bytes,
        tensor_maps,
        producer_warpgroup,
        workspace: workspace(problem, direction, &tiles),
        not_chosen: Vec::new(),
        staged: Vec::new(),
    })
}

/// What both tensor-core families refuse whatever the device.
fn tensor_core_admits(problem: &Problem, direction: Direction) -> std::result::Result<(), String> {
    let o = &problem.options;
    if problem.dtype == DType::F32 {
        return Err("takes f16 or bf16, not f32".into());
    }
    if o.schedule == Schedule::Paper {
        return Err(
            "runs the row-owned schedule only (the paper's K/V-outer one is exact's)".into(),
        );
    }
    if o.block_sizes.is_some() {
        return Err("has fixed tiles; explicit (B_r, B_c) are the exact kernels'".into());
    }
    if direction == Direction::Backward && o.deterministic && problem.needs_general() {
        return Err(
            "has no deterministic instance with key lengths, packed sequences, dropout, the \
             window or score modifiers"
                .into(),
        );
    }
    if direction == Direction::Backward && preprocess_blocks(&problem.shape) > i32::MAX as u64 {
        return Err(
            "pads each (batch, head) to whole Q blocks: too many padded rows for one grid".into(),
        );
    }
    Ok(())
}

/// Blocks of the tensor-core backward's preprocess: one warp per padded row. Rows of
/// `validate_shape`'s shapes are below 2^31, but padding a tiny `n_q` to 64 rows for each of up to
/// 2^31 (batch, head) pairs is not.
pub(crate) fn preprocess_blocks(s: &AttentionShape) -> u64 {
    let padded = s.batch as u64 * s.heads_q as u64 * n_q_pad(s.n_q) as u64;
    padded.div_ceil(PREPROCESS_WARPS as u64)
}

fn head_dims(name: &str, d: u32) -> String {
    format!(
        "runs {name} a multiple of 8 from 32 to {MAX_TENSOR_CORE_HEAD_DIM} (compiled for 64, \
         128, 192 and 256, the sm90 forward for 96 too, zero-padded in between), not {d}"
    )
}

/// The head dim the tensor-core tiles are chosen by: the wider of Q/K's and V/O's (the
/// narrower one is zero-padded to it), once both are head dims these kernels run.
fn tensor_core_head_dims(s: &AttentionShape) -> std::result::Result<u32, String> {
    for (name, d) in [("head_dim", s.head_dim), ("head_dim_v", s.head_dim_v)] {
        if tensor_core_head_dim(d).is_none() {
            return Err(head_dims(name, d));
        }
    }
    Ok(s.widest_head_dim())
}

/// Device scratch of the call besides its outputs, f32 pieces in launch order.
fn workspace(problem: &Problem, direction: Direction, tiles: &Tiles) -> Vec<(&'static str, u64)> {
    let s = &problem.shape;
    let (q, rows) = (s.q_elems() as u64, s.row_elems() as u64);
    let o = &problem.options;
    let pieces: Vec<(&'static str, u64)> = match (direction, tiles) {
        (Direction::Forward, Tiles::Exact(_)) if o.schedule == Schedule::Paper => {
            vec![
                ("o_state", s.o_elems() as u64),
                ("row_sum", rows),
                ("row_max", rows),
            ]
        }
        (Direction::Forward, _) => vec![],
        // dQ comes from atomics into an f32 accumulator unless the deterministic pass writes it.
        (Direction::Backward, Tiles::Exact(_)) if o.deterministic => vec![("delta", rows)],
        (Direction::Backward, Tiles::Exact(_)) => vec![("delta", rows), ("dq_accum", q)],
        (Direction::Backward, _) => {
            // Rows padded to whole Q blocks, so each block's statistics are whole 16-byte chunks.
            let padded = s.batch as u64 * s.heads_q as u64 * n_q_pad(s.n_q) as u64;
            let mut pieces = vec![("dq_accum", q), ("lse_log2", padded), ("d_sum", padded)];
            if o.deterministic {
                // One u32 per (batch, head, Q block).
                pieces.push(("dq_semaphores", padded / Q_BLOCK as u64));
            }
            pieces
        }
    };
    pieces
        .into_iter()
        .map(|(name, floats)| (name, (4 * floats).next_multiple_of(WORKSPACE_ALIGN)))
        .collect()
}

impl Plan {
    /// Bytes of device scratch the plan needs besides its outputs.
    pub fn workspace_bytes(&self) -> u64 {
        self.workspace.iter().map(|(_, b)| b).sum()
    }

    /// Grid, block and shared memory of the main kernel.
    pub fn launch_config(&self) -> crate::runtime::LaunchConfig {
        crate::runtime::LaunchConfig {
            grid: self.grid,
            block: (self.threads, 1, 1),
            shared_bytes: self.shared_bytes,
        }
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (gx, gy, gz) = self.grid;
        writeln!(f, "direction   {:?}", self.direction)?;
        writeln!(
            f,
            "family      {} ({})",
            self.family,
            self.family.describe()
        )?;
        writeln!(f, "kernel      {}", self.entry)?;
        writeln!(f, "tiles       {:?}", self.tiles)?;
        writeln!(
            f,
            "block       {} query rows x {} keys, {} threads",
            self.block_rows, self.block_keys, self.threads
        )?;
        writeln!(
            f,
            "grid        ({gx}, {gy}, {gz}) = {} blocks",
            gx as u64 * gy as u64 * gz as u64
        )?;
        writeln!(f, "shared      {} bytes per block", self.shared_bytes)?;
        if self.tensor_maps {
            let tiles = match self.direction {
                Direction::Forward => "K and V",
                Direction::Backward => "Q and dO",
            };
            let by = match self.tiles {
                Tiles::Sm90Forward(c) if self.producer_warpgroup => format!(
                    ", issued by a producer warpgroup for {} consumer warpgroups in turns",
                    c.warpgroups
                ),
                _ => String::new(),
            };
            writeln!(f, "loads       {tiles} through tensor maps (TMA){by}")?;
        }
        let pieces: Vec<String> = self
            .workspace
            .iter()
            .map(|(n, b)| format!("{n} {b}"))
            .collect();
        writeln!(
            f,
            "workspace   {} bytes{}",
            self.workspace_bytes(),
            if pieces.is_empty() {
                String::new()
            } else {
                format!(" ({})", pieces.join(", "))
            }
        )?;
        if !self.staged.is_empty() {
            writeln!(
                f,
                "staged      {} (copied: not in place)",
                self.staged.join(", ")
            )?;
        }
        for (i, (family, why)) in self.not_chosen.iter().enumerate() {
            let head = if i == 0 { "not chosen" } else { "" };
            writeln!(f, "{head:<11} {family}: {why}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use attention_kernels::abi::shape::AttentionShape;

    use super::*;
    use crate::flash_options::FlashOptions;
    use crate::options::AttentionOptions;

    fn shape(head_dim: u32) -> AttentionShape {
        AttentionShape::new(2, 100, 70, 4, 2, head_dim)
    }

    fn h200() -> DeviceCaps {
        DeviceCaps::for_arch("sm_90", true).unwrap()
    }

    fn a100() -> DeviceCaps {
        DeviceCaps::for_arch("sm_80", false).unwrap()
    }

    fn select_on(
        device: &DeviceCaps,
        s: AttentionShape,
        dtype: DType,
        o: FlashOptions,
        direction: Direction,
    ) -> Result<Plan> {
        select(device, &Problem::new(&s, dtype, &o).unwrap(), direction)
    }

    #[test]
    fn auto_takes_the_fastest_family_that_can_run_the_call() {
        let (h, a) = (h200(), a100());
        let plain = FlashOptions::default;
        let masked = || FlashOptions::new(AttentionOptions::new().key_lengths(vec![10, 70]));
        for direction in [Direction::Forward, Direction::Backward] {
            let family = |dev, s, dt, o| select_on(dev, s, dt, o, direction).unwrap().family;
            assert_eq!(family(&h, shape(128), DType::Bf16, plain()), Family::Sm90);
            assert_eq!(family(&h, shape(64), DType::F16, masked()), Family::Sm90);
            assert_eq!(family(&a, shape(64), DType::Bf16, plain()), Family::Sm80);
            assert_eq!(family(&a, shape(64), DType::Bf16, masked()), Family::Sm80);
            assert_eq!(family(&h, shape(96), DType::Bf16, plain()), Family::Sm90);
            assert_eq!(family(&h, shape(136), DType::Bf16, plain()), Family::Sm90);
            assert_eq!(family(&h, shape(36), DType::Bf16, plain()), Family::Exact);
            assert_eq!(family(&h, shape(128), DType::F32, plain()), Family::Exact);
            let paper = plain().schedule(Schedule::Paper);
            assert_eq!(family(&h, shape(128), DType::Bf16, paper), Family::Exact);
        }
        let deterministic = plain().deterministic(true);
        let backward = |dev, o| select_on(dev, shape(128), DType::Bf16, o, Direction::Backward);
        let p = backward(&h, deterministic.clone()).unwrap();
        assert_eq!(p.family, Family::Sm90);
        assert_eq!(p.entry, "flash_wgmma_backward_det_bf16_d128_g2");
        assert_eq!(p.workspace.last().unwrap(), &("dq_semaphores", 256));
        let p = backward(&a, deterministic.clone()).unwrap();
        assert_eq!(p.entry, "flash_tc_backward_det_bf16_d128_w4");
        // With dropout only the exact family has a deterministic backward.
        let dropout = FlashOptions::new(AttentionOptions::new().dropout(0.1, 1, 2));
        for dev in [&h, &a] {
            let p = backward(dev, dropout.clone().deterministic(true)).unwrap();
            assert_eq!(p.family, Family::Exact);
            let reason = format!("{:?}", p.not_chosen);
            assert!(reason.contains("no deterministic instance"), "{reason}");
        }
    }

    /// Every multiple of 8 from 32 to 256 runs forward and backward on the next compiled head
    /// dim (64, 128, 192, 256; the `wgmma` forward 96 too, its plain calls 32, 80 and 160, the
    /// plain backward 32, 80, 96 and 160) of each tensor-core family on the H200 and the A100.
    /// Others fall to the exact kernels.
    #[test]
    fn head_dims_pad_to_the_next_compiled_instance() {
        let (h, a) = (h200(), a100());
        for d in (8..=256u32).step_by(8) {
            for direction in [Direction::Forward, Direction::Backward] {
                let padded = (32..=256).contains(&d).then(|| d.next_multiple_of(64));
                for (dev, family) in [(&h, Family::Sm90), (&a, Family::Sm80), (&h, Family::Sm80)] {
                    let o = FlashOptions::default().kernel(KernelChoice::Only(family));
                    let p = select_on(dev, shape(d), DType::Bf16, o, direction);
                    // The `wgmma` forward compiles d = 96 too, its plain calls 32, 80 and 160,
                    // the plain backward 80, 96 and 160 as well.
                    let sm90 = family == Family::Sm90;
                    let backward = direction == Direction::Backward;
                    let padded = padded.map(|pd| match d {
                        32 | 80 | 160 if sm90 && !backward => d,
                        72..=80 if sm90 && backward => 80,
                        72..=96 if sm90 => 96,
                        32 if sm90 => 32,
                        136..=160 if sm90 && backward => 160,
                        _ => pd,
                    });
                    match padded {
                        Some(pd) => {
                            let p = p.unwrap_or_else(|e| panic!("d={d} {family}: {e}"));
                            assert_eq!(p.tiles.compiled_head_dim(), Some(pd), "d={d}");
                            assert!(p.entry.contains(&format!("_d{pd}_")), "{}", p.entry);
                            // The sm90 forward's plain instances take their head dim only.
                            if family == Family::Sm90 && direction == Direction::Forward {
                                assert_eq!(p.entry.contains("_padded_"), d != pd, "{}", p.entry);
                            }
                        }
                        None => assert!(p.is_err(), "d={d} {family} {direction:?}"),
                    }
                    let auto = select_on(
                        dev,
                        shape(d),
                        DType::F16,
                        FlashOptions::default(),
                        direction,
                    );
                    let auto = auto.unwrap().family;
                    let want = match padded {
                        Some(_) if dev.wgmma => Family::Sm90,
                        Some(_) => Family::Sm80,
                        None => Family::Exact,
                    };
                    assert_eq!(auto, want, "d={d} {direction:?}");
                }
            }
        }
        assert_eq!(tensor_core_head_dim(32), Some(64));
        assert_eq!(tensor_core_head_dim(72), Some(128));
        assert_eq!(tensor_core_head_dim(136), Some(192));
        assert_eq!(tensor_core_head_dim(200), Some(256));
        assert_eq!(tensor_core_head_dim(24), None);
        assert_eq!(tensor_core_head_dim(36), None);
    }

    /// The plain `wgmma` forward at exactly d = 80 and 160 runs `sm90::D80` and `sm90::D160`
    /// (warp-specialized, 384 threads, causal or not); 72, 88, 152, 168, a V head dim of its
    /// own, key lengths and a window keep `D96`'s and `D192`'s instances; `with_tiles` takes
    /// the own tiles only where the plan gives them.
    #[test]
    fn plain_forwards_at_d80_and_d160_run_tiles_of_their_own() {
        let h = h200();
        let fwd = Direction::Forward;
        let plan = |s: AttentionShape, o: FlashOptions| select_on(&h, s, DType::Bf16, o, fwd);
        for (d, own, default, entry) in [
            (
                80,
                sm90::D80,
                sm90::D96,
                "flash_wgmma_forward_bf16_d80_g2_k128",
            ),
            (
                160,
                sm90::D160,
                sm90::D192,
                "flash_wgmma_forward_bf16_d160_g2_k64",
            ),
        ] {
            for causal in [false, true] {
                let o = FlashOptions::new(AttentionOptions::new().causal(causal));
                let p = plan(shape(d), o.clone()).unwrap();
                assert_eq!(p.tiles, Tiles::Sm90Forward(own), "d={d} causal={causal}");
                assert_eq!((p.entry.as_str(), p.threads), (entry, 384));
                let problem = Problem::new(&shape(d), DType::Bf16, &o).unwrap();
                for c in [own, default] {
                    let p = with_tiles(&h, &problem, fwd, Tiles::Sm90Forward(c)).unwrap();
                    assert_eq!(p.tiles, Tiles::Sm90Forward(c));
                }
            }
            for (s, o) in [
                (shape(d - 8), FlashOptions::default()),
                (shape(d + 8), FlashOptions::default()),
                (shape(d).with_head_dim_v(d - 16), FlashOptions::default()),
                (
                    shape(d),
                    FlashOptions::new(AttentionOptions::new().key_lengths(vec![50, 70])),
                ),
                (
                    shape(d),
                    FlashOptions::new(AttentionOptions::new().window(16, 0)),
                ),
            ] {
                let p = plan(s, o.clone()).unwrap();
                assert_ne!(p.tiles, Tiles::Sm90Forward(own), "{s:?} {o:?}");
                let Tiles::Sm90Forward(c) = p.tiles else {
                    panic!("{s:?}: {:?}", p.tiles)
                };
                assert_eq!(
                    c.head_dim,
                    sm90::config(s.head_dim.max(s.head_dim_v)).unwrap().head_dim
                );
                let problem = Problem::new(&s, DType::Bf16, &o).unwrap();
                assert!(with_tiles(&h, &problem, fwd, Tiles::Sm90Forward(own)).is_err());
            }
        }
    }

    /// The plain `wgmma` forward at d = 32 runs `sm90::D32` (short or long, causal or not);
    /// key lengths, a window, or a V head dim past 32 keep `D64`'s general, window and padded
    /// instances, and `with_tiles` takes both where the plan gives `D32`.
    #[test]
    fn plain_forwards_at_d32_run_tiles_of_their_own() {
        let h = h200();
        let fwd = Direction::Forward;
        let plan = |s: AttentionShape, o: FlashOptions| select_on(&h, s, DType::Bf16, o, fwd);
        let long = AttentionShape::new(1, sm90::D64_WS_MIN_ROWS, 300, 4, 2, 32);
        for s in [shape(32), long] {
            for causal in [false, true] {
                let o = FlashOptions::new(AttentionOptions::new().causal(causal));
                let p = plan(s, o.clone()).unwrap();
                assert_eq!(
                    p.tiles,
                    Tiles::Sm90Forward(sm90::D32),
                    "{s:?} causal={causal}"
                );
                assert_eq!(p.entry, "flash_wgmma_forward_bf16_d32_g2_k64");
                let problem = Problem::new(&s, DType::Bf16, &o).unwrap();
                for c in [sm90::D32, sm90::D64] {
                    let p = with_tiles(&h, &problem, fwd, Tiles::Sm90Forward(c)).unwrap();
                    assert_eq!(p.tiles, Tiles::Sm90Forward(c));
                }
            }
        }
        for (s, o, kind) in [
            (
                shape(32),
                FlashOptions::new(AttentionOptions::new().key_lengths(vec![50, 70])),
                "_general_",
            ),
            (
                shape(32),
                FlashOptions::new(AttentionOptions::new().window(16, 0)),
                "_window_",
            ),
            (
                shape(32).with_head_dim_v(64),
                FlashOptions::default(),
                "_padded_",
            ),
        ] {
            let p = plan(s, o).unwrap();
            assert_eq!(p.tiles, Tiles::Sm90Forward(sm90::D64), "{s:?}");
            assert!(p.entry.contains(kind), "{}", p.entry);
        }
    }

    /// The plain `wgmma` backward runs tiles of its own at d = 32 (`BACKWARD_D32`), 40–64
    /// (`BACKWARD_D64_TALL`), 72–80 (`BACKWARD_D80`), 88–96 (`BACKWARD_D96`; V's head dim too),
    /// 136–160 (`BACKWARD_D160`) and 168–192 (`BACKWARD_D192_TRANSPOSED`); a window or
    /// deterministic dQ keep the padded defaults, as key lengths do, and `with_tiles` takes both
    /// where the plan gives the own ones.
    #[test]
    fn plain_backwards_run_tiles_of_their_own() {
        let h = h200();
        let bwd = Direction::Backward;
        let plan = |s: AttentionShape, o: FlashOptions| select_on(&h, s, DType::Bf16, o, bwd);
        for (d, d_v, own) in [
            (32, 32, sm90::BACKWARD_D32),
            (64, 64, sm90::BACKWARD_D64_TALL),
            (40, 32, sm90::BACKWARD_D64_TALL),
            (48, 56, sm90::BACKWARD_D64_TALL),
            (72, 72, sm90::BACKWARD_D80),
            (80, 80, sm90::BACKWARD_D80),
            (80, 64, sm90::BACKWARD_D80),
            (96, 80, sm90::BACKWARD_D96),
            (64, 96, sm90::BACKWARD_D96),
            (160, 160, sm90::BACKWARD_D160),
            (136, 128, sm90::BACKWARD_D160),
            (192, 160, sm90::BACKWARD_D192_TRANSPOSED),
            (168, 168, sm90::BACKWARD_D192_TRANSPOSED),
            (128, 192, sm90::BACKWARD_D192_TRANSPOSED),
        ] {
            let s = shape(d).with_head_dim_v(d_v);
            let p = plan(s, FlashOptions::default()).unwrap();
            assert_eq!(p.tiles, Tiles::Sm90Backward(own), "({d}, {d_v})");
            let tall = if own.tall_q_blocks { "_tall" } else { "" };
            assert!(
                p.entry
                    .ends_with(&format!("_d{}_g{}{tall}", own.head_dim, own.warpgroups)),
                "{}",
                p.entry
            );
            let default = sm90::backward_config(d.max(d_v)).unwrap();
            for o in [
                FlashOptions::new(AttentionOptions::new().key_lengths(vec![50, 70])),
                FlashOptions::new(AttentionOptions::new().window(16, 0)),
                FlashOptions::default().deterministic(true),
            ] {
                let p = plan(s, o.clone()).unwrap();
                assert_eq!(p.tiles, Tiles::Sm90Backward(default), "({d}, {d_v}) {o:?}");
            }
            let problem = Problem::new(&s, DType::Bf16, &FlashOptions::default()).unwrap();
            for c in [own, default] {
                let p = with_tiles(&h, &problem, bwd, Tiles::Sm90Backward(c)).unwrap();
                assert_eq!(p.tiles, Tiles::Sm90Backward(c));
            }
        }
        for (d, d_v) in [(104, 104), (96, 128)] {
            let p = plan(shape(d).with_head_dim_v(d_v), FlashOptions::default()).unwrap();
            let default = sm90::backward_config(d.max(d_v)).unwrap();
            assert_eq!(p.tiles, Tiles::Sm90Backward(default), "({d}, {d_v})");
        }
    }

    /// A V head dim of its own runs on the tensor-core instance of the wider head dim (the
    /// `wgmma` forward's padded one; a plain `wgmma` backward up to 160 wide on `BACKWARD_D160`),
    /// forward and backward on both families, and on the exact
    /// kernels with tiles sized for both; the decode family refuses it with the reason, and a
    /// V head dim no tensor-core kernel takes falls to the exact kernels.
    #[test]
    fn a_value_head_dim_of_its_own_runs_on_the_wider_ones_instance() {
        let (h, a) = (h200(), a100());
        for (d, d_v, compiled) in [
            (192, 128, 192),
            (64, 128, 128),
            (128, 64, 128),
            (48, 160, 192),
        ] {
            let s = shape(d).with_head_dim_v(d_v);
            for direction in [Direction::Forward, Direction::Backward] {
                for (dev, family) in [(&h, Family::Sm90), (&a, Family::Sm80)] {
                    let o = FlashOptions::default().kernel(KernelChoice::Only(family));
                    let p = select_on(dev, s, DType::Bf16, o, direction)
                        .unwrap_or_else(|e| panic!("({d}, {d_v}) {family}: {e}"));
                    let plain_d160 = family == Family::Sm90
                        && direction == Direction::Backward
                        && d.max(d_v) <= 160
                        && compiled == 192;
                    let expected = if plain_d160 { 160 } else { compiled };
                    assert_eq!(p.tiles.compiled_head_dim(), Some(expected));
                    if family == Family::Sm90 && direction == Direction::Forward {
                        assert!(p.entry.contains("_padded_"), "{}", p.entry);
                    }
                }
                let auto = select_on(&h, s, DType::Bf16, FlashOptions::default(), direction);
                assert_eq!(auto.unwrap().family, Family::Sm90);
            }
        }
        let s = shape(128).with_head_dim_v(64);
        for direction in [Direction::Forward, Direction::Backward] {
            let p = select_on(&h, s, DType::F32, FlashOptions::default(), direction).unwrap();
            assert_eq!(p.family, Family::Exact);
            let Tiles::Exact(b) = p.tiles else {
                panic!("{p:?}")
            };
            let kind = exact_kind(direction);
            assert_eq!(p.shared_bytes as u64, kind.shared_bytes(b, 128, 64));
            assert!(kind.shared_bytes(b, 128, 64) < kind.shared_bytes(b, 128, 128));
        }
        let decode = FlashOptions::default().kernel(KernelChoice::Only(Family::Decode));
        let one_row = AttentionShape { n_q: 1, ..s };
        let err = select_on(&h, one_row, DType::Bf16, decode, Direction::Forward).unwrap_err();
        assert!(err.to_string().contains("head_dim_v 64 differ"), "{err}");
        let narrow_v = shape(64).with_head_dim_v(20);
        let sm90 = FlashOptions::default().kernel(KernelChoice::Only(Family::Sm90));
        let err = select_on(&h, narrow_v, DType::Bf16, sm90, Direction::Forward).unwrap_err();
        assert!(
            err.to_string().contains("head_dim_v a multiple of 8"),
            "{err}"
        );
        let auto = select_on(
            &h,
            narrow_v,
            DType::Bf16,
            FlashOptions::default(),
            Direction::Forward,
        );
        assert_eq!(auto.unwrap().family, Family::Exact);
    }

    /// `with_tiles` plans a compiled configuration for the head dims it pads, and refuses one
    /// the call's head dim does not pad to (d = 96 runs the `wgmma` forward's d = 96 tiles,
    /// not d = 128's, whose backward it still runs) and a configuration of the other direction;
    /// length masks run on the default tiles, the softcap on the modifier instance's only.
    #[test]
    fn explicit_tiles_are_planned_for_the_head_dims_they_pad() {
        let h = h200();
        let problem = |d: u32, o: FlashOptions| Problem::new(&shape(d), DType::Bf16, &o).unwrap();
        let plain = FlashOptions::default();
        let fwd = Direction::Forward;
        for (d, tiles) in [
            (80, Tiles::Sm90Forward(sm90::D96)),
            (96, Tiles::Sm90Forward(sm90::D96)),
            (128, Tiles::Sm90Forward(sm90::D128)),
            (96, Tiles::Sm80Forward(sm80::forward::D128)),
        ] {
            let p = with_tiles(&h, &problem(d, plain.clone()), fwd, tiles).unwrap();
            assert_eq!(p.tiles, tiles, "d={d}");
        }
        let back = Tiles::Sm90Backward(sm90::BACKWARD_D128);
        assert!(with_tiles(&h, &problem(96, plain.clone()), Direction::Backward, back).is_ok());
        let refused = |d: u32, o: FlashOptions, direction, tiles| {
            with_tiles(&h, &problem(d, o), direction, tiles)
                .unwrap_err()
                .to_string()
        };
        let e = refused(96, plain.clone(), fwd, Tiles::Sm90Forward(sm90::D128));
        assert!(e.contains("no compiled instance"), "{e}");
        let e = refused(64, plain.clone(), fwd, back);
        assert!(e.contains("is not a Forward configuration"), "{e}");
        // Length masks run on the default tiles: d = 96's are D96.
        let masked = FlashOptions::new(AttentionOptions::new().key_lengths(vec![50, 70]));
        let p = with_tiles(&h, &problem(96, masked), fwd, Tiles::Sm90Forward(sm90::D96));
        assert!(p.unwrap().entry.contains("_general_"));
        // The softcap runs on the modifier instance's tiles, d = 96's 64-key blocks, and on no
        // other: D96's 128-key tiles are refused for it.
        let capped = FlashOptions::new(AttentionOptions::new().softcap(30.0));
        let mods = sm90::mods_config(&sm90::D96);
        assert_eq!(mods.block_keys, 64);
        let p = with_tiles(
            &h,
            &problem(96, capped.clone()),
            fwd,
            Tiles::Sm90Forward(mods),
        );
        assert_eq!(p.unwrap().entry, "flash_wgmma_forward_mods_bf16_d96_g2_k64");
        let e = refused(96, capped, fwd, Tiles::Sm90Forward(sm90::D96));
        assert!(
            e.contains("run on the tiles the plan gives the call only"),
            "{e}"
        );
    }

    /// d = 64's plain forward without the causal mask runs warp-specialized on tiles of its
    /// own from `sm90::D64_WS_MIN_ROWS` query rows (`sm90::D64_WS`: three consumer warpgroups
    /// and a producer, 512 threads, 192 rows, 128-key blocks); shorter, causal, padded,
    /// windowed and masked calls, and `with_tiles(D64)`, keep `D64`'s two warpgroups without a
    /// producer; `D64_WS` takes head dim 64 only.
    #[test]
    fn the_long_d64_plain_forward_runs_warp_specialized_on_tiles_of_its_own() {
        let h = h200();
        let fwd = Direction::Forward;
        let long = |d: u32| AttentionShape::new(1, sm90::D64_WS_MIN_ROWS, 300, 4, 2, d);
        let plan = |s: AttentionShape, a: AttentionOptions| {
            select_on(&h, s, DType::Bf16, FlashOptions::new(a), fwd).unwrap()
        };
        let p = plan(long(64), AttentionOptions::new());
        assert_eq!(p.tiles, Tiles::Sm90Forward(sm90::D64_WS));
        assert_eq!(p.entry, "flash_wgmma_forward_bf16_d64_g3_k128");
        assert_eq!((p.threads, p.block_rows, p.block_keys), (512, 192, 128));
        assert_eq!(p.grid.0, sm90::D64_WS_MIN_ROWS.div_ceil(192));
        assert!(p.producer_warpgroup && p.tensor_maps);
        assert!(p.to_string().contains("for 3 consumer warpgroups"), "{p}");
        let shorter = AttentionShape::new(1, sm90::D64_WS_MIN_ROWS - 1, 300, 4, 2, 64);
        for (s, a, kind) in [
            (shorter, AttentionOptions::new(), ""),
            (long(64), AttentionOptions::new().causal(true), ""),
            (long(48), AttentionOptions::new(), "_padded_"),
            (
                long(64).with_head_dim_v(48),
                AttentionOptions::new(),
                "_padded_",
            ),
            (
                long(64),
                AttentionOptions::new().key_lengths(vec![50]),
                "_general_",
            ),
            (long(64), AttentionOptions::new().window(16, 0), "_window_"),
        ] {
            let p = plan(s, a);
            assert_eq!(p.tiles, Tiles::Sm90Forward(sm90::D64), "{}", p.entry);
            assert!(
                p.entry.contains(kind) && p.entry.ends_with("_d64_g2_k64"),
                "{}",
                p.entry
            );
            assert!(!p.producer_warpgroup && p.threads == 256, "{}", p.entry);
        }
        let problem = |d| Problem::new(&long(d), DType::Bf16, &FlashOptions::default()).unwrap();
        let p = with_tiles(&h, &problem(64), fwd, Tiles::Sm90Forward(sm90::D64)).unwrap();
        assert_eq!(p.entry, "flash_wgmma_forward_bf16_d64_g2_k64");
        assert!(!p.producer_warpgroup && p.threads == 256);
        let ws = Tiles::Sm90Forward(sm90::D64_WS);
        let short = Problem::new(&shape(64), DType::Bf16, &FlashOptions::default()).unwrap();
        assert!(with_tiles(&h, &short, fwd, ws).unwrap().producer_warpgroup);
        let e = with_tiles(&h, &problem(48), fwd, ws)
            .unwrap_err()
            .to_string();
        assert!(e.contains("head_dim = head_dim_v = 64 only"), "{e}");
    }

    #[test]
    fn a_forced_family_that_cannot_run_the_call_is_refused_with_the_reason() {
        let (h, a) = (h200(), a100());
        let only = |f| FlashOptions::default().kernel(KernelChoice::Only(f));
        let refusal = |dev, s, dt, o| {
            select_on(dev, s, dt, o, Direction::Forward)
                .unwrap_err()
                .to_string()
        };
        let e = refusal(&a, shape(128), DType::Bf16, only(Family::Sm90));
        assert!(e.contains("sm90") && e.contains("sm_90a"), "{e}");
        let e = refusal(&h, shape(44), DType::Bf16, only(Family::Sm90));
        assert!(e.contains("multiple of 8") && e.contains("not 44"), "{e}");
        let e = select_on(
            &h,
            shape(44),
            DType::Bf16,
            only(Family::Sm80),
            Direction::Backward,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("to 256") && e.contains("not 44"), "{e}");
        let e = refusal(&h, shape(64), DType::F32, only(Family::Sm90));
        assert!(e.contains("not f32"), "{e}");
        let dropout = FlashOptions::new(AttentionOptions::new().dropout(0.1, 1, 0));
        let e = select_on(
            &a,
            shape(64),
            DType::F16,
            dropout
                .deterministic(true)
                .kernel(KernelChoice::Only(Family::Sm80)),
            Direction::Backward,
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("sm80") && e.contains("no deterministic instance") && e.contains("dropout"),
            "{e}"
        );
        let p = select_on(
            &h,
            shape(64),
            DType::F16,
            only(Family::Exact),
            Direction::Forward,
        )
        .unwrap();
        assert_eq!(p.family, Family::Exact);
        assert!(
            p.not_chosen
                .iter()
                .filter(|(f, _)| *f != Family::Decode)
                .all(|(_, why)| why.contains("--kernel exact"))
        );
    }

    /// Windows and score modifiers run on the tensor-core families' `mods` instances (both
    /// directions), with length masks too (`mma.sync`: its `general_mods` ones); a window alone
    /// over full-length sequences on the `wgmma` family's `window` ones, on the default tiles
    /// (the `wgmma` forward's `mods` on shorter key blocks, `sm90::mods_config`).
    #[test]
    fn score_modifiers_route_to_the_mods_instances() {
        let (h, a) = (h200(), a100());
        for direction in [Direction::Forward, Direction::Backward] {
            let window = AttentionOptions::new().window(128, 0);
            let o = |options: AttentionOptions| FlashOptions::new(options);
            let p = select_on(&h, shape(128), DType::Bf16, o(window.clone()), direction);
            let want = match direction {
                Direction::Forward => "flash_wgmma_forward_window_bf16_d128_g2_k128",
                Direction::Backward => "flash_wgmma_backward_window_bf16_d128_g2",
            };
            assert_eq!(p.unwrap().entry, want);
            for other in [
                window.clone().softcap(30.0),
                window.clone().key_lengths(vec![5, 70]),
                window.clone().dropout(0.1, 7, 0),
            ] {
                let p = select_on(&h, shape(128), DType::Bf16, o(other), direction);
                // The forward's mods instance runs `sm90::mods_config`'s 64-key blocks, the
                // backward's `sm90::backward_mods_config`'s sliced tiles.
                let mods = match direction {
                    Direction::Forward => {
                        want.replace("_window_", "_mods_").replace("_k128", "_k64")
                    }
                    Direction::Backward => want.replace("_window_", "_mods_") + "_sliced",
                };
                assert_eq!(p.unwrap().entry, mods);
            }
        }
        let mods = [
            AttentionOptions::new().window(128, 0),
            AttentionOptions::new().softcap(30.0),
            AttentionOptions::new().alibi_slopes(vec![0.5, 0.25, 0.125, 0.0625]),
            AttentionOptions::new().sinks(vec![0.0; 4]),
        ];
        for options in mods {
            for direction in [Direction::Forward, Direction::Backward] {
                let o = || FlashOptions::new(options.clone());
                let p = select_on(&h, shape(128), DType::Bf16, o(), direction).unwrap();
                assert_eq!(p.family, Family::Sm90);
                let window_only = options.has_score_mods() && !options.modifies_scores();
                let kind = if window_only { "_window_" } else { "_mods_" };
                assert!(p.entry.contains(kind), "{}", p.entry);
                let p = select_on(&a, shape(64), DType::Bf16, o(), direction).unwrap();
                let sm80 = select_on(
                    &h,
                    shape(64),
                    DType::Bf16,
                    o().kernel(KernelChoice::Only(Family::Sm80)),
                    direction,
                );
                let want = match direction {
                    Direction::Forward => "flash_tc_forward_mods_bf16_d64_w4_k64",
                    Direction::Backward => "flash_tc_backward_mods_bf16_d64_w4",
                };
                assert_eq!(p.entry, want);
                assert_eq!(sm80.unwrap().entry, want);
                let lengths = options.clone().key_lengths(vec![5, 70]);
                let p = select_on(
                    &a,
                    shape(64),
                    DType::Bf16,
                    FlashOptions::new(lengths),
                    direction,
                );
                assert_eq!(p.unwrap().entry, want.replace("_mods_", "_general_mods_"));
            }
        }
    }

    /// The `wgmma` forward's modifier instance runs `sm90::mods_config`'s tiles at every head
    /// dim: 64-key blocks where the defaults take 128 (d = 72 to 128), the defaults' elsewhere;
    /// the general and window instances keep the defaults' tiles.
    #[test]
    fn the_modifier_forward_runs_64_key_blocks() {
        let h = h200();
        let fwd = Direction::Forward;
        let plan = |d: u32, a: AttentionOptions| {
            select_on(&h, shape(d), DType::Bf16, FlashOptions::new(a), fwd).unwrap()
        };
        for d in (32..=256).step_by(8) {
            let default = sm90::config(d).unwrap();
            let mods = [
                AttentionOptions::new().softcap(30.0),
                AttentionOptions::new().alibi_slopes(vec![0.5; 4]),
                AttentionOptions::new().sinks(vec![0.0; 4]),
                AttentionOptions::new()
                    .window(64, 0)
                    .key_lengths(vec![5, 70]),
            ];
            for a in mods {
                let p = plan(d, a);
                let keys = if (72..=128).contains(&d) {
                    64
                } else {
                    default.block_keys
                };
                let c = sm90::WgConfig {
                    block_keys: keys,
                    ..default
                };
                assert_eq!(p.tiles, Tiles::Sm90Forward(c), "d={d}");
                assert!(p.entry.contains("_mods_") && p.entry.ends_with(&format!("_k{keys}")));
                assert_eq!(p.block_keys, keys);
            }
            let others = [
                AttentionOptions::new().window(64, 0),
                AttentionOptions::new().key_lengths(vec![5, 70]),
                AttentionOptions::new().dropout(0.1, 7, 0),
            ];
            for a in others {
                assert_eq!(plan(d, a).tiles, Tiles::Sm90Forward(default), "d={d}");
            }
        }
    }

    /// The `wgmma` backward's modifier instance runs `sm90::backward_mods_config`'s tiles: sliced
    /// where the default is d = 128's unsliced one (head dims 72 to 128: 64 keys a block, both
    /// warpgroups on them, a 64-column half of the head dim each), the default elsewhere; the
    /// general, window and deterministic instances keep the default.
    #[test]
    fn the_modifier_backward_runs_sliced_at_d128() {
        let h = h200();
        let bwd = Direction::Backward;
        let plan = |d: u32, o: FlashOptions| select_on(&h, shape(d), DType::Bf16, o, bwd).unwrap();
        for d in (32..=256).step_by(8) {
            let default = sm90::backward_config(d).unwrap();
            let split = default == sm90::BACKWARD_D128;
            let want = sm90::WgBackwardConfig {
                split_head_dim: split,
                ..default
            };
            for a in [
                AttentionOptions::new().softcap(30.0),
                AttentionOptions::new().alibi_slopes(vec![0.5; 4]),
                AttentionOptions::new().window(64, 0).dropout(0.1, 7, 0),
            ] {
                let p = plan(d, FlashOptions::new(a));
                assert!(p.entry.contains("_mods_"), "{}", p.entry);
                assert_eq!(p.tiles, Tiles::Sm90Backward(want), "d={d}");
                assert_eq!(p.entry.ends_with("_sliced"), split, "{}", p.entry);
                if split {
                    assert!(want.sliced() && want.block_keys() == 64 && want.tile_cols() == 128);
                    assert_eq!(p.block_keys, 64);
                }
            }
            for o in [
                FlashOptions::new(AttentionOptions::new().key_lengths(vec![5, 70])),
                FlashOptions::new(AttentionOptions::new().dropout(0.1, 7, 0)),
                FlashOptions::new(AttentionOptions::new().window(64, 0)),
                FlashOptions::default().deterministic(true),
            ] {
                let p = plan(d, o);
                assert_eq!(p.tiles, Tiles::Sm90Backward(default), "d={d}");
                assert!(!p.entry.ends_with("_sliced"), "{}", p.entry);
            }
        }
    }

    /// Key lengths, packed sequences and dropout run on both tensor-core families' general
    /// instances, in both directions; the grid covers the widest packed sequence.
    #[test]
    fn lengths_and_dropout_route_to_the_general_instances() {
        let (h, a) = (h200(), a100());
        let packed = AttentionShape {
            batch: 1,
            ..shape(64)
        };
        let general = [
            (shape(64), AttentionOptions::new().key_lengths(vec![0, 70])),
            (
                packed,
                AttentionOptions::new().packed(vec![0, 30, 100], vec![0, 60, 70]),
            ),
            (
                shape(64),
                AttentionOptions::new().dropout(0.2, 7, 3).causal(true),
            ),
        ];
        for (s, options) in general {
            let o = || FlashOptions::new(options.clone());
            let problem = Problem::new(&s, DType::F16, &o()).unwrap();
            for direction in [Direction::Forward, Direction::Backward] {
                let wide = AttentionShape {
                    head_dim: 128,
                    head_dim_v: 128,
                    ..s
                };
                let p = select_on(&h, wide, DType::F16, o(), direction).unwrap();
                assert_eq!(p.family, Family::Sm90);
                assert!(p.entry.contains("_general_"), "{}", p.entry);
                let (want, grid) = match direction {
                    Direction::Forward => (
                        "flash_tc_forward_general_f16_d64_w4_k64",
                        (problem.max_q_len.div_ceil(64), 4, problem.sequences),
                    ),
                    Direction::Backward => (
                        "flash_tc_backward_general_f16_d64_w4",
                        (problem.max_k_rows.div_ceil(64), 2, problem.sequences),
                    ),
                };
                let only = o().kernel(KernelChoice::Only(Family::Sm80));
                for (dev, o) in [(&a, o()), (&h, only)] {
                    let p = select_on(dev, s, DType::F16, o, direction).unwrap();
                    assert_eq!((p.family, p.entry.as_str()), (Family::Sm80, want));
                    assert_eq!(p.grid, grid, "{options:?} {direction:?}");
                }
            }
        }
    }

    #[test]
    fn plans_carry_the_launch_and_the_workspace() {
        let (h, a) = (h200(), a100());
        let p = select_on(
            &h,
            shape(128),
            DType::Bf16,
            FlashOptions::default(),
            Direction::Forward,
        )
        .unwrap();
        assert_eq!(p.entry, "flash_wgmma_forward_bf16_d128_g2_k128");
        assert_eq!(p.grid, (1, 4, 2));
        assert_eq!(p.workspace_bytes(), 0);
        assert_eq!(p.not_chosen.len(), 3);
        let b = select_on(
            &h,
            shape(128),
            DType::Bf16,
            FlashOptions::default(),
            Direction::Backward,
        )
        .unwrap();
        // dQ accumulator (f32, Q's layout) and two f32 rows per (batch, head) padded to 128.
        let rows = 2 * 4 * 128 * 4;
        assert_eq!(
            b.workspace,
            vec![
                ("dq_accum", 2 * 100 * 4 * 128 * 4),
                ("lse_log2", rows),
                ("d_sum", rows)
            ]
        );
        assert_eq!(b.grid, (1, 2, 2));
        let exact = FlashOptions::default().kernel(KernelChoice::Only(Family::Exact));
        let e = select_on(&a, shape(64), DType::F32, exact, Direction::Backward).unwrap();
        assert_eq!(
            e.workspace.iter().map(|p| p.0).collect::<Vec<_>>(),
            ["delta", "dq_accum"]
        );
        assert!(e.shared_bytes <= 163 * 1024);
    }

    #[test]
    fn folded_grids_are_the_plans_grid() {
        // 70,000 sequences and 70,000 K/V heads: y and z fold (`abi::grid`), the plan says so.
        let many = AttentionShape {
            batch: 70_000,
            n_q: 5,
            n_k: 9,
            heads_q: 2,
            heads_kv: 1,
            head_dim: 64,
            head_dim_v: 64,
        };
        let plan = |s, d| select_on(&h200(), s, DType::Bf16, FlashOptions::default(), d).unwrap();
        assert_eq!(plan(many, Direction::Forward).grid, (1, 65_535, 3));
        assert_eq!(plan(many, Direction::Backward).grid, (1, 65_535, 2));
        let heads = AttentionShape {
            batch: 1,
            heads_q: 70_000,
            heads_kv: 70_000,
            ..many
        };
        assert_eq!(plan(heads, Direction::Backward).grid, (1, 65_535, 2));
    }

    #[test]
    fn tensor_core_backwards_refuse_a_preprocess_grid_past_the_hardware() {
        // 2^30 (batch, head) pairs of one row each: 2^31 rows is over the bound, 2^30 rows is
        // not, but padding each pair to a 64-row Q block gives 2^36 padded rows.
        let tiny = AttentionShape {
            batch: 1 << 20,
            n_q: 1,
            n_k: 1,
            heads_q: 1 << 10,
            heads_kv: 1 << 10,
            head_dim: 64,
            head_dim_v: 64,
        };
        let b = select_on(
            &h200(),
            tiny,
            DType::Bf16,
            FlashOptions::default(),
            Direction::Backward,
        )
        .unwrap();
        assert_eq!(b.family, Family::Exact);
        let reason = format!("{:?}", b.not_chosen);
        assert!(reason.contains("padded rows"), "{reason}");
        let f = select_on(
            &h200(),
            tiny,
            DType::Bf16,
            FlashOptions::default(),
            Direction::Forward,
        )
        .unwrap();
        assert_eq!(f.family, Family::Sm90);
    }
}
