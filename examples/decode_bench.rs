//! Decode speed on the rows (bf16, d = 128): one query row per sequence against a long
//! key cache, plus a chunked prefill (N_q = 512 against 32,768 keys). Pipelined timing: after
//! warm-up, each sample is `--calls` back-to-back `forward_into` calls between two CUDA events
//! (per-call time = sample / calls), so launch gaps overlap as in a serving loop. Prints the
//! median per-call time and the K/V bytes read per second; writes every raw sample to
//! `<out>/decode-bench.json`. The PyTorch side: `scripts/peers/decode_bench.py` (same rows, same
//! timing); `scripts/bench-h200.sh decode` runs both.
//!
//! `cargo run --release --example decode_bench -- [--calls 50] [--samples 30] [--warmup 5]
//! [--kernel auto|decode|sm90|…] [--out reports/bench]`

use flash_attn::timing::{median, time_calls};
use flash_attn::{AttentionShape, DType, DeviceF32, DeviceTensor, FlashOptions, KernelChoice};

/// (batch, n_q, n_k, heads_q, heads_kv).
const ROWS: [(u32, u32, u32, u32, u32); 6] = [
    (1, 1, 32768, 32, 8),
    (1, 1, 131072, 32, 8),
    (8, 1, 8192, 32, 8),
    (64, 1, 4096, 32, 8),
    (1, 1, 131072, 32, 32),
    (1, 512, 32768, 32, 8),
];

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: cannot parse {v:?}"))
        })
        .unwrap_or(default)
}

fn main() -> flash_attn::Result<()> {
    let (calls, samples, warmup) = (
        arg("--calls", 50usize),
        arg("--samples", 30usize),
        arg("--warmup", 5usize),
    );
    assert!(samples >= 20, "--samples must be at least 20");
    let kernel: KernelChoice = arg("--kernel", "auto".to_owned())
        .parse()
        .expect("--kernel");
    let out_dir = arg("--out", "reports/bench".to_owned());
    let gpu = flash_attn::gpu()?;
    let options = FlashOptions::default().kernel(kernel);
    let mut records = vec![];
    for (batch, n_q, n_k, heads_q, heads_kv) in ROWS {
        let s = AttentionShape {
            batch,
            n_q,
            n_k,
            heads_q,
            heads_kv,
            head_dim: 128,
        };
        let fill = |n: usize, seed: u64| {
            let x = flash_attn_testkit::inputs::uniform(seed, n);
            DeviceTensor::from_f32(DType::Bf16, &x)
        };
        let (q, k, v) = (
            fill(s.q_elems(), 1)?,
            fill(s.kv_elems(), 2)?,
            fill(s.kv_elems(), 3)?,
        );
        let o = DeviceTensor::poisoned(DType::Bf16, s.q_elems())?;
        let lse = DeviceF32::poisoned(s.row_elems())?;
        let plan = flash_attn::plan(
            &gpu,
            &s,
            DType::Bf16,
            &options,
            flash_attn::Direction::Forward,
        )?;
        let raw = time_calls(&gpu, warmup, samples, || {
            for _ in 0..calls {
                flash_attn::forward_into(&gpu, &s, &q, &k, &v, &o, &lse, &options)?;
            }
            Ok(())
        })?;
        let per_call: Vec<f32> = raw.iter().map(|ms| ms / calls as f32).collect();
        let ms = median(&per_call);
        let kv_bytes = 2 * s.kv_elems() as u64 * 2;
        let tb_s = kv_bytes as f64 / (ms as f64 * 1e-3) / 1e12;
        println!(
            "B={batch} N_q={n_q} N_k={n_k} H_q/H_kv={heads_q}/{heads_kv}: {ms:.4} ms per call, K/V {tb_s:.2} TB/s ({} grid {:?})",
            plan.entry, plan.grid
        );
        records.push(format!(
            "{{\"B\":{batch},\"N_q\":{n_q},\"N_k\":{n_k},\"H_q\":{heads_q},\"H_kv\":{heads_kv},\"d\":128,\"dtype\":\"bf16\",\"kernel\":\"{}\",\"entry\":\"{}\",\"grid\":[{},{},{}],\"calls_per_sample\":{calls},\"warmup\":{warmup},\"median_ms\":{ms},\"kv_bytes\":{kv_bytes},\"kv_tb_per_s\":{tb_s},\"samples_ms_per_call\":{:?}}}",
            plan.family, plan.entry, plan.grid.0, plan.grid.1, plan.grid.2, per_call
        ));
    }
    std::fs::create_dir_all(&out_dir).expect("create the output folder");
    let path = format!("{out_dir}/decode-bench.json");
    let json = format!(
        "{{\"device\":\"{}\",\"commit\":\"{}\",\"rows\":[\n{}\n]}}\n",
        gpu.device_name(),
        flash_attn::BUILD_COMMIT,
        records.join(",\n")
    );
    std::fs::write(&path, json).expect("write the samples");
    println!("samples: {path}");
    Ok(())
}
