//! Index arithmetic of the 8-bit `wgmma` operands (`tile::wgmma_fp8`), plain functions that
//! compile for the host too, where the tests below check them against the PTX ISA's fragment
//! layouts.

/// The key (inside its 32-key k-step) that k position `pos` of the 8-bit products stands for:
/// position `16h + 4t + i` is key `16h + 2t + (i & 1) + 8 (i >> 1)`, which lane `t`'s f32
/// accumulators hold (fragments `2h` and `2h + 1`, elements `i & 1`).
#[inline(always)]
pub const fn key_of_position(pos: u32) -> u32 {
    let (h, t, i) = (pos / 16, (pos / 4) % 4, pos % 4);
    16 * h + 2 * t + (i & 1) + 8 * (i >> 1)
}

/// The 4×4 byte square that producer thread `p` (0..128) moves in its step `u` (0..8) of a
/// 128-key, 128-column V transpose: key group `kg` (positions `4kg .. 4kg + 4`) and column group
/// `cg` (columns `4cg .. 4cg + 4`). A warp's lanes span 8 key groups and 4 column groups.
#[inline(always)]
pub const fn transpose_square(p: u32, u: u32) -> (u32, u32) {
    (p % 8 + 8 * (u % 4), p / 8 + 16 * (u / 4))
}

/// Whether the e4m3 byte `b` is a NaN (`S.1111.111`; e4m3 has no infinities).
#[inline(always)]
pub const fn is_nan(b: u8) -> bool {
    b & 0x7f == 0x7f
}

/// A mask of `0xff` in each byte of `w` (four e4m3 values) that is a NaN, 0 elsewhere: the low
/// seven bits of a byte plus 1 carry into its eighth exactly when they are all ones, and never
/// past it.
#[inline(always)]
pub const fn nan_bytes(w: u32) -> u32 {
    let carried = ((w & 0x7f7f_7f7f) + 0x0101_0101) & 0x8080_8080;
    (carried >> 7) * 0xff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_bytes_marks_exactly_the_nans() {
        for x in 0..=255u8 {
            for (shift, other) in [(0, 0x7fu8), (8, 0x00), (16, 0xff), (24, 0x7e)] {
                let w = (x as u32) << shift | (other as u32) << ((shift + 8) % 32);
                let m = nan_bytes(w);
                for byte in 0..4 {
                    let v = (w >> (8 * byte)) as u8;
                    let marked = (m >> (8 * byte)) as u8;
                    assert_eq!(marked, if is_nan(v) { 0xff } else { 0 }, "w {w:#010x}");
                }
            }
        }
        assert!(is_nan(0x7f) && is_nan(0xff) && !is_nan(0x7e) && !is_nan(0xfe));
    }

    #[test]
    fn positions_are_a_permutation_of_each_k_step() {
        let mut seen = [false; 32];
        for pos in 0..32 {
            let key = key_of_position(pos) as usize;
            assert!(!seen[key], "key {key} twice");
            seen[key] = true;
        }
    }

    /// PTX ISA: the 8-bit A fragment of lane (g, t) holds in register `r`, byte `b` row
    /// `g + 8 (r % 2)` at k `4t + b + 16 (r / 2)`; the f32 accumulators hold in fragment `n`,
    /// element `e` row `g + 8 (e / 2)` at column `8n + 2t + e % 2`. `pack_p` puts fragment
    /// `2 (r / 2) + b / 2`, element `2 (r % 2) + b % 2` into register `r`, byte `b`: that value's
    /// key must be the one `key_of_position` says the k position stands for.
    #[test]
    fn packed_p_meets_the_transposed_v() {
        for t in 0..4 {
            for r in 0..4 {
                for b in 0..4 {
                    let pos = 4 * t + b + 16 * (r / 2);
                    let (n, e) = (2 * (r / 2) + b / 2, 2 * (r % 2) + b % 2);
                    let key = 8 * n + 2 * t + e % 2;
                    assert_eq!(key_of_position(pos), key, "t {t} r {r} b {b}");
                }
            }
        }
    }

    #[test]
    fn the_transpose_covers_the_block_once() {
        let mut seen = [[false; 32]; 32];
        for p in 0..128 {
            for u in 0..8 {
                let (kg, cg) = transpose_square(p, u);
                assert!(!seen[kg as usize][cg as usize], "({kg}, {cg}) twice");
                seen[kg as usize][cg as usize] = true;
            }
        }
        assert!(seen.iter().flatten().all(|&s| s));
    }
}
