//! The paged KV cache: K and V are a pool of pages `[pages, page_size, heads_kv, head_dim]`
//! shared by every sequence, and a block table (`[sequences, pages_per_sequence]` pool page
//! indices) says which page holds each page-sized slice of each sequence's rows. Sequences of
//! very different lengths then take only the pages they fill, not each a whole capacity.
//!
//! The table lives on the host, where every change is checked ([`BlockTable`]), and is uploaded
//! after each change; the kernels read that device copy and trust it, since nothing else writes
//! it (the sequences' lengths likewise, `seq_lens`). Appends and attention run the contiguous
//! cache's kernels with the block table as their row translation (`KeyPages`).

use attention_kernels::abi::layout::KeyPages;
use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::kernels::decode::HEAD_DIMS;

use super::append::{self, Destination, check_geometry};
use super::block_table::{BlockTable, UNASSIGNED};
use super::seq_lens::SeqLens;
use super::with_cache_lengths;
use crate::attention::{ForwardOutput, check_lse, check_owned_context, check_tensor};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::families::decode;
use crate::family::{Family, KernelChoice};
use crate::flash_options::FlashOptions;
use crate::options::{MAX_TENSOR_ROWS, checked_elems};
use crate::plan::{DeviceCaps, Plan};
use crate::problem::Problem;
use crate::runtime::buffer::{DeviceArray, DeviceF32, DeviceTensor};
use crate::runtime::{Gpu, Queue};
use crate::tensors::Workspace;

/// The extents of a paged cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedLayout {
    /// Sequences (the batch of every append and attention).
    pub sequences: u32,
    /// Block table slots per sequence: a sequence holds at most `pages_per_sequence · page_size`
    /// rows.
    pub pages_per_sequence: u32,
    /// Pages in the pool.
    pub pages: u32,
    /// Rows per page: a power of two (the kernels find a key's page and row with a shift and a
    /// mask).
    pub page_size: u32,
    pub heads_kv: u32,
    /// 64 or 128: the decode kernels' head dims.
    pub head_dim: u32,
}

/// A paged cache of K and V rows (see the module docs).
///
/// # Example
///
/// Three sequences sharing a pool of 64 pages of 16 rows; each takes the pages it fills:
///
/// ```no_run
/// use attention_host::{AttentionOptions, DType, DeviceTensor, FlashOptions};
/// use attention_host::{PagedKvCache, PagedLayout};
/// # fn run(gpu: &attention_host::Gpu) -> attention_host::Result<()> {
/// let layout = PagedLayout {
///     sequences: 3, pages_per_sequence: 32, pages: 64, page_size: 16, heads_kv: 2, head_dim: 64,
/// };
/// let mut cache = PagedKvCache::new(DType::F16, layout)?;
/// cache.reserve(&[40, 7, 100])?;
/// let rows = vec![0.25f32; (3 * 100 * 2 * 64) as usize];
/// let k = DeviceTensor::from_f32(DType::F16, &rows)?;
/// cache.append(gpu, &k, &k, 100, &[40, 7, 100])?;
/// let q = DeviceTensor::from_f32(DType::F16, &vec![0.1f32; 3 * 8 * 64])?;
/// let out = cache.attend(gpu, &q, 1, 8, &FlashOptions::new(AttentionOptions::new().causal(true)))?;
/// cache.release(1)?; // sequence 1 finished: its page goes back to the pool
/// println!("{}; {} pages free", out.plan.entry, cache.free_pages());
/// # Ok(())
/// # }
/// ```
pub struct PagedKvCache {
    k: DeviceTensor,
    v: DeviceTensor,
    layout: PagedLayout,
    table: BlockTable,
    /// The device copy of `table`, replaced after every change.
    table_device: DeviceArray<u32>,
    lengths: SeqLens,
}

impl PagedKvCache {
    /// A block table slot with no page.
    pub const UNASSIGNED: u32 = UNASSIGNED;

