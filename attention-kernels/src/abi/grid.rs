//! How the (head, sequence) pairs of a call fold into a grid's y and z extents, which the hardware
//! limits to 65,535 each: the host's launch and the kernels' decoding share this one definition.
//!
//! The pairs are numbered `L = h + heads · s`; block `(y, z)` of a grid `(·, Y, Z)` takes
//! `L = y + Y · z`. While both counts fit (every call below 65,536 heads and sequences), `Y` is
//! `heads` and `Z` is `sequences`, so `y = h` and `z = s` as with an unfolded grid; past that, `Y`
//! is 65,535 and the few blocks with `L ≥ heads · sequences` leave at once.

/// Largest grid y or z extent (the hardware's).
pub const MAX_GRID_YZ: u32 = 65_535;

/// Grid `(y, z)` extents covering `heads · sequences` pairs, or `None` when even a folded grid
/// cannot (more than `65,535²` pairs) or a count is zero.
pub const fn fold_heads_sequences(heads: u32, sequences: u32) -> Option<(u32, u32)> {
    if heads == 0 || sequences == 0 {
        return None;
    }
    if heads <= MAX_GRID_YZ && sequences <= MAX_GRID_YZ {
        return Some((heads, sequences));
    }
    let pairs = heads as u64 * sequences as u64;
    let y = if pairs < MAX_GRID_YZ as u64 {
        pairs
    } else {
        MAX_GRID_YZ as u64
    };
    let z = pairs.div_ceil(y);
    if z > MAX_GRID_YZ as u64 {
        None
    } else {
        Some((y as u32, z as u32))
    }
}

/// The (head, sequence) pair of block `(y, z)` in a grid of y extent `grid_y` built by
/// [`fold_heads_sequences`], or `None` for a block past the last pair.
#[inline(always)]
pub const fn unfold_heads_sequences(
    y: u32,
    z: u32,
    grid_y: u32,
    heads: u32,
    sequences: u32,
) -> Option<(u32, u32)> {
    // y < grid_y <= 65,535 and z < 65,535: the pair number fits in u32.
    let pair = y + grid_y * z;
    let (h, s) = (pair % heads, pair / heads);
    if s < sequences { Some((h, s)) } else { None }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers_each_pair_once(heads: u32, sequences: u32) {
        let (gy, gz) = fold_heads_sequences(heads, sequences).unwrap();
        assert!(gy <= MAX_GRID_YZ && gz <= MAX_GRID_YZ);
        let mut seen = std::vec![false; heads as usize * sequences as usize];
        for z in 0..gz {
            for y in 0..gy {
                if let Some((h, s)) = unfold_heads_sequences(y, z, gy, heads, sequences) {
                    let at = (s * heads + h) as usize;
                    assert!(!seen[at], "pair ({h}, {s}) twice");
                    seen[at] = true;
                }
            }
        }
        assert!(
            seen.iter().all(|&x| x),
            "{heads} x {sequences}: a pair is missing"
        );
    }

    #[test]
    fn small_counts_keep_the_unfolded_grid() {
        assert_eq!(fold_heads_sequences(32, 4), Some((32, 4)));
        assert_eq!(unfold_heads_sequences(5, 3, 32, 32, 4), Some((5, 3)));
        assert_eq!(
            fold_heads_sequences(MAX_GRID_YZ, MAX_GRID_YZ),
            Some((MAX_GRID_YZ, MAX_GRID_YZ))
        );
    }

    #[test]
    fn folded_grids_cover_every_pair_once() {
        covers_each_pair_once(70_000, 1);
        covers_each_pair_once(1, 70_001);
        covers_each_pair_once(3, 65_536);
        covers_each_pair_once(65_536, 2);
    }

    #[test]
    fn too_many_pairs_or_none_are_refused() {
        assert_eq!(fold_heads_sequences(u32::MAX, 2), None);
        assert_eq!(fold_heads_sequences(0, 2), None);
        assert_eq!(fold_heads_sequences(2, 0), None);
        // 2^31 pairs fold into 65,535 x 32,769.
        assert_eq!(
            fold_heads_sequences(1 << 16, 1 << 15),
            Some((65_535, 32_769))
        );
    }
}
