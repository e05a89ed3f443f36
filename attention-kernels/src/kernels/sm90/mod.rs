//! FlashAttention forward and backward on Hopper's warpgroup tensor cores (`wgmma`, sm_90a): tile
//! configurations shared by the host launchers and the device kernels. The backward's main kernel
//! is the only new one: it runs between `sm80::backward`'s preprocess and dQ conversion, on the
//! same workspace.
//!
//! These kernels exist only in the second PTX module that `build.rs` compiles for `sm_90a` (with
//! `--cfg flash_attn_sm90a`); the host loads that module on compute capability 9.0 devices and
//! uses the `mma.sync` kernels of `sm80` everywhere else.

#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
mod backward;
#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
mod backward_transposed;
#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
mod forward;
#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
mod forward_fp8;
mod launch_bounds;

pub use launch_bounds::{LAUNCH_BOUNDS, TUNING_LAUNCH_BOUNDS};

use crate::attn::backward::{Q_BLOCK, TALL_Q_BLOCK};
use crate::kernels::BACKWARD_SLICE_COLS;

/// Tiles of one kernel instance: `warpgroups` groups of 4 warps, each owning 64 query rows, and
/// K/V blocks of `block_keys` keys in two shared stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgConfig {
    pub head_dim: u32,
    pub warpgroups: u32,
    pub block_keys: u32,
}

impl WgConfig {
    /// Query rows per thread block.
    pub const fn block_rows(&self) -> u32 {
        64 * self.warpgroups
    }
    pub const fn threads(&self) -> u32 {
        128 * self.warpgroups
    }
    /// Columns of the shared tiles: whole 64-column panels (128-byte swizzle rows), zeros past
    /// the head dim (d = 96 fills three quarters of two).
    pub const fn tile_cols(&self) -> u32 {
        self.head_dim.next_multiple_of(64)
    }
    /// The Q tile plus two stages each of K and V, 16-bit elements.
    pub const fn shared_bytes(&self) -> u32 {
        (self.block_rows() + 4 * self.block_keys) * self.tile_cols() * 2
    }
}

/// d = 64 (and 32–56 padded to it): two warpgroups, 64-key blocks: 48 KiB of shared memory and
/// 121 registers, two blocks (16 warps) per SM; measured 17–29% faster than 128-key blocks on
/// the H200, which hold 166 registers and so one block per SM (reports/PERF_LOG.md). Its long
/// plain calls without the causal mask run [`D64_WS`] ([`plain_config`]).
pub const D64: WgConfig = WgConfig {
    head_dim: 64,
    warpgroups: 2,
    block_keys: 64,
};
/// d = 32, plain calls only ([`plain_config`]): [`D64`]'s tiles (one 64-column panel, zeros
/// past 32, never read) with half of its tensor-core work: `Q·Kᵀ` in 2 k-steps, `P·V`
/// `m64n32k16`; two blocks per SM as [`D64`], no producer.
pub const D32: WgConfig = WgConfig {
    head_dim: 32,
    warpgroups: 2,
    block_keys: 64,
};
/// d = 64's plain instance for long sequences without the causal mask ([`plain_config`]):
/// warp-specialized, FlashAttention-3's tiles, three consumer warpgroups of 64 rows beside the
/// producer and 128-key blocks: 88 KiB of shared memory, one block of 16 warps per SM. Its
/// consumers spill 64 bytes at the 160 registers three of them can have, and it still ran 11%
/// faster than [`D64`] at N = 4096; at N = 1024, and causal at N = 4096, it did not
/// (reports/PERF_LOG.md).
pub const D64_WS: WgConfig = WgConfig {
    head_dim: 64,
    warpgroups: 3,
    block_keys: 128,
};

