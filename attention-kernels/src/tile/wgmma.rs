//! `wgmma.mma_async` (sm_90a): one warpgroup (4 consecutive warps, the first at a warp index
//! divisible by 4) multiplies a 64-row A by a B read straight from shared memory.
//!
//! A comes from shared memory (a [`Desc`]) or from registers ([`FragA`], the same lane layout as
//! `mma.sync`'s A: warp `w` of the group holds rows `16w ..`). The f32 accumulators of an `n`-wide
//! product are `n / 8` [`FragC`] per thread, again in `mma.sync`'s C layout with warp `w` on rows
//! `16w ..`, so scores turn into the A operand of the next product with `MmaElem::pack_a`.
//!
//! The products run asynchronously: issue them between [`fence`] and [`commit`], and read the
//! accumulators only after [`wait`] and [`Accumulator::pin`] (the compiler does not know that an
//! asm's outputs land later; the pin makes every later use depend on an asm ordered after the wait).

use core::arch::asm;

use crate::abi::storage::{Bf16, F16};
use crate::tile::mma::{FragA, FragC, MmaElem};

/// A shared-memory matrix descriptor: start address, leading and stride byte offsets (all in
/// 16-byte units) and the 128-byte swizzle mode.
#[derive(Clone, Copy)]
pub struct Desc(pub u64);

impl Desc {
    /// A matrix whose 8-row, 128-byte swizzle atoms start at `addr` (1024-byte aligned atoms, so
    /// the base-offset field stays 0), `lbo` and `sbo` bytes apart as the operand's major-ness
    /// defines (see `tile::panel`).
    #[inline(always)]
    pub const fn swizzle_128(addr: u32, lbo: u32, sbo: u32) -> Desc {
        const SWIZZLE_128B: u64 = 1 << 62;
        const fn field(bytes: u32) -> u64 {
            ((bytes & 0x3_ffff) >> 4) as u64
        }
        Desc(field(addr) | (field(lbo) << 16) | (field(sbo) << 32) | SWIZZLE_128B)
    }

    /// The same matrix `bytes` (a multiple of 16) further on: the start address field takes the
    /// offset without a carry out of it, shared memory ending below its 2^18 bytes. One
    /// descriptor's bit arithmetic then serves every k-step of an operand.
    #[inline(always)]
    pub const fn advanced(self, bytes: u32) -> Desc {
        Desc(self.0 + (bytes >> 4) as u64)
    }
}

/// Makes register values written by ordinary instructions (accumulators rescaled, A fragments
/// packed) visible to the products issued after it.
#[inline(always)]
pub fn fence() {
    // SAFETY: a warpgroup-wide ordering instruction; callers run it on all 128 threads.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) }
}

/// Closes the products issued since the last commit into one group.
#[inline(always)]
pub fn commit() {
    // SAFETY: as above.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) }
}

/// Waits until at most `PENDING` committed groups are still running.
#[inline(always)]
pub fn wait<const PENDING: u32>() {
    // SAFETY: as above.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const PENDING, options(nostack)) }
}

/// The accumulators of one `m64nNk16` product: `N / 8` fragments per thread.
pub trait Accumulator {
    /// `self (+)= A · B` with A and B K-major in shared memory; `accumulate == false` overwrites.
    ///
    /// # Safety
    /// Both descriptors must describe initialised shared memory laid out as `tile::panel` says;
    /// all 128 threads of the warpgroup must call it.
    unsafe fn mma_ss<T: Wgmma>(&mut self, a: Desc, b: Desc, accumulate: bool);
    /// `self (+)= A · B` with A and B MN-major (transposed) in shared memory.
    ///
    /// # Safety
    /// As [`Accumulator::mma_ss`].
    unsafe fn mma_ss_trans<T: Wgmma>(&mut self, a: Desc, b: Desc, accumulate: bool);
    /// `self += A · B` with A K-major and B MN-major (transposed) in shared memory.
    ///
    /// # Safety
    /// As [`Accumulator::mma_ss`].
    unsafe fn mma_ss_trans_b<T: Wgmma>(&mut self, a: Desc, b: Desc, accumulate: bool);
    /// `self += A · B` with A in registers and B MN-major (transposed) in shared memory.
    ///
    /// # Safety
    /// As [`Accumulator::mma_ss`].
    unsafe fn mma_rs_trans_b<T: Wgmma>(&mut self, a: &FragA, b: Desc);
    /// Orders every later use of the accumulators after the preceding [`wait`].
    fn pin(&mut self);
}

/// An element type `wgmma` multiplies; the asm templates are chosen per type at compile time.
pub trait Wgmma: MmaElem {
    const BF16: bool;
}

impl Wgmma for Bf16 {
    const BF16: bool = true;
}
impl Wgmma for F16 {
    const BF16: bool = false;
}

