//! The names a call and its plan share: the kernel families, the choice among them, the
//! direction.

use std::fmt;

/// A kernel family: kernels that share an architecture's matrix instructions and tile layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Family {
    /// Split-KV decode (`mma.sync`, sm_80+), bf16/f16, head dims 64 and 128, at most 16 query
    /// rows per K/V head (one 16-row tile); partials merged by the combine kernel.
    Decode,
    /// Hopper warpgroup tensor cores (`wgmma`, `sm_90a` module), bf16/f16, head dims every
    /// multiple of 8 from 32 to 256 forward and backward (compiled for 64, 128, 192 and 256, the
    /// forward for 96 too, zero-padded in between; calls without options also run tiles of their
    /// own at some head dims: the plan names the instance), every option of `AttentionOptions`.
    Sm90,
    /// Warp tensor cores (`mma.sync`, sm_80+), bf16/f16, head dims as `Sm90` (compiled for 64,
    /// 128, 192 and 256), every option of `AttentionOptions`: key lengths, packed sequences,
    /// dropout, the window and the score modifiers.
    Sm80,
    /// The exact SIMT kernels: f32 tiles, every dtype, option and head dim up to 256.
    Exact,
}

impl Family {
    /// Every family, in the order `Auto` tries them.
    pub const ALL: [Family; 4] = [Family::Decode, Family::Sm90, Family::Sm80, Family::Exact];

    pub fn name(self) -> &'static str {
        match self {
            Family::Decode => "decode",
            Family::Sm90 => "sm90",
            Family::Sm80 => "sm80",
            Family::Exact => "exact",
        }
    }

    pub(crate) fn describe(self) -> &'static str {
        match self {
            Family::Decode => {
                "split-KV decode on mma.sync (a K/V head's query rows as one 16-row tile), partials merged by the combine kernel"
            }
            Family::Sm90 => "wgmma tensor cores, sm_90a module",
            Family::Sm80 => "mma.sync tensor cores",
            Family::Exact => "exact SIMT kernels, f32 tiles",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which family a call may use: `Auto` (the fastest that can run it) or one named family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum KernelChoice {
    #[default]
    Auto,
    Only(Family),
}

impl std::str::FromStr for KernelChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(KernelChoice::Auto),
            _ => Family::ALL
                .into_iter()
                .find(|f| f.name() == s)
                .map(KernelChoice::Only)
                .ok_or_else(|| {
                    format!("unknown kernel {s:?} (expected auto, decode, exact, sm80 or sm90)")
                }),
        }
    }
}

impl fmt::Display for KernelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelChoice::Auto => f.write_str("auto"),
            KernelChoice::Only(family) => family.fmt(f),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Forward,
    Backward,
}