/// The query rows from which [`plain_config`] takes [`D64_WS`].
pub const D64_WS_MIN_ROWS: u32 = 4096;
/// d = 96 (and 72–88 padded to it): d = 128's tiles and shared memory (160 KiB, 128-key
/// blocks) with three quarters of its tensor-core work: 6 k-steps of `Q·Kᵀ` and a 96-column
/// `P·V` (`m64n96k16`).
pub const D96: WgConfig = WgConfig {
    head_dim: 96,
    warpgroups: 2,
    block_keys: 128,
};
/// d = 80's plain calls ([`plain_config`]; Q/K and V head dims both 80): [`D96`]'s tiles (two
/// 64-column panels, zeros past 80) with five sixths of its tensor-core work, 5 k-steps of
/// `Q·Kᵀ` and an 80-column `P·V` (`m64n80k16`), warp-specialized as the defaults' plain instances
/// are; 72, 88 and mixed head dims run [`D96`]'s padded instance.
pub const D80: WgConfig = WgConfig {
    head_dim: 80,
    warpgroups: 2,
    block_keys: 128,
};
/// d = 128: 160 KiB of shared memory, 175 registers, one block of 8 warps per SM; 13% faster
/// than 64-key blocks (two blocks per SM) on the H200.
pub const D128: WgConfig = WgConfig {
    head_dim: 128,
    warpgroups: 2,
    block_keys: 128,
};
/// d = 192: two warpgroups of 64 rows as FlashAttention-3 (which takes 112 keys; our score
/// accumulators come in 32, 64 or 128 keys), 64-key blocks: 144 KiB of shared memory, O 96
/// registers per thread beside 32 of scores.
pub const D192: WgConfig = WgConfig {
    head_dim: 192,
    warpgroups: 2,
    block_keys: 64,
};
/// d = 160's plain calls ([`plain_config`]; both head dims 160): [`D192`]'s tiles (three
/// panels, zeros past 160) with five sixths of its tensor-core work, 10 k-steps of `Q·Kᵀ` and a
/// 160-column `P·V` (`m64n160k16`), warp-specialized; 136–152, 168–184 and mixed head dims run
/// [`D192`]'s padded instance.
pub const D160: WgConfig = WgConfig {
    head_dim: 160,
    warpgroups: 2,
    block_keys: 64,
};
/// d = 256: 128 rows × 64 keys (FlashAttention-3 takes 80 keys): 192 KiB of shared memory, one
/// block per SM; O 128 registers per thread beside 32 of scores, within the 240 a consumer
/// thread of the warp-specialized plain instance has.
pub const D256: WgConfig = WgConfig {
    head_dim: 256,
    warpgroups: 2,
    block_keys: 64,
};

/// Every configuration compiled into the sm_90a PTX: the defaults, and with the `tuning` feature
/// the candidates they were measured against (compared by the timing examples).
pub const VARIANTS: &[WgConfig] = if cfg!(feature = "tuning") {
    &[
        D32,
        D64,
        D64_WS,
        D96,
        D128,
        D192,
        D256,
        D80,
        D160,
        WgConfig {
            head_dim: 128,
            warpgroups: 2,
            block_keys: 64,
        },
        PLAIN_CANDIDATES[0],
        PLAIN_CANDIDATES[1],
        PLAIN_CANDIDATES[2],
    ]
} else {
    &[D32, D64, D64_WS, D96, D128, D192, D256, D80, D160]
};

/// The tuning candidates compiled as warp-specialized plain instances only (their head dim,
/// full-length sequences, no dropout): against [`D64_WS`], two consumer warpgroups with 128-key
/// blocks and three with 64-key blocks; against [`D128`], three consumer warpgroups with 64-key
/// blocks (each consumer's score block half as long, so a third one's softmax fits beside two,
/// in the 160 registers three consumers can have).
const PLAIN_CANDIDATES: [WgConfig; 3] = [
    WgConfig {
        head_dim: 64,
        warpgroups: 2,
        block_keys: 128,
    },
    WgConfig {
        head_dim: 64,
        warpgroups: 3,
        block_keys: 64,
    },
    WgConfig {
        head_dim: 128,
        warpgroups: 3,
        block_keys: 64,
    },
];

/// The default forward configuration for a head dimension (padded to its compiled one:
/// [`super::tensor_core_head_dim`]'s, but 72–96 to [`D96`]), `None` where no `wgmma` kernel
/// runs it.
pub const fn config(head_dim: u32) -> Option<WgConfig> {
    match super::tensor_core_head_dim(head_dim) {
        Some(64) => Some(D64),
        Some(128) if head_dim <= 96 => Some(D96),
        Some(128) => Some(D128),
        Some(192) => Some(D192),
        Some(256) => Some(D256),
        _ => None,
    }
}

