//! Trains a small GPT (decoder-only, byte-level) in candle twice from the same seed and the same
//! batches — once with this crate's [`flash_attn`] op, once with candle's own matmul + causal mask
//! + softmax attention — and compares the loss curves, step time, tokens/s and peak memory.
//!
//! ```text
//! cd crates/candle-gpt && source <(../../scripts/candle-toolchain.sh --env)
//! cargo build --release --features cuda
//! ../../scripts/candle-run.sh target/release/gpt --attention both --out gpt.json
//! python3 ../../scripts/plot-gpt.py gpt.json -o gpt.png
//! ```
//!
//! The text is the opening of William Shakespeare's *Coriolanus* (public domain), the first 48 KB
//! of the `tinyshakespeare` file of karpathy/char-rnn, in `src/data/coriolanus.txt`.
//!
//! Model: pre-LayerNorm blocks (attention, then a GELU MLP of width 4·d_model), learned
//! positions, byte vocabulary (256), untied output head; AdamW (β = 0.9, 0.95, weight decay 0.1),
//! learning rate warmed up linearly over the first 20 steps. Parameters are initialised on the
//! host from `--seed` (N(0, 0.02), the residual projections scaled by 1/√(2·layers) as in GPT-2)
//! and the batches are drawn on the host from the seed too, so every run starts from the same
//! weights and sees the same batches.
//!
//! Dtype policy (the same in every bf16 run, so only the attention's implementation differs):
//! parameters, activations, LayerNorm, the MLP, the loss and the optimiser are f32; each
//! attention rounds Q, K and V to bf16 and gives back a bf16 O that is widened to f32.
//! - `flash`: [`flash_attn`] on the bf16 Q, K, V (causal, τ = 1/√64), forward and backward.
//! - `candle`: the same rounding points as the kernel: S = τ·QKᵀ from the bf16 values in an f32
//!   matmul (bf16 products are exact in f32, sums in f32, as in the kernel's MMA), the causal
//!   mask added as −∞, `candle_nn::ops::softmax` in f32, P rounded to bf16, O = P·V a bf16 matmul
//!   (f32 accumulation) rounded to bf16. Its backward is candle's autograd of these ops.
//! - `candle-f32`: the same ops with nothing rounded to bf16: the reference that measures the
//!   bf16 noise.
//!
//! "Agree within bf16 noise" is checked as: over the last `--check-last` steps (default 100), the
//! mean |loss_flash − loss_candle| is at most twice the mean |loss_candle − loss_candle-f32|. The
//! second difference is what rounding attention to bf16 does to this training run (the
//! trajectories drift apart as the roundings compound). flash and candle at bf16 differ at fewer
//! points — the rounding of P (the kernel rounds it before normalising, candle after), the
//! backward's intermediates (dP, dS) and the order of f32 sums — than candle and candle-f32 (Q,
//! K, V, P, O and the gradients dO, dP, dQ, dK, dV), each a rounding of the same relative size,
//! so their difference is
//! expected to be smaller than the noise; the factor 2 leaves room for the noise being itself
//! noisy (a mean over 100 steps of a drift that differs run to run). Also every loss must be
//! finite and every run must have learned (its mean loss over those steps at most 3/4 of its
//! first: a run that learned nothing compares nothing). `--attention both` runs flash, candle and
//! candle-f32 in one process, writes every step's loss and time to `--out` (JSON) and exits 1
//! when the check fails.
//!
//! Step time: forward, backward and optimiser step, then a device synchronize; the median over
//! the steps after `--warmup`. Peak memory (CUDA): the high-water mark of bytes allocated from the
//! device's memory pool (`CU_MEMPOOL_ATTR_USED_MEM_HIGH`; candle, cudarc and flash-attn allocate
//! with `cuMemAllocAsync` from it), reset at the start of each run, less what was allocated then
//! (earlier runs' leftovers, such as the attention workspaces flash-attn keeps): what the run's
//! parameters, optimiser state, activations and workspaces needed at their peak. The CUDA
//! context, modules and cuBLAS's own allocations are outside it. Freed memory stays in the pool
//! (release threshold raised), as with any caching allocator, so no step pays for mapping pages.
//!
//! On the CPU (`--device cpu`, a small config) only the candle modes run: the flash op is CUDA
//! only.

