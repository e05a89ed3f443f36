//! The table of compiled kernel instances: every PTX entry point the host may launch, named by
//! the same functions the plans and launchers use. `tests/ptx_entries.rs` checks each against the
//! embedded modules.

use attention_kernels::kernels::sm80::backward::TcBackwardConfig;
use attention_kernels::kernels::sm80::forward::TcConfig;
use attention_kernels::kernels::sm90::{Fp8Config, WgBackwardConfig, WgConfig};
use attention_kernels::kernels::{decode, sm80, sm90};

use crate::dtype::DType;
use crate::family::Family;

/// The dtypes of the tensor-core families.
pub const HALF_DTYPES: [DType; 2] = [DType::F16, DType::Bf16];

/// One entry point and the family whose module holds it (`Sm90`: the `sm_90a` module only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub family: Family,
    pub name: String,
}

/// The exact forward (`paper`: the K/V-outer schedule of Algorithm 1).
pub fn exact_forward(dtype: DType, paper: bool) -> String {
    format!("flash_forward_{}{dtype}", if paper { "paper_" } else { "" })
}

/// The exact backward's kernels: `delta` (D), `kv` (dK, dV, atomic dQ), `dq` (the deterministic
/// dQ pass), `dq_convert` (f32 accumulator to the dtype).
pub fn exact_backward(dtype: DType, kernel: &str) -> String {
    format!("flash_backward_{kernel}_{dtype}")
}

/// The exact backward's sink gradient (`dσ_h = −Σ_rows P_sink · D`, one warp per query head;
/// f32 whatever the dtype).
pub fn exact_d_sink() -> String {
    "flash_backward_d_sink".to_owned()
}

/// The `mma.sync` forward `cfg`; `general` names the instance that takes length masks and
/// dropout (compiled for the defaults only).
pub fn sm80_forward(dtype: DType, cfg: &TcConfig, general: bool) -> String {
    format!(
        "flash_tc_forward_{}{dtype}_d{}_w{}_k{}",
        if general { "general_" } else { "" },
        cfg.head_dim,
        cfg.warps,
        cfg.block_keys
    )
}

/// The `mma.sync` forward `cfg` that takes the window and score modifiers, and with `general`
/// length masks and dropout too (compiled for the defaults only).
pub fn sm80_forward_mods(dtype: DType, cfg: &TcConfig, general: bool) -> String {
    let mods = if general { "_general_mods_" } else { "_mods_" };
    sm80_forward(dtype, cfg, false).replacen("_forward_", &format!("_forward{mods}"), 1)
}

/// The `wgmma` forward `cfg`; `general` names the instance that takes length masks and dropout
/// (compiled for the defaults only).
pub fn sm90_forward(dtype: DType, cfg: &WgConfig, general: bool) -> String {
    format!(
        "flash_wgmma_forward_{}{dtype}_d{}_g{}_k{}",
        if general { "general_" } else { "" },
        cfg.head_dim,
        cfg.warpgroups,
        cfg.block_keys
    )
}

/// The `wgmma` forward `cfg` for head dims below its compiled one (zero-padded columns), scale
/// and causal only (compiled for the defaults only): the plain instance of [`sm90_forward`]
/// takes the compiled head dim alone.
pub fn sm90_forward_padded(dtype: DType, cfg: &WgConfig) -> String {
    sm90_forward(dtype, cfg, false).replacen("_forward_", "_forward_padded_", 1)
}

/// The `wgmma` forward `cfg` that takes the window and score modifiers besides every option of
/// the general one (compiled for the defaults' `sm90::mods_config` only).
pub fn sm90_forward_mods(dtype: DType, cfg: &WgConfig) -> String {
    sm90_forward(dtype, cfg, true).replacen("_general_", "_mods_", 1)
}

/// The `wgmma` forward `cfg` that takes the local window and nothing else of the general one's
/// options (compiled for the defaults only): window-only calls of full-length sequences, without
/// the modifiers' registers.
pub fn sm90_forward_window(dtype: DType, cfg: &WgConfig) -> String {
    sm90_forward(dtype, cfg, true).replacen("_general_", "_window_", 1)
}

/// The FP8 (e4m3) `wgmma` forward `cfg` (`crate::fp8`): plain calls, O in bf16.
pub fn sm90_forward_e4m3(cfg: &Fp8Config) -> String {
    format!(
        "flash_wgmma_forward_e4m3_d{}_g{}_k{}",
        cfg.head_dim, cfg.warpgroups, cfg.block_keys
    )
}

