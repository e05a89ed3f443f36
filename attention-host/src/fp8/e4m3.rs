//! The e4m3 ("E4M3FN") 8-bit float the FP8 forward reads: 1 sign bit, 4 exponent bits (bias 7),
//! 3 mantissa bits; no infinities, NaN `S.1111.111`, largest finite ±448, smallest subnormal
//! 2⁻⁹. Conversions as the hardware's `cvt.rn.satfinite.e4m3x2.f32`: round to nearest even,
//! finite values past ±448 (and ±∞) saturate to ±448, NaN stays NaN.

/// The positive NaN pattern (`0xff` is the negative one).
pub const NAN: u8 = 0x7f;
/// The largest finite e4m3 value.
pub const MAX: f32 = 448.0;

/// The value of e4m3 byte `b`.
pub fn to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m) = ((b >> 3) & 0xf, b & 7);
    if e == 0xf && m == 7 {
        return f32::NAN;
    }
    let magnitude = if e == 0 {
        m as f32 / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
    };
    sign * magnitude
}

/// The positive finite values, codes `0 ..= 0x7e` in increasing order.
fn positive_values() -> &'static [f32; 127] {
    static TABLE: std::sync::OnceLock<[f32; 127]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| to_f32(c as u8)))
}

/// `x` rounded to the nearest e4m3 (ties to the even code), saturated to ±448.
pub fn from_f32(x: f32) -> u8 {
    if x.is_nan() {
        return NAN;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let table = positive_values();
    // The first code at or above `a`, and the one below it.
    let above = table.partition_point(|&v| v < a);
    let code = if above == table.len() {
        table.len() - 1
    } else if above == 0 || table[above] == a {
        above
    } else {
        let (lo, hi) = (table[above - 1], table[above]);
        match (a - lo).total_cmp(&(hi - a)) {
            std::cmp::Ordering::Less => above - 1,
            std::cmp::Ordering::Greater => above,
            // A tie: the even code (an even mantissa).
            std::cmp::Ordering::Equal => {
                if above % 2 == 0 {
                    above
                } else {
                    above - 1
                }
            }
        }
    };
    sign | code as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        assert_eq!(to_f32(0x00), 0.0);
        assert_eq!(to_f32(0x38), 1.0);
        assert_eq!(to_f32(0x40), 2.0);
        assert_eq!(to_f32(0x7e), 448.0);
        assert_eq!(to_f32(0xfe), -448.0);
        assert_eq!(to_f32(0x01), 2f32.powi(-9));
        assert_eq!(to_f32(0x08), 2f32.powi(-6));
        assert_eq!(to_f32(0x3c), 1.5);
        assert!(to_f32(NAN).is_nan() && to_f32(0xff).is_nan());
        assert_eq!(from_f32(1.0), 0x38);
        assert_eq!(from_f32(-2.0), 0xc0);
        assert_eq!(from_f32(0.1), 0x1d); // 0.1015625 = 1.625 · 2⁻⁴
    }

    #[test]
    fn every_code_round_trips() {
        for b in 0..=255u8 {
            let x = to_f32(b);
            if x.is_nan() {
                assert!(to_f32(from_f32(x)).is_nan());
            } else if x == 0.0 {
                assert_eq!(to_f32(from_f32(x)), 0.0);
            } else {
                assert_eq!(from_f32(x), b, "code {b:#04x} = {x}");
            }
        }
    }

    #[test]
    fn rounds_to_nearest_even_and_saturates() {
        // Between 1 (0x38, even) and 1.125 (0x39): the tie goes to 1; past it, up.
        assert_eq!(from_f32(1.0625), 0x38);
        assert_eq!(from_f32(1.07), 0x39);
        // Between 1.125 (odd) and 1.25 (0x3a, even): the tie goes up.
        assert_eq!(from_f32(1.1875), 0x3a);
        // The smallest subnormal's half rounds to zero (even), just past it to 2⁻⁹.
        assert_eq!(from_f32(2f32.powi(-10)), 0x00);
        assert_eq!(from_f32(2f32.powi(-10) * 1.01), 0x01);
        assert_eq!(from_f32(500.0), 0x7e);
        assert_eq!(from_f32(f32::INFINITY), 0x7e);
        assert_eq!(from_f32(f32::NEG_INFINITY), 0xfe);
        // The rounding error is at most half a step: 2⁻⁴ relative above the subnormals.
        for i in 0..10_000 {
            let x = (i as f32 * 0.0371).sin() * 300.0;
            let r = to_f32(from_f32(x));
            assert!(
                (r - x).abs() <= x.abs() / 16.0 + 2f32.powi(-10),
                "{x} -> {r}"
            );
        }
    }
}
