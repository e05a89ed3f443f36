//! Logical-word ledgers of Algorithm 1 (forward) and Algorithm 4 (backward), counted by walking the
//! schedule with true tail extents, and their closed forms.

use crate::schedule::Schedule;

/// Words moved by Algorithm 1, by term. `N_q`, `N_k`, `d`, `T_c` as in the schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardWords {
    /// `K_j`, `V_j` once per outer step: `2 N_k d`.
    pub kv_reads: u64,
    /// `Q_i` per visit: `T_c N_q d`.
    pub q_reads: u64,
    /// `O_i` per visit: `T_c N_q d`.
    pub o_reads: u64,
    /// `O_i` per visit: `T_c N_q d`.
    pub o_writes: u64,
    /// `m_i`, `l_i` per visit: `2 T_c N_q`.
    pub stats_reads: u64,
    /// `m_i`, `l_i` per visit: `2 T_c N_q`.
    pub stats_writes: u64,
    /// Line 2 writes `O = 0`: `N_q d`.
    pub init_o: u64,
    /// Line 2 writes `l = 0`, `m = −∞`: `2 N_q`.
    pub init_stats: u64,
}

impl ForwardWords {
    /// Counts the words of every visit of `schedule` for head dimension `d`.
    pub fn walk(schedule: &Schedule, d: u64) -> Self {
        let mut w = ForwardWords {
            init_o: schedule.n_q * d,
            init_stats: 2 * schedule.n_q,
            ..Default::default()
        };
        for j in 0..schedule.col_blocks() {
            w.kv_reads += 2 * schedule.cols(j).count() as u64 * d;
        }
        for visit in schedule.visits() {
            let rows = visit.rows.count() as u64;
            w.q_reads += rows * d;
            w.o_reads += rows * d;
            w.o_writes += rows * d;
            w.stats_reads += 2 * rows;
            w.stats_writes += 2 * rows;
        }
        w
    }

    /// `W_fwd = 2 N_k d + 3 T_c N_q d + 4 T_c N_q + N_q d + 2 N_q` term by term.
    pub fn closed_form(n_q: u64, n_k: u64, d: u64, t_c: u64) -> Self {
        ForwardWords {
            kv_reads: 2 * n_k * d,
            q_reads: t_c * n_q * d,
            o_reads: t_c * n_q * d,
            o_writes: t_c * n_q * d,
            stats_reads: 2 * t_c * n_q,
            stats_writes: 2 * t_c * n_q,
            init_o: n_q * d,
            init_stats: 2 * n_q,
        }
    }

    /// The article's row "Q/O reads plus O writes".
    pub fn q_o_traffic(&self) -> u64 {
        self.q_reads + self.o_reads + self.o_writes
    }

    /// The article's row "m/l reads plus writes".
    pub fn stats_traffic(&self) -> u64 {
        self.stats_reads + self.stats_writes
    }

    pub fn reads(&self) -> u64 {
        self.kv_reads + self.q_reads + self.o_reads + self.stats_reads
    }

    pub fn writes(&self) -> u64 {
        self.o_writes + self.stats_writes
    }

    pub fn init(&self) -> u64 {
        self.init_o + self.init_stats
    }

    /// Nested-loop traffic, without initialisation.
    pub fn transfer(&self) -> u64 {
        self.reads() + self.writes()
    }

    /// Traffic including the initialisation writes.
    pub fn total(&self) -> u64 {
        self.transfer() + self.init()
    }
}

/// Words moved by Algorithm 4, by term.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardWords {
    /// `K_j`, `V_j` once per outer step: `2 N_k d`.
    pub kv_reads: u64,
    /// `Q_i`, `O_i`, `dO_i`, `dQ_i` per visit: `4 T_c N_q d`.
    pub q_o_reads: u64,
    /// `m_i`, `l_i` per visit: `2 T_c N_q`.
    pub stats_reads: u64,
    /// `dQ_i` per visit: `T_c N_q d`.
    pub dq_writes: u64,
    /// `dK_j`, `dV_j` once per outer step: `2 N_k d`.
    pub dkv_writes: u64,
    /// `dQ`, `dK`, `dV` zeroed in HBM: `N_q d + 2 N_k d`.
    pub init: u64,
}

impl BackwardWords {
    pub fn walk(schedule: &Schedule, d: u64) -> Self {
        let mut w = BackwardWords {
            init: (schedule.n_q + 2 * schedule.n_k) * d,
            ..Default::default()
        };
        for j in 0..schedule.col_blocks() {
            let cols = schedule.cols(j).count() as u64;
            w.kv_reads += 2 * cols * d;
            w.dkv_writes += 2 * cols * d;
        }
        for visit in schedule.visits() {
            let rows = visit.rows.count() as u64;
            w.q_o_reads += 4 * rows * d;
            w.stats_reads += 2 * rows;
            w.dq_writes += rows * d;
        }
        w
    }