/// The configuration whose plain instance runs the calls of default `c` over full-length
/// sequences without dropout, window or score modifiers, `q_len` query rows each, Q/K and V
/// head dims `head_dims`: [`D32`] for [`D64`] at 32; [`D64_WS`] for [`D64`] at its compiled
/// head dim without the causal mask from [`D64_WS_MIN_ROWS`] rows; [`D80`] and [`D160`] for
/// [`D96`] and [`D192`] at exactly 80 and 160; otherwise `c`.
pub const fn plain_config(
    c: &WgConfig,
    causal: bool,
    q_len: u32,
    head_dims: (u32, u32),
) -> WgConfig {
    let compiled = head_dims.0 == c.head_dim && head_dims.1 == c.head_dim;
    if same(c, &D64) && head_dims.0 <= D32.head_dim && head_dims.1 <= D32.head_dim {
        D32
    } else if same(c, &D64) && compiled && !causal && q_len >= D64_WS_MIN_ROWS {
        D64_WS
    } else if same(c, &D96) && head_dims.0 == D80.head_dim && head_dims.1 == D80.head_dim {
        D80
    } else if same(c, &D192) && head_dims.0 == D160.head_dim && head_dims.1 == D160.head_dim {
        D160
    } else {
        *c
    }
}

/// The tiles of default `c`'s modifier instance (softcap, ALiBi, sinks, or the window with key
/// lengths, packed sequences or dropout): `c`'s with 64-key blocks where `c` takes 128 (d = 96
/// and 128), whose scores and P then take half the registers beside O and the modifiers' own (on
/// `c`'s tiles the instance spilled inside its key loop); `c`'s elsewhere. The general and window
/// instances keep `c`'s tiles.
pub const fn mods_config(c: &WgConfig) -> WgConfig {
    let block_keys = if c.block_keys > 64 { 64 } else { c.block_keys };
    WgConfig { block_keys, ..*c }
}

/// Whether `c` is compiled as a warp-specialized plain instance only, for its head dim and no
/// options: [`D64_WS`], [`D80`], [`D160`], or a tuning candidate.
pub const fn plain_only(c: &WgConfig) -> bool {
    if same(c, &D64_WS) || same(c, &D80) || same(c, &D160) {
        return true;
    }
    let mut i = 0;
    while cfg!(feature = "tuning") && i < PLAIN_CANDIDATES.len() {
        if same(c, &PLAIN_CANDIDATES[i]) {
            return true;
        }
        i += 1;
    }
    false
}

const fn same(a: &WgConfig, b: &WgConfig) -> bool {
    a.head_dim == b.head_dim && a.warpgroups == b.warpgroups && a.block_keys == b.block_keys
}

/// Whether the forward instance of `c` for full-length sequences without dropout (`general`
/// false: the plain, padded and window instances; `padded`: the padded and window ones) loads K
/// and V with the tensor memory accelerator, taking `abi::params::TmaForwardParams`: up to
/// d = 192, and d = 256's plain instance, which is [`warp_specialized`] (at d = 256 the
/// barriers' registers made the padded and window instances spill, without a producer's
/// registers to move to them).
pub const fn tma_loads(c: &WgConfig, general: bool, padded: bool) -> bool {
    !general && (c.head_dim <= 192 || !padded)
}

/// Whether the forward instance of `c` (`general` as [`tma_loads`]; `padded`: an instance that
/// takes smaller head dims than its tiles', which the window instances are too) is
/// warp-specialized: a producer warpgroup issues the accelerator's loads of K and V, and the
/// consumer warpgroups take turns at the tensor cores (round robin), each releasing a stage
/// once its products have read it. The defaults' plain instances from d = 96 to 256 and the
/// plain-only ones of d = 64 ([`plain_only`]), which run one block per SM, so the producer's
/// registers come from the consumers' headroom (`setmaxnreg`: 24 for the producer, which only
/// issues copies, and 240 for each thread of two consumer warpgroups; 32 and 160 with three).
/// The padded and window instances keep two warpgroups and no producer (they spilled at 232
/// registers).
pub const fn warp_specialized(c: &WgConfig, general: bool, padded: bool) -> bool {
    let default = match config(c.head_dim) {
        Some(d) => same(&d, c),
        None => false,
    };
    tma_loads(c, general, padded) && !padded && ((default && c.head_dim >= 96) || plain_only(c))
}

/// Threads per block of a forward instance: the consumer warpgroups, and a producer warpgroup
/// where the instance is [`warp_specialized`].
pub const fn forward_threads(c: &WgConfig, warp_specialized: bool) -> u32 {
    c.threads() + if warp_specialized { 128 } else { 0 }
}

