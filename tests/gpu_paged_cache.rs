//! The paged KV cache (`flash_attn::PagedKvCache`) beside the contiguous one: the same appends into
//! both (a ragged prefill with an empty sequence, token-by-token steps with ragged appends, a
//! speculative step of up to 4 rows), every step's attention into NaN-poisoned outputs against the
//! f64 reference and **bitwise** against the contiguous cache of the same capacity (the same decode
//! kernel, splits and arithmetic; only the row translation differs), an empty cache first. Block
//! tables start shuffled (non-monotone pages, spare pool pages) and grow by `reserve`; page sizes
//! 1, 16, 32, 64 and 256, so appends straddle pages and the decode's 64-key tiles hold many
//! pages, one, or part of one; GQA ratios 1, 2, 4, 8, 16; bf16 and f16; d = 64 and 128. The pool is
//! read back: every held row where the table puts it, every other row still NaN. Then the refusals
//! that need a cache: bad tables, appends past the pages, attention the decode family cannot run.
//!
//! Where no CUDA device answers, the tests print `SKIP` and return.

use flash_attn::reference::forward_f32;
use flash_attn::{
    AttentionOptions, DType, DecodeCombine, DeviceF32, DeviceTensor, Family, FlashOptions, Gpu,
    KernelChoice, KvCache, PagedKvCache, PagedLayout,
};
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip, lse_err, rel_err};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

const SEQUENCES: u32 = 3;

struct Config {
    dtype: DType,
    head_dim: u32,
    page_size: u32,
    heads_q: u32,
    heads_kv: u32,
}

/// Both caches and the host mirror of their rows (`[sequences, capacity, heads_kv, head_dim]`).
struct Caches {
    c: Config,
    paged: PagedKvCache,
    contiguous: KvCache,
    k: Vec<f32>,
    v: Vec<f32>,
    lengths: Vec<u32>,
    capacity: u32,
}

impl Caches {
    fn new(c: Config) -> Caches {
        // About 640 rows per sequence, and spare pool pages no sequence gets.
        let width = 640u32.div_ceil(c.page_size);
        let layout = PagedLayout {
            sequences: SEQUENCES,
            pages_per_sequence: width,
            pages: SEQUENCES * width + 3,
            page_size: c.page_size,
            heads_kv: c.heads_kv,
            head_dim: c.head_dim,
        };
        let paged = PagedKvCache::new(c.dtype, layout).unwrap();
        let capacity = width * c.page_size;
        let contiguous =
            KvCache::new(c.dtype, SEQUENCES, capacity, c.heads_kv, c.head_dim).unwrap();
        let elems = (SEQUENCES * capacity * c.heads_kv * c.head_dim) as usize;
        Caches {
            c,
            paged,
            contiguous,
            k: vec![f32::NAN; elems],
            v: vec![f32::NAN; elems],
            lengths: vec![0; SEQUENCES as usize],
            capacity,
        }
    }

    fn row(&self) -> usize {
        (self.c.heads_kv * self.c.head_dim) as usize
    }