    /// An empty cache: no rows, every slot [`Self::UNASSIGNED`]. The pool starts NaN, so a
    /// kernel that read a row no sequence holds would show it.
    pub fn new(dtype: DType, layout: PagedLayout) -> Result<PagedKvCache> {
        let l = layout;
        check_geometry(
            dtype,
            &[
                ("sequences", l.sequences),
                ("pages_per_sequence", l.pages_per_sequence),
                ("pages", l.pages),
                ("page_size", l.page_size),
                ("heads_kv", l.heads_kv),
                ("head_dim", l.head_dim),
            ],
            [l.heads_kv, l.head_dim],
        )?;
        if dtype == DType::F32 || !HEAD_DIMS.contains(&l.head_dim) {
            return Err(invalid!(
                "a paged cache is attended by the decode kernels: f16 or bf16, head_dim 64 or 128 (got {dtype}, {})",
                l.head_dim
            ));
        }
        if !l.page_size.is_power_of_two() {
            return Err(invalid!(
                "page_size {} is not a power of two (the kernels find a key's page with a shift and a mask)",
                l.page_size
            ));
        }
        // Rows of the pool, and of the contiguous tensors the attention's shape describes, fit the
        // kernels' 31-bit row indices (the bound every tensor has).
        for (what, factors) in [
            ("the pool", [l.pages, l.page_size, l.heads_kv, 1]),
            (
                "sequences x pages_per_sequence x page_size x heads_kv",
                [l.sequences, l.pages_per_sequence, l.page_size, l.heads_kv],
            ),
        ] {
            let rows = factors
                .iter()
                .try_fold(1u64, |acc, &f| acc.checked_mul(f as u64));
            if rows.is_none_or(|r| r > MAX_TENSOR_ROWS) {
                return Err(invalid!(
                    "{what} ({factors:?}) is more than {MAX_TENSOR_ROWS} rows"
                ));
            }
        }
        let elems = checked_elems("the pool", &[l.pages, l.page_size, l.heads_kv, l.head_dim])?;
        let table = BlockTable::empty(l.sequences, l.pages_per_sequence, l.pages);
        Ok(PagedKvCache {
            k: DeviceTensor::poisoned(dtype, elems)?,
            v: DeviceTensor::poisoned(dtype, elems)?,
            table_device: DeviceArray::from_slice(table.entries())?,
            table,
            layout,
            lengths: SeqLens::empty(l.sequences)?,
        })
    }

    pub fn layout(&self) -> PagedLayout {
        self.layout
    }

    /// Rows each sequence holds.
    pub fn lengths(&self) -> &[u32] {
        self.lengths.host()
    }

    /// The device copy of [`Self::lengths`] that the kernels read (`cache_seqlens`), downloaded
    /// once the queued appends have run; equal to `lengths()`.
    pub fn device_lengths(&self) -> Result<Vec<u32>> {
        self.lengths.download()
    }

    /// The block table, `[sequences, pages_per_sequence]`.
    pub fn block_table(&self) -> &[u32] {
        self.table.entries()
    }

    /// Pool pages in no slot.
    pub fn free_pages(&self) -> u32 {
        self.table.free_pages().len() as u32
    }

    /// The pool's K and V (`[pages, page_size, heads_kv, head_dim]`).
    pub fn tensors(&self) -> (&DeviceTensor, &DeviceTensor) {
        (&self.k, &self.v)
    }

    /// Replaces the block table (`[sequences, pages_per_sequence]`). Refused, the table
    /// unchanged, when an entry is neither a pool page nor [`Self::UNASSIGNED`], when a page is
    /// in two slots, or when a sequence holds more rows than its pages before its first
    /// unassigned slot. A slot's rows are read from whatever page it names: moving rows between
    /// pages is the caller's copy.
    pub fn set_block_table(&mut self, entries: &[u32]) -> Result<()> {
        let l = &self.layout;
        let table = BlockTable::new(entries, l.sequences, l.pages_per_sequence, l.pages)?;
        table.check_lengths(self.lengths.host(), l.page_size)?;
        self.commit(table)
    }

    /// Gives each sequence `b` free pages (lowest first) until it may hold `rows[b]` rows; all
    /// or nothing.
    pub fn reserve(&mut self, rows: &[u32]) -> Result<()> {
        let pages: Vec<u32> = rows
            .iter()
            .map(|&r| r.div_ceil(self.layout.page_size))
            .collect();
        let mut table = self.table.clone();
        table.reserve(&pages)?;
        if table == self.table {
            return Ok(());
        }
        self.commit(table)
    }

