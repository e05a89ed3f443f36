//! Shapes whose element counts overflow `usize` (or the kernels' `i32` indexing) are refused with
//! `InvalidInput` before anything is allocated: never a panic, never a wrapped size. Runs with or
//! without a GPU (every refusal here comes before the driver is asked for anything).

use flash_attn::materialized::MaterializedWorkspace;
use flash_attn::options::{checked_elems, validate_shape};
use flash_attn::{
    AttentionError, AttentionOptions, AttentionShape, CheckedElems, DType, DeviceF32, DeviceTensor,
    FlashOptions, GradientBuffers, Problem,
};

const BIG: u32 = u32::MAX;

/// Shapes each of whose Q or K/V element count overflows `u64`/`usize`, wraps to a small number
/// when multiplied unchecked, or passes `usize` but not the kernels' `i32` indexing.
fn overflowing_shapes() -> Vec<(&'static str, AttentionShape)> {
    let unit = AttentionShape {
        batch: 1,
        n_q: 1,
        n_k: 1,
        heads_q: 1,
        heads_kv: 1,
        head_dim: 64,
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
                ..unit
            },
        ),
        (
            "Q past i32::MAX",
            AttentionShape {
                n_q: 1 << 25,
                ..unit
            },
        ),
        (
            "K/V past i32::MAX with n_k near u32::MAX",
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
    };
    assert_invalid("checked_q_elems", "all max", all.checked_q_elems());
    assert_invalid("checked_kv_elems", "all max", all.checked_kv_elems());
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