/// 8-byte slots after the tiles of a forward instance: with the accelerator's loads a barrier
/// per stage of K and of V (the stage's data has landed); warp-specialized, also a barrier per
/// stage that the consumers' releases complete.
pub const fn forward_barrier_slots(tma: bool, warp_specialized: bool) -> u32 {
    if warp_specialized {
        8
    } else if tma {
        4
    } else {
        0
    }
}

/// Bytes of one `mbarrier` slot in shared memory.
pub const BARRIER_BYTES: u32 = 8;

/// Bytes of shared memory an instance takes: its tiles and its barrier slots.
pub const fn forward_shared_bytes(c: &WgConfig, tma: bool, warp_specialized: bool) -> u32 {
    c.shared_bytes() + BARRIER_BYTES * forward_barrier_slots(tma, warp_specialized)
}

/// Tiles of the FP8 (e4m3) forward (`forward_fp8`): `warpgroups` consumer groups of 64 query
/// rows beside a producer warpgroup, K/V blocks of `block_keys` keys, rows of `head_dim` bytes
/// (one 128-byte swizzle row at d = 128).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fp8Config {
    pub head_dim: u32,
    pub warpgroups: u32,
    pub block_keys: u32,
}

impl Fp8Config {
    pub const fn block_rows(&self) -> u32 {
        64 * self.warpgroups
    }
    pub const fn consumer_threads(&self) -> u32 {
        128 * self.warpgroups
    }
    /// The consumers and the producer warpgroup.
    pub const fn threads(&self) -> u32 {
        self.consumer_threads() + 128
    }
    /// Bytes of one tile: every tile (Q, a K, V or transposed V stage) is 128 rows of 128 bytes.
    pub const fn tile_bytes(&self) -> u32 {
        assert!(self.block_rows() == 128 && self.block_keys == 128 && self.head_dim == 128);
        128 * 128
    }
    /// Q, two stages each of K, V as it lands and V transposed, then ten barriers (a stage's
    /// K landed and released, V landed, V transposed and released) and the word that flags a
    /// NaN of V under the causal diagonal.
    pub const fn shared_bytes(&self) -> u32 {
        7 * self.tile_bytes() + 11 * BARRIER_BYTES
    }
}

/// d = 128: two consumer warpgroups (128 query rows), 128-key blocks: 112 KiB of shared memory,
/// one block of 12 warps per SM, as the bf16 [`D128`].
pub const FP8_D128: Fp8Config = Fp8Config {
    head_dim: 128,
    warpgroups: 2,
    block_keys: 128,
};

/// The FP8 forward's configuration for a head dim: d = 128 only (smaller ones would need
/// another swizzle than 128-byte rows).
pub const fn fp8_config(head_dim: u32) -> Option<Fp8Config> {
    if head_dim == 128 {
        Some(FP8_D128)
    } else {
        None
    }
}

/// Whether the backward's main kernel of `c` for full-length sequences without dropout
/// (`general` false: the plain, window and deterministic instances) loads each step's Q and dO
/// with the tensor memory accelerator, taking `abi::params::TmaBackwardParams`.
pub const fn tma_loads_backward(_c: &WgBackwardConfig, general: bool) -> bool {
    !general
}

/// Whether the backward's main kernel of `c` adds dQ with the tensor memory accelerator's bulk
/// reductions (`cp.reduce.async.bulk.tensor`, through `abi::params::TmaBackwardParams::dq_map`)
/// instead of a `red.global` per fragment pair: the sliced d = 256 instances that load with the
/// accelerator and are not deterministic (the deterministic ones order their adds by semaphore).
/// Each step's dQ is staged in the step's Q/dO stage once the dV and dK products that read it
/// are done, so it takes no shared memory of its own.
pub const fn bulk_dq(c: &WgBackwardConfig, tma: bool, deterministic: bool) -> bool {
    c.head_dim == 256 && c.sliced() && tma && !deterministic
}

/// Bytes of shared memory the backward's main kernel takes: its tiles, and with the
/// accelerator's loads a barrier per stage after them.
pub const fn backward_shared_bytes(c: &WgBackwardConfig, tma: bool) -> u32 {
    c.shared_bytes() + if tma { 4 * BARRIER_BYTES } else { 0 }
}

