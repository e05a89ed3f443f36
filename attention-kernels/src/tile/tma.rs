//! Hopper's tensor memory accelerator: `cp.async.bulk.tensor` copies of whole tiles, described by
//! a tensor map the host encoded (`abi::params::TensorMap`), completing on an `mbarrier` in
//! shared memory. One thread issues a tile's copies and tells the barrier how many bytes to
//! expect; every thread that reads the tile waits on the barrier's phase.
//!
//! A tensor map with a 128-byte swizzle writes a box of 64 16-bit columns exactly as one panel of
//! a [`super::PanelTile`] (1024-byte aligned), and fills what lies outside the tensor with
//! zeros: keys past the sequence and columns past the head dim. The other way, a bulk reduction
//! adds a shared box into the tensor (`reduce_add_4d`), tracked by the issuing thread's bulk
//! groups instead of a barrier.

use core::arch::asm;

/// Bytes of one `mbarrier` object: the host's shared-memory sizes count them by the same constant.
pub const BARRIER_BYTES: u32 = crate::kernels::sm90::BARRIER_BYTES;

/// The generic address of the tensor maps the entry point `$entry` receives in parameter space
/// (`abi::params::TmaForwardParams`, `TmaBackwardParams`): its parameter's address, taken by
/// name (`<entry>_param_0`, which the ABI gives no other way to reach), plus `TMA_MAPS_OFFSET`.
macro_rules! param_maps {
    ($entry:ident) => {{
        let maps: u64;
        // SAFETY: the address of the entry's own parameter has no preconditions.
        unsafe {
            core::arch::asm!(
                concat!("mov.u64 {m}, ", stringify!($entry), "_param_0;"),
                "cvta.param.u64 {m}, {m};",
                m = out(reg64) maps,
                options(pure, nomem, nostack)
            )
        };
        maps + crate::abi::params::TMA_MAPS_OFFSET as u64
    }};
}
pub(crate) use param_maps;

/// Initializes the barrier at shared address `bar` for `count` arrivals per phase.
///
/// # Safety
/// `bar` is an 8-byte aligned shared address no thread uses as a barrier yet; the barrier is
/// published to the other threads (`fence_barrier_init`, then a block barrier) before they wait.
#[inline(always)]
pub unsafe fn init(bar: u32, count: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        asm!("mbarrier.init.shared::cta.b64 [{b}], {c};", b = in(reg32) bar, c = in(reg32) count,
            options(nostack))
    }
}

/// Makes the barriers this thread initialized visible to the async proxy (the copies that
/// complete on them).
#[inline(always)]
pub fn fence_barrier_init() {
    // SAFETY: a fence has no preconditions.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) }
}

/// Arrives on `bar` and raises the bytes its current phase waits for by `bytes`.
///
/// # Safety
/// `bar` is an initialized barrier; the copies that complete those bytes are issued on it.
#[inline(always)]
pub unsafe fn arrive_expect_tx(bar: u32, bytes: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{b}], {n};", b = in(reg32) bar,
            n = in(reg32) bytes, options(nostack))
    }
}

/// Arrives on `bar` (release: this thread's earlier writes are visible to the threads that see
/// the phase complete).
///
/// # Safety
/// `bar` is an initialized barrier.
#[inline(always)]
pub unsafe fn arrive(bar: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        asm!("mbarrier.arrive.shared::cta.b64 _, [{b}];", b = in(reg32) bar, options(nostack))
    }
}

/// Waits until the phase of `bar` with parity `parity` has completed: its arrivals and bytes.
///
/// # Safety
/// `bar` is an initialized barrier whose phase `parity` completes.
#[inline(always)]
pub unsafe fn wait(bar: u32, parity: u32) {
    loop {
        let done: u32;
        // SAFETY: forwarded to the caller.
        unsafe {
            asm!(
                "{{",
                ".reg .pred p;",
                "mbarrier.try_wait.parity.shared::cta.b64 p, [{b}], {ph};",
                "selp.u32 {d}, 1, 0, p;",
                "}}",
                b = in(reg32) bar, ph = in(reg32) parity, d = out(reg32) done,
                options(nostack)
            )
        }
        if done != 0 {
            return;
        }
    }
}

/// Copies the box at coordinates `c` (innermost first) of the four-dimensional tensor map at
/// generic address `map` into shared memory at `dst`, completing its bytes on `bar`.
///
/// # Safety
/// `map` addresses a valid tensor map in kernel-parameter, constant or global memory; `dst` is
/// the start of a box-sized shared region aligned as the map's swizzle needs (1024 bytes for
/// 128-byte swizzling) that nothing else reads or writes until `bar`'s phase completes.
#[inline(always)]
pub unsafe fn load_4d(dst: u32, map: u64, bar: u32, c: [i32; 4]) {
    // SAFETY: forwarded to the caller.
    unsafe {
        asm!(
            "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [{d}], [{m}, {{{c0}, {c1}, {c2}, {c3}}}], [{b}];",
            d = in(reg32) dst, m = in(reg64) map, b = in(reg32) bar,
            c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
            options(nostack)
        )
    }
}

/// Copies `bytes` (a multiple of 16) from global address `src` to shared address `dst`, both
/// 16-byte aligned, completing them on `bar`.
///
/// # Safety
/// `src .. src + bytes` is readable global memory; `dst .. dst + bytes` is shared memory that
/// nothing else reads or writes until `bar`'s phase completes.
#[inline(always)]
pub unsafe fn load_bulk(dst: u32, src: u64, bytes: u32, bar: u32) {
    // SAFETY: forwarded to the caller.
    unsafe {
        asm!(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, b = in(reg32) bar,
            options(nostack)
        )
    }
}

/// Adds the box at shared address `src` into the box at coordinates `c` (innermost first) of
/// the four-dimensional f32 tensor map at generic address `map`, element by element
/// (`cp.reduce.async.bulk.tensor ... .add`), as part of the thread's current bulk group. Elements
/// outside the tensor are not written.
///
/// # Safety
/// `map` addresses a valid f32 tensor map in kernel-parameter, constant or global memory; `src`
/// is a box-sized shared region, aligned as the map's swizzle needs (1024 bytes for 128-byte
/// swizzling), whose writes are visible to the async proxy (`wgmma::fence_proxy_async` and a
/// barrier) and which nothing writes until the group's reads are waited for
/// ([`wait_bulk_reads`]).
#[inline(always)]
pub unsafe fn reduce_add_4d(src: u32, map: u64, c: [i32; 4]) {
    // SAFETY: forwarded to the caller.
    unsafe {
        asm!(
            "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [{m}, {{{c0}, {c1}, {c2}, {c3}}}], [{s}];",
            s = in(reg32) src, m = in(reg64) map,
            c0 = in(reg32) c[0], c1 = in(reg32) c[1], c2 = in(reg32) c[2], c3 = in(reg32) c[3],
            options(nostack)
        )
    }
}

/// Closes the thread's current bulk group (the reductions issued since the last commit).
#[inline(always)]
pub fn commit_bulk() {
    // SAFETY: committing an empty or open bulk group has no preconditions.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) }
}

/// Waits until every bulk group the thread committed has read its shared source: the regions
/// may be written again (the writes to global memory may still be on their way).
#[inline(always)]
pub fn wait_bulk_reads() {
    // SAFETY: waiting has no preconditions.
    unsafe { asm!("cp.async.bulk.wait_group.read 0;", options(nostack)) }
}
