//! Shapes whose element counts overflow `usize`, or whose row counts pass the kernels' bound
//! (`batch · n · heads < 2^31`, `validate_shape`), are refused with `InvalidInput` before anything
//! is allocated: never a panic, never a wrapped size. Shapes of more than 2^31 elements within the
//! bound are accepted. Runs with or without a GPU (nothing here reaches the driver).

use flash_attn::materialized::MaterializedWorkspace;
use flash_attn::options::{checked_elems, validate_shape};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, CheckedElems, DType, DeviceF32, DeviceTensor,
    FlashOptions, GradientBuffers, Problem,
};

const BIG: u32 = u32::MAX;

/// Shapes each of whose Q or K/V element count overflows `u64`/`usize`, wraps to a small number
/// when multiplied unchecked, or whose row count passes `2^31 − 1`.
fn overflowing_shapes() -> Vec<(&'static str, AttentionShape)> {
    let unit = AttentionShape {
        batch: 1,
        n_q: 1,
        n_k: 1,
        heads_q: 1,
        heads_kv: 1,
        head_dim: 64,
        head_dim_v: 64,
    };
    vec![
        (
            "every extent u32::MAX (a 128-bit product)",
            AttentionShape {
                batch: BIG,
                n_q: BIG,
                n_k: BIG,
                heads_q: BIG,
                heads_kv: BIG,
                head_dim: BIG,
                head_dim_v: BIG,
            },
        ),
        (
            // 2^16 · 2^16 · 2^16 · 2^16 = 2^64: an unchecked product wraps to exactly 0.
            "Q of 2^64 elements (wraps to 0)",
            AttentionShape {
                batch: 1 << 16,
                n_q: 1 << 16,
                heads_q: 1 << 16,
                head_dim: 1 << 16,
                head_dim_v: 1 << 16,
                ..unit
            },
        ),
        (
            // 2^64 + 2^48: wraps to 2^48, or to a small count after `as u32`.
            "K/V of 2^64 + 2^48 elements",
            AttentionShape {
                batch: (1 << 16) + 1,
                n_k: 1 << 16,
                heads_kv: 1 << 16,
                heads_q: 1 << 16,
                head_dim: 1 << 16,
                head_dim_v: 1 << 16,
                ..unit
            },
        ),
        (
            "Q rows exactly 2^31",
            AttentionShape {
                batch: 2,
                n_q: 1 << 20,
                heads_q: 1 << 10,
                heads_kv: 1,
                ..unit
            },
        ),
        (
            "K/V rows past i32::MAX with n_k near u32::MAX",
            AttentionShape {
                n_k: BIG - 1,
                ..unit
            },
        ),
        (
            "n_q near u32::MAX (a padded row count would overflow u32)",
            AttentionShape {
                n_q: BIG,
                head_dim: 1,
                head_dim_v: 1,
                ..unit
            },
        ),
    ]
}

fn assert_invalid<T>(what: &str, case: &str, result: flash_attn::Result<T>) {
    match result {
        Err(AttentionError::InvalidInput(_)) => {}
        Err(e) => panic!("{case}: {what} gave {e}, not InvalidInput"),
        Ok(_) => panic!("{case}: {what} accepted the shape"),
    }
}

#[test]
fn checked_products_refuse_overflow() {
    assert_eq!(checked_elems("x", &[]).unwrap(), 1);
    assert_eq!(
        checked_elems("x", &[BIG, BIG]).unwrap() as u128,
        BIG as u128 * BIG as u128
    );
    assert!(checked_elems("x", &[BIG, BIG, BIG]).is_err());
    let all = AttentionShape {
        batch: BIG,
        n_q: BIG,
        n_k: BIG,
        heads_q: BIG,
        heads_kv: BIG,
        head_dim: BIG,
        head_dim_v: BIG,
    };
    assert_invalid("checked_q_elems", "all max", all.checked_q_elems());
    assert_invalid("checked_k_elems", "all max", all.checked_k_elems());
    assert_invalid("checked_v_elems", "all max", all.checked_v_elems());
    assert_invalid("checked_o_elems", "all max", all.checked_o_elems());
    assert_invalid("checked_score_elems", "all max", all.checked_score_elems());
    // Three u32 factors can overflow 64 bits too.
    assert_invalid("checked_row_elems", "all max", all.checked_row_elems());
}

