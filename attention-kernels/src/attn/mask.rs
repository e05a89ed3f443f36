//! What masked keys and non-finite inputs do, in one place for every kernel family (the
//! reference's policy, `attention_host::reference`):
//! - a masked key (causal, key length, another packed sequence, a tile's tail past the keys)
//!   never contributes, whatever K and V hold there;
//! - a NaN or `+∞` score at an allowed key makes its row's O and LSE NaN; a row's sum `ℓ` is 0
//!   only for a row with nothing allowed ([`row_is_empty`]): testing `ℓ > 0` instead would turn a
//!   NaN row into an empty one;
//! - a non-finite V (or K, Q in the backward products) at an allowed position reaches the output
//!   by IEEE arithmetic (`0 · ∞ = NaN` even where the weight underflows to 0).
//!
//! Keys masked for every row of a tile are never loaded (zero-filled), so the products see only
//! zeros there. Keys masked for some rows only (the causal diagonal) are where `0 · NaN` could
//! leak a masked key into an allowed row through a matrix product; the kernels then take a slow
//! path, only on diagonal tiles whose operand holds a non-finite value (`sanitize_own_chunks`,
//! each thread on the chunks it copied, before the barrier that publishes them): the product
//! runs on the tile with non-finite values replaced by 0, and [`Poison`] adds the non-finite
//! contributions of the allowed positions back.
//!
//! The exact (SIMT) kernels mark masked weights with the sentinel [`MASKED`] (`−0`, which `exp`
//! and products of non-negative factors never give) and skip them in their products
//! ([`contribution`]).

use crate::tile::Quad;

/// The weight of a masked position in the exact kernels' P, P∘Z and dS tiles: `−0.0`.
pub const MASKED: f32 = -0.0;

/// Whether `w` is the [`MASKED`] sentinel (bitwise: `+0.0` is an allowed weight that underflowed).
#[inline(always)]
pub fn is_masked(w: f32) -> bool {
    w.to_bits() == MASKED.to_bits()
}

/// An allowed weight as stored beside [`MASKED`] ones: a `−0` result becomes `+0`, so that it is
/// not taken for a masked position (the value is the same).
#[inline(always)]
pub fn allowed_weight(w: f32) -> f32 {
    if w == 0.0 { 0.0 } else { w }
}

/// `w · x`, or 0 for a masked `w` whatever `x` holds.
#[inline(always)]
pub fn contribution(w: f32, x: f32) -> f32 {
    if is_masked(w) { 0.0 } else { w * x }
}

/// Whether a row's softmax sum `ℓ` means "no allowed key". NaN (a NaN or `+∞` score) is not
/// empty: the row's O and LSE come out NaN.
#[inline(always)]
pub fn row_is_empty(l: f32) -> bool {
    l == 0.0
}

/// `key >= allowed_key_end(row, n_q, n_k, causal)` in plain u32 arithmetic (no clamping, no
/// 64-bit): the main kernel evaluates it per score of a masked block. Exact for row, key, n_q,
/// n_k below 2^31 (the host's validation keeps every extent there).
#[inline(always)]
pub const fn hidden(row: u32, key: u32, n_q: u32, n_k: u32, causal: bool) -> bool {
    key >= n_k || (causal && key + n_q > row + n_k)
}

/// Exponent bits of one 16-bit element (both halves of a word hold one each).
pub trait Exponent {
    /// The exponent field: all ones means ±∞ or NaN.
    const EXPONENT: u32;
    /// A quiet NaN.
    const QNAN: u32;
    /// The element with bits `h`, widened exactly.
    fn widen(h: u32) -> f32;
    /// The two elements of a packed word (low half first), widened exactly.
    #[inline(always)]
    fn widen_pair(word: u32) -> [f32; 2] {
        [Self::widen(word & 0xffff), Self::widen(word >> 16)]
    }
}

impl Exponent for crate::abi::storage::Bf16 {
    const EXPONENT: u32 = 0x7f80;
    const QNAN: u32 = 0x7fc0;
    #[inline(always)]
    fn widen(h: u32) -> f32 {
        f32::from_bits(h << 16)
    }
}

impl Exponent for crate::abi::storage::F16 {
    const EXPONENT: u32 = 0x7c00;
    const QNAN: u32 = 0x7e00;
    #[inline(always)]
    fn widen(h: u32) -> f32 {
        use crate::abi::storage::Storage;
        crate::abi::storage::F16(h as u16).to_f32()
    }
}

