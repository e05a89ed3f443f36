//! `flash-attn forward`: O and LSE of Q, K, V read from `.npy` files (`[batch, seq, heads, head_dim]`).

use std::path::{Path, PathBuf};

use crate::npy::{self, NpyArray, NpyDType};
use flash_attn::{
    AttentionOptions, AttentionShape, BlockSizes, DType, FlashOptions, KernelChoice, Schedule,
    Window,
};

/// The options of a call, as `forward`, `backward` and `plan` take them.
#[derive(clap::Args, Debug)]
pub struct CallArgs {
    /// Score scale τ (default 1/√head_dim).
    #[arg(long, allow_negative_numbers = true)]
    pub scale: Option<f32>,
    /// Causal mask, bottom-right aligned per sequence.
    #[arg(long)]
    pub causal: bool,
    /// Keys each batch item may see, comma separated (one per batch item).
    #[arg(long, value_delimiter = ',', conflicts_with = "cu_seqlens_q")]
    pub key_lengths: Option<Vec<u32>>,
    /// Packed sequences (batch 1): cumulative query row offsets, e.g. 0,5,12.
    #[arg(long, value_delimiter = ',', requires = "cu_seqlens_k")]
    pub cu_seqlens_q: Option<Vec<u32>>,
    /// Packed sequences: cumulative key offsets, as many as --cu-seqlens-q.
    #[arg(long, value_delimiter = ',', requires = "cu_seqlens_q")]
    pub cu_seqlens_k: Option<Vec<u32>>,
    /// Dropout probability on the normalised probabilities.
    #[arg(long, allow_negative_numbers = true)]
    pub dropout: Option<f32>,
    /// Seed of the dropout RNG (Philox).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Offset of this call in the dropout RNG's stream (advance it between calls).
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    #[command(flatten)]
    pub mods: ScoreModArgs,
    /// Kernel family: auto (the fastest that can run the call), decode, sm90, sm80 or exact. A
    /// family that cannot run the call is refused with the reason.
    #[arg(long, default_value = "auto")]
    pub kernel: KernelChoice,
    /// Forward schedule of the exact kernels: row-owned (default) or paper.
    #[arg(long, default_value = "row-owned")]
    pub schedule: Schedule,
    /// Explicit B_r of the exact kernels (with --block-cols); default: the paper's rule for this
    /// device.
    #[arg(long, requires = "block_cols")]
    pub block_rows: Option<u32>,
    /// Explicit B_c (with --block-rows).
    #[arg(long, requires = "block_rows")]
    pub block_cols: Option<u32>,
}

/// The local window and the score modifiers (semantics in `flash_attn::AttentionOptions`).
#[derive(clap::Args, Debug, Default)]
pub struct ScoreModArgs {
    /// Local window LEFT,RIGHT: row i sees keys i + n_k − n_q − LEFT ..= i + n_k − n_q + RIGHT
    /// (bottom-right aligned like --causal, and cut by it when both are given); `inf` leaves a
    /// side open, e.g. --window 1023,0.
    #[arg(long, value_name = "LEFT,RIGHT", value_parser = parse_window)]
    pub window: Option<Window>,
    /// Logit softcap C: each scaled score s becomes C·tanh(s / C).
    #[arg(long, value_name = "C", allow_negative_numbers = true)]
    pub softcap: Option<f32>,
    /// ALiBi with the standard geometric slopes of heads_q heads (2^(−8k/n), …): bias
    /// −slope_h · |i + n_k − n_q − j|.
    #[arg(long)]
    pub alibi: bool,
    /// Sink logits: one value for every query head, or one per head, comma separated.
    // A list such as `-1.5,0.25` is not one number, which `allow_negative_numbers` needs.
    #[arg(
        long,
        value_name = "SINK[,SINK...]",
        value_delimiter = ',',
        allow_hyphen_values = true
    )]
    pub sinks: Option<Vec<f32>>,
}

impl ScoreModArgs {
    /// `a` with these modifiers, for a call of `heads_q` query heads.
    pub fn apply(&self, mut a: AttentionOptions, heads_q: u32) -> AttentionOptions {
        a.window = self.window;
        a.softcap = self.softcap;
        if self.alibi {
            a.alibi_slopes = Some(flash_attn::alibi_slopes(heads_q));
        }
        a.sinks = self.sinks.as_ref().map(|s| match s[..] {
            [one] => vec![one; heads_q as usize],
            _ => s.clone(),
        });
        a
    }
}

fn parse_window(s: &str) -> Result<Window, String> {
    let side = |x: &str| match x.trim() {
        "inf" => Ok(u32::MAX),
        x => x
            .parse::<u32>()
            .map_err(|e| format!("window side {x:?}: {e}")),
    };
    match s.split_once(',') {
        Some((l, r)) => Ok(Window {
            left: side(l)?,
            right: side(r)?,
        }),
        None => Err(format!("expected LEFT,RIGHT, got {s:?}")),
    }
}

