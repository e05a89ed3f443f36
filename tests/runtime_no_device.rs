//! What runs without a GPU: the runtime reports the missing device as its own error variant, and
//! the inputs are refused before any launch.

use flash_attn::{AttentionError, AttentionOptions, AttentionShape};

#[test]
fn gpu_reports_no_device_or_starts() {
    match flash_attn::gpu() {
        Ok(gpu) => eprintln!("a CUDA device answered: {}", gpu.device_name()),
        Err(AttentionError::NoDevice(why)) => {
            eprintln!("no CUDA device answered, as expected here: {why}")
        }
        Err(e) => panic!("the runtime must either start or report NoDevice, got: {e}"),
    }
}

#[test]
fn shapes_and_options_are_validated() {
    let shape = AttentionShape {
        batch: 2,
        n_q: 5,
        n_k: 7,
        heads_q: 6,
        heads_kv: 4,
        head_dim: 64,
        head_dim_v: 64,
    };
    let err = AttentionOptions::new().validate(&shape).unwrap_err();
    assert!(err.to_string().contains("not a multiple"), "{err}");
    let ok = AttentionShape {
        heads_kv: 3,
        ..shape
    };
    AttentionOptions::new().validate(&ok).unwrap();
    let err = AttentionOptions::new()
        .dropout(1.0, 0, 0)
        .validate(&ok)
        .unwrap_err();
    assert!(err.to_string().contains("dropout"), "{err}");
    let err = AttentionOptions::new()
        .key_lengths(vec![7, 8])
        .validate(&ok)
        .unwrap_err();
    assert!(err.to_string().contains("exceeds"), "{err}");
    let err = AttentionOptions::new()
        .key_lengths(vec![7])
        .validate(&ok)
        .unwrap_err();
    assert!(
        err.to_string().contains("key lengths for a batch of 2"),
        "{err}"
    );
    let packed = AttentionShape { batch: 1, ..ok };
    AttentionOptions::new()
        .packed(vec![0, 2, 5], vec![0, 3, 7])
        .validate(&packed)
        .unwrap();
    let err = AttentionOptions::new()
        .packed(vec![0, 2, 4], vec![0, 3, 7])
        .validate(&packed)
        .unwrap_err();
    assert!(err.to_string().contains("ends at 4"), "{err}");
    let zero = AttentionShape { n_k: 0, ..ok };
    assert!(matches!(
        AttentionOptions::new().validate(&zero),
        Err(AttentionError::InvalidInput(_))
    ));
}

#[test]
fn half_tensors_round_trip_bit_for_bit() {
    let Some(_gpu) =
        flash_attn_testkit::testing::gpu_or_skip("half_tensors_round_trip_bit_for_bit")
    else {
        return;
    };
    let values = flash_attn_testkit::inputs::uniform(
        flash_attn_testkit::testing::fresh_seed("half round trip"),
        1000,
    );
    let f16: Vec<half::f16> = values
        .iter()
        .map(|&x| half::f16::from_f32(x * 1000.0))
        .collect();
    let bf16: Vec<half::bf16> = values
        .iter()
        .map(|&x| half::bf16::from_f32(x * 1e30))
        .collect();
    let f16_back = flash_attn::DeviceTensor::from_f16(&f16)
        .unwrap()
        .to_f16()
        .unwrap();
    let bf16_tensor = flash_attn::DeviceTensor::from_bf16(&bf16).unwrap();
    assert_eq!(f16_back, f16);
    assert_eq!(bf16_tensor.to_bf16().unwrap(), bf16);
    let widened = bf16_tensor.to_f32().unwrap();
    assert!(widened.iter().zip(&bf16).all(|(w, b)| *w == b.to_f32()));
    assert!(matches!(
        bf16_tensor.to_f16(),
        Err(AttentionError::InvalidInput(_))
    ));
}