    /// `W_bwd = 7Nd + 5 T_c N d + 2 T_c N`, generalised to `N_q ≠ N_k`, term by term.
    pub fn closed_form(n_q: u64, n_k: u64, d: u64, t_c: u64) -> Self {
        BackwardWords {
            kv_reads: 2 * n_k * d,
            q_o_reads: 4 * t_c * n_q * d,
            stats_reads: 2 * t_c * n_q,
            dq_writes: t_c * n_q * d,
            dkv_writes: 2 * n_k * d,
            init: (n_q + 2 * n_k) * d,
        }
    }

    /// The article's row "Q/O/dO/dQ reads + dQ writes".
    pub fn q_o_traffic(&self) -> u64 {
        self.q_o_reads + self.dq_writes
    }

    /// Traffic without initialisation.
    pub fn transfer(&self) -> u64 {
        self.kv_reads + self.q_o_reads + self.stats_reads + self.dq_writes + self.dkv_writes
    }

    pub fn total(&self) -> u64 {
        self.transfer() + self.init
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::BlockSizes;

    fn schedule(n_q: u64, n_k: u64, block_rows: u64, block_cols: u64) -> Schedule {
        Schedule::new(
            n_q,
            n_k,
            BlockSizes {
                block_rows,
                block_cols,
            },
        )
        .unwrap()
    }

    /// 0x0CB: N = 4096, d = 64, M = 65,536.
    #[test]
    fn forward_sensitivity_fixture() {
        let s = Schedule::new(4096, 4096, BlockSizes::paper(65_536, 64)).unwrap();
        let w = ForwardWords::walk(&s, 64);
        assert_eq!(w.kv_reads, 524_288);
        assert_eq!(w.q_o_traffic(), 12_582_912);
        assert_eq!(w.stats_traffic(), 262_144);
        assert_eq!(w.init(), 270_336);
        assert_eq!(w.total(), 13_639_680);
    }

    /// 0x0CC: the same N, d, M.
    #[test]
    fn backward_sensitivity_fixture() {
        let s = Schedule::new(4096, 4096, BlockSizes::paper(65_536, 64)).unwrap();
        let w = BackwardWords::walk(&s, 64);
        assert_eq!(w.kv_reads, 524_288);
        assert_eq!(w.q_o_traffic(), 20_971_520);
        assert_eq!(w.stats_reads, 131_072);
        assert_eq!(w.dkv_writes, 524_288);
        assert_eq!(w.init, 786_432);
        assert_eq!(w.total(), 22_937_600);
    }

    /// 0x0AE: N_q = 7, N_k = 10, d = 4, B_r = 3, B_c = 4.
    #[test]
    fn forward_non_multiple_fixture() {
        let w = ForwardWords::walk(&schedule(7, 10, 3, 4), 4);
        assert_eq!((w.reads(), w.writes(), w.transfer()), (290, 126, 416));
        assert_eq!((w.init_o, w.init_stats), (28, 14));
        assert_eq!((w.init(), w.total()), (42, 458));
    }

    /// 0x0DD: N_q = 4, N_k = 5, d = 3, B_r = 2, B_c = 3.
    #[test]
    fn backward_non_multiple_fixture() {
        let w = BackwardWords::walk(&schedule(4, 5, 2, 3), 3);
        assert_eq!(
            (
                w.kv_reads,
                w.q_o_reads,
                w.stats_reads,
                w.dq_writes,
                w.dkv_writes,
                w.init
            ),
            (30, 96, 16, 24, 30, 42)
        );
        assert_eq!(w.total(), 238);
    }

    /// Walking the visits with tail extents gives the closed forms for any shape.
    #[test]
    fn walked_ledgers_equal_the_closed_forms() {
        for (n_q, n_k, d, b_r, b_c) in [
            (7, 10, 4, 3, 4),
            (4, 5, 3, 2, 3),
            (1, 9, 8, 5, 2),
            (33, 7, 16, 8, 64),
            (100, 100, 64, 64, 16),
        ] {
            let s = schedule(n_q, n_k, b_r, b_c);
            let t_c = s.col_blocks();
            assert_eq!(
                ForwardWords::walk(&s, d),
                ForwardWords::closed_form(n_q, n_k, d, t_c)
            );
            assert_eq!(
                BackwardWords::walk(&s, d),
                BackwardWords::closed_form(n_q, n_k, d, t_c)
            );
            // The square formulas of the article when N_q = N_k = N.
            if n_q == n_k {
                let n = n_q;
                assert_eq!(
                    ForwardWords::walk(&s, d).total(),
                    2 * n * d + 3 * t_c * n * d + 4 * t_c * n + n * d + 2 * n
                );
                assert_eq!(
                    BackwardWords::walk(&s, d).total(),
                    7 * n * d + 5 * t_c * n * d + 2 * t_c * n
                );
            }
        }
    }

    /// B_r does not enter the dominant term: each K/V tile triggers one full Q/O traversal.
    #[test]
    fn block_rows_do_not_change_the_ledger() {
        let a = ForwardWords::walk(&schedule(96, 96, 8, 32), 16);
        let b = ForwardWords::walk(&schedule(96, 96, 32, 32), 16);
        assert_eq!(a, b);
        let fewer_passes = ForwardWords::walk(&schedule(96, 96, 8, 48), 16);
        assert!(fewer_passes.total() < a.total());
    }
}
