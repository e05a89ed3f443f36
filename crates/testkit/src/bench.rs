//! Benchmark evidence: what ran, where, how it was timed, how fast, how right, how much memory.
//!
//! One bundle per run (a JSON file) holds the environment and one record per case with every raw
//! event-timed sample, so any summary can be recomputed from it.

use serde_json::{Value, json};

use flash_attn::timing::median;
use flash_attn::{AttentionShape, DType, Gpu};

/// FLOPs of the forward pass as the anchors count them: `4·B·H·N_q·N_k·d`, halved when causal.
pub fn forward_flops(shape: &AttentionShape, causal: bool) -> f64 {
    let f = 4.0
        * shape.batch as f64
        * shape.heads_q as f64
        * shape.n_q as f64
        * shape.n_k as f64
        * shape.head_dim as f64;
    if causal { f / 2.0 } else { f }
}

/// FLOPs of the forward pass over the (row, key) pairs a local window and the causal mask
/// allow (`4·d` per pair, every batch item and head), so windowed runs report the work they do.
pub fn windowed_forward_flops(
    shape: &AttentionShape,
    options: &flash_attn::AttentionOptions,
) -> f64 {
    use flash_attn::key_range;
    let window = options.window_or_none();
    let pairs: u64 = (0..shape.n_q)
        .map(|i| {
            let (start, end) = key_range(i, shape.n_q, shape.n_k, options.causal, window);
            end.saturating_sub(start) as u64
        })
        .sum();
    4.0 * shape.batch as f64 * shape.heads_q as f64 * pairs as f64 * shape.head_dim as f64
}

/// FLOPs of the backward pass as the anchors count them: 2.5 × the forward's.
pub fn backward_flops(shape: &AttentionShape, causal: bool) -> f64 {
    2.5 * forward_flops(shape, causal)
}

/// The rows of the anchors table (`shared/anchors`): d ∈ {64, 128}, N = 512 … 16384 with
/// `B = 16384/N`, `H = 2048/d`, causal and not, then the running fixture.
pub fn anchor_cases() -> Vec<(AttentionShape, bool)> {
    let mut cases = Vec::new();
    for d in [64u32, 128] {
        for n in [512u32, 1024, 2048, 4096, 8192, 16384] {
            let shape = AttentionShape {
                batch: (16384 / n).max(1),
                n_q: n,
                n_k: n,
                heads_q: 2048 / d,
                heads_kv: 2048 / d,
                head_dim: d,
                head_dim_v: d,
            };
            cases.push((shape, false));
            cases.push((shape, true));
        }
    }
    cases.push((running_fixture(), false));
    cases
}

/// The rows of the window-cost check (issue 10: blocks outside a local window are skipped, so a
/// window costs what its keys cost), H = 16, d = 128, non-causal, each with its window: at
/// B = 1, N = 16384 the full square, the window (1024, 1024) (2049 keys per row) and the
/// sliding window (1024, 0) (1025 keys per row); beside them the same 16384 rows as B = 8 ×
/// N = 2048 and B = 16 × N = 1024 without a window (2048 and 1024 keys per row).
pub fn window_cases() -> Vec<(AttentionShape, Option<(u32, u32)>)> {
    let shape = |batch: u32, n: u32| AttentionShape {
        batch,
        n_q: n,
        n_k: n,
        heads_q: 16,
        heads_kv: 16,
        head_dim: 128,
        head_dim_v: 128,
    };
    vec![
        (shape(1, 16384), None),
        (shape(1, 16384), Some((1024, 1024))),
        (shape(8, 2048), None),
        (shape(1, 16384), Some((1024, 0))),
        (shape(16, 1024), None),
    ]
}

/// The head dims of the head-dim speed table (issue 10): d ∈ {32, 80, 96, 160, 192, 256} at
/// N = 4096, causal and not, with the anchors' work per case: `B = 16384/N = 4` (16K tokens)
/// and `H = 2048/d` rounded to the nearest head (H·d within 1.6% of 2048).
pub const HEADDIM_TABLE_DIMS: [u32; 6] = [32, 80, 96, 160, 192, 256];

