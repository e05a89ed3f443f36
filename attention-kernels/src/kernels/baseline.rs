//! The article's materialized baseline (0x02B): three global stages, each written to HBM.
//!
//! stage 1 `S = τ·QKᵀ` with the mask applied, stage 2 row softmax `P`, stage 3 `O = PV`. It is the
//! comparison schedule for the memory and traffic claims, so it deliberately stores `S` and `P`
//! (`[batch, heads_q, n_q, n_k]`, in the storage type) instead of fusing them away.

use crate::abi::params::{
    MaterializedOutputParams, MaterializedScoresParams, MaterializedSoftmaxParams,
};
use crate::abi::shape::causal_key_end;
use crate::abi::storage::{Bf16, F16, Storage};
use crate::arch::{
    block_dim_x, block_x, block_y, block_z, entry_points, exp, shared_base, sync_threads, thread_x,
    thread_y, warp_max, warp_sum,
};

/// Side of the square thread block and of the shared tiles of stages 1 and 3.
const TILE: u32 = 16;
/// Shared tiles are padded by one column so column reads do not hit one bank.
const PITCH: usize = TILE as usize + 1;

/// Stage 1. Grid `(⌈n_k/16⌉, ⌈n_q/16⌉, batch·heads_q)`, block `16×16`, shared `2·16·17` f32.
unsafe fn scores<T: Storage>(p: &MaterializedScoresParams) {
    let s = p.shape;
    let (tx, ty) = (thread_x(), thread_y());
    let (b, h) = (block_z() / s.heads_q, block_z() % s.heads_q);
    let hk = s.kv_head(h);
    let i = block_y() * TILE + ty;
    let j = block_x() * TILE + tx;
    let (q, k) = (p.q as *const T, p.k as *const T);
    let d = s.head_dim as usize;
    let q_row =
        |r: u32| ((b as usize * s.n_q as usize + r as usize) * s.heads_q as usize + h as usize) * d;
    let k_row = |r: u32| {
        ((b as usize * s.n_k as usize + r as usize) * s.heads_kv as usize + hk as usize) * d
    };

    let q_tile = shared_base() as *mut f32;
    // SAFETY: the launch provides 2·TILE·PITCH f32 of shared memory.
    let k_tile = unsafe { q_tile.add(TILE as usize * PITCH) };
    let key_row = block_x() * TILE + ty;
    let mut acc = 0.0f32;
    let mut c0 = 0;
    while c0 < s.head_dim {
        let c = c0 + tx;
        // SAFETY: reads are predicated on the tensor bounds; tile writes stay in the window.
        unsafe {
            let qv = if i < s.n_q && c < s.head_dim {
                (*q.add(q_row(i) + c as usize)).to_f32()
            } else {
                0.0
            };
            let kv = if key_row < s.n_k && c < s.head_dim {
                (*k.add(k_row(key_row) + c as usize)).to_f32()
            } else {
                0.0
            };
            *q_tile.add(ty as usize * PITCH + tx as usize) = qv;
            *k_tile.add(ty as usize * PITCH + tx as usize) = kv;
        }
        sync_threads();
        for t in 0..TILE as usize {
            // SAFETY: indices are below TILE·PITCH.
            unsafe {
                acc += *q_tile.add(ty as usize * PITCH + t) * *k_tile.add(tx as usize * PITCH + t)
            };
        }
        sync_threads();
        c0 += TILE;
    }
    if i < s.n_q && j < s.n_k {
        let allowed = p.causal == 0 || j < causal_key_end(i, s.n_q, s.n_k);
        let score = if allowed {
            p.scale * acc
        } else {
            f32::NEG_INFINITY
        };
        let at = ((b as usize * s.heads_q as usize + h as usize) * s.n_q as usize + i as usize)
            * s.n_k as usize
            + j as usize;
        // SAFETY: `at` is inside the [batch, heads_q, n_q, n_k] score tensor.
        unsafe { *(p.s as *mut T).add(at) = T::from_f32(score) };
    }
}

