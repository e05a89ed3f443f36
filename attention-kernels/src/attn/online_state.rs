//! Online softmax state algebra (the article's 0x08–0x09), shared by the kernels and the host.
//!
//! A state summarises one set `A` of allowed score positions of a row: `row_max = max s_j`,
//! `row_sum = Σ exp(s_j − row_max)`, `numerator = Σ exp(s_j − row_max)·v_j` and `count = |A|`.
//! States of disjoint sets merge under one common maximum, so any partition of a row into tiles,
//! folded in any order or tree, represents the dense row. Three equivalent forms are provided:
//! unnormalised `(m, l, u)` ([`OnlineState`]), normalised `(m, l, O)` ([`NormalizedState`], what
//! Algorithm 1 keeps in HBM) and log-domain `(LSE, O)` ([`LogState`], for split reductions).
//!
//! The empty set (an empty or fully masked tile) is `count == 0`. Every merge takes an explicit
//! identity branch for it, so `exp(−∞ − −∞)` is never evaluated.
//!
//! Exceptional scores follow IEEE propagation: a score of `−∞` is a masked position (it joins no
//! set), a NaN or `+∞` score makes the state NaN (`exp(∞ − ∞)`), and the maximum propagates NaN so
//! no merge order can hide it.

use core::ops::{Add, Div, Mul, Sub};

