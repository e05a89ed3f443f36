// Also `include!`d by the root build script, which applies it to the PTX: inner attributes and
// `use` items would not compile there.

/// `sm_90a` entry points compiled for a number of resident blocks per SM: `(entry, threads per
/// block, blocks per SM)`, written into the PTX as `.maxntid` and `.minnctapersm` after the
/// entry's parameters (rustc has no attribute for them), so ptxas keeps the registers to what
/// that many blocks leave (64 K / (256 · 2) = 128; 64 K / 384 = 168 and 64 K / 512 = 128 for
/// the warp-specialized instances, which must launch all their threads). Without it the d = 64 `wgmma` forward takes
/// more registers than two blocks leave and runs one block per SM, which is slower despite the
/// spills the bound costs (`reports/PERF_LOG.md`); its padded twin, which runs head dims 32 to
/// 56, likewise.
pub const LAUNCH_BOUNDS: &[(&str, u32, u32)] = &[
    ("flash_wgmma_forward_bf16_d32_g2_k64", 256, 2),
    ("flash_wgmma_forward_f16_d32_g2_k64", 256, 2),
    ("flash_wgmma_forward_bf16_d64_g2_k64", 256, 2),
    ("flash_wgmma_forward_f16_d64_g2_k64", 256, 2),
    ("flash_wgmma_forward_padded_bf16_d64_g2_k64", 256, 2),
    ("flash_wgmma_forward_padded_f16_d64_g2_k64", 256, 2),
    // The plain d = 32 backward (`sm90::BACKWARD_D32`): two blocks per SM, dQ not carried.
    ("flash_wgmma_backward_bf16_d32_g2", 256, 2),
    ("flash_wgmma_backward_f16_d32_g2", 256, 2),
    // The warp-specialized instances (`sm90::warp_specialized`): 512 or 384 threads, so that
    // ptxas compiles for the registers that leaves before `setmaxnreg` redistributes them.
    ("flash_wgmma_forward_bf16_d64_g3_k128", 512, 1),
    ("flash_wgmma_forward_f16_d64_g3_k128", 512, 1),
    ("flash_wgmma_forward_bf16_d80_g2_k128", 384, 1),
    ("flash_wgmma_forward_f16_d80_g2_k128", 384, 1),
    ("flash_wgmma_forward_bf16_d160_g2_k64", 384, 1),
    ("flash_wgmma_forward_f16_d160_g2_k64", 384, 1),
    ("flash_wgmma_forward_bf16_d96_g2_k128", 384, 1),
    ("flash_wgmma_forward_f16_d96_g2_k128", 384, 1),
    ("flash_wgmma_forward_bf16_d128_g2_k128", 384, 1),
    ("flash_wgmma_forward_f16_d128_g2_k128", 384, 1),
    ("flash_wgmma_forward_bf16_d192_g2_k64", 384, 1),
    ("flash_wgmma_forward_f16_d192_g2_k64", 384, 1),
    ("flash_wgmma_forward_bf16_d256_g2_k64", 384, 1),
    ("flash_wgmma_forward_f16_d256_g2_k64", 384, 1),
    ("flash_wgmma_forward_e4m3_d128_g2_k128", 384, 1),
    // The transposed d = 192 backward (`sm90::BACKWARD_D192_TRANSPOSED`): three warpgroups.
    ("flash_wgmma_backward_bf16_d192_g3", 384, 1),
    ("flash_wgmma_backward_f16_d192_g3", 384, 1),
];

/// The bounds of the warp-specialized tuning candidates (the `tuning` feature), for the same
/// reason.
pub const TUNING_LAUNCH_BOUNDS: &[(&str, u32, u32)] = &[
    ("flash_wgmma_forward_bf16_d64_g2_k128", 384, 1),
    ("flash_wgmma_forward_f16_d64_g2_k128", 384, 1),
    ("flash_wgmma_forward_bf16_d64_g3_k64", 512, 1),
    ("flash_wgmma_forward_f16_d64_g3_k64", 512, 1),
    ("flash_wgmma_forward_bf16_d128_g3_k64", 512, 1),
    ("flash_wgmma_forward_f16_d128_g3_k64", 512, 1),
];
