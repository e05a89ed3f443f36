//! Device-only building blocks: thread indices, barriers, dynamic shared memory, warp shuffles and
//! the conversion instructions. Kernels use these instead of raw intrinsics or inline PTX.

use core::arch::asm;
use core::arch::nvptx;

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `trap` aborts the kernel; the host sees a launch failure.
    unsafe { nvptx::trap() }
}

// One dynamic shared-memory window per kernel; its size is set at launch. 1024-byte alignment is
// what `wgmma`'s 128-byte swizzle atoms need.
core::arch::global_asm!(".extern .shared .align 1024 .b8 SMEM[];");

#[inline(always)]
pub fn thread_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}
#[inline(always)]
pub fn thread_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_thread_idx_y() as u32 }
}
#[inline(always)]
pub fn block_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_x() as u32 }
}
#[inline(always)]
pub fn block_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_y() as u32 }
}
#[inline(always)]
pub fn block_z() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_idx_z() as u32 }
}
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_block_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_x() as u32 }
}
#[inline(always)]
pub fn grid_dim_y() -> u32 {
    // SAFETY: as above.
    unsafe { nvptx::_grid_dim_y() as u32 }
}

/// Barrier over the thread block; every thread of the block must reach it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: kernels call this from uniform control flow.
    unsafe { nvptx::_syncthreads() }
}

/// Generic pointer to the start of the dynamic shared-memory window.
#[inline(always)]
pub fn shared_base() -> *mut u8 {
    let p: u64;
    // SAFETY: `cvta` converts the window's shared-space address into a generic one.
    unsafe {
        asm!("cvta.shared.u64 {p}, SMEM;", p = out(reg64) p, options(pure, nomem, nostack));
    }
    p as *mut u8
}

/// Butterfly shuffle within a full warp: lane `l` receives `x` of lane `l ^ mask`.
#[inline(always)]
pub fn shfl_xor(x: f32, mask: u32) -> f32 {
    let r: f32;
    // SAFETY: all 32 lanes of the warp execute this with the full member mask.
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {x}, {m}, 0x1f, 0xffffffff;",
             r = out(reg32) r, x = in(reg32) x, m = in(reg32) mask,
             options(nomem, nostack));
    }
    r
}

/// `x` of the warp's lane 0, which ptxas then knows to be the same on every lane: a value that is
/// uniform by construction (a warpgroup's index) but computed from the thread index goes to the
/// uniform datapath after this, so the `wgmma` descriptors built from it are uniform registers
/// instead of per-thread ones moved over (`R2UR`) before each product.
#[inline(always)]
pub fn warp_uniform(x: u32) -> u32 {
    let r: u32;
    // SAFETY: all 32 lanes of the warp execute this with the full member mask.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {x}, 0, 0x1f, 0xffffffff;",
             r = out(reg32) r, x = in(reg32) x, options(nomem, nostack));
    }
    r
}

/// Barrier over the thread block that also returns whether `pred` held on any thread; every
/// thread of the block must reach it. Orders shared-memory accesses like `sync_threads`.
#[inline(always)]
pub fn sync_threads_or(pred: bool) -> bool {
    let r: u32;
    // SAFETY: kernels call this from block-uniform control flow.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.or.pred q, 0, p; selp.u32 {r}, 1, 0, q; }}",
             r = out(reg32) r, x = in(reg32) pred as u32, options(nostack));
    }
    r != 0
}

/// Bit `l` set where `pred` holds on lane `l`; all 32 lanes of the warp execute it.
#[inline(always)]
pub fn ballot(pred: bool) -> u32 {
    let r: u32;
    // SAFETY: kernels call this with the full warp converged.
    unsafe {
        asm!("{{ .reg .pred p; setp.ne.u32 p, {x}, 0; vote.sync.ballot.b32 {r}, p, 0xffffffff; }}",
             r = out(reg32) r, x = in(reg32) pred as u32, options(nomem, nostack));
    }
    r
}

#[inline(always)]
pub fn warp_max(mut x: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        x = x.max(shfl_xor(x, m));
        m >>= 1;
    }
    x
}

#[inline(always)]
pub fn warp_sum(mut x: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        x += shfl_xor(x, m);
        m >>= 1;
    }
    x
}

/// `e^x` through the hardware `ex2` with `log2 e` folded in.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let r: f32;
    let y = x * core::f32::consts::LOG2_E;
    // SAFETY: pure arithmetic instruction.
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {y};", r = out(reg32) r, y = in(reg32) y,
             options(pure, nomem, nostack));
    }
    r
}