/// The rows of the head-dim speed table; see [`HEADDIM_TABLE_DIMS`].
pub fn headdim_cases() -> Vec<(AttentionShape, bool)> {
    let n = 4096u32;
    let mut cases = Vec::new();
    for d in HEADDIM_TABLE_DIMS {
        let heads = (2048 + d / 2) / d;
        let shape = AttentionShape {
            batch: 16384 / n,
            n_q: n,
            n_k: n,
            heads_q: heads,
            heads_kv: heads,
            head_dim: d,
            head_dim_v: d,
        };
        cases.push((shape, false));
        cases.push((shape, true));
    }
    cases
}

/// The article's running fixture: B=1, N=4096, H=32, d=128.
pub fn running_fixture() -> AttentionShape {
    AttentionShape {
        batch: 1,
        n_q: 4096,
        n_k: 4096,
        heads_q: 32,
        heads_kv: 32,
        head_dim: 128,
        head_dim_v: 128,
    }
}

/// GPU, driver and CUDA versions, and the commit the binary was built from.
pub fn environment(gpu: &Gpu) -> Value {
    let driver = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| {
            // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release ..."
            let rest = t.lines().next()?.split("Kernel Module").nth(1)?;
            rest.split_whitespace()
                .find(|w| w.starts_with(|c: char| c.is_ascii_digit()) && w.contains('.'))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let cuda = gpu
        .cuda_version()
        .unwrap_or_else(|e| format!("unknown ({e})"));
    json!({
        "gpu": gpu.device_name(),
        "driver": driver,
        "cuda_driver_api": cuda,
        "commit": flash_attn::BUILD_COMMIT,
        "ptx_arch": flash_attn::PTX_ARCH,
        "ptx_origin": flash_attn::PTX_ORIGIN,
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0),
    })
}

/// One timed case of a bundle.
pub struct CaseRecord<'a> {
    pub kernel: &'a str,
    pub pass: &'a str,
    pub schedule: &'a str,
    pub block_sizes: Value,
    pub shape: AttentionShape,
    pub causal: bool,
    /// The local window (left, right), if any.
    pub window: Option<(u32, u32)>,
    pub dtype: DType,
    pub flops: f64,
    pub warmup: usize,
    /// `pipelined` (each sample: `calls_per_sample` calls queued back to back, per-call time) or
    /// `synced` (each sample: one call, waited on).
    pub timing: &'static str,
    pub calls_per_sample: usize,
    pub samples_ms: Vec<f32>,
    /// Relative error against the f64 reference and what it was measured on.
    pub error: Value,
    /// Peak bytes held by the library's device buffers during the timed calls.
    pub peak_bytes: usize,
}

impl CaseRecord<'_> {
    pub fn median_ms(&self) -> f32 {
        median(&self.samples_ms)
    }

    pub fn tflops(&self) -> f64 {
        self.flops / (self.median_ms() as f64 * 1e-3) / 1e12
    }

    pub fn to_json(&self) -> Value {
        let s = &self.shape;
        json!({
            "kernel": self.kernel,
            "pass": self.pass,
            "schedule": self.schedule,
            "block_sizes": self.block_sizes,
            "shape": {"B": s.batch, "N_q": s.n_q, "N_k": s.n_k, "H_q": s.heads_q, "H_kv": s.heads_kv, "d": s.head_dim},
            "causal": self.causal,
            "window": self.window,
            "dtype": self.dtype.name(),
            "flops": self.flops,
            "warmup": self.warmup,
            "timing": self.timing,
            "calls_per_sample": self.calls_per_sample,
            "samples_ms": self.samples_ms,
            "median_ms": self.median_ms(),
            "tflops": self.tflops(),
            "error": self.error,
            "peak_bytes": self.peak_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_cases_match_the_anchor_table() {
        let cases = anchor_cases();
        assert_eq!(cases.len(), 25);
        let (first, causal) = cases[0];
        assert_eq!(
            (
                first.batch,
                first.heads_q,
                first.n_q,
                first.head_dim,
                causal
            ),
            (32, 32, 512, 64, false)
        );
        let (last_d128, _) = cases[23];
        assert_eq!(
            (
                last_d128.batch,
                last_d128.heads_q,
                last_d128.n_q,
                last_d128.head_dim
            ),
            (1, 16, 16384, 128)
        );
        // Running fixture: 4·32·4096²·128 = 274.9 GFLOP forward.
        assert_eq!(forward_flops(&running_fixture(), false), 274_877_906_944.0);
        assert_eq!(
            backward_flops(&running_fixture(), true),
            2.5 * 137_438_953_472.0
        );
    }
}
