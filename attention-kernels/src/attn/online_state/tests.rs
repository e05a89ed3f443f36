use super::*;
use approx::assert_relative_eq;
use std::vec::Vec;

/// The article's three-block row (0x09G, 0x11).
const SCORES: [f64; 5] = [0.0, -2.0, 3.0, 1.0, -1.0];
const VALUES: [[f64; 2]; 5] = [[1.0, 0.0], [0.0, 2.0], [4.0, 1.0], [2.0, 3.0], [-1.0, 2.0]];
const BLOCKS: [core::ops::Range<usize>; 3] = [0..2, 2..4, 4..5];
const OUTPUT: [f64; 2] = [3.554972349613208, 1.2032242390332164];
const LSE: f64 = 3.19076575192487;

fn block_states() -> Vec<OnlineState<f64, 2>> {
    BLOCKS
        .iter()
        .map(|b| OnlineState::from_tile(&SCORES[b.clone()], &VALUES[b.clone()]))
        .collect()
}

/// The three merge trees of 0x08H over states `s`, with `merge` of the form under test.
fn trees<S: Copy>(s: &[S], merge: impl Fn(&S, &S) -> S) -> [S; 3] {
    let sequential = merge(&merge(&s[0], &s[1]), &s[2]);
    let balanced = merge(&s[0], &merge(&s[1], &s[2]));
    let permuted = merge(&merge(&s[2], &s[0]), &s[1]);
    [sequential, balanced, permuted]
}

#[test]
fn three_block_trace_intermediate_states() {
    let s = block_states();
    let r = rescale(s[0].row_max, s[1].row_max);
    assert!((r.alpha - 0.049787).abs() < 1e-6 && r.beta == 1.0);
    let first_two = s[0].merge(&s[1]);
    assert_eq!(first_two.row_max, 3.0);
    assert_relative_eq!(
        [first_two.row_sum][..],
        [1.191860][..],
        epsilon = 1e-6,
        max_relative = 0.0
    );
    assert_relative_eq!(
        first_two.numerator[..],
        [4.320458, 1.419482][..],
        epsilon = 1e-6,
        max_relative = 0.0
    );
    let all = first_two.merge(&s[2]);
    assert_eq!((all.row_max, all.count), (3.0, 5));
    assert_relative_eq!(
        [all.row_sum][..],
        [1.2101759374922962][..],
        epsilon = 1e-12,
        max_relative = 0.0
    );
    assert_relative_eq!(
        all.numerator[..],
        [4.302141995952355, 1.4561130214854774][..],
        epsilon = 1e-12,
        max_relative = 0.0
    );
}

