//! A cache's sequence lengths (`cache_seqlens`): on the host, where every append and attention is
//! checked before launch, and on the device, where the kernels read them. The append kernel
//! writes the lengths after it into the other of two device arrays, so a decode step (every
//! sequence appending the same number of rows, then attention) uploads nothing and never waits
//! for the device; the two arrays alternate because every chunk of an append reads the lengths
//! before it while the items' first chunks write the new ones.

use crate::error::{Result, invalid};
use crate::runtime::buffer::DeviceArray;

pub(crate) struct SeqLens {
    host: Vec<u32>,
    device: [DeviceArray<u32>; 2],
    /// The device array that holds `host` once the queued work has run.
    current: usize,
}

/// The device arrays an append reads (the lengths before it) and writes (the lengths after it).
pub(crate) struct AppendLengths {
    pub before: u64,
    pub after: u64,
}

impl SeqLens {
    /// `sequences` empty sequences.
    pub(crate) fn empty(sequences: u32) -> Result<SeqLens> {
        let zeros = vec![0; sequences as usize];
        Ok(SeqLens {
            device: [
                DeviceArray::from_slice(&zeros)?,
                DeviceArray::from_slice(&zeros)?,
            ],
            host: zeros,
            current: 0,
        })
    }

    pub(crate) fn host(&self) -> &[u32] {
        &self.host
    }

    /// The device copy the kernels queued next read.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.device[self.current].device_ptr()
    }

    /// Downloads the device copy (waits for the queued appends).
    pub(crate) fn download(&self) -> Result<Vec<u32>> {
        self.device[self.current].to_vec()
    }

    /// Where the next append reads and writes the lengths.
    pub(crate) fn for_append(&self) -> AppendLengths {
        AppendLengths {
            before: self.device[self.current].device_ptr(),
            after: self.device[1 - self.current].device_ptr(),
        }
    }

    /// Records an append of [`Self::for_append`] that was queued: the lengths are now `after`.
    pub(crate) fn appended(&mut self, after: Vec<u32>) {
        self.host = after;
        self.current = 1 - self.current;
    }

    /// Empties sequence `b` on both sides (an upload, in stream order after the queued work).
    pub(crate) fn clear(&mut self, b: usize) -> Result<()> {
        let mut host = self.host.clone();
        host[b] = 0;
        self.set(host)
    }

    /// Cuts each sequence `b` back to its first `kept[b]` rows on both sides; refused, nothing
    /// changed, when a sequence would grow.
    pub(crate) fn truncate(&mut self, kept: &[u32]) -> Result<()> {
        let kept = kept_lengths(&self.host, kept)?;
        self.set(kept)
    }

    /// Makes `lengths` (checked by the caller) the lengths on both sides (an upload, in stream
    /// order after the queued work).
    pub(crate) fn set(&mut self, lengths: Vec<u32>) -> Result<()> {
        self.device[self.current] = DeviceArray::from_slice(&lengths)?;
        self.host = lengths;
        Ok(())
    }
}

/// `lengths` cut back to `kept` (the rows of a speculative step that were accepted), or why not:
/// one entry per sequence, none longer than the sequence is.
fn kept_lengths(lengths: &[u32], kept: &[u32]) -> Result<Vec<u32>> {
    if kept.len() != lengths.len() {
        return Err(invalid!(
            "{} lengths to keep, the cache holds {} sequences",
            kept.len(),
            lengths.len()
        ));
    }
    for (b, (&len, &keep)) in lengths.iter().zip(kept).enumerate() {
        if keep > len {
            return Err(invalid!(
                "sequence {b} holds {len} rows, it cannot keep {keep} (truncate only drops rows)"
            ));
        }
    }
    Ok(kept.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_only_drops_rows() {
        assert_eq!(kept_lengths(&[5, 9, 0], &[5, 2, 0]).unwrap(), [5, 2, 0]);
        let e = kept_lengths(&[5, 9], &[6, 2]).unwrap_err().to_string();
        assert!(
            e.contains("sequence 0 holds 5 rows, it cannot keep 6"),
            "{e}"
        );
        let e = kept_lengths(&[5, 9], &[5]).unwrap_err().to_string();
        assert!(e.contains("1 lengths to keep, the cache holds 2"), "{e}");
    }
}