use std::fmt::Write as _;
use std::time::Instant;

use candle_core::{D, DType, Device, Result, Tensor, Var};
use candle_nn::optim::{AdamW, Optimizer, ParamsAdamW};
use candle_nn::{Embedding, Linear, Module};
use flash_attn::candle::flash_attn;
use flash_attn::{AttentionOptions, FlashOptions};

const TEXT: &str = include_str!("data/coriolanus.txt");
const VOCAB: usize = 256;
const LR_WARMUP_STEPS: usize = 20;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Attention {
    Flash,
    Candle,
    CandleF32,
}

impl Attention {
    fn name(self) -> &'static str {
        match self {
            Attention::Flash => "flash",
            Attention::Candle => "candle",
            Attention::CandleF32 => "candle-f32",
        }
    }
}

struct Config {
    layers: usize,
    d_model: usize,
    heads: usize,
    seq: usize,
    batch: usize,
    steps: usize,
    warmup: usize,
    lr: f64,
    seed: u64,
    check_last: usize,
}

const USAGE: &str =
    "usage: gpt [--attention flash|candle|candle-f32|both[,...]] [--device cuda|cpu]
           [--steps N] [--batch N] [--seq N] [--layers N] [--d-model N] [--heads N]
           [--lr X] [--seed N] [--warmup N] [--check-last N] [--out FILE.json]
  both (the default): flash, candle and the candle-f32 reference in one process, then the check;
  a list (candle,candle-f32) runs each in turn";

struct Args {
    config: Config,
    modes: Vec<Attention>,
    device: String,
    out: Option<String>,
}

fn parse_args() -> std::result::Result<Args, String> {
    let mut config = Config {
        layers: 4,
        d_model: 512,
        heads: 8,
        seq: 256,
        batch: 32,
        steps: 300,
        warmup: 10,
        lr: 1e-3,
        seed: 0,
        check_last: 100,
    };
    let mut attention = "both".to_string();
    let mut device = "cuda".to_string();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.into());
        }
        let value = args
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = |v: &str| {
            v.parse::<usize>()
                .map_err(|e| format!("{flag} {v}: {e}\n{USAGE}"))
        };
        match flag.as_str() {
            "--attention" => attention = value,
            "--device" => device = value,
            "--out" => out = Some(value),
            "--steps" => config.steps = number(&value)?,
            "--batch" => config.batch = number(&value)?,
            "--seq" => config.seq = number(&value)?,
            "--layers" => config.layers = number(&value)?,
            "--d-model" => config.d_model = number(&value)?,
            "--heads" => config.heads = number(&value)?,
            "--warmup" => config.warmup = number(&value)?,
            "--check-last" => config.check_last = number(&value)?,
            "--seed" => config.seed = number(&value)? as u64,
            "--lr" => {
                config.lr = value
                    .parse()
                    .map_err(|e| format!("--lr {value}: {e}\n{USAGE}"))?
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    let mut modes = Vec::new();
    for a in attention.split(',') {
        match a {
            "flash" => modes.push(Attention::Flash),
            "candle" => modes.push(Attention::Candle),
            "candle-f32" => modes.push(Attention::CandleF32),
            "both" => modes.extend([Attention::Flash, Attention::Candle, Attention::CandleF32]),
            _ => return Err(format!("unknown --attention {a}\n{USAGE}")),
        }
    }
    let c = &config;
    if c.layers == 0 || c.batch == 0 || c.seq == 0 || c.heads == 0 || c.steps == 0 {
        return Err("layers, batch, seq, heads and steps must be positive".into());
    }
    if !c.d_model.is_multiple_of(c.heads) {
        return Err(format!(
            "d-model {} is not a multiple of heads {}",
            c.d_model, c.heads
        ));
    }
    if c.seq >= TEXT.len() {
        return Err(format!(
            "seq {} needs a text longer than its {} bytes",
            c.seq,
            TEXT.len()
        ));
    }
    if c.warmup >= c.steps {
        return Err(format!(
            "warmup {} leaves no timed step of {}",
            c.warmup, c.steps
        ));
    }
    if c.check_last == 0 || c.check_last > c.steps {
        return Err(format!(
            "check-last {} must be in 1..={}",
            c.check_last, c.steps
        ));
    }
    if device == "cpu" && modes.contains(&Attention::Flash) {
        return Err(
            "the flash op runs on CUDA only: on the CPU use --attention candle or candle-f32"
                .into(),
        );
    }
    Ok(Args {
        config,
        modes,
        device,
        out,
    })
}

/// SplitMix64: the host random numbers for the initial weights and the batch order, the same
/// on every device and in every run of a seed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// N(0, std²) by Box–Muller.
    fn normal(&mut self, std: f64) -> f32 {
        let (u, v) = (self.uniform(), self.uniform());
        (std * (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// The trainable tensors, created on the host and copied to the device.
struct Params<'d> {
    rng: Rng,
    device: &'d Device,
    vars: Vec<Var>,
}

impl Params<'_> {
    fn var(&mut self, dims: &[usize], init: impl Fn(&mut Rng) -> f32) -> Result<Tensor> {
        let values: Vec<f32> = (0..dims.iter().product())
            .map(|_| init(&mut self.rng))
            .collect();
        let var = Var::from_tensor(&Tensor::from_vec(values, dims, self.device)?)?;
        let tensor = var.as_tensor().clone();
        self.vars.push(var);
        Ok(tensor)
    }

    fn normal(&mut self, dims: &[usize], std: f64) -> Result<Tensor> {
        self.var(dims, |r| r.normal(std))
    }

    fn linear(&mut self, inputs: usize, outputs: usize, std: f64) -> Result<Linear> {
        let w = self.normal(&[outputs, inputs], std)?;
        let b = self.var(&[outputs], |_| 0.0)?;
        Ok(Linear::new(w, Some(b)))
    }

    fn layer_norm(&mut self, d: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.var(&[d], |_| 1.0)?,
            bias: self.var(&[d], |_| 0.0)?,
        })
    }
}

