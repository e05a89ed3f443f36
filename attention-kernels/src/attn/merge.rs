//! Merging saved `(O, LSE)` pairs of disjoint key sets (cascade attention, split-KV decode,
//! attention spread over devices): the log-domain algebra of [`LogState`] applied to parts whose
//! payload is a row of O. Shared by the merge kernel and the f64 reference.
//!
//! Policy, the forward's own: a part with `LSE = −∞` is the empty set and contributes nothing
//! (its O is never read); when every part is empty the merged row is `O = 0`, `LSE = −∞`; a NaN
//! LSE (a row that met a NaN or `+∞` score) makes the merged row NaN, whatever the order.

use super::online_state::{LogState, Real};

/// The state of one saved part without its payload: `LSE = −∞` is the empty set.
#[inline(always)]
pub fn part_state<T: Real>(lse: T) -> LogState<T, 0> {
    if lse == T::NEG_INFINITY {
        LogState::identity()
    } else {
        LogState {
            lse,
            output: [],
            count: 1,
        }
    }
}

/// `LSE` of the union of the parts whose LSEs `lses` yields: their [`LogState`]s folded in order.
#[inline(always)]
pub fn merged_lse<T: Real>(lses: impl Iterator<Item = T>) -> T {
    lses.fold(LogState::<T, 0>::identity(), |acc, lse| {
        acc.merge(&part_state(lse))
    })
    .lse
}

/// The weight `exp(LSE_part − LSE)` of a part's O in the merged O, or `None` for an empty part
/// (it is skipped, whatever its O holds). A NaN merged LSE gives NaN weights: the row is NaN.
#[inline(always)]
pub fn part_weight<T: Real>(part_lse: T, merged_lse: T) -> Option<T> {
    if part_lse == T::NEG_INFINITY {
        None
    } else {
        Some((part_lse - merged_lse).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attn::online_state::OnlineState;

    #[test]
    fn merged_lse_is_the_union_of_the_parts() {
        let scores = [0.5f64, -1.0, 2.0, 0.25];
        let whole = OnlineState::<f64, 0>::from_tile(&scores, &[[]; 4]).lse();
        let parts = [
            OnlineState::<f64, 0>::from_tile(&scores[..1], &[[]; 1]).lse(),
            OnlineState::<f64, 0>::from_tile(&scores[1..3], &[[]; 2]).lse(),
            f64::NEG_INFINITY,
            OnlineState::<f64, 0>::from_tile(&scores[3..], &[[]; 1]).lse(),
        ];
        assert!((merged_lse(parts.into_iter()) - whole).abs() < 1e-14);
        let total: f64 = parts.iter().filter_map(|&l| part_weight(l, whole)).sum();
        assert!((total - 1.0).abs() < 1e-14);
    }

    #[test]
    fn empty_parts_are_the_identity_and_nan_propagates() {
        let empty = [f64::NEG_INFINITY; 3];
        assert_eq!(merged_lse(empty.into_iter()), f64::NEG_INFINITY);
        assert_eq!(merged_lse(core::iter::empty::<f64>()), f64::NEG_INFINITY);
        assert_eq!(part_weight(f64::NEG_INFINITY, 1.0), None);
        for order in [
            [f64::NAN, 1.0, f64::NEG_INFINITY],
            [1.0, f64::NEG_INFINITY, f64::NAN],
        ] {
            let lse = merged_lse(order.into_iter());
            assert!(lse.is_nan());
            assert!(part_weight(1.0, lse).unwrap().is_nan());
        }
    }
}