#[test]
fn three_block_trace_every_form_and_tree() {
    let s = block_states();
    for state in trees(&s, |a, b| a.merge(b)) {
        assert_relative_eq!(
            state.output()[..],
            OUTPUT[..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        assert_relative_eq!(
            [state.lse()][..],
            [LSE][..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
    }
    let normalized: Vec<_> = s.iter().map(|x| x.normalized()).collect();
    for state in trees(&normalized, |a, b| a.merge(b)) {
        assert_relative_eq!(
            state.output[..],
            OUTPUT[..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        assert_relative_eq!(
            [state.lse()][..],
            [LSE][..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
    }
    let log: Vec<_> = s.iter().map(|x| x.log_domain()).collect();
    for state in trees(&log, |a, b| a.merge(b)) {
        assert_relative_eq!(
            state.output[..],
            OUTPUT[..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        assert_relative_eq!(
            [state.lse][..],
            [LSE][..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        assert_eq!(state.count, 5);
    }
}

#[test]
fn three_block_trace_in_f32() {
    let scores = SCORES.map(|x| x as f32);
    let values = VALUES.map(|v| v.map(|x| x as f32));
    let s: Vec<OnlineState<f32, 2>> = BLOCKS
        .iter()
        .map(|b| OnlineState::from_tile(&scores[b.clone()], &values[b.clone()]))
        .collect();
    let all = s[0].merge(&s[1]).merge(&s[2]);
    let o = all.output();
    assert!((o[0] as f64 - OUTPUT[0]).abs() < 1e-5 && (o[1] as f64 - OUTPUT[1]).abs() < 1e-5);
    assert!((all.lse() as f64 - LSE).abs() < 1e-5);
}

/// 0x09H: adding locally normalised block outputs gives 101; the merge gives ≈ 99.9910116300.
#[test]
fn naive_block_softmax_counterexample() {
    let b1 = OnlineState::<f64, 1>::from_tile(&[0.0, 0.0], &[[1.0], [1.0]]);
    let b2 = OnlineState::<f64, 1>::from_tile(&[10.0], &[[100.0]]);
    let naive = b1.output()[0] + b2.output()[0];
    assert_eq!(naive, 101.0);
    let exact = b1.merge(&b2).output()[0];
    assert!((exact - 99.9910116300).abs() < 1e-9, "{exact}");
    let r = rescale(b1.row_max, b2.row_max);
    let masses = [r.alpha * b1.row_sum, r.beta * b2.row_sum];
    let total = masses[0] + masses[1];
    assert!((masses[0] / total * 1.0 + masses[1] / total * 100.0 - exact).abs() < 1e-12);
}

#[test]
fn identity_laws_hold_exactly_and_never_make_nan() {
    let e = OnlineState::<f64, 2>::identity();
    for s in block_states() {
        assert_eq!(e.merge(&s), s);
        assert_eq!(s.merge(&e), s);
        assert_eq!(
            NormalizedState::identity().merge(&s.normalized()),
            s.normalized()
        );
        assert_eq!(s.log_domain().merge(&LogState::identity()), s.log_domain());
    }
    let masked = OnlineState::<f64, 2>::from_tile(&[f64::NEG_INFINITY; 3], &[[1.0, 2.0]; 3]);
    assert_eq!(masked, e);
    let empty = OnlineState::<f64, 2>::from_tile(&[], &[]);
    let both = masked.merge(&empty);
    assert_eq!(both, e);
    assert_eq!(both.output(), [0.0, 0.0]);
    assert_eq!(both.lse(), f64::NEG_INFINITY);
    assert_eq!(
        NormalizedState::<f64, 2>::identity()
            .merge(&masked.normalized())
            .lse(),
        f64::NEG_INFINITY
    );
    assert_eq!(
        LogState::<f64, 2>::identity()
            .merge(&masked.log_domain())
            .output,
        [0.0, 0.0]
    );
}

/// 0x0AD: query row 6 against three key tiles, keys 7.. masked before each tile maximum.
#[test]
fn masked_row_six_trace() {
    let ninf = f64::NEG_INFINITY;
    let scores = [0.0, -2.0, 3.0, 1.0, -1.0, 4.0, 2.0, ninf, ninf, ninf];
    let values = [[0.0]; 10];
    let tiles: Vec<OnlineState<f64, 1>> = [0..4, 4..8, 8..10]
        .iter()
        .map(|t| OnlineState::from_tile(&scores[t.clone()], &values[t.clone()]))
        .collect();
    let first = tiles[0];
    assert_eq!(first.row_max, 3.0);
    assert!((first.row_sum - 1.191860298604).abs() < 1e-12);
    let r = rescale(first.row_max, tiles[1].row_max);
    assert!((r.alpha - 0.367879441171).abs() < 1e-12 && r.beta == 1.0);
    let second = first.merge(&tiles[1]);
    assert_eq!((second.row_max, second.count), (4.0, 7));
    assert!((second.row_sum - 1.580534130840).abs() < 1e-12);
    assert!(tiles[2].is_identity());
    assert_eq!(second.merge(&tiles[2]), second);

    // Finalising the printed tile-2 state gives the printed output.
    let printed = OnlineState {
        row_max: 4.0,
        row_sum: 1.580534130840,
        numerator: [3.839623, 0.598530, 0.930406, 1.706961],
        count: 7,
    };
    assert_relative_eq!(
        printed.output()[..],
        [2.429320, 0.378688, 0.588666, 1.079990][..],
        epsilon = 1e-6,
        max_relative = 0.0
    );
}

/// splitmix64: a tiny deterministic source so this no_std crate needs no RNG dependency.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn dense_row(scores: &[f64], values: &[[f64; 3]]) -> ([f64; 3], f64) {
    let m = scores
        .iter()
        .copied()
        .filter(|s| *s != f64::NEG_INFINITY)
        .fold(f64::NEG_INFINITY, f64::max);
    let mut l = 0.0;
    let mut u = [0.0; 3];
    for (s, v) in scores.iter().zip(values) {
        let p = (s - m).exp();
        l += p;
        for c in 0..3 {
            u[c] += p * v[c];
        }
    }
    (u.map(|x| x / l), m + l.ln())
}

#[test]
fn random_partitions_and_orders_match_the_dense_row() {
    let mut rng = Mix(7);
    for _ in 0..200 {
        let n = 1 + rng.below(40);
        let mut scores: Vec<f64> = (0..n).map(|_| rng.uniform(-20.0, 20.0)).collect();
        // Mask some positions but keep at least one allowed.
        for s in scores.iter_mut().skip(1) {
            if rng.below(4) == 0 {
                *s = f64::NEG_INFINITY;
            }
        }
        let values: Vec<[f64; 3]> = (0..n)
            .map(|_| {
                [
                    rng.uniform(-5.0, 5.0),
                    rng.uniform(-5.0, 5.0),
                    rng.uniform(-5.0, 5.0),
                ]
            })
            .collect();
        let (want_o, want_lse) = dense_row(&scores, &values);

        let mut cuts = std::vec![0, n];
        for _ in 0..rng.below(n) {
            cuts.push(rng.below(n + 1));
        }
        cuts.sort_unstable();
        let mut tiles: Vec<OnlineState<f64, 3>> = cuts
            .windows(2)
            .map(|w| OnlineState::from_tile(&scores[w[0]..w[1]], &values[w[0]..w[1]]))
            .collect();
        for i in (1..tiles.len()).rev() {
            tiles.swap(i, rng.below(i + 1));
        }
        let folded = tiles
            .iter()
            .fold(OnlineState::identity(), |acc, t| acc.merge(t));
        let allowed = scores.iter().filter(|s| **s != f64::NEG_INFINITY).count() as u32;
        assert_eq!(folded.count, allowed);
        assert_relative_eq!(
            folded.output()[..],
            want_o[..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        assert!((folded.lse() - want_lse).abs() < 1e-12);

        let normalized = tiles.iter().fold(NormalizedState::identity(), |acc, t| {
            acc.merge(&t.normalized())
        });
        assert_relative_eq!(
            normalized.output[..],
            want_o[..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        let log = tiles
            .iter()
            .fold(LogState::identity(), |acc, t| acc.merge(&t.log_domain()));
        assert_relative_eq!(
            log.output[..],
            want_o[..],
            epsilon = 1e-12,
            max_relative = 0.0
        );
        assert!((log.lse - want_lse).abs() < 1e-12);
    }
}

#[test]
fn nan_and_positive_infinity_poison_the_row_in_any_order() {
    for bad in [f64::NAN, f64::INFINITY] {
        let bad_tile = OnlineState::from_tile(&[1.0, bad], &[[1.0], [2.0]]);
        let good = OnlineState::from_tile(&[5.0], &[[3.0]]);
        for state in [bad_tile.merge(&good), good.merge(&bad_tile)] {
            assert!(
                state.output()[0].is_nan() && state.lse().is_nan(),
                "{bad}: {state:?}"
            );
        }
        let log = good.log_domain().merge(&bad_tile.log_domain());
        assert!(log.lse.is_nan() && log.output[0].is_nan());
    }
    let masked = OnlineState::from_tile(&[f64::NEG_INFINITY, 2.0], &[[f64::NAN], [4.0]]);
    assert_eq!(
        (masked.output(), masked.lse(), masked.count),
        ([4.0], 2.0, 1)
    );
}
