// Also `include!`d by the root build script, which applies it to the PTX: inner attributes and
// `use` items would not compile there.

/// `sm_90a` entry points compiled for a number of resident blocks per SM: `(entry, threads per
/// block, blocks per SM)`, written into the PTX as `.maxntid` and `.minnctapersm` after the
/// entry's parameters (rustc has no attribute for them), so ptxas keeps the registers to what
/// that many blocks leave (64 K / (256 · 2) = 128). Without it the d = 64 `wgmma` forward takes
/// more registers than two blocks leave and runs one block per SM, which is slower despite the
/// spills the bound costs (`reports/PERF_LOG.md`); its padded twin, which runs head dims 32 to
/// 56, likewise.
pub const LAUNCH_BOUNDS: &[(&str, u32, u32)] = &[
    ("flash_wgmma_forward_bf16_d64_g2_k64", 256, 2),
    ("flash_wgmma_forward_f16_d64_g2_k64", 256, 2),
    ("flash_wgmma_forward_padded_bf16_d64_g2_k64", 256, 2),
    ("flash_wgmma_forward_padded_f16_d64_g2_k64", 256, 2),
];
