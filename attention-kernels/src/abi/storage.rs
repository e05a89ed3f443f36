//! Storage element types: what a tensor holds in memory. Arithmetic is always f32.
//!
//! `F16` and `Bf16` are bit patterns (`u16`) so the same types cross the host/device boundary and
//! need no crate on the device side. Conversions round to nearest even, like `half` and the
//! hardware `cvt.rn` instructions that the device build uses.

/// A stored element that widens to f32 for arithmetic and narrows back for storage.
pub trait Storage: Copy + 'static {
    /// Name used in kernel entry points and messages: `f32`, `f16`, `bf16`.
    const NAME: &'static str;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

/// IEEE binary16 bits.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct F16(pub u16);

/// bfloat16 bits (the upper half of an f32).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bf16(pub u16);

impl Storage for f32 {
    const NAME: &'static str = "f32";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Storage for Bf16 {
    const NAME: &'static str = "bf16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.0 as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        #[cfg(target_arch = "nvptx64")]
        {
            Bf16(crate::arch::cvt_rn_bf16(x))
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            Bf16(bf16_bits_rne(x))
        }
    }
}

impl Storage for F16 {
    const NAME: &'static str = "f16";
    #[inline(always)]
    fn to_f32(self) -> f32 {
        #[cfg(target_arch = "nvptx64")]
        {
            crate::arch::cvt_f32_f16(self.0)
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            f16_bits_to_f32(self.0)
        }
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        #[cfg(target_arch = "nvptx64")]
        {
            F16(crate::arch::cvt_rn_f16(x))
        }
        #[cfg(not(target_arch = "nvptx64"))]
        {
            F16(f16_bits_rne(x))
        }
    }
}

/// f32 → bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
pub const fn bf16_bits_rne(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    ((bits + round) >> 16) as u16
}

/// binary16 bits → f32 (exact).
pub const fn f16_bits_to_f32(h: u16) -> f32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let mant = (h & 0x3ff) as u32;
    let bits = if exp == 0x1f {
        sign | 0x7f80_0000 | (mant << 13)
    } else if exp != 0 {
        sign | ((exp + 112) << 23) | (mant << 13)
    } else if mant == 0 {
        sign
    } else {
        // Subnormal: normalise the mantissa.
        let shift = mant.leading_zeros() - 21;
        let mant = (mant << shift) & 0x3ff;
        sign | ((113 - shift) << 23) | (mant << 13)
    };
    f32::from_bits(bits)
}

/// f32 → binary16 bits, round to nearest even, overflow to ±∞, NaN stays NaN.
pub const fn f16_bits_rne(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    if abs > 0x7f80_0000 {
        return sign | 0x7e00;
    }
    if abs >= 0x4780_0000 {
        // ≥ 65520 rounds to infinity (65504 is the largest finite half).
        return if abs < 0x477f_f000 {
            sign | 0x7bff
        } else {
            sign | 0x7c00
        };
    }
    if abs < 0x3880_0000 {
        // Result is subnormal or zero: scale into the 10-bit field and round.
        if abs < 0x3300_0000 {
            return sign;
        }
        let exp = abs >> 23;
        let mant = (abs & 0x7f_ffff) | 0x80_0000;
        let shift = 126 - exp; // 14..=24
        let half = 1u32 << (shift - 1);
        let rem = mant & ((1u32 << shift) - 1);
        let mut out = mant >> shift;
        if rem > half || (rem == half && (out & 1) == 1) {
            out += 1;
        }
        return sign | out as u16;
    }
    let round = 0x0fff + ((abs >> 13) & 1);
    let rebased = abs - (112 << 23) + round;
    sign | (rebased >> 13) as u16
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn f16_round_trip_all_bit_patterns() {
        for h in 0..=u16::MAX {
            let x = f16_bits_to_f32(h);
            if x.is_nan() {
                assert!(f16_bits_to_f32(f16_bits_rne(x)).is_nan());
            } else {
                assert_eq!(f16_bits_rne(x), h, "bits {h:#06x} -> {x}");
            }
        }
    }

    #[test]
    fn f16_rounds_to_nearest_even() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
        assert_eq!(f16_bits_rne(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // Slightly above the tie rounds up.
        assert_eq!(
            f16_bits_rne(1.0 + f32::powi(2.0, -11) + f32::powi(2.0, -20)),
            0x3c01
        );
        assert_eq!(f16_bits_rne(65504.0), 0x7bff);
        assert_eq!(f16_bits_rne(65520.0), 0x7c00);
        assert_eq!(f16_bits_rne(-1e9), 0xfc00);
        // Smallest subnormal 2^-24, and half of it ties to zero.
        assert_eq!(f16_bits_rne(f32::powi(2.0, -24)), 0x0001);
        assert_eq!(f16_bits_rne(f32::powi(2.0, -25)), 0x0000);
        assert_eq!(f16_bits_rne(3.0 * f32::powi(2.0, -25)), 0x0002);
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits_rne(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even.
        assert_eq!(bf16_bits_rne(1.0 + f32::powi(2.0, -8)), 0x3f80);
        assert_eq!(bf16_bits_rne(1.0 + 3.0 * f32::powi(2.0, -8)), 0x3f82);
        assert!(Bf16(bf16_bits_rne(f32::NAN)).to_f32().is_nan());
        assert_eq!(Bf16(bf16_bits_rne(-2.5)).to_f32(), -2.5);
    }
}