/// Bit 15 of each half of the result is set where that 16-bit element of `word` is non-finite:
/// its exponent field plus the one that completes it to bit 15 carries there only when the field
/// is all ones, and never into the other half. ORed over several words and tested against
/// `0x8000_8000`, a chunk's elements are tested in two instructions a word.
#[inline(always)]
pub fn non_finite_bits<T: Exponent>(word: u32) -> u32 {
    let fields = T::EXPONENT | T::EXPONENT << 16;
    let carry = 0x8000 - T::EXPONENT;
    (word & fields) + (carry | carry << 16)
}

/// Whether a 16-byte chunk (four words of two 16-bit elements) holds a non-finite element.
#[inline(always)]
pub fn chunk_non_finite<T: Exponent>(chunk: [u32; 4]) -> bool {
    chunk
        .iter()
        .fold(0, |acc, &x| acc | non_finite_bits::<T>(x))
        & 0x8000_8000
        != 0
}

/// `word` (two 16-bit elements) with each non-finite element replaced by 0, and whether it had one.
#[inline(always)]
pub fn sanitize_pair<T: Exponent>(word: u32) -> (u32, bool) {
    let (lo, hi) = (word & 0xffff, word >> 16);
    let bad_lo = lo & T::EXPONENT == T::EXPONENT;
    let bad_hi = hi & T::EXPONENT == T::EXPONENT;
    let lo = if bad_lo { 0 } else { lo };
    let hi = if bad_hi { 0 } else { hi };
    (lo | (hi << 16), bad_lo || bad_hi)
}

/// Non-finite contributions `w · v` of allowed positions to the output elements one lane owns in
/// an `m16n8` accumulator layout (rows `g`, `g + 8`; columns `8n + 2t + {0, 1}`, `n < 32`: head
/// dims to 256),
/// kept as bit masks by kind so that no register array is indexed at run time. Their IEEE sum is
/// NaN, `+∞` or `−∞`; [`Poison::apply`] adds it to the accumulators (the finite part came from
/// the product over the sanitized tile).
#[derive(Clone, Copy, Default)]
pub struct Poison {
    nan: [u64; 2],
    pos: [u64; 2],
    neg: [u64; 2],
}

impl Poison {
    /// Adds `x = w · v` (non-finite) to row `r` (0: g, 1: g + 8), owned column `bit = 2n + c`.
    #[inline(always)]
    pub fn add(&mut self, r: usize, bit: u32, x: f32) {
        let m = 1u64 << bit;
        if x.is_nan() {
            self.nan[r] |= m;
        } else if x == f32::INFINITY {
            self.pos[r] |= m;
        } else if x == f32::NEG_INFINITY {
            self.neg[r] |= m;
        }
    }

    /// The sum for row `r`, owned column `bit`: NaN, `±∞`, or `None` where nothing was added.
    #[inline(always)]
    pub fn get(&self, r: usize, bit: u32) -> Option<f32> {
        let has = |m: [u64; 2]| (m[r] >> bit) & 1 != 0;
        let (nan, pos, neg) = (has(self.nan), has(self.pos), has(self.neg));
        if nan || (pos && neg) {
            Some(f32::NAN)
        } else if pos {
            Some(f32::INFINITY)
        } else if neg {
            Some(f32::NEG_INFINITY)
        } else {
            None
        }
    }

    /// `word` (the owned columns `2n`, `2n + 1` of row `r`, 16-bit elements of `T`) plus the
    /// non-finite sums: a finite value plus NaN or `±∞` is that NaN or `±∞`; a NaN stays NaN,
    /// and `+∞ + −∞` is NaN.
    #[inline(always)]
    pub fn patch_pair<T: Exponent>(&self, r: usize, n: u32, word: u32) -> u32 {
        let half = |x: Option<f32>, old: u32| match x {
            Some(x) => {
                let sum = T::widen(old) + x;
                if sum.is_nan() {
                    T::QNAN
                } else if sum > 0.0 {
                    T::EXPONENT
                } else {
                    0x8000 | T::EXPONENT
                }
            }
            None => old,
        };
        half(self.get(r, 2 * n), word & 0xffff) | (half(self.get(r, 2 * n + 1), word >> 16) << 16)
    }

