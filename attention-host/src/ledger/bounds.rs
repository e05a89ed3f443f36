//! Asymptotic IO bounds (0x0CD, 0x0CE), evaluated without their constant factors.

/// Which term of the tight forward bound is smaller: `M ≥ d²` (FA-style tiling is optimal) or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheRegime {
    /// `M ≥ d²`: `N²d²/M` is tight.
    Large,
    /// `M < d²`: `N²d/√M` is smaller; a matmul-style schedule beats FA1 asymptotically.
    Small,
}

impl CacheRegime {
    pub fn of(head_dim: f64, sram_words: f64) -> Self {
        if sram_words >= head_dim * head_dim {
            CacheRegime::Large
        } else {
            CacheRegime::Small
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            CacheRegime::Large => "large-cache (M >= d^2)",
            CacheRegime::Small => "small-cache (M < d^2)",
        }
    }
}

/// FA1's own schedule: `Θ(Nd + N²d²/M)`.
pub fn fa1_bound(n: f64, d: f64, m: f64) -> f64 {
    n * d + n * n * d * d / m
}

/// Saha and Ye, forward with standard matrix multiplication: `Θ(min(N²d/√M, N²d²/M))`.
pub fn forward_tight_bound(n: f64, d: f64, m: f64) -> f64 {
    (n * n * d / m.sqrt()).min(n * n * d * d / m)
}

/// Li et al., backward: `Θ(min((N²d² + Nd³)/M, (N²d + Nd²)/√M))`.
pub fn backward_tight_bound(n: f64, d: f64, m: f64) -> f64 {
    ((n * n * d * d + n * d * d * d) / m).min((n * n * d + n * d * d) / m.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regime_picks_the_smaller_forward_term() {
        let (n, d) = (4096.0, 64.0);
        // M = 65,536 ≥ d² = 4096: the FA term N²d²/M = 2^20 is tight.
        assert_eq!(CacheRegime::of(d, 65_536.0), CacheRegime::Large);
        assert_eq!(forward_tight_bound(n, d, 65_536.0), 1_048_576.0);
        // M = 1024 < d²: N²d/√M = 2^24·64/32 = 2^25 is smaller than N²d²/M = 2^26.
        assert_eq!(CacheRegime::of(d, 1024.0), CacheRegime::Small);
        assert_eq!(forward_tight_bound(n, d, 1024.0), 33_554_432.0);
        assert!(forward_tight_bound(n, d, 1024.0) < n * n * d * d / 1024.0);
        // At M = d² both terms meet.
        assert_eq!(forward_tight_bound(n, d, d * d), n * n * d / d);
    }

    #[test]
    fn backward_bound_keeps_the_rectangular_terms() {
        let (n, d, m) = (4096.0, 64.0, 65_536.0);
        assert_eq!(
            backward_tight_bound(n, d, m),
            (n * n * d * d + n * d * d * d) / m
        );
        // With N < d the N d³ term dominates N²d².
        assert!(backward_tight_bound(8.0, 64.0, m) > 2.0 * forward_tight_bound(8.0, 64.0, m));
    }

    #[test]
    fn fa1_bound_keeps_the_input_output_floor() {
        assert_eq!(
            fa1_bound(4096.0, 64.0, 65_536.0),
            4096.0 * 64.0 + 1_048_576.0
        );
        assert_eq!(fa1_bound(4096.0, 64.0, 4096.0 * 64.0), 2.0 * 4096.0 * 64.0);
    }
}