#[test]
fn overflowing_shapes_are_invalid_input_everywhere() {
    let options = AttentionOptions::new();
    for (case, shape) in overflowing_shapes() {
        assert_invalid("validate_shape", case, validate_shape(&shape));
        assert_invalid("AttentionOptions::validate", case, options.validate(&shape));
        assert_invalid(
            "reference::forward",
            case,
            flash_attn::reference::forward(&shape, &[], &[], &[], &options),
        );
        assert_invalid(
            "reference::backward",
            case,
            flash_attn::reference::backward(&shape, &[], &[], &[], &[], &options),
        );
        // Allocating constructors check before they reach the driver, so these are
        // InvalidInput with or without a device.
        assert_invalid(
            "MaterializedWorkspace::new",
            case,
            MaterializedWorkspace::new(&shape, DType::Bf16),
        );
        assert_invalid(
            "GradientBuffers::poisoned",
            case,
            GradientBuffers::poisoned(&shape, DType::Bf16),
        );
        let tc = AttentionShape {
            head_dim: 64,
            head_dim_v: 64,
            ..shape
        };
        let options = FlashOptions::default();
        assert_invalid(
            "Problem::new",
            case,
            Problem::new(&tc, DType::Bf16, &options),
        );
    }
}

#[test]
fn materialized_scores_past_usize_are_refused() {
    // Q and K/V are small enough to index; S = [batch, heads_q, n_q, n_k] is 2^66 elements.
    let shape = AttentionShape {
        batch: 1,
        n_q: 1 << 22,
        n_k: BIG,
        heads_q: 1 << 22,
        heads_kv: 1 << 22,
        head_dim: 1,
        head_dim_v: 1,
    };
    assert_invalid(
        "MaterializedWorkspace::new",
        "scores past usize",
        MaterializedWorkspace::new(&shape, DType::F32),
    );
}

#[test]
fn buffer_byte_sizes_are_checked_before_allocating() {
    for len in [usize::MAX, usize::MAX / 2 + 1, isize::MAX as usize / 2 + 1] {
        let case = format!("{len} elements");
        assert_invalid(
            "DeviceTensor::poisoned f32",
            &case,
            DeviceTensor::poisoned(DType::F32, len),
        );
        assert_invalid("DeviceF32::poisoned", &case, DeviceF32::poisoned(len));
    }
    assert_invalid(
        "DeviceTensor::poisoned bf16",
        "usize::MAX elements",
        DeviceTensor::poisoned(DType::Bf16, usize::MAX),
    );
}

/// The 1M-token prefill: 2^32 elements per Q-shaped tensor, 2^25 rows.
fn million_token_prefill() -> AttentionShape {
    AttentionShape {
        batch: 1,
        n_q: 1 << 20,
        n_k: 1 << 20,
        heads_q: 32,
        heads_kv: 8,
        head_dim: 128,
        head_dim_v: 128,
    }
}

#[test]
fn tensors_past_2_31_elements_are_accepted() {
    let shape = million_token_prefill();
    assert_eq!(shape.checked_q_elems().unwrap(), 1 << 32);
    validate_shape(&shape).unwrap();
    for causal in [false, true] {
        let options = FlashOptions::new(AttentionOptions::new().causal(causal));
        let p = Problem::new(&shape, DType::Bf16, &options).unwrap();
        assert_eq!(p.grid_yz(shape.heads_q), (32, 1));
    }
    // The largest row count allowed, with the widest head the families take: 2^39 elements.
    let widest = AttentionShape {
        batch: 1,
        n_q: i32::MAX as u32,
        n_k: 1,
        heads_q: 1,
        heads_kv: 1,
        head_dim: 256,
        head_dim_v: 256,
    };
    validate_shape(&widest).unwrap();
    Problem::new(&widest, DType::Bf16, &FlashOptions::default()).unwrap();
}

#[test]
fn row_counts_past_the_bound_are_refused_with_their_count() {
    let rows = AttentionShape {
        n_q: 1 << 21,
        heads_q: 1 << 10,
        heads_kv: 1,
        ..million_token_prefill()
    };
    let err = validate_shape(&rows).unwrap_err().to_string();
    assert!(err.contains("2147483648 rows"), "{err}");
    let kv = AttentionShape {
        n_k: 1 << 29,
        heads_kv: 8,
        ..million_token_prefill()
    };
    let err = validate_shape(&kv).unwrap_err().to_string();
    assert!(err.contains("K/V has 4294967296 rows"), "{err}");
}

#[test]
fn batch_times_heads_past_the_grid_limit_is_accepted() {
    // 2^17 (batch, head) pairs, 2^21 rows: the grid folds the pairs (`abi::grid`).
    let shape = AttentionShape {
        batch: 1 << 12,
        n_q: 16,
        n_k: 16,
        heads_q: 32,
        heads_kv: 8,
        head_dim: 64,
        head_dim_v: 64,
    };
    let p = Problem::new(&shape, DType::Bf16, &FlashOptions::default()).unwrap();
    assert_eq!(p.grid_yz(32), (32, 1 << 12));
    let heads = AttentionShape {
        batch: 2,
        heads_q: 1 << 17,
        heads_kv: 1 << 17,
        ..shape
    };
    let p = Problem::new(&heads, DType::Bf16, &FlashOptions::default()).unwrap();
    assert_eq!(p.grid_yz(1 << 17), (65_535, 5));
}
