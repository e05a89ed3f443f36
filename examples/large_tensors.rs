//! The large-tensor check (issue 10 item 5): a causal bf16 call with 2^32 elements per Q-shaped
//! tensor, forward and backward on the family the plan picks (sm90 on an H200), O, LSE and dQ
//! checked against the f64 reference on sampled rows (the last row of the last head, which sees
//! every key, among them), each pass timed once (one sample: at this size a pass is tens of
//! seconds, so launch overhead and warm-up do not matter), a JSON record written.
//!
//! `cargo run --release --example large_tensors -- [--n N] [--heads-q H] [--heads-kv H]
//! [--rows R] [--out FILE]`; defaults: N = 2^20, H_q = 32, H_kv = 8, d = 128, 16 sampled rows,
//! `large_tensors.json`. Device memory: Q, O, dO, dQ 8 GiB each, K, V, dK, dV 2 GiB each, the f32
//! dQ accumulator 16 GiB (about 57 GiB); host memory about 40 GiB (the inputs as bf16 bits, O
//! and dQ downloaded). Inputs come from a counter-based hash (any thread writes any element), so
//! they are generated on every core.
//!
//! Bounds, as the GPU matrix's for bf16: ‖out − ref‖/‖ref‖ ≤ 1e-2 over the sampled rows for O and
//! dQ, |LSE − ref| ≤ 2e-3. Exits non-zero on a failed check.

use std::time::Instant;

use flash_attn::{
    AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceTensor, Direction, FlashOptions,
};
use flash_attn_testkit::sampled_rows::{RowInputs, relative_error, row_reference};
use half::bf16;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

struct Args {
    n: u32,
    heads_q: u32,
    heads_kv: u32,
    rows: usize,
    out: String,
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        n: 1 << 20,
        heads_q: 32,
        heads_kv: 8,
        rows: 16,
        out: "large_tensors.json".into(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--n" => a.n = value()?.parse()?,
            "--heads-q" => a.heads_q = value()?.parse()?,
            "--heads-kv" => a.heads_kv = value()?.parse()?,
            "--rows" => a.rows = value()?.parse()?,
            "--out" => a.out = value()?,
            _ => return Err(format!("unknown argument {flag}").into()),
        }
    }
    if a.rows < 2 {
        return Err("--rows must be at least 2".into());
    }
    Ok(a)
}

/// SplitMix64 of `x`: a counter-based generator, so element `e` of tensor `t` is the same
/// whichever thread writes it.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `len` bf16 bits uniform in `[-range, range)`, from tensor number `tensor` of seed `seed`,
/// generated on every core.
fn random_bf16(len: usize, seed: u64, tensor: u64, range: f32) -> Vec<u16> {
    let mut out = vec![0u16; len];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let chunk = len.div_ceil(threads).max(1);
    let key = mix(seed ^ mix(tensor));
    std::thread::scope(|scope| {
        for (c, part) in out.chunks_mut(chunk).enumerate() {
            scope.spawn(move || {
                let first = c * chunk;
                for (e, x) in part.iter_mut().enumerate() {
                    let bits = mix(key ^ (first + e) as u64);
                    let unit = (bits >> 40) as f32 / (1u64 << 24) as f32;
                    *x = bf16::from_f32((2.0 * unit - 1.0) * range).to_bits();
                }
            });
        }
    });
    out
}

fn widen(bits: &[u16], e: usize) -> f64 {
    bf16::from_bits(bits[e]).to_f64()
}