/// Tiles of the backward's main kernel: `warpgroups` groups of 4 warps, each owning 64 keys of the
/// K/V block for `Sᵀ`, `dPᵀ`, dK and dV; Q blocks of 64 rows, whose dQ the groups split by
/// columns (each reads every group's `dSᵀ` rows). Past d = 128 the block is [`sliced`]: both
/// groups own the same 64 keys, group `w` the head-dim slice `w` of their dK, dV and dQ (an
/// equal share, [`slice_cols`], stored from column `w` · [`BACKWARD_SLICE_COLS`] of the tiles),
/// each computing `Sᵀ` and `dPᵀ` for half the Q block's rows ([`score_queries`]).
///
/// [`sliced`]: WgBackwardConfig::sliced
/// [`slice_cols`]: WgBackwardConfig::slice_cols
/// [`score_queries`]: WgBackwardConfig::score_queries
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WgBackwardConfig {
    pub head_dim: u32,
    pub warpgroups: u32,
    /// Sliced although the head dim fits one warpgroup's registers whole: d = 128's modifier
    /// instance ([`backward_mods_config`]).
    pub split_head_dim: bool,
    /// Q blocks of [`TALL_Q_BLOCK`] rows instead of [`Q_BLOCK`]: each group's `Sᵀ` and `dPᵀ`
    /// are `m64n128`, and the groups split dQ by rows (64 each, every column) instead of by
    /// columns ([`BACKWARD_D64_TALL`]).
    pub tall_q_blocks: bool,
}

impl WgBackwardConfig {
    /// Whether the warpgroups split the head dim (one slice each) instead of the keys.
    pub const fn sliced(&self) -> bool {
        (self.head_dim > BACKWARD_SLICE_COLS || self.split_head_dim) && !self.transposed()
    }
    /// Whether the block runs the transposed schedule (`backward_transposed`): three warpgroups
    /// split 96 keys for `S` and `dP` (32 each) and the head dim for dQ and the transposed dK
    /// and dV (64 columns each). d = 192's plain instance only.
    pub const fn transposed(&self) -> bool {
        self.head_dim > BACKWARD_SLICE_COLS && self.warpgroups == 3
    }
    pub const fn block_keys(&self) -> u32 {
        if self.transposed() {
            32 * self.warpgroups
        } else if self.sliced() {
            64
        } else {
            64 * self.warpgroups
        }
    }
    pub const fn block_rows(&self) -> u32 {
        if self.tall_q_blocks {
            TALL_Q_BLOCK
        } else {
            Q_BLOCK
        }
    }
    pub const fn threads(&self) -> u32 {
        128 * self.warpgroups
    }
    /// Columns of the shared tiles: whole 64-column panels (128-byte swizzle rows), or (sliced)
    /// [`slice_stride`](Self::slice_stride) per slice, zeros past the head dim (see the kernel).
    pub const fn tile_cols(&self) -> u32 {
        if self.sliced() {
            self.warpgroups * self.slice_stride()
        } else {
            self.head_dim.next_multiple_of(64)
        }
    }
    /// Columns of dK and dV each warpgroup accumulates: all, or (sliced) its equal share, which
    /// keeps k-steps whole (d = 160, 192 and 256: 80, 96 and 128).
    pub const fn slice_cols(&self) -> u32 {
        if self.sliced() {
            self.head_dim / self.warpgroups
        } else {
            self.head_dim
        }
    }
    /// Tile columns from one slice's start to the next's: the slice itself where it is whole
    /// 64-column panels (d = 128, 256), else [`BACKWARD_SLICE_COLS`] (a gap after it).
    pub const fn slice_stride(&self) -> u32 {
        if self.slice_cols().is_multiple_of(64) {
            self.slice_cols()
        } else {
            BACKWARD_SLICE_COLS
        }
    }
    /// Query columns of `Sᵀ` (and `dPᵀ`, `Pᵀ`, `dSᵀ`) each warpgroup computes: the whole Q
    /// block's, or (sliced, where the groups share the keys) its share of them.
    pub const fn score_queries(&self) -> u32 {
        if self.sliced() {
            self.block_rows() / self.warpgroups
        } else {
            self.block_rows()
        }
    }
    /// Whether dQ of one step is carried into the next (see the kernel): only where registers
    /// allow, d = 64's 64-row blocks (d = 32 gives those registers to a second block per SM
    /// instead; the tall blocks to `Sᵀ` and `dPᵀ` of 128 queries).
    pub const fn carry_dq(&self) -> bool {
        self.head_dim == 64 && !self.tall_q_blocks
    }
    /// dQ columns of one `wgmma` chain: each warpgroup's share, all of them with tall Q blocks
    /// (the groups split the rows instead), or (sliced) its slice in one chain up to 96 columns
    /// and 64 at a time past that, so that they fit beside the slice's dK and dV. A chain's
    /// columns lie in one 64-column panel or start one (an MN-major operand cannot start inside
    /// a panel and cross into the next), so d = 96 shares the tiles' 128 columns, zeros past 96.
    pub const fn dq_cols(&self) -> u32 {
        let share = self.head_dim / self.warpgroups;
        if self.tall_q_blocks {
            self.head_dim
        } else if self.sliced() {
            if share <= 96 { share } else { 64 }
        } else if 64u32.is_multiple_of(share) || share.is_multiple_of(64) {
            share
        } else {
            self.tile_cols() / self.warpgroups
        }
    }
    /// Shared stages of Q, dO and their rows' statistics: three where dQ is carried into the
    /// next step (its `dSᵀ` and the stage it was issued with are still read). Where every
    /// product of a step is waited for within it two suffice: the sliced tiles (d = 256 needs
    /// them to fit), d = 32 (two blocks per SM) and the tall blocks take two; d = 96 and 128,
    /// one block per SM either way, keep three (two were not measured there).
    pub const fn stages(&self) -> u32 {
        if self.sliced() || self.transposed() || self.head_dim == 32 || self.tall_q_blocks {
            2
        } else {
            3
        }
    }
    /// Columns of each score buffer (`dSᵀ`, or transposed `P` and `dS`): one per query, or
    /// (transposed) one per key in whole 64-column panels.
    pub const fn score_tile_cols(&self) -> u32 {
        if self.transposed() {
            self.block_keys().next_multiple_of(64)
        } else {
            self.block_rows()
        }
    }
    /// K and V; the stages of Q and dO; two score buffers; the stages of the rows'
    /// `LSE · log2 e` and `D`.
    pub const fn shared_bytes(&self) -> u32 {
        let (bc, br, d, st) = (
            self.block_keys(),
            self.block_rows(),
            self.tile_cols(),
            self.stages(),
        );
        let score_rows = if self.transposed() { br } else { bc };
        2 * bc * d * 2
            + st * 2 * br * d * 2
            + 2 * score_rows * self.score_tile_cols() * 2
            + st * 2 * br * 4
    }
}