    /// Empties sequence `b` (a finished sequence) and frees its pages.
    pub fn release(&mut self, b: u32) -> Result<()> {
        if b >= self.layout.sequences {
            return Err(invalid!(
                "sequence {b} of a cache of {} sequences",
                self.layout.sequences
            ));
        }
        let mut table = self.table.clone();
        table.release(b as usize);
        self.lengths.clear(b as usize)?;
        self.commit(table)
    }

    /// Uploads `table` (checked) and makes it the cache's.
    fn commit(&mut self, table: BlockTable) -> Result<()> {
        self.table_device = DeviceArray::from_slice(table.entries())?;
        self.table = table;
        Ok(())
    }

    /// Where the kernels find the rows.
    fn key_pages(&self) -> KeyPages {
        KeyPages {
            table: self.table_device.device_ptr(),
            table_width: self.layout.pages_per_sequence,
            page_shift: self.layout.page_size.trailing_zeros(),
        }
    }

    /// Appends the first `new_lengths[b]` rows of item `b` of `k_new`, `v_new` (`[sequences,
    /// n_new, heads_kv, head_dim]`, the cache's dtype) after the sequence's rows, into its pages;
    /// refused before launch when a sequence would pass its pages ([`Self::reserve`] first).
    /// Does not wait.
    pub fn append(
        &mut self,
        gpu: &Gpu,
        k_new: &DeviceTensor,
        v_new: &DeviceTensor,
        n_new: u32,
        new_lengths: &[u32],
    ) -> Result<()> {
        // A sequence may hold the rows of its pages before its first unassigned slot.
        let (table, page_size) = (&self.table, self.layout.page_size);
        let to = Destination {
            k: &self.k,
            v: &self.v,
            heads_kv: self.layout.heads_kv,
            head_dim: self.layout.head_dim,
            capacity: self.capacity(),
            pages: self.key_pages(),
            room: &|b| table.held(b) * page_size,
            room_name: "the rows its pages hold",
        };
        append::append(
            gpu,
            &to,
            k_new,
            v_new,
            n_new,
            &mut self.lengths,
            new_lengths,
        )
    }

    /// Cuts each sequence `b` back to its first `kept[b]` rows (a speculative step's rejected
    /// rows dropped); refused, nothing changed, when a sequence would grow. Its pages stay in
    /// its block table row ([`Self::release`] frees them). Rows past the new lengths are masked
    /// keys until appends overwrite them.
    pub fn truncate(&mut self, kept: &[u32]) -> Result<()> {
        self.lengths.truncate(kept)
    }

    /// O and LSE of `q` (`[sequences, n_q, heads_q, head_dim]`) over each sequence's rows (the
    /// new rows appended first), on the decode family: at most 16 query rows per K/V head
    /// (`heads_q / heads_kv · n_q`). `options` must not set lengths (the cache's are used) and
    /// may choose `Auto` or the decode family only. Causal aligns the `n_q` rows to the end of
    /// each sequence. Returns once the kernels are queued.
    pub fn attend(
        &self,
        gpu: &Gpu,
        q: &DeviceTensor,
        n_q: u32,
        heads_q: u32,
        options: &FlashOptions,
    ) -> Result<ForwardOutput> {
        let (problem, plan) = self.prepare(gpu, q, n_q, heads_q, options)?;
        let out = ForwardOutput {
            o: DeviceTensor::uninitialized(problem.dtype, problem.shape.o_elems())?,
            lse: DeviceF32::uninitialized(problem.shape.row_elems())?,
            plan,
        };
        self.launch(gpu, &problem, &out.plan, q, &out.o, &out.lse)?;
        Ok(out)
    }