    /// `acc += Σ x` per owned element (unchanged where nothing was added). Every fragment is
    /// named by a constant index, so the accumulators stay in registers: a loop that did not
    /// unroll would index them at run time and move them all to local memory for the whole
    /// kernel.
    #[inline(always)]
    pub fn apply<Q: Quad, const N: usize>(&self, acc: &mut [Q; N]) {
        const { assert!(N <= 32) };
        macro_rules! fragments {
            ($($n:literal)*) => {$(
                if let Some(t) = acc.get_mut($n) {
                    let q = t.quad();
                    q[0] = self.added(0, 2 * $n, q[0]);
                    q[1] = self.added(0, 2 * $n + 1, q[1]);
                    q[2] = self.added(1, 2 * $n, q[2]);
                    q[3] = self.added(1, 2 * $n + 1, q[3]);
                }
            )*};
        }
        fragments!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
    }

    /// `x` plus the sum added at row `r`, owned column `bit`.
    #[inline(always)]
    fn added(&self, r: usize, bit: u32, x: f32) -> f32 {
        let has = |m: [u64; 2]| (m[r] >> bit) & 1 != 0;
        let (nan, pos, neg) = (has(self.nan), has(self.pos), has(self.neg));
        if nan || (pos && neg) {
            f32::NAN
        } else if pos {
            x + f32::INFINITY
        } else if neg {
            x + f32::NEG_INFINITY
        } else {
            x
        }
    }
}

