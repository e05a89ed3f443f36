//! Token-by-token generation with a small random-weight decoder whose attention runs over the
//! paged KV cache (`flash_attn::PagedKvCache`), greedy sampling.
//!
//! The model: a token embedding, two blocks of (RMSNorm, Q/K/V projections with rotary
//! positions, attention over the block's own cache, output projection, RMSNorm, ReLU MLP) with
//! residuals, a final RMSNorm and an output projection; 4 query heads sharing 2 K/V heads of
//! d = 64 (GQA), f16. The weights are seeded random numbers. Projections and MLP run on the host
//! in f32; each step appends every active sequence's new K/V row to each block's cache and
//! attends its query row through the library.
//!
//! First a check on a short run (2 sequences, the second joining 3 steps late): the same tokens
//! from the paged cache, the contiguous `KvCache` and the f64 reference attention
//! (`flash_attn::reference`), said in the output (exit status 1 if not). Then the timed run:
//! `--batch` sequences joining at staggered steps (so their lengths differ), `--tokens` steps,
//! the per-token latency (the whole step, and its attention calls) printed against the longest
//! sequence's length. Where no CUDA device answers, it says so and runs the check's reference
//! generation alone.
//!
//! `cargo run --release --example generate -- [--tokens 2048] [--batch 4] [--page-size 16]`
//!
//! Timing paged against contiguous decode at N_k = 32,768: `examples/decode_bench.rs`
//! (`--caches-only`).

use std::time::{Duration, Instant};

use flash_attn::reference::forward_f32;
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, DType, DeviceTensor, FlashOptions, Gpu,
    KvCache, PagedKvCache, PagedLayout,
};
use flash_attn_testkit::args::arg;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const VOCAB: usize = 512;
const D_MODEL: usize = 256;
const HIDDEN: usize = 512;
const LAYERS: usize = 2;
const HEADS_Q: u32 = 4;
const HEADS_KV: u32 = 2;
const HEAD_DIM: u32 = 64;
const DTYPE: DType = DType::F16;
const Q_WIDTH: usize = (HEADS_Q * HEAD_DIM) as usize;
const KV_WIDTH: usize = (HEADS_KV * HEAD_DIM) as usize;

/// Weights `[out, in]`.
struct Block {
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    w1: Vec<f32>,
    w2: Vec<f32>,
}

struct Model {
    embed: Vec<f32>,
    blocks: Vec<Block>,
    unembed: Vec<f32>,
}

impl Model {
    /// Uniform weights of variance `1 / fan_in` (the embedding's: 1/3).
    fn random(seed: u64) -> Model {
        let mut rng = StdRng::seed_from_u64(seed);
        let embed = (0..VOCAB * D_MODEL)
            .map(|_| rng.gen_range(-1.0..1.0))
            .collect();
        let mut layer = |out: usize, fan_in: usize| -> Vec<f32> {
            let a = (3.0 / fan_in as f32).sqrt();
            (0..out * fan_in).map(|_| rng.gen_range(-a..a)).collect()
        };
        Model {
            embed,
            blocks: (0..LAYERS)
                .map(|_| Block {
                    wq: layer(Q_WIDTH, D_MODEL),
                    wk: layer(KV_WIDTH, D_MODEL),
                    wv: layer(KV_WIDTH, D_MODEL),
                    wo: layer(D_MODEL, Q_WIDTH),
                    w1: layer(HIDDEN, D_MODEL),
                    w2: layer(D_MODEL, HIDDEN),
                })
                .collect(),
            unembed: layer(VOCAB, D_MODEL),
        }
    }
}

fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rms_norm(x: &[f32]) -> Vec<f32> {
    let rms = (x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32 + 1e-6).sqrt();
    x.iter().map(|v| v / rms).collect()
}