    /// As [`Self::attend`], into `o` (`q`'s layout and dtype) and `lse` (f32 `[sequences,
    /// heads_q, n_q]`) the caller owns. Returns the plan it ran.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_into(
        &self,
        gpu: &Gpu,
        q: &DeviceTensor,
        n_q: u32,
        heads_q: u32,
        o: &DeviceTensor,
        lse: &DeviceF32,
        options: &FlashOptions,
    ) -> Result<Plan> {
        let (problem, plan) = self.prepare(gpu, q, n_q, heads_q, options)?;
        check_tensor("o", o, problem.dtype, problem.shape.o_elems())?;
        check_lse(lse, &problem.shape)?;
        self.launch(gpu, &problem, &plan, q, o, lse)?;
        Ok(plan)
    }

    /// The validated attention call and its decode plan, before anything is allocated.
    fn prepare(
        &self,
        gpu: &Gpu,
        q: &DeviceTensor,
        n_q: u32,
        heads_q: u32,
        options: &FlashOptions,
    ) -> Result<(Problem, Plan)> {
        check_owned_context(gpu)?;
        let options = with_cache_lengths(options, self.lengths.host())?;
        if !matches!(
            options.kernel,
            KernelChoice::Auto | KernelChoice::Only(Family::Decode)
        ) {
            return Err(invalid!(
                "a paged cache is attended by the decode family only, options ask for {:?}",
                options.kernel
            ));
        }
        let shape = self.shape(n_q, heads_q);
        let problem = Problem::new(&shape, self.k.dtype(), &options)?
            .with_device_key_lengths(self.lengths.device_ptr());
        check_tensor("q", q, problem.dtype, shape.q_elems())?;
        let plan = decode::plan_paged(&DeviceCaps::of(gpu)?, &problem, self.layout.page_size)
            .map_err(|why| {
                invalid!("a paged cache is attended by the decode family, which {why}")
            })?;
        Ok((problem, plan))
    }

    fn launch(
        &self,
        gpu: &Gpu,
        problem: &Problem,
        plan: &Plan,
        q: &DeviceTensor,
        o: &DeviceTensor,
        lse: &DeviceF32,
    ) -> Result<()> {
        let workspace = Workspace::on_own_queue(gpu, plan)?;
        decode::launch_forward(
            &Queue::own(gpu),
            problem,
            plan,
            q,
            &self.k,
            &self.v,
            o,
            lse,
            &workspace,
            self.key_pages(),
        )
    }

    /// Rows a sequence may reach: `pages_per_sequence · page_size`.
    fn capacity(&self) -> u32 {
        self.layout.pages_per_sequence * self.layout.page_size
    }

    /// The shape of attention of `n_q` rows of `heads_q` heads over the cache: its `n_k` is the
    /// most rows a sequence may reach (the key lengths are the sequences' rows), the same as a
    /// contiguous [`super::KvCache`] of that capacity (whose attention then runs the same splits).
    pub fn shape(&self, n_q: u32, heads_q: u32) -> AttentionShape {
        let l = &self.layout;
        AttentionShape::new(
            l.sequences,
            n_q,
            self.capacity(),
            heads_q,
            l.heads_kv,
            l.head_dim,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> PagedLayout {
        PagedLayout {
            sequences: 2,
            pages_per_sequence: 4,
            pages: 8,
            page_size: 16,
            heads_kv: 2,
            head_dim: 128,
        }
    }

    fn refusal(dtype: DType, l: PagedLayout) -> String {
        match PagedKvCache::new(dtype, l) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{l:?} was accepted"),
        }
    }

    #[test]
    fn layouts_the_kernels_cannot_take_are_refused_before_allocating() {
        for (l, dtype, why) in [
            (
                PagedLayout {
                    page_size: 24,
                    ..layout()
                },
                DType::Bf16,
                "page_size 24 is not a power of two",
            ),
            (
                PagedLayout {
                    page_size: 0,
                    ..layout()
                },
                DType::Bf16,
                "page_size must be at least 1",
            ),
            (
                PagedLayout {
                    head_dim: 96,
                    ..layout()
                },
                DType::F16,
                "head_dim 64 or 128 (got f16, 96)",
            ),
            (layout(), DType::F32, "f16 or bf16"),
            (
                PagedLayout {
                    pages: 1 << 20,
                    page_size: 1 << 12,
                    ..layout()
                },
                DType::Bf16,
                "the pool ([1048576, 4096, 2, 1]) is more than 2147483647 rows",
            ),
            (
                PagedLayout {
                    sequences: 1 << 16,
                    pages_per_sequence: 1 << 16,
                    ..layout()
                },
                DType::Bf16,
                "is more than 2147483647 rows",
            ),
            (
                PagedLayout {
                    pages: u32::MAX,
                    page_size: 1,
                    heads_kv: 1,
                    ..layout()
                },
                DType::Bf16,
                "the pool ([4294967295, 1, 1, 1]) is more than",
            ),
        ] {
            let e = refusal(dtype, l);
            assert!(e.contains(why), "{l:?}: {e}");
        }
    }
}
