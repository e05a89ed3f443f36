//! Counter-based dropout RNG (Philox-4x32-10, Salmon et al. 2011) shared by host and device.
//!
//! The keep/drop decision for one probability is a pure function of
//! `(seed, offset, batch, head, query row, key column)`, so the forward kernel, the backward kernel
//! and the CPU reference draw the same mask whatever their tiling or visit order.
//! Layout of one draw: key = `(seed_lo, seed_hi)` bumped by the call's `offset` through one Philox
//! block, counter = `(col / 4, row, head, batch)`; the four output words serve four consecutive
//! key columns, word `col % 4` deciding column `col`.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

#[inline(always)]
const fn mulhilo(a: u32, b: u32) -> (u32, u32) {
    let p = a as u64 * b as u64;
    ((p >> 32) as u32, p as u32)
}

/// Philox-4x32 with 10 rounds.
#[inline(always)]
pub const fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let mut c = counter;
    let mut k = key;
    let mut round = 0;
    while round < 10 {
        let (hi0, lo0) = mulhilo(M0, c[0]);
        let (hi1, lo1) = mulhilo(M1, c[2]);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k = [k[0].wrapping_add(W0), k[1].wrapping_add(W1)];
        round += 1;
    }
    c
}

/// Dropout configuration of one call: drop probability `p` in `[0, 1)`, and where in the RNG
/// stream this call draws from (`seed` and `offset`; a new call advances `offset`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DropoutRng {
    pub seed: u64,
    pub offset: u64,
    /// A draw `w` keeps its probability iff `w >= threshold`, `threshold = round(p·2³²)`.
    /// Zero means dropout is off (every draw keeps).
    pub threshold: u32,
    /// Inverted-dropout multiplier of kept probabilities, `1/(1-p)`.
    pub keep_scale: f32,
}

impl DropoutRng {
    /// Off: every probability kept with multiplier 1.
    pub const OFF: DropoutRng = DropoutRng {
        seed: 0,
        offset: 0,
        threshold: 0,
        keep_scale: 1.0,
    };

    /// Dropout with drop probability `p`; `None` unless `0 <= p < 1`.
    pub fn new(p: f32, seed: u64, offset: u64) -> Option<DropoutRng> {
        if !(0.0..1.0).contains(&p) {
            return None;
        }
        // Round half up; `as` saturates, so p just below 1 gives u32::MAX rather than wrapping.
        let threshold = (p as f64 * 4_294_967_296.0 + 0.5) as u64;
        let threshold = if threshold > u32::MAX as u64 {
            u32::MAX
        } else {
            threshold as u32
        };
        Some(DropoutRng {
            seed,
            offset,
            threshold,
            keep_scale: 1.0 / (1.0 - p),
        })
    }

    pub const fn enabled(&self) -> bool {
        self.threshold != 0
    }

    /// The Philox key of this call: `seed` mixed with `offset` so distinct offsets give
    /// independent streams.
    #[inline(always)]
    pub const fn key(&self) -> [u32; 2] {
        let k = philox4x32_10(
            [
                self.offset as u32,
                (self.offset >> 32) as u32,
                0x0A77_E471,
                0x5EED_D20F,
            ],
            [self.seed as u32, (self.seed >> 32) as u32],
        );
        [k[0], k[1]]
    }

    /// The four draws for columns `4·quad .. 4·quad + 4` of (batch, head, row), given `key()`.
    #[inline(always)]
    pub const fn draws(key: [u32; 2], batch: u32, head: u32, row: u32, quad: u32) -> [u32; 4] {
        philox4x32_10([quad, row, head, batch], key)
    }

    /// Whether probability (batch, head, row, col) is kept. Always true when dropout is off.
    #[inline(always)]
    pub const fn keep(&self, batch: u32, head: u32, row: u32, col: u32) -> bool {
        if !self.enabled() {
            return true;
        }
        let w = Self::draws(self.key(), batch, head, row, col / 4)[(col % 4) as usize];
        w >= self.threshold
    }

    /// Whether columns `col` (bit 0) and `col + 1` (bit 1) of (batch, head, row) are kept
    /// (`col` even), given `key()`: one Philox call for the pair. Kernels gather these bits in a
    /// loop that need not unroll and apply them in one that must (see `kernels::sm90`).
    #[inline(always)]
    pub const fn pair_keep_bits(
        &self,
        key: [u32; 2],
        batch: u32,
        head: u32,
        row: u32,
        col: u32,
    ) -> u32 {
        let w = Self::draws(key, batch, head, row, col / 4);
        // Selects rather than `w[col % 4]`: a run-time index would put `w` in local memory.
        let (a, b) = if col.is_multiple_of(4) {
            (w[0], w[1])
        } else {
            (w[2], w[3])
        };
        (a >= self.threshold) as u32 | (((b >= self.threshold) as u32) << 1)
    }

    /// Whether (batch, head, row, col) is kept, given `key()`.
    #[inline(always)]
    pub const fn keep_with_key(
        &self,
        key: [u32; 2],
        batch: u32,
        head: u32,
        row: u32,
        col: u32,
    ) -> bool {
        let w = Self::draws(key, batch, head, row, col / 4);
        let c = col % 4;
        let x = if c < 2 {
            if c == 0 { w[0] } else { w[1] }
        } else if c == 2 {
            w[2]
        } else {
            w[3]
        };
        x >= self.threshold
    }