#[inline(always)]
pub fn cvt_rn_bf16(x: f32) -> u16 {
    let r: u16;
    // SAFETY: pure conversion instruction.
    unsafe {
        asm!("cvt.rn.bf16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    r
}

#[inline(always)]
pub fn cvt_rn_f16(x: f32) -> u16 {
    let r: u16;
    // SAFETY: pure conversion instruction.
    unsafe {
        asm!("cvt.rn.f16.f32 {r}, {x};", r = out(reg16) r, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    r
}

#[inline(always)]
pub fn cvt_f32_f16(h: u16) -> f32 {
    let r: f32;
    // SAFETY: pure conversion instruction.
    unsafe {
        asm!("cvt.f32.f16 {r}, {h};", r = out(reg32) r, h = in(reg16) h,
             options(pure, nomem, nostack));
    }
    r
}

/// Natural logarithm through the hardware `lg2` with `ln 2` folded in.
#[inline(always)]
pub fn ln(x: f32) -> f32 {
    log2(x) * core::f32::consts::LN_2
}

/// `log2 x` (hardware `lg2`).
#[inline(always)]
pub fn log2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic instruction.
    unsafe {
        asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    r
}

/// `a · b + c` rounded once (`fma.rn`); LLVM folds `b = 1` to an addition.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::f32::math::mul_add(a, b, c)
}

/// `2^x` (hardware `ex2`, flushes subnormals; `2^-∞ = 0`).
#[inline(always)]
pub fn exp2(x: f32) -> f32 {
    let r: f32;
    // SAFETY: pure arithmetic instruction.
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
             options(pure, nomem, nostack));
    }
    r
}

/// 32-bit shared-space address of the dynamic shared-memory window (what `ldmatrix`, `cp.async`
/// and `ld/st.shared` take).
#[inline(always)]
pub fn shared_window() -> u32 {
    let r: u32;
    // SAFETY: reading the window's address has no preconditions.
    unsafe {
        asm!("mov.u32 {r}, SMEM;", r = out(reg32) r, options(pure, nomem, nostack));
    }
    r
}

/// `*p += x` in global memory, atomically with respect to other threads' additions.
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global address of an f32.
#[inline(always)]
pub unsafe fn atomic_add_global(p: *mut f32, x: f32) {
    // SAFETY: the caller guarantees `p` addresses an f32 in global memory.
    unsafe {
        asm!("red.global.add.f32 [{p}], {x};", p = in(reg64) p, x = in(reg32) x, options(nostack));
    }
}

/// `*p += x` in global memory, atomically (relaxed, GPU scope); returns the value before.
///
/// # Safety
/// `p` must be a valid, 4-byte aligned global address of a u32.
#[inline(always)]
pub unsafe fn atomic_add_u32_global(p: *mut u32, x: u32) -> u32 {
    let r: u32;
    // SAFETY: the caller guarantees `p` addresses a u32 in global memory.
    unsafe {
        asm!("atom.global.add.u32 {r}, [{p}], {x};", r = out(reg32) r, p = in(reg64) p,
             x = in(reg32) x, options(nostack));
    }
    r
}

/// Acquire-release fence at GPU scope: the thread's memory accesses before it are ordered before
/// those after it for every thread of the device that synchronizes with it (through an atomic
/// and a barrier: the release half before a counter's atomic, the acquire half after it).
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// Defines `extern "ptx-kernel"` entry points, one per storage type, over a generic body that
/// takes the kernel's `#[repr(C)]` parameter struct by reference.
macro_rules! entry_points {
    ($($name:ident => $body:ident::<$t:ty>($params:ty);)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(p: $params) {
            // SAFETY: the host validated the buffers against `p` before launching.
            unsafe { $body::<$t>(&p) }
        }
    )*};
}

pub(crate) use entry_points;

/// Barrier and memory fence over the 32 lanes of a warp: orders their shared-memory accesses
/// (lanes are scheduled independently since Volta, so a shuffle alone does not order plain loads
/// against stores).
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: all 32 lanes reach it from warp-uniform control flow.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) }
}

/// Named barrier `id` (1 to 15; 0 is [`sync_threads`]'s) over `threads` threads, a multiple of 32:
/// the calling warp waits until that many threads have reached it, here or at [`named_arrive`].
/// Orders shared-memory accesses among the threads that sync.
#[inline(always)]
pub fn named_sync(id: u32, threads: u32) {
    // SAFETY: kernels call this from warp-uniform control flow with one `threads` per `id`.
    unsafe { asm!("bar.sync {i}, {n};", i = in(reg32) id, n = in(reg32) threads, options(nostack)) }
}

/// [`named_sync`] that also returns whether `pred` held on any of the `threads` threads (all of
/// which sync, none arrive).
#[inline(always)]
pub fn named_sync_or(id: u32, threads: u32, pred: bool) -> bool {
    let r: u32;
    // SAFETY: as `named_sync`.
    unsafe {
        asm!("{{ .reg .pred p, q; setp.ne.u32 p, {x}, 0; bar.red.or.pred q, {i}, {n}, p; selp.u32 {r}, 1, 0, q; }}",
             r = out(reg32) r, i = in(reg32) id, n = in(reg32) threads, x = in(reg32) pred as u32,
             options(nostack));
    }
    r != 0
}

/// Counts the calling warp towards named barrier `id` of `threads` threads without waiting: the
/// signal half of a producer/consumer pair of [`named_sync`]. No memory ordering.
#[inline(always)]
pub fn named_arrive(id: u32, threads: u32) {
    // SAFETY: as `named_sync`.
    unsafe {
        asm!("bar.arrive {i}, {n};", i = in(reg32) id, n = in(reg32) threads, options(nostack))
    }
}

/// Lowers the registers of every thread of the calling warpgroup to `N` (a multiple of 8 from 24
/// to 256), giving them back to the SM for another warpgroup's [`claim_registers`]. sm_90a only.
#[inline(always)]
pub fn release_registers<const N: u32>() {
    // SAFETY: all 128 threads of the warpgroup execute it (`.sync.aligned`).
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}

/// Raises the registers of every thread of the calling warpgroup to `N`, waiting until other
/// warpgroups have released enough. sm_90a only.
#[inline(always)]
pub fn claim_registers<const N: u32>() {
    // SAFETY: as `release_registers`.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {n};", n = const N, options(nostack)) }
}

/// `x`, recomputed where it is used: the compiler may not hoist it (nor what derives from it) out
/// of a loop. Lane-derived shared addresses hoisted out of a long loop body each hold a register
/// for the whole loop; recomputing them costs an add or two per use.
#[inline(always)]
pub fn opaque(x: u32) -> u32 {
    let r: u32;
    // SAFETY: a register move; without `pure` the compiler treats it as having effects.
    unsafe { asm!("mov.u32 {r}, {x};", r = out(reg32) r, x = in(reg32) x, options(nomem, nostack)) }
    r
}