#[cfg(target_arch = "nvptx64")]
pub use device::*;

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::{Exponent, Poison, chunk_non_finite, sanitize_pair};
    use crate::arch::opaque;
    use crate::tile::cp_async::ChunkedTile;
    use crate::tile::mem::{load_shared_16, store_shared_u32};

    /// The 16-byte shared chunk at `at` with its non-finite elements replaced by 0; returns
    /// whether it held one. Rare: only such a chunk is rewritten.
    ///
    /// # Safety
    /// `at` is a 16-byte chunk inside the shared window that no other thread accesses until the
    /// caller's next barrier.
    #[inline(always)]
    unsafe fn sanitize_chunk<T: Exponent>(at: u32) -> bool {
        // SAFETY: forwarded to the caller.
        unsafe {
            let w = load_shared_16(at);
            let bad = chunk_non_finite::<T>(w);
            if bad {
                for (k, &x) in w.iter().enumerate() {
                    store_shared_u32(at + 4 * k as u32, sanitize_pair::<T>(x).0);
                }
            }
            bad
        }
    }

    /// The 16-byte chunks this thread itself copied into `tile` with
    /// `fill_async(_, _, rows, tid, threads)` (the same mapping): non-finite elements become 0;
    /// returns whether there was one. No barrier of its own: after the thread's `wait_all` its
    /// copies are complete, and the caller's next barrier (a `sync_threads_or` of the result, or
    /// a plain one) publishes the writes, so a block pays nothing but this scan, and the
    /// kernel's barriers stay unconditional (a barrier on a data-dependent path makes ptxas
    /// serialize `wgmma`). For `wgmma` readers, fence the async proxy before that barrier.
    ///
    /// # Safety
    /// The thread's copies into `tile` are complete, and nobody else reads them before the
    /// caller's next barrier.
    #[inline(always)]
    pub unsafe fn sanitize_own_chunks<T: Exponent, C: ChunkedTile>(
        tile: &C,
        rows: u32,
        tid: u32,
        threads: u32,
    ) -> bool {
        let chunks = tile.chunks();
        let mut any = false;
        let mut i = tid;
        while i < rows * chunks {
            // SAFETY: the thread's own chunk of the tile (caller).
            any |= unsafe { sanitize_chunk::<T>(tile.chunk_addr(i / chunks, i % chunks)) };
            i += threads;
        }
        any
    }

    /// Lane `t` of a quad's part of one shared row (chunks `t, t + 4, …` of `chunks` 16-byte
    /// chunks at `addr(chunk)`): non-finite elements become 0; returns whether there was one.
    /// Combine the quad with [`quad_any`].
    ///
    /// # Safety
    /// Every `addr(chunk)` is a 16-byte chunk inside the shared window that no other thread
    /// accesses until the caller's next barrier.
    #[inline(always)]
    pub unsafe fn sanitize_row_part<T: Exponent>(
        addr: impl Fn(u32) -> u32,
        chunks: u32,
        t: u32,
    ) -> bool {
        let mut any = false;
        let mut c = t;
        while c < chunks {
            // SAFETY: forwarded to the caller.
            any |= unsafe { sanitize_chunk::<T>(addr(c)) };
            c += 4;
        }
        any
    }

    /// Bits of the four lanes of a quad, or-ed; every lane of the warp must call it.
    #[inline(always)]
    pub fn quad_any(bits: u32) -> u32 {
        let b = bits | crate::arch::shfl_xor(f32::from_bits(bits), 1).to_bits();
        b | crate::arch::shfl_xor(f32::from_bits(b), 2).to_bits()
    }

    /// Whether row `row` of `q` scores key `key` of `k` `−∞` once `score` (scale and modifiers)
    /// maps the raw dot product: the key is then outside the row's support. Both rows are read
    /// from global memory, for the slow path only; the sum's order does not matter, since a sum
    /// with a `+∞` or NaN term is not `−∞` in any order.
    ///
    /// # Safety
    /// `row` is a readable row of `q` and `key` of `k`, each of `d` 16-bit elements.
    #[inline(always)]
    pub unsafe fn scored_out<T: Exponent>(
        q: Operand,
        k: Operand,
        (row, key): (u32, u32),
        d: u32,
        score: impl Fn(f32) -> f32,
    ) -> bool {
        let (qr, kr) = (
            q.base + row as u64 * q.stride,
            k.base + key as u64 * k.stride,
        );
        let mut dot = 0.0f32;
        let mut c = 0;
        while c < opaque(d) {
            // SAFETY: element c of both rows (caller).
            let (x, y) = unsafe {
                (
                    T::widen(*((qr + 2 * c as u64) as *const u16) as u32),
                    T::widen(*((kr + 2 * c as u64) as *const u16) as u32),
                )
            };
            dot += x * y;
            c += 1;
        }
        score(dot) == f32::NEG_INFINITY
    }

    /// Where the lane's accumulator rows take their non-finite contributions from: global rows
    /// `base + key · stride` (bytes) holding the unsanitized operand, 16-bit elements, `8 · tiles`
    /// of them per row (the real head dim: a padded call's accumulator has more columns).
    #[derive(Clone, Copy)]
    pub struct Operand {
        pub base: u64,
        pub stride: u64,
        pub tiles: u32,
    }

    /// Rows of an operand as [`non_finite_part`] reads them: key `key`'s row of `8 · tiles()`
    /// 16-bit elements starts at byte address `row_addr(key)` (a fixed stride, or a page pool's
    /// rows found through a block table: the decode kernel reads V through one).
    pub trait OperandRows: Copy {
        /// # Safety
        /// `key` is a key whose row exists (the caller of [`non_finite_part`] guarantees it).
        unsafe fn row_addr(&self, key: u32) -> u64;
        fn tiles(&self) -> u32;
    }

    impl OperandRows for Operand {
        #[inline(always)]
        unsafe fn row_addr(&self, key: u32) -> u64 {
            self.base + key as u64 * self.stride
        }
        #[inline(always)]
        fn tiles(&self) -> u32 {
            self.tiles
        }
    }

    /// The non-finite part of `Σ_j w_j · x_j` over keys `keys.0 .. keys.1` for the lane's
    /// output elements (`m16n8` layout, `2·ND ≤ 64` owned columns), for [`Poison::apply`]: key
    /// `j` counts for row g (g + 8) when in `starts[0] .. ends[0]` (`starts[1] .. ends[1]`: a
    /// local window's rows start past 0), and each non-finite operand
    /// element `x = (j, col)` adds `w · x`, where the weight `w` of an allowed key is positive
    /// (the reference's `exp` does not underflow for scores that differ by less than ~745) unless
    /// `dropped(row, j)` (dropout's 0: `0 · ∞ = NaN`); a NaN row is NaN already. So the sum needs
    /// no weights: NaN, `+∞` or `−∞` per element, added to O at any point (it survives every
    /// positive rescaling, and adding one twice changes nothing, so `keys` may cover blocks the
    /// product already took them from). Slow (every key and owned column is read back from
    /// global memory), for the rare partly masked tiles whose operand held a non-finite value.
    ///
    /// A key the row allows but scores `−∞` (which non-finite Q or K give) is outside its support
    /// (`in_support(row, key)` false): its value never reaches O, whatever it holds.
    ///
    /// # Safety
    /// Every key below `max(ends)` is a readable row of `op` with `8 · op.tiles()` elements.
    #[inline(never)]
    pub unsafe fn non_finite_part<T: Exponent, const ND: usize>(
        keys: (u32, u32),
        starts: [u32; 2],
        ends: [u32; 2],
        op: impl OperandRows,
        lane: u32,
        dropped: impl Fn(usize, u32) -> bool,
        in_support: impl Fn(usize, u32) -> bool,
    ) -> Poison {
        const { assert!(ND <= 32) };
        let t = lane % 4;
        let mut poison = Poison::default();
        let end = keys.1.min(ends[0].max(ends[1]));
        let mut key = keys.0;
        while key < end {
            let (lo, hi) = (
                starts[0] <= key && key < ends[0],
                starts[1] <= key && key < ends[1],
            );
            // SAFETY: an allowed key's row exists (caller).
            let row = unsafe { op.row_addr(key) };
            // A run-time loop (bound through `opaque`): this is the slow path.
            let cols = opaque(2 * op.tiles().min(ND as u32));
            let mut bit = 0;
            while bit < cols {
                let col = 8 * (bit / 2) + 2 * t + bit % 2;
                // SAFETY: an allowed key is a readable row (caller).
                let x = T::widen(unsafe { *((row + 2 * col as u64) as *const u16) } as u32);
                if !x.is_finite() {
                    for (r, allowed) in [(0, lo), (1, hi)] {
                        if allowed && in_support(r, key) {
                            poison.add(r, bit, if dropped(r, key) { f32::NAN } else { x });
                        }
                    }
                }
                bit += 1;
            }
            key += 1;
        }
        poison
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi::shape::allowed_key_end;
    use crate::abi::storage::{Bf16, F16};

    /// `hidden` is `allowed_key_end`'s complement, without its clamping or 64-bit arithmetic.
    #[test]
    fn hidden_is_past_the_allowed_key_end() {
        for (n_q, n_k) in [(1, 1), (5, 5), (3, 9), (9, 3), (17, 64)] {
            for causal in [false, true] {
                for row in 0..n_q {
                    for key in 0..n_k + 70 {
                        assert_eq!(
                            hidden(row, key, n_q, n_k, causal),
                            key >= allowed_key_end(row, n_q, n_k, causal),
                            "n_q={n_q} n_k={n_k} causal={causal} row={row} key={key}"
                        );
                    }
                }
            }
        }
    }

    /// `non_finite_bits` flags exactly the elements whose widened value is not finite, in either
    /// half and beside any other element, for every 16-bit pattern of both types.
    #[test]
    fn non_finite_bits_flags_exactly_the_non_finite_elements() {
        fn check<T: Exponent>() {
            let mut flagged = 0;
            for h in 0..=0xffffu32 {
                let bad = !T::widen(h).is_finite();
                flagged += bad as u32;
                for other in [0, 0x3c00, 0x7bff, 0xffff, h] {
                    let (lo, hi) = (
                        non_finite_bits::<T>(h | other << 16),
                        non_finite_bits::<T>(other | h << 16),
                    );
                    assert_eq!(lo & 0x8000 != 0, bad, "{h:#06x} low beside {other:#06x}");
                    assert_eq!(
                        hi & 0x8000_0000 != 0,
                        bad,
                        "{h:#06x} high beside {other:#06x}"
                    );
                }
            }
            // ±∞ and the NaNs: 2 · 2^mantissa bits of each exponent-all-ones sign.
            assert_eq!(flagged, if T::EXPONENT == 0x7f80 { 256 } else { 2048 });
        }
        check::<Bf16>();
        check::<F16>();
    }

    /// A chunk is flagged exactly when one of its eight elements is non-finite, wherever it sits.
    #[test]
    fn chunk_non_finite_finds_one_element_anywhere() {
        fn check<T: Exponent>(inf: u32, nan: u32) {
            let finite = [0x3c00_bc00, 0x7b7f_0001, 0x8000_0000, 0x7b00_3f80];
            assert!(!chunk_non_finite::<T>(finite));
            for word in 0..4 {
                for (shift, bad) in [(0, inf), (16, nan), (0, nan | 0x8000), (16, inf | 0x8000)] {
                    let mut chunk = finite;
                    chunk[word] = chunk[word] & !(0xffff << shift) | bad << shift;
                    assert!(
                        chunk_non_finite::<T>(chunk),
                        "word {word} shift {shift} {bad:#06x}"
                    );
                }
            }
        }
        check::<Bf16>(0x7f80, 0x7fc1);
        check::<F16>(0x7c00, 0x7e01);
    }

    #[test]
    fn sentinel_is_negative_zero_only() {
        assert!(is_masked(MASKED));
        assert!(!is_masked(0.0) && !is_masked(allowed_weight(-0.0)));
        assert_eq!(contribution(MASKED, f32::NAN), 0.0);
        assert!(contribution(0.0, f32::NAN).is_nan());
        assert!(contribution(allowed_weight(-0.0), f32::INFINITY).is_nan());
        assert!(!row_is_empty(f32::NAN) && row_is_empty(0.0));
    }

    #[test]
    fn pairs_lose_exactly_their_non_finite_halves() {
        // bf16: 1.0 = 0x3f80, +∞ = 0x7f80, NaN = 0x7fc0, −∞ = 0xff80.
        assert_eq!(sanitize_pair::<Bf16>(0x3f80_3f80), (0x3f80_3f80, false));
        assert_eq!(sanitize_pair::<Bf16>(0x7fc0_3f80), (0x0000_3f80, true));
        assert_eq!(sanitize_pair::<Bf16>(0x3f80_ff80), (0x3f80_0000, true));
        // f16: 1.0 = 0x3c00, +∞ = 0x7c00; 0x7f80 is a finite f16.
        assert_eq!(sanitize_pair::<F16>(0x7c00_3c00), (0x0000_3c00, true));
        assert_eq!(sanitize_pair::<F16>(0x3c00_7b80), (0x3c00_7b80, false));
    }

    #[test]
    fn patched_pairs_hold_the_sums() {
        let mut p = Poison::default();
        p.add(1, 2, f32::NAN);
        p.add(1, 3, f32::NEG_INFINITY);
        p.add(0, 3, f32::INFINITY);
        assert_eq!(p.patch_pair::<Bf16>(1, 1, 0x3f80_3f80), 0xff80_7fc0);
        assert_eq!(p.patch_pair::<F16>(0, 1, 0x3c00_3c00), 0x7c00_3c00);
        assert_eq!(p.patch_pair::<Bf16>(0, 0, 0x1234_5678), 0x1234_5678);
        // A NaN row stays NaN; −∞ + +∞ is NaN.
        assert_eq!(p.patch_pair::<Bf16>(0, 1, 0x7fc0_3f80), 0x7fc0_3f80);
        assert_eq!(p.patch_pair::<Bf16>(0, 1, 0xffc0_3f80), 0x7fc0_3f80);
        assert_eq!(p.patch_pair::<Bf16>(0, 1, 0xff80_3f80), 0x7fc0_3f80);
    }

    #[test]
    fn widen_is_exact() {
        assert_eq!(Bf16::widen_pair(0x4000_3f80), [1.0, 2.0]);
        assert_eq!(F16::widen_pair(0xc000_3c00), [1.0, -2.0]);
        assert!(Bf16::widen(0x7fc0).is_nan() && F16::widen(0x7c00) == f32::INFINITY);
    }

    #[test]
    fn poison_sums_like_ieee() {
        let mut p = Poison::default();
        p.add(0, 0, f32::INFINITY);
        p.add(0, 1, f32::INFINITY);
        p.add(0, 1, f32::NEG_INFINITY);
        p.add(1, 2, f32::NEG_INFINITY);
        p.add(1, 3, f32::NAN);
        let mut acc = [[1.0f32; 4]; 2];
        p.apply(&mut acc);
        assert_eq!(acc[0][0], f32::INFINITY);
        assert!(acc[0][1].is_nan());
        assert_eq!(acc[0][2], 1.0);
        assert_eq!(acc[1][2], f32::NEG_INFINITY);
        assert!(acc[1][3].is_nan());
        assert_eq!(acc[1][0], 1.0);
    }
}