    fn draw(&self, rng: &mut StdRng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| self.c.dtype.round(rng.gen_range(-1.5f32..1.5)))
            .collect()
    }

    /// Appends `counts` fresh rows to both caches (the paged one reserving pages first) and the
    /// mirror.
    fn append(&mut self, gpu: &Gpu, rng: &mut StdRng, n_new: u32, counts: &[u32]) {
        let row = self.row();
        let n = SEQUENCES as usize * n_new as usize * row;
        let (k, v) = (self.draw(rng, n), self.draw(rng, n));
        let up = |x: &[f32]| DeviceTensor::from_f32(self.c.dtype, x).unwrap();
        let (kd, vd) = (up(&k), up(&v));
        let after: Vec<u32> = self
            .lengths
            .iter()
            .zip(counts)
            .map(|(l, c)| l + c)
            .collect();
        self.paged.reserve(&after).unwrap();
        self.paged.append(gpu, &kd, &vd, n_new, counts).unwrap();
        self.contiguous
            .append(gpu, &kd, &vd, n_new, counts)
            .unwrap();
        for (b, &count) in counts.iter().enumerate() {
            for i in 0..count as usize {
                let src = (b * n_new as usize + i) * row;
                let dst = (b * self.capacity as usize + self.lengths[b] as usize + i) * row;
                self.k[dst..dst + row].copy_from_slice(&k[src..src + row]);
                self.v[dst..dst + row].copy_from_slice(&v[src..src + row]);
            }
        }
        self.lengths = after;
        assert_eq!(self.paged.lengths(), &self.lengths[..]);
        assert_eq!(self.contiguous.lengths(), &self.lengths[..]);
        // The device copies the appends advanced (uniform counts upload none).
        assert_eq!(self.paged.device_lengths().unwrap(), self.lengths);
        assert_eq!(self.contiguous.device_lengths().unwrap(), self.lengths);
    }

    /// Attention of `n_q` fresh rows with each combine of the decode splits (the last split's
    /// merge, the parallel combine and the strided merge): paged into poisoned outputs, bitwise the contiguous
    /// cache's, within the dtype's bound of the reference. Returns the first failure, if any.
    fn attend(&self, gpu: &Gpu, rng: &mut StdRng, n_q: u32, causal: bool) -> Option<String> {
        let (c, s) = (&self.c, self.paged.shape(n_q, self.c.heads_q));
        assert_eq!(s, self.contiguous.shape(n_q, c.heads_q));
        let q = self.draw(rng, s.q_elems());
        let qd = DeviceTensor::from_f32(c.dtype, &q).unwrap();
        let options = AttentionOptions::new().causal(causal);
        let poisoned = || {
            (
                DeviceTensor::poisoned(c.dtype, s.q_elems()).unwrap(),
                DeviceF32::poisoned(s.row_elems()).unwrap(),
            )
        };
        for combine in DecodeCombine::ALL {
            let (o, lse) = poisoned();
            let plan = self
                .paged
                .attend_into(
                    gpu,
                    &qd,
                    n_q,
                    c.heads_q,
                    &o,
                    &lse,
                    &FlashOptions::new(options.clone()).decode_combine(combine),
                )
                .unwrap();
            assert_eq!(plan.family, Family::Decode);
            let (o_c, lse_c) = poisoned();
            let plan_c = self
                .contiguous
                .attend_into(
                    gpu,
                    &qd,
                    n_q,
                    c.heads_q,
                    &o_c,
                    &lse_c,
                    &FlashOptions::new(options.clone()).decode_combine(combine),
                )
                .unwrap();
            assert_eq!((plan_c.family, plan_c.grid), (Family::Decode, plan.grid));
            let name = format!(
                "{} d {} page {} H {}/{} lengths {:?} n_q {n_q} causal {causal} {combine:?}",
                c.dtype, c.head_dim, c.page_size, c.heads_q, c.heads_kv, self.lengths
            );
            let (lse_bits, lse_c_bits): (Vec<u32>, Vec<u32>) = (
                lse.to_vec().unwrap().iter().map(|x| x.to_bits()).collect(),
                lse_c
                    .to_vec()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect(),
            );
            if o.to_bits16().unwrap() != o_c.to_bits16().unwrap() || lse_bits != lse_c_bits {
                return Some(format!("{name}: paged differs from contiguous"));
            }
            let with_lengths = options.clone().key_lengths(self.lengths.clone());
            let want = forward_f32(&s, &q, &self.k, &self.v, &with_lengths).unwrap();
            let (eo, el) = (
                rel_err(&o.to_f32().unwrap(), &want.o),
                lse_err(&lse.to_vec().unwrap(), &want.lse),
            );
            println!("{name}: bitwise contiguous, O rel {eo:.2e}, LSE abs {el:.2e}");
            let bound = if c.dtype == DType::Bf16 { 1e-2 } else { 2e-3 };
            if eo > bound || el > 1e-3 {
                return Some(format!("{name}: O {eo:.2e} LSE {el:.2e}"));
            }
        }
        None
    }

    /// The pool holds each sequence's rows where its table puts them, and NaN everywhere else.
    fn check_pool(&self) {
        let (row, p) = (self.row(), self.c.page_size as usize);
        let width = self.paged.layout().pages_per_sequence as usize;
        let table = self.paged.block_table();
        let (k, v) = self.paged.tensors();
        let (k, v) = (k.to_f32().unwrap(), v.to_f32().unwrap());
        let mut held = vec![false; k.len() / row];
        for b in 0..SEQUENCES as usize {
            for j in 0..self.lengths[b] as usize {
                let at = table[b * width + j / p] as usize * p + j % p;
                held[at] = true;
                let (pool, mirror) = (at * row, (b * self.capacity as usize + j) * row);
                assert_eq!(
                    k[pool..pool + row],
                    self.k[mirror..mirror + row],
                    "K {b} {j}"
                );
                assert_eq!(
                    v[pool..pool + row],
                    self.v[mirror..mirror + row],
                    "V {b} {j}"
                );
            }
        }
        for (r, _) in held.iter().enumerate().filter(|(_, h)| !**h) {
            let written = |x: &[f32]| x[r * row..(r + 1) * row].iter().any(|e| !e.is_nan());
            assert!(
                !written(&k) && !written(&v),
                "pool row {r} is no sequence's, but was written"
            );
        }
    }
}

