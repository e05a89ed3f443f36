//! `flash-attn memory`: device memory of forward and backward as N grows, against the
//! materialized baseline. Writes `memory-<unix time>.json`; `scripts/peers/memory_plot.py` puts it
//! beside PyTorch's math backend (`scripts/peers/sdpa_bench.py --memory`) as a table and a PNG.

use std::path::PathBuf;

use clap::Args;
use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::tensor_core::tensor_core_forward;
use flash_attn::tensor_core_backward::{self, BackwardInputs};
use flash_attn::{
    AttentionOptions, AttentionShape, DType, DeviceTensor, FlashOptions, Gpu, flash_backward,
    flash_forward, memory,
};
use flash_attn_testkit::bench::environment;
use flash_attn_testkit::inputs::uniform;
use serde_json::json;

use super::CliResult;

#[derive(Args, Debug)]
pub struct MemoryArgs {
    /// Sequence lengths N (queries and keys).
    #[arg(long, num_args = 1.., default_values_t = [1024u32, 2048, 4096, 8192, 16384])]
    n: Vec<u32>,
    /// Heads H (B = 1).
    #[arg(long, default_value_t = 16)]
    heads: u32,
    /// Head dimension d.
    #[arg(long, default_value_t = 128)]
    head_dim: u32,
    /// Storage dtype.
    #[arg(long, default_value = "bf16")]
    dtype: DType,
    /// Directory for the JSON record.
    #[arg(long, default_value = "reports/bench")]
    out: PathBuf,
}

/// Bytes the library allocates during `call` beyond what was live before it (inputs excluded).
fn extra_bytes(call: impl FnOnce() -> flash_attn::Result<()>) -> flash_attn::Result<usize> {
    let before = memory::live_bytes();
    memory::reset_peak();
    call()?;
    Ok(memory::peak_bytes() - before)
}

pub fn run(args: &MemoryArgs) -> CliResult {
    let gpu = flash_attn::gpu()?;
    let dtype = args.dtype;
    let env = environment(&gpu);
    println!(
        "{:>6} {:>16} {:>14} {:>14} {:>15} {:>15}",
        "N", "materialized fwd", "exact fwd", "exact bwd", "tensor-core fwd", "tensor-core bwd"
    );
    let mut rows = Vec::new();
    for &n in &args.n {
        let shape = AttentionShape {
            batch: 1,
            n_q: n,
            n_k: n,
            heads_q: args.heads,
            heads_kv: args.heads,
            head_dim: args.head_dim,
        };
        let row = measure(&gpu, &shape, dtype)?;
        let mib = |k: &str| {
            row[k].as_u64().map_or("-".to_owned(), |b| {
                format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
            })
        };
        println!(
            "{n:>6} {:>16} {:>14} {:>14} {:>15} {:>15}",
            mib("materialized_forward"),
            mib("exact_forward"),
            mib("exact_backward"),
            mib("tensor_core_forward"),
            mib("tensor_core_backward")
        );
        rows.push(row);
    }
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join(format!("memory-{}.json", env["unix_time"]));
    let doc = json!({
        "environment": env,
        "measure": "bytes the library's device buffers reach during the call beyond the inputs (outputs, LSE and any workspace)",
        "rows": rows,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("record: {}", path.display());
    Ok(())
}

fn measure(
    gpu: &Gpu,
    shape: &AttentionShape,
    dtype: DType,
) -> flash_attn::Result<serde_json::Value> {
    let upload = |seed: u64, len: usize| DeviceTensor::from_f32(dtype, &uniform(seed, len));
    let seed = rand::random::<u64>();
    let (q, k, v, d_o) = (
        upload(seed, shape.q_elems())?,
        upload(seed + 1, shape.kv_elems())?,
        upload(seed + 2, shape.kv_elems())?,
        upload(seed + 3, shape.q_elems())?,
    );
    let options = AttentionOptions::new();
    let materialized = extra_bytes(|| {
        let workspace = MaterializedWorkspace::new(shape, dtype)?;
        let o = DeviceTensor::poisoned(dtype, shape.q_elems())?;
        materialized_forward(gpu, &workspace, &q, &k, &v, &o, &options)?;
        gpu.synchronize()
    })?;
    let flash = FlashOptions::new(options.clone());
    let exact_forward = extra_bytes(|| flash_forward(gpu, shape, &q, &k, &v, &flash).map(drop))?;
    let fwd = flash_forward(gpu, shape, &q, &k, &v, &flash)?;
    let exact_backward = extra_bytes(|| {
        flash_backward(gpu, shape, &q, &k, &v, &fwd.o, &fwd.lse, &d_o, &flash).map(drop)
    })?;
    let (tensor_core, tensor_core_backward) =
        if dtype != DType::F32 && matches!(shape.head_dim, 64 | 128) {
            let forward =
                extra_bytes(|| tensor_core_forward(gpu, shape, &q, &k, &v, &options).map(drop))?;
            let fwd = tensor_core_forward(gpu, shape, &q, &k, &v, &options)?;
            let inputs = BackwardInputs {
                q: &q,
                k: &k,
                v: &v,
                o: &fwd.o,
                d_o: &d_o,
                lse: &fwd.lse,
            };
            let backward = extra_bytes(|| {
                tensor_core_backward::tensor_core_backward(gpu, shape, &inputs, &options).map(drop)
            })?;
            (Some(forward), Some(backward))
        } else {
            (None, None)
        };
    Ok(json!({
        "B": shape.batch, "H": shape.heads_q, "N": shape.n_q, "d": shape.head_dim, "dtype": dtype.name(),
        "input_bytes": (q.size_bytes() + k.size_bytes() + v.size_bytes()),
        "materialized_forward": materialized,
        "exact_forward": exact_forward,
        "exact_backward": exact_backward,
        "tensor_core_forward": tensor_core,
        "tensor_core_backward": tensor_core_backward,
    }))
}
