//! `flash-attn ledger`: the paper's block sizes and logical-word ledgers for one shape (0x0C).

use flash_attn::ledger::{
    BackwardWords, CacheRegime, ForwardWords, backward_tight_bound, fa1_bound, forward_tight_bound,
};
use flash_attn::schedule::{BlockSizes, Schedule};
use serde_json::{Value, json};

#[derive(clap::Args, Debug)]
pub struct LedgerArgs {
    /// Sequence length N of queries and keys (or give --n-q and --n-k).
    #[arg(short = 'n', long)]
    pub n: Option<u64>,
    /// Query rows N_q.
    #[arg(long)]
    pub n_q: Option<u64>,
    /// Keys N_k.
    #[arg(long)]
    pub n_k: Option<u64>,
    /// Head dimension d.
    #[arg(short = 'd', long)]
    pub head_dim: u64,
    /// On-chip capacity M in scalar words; gives the paper's B_c = ceil(M/4d), B_r = min(B_c, d).
    #[arg(short = 'm', long)]
    pub sram_words: Option<u64>,
    /// Rows per query block B_r (overrides the paper's choice).
    #[arg(long)]
    pub block_rows: Option<u64>,
    /// Keys per K/V block B_c (overrides the paper's choice).
    #[arg(long)]
    pub block_cols: Option<u64>,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Everything the subcommand prints, computed from the arguments.
#[derive(Debug)]
pub struct LedgerReport {
    pub schedule: Schedule,
    pub head_dim: u64,
    pub sram_words: Option<u64>,
    pub forward: ForwardWords,
    pub backward: BackwardWords,
}

impl LedgerReport {
    pub fn new(args: &LedgerArgs) -> Result<Self, String> {
        let (n_q, n_k) = match (args.n, args.n_q, args.n_k) {
            (Some(n), None, None) => (n, n),
            (None, Some(n_q), Some(n_k)) => (n_q, n_k),
            _ => return Err("give either --n, or both --n-q and --n-k".into()),
        };
        if args.head_dim == 0 {
            return Err("--head-dim must be at least 1".into());
        }
        let paper = args.sram_words.map(|m| BlockSizes::paper(m, args.head_dim));
        let block_rows = args.block_rows.or(paper.map(|b| b.block_rows));
        let block_cols = args.block_cols.or(paper.map(|b| b.block_cols));
        let (Some(block_rows), Some(block_cols)) = (block_rows, block_cols) else {
            return Err("give --sram-words, or both --block-rows and --block-cols".into());
        };
        let schedule = Schedule::new(
            n_q,
            n_k,
            BlockSizes {
                block_rows,
                block_cols,
            },
        )
        .ok_or("lengths and block sizes must be at least 1")?;
        // The ledger walks every (row block, column block) visit and counts words in u64.
        let visits = schedule.row_blocks().checked_mul(schedule.col_blocks());
        if visits.is_none_or(|v| v > MAX_VISITS) {
            return Err(format!(
                "{} x {} block visits; the ledger walks each one and takes at most {MAX_VISITS}",
                schedule.row_blocks(),
                schedule.col_blocks()
            ));
        }
        let largest_term = [
            n_q.max(n_k),
            args.head_dim,
            schedule.row_blocks().max(schedule.col_blocks()),
            16,
        ]
        .into_iter()
        .try_fold(1u64, u64::checked_mul);
        if largest_term.is_none() {
            return Err("the word counts of this shape overflow 64 bits".into());
        }
        Ok(LedgerReport {
            schedule,
            head_dim: args.head_dim,
            sram_words: args.sram_words,
            forward: ForwardWords::walk(&schedule, args.head_dim),
            backward: BackwardWords::walk(&schedule, args.head_dim),
        })
    }

    /// Asymptotic bounds for square shapes with a capacity given: `(regime, FA1, forward, backward)`.
    fn bounds(&self) -> Option<(CacheRegime, f64, f64, f64)> {
        let m = self.sram_words? as f64;
        (self.schedule.n_q == self.schedule.n_k).then(|| {
            let (n, d) = (self.schedule.n_q as f64, self.head_dim as f64);
            (
                CacheRegime::of(d, m),
                fa1_bound(n, d, m),
                forward_tight_bound(n, d, m),
                backward_tight_bound(n, d, m),
            )
        })
    }

    pub fn to_json(&self) -> Value {
        let (s, f, b) = (&self.schedule, &self.forward, &self.backward);
        let mut report = json!({
            "n_q": s.n_q,
            "n_k": s.n_k,
            "head_dim": self.head_dim,
            "sram_words": self.sram_words,
            "block_rows": s.blocks.block_rows,
            "block_cols": s.blocks.block_cols,
            "row_blocks": s.row_blocks(),
            "col_blocks": s.col_blocks(),
            "tile_visits": s.row_blocks() * s.col_blocks(),
            "forward": {
                "kv_reads": f.kv_reads,
                "q_reads": f.q_reads,
                "o_reads": f.o_reads,
                "o_writes": f.o_writes,
                "stats_reads": f.stats_reads,
                "stats_writes": f.stats_writes,
                "init_o": f.init_o,
                "init_stats": f.init_stats,
                "reads": f.reads(),
                "writes": f.writes(),
                "transfer": f.transfer(),
                "total": f.total(),
            },
            "backward": {
                "kv_reads": b.kv_reads,
                "q_o_do_dq_reads": b.q_o_reads,
                "stats_reads": b.stats_reads,
                "dq_writes": b.dq_writes,
                "dkv_writes": b.dkv_writes,
                "init": b.init,
                "transfer": b.transfer(),
                "total": b.total(),
            },
        });
        if let Some((regime, fa1, fwd, bwd)) = self.bounds() {
            report["bounds"] = json!({ "regime": regime.name(), "fa1": fa1, "forward_tight": fwd, "backward_tight": bwd });
        }
        report
    }