/// Rotary positions: each head's pairs `(x[2i], x[2i+1])` turned by `pos · 10000^(−2i/d)`.
fn rope(x: &mut [f32], pos: u32) {
    let d = HEAD_DIM as usize;
    for head in x.chunks_exact_mut(d) {
        for i in 0..d / 2 {
            let angle = pos as f32 * 10000f32.powf(-2.0 * i as f32 / d as f32);
            let (s, c) = angle.sin_cos();
            let (a, b) = (head[2 * i], head[2 * i + 1]);
            head[2 * i] = a * c - b * s;
            head[2 * i + 1] = a * s + b * c;
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a += b);
}

/// Where a step's attention runs: each block's cache on the GPU (paged or contiguous), or the
/// f64 reference over host copies of the rows (`[sequences, capacity, heads_kv, head_dim]`).
enum Attention<'g> {
    Paged(&'g Gpu, Vec<PagedKvCache>),
    Contiguous(&'g Gpu, Vec<KvCache>),
    Reference {
        k: Vec<Vec<f32>>,
        v: Vec<Vec<f32>>,
        capacity: u32,
    },
}

impl<'g> Attention<'g> {
    fn paged(gpu: &'g Gpu, layout: PagedLayout) -> flash_attn::Result<Self> {
        let caches = (0..LAYERS)
            .map(|_| PagedKvCache::new(DTYPE, layout))
            .collect::<flash_attn::Result<_>>()?;
        Ok(Attention::Paged(gpu, caches))
    }

    fn contiguous(gpu: &'g Gpu, sequences: u32, capacity: u32) -> flash_attn::Result<Self> {
        let caches = (0..LAYERS)
            .map(|_| KvCache::new(DTYPE, sequences, capacity, HEADS_KV, HEAD_DIM))
            .collect::<flash_attn::Result<_>>()?;
        Ok(Attention::Contiguous(gpu, caches))
    }

    fn reference(sequences: u32, capacity: u32) -> Self {
        let rows = vec![f32::NAN; sequences as usize * capacity as usize * KV_WIDTH];
        Attention::Reference {
            k: vec![rows.clone(); LAYERS],
            v: vec![rows; LAYERS],
            capacity,
        }
    }

    /// Appends each sequence's `active[b]` (0 or 1) new K/V row after its `lengths[b]` rows in
    /// block `layer`'s cache and returns O of the query rows (`[sequences, heads_q, head_dim]`,
    /// the dtype's values). `q`, `k`, `v` hold values of the dtype.
    fn step(
        &mut self,
        layer: usize,
        [q, k, v]: [&[f32]; 3],
        lengths: &[u32],
        active: &[u32],
    ) -> flash_attn::Result<Vec<f32>> {
        let after: Vec<u32> = lengths.iter().zip(active).map(|(l, a)| l + a).collect();
        let causal = FlashOptions::new(AttentionOptions::new().causal(true));
        let up = |x: &[f32]| DeviceTensor::from_f32(DTYPE, x);
        match self {
            Attention::Paged(gpu, caches) => {
                let cache = &mut caches[layer];
                cache.reserve(&after)?;
                cache.append(gpu, &up(k)?, &up(v)?, 1, active)?;
                cache.attend(gpu, &up(q)?, 1, HEADS_Q, &causal)?.o.to_f32()
            }
            Attention::Contiguous(gpu, caches) => {
                let cache = &mut caches[layer];
                cache.append(gpu, &up(k)?, &up(v)?, 1, active)?;
                cache.attend(gpu, &up(q)?, 1, HEADS_Q, &causal)?.o.to_f32()
            }
            Attention::Reference {
                k: k_rows,
                v: v_rows,
                capacity,
            } => {
                for (b, _) in active.iter().enumerate().filter(|(_, a)| **a == 1) {
                    let at = (b * *capacity as usize + lengths[b] as usize) * KV_WIDTH;
                    let new = b * KV_WIDTH..(b + 1) * KV_WIDTH;
                    k_rows[layer][at..at + KV_WIDTH].copy_from_slice(&k[new.clone()]);
                    v_rows[layer][at..at + KV_WIDTH].copy_from_slice(&v[new]);
                }
                let shape = AttentionShape {
                    batch: lengths.len() as u32,
                    n_q: 1,
                    n_k: *capacity,
                    heads_q: HEADS_Q,
                    heads_kv: HEADS_KV,
                    head_dim: HEAD_DIM,
                    head_dim_v: HEAD_DIM,
                };
                let options = causal.attention.key_lengths(after);
                let out = forward_f32(&shape, q, &k_rows[layer], &v_rows[layer], &options)?;
                Ok(out.o.iter().map(|&x| DTYPE.round(x as f32)).collect())
            }
        }
    }
}

/// A batch of sequences being generated.
struct Generation<'m> {
    model: &'m Model,
    /// Rows each sequence's caches hold (its next position).
    lengths: Vec<u32>,
    /// Each sequence's tokens so far (its prompt token first).
    tokens: Vec<Vec<usize>>,
    /// The smallest gap between the two largest logits of any choice so far: how close the
    /// greedy choices came to a tie.
    margin: f32,
}

impl Generation<'_> {
    /// One step: every `active` sequence feeds its last token and appends the greedy next one.
    /// Returns the time spent in attention.
    fn step(&mut self, attention: &mut Attention, active: &[u32]) -> flash_attn::Result<Duration> {
        let m = self.model;
        let n = self.lengths.len();
        let mut x: Vec<Vec<f32>> = (0..n)
            .map(|b| {
                let t = *self.tokens[b].last().unwrap();
                m.embed[t * D_MODEL..(t + 1) * D_MODEL].to_vec()
            })
            .collect();
        let mut spent = Duration::ZERO;
        for (layer, w) in m.blocks.iter().enumerate() {
            let (mut q, mut k, mut v) = (
                vec![0.0; n * Q_WIDTH],
                vec![0.0; n * KV_WIDTH],
                vec![0.0; n * KV_WIDTH],
            );
            for b in (0..n).filter(|&b| active[b] == 1) {
                let h = rms_norm(&x[b]);
                let (mut qb, mut kb) = (matvec(&w.wq, &h), matvec(&w.wk, &h));
                rope(&mut qb, self.lengths[b]);
                rope(&mut kb, self.lengths[b]);
                let round = |x: Vec<f32>| x.into_iter().map(|e| DTYPE.round(e));
                q.splice(b * Q_WIDTH..(b + 1) * Q_WIDTH, round(qb));
                k.splice(b * KV_WIDTH..(b + 1) * KV_WIDTH, round(kb));
                v.splice(b * KV_WIDTH..(b + 1) * KV_WIDTH, round(matvec(&w.wv, &h)));
            }
            let start = Instant::now();
            let o = attention.step(layer, [&q, &k, &v], &self.lengths, active)?;
            spent += start.elapsed();
            for b in (0..n).filter(|&b| active[b] == 1) {
                add(
                    &mut x[b],
                    &matvec(&w.wo, &o[b * Q_WIDTH..(b + 1) * Q_WIDTH]),
                );
                let mut hidden = matvec(&w.w1, &rms_norm(&x[b]));
                hidden.iter_mut().for_each(|e| *e = e.max(0.0));
                add(&mut x[b], &matvec(&w.w2, &hidden));
            }
        }
        for b in (0..n).filter(|&b| active[b] == 1) {
            let logits = matvec(&m.unembed, &rms_norm(&x[b]));
            let next = (0..VOCAB)
                .max_by(|&i, &j| logits[i].total_cmp(&logits[j]))
                .unwrap();
            let second = (0..VOCAB)
                .filter(|&i| i != next)
                .map(|i| logits[i])
                .fold(f32::NEG_INFINITY, f32::max);
            self.margin = self.margin.min(logits[next] - second);
            self.tokens[b].push(next);
            self.lengths[b] += 1;
        }
        Ok(spent)
    }
}