/// The `mma.sync` backward main kernel `cfg`; `general` as for [`sm80_forward`];
/// `deterministic` adds dQ in key order (scale and causal only: never with `general`).
pub fn sm80_backward(
    dtype: DType,
    cfg: &TcBackwardConfig,
    general: bool,
    deterministic: bool,
) -> String {
    let kind = match (general, deterministic) {
        (true, _) => "general_",
        (false, true) => "det_",
        (false, false) => "",
    };
    format!(
        "flash_tc_backward_{kind}{dtype}_d{}_w{}",
        cfg.head_dim, cfg.warps
    )
}

/// The `mma.sync` backward main kernel `cfg` with the window and score modifiers, `general` as
/// for [`sm80_forward_mods`].
pub fn sm80_backward_mods(dtype: DType, cfg: &TcBackwardConfig, general: bool) -> String {
    let mods = if general { "_general_mods_" } else { "_mods_" };
    sm80_backward(dtype, cfg, false, false).replacen("_backward_", &format!("_backward{mods}"), 1)
}

/// The `wgmma` backward main kernel `cfg`; `general` as for [`sm90_forward`]; `deterministic`
/// adds dQ in key order (scale and causal only: never with `general`); `_sliced` where `cfg`
/// splits a head dim of at most 128 (`sm90::backward_mods_config`), `_tall` where its Q blocks
/// are 128 rows (`sm90::BACKWARD_D64_TALL`).
pub fn sm90_backward(
    dtype: DType,
    cfg: &WgBackwardConfig,
    general: bool,
    deterministic: bool,
) -> String {
    let kind = match (general, deterministic) {
        (true, _) => "general_",
        (false, true) => "det_",
        (false, false) => "",
    };
    format!(
        "flash_wgmma_backward_{kind}{dtype}_d{}_g{}{}{}",
        cfg.head_dim,
        cfg.warpgroups,
        if cfg.split_head_dim { "_sliced" } else { "" },
        if cfg.tall_q_blocks { "_tall" } else { "" }
    )
}

/// The `wgmma` backward main kernel `cfg` with the window and score modifiers, as
/// [`sm90_forward_mods`].
pub fn sm90_backward_mods(dtype: DType, cfg: &WgBackwardConfig) -> String {
    sm90_backward(dtype, cfg, true, false).replacen("_general_", "_mods_", 1)
}

/// The `wgmma` backward main kernel `cfg` with the window alone, as [`sm90_forward_window`].
pub fn sm90_backward_window(dtype: DType, cfg: &WgBackwardConfig) -> String {
    sm90_backward(dtype, cfg, true, false).replacen("_general_", "_window_", 1)
}

/// The tensor-core backward's preprocess (D, LSE · log2 e, zeroed dQ accumulator).
pub fn tensor_core_preprocess(dtype: DType, head_dim: u32) -> String {
    format!("flash_tc_backward_preprocess_{dtype}_d{head_dim}")
}

/// The tensor-core backward's sink gradient (after the preprocess, one warp per query head).
pub fn tensor_core_d_sink() -> String {
    "flash_tc_backward_d_sink".to_owned()
}

/// The tensor-core backward's dQ conversion (f32 accumulator · τ to the dtype).
pub fn tensor_core_convert_dq(dtype: DType) -> String {
    format!("flash_tc_backward_convert_dq_{dtype}")
}

/// The tensor-core backward's pass over NaN rows (dK, dV of the keys in their support, dQ).
pub fn tensor_core_nan_rows(dtype: DType) -> String {
    format!("flash_tc_backward_nan_rows_{dtype}")
}

/// The split-KV decode kernel on `mma.sync` (up to 16 query rows per K/V head as one 16-row
/// tile) for head dim `head_dim`.
pub fn decode(dtype: DType, head_dim: u32) -> String {
    format!("flash_decode_mma_{dtype}_d{head_dim}")
}

/// The parallel combine of the decode splits' f32 partials into `dtype` O
/// (`decode::DecodeCombine::Parallel`).
pub fn decode_combine(dtype: DType, head_dim: u32) -> String {
    format!("flash_decode_combine_{dtype}_d{head_dim}")
}