impl CallArgs {
    /// The options of a call with `heads_q` query heads (ALiBi slopes and sinks are per head).
    pub fn options(&self, heads_q: u32) -> FlashOptions {
        let mut a = self
            .mods
            .apply(AttentionOptions::new().causal(self.causal), heads_q);
        a.scale = self.scale;
        if let Some(l) = &self.key_lengths {
            a = a.key_lengths(l.clone());
        }
        if let (Some(q), Some(k)) = (&self.cu_seqlens_q, &self.cu_seqlens_k) {
            a = a.packed(q.clone(), k.clone());
        }
        if let Some(p) = self.dropout {
            a = a.dropout(p, self.seed, self.offset);
        }
        let mut o = FlashOptions::new(a)
            .kernel(self.kernel)
            .schedule(self.schedule);
        if let (Some(r), Some(c)) = (self.block_rows, self.block_cols) {
            o.block_sizes = Some(BlockSizes {
                block_rows: r,
                block_cols: c,
            });
        }
        o
    }
}

/// What a call from `.npy` files takes besides the options: the compute dtype and whether to
/// print the plan.
#[derive(clap::Args, Debug)]
pub struct FileCallArgs {
    /// Compute dtype: f32, f16 or bf16 (default: the files' dtype; `.npy` has no bf16, so inputs
    /// are rounded to bf16 on upload). Outputs are written in the files' dtype.
    #[arg(long)]
    pub dtype: Option<DType>,
    /// Print the plan the call ran: family, kernel, tiles (B_r, B_c), grid, shared memory,
    /// workspace, and why each other family was not chosen.
    #[arg(long, alias = "print-block-sizes")]
    pub print_plan: bool,
    #[command(flatten)]
    pub call: CallArgs,
}

impl FileCallArgs {
    /// The compute dtype: `--dtype`, else the files'.
    pub fn dtype(&self, files: NpyDType) -> DType {
        self.dtype.unwrap_or(match files {
            NpyDType::F32 => DType::F32,
            NpyDType::F16 => DType::F16,
        })
    }
}

#[derive(clap::Args, Debug)]
pub struct ForwardArgs {
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
    /// Where O is written (`[batch, n_q, heads_q, head_dim_v]`).
    #[arg(long)]
    pub out: PathBuf,
    /// Where LSE is written (f32, `[batch, heads_q, n_q]`).
    #[arg(long)]
    pub lse: Option<PathBuf>,
    #[command(flatten)]
    pub call: FileCallArgs,
}

/// Q, K, V read, checked against each other, and the shape they give.
pub fn read_qkv(
    q: &Path,
    k: &Path,
    v: &Path,
) -> Result<([NpyArray; 3], AttentionShape), Box<dyn std::error::Error>> {
    let (q, k, v) = (npy::read(q)?, npy::read(k)?, npy::read(v)?);
    for (name, a) in [("q", &q), ("k", &k), ("v", &v)] {
        if a.shape.len() != 4 {
            return Err(format!(
                "{name} must be [batch, seq, heads, head_dim], got shape {:?}",
                a.shape
            )
            .into());
        }
        if a.dtype != q.dtype {
            return Err(format!("{name} is {:?} but q is {:?}", a.dtype, q.dtype).into());
        }
    }
    if k.shape[..3] != v.shape[..3] {
        return Err(format!(
            "k {:?} and v {:?} differ in batch, keys or heads",
            k.shape, v.shape
        )
        .into());
    }
    let dim = |a: &NpyArray, i: usize| {
        u32::try_from(a.shape[i]).map_err(|_| format!("dimension {} too large", a.shape[i]))
    };
    let shape = AttentionShape {
        batch: dim(&q, 0)?,
        n_q: dim(&q, 1)?,
        n_k: dim(&k, 1)?,
        heads_q: dim(&q, 2)?,
        heads_kv: dim(&k, 2)?,
        head_dim: dim(&q, 3)?,
        head_dim_v: dim(&v, 3)?,
    };
    if k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3] {
        return Err(format!(
            "q {:?} and k {:?} disagree in batch or head_dim",
            q.shape, k.shape
        )
        .into());
    }
    Ok(([q, k, v], shape))
}

pub fn run(args: &ForwardArgs) -> Result<(), Box<dyn std::error::Error>> {
    let ([q, k, v], shape) = read_qkv(&args.q, &args.k, &args.v)?;
    let dtype = args.call.dtype(q.dtype);
    let gpu = flash_attn::gpu()?;
    let out = flash_attn::forward_host(
        &gpu,
        dtype,
        &shape,
        &q.data,
        &k.data,
        &v.data,
        &args.call.call.options(shape.heads_q),
    )?;
    if args.call.print_plan {
        print!("{}", out.plan);
    }
    let o_shape = [q.shape[0], q.shape[1], q.shape[2], v.shape[3]];
    npy::write(&args.out, &o_shape, q.dtype, &out.o)?;
    if let Some(path) = &args.lse {
        let rows = [
            shape.batch as usize,
            shape.heads_q as usize,
            shape.n_q as usize,
        ];
        npy::write(path, &rows, NpyDType::F32, &out.lse)?;
    }
    Ok(())
}
