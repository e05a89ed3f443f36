//! The one validation of a call: shape, dtype and options checked once, before any plan, allocation
//! or launch, and the extents every family's grid derives from.

use attention_kernels::abi::grid::fold_heads_sequences;
use attention_kernels::abi::shape::AttentionShape;
use attention_kernels::kernels::decode::MAX_SPLITS;

use crate::dtype::DType;
use crate::error::{Result, invalid};
use crate::flash_options::FlashOptions;
use crate::options::{Lengths, MAX_TENSOR_ROWS};

/// Largest head dimension any family is built for (the exact kernels' limit).
pub const MAX_HEAD_DIM: u32 = 256;

/// A validated call: everything a plan needs to choose a family, no device memory.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub shape: AttentionShape,
    pub dtype: DType,
    pub options: FlashOptions,
    /// Sequences the grid covers (folded with the heads, `abi::grid`): `batch`, or the packed
    /// sequence count.
    pub sequences: u32,
    /// Longest sequence in query rows and in key rows: the grid's Q and K/V block extents.
    pub max_q_len: u32,
    pub max_k_rows: u32,
    /// Where the device holds `options`' `KeyLengths` already (a KV cache's lengths): the launch
    /// passes that array instead of uploading the host one.
    pub(crate) device_key_lengths: Option<u64>,
}

impl Problem {
    /// Checks `shape`, `dtype` and `options` together; every refusal names what is wrong.
    pub fn new(shape: &AttentionShape, dtype: DType, options: &FlashOptions) -> Result<Problem> {
        options.attention.validate(shape)?;
        if let Some(n) = options
            .decode_splits
            .filter(|n| !(1..=MAX_SPLITS).contains(n))
        {
            return Err(invalid!(
                "decode_splits {n}: the decode family splits the keys 1 to {MAX_SPLITS} times"
            ));
        }
        for (name, d) in [
            ("head_dim", shape.head_dim),
            ("head_dim_v", shape.head_dim_v),
        ] {
            if d > MAX_HEAD_DIM {
                return Err(invalid!("{name} {d} exceeds the supported {MAX_HEAD_DIM}"));
            }
        }
        let (sequences, max_q_len, max_k_rows) = match &options.attention.lengths {
            Lengths::Packed {
                cu_seqlens_q,
                cu_seqlens_k,
            } => {
                let widest = |cu: &[u32]| cu.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
                (
                    (cu_seqlens_q.len() - 1) as u64,
                    widest(cu_seqlens_q),
                    widest(cu_seqlens_k),
                )
            }
            _ => (shape.batch as u64, shape.n_q, shape.n_k),
        };
        // `batch · heads_q` is below 2^31 (validated); empty packed sequences are not bounded
        // by the rows, so their count is checked here: every (head, sequence) pair is a grid row.
        let pairs = shape.heads_q as u64 * sequences;
        if pairs > MAX_TENSOR_ROWS {
            return Err(invalid!(
                "heads_q ({}) x sequences ({sequences}) = {pairs} exceeds {MAX_TENSOR_ROWS}",
                shape.heads_q
            ));
        }
        Ok(Problem {
            shape: *shape,
            dtype,
            options: options.clone(),
            sequences: sequences as u32,
            max_q_len,
            max_k_rows,
            device_key_lengths: None,
        })
    }

    /// This call with its `KeyLengths` read from the device array at `lengths` (`batch` u32, equal
    /// to the host ones, which were validated).
    pub(crate) fn with_device_key_lengths(self, lengths: u64) -> Problem {
        debug_assert!(matches!(
            self.options.attention.lengths,
            Lengths::KeyLengths(_)
        ));
        Problem {
            device_key_lengths: Some(lengths),
            ..self
        }
    }

    /// Grid `(y, z)` extents of the (head, sequence) pairs for `heads` heads per sequence
    /// (`heads_q` or `heads_kv`): unfolded below 65,536 of each, folded past that.
    pub fn grid_yz(&self, heads: u32) -> (u32, u32) {
        fold_heads_sequences(heads, self.sequences)
            .expect("Problem::new bounds heads x sequences below 2^31")
    }

    /// Whether the call masks by lengths, drops out, or has a local window or score modifiers:
    /// what the tensor-core families run on instances other than their defaults (`wgmma`: the
    /// general ones, their `window` ones for a window alone over full-length sequences without
    /// dropout, their `mods` ones for the rest with the window or score modifiers; `mma.sync`: see
    /// [`Problem::needs_lengths_or_dropout`]).
    pub fn needs_general(&self) -> bool {
        self.needs_lengths_or_dropout() || self.options.attention.has_score_mods()
    }

    /// Whether the window is the call's only option besides the scale and the causal mask: what
    /// the `wgmma` family runs on its `window` instances, on the default tiles.
    pub fn window_only(&self) -> bool {
        let a = &self.options.attention;
        a.window.is_some() && !a.modifies_scores() && !self.needs_lengths_or_dropout()
    }

    /// Whether the call masks by lengths or drops out: what the `mma.sync` family runs on its
    /// general instances (`general_mods` with the window or score modifiers too).
    pub fn needs_lengths_or_dropout(&self) -> bool {
        let a = &self.options.attention;
        a.dropout.is_some() || a.lengths != Lengths::Full
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::AttentionOptions;

    fn shape() -> AttentionShape {
        AttentionShape {
            batch: 1,
            n_q: 300,
            n_k: 500,
            heads_q: 4,
            heads_kv: 2,
            head_dim: 64,
            head_dim_v: 64,
        }
    }

    #[test]
    fn packed_extents_are_the_widest_sequence() {
        let options =
            FlashOptions::new(AttentionOptions::new().packed(vec![0, 100, 300], vec![0, 450, 500]));
        let p = Problem::new(&shape(), DType::Bf16, &options).unwrap();
        assert_eq!((p.sequences, p.max_q_len, p.max_k_rows), (2, 200, 450));
        assert!(p.needs_general());
    }

    #[test]
    fn refuses_head_dims_past_the_limit_and_folds_grids_past_the_hardware() {
        let big_d = AttentionShape {
            head_dim: 264,
            head_dim_v: 264,
            ..shape()
        };
        let err = Problem::new(&big_d, DType::F32, &FlashOptions::default()).unwrap_err();
        assert!(err.to_string().contains("head_dim 264"), "{err}");
        for (d_v, says) in [(264, "head_dim_v 264 exceeds"), (0, "head_dim_v must be")] {
            let err = Problem::new(
                &shape().with_head_dim_v(d_v),
                DType::F32,
                &FlashOptions::default(),
            )
            .unwrap_err();
            assert!(err.to_string().contains(says), "{err}");
        }
        let many_heads = AttentionShape {
            heads_q: 70_000,
            heads_kv: 1,
            n_q: 1,
            n_k: 1,
            ..shape()
        };
        let p = Problem::new(&many_heads, DType::F32, &FlashOptions::default()).unwrap();
        assert_eq!(p.grid_yz(70_000), (65_535, 2));
        assert_eq!(p.grid_yz(1), (1, 1));
        // Empty packed sequences count as grid rows too.
        let mut cu = vec![0u32; 1 << 20];
        *cu.last_mut().unwrap() = 300;
        let packed = FlashOptions::new(AttentionOptions::new().packed(cu.clone(), {
            let mut k = cu;
            *k.last_mut().unwrap() = 500;
            k
        }));
        let wide = AttentionShape {
            heads_q: 4096,
            heads_kv: 4096,
            ..shape()
        };
        let err = Problem::new(&wide, DType::F32, &packed).unwrap_err();
        assert!(err.to_string().contains("sequences"), "{err}");
    }
}
