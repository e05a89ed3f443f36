//! The paged cache's block table on the host: for each sequence, the pool page of each of its
//! `width` page-sized slots of key rows, or [`UNASSIGNED`]. Every table the cache uploads has
//! passed [`BlockTable::new`]'s checks, so the kernels can trust the device copy.

use crate::error::{Result, invalid};

/// A slot with no page yet.
pub(crate) const UNASSIGNED: u32 = u32::MAX;

/// `[sequences, width]` pool page indices: each below `pages` or [`UNASSIGNED`], no page in two
/// slots (appends write pages, so a shared page would be written by two sequences).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BlockTable {
    entries: Vec<u32>,
    width: u32,
    pages: u32,
}

impl BlockTable {
    /// Every slot unassigned.
    pub(crate) fn empty(sequences: u32, width: u32, pages: u32) -> BlockTable {
        BlockTable {
            entries: vec![UNASSIGNED; sequences as usize * width as usize],
            width,
            pages,
        }
    }

    /// `entries` as a table of `sequences` rows of `width` slots over a pool of `pages` pages, or
    /// why not.
    pub(crate) fn new(entries: &[u32], sequences: u32, width: u32, pages: u32) -> Result<Self> {
        let want = sequences as usize * width as usize;
        if entries.len() != want {
            return Err(invalid!(
                "the block table has {} entries, [sequences, pages_per_sequence] is {want}",
                entries.len()
            ));
        }
        let mut owner = vec![None; pages as usize];
        for (slot, &page) in entries.iter().enumerate() {
            if page == UNASSIGNED {
                continue;
            }
            let (b, i) = (slot / width as usize, slot % width as usize);
            let Some(seen) = owner.get_mut(page as usize) else {
                return Err(invalid!(
                    "block table: sequence {b} slot {i} names page {page}, the pool has {pages} pages"
                ));
            };
            if let Some((b0, i0)) = seen.replace((b, i)) {
                return Err(invalid!(
                    "block table: page {page} is in sequence {b0} slot {i0} and sequence {b} slot {i}; a page holds one sequence's rows"
                ));
            }
        }
        Ok(BlockTable {
            entries: entries.to_vec(),
            width,
            pages,
        })
    }

    pub(crate) fn entries(&self) -> &[u32] {
        &self.entries
    }

    fn sequence(&self, b: usize) -> &[u32] {
        let w = self.width as usize;
        &self.entries[b * w..(b + 1) * w]
    }

    /// Pages sequence `b` holds before its first unassigned slot: its rows may reach
    /// `held · page_size`.
    pub(crate) fn held(&self, b: usize) -> u32 {
        self.sequence(b)
            .iter()
            .take_while(|&&p| p != UNASSIGNED)
            .count() as u32
    }

    /// Refused when a sequence holds more rows than its pages of `page_size` rows before its
    /// first unassigned slot.
    pub(crate) fn check_lengths(&self, lengths: &[u32], page_size: u32) -> Result<()> {
        for (b, &len) in lengths.iter().enumerate() {
            let held = self.held(b);
            if len as u64 > held as u64 * page_size as u64 {
                return Err(invalid!(
                    "sequence {b} holds {len} rows, the table gives it {held} pages of {page_size} rows before its first unassigned slot"
                ));
            }
        }
        Ok(())
    }

    /// Pool pages in no slot, lowest first.
    pub(crate) fn free_pages(&self) -> Vec<u32> {
        let mut used = vec![false; self.pages as usize];
        for &p in self.entries.iter().filter(|&&p| p != UNASSIGNED) {
            used[p as usize] = true;
        }
        (0..self.pages).filter(|&p| !used[p as usize]).collect()
    }

