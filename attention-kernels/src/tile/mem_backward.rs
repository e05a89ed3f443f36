//! Accesses the backward adds to `mem`: per-row statistics and `Pᵀ` read back from shared memory,
//! and the dQ accumulation that many thread blocks add into at once.

use core::arch::asm;

/// Two consecutive f32 from shared memory.
///
/// # Safety
/// `addr` must be an 8-byte aligned address inside the shared window.
#[inline(always)]
pub unsafe fn load_shared_f32x2(addr: u32) -> [f32; 2] {
    let (a, b): (f32, f32);
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.shared.v2.f32 {{{0}, {1}}}, [{a}];", out(reg32) a, out(reg32) b,
             a = in(reg32) addr, options(nostack, readonly));
    }
    [a, b]
}

/// Two consecutive f32 to shared memory.
///
/// # Safety
/// `addr` must be an 8-byte aligned address inside the shared window.
#[inline(always)]
pub unsafe fn store_shared_f32x2(addr: u32, v: [f32; 2]) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("st.shared.v2.f32 [{a}], {{{0}, {1}}};", in(reg32) v[0], in(reg32) v[1],
             a = in(reg32) addr, options(nostack));
    }
}

/// # Safety
/// `addr` must be a 4-byte aligned address inside the shared window.
#[inline(always)]
pub unsafe fn load_shared_u32(addr: u32) -> u32 {
    let v: u32;
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("ld.shared.b32 {v}, [{a}];", v = out(reg32) v, a = in(reg32) addr,
             options(nostack, readonly));
    }
    v
}

/// `*addr += v` in global memory, atomically, without returning the old value (`red`).
///
/// # Safety
/// `addr` must be a 4-byte aligned, writable global address.
#[inline(always)]
pub unsafe fn red_add_f32(addr: u64, v: f32) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("red.global.add.f32 [{a}], {v};", a = in(reg64) addr, v = in(reg32) v,
             options(nostack));
    }
}

/// `addr[0..2] += v`, each element atomically, in one vector reduction (PTX 8.1, sm_90).
///
/// # Safety
/// `addr` must be an 8-byte aligned, writable global address.
#[cfg(flash_attn_sm90a)]
#[inline(always)]
pub unsafe fn red_add_f32x2(addr: u64, v: [f32; 2]) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("red.global.add.v2.f32 [{a}], {{{0}, {1}}};",
             in(reg32) v[0], in(reg32) v[1], a = in(reg64) addr, options(nostack));
    }
}

/// Spins until the u32 at `addr` equals `value`, each read an acquire at GPU scope: what other
/// blocks released before storing `value` is visible after it.
///
/// # Safety
/// `addr` must be a 4-byte aligned global address that another block will set to `value`.
#[inline(always)]
pub unsafe fn wait_equal_acquire(addr: u64, value: u32) {
    loop {
        let v: u32;
        // SAFETY: the caller guarantees the address.
        unsafe {
            asm!("ld.acquire.gpu.global.u32 {v}, [{a}];", v = out(reg32) v, a = in(reg64) addr,
                 options(nostack));
        }
        if v == value {
            break;
        }
    }
}

/// Stores `value` at `addr` as a release at GPU scope, after a GPU-scope fence: with a barrier
/// before it, the whole block's earlier writes (the dQ reductions) are visible to a block that
/// acquires `value` ([`wait_equal_acquire`]).
///
/// # Safety
/// `addr` must be a 4-byte aligned, writable global address.
#[inline(always)]
pub unsafe fn release_store(addr: u64, value: u32) {
    // SAFETY: the caller guarantees the address.
    unsafe {
        asm!("fence.acq_rel.gpu;", "st.release.gpu.global.u32 [{a}], {v};",
             a = in(reg64) addr, v = in(reg32) value, options(nostack));
    }
}
