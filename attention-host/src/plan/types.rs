//! What a plan is: the device it plans for ([`DeviceCaps`]), the tiles it runs ([`Tiles`]) and the
//! plan itself ([`Plan`]), apart from the selection (`plan::select`) so that a family that plans
//! itself (`families::decode`) can build one without importing the selection.

use attention_kernels::abi::layout::BlockSizes;
use attention_kernels::kernels::decode::DecodeConfig;
use attention_kernels::kernels::sm80::backward::TcBackwardConfig;
use attention_kernels::kernels::sm80::forward::TcConfig;
use attention_kernels::kernels::sm90::{WgBackwardConfig, WgConfig};

use crate::error::{Result, invalid};
use crate::family::{Direction, Family};
use crate::runtime::Gpu;

/// Alignment of each workspace piece, bytes (the kernels read 16-byte vectors).
pub const WORKSPACE_ALIGN: u64 = 256;

/// The workspace piece of the decode family's per-(sequence, K/V head) split counters (u32):
/// zeroed when the workspace is allocated, and left zero by every launch
/// (`kernels::decode::DecodeCombine::LastSplit`).
pub const SPLIT_COUNTERS: &str = "split_counters";

/// What a plan needs to know of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCaps {
    pub compute_capability: (u32, u32),
    /// Whether the loaded module has the `wgmma` kernels (`Gpu::has_wgmma`).
    pub wgmma: bool,
    /// Shared memory a block may opt in to, in bytes.
    pub max_shared_per_block: u32,
    /// Streaming multiprocessors (the decode family's split count fills them).
    pub multiprocessors: u32,
}

impl DeviceCaps {
    pub fn of(gpu: &Gpu) -> Result<DeviceCaps> {
        Ok(DeviceCaps {
            compute_capability: gpu.compute_capability(),
            wgmma: gpu.has_wgmma(),
            max_shared_per_block: gpu.max_shared_per_block()?,
            multiprocessors: gpu.multiprocessors()?,
        })
    }

    /// The H200 (`sm_90`, 227 KiB per block, 132 SMs; `wgmma` where the build has the `sm_90a`
    /// module) or the A100 (`sm_80`, 163 KiB per block, 108 SMs), for planning without a device.
    pub fn for_arch(arch: &str, hopper_module: bool) -> Result<DeviceCaps> {
        match arch {
            "sm_90" | "sm_90a" => Ok(DeviceCaps {
                compute_capability: (9, 0),
                wgmma: hopper_module,
                max_shared_per_block: 227 * 1024,
                multiprocessors: 132,
            }),
            "sm_80" => Ok(DeviceCaps {
                compute_capability: (8, 0),
                wgmma: false,
                max_shared_per_block: 163 * 1024,
                multiprocessors: 108,
            }),
            _ => Err(invalid!(
                "unknown architecture {arch:?} (expected sm_90 or sm_80)"
            )),
        }
    }
}

/// The tile configuration a plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tiles {
    Exact(BlockSizes),
    Sm80Forward(TcConfig),
    Sm90Forward(WgConfig),
    Sm80Backward(TcBackwardConfig),
    Sm90Backward(WgBackwardConfig),
    Decode(DecodeConfig),
}

impl Tiles {
    /// The compiled head dim of a tensor-core instance (a call's head dim padded to it), `None`
    /// for the exact and decode tiles.
    pub fn compiled_head_dim(&self) -> Option<u32> {
        match self {
            Tiles::Sm80Forward(c) => Some(c.head_dim),
            Tiles::Sm90Forward(c) => Some(c.head_dim),
            Tiles::Sm80Backward(c) => Some(c.head_dim),
            Tiles::Sm90Backward(c) => Some(c.head_dim),
            Tiles::Exact(_) | Tiles::Decode(_) => None,
        }
    }
}

/// How one call runs: what [`select`](super::select) decided and everything its launch derives from.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub direction: Direction,
    pub family: Family,
    pub tiles: Tiles,
    /// PTX entry point of the main kernel (the backward also runs a preprocess and a dQ pass).
    pub entry: String,
    /// Query rows and keys per block of the main kernel.
    pub block_rows: u32,
    pub block_keys: u32,
    pub grid: (u32, u32, u32),
    pub threads: u32,
    /// Dynamic shared memory of the main kernel, bytes.
    pub shared_bytes: u32,
    /// Whether the main kernel loads tiles through tensor maps (the tensor memory accelerator:
    /// K and V in the forward, Q and dO in the backward), which its launcher encodes for the
    /// call's tensors and passes ahead of the other parameters (`abi::params::TmaForwardParams`,
    /// `TmaBackwardParams`).
    pub tensor_maps: bool,
    /// Whether the main kernel is warp-specialized (`sm90::warp_specialized`): a producer
    /// warpgroup issues the tensor-map loads, counted in `threads`.
    pub producer_warpgroup: bool,
    /// Device scratch besides the outputs: named pieces of 4-byte words, bytes each (rounded up
    /// to [`WORKSPACE_ALIGN`]), laid out in this order ([`crate::tensors::Workspace`]); every
    /// call writes a piece before reading it, except [`SPLIT_COUNTERS`].
    pub workspace: Vec<(&'static str, u64)>,
    /// Every other family, with why it was not chosen.
    pub not_chosen: Vec<(Family, String)>,
    /// The call's tensors that went through a staging copy because the kernels could not take
    /// the caller's view in place (`forward_on` / `backward_on`, see [`crate::stream_api`]);
    /// empty for a plan that has not run, and for a call that ran every tensor in place.
    pub staged: Vec<&'static str>,
}
