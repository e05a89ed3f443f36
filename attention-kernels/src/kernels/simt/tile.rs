//! Shared-memory tiles and the block-wide operations the tiled kernels are written in.
//!
//! Every operation spreads its output elements over the threads of the block (element `e` to
//! thread `e mod blockDim`), so any `B_r`, `B_c` and head dimension work with one launch shape;
//! callers separate phases with `sync_threads`. Arithmetic is f32 whatever the storage type.

use crate::abi::storage::Storage;
use crate::arch::{block_dim_x, shared_base, thread_x};
use crate::attn::mask::contribution;

/// A row-major f32 matrix in shared memory.
#[derive(Clone, Copy)]
pub struct Tile {
    ptr: *mut f32,
    pitch: usize,
}

impl Tile {
    #[inline(always)]
    pub fn row(self, r: u32) -> *mut f32 {
        self.ptr.wrapping_add(r as usize * self.pitch)
    }
    /// # Safety
    /// `(r, c)` lies inside the carved tile.
    #[inline(always)]
    pub unsafe fn get(self, r: u32, c: u32) -> f32 {
        // SAFETY: the caller keeps (r, c) inside the tile.
        unsafe { *self.row(r).add(c as usize) }
    }
    /// # Safety
    /// `(r, c)` lies inside the carved tile.
    #[inline(always)]
    pub unsafe fn set(self, r: u32, c: u32, x: f32) {
        // SAFETY: the caller keeps (r, c) inside the tile.
        unsafe { *self.row(r).add(c as usize) = x }
    }
}

/// Carves the dynamic shared-memory window front to back, in the order `flash::smem` sums.
pub struct Arena {
    next: *mut f32,
}

impl Arena {
    pub fn new() -> Arena {
        Arena {
            next: shared_base() as *mut f32,
        }
    }
    pub fn tile(&mut self, rows: u32, pitch: u32) -> Tile {
        let t = Tile {
            ptr: self.next,
            pitch: pitch as usize,
        };
        self.next = self.next.wrapping_add(rows as usize * pitch as usize);
        t
    }
    pub fn vector(&mut self, len: u32) -> Tile {
        self.tile(1, len)
    }
}

/// Calls `f(e)` for every `e < count` this thread owns.
#[inline(always)]
pub fn for_each(count: u32, mut f: impl FnMut(u32)) {
    let step = block_dim_x();
    let mut e = thread_x();
    while e < count {
        f(e);
        e += step;
    }
}

/// `dst[r][c] = src[r·row_stride + c]` widened to f32, for `r < rows`, `c < d`.
///
/// # Safety
/// The `rows` source rows are readable and `dst` holds `rows × d`.
#[inline(always)]
pub unsafe fn load_rows<T: Storage>(
    dst: Tile,
    src: *const T,
    row_stride: usize,
    rows: u32,
    d: u32,
) {
    // Consecutive threads read consecutive elements of a row: coalesced global loads.
    for_each(rows * d, |e| {
        let (r, c) = (e / d, e % d);
        // SAFETY: r < rows and c < d, inside both source and tile.
        unsafe {
            dst.set(
                r,
                c,
                (*src.add(r as usize * row_stride + c as usize)).to_f32(),
            )
        }
    });
}

/// `dst[r·row_stride + c] = scale · src[r][c]` narrowed to `T`, for `r < rows`, `c < d`.
///
/// # Safety
/// The `rows` destination rows are writable and `src` holds `rows × d`.
#[inline(always)]
pub unsafe fn store_rows<T: Storage>(
    dst: *mut T,
    row_stride: usize,
    src: Tile,
    scale: f32,
    rows: u32,
    d: u32,
) {
    for_each(rows * d, |e| {
        let (r, c) = (e / d, e % d);
        // SAFETY: r < rows and c < d, inside both tile and destination.
        unsafe {
            *dst.add(r as usize * row_stride + c as usize) = T::from_f32(scale * src.get(r, c))
        }
    });
}