/// d = 64 and 128: two warpgroups, 128 keys × 64 query rows.
pub const BACKWARD_D64: WgBackwardConfig = WgBackwardConfig {
    head_dim: 64,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};
pub const BACKWARD_D128: WgBackwardConfig = WgBackwardConfig {
    head_dim: 128,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};
/// d = 192 and 256: 64 keys × 64 query rows, one warpgroup per half of the head dim (tiles of
/// 256 columns at both, a half from each 128-column boundary): 209 KiB of shared memory (two
/// stages), one block per SM. d = 192's plain calls run [`BACKWARD_D192_TRANSPOSED`].
pub const BACKWARD_D192: WgBackwardConfig = WgBackwardConfig {
    head_dim: 192,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};
pub const BACKWARD_D256: WgBackwardConfig = WgBackwardConfig {
    head_dim: 256,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};

/// d = 32 and 96, plain calls only ([`backward_plain_config`]): d = 64's and d = 128's tiles
/// (one and two 64-column panels, zeros past the head dim) with half and three quarters of their
/// tensor-core work: `Sᵀ` and `dPᵀ` in 2 and 6 k-steps, dK and dV 32 and 96 columns wide; dQ
/// 16 columns per warpgroup at d = 32, at d = 96 d = 128's 64 (its zero columns are not added).
pub const BACKWARD_D32: WgBackwardConfig = WgBackwardConfig {
    head_dim: 32,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};
pub const BACKWARD_D96: WgBackwardConfig = WgBackwardConfig {
    head_dim: 96,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};
