//! FlashAttention-2 forward on the tensor cores (`mma.sync`): tile configuration shared by the
//! host launcher and the device kernels.

#[cfg(target_arch = "nvptx64")]
mod mainloop;

/// Tiles of one kernel instance: `warps` warps of 16 query rows each, K/V blocks of `block_keys`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcConfig {
    pub head_dim: u32,
    pub warps: u32,
    pub block_keys: u32,
}

impl TcConfig {
    /// Query rows per thread block.
    pub const fn block_rows(&self) -> u32 {
        16 * self.warps
    }
    pub const fn threads(&self) -> u32 {
        32 * self.warps
    }
    /// The Q tile plus two stages each of K and V, 16-bit elements.
    pub const fn shared_bytes(&self) -> u32 {
        (self.block_rows() + 4 * self.block_keys) * self.head_dim * 2
    }
}

/// d = 64: 40 KiB of shared memory and 167 registers, three blocks (12 warps) per SM; measured
/// 5–7% faster on the H200 than 4 warps × 128 keys or 8 warps × 128 keys (reports/PERF_LOG.md).
pub const D64: TcConfig = TcConfig {
    head_dim: 64,
    warps: 4,
    block_keys: 64,
};
/// d = 128: 96 KiB of shared memory and 248 registers, one block of 8 warps per SM; 128-row blocks
/// read K/V from L2 half as often as 64-row ones, measured 3% faster non-causal, equal causal.
pub const D128: TcConfig = TcConfig {
    head_dim: 128,
    warps: 8,
    block_keys: 64,
};
/// d = 192: 64 rows, 4 warps as FlashAttention-2's sm80 tiles, but 32-key blocks: with 64 keys
/// (FlashAttention-2's choice) Q (48 registers), O (96) and the scores (32) spill 112 bytes on
/// sm_90a; with 32, 4 bytes. 72 KiB of shared memory.
pub const D192: TcConfig = TcConfig {
    head_dim: 192,
    warps: 4,
    block_keys: 32,
};
/// d = 256: 64 rows, 4 warps as FlashAttention-2, but 32-key blocks: Q (64 registers) and O
/// (128) leave too few for 64 keys' scores (32) and their operands; 96 KiB of shared memory, so
/// it fits sm_86/89's 99 KiB too.
pub const D256: TcConfig = TcConfig {
    head_dim: 256,
    warps: 4,
    block_keys: 32,
};

/// Every configuration compiled into the PTX: the defaults, and with the `tuning` feature the
/// candidates they were measured against (compared by the timing examples).
pub const VARIANTS: &[TcConfig] = if cfg!(feature = "tuning") {
    &[
        D64,
        D128,
        D192,
        D256,
        TcConfig {
            head_dim: 64,
            warps: 4,
            block_keys: 128,
        },
        TcConfig {
            head_dim: 64,
            warps: 8,
            block_keys: 128,
        },
        TcConfig {
            head_dim: 128,
            warps: 4,
            block_keys: 64,
        },
    ]
} else {
    &[D64, D128, D192, D256]
};

/// The default configuration for a head dimension (padded to its compiled one,
/// [`crate::kernels::tensor_core_head_dim`]), `None` where no tensor-core kernel runs it.
pub const fn config(head_dim: u32) -> Option<TcConfig> {
    match crate::kernels::tensor_core_head_dim(head_dim) {
        Some(64) => Some(D64),
        Some(128) => Some(D128),
        Some(192) => Some(D192),
        Some(256) => Some(D256),
        _ => None,
    }
}