/// Sets the first `rows × cols` elements of `t` to `x`.
///
/// # Safety
/// `t` holds `rows × cols`.
#[inline(always)]
pub unsafe fn fill(t: Tile, rows: u32, cols: u32, x: f32) {
    // SAFETY: the caller sized the tile.
    for_each(rows * cols, |e| unsafe { t.set(e / cols, e % cols, x) });
}

/// `⟨a, b⟩` over `d` elements of two shared-memory rows.
///
/// # Safety
/// Both rows hold `d` elements.
#[inline(always)]
pub unsafe fn dot(a: *const f32, b: *const f32, d: u32) -> f32 {
    let mut acc = 0.0f32;
    for x in 0..d as usize {
        // SAFETY: x < d.
        unsafe { acc += *a.add(x) * *b.add(x) };
    }
    acc
}

/// `w · x` in a tile product: with `CHECKED`, 0 for a [`MASKED`](crate::attn::mask::MASKED) `w`
/// whatever `x` holds ([`contribution`]); without, a plain product (for tiles that hold no
/// masked entry, which a block-wide vote established).
#[inline(always)]
pub fn product<const CHECKED: bool>(w: f32, x: f32) -> f32 {
    if CHECKED { contribution(w, x) } else { w * x }
}

/// `acc[r][x] = rescale[r]·acc[r][x] + Σ_{c<k} a[r][c]·b[c][x]` for `r < m`, `x < n`, with
/// `rescale` absent meaning 1 (the `P̃V` and `dS·K` products). With `checked`, entries of `a` that
/// are [`MASKED`](crate::attn::mask::MASKED) add nothing, whatever `b` holds; without, `a` holds
/// none.
///
/// # Safety
/// Every tile holds the extents it is indexed with.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub unsafe fn mul_acc(
    acc: Tile,
    rescale: Option<Tile>,
    a: Tile,
    b: Tile,
    m: u32,
    n: u32,
    k: u32,
    checked: bool,
) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if checked {
            mul_acc_with::<true>(acc, rescale, a, b, m, n, k)
        } else {
            mul_acc_with::<false>(acc, rescale, a, b, m, n, k)
        }
    }
}

#[inline(always)]
unsafe fn mul_acc_with<const CHECKED: bool>(
    acc: Tile,
    rescale: Option<Tile>,
    a: Tile,
    b: Tile,
    m: u32,
    n: u32,
    k: u32,
) {
    for_each(m * n, |e| {
        let (r, x) = (e / n, e % n);
        // SAFETY: r < m, x < n, c < k.
        unsafe {
            let mut sum = match rescale {
                Some(s) => s.get(0, r) * acc.get(r, x),
                None => acc.get(r, x),
            };
            let a_row = a.row(r);
            for c in 0..k {
                sum += product::<CHECKED>(*a_row.add(c as usize), b.get(c, x));
            }
            acc.set(r, x, sum);
        }
    });
}

/// `acc[c][x] += Σ_{r<k} a[r][c]·b[r][x]` for `c < m`, `x < n` (the `P_dropᵀdO` and `dSᵀQ`
/// products); with `checked`, [`MASKED`](crate::attn::mask::MASKED) entries of `a` add nothing;
/// without, `a` holds none.
///
/// # Safety
/// Every tile holds the extents it is indexed with.
#[inline(always)]
pub unsafe fn mul_t_acc(acc: Tile, a: Tile, b: Tile, m: u32, n: u32, k: u32, checked: bool) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if checked {
            mul_t_acc_with::<true>(acc, a, b, m, n, k)
        } else {
            mul_t_acc_with::<false>(acc, a, b, m, n, k)
        }
    }
}

#[inline(always)]
unsafe fn mul_t_acc_with<const CHECKED: bool>(acc: Tile, a: Tile, b: Tile, m: u32, n: u32, k: u32) {
    for_each(m * n, |e| {
        let (c, x) = (e / n, e % n);
        // SAFETY: c < m, x < n, r < k.
        unsafe {
            let mut sum = acc.get(c, x);
            for r in 0..k {
                sum += product::<CHECKED>(a.get(r, c), b.get(r, x));
            }
            acc.set(c, x, sum);
        }
    });
}
