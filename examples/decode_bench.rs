//! Decode speed on the rows (bf16, d = 128): one query row per sequence against a long
//! key cache, plus a chunked prefill (N_q = 512 against 32,768 keys); then the KV caches: one
//! decode step over a full contiguous `KvCache` and over `PagedKvCache`s of the same rows (page
//! sizes 16, 64 and 256, pages in shuffled order), the paged/contiguous ratio printed. Pipelined
//! timing: after warm-up, each sample is `--calls` back-to-back calls (`forward_into`, the
//! caches' `attend_into`) between two CUDA events (per-call time = sample / calls), so launch
//! gaps overlap as in a serving loop. Prints the median per-call time and the K/V bytes read per
//! second; writes every raw sample to `<out>/decode-bench.json`. The PyTorch side:
//! `scripts/peers/decode_bench.py` (same rows, same timing); `scripts/bench-h200.sh decode` runs
//! both.
//!
//! `cargo run --release --example decode_bench -- [--calls 50] [--samples 30] [--warmup 5]
//! [--kernel auto|decode|sm90|…] [--combine all|merge|parallel|last-split] [--splits 16,32,…]
//! [--out reports/bench] [--caches-only] [--rows 1,2,…] [--shapes B,Nq,Nk,Hq,Hkv;…] [--no-caches]
//! [--paged-as-contiguous]`: every decode row and cache row once per combine of the splits, the
//! decode rows also once per split count of `--splits` (the plan's without it); `--rows` keeps
//! the decode rows of those numbers (1 is the first), `--shapes` times these shapes instead
//! (d = 128, no mask; to place a row among its neighbours), `--no-caches` leaves the caches out
//! (`scripts/profile-decode.sh` profiles one row), `--paged-as-contiguous` also times the paged
//! caches at the contiguous plan's split count.

use flash_attn::timing::{median, time_calls};
use flash_attn::{
    AttentionShape, DType, DecodeCombine, DeviceF32, DeviceTensor, Family, FlashOptions, Gpu,
    KernelChoice, KvCache, PagedKvCache, PagedLayout, Plan,
};
use flash_attn_testkit::args::{arg, flag};
use rand::SeedableRng;
use rand::seq::SliceRandom;

/// (batch, n_q, n_k, heads_q, heads_kv).
type Row = (u32, u32, u32, u32, u32);
const ROWS: [Row; 6] = [
    (1, 1, 32768, 32, 8),
    (1, 1, 131072, 32, 8),
    (8, 1, 8192, 32, 8),
    (64, 1, 4096, 32, 8),
    (1, 1, 131072, 32, 32),
    (1, 512, 32768, 32, 8),
];
/// The caches' rows: (batch, n_k) full sequences, one query row, H = 32/8.
const CACHE_ROWS: [(u32, u32); 2] = [(1, 32768), (8, 8192)];
const PAGE_SIZES: [u32; 3] = [16, 64, 256];

struct Timing {
    calls: usize,
    samples: usize,
    warmup: usize,
}

impl Timing {
    /// Median per-call ms and every sample's per-call ms of `call`.
    fn run(
        &self,
        gpu: &Gpu,
        mut call: impl FnMut() -> flash_attn::Result<Plan>,
    ) -> flash_attn::Result<(f32, Vec<f32>)> {
        let raw = time_calls(gpu, self.warmup, self.samples, || {
            for _ in 0..self.calls {
                call()?;
            }
            Ok(())
        })?;
        let per_call: Vec<f32> = raw.iter().map(|ms| ms / self.calls as f32).collect();
        Ok((median(&per_call), per_call))
    }

    /// Prints the row and returns its JSON record.
    fn record(
        &self,
        s: &AttentionShape,
        kernel: &str,
        plan: &Plan,
        timed: (f32, Vec<f32>),
    ) -> String {
        let (ms, per_call) = timed;
        let kv_bytes = (s.k_elems() + s.v_elems()) as u64 * 2;
        let tb_s = kv_bytes as f64 / (ms as f64 * 1e-3) / 1e12;
        let AttentionShape {
            batch,
            n_q,
            n_k,
            heads_q,
            heads_kv,
            ..
        } = *s;
        println!(
            "B={batch} N_q={n_q} N_k={n_k} H_q/H_kv={heads_q}/{heads_kv} {kernel}: {ms:.4} ms per call, K/V {tb_s:.2} TB/s ({} grid {:?})",
            plan.entry, plan.grid
        );
        format!(
            "{{\"B\":{batch},\"N_q\":{n_q},\"N_k\":{n_k},\"H_q\":{heads_q},\"H_kv\":{heads_kv},\"d\":128,\"dtype\":\"bf16\",\"kernel\":\"{kernel}\",\"entry\":\"{}\",\"grid\":[{},{},{}],\"calls_per_sample\":{},\"warmup\":{},\"median_ms\":{ms},\"kv_bytes\":{kv_bytes},\"kv_tb_per_s\":{tb_s},\"samples_ms_per_call\":{:?}}}",
            plan.entry, plan.grid.0, plan.grid.1, plan.grid.2, self.calls, self.warmup, per_call
        )
    }
}