/// Stage 2. One warp per row, any block size that is a multiple of 32; grid `⌈rows/warps⌉`.
unsafe fn softmax<T: Storage>(p: &MaterializedSoftmaxParams) {
    let warps = block_dim_x() / 32;
    let row = block_x() * warps + thread_x() / 32;
    let lane = thread_x() % 32;
    if row >= p.rows {
        return;
    }
    let n = p.n_k as usize;
    // SAFETY: `row < rows`, so the row's n_k elements are inside both tensors.
    let (src, dst) = unsafe {
        (
            (p.s as *const T).add(row as usize * n),
            (p.p as *mut T).add(row as usize * n),
        )
    };
    let mut m = f32::NEG_INFINITY;
    let mut j = lane as usize;
    while j < n {
        // SAFETY: j < n.
        m = m.max(unsafe { *src.add(j) }.to_f32());
        j += 32;
    }
    let m = warp_max(m);
    // A row with no allowed key has no distribution: it is written as zeros (O = 0 downstream).
    let mut l = 0.0f32;
    if m != f32::NEG_INFINITY {
        j = lane as usize;
        while j < n {
            // SAFETY: j < n.
            l += exp(unsafe { *src.add(j) }.to_f32() - m);
            j += 32;
        }
    }
    let l = warp_sum(l);
    let inv_l = if l > 0.0 { 1.0 / l } else { 0.0 };
    j = lane as usize;
    while j < n {
        // SAFETY: j < n.
        unsafe {
            let x = (*src.add(j)).to_f32();
            let pr = if m == f32::NEG_INFINITY {
                0.0
            } else {
                exp(x - m) * inv_l
            };
            *dst.add(j) = T::from_f32(pr);
        }
        j += 32;
    }
}

/// Stage 3. Grid `(⌈d_v/16⌉, ⌈n_q/16⌉, batch·heads_q)`, block `16×16`, shared `2·16·17` f32.
unsafe fn output<T: Storage>(p: &MaterializedOutputParams) {
    let s = p.shape;
    let (tx, ty) = (thread_x(), thread_y());
    let (b, h) = (block_z() / s.heads_q, block_z() % s.heads_q);
    let hk = s.kv_head(h);
    let i = block_y() * TILE + ty;
    let c = block_x() * TILE + tx;
    let d = s.head_dim_v as usize;
    let (prob, v) = (p.p as *const T, p.v as *const T);
    let p_row = (b as usize * s.heads_q as usize + h as usize) * s.n_q as usize;
    let v_at = |j: u32, c: u32| {
        ((b as usize * s.n_k as usize + j as usize) * s.heads_kv as usize + hk as usize) * d
            + c as usize
    };

    let p_tile = shared_base() as *mut f32;
    // SAFETY: the launch provides 2·TILE·PITCH f32 of shared memory.
    let v_tile = unsafe { p_tile.add(TILE as usize * PITCH) };
    let mut acc = 0.0f32;
    let mut j0 = 0;
    while j0 < s.n_k {
        // SAFETY: reads are predicated on the tensor bounds; tile writes stay in the window.
        unsafe {
            let pj = j0 + tx;
            let pv = if i < s.n_q && pj < s.n_k {
                (*prob.add((p_row + i as usize) * s.n_k as usize + pj as usize)).to_f32()
            } else {
                0.0
            };
            let vj = j0 + ty;
            let vv = if vj < s.n_k && c < s.head_dim_v {
                (*v.add(v_at(vj, c))).to_f32()
            } else {
                0.0
            };
            *p_tile.add(ty as usize * PITCH + tx as usize) = pv;
            *v_tile.add(ty as usize * PITCH + tx as usize) = vv;
        }
        sync_threads();
        for t in 0..TILE as usize {
            // SAFETY: indices are below TILE·PITCH.
            unsafe {
                acc += *p_tile.add(ty as usize * PITCH + t) * *v_tile.add(t * PITCH + tx as usize)
            };
        }
        sync_threads();
        j0 += TILE;
    }
    if i < s.n_q && c < s.head_dim_v {
        let at = ((b as usize * s.n_q as usize + i as usize) * s.heads_q as usize + h as usize) * d
            + c as usize;
        // SAFETY: `at` is inside O.
        unsafe { *(p.o as *mut T).add(at) = T::from_f32(acc) };
    }
}

entry_points! {
    materialized_scores_f32 => scores::<f32>(MaterializedScoresParams);
    materialized_scores_f16 => scores::<F16>(MaterializedScoresParams);
    materialized_scores_bf16 => scores::<Bf16>(MaterializedScoresParams);
    materialized_softmax_f32 => softmax::<f32>(MaterializedSoftmaxParams);
    materialized_softmax_f16 => softmax::<F16>(MaterializedSoftmaxParams);
    materialized_softmax_bf16 => softmax::<Bf16>(MaterializedSoftmaxParams);
    materialized_output_f32 => output::<f32>(MaterializedOutputParams);
    materialized_output_f16 => output::<F16>(MaterializedOutputParams);
    materialized_output_bf16 => output::<Bf16>(MaterializedOutputParams);
}
