//! Storage dtypes on the host side: names, sizes, and conversion of host slices to the bit
//! patterns the kernels read.

use attention_kernels::abi::storage::{Bf16, F16, Storage};

/// Element type a tensor is stored in. Arithmetic inside the kernels is always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub const ALL: [DType; 3] = [DType::F32, DType::F16, DType::Bf16];

    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => f32::NAME,
            DType::F16 => F16::NAME,
            DType::Bf16 => Bf16::NAME,
        }
    }

    pub const fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// Rounds an f32 to this dtype and back: what storing a value in it does.
    pub fn round(self, x: f32) -> f32 {
        match self {
            DType::F32 => x,
            DType::F16 => F16::from_f32(x).to_f32(),
            DType::Bf16 => Bf16::from_f32(x).to_f32(),
        }
    }

    /// The 16-bit pattern of `x` in a half-width dtype; `None` for f32.
    pub fn bits16(self, x: f32) -> Option<u16> {
        match self {
            DType::F32 => None,
            DType::F16 => Some(F16::from_f32(x).0),
            DType::Bf16 => Some(Bf16::from_f32(x).0),
        }
    }

    /// Widens a 16-bit pattern of this dtype to f32 (f32 tensors never use this).
    pub fn widen16(self, bits: u16) -> f32 {
        match self {
            DType::F16 => F16(bits).to_f32(),
            DType::Bf16 | DType::F32 => Bf16(bits).to_f32(),
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" | "float32" => Ok(DType::F32),
            "f16" | "float16" | "half" => Ok(DType::F16),
            "bf16" | "bfloat16" => Ok(DType::Bf16),
            _ => Err(format!("unknown dtype {s:?} (expected f32, f16 or bf16)")),
        }
    }
}