/// The float operations the algebra needs. `exp` and `ln` come from std on the host and from the
/// hardware approximations on the device.
pub trait Real:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;

    /// Maximum that returns NaN when either side is NaN (`f32::max` would drop it).
    #[inline(always)]
    fn max_nan(self, other: Self) -> Self {
        #[allow(clippy::eq_op)]
        let self_nan = self != self;
        if self_nan || self >= other {
            self
        } else {
            other
        }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl Real for f64 {
    const ZERO: f64 = 0.0;
    const ONE: f64 = 1.0;
    const NEG_INFINITY: f64 = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> f64 {
        std::primitive::f64::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> f64 {
        std::primitive::f64::ln(self)
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    const NEG_INFINITY: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> f32 {
        std::primitive::f32::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> f32 {
        std::primitive::f32::ln(self)
    }
}

#[cfg(target_arch = "nvptx64")]
impl Real for f32 {
    const ZERO: f32 = 0.0;
    const ONE: f32 = 1.0;
    const NEG_INFINITY: f32 = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> f32 {
        crate::arch::exp(self)
    }
    #[inline(always)]
    fn ln(self) -> f32 {
        let r: f32;
        // SAFETY: pure arithmetic instruction; ln x = log2 x · ln 2.
        unsafe {
            core::arch::asm!("lg2.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) self,
                 options(pure, nomem, nostack));
        }
        r * core::f32::consts::LN_2
    }
}

/// The common maximum of two non-empty states and the factors that move each into it:
/// `alpha = exp(m_a − m)`, `beta = exp(m_b − m)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rescale<T> {
    pub row_max: T,
    pub alpha: T,
    pub beta: T,
}

/// Coordinates of the union of two non-empty sets with maxima `m_a` and `m_b`. Callers take the
/// identity branch for empty sets first: with both maxima `−∞` this is NaN.
#[inline(always)]
pub fn rescale<T: Real>(m_a: T, m_b: T) -> Rescale<T> {
    let row_max = m_a.max_nan(m_b);
    Rescale {
        row_max,
        alpha: (m_a - row_max).exp(),
        beta: (m_b - row_max).exp(),
    }
}

/// Unnormalised state `(m, l, u, n)` of one allowed set, with a value payload of `D` components.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OnlineState<T, const D: usize> {
    pub row_max: T,
    pub row_sum: T,
    pub numerator: [T; D],
    pub count: u32,
}

impl<T: Real, const D: usize> OnlineState<T, D> {
    /// The empty set `(−∞, 0, 0, 0)`.
    pub const fn identity() -> Self {
        OnlineState {
            row_max: T::NEG_INFINITY,
            row_sum: T::ZERO,
            numerator: [T::ZERO; D],
            count: 0,
        }
    }

    pub const fn is_identity(&self) -> bool {
        self.count == 0
    }

    /// State of one tile: the positions with a score other than `−∞` (masked) form the set.
    /// `scores` and `values` pair up position by position.
    pub fn from_tile(scores: &[T], values: &[[T; D]]) -> Self {
        let mut row_max = T::NEG_INFINITY;
        let mut count = 0;
        for &s in scores {
            if s != T::NEG_INFINITY {
                row_max = row_max.max_nan(s);
                count += 1;
            }
        }
        if count == 0 {
            return Self::identity();
        }
        let mut row_sum = T::ZERO;
        let mut numerator = [T::ZERO; D];
        for (&s, v) in scores.iter().zip(values) {
            if s == T::NEG_INFINITY {
                continue;
            }
            let p = (s - row_max).exp();
            row_sum = row_sum + p;
            for (u, &x) in numerator.iter_mut().zip(v) {
                *u = *u + p * x;
            }
        }
        OnlineState {
            row_max,
            row_sum,
            numerator,
            count,
        }
    }

    /// `self ⊕ other` for disjoint sets.
    pub fn merge(&self, other: &Self) -> Self {
        if other.is_identity() {
            return *self;
        }
        if self.is_identity() {
            return *other;
        }
        let r = rescale(self.row_max, other.row_max);
        let mut numerator = [T::ZERO; D];
        for (u, (&a, &b)) in numerator
            .iter_mut()
            .zip(self.numerator.iter().zip(&other.numerator))
        {
            *u = r.alpha * a + r.beta * b;
        }
        OnlineState {
            row_max: r.row_max,
            row_sum: r.alpha * self.row_sum + r.beta * other.row_sum,
            numerator,
            count: self.count + other.count,
        }
    }

    /// Finalisation `O = u / l`; zero for the empty set (the all-masked row policy).
    pub fn output(&self) -> [T; D] {
        if self.is_identity() {
            return [T::ZERO; D];
        }
        self.numerator.map(|u| u / self.row_sum)
    }

    /// `LSE = m + ln l`; `−∞` for the empty set.
    pub fn lse(&self) -> T {
        if self.is_identity() {
            T::NEG_INFINITY
        } else {
            self.row_max + self.row_sum.ln()
        }
    }

    pub fn normalized(&self) -> NormalizedState<T, D> {
        NormalizedState {
            row_max: self.row_max,
            row_sum: self.row_sum,
            output: self.output(),
            count: self.count,
        }
    }

    pub fn log_domain(&self) -> LogState<T, D> {
        LogState {
            lse: self.lse(),
            output: self.output(),
            count: self.count,
        }
    }
}

/// Normalised state `(m, l, O, n)`: the partial output carried directly (Algorithm 1, line 12).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormalizedState<T, const D: usize> {
    pub row_max: T,
    pub row_sum: T,
    pub output: [T; D],
    pub count: u32,
}

impl<T: Real, const D: usize> NormalizedState<T, D> {
    pub const fn identity() -> Self {
        NormalizedState {
            row_max: T::NEG_INFINITY,
            row_sum: T::ZERO,
            output: [T::ZERO; D],
            count: 0,
        }
    }

    pub const fn is_identity(&self) -> bool {
        self.count == 0
    }

    /// Each side's output weighted by its mass in the union, `alpha·l_a` and `beta·l_b`.
    pub fn merge(&self, other: &Self) -> Self {
        if other.is_identity() {
            return *self;
        }
        if self.is_identity() {
            return *other;
        }
        let r = rescale(self.row_max, other.row_max);
        let left_mass = r.alpha * self.row_sum;
        let right_mass = r.beta * other.row_sum;
        let row_sum = left_mass + right_mass;
        let mut output = [T::ZERO; D];
        for (o, (&a, &b)) in output.iter_mut().zip(self.output.iter().zip(&other.output)) {
            *o = (left_mass * a + right_mass * b) / row_sum;
        }
        NormalizedState {
            row_max: r.row_max,
            row_sum,
            output,
            count: self.count + other.count,
        }
    }

    pub fn lse(&self) -> T {
        if self.is_identity() {
            T::NEG_INFINITY
        } else {
            self.row_max + self.row_sum.ln()
        }
    }
}

/// Log-domain state `(LSE, O, n)`: merges by `logaddexp` of the two partition functions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogState<T, const D: usize> {
    pub lse: T,
    pub output: [T; D],
    pub count: u32,
}

impl<T: Real, const D: usize> LogState<T, D> {
    pub const fn identity() -> Self {
        LogState {
            lse: T::NEG_INFINITY,
            output: [T::ZERO; D],
            count: 0,
        }
    }

    pub const fn is_identity(&self) -> bool {
        self.count == 0
    }

    /// `L = logaddexp(L_a, L_b)`, `O = exp(L_a − L)·O_a + exp(L_b − L)·O_b`.
    pub fn merge(&self, other: &Self) -> Self {
        if other.is_identity() {
            return *self;
        }
        if self.is_identity() {
            return *other;
        }
        let r = rescale(self.lse, other.lse);
        let lse = r.row_max + (r.alpha + r.beta).ln();
        let left = (self.lse - lse).exp();
        let right = (other.lse - lse).exp();
        let mut output = [T::ZERO; D];
        for (o, (&a, &b)) in output.iter_mut().zip(self.output.iter().zip(&other.output)) {
            *o = left * a + right * b;
        }
        LogState {
            lse,
            output,
            count: self.count + other.count,
        }
    }
}

#[cfg(test)]
mod tests;
