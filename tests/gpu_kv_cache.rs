//! The contiguous KV cache (`flash_attn::KvCache`): ragged prefill appends (one sequence empty),
//! token-by-token decode steps with ragged appends, a 4-row speculative step (causal, bottom-right
//! to each sequence's length) whose rows are then partly dropped (`truncate`) and overwritten by
//! the next append, each step's attention against the f64 reference over the same
//! cached rows, the cache's rows bit for bit against a host mirror, and an append past the
//! capacity refused with the cache unchanged. bf16 and f16, d = 128, GQA 4.
//!
//! Where no CUDA device answers, the test prints `SKIP` and returns.

use flash_attn::reference::forward_f32;
use flash_attn::{AttentionOptions, DType, DeviceTensor, Family, FlashOptions, Gpu, KvCache};
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, lse_err, rel_err};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BATCH: u32 = 3;
const CAPACITY: u32 = 600;
const HEADS_KV: u32 = 2;
const HEADS_Q: u32 = 8;
const D: u32 = 128;

struct Mirror {
    k: Vec<f32>,
    v: Vec<f32>,
    lengths: Vec<u32>,
}

fn draw(rng: &mut StdRng, n: usize, dtype: DType) -> Vec<f32> {
    (0..n)
        .map(|_| dtype.round(rng.gen_range(-1.5f32..1.5)))
        .collect()
}

/// Appends `counts` rows of fresh K/V to the cache and the mirror.
fn append(
    gpu: &Gpu,
    cache: &mut KvCache,
    m: &mut Mirror,
    rng: &mut StdRng,
    dtype: DType,
    n_new: u32,
    counts: &[u32],
) {
    let row = (HEADS_KV * D) as usize;
    let n = BATCH as usize * n_new as usize * row;
    let (k, v) = (draw(rng, n, dtype), draw(rng, n, dtype));
    let up = |x: &[f32]| DeviceTensor::from_f32(dtype, x).unwrap();
    cache.append(gpu, &up(&k), &up(&v), n_new, counts).unwrap();
    for (b, &count) in counts.iter().enumerate() {
        for i in 0..count as usize {
            let src = (b * n_new as usize + i) * row;
            let dst = (b * CAPACITY as usize + m.lengths[b] as usize + i) * row;
            m.k[dst..dst + row].copy_from_slice(&k[src..src + row]);
            m.v[dst..dst + row].copy_from_slice(&v[src..src + row]);
        }
        m.lengths[b] += count;
    }
    assert_eq!(cache.lengths(), &m.lengths[..]);
    assert_eq!(cache.device_lengths().unwrap(), m.lengths);
}

/// Attention of `n_q` fresh rows over the cache against the reference; returns the family.
fn attend(
    gpu: &Gpu,
    cache: &KvCache,
    m: &Mirror,
    rng: &mut StdRng,
    dtype: DType,
    n_q: u32,
    causal: bool,
) -> Family {
    let s = cache.shape(n_q, HEADS_Q);
    let q = draw(rng, s.q_elems(), dtype);
    let options = AttentionOptions::new().causal(causal);
    let out = cache
        .attend(
            gpu,
            &DeviceTensor::from_f32(dtype, &q).unwrap(),
            n_q,
            HEADS_Q,
            &FlashOptions::new(options.clone()),
        )
        .unwrap();
    let want = forward_f32(&s, &q, &m.k, &m.v, &options.key_lengths(m.lengths.clone())).unwrap();
    let (eo, el) = (
        rel_err(&out.o.to_f32().unwrap(), &want.o),
        lse_err(&out.lse.to_vec().unwrap(), &want.lse),
    );
    println!(
        "{dtype} lengths {:?} n_q {n_q} causal {causal} on {}: O rel {eo:.2e}, LSE abs {el:.2e}",
        m.lengths, out.plan.family
    );
    let bound = if dtype == DType::Bf16 { 1e-2 } else { 2e-3 };
    assert!(
        eo <= bound && el <= 1e-3,
        "lengths {:?} n_q {n_q}: O {eo:.2e} LSE {el:.2e}",
        m.lengths
    );
    out.plan.family
}