    /// The multiplier `Z` of probability (batch, head, row, col): 0 if dropped, `1/(1-p)` if kept.
    #[inline(always)]
    pub fn multiplier(&self, batch: u32, head: u32, row: u32, col: u32) -> f32 {
        if self.keep(batch, head, row, col) {
            self.keep_scale
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors of Random123's `kat_vectors` for philox4x32_10.
    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn off_keeps_everything_and_p_bounds_are_checked() {
        assert!(DropoutRng::OFF.keep(1, 2, 3, 4));
        assert_eq!(DropoutRng::OFF.multiplier(0, 0, 0, 0), 1.0);
        assert!(DropoutRng::new(1.0, 0, 0).is_none());
        assert!(DropoutRng::new(-0.1, 0, 0).is_none());
        assert!(DropoutRng::new(f32::NAN, 0, 0).is_none());
        assert!(!DropoutRng::new(0.0, 0, 0).unwrap().enabled());
    }

    /// Kept draws of `rng` over a `4 × 4 × 64 × 64` grid of (batch, head, row, col).
    fn kept(rng: &DropoutRng) -> u64 {
        let mut kept = 0;
        for b in 0..4 {
            for h in 0..4 {
                for row in 0..64 {
                    for col in 0..64 {
                        kept += rng.keep(b, h, row, col) as u64;
                    }
                }
            }
        }
        kept
    }

    #[test]
    fn keep_fraction_is_within_five_sigma_of_one_minus_p() {
        let n = 4.0 * 4.0 * 64.0 * 64.0;
        for p in [0.1f32, 0.5, 0.9] {
            let rng = DropoutRng::new(p, 0x1234_5678_9abc, 3).unwrap();
            let q = 1.0 - p as f64;
            let sigma = (n * q * (1.0 - q)).sqrt();
            let deviation = (kept(&rng) as f64 - n * q).abs();
            assert!(
                deviation < 5.0 * sigma,
                "p = {p}: {deviation} kept draws off, sigma {sigma}"
            );
        }
    }

    #[test]
    fn same_coordinates_replay_the_same_bit() {
        let rng = DropoutRng::new(0.3, 42, 7).unwrap();
        let again = DropoutRng::new(0.3, 42, 7).unwrap();
        for (b, h, row, col) in [
            (0, 0, 0, 0),
            (1, 3, 17, 5),
            (2, 1, 63, 1023),
            (7, 15, 4095, 4094),
        ] {
            let first = rng.keep(b, h, row, col);
            assert!(
                (0..3)
                    .all(|_| rng.keep(b, h, row, col) == first
                        && again.keep(b, h, row, col) == first)
            );
            let z = rng.multiplier(b, h, row, col);
            assert_eq!(z, if first { 1.0 / 0.7 } else { 0.0 });
        }
    }

    /// Fraction of a grid on which two streams disagree, against its expectation `2p(1-p)` for
    /// independent masks.
    fn disagreements_are_independent(a: &DropoutRng, b: &DropoutRng, p: f64) {
        let mut differ = 0u64;
        let n = 64u64 * 64 * 8;
        for row in 0..64 {
            for col in 0..64 {
                for h in 0..8 {
                    differ += (a.keep(0, h, row, col) != b.keep(0, h, row, col)) as u64;
                }
            }
        }
        let q = 2.0 * p * (1.0 - p);
        let sigma = (n as f64 * q * (1.0 - q)).sqrt();
        assert!(
            (differ as f64 - n as f64 * q).abs() < 5.0 * sigma,
            "{differ} of {n} differ"
        );
    }

    #[test]
    fn different_offsets_and_seeds_draw_independent_masks() {
        let base = DropoutRng::new(0.5, 99, 0).unwrap();
        disagreements_are_independent(&base, &DropoutRng::new(0.5, 99, 1).unwrap(), 0.5);
        disagreements_are_independent(&base, &DropoutRng::new(0.5, 100, 0).unwrap(), 0.5);
        disagreements_are_independent(&base, &DropoutRng::new(0.5, 99, 1 << 32).unwrap(), 0.5);
    }

    #[test]
    fn every_coordinate_moves_the_draw() {
        let rng = DropoutRng::new(0.5, 5, 5).unwrap();
        let key = rng.key();
        let base = DropoutRng::draws(key, 1, 1, 1, 1);
        for other in [
            DropoutRng::draws(key, 2, 1, 1, 1),
            DropoutRng::draws(key, 1, 2, 1, 1),
            DropoutRng::draws(key, 1, 1, 2, 1),
            DropoutRng::draws(key, 1, 1, 1, 2),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn keyed_decisions_match_the_plain_ones() {
        let rng = DropoutRng::new(0.3, 0x1234_5678_9abc, 77).unwrap();
        let key = rng.key();
        let mut kept = 0;
        for (batch, head, row) in [(0, 0, 0), (3, 5, 1000), (1, 31, 4095)] {
            for col in (0..64).step_by(2) {
                let bits = rng.pair_keep_bits(key, batch, head, row, col);
                assert_eq!(bits & 1 == 1, rng.keep(batch, head, row, col));
                assert_eq!(bits >> 1 == 1, rng.keep(batch, head, row, col + 1));
                assert_eq!(rng.keep_with_key(key, batch, head, row, col), bits & 1 == 1);
                assert_eq!(
                    rng.keep_with_key(key, batch, head, row, col + 1),
                    bits >> 1 == 1
                );
                kept += bits.count_ones();
            }
        }
        // Both outcomes occur (p = 0.3 over 192 draws).
        assert!(kept > 100 && kept < 180, "{kept}");
        let off = DropoutRng::OFF;
        assert_eq!(off.pair_keep_bits(off.key(), 0, 0, 0, 2), 3);
    }
}