/// Sampled `(head, row)` pairs: the first and last rows of the first and last heads, and an even
/// spread of the rest (rows near the end see nearly every key: the costly, telling ones).
fn sampled_rows(shape: &AttentionShape, count: usize) -> Vec<(u32, u32, u32)> {
    let (h_last, i_last) = (shape.heads_q - 1, shape.n_q - 1);
    let mut rows = vec![
        (0, h_last, i_last),
        (0, 0, 0),
        (0, h_last, 0),
        (0, 0, i_last),
    ];
    let spread = count.saturating_sub(rows.len()) as u64;
    for t in 0..spread {
        let h = ((t * 7 + 3) % shape.heads_q as u64) as u32;
        let i = (shape.n_q as u64 - 1 - (t * shape.n_q as u64) / (spread * 3)) as u32;
        rows.push((0, h, i));
    }
    rows.truncate(count);
    rows
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let start = Instant::now();
    let stamp = || format!("[{:6.1} s]", start.elapsed().as_secs_f64());
    let shape = AttentionShape {
        batch: 1,
        n_q: args.n,
        n_k: args.n,
        heads_q: args.heads_q,
        heads_kv: args.heads_kv,
        head_dim: 128,
        head_dim_v: 128,
    };
    let dtype = DType::Bf16;
    let attention = AttentionOptions::new().causal(true);
    let options = FlashOptions::new(attention.clone());
    let gpu = flash_attn::gpu()?;
    println!("{} {} {shape:?} bf16 causal", stamp(), gpu.device_name());
    println!(
        "{} Q-shaped tensors: {} elements each",
        stamp(),
        shape.q_elems()
    );
    let forward_plan = flash_attn::plan(&gpu, &shape, dtype, &options, Direction::Forward)?;
    let backward_plan = flash_attn::plan(&gpu, &shape, dtype, &options, Direction::Backward)?;
    println!("forward plan:\n{forward_plan}\nbackward plan:\n{backward_plan}");

    let seed = 0x1a7e_5eed;
    let q = random_bf16(shape.q_elems(), seed, 0, 2.0);
    let k = random_bf16(shape.k_elems(), seed, 1, 2.0);
    let v = random_bf16(shape.v_elems(), seed, 2, 1.0);
    let d_o = random_bf16(shape.o_elems(), seed, 3, 1.0);
    println!("{} inputs generated on the host", stamp());
    let up = |bits: &[u16]| DeviceTensor::from_bits16(dtype, bits);
    let (qd, kd, vd, dod) = (up(&q)?, up(&k)?, up(&v)?, up(&d_o)?);
    gpu.synchronize()?;
    println!("{} inputs uploaded", stamp());

    let t = Instant::now();
    let fwd = flash_attn::forward(&gpu, &shape, &qd, &kd, &vd, &options)?;
    gpu.synchronize()?;
    let forward_s = t.elapsed().as_secs_f64();
    println!(
        "{} forward on {}: {forward_s:.2} s (one sample, allocation of O and LSE included)",
        stamp(),
        fwd.plan.family
    );
    let inputs = BackwardInputs {
        q: &qd,
        k: &kd,
        v: &vd,
        o: &fwd.o,
        d_o: &dod,
        lse: &fwd.lse,
    };
    let t = Instant::now();
    let grads = flash_attn::backward(&gpu, &shape, &inputs, &options)?;
    gpu.synchronize()?;
    let backward_s = t.elapsed().as_secs_f64();
    println!(
        "{} backward on {}: {backward_s:.2} s (one sample, allocation of the gradients and workspace included)",
        stamp(),
        grads.plan.family
    );
    let o = fwd.o.to_bits16()?;
    let lse = fwd.lse.to_vec()?;
    let dq = grads.dq.to_bits16()?;
    println!("{} O, LSE and dQ downloaded", stamp());

    let rows = sampled_rows(&shape, args.rows);
    let reader = RowInputs {
        q: |e: usize| widen(&q, e),
        k: |e: usize| widen(&k, e),
        v: |e: usize| widen(&v, e),
        d_o: |e: usize| widen(&d_o, e),
    };
    let references: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = rows
            .iter()
            .map(|&row| {
                let (shape, attention, reader) = (&shape, &attention, &reader);
                scope.spawn(move || row_reference(shape, attention, row, reader))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    println!("{} f64 reference of {} rows computed", stamp(), rows.len());
    let d = shape.head_dim as usize;
    let (mut o_got, mut o_want, mut dq_got, mut dq_want) = (vec![], vec![], vec![], vec![]);
    let mut lse_err = 0.0f64;
    for (&(b, h, i), r) in rows.iter().zip(references) {
        let r = r?;
        let at = ((b as usize * shape.n_q as usize + i as usize) * shape.heads_q as usize
            + h as usize)
            * d;
        o_got.extend((0..d).map(|c| widen(&o, at + c)));
        dq_got.extend((0..d).map(|c| widen(&dq, at + c)));
        o_want.extend(r.o);
        dq_want.extend(r.dq);
        let l = lse
            [(b as usize * shape.heads_q as usize + h as usize) * shape.n_q as usize + i as usize]
            as f64;
        let e = (l - r.lse).abs();
        lse_err = if e.is_nan() { f64::NAN } else { lse_err.max(e) };
    }
    let (o_err, dq_err) = (
        relative_error(&o_got, &o_want),
        relative_error(&dq_got, &dq_want),
    );
    let ok = o_err <= 1e-2 && dq_err <= 1e-2 && lse_err <= 2e-3;
    println!(
        "{} {}: o {o_err:.2e}, lse {lse_err:.2e}, dq {dq_err:.2e} over rows {rows:?}",
        stamp(),
        if ok { "ok" } else { "FAIL" }
    );
    let record = format!(
        "{{\"check\": \"large_tensors\", \"device\": {:?}, \"shape\": {{\"batch\": {}, \"n_q\": {}, \"n_k\": {}, \"heads_q\": {}, \"heads_kv\": {}, \"head_dim\": {}}}, \"dtype\": \"bf16\", \"causal\": true, \"q_elems\": {}, \"forward_family\": \"{}\", \"forward_kernel\": {:?}, \"backward_family\": \"{}\", \"backward_kernel\": {:?}, \"forward_s\": {forward_s:.3}, \"backward_s\": {backward_s:.3}, \"timing\": \"one sample each, synchronized wall clock\", \"rows\": {:?}, \"o_rel_err\": {o_err:e}, \"lse_abs_err\": {lse_err:e}, \"dq_rel_err\": {dq_err:e}, \"bounds\": {{\"o\": 1e-2, \"lse\": 2e-3, \"dq\": 1e-2}}, \"ok\": {ok}, \"total_s\": {:.1}}}\n",
        gpu.device_name(),
        shape.batch,
        shape.n_q,
        shape.n_k,
        shape.heads_q,
        shape.heads_kv,
        shape.head_dim,
        shape.q_elems(),
        fwd.plan.family,
        fwd.plan.entry,
        grads.plan.family,
        grads.plan.entry,
        rows.iter().map(|&(b, h, i)| [b, h, i]).collect::<Vec<_>>(),
        start.elapsed().as_secs_f64()
    );
    std::fs::write(&args.out, record)?;
    println!("{} record written to {}", stamp(), args.out);
    if !ok {
        return Err("the large-tensor check failed".into());
    }
    Ok(())
}
