//! FlashAttention forward on Hopper's warpgroup tensor cores (`wgmma`, sm_90a): tile
//! configuration shared by the host launcher and the device kernels.
//!
//! These kernels exist only in the second PTX module that `build.rs` compiles for `sm_90a` (with
//! `--cfg flash_attn_sm90a`); the host loads that module on compute capability 9.0 devices and
//! uses the `mma.sync` kernels of `flash_tc` everywhere else.

#[cfg(all(target_arch = "nvptx64", flash_attn_sm90a))]
mod forward;

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
    /// The Q tile plus two stages each of K and V, 16-bit elements.
    pub const fn shared_bytes(&self) -> u32 {
        (self.block_rows() + 4 * self.block_keys) * self.head_dim * 2
    }
}

/// d = 64: 80 KiB of shared memory, two blocks (16 warps) per SM.
pub const D64: WgConfig = WgConfig {
    head_dim: 64,
    warpgroups: 2,
    block_keys: 128,
};
/// d = 128: 160 KiB of shared memory, one block of 8 warps per SM.
pub const D128: WgConfig = WgConfig {
    head_dim: 128,
    warpgroups: 2,
    block_keys: 128,
};

/// Every configuration compiled into the sm_90a PTX: the defaults first, then candidates.
pub const VARIANTS: [WgConfig; 4] = [
    D64,
    D128,
    WgConfig {
        head_dim: 128,
        warpgroups: 2,
        block_keys: 64,
    },
    WgConfig {
        head_dim: 64,
        warpgroups: 3,
        block_keys: 128,
    },
];

/// The default configuration for a head dimension, `None` where no `wgmma` kernel exists.
pub const fn config(head_dim: u32) -> Option<WgConfig> {
    match head_dim {
        64 => Some(D64),
        128 => Some(D128),
        _ => None,
    }
}
