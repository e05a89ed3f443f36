//! Options of one tiled call: the attention semantics plus how the kernels execute them.

use attention_kernels::abi::layout::BlockSizes;
use attention_kernels::kernels::decode::DecodeCombine;

use crate::family::KernelChoice;
use crate::options::AttentionOptions;

/// Forward loop order (the article's 0x0AA).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Schedule {
    /// A thread block owns a Q block and streams every K/V block; (m, ℓ, O) stay on chip and O and
    /// LSE are written once.
    #[default]
    RowOwned,
    /// Algorithm 1 as written: K/V blocks outer (one launch each), Q blocks inner, O, ℓ, m kept in
    /// global memory (f32) between K/V blocks.
    Paper,
}

impl std::str::FromStr for Schedule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "row-owned" | "row_owned" => Ok(Schedule::RowOwned),
            "paper" => Ok(Schedule::Paper),
            _ => Err(format!(
                "unknown schedule {s:?} (expected row-owned or paper)"
            )),
        }
    }
}

/// Everything one call needs besides its tensors. `FlashOptions::default()`: plain attention, the
/// fastest kernel family that can run the call, row-owned schedule, dQ by atomics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FlashOptions {
    pub attention: AttentionOptions,
    /// Which kernel family may run the call (`plan::select`); `Auto` picks the fastest that can.
    pub kernel: KernelChoice,
    /// Loop order of the exact forward (the tensor-core families run `RowOwned` only).
    pub schedule: Schedule,
    /// Explicit `(B_r, B_c)` of the exact kernels; `None` derives them from the device's shared
    /// memory (`blocks`).
    pub block_sizes: Option<BlockSizes>,
    /// Gradients bitwise identical run to run. The exact backward writes dQ in a separate
    /// row-owned pass instead of atomics (whose order of addition varies); the tensor-core
    /// backwards keep their atomics but order them: each K/V block adds its part of a Q block's
    /// dQ after the K/V blocks before it (a semaphore per Q block). The tensor-core instances
    /// that do this (sm90 and sm80) take scale and causal only: a call with key lengths, packed
    /// sequences, dropout, a window or score modifiers runs it on the exact kernels.
    pub deterministic: bool,
    /// How the decode family combines its splits: the last split merges them in the kernel (the
    /// default), or a combine launch follows, the parallel combine or the generic strided merge
    /// (`PERF_LOG_DECODE.md`); the other families ignore it.
    pub decode_combine: DecodeCombine,
    /// The decode family's splits of each (sequence, K/V head)'s keys, 1 to
    /// `kernels::decode::MAX_SPLITS`: each split gets the same whole number of 64-key tiles, so
    /// the count that runs may be lower (100 asked of 50,000 keys run as 98 of 8 tiles; the plan's
    /// grid says); `None`: the plan's choice, one wave of blocks. The other families ignore it.
    pub decode_splits: Option<u32>,
}

impl FlashOptions {
    pub fn new(attention: AttentionOptions) -> Self {
        FlashOptions {
            attention,
            ..Default::default()
        }
    }
    pub fn kernel(mut self, kernel: KernelChoice) -> Self {
        self.kernel = kernel;
        self
    }
    pub fn schedule(mut self, schedule: Schedule) -> Self {
        self.schedule = schedule;
        self
    }
    pub fn block_sizes(mut self, block_rows: u32, block_cols: u32) -> Self {
        self.block_sizes = Some(BlockSizes {
            block_rows,
            block_cols,
        });
        self
    }
    pub fn deterministic(mut self, deterministic: bool) -> Self {
        self.deterministic = deterministic;
        self
    }
    pub fn decode_combine(mut self, combine: DecodeCombine) -> Self {
        self.decode_combine = combine;
        self
    }
    pub fn decode_splits(mut self, splits: Option<u32>) -> Self {
        self.decode_splits = splits;
        self
    }
}