/// "{}, {}, …" with four placeholders per accumulator fragment.
macro_rules! placeholders {
    (@more $i:tt) => { ", {}, {}, {}, {}" };
    ($first:tt $($rest:tt)*) => { concat!("{}, {}, {}, {}" $(, placeholders!(@more $rest))*) };
}

macro_rules! accumulator {
    // Both operands from shared memory; `$ta`, `$tb` are the transpose flags of A and B. Without
    // `accumulate` the accumulators are outputs only, so nothing zeroes them before the product.
    (@ss $acc:ident, $a:ident, $b:ident, $accumulate:ident, $ta:literal, $tb:literal, [$($i:tt)*], $n:literal) => {{
        let c = $acc;
        macro_rules! ss {
            ($ty:literal, $sd:literal, $dir:ident) => {
                asm!(concat!("{{ .reg .pred p; setp.ne.b32 p, ", $sd, ", 0; wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty,
                             " {{", placeholders!($($i)*), "}}, {a}, {b}, p, 1, 1, ", $ta, ", ", $tb, "; }}"),
                     $($dir(reg32) c[$i].0[0], $dir(reg32) c[$i].0[1], $dir(reg32) c[$i].0[2], $dir(reg32) c[$i].0[3],)*
                     a = in(reg64) $a.0, b = in(reg64) $b.0, options(nostack))
            };
        }
        match (T::BF16, $accumulate) {
            (true, true) => ss!("bf16", "1", inout),
            (true, false) => ss!("bf16", "0", out),
            (false, true) => ss!("f16", "1", inout),
            (false, false) => ss!("f16", "0", out),
        }
    }};
    ($n:literal, $tiles:literal, [$($i:tt)*]) => {
        impl Accumulator for [FragC; $tiles] {
            #[inline(always)]
            unsafe fn mma_ss<T: Wgmma>(&mut self, a: Desc, b: Desc, accumulate: bool) {
                // SAFETY: forwarded to the caller.
                unsafe { accumulator!(@ss self, a, b, accumulate, "0", "0", [$($i)*], $n) }
            }

            #[inline(always)]
            unsafe fn mma_ss_trans<T: Wgmma>(&mut self, a: Desc, b: Desc, accumulate: bool) {
                // SAFETY: forwarded to the caller.
                unsafe { accumulator!(@ss self, a, b, accumulate, "1", "1", [$($i)*], $n) }
            }

            #[inline(always)]
            unsafe fn mma_ss_trans_b<T: Wgmma>(&mut self, a: Desc, b: Desc, accumulate: bool) {
                // SAFETY: forwarded to the caller.
                unsafe { accumulator!(@ss self, a, b, accumulate, "0", "1", [$($i)*], $n) }
            }

            #[inline(always)]
            unsafe fn mma_rs_trans_b<T: Wgmma>(&mut self, a: &FragA, b: Desc) {
                let c = self;
                macro_rules! rs {
                    ($ty:literal) => {
                        // SAFETY: the caller guarantees the descriptor and the warpgroup.
                        unsafe {
                            asm!(concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty,
                                         " {{", placeholders!($($i)*), "}}, {{{a0}, {a1}, {a2}, {a3}}}, {b}, 1, 1, 1, 1;"),
                                 $(inout(reg32) c[$i].0[0], inout(reg32) c[$i].0[1], inout(reg32) c[$i].0[2], inout(reg32) c[$i].0[3],)*
                                 a0 = in(reg32) a.0[0], a1 = in(reg32) a.0[1], a2 = in(reg32) a.0[2], a3 = in(reg32) a.0[3],
                                 b = in(reg64) b.0, options(nostack));
                        }
                    };
                }
                if T::BF16 { rs!("bf16") } else { rs!("f16") }
            }

            #[inline(always)]
            fn pin(&mut self) {
                let c = self;
                // SAFETY: a PTX comment; the operands only order the surrounding code.
                unsafe {
                    asm!(concat!("// wgmma pin ", placeholders!($($i)*)),
                         $(inout(reg32) c[$i].0[0], inout(reg32) c[$i].0[1], inout(reg32) c[$i].0[2], inout(reg32) c[$i].0[3],)*
                         options(nomem, nostack));
                }
            }
        }
    };
}

accumulator!(16, 2, [0 1]);
accumulator!(32, 4, [0 1 2 3]);
accumulator!(64, 8, [0 1 2 3 4 5 6 7]);
accumulator!(80, 10, [0 1 2 3 4 5 6 7 8 9]);
accumulator!(96, 12, [0 1 2 3 4 5 6 7 8 9 10 11]);
accumulator!(128, 16, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]);
accumulator!(160, 20, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19]);
accumulator!(192, 24, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23]);
accumulator!(256, 32, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]);

/// Makes shared memory written through the generic proxy (`cp.async`, ordinary stores) visible to
/// the tensor cores' async proxy; each writing thread runs it before the barrier that publishes
/// the data.
#[inline(always)]
pub fn fence_proxy_async() {
    // SAFETY: a memory fence has no preconditions.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) }
}