    /// Gives each sequence `b` free pages (lowest first) in the unassigned ones of its first
    /// `pages[b]` slots; all or nothing.
    pub(crate) fn reserve(&mut self, pages: &[u32]) -> Result<()> {
        let sequences = self.entries.len() / self.width.max(1) as usize;
        if pages.len() != sequences {
            return Err(invalid!(
                "{} entries for a cache of {sequences} sequences",
                pages.len()
            ));
        }
        let mut free = self.free_pages().into_iter();
        let mut next = self.clone();
        for (b, &want) in pages.iter().enumerate() {
            if want > self.width {
                return Err(invalid!(
                    "sequence {b} needs {want} pages, its block table row has {} slots",
                    self.width
                ));
            }
            let slots = b * self.width as usize..b * self.width as usize + want as usize;
            for slot in &mut next.entries[slots] {
                if *slot == UNASSIGNED {
                    *slot = free.next().ok_or_else(|| {
                        invalid!(
                            "the pool's {} pages are all taken: sequence {b} needs {want}",
                            self.pages
                        )
                    })?;
                }
            }
        }
        *self = next;
        Ok(())
    }

    /// Unassigns every slot of sequence `b`: its pages are free again.
    pub(crate) fn release(&mut self, b: usize) {
        let w = self.width as usize;
        self.entries[b * w..(b + 1) * w].fill(UNASSIGNED);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const U: u32 = UNASSIGNED;

    #[test]
    fn bad_tables_are_refused_with_the_slot() {
        let ok = BlockTable::new(&[3, 0, U, 1, U, 2], 2, 3, 4).unwrap();
        assert_eq!((ok.held(0), ok.held(1)), (2, 1));
        assert_eq!(ok.free_pages(), Vec::<u32>::new());
        let e = |entries: &[u32], seqs, width, pages| {
            BlockTable::new(entries, seqs, width, pages)
                .unwrap_err()
                .to_string()
        };
        let m = e(&[0, 4, U, U], 2, 2, 4);
        assert!(
            m.contains("sequence 0 slot 1 names page 4, the pool has 4 pages"),
            "{m}"
        );
        let m = e(&[0, 1, U, 1], 2, 2, 4);
        assert!(
            m.contains("page 1 is in sequence 0 slot 1 and sequence 1 slot 1"),
            "{m}"
        );
        let m = e(&[0, 1, 2], 2, 2, 4);
        assert!(
            m.contains("3 entries, [sequences, pages_per_sequence] is 4"),
            "{m}"
        );
        // A gap: rows may reach only the pages before it.
        let gap = BlockTable::new(&[0, U, 2], 1, 3, 4).unwrap();
        assert_eq!(gap.held(0), 1);
        gap.check_lengths(&[16], 16).unwrap();
        let m = gap.check_lengths(&[17], 16).unwrap_err().to_string();
        assert!(
            m.contains("sequence 0 holds 17 rows, the table gives it 1 pages of 16 rows"),
            "{m}"
        );
        ok.check_lengths(&[0, 0], 16).unwrap();
        let m = ok.check_lengths(&[32, 17], 16).unwrap_err().to_string();
        assert!(m.contains("sequence 1 holds 17 rows"), "{m}");
    }

    #[test]
    fn reserve_takes_the_lowest_free_pages_all_or_nothing() {
        let mut t = BlockTable::new(&[2, U, U, U, U, U], 2, 3, 5).unwrap();
        t.reserve(&[2, 3]).unwrap();
        assert_eq!(t.entries(), [2, 0, U, 1, 3, 4]);
        t.release(1);
        assert_eq!(t.free_pages(), [1, 3, 4]);
        t.reserve(&[1, 1]).unwrap();
        assert_eq!(t.entries(), [2, 0, U, 1, U, U]);
        // A gap is filled, the page after it kept.
        let mut gap = BlockTable::new(&[0, U, 2], 1, 3, 4).unwrap();
        gap.reserve(&[3]).unwrap();
        assert_eq!((gap.entries(), gap.held(0)), (&[0, 1, 2][..], 3));
        let before = t.clone();
        let m = t.reserve(&[3, 3]).unwrap_err().to_string();
        assert!(
            m.contains("the pool's 5 pages are all taken: sequence 1 needs 3"),
            "{m}"
        );
        assert_eq!(t, before);
        let m = t.reserve(&[4, 0]).unwrap_err().to_string();
        assert!(
            m.contains("sequence 0 needs 4 pages, its block table row has 3 slots"),
            "{m}"
        );
        let m = t.reserve(&[1]).unwrap_err().to_string();
        assert!(m.contains("1 entries for a cache of 2 sequences"), "{m}");
    }
}