/// d = 40 to 64, plain calls only ([`backward_plain_config`]): d = 64's 128 keys against Q
/// blocks of 128 rows ([`WgBackwardConfig::tall_q_blocks`]), dQ not carried, two stages: half
/// the steps of [`BACKWARD_D64`] for the same work, and `Sᵀ`, `dPᵀ` and dQ as `m64n128` and
/// `m64n64` products, which read fewer shared bytes per multiply-add than `m64n64` and
/// `m64n32`. 162 KiB of shared memory, one block per SM.
pub const BACKWARD_D64_TALL: WgBackwardConfig = WgBackwardConfig {
    head_dim: 64,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: true,
};

/// d = 72 and 80, plain calls only ([`backward_plain_config`]): d = 128's tiles with five
/// eighths of their tensor-core work, `Sᵀ` and `dPᵀ` in 5 k-steps, dK and dV 80 columns wide
/// (`m64n80k16`), dQ d = 128's 64 columns per warpgroup (its zero columns are not added).
pub const BACKWARD_D80: WgBackwardConfig = WgBackwardConfig {
    head_dim: 80,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};

/// d = 136 to 160, plain calls only ([`backward_plain_config`]): d = 192's sliced tiles in
/// halves of 80 columns, zeros past the head dim, `Sᵀ` and `dPᵀ` in 10 k-steps instead of 12.
pub const BACKWARD_D160: WgBackwardConfig = WgBackwardConfig {
    head_dim: 160,
    warpgroups: 2,
    split_head_dim: false,
    tall_q_blocks: false,
};

/// d = 168 to 192, plain calls only ([`backward_plain_config`]): the transposed schedule
/// ([`WgBackwardConfig::transposed`]), 96 keys × 64 query rows, tiles of 192 columns; 201 KiB of
/// shared memory (two stages), one block of 384 threads per SM.
pub const BACKWARD_D192_TRANSPOSED: WgBackwardConfig = WgBackwardConfig {
    head_dim: 192,
    warpgroups: 3,
    split_head_dim: false,
    tall_q_blocks: false,
};

/// Every backward configuration compiled into the sm_90a PTX: the defaults and the plain-only
/// [`BACKWARD_D32`], [`BACKWARD_D80`], [`BACKWARD_D96`], [`BACKWARD_D160`],
/// [`BACKWARD_D192_TRANSPOSED`] and [`BACKWARD_D64_TALL`]. Measured against them on the H200
/// and dropped (reports/PERF_LOG_BACKWARD.md): dQ split by keys instead of columns, and one
/// warpgroup per block at d = 64 (two independent blocks per SM).
pub const BACKWARD_VARIANTS: &[WgBackwardConfig] = &[
    BACKWARD_D64,
    BACKWARD_D128,
    BACKWARD_D192,
    BACKWARD_D256,
    BACKWARD_D32,
    BACKWARD_D80,
    BACKWARD_D96,
    BACKWARD_D160,
    BACKWARD_D192_TRANSPOSED,
    BACKWARD_D64_TALL,
];

/// The default backward configuration for a head dimension (padded as [`config`]).
pub const fn backward_config(head_dim: u32) -> Option<WgBackwardConfig> {
    match super::tensor_core_head_dim(head_dim) {
        Some(64) => Some(BACKWARD_D64),
        Some(128) => Some(BACKWARD_D128),
        Some(192) => Some(BACKWARD_D192),
        Some(256) => Some(BACKWARD_D256),
        _ => None,
    }
}

/// The configuration of default `c`'s modifier instance (softcap, ALiBi, sinks, or the window
/// with any of those or with key lengths, packed sequences or dropout): at d = 128 sliced
/// ([`WgBackwardConfig::sliced`]: both warpgroups on the same 64 keys, a 64-column half of the
/// head dim each), since on `c`'s tiles (dK and dV whole, 128 registers a thread beside the
/// scores) it reloaded spilled values hundreds of times a step; `c` elsewhere. The general
/// instance keeps `c`, on which dropout ran faster than sliced (`reports/PERF_LOG_BACKWARD.md`).
pub const fn backward_mods_config(c: &WgBackwardConfig) -> WgBackwardConfig {
    if c.head_dim == 128 && !c.sliced() {
        WgBackwardConfig {
            split_head_dim: true,
            ..*c
        }
    } else {
        *c
    }
}