/// The label of a plan's kernel: the family, and the combine when the decode family runs it.
fn label(plan: &Plan, combine: DecodeCombine) -> String {
    match plan.family {
        Family::Decode => format!("decode ({combine:?} combine)"),
        family => family.name().to_owned(),
    }
}

fn fill(n: usize, seed: u64) -> flash_attn::Result<DeviceTensor> {
    DeviceTensor::from_f32(DType::Bf16, &flash_attn_testkit::inputs::uniform(seed, n))
}

/// The decode rows through `forward_into`, once per combine (once in all for rows that another
/// family runs).
fn tensor_rows(
    gpu: &Gpu,
    t: &Timing,
    options: &FlashOptions,
    combines: &[DecodeCombine],
    splits: &[Option<u32>],
    rows: &[Row],
) -> flash_attn::Result<Vec<String>> {
    let mut records = vec![];
    for &(batch, n_q, n_k, heads_q, heads_kv) in rows {
        let s = AttentionShape::new(batch, n_q, n_k, heads_q, heads_kv, 128);
        let (q, k, v) = (
            fill(s.q_elems(), 1)?,
            fill(s.k_elems(), 2)?,
            fill(s.v_elems(), 3)?,
        );
        let o = DeviceTensor::poisoned(DType::Bf16, s.o_elems())?;
        let lse = DeviceF32::poisoned(s.row_elems())?;
        'row: for &combine in combines {
            for &asked in splits {
                let options = options.clone().decode_combine(combine).decode_splits(asked);
                let plan = flash_attn::plan(
                    gpu,
                    &s,
                    DType::Bf16,
                    &options,
                    flash_attn::Direction::Forward,
                )?;
                let timed = t.run(gpu, || {
                    flash_attn::forward_into(gpu, &s, &q, &k, &v, &o, &lse, &options)
                })?;
                let kernel = match asked {
                    Some(_) if plan.family == Family::Decode => {
                        format!("{}, {} splits", label(&plan, combine), plan.grid.0)
                    }
                    _ => label(&plan, combine),
                };
                records.push(t.record(&s, &kernel, &plan, timed));
                if plan.family != Family::Decode {
                    break 'row;
                }
            }
        }
    }
    Ok(records)
}

