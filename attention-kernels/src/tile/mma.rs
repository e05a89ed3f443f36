//! `mma.sync.aligned.m16n8k16` register fragments (f16/bf16 operands, f32 accumulators).
//!
//! Lane `l` has group `g = l / 4` and thread-in-group `t = l % 4`. A (16×16, row-major): registers
//! hold (row g, cols 2t..2t+1), (g+8, 2t..), (g, 2t+8..), (g+8, 2t+8..). B (16×8, k × n): (k 2t..2t+1,
//! col g), (k 2t+8.., col g). C (16×8 f32): (row g, cols 2t, 2t+1), (row g+8, cols 2t, 2t+1). So the
//! C fragments of two adjacent n-tiles, packed to pairs, are exactly one A fragment: that is how P
//! stays in registers between the two products.

use core::arch::asm;

use crate::abi::storage::{Bf16, F16, Storage};

/// A operand: 16×16, two packed elements per register.
#[derive(Clone, Copy, Default)]
pub struct FragA(pub [u32; 4]);

/// B operand: 16×8, two packed elements per register.
#[derive(Clone, Copy, Default)]
pub struct FragB(pub [u32; 2]);

/// Accumulator: 16×8 f32; `[0], [1]` on row g, `[2], [3]` on row g + 8.
#[derive(Clone, Copy, Default)]
pub struct FragC(pub [f32; 4]);

impl super::Quad for FragC {
    #[inline(always)]
    fn quad(&mut self) -> &mut [f32; 4] {
        &mut self.0
    }
    #[inline(always)]
    fn get(&self) -> [f32; 4] {
        self.0
    }
}

/// A 16-bit element type the tensor cores multiply.
pub trait MmaElem: Storage {
    /// `acc += a · b`.
    fn mma(acc: &mut FragC, a: &FragA, b: &FragB);
    /// Rounds two f32 to nearest even and packs them, `lo` in the low half (the lower column).
    fn pack(lo: f32, hi: f32) -> u32;

    /// The A fragment made of accumulators of n-tiles `2k` and `2k + 1` (see the module docs).
    #[inline(always)]
    fn pack_a(left: &FragC, right: &FragC) -> FragA {
        FragA([
            Self::pack(left.0[0], left.0[1]),
            Self::pack(left.0[2], left.0[3]),
            Self::pack(right.0[0], right.0[1]),
            Self::pack(right.0[2], right.0[3]),
        ])
    }
}

macro_rules! mma_elem {
    ($t:ty, $mma:literal, $cvt:literal) => {
        impl MmaElem for $t {
            #[inline(always)]
            fn mma(acc: &mut FragC, a: &FragA, b: &FragB) {
                let c = &mut acc.0;
                // SAFETY: register-only instruction; all 32 lanes run it (warp-uniform callers).
                unsafe {
                    asm!(concat!($mma, " {{{0}, {1}, {2}, {3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{0}, {1}, {2}, {3}}};"),
                         inout(reg32) c[0], inout(reg32) c[1], inout(reg32) c[2], inout(reg32) c[3],
                         a0 = in(reg32) a.0[0], a1 = in(reg32) a.0[1], a2 = in(reg32) a.0[2], a3 = in(reg32) a.0[3],
                         b0 = in(reg32) b.0[0], b1 = in(reg32) b.0[1],
                         options(pure, nomem, nostack));
                }
            }
            #[inline(always)]
            fn pack(lo: f32, hi: f32) -> u32 {
                let r: u32;
                // SAFETY: pure conversion; the first source lands in the upper half.
                unsafe {
                    asm!(concat!($cvt, " {r}, {hi}, {lo};"), r = out(reg32) r, hi = in(reg32) hi, lo = in(reg32) lo,
                         options(pure, nomem, nostack));
                }
                r
            }
        }
    };
}

mma_elem!(
    Bf16,
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "cvt.rn.bf16x2.f32"
);
mma_elem!(
    F16,
    "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
    "cvt.rn.f16x2.f32"
);

/// `body` for fragment `j` of an array of at most 16 fragments, once per fragment with `j` a
/// constant: no loop, so the fragments stay in registers whatever the body's size (a loop the
/// unroller leaves rolled indexes them at run time and moves the whole array to local memory).
/// `each_fragment!(array, |j, f| { … })` with `f: &mut` the fragment;
/// `each_fragment!(array, other, |j, f, x| { … })` with `x: &` fragment `j` of `other` too.
macro_rules! each_fragment {
    ($array:expr, |$j:ident, $f:ident| $body:block) => {
        each_fragment!(@each $array, $j, $f, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    ($array:expr, $other:expr, |$j:ident, $f:ident, $x:ident| $body:block) => {
        each_fragment!(@pair $array, $other, $j, $f, $x, $body, 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15)
    };
    (@each $array:expr, $j:ident, $f:ident, $body:block, $($n:literal)*) => {$(
        if let Some($f) = $array.get_mut($n) {
            let $j: usize = $n;
            $body
        }
    )*};
    (@pair $array:expr, $other:expr, $j:ident, $f:ident, $x:ident, $body:block, $($n:literal)*) => {$(
        if let (Some($f), Some($x)) = ($array.get_mut($n), $other.get($n)) {
            let $j: usize = $n;
            $body
        }
    )*};
}
pub(crate) use each_fragment;
