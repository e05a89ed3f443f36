//! `flash-attn backward`: dQ, dK, dV from Q, K, V, dO `.npy` files. O and LSE are recomputed by
//! the forward with the same options unless given (`--o` and `--lse`, from `flash-attn forward`).

use std::path::PathBuf;

use crate::npy;

use super::forward::{FileCallArgs, read_qkv};

#[derive(clap::Args, Debug)]
pub struct BackwardArgs {
    /// Q, `.npy` f32 or f16, `[batch, n_q, heads_q, head_dim]`.
    #[arg(long)]
    pub q: PathBuf,
    /// K, `[batch, n_k, heads_kv, head_dim]`, same dtype as Q.
    #[arg(long)]
    pub k: PathBuf,
    /// V, `[batch, n_k, heads_kv, head_dim_v]`: K's shape but for the last dimension, which
    /// may differ from Q's and K's.
    #[arg(long)]
    pub v: PathBuf,
    /// Gradient of the loss with respect to O (shape of O: `[batch, n_q, heads_q, head_dim_v]`).
    #[arg(long = "do")]
    pub d_o: PathBuf,
    /// O of the forward (with --lse; without both, the forward is recomputed).
    #[arg(long, requires = "lse")]
    pub o: Option<PathBuf>,
    /// LSE of the forward (f32, `[batch, heads_q, n_q]`; with --o).
    #[arg(long, requires = "o")]
    pub lse: Option<PathBuf>,
    /// Where dQ is written (shape of Q, the files' dtype).
    #[arg(long)]
    pub dq: PathBuf,
    /// Where dK is written (shape of K).
    #[arg(long)]
    pub dk: PathBuf,
    /// Where dV is written (shape of V).
    #[arg(long)]
    pub dv: PathBuf,
    /// Where the sink gradients are written (f32, `[heads_q]`; with --sinks).
    #[arg(long, requires = "sinks")]
    pub d_sinks: Option<PathBuf>,
    /// Bitwise reproducible gradients (the exact kernels: dQ from a separate pass instead of
    /// atomics; the tensor-core kernels: dQ atomics in key order).
    #[arg(long)]
    pub deterministic: bool,
    #[command(flatten)]
    pub call: FileCallArgs,
}

pub fn run(args: &BackwardArgs) -> Result<(), Box<dyn std::error::Error>> {
    let ([q, k, v], shape) = read_qkv(&args.q, &args.k, &args.v)?;
    let d_o = npy::read(&args.d_o)?;
    let o_shape = [q.shape[0], q.shape[1], q.shape[2], v.shape[3]];
    if d_o.shape != o_shape || d_o.dtype != q.dtype {
        return Err(format!(
            "do must be O's shape {o_shape:?} in q's dtype {:?}, it is {:?} {:?}",
            q.dtype, d_o.shape, d_o.dtype
        )
        .into());
    }
    let dtype = args.call.dtype(q.dtype);
    let options = args
        .call
        .call
        .options(shape.heads_q)
        .deterministic(args.deterministic);
    let gpu = flash_attn::gpu()?;
    let (o, lse) = match (&args.o, &args.lse) {
        (Some(o), Some(lse)) => (npy::read(o)?.data, npy::read(lse)?.data),
        _ => {
            let f =
                flash_attn::forward_host(&gpu, dtype, &shape, &q.data, &k.data, &v.data, &options)?;
            (f.o, f.lse)
        }
    };
    let g = flash_attn::backward_host(
        &gpu, dtype, &shape, &q.data, &k.data, &v.data, &o, &lse, &d_o.data, &options,
    )?;
    if args.call.print_plan {
        print!("{}", g.plan);
    }
    npy::write(&args.dq, &q.shape, q.dtype, &g.dq)?;
    npy::write(&args.dk, &k.shape, q.dtype, &g.dk)?;
    npy::write(&args.dv, &v.shape, q.dtype, &g.dv)?;
    if let (Some(path), Some(d)) = (&args.d_sinks, &g.d_sinks) {
        npy::write(path, &[d.len()], npy::NpyDType::F32, d)?;
    }
    Ok(())
}
