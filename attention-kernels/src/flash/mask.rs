//! Which keys a query row may see, in coordinates local to one sequence.
//!
//! Every length mode reduces to one sequence of `q_len` query rows and `k_len` allowed keys:
//! a full batch item (`n_q`, `n_k`), a padded batch item (`n_q`, `key_lengths[b]`), or one packed
//! sequence (`cu_seqlens_q[s+1] - cu_seqlens_q[s]`, likewise for keys). The causal mask is
//! bottom-right aligned to that sequence's own lengths (FlashAttention-2's convention for varlen
//! and for `seqused_k`), so the last query row of a sequence sees all of its keys.

use crate::params::causal_key_end;

/// Exclusive end of the keys row `i` (local) may see: keys `0 .. key_end` are allowed.
#[inline(always)]
pub const fn key_end(i: u32, q_len: u32, k_len: u32, causal: bool) -> u32 {
    if causal { causal_key_end(i, q_len, k_len) } else { k_len }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_is_bottom_right_aligned_and_bounded_by_the_key_length() {
        // 3 rows, 5 keys: row 0 sees keys 0..3, the last row sees all.
        assert_eq!([0, 1, 2].map(|i| key_end(i, 3, 5, true)), [3, 4, 5]);
        // More rows than keys: the first rows see nothing (fully masked rows).
        assert_eq!([0, 1, 2, 3].map(|i| key_end(i, 4, 2, true)), [0, 0, 1, 2]);
        assert_eq!(key_end(0, 4, 2, false), 2);
        assert_eq!(key_end(7, 8, 0, true), 0);
    }
}
