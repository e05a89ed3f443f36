//! Shared-memory footprints of the tiled kernels, in f32 elements. The kernels carve their tiles
//! in exactly this order and the host sizes launches and chooses block sizes from the same sums.
//!
//! Tiles whose rows are read across a warp (one row per thread) get a pitch of `d + 1` so the
//! threads of a warp hit distinct banks.

/// Pitch of a tile read row-per-thread.
pub const fn padded(d: u32) -> u32 {
    d + 1
}

/// Row-owned and paper forward: Q_i, K_j (padded, `d` columns), V_j (`d_v`), S_ij/P_ij, the O_i
/// accumulator (`d_v`), and the row statistics m_i, ℓ_i and the rescale factor of each row.
pub const fn forward_floats(br: u32, bc: u32, d: u32, d_v: u32) -> u32 {
    br * padded(d) + bc * padded(d) + bc * d_v + br * bc + br * d_v + 3 * br
}

/// K/V-outer backward: K_j, V_j (padded), the dK_j and dV_j accumulators, Q_i, dO_i (padded),
/// the P_drop and dS tiles, and LSE_i, D_i. V, dV and dO have `d_v` columns, the others `d`.
pub const fn backward_kv_floats(br: u32, bc: u32, d: u32, d_v: u32) -> u32 {
    bc * (padded(d) + padded(d_v))
        + bc * (d + d_v)
        + br * (padded(d) + padded(d_v))
        + 2 * br * bc
        + 2 * br
}

/// Row-owned dQ pass: Q_i, dO_i, K_j, V_j (padded), the dS tile, the dQ_i accumulator, LSE_i, D_i.
pub const fn backward_dq_floats(br: u32, bc: u32, d: u32, d_v: u32) -> u32 {
    br * (padded(d) + padded(d_v)) + bc * (padded(d) + padded(d_v)) + br * bc + br * d + 2 * br
}

pub const fn bytes(floats: u32) -> u32 {
    floats * 4
}
