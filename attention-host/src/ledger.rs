//! IO ledgers of the article (0x02E, 0x0AE, 0x0C, 0x0DD): logical scalar words the paper schedules
//! move across the HBM/on-chip boundary, the byte ledger of the materialized baseline, and the
//! tight IO bounds with their cache regimes. Logical words are not DRAM transactions.

mod bounds;
mod bytes;
mod words;

pub use bounds::{CacheRegime, backward_tight_bound, fa1_bound, forward_tight_bound};
pub use bytes::{ByteWidths, MaterializedBytes, lse_bytes, row_stats_bytes};
pub use words::{BackwardWords, ForwardWords};