/// The configuration whose plain instance runs the plain calls (full-length sequences, no
/// dropout, window, score modifiers or deterministic dQ) of default `c` whose Q/K and V head
/// dims are at most `widest`: [`BACKWARD_D32`] for [`BACKWARD_D64`]'s at 32 and
/// [`BACKWARD_D64_TALL`] above, [`BACKWARD_D80`]
/// and [`BACKWARD_D96`] for [`BACKWARD_D128`]'s from 72 to 80 and to 96, [`BACKWARD_D160`] for
/// [`BACKWARD_D192`]'s from 136 to 160 and [`BACKWARD_D192_TRANSPOSED`] above that; otherwise
/// `c`.
pub const fn backward_plain_config(c: &WgBackwardConfig, widest: u32) -> WgBackwardConfig {
    if c.head_dim == 64 && widest <= BACKWARD_D32.head_dim {
        BACKWARD_D32
    } else if c.head_dim == 64 {
        BACKWARD_D64_TALL
    } else if c.head_dim == 128 && widest <= BACKWARD_D80.head_dim {
        BACKWARD_D80
    } else if c.head_dim == 128 && widest <= BACKWARD_D96.head_dim {
        BACKWARD_D96
    } else if c.head_dim == 192 && widest <= BACKWARD_D160.head_dim {
        BACKWARD_D160
    } else if c.head_dim == 192 {
        BACKWARD_D192_TRANSPOSED
    } else {
        *c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tile::{GappedTile, PanelTile};

    /// Where each warpgroup's dK/dV operand and dQ chains start in the tiles' physical columns,
    /// for every compiled backward: an MN-major operand must start a 64-column panel or end
    /// inside the one it starts in, and a sliced group's half must keep `Sᵀ`'s k-steps whole.
    #[test]
    fn backward_operands_start_panels() {
        let mods = backward_mods_config(&BACKWARD_D128);
        assert!(mods.sliced());
        for c in BACKWARD_VARIANTS.iter().chain([&mods]) {
            let (d, groups) = (c.head_dim, c.warpgroups);
            let fits = |start: u32, cols: u32| start.is_multiple_of(64) || start % 64 + cols <= 64;
            if c.sliced() {
                let half = c.slice_cols();
                assert_eq!(half * groups, d, "{c:?}");
                assert!(
                    half.is_multiple_of(16) && half <= BACKWARD_SLICE_COLS,
                    "{c:?}"
                );
                let stride = c.slice_stride();
                assert_eq!(c.tile_cols(), groups * stride, "{c:?}");
                let tile = PanelTile::new(0, c.block_rows(), c.tile_cols());
                let gapped = GappedTile::new(tile, half / 8, stride / 8);
                let parts = half / c.dq_cols();
                assert!(
                    (parts == 1 || parts == 2) && parts * c.dq_cols() == half,
                    "{c:?}"
                );
                for w in 0..groups {
                    let col0 = half * w;
                    assert_eq!(
                        gapped.mn_major(0, col0),
                        tile.mn_major(0, stride * w),
                        "{c:?}"
                    );
                    for part in 0..parts {
                        let start = 8 * gapped.physical((col0 + part * c.dq_cols()) / 8);
                        assert!(fits(start, c.dq_cols()), "{c:?} group {w} part {part}");
                    }
                }
                // `Sᵀ`'s k-steps land on whole 16-column steps of the runs, none in the gap.
                for kk in 0..d / 16 {
                    let physical = gapped.physical(2 * kk);
                    assert!(physical % (stride / 8) < half / 8, "{c:?} k-step {kk}");
                }
            } else {
                assert_eq!(c.slice_cols(), d, "{c:?}");
                for w in 0..groups {
                    // Tall Q blocks: each group's dQ takes every column of its rows.
                    let start = if c.tall_q_blocks { 0 } else { w * c.dq_cols() };
                    assert!(fits(start, c.dq_cols()), "{c:?} group {w}");
                }
            }
            if c.transposed() {
                // Each group's head-dim rows of dKᵀ/dVᵀ and columns of dQ are one whole panel,
                // its keys of `S` whole 8-row groups, and the keys whole k-steps of dQ.
                assert_eq!(
                    (c.dq_cols(), c.dq_cols() * groups, d),
                    (64, d, c.tile_cols()),
                    "{c:?}"
                );
                assert_eq!(c.block_keys(), 32 * groups, "{c:?}");
                assert!(c.block_keys().is_multiple_of(16), "{c:?}");
            }
        }
    }
}