/// A block table giving each sequence its first `pages[b]` slots from a shuffled pool.
fn shuffled_table(rng: &mut StdRng, layout: &PagedLayout, pages: &[u32]) -> Vec<u32> {
    let mut pool: Vec<u32> = (0..layout.pages).collect();
    pool.shuffle(rng);
    let mut pool = pool.into_iter();
    let width = layout.pages_per_sequence as usize;
    let mut table = vec![PagedKvCache::UNASSIGNED; SEQUENCES as usize * width];
    for (b, &n) in pages.iter().enumerate() {
        for slot in &mut table[b * width..b * width + n as usize] {
            *slot = pool.next().unwrap();
        }
    }
    table
}

#[test]
fn paged_cache_matches_the_reference_and_the_contiguous_cache_bitwise() {
    let test = "paged_cache_matches_the_reference_and_the_contiguous_cache_bitwise";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(fresh_seed(test));
    let mut failures = vec![];
    for (dtype, head_dim, page_size, heads_q, heads_kv) in [
        (DType::Bf16, 128, 16, 8, 2),
        (DType::F16, 128, 64, 16, 1),
        (DType::Bf16, 64, 1, 2, 2),
        (DType::F16, 64, 256, 16, 2),
        (DType::Bf16, 128, 32, 4, 2),
    ] {
        let c = Config {
            dtype,
            head_dim,
            page_size,
            heads_q,
            heads_kv,
        };
        let group = heads_q / heads_kv;
        let mut caches = Caches::new(c);
        // An empty cache: every row sees nothing (O = 0, LSE = −∞).
        failures.extend(caches.attend(&gpu, &mut rng, 1, true));
        // A shuffled table holding the prefill, then a ragged prefill that ends mid-page.
        let prefill: [u32; 3] = [0, rng.gen_range(1..=200), 200];
        let layout = caches.paged.layout();
        let pages: Vec<u32> = prefill.iter().map(|r| r.div_ceil(page_size)).collect();
        let table = shuffled_table(&mut rng, &layout, &pages);
        caches.paged.set_block_table(&table).unwrap();
        caches.append(&gpu, &mut rng, 200, &prefill);
        failures.extend(caches.attend(&gpu, &mut rng, 1, true));
        // Token by token (one sequence skipping every other step); `reserve` adds pages.
        for step in 0..6 {
            let counts = if step % 2 == 0 { [1, 1, 1] } else { [1, 0, 1] };
            caches.append(&gpu, &mut rng, 1, &counts);
            failures.extend(caches.attend(&gpu, &mut rng, 1, true));
        }
        // A big ragged append straddling many pages, and a speculative step of up to 4 rows
        // within the decode family's 16 rows per K/V head (GQA 8: 2 rows, the whole tile).
        let counts = [rng.gen_range(0..=300), 300, rng.gen_range(0..=300)];
        caches.append(&gpu, &mut rng, 300, &counts);
        let n_q = (16 / group).min(4);
        caches.append(&gpu, &mut rng, n_q, &[n_q; 3]);
        failures.extend(caches.attend(&gpu, &mut rng, n_q, true));
        failures.extend(caches.attend(&gpu, &mut rng, n_q, false));
        caches.check_pool();
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn paged_cache_refuses_bad_tables_appends_and_calls_before_launch() {
    let test = "paged_cache_refuses_bad_tables_appends_and_calls_before_launch";
    let Some(gpu) = gpu_or_skip(test) else {
        return;
    };
    let layout = PagedLayout {
        sequences: 2,
        pages_per_sequence: 4,
        pages: 6,
        page_size: 16,
        heads_kv: 2,
        head_dim: 64,
    };
    let dtype = DType::Bf16;
    let mut cache = PagedKvCache::new(dtype, layout).unwrap();
    const U: u32 = PagedKvCache::UNASSIGNED;
    let err = |r: flash_attn::Result<()>| r.unwrap_err().to_string();
    // Entries out of the pool, a page twice.
    let e = err(cache.set_block_table(&[0, 1, U, U, 6, U, U, U]));
    assert!(
        e.contains("sequence 1 slot 0 names page 6, the pool has 6 pages"),
        "{e}"
    );
    let e = err(cache.set_block_table(&[0, 1, U, U, 1, U, U, U]));
    assert!(
        e.contains("page 1 is in sequence 0 slot 1 and sequence 1 slot 0"),
        "{e}"
    );
    cache.set_block_table(&[5, 0, U, U, 3, U, U, U]).unwrap();
    // Appends past the pages a sequence holds: refused, nothing changed.
    let rows =
        |n: u32| DeviceTensor::from_f32(dtype, &vec![0.5; (2 * n * 2 * 64) as usize]).unwrap();
    let (x17, x40) = (rows(17), rows(40));
    let e = err(cache.append(&gpu, &x17, &x17, 17, &[17, 17]));
    assert!(
        e.contains("sequence 1: 0 cached + 17 new rows pass the rows its pages hold: 16"),
        "{e}"
    );
    assert_eq!(cache.lengths(), [0, 0]);
    cache.append(&gpu, &x17, &x17, 17, &[17, 16]).unwrap();
    // A table that takes pages from under a sequence's rows; one that leaves them.
    let e = err(cache.set_block_table(&[5, U, 0, U, 3, U, U, U]));
    assert!(
        e.contains("sequence 0 holds 17 rows, the table gives it 1 pages of 16 rows"),
        "{e}"
    );
    cache.set_block_table(&[5, 0, U, U, 3, 1, U, U]).unwrap();
    // Past a sequence's slots, and past the pool.
    let e = err(cache.reserve(&[65, 0]));
    assert!(
        e.contains("sequence 0 needs 5 pages, its block table row has 4 slots"),
        "{e}"
    );
    let e = err(cache.reserve(&[64, 64]));
    assert!(e.contains("the pool's 6 pages are all taken"), "{e}");
    assert_eq!(cache.free_pages(), 2);
    let e = err(cache.append(&gpu, &x40, &x40, 40, &[40, 0]));
    assert!(
        e.contains("sequence 0: 17 cached + 40 new rows pass"),
        "{e}"
    );
    // Attention the decode family cannot run, or options the cache sets itself.
    let q = |n_q: u32, heads: u32| {
        DeviceTensor::from_f32(dtype, &vec![0.5; (2 * n_q * heads * 64) as usize]).unwrap()
    };
    let attend = |q: &DeviceTensor, n_q, heads, options: FlashOptions| {
        cache
            .attend(&gpu, q, n_q, heads, &options)
            .err()
            .unwrap()
            .to_string()
    };
    let e = attend(&q(3, 16), 3, 16, FlashOptions::default());
    assert!(
        e.contains("decode family, which takes at most 16 query rows per K/V head"),
        "{e}"
    );
    let e = attend(
        &q(1, 4),
        1,
        4,
        FlashOptions::default().kernel(KernelChoice::Only(Family::Sm90)),
    );
    assert!(e.contains("decode family only"), "{e}");
    let e = attend(
        &q(1, 4),
        1,
        4,
        FlashOptions::new(AttentionOptions::new().key_lengths(vec![1, 1])),
    );
    assert!(e.contains("must not set lengths"), "{e}");
    let e = attend(&q(1, 4), 1, 8, FlashOptions::default());
    assert!(e.contains("q must be bf16 with 1024 elements"), "{e}");
    // A rejected row dropped (the pages stay); growing is refused.
    cache.truncate(&[16, 16]).unwrap();
    assert_eq!(cache.device_lengths().unwrap(), [16, 16]);
    let e = err(cache.truncate(&[17, 16]));
    assert!(
        e.contains("sequence 0 holds 16 rows, it cannot keep 17"),
        "{e}"
    );
    assert_eq!(cache.free_pages(), 2);
    // A finished sequence gives its pages back.
    cache.release(0).unwrap();
    assert_eq!((cache.lengths(), cache.free_pages()), (&[0, 16][..], 4));
    assert_eq!(cache.device_lengths().unwrap(), [0, 16]);
    let e = err(cache.release(2));
    assert!(e.contains("sequence 2 of a cache of 2 sequences"), "{e}");
}