    pub fn to_text(&self) -> String {
        let (s, f, b) = (&self.schedule, &self.forward, &self.backward);
        let mut out = format!(
            "N_q = {}, N_k = {}, d = {}{}\n\
             B_r = {}, B_c = {}, T_r = {}, T_c = {}, tile visits = {}\n\n\
             forward (Algorithm 1), logical words\n",
            s.n_q,
            s.n_k,
            self.head_dim,
            self.sram_words
                .map_or(String::new(), |m| format!(", M = {m}")),
            s.blocks.block_rows,
            s.blocks.block_cols,
            s.row_blocks(),
            s.col_blocks(),
            s.row_blocks() * s.col_blocks(),
        );
        for (term, words) in [
            ("K/V reads", f.kv_reads),
            ("Q/O reads plus O writes", f.q_o_traffic()),
            ("m/l reads plus writes", f.stats_traffic()),
            ("reads", f.reads()),
            ("writes", f.writes()),
            ("transfer", f.transfer()),
            ("O/m/l initialization", f.init()),
            ("forward total", f.total()),
        ] {
            out += &format!("  {term:<32}{words:>16}\n");
        }
        out += "\nbackward (Algorithm 4), logical words\n";
        for (term, words) in [
            ("K/V reads", b.kv_reads),
            ("Q/O/dO/dQ reads", b.q_o_reads),
            ("m/l reads", b.stats_reads),
            ("dQ writes", b.dq_writes),
            ("Q/O/dO/dQ reads + dQ writes", b.q_o_traffic()),
            ("dK/dV final writes", b.dkv_writes),
            ("transfer", b.transfer()),
            ("dQ/dK/dV initialization", b.init),
            ("backward total", b.total()),
        ] {
            out += &format!("  {term:<32}{words:>16}\n");
        }
        if let Some((regime, fa1, fwd, bwd)) = self.bounds() {
            out += &format!(
                "\nbounds without constants, {}\n  FA1 Nd + N^2 d^2/M{fa1:>29.0}\n  forward tight (Saha-Ye){fwd:>25.0}\n  backward tight (Li et al.){bwd:>22.0}\n",
                regime.name()
            );
        }
        out
    }
}

/// Block visits the ledger walks at most (a second or so).
const MAX_VISITS: u64 = 100_000_000;

pub fn run(args: &LedgerArgs) -> Result<(), Box<dyn std::error::Error>> {
    let report = LedgerReport::new(args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report.to_json())?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(
        n: Option<u64>,
        n_qk: Option<(u64, u64)>,
        d: u64,
        m: Option<u64>,
        blocks: Option<(u64, u64)>,
    ) -> LedgerArgs {
        LedgerArgs {
            n,
            n_q: n_qk.map(|x| x.0),
            n_k: n_qk.map(|x| x.1),
            head_dim: d,
            sram_words: m,
            block_rows: blocks.map(|b| b.0),
            block_cols: blocks.map(|b| b.1),
            json: true,
        }
    }

    #[test]
    fn article_sensitivity_fixture() {
        let r = LedgerReport::new(&args(Some(4096), None, 64, Some(65_536), None))
            .unwrap()
            .to_json();
        assert_eq!(
            (r["block_cols"].as_u64(), r["block_rows"].as_u64()),
            (Some(256), Some(64))
        );
        assert_eq!(
            (r["col_blocks"].as_u64(), r["row_blocks"].as_u64()),
            (Some(16), Some(64))
        );
        assert_eq!(r["forward"]["kv_reads"], 524_288);
        assert_eq!(r["forward"]["total"], 13_639_680);
        assert_eq!(r["backward"]["total"], 22_937_600);
        assert_eq!(r["bounds"]["regime"], CacheRegime::Large.name());
        let text = LedgerReport::new(&args(Some(4096), None, 64, Some(65_536), None))
            .unwrap()
            .to_text();
        for row in [
            "12582912", "262144", "270336", "20971520", "131072", "786432",
        ] {
            assert!(text.contains(row), "{row} missing from\n{text}");
        }
    }

    #[test]
    fn article_non_multiple_fixtures() {
        let r = LedgerReport::new(&args(None, Some((7, 10)), 4, None, Some((3, 4))))
            .unwrap()
            .to_json();
        let f = &r["forward"];
        assert_eq!(
            (
                f["reads"].as_u64(),
                f["writes"].as_u64(),
                f["transfer"].as_u64()
            ),
            (Some(290), Some(126), Some(416))
        );
        assert_eq!(f["total"], 458);
        assert_eq!(r["tile_visits"], 9);
        assert!(r.get("bounds").is_none());
        let r = LedgerReport::new(&args(None, Some((4, 5)), 3, None, Some((2, 3))))
            .unwrap()
            .to_json();
        assert_eq!(r["backward"]["total"], 238);
        assert_eq!(r["backward"]["init"], 42);
    }

    #[test]
    fn explicit_blocks_override_the_paper_rule_and_bad_arguments_are_refused() {
        let r =
            LedgerReport::new(&args(Some(4096), None, 64, Some(65_536), Some((128, 256)))).unwrap();
        assert_eq!(
            r.schedule.blocks,
            BlockSizes {
                block_rows: 128,
                block_cols: 256
            }
        );
        assert!(LedgerReport::new(&args(Some(8), Some((8, 8)), 4, Some(64), None)).is_err());
        assert!(LedgerReport::new(&args(Some(8), None, 4, None, None)).is_err());
        assert!(LedgerReport::new(&args(Some(8), None, 0, Some(64), None)).is_err());
        assert!(LedgerReport::new(&args(Some(0), None, 4, Some(64), None)).is_err());
    }
}
