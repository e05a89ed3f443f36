//! `wgmma` on 8-bit floats (e4m3, sm_90a): `m64nNk32` products whose operands are both K-major,
//! for 8-bit types have no transpose, so `P·V` reads a V tile transposed in shared memory
//! ([`transpose_4x4`] builds it) and P, f32 accumulators, becomes the A operand's bytes in
//! registers ([`pack_p`]).
//!
//! The 8-bit A fragment of a k-step of 32 keys holds, per lane `(g, t)`, bytes of row g at k
//! positions `4t .. 4t + 4` and `16 + 4t .. 16 + 4t + 4` (registers 0 and 2) and the same of row
//! g + 8 (1 and 3). The accumulators give the lane keys `8n + 2t, + 1` of fragments `n = 0 .. 4`
//! instead. Rather than exchanging bytes between lanes, the kernel stores V's keys in the order
//! `tile::fp8_layout::key_of_position` gives, so that position `4t + i` of the product's K is the key the lane
//! already holds there.

use core::arch::asm;

use crate::tile::mma::{FragA, FragC};
use crate::tile::wgmma::Desc;

/// Two f32 as e4m3 bytes, round to nearest even, saturated to ±448 (NaN stays NaN): `lo` in the
/// low byte.
#[inline(always)]
fn e4m3x2(lo: f32, hi: f32) -> u32 {
    let r: u16;
    // SAFETY: register-only conversion (sm_89+).
    unsafe {
        asm!("cvt.rn.satfinite.e4m3x2.f32 {r}, {hi}, {lo};", r = out(reg16) r, hi = in(reg32) hi,
             lo = in(reg32) lo, options(pure, nomem, nostack))
    };
    r as u32
}

/// The weights (scores after `RowState::fold_biased`, `NK` fragments of 8 keys) as
/// `NP = NK / 4` 8-bit A fragments, one per 32-key k-step, in the key order of
/// `tile::fp8_layout::key_of_position`.
#[inline(always)]
pub fn pack_p<const NK: usize, const NP: usize>(s: &[FragC; NK]) -> [FragA; NP] {
    let mut p = [FragA::default(); NP];
    let word = |a: &FragC, b: &FragC, r: usize| {
        let (lo, hi) = (2 * r, 2 * r + 1);
        e4m3x2(a.0[lo], a.0[hi]) | (e4m3x2(b.0[lo], b.0[hi]) << 16)
    };
    for (kk, a) in p.iter_mut().enumerate() {
        let f = &s[4 * kk..4 * kk + 4];
        *a = FragA([
            word(&f[0], &f[1], 0),
            word(&f[0], &f[1], 1),
            word(&f[2], &f[3], 0),
            word(&f[2], &f[3], 1),
        ]);
    }
    p
}

/// The 4×4 byte transpose of the words `w` (word `j`, byte `i` → word `i`, byte `j`): four rows
/// of four bytes to four columns.
#[inline(always)]
pub fn transpose_4x4(w: [u32; 4]) -> [u32; 4] {
    let prmt = |a: u32, b: u32, sel: u32| -> u32 {
        let r: u32;
        // SAFETY: register-only byte permute.
        unsafe {
            asm!("prmt.b32 {r}, {a}, {b}, {s};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
                 s = in(reg32) sel, options(pure, nomem, nostack))
        };
        r
    };
    // Bytes 0, 1 (2, 3) of two words interleaved, then the interleaved pairs joined.
    let (lo01, hi01) = (prmt(w[0], w[1], 0x5140), prmt(w[0], w[1], 0x7362));
    let (lo23, hi23) = (prmt(w[2], w[3], 0x5140), prmt(w[2], w[3], 0x7362));
    [
        prmt(lo01, lo23, 0x5410),
        prmt(lo01, lo23, 0x7632),
        prmt(hi01, hi23, 0x5410),
        prmt(hi01, hi23, 0x7632),
    ]
}

/// The accumulators of one `m64nNk32` e4m3 product: `N / 8` fragments per thread.
pub trait E4m3Accumulator {
    /// `self (+)= A · B`, both K-major e4m3 in shared memory; `accumulate == false` overwrites.
    ///
    /// # Safety
    /// Both descriptors describe initialised shared memory in `tile::panel`'s layout (a 128-byte
    /// row: 128 elements); all 128 threads of the warpgroup call it.
    unsafe fn mma_ss_e4m3(&mut self, a: Desc, b: Desc, accumulate: bool);
    /// `self += A · B` with A's e4m3 bytes in registers ([`pack_p`]) and B K-major in shared
    /// memory.
    ///
    /// # Safety
    /// As [`E4m3Accumulator::mma_ss_e4m3`].
    unsafe fn mma_rs_e4m3(&mut self, a: &FragA, b: Desc);
}

/// "{}, {}, …" with four placeholders per accumulator fragment.
macro_rules! placeholders {
    (@more $i:tt) => { ", {}, {}, {}, {}" };
    ($first:tt $($rest:tt)*) => { concat!("{}, {}, {}, {}" $(, placeholders!(@more $rest))*) };
}

macro_rules! e4m3_accumulator {
    ($n:literal, $tiles:literal, [$($i:tt)*]) => {
        impl E4m3Accumulator for [FragC; $tiles] {
            #[inline(always)]
            unsafe fn mma_ss_e4m3(&mut self, a: Desc, b: Desc, accumulate: bool) {
                let c = self;
                macro_rules! ss {
                    ($sd:literal, $dir:ident) => {
                        // SAFETY: forwarded to the caller.
                        unsafe {
                            asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, ", $sd, ", 0; wgmma.mma_async.sync.aligned.m64n", $n,
                                         "k32.f32.e4m3.e4m3 {{", placeholders!($($i)*), "}}, {a}, {b}, p, 1, 1; }}"),
                                 $($dir(reg32) c[$i].0[0], $dir(reg32) c[$i].0[1], $dir(reg32) c[$i].0[2], $dir(reg32) c[$i].0[3],)*
                                 a = in(reg64) a.0, b = in(reg64) b.0, options(nostack))
                        }
                    };
                }
                if accumulate { ss!("1", inout) } else { ss!("0", out) }
            }

            #[inline(always)]
            unsafe fn mma_rs_e4m3(&mut self, a: &FragA, b: Desc) {
                let c = self;
                // SAFETY: forwarded to the caller.
                unsafe {
                    asm!(concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 {{", placeholders!($($i)*),
                                 "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, 1, 1, 1;"),
                         $(inout(reg32) c[$i].0[0], inout(reg32) c[$i].0[1], inout(reg32) c[$i].0[2], inout(reg32) c[$i].0[3],)*
                         a0 = in(reg32) a.0[0], a1 = in(reg32) a.0[1], a2 = in(reg32) a.0[2], a3 = in(reg32) a.0[3],
                         b = in(reg64) b.0, options(nostack));
                }
            }
        }
    };
}

e4m3_accumulator!(64, 8, [0 1 2 3 4 5 6 7]);
e4m3_accumulator!(128, 16, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]);
