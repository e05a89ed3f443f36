//! Bytes of device memory the library's tensors hold: live now, and the peak since the last reset.
//!
//! Every `DeviceTensor` and `DeviceF32` registers its bytes here on allocation and releases them on
//! drop, so the peak of a call counts its outputs and any workspace it allocates and frees inside.
//! Buffers of other libraries, the context and the module are not counted; for those, see
//! `Gpu::memory_info`.

use std::sync::atomic::{AtomicUsize, Ordering};

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

pub(crate) fn allocated(bytes: usize) {
    let live = LIVE.fetch_add(bytes, Ordering::SeqCst) + bytes;
    PEAK.fetch_max(live, Ordering::SeqCst);
}

pub(crate) fn released(bytes: usize) {
    LIVE.fetch_sub(bytes, Ordering::SeqCst);
}

/// Bytes held by live library buffers.
pub fn live_bytes() -> usize {
    LIVE.load(Ordering::SeqCst)
}

/// Highest `live_bytes()` since the last `reset_peak()`.
pub fn peak_bytes() -> usize {
    PEAK.load(Ordering::SeqCst)
}

/// Starts a new peak measurement from what is live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::SeqCst), Ordering::SeqCst);
}