/// Sequence `b` joins at step `starts[b]` with prompt token `prompts[b]`; `steps` steps. Calls
/// `each(step, generation, step time, attention time)` after every step; returns the tokens and
/// the smallest top-two logit margin.
fn generate(
    model: &Model,
    attention: &mut Attention,
    prompts: &[usize],
    starts: &[u32],
    steps: u32,
    mut each: impl FnMut(u32, &Generation, Duration, Duration),
) -> flash_attn::Result<(Vec<Vec<usize>>, f32)> {
    let mut g = Generation {
        model,
        lengths: vec![0; prompts.len()],
        tokens: prompts.iter().map(|&t| vec![t]).collect(),
        margin: f32::INFINITY,
    };
    for step in 0..steps {
        let active: Vec<u32> = starts.iter().map(|&s| (step >= s) as u32).collect();
        let start = Instant::now();
        let spent = g.step(attention, &active)?;
        each(step, &g, start.elapsed(), spent);
    }
    Ok((g.tokens, g.margin))
}

/// The short run through the paged cache, the contiguous cache and the reference; whether all
/// three gave the same tokens.
fn check(model: &Model, gpu: Option<&Gpu>, page_size: u32) -> flash_attn::Result<bool> {
    let (prompts, starts, steps) = ([17, 300], [0, 3], 24u32);
    let width = steps.div_ceil(page_size);
    let capacity = width * page_size;
    let run = |mut a: Attention| generate(model, &mut a, &prompts, &starts, steps, |_, _, _, _| {});
    let (reference, margin) = run(Attention::reference(2, capacity))?;
    let Some(gpu) = gpu else {
        println!("reference generation ({steps} steps, the second sequence joining at step 3):");
        for (b, t) in reference.iter().enumerate() {
            println!("  sequence {b}: {t:?}");
        }
        return Ok(true);
    };
    let layout = PagedLayout {
        sequences: 2,
        pages_per_sequence: width,
        pages: 2 * width,
        page_size,
        heads_kv: HEADS_KV,
        head_dim: HEAD_DIM,
    };
    let (paged, _) = run(Attention::paged(gpu, layout)?)?;
    let (contiguous, _) = run(Attention::contiguous(gpu, 2, capacity)?)?;
    let same = paged == contiguous && paged == reference;
    println!(
        "check, {steps} steps of 2 sequences (the second joining at step 3), page size {page_size}: {}",
        if same {
            "paged cache, contiguous cache and f64 reference attention give the SAME tokens"
        } else {
            "the tokens DIFFER"
        }
    );
    for (name, tokens) in [
        ("paged", &paged),
        ("contiguous", &contiguous),
        ("reference", &reference),
    ] {
        for (b, t) in tokens.iter().enumerate() {
            println!("  {name:>10} sequence {b}: {t:?}");
        }
    }
    // How close a choice came to a tie. With this seed, moving every attention output of the
    // reference by 1e-3 relative (two f16 ulps; the kernels' f32 sums differ from f64 by ~1e-6
    // before the output's rounding) leaves every token unchanged (tried on the CPU); they first
    // change at 5e-3.
    println!("  smallest top-two logit margin of the reference's choices: {margin:.2e}");
    Ok(same)
}

