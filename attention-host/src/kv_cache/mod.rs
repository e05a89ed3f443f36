//! KV caches for decoding: the contiguous [`KvCache`] and the paged [`PagedKvCache`]. Both keep
//! each sequence's length on the host, where every append is checked before launch, and on the
//! device, where the append kernel advances it and attention reads it (`seq_lens`); attention of
//! new queries over a cache is a forward with the sequences' lengths as key lengths (causal is
//! bottom-right aligned to each sequence's own length, so the new rows see the cache and
//! themselves). One append kernel and one decode kernel serve both: the paged cache's rows are
//! found through its block table, the contiguous layout is the identity
//! (`attention_kernels::abi::layout::KeyPages`).

mod append;
mod block_table;
mod paged;
mod seq_lens;

pub use paged::{PagedKvCache, PagedLayout};

use attention_kernels::abi::layout::KeyPages;
use attention_kernels::abi::shape::AttentionShape;

use crate::attention::{ForwardOutput, forward_into_tiles, forward_with_lengths};
use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::flash_options::FlashOptions;
use crate::options::{Lengths, checked_elems};
use crate::plan::Plan;
use crate::runtime::Gpu;
use crate::runtime::buffer::{DeviceF32, DeviceTensor};
use append::{Destination, check_geometry};
use seq_lens::SeqLens;

/// A contiguous cache: K and V caches of `batch` sequences of at most `capacity` rows each
/// (`[batch, capacity, heads_kv, head_dim]`).
///
/// # Example
///
/// A prompt of 5 and one of 3 rows appended, then one decode step (GQA 8/2, causal):
///
/// ```no_run
/// use attention_host::{AttentionOptions, DType, DeviceTensor, FlashOptions, KvCache};
/// # fn run(gpu: &attention_host::Gpu) -> attention_host::Result<()> {
/// let (batch, heads_q, heads_kv, d) = (2, 8, 2, 128);
/// let mut cache = KvCache::new(DType::Bf16, batch, 4096, heads_kv, d)?;
/// let prompt = vec![0.5f32; (batch * 5 * heads_kv * d) as usize];
/// let k = DeviceTensor::from_f32(DType::Bf16, &prompt)?;
/// let v = DeviceTensor::from_f32(DType::Bf16, &prompt)?;
/// cache.append(gpu, &k, &v, 5, &[5, 3])?;
/// let q = DeviceTensor::from_f32(DType::Bf16, &vec![0.1f32; (batch * heads_q * d) as usize])?;
/// let options = FlashOptions::new(AttentionOptions::new().causal(true));
/// let out = cache.attend(gpu, &q, 1, heads_q, &options)?;
/// println!("{} over lengths {:?}", out.plan.entry, cache.lengths());
/// # Ok(())
/// # }
/// ```
pub struct KvCache {
    k: DeviceTensor,
    v: DeviceTensor,
    batch: u32,
    capacity: u32,
    heads_kv: u32,
    head_dim: u32,
    lengths: SeqLens,
}

impl KvCache {
    /// An empty cache. Its rows start NaN: rows past a sequence's length are masked keys, which
    /// never contribute whatever they hold (and a kernel that read one would show it).
    pub fn new(
        dtype: DType,
        batch: u32,
        capacity: u32,
        heads_kv: u32,
        head_dim: u32,
    ) -> Result<KvCache> {
        check_geometry(
            dtype,
            &[
                ("batch", batch),
                ("capacity", capacity),
                ("heads_kv", heads_kv),
                ("head_dim", head_dim),
            ],
            [heads_kv, head_dim],
        )?;
        let elems = checked_elems("the cache", &[batch, capacity, heads_kv, head_dim])?;
        Ok(KvCache {
            k: DeviceTensor::poisoned(dtype, elems)?,
            v: DeviceTensor::poisoned(dtype, elems)?,
            batch,
            capacity,
            heads_kv,
            head_dim,
            lengths: SeqLens::empty(batch)?,
        })
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

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The cache's K and V (`[batch, capacity, heads_kv, head_dim]`).
    pub fn tensors(&self) -> (&DeviceTensor, &DeviceTensor) {
        (&self.k, &self.v)
    }

    /// Appends the first `new_lengths[b]` rows of item `b` of `k_new`, `v_new` (`[batch, n_new,
    /// heads_kv, head_dim]`, the cache's dtype) after the sequence's rows; refused before launch
    /// when a sequence would pass the capacity. Does not wait.
    pub fn append(
        &mut self,
        gpu: &Gpu,
        k_new: &DeviceTensor,
        v_new: &DeviceTensor,
        n_new: u32,
        new_lengths: &[u32],
    ) -> Result<()> {
        let capacity = self.capacity;
        let to = Destination {
            k: &self.k,
            v: &self.v,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            capacity,
            pages: KeyPages::CONTIGUOUS,
            room: &|_| capacity,
            room_name: "the capacity",
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
    /// rows dropped); refused, nothing changed, when a sequence would grow. Rows past the
    /// new lengths are masked keys until appends overwrite them.
    pub fn truncate(&mut self, kept: &[u32]) -> Result<()> {
        self.lengths.truncate(kept)
    }

    /// O and LSE of `q` (`[batch, n_q, heads_q, head_dim]`) over each sequence's cached rows (the
    /// new rows appended first), with `options` (which must not set lengths: the cache's are
    /// used). Causal aligns the `n_q` rows to the end of each sequence. Returns once the kernels
    /// are queued (reading the output waits).
    pub fn attend(
        &self,
        gpu: &Gpu,
        q: &DeviceTensor,
        n_q: u32,
        heads_q: u32,
        options: &FlashOptions,
    ) -> Result<ForwardOutput> {
        let options = with_cache_lengths(options, self.lengths.host())?;
        let (qkv, lengths) = ([q, &self.k, &self.v], Some(self.lengths.device_ptr()));
        forward_with_lengths(gpu, &self.shape(n_q, heads_q), qkv, &options, lengths)
    }

    /// As [`Self::attend`], into `o` (`q`'s layout and dtype) and `lse` (f32 `[batch, heads_q,
    /// n_q]`) the caller owns. Returns the plan it ran.
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
        let options = with_cache_lengths(options, self.lengths.host())?;
        let (shape, lengths) = (self.shape(n_q, heads_q), Some(self.lengths.device_ptr()));
        let (k, v) = (&self.k, &self.v);
        forward_into_tiles(gpu, &shape, None, q, k, v, o, lse, &options, lengths)
    }

    /// The shape of attention of `n_q` rows of `heads_q` heads over the cache.
    pub fn shape(&self, n_q: u32, heads_q: u32) -> AttentionShape {
        AttentionShape::new(
            self.batch,
            n_q,
            self.capacity,
            heads_q,
            self.heads_kv,
            self.head_dim,
        )
    }
}

/// `options` with the cache's `lengths` as key lengths; refused when they set lengths themselves.
fn with_cache_lengths(options: &FlashOptions, lengths: &[u32]) -> Result<FlashOptions> {
    if options.attention.lengths != Lengths::Full {
        return Err(invalid!(
            "attention over the cache uses the cache's lengths; options must not set lengths"
        ));
    }
    let mut options = options.clone();
    options.attention.lengths = Lengths::KeyLengths(lengths.to_vec());
    Ok(options)
}