/// One decode step over full caches of `CACHE_ROWS`: contiguous, then paged with each page size;
/// each with every combine of `combines`.
fn cache_rows(
    gpu: &Gpu,
    t: &Timing,
    combines: &[DecodeCombine],
) -> flash_attn::Result<Vec<String>> {
    let (heads_q, heads_kv, d) = (32, 8, 128);
    let mut records = vec![];
    for (batch, n_k) in CACHE_ROWS {
        let new = |seed| fill((batch * n_k * heads_kv * d) as usize, seed);
        let (k, v) = (new(2)?, new(3)?);
        let full = vec![n_k; batch as usize];
        let mut contiguous = KvCache::new(DType::Bf16, batch, n_k, heads_kv, d)?;
        contiguous.append(gpu, &k, &v, n_k, &full)?;
        let s = contiguous.shape(1, heads_q);
        let q = fill(s.q_elems(), 1)?;
        let o = DeviceTensor::poisoned(DType::Bf16, s.o_elems())?;
        let lse = DeviceF32::poisoned(s.row_elems())?;
        let mut paged_caches = vec![];
        for page_size in PAGE_SIZES {
            let width = n_k / page_size;
            let layout = PagedLayout {
                sequences: batch,
                pages_per_sequence: width,
                pages: batch * width,
                page_size,
                heads_kv,
                head_dim: d,
            };
            let mut paged = PagedKvCache::new(DType::Bf16, layout)?;
            let mut table: Vec<u32> = (0..layout.pages).collect();
            table.shuffle(&mut rand::rngs::StdRng::seed_from_u64(page_size as u64));
            paged.set_block_table(&table)?;
            paged.append(gpu, &k, &v, n_k, &full)?;
            paged_caches.push((page_size, paged));
        }
        for &combine in combines {
            let options = FlashOptions::default().decode_combine(combine);
            let attend = || contiguous.attend_into(gpu, &q, 1, heads_q, &o, &lse, &options);
            let plan = attend()?;
            let timed = t.run(gpu, attend)?;
            let base = timed.0;
            let kernel = format!("decode contiguous cache, {combine:?} combine");
            records.push(t.record(&s, &kernel, &plan, timed));
            // The paged plan's split count, and the contiguous plan's with `--paged-as-contiguous`.
            let paged_splits: &[Option<u32>] = match flag("--paged-as-contiguous") {
                true => &[None, Some(plan.grid.0)],
                false => &[None],
            };
            for (page_size, paged) in &paged_caches {
                for &splits in paged_splits {
                    let options = options.clone().decode_splits(splits);
                    let attend = || paged.attend_into(gpu, &q, 1, heads_q, &o, &lse, &options);
                    let plan = attend()?;
                    let timed = t.run(gpu, attend)?;
                    let ratio = timed.0 / base;
                    let mut kernel =
                        format!("decode paged cache, page {page_size}, {combine:?} combine");
                    if splits.is_some() {
                        kernel += &format!(", {} splits", plan.grid.0);
                    }
                    records.push(t.record(&s, &kernel, &plan, timed));
                    println!(
                        "  paged (page {page_size}) / contiguous: {ratio:.3} ({} 1.10)",
                        if ratio <= 1.10 { "within" } else { "PAST" }
                    );
                }
            }
        }
    }
    Ok(records)
}

/// `B,Nq,Nk,Hq,Hkv` of `--shapes`.
fn parse_shape(text: &str) -> Row {
    let n: Vec<u32> = text
        .split(',')
        .map(|n| n.trim().parse().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .unwrap_or_else(|| panic!("--shapes: positive B,Nq,Nk,Hq,Hkv, got {text:?}"));
    match n[..] {
        [b, nq, nk, hq, hkv] => (b, nq, nk, hq, hkv),
        _ => panic!("--shapes: five numbers B,Nq,Nk,Hq,Hkv, got {text:?}"),
    }
}

fn main() -> flash_attn::Result<()> {
    let t = Timing {
        calls: arg("--calls", 50usize),
        samples: arg("--samples", 30usize),
        warmup: arg("--warmup", 5usize),
    };
    assert!(t.samples >= 20, "--samples must be at least 20");
    let kernel: KernelChoice = arg("--kernel", "auto".to_owned())
        .parse()
        .expect("--kernel");
    let combines: &[DecodeCombine] = match arg("--combine", "all".to_owned()).as_str() {
        "all" => &DecodeCombine::ALL,
        "merge" => &[DecodeCombine::Merge],
        "parallel" => &[DecodeCombine::Parallel],
        "last-split" => &[DecodeCombine::LastSplit],
        other => panic!("--combine {other:?}: expected all, merge, parallel or last-split"),
    };
    // Split counts to time the decode rows with (`--splits 16,32,64`); the plan's by default.
    let splits: Vec<Option<u32>> = match arg("--splits", String::new()).as_str() {
        "" => vec![None],
        list => list
            .split(',')
            .map(|n| Some(n.trim().parse().expect("--splits: comma-separated counts")))
            .collect(),
    };
    let rows: Vec<Row> = match (
        arg("--rows", String::new()).as_str(),
        arg("--shapes", String::new()).as_str(),
    ) {
        ("", "") => ROWS.to_vec(),
        (list, "") => list
            .split(',')
            .map(|r| {
                r.trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|r| (1..=ROWS.len()).contains(r))
                    .map(|r| ROWS[r - 1])
                    .unwrap_or_else(|| panic!("--rows: numbers 1 to {}, got {r:?}", ROWS.len()))
            })
            .collect(),
        ("", list) => list.split(';').map(parse_shape).collect(),
        _ => panic!("--rows and --shapes: give one of them"),
    };
    let out_dir = arg("--out", "reports/bench".to_owned());
    let gpu = flash_attn::gpu()?;
    let mut records = vec![];
    if !flag("--caches-only") {
        records.extend(tensor_rows(
            &gpu,
            &t,
            &FlashOptions::default().kernel(kernel),
            combines,
            &splits,
            &rows,
        )?);
    }
    if !flag("--no-caches") {
        records.extend(cache_rows(&gpu, &t, combines)?);
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