/// `candle_nn::ops::layer_norm_slow`: candle_nn's `LayerNorm` module runs its fused op on
/// contiguous inputs, and that op has no backward (gradients would silently stop there).
struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
}

impl LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::layer_norm_slow(x, &self.weight, &self.bias, 1e-5)
    }
}

struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc: Linear,
    fc2: Linear,
}

struct Gpt {
    wte: Embedding,
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
    vars: Vec<Var>,
    heads: usize,
}

impl Gpt {
    fn new(c: &Config, device: &Device) -> Result<Self> {
        let d = c.d_model;
        let mut p = Params {
            rng: Rng(c.seed),
            device,
            vars: Vec::new(),
        };
        let std = 0.02;
        let residual_std = std / ((2 * c.layers) as f64).sqrt();
        let wte = Embedding::new(p.normal(&[VOCAB, d], std)?, d);
        let wpe = p.normal(&[c.seq, d], std)?;
        let blocks = (0..c.layers)
            .map(|_| {
                Ok(Block {
                    ln1: p.layer_norm(d)?,
                    qkv: p.linear(d, 3 * d, std)?,
                    proj: p.linear(d, d, residual_std)?,
                    ln2: p.layer_norm(d)?,
                    fc: p.linear(d, 4 * d, std)?,
                    fc2: p.linear(4 * d, d, residual_std)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let ln_f = p.layer_norm(d)?;
        let head = Linear::new(p.normal(&[VOCAB, d], std)?, None);
        Ok(Gpt {
            wte,
            wpe,
            blocks,
            ln_f,
            head,
            vars: p.vars,
            heads: c.heads,
        })
    }

    /// Logits `[batch·seq, 256]` of the byte after each position of `tokens` (`[batch, seq]`).
    fn forward(&self, tokens: &Tensor, attention: Attention, mask: &Tensor) -> Result<Tensor> {
        let (b, t) = tokens.dims2()?;
        let mut x = self.wte.forward(tokens)?.broadcast_add(&self.wpe)?;
        for block in &self.blocks {
            let a = self.attention(&block.ln1.forward(&x)?, block, attention, mask)?;
            x = (x + a)?;
            let h = block.fc.forward(&block.ln2.forward(&x)?)?.gelu()?;
            x = (&x + block.fc2.forward(&h)?)?;
        }
        let logits = self.head.forward(&self.ln_f.forward(&x)?)?;
        logits.reshape((b * t, VOCAB))
    }

    fn attention(
        &self,
        x: &Tensor,
        block: &Block,
        attention: Attention,
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (b, t, d) = x.dims3()?;
        let qkv = block
            .qkv
            .forward(x)?
            .reshape((b, t, 3, self.heads, d / self.heads))?;
        // [B, T, H, head_dim] each: the op's layout (strided views of qkv).
        let [q, k, v] = [0, 1, 2].map(|i| qkv.narrow(2, i, 1).and_then(|t| t.squeeze(2)));
        let (q, k, v) = (q?, k?, v?);
        let o = match attention {
            Attention::Flash => {
                let options = FlashOptions::new(AttentionOptions::new().causal(true));
                let bf16 = |t: &Tensor| t.to_dtype(DType::BF16);
                flash_attn(&bf16(&q)?, &bf16(&k)?, &bf16(&v)?, &options)?.to_dtype(DType::F32)?
            }
            Attention::Candle | Attention::CandleF32 => {
                candle_attention(&q, &k, &v, mask, attention == Attention::Candle)?
            }
        };
        block.proj.forward(&o.reshape((b, t, d))?)
    }
}

/// Causal attention from candle's matmul and softmax on `[B, T, H, head_dim]` f32 tensors; with
/// `bf16` at the flash kernel's rounding points (see the module docs). Returns `[B, T, H, d]`.
fn candle_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Tensor,
    bf16: bool,
) -> Result<Tensor> {
    let scale = 1.0 / (q.dim(D::Minus1)? as f64).sqrt();
    let heads_first = |t: &Tensor| t.transpose(1, 2)?.contiguous();
    let (q, k, v) = (heads_first(q)?, heads_first(k)?, heads_first(v)?);
    let round = |t: &Tensor| t.to_dtype(DType::BF16)?.to_dtype(DType::F32);
    let (q, k) = if bf16 {
        (round(&q)?, round(&k)?)
    } else {
        (q, k)
    };
    let s = (q.matmul(&k.t()?)? * scale)?.broadcast_add(mask)?;
    let p = candle_nn::ops::softmax(&s, D::Minus1)?;
    let o = if bf16 {
        p.to_dtype(DType::BF16)?
            .matmul(&v.to_dtype(DType::BF16)?)?
            .to_dtype(DType::F32)?
    } else {
        p.matmul(&v)?
    };
    o.transpose(1, 2)
}

/// `[T, T]`: 0 where key j ≤ query i, −∞ above the diagonal.
fn causal_mask(t: usize, device: &Device) -> Result<Tensor> {
    let values: Vec<f32> = (0..t * t)
        .map(|ij| {
            if ij % t <= ij / t {
                0.0
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    Tensor::from_vec(values, (t, t), device)
}

/// `batch` windows of the text at random offsets: inputs and the next bytes.
fn batch(c: &Config, rng: &mut Rng, device: &Device) -> Result<(Tensor, Tensor)> {
    let text = TEXT.as_bytes();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for _ in 0..c.batch {
        let at = rng.below(text.len() - c.seq);
        x.extend(text[at..at + c.seq].iter().map(|&b| u32::from(b)));
        y.extend(text[at + 1..at + c.seq + 1].iter().map(|&b| u32::from(b)));
    }
    Ok((
        Tensor::from_vec(x, (c.batch, c.seq), device)?,
        Tensor::from_vec(y, c.batch * c.seq, device)?,
    ))
}

struct Run {
    attention: Attention,
    loss: Vec<f32>,
    step_ms: Vec<f64>,
    /// Peak bytes (CUDA only).
    peak: Option<u64>,
}

impl Run {
    fn median_ms(&self, warmup: usize) -> f64 {
        let mut t = self.step_ms[warmup..].to_vec();
        t.sort_by(f64::total_cmp);
        let n = t.len();
        if n % 2 == 1 {
            t[n / 2]
        } else {
            (t[n / 2 - 1] + t[n / 2]) / 2.0
        }
    }

    fn mean_last(&self, n: usize) -> f64 {
        let l = &self.loss[self.loss.len() - n..];
        l.iter().map(|&x| f64::from(x)).sum::<f64>() / n as f64
    }
}

fn train(c: &Config, attention: Attention, device: &Device) -> Result<Run> {
    let pool = memory::Pool::of(device)?;
    let base = pool.as_ref().map(|p| p.reset_high()).transpose()?;
    let model = Gpt::new(c, device)?;
    let mask = causal_mask(c.seq, device)?;
    let params = ParamsAdamW {
        lr: c.lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    let mut opt = AdamW::new(model.vars.clone(), params)?;
    // A stream of its own: the batch order does not depend on how many weights were drawn.
    let mut batches = Rng(c.seed ^ 0x5eed_ba7c_0000_0000);
    let mut run = Run {
        attention,
        loss: Vec::with_capacity(c.steps),
        step_ms: Vec::with_capacity(c.steps),
        peak: None,
    };
    for step in 0..c.steps {
        let (x, y) = batch(c, &mut batches, device)?;
        let warm = ((step + 1) as f64 / LR_WARMUP_STEPS as f64).min(1.0);
        opt.set_learning_rate(c.lr * warm);
        device.synchronize()?;
        let start = Instant::now();
        let logits = model.forward(&x, attention, &mask)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &y)?;
        opt.backward_step(&loss)?;
        device.synchronize()?;
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let loss = loss.to_scalar::<f32>()?;
        println!(
            "step {step:4} {:10} loss {loss:.4} {ms:8.2} ms",
            attention.name()
        );
        run.loss.push(loss);
        run.step_ms.push(ms);
    }
    if let (Some(pool), Some(base)) = (&pool, base) {
        run.peak = Some(pool.high()?.saturating_sub(base));
    }
    Ok(run)
}

/// The check of the module docs: the two mean differences and what failed (nothing: passed).
struct Verdict {
    diff: f64,
    noise: f64,
    failures: Vec<String>,
}

fn check(runs: &[Run], last: usize) -> Option<Verdict> {
    let find = |a| runs.iter().find(|r| r.attention == a);
    let (flash, candle, reference) = (
        find(Attention::Flash)?,
        find(Attention::Candle)?,
        find(Attention::CandleF32)?,
    );
    let mean_abs_diff = |a: &Run, b: &Run| {
        let n = a.loss.len();
        (n - last..n)
            .map(|i| f64::from((a.loss[i] - b.loss[i]).abs()))
            .sum::<f64>()
            / last as f64
    };
    let diff = mean_abs_diff(flash, candle);
    let noise = mean_abs_diff(candle, reference);
    let mut failures = Vec::new();
    for run in runs {
        let name = run.attention.name();
        if let Some(step) = run.loss.iter().position(|l| !l.is_finite()) {
            failures.push(format!("{name}: loss {} at step {step}", run.loss[step]));
        } else if run.mean_last(last) > 0.75 * f64::from(run.loss[0]) {
            failures.push(format!(
                "{name} did not learn: mean loss {:.4} over the last {last} steps, {:.4} at step 0",
                run.mean_last(last),
                run.loss[0]
            ));
        }
    }
    // False when either is NaN.
    let agree = diff <= 2.0 * noise;
    if !agree {
        failures.push(format!(
            "flash and candle differ by {diff:.4} on average over the last {last} steps, more \
             than twice the bf16 noise {noise:.4} (candle vs candle-f32)"
        ));
    }
    Some(Verdict {
        diff,
        noise,
        failures,
    })
}

fn json(c: &Config, device: &str, runs: &[Run], verdict: Option<&Verdict>) -> String {
    let number = |x: f64| {
        if x.is_finite() {
            format!("{x}")
        } else {
            "null".into()
        }
    };
    let list = |xs: &mut dyn Iterator<Item = f64>| xs.map(number).collect::<Vec<_>>().join(",");
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"device\":\"{device}\",\"config\":{{\"layers\":{},\"d_model\":{},\"heads\":{},\
         \"seq\":{},\"batch\":{},\"steps\":{},\"warmup\":{},\"lr\":{},\"seed\":{},\
         \"check_last\":{}}},\"runs\":[",
        c.layers, c.d_model, c.heads, c.seq, c.batch, c.steps, c.warmup, c.lr, c.seed, c.check_last
    );
    for (i, run) in runs.iter().enumerate() {
        let median = run.median_ms(c.warmup);
        let _ = write!(
            s,
            "{}{{\"attention\":\"{}\",\"median_step_ms\":{},\"tokens_per_s\":{},\
             \"peak_bytes\":{},\"loss\":[{}],\"step_ms\":[{}]}}",
            if i > 0 { "," } else { "" },
            run.attention.name(),
            number(median),
            number((c.batch * c.seq) as f64 / median * 1e3),
            run.peak.map_or("null".into(), |p| p.to_string()),
            list(&mut run.loss.iter().map(|&l| f64::from(l))),
            list(&mut run.step_ms.iter().copied()),
        );
    }
    s.push(']');
    if let Some(v) = verdict {
        let _ = write!(
            s,
            ",\"check\":{{\"mean_abs_diff_flash_candle\":{},\"mean_abs_diff_candle_f32\":{},\
             \"passed\":{}}}",
            number(v.diff),
            number(v.noise),
            v.failures.is_empty()
        );
    }
    s.push_str("}\n");
    s
}

fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let args = match parse_args() {
        Ok(a) => a,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let c = &args.config;
    let device = match args.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        d => {
            eprintln!("unknown --device {d}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let tokens = c.batch * c.seq;
    println!(
        "gpt: {} layers, d_model {}, {} heads of {}, context {}, batch {} ({tokens} tokens/step), \
         {} steps, lr {}, seed {}, text {} bytes, on {}",
        c.layers,
        c.d_model,
        c.heads,
        c.d_model / c.heads,
        c.seq,
        c.batch,
        c.steps,
        c.lr,
        c.seed,
        TEXT.len(),
        args.device
    );
    let mut runs = Vec::new();
    for &mode in &args.modes {
        runs.push(train(c, mode, &device)?);
    }
    println!(
        "\nattention   median step ms   tokens/s   peak MiB   final loss   mean loss last {}",
        c.check_last
    );
    for run in &runs {
        let median = run.median_ms(c.warmup);
        let peak = run
            .peak
            .map_or("n/a".into(), |p| format!("{:.1}", p as f64 / 1048576.0));
        println!(
            "{:10} {:15.2} {:10.0} {:>10} {:12.4} {:12.4}",
            run.attention.name(),
            median,
            tokens as f64 / median * 1e3,
            peak,
            run.loss[c.steps - 1],
            run.mean_last(c.check_last),
        );
    }
    let verdict = check(&runs, c.check_last);
    if let Some(path) = &args.out {
        std::fs::write(path, json(c, &args.device, &runs, verdict.as_ref()))?;
        println!("wrote {path}");
    }
    if let Some(v) = verdict {
        println!(
            "mean |loss_flash - loss_candle| over the last {} steps: {:.4}; bf16 noise \
             (mean |loss_candle - loss_candle-f32|): {:.4}; ratio {:.2} (at most 2 passes)",
            c.check_last,
            v.diff,
            v.noise,
            v.diff / v.noise
        );
        if !v.failures.is_empty() {
            for f in &v.failures {
                println!("FAIL: {f}");
            }
            std::process::exit(1);
        }
        println!("PASS: the loss curves agree within bf16 noise");
    }
    Ok(())
}

/// The device memory pool's high-water mark (CUDA builds; see the module docs).
#[cfg(feature = "cuda")]
mod memory {
    use candle_core::cuda_backend::cudarc::driver::{result, sys};
    use candle_core::{Device, Result};

    pub struct Pool(sys::CUmemoryPool);

    fn wrap(e: result::DriverError) -> candle_core::Error {
        candle_core::Error::wrap(e)
    }

    impl Pool {
        /// The pool `cuMemAllocAsync` takes from on `device`, with freed memory kept in it;
        /// `None` off CUDA or where the device has no memory pools (cudarc then allocates
        /// with `cuMemAlloc`, which no high-water mark counts).
        pub fn of(device: &Device) -> Result<Option<Pool>> {
            let Device::Cuda(cuda) = device else {
                return Ok(None);
            };
            let stream = cuda.cuda_stream();
            let context = stream.context();
            if !context.has_async_alloc() {
                return Ok(None);
            }
            context.bind_to_thread().map_err(wrap)?;
            // SAFETY: the device handle comes from the live context.
            let pool =
                Pool(unsafe { result::device::get_mem_pool(context.cu_device()) }.map_err(wrap)?);
            pool.set(
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                u64::MAX,
            )?;
            Ok(Some(pool))
        }

        fn get(&self, attribute: sys::CUmemPool_attribute) -> Result<u64> {
            let mut value = 0u64;
            // SAFETY: these attributes are cuuint64_t.
            unsafe { result::mem_pool::get_attribute(self.0, attribute, (&raw mut value).cast()) }
                .map_err(wrap)?;
            Ok(value)
        }

        fn set(&self, attribute: sys::CUmemPool_attribute, mut value: u64) -> Result<()> {
            // SAFETY: these attributes are cuuint64_t.
            unsafe { result::mem_pool::set_attribute(self.0, attribute, (&raw mut value).cast()) }
                .map_err(wrap)
        }

        /// Resets the high-water mark to the bytes allocated now, and returns them.
        pub fn reset_high(&self) -> Result<u64> {
            self.set(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH, 0)?;
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
        }

        pub fn high(&self) -> Result<u64> {
            self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
        }
    }
}

/// Without candle's CUDA backend nothing runs on a GPU and there is no pool to read.
#[cfg(not(feature = "cuda"))]
mod memory {
    use candle_core::{Device, Result};

    pub enum Pool {}

    impl Pool {
        pub fn of(_: &Device) -> Result<Option<Pool>> {
            Ok(None)
        }

        pub fn reset_high(&self) -> Result<u64> {
            match *self {}
        }

        pub fn high(&self) -> Result<u64> {
            match *self {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Attention, Run, check};

    /// Runs whose losses are `5 − 0.3·step` plus `flash` and `reference` on those two runs.
    fn runs(flash: f32, reference: f32) -> Vec<Run> {
        let curve = |offset: f32| (0..10).map(|i| 5.0 - 0.3 * i as f32 + offset).collect();
        [
            (Attention::Flash, flash),
            (Attention::Candle, 0.0),
            (Attention::CandleF32, reference),
        ]
        .into_iter()
        .map(|(attention, offset)| Run {
            attention,
            loss: curve(offset),
            step_ms: vec![1.0; 10],
            peak: None,
        })
        .collect()
    }

    #[test]
    fn check_passes_within_twice_the_noise_and_fails_beyond() {
        let v = check(&runs(0.019, -0.01), 4).unwrap();
        assert!(v.failures.is_empty(), "{:?}", v.failures);
        assert!((v.diff - 0.019).abs() < 1e-6 && (v.noise - 0.01).abs() < 1e-6);
        let v = check(&runs(0.021, 0.01), 4).unwrap();
        assert_eq!(v.failures.len(), 1, "{:?}", v.failures);
        assert!(v.failures[0].contains("twice the bf16 noise"));
    }

    #[test]
    fn check_fails_non_finite_and_unlearned_runs() {
        let mut r = runs(0.0, 0.01);
        r[0].loss[3] = f32::NAN;
        let v = check(&r, 4).unwrap();
        assert!(
            v.failures
                .iter()
                .any(|f| f.starts_with("flash: loss NaN at step 3"))
        );
        let mut r = runs(0.0, 0.01);
        r[1].loss = vec![5.0; 10];
        r[2].loss = vec![5.01; 10];
        let v = check(&r, 4).unwrap();
        assert!(
            v.failures
                .iter()
                .any(|f| f.starts_with("candle did not learn"))
        );
        assert!(
            v.failures
                .iter()
                .any(|f| f.contains("twice the bf16 noise"))
        );
    }

    #[test]
    fn no_check_without_the_three_runs() {
        let r = runs(0.0, 0.01);
        assert!(check(&r[1..], 4).is_none());
    }
}
