//! `flash-attn memory`: device memory of forward and backward as N grows, against the
//! materialized baseline. Writes `memory-<unix time>.json`; `scripts/peers/memory_plot.py` puts it
//! beside PyTorch's math backend (`scripts/peers/sdpa_bench.py --memory`) as a table and a PNG.

use std::path::PathBuf;

use clap::Args;
use flash_attn::materialized::{MaterializedWorkspace, materialized_forward};
use flash_attn::{
    AttentionOptions, AttentionShape, BackwardInputs, DType, DeviceTensor, FlashOptions, Gpu,
    KernelChoice, Plan, memory,
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
    /// Kernel families to measure, comma separated: auto (the one `flash_attn::forward` picks),
    /// exact, sm80, sm90.
    #[arg(long, value_delimiter = ',', default_value = "auto")]
    kernel: Vec<KernelChoice>,
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
        "{:>6} {:<18} {:>14} {:>14} {:>14} {:>14}",
        "N", "kernel", "fwd measured", "fwd planned", "bwd measured", "bwd planned"
    );
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    let mut rows = Vec::new();
    for &n in &args.n {
        let shape = AttentionShape {
            batch: 1,
            n_q: n,
            n_k: n,
            heads_q: args.heads,
            heads_kv: args.heads,
            head_dim: args.head_dim,
            head_dim_v: args.head_dim,
        };
        let row = measure(&gpu, &shape, dtype, &args.kernel)?;
        println!(
            "{n:>6} {:<18} {:>14}",
            "materialized",
            mib(row["materialized_forward"].as_u64().unwrap_or(0))
        );
        for family in row["families"].as_array().into_iter().flatten() {
            let b = |k: &str| mib(family[k].as_u64().unwrap_or(0));
            println!(
                "{n:>6} {:<18} {:>14} {:>14} {:>14} {:>14}",
                format!(
                    "{} ({})",
                    family["family"].as_str().unwrap_or("?"),
                    family["asked"].as_str().unwrap_or("?")
                ),
                b("forward"),
                b("forward_planned"),
                b("backward"),
                b("backward_planned")
            );
        }
        rows.push(row);
    }
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join(format!("memory-{}.json", env["unix_time"]));
    let doc = json!({
        "environment": env,
        "measure": "bytes the library's device buffers reach during the call beyond the inputs (outputs, LSE, workspace, sequence arrays); planned: outputs + LSE + the plan's workspace",
        "rows": rows,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&doc)?)?;
    println!("record: {}", path.display());
    Ok(())
}

/// Bytes a call's outputs and workspace take by its plan (the sequence arrays of length masks
/// aside, which the measure counts too).
fn planned_bytes(shape: &AttentionShape, dtype: DType, plan: &Plan) -> u64 {
    let e = dtype.size_bytes() as u64;
    let outputs = match plan.direction {
        flash_attn::Direction::Forward => e * shape.o_elems() as u64 + 4 * shape.row_elems() as u64,
        flash_attn::Direction::Backward => {
            e * (shape.q_elems() + shape.k_elems() + shape.v_elems()) as u64
        }
    };
    outputs + plan.workspace_bytes()
}

fn measure(
    gpu: &Gpu,
    shape: &AttentionShape,
    dtype: DType,
    kernels: &[KernelChoice],
) -> flash_attn::Result<serde_json::Value> {
    flash_attn::options::validate_shape(shape)?;
    let upload = |seed: u64, len: usize| DeviceTensor::from_f32(dtype, &uniform(seed, len));
    let seed = rand::random::<u64>();
    let (q, k, v, d_o) = (
        upload(seed, shape.q_elems())?,
        upload(seed + 1, shape.k_elems())?,
        upload(seed + 2, shape.v_elems())?,
        upload(seed + 3, shape.q_elems())?,
    );
    let options = AttentionOptions::new();
    let materialized = extra_bytes(|| {
        let workspace = MaterializedWorkspace::new(shape, dtype)?;
        let o = DeviceTensor::poisoned(dtype, shape.o_elems())?;
        materialized_forward(gpu, &workspace, &q, &k, &v, &o, &options)?;
        gpu.synchronize()
    })?;
    let mut families = Vec::new();
    for &choice in kernels {
        let flash = FlashOptions::new(options.clone()).kernel(choice);
        let mut forward_plan = None;
        let forward = extra_bytes(|| {
            forward_plan = Some(flash_attn::forward(gpu, shape, &q, &k, &v, &flash)?.plan);
            Ok(())
        })?;
        let fwd = flash_attn::forward(gpu, shape, &q, &k, &v, &flash)?;
        let inputs = BackwardInputs {
            q: &q,
            k: &k,
            v: &v,
            o: &fwd.o,
            d_o: &d_o,
            lse: &fwd.lse,
        };
        let mut backward_plan = None;
        let backward = extra_bytes(|| {
            backward_plan = Some(flash_attn::backward(gpu, shape, &inputs, &flash)?.plan);
            Ok(())
        })?;
        let (fp, bp) = (forward_plan.unwrap(), backward_plan.unwrap());
        families.push(json!({
            "asked": choice.to_string(),
            "family": fp.family.name(),
            "backward_family": bp.family.name(),
            "forward": forward,
            "forward_planned": planned_bytes(shape, dtype, &fp),
            "backward": backward,
            "backward_planned": planned_bytes(shape, dtype, &bp),
            "backward_workspace": bp.workspace,
        }));
    }
    Ok(json!({
        "B": shape.batch, "H": shape.heads_q, "N": shape.n_q, "d": shape.head_dim, "dtype": dtype.name(),
        "input_bytes": (q.size_bytes() + k.size_bytes() + v.size_bytes()),
        "materialized_forward": materialized,
        "families": families,
    }))
}