/// The timed run: `batch` sequences joining at staggered steps, the per-token latency printed
/// each time the longest sequence reaches a power of two (means over the steps since the last
/// row).
fn timed(
    model: &Model,
    gpu: &Gpu,
    batch: u32,
    tokens: u32,
    page_size: u32,
) -> flash_attn::Result<()> {
    let starts: Vec<u32> = (0..batch).map(|b| b * tokens / (2 * batch)).collect();
    let rows: u32 = starts.iter().map(|s| tokens - s).sum();
    let width = tokens.div_ceil(page_size);
    // Pages for the rows the sequences will hold (each may leave one page partly empty), not
    // `batch` whole capacities.
    let pages = rows.div_ceil(page_size) + batch;
    let layout = PagedLayout {
        sequences: batch,
        pages_per_sequence: width,
        pages,
        page_size,
        heads_kv: HEADS_KV,
        head_dim: HEAD_DIM,
    };
    let row_bytes = 2 * KV_WIDTH as u64 * DTYPE.size_bytes() as u64 * LAYERS as u64;
    println!(
        "\ntimed run: {batch} sequences joining at steps {starts:?}, {tokens} steps, page size {page_size}: \
         a pool of {pages} pages ({:.1} MiB of K/V over {LAYERS} blocks) where contiguous caches take {:.1} MiB",
        (pages * page_size) as f64 * row_bytes as f64 / (1 << 20) as f64,
        (batch * width * page_size) as f64 * row_bytes as f64 / (1 << 20) as f64,
    );
    println!(
        "{:>8}  {:>28}  {:>14}  {:>18}",
        "longest", "lengths", "ms per token", "attention ms"
    );
    let mut attention = Attention::paged(gpu, layout)?;
    let prompts: Vec<usize> = (0..batch as usize).map(|b| (37 * b + 5) % VOCAB).collect();
    let (mut window, mut step_sum, mut attention_sum) = (0u32, Duration::ZERO, Duration::ZERO);
    generate(
        model,
        &mut attention,
        &prompts,
        &starts,
        tokens,
        |step, g, total, spent| {
            (window, step_sum, attention_sum) =
                (window + 1, step_sum + total, attention_sum + spent);
            let longest = *g.lengths.iter().max().unwrap();
            if (longest >= 16 && longest.is_power_of_two()) || step + 1 == tokens {
                let ms = |d: Duration| d.as_secs_f64() * 1e3 / window as f64;
                println!(
                    "{longest:>8}  {:>28}  {:>14.3}  {:>18.3}",
                    format!("{:?}", g.lengths),
                    ms(step_sum),
                    ms(attention_sum)
                );
                (window, step_sum, attention_sum) = (0, Duration::ZERO, Duration::ZERO);
            }
        },
    )?;
    Ok(())
}

fn main() -> flash_attn::Result<()> {
    let (tokens, batch, page_size) = (
        arg("--tokens", 2048u32),
        arg("--batch", 4u32),
        arg("--page-size", 16u32),
    );
    let model = Model::random(7);
    let gpu = match flash_attn::gpu() {
        Ok(gpu) => gpu,
        Err(AttentionError::NoDevice(why)) => {
            println!(
                "SKIP the GPU runs: no CUDA device answered ({why}); the f64 reference alone:"
            );
            check(&model, None, page_size)?;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    println!("{} ({:?})", gpu.device_name(), gpu.compute_capability());
    if !check(&model, Some(&gpu), page_size)? {
        std::process::exit(1);
    }
    timed(&model, &gpu, batch, tokens, page_size)
}