#[test]
fn kv_cache_appends_and_attends_like_the_reference() {
    let test = "kv_cache_appends_and_attends_like_the_reference";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    for dtype in [DType::Bf16, DType::F16] {
        let mut cache = KvCache::new(dtype, BATCH, CAPACITY, HEADS_KV, D).unwrap();
        let elems = (BATCH * CAPACITY * HEADS_KV * D) as usize;
        let mut m = Mirror {
            k: vec![f32::NAN; elems],
            v: vec![f32::NAN; elems],
            lengths: vec![0; BATCH as usize],
        };
        // Prefill, ragged (sequence 0 stays empty: its rows are O = 0, LSE = −∞).
        append(
            &gpu,
            &mut cache,
            &mut m,
            &mut rng,
            dtype,
            200,
            &[0, 150, 200],
        );
        attend(&gpu, &cache, &m, &mut rng, dtype, 1, true);
        // Token by token, one sequence skipping a step.
        for step in 0..6 {
            let counts = if step % 2 == 0 { [1, 1, 1] } else { [1, 0, 1] };
            append(&gpu, &mut cache, &mut m, &mut rng, dtype, 1, &counts);
            let family = attend(&gpu, &cache, &m, &mut rng, dtype, 1, true);
            assert_eq!(family, Family::Decode);
        }
        // A speculative step: 4 new rows attend causally to the cache and to each other.
        append(&gpu, &mut cache, &mut m, &mut rng, dtype, 4, &[4, 4, 4]);
        attend(&gpu, &cache, &m, &mut rng, dtype, 4, true);
        attend(&gpu, &cache, &m, &mut rng, dtype, 4, false);
        // Some of the step's rows rejected: the cache cut back, then the next token appended
        // over the dropped rows.
        let kept = [m.lengths[0] - 2, m.lengths[1], m.lengths[2] - 4];
        cache.truncate(&kept).unwrap();
        m.lengths = kept.to_vec();
        assert_eq!(cache.device_lengths().unwrap(), m.lengths);
        attend(&gpu, &cache, &m, &mut rng, dtype, 1, true);
        append(&gpu, &mut cache, &mut m, &mut rng, dtype, 1, &[1, 1, 1]);
        attend(&gpu, &cache, &m, &mut rng, dtype, 1, true);
        let grow = [m.lengths[0] + 1, m.lengths[1], m.lengths[2]];
        let e = cache.truncate(&grow).unwrap_err().to_string();
        assert!(e.contains("truncate only drops rows"), "{e}");
        assert_eq!(cache.lengths(), &m.lengths[..]);
        // The cache holds exactly the appended rows (bit for bit, after the dtype's rounding).
        let (k, v) = cache.tensors();
        let row = (HEADS_KV * D) as usize;
        let (k, v) = (k.to_f32().unwrap(), v.to_f32().unwrap());
        for b in 0..BATCH as usize {
            let filled =
                b * CAPACITY as usize * row..(b * CAPACITY as usize + m.lengths[b] as usize) * row;
            assert_eq!(k[filled.clone()], m.k[filled.clone()], "K of sequence {b}");
            assert_eq!(v[filled.clone()], m.v[filled], "V of sequence {b}");
        }
        // Past the capacity: refused, nothing changed.
        let before = cache.lengths().to_vec();
        let n = (BATCH * 400 * HEADS_KV * D) as usize;
        let big = DeviceTensor::from_f32(dtype, &vec![0.0; n]).unwrap();
        let e = cache
            .append(&gpu, &big, &big, 400, &[400, 400, 400])
            .unwrap_err();
        assert!(e.to_string().contains("pass the capacity: 600"), "{e}");
        assert_eq!(cache.lengths(), &before[..]);
        let e = cache
            .attend(
                &gpu,
                &big,
                1,
                HEADS_Q,
                &FlashOptions::new(AttentionOptions::new().key_lengths(vec![1; 3])),
            )
            .err()
            .unwrap();
        assert!(e.to_string().contains("must not set lengths"), "{e}");
    }
}