/// The merge of `(O, LSE)` parts from `input` O to `output` O: parts from a table of addresses
/// (the public merge, `input == output`) or at a fixed stride (`strided`, the split-KV combine,
/// f32 partials).
pub fn merge(input: DType, output: DType, strided: bool) -> String {
    format!(
        "flash_merge_{}{input}_{output}",
        if strided { "strided_" } else { "" }
    )
}

/// The KV cache's append (any dtype: rows are copied as 16-byte chunks).
pub fn cache_append() -> String {
    "flash_cache_append".to_owned()
}

/// The kernels that serve every family (the merges, the cache append), in every module.
pub fn support_entry_points() -> Vec<String> {
    let mut out: Vec<String> = [DType::F32, DType::F16, DType::Bf16]
        .into_iter()
        .map(|d| merge(d, d, false))
        .collect();
    out.extend(
        [DType::F32, DType::F16, DType::Bf16]
            .into_iter()
            .map(|d| merge(DType::F32, d, true)),
    );
    out.push(cache_append());
    out
}

/// Every entry point the host may launch.
pub fn entry_points() -> Vec<Entry> {
    let mut out = Vec::new();
    let mut push = |family, name| out.push(Entry { family, name });
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for paper in [false, true] {
            push(Family::Exact, exact_forward(dtype, paper));
        }
        for kernel in ["delta", "kv", "dq", "dq_convert"] {
            push(Family::Exact, exact_backward(dtype, kernel));
        }
    }
    push(Family::Exact, exact_d_sink());
    push(Family::Sm80, tensor_core_d_sink());
    for dtype in HALF_DTYPES {
        for d in decode::HEAD_DIMS {
            push(Family::Decode, self::decode(dtype, d));
            push(Family::Decode, decode_combine(dtype, d));
        }
        for &cfg in sm80::forward::VARIANTS {
            push(Family::Sm80, sm80_forward(dtype, &cfg, false));
            if sm80::forward::config(cfg.head_dim) == Some(cfg) {
                push(Family::Sm80, sm80_forward(dtype, &cfg, true));
                push(Family::Sm80, sm80_forward_mods(dtype, &cfg, false));
                push(Family::Sm80, sm80_forward_mods(dtype, &cfg, true));
            }
        }
        for &cfg in sm80::backward::VARIANTS {
            push(Family::Sm80, sm80_backward(dtype, &cfg, false, false));
            if sm80::backward::config(cfg.head_dim) == Some(cfg) {
                push(Family::Sm80, sm80_backward(dtype, &cfg, true, false));
                push(Family::Sm80, sm80_backward(dtype, &cfg, false, true));
                push(Family::Sm80, sm80_backward_mods(dtype, &cfg, false));
                push(Family::Sm80, sm80_backward_mods(dtype, &cfg, true));
            }
        }
        for d in [64, 128, 192, 256] {
            push(Family::Sm80, tensor_core_preprocess(dtype, d));
        }
        push(Family::Sm80, tensor_core_convert_dq(dtype));
        push(Family::Sm80, tensor_core_nan_rows(dtype));
        for &cfg in sm90::VARIANTS {
            push(Family::Sm90, sm90_forward(dtype, &cfg, false));
            if sm90::config(cfg.head_dim) == Some(cfg) {
                push(Family::Sm90, sm90_forward_padded(dtype, &cfg));
                push(Family::Sm90, sm90_forward(dtype, &cfg, true));
                push(
                    Family::Sm90,
                    sm90_forward_mods(dtype, &sm90::mods_config(&cfg)),
                );
                push(Family::Sm90, sm90_forward_window(dtype, &cfg));
            }
        }
        for &cfg in sm90::BACKWARD_VARIANTS {
            push(Family::Sm90, sm90_backward(dtype, &cfg, false, false));
            if sm90::backward_config(cfg.head_dim) == Some(cfg) {
                push(Family::Sm90, sm90_backward(dtype, &cfg, true, false));
                push(Family::Sm90, sm90_backward(dtype, &cfg, false, true));
                let mods = sm90::backward_mods_config(&cfg);
                push(Family::Sm90, sm90_backward_mods(dtype, &mods));
                push(Family::Sm90, sm90_backward_window(dtype, &cfg));
            }
        }
    }
    push(Family::Sm90, sm90_forward_e4m3(&sm90::FP8_D128));
    out
}
